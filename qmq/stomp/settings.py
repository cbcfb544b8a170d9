"""Settings of the STOMP frontend: frame limits, heart-beats, delivery defaults.

Filled from the ``[stomp]`` table of the configuration (see :mod:`qmq.config`);
the defaults here are the documented defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    @ivar topic_backlog: most messages a non-durable topic subscription holds
        for a client that does not keep up; past it the oldest are dropped
        (ActiveMQ's pending-message limit), so one stalled subscriber cannot
        grow the broker's memory without bound. 0 means unbounded.
    """

    max_body_size: int = 16 * MiB
    max_headers: int = 1000
    max_header_line: int = 8 * 1024
    max_header_block: int = 64 * 1024
    heartbeat_send_ms: int = 10_000
    heartbeat_receive_ms: int = 10_000
    heartbeat_grace: float = 1.5
    default_prefetch: int = 100
    strict_vhost: bool = False
    connect_timeout: float = 30.0
    topic_backlog: int = 10_000
