# -*- test-case-name: tests.test_core -*-
"""The broker: virtual hosts, message ids, time, the store and end-of-turn batching.

The core never imports the reactor itself: it gets a clock (an
C{IReactorTime}) from whoever builds it, so tests drive it with
C{twisted.internet.task.Clock}. Nor does it choose a store: the service
gives it one (L{qmq.core.store}); without one it keeps nothing on disk
(L{NullStore}).

At start the service declares what the configuration names, then calls
L{Broker.recover}: what the store kept comes back (durable topology,
messages, and the next message id: L{qmq.core.ids} starts this run's ids
above it and above a time floor, so ids never repeat across restarts).
A kept name that the rules of L{qmq.core.names} refuse today (an older
version accepted it) is kept reachable, with a warning in the log.
Declaring first means the configuration wins: a queue the configuration
declares keeps the configuration's arguments, and recovery only puts its
messages back; a durable declaration reaches the store as it is made.

The broker-wide limits (L{LimitSettings}, the C{[limits]} table) are given
at construction: every topic exchange of every virtual host gets the word
and length limits, and frontends read L{Broker.max_unfinished_bytes}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.core.admission import Admission
from qmq.core.alarm import trim_heap
from qmq.core.batch import WriteBatcher
from qmq.core.events import Observer
from qmq.core.ids import DEFAULT_NODE, MessageIds
from qmq.core.limits import LimitSettings
from qmq.core.message import Message
from qmq.core.names import InvalidName, problem
from qmq.core.store import MessageStore, NullStore, RecoveredQueue, collector_paused
from qmq.core.traffic import Traffic
from qmq.core.vhost import VirtualHost

if TYPE_CHECKING:
    from qmq.core.queue import Queue

DEFAULT_VHOST = "/"


log = Logger()


def _warn_kept(kind: str, name: str, vhost: str, slash: bool = False) -> None:
    """Log a warning if a name the store kept breaks today's rules
    (L{qmq.core.names}): it stays as it is, reachable, and can be deleted."""
    reason = problem(kind, name, slash)
    if reason is not None:
        log.warn(
            "recovered {kind} {name!r} in virtual host {vhost!r} breaks a naming rule "
            "({reason}); it is kept and reachable, but clients of some protocols may "
            "not be able to name it: consider moving its messages and deleting it",
            kind=kind,
            name=name,
            vhost=vhost,
            reason=reason,
        )


def _declare_recovered(vhost: VirtualHost, q: RecoveredQueue) -> Queue:
    """Declare a queue the store kept, as it was; arguments that name a
    dead-letter target today's rules refuse are dropped, with a warning
    (its messages come back; dead letters are not sent there)."""

    def declare(arguments: dict | None) -> Queue:
        return vhost.declare_queue(
            q.name,
            durable=True,
            auto_delete=q.auto_delete,
            arguments=arguments,
            on_demand=True,
            subscription=q.subscription,
            validate=False,
        )

    try:
        return declare(q.arguments)
    except InvalidName as e:
        if not q.arguments:
            raise
        log.warn(
            "recovered queue {name!r} in virtual host {vhost!r}: {reason}; it is kept "
            "without its dead-letter arguments",
            name=q.name,
            vhost=q.vhost,
            reason=e.message,
        )
    kept = {k: v for k, v in q.arguments.items() if k not in _DEAD_LETTER_ARGUMENTS}
    return declare(kept or None)


_DEAD_LETTER_ARGUMENTS = frozenset(("x-dead-letter-exchange", "x-dead-letter-routing-key"))


class _StoreFlush:
    """Asks the store to flush once at the end of a turn that used it."""

    __slots__ = ("store", "pending")

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.pending = False

    def flush(self) -> None:
        self.pending = False
        self.store.flush()


class Broker:
    """One broker: the root of the core's object graph.

    @ivar clock: the C{IReactorTime} all timing comes from.
    @ivar vhosts: virtual hosts by name.
    @ivar default_vhost: the virtual host named C{"/"}.
    @ivar batcher: flushes frontends' buffered writes once per reactor turn.
    @ivar store: where durable messages are kept (L{MessageStore}).
    @ivar message_ids: the source of message ids (L{MessageIds}, an
        C{itertools.count}: C{next(broker.message_ids)}), replaced by
        L{recover}; its C{prefix} names this run of this node on the wire.
    @ivar node: the node id (L{qmq.core.ids}).
    @ivar admission: whether publishers may publish now (L{Admission}),
        fed by the memory alarm, the disk alarm and the store's health;
        every frontend asks it.
    @ivar memory_alarm: the broker-wide memory alarm
        (L{qmq.core.alarm.MemoryAlarm}), or None when there is none;
        setting it makes admission watch it.
    @ivar disk_alarm: the disk free-space alarm
        (L{qmq.core.alarm.DiskAlarm}), or None; setting it makes admission
        watch it (persistent publishes only).
    @ivar auth: the authenticator frontends log clients in with, or None.
    @ivar unfinished_bytes: bytes of frames still being received.
    @ivar max_unfinished_bytes: the most allowed (0: no limit), from
        C{limits.max_unfinished_bytes}.
    @ivar limits: the broker-wide limits (L{LimitSettings}); virtual hosts
        read the topic limits from here when they make a topic exchange.
    """

    def __init__(
        self,
        clock: Any = None,
        store: MessageStore | None = None,
        limits: LimitSettings | None = None,
        node: str = DEFAULT_NODE,
    ) -> None:
        """
        @param clock: the C{IReactorTime}; the global reactor if None.
        @param node: the node id, in every wire name of a delivery.
        @param store: where durable messages go; L{NullStore} if None.
        @param limits: the broker-wide limits; L{LimitSettings}'s defaults
            if None.
        """
        if clock is None:
            from twisted.internet import reactor as clock  # noqa: PLC0415
        self.clock = clock
        # Before the first virtual host: its amq.topic reads the limits.
        self.limits = limits if limits is not None else LimitSettings()
        self.store: MessageStore = store if store is not None else NullStore()
        self.admission = Admission()
        self.admission.watch_store(self.store)
        self._memory_alarm: Any = None
        self._disk_alarm: Any = None
        self._store_flush = _StoreFlush(self.store)
        self.vhosts: dict[str, VirtualHost] = {}
        # Observers of every virtual host's events: [observer, replay, stops].
        self._observers: list[list[Any]] = []
        self.default_vhost = self.add_vhost(DEFAULT_VHOST)
        self.batcher = WriteBatcher(clock)
        self.node = node
        # (A fake reactor without a clock starts from the floor of 0.)
        self.message_ids = MessageIds.starting(getattr(clock, "seconds", float)(), 1, node)
        #: Messages published, delivered and acked, by protocol (L{qmq.core.traffic}).
        self.traffic = Traffic()
        #: Authentication (L{qmq.auth.Authenticator}), set by the service
        #: when users or tokens are configured; None: every client is
        #: anonymous with every right.
        self.auth: Any = None
        #: The configured listeners (each with C{protocol}, C{spec} and
        #: C{port}, None while not bound), set by the service; the
        #: readiness check asks them (L{qmq.web.api.health}).
        self.listeners: list[Any] = []
        #: Bytes of frames still being received, over all connections, and
        #: the most allowed (0: no limit); frontends keep the count.
        self.unfinished_bytes = 0
        self.max_unfinished_bytes = self.limits.max_unfinished_bytes
        #: Gives free heap memory back to the OS (L{release_memory}); None: never.
        self.trim: Callable[[], object] | None = trim_heap
        #: Where queues live in a mesh (L{qmq.core.remote.Homes}), set by
        #: the mesh; None: every queue lives here.
        self.homes: Any = None
        self._trim_call: Any = None

    @property
    def memory_alarm(self) -> Any:
        return self._memory_alarm

    @memory_alarm.setter
    def memory_alarm(self, alarm: Any) -> None:
        self._memory_alarm = self._watch(self._memory_alarm, alarm, "memory", False)

    @property
    def disk_alarm(self) -> Any:
        return self._disk_alarm

    @disk_alarm.setter
    def disk_alarm(self, alarm: Any) -> None:
        self._disk_alarm = self._watch(self._disk_alarm, alarm, "disk", True)

    def _watch(self, old: Any, alarm: Any, name: str, persistent_only: bool) -> Any:
        """Admission follows C{alarm} (None: no alarm) instead of C{old}."""
        if old is not alarm:
            self.admission.watch_alarm(alarm, name, persistent_only)
        return alarm

    def add_vhost(self, name: str) -> VirtualHost:
        """Create the virtual host C{name}, or return it if it exists."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(self, name)
            for entry in self._observers:
                entry[2].append(vhost.observe(entry[0], entry[1]))
        return vhost

    def observe(self, observer: Observer, replay: bool = True) -> Callable[[], None]:
        """Make C{observer} listen to the interest and topology events
        (L{qmq.core.events}) of every virtual host, those made later too.

        @return: the call that stops it listening everywhere.
        """
        entry: list[Any] = [observer, replay, [v.observe(observer, replay) for v in self.vhosts.values()]]
        self._observers.append(entry)

        def stop() -> None:
            if entry in self._observers:
                self._observers.remove(entry)
            stops, entry[2] = entry[2], []
            for each in stops:
                each()

        return stop

    def vhost(self, name: str | None) -> VirtualHost | None:
        """The virtual host called C{name}, or None."""
        return self.vhosts.get(name) if name is not None else self.default_vhost

    def recover(self) -> None:
        """Bring back what the store kept (call once, before listening).

        Call it after the configuration's declarations: what they declared
        exists already and is kept as declared (a kept exchange must have
        the declared type, else L{PreconditionFailed}). A kept queue that
        the configuration does not declare was made at runtime by a client,
        so it comes back under its virtual host's defaults for queues made
        on demand, its own arguments over them.

        @raise BrokerError: what the store kept contradicts the declarations.
        """
        # A queue and its message per durable queue, all long-lived.
        with collector_paused():
            self._recover()
        # Replay's buffers (whole segments) and the tables its dicts grew
        # out of are free now: give the heap's free pages back.
        if self.trim is not None:
            self.trim()

    def _recover(self) -> None:
        recovery = self.store.recover()
        self.message_ids = MessageIds.starting(
            getattr(self.clock, "seconds", float)(), recovery.next_message_id, self.node
        )
        for vhost_name, name, type_, auto_delete, *more in recovery.exchanges:
            _warn_kept("exchange name", name, vhost_name, True)
            options = (more[0] if more else None) or {}
            self.add_vhost(vhost_name).declare_exchange(
                name, type_, True, auto_delete, validate=False,
                internal=bool(options.get("internal")), arguments=options.get("arguments"),
            )
        gone = []
        kept = recovery.messages
        entries = recovery.queues
        for i, entry in enumerate(entries):
            # Each entry, and its messages' list, is let go as soon as its
            # queue is made: what a million queues leave behind is then
            # reused by the next queues' objects rather than left as holes
            # in the heap (a fifth of the memory of a recovered queue).
            entries[i] = None
            q = entry if entry.__class__ is RecoveredQueue else RecoveredQueue(*entry)
            vhost = self.add_vhost(q.vhost)
            if q.name not in vhost.queues:
                _warn_kept("queue name", q.name, q.vhost)
            queue = _declare_recovered(vhost, q)
            if q.exclusive:
                gone.append((vhost, q.name))
            if kept:
                messages = kept.pop((q.vhost, q.name), None)
                if messages:
                    queue.restore(messages)
        for vhost_name, queue_name, exchange, key, arguments in recovery.bindings:
            _warn_kept("binding key", key, vhost_name)
            self.add_vhost(vhost_name).bind(queue_name, exchange, key, arguments, validate=False)
        for vhost_name, destination, source, key, arguments in recovery.exchange_bindings:
            _warn_kept("binding key", key, vhost_name)
            self.add_vhost(vhost_name).bind_exchange(
                destination, source, key, arguments, validate=False
            )
        for (vhost_name, queue_name), messages in kept.items():
            # Messages of a queue the store did not list.
            queue = self.add_vhost(vhost_name).queues.get(queue_name)
            if queue is not None:
                queue.restore(messages)
        for vhost, name in gone:
            # Its connection is gone: as if it had closed (messages and all).
            vhost.delete_queue(name)

    def new_message(
        self,
        exchange: str,
        routing_key: str,
        headers: dict[str, str] | None,
        body: bytes,
        persistent: bool = False,
    ) -> Message:
        """Build a message stamped with a fresh id and the clock's time
        (L{qmq.core.channel.Channel.new_message} does the same, inline)."""
        return Message(
            next(self.message_ids), exchange, routing_key, headers, body, self.clock.seconds(), persistent
        )

    def store_publish(self, vhost: VirtualHost, message: Message, queues: Sequence[Queue]) -> Any:
        """Give a persistent message to the store (see L{VirtualHost.publish_to})."""
        waiter = self.store.publish(vhost, message, queues)
        flusher = self._store_flush
        if not flusher.pending:
            flusher.pending = True
            self.batcher.want_flush(flusher)
        return waiter

    def release_memory(self) -> None:
        """Large buffers were just freed (a connection holding megabytes of
        an unfinished frame went): give the free heap back to the OS soon,
        once however often asked, so that RSS follows what is held."""
        if self.trim is not None and self._trim_call is None:
            self._trim_call = self.clock.callLater(0.25, self._release_now)

    def _release_now(self) -> None:
        self._trim_call = None
        if self.trim is not None:
            self.trim()

    def close(self) -> Any:
        """Shut the store down (after every listener closed), and stop every
        timer of the core (L{stop_timers})."""
        if self._trim_call is not None and self._trim_call.active():
            self._trim_call.cancel()
            self._trim_call = None
        self.stop_timers()
        return self.store.close()

    def stop_timers(self) -> None:
        """Cancel the timers of every virtual host and queue (queue expiry,
        delayed messages, message expiry, ack timeouts): at shutdown, when
        no client is left. Messages keep their state; nothing fires."""
        for vhost in self.vhosts.values():
            vhost.stop_timers()
