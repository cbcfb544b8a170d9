# -*- test-case-name: tests.test_cluster_queues -*-
"""Queues whose home is another node: the core's one decision about them.

In a mesh (docs/cluster.rst, "Queues across nodes") each queue has one home
node. Which one is a policy's business (L{qmq.cluster.placement}); that a
queue is remote, and what that means for a publish or a consumer, is
decided here, once, for every frontend:

    - L{qmq.core.vhost.VirtualHost.declare_queue} asks the broker's
      L{Homes} (C{broker.homes}, None outside a mesh) where a queue it is
      about to make lives. When another node is its home it makes a
      L{RemoteQueue} instead: a stand-in, kept in the virtual host's
      queues like any queue, so every frontend that names the queue
      (STOMP's C{/queue/q}, AMQP's default exchange and C{basic.consume},
      the HTTP API) finds it by the same lookups as a local one.
    - L{qmq.core.channel.Channel.publish_target} and
      L{qmq.core.channel.Channel.publish} hand a message for a stand-in to
      C{Homes.forward}: the answer is the durability Deferred every
      frontend already waits on before its RECEIPT, HTTP 201 or AMQP
      confirm; it fires when the home node's store has the message, and
      fails (with the home's refusal, or because the link went) otherwise.
      When the home is not linked the publish is refused at once
      (L{Unavailable}: a STOMP ERROR, HTTP 503, AMQP 404).
    - L{qmq.core.channel.Channel.consume} attaches a consumer to the
      stand-in as to a queue; the stand-in asks C{Homes.open} for a
      consumer on the home node, with a window. What the home delivers
      comes back through L{RemoteQueue.from_home}, and the channel's
      settles (acks, nacks, rejects, a channel closing) go back through
      C{Homes.settle} and C{Homes.close}. A consumer without acks takes
      its deliveries off the queue on the home as they go (as a local one
      does); each handed to its client gives the home one more credit
      (C{Homes.credit}), and what it had not taken when it goes is
      published to the queue again.

Queues that are never remote: names starting with C{amq.} or C{durable.}
(a connection's own queues, durable subscriptions: the node of their
client), exclusive queues, private subscription queues. The L{Homes}
decides the rest.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from twisted.logger import Logger

from qmq.core.errors import NotFound, PreconditionFailed
from qmq.core.queue import Queue

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from qmq.core.consumer import Consumer
    from qmq.core.message import Message
    from qmq.core.vhost import VirtualHost

__all__ = ["Homes", "RemoteQueue", "Unavailable", "home_of"]

log = Logger()


class Unavailable(NotFound):
    """A queue's home node is not reachable now (RabbitMQ's 404
    C{NOT_FOUND}: "home node ... is down or inaccessible"); the HTTP API
    answers 503."""


class Homes(Protocol):
    """Where queues live, and the way to them (what a mesh gives the core).

    Each method is called by the core only; none may call back into the
    core synchronously but as documented.
    """

    def home(self, vhost: str, name: str, arguments: dict[str, Any] | None) -> str | None:
        """The node a new queue C{name} lives on, or None for this node.

        @raise PreconditionFailed: a bad placement argument.
        """

    def declared(self, queue: RemoteQueue) -> None:
        """A stand-in was made with arguments: its home should have them."""

    def owner(self, vhost: str, name: str) -> str | None:
        """The node one of whose connections holds queue C{name} exclusively
        (as that node told), when it is another node; else None."""

    def reachable(self, queue: RemoteQueue) -> None:
        """@raise Unavailable: the home of C{queue} is not reachable now."""

    def get(self, queue: RemoteQueue, ack: bool) -> Deferred:
        """Take the next ready message of C{queue} on its home (a basic.get):
        a Deferred of (message, how many remain) or None. With C{ack} it
        waits on the home until C{settle} names it."""

    def scan(self, queue: RemoteQueue, start: float, end: float, cursor: str | None, limit: int) -> Deferred:
        """A range scan of C{queue} on its home (its log holds the
        messages), the arguments checked already: a Deferred of a
        L{qmq.core.store.ScanPage} naming the home (C{node}); the page may
        hold fewer messages than the home read, its cursor going on after
        the last, so that it fits one answer."""

    def operate(self, queue: RemoteQueue, op: str, args: dict[str, Any]) -> Deferred:
        """Do management operation C{op} (C{queue.purge}, C{queue.delete},
        C{queue.bind}, C{queue.unbind}) on C{queue}'s home, the caller's
        access checked already: a Deferred of the home's answer, failing
        with its refusal or L{Unavailable}."""

    def forward(self, queue: RemoteQueue, message: Message) -> Deferred:
        """Send C{message} to C{queue}'s home: a Deferred that fires once
        the home has it (as durable as its store makes it).

        @raise Unavailable: the home is not reachable now.
        """

    def open(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """C{consumer} attached to C{queue}: consume on the home."""

    def close(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """C{consumer} left C{queue}: the home gives back what it holds."""

    def settle(
        self, queue: RemoteQueue, messages: list[Message], ack: bool, requeue: bool
    ) -> None:
        """Messages C{queue} delivered are acked, or given back (C{requeue})
        or dropped on the home."""

    def credit(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """C{consumer}, which does not ack, took a delivery of C{queue}:
        the home may send it one more (its deliveries left the queue on
        the home as they went)."""


class RemoteQueue(Queue):
    """The stand-in of a queue whose home is another node (see the module
    docstring). It holds no messages: what its consumers were handed waits
    on the home, unacked, until they settle it.

    @ivar home: the node id of the home.
    @ivar remote: the L{Homes} that reaches it.
    @ivar held: consumer -> deliveries from the home waiting while it is
        paused (bounded by the window the home was given).
    """

    __slots__ = ("home", "remote", "held")

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        home: str,
        remote: Homes,
        arguments: dict | None = None,
    ) -> None:
        # Not durable here (the store never hears of a stand-in); its home
        # keeps the queue as it was declared there.
        super().__init__(vhost, name, False, None, False, arguments, None)
        self.home = home
        self.remote = remote
        self.held: dict[Consumer, deque[Message]] = {}

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.name!r} home={self.home!r} consumers={len(self.consumers)}>"

    # -- publishing ----------------------------------------------------------

    def publish(self, message: Message) -> bool | None:
        """A publish that reached the stand-in other than through a
        channel (a dead letter, a tool): forwarded, its confirm logged if it
        fails. Channels use C{remote.forward} and pass the confirm on."""
        self.published += 1
        try:
            confirm = self.remote.forward(self, message)
        except NotFound as e:
            log.warn("a message for queue {queue!r} was not forwarded: {error}", queue=self.name, error=e.message)
            return True
        confirm.addErrback(
            lambda f: log.warn(
                "a message for queue {queue!r} was not taken by its home: {error}",
                queue=self.name,
                error=f.getErrorMessage(),
            )
        )
        return True  # not kept here: nothing for this node's store

    def would_refuse(self, message: Message) -> bool:
        return False

    def get(self) -> Message | None:
        raise PreconditionFailed(
            f"Queue {self.name!r} lives on node {self.home!r}: consume it from here, or "
            "get from it on its home node.",
            "get of a remote queue",
        )

    def purge(self) -> int:
        raise PreconditionFailed(
            f"Queue {self.name!r} lives on node {self.home!r}: purge it there.",
            "purge of a remote queue",
        )

    # -- consumers -----------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        consumer.queue = self
        if self.consumers.__class__ is tuple:
            self.consumers = []
            self._disarm_expiry()
        self.consumers.append(consumer)
        self.remote.open(self, consumer)

    def remove_consumer(self, consumer: Consumer, unacked: list[Message] = ()) -> None:  # type: ignore[assignment]
        """The home takes back what C{consumer} held (its consumer there
        goes: every unacked delivery returns to the queue)."""
        try:
            self.consumers.remove(consumer)  # type: ignore[union-attr]
        except (ValueError, AttributeError):
            return
        consumer.queue = None
        held = self.held.pop(consumer, None)
        self.remote.close(self, consumer)
        if not self.consumers:
            self.consumers = ()
        if held and not consumer.ack_required:
            self._give_back(held)

    def _give_back(self, messages: deque[Message]) -> None:
        """Deliveries without acks a consumer that went never took: this
        node's (they left the queue on the home), so back to the queue."""
        for message in messages:
            self.publish(message)

    def detach_all(self) -> list[Consumer]:
        consumers = super().detach_all()
        for consumer in consumers:
            self.held.pop(consumer, None)  # deleted: what it held goes with the queue
            self.remote.close(self, consumer)
        return consumers

    def from_home(self, consumer: Consumer, message: Message) -> bool:
        """The home delivered C{message} to C{consumer}: hand it over now,
        or hold it while the consumer is paused.

        @return: whether C{consumer} still consumes here.
        """
        if consumer.queue is not self:
            return False
        held = self.held.get(consumer)
        if held is not None or consumer.paused or consumer.credit <= 0:
            if held is None:
                held = self.held[consumer] = deque()
            held.append(message)
            return True
        self._hand(consumer, message)
        return True

    def _hand(self, consumer: Consumer, message: Message) -> None:
        self.delivered += 1
        if consumer.ack_required:
            consumer.credit -= 1
            consumer.deliver(message, self)
        else:
            consumer.deliver(message, self)
            self.remote.credit(self, consumer)

    def drain(self) -> None:
        """Hand what waited to the consumers that may take it now."""
        held = self.held
        if not held:
            return
        for consumer, messages in list(held.items()):
            while messages and not consumer.paused and consumer.credit > 0 and consumer.queue is self:
                self._hand(consumer, messages.popleft())
            if not messages and held.get(consumer) is messages:
                del held[consumer]

    # -- settling ------------------------------------------------------------

    def ack(self, consumer: Consumer, message: Message) -> None:
        consumer.credit += 1
        self.remote.settle(self, [message], True, False)
        if self.held:
            self.drain()

    def reject(self, consumer: Consumer, messages: list[Message], requeue: bool) -> None:
        consumer.credit += len(messages)
        self.remote.settle(self, messages, False, requeue)
        if self.held:
            self.drain()

    def requeue(self, messages: list[Message]) -> None:
        self.remote.settle(self, messages, False, True)


def home_of(queue: Queue | None) -> str | None:
    """The node C{queue} lives on, in a mesh (for a client: STOMP's
    C{home} receipt header, the HTTP API's queue view); None outside one."""
    if queue is None:
        return None
    if queue.remote is not None:
        return queue.home  # type: ignore[attr-defined,no-any-return]
    vhost = queue.vhost
    broker = vhost.broker if vhost is not None else None
    return broker.node if broker is not None and broker.homes is not None else None
