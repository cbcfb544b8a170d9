"""The message as the core sees it: one model for every protocol.

A message is AMQP 0-9-1's: I{properties} that the broker and the protocols
understand, I{application headers} that only the applications do, and the
body. Every frontend maps its wire form to this model when a message comes
in and back when it goes out (docs/architecture.rst has the table): nothing
of a protocol's own spelling is kept in a message, nor on disk.

Properties:

    content_type, content_encoding, correlation_id, reply_to, message_id,
    user_id, app_id, type
                    text, in L{Message.properties} (a dict of the ones
                    set, or None: most messages have none); their names are
                    L{PROPERTY_NAMES}
    timestamp       L{Message.timestamp}: when the broker took it
    priority        L{Message.priority}
    expiration      L{Message.expires}: when it expires (a time, not a span)
    delivery mode   L{Message.persistent}

Application headers (L{Message.headers}) are a dict of names to typed
values: C{str}, C{int}, C{float}, C{bool}, C{bytes} or C{None}
(L{HEADER_TYPES}); a protocol that carries only text (STOMP) writes them as
text. The core's own delivery options (when it is first delivered, how long
a consumer may hold it: L{Message.deliver_at}, L{Message.ack_timeout}) are
fields too, kept by every store.

One L{Message} object is shared by every queue a publish is routed to; a
queue that redelivers a message keeps a shallow copy with its own delivery
count (L{Message.redelivery}), so a redelivery in one queue never marks the
copies in the others. Nothing changes a message's properties or headers
dicts in place once it is published (frontends and stores share them
between messages).
"""

from __future__ import annotations

from typing import Any

from qmq.core.errors import AccessRefused

#: The text properties, in the order the commit log numbers them (never
#: reorder: the index is on disk).
PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "user_id",
    "app_id",
    "type",
)
#: The types an application header's value may have.
HEADER_TYPES = (str, int, float, bool, bytes, type(None))


def check_user_id(properties: dict[str, str] | None, user: Any) -> None:
    """Refuse a C{user_id} property that is not the publisher's own user
    (RabbitMQ's rule: a receiver may trust it), for every frontend.

    @param user: the authenticated user (anything with C{name}), or None
        when authentication is off (then any user id goes).
    @raise AccessRefused: it names another user.
    """
    if properties is None or user is None:
        return
    claimed = properties.get("user_id")
    if claimed is not None and claimed != user.name:
        raise AccessRefused(
            f"the user_id property {claimed[:64]!r} is not the publisher's user {user.name!r}",
            "user-id refused",
        )



class OnDisk(int):
    """The body of a message a store keeps on disk while it waits in a long
    backlog (see L{qmq.core.queue.Queue.offload}): an opaque number the
    store made (where the message is), whose C{len()} is the body's length,
    so a queue's byte counts stay right. A queue asks its store to load the
    body back (L{qmq.core.store.MessageStore.load}) before anything reads it.

    The low 31 bits are the body's length; the store owns the rest.
    """

    __slots__ = ()

    def __len__(self) -> int:
        return self & 0x7FFFFFFF


class Message:
    """A published message.

    @ivar id: broker-wide increasing integer; orders messages within a queue.
    @ivar exchange: name of the exchange it was published to (C{""} is the
        default exchange).
    @ivar routing_key: the routing key it was published with.
    @ivar headers: application headers (C{str} to a value of
        L{HEADER_TYPES}), or C{None} if none.
    @ivar properties: the text properties that are set (L{PROPERTY_NAMES}
        to C{str}), or C{None} if none.
    @ivar body: the payload.
    @ivar timestamp: seconds since the epoch, from the broker's clock.
    @ivar persistent: whether the publisher asked for the message to survive
        a restart (meaningful on durable queues).
    @ivar priority: 0 (the default, lowest) to 9; higher is delivered first
        where a queue honours priorities.
    @ivar expires: when the message expires, seconds since the epoch; C{0.0}
        means never.
    @ivar deliver_at: when the message may first be delivered, seconds since
        the epoch; C{0.0} means at once (delayed delivery). Kept across a
        restart by every store.
    @ivar ack_timeout: seconds a consumer may hold it unacked before it is
        taken back and redelivered; C{0.0} means the queue's rule. Kept
        across a restart by every store.
    @ivar delivery_count: how many times this copy was delivered and given
        back; 0 for a first delivery.
    @ivar cache: a frontend's pre-encoded form of the headers (the STOMP
        frontend keeps its header block here); opaque to the core.
    """

    __slots__ = (
        "id",
        "exchange",
        "routing_key",
        "headers",
        "body",
        "timestamp",
        "persistent",
        "priority",
        "expires",
        "deliver_at",
        "ack_timeout",
        "delivery_count",
        "cache",
        "properties",
    )

    def __init__(
        self,
        id: int,
        exchange: str,
        routing_key: str,
        headers: dict[str, str] | None,
        body: bytes,
        timestamp: float = 0.0,
        persistent: bool = False,
        priority: int = 0,
        expires: float = 0.0,
    ) -> None:
        self.id = id
        self.exchange = exchange
        self.routing_key = routing_key
        self.headers = headers
        self.body = body
        self.timestamp = timestamp
        self.persistent = persistent
        self.priority = priority
        self.expires = expires
        self.deliver_at = 0.0
        self.ack_timeout = 0.0
        self.delivery_count = 0
        self.cache = None
        self.properties: dict[str, str] | None = None

    def _copy(self) -> Message:
        """A copy of every field (the body and dicts shared)."""
        m = Message.__new__(Message)
        m.id = self.id
        m.exchange = self.exchange
        m.routing_key = self.routing_key
        m.headers = self.headers
        m.body = self.body
        m.timestamp = self.timestamp
        m.persistent = self.persistent
        m.priority = self.priority
        m.expires = self.expires
        m.deliver_at = self.deliver_at
        m.ack_timeout = self.ack_timeout
        m.delivery_count = self.delivery_count
        m.cache = self.cache
        m.properties = self.properties
        return m

    def redelivery(self) -> Message:
        """Return a copy of this message with its delivery count raised by one."""
        m = self._copy()
        m.delivery_count += 1
        return m

    def offloaded(self, body: OnDisk) -> Message:
        """A copy whose body (and headers, and the frontend's cache of them)
        are left to the store: C{body} says where they are. (Its properties,
        delivery time and ack timeout stay.)"""
        m = self._copy()
        m.headers = None
        m.body = body
        m.cache = None
        return m

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id} exchange={self.exchange!r} "
            f"routing_key={self.routing_key!r} {len(self.body)} bytes>"
        )
