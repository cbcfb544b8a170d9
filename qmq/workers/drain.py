# -*- test-case-name: tests.test_workers_drain -*-
"""Messages of a queue whose home moved, sent on to the new home.

When the number of workers changes, the homes of some queues change with
it (the mesh's placement over all N workers). A worker that recovers such
a queue from its own commit log, holding messages, keeps it (the mesh's
rule: L{qmq.cluster.queues.RemoteQueues.place_existing}), so nothing is
lost; this module moves those messages to the new home, so that clients
of every worker find them there:

    1. every L{INTERVAL} seconds, L{Drain.check} looks for local queues
       (not stand-ins, not a connection's own) whose home is another
       worker, linked now, that hold messages;
    2. it consumes each with a L{DrainConsumer} (a consumer that must ack,
       L{WINDOW} messages at a time), which forwards every delivery to the
       home exactly as a client's SEND on this worker is forwarded (the
       mesh's C{forward}: the home's store has it when the confirm comes),
       and acks it here only then: a message is in one log or the other,
       or in both for a moment (at least once, never lost);
    3. a forward that fails (the link went, the home refused) stops that
       queue's drain until the next check: what was not confirmed goes
       back to the queue (the drain's channel closes);
    4. a queue left empty with no consumer is replaced by the stand-in,
       as the mesh does for queues made before it started.
"""

from __future__ import annotations

import copy
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from qmq.core.channel import Channel
from qmq.core.consumer import Consumer
from qmq.core.errors import BrokerError
from qmq.core.remote import RemoteQueue

__all__ = ["INTERVAL", "WINDOW", "Drain", "DrainConsumer"]

log = Logger()

#: Seconds between two looks for queues to drain.
INTERVAL = 5.0
#: Most messages of one queue on their way to its home at once.
WINDOW = 200

#: Queue names that always live on their client's worker.
LOCAL_PREFIXES = ("amq.", "durable.")


class DrainConsumer(Consumer):
    """Consumes one local queue, forwarding each message to its home."""

    __slots__ = ("drain", "standin", "moved", "failed")

    def __init__(self, drain: Drain, standin: RemoteQueue) -> None:
        super().__init__(True, WINDOW)
        self.drain = drain
        self.standin = standin
        self.moved = 0
        self.failed = False

    def deliver(self, message: Any, queue: Any) -> None:
        tag = self.channel.track(self, message)  # type: ignore[union-attr]
        if self.failed:
            return  # held until the channel closes, which gives it back
        # The home publishes a forward to the queue its routing key names
        # (as a client's SEND to /queue/NAME): a copy says so, whatever
        # exchange the message came through here.
        moving = copy.copy(message)
        moving.exchange = ""
        moving.routing_key = self.standin.name
        moving.cache = None
        try:
            confirm = self.drain.forward(self.standin, moving)
        except BrokerError as e:
            self._failed(e.message)
            return
        confirm.addCallbacks(lambda _: self._acked(tag), lambda f: self._failed(f.getErrorMessage()))

    def _acked(self, tag: int) -> None:
        channel = self.channel
        if channel is None or channel.closed:
            return  # given back already: the home has a copy (at least once)
        try:
            channel.settle(tag)
        except BrokerError:
            return  # given back already (an ack timeout, the queue went)
        self.moved += 1

    def _failed(self, reason: str) -> None:
        # Nothing is given back one by one (the queue would hand it straight
        # back): the drain of this queue stops, and its channel closing
        # gives back everything not confirmed.
        first = not self.failed
        self.failed = True
        if first:
            log.warn(
                "QMQ worker: moving queue {queue!r} to its home {home!r} stopped: {reason}; "
                "tried again in {interval:g} s",
                queue=self.standin.name,
                home=self.standin.home,
                reason=reason,
                interval=INTERVAL,
            )
            self.drain.clock.callLater(0, self.drain.stop, self)

    def cancelled(self) -> None:
        """The queue was deleted."""
        self.drain.stop(self)


class Drain:
    """The worker's drain of queues whose home moved (module docstring).

    @ivar draining: (vhost, queue name) -> its consumer, while it runs.
    """

    def __init__(self, broker: Any, mesh: Any, clock: Any) -> None:
        self.broker = broker
        self.mesh = mesh
        self.clock = clock
        self.draining: dict[tuple[str, str], DrainConsumer] = {}
        self._loop: LoopingCall | None = None

    def start(self) -> None:
        self._loop = LoopingCall(self.check)
        self._loop.clock = self.clock
        self._loop.start(INTERVAL, now=False)

    def stop_all(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for consumer in list(self.draining.values()):
            self.stop(consumer)

    def forward(self, standin: RemoteQueue, message: Any) -> Any:
        return self.mesh.queues.forward(standin, message)

    def check(self) -> None:
        """Start draining what should be, and finish what is done."""
        queues = self.mesh.queues
        for vhost in list(self.broker.vhosts.values()):
            for name, queue in list(vhost.queues.items()):
                key = (vhost.name, name)
                running = self.draining.get(key)
                if running is not None:
                    if not len(queue) and not running.unacked:
                        self._finish(vhost, name, queue, running)
                    continue
                if isinstance(queue, RemoteQueue) or name.startswith(LOCAL_PREFIXES):
                    continue
                if queue.exclusive_owner is not None or queue.subscription or not len(queue):
                    continue
                try:
                    home = queues.home(vhost.name, name, queue.arguments)
                except BrokerError:
                    continue
                link = self.mesh.links.get(home) if home is not None else None
                if link is None or link.state != "up":
                    continue
                self._begin(vhost, name, home)

    def _begin(self, vhost: Any, name: str, home: str) -> None:
        count = len(vhost.queues[name])
        standin = RemoteQueue(vhost, name, home, self.mesh.queues, vhost.queues[name].arguments)
        consumer = DrainConsumer(self, standin)
        channel = Channel(self.broker, vhost, f"drain:{name}", protocol="peer")
        try:
            channel.consume(consumer, name, tag=None)
        except BrokerError as e:
            channel.close()
            log.warn("QMQ worker: cannot move queue {queue!r}: {error}", queue=name, error=e.message)
            return
        self.draining[(vhost.name, name)] = consumer
        log.info(
            "QMQ worker {node}: queue {queue!r} of virtual host {vhost!r} has its home on {home!r} now: "
            "moving its {count} message(s) there",
            node=self.mesh.node,
            queue=name,
            vhost=vhost.name,
            home=home,
            count=count,
        )

    def _finish(self, vhost: Any, name: str, queue: Any, consumer: DrainConsumer) -> None:
        self.stop(consumer)
        log.info(
            "QMQ worker {node}: queue {queue!r} moved to {home!r} ({moved} message(s))",
            node=self.mesh.node,
            queue=name,
            home=consumer.standin.home,
            moved=consumer.moved,
        )
        if queue.consumers or len(queue) or queue.deleted:
            return
        # As the mesh does for queues made before it: the stand-in.
        vhost.delete_queue(name)
        vhost.declare_queue(name, arguments=queue.arguments)

    def stop(self, consumer: DrainConsumer) -> None:
        key = (consumer.standin.vhost.name, consumer.standin.name)  # type: ignore[union-attr]
        if self.draining.get(key) is consumer:
            del self.draining[key]
        channel = consumer.channel
        if channel is not None and not channel.closed:
            channel.close()
