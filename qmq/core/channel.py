# -*- test-case-name: tests.test_core_channel -*-
"""The channel: every frontend's one way into the core, in AMQP 0-9-1's words.

A frontend session (STOMP over any transport, the HTTP API, later AMQP and
links between nodes) opens a L{Channel} for its client, as an AMQP client
opens a channel on a connection, and does everything through it. The
operations are AMQP's, so every frontend is a translation onto them:

    declare   L{declare_queue} (durable, exclusive to the connection,
              auto-delete, arguments; passive), L{named_queue} (made on
              first use, for protocols that name queues into being)
    publish   L{make_message} / L{new_message} (the core stamps the id and
              the time), then L{publish}(exchange, routing key, message,
              mandatory): routed atomically, the store asked once; the
              answer is L{Published}: how many queues (and live consumers)
              took it, and None ("done") or a Deferred that fires when the
              message is as durable as the store makes it. A frontend that
              resolved its target once (L{target}) publishes with
              L{publish_target}, the hot path.
    consume   L{consume} a L{Consumer} on a queue, or on an exchange + a
              binding pattern (a live consumer, a private queue, or a
              durable subscription's queue), with a consumer tag and
              exclusivity; L{cancel} by tag, L{unsubscribe} by consumer
    qos       L{qos}: a prefetch window by count and bytes, per consumer
              (for the consumers made after) or for the whole channel
    settle    L{settle}(tag, multiple): ack, nack or reject, one delivery
              or every earlier one on the channel, requeued or not;
              L{settle_delivery} settles one consumer's delivery (STOMP's
              cumulative C{ack:client} is per subscription)
    get       L{get}: take one message from a queue, tracked for an ack
    bind      L{bind_exchange} / L{unbind_exchange}: exchange to exchange
    leave     L{close} when the client goes: unacked messages go back to
              their queues, private queues go, and with the last channel of
              its L{Connection} the queues exclusive to it

Deliveries are tagged by the channel: a frontend's C{Consumer.deliver} takes
a tag with L{track} and names it to its client; the client's ack names it
back.

Names of destinations (STOMP's C{/queue/NAME}, C{/topic/KEY}...) are not the
core's business: L{qmq.stomp.destinations} translates them onto these
operations (and the HTTP API borrows it as an adapter).

Refusals are L{qmq.core.errors} with AMQP's reply codes: a second consumer
on a queue that has an exclusive one, or an exclusive consumer on a queue
that has consumers, is L{AccessRefused} (403 access-refused); a queue
exclusive to another connection is L{ResourceLocked} (405); an unknown
delivery tag is L{PreconditionFailed} (406).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from twisted.logger import Logger

from qmq.core.access import Resource, authorize, resource_named
from qmq.core.consumer import UNLIMITED, BacklogBudget, Consumer
from qmq.core.errors import AccessRefused, NotAllowed, NotFound, PreconditionFailed, ResourceLocked
from qmq.core.ids import Counter
from qmq.core.management import authorize_arguments, check_equivalent, check_equivalent_policy
from qmq.core.message import Message
from qmq.core.names import check_binding_key, check_exchange, check_headers, check_routing_key
from qmq.core.ownership import (
    DURABLE_SUBSCRIPTION_PREFIX,
    check_queue_access,
    durable_queue_name,
    owned_token,
)
from qmq.core.policy import CUT_CONSUMERS, QueuePolicy
from qmq.core.queue import Queue

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from qmq.core.broker import Broker
    from qmq.core.exchange import Exchange
    from qmq.core.vhost import VirtualHost

log = Logger()

#: A resolved send target: (queue or None, exchange or None, exchange
#: name, routing key, the object whose C{deleted} flag invalidates it).
SendTarget = tuple[Any, Any, Any, str, Any]

#: Most names L{Channel.publish} remembers as writable (then it forgets all).
_WRITABLE_CACHE_SIZE = 1000
# Queue names the broker keeps to itself: never made on demand (named_queue).
_RESERVED_PREFIXES = ("amq.", DURABLE_SUBSCRIPTION_PREFIX)


class Published(NamedTuple):
    """What L{Channel.publish} did.

    @ivar routed: how many queues and live consumers took the message (0:
        unroutable; a frontend returns a mandatory message, as AMQP's
        C{basic.return}).
    @ivar durable: None when the message is as safe as it will be, else a
        Deferred that fires once the store has made it durable.
    """

    routed: int
    durable: Deferred | None


class Got(NamedTuple):
    """One message taken by L{Channel.get} (AMQP's C{basic.get-ok}).

    @ivar tag: its delivery tag (settle it with L{Channel.settle} when it
        was taken with C{ack=True}).
    @ivar message: the message.
    @ivar remaining: how many messages are still ready in the queue.
    """

    tag: int
    message: Message
    remaining: int


class Window:
    """A prefetch window: most unacknowledged deliveries by count and body bytes.

    @ivar count: most deliveries (0: no bound by count).
    @ivar bytes: most body bytes (0: no bound by bytes). A delivery is made
        while fewer bytes than this are out, so a message bigger than the
        window still goes, alone (AMQP's prefetch-size would never send it).
    @ivar used: deliveries out now.
    @ivar used_bytes: body bytes out now.
    """

    __slots__ = ("count", "bytes", "used", "used_bytes")

    def __init__(self, count: int = 0, bytes: int = 0) -> None:
        self.count = count
        self.bytes = bytes
        self.used = 0
        self.used_bytes = 0

    def full(self) -> bool:
        """Whether no more deliveries may be made."""
        return bool(
            (self.count and self.used >= self.count) or (self.bytes and self.used_bytes >= self.bytes)
        )

    def __repr__(self) -> str:
        return f"<Window {self.used}/{self.count or '-'} messages, {self.used_bytes}/{self.bytes or '-'} bytes>"


class Connection:
    """What a client's connection owns across its channels: the queues
    exclusive to it (AMQP's C{exclusive} queues, STOMP's temp queues and
    private subscription queues), deleted when it closes.

    A frontend with one channel per connection (STOMP, the HTTP API) lets
    each L{Channel} make its own; a frontend with several (AMQP) makes one
    and gives it to each channel it opens, and closes it last.

    @ivar exclusive_queues: the queues exclusive to it, by (virtual host
        name, queue name).
    @ivar closed: set once it has closed.
    """

    def __init__(self) -> None:
        self.exclusive_queues: dict[tuple[str, str], Queue] = {}
        self.closed = False

    def owns(self, queue: Queue) -> None:
        """Record C{queue} as exclusive to this connection."""
        vhost = queue.vhost
        self.exclusive_queues[(vhost.name if vhost is not None else "", queue.name)] = queue

    def close(self) -> None:
        """The connection is gone: delete the queues exclusive to it (once)."""
        if self.closed:
            return
        self.closed = True
        queues, self.exclusive_queues = self.exclusive_queues, {}
        for queue in queues.values():
            vhost = queue.vhost
            if not queue.deleted and vhost is not None and vhost.queues.get(queue.name) is queue:
                vhost.delete_queue(queue.name)


class _Getter(Consumer):
    """The consumer that L{Channel.get}'s deliveries wait on for their ack:
    never attached to its queue (the queue hands it nothing), only there so
    that a settle finds the queue and the credit bookkeeping stays one."""

    __slots__ = ()

    def deliver(self, message: Message, queue: Queue | None) -> None:  # pragma: no cover
        raise AssertionError("a getter is never attached to a queue")


class Channel:
    """One client's way into the core (see the module docstring).

    @ivar broker: the broker.
    @ivar vhost: the virtual host the client chose.
    @ivar connection: the L{Connection} it belongs to (owner of exclusive
        queues).
    @ivar owner_name: who the client is (its user: until authentication,
        the login it gave or its TLS identity), owning its durable
        subscriptions (L{qmq.core.ownership}).
    @ivar owners: delivery tag -> the consumer it was delivered on.
    @ivar next_tag: the next delivery tag (read it; L{track} takes one, as
        does C{next()} of the iterator L{tag_source} returns).
    @ivar consumer_tags: consumer tag -> consumer, for the consumers
        L{consume} tagged.
    @ivar backlog_budget: the budget the backlogs of its live consumers
        share, or None (each bounded only by its own C{backlog_limit}).
    @ivar user: the authenticated user whose permissions every new
        destination is checked against (L{qmq.auth.User}: anything with
        C{name} and C{can(operation, vhost, resource, destination)}), or
        None: no checks (authentication is off).
    @ivar prefetch_count: the prefetch by count of the consumers made
        next (L{qos}, not global; 0: none beyond their own).
    @ivar prefetch_bytes: their prefetch by body bytes (0: none).
    @ivar window: the channel's own L{Window} (L{qos} global), or None.
    """

    # Slots for what __init__ sets: a channel per connection, and with more
    # than 30 attributes CPython 3.11 gives each instance a full dict of its
    # own (about 1.5 KiB) instead of values sharing the class's keys. A
    # subclass or a test may still add attributes (__dict__).
    __slots__ = (
        'broker', 'protocol', 'published', 'acked', 'user', 'backlog_budget', 'vhost',
        'owner_name', '_own_connection', 'connection', 'token', 'owners', '_tags',
        'consumers', 'consumer_tags', '_tag_of', '_ctag_serial', 'closed',
        '_cumulative_upto', '_taken_back', 'prefetch_count', 'prefetch_bytes', 'window',
        '_windows', '_gated', '_transport_paused', '_getters', '_writable',
        '_checked_headers', '_checked_key', '_ids', '_seconds', '__dict__', '__weakref__'
    )

    def __init__(
        self,
        broker: Broker,
        vhost: VirtualHost,
        owner_name: str = "",
        backlog_budget: int = 0,
        user: Any = None,
        protocol: str = "",
        connection: Connection | None = None,
    ) -> None:
        """
        @param backlog_budget: most messages its live consumers' backlogs
            hold together (0: no shared bound).
        @param user: the authenticated user, or None (no permission checks).
        @param protocol: the frontend's name, for the counts by protocol
            (L{qmq.core.traffic}).
        @param connection: the connection it is a channel of; None: its own
            (closed with it), for protocols with one channel per connection.
        """
        self.broker = broker
        self.protocol = protocol
        #: Messages published and deliveries acknowledged through it (plain
        #: counts, read by L{qmq.core.traffic.Traffic}); its deliveries are
        #: C{next_tag - 1}.
        self.published = 0
        self.acked = 0
        self.user = user
        self.backlog_budget = BacklogBudget(backlog_budget) if backlog_budget else None
        self.vhost = vhost
        self.owner_name = owner_name
        self._own_connection = connection is None
        self.connection = connection if connection is not None else Connection()
        # Names of the channel's own queues carry a random token: they can be
        # published to by name (RPC replies), so they must not be guessable;
        # in a mesh it names this node, where they live (owned_token).
        self.token = owned_token(broker)
        self.owners: dict[int, Consumer] = {}
        # The delivery tags: next() on it takes one (a C call).
        self._tags = Counter(1)
        self.consumers: set[Consumer] = set()
        self.consumer_tags: dict[str, Consumer] = {}
        self._tag_of: dict[Consumer, str] = {}
        self._ctag_serial = 0
        self.closed = False
        self._cumulative_upto = 0
        self._taken_back: dict[int, None] = {}
        self.prefetch_count = 0
        self.prefetch_bytes = 0
        self.window: Window | None = None
        # Consumers with a window of their own (a prefetch by bytes).
        self._windows: dict[Consumer, Window] = {}
        # Whether any window applies: the one test track pays without qos.
        self._gated = False
        self._transport_paused = False
        self._getters: dict[Queue, _Getter] = {}
        # What L{publish} found writable under the current user: queue
        # names (the default exchange), (exchange, routing key) pairs.
        self._writable: set[Any] = set()
        # The last headers dict whose names were checked (qmq.core.names):
        # a producer's messages share one, so it is checked once.
        self._checked_headers: Any = None
        # And the last routing key L{publish} checked (a producer reuses one).
        self._checked_key: Any = None
        self._ids = broker.message_ids
        self._seconds = broker.clock.seconds
        traffic = getattr(broker, "traffic", None)
        if traffic is not None:
            traffic.opened(self)

    def set_user(self, user: Any) -> None:
        """Check later destinations against C{user} (the same client logged
        in again, with permissions changed since): the send targets resolved
        under the old permissions are forgotten (L{forget_targets})."""
        self.user = user
        self._writable.clear()
        self.forget_targets()

    def forget_targets(self) -> None:
        """Forget what was resolved under the old permissions (a frontend's
        adapter that caches resolutions overrides it)."""

    def _authorize(self, operation: str, resource: str, text: str) -> None:
        """Check the user's C{operation} permission on C{resource}, named
        by the destination C{text}.

        Asked only when a destination is first resolved (send targets are
        cached per channel) or subscribed to: never per message.

        @raise AccessRefused: naming the operation and the destination.
        """
        user = self.user
        if user is not None:
            # The verdict is the core's (qmq.core.access), on the resource
            # itself: the same whichever frontend or text named it.
            vhost = self.vhost
            named = resource_named(vhost.name, operation, resource, text, vhost.exchanges, vhost.queues)
            authorize(user, operation, named, named=text)

    def named_queue(
        self,
        name: str,
        operation: str = "read",
        arguments: dict[str, Any] | None = None,
        checked: bool = False,
    ) -> Queue:
        """The queue a C{/queue/NAME} destination names, created on first use.

        Names starting with C{amq.} are the broker's own (private
        subscription queues, temp queues): they are never created on demand,
        so a reply to a requester that has gone away is refused instead of
        leaving a stray queue behind. Nor are durable subscriptions' queues
        (C{durable.OWNER.NAME}): a durable SUBSCRIBE makes them, and only
        their owner may name them (L{check_queue_access}).

        @param checked: the caller checked C{name} already (L{check_queue}):
            a new queue's name is not checked again.
        """
        vhost = self.vhost
        reserved = name.startswith(_RESERVED_PREFIXES)
        if reserved and name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
            check_queue_access(self.owner_name, name, operation)
        if arguments:
            # Arguments that make the broker write somewhere (dead letters)
            # need the declarer's write permission there.
            authorize_arguments(self.user, self.owner_name, vhost.name, arguments, vhost.queue_defaults)
        if reserved:
            queue = vhost.queues.get(name)
            if queue is None and self.broker.homes is not None:
                # A connection's queue on another node (a reply to a requester there).
                queue = vhost.stand_in(name)
            if queue is None:
                raise NotFound(
                    f"Queue {name!r} does not exist; names starting with 'amq.' or 'durable.' "
                    "are reserved for the broker and are not created on demand (its owner may "
                    "have gone).",
                    "no such queue",
                )
            return queue
        if not vhost.allow_create:
            queue = vhost.queues.get(name)
            if queue is None:
                raise NotFound(
                    f"Queue {name!r} does not exist, and virtual host {vhost.name!r} does not "
                    "let clients create queues (allow_create = false): only queues declared "
                    "in the configuration can be used.",
                    "no such queue",
                )
            if arguments:
                self._check_arguments(queue, arguments)
            return queue
        if arguments:
            queue = vhost.queues.get(name)
            if queue is not None:
                self._check_arguments(queue, arguments)
                return vhost.declare_queue(name, on_demand=True)
        return vhost.declare_queue(name, on_demand=True, arguments=arguments, validate=not checked)

    @staticmethod
    def _check_arguments(queue: Queue, arguments: dict[str, Any]) -> None:
        """C{arguments} given for C{queue}, which exists: they must agree
        with its policy (their values are checked, as for a new queue)."""
        check_equivalent(queue, arguments)

    # -- publishing --------------------------------------------------------------

    # -- declaring ---------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        passive: bool = False,
    ) -> Queue:
        """Declare queue C{name} (AMQP's C{queue.declare}), or find it.

        An exclusive queue belongs to this channel's L{Connection}: only its
        channels may use it, and it goes when the connection closes.

        @param passive: only find it (L{NotFound} if there is none); for
            a queue whose home is another node, the answer is a Deferred
            of (its stand-in, the home's facts), as L{find_queue}'s.
        @raise ResourceLocked: it is exclusive to another connection.
        @raise PreconditionFailed: it exists with other arguments, or a
            bad name or argument.
        @raise AccessRefused: no configure permission to make it.
        """
        vhost = self.vhost
        queue = vhost.queues.get(name)
        if passive and (queue is None or queue.remote is not None):
            found = self.find_queue(name)
            if not isinstance(found, Queue):
                if arguments:
                    found.addCallback(self._check_found_arguments, arguments)
                return found  # type: ignore[return-value]
            queue = found
        if queue is not None or passive:
            if queue is None:
                raise NotFound(f"no queue {name!r} in virtual host {vhost.name!r}", "no such queue")
            self._check_exclusive(queue)
            if arguments:
                self._check_arguments(queue, arguments)
            queue.touch()
            return queue
        if self.user is not None:
            self._authorize("configure", name, name)
        queue = vhost.declare_queue(
            name,
            durable=durable,
            auto_delete=auto_delete,
            arguments=arguments,
            exclusive_owner=self.connection if exclusive else None,
        )
        if exclusive:
            self.connection.owns(queue)
        return queue

    @property
    def getters(self) -> list[Consumer]:
        """The channel's consumers of C{basic.get}s (one a queue), whose
        deliveries wait for their acks as a consumer's do."""
        return list(self._getters.values())

    def find_queue(self, name: str) -> Queue | Deferred:
        """Queue C{name}, which a client names as one that exists (AMQP's
        C{basic.consume} and passive C{queue.declare}, the HTTP API's
        receive), not one to make on first use (L{named_queue}).

        A queue here is returned as it is. When its home is another node
        (L{qmq.core.remote}) the home is asked, even if this node has its
        stand-in (another node may have deleted it there since): the answer
        is a Deferred of (the stand-in, the home's facts of it,
        L{qmq.core.management.queue_facts}), failing with L{NotFound} when
        the home has no such queue (a stand-in made for the question goes
        again), L{qmq.core.remote.Unavailable}, or L{ResourceLocked} when it
        is exclusive to a connection there. The caller's other checks (read
        permission) are its own, as for a queue here.

        @raise NotFound: no such queue here, and no other node is its home.
        """
        vhost = self.vhost
        queue = vhost.queues.get(name)
        if queue is None:
            queue = vhost.stand_in(name)
            if queue is None:
                return vhost.queue(name)  # raises NoSuchQueue
        elif queue.remote is None:
            return queue
        return vhost.home_facts(queue).addCallback(_with_facts, queue)

    def _check_found_arguments(self, found: tuple[Queue, dict[str, Any]], arguments: dict[str, Any]) -> Any:
        """A passive declare's C{arguments}, for a queue found on its home:
        they must agree with those the home has, as for a queue here."""
        queue, facts = found
        home = facts.get("arguments")
        policy = QueuePolicy.from_arguments(home if isinstance(home, dict) else None, self.vhost.queue_defaults)
        check_equivalent_policy(queue.name, policy, arguments)
        return found

    def _check_exclusive(self, queue: Queue) -> None:
        """@raise ResourceLocked: C{queue} is exclusive to another connection."""
        owner = queue.exclusive_owner
        if owner is not None and owner is not self.connection:
            raise ResourceLocked(
                f"Queue {queue.name!r} is exclusive to another connection.", "resource locked"
            )

    # -- publishing --------------------------------------------------------------

    def make_message(
        self,
        exchange: str,
        routing_key: str,
        headers: dict[str, str] | None,
        body: bytes,
        persistent: bool = False,
    ) -> Message:
        """A message to publish to C{exchange} with C{routing_key}, stamped
        with a fresh id and the clock's time: the broker's
        L{Broker.new_message}, the one place messages are made (but
        L{new_message}, the hot path's inlined copy)."""
        return self.broker.new_message(exchange, routing_key, headers, body, persistent)

    def new_message(
        self,
        target: SendTarget,
        headers: dict[str, str] | None,
        body: bytes,
        persistent: bool = False,
    ) -> Message:
        """L{make_message} for a resolved C{target} (L{publish_target}).

        The frontend may set C{message.cache} (its encoded form) before
        publishing. (Inlined: this is the publish path.)
        """
        # The clock's bound method read as an attribute, then called:
        # CPython 3.11 cannot specialize a method call of a callable kept on
        # the instance (self._seconds()), and looks it up the slow way.
        seconds = self._seconds
        return Message(next(self._ids), target[2], target[3], headers, body, seconds(), persistent)

    def now(self) -> float:
        """The core's time (its clock's seconds), as messages are stamped."""
        return self._seconds()

    def id_source(self) -> Any:
        """A callable giving fresh message ids, for a frontend that stamps a
        batch of messages itself (L{new_message} does it one at a time)."""
        return self._ids.__next__

    def target(self, exchange: str, routing_key: str) -> SendTarget:
        """Resolve a publish to C{exchange} with C{routing_key} once, for
        L{publish_target} (a frontend may cache it until C{target[4].deleted}).

        The default exchange (C{""}) names the queue C{routing_key}, which
        must exist.

        @raise NotFound: no such exchange or queue.
        @raise AccessRefused: no write permission on it, or an internal
            exchange (only other exchanges route into one).
        """
        if not exchange:
            queue = self.vhost.queues.get(routing_key)
            if queue is None and self.broker.homes is not None:
                queue = self.vhost.stand_in(routing_key)
            if queue is None:
                queue = self.vhost.queue(routing_key)  # raises NotFound
            self._may_write("", routing_key)
            return (queue, None, "", routing_key, queue)
        ex = self.publishable_exchange(exchange)
        check_routing_key(routing_key, ex)
        if self.user is not None:
            self._may_write(exchange, routing_key)
        return (None, ex, exchange, routing_key, ex)

    def publishable_exchange(self, name: str) -> Exchange:
        """Exchange C{name}, which a client may publish to: every frontend's
        resolution of a publish (L{target}, L{publish}, STOMP's
        destinations) asks this.

        @raise NotFound: there is none.
        @raise AccessRefused: it is internal (only other exchanges route
            into it), whatever the permissions.
        """
        ex = self.vhost.exchange(name)
        if ex.internal:
            raise _internal(ex, self.vhost)
        return ex

    def publish(
        self, exchange: str, routing_key: str, message: Message, mandatory: bool = False
    ) -> Published:
        """Publish C{message} to C{exchange} with C{routing_key} (AMQP's
        C{basic.publish}), atomically: a bounded queue that refuses it
        means no queue has it.

        A message the exchange routes nowhere goes to its alternate
        exchange if it has one (L{VirtualHost.expand}), and counts as
        routed when that takes it. A message that reaches nothing is
        dropped, and counted as published unless C{mandatory} (the frontend
        returns it: C{routed} is 0).

        @return: L{Published}: the routed count, and the durability Deferred
            or None.
        @raise NotFound: no such exchange.
        @raise AccessRefused: no write permission on the exchange (or, for
            the default exchange, on the queue), or an internal exchange.
        @raise ResourceLimit: a bounded queue refused it.
        @raise PreconditionFailed: the routing key breaks a limit.
        @raise InvalidName: a header name or value breaks a rule.
        """
        headers = message.headers
        if headers is not None and headers is not self._checked_headers:
            check_headers(headers)
            self._checked_headers = headers
        vhost = self.vhost
        if exchange:
            ex = vhost.exchange(exchange)
            if ex.internal:
                raise _internal(ex, vhost)
            if routing_key is not self._checked_key:
                check_routing_key(routing_key, ex)
                self._checked_key = routing_key
            if self.user is not None and (exchange, routing_key) not in self._writable:
                self._may_write(exchange, routing_key)
            targets = ex.route(routing_key, message.headers)
            if ex.e2e or (not targets and ex.alternate is not None):
                targets = vhost.expand(ex, targets, routing_key, message.headers)
        else:
            if routing_key not in self._writable:
                self._may_write("", routing_key)
            queue = vhost.queues.get(routing_key)
            if queue is None and self.broker.homes is not None:
                # A queue whose home is another node may exist there only.
                queue = vhost.stand_in(routing_key)
            if queue is not None and queue.remote is not None:
                self.published += 1
                return Published(1, queue.remote.forward(queue, message))
            targets = (queue,) if queue is not None else ()
        if not targets and mandatory:
            return Published(0, None)
        self.published += 1
        if not targets:
            vhost.unroutable += 1
            return Published(0, None)
        return Published(len(targets), vhost.publish_to(targets, message))

    def _may_write(self, exchange: str, routing_key: str) -> None:
        """Check once per channel (and permissions) that this client may
        publish to C{exchange} with C{routing_key}: L{publish} is per
        message, the check is not. The verdict is the core's on the
        structural resource (the exchange with the key, so a token's
        C{destinations} see C{/topic/KEY}; for the default exchange the
        queue the key names, which must not be another owner's durable
        subscription, authentication on or off)."""
        if not exchange:
            authorize(self.user, "write", Resource.queue(self.vhost.name, routing_key), self.owner_name)
            key: Any = routing_key
        else:
            authorize(self.user, "write", Resource.exchange(self.vhost.name, exchange, routing_key))
            key = (exchange, routing_key)
        writable = self._writable
        if len(writable) >= _WRITABLE_CACHE_SIZE:
            writable.clear()
        writable.add(key)

    def publish_target(self, target: SendTarget, message: Message, checked: bool = False) -> Any:
        """Route C{message} to a resolved C{target}'s queues, atomically (the
        hot path of frontends that resolve a destination once).

        @return: None when the message is as safe as it will be, else a
            Deferred that fires once the store has made it durable.
        Its headers are checked (L{qmq.core.names.check_headers}) unless
        they are the dict the previous publish checked, or C{checked}: the
        frontend passed them to L{qmq.core.names.check_headers} itself (the
        HTTP API checks a whole batch before publishing any of it).

        @raise ResourceLimit: a bounded queue refused it (then no queue has it).
        @raise PreconditionFailed: the routing key breaks a limit.
        @raise InvalidName: a header name or value breaks a rule.
        """
        headers = message.headers
        if headers is not None and headers is not self._checked_headers and not checked:
            check_headers(headers)
            self._checked_headers = headers
        self.published += 1
        queue = target[0]
        if queue is not None:
            if queue.remote is not None:
                # Its home is another node (qmq.core.remote): the confirm
                # of the home is the durability Deferred.
                return queue.remote.forward(queue, message)
            # VirtualHost.publish_to for one queue, inlined (the hot path).
            dropped = queue.publish(message)
            if message.persistent and queue.store is not None and not dropped:
                return self.broker.store_publish(self.vhost, message, (queue,))
            return None
        exchange = target[1]
        targets = exchange.route(message.routing_key, message.headers)
        if exchange.e2e or (not targets and exchange.alternate is not None):
            targets = self.vhost.expand(exchange, targets, message.routing_key, message.headers)
        return self.vhost.publish_to(targets, message)

    # -- consuming ---------------------------------------------------------------

    def consume(
        self,
        consumer: Consumer,
        queue: str | None = None,
        *,
        exchange: str | None = None,
        pattern: str = "",
        tag: str | None = None,
        exclusive: bool = False,
        durable_name: str | None = None,
        live: bool = True,
        label: str = "",
        arguments: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> str:
        """Attach C{consumer} to queue C{queue} (AMQP's C{basic.consume}),
        or to C{exchange} with the binding C{pattern}:

          - with C{durable_name}, a queue consumer on the durable queue
            C{durable.OWNER.NAME} bound with the pattern (it keeps messages
            while the client is away);
          - else, for an auto-ack consumer when C{live} is true, a live
            consumer bound straight to the exchange;
          - else a queue consumer on a private, auto-delete queue bound with
            the pattern (deleted with the consumer), named after C{label}
            and the channel's token.

        C{arguments} are queue arguments (L{qmq.core.policy.QUEUE_ARGUMENTS})
        for a durable subscription's queue: they apply when it is made; a
        queue that exists must already have them, else L{PreconditionFailed}.

        @param tag: a consumer tag to cancel it by (L{cancel}); C{""} for
            one made up; None for none (a frontend that keeps its own ids).
        @param exclusive: no other consumer may share the queue.
        @param text: how the client named it, for error messages (its
            destination); the queue or exchange name by default.
        @return: the consumer tag (C{""} without one).
        @raise NotFound: no such queue or exchange.
        @raise AccessRefused: no read permission, or the queue has an
            exclusive consumer (or has consumers, for an exclusive one).
        @raise ResourceLocked: the queue is exclusive to another connection.
        @raise NotAllowed: the tag is in use on this channel.
        """
        if tag is not None:
            if not tag:
                self._ctag_serial += 1
                tag = f"amq.ctag-{self.token}-{self._ctag_serial}"
            elif tag in self.consumer_tags:
                raise NotAllowed(f"Consumer tag {tag!r} is in use on this channel.", "tag in use")
        if queue is not None:
            q = self.vhost.queue(queue)
            if self.user is not None:
                self._authorize("read", queue, text or queue)
            if queue.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                check_queue_access(self.owner_name, queue, "read")
            self._check_buffer(consumer, True)
            consumer.channel = self
            self._attach(consumer, q, exclusive)
        elif exchange is not None:
            self._check_buffer(consumer, durable_name is not None)
            consumer.channel = self
            self._consume_exchange(
                consumer, exchange, pattern, durable_name, live, label, arguments, text or exchange
            )
        else:
            raise PreconditionFailed("a consumer needs a queue or an exchange")
        if tag is not None:
            self.consumer_tags[tag] = consumer
            self._tag_of[consumer] = tag
            return tag
        return ""

    @staticmethod
    def _check_buffer(consumer: Consumer, shared: bool) -> None:
        if consumer.buffer is not None and shared:
            raise PreconditionFailed(
                "A subscriber's buffer (buffer-messages, buffer-bytes) bounds what is held for "
                "it alone: it applies to non-durable topic and exchange subscriptions, not to "
                "a queue (shared, or kept for a durable subscription), whose own bounds apply.",
                "buffer not allowed here",
            )

    def _consume_exchange(
        self,
        consumer: Consumer,
        exchange_name: str,
        pattern: str,
        durable_name: str | None,
        live: bool,
        label: str,
        arguments: dict[str, Any] | None,
        text: str,
    ) -> None:
        """L{consume} on an exchange + pattern (see there)."""
        vhost = self.vhost
        user = self.user
        if exchange_name not in vhost.exchanges:
            check_exchange(exchange_name)
        exchange = vhost.exchange(exchange_name)
        if user is not None:
            self._authorize("read", exchange.name, text)
        if durable_name is not None:
            name = durable_queue_name(self.owner_name, durable_name)
            existed = name in vhost.queues
            if user is not None and not existed:
                self._authorize("configure", name, text)
            if arguments:
                authorize_arguments(user, self.owner_name, vhost.name, arguments, vhost.queue_defaults)
            queue = vhost.declare_queue(
                name, durable=True, on_demand=True, subscription=True, arguments=arguments
            )
            if queue.remote is not None:
                self._subscribe_on_home(queue, exchange, pattern, arguments)
            else:
                if existed and arguments:
                    self._check_arguments(queue, arguments)
                self._bind_or_undo(queue, exchange, pattern, made=not existed)
            consumer.durable = True
        elif live and not consumer.ack_required:
            self._bind_live(consumer, exchange, pattern)
            return
        else:
            name = f"amq.sub.{self.token}.{label or f'{id(consumer):x}'}"
            queue = vhost.declare_queue(
                name,
                durable=False,
                auto_delete=True,
                exclusive_owner=self.connection,
                arguments=None,
                backlog=consumer.backlog_limit,
                policy=_buffer_policy(consumer),
            )
            self._bind_or_undo(queue, exchange, pattern, made=True)
            consumer.private = True
        self._attach(consumer, queue, False)

    def _subscribe_on_home(
        self, queue: Queue, exchange: Exchange, pattern: str, arguments: dict[str, Any] | None
    ) -> None:
        """A durable subscription whose queue's home is another node (it is
        placed as any queue, so that its client finds it from any node):
        declared there as a subscription's queue and bound there, before
        the consumer that follows on the same link. The key is checked
        here first; what the home refuses (other arguments than those it
        has) is logged on both nodes.
        @raise qmq.core.remote.Unavailable: the home is not linked now."""
        check_binding_key(pattern, exchange)
        remote = queue.remote
        remote.reachable(queue)  # type: ignore[union-attr]
        for op, args in (
            ("queue.declare", {"durable": True, "auto_delete": False, "arguments": arguments or None,
                               "subscription": True}),
            ("queue.bind", {"exchange": exchange.name, "key": pattern, "arguments": None}),
        ):
            remote.operate(queue, op, args).addErrback(_not_on_home, queue, op)  # type: ignore[union-attr]

    def _attach(self, consumer: Consumer, queue: Queue, exclusive: bool) -> None:
        """Attach C{consumer} to C{queue} (checked: exclusivity), under the
        channel's prefetch for consumers made now (L{qos})."""
        self._check_exclusive(queue)
        if queue.remote is not None:
            queue.remote.reachable(queue)
        consumers = queue.consumers
        if consumers and (exclusive or consumers[0].exclusive):
            raise AccessRefused(
                f"Queue {queue.name!r} has an exclusive consumer."
                if consumers[0].exclusive
                else f"Queue {queue.name!r} has consumers: an exclusive one cannot join.",
                "access refused (exclusive consumer)",
            )
        consumer.exclusive = exclusive
        if consumer.ack_required:
            if self.prefetch_count and consumer.prefetch == UNLIMITED:
                consumer.prefetch = consumer.credit = self.prefetch_count
            if self.prefetch_bytes:
                self._windows[consumer] = Window(0, self.prefetch_bytes)
                self._gated = True
        self.consumers.add(consumer)
        queue.add_consumer(consumer)

    def _bind_or_undo(self, queue: Queue, exchange: Exchange, key: str, made: bool) -> None:
        """Bind C{queue}; if that is refused (a key past the limits), delete
        the queue again when this subscription made it and it holds nothing,
        so a refused SUBSCRIBE leaves no queue behind."""
        try:
            self.vhost.bind(queue.name, exchange.name, key)
        except Exception:
            if made and not len(queue) and not queue.deleted:
                self.vhost.delete_queue(queue.name)
            raise

    def _bind_live(self, consumer: Consumer, exchange: Exchange, key: str) -> None:
        check_binding_key(key, exchange)
        self.vhost.bind_live(consumer, exchange, key)
        consumer.exchange = exchange
        consumer.binding_key = key
        consumer.budget = self.backlog_budget
        self.consumers.add(consumer)

    def cancel(self, tag: str, keep_unacked: bool = False) -> Consumer:
        """Cancel the consumer tagged C{tag} (AMQP's C{basic.cancel}): see
        L{unsubscribe}.

        @param keep_unacked: its unacknowledged deliveries stay the
            channel's, to be settled by their tags (or given back when the
            channel closes), as AMQP 0-9-1 and RabbitMQ keep them; without
            it they go back to the queue now (STOMP's UNSUBSCRIBE).
        @raise NotFound: no consumer has that tag here."""
        consumer = self.consumer_tags.get(tag)
        if consumer is None:
            raise NotFound(f"No consumer is tagged {tag!r} on this channel.", "unknown consumer tag")
        if keep_unacked and consumer.unacked and consumer.queue is not None:
            self._keep_unacked(consumer, consumer.queue)
        self.unsubscribe(consumer)
        return consumer

    def _keep_unacked(self, consumer: Consumer, queue: Queue) -> None:
        """Hand C{consumer}'s unacked deliveries to the channel's getter of
        C{queue} (what L{get}'s deliveries wait on): their tags settle there,
        and the channel's own window still counts them until then."""
        getter = self._getter(queue)
        owners = self.owners
        for tag, message in consumer.unacked.items():
            getter.unacked[tag] = message
            owners[tag] = getter
        consumer.unacked.clear()
        if self._windows:
            self._windows.pop(consumer, None)

    def unsubscribe(self, consumer: Consumer, delete_durable: bool = False) -> None:
        """Detach C{consumer}: its unacked messages go back to their queue; a
        private queue goes with it, and a durable subscription's queue too
        when C{delete_durable}."""
        self.consumers.discard(consumer)
        if self._tag_of:
            tag = self._tag_of.pop(consumer, None)
            if tag is not None:
                del self.consumer_tags[tag]
        exchange = consumer.exchange
        if exchange is not None:
            consumer.exchange = None
            consumer.discard_backlog()
            if not exchange.deleted:
                self.vhost.unbind_live(consumer, exchange, consumer.binding_key)
            return
        unacked = self._forget_unacked(consumer)
        queue = consumer.queue
        if queue is None:
            return
        queue.remove_consumer(consumer, unacked)
        if delete_durable and consumer.durable:
            check_queue_access(self.owner_name, queue.name, "delete")
            if self.user is not None:
                self._authorize("configure", queue.name, queue.name)
        if (consumer.private or (delete_durable and consumer.durable)) and not queue.deleted:
            if queue.remote is not None:
                # Deleted on its home (after the cancel, on the same link).
                queue.remote.operate(queue, "queue.delete", {}).addErrback(  # type: ignore[attr-defined]
                    _not_on_home, queue, "queue.delete")
            self.vhost.delete_queue(queue.name)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue or exchange under C{consumer} was deleted by someone else."""
        self.consumers.discard(consumer)
        if self._tag_of:
            tag = self._tag_of.pop(consumer, None)
            if tag is not None:
                del self.consumer_tags[tag]
        consumer.discard_backlog()
        self._forget_unacked(consumer)

    def _forget_unacked(self, consumer: Consumer) -> list[Message]:
        """Stop tracking C{consumer}'s unacknowledged deliveries; return their messages."""
        unacked = consumer.unacked
        if not unacked:
            if self._windows:
                self._windows.pop(consumer, None)
            return []
        owners = self.owners
        for tag in unacked:
            owners.pop(tag, None)
        messages = list(unacked.values())
        unacked.clear()
        if self._gated:
            self._released(consumer, messages)
            self._windows.pop(consumer, None)
        return messages

    # -- prefetch ----------------------------------------------------------------

    def qos(self, prefetch_count: int = 0, prefetch_bytes: int = 0, global_: bool = False) -> None:
        """Set a prefetch window (AMQP's C{basic.qos}).

        Not global: the consumers this channel attaches from now on may
        hold at most C{prefetch_count} unacknowledged deliveries each (unless
        they state their own) and C{prefetch_bytes} body bytes. Global: the
        channel's consumers together, from now on (what is out counts).
        0 is no bound.

        @raise PreconditionFailed: a negative bound.
        """
        if prefetch_count < 0 or prefetch_bytes < 0:
            raise PreconditionFailed("a prefetch bound is 0 (none) or more")
        if not global_:
            self.prefetch_count = prefetch_count
            self.prefetch_bytes = prefetch_bytes
            return
        if not (prefetch_count or prefetch_bytes):
            self.window = None
            self._gated = bool(self._windows)
            self._reopen(list(self.consumers))
            return
        window = self.window = Window(prefetch_count, prefetch_bytes)
        window.used = len(self.owners)
        for consumer in set(self.owners.values()):
            window.used_bytes += sum(len(m.body) for m in consumer.unacked.values())
        self._gated = True
        if window.full():
            for consumer in self.consumers:
                if consumer.ack_required:
                    consumer.paused = True

    def _took(self, consumer: Consumer, message: Message) -> None:
        """C{message} was delivered to C{consumer}, which must ack it:
        count it in the windows over it, and close a window that is full."""
        size = len(message.body)
        window = self._windows.get(consumer) if self._windows else None
        if window is not None:
            window.used += 1
            window.used_bytes += size
            if window.full():
                consumer.paused = True
        window = self.window
        if window is not None:
            window.used += 1
            window.used_bytes += size
            if window.full():
                for c in self.consumers:
                    if c.ack_required:
                        c.paused = True

    def _released(self, consumer: Consumer, messages: Iterable[Message]) -> None:
        """C{messages} delivered to C{consumer} are settled (or given back):
        open the windows they held, and deliver what waits."""
        count = 0
        size = 0
        for m in messages:
            count += 1
            size += len(m.body)
        reopen: list[Consumer] = []
        window = self._windows.get(consumer) if self._windows else None
        if window is not None:
            was = window.full()
            window.used -= count
            window.used_bytes -= size
            if was and not window.full():
                reopen.append(consumer)
        window = self.window
        if window is not None:
            was = window.full()
            window.used -= count
            window.used_bytes -= size
            if was and not window.full():
                reopen = list(self.consumers)
        if reopen:
            # The settle's own drain serves the consumer's queue.
            self._reopen(reopen, consumer.queue)

    def _blocked(self, consumer: Consumer) -> bool:
        """Whether a window (or the transport) keeps C{consumer} paused."""
        if self._transport_paused:
            return True
        if self.window is not None and self.window.full():
            return True
        window = self._windows.get(consumer) if self._windows else None
        return window is not None and window.full()

    def _reopen(self, consumers: list[Consumer], drained: Queue | None = None) -> None:
        """Unpause those of C{consumers} nothing keeps paused, and hand them
        what waits in their queues (but C{drained}, which the caller drains)."""
        queues = []
        for consumer in consumers:
            buffer = consumer.buffer
            if consumer.paused and not self._blocked(consumer) and not (buffer is not None and buffer.cut):
                consumer.paused = False
                queue = consumer.queue
                if queue is not None and queue is not drained and queue not in queues:
                    queues.append(queue)
        for queue in queues:
            queue.drain()

    # -- acknowledgements --------------------------------------------------------

    def track(self, consumer: Consumer, message: Message) -> int:
        """Tag a delivery on C{consumer} and record it as unacked if it must
        be acked: what every frontend's C{Consumer.deliver} calls first.

        @return: the delivery tag to name to the client.
        """
        tag = next(self._tags)
        if consumer.ack_required:
            consumer.unacked[tag] = message
            self.owners[tag] = consumer
            if self._gated:
                self._took(consumer, message)
        return tag

    @property
    def next_tag(self) -> int:
        """The next delivery tag (none is taken)."""
        return self._tags.next_value

    def tag_source(self) -> Iterator[int]:
        """The delivery tags, as an iterator: C{next()} of it takes a tag
        and records nothing, all that L{track} does for a consumer that
        does not ack (its deliveries are settled as they go out). Such a
        consumer's frontend may keep it and call C{next} on it per delivery
        instead of L{track} (a C call: fan-out makes one per subscriber and
        message; C{next(tags)} is cheaper than calling a bound
        C{__next__})."""
        return self._tags

    def owner_of(self, tag: int) -> Consumer | None:
        """The consumer delivery C{tag} waits on, or None.

        @raise NotFound: no delivery C{tag} waits for an acknowledgement and
            C{tag} is above the highest tag a cumulative ack settled on this
            channel (at or below it, an ack of a tag no longer waiting is a
            no-op: the mark is kept per channel, not per consumer, as a tag
            settled by a cumulative ack is not remembered one by one).
        """
        consumer = self.owners.get(tag)
        if consumer is None:
            if 0 < tag <= self._cumulative_upto:
                return None  # already covered by a cumulative ack
            if tag in self._taken_back:
                return None  # its ack timeout passed: the queue took it back
            raise NotFound(f"no delivery {tag} is waiting for an acknowledgement")
        return consumer

    def settle(self, tag: int, multiple: bool = False, ack: bool = True, requeue: bool = True) -> int:
        """Settle delivery C{tag} (AMQP's C{basic.ack}, C{basic.nack} and
        C{basic.reject}): ack it, or nack it, requeued or dropped (dead-lettered
        where the queue says so).

        With C{multiple}, every delivery of this channel up to C{tag} too,
        whichever consumer it went to; C{multiple} with tag 0 settles all.
        Each consumer's deliveries are settled in delivery order.

        A tag whose ack timeout passed (the queue took it back) is ignored.

        @return: how many deliveries were settled.
        @raise PreconditionFailed: C{tag} is not waiting for a settle here
            (AMQP's 406 "unknown delivery tag").
        """
        owners = self.owners
        if multiple:
            if tag and tag not in owners and tag not in self._taken_back:
                raise PreconditionFailed(f"unknown delivery tag {tag}", "unknown delivery tag")
            # Outstanding deliveries are bounded by the prefetch window.
            tags = [t for t in owners if t <= tag] if tag else list(owners)
        else:
            if tag not in owners:
                if tag in self._taken_back:
                    return 0
                raise PreconditionFailed(f"unknown delivery tag {tag}", "unknown delivery tag")
            tags = [tag]
        by_consumer: dict[Consumer, list[Message]] = {}
        for t in tags:
            consumer = owners.pop(t)
            by_consumer.setdefault(consumer, []).append(consumer.unacked.pop(t))
        for consumer, messages in by_consumer.items():
            self._settle_messages(consumer, messages, ack, requeue)
        return len(tags)

    def settle_delivery(
        self, consumer: Consumer | None, tag: int, ack: bool, requeue: bool = True
    ) -> None:
        """Ack (or nack, requeueing or not) delivery C{tag} on C{consumer};
        for a cumulative consumer, every earlier delivery on it too (STOMP's
        C{ack:client}, which is per subscription).

        Each settled delivery is visited once: the cost is O(1) per message,
        however many acks name it (the consumer's unacked dict is in delivery
        order, so a cumulative ack pops from its front).
        """
        if consumer is None:
            return
        unacked = consumer.unacked
        owners = self.owners
        if consumer.cumulative:
            if tag > self._cumulative_upto:
                self._cumulative_upto = tag
            done = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                done.append(unacked.pop(first))
                owners.pop(first, None)
        else:
            message = unacked.pop(tag, None)
            owners.pop(tag, None)
            if message is None:
                return
            if not self._gated and ack:
                # One message acked, the commonest case (STOMP's
                # ack:client-individual): no list, no loop.
                queue = consumer.queue
                if queue is not None:
                    self.acked += 1
                    queue.ack(consumer, message)
                return
            done = [message]
        # _settle_messages, inlined: STOMP's every ACK comes here.
        if not done:
            return
        if self._gated:
            self._released(consumer, done)
        queue = consumer.queue
        if queue is None:
            return
        if ack:
            self.acked += len(done)
            for m in done:
                queue.ack(consumer, m)
        else:
            queue.reject(consumer, done, requeue)

    def _settle_messages(
        self, consumer: Consumer, messages: list[Message], ack: bool, requeue: bool
    ) -> None:
        if self._gated:
            # Before the queue drains: the consumer may take more at once.
            self._released(consumer, messages)
        queue = consumer.queue
        if queue is None:
            return
        if ack:
            self.acked += len(messages)
            for m in messages:
                queue.ack(consumer, m)
        else:
            queue.reject(consumer, messages, requeue)

    # -- polling -----------------------------------------------------------------

    def get(self, queue: str, ack: bool = True) -> Got | None | Deferred:
        """Take the next ready message of C{queue} (AMQP's C{basic.get}).

        With C{ack}, the delivery waits for L{settle} (a nack requeues it;
        it goes back to the queue if the channel closes first); without,
        it is settled as it is taken.

        @return: L{Got}, or None when the queue has nothing ready; for a
            queue whose home is another node, a Deferred of it.
        @raise NotFound: no such queue.
        @raise ResourceLocked: the queue is exclusive to another connection.
        @raise AccessRefused: no read permission, or the queue has an
            exclusive consumer.
        """
        q = self.vhost.queue_or_stand_in(queue)
        self._check_exclusive(q)
        if self.user is not None:
            self._authorize("read", queue, queue)
        if queue.startswith(DURABLE_SUBSCRIPTION_PREFIX):
            check_queue_access(self.owner_name, queue, "read")
        if q.consumers and q.consumers[0].exclusive:
            raise AccessRefused(
                f"Queue {queue!r} has an exclusive consumer.", "access refused (exclusive consumer)"
            )
        if q.remote is not None:
            # Its home is another node (qmq.core.remote): taken there.
            d = q.remote.get(q, ack)
            return d.addCallbacks(self._got_remote, self.vhost.not_on_home, (q, ack), None, (q,))  # type: ignore[no-any-return]
        message = q.get()
        if message is None:
            return None
        getter = self._getter(q)
        if ack:
            tag = self.track(getter, message)
        else:
            tag = next(self._tags)
            q.ack(getter, message)
        return Got(tag, message, len(q))

    def _got_remote(self, got: tuple[Message, int] | None, queue: Queue, ack: bool) -> Got | None:
        """What a queue's home node gave a L{get}: tracked here as a local one."""
        if got is None:
            return None
        message, remaining = got
        if self.closed:
            if ack:
                queue.requeue([message])
            return None
        getter = self._getter(queue)
        if ack:
            tag = self.track(getter, message)
        else:
            tag = next(self._tags)
        return Got(tag, message, remaining)

    def _getter(self, queue: Queue) -> _Getter:
        """The channel's getter of C{queue}, made on first use."""
        getter = self._getters.get(queue)
        if getter is None:
            getter = self._getters[queue] = _Getter(True, None, self)
            getter.channel = self
            getter.queue = queue
        return getter

    # -- exchange to exchange ----------------------------------------------------

    def bind_exchange(
        self, destination: str, source: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Bind exchange C{destination} to exchange C{source} (AMQP's
        C{exchange.bind}): what C{source} routes with a matching key goes
        on through C{destination} too, with its own routing key. A loop of
        such bindings is allowed and harmless: a publish visits each
        exchange once and reaches each queue once.

        @raise NotFound: no such exchange.
        @raise AccessRefused: no write permission on C{destination}, or
            no read permission on C{source} (as RabbitMQ asks).
        """
        if self.user is not None:
            self._authorize("write", destination, destination)
            self._authorize("read", source, source)
        self.vhost.bind_exchange(destination, source, routing_key, arguments)

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Remove an exchange-to-exchange binding (AMQP's C{exchange.unbind};
        no error if there was none)."""
        if self.user is not None:
            self._authorize("write", destination, destination)
            self._authorize("read", source, source)
        self.vhost.unbind_exchange(destination, source, routing_key, arguments)

    #: How many taken-back delivery tags a channel remembers, so that a
    #: late ack of one is a no-op rather than an error.
    taken_back_memory = 4096

    def take_back(self, consumer: Consumer, message: Message) -> bool:
        """The queue takes C{message} back from C{consumer} (its ack timeout
        passed): forget the delivery and give the consumer's credit back.

        A later ack or nack of its tag is ignored (the last
        L{taken_back_memory} tags are remembered).

        @return: whether C{message} was still waiting for an ack on C{consumer}.
        """
        unacked = consumer.unacked
        tag = next((t for t, m in unacked.items() if m is message), None)
        if tag is None:
            return False
        del unacked[tag]
        self.owners.pop(tag, None)
        taken = self._taken_back
        taken[tag] = None
        if len(taken) > self.taken_back_memory:
            del taken[next(iter(taken))]
        if self._gated:
            self._released(consumer, (message,))
        consumer.credit += 1
        return True

    # -- flow control ------------------------------------------------------------

    def pause(self) -> None:
        """The client's transport is full: no consumer of this channel gets more."""
        self._transport_paused = True
        for consumer in self.consumers:
            consumer.paused = True

    def resume(self) -> None:
        """The transport drained: deliver what waits (to the consumers no
        prefetch window keeps paused)."""
        self._transport_paused = False
        gated = self._gated
        for consumer in list(self.consumers):
            if not (gated and self._blocked(consumer)):
                consumer.resume()

    def deliver_waiting(self, consumer: Consumer) -> None:
        """Hand C{consumer} what waits for it now, if it may take it (a
        frontend that held deliveries back, e.g. until a RECEIPT was sent)."""
        if consumer.paused:
            return
        queue = consumer.queue
        if queue is not None:
            queue.drain()
        elif consumer.backlog:
            consumer.drain_backlog()

    # -- the end -------------------------------------------------------------------

    #: Most consumers one reactor turn detaches when a channel closes; a
    #: client with 10,000 subscriptions is taken apart over several turns.
    close_batch = 256

    def close(self) -> None:
        """The client is gone: give back what it held (once).

        Its consumers are paused at once (no queue hands them anything
        more) and detached L{close_batch} per reactor turn: their unacked
        messages go back, their private queues go, and then, if the channel
        has its own L{Connection}, the queues exclusive to it.
        """
        if self.closed:
            return
        self.closed = True
        traffic = getattr(self.broker, "traffic", None)
        if traffic is not None:
            traffic.close(self)
        consumers = list(self.consumers)
        if len(consumers) > self.close_batch:
            for consumer in consumers:
                consumer.paused = True
        self._detach(consumers)

    def _detach(self, consumers: list[Consumer]) -> None:
        batch = self.close_batch
        for consumer in consumers[:batch]:
            self.unsubscribe(consumer)
        if len(consumers) > batch:
            self.broker.clock.callLater(0, self._detach, consumers[batch:])
            return
        self.consumers.clear()
        getters, self._getters = self._getters, {}
        for queue, getter in getters.items():
            unacked = self._forget_unacked(getter)
            if unacked and not queue.deleted:
                queue.requeue(unacked)
        self.owners.clear()
        self._closed()

    def _closed(self) -> None:
        """The last step of L{close}: what it resolved is forgotten, and
        its own connection closes (its exclusive queues go)."""
        self.forget_targets()
        if self._own_connection:
            self.connection.close()


def _internal(exchange: Exchange, vhost: VirtualHost) -> AccessRefused:
    """The refusal of a publish to an internal exchange (RabbitMQ's words),
    whichever frontend asked: only other exchanges route into it."""
    return AccessRefused(
        f"cannot publish to internal exchange {exchange.name!r} in vhost {vhost.name!r}",
        "access refused (internal exchange)",
    )


def _buffer_policy(consumer: Consumer) -> QueuePolicy | None:
    """The policy of the private queue of a C{consumer} that states a
    buffer: its bounds (the smaller of its own and its C{backlog_limit}),
    and past them it is cut off (L{CUT_CONSUMERS}); None without a buffer."""
    buffer = consumer.buffer
    if buffer is None:
        return None
    limits = [n for n in (buffer.messages, consumer.backlog_limit) if n]
    return QueuePolicy.shared(
        max_length=min(limits) if limits else None,
        max_bytes=buffer.bytes or None,
        overflow=CUT_CONSUMERS,
    )


__all__ = ["Channel", "Connection", "Got", "PreconditionFailed", "Published", "SendTarget", "Window"]


def _not_on_home(failure: Any, queue: Queue, op: str) -> None:
    """An operation a channel carried to C{queue}'s home, refused there:
    logged (nobody waits for its answer)."""
    log.warn("{op} of queue {queue!r} on its home node {home!r} failed: {error}", op=op, queue=queue.name,
             home=getattr(queue, "home", None), error=failure.getErrorMessage())


def _with_facts(facts: Any, queue: Queue) -> tuple[Queue, dict[str, Any]]:
    """(C{queue}, what its home said of it), for L{Channel.find_queue}.
    @raise ResourceLocked: it is exclusive to a connection there (never
        this one: this connection's own queues live here)."""
    if not isinstance(facts, dict):
        facts = {}
    if facts.get("exclusive") is True:
        raise ResourceLocked(f"Queue {queue.name!r} is exclusive to another connection.", "resource locked")
    return queue, facts
