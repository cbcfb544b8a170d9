# -*- test-case-name: tests.test_core_management -*-
"""Management operations, with their access checks, in the core.

A frontend that manages topology (the HTTP API's queue, exchange and
binding endpoints; later AMQP's C{queue.declare} and friends) opens a
L{Management} for the identity of the request and calls it; the checks are
made here, once, and each operation is then done on the
L{qmq.core.vhost.VirtualHost}:

    operation                 permission (RabbitMQ's)         ownership
    declare a queue           configure: the queue            yes
      with arguments that     write: each target (see
      make the broker write   L{authorize_arguments})
    delete a queue            configure: the queue            yes
    purge a queue             read: the queue                 yes
    get (describe) a queue    read: the queue                 yes (unless
                                                              C{see_all})
    scan a queue              read: the queue                 yes
    bind / unbind             write: the queue; read: the     yes (queue)
                              exchange with the binding key
    declare an exchange       configure: the exchange
      with an alternate       write: the alternate exchange
    delete an exchange        configure: the exchange
    get an exchange           read: the exchange

"Ownership" is L{qmq.core.ownership}: a durable subscription's queue is its
owner's alone, whatever the permissions, with authentication on or off.
L{Management.check_owner} asks that rule alone, for a frontend about to
receive from a queue or settle its deliveries (the channel checks C{read}
when it attaches the consumer).

Arguments that make the broker write somewhere are permissions too: a queue
declared with C{x-dead-letter-exchange} republishes into that exchange (or,
for the default exchange C{""}, into the queue C{x-dead-letter-routing-key}
names) on behalf of whoever publishes to it, so declaring one needs the
declarer's C{write} on the target, as publishing there would
(L{authorize_arguments}, which L{qmq.core.channel.Channel} also asks when a
STOMP SUBSCRIBE declares a queue with arguments). An exchange declared with
C{alternate-exchange} is the same: what it cannot route is published to the
alternate on the publisher's behalf, so declaring it needs C{write} there
(RabbitMQ asks the same). Queues and exchanges declared in the
configuration are the operator's and are not asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.core.access import Resource, allowed, authorize
from qmq.core.errors import AccessRefused, NotFound, PreconditionFailed
from qmq.core.exchange import ALTERNATE_EXCHANGE, alternate_of
from qmq.core.names import check_binding_key
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX, Owner, check_queue_access
from qmq.core.policy import QueuePolicy, argument_name

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from qmq.core.exchange import Exchange
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost

log = Logger()

__all__ = ["Management", "authorize_arguments", "check_equivalent", "queue_facts", "writing_targets"]


#: The queue arguments that make the broker write somewhere (by their core
#: names, L{argument_name}).
WRITING_ARGUMENTS = frozenset(("x-dead-letter-exchange", "x-dead-letter-routing-key"))


def writing_targets(
    vhost: str, arguments: dict[str, Any] | None, base: QueuePolicy | None = None, of: str = "queue"
) -> list[tuple[str, Resource]]:
    """The resources queue (or exchange) C{arguments} make the broker write
    to, each with the argument that names it.

    For an exchange's arguments (C{of="exchange"}) the target is its
    alternate exchange (C{alternate-exchange}, L{alternate_of}): what the
    exchange cannot route is published there on behalf of whoever published
    to it.

    Read from the policy the arguments make over C{base} (the virtual
    host's defaults: a routing key given over a default dead-letter
    exchange aims that exchange), so C{dead-letter-exchange} and
    C{x-dead-letter-exchange} are one argument and a bad value is refused
    as anywhere else. Arguments that name no target (L{WRITING_ARGUMENTS})
    make none: what the defaults alone aim at is the operator's. A queue's
    target is the dead-letter one: the exchange C{x-dead-letter-exchange}
    with C{x-dead-letter-routing-key} (None: the message's own key), or,
    for the default exchange, the queue that key names.

    @raise PreconditionFailed: an argument's value is bad, or the default
        exchange is named without a routing key: the dead letters would go
        to whichever queue their own routing key names, which no check at
        declare time can bound.
    """
    if of == "exchange":
        alternate = alternate_of(arguments)
        if alternate is None:
            return []
        return [(ALTERNATE_EXCHANGE, Resource.exchange(vhost, alternate))]
    if not arguments or WRITING_ARGUMENTS.isdisjoint(map(argument_name, arguments)):
        return []
    policy = QueuePolicy.from_arguments(arguments, base)
    exchange = policy.dead_letter_exchange
    if exchange is None:
        return []
    key = policy.dead_letter_routing_key
    if not exchange and key is None:
        raise PreconditionFailed(
            "x-dead-letter-exchange '' (the default exchange) needs x-dead-letter-routing-key "
            "naming the queue dead letters go to: without one they would go to whichever queue "
            "their own routing key names, and the broker cannot check that you may write there.",
            "dead-letter target needed",
        )
    return [("x-dead-letter-exchange", Resource.exchange(vhost, exchange, key))]


def check_equivalent(queue: Queue, arguments: dict[str, Any]) -> None:
    """C{arguments} given again for C{queue}, which exists: they must agree
    with its policy (RabbitMQ's "inequivalent arg"), their values checked
    as for a new queue; nothing is changed.

    @raise PreconditionFailed: they do not, naming them.
    """
    check_equivalent_policy(queue.name, queue.policy, arguments)


def check_equivalent_policy(name: str, policy: QueuePolicy, arguments: dict[str, Any]) -> None:
    """L{check_equivalent} for queue C{name} whose policy is C{policy}
    (a queue on another node: the policy of the arguments its home has)."""
    wanted = QueuePolicy.from_arguments(arguments, policy)
    if wanted != policy:
        given = ", ".join(f"{k}={v}" for k, v in sorted(arguments.items()))
        raise PreconditionFailed(
            f"Queue {name!r} exists with other arguments than those given ({given}); "
            "delete it or declare it without them.",
            "inequivalent queue arguments",
        )


def authorize_arguments(
    user: Any,
    owner: str | Owner,
    vhost: str,
    arguments: dict[str, Any] | None,
    base: QueuePolicy | None = None,
    of: str = "queue",
) -> None:
    """Refuse queue (or exchange, C{of="exchange"}) C{arguments} that would
    make the broker write where the declarer may not (see
    L{writing_targets}): the declarer needs C{write} on each target, and a
    target queue that is another owner's durable subscription is refused
    whatever the permissions.

    @param user: a L{qmq.auth.User}, or None (authentication off: only
        ownership is asked).
    @param owner: the declarer as the owner of durable subscriptions.
    @param base: the policy the arguments apply over (the virtual host's
        C{queue_defaults}).
    @raise AccessRefused: naming the argument and the target.
    @raise PreconditionFailed: see L{writing_targets}.
    """
    for argument, target in writing_targets(vhost, arguments, base, of):
        try:
            authorize(user, "write", target, owner)
        except AccessRefused as e:
            raise AccessRefused(
                f"{argument} would make the broker write to {target.describe()}, and {e.message}",
                e.short,
            ) from None


def queue_facts(queue: Any) -> dict[str, Any]:
    """What a listing shows of C{queue} on its home: JSON-ready facts."""
    unacked = sum(len(c.unacked) for c in queue.consumers)
    return {
        "name": queue.name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "arguments": queue.arguments or {},
        "messages_ready": len(queue),
        "messages_unacknowledged": unacked,
        "ready_bytes": queue.ready_bytes,
        "consumers": len(queue.consumers),
        "dropped": queue.dropped,
        "published": queue.published,
        "delivered": queue.delivered,
    }


class Management:
    """Topology operations of one identity in one virtual host (see the
    module docstring).

    @ivar vhost: the virtual host.
    @ivar user: a L{qmq.auth.User}, or None (authentication off).
    @ivar owner: who the identity is as the owner of durable subscriptions.
    """

    def __init__(self, vhost: VirtualHost, user: Any = None, owner: str | Owner = "") -> None:
        self.vhost = vhost
        self.user = user
        self.owner = owner

    # -- the checks ------------------------------------------------------------------

    def _queue(self, name: str) -> Resource:
        return Resource.queue(self.vhost.name, name)

    def _exchange(self, name: str, key: str | None = None) -> Resource:
        return Resource(self.vhost.name, "exchange", name, key)

    def authorize(self, operation: str, resource: Resource) -> None:
        """L{qmq.core.access.authorize} for this identity (ownership included)."""
        authorize(self.user, operation, resource, self.owner)

    def check_owner(self, name: str, operation: str) -> None:
        """The durable-subscription rule alone (L{check_queue_access}): for
        receiving from queue C{name} and settling its deliveries, whose
        C{read} permission the channel checks when it attaches a consumer.
        @raise AccessRefused: it is another owner's durable subscription."""
        check_queue_access(self.owner, name, operation)

    def may_read_queue(self, name: str, see_all: bool = False) -> bool:
        """Whether this identity may read queue C{name} (its permissions and,
        for a durable subscription, ownership): what a listing shows.
        @param see_all: skip ownership (an administrator's listing)."""
        try:
            authorize(self.user, "read", self._queue(name), None if see_all else self.owner)
        except AccessRefused:
            return False
        return True

    def may_read_exchange(self, name: str) -> bool:
        """Whether this identity may read exchange C{name} (a listing's filter)."""
        return allowed(self.user, "read", self._exchange(name))

    # -- queues ------------------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        wait: list[Deferred] | None = None,
    ) -> tuple[Queue, bool]:
        """Declare queue C{name} (made on demand: the virtual host's
        defaults under its C{arguments}); return it and whether it was made.

        @param wait: where the home's answer goes (a Deferred) when the
            queue's home is another node: of C{{"made": bool, "facts":
            queue_facts}} (or None from a peer of an older version), failing
            with the home's refusal; None: its refusal is logged.

        @raise AccessRefused: an C{amq.} name or a new C{durable.} name
            (the broker's own), no
            C{configure}, another owner's durable subscription, or
            arguments that write where the declarer may not.
        @raise PreconditionFailed: bad arguments, or other arguments than
            those of the queue that exists.
        @raise ResourceLocked: a connection of another node of the mesh
            holds it exclusively.
        @raise NotFound: it does not exist and the virtual host does not let
            clients create queues (C{allow_create = false}).
        """
        vhost = self.vhost
        if name.startswith("amq.") or (name.startswith(DURABLE_SUBSCRIPTION_PREFIX) and name not in vhost.queues):
            # As for a STOMP destination: the broker makes these (temporary
            # and private queues; a durable SUBSCRIBE makes durable.OWNER.NAME).
            raise AccessRefused(
                f"Queue {name!r}: names starting with 'amq.' or 'durable.' are the broker's own; "
                "a durable subscription's queue is made by subscribing.",
                "access refused (configure)",
            )
        self.authorize("configure", self._queue(name))
        authorize_arguments(self.user, self.owner, vhost.name, arguments, vhost.queue_defaults)
        queue = vhost.queues.get(name)
        existed = queue is not None
        if queue is None or queue.remote is not None:
            vhost.check_unlocked(name)
        if queue is not None and arguments:
            check_equivalent(queue, arguments)
        if not existed and not vhost.allow_create:
            # The same rule as a STOMP SEND or SUBSCRIBE naming a new queue.
            raise NotFound(
                f"Queue {name!r} does not exist, and virtual host {vhost.name!r} does not let "
                "clients create queues (allow_create = false): only queues declared in the "
                "configuration can be used.",
                "no such queue",
            )
        queue = self.vhost.declare_queue(
            name, durable=durable, auto_delete=auto_delete, arguments=arguments or None, on_demand=True
        )
        if queue.remote is not None:
            # Its home is another node: declared there too, as asked (what
            # this node asks of it next, a bind, follows on the same link).
            args = {"durable": durable, "auto_delete": auto_delete, "arguments": arguments or None}
            answer = queue.remote.operate(queue, "queue.declare", args)
            if wait is not None:
                wait.append(answer)
            else:
                answer.addErrback(_not_declared, queue)
        return queue, not existed

    def queue(self, name: str, see_all: bool = False) -> Queue:
        """Queue C{name}, to describe. @param see_all: skip ownership (an
        administrator sees every queue's description).
        @raise NotFound, AccessRefused."""
        queue = self.vhost.queue_or_stand_in(name)
        authorize(self.user, "read", self._queue(name), None if see_all else self.owner)
        return queue

    def delete_queue(self, name: str, if_unused: bool = False, if_empty: bool = False) -> int | Deferred:
        """Delete queue C{name}; return how many ready messages went with it
        (for a queue whose home is another node, a Deferred of it: the
        home deletes it, then this node's stand-in goes).
        @param if_unused: refuse if it has consumers (AMQP's C{if-unused}).
        @param if_empty: refuse if it holds messages (AMQP's C{if-empty}).
        @raise NotFound, AccessRefused (also: it belongs to a session),
            PreconditionFailed (C{if_unused}, C{if_empty})."""
        queue = self.vhost.queue_or_stand_in(name)
        self.authorize("configure", self._queue(name))
        if queue.exclusive_owner is not None:
            raise AccessRefused(f"Queue {name!r} belongs to a session.", "access refused (configure)")
        if queue.remote is not None:
            d = queue.remote.operate(queue, "queue.delete", {"if_unused": if_unused, "if_empty": if_empty})
            return d.addCallbacks(self._stand_in_gone, self.vhost.not_on_home, (queue,), None, (queue,))
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue {name!r} in vhost {self.vhost.name!r} in use")
        if if_empty and len(queue):
            raise PreconditionFailed(f"queue {name!r} in vhost {self.vhost.name!r} not empty")
        return self.vhost.delete_queue(name)

    def _stand_in_gone(self, count: Any, queue: Queue) -> int:
        if self.vhost.queues.get(queue.name) is queue:
            self.vhost.delete_queue(queue.name)
        return int(count or 0)

    def purge_queue(self, name: str) -> int | Deferred:
        """Drop queue C{name}'s ready messages; return how many (a Deferred
        of it for a queue whose home is another node: purged there).
        @raise NotFound, AccessRefused."""
        queue = self.vhost.queue_or_stand_in(name)
        self.authorize("read", self._queue(name))
        if queue.remote is not None:
            d = queue.remote.operate(queue, "queue.purge", {})
            return d.addCallbacks(lambda n: int(n or 0), self.vhost.not_on_home, errbackArgs=(queue,))
        return queue.purge()

    def scan(self, name: str, start: float, end: float, cursor: str | None = None, limit: int = 100) -> Deferred:
        """A range scan of queue C{name} (L{VirtualHost.scan}).
        @raise NotFound, AccessRefused, PreconditionFailed."""
        self.vhost.queue_or_stand_in(name)
        self.authorize("read", self._queue(name))
        return self.vhost.scan(name, start, end, cursor, limit)

    # -- bindings ------------------------------------------------------------------------

    def _binding(self, queue: str, exchange: str, key: str) -> None:
        self.vhost.queue_or_stand_in(queue)
        self.vhost.exchange(exchange)
        self.authorize("write", self._queue(queue))
        self.authorize("read", self._exchange(exchange, key))

    def bind(self, queue: str, exchange: str, key: str = "", arguments: dict | None = None) -> Deferred | None:
        """Bind C{queue} to C{exchange} with C{key} (and, for a headers
        exchange, its C{arguments}). A queue whose home is another node is
        bound there (its bindings are its home's): a Deferred of the home's
        answer.
        @raise NotFound, AccessRefused, PreconditionFailed."""
        return self._bind("queue.bind", queue, exchange, key, arguments)

    def unbind(self, queue: str, exchange: str, key: str = "", arguments: dict | None = None) -> Deferred | None:
        """Remove the binding of C{queue} to C{exchange} with C{key} (on
        the queue's home, as L{bind}).
        @raise NotFound, AccessRefused."""
        return self._bind("queue.unbind", queue, exchange, key, arguments)

    def _bind(self, op: str, queue: str, exchange: str, key: str, arguments: dict | None) -> Deferred | None:
        self._binding(queue, exchange, key)
        q = self.vhost.queue_or_stand_in(queue)
        if q.remote is not None:
            if op == "queue.bind":
                check_binding_key(key, self.vhost.exchange(exchange))
            args = {"exchange": exchange, "key": key, "arguments": arguments}
            return q.remote.operate(q, op, args).addCallbacks(lambda _: None, self.vhost.not_on_home,
                                                              errbackArgs=(q,))
        if op == "queue.bind":
            self.vhost.bind(queue, exchange, key, arguments)
        else:
            self.vhost.unbind(queue, exchange, key, arguments)
        return None

    # -- exchanges -----------------------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> tuple[Exchange, bool]:
        """Declare exchange C{name}; return it and whether it was made.

        @param internal: clients may not publish to it.
        @param arguments: its arguments; C{alternate-exchange} needs the
            declarer's C{write} on that exchange (L{authorize_arguments}).
        @raise AccessRefused: a new C{amq.} name, no C{configure}, or an
            alternate exchange the declarer may not write to.
        @raise PreconditionFailed: another type, internal flag or alternate
            than the existing one's; a bad argument."""
        vhost = self.vhost
        exchanges = vhost.exchanges
        if name.startswith("amq.") and name not in exchanges:
            raise AccessRefused(f"Exchange names starting with 'amq.' are the broker's own ({name!r}).",
                                "access refused (configure)")
        self.authorize("configure", self._exchange(name))
        authorize_arguments(self.user, self.owner, vhost.name, arguments, of="exchange")
        existed = name in exchanges
        exchange = vhost.declare_exchange(name, type, durable, auto_delete, internal=internal, arguments=arguments)
        return exchange, not existed

    def exchange(self, name: str) -> Exchange:
        """Exchange C{name}, to describe. @raise NotFound, AccessRefused."""
        exchange = self.vhost.exchange(name)
        self.authorize("read", self._exchange(name))
        return exchange

    def delete_exchange(self, name: str) -> None:
        """Delete exchange C{name} and its bindings.
        @raise NotFound, AccessRefused (also: a built-in exchange)."""
        self.vhost.exchange(name)
        self.authorize("configure", self._exchange(name))
        self.vhost.delete_exchange(name)


def _not_declared(failure: Any, queue: Queue) -> None:
    log.warn("queue {queue!r} was not declared on its home node {home!r}: {error}", queue=queue.name,
             home=getattr(queue, "home", None), error=failure.getErrorMessage())
