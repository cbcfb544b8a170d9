"""The message as the core sees it.

One L{Message} object is shared by every queue a publish is routed to; a
queue that redelivers a message keeps a shallow copy with its own delivery
count (L{Message.redelivery}), so a redelivery in one queue never marks the
copies in the others.
"""

from __future__ import annotations

#: The header in which a delayed message keeps its delivery time (epoch
#: milliseconds), so that every store keeps it with the headers; a frontend
#: that sets L{Message.deliver_at} writes it (L{Message.restore_options}
#: reads it back).
DELIVER_AT_HEADER = "deliver-at"
#: The header in which a message keeps its own ack timeout (seconds, as a
#: decimal number: ocamlmq's header).
ACK_TIMEOUT_HEADER = "ack-timeout"


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
    @ivar headers: application headers (C{str} to C{str}), or C{None} if none.
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
        restart in the header L{DELIVER_AT_HEADER}.
    @ivar ack_timeout: seconds a consumer may hold it unacked before it is
        taken back and redelivered; C{0.0} means the queue's rule. Kept
        across a restart in the header L{ACK_TIMEOUT_HEADER}.
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

    def redelivery(self) -> Message:
        """Return a copy of this message with its delivery count raised by one."""
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
        m.delivery_count = self.delivery_count + 1
        m.cache = self.cache
        return m

    def offloaded(self, body: OnDisk) -> Message:
        """A copy whose body (and headers, and the frontend's cache of them)
        are left to the store: C{body} says where they are. (Its delivery
        time and ack timeout, read from headers, stay.)"""
        m = Message.__new__(Message)
        m.id = self.id
        m.exchange = self.exchange
        m.routing_key = self.routing_key
        m.headers = None
        m.body = body
        m.timestamp = self.timestamp
        m.persistent = self.persistent
        m.priority = self.priority
        m.expires = self.expires
        m.deliver_at = self.deliver_at
        m.ack_timeout = self.ack_timeout
        m.delivery_count = self.delivery_count
        m.cache = None
        return m

    def restore_options(self) -> None:
        """Set L{deliver_at} and L{ack_timeout} from the headers that keep
        them (L{DELIVER_AT_HEADER}, L{ACK_TIMEOUT_HEADER}): for a message a
        store recovered. Values that do not read as numbers are ignored."""
        headers = self.headers
        if not headers:
            return
        value = headers.get(DELIVER_AT_HEADER)
        if value is not None and value.isascii() and value.isdigit() and len(value) <= 19:
            self.deliver_at = int(value) / 1000.0
        value = headers.get(ACK_TIMEOUT_HEADER)
        if value is not None and len(value) <= 19:
            try:
                seconds = float(value)
            except ValueError:
                return
            if 0 < seconds < 2**31:
                self.ack_timeout = seconds

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id} exchange={self.exchange!r} "
            f"routing_key={self.routing_key!r} {len(self.body)} bytes>"
        )
