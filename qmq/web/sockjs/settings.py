"""Settings of the SockJS endpoint (the C{[sockjs]} table of the configuration).

L{qmq.config} registers L{SockJSSettings} under C{sockjs} in its C{SECTIONS};
the table's schema comes from the fields (see L{qmq.stomp.settings}).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024

#: Where the iframe page loads sockjs-client from (the iframe transports
#: only; sockjs-client 1.x uses them where CORS is not available).
DEFAULT_SOCKJS_URL = "https://cdn.jsdelivr.net/npm/sockjs-client@1/dist/sockjs.min.js"


@dataclass(frozen=True)
class SockJSSettings:
    """What the SockJS endpoint offers and enforces.

    @ivar websocket: offer the WebSocket transport (C{/info} says so).
    @ivar cookie_needed: set a C{JSESSIONID} cookie on every session request,
        for load balancers that keep a session on one node by it.
    @ivar heartbeat_delay: seconds between heart-beat frames (C{h}) on an
        otherwise silent receiving connection.
    @ivar disconnect_delay: seconds a session lives without a receiving
        connection (polls are expected closer together than this).
    @ivar response_limit: bytes after which a streaming response is ended
        (the client opens the next one), so a browser does not keep a whole
        session's data in memory.
    @ivar max_buffered_bytes: most characters of messages one session holds
        for a client that is not taking them: past it the STOMP session's
        deliveries pause; past twice this, the session is closed. Messages
        received while the broker stopped reading the client wait under the
        same bound.
    @ivar max_payload_bytes: largest body of one sending request (or
        WebSocket message).
    @ivar sockjs_url: the sockjs-client script that the iframe page loads.
    @ivar bind_to_address: a session answers only requests from the client
        address that opened it (besides the TLS client identity, always
        bound); turn it off for clients behind proxies that rotate their
        outgoing address. Requests from elsewhere are treated as naming an
        unknown session.
    @ivar test_services: serve sockjs-protocol's test services (C{echo},
        C{disabled_websocket_echo}, C{cookie_needed_echo}, C{close}) under
        C{/sockjs_test}, with a 4096-byte response limit as the protocol's
        test suite expects. Off by default.
    """

    websocket: bool = True
    cookie_needed: bool = False
    heartbeat_delay: float = 25.0
    disconnect_delay: float = 5.0
    response_limit: int = field(default=128 * 1024, metadata={"min": 1})
    max_buffered_bytes: int = field(default=MiB, metadata={"min": 1})
    max_payload_bytes: int = field(default=16 * MiB + 64 * 1024, metadata={"min": 1})
    sockjs_url: str = DEFAULT_SOCKJS_URL
    bind_to_address: bool = True
    test_services: bool = False
