# -*- test-case-name: tests.test_core -*-
"""Virtual hosts: the namespace of exchanges, queues and bindings.

This is AMQP 0-9-1's model. Every virtual host has the default exchange
(C{""}, routing to the queue named by the routing key) and C{amq.direct},
C{amq.fanout}, C{amq.topic}, C{amq.headers}. Frontends publish with
L{VirtualHost.publish} and consume by attaching a
L{qmq.core.consumer.Consumer} to a queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qmq.core.errors import AccessRefused, NotFound, PreconditionFailed
from qmq.core.exchange import EXCHANGE_CLASSES, EXCHANGE_TYPES, Exchange
from qmq.core.queue import Queue

if TYPE_CHECKING:
    from qmq.core.broker import Broker
    from qmq.core.message import Message

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
    """

    def __init__(self, broker: Broker | None, name: str) -> None:
        self.broker = broker
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        for ex_name, ex_type in STANDARD_EXCHANGES:
            self.declare_exchange(ex_name, ex_type)

    def __repr__(self) -> str:
        return f"<VirtualHost {self.name!r} queues={len(self.queues)}>"

    # -- exchanges ---------------------------------------------------------

    def declare_exchange(
        self, name: str, type: str, durable: bool = True, auto_delete: bool = False
    ) -> Exchange:
        """Create an exchange, or return the existing one if it agrees.

        @raise PreconditionFailed: unknown type, or an existing exchange of
            another type.
        """
        if type not in EXCHANGE_TYPES:
            raise PreconditionFailed(
                f"unknown exchange type {type!r} (expected one of {', '.join(EXCHANGE_TYPES)})"
            )
        if not name:
            raise AccessRefused("the default exchange cannot be declared")
        existing = self.exchanges.get(name)
        if existing is not None:
            if existing.type != type:
                raise PreconditionFailed(
                    f"exchange {name!r} exists with type {existing.type!r}, not {type!r}"
                )
            return existing
        exchange = EXCHANGE_CLASSES[type](name, durable, auto_delete)
        self.exchanges[name] = exchange
        return exchange

    def exchange(self, name: str) -> Exchange:
        """The exchange called C{name}. @raise NotFound: there is none."""
        try:
            return self.exchanges[name]
        except KeyError:
            raise NotFound(f"no exchange {name!r} in virtual host {self.name!r}") from None

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings."""
        if name.startswith("amq."):
            raise AccessRefused(f"exchange {name!r} is built in")
        exchange = self.exchange(name)
        for queue in self.queues.values():
            if queue.bindings:
                for b in [b for b in queue.bindings if b[0] is exchange]:
                    self.unbind(queue.name, name, b[1], b[2])
        # An auto-delete exchange is gone already once its last binding went.
        self.exchanges.pop(name, None)
        exchange.deleted = True

    # -- queues ------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: dict | None = None,
        exclusive_owner: object = None,
    ) -> Queue:
        """Create a queue, or return the existing one.

        @raise AccessRefused: the queue is exclusive to another session.
        @raise PreconditionFailed: bad arguments.
        """
        queue = self.queues.get(name)
        if queue is not None:
            if queue.exclusive_owner is not None and queue.exclusive_owner is not exclusive_owner:
                raise AccessRefused(f"queue {name!r} is exclusive to another session")
            return queue
        if not name:
            raise PreconditionFailed("a queue needs a name")
        queue = Queue(self, name, durable, exclusive_owner, auto_delete, arguments)
        self.queues[name] = queue
        return queue

    def queue(self, name: str) -> Queue:
        """The queue called C{name}. @raise NotFound: there is none."""
        try:
            return self.queues[name]
        except KeyError:
            raise NotFound(f"no queue {name!r} in virtual host {self.name!r}") from None

    def delete_queue(self, name: str) -> int:
        """Delete a queue and its bindings; return how many ready messages went with it."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return 0
        if queue.bindings:
            for exchange, key, args in list(queue.bindings):
                exchange.unbind(queue, key, args)
                self.maybe_auto_delete_exchange(exchange)
            queue.bindings = None
        count = len(queue)
        for consumer in queue.detach_all():
            consumer.cancelled()
        return count

    # -- bindings ----------------------------------------------------------

    def bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Bind C{queue} to C{exchange} with C{routing_key}.

        @raise NotFound: no such queue or exchange.
        """
        q = self.queue(queue)
        if not exchange:
            raise AccessRefused("the default exchange cannot be bound")
        ex = self.exchange(exchange)
        if ex.bind(q, routing_key, arguments):
            if q.bindings is None:
                q.bindings = []
            q.bindings.append((ex, routing_key, arguments))

    def unbind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict | None = None
    ) -> None:
        """Remove a binding (no error if it did not exist)."""
        q = self.queue(queue)
        ex = self.exchange(exchange)
        if ex.unbind(q, routing_key, arguments) and q.bindings:
            for i, b in enumerate(q.bindings):
                if b[0] is ex and b[1] == routing_key and b[2] == arguments:
                    del q.bindings[i]
                    break
            self.maybe_auto_delete_exchange(ex)

    def maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        """Delete C{exchange} if it is auto-delete and has no binding left."""
        if exchange.auto_delete and exchange.binding_count == 0:
            self.exchanges.pop(exchange.name, None)
            exchange.deleted = True

    # -- publishing ----------------------------------------------------------

    def route(self, exchange: str, routing_key: str, headers: dict | None = None) -> tuple | list:
        """The queues a publish would reach. @raise NotFound: no such exchange."""
        if not exchange:
            q = self.queues.get(routing_key)
            return (q,) if q is not None else ()
        return self.exchange(exchange).route(routing_key, headers)

    def publish(self, message: Message) -> int:
        """Route C{message} by its exchange and key; return how many queues took it.

        @raise NotFound: the exchange does not exist.
        @raise ResourceLimit: a bounded queue refused it.
        """
        queues = self.route(message.exchange, message.routing_key, message.headers)
        for q in queues:
            q.publish(message)
        return len(queues)
