"""Settings of the STOMP frontend: frame limits, heart-beats, delivery defaults.

Filled from the C{[stomp]} table of the configuration: L{qmq.config}
registers L{StompSettings} under that name in its C{SECTIONS} and derives the
table's schema from the fields: the type annotation gives the TOML type, the
field's C{metadata} the allowed range (C{{"min": 1}}: at least 1,
C{{"above": 0}}: more than 0).  The defaults here are the documented defaults
(C{qmq/default.toml} repeats them; a test sees that they agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass(frozen=True)
class StompSettings:
    """What a STOMP listener enforces and offers.

    @ivar max_body_size: largest frame body accepted, in bytes.
    @ivar max_headers: most headers in one frame.
    @ivar max_header_line: longest header line, in bytes.
    @ivar max_header_block: largest command + headers block, in bytes.
    @ivar heartbeat_send_ms: the interval at which the broker offers to send
        heart-beats (the first number of its C{heart-beat} header); 0 = never.
    @ivar heartbeat_receive_ms: the interval at which the broker asks the
        client to send heart-beats (the second number); 0 = never.
    @ivar heartbeat_grace: a client is declared dead after this many agreed
        intervals without a byte from it (at least 1.5).
    @ivar default_prefetch: credit of a C{client}/C{client-individual}
        subscription that names no prefetch header.
    @ivar strict_vhost: if true, a C{host} header that names no virtual host
        is refused; if false it maps to the default virtual host.
    @ivar connect_timeout: seconds a new connection may take to send CONNECT.
    @ivar topic_backlog: most messages the non-durable, auto-ack topic
        subscriptions of one connection hold, together, for a client that
        does not keep up; past it each subscription's oldest are dropped
        (ActiveMQ's pending-message limit), so a stalled client cannot grow
        the broker's memory without bound, however many subscriptions it
        has. 0 means unbounded.
    @ivar idle_timeout: seconds after which a client that sent nothing at
        all (not even a heart-beat) is closed, whatever heart-beats it
        negotiated; 0 turns it off.
    @ivar frame_timeout: seconds a frame may take from its first byte to its
        last; a client that leaves one unfinished longer is closed; 0 = off.
    @ivar max_subscriptions: most subscriptions one connection holds;
        0 = no limit.
    @ivar max_subscription_id: most characters in a subscription's C{id}
        (kept, and repeated in every MESSAGE, for as long as it lasts).
    @ivar max_transactions: most transactions one connection has open;
        0 = no limit.
    @ivar max_transaction_frames: most frames held in one connection's open
        transactions; 0 = no limit.
    @ivar max_transaction_bytes: most body bytes held in one connection's
        open transactions; 0 = no limit.
    """

    max_body_size: int = field(default=16 * MiB, metadata={"min": 1})
    max_headers: int = field(default=1000, metadata={"min": 1})
    max_header_line: int = field(default=8 * 1024, metadata={"min": 1})
    max_header_block: int = field(default=64 * 1024, metadata={"min": 1})
    heartbeat_send_ms: int = field(default=10_000, metadata={"min": 0})
    heartbeat_receive_ms: int = field(default=10_000, metadata={"min": 0})
    heartbeat_grace: float = field(default=1.5, metadata={"min": 1.5})
    default_prefetch: int = field(default=100, metadata={"min": 1})
    strict_vhost: bool = False
    connect_timeout: float = field(default=30.0, metadata={"above": 0})
    topic_backlog: int = field(default=10_000, metadata={"min": 0})
    idle_timeout: float = field(default=600.0, metadata={"min": 0})
    frame_timeout: float = field(default=120.0, metadata={"min": 0})
    max_subscriptions: int = field(default=10_000, metadata={"min": 0})
    max_subscription_id: int = field(default=255, metadata={"min": 1})
    max_transactions: int = field(default=100, metadata={"min": 0})
    max_transaction_frames: int = field(default=10_000, metadata={"min": 0})
    max_transaction_bytes: int = field(default=64 * MiB, metadata={"min": 0})
