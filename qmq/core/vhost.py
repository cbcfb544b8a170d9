# -*- test-case-name: tests.test_core -*-
"""Virtual hosts: the namespace of exchanges, queues and bindings.

This is AMQP 0-9-1's model. Every virtual host has the default exchange
(C{""}, routing to the queue named by the routing key) and C{amq.direct},
C{amq.fanout}, C{amq.topic}, C{amq.headers}. Frontends publish with
L{VirtualHost.publish} and consume by attaching a
L{qmq.core.consumer.Consumer} to a queue.

Frontends do not call a virtual host directly: they go through a
L{qmq.core.channel.Channel}, which speaks AMQP's operations and tags
deliveries; the virtual host does the routing (L{VirtualHost.publish_to}:
atomic, one store call per publish) and keeps the topology.

Two settings come from the configuration through the service:

  - the topic limits: every topic exchange made here (C{amq.topic} and
    declared ones) gets C{max_words} and C{max_key_length} from the broker's
    L{qmq.core.limits.LimitSettings} (C{limits.max_topic_words},
    C{limits.max_routing_key_length});
  - L{VirtualHost.queue_defaults}: the policy of queues a client makes by
    naming them (C{declare_queue(..., on_demand=True)}), from the virtual
    host's C{queue_defaults} table (L{VirtualHost.set_queue_defaults}).
    Queues declared with arguments (configuration, a frontend's private
    queues) do not get them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.core.errors import (
    AccessRefused,
    BrokerError,
    NoSuchExchange,
    NoSuchQueue,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from qmq.core.events import Events, Observer, observe
from qmq.core.exchange import (
    ALTERNATE_EXCHANGE,
    EXCHANGE_CLASSES,
    EXCHANGE_TYPES,
    Exchange,
    TopicExchange,
    alternate_of,
)
from qmq.core.expiry import ExpiryWheel
from qmq.core.guarantee import queue_class_for
from qmq.core.names import MAX_NAME_BYTES, check_binding_key, check_exchange, check_queue
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX
from qmq.core.policy import DEFAULT_POLICY, QueuePolicy
from qmq.core.queue import Queue
from qmq.core.remote import RemoteQueue, Unavailable
from qmq.core.store import ScanPage

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from qmq.core.broker import Broker
    from qmq.core.message import Message
    from qmq.core.store import MessageStore

log = Logger()

#: Headers a dead-lettered copy does not keep: the STOMP destination it was
#: sent to (it is delivered from its new one) and its delivery time.
_NOT_DEAD_LETTERED = frozenset(("destination", "deliver-at", "delay", "expires", "ttl"))

#: The headers a dead-lettered message carries (L{VirtualHost.dead_letter}).
DEATH_HEADERS = (
    "x-death-queue",
    "x-death-reason",
    "x-death-count",
    "x-death-exchange",
    "x-death-routing-key",
    "x-death-time",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
)

#: Most bytes (UTF-8) in a queue name (AMQP 0-9-1's short string): clients
#: name queues, and a name is kept for as long as its queue lives
#: (L{qmq.core.names} has every rule a name follows).
MAX_QUEUE_NAME = MAX_NAME_BYTES

__all__ = ["DURABLE_SUBSCRIPTION_PREFIX", "MAX_QUEUE_NAME", "VirtualHost"]

#: Most messages one page of a range scan may hold (L{VirtualHost.scan}).
MAX_SCAN_LIMIT = 1000

# A scan cursor: "i" then the last id returned, in hex.
_CURSOR = re.compile(r"i([0-9a-f]{1,16})\Z")


def make_cursor(after: int) -> str:
    """The opaque cursor that goes on after message id C{after}."""
    return f"i{after:x}"


def parse_cursor(cursor: object) -> int:
    """The message id a cursor goes on after.

    @raise PreconditionFailed: not a cursor L{make_cursor} made.
    """
    match = _CURSOR.match(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise PreconditionFailed(f"not a scan cursor: {cursor!r}")
    return int(match.group(1), 16)


def _shown(value: object) -> str:
    """A declaration's value as RabbitMQ's equivalence errors show it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    return repr(value)


def _is_time(value: object) -> bool:
    return value.__class__ in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _page(result: tuple[list[Message], int | None]) -> ScanPage:
    messages, following = result
    return ScanPage(messages, make_cursor(following) if following is not None else None)


EXCHANGE_CLASSES_SET = frozenset(EXCHANGE_CLASSES.values())

STANDARD_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
)


class VirtualHost:
    """A virtual host.

    @ivar name: its name (the default one is C{"/"}).
    @ivar exchanges: exchanges by name (the default exchange is not listed).
    @ivar queues: queues by name.
    @ivar queue_defaults: the policy that queues created on demand start
        from (their own arguments, if any, override it); no limits until
        L{set_queue_defaults} says otherwise.
    @ivar expiry: the deadlines of its unused queues that have an expiry
        policy (None without a broker).
    @ivar allow_create: whether a client may create a queue by naming it
        (L{qmq.core.channel.Channel.named_queue}); the configuration's
        C{allow_create}.
    @ivar fsync: the commit log's fsync policy for its durable queues that
        do not set C{x-fsync}; None for the store's own (C{[commit_log]}).
    """

    allow_create = True

    def __init__(self, broker: Broker | None, name: str) -> None:
        self.broker = broker
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.queue_defaults: QueuePolicy = DEFAULT_POLICY
        # (queue_defaults, the class of a queue made on demand with them).
        self._on_demand_class: tuple[QueuePolicy | None, type[Queue]] = (None, Queue)
        self.fsync: str | None = None
        #: Counts for C{/metrics}, kept where the rare event happens (never
        #: per delivered message): messages given back to a queue
        #: (L{Queue.requeue}), republished to a dead-letter exchange
        #: (L{dead_letter}), and published to no queue and dropped
        #: (L{publish_to} with no target; a mandatory one is returned).
        self.redelivered = 0
        self.dead_lettered = 0
        self.unroutable = 0
        #: The interest and topology events' observers (L{qmq.core.events}),
        #: or None while nobody listens (each change then pays one test).
        self.events: Events | None = None
        # Deadlines of unused queues with an expiry policy.
        self.expiry: ExpiryWheel | None = ExpiryWheel(broker.clock) if broker is not None else None
        for ex_name, ex_type in STANDARD_EXCHANGES:
            self.declare_exchange(ex_name, ex_type)

    def __repr__(self) -> str:
        return f"<VirtualHost {self.name!r} queues={len(self.queues)}>"

    def set_queue_defaults(self, arguments: Mapping[str, Any] | None) -> QueuePolicy:
        """Set the defaults of queues created on demand from queue arguments.

        Queues that exist already keep their policy.

        @param arguments: queue arguments by their core names
            (C{x-max-length}, C{x-max-length-bytes}, C{x-overflow},
            C{x-expires}, C{x-delivery-limit}); None or empty for no limits.
        @return: the new L{queue_defaults}.
        @raise PreconditionFailed: an argument has a bad value.
        """
        self.queue_defaults = QueuePolicy.from_arguments(dict(arguments or {}))
        return self.queue_defaults

    def observe(self, observer: Observer, replay: bool = True) -> Any:
        """Make C{observer} listen to this virtual host's interest and
        topology events (L{qmq.core.events.observe}); return the call that
        stops it."""
        return observe(self, observer, replay)

    def stop_timers(self) -> None:
        """Cancel every timer of this virtual host and its queues (shutdown)."""
        if self.expiry is not None:
            self.expiry.stop()
        for queue in self.queues.values():
            queue.stop_timers()

    # -- exchanges ---------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type: str,
        durable: bool = True,
        auto_delete: bool = False,
        validate: bool = True,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> Exchange:
        """Create an exchange, or return the existing one if it agrees.

        An exchange declared again must agree on its type, on C{internal}
        and on its alternate exchange (RabbitMQ's equivalence; durable and
        auto-delete are the first declaration's).

        @param validate: check a new exchange's name (L{qmq.core.names});
            False only for what a store recovered (kept as it was).
        @param internal: clients may not publish to it (L{Exchange.internal}).
        @param arguments: its arguments: C{alternate-exchange} (L{alternate_of});
            others are kept and mean nothing.
        @raise PreconditionFailed: unknown type, an existing exchange of
            another type, internal flag or alternate, or a bad argument.
        @raise InvalidName: the name breaks a rule of L{qmq.core.names}.
        """
        if type not in EXCHANGE_TYPES:
            raise PreconditionFailed(
                f"unknown exchange type {type!r} (expected one of {', '.join(EXCHANGE_TYPES)})"
            )
        if not name:
            raise AccessRefused("the default exchange cannot be declared")
        alternate = alternate_of(arguments)
        existing = self.exchanges.get(name)
        if existing is not None:
            if existing.type != type:
                raise PreconditionFailed(
                    f"exchange {name!r} exists with type {existing.type!r}, not {type!r}"
                )
            for arg, received, current in (
                ("internal", bool(internal), existing.internal),
                (ALTERNATE_EXCHANGE, alternate, existing.alternate),
            ):
                if received != current:
                    # RabbitMQ's words.
                    raise PreconditionFailed(
                        f"inequivalent arg {arg!r} for exchange {name!r} in vhost {self.name!r}: "
                        f"received {_shown(received)} but current is {_shown(current)}",
                        "inequivalent exchange arguments",
                    )
            return existing
        if validate:
            check_exchange(name)
        exchange = EXCHANGE_CLASSES[type](name, durable, auto_delete)
        if internal:
            exchange.internal = True
        if arguments:
            exchange.arguments = dict(arguments)
            exchange.alternate = alternate
        if isinstance(exchange, TopicExchange) and self.broker is not None:
            limits = self.broker.limits
            exchange.max_words = limits.max_topic_words
            exchange.max_key_length = limits.max_routing_key_length
        self.exchanges[name] = exchange
        if durable and self.broker is not None and not name.startswith("amq."):
            self.broker.store.declare_exchange(self, exchange)
        if self.events is not None:
            self.events.exchange_declared(exchange)
        return exchange

    def exchange(self, name: str) -> Exchange:
        """The exchange called C{name}. @raise NotFound: there is none."""
        try:
            return self.exchanges[name]
        except KeyError:
            raise NoSuchExchange(f"no exchange {name!r} in virtual host {self.name!r}") from None

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings."""
        if name.startswith("amq."):
            raise AccessRefused(f"exchange {name!r} is built in")
        exchange = self.exchange(name)
        for source, key, arguments in list(exchange.sources or ()):
            self.unbind_exchange(name, source.name, key, arguments)
        for target, key, arguments in list(exchange.bindings()):
            if isinstance(target, Queue):
                self.unbind(target.name, name, key, arguments)
            elif isinstance(target, Exchange):
                self.unbind_exchange(target.name, name, key, arguments)
            else:
                # A live consumer bound straight to the exchange: it has no
                # queue to fall back on, so its client is told.
                exchange.unbind(target, key, arguments)
                if self.events is not None:
                    self.events.unbound(exchange, key)
                target.exchange = None
                target.cancelled()
        # An auto-delete exchange is gone already once its last binding went.
        if self.exchanges.pop(name, None) is not None and self.events is not None:
            self.events.exchange_deleted(exchange)
        exchange.deleted = True
        if exchange.durable and self.broker is not None:
            self.broker.store.delete_exchange(self, exchange)

    # -- queues ------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: dict | None = None,
        exclusive_owner: object = None,
        on_demand: bool = False,
        backlog: int = 0,
        policy: QueuePolicy | None = None,
        subscription: bool = False,
        validate: bool = True,
    ) -> Queue:
        """Create a queue, or return the existing one.

        A new queue's name must follow L{qmq.core.names}; an existing one is
        returned whatever its name (a durable queue recovered with a name
        an older version accepted stays reachable).

        @param on_demand: the queue is made because a client named it (not
            declared in configuration): it starts from L{queue_defaults},
            and C{arguments} given override them. Ignored for a queue that
            exists.
        @param backlog: for a private subscription queue, the most messages it
            holds (the oldest are dropped past it); 0 for unbounded.
        @param policy: the policy to start from, over C{backlog} and
            C{on_demand} (a private queue whose subscriber states a buffer).
        @param subscription: the queue of a durable topic subscription: made
            on demand, it never expires (see L{_on_demand_policy}).
        @param validate: check a new queue's name; False only for what a
            store recovered, or a name the caller checked already.
        @raise AccessRefused: the queue is exclusive to another session.
        @raise ResourceLocked: an exclusive queue whose name a connection of
            another node of the mesh holds exclusively.
        @raise PreconditionFailed: bad arguments.
        @raise InvalidName: the name breaks a rule of L{qmq.core.names}.
        """
        queue = self.queues.get(name)
        if queue is not None:
            if queue.exclusive_owner is not None and queue.exclusive_owner is not exclusive_owner:
                raise AccessRefused(f"queue {name!r} is exclusive to another session")
            # A redeclare is a use: an x-expires countdown starts over.
            queue.touch()
            return queue
        if not name:
            raise PreconditionFailed("a queue needs a name")
        if validate:
            check_queue(name)
        broker = self.broker
        if exclusive_owner is not None:
            self.check_unlocked(name)
        if (
            broker is not None
            and broker.homes is not None
            and exclusive_owner is None
            and not (backlog or policy is not None)
        ):
            home = broker.homes.home(self.name, name, arguments)
            if home is not None:
                # Its home is another node: a stand-in (qmq.core.remote). A
                # durable subscription's is declared there by its channel.
                return self._add_stand_in(name, home, None if subscription else arguments)
        if on_demand and policy is None and not (backlog or subscription or arguments):
            # The common case, a client naming a new queue (a million of
            # them in a row, at worst): the virtual host's defaults, whose
            # queue class is looked up once per defaults.
            base = self.queue_defaults
            made = self._on_demand_class
            if made[0] is not base:
                made = self._on_demand_class = (base, queue_class_for(base.guarantee))
            cls = made[1]
            guarantee = base.guarantee
            queue = cls(self, name, durable, exclusive_owner, auto_delete, None, base)
        else:
            base = (
                policy
                if policy is not None
                # A private subscription's backlog: bounded like x-max-length
                # + drop-head, one shared policy, no arguments dict per queue.
                else QueuePolicy.shared(max_length=backlog, overflow="drop-head")
                if backlog
                else self._on_demand_policy(subscription) if on_demand else None
            )
            # The delivery guarantee picks the class (a plain Queue for the
            # default): known only once the arguments are read over the base.
            guarantee = (base or DEFAULT_POLICY).guarantee
            if arguments:
                guarantee = QueuePolicy.from_arguments(arguments, base).guarantee
            cls = queue_class_for(guarantee)
            queue = cls(
                self,
                name,
                durable,
                exclusive_owner,
                auto_delete,
                arguments,
                base,
                subscription=subscription,
            )
        self.queues[name] = queue
        if durable and self.broker is not None:
            store = self.broker.store
            # An at-most-once queue's messages never reach the store (its
            # topology does, through _durable_store).
            if cls is Queue or guarantee != "at-most-once":
                queue.store = store
            store.declare_queue(self, queue)
        if self.events is not None:
            self.events.queue_declared(queue)
        return queue

    def stand_in(self, name: str) -> Queue | None:
        """The stand-in of queue C{name} when its home is another node
        (made now: a publish to it names it), else None (L{qmq.core.remote})."""
        existing = self.queues.get(name)
        if existing is not None:
            return existing if existing.remote is not None else None
        home = self.placed_elsewhere(name)
        if home is None:
            return None
        return self._add_stand_in(name, home, None)

    def placed_elsewhere(self, name: str) -> str | None:
        """The node a queue C{name} lives on when its placement names
        another node (whether or not it exists, or was named here), else
        None: it would live here, or no queue can have that name."""
        broker = self.broker
        homes = broker.homes if broker is not None else None
        if homes is None or not name:
            return None
        try:
            check_queue(name)
            return homes.home(self.name, name, None)
        except BrokerError:
            return None

    def queue_or_stand_in(self, name: str) -> Queue:
        """Queue C{name}, to act on by name (purge, delete, bind, get): the
        queue here, or, when its home is another node, its stand-in (made
        now: a queue that node holds may never have been named here).
        @raise NoSuchQueue: neither."""
        queue = self.queues.get(name)
        if queue is None:
            queue = self.stand_in(name)
        return queue if queue is not None else self.queue(name)

    def home_facts(self, queue: Queue) -> Deferred:
        """What the home of C{queue} (a stand-in) says of it: a Deferred of
        its L{qmq.core.management.queue_facts}, failing with the home's
        refusal (a stand-in of a name the home does not have goes:
        L{not_on_home})."""
        d = queue.remote.operate(queue, "queue", {})  # type: ignore[union-attr]
        return d.addErrback(self.not_on_home, queue)  # type: ignore[no-any-return]

    def check_unlocked(self, name: str) -> None:
        """@raise ResourceLocked: a connection of another node of the mesh
        holds queue C{name} exclusively (as that node told)."""
        homes = self.broker.homes if self.broker is not None else None
        elsewhere = homes.owner(self.name, name) if homes is not None else None
        if elsewhere is not None:
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue {name!r} in vhost {self.name!r}: "
                f"it is exclusive to a connection on node {elsewhere!r}", "resource locked")

    def not_on_home(self, failure: Any, queue: Queue) -> Any:
        """An errback for what C{queue}'s home answered: when the home has
        no such queue, the stand-in goes too (unless clients use it), so
        that names asked for and not found leave nothing here. The failure
        passes on."""
        if (
            failure.check(NotFound)
            and not failure.check(Unavailable)
            and self.queues.get(queue.name) is queue
            and queue.remote is not None
            and not queue.consumers
        ):
            self.delete_queue(queue.name)
        return failure

    def _add_stand_in(self, name: str, home: str, arguments: dict | None) -> Queue:
        assert self.broker is not None
        queue = RemoteQueue(self, name, home, self.broker.homes, arguments)
        self.queues[name] = queue
        if arguments:
            self.broker.homes.declared(queue)
        return queue

    def _durable_store(self, queue: Queue) -> MessageStore | None:
        """The store that keeps C{queue}'s topology (declaration, bindings),
        or None: the broker's for a durable queue. (C{queue.store}, which
        keeps its messages, is None for an at-most-once queue.)"""
        return self.broker.store if queue.durable and self.broker is not None else None

    def _on_demand_policy(self, subscription: bool) -> QueuePolicy:
        """The defaults of a queue made on demand: L{queue_defaults}, but a
        durable subscription's queue never expires, as ActiveMQ keeps an
        offline durable subscriber by default: its client may stay away
        longer than any C{x-expires}."""
        defaults = self.queue_defaults
        if defaults.expires is not None and subscription:
            return defaults.merge(expires=None)
        return defaults

    def queue(self, name: str) -> Queue:
        """The queue called C{name}. @raise NotFound: there is none."""
        try:
            return self.queues[name]
        except KeyError:
            raise NoSuchQueue(f"no queue {name!r} in virtual host {self.name!r}") from None

    def delete_queue(self, name: str) -> int:
        """Delete a queue and its bindings; return how many ready messages went with it."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return 0
        if queue.bindings:
            events = self.events
            for exchange, key, args in list(queue.bindings):
                exchange.unbind(queue, key, args)
                if events is not None:
                    events.unbound(exchange, key)
                self.maybe_auto_delete_exchange(exchange)
            queue.bindings = None
        count = len(queue)
        for consumer in queue.detach_all():
            consumer.cancelled()
        store = self._durable_store(queue)
        if store is not None:
            store.delete_queue(self, queue)
        if self.events is not None:
            self.events.queue_deleted(queue)
        return count

    def queue_unused(self, queue: Queue) -> None:
        """C{queue}'s last consumer left: an auto-delete queue goes now."""
        if queue.auto_delete and not queue.deleted and self.queues.get(queue.name) is queue:
            self.delete_queue(queue.name)

    def queue_expired(self, queue: Queue) -> None:
        """C{queue} stayed unused past its C{x-expires}: delete it if it is empty.

        Unlike RabbitMQ, QMQ never drops messages because nobody came for
        them: an unused queue that still holds messages stays (it expires
        once it is empty and unused again).
        """
        if (
            not queue.deleted
            and not len(queue)
            and not queue.delayed_count
            and self.queues.get(queue.name) is queue
        ):
            self.delete_queue(queue.name)

    # -- range scans -------------------------------------------------------

    def scan(
        self,
        queue: str,
        start: float,
        end: float,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Deferred:
        """Read C{queue}'s messages published in [C{start}, C{end}) (seconds
        since the epoch) without consuming them: a range scan (Queuey's
        rewind), read from the commit log off the reactor thread.

        A page holds the persistent messages the log still keeps for the
        queue: those it holds (ready, or delivered and not acked) and those
        acked less than its C{x-retention} ago (longer, if their segment is
        still on disk for other reasons), by increasing id (publish order).
        Non-persistent messages are never in the log, so never in a scan.

        @param cursor: the C{next_cursor} of the previous page, to go on
            exactly after its last message; None to begin.
        @param limit: most messages in the page, 1 to L{MAX_SCAN_LIMIT}.
        @return: a Deferred of a L{ScanPage}; for a queue whose home is
            another node, the home's page (L{qmq.core.remote.Homes.scan}).
        @raise NotFound: no such queue.
        @raise PreconditionFailed: a bad argument or cursor, or a queue
            with no log to read (not durable, or the store is the memory
            store): the message says which.
        """
        q = self.queue(queue)
        if not (_is_time(start) and _is_time(end)) or start > end:
            raise PreconditionFailed(
                f"a scan needs start <= end, both seconds since the epoch; got {start!r}, {end!r}"
            )
        if limit.__class__ is not int or not 1 <= limit <= MAX_SCAN_LIMIT:
            raise PreconditionFailed(f"a scan's limit must be 1 to {MAX_SCAN_LIMIT}, got {limit!r}")
        after = parse_cursor(cursor) if cursor is not None else 0
        if q.remote is not None:
            # Its home is another node, whose log holds its messages: scanned there.
            d = q.remote.scan(q, float(start), float(end), cursor, limit)
            return d.addErrback(self.not_on_home, q)
        store = q.store
        if store is None:
            raise PreconditionFailed(
                f"queue {queue!r} is not durable (or is at-most-once): it keeps no "
                "messages in a log to scan (range scans read durable queues on the commit log)"
            )
        d = store.scan(self, q, float(start), float(end), after, limit)
        return d.addCallback(_page)

    # -- bindings ----------------------------------------------------------

    def bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        arguments: dict | None = None,
        validate: bool = True,
    ) -> None:
        """Bind C{queue} to C{exchange} with C{routing_key}.

        @param validate: check the binding key (L{qmq.core.names}); False
            only for what a store recovered.
        @raise NotFound: no such queue or exchange.
        @raise InvalidName: the key breaks a rule of L{qmq.core.names}.
        """
        q = self.queue(queue)
        if not exchange:
            raise AccessRefused("the default exchange cannot be bound")
        if q.remote is not None:
            raise PreconditionFailed(
                f"Queue {queue!r} lives on node {q.home!r} (docs/cluster.rst): bind it there; "
                "exchanges route to a queue on its home node only.",
                "bind of a remote queue",
            )
        ex = self.exchange(exchange)
        if validate:
            check_binding_key(routing_key, ex)
        if ex.bind(q, routing_key, arguments):
            if q.bindings is None:
                q.bindings = []
            q.bindings.append((ex, routing_key, arguments))
            if self.events is not None:
                self.events.bound(ex, routing_key)
            store = self._durable_store(q)
            if store is not None and ex.durable:
                store.bind(self, q, ex, routing_key, arguments)

    def unbind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Remove a binding (no error if it did not exist)."""
        q = self.queue(queue)
        ex = self.exchange(exchange)
        if ex.unbind(q, routing_key, arguments) and q.bindings:
            if self.events is not None:
                self.events.unbound(ex, routing_key)
            for i, b in enumerate(q.bindings):
                if b[0] is ex and b[1] == routing_key and b[2] == arguments:
                    del q.bindings[i]
                    break
            store = self._durable_store(q)
            if store is not None and ex.durable:
                store.unbind(self, q, ex, routing_key, arguments)
            self.maybe_auto_delete_exchange(ex)

    def maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        """Delete C{exchange} if it is auto-delete and has no binding left
        (bindings from other exchanges to it go with it)."""
        if exchange.auto_delete and exchange.binding_count == 0 and not exchange.deleted:
            for source, key, arguments in list(exchange.sources or ()):
                self.unbind_exchange(exchange.name, source.name, key, arguments)
            if self.exchanges.pop(exchange.name, None) is not None and self.events is not None:
                self.events.exchange_deleted(exchange)
            exchange.deleted = True

    def bind_live(self, consumer: Any, exchange: Exchange, routing_key: str) -> None:
        """Bind a live consumer straight to C{exchange} with C{routing_key}.

        @raise PreconditionFailed: the key breaks a limit.
        """
        if exchange.bind(consumer, routing_key, None) and self.events is not None:
            self.events.bound(exchange, routing_key)

    def unbind_live(self, consumer: Any, exchange: Exchange, routing_key: str) -> None:
        """Remove a live consumer's binding (an auto-delete exchange left
        with none goes)."""
        if exchange.unbind(consumer, routing_key, None) and self.events is not None:
            self.events.unbound(exchange, routing_key)
        self.maybe_auto_delete_exchange(exchange)

    # -- exchange to exchange ------------------------------------------------

    def bind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        arguments: dict | None = None,
        validate: bool = True,
    ) -> None:
        """Bind exchange C{destination} to exchange C{source}: what
        C{source} routes with a matching key goes on through C{destination}
        (L{expand}). A binding between two durable exchanges is stored
        (kept across a restart, as a durable queue's bindings are).

        @param validate: check the binding key (L{qmq.core.names}); False
            only for what a store recovered.
        @raise NotFound: no such exchange.
        @raise AccessRefused: the default exchange.
        """
        if not destination or not source:
            raise AccessRefused("the default exchange cannot be bound")
        dest = self.exchange(destination)
        src = self.exchange(source)
        if validate:
            check_binding_key(routing_key, src)
        if src.bind(dest, routing_key, arguments):
            src.e2e += 1
            if dest.sources is None:
                dest.sources = []
            dest.sources.append((src, routing_key, arguments))
            if self.events is not None:
                self.events.bound(src, routing_key)
                self.events.exchange_bound(dest, src, routing_key, arguments)
            if src.durable and dest.durable and self.broker is not None:
                self.broker.store.bind_exchange(self, dest, src, routing_key, arguments)

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Remove an exchange-to-exchange binding (no error if there was none)."""
        dest = self.exchanges.get(destination)
        src = self.exchanges.get(source)
        if dest is None or src is None or not src.unbind(dest, routing_key, arguments):
            return
        src.e2e -= 1
        if dest.sources:
            for i, b in enumerate(dest.sources):
                if b[0] is src and b[1] == routing_key and b[2] == arguments:
                    del dest.sources[i]
                    break
        if self.events is not None:
            self.events.unbound(src, routing_key)
            self.events.exchange_unbound(dest, src, routing_key, arguments)
        if src.durable and dest.durable and self.broker is not None:
            self.broker.store.unbind_exchange(self, dest, src, routing_key, arguments)
        self.maybe_auto_delete_exchange(src)

    #: Most exchanges one publish passes through (bindings from exchange to
    #: exchange): a bound on the work of a publish, whatever the topology.
    max_exchange_hops = 64

    def expand(
        self, exchange: Exchange, targets: Sequence[Any], routing_key: str, headers: dict | None
    ) -> list:
        """The queues and live consumers a publish reaches through C{exchange}
        whose route gave C{targets}, some of which are exchanges: each
        exchange reached routes the same key and headers on, once (a loop
        of bindings ends where it began), and each queue gets one copy.

        An exchange whose own bindings route the publish to nothing hands it
        to its alternate exchange (C{alternate-exchange}), if that exists,
        as RabbitMQ does: the publish counts as routed when the alternate
        routes it. An alternate is an exchange passed through like any other,
        so a cycle of alternates ends where it began.

        At most L{max_exchange_hops} exchanges are passed through."""
        seen = {exchange}
        out: dict[Any, None] = {}
        pending = [(exchange, targets)]
        hops = 0
        exchanges = self.exchanges
        while pending:
            source, routed = pending.pop()
            if not routed and source.alternate is not None:
                alternate = exchanges.get(source.alternate)
                if alternate is not None:
                    routed = (alternate,)
            for t in routed:
                if t.__class__ in EXCHANGE_CLASSES_SET:
                    if t in seen or hops >= self.max_exchange_hops:
                        continue
                    seen.add(t)
                    hops += 1
                    pending.append((t, t.route(routing_key, headers)))
                else:
                    out[t] = None
        return list(out)

    # -- dead letters ----------------------------------------------------------

    def dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        """Republish C{message}, which left C{queue} for C{reason}, to the
        queue's dead-letter exchange (C{x-dead-letter-exchange}).

        The copy is a new message (a new id, the time now) with the same
        body, priority and persistence, no expiry and no delivery time,
        routed with C{x-dead-letter-routing-key} or its own routing key. Its
        headers are the original ones plus RabbitMQ's C{x-death} record,
        flattened to strings (L{DEATH_HEADERS}): C{x-death-queue},
        C{x-death-reason}, C{x-death-count} (deaths in a row in this queue
        for this reason), C{x-death-exchange}, C{x-death-routing-key},
        C{x-death-time} (epoch seconds), C{x-first-death-queue},
        C{x-first-death-reason}, C{x-first-death-exchange} and the same
        three C{x-last-death-*}.

        A message that died in this queue for this reason last time, other
        than a rejection, is dropped instead (a cycle nobody breaks, as
        RabbitMQ drops it); so is one whose dead-letter exchange is gone
        or whose dead-letter queue refuses it (both logged).
        """
        broker = self.broker
        if broker is None:
            return
        policy = queue.policy
        exchange = policy.dead_letter_exchange or ""
        key = policy.dead_letter_routing_key
        if key is None:
            key = message.routing_key
        old = message.headers or {}
        same = old.get("x-last-death-queue") == queue.name and old.get("x-last-death-reason") == reason
        if same and reason != "rejected":
            log.info(
                "dead-letter cycle: message {id} dropped (queue {queue!r}, {reason})",
                id=message.id,
                queue=queue.name,
                reason=reason,
            )
            return
        count = 1
        if same:
            count_text = old.get("x-death-count", "")
            if count_text.isascii() and count_text.isdigit() and len(count_text) < 10:
                count = int(count_text) + 1
        headers = {k: v for k, v in old.items() if k not in _NOT_DEAD_LETTERED}
        death = {
            "x-death-queue": queue.name,
            "x-death-reason": reason,
            "x-death-count": str(count),
            "x-death-exchange": message.exchange,
            "x-death-routing-key": message.routing_key,
            "x-death-time": str(int(broker.clock.seconds())),
            "x-last-death-queue": queue.name,
            "x-last-death-reason": reason,
            "x-last-death-exchange": message.exchange,
        }
        headers.update(death)
        if "x-first-death-queue" not in headers:
            headers["x-first-death-queue"] = queue.name
            headers["x-first-death-reason"] = reason
            headers["x-first-death-exchange"] = message.exchange
        copy = broker.new_message(exchange, key, headers, message.body, message.persistent)
        copy.priority = message.priority
        copy.ack_timeout = message.ack_timeout
        copy.properties = message.properties
        try:
            targets = self.route(exchange, key, headers)
            result = self.publish_to(targets, copy)
            self.dead_lettered += 1
        except BrokerError as e:
            log.info(
                "dead-letter of message {id} from queue {queue!r} dropped: {why}",
                id=message.id,
                queue=queue.name,
                why=e.message,
            )
            return
        if result is not None:
            result.addErrback(lambda f: log.failure("dead-letter store", f))

    # -- publishing ----------------------------------------------------------

    def route(self, exchange: str, routing_key: str, headers: dict | None = None) -> tuple | list:
        """The queues a publish would reach. @raise NotFound: no such exchange."""
        if not exchange:
            q = self.queues.get(routing_key)
            return (q,) if q is not None else ()
        ex = self.exchange(exchange)
        targets = ex.route(routing_key, headers)
        if ex.e2e or (not targets and ex.alternate is not None):
            return self.expand(ex, targets, routing_key, headers)
        return targets

    def publish(self, message: Message) -> int:
        """Route C{message} by its exchange and key (see L{publish_to}); return
        how many queues and live consumers took it. For tools and tests:
        frontends publish through a L{qmq.core.channel.Channel}.

        @raise NotFound: the exchange does not exist.
        """
        targets = self.route(message.exchange, message.routing_key, message.headers)
        self.publish_to(targets, message)
        return len(targets)

    def publish_to(self, targets: Sequence[Any], message: Message) -> Any:
        """Hand C{message} to C{targets} (queues and live consumers), atomically.

        A publish that one bounded queue refuses reaches none of them. A
        persistent message that reaches durable queues is given to the store
        once, with all of them.

        @return: None when the message is as safe as it will be, else a
            Deferred that fires when the store has made it durable.
        @raise ResourceLimit: a bounded queue refused it.
        """
        if len(targets) != 1:
            # (One test for the common case, one target: no more than before
            # the unroutable count.)
            if not targets:
                self.unroutable += 1
                return None
            # Only a bounded reject-publish queue can refuse (live consumers
            # never do): ask those, without a call for the others.
            for t in targets:
                if t.policy.rejects and t.would_refuse(message):
                    t.publish(message)  # raises ResourceLimit, naming the queue
        dropped = None
        for t in targets:
            if t.publish(message):
                # Not taken (a duplicate, or it could never fit): the store
                # must not keep it for this queue.
                if dropped is None:
                    dropped = []
                dropped.append(t)
        if message.persistent:
            durable = [
                t for t in targets if t.store is not None and (dropped is None or t not in dropped)
            ]
            if durable:
                broker = self.broker
                assert broker is not None
                return broker.store_publish(self, message, durable)
        return None
