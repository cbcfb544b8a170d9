"""Settings of the AMQP 0-9-1 frontend: the C{[amqp]} table.

L{qmq.config} registers L{AmqpSettings} under C{amqp} in its C{SECTIONS}
and derives the table's schema from the fields (the type annotation gives
the TOML type, the C{metadata} the allowed range), as for C{[stomp]}.
C{qmq/default.toml} repeats the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass(frozen=True)
class AmqpSettings:
    """What an C{amqp:} listener offers and enforces.

    @ivar frame_max: the largest frame the broker accepts and offers in
        C{connection.tune} (bytes, the frame's header and end octet
        included); a client may ask for less, never more. A frame over the
        negotiated size closes the connection (501 FRAME_ERROR).
    @ivar channel_max: the most channels one connection may open (offered
        in C{connection.tune}; a client may ask for fewer).
    @ivar heartbeat: the heart-beat interval the broker proposes, in
        seconds (the client's C{tune-ok} decides; 0 turns them off). A
        client silent for two intervals is disconnected.
    @ivar max_message_size: the largest message body accepted; a content
        header announcing more is refused (406 PRECONDITION_FAILED).
    @ivar connect_timeout: seconds from the TCP connection to
        C{connection.open-ok} (protocol header, login, tuning): a client
        that stalls in the handshake is disconnected.
    @ivar frame_timeout: seconds a frame, or a message's content frames,
        may take from the first byte to the last; 0 turns it off.
    @ivar max_consumers: most consumers on one channel; 0: no limit.
    @ivar max_transaction_messages: most publishes and acks held in one
        channel's open transaction; 0: no limit.
    @ivar max_transaction_bytes: most body bytes held in one channel's
        open transaction; 0: no limit.
    """

    frame_max: int = field(default=131072, metadata={"min": 4096, "max": 1 << 30})
    channel_max: int = field(default=2047, metadata={"min": 1, "max": 65535})
    heartbeat: int = field(default=60, metadata={"min": 0, "max": 65535})
    max_message_size: int = field(default=16 * MiB, metadata={"min": 1})
    connect_timeout: float = field(default=30.0, metadata={"above": 0})
    frame_timeout: float = field(default=120.0, metadata={"min": 0})
    max_consumers: int = field(default=10_000, metadata={"min": 0})
    max_transaction_messages: int = field(default=10_000, metadata={"min": 0})
    max_transaction_bytes: int = field(default=64 * MiB, metadata={"min": 0})
