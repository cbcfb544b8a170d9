"""Settings of the HTTP listener: the C{[web]} table of the configuration.

L{qmq.config} registers L{WebSettings} under C{web} in its C{SECTIONS} and
derives the table's schema from the fields (see L{qmq.stomp.settings}).
Every C{http:} listener uses the same settings; the STOMP session carried
over WebSocket keeps the C{[stomp]} table's limits and timeouts, and the
connections the C{[connections]} table's caps and deadlines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


def _origins(value: str) -> str:
    """Check an C{allowed_origins} list: whitespace- or comma-separated."""
    for origin in split_origins(value):
        if origin != "*" and "://" not in origin:
            raise ValueError(
                f"expected origins such as \"https://app.example.com\" or \"*\", got {origin!r}"
            )
    return value


def _hosts(value: str) -> str:
    """Check an C{allowed_hosts} list: whitespace- or comma-separated."""
    from qmq.web.guard import check_host_pattern, split_hosts  # noqa: PLC0415

    for entry in split_hosts(value):
        check_host_pattern(entry)
    return value


def split_origins(value: str) -> tuple[str, ...]:
    """The origin patterns of an C{allowed_origins} value, in order."""
    return tuple(part for part in value.replace(",", " ").split() if part)


@dataclass(frozen=True)
class WebSettings:
    """What an C{http:} listener serves and enforces.

    @ivar allowed_origins: the origins (scheme://host[:port], C{*} and C{?}
        wildcards allowed, whitespace- or comma-separated) whose pages may
        use the broker (open a WebSocket or a SockJS session, call the API;
        L{qmq.web.guard}), besides the broker's own origin (always allowed).
        C{"*"}: any page. A request without an C{Origin} header (not a
        browser) is not checked.
    @ivar allowed_hosts: the host names (besides the loopback names, IP
        addresses, the machine's host name and the listener's interface)
        that requests may name in their C{Host} header; C{*.example.com}:
        every name under C{example.com}; C{"*"}: any (no DNS rebinding
        protection). Whitespace- or comma-separated (L{qmq.web.guard}).
    @ivar head_timeout: seconds a request's head (its first line and
        headers) may take to arrive, from its first byte; a slower one is
        answered 408 and the connection closed.
    @ivar examples: serve the example pages at C{/examples/}.
    @ivar ping_interval: seconds between the broker's WebSocket pings on an
        idle connection; 0 = none.
    @ivar ping_timeout: seconds the client has to answer a ping with a pong
        before the connection is dropped.
    @ivar idle_timeout: seconds a kept-alive HTTP connection may stay
        without a request before it is closed.
    @ivar max_request_body: the largest HTTP request body, in bytes; a
        larger one is answered 413 and the connection closed.
    @ivar frame_type: the WebSocket message type of the frames the broker
        sends: C{"auto"} (text when the frame is valid UTF-8, else binary),
        C{"text"} or C{"binary"}.
    @ivar access_log: log a line for every HTTP request (Twisted's combined
        log format, in the broker's log). Off by default, as RabbitMQ's
        management API: a line costs about as much as answering a
        one-message publish.
    """

    allowed_origins: str = field(default="", metadata={"parse": _origins})
    allowed_hosts: str = field(default="", metadata={"parse": _hosts})
    head_timeout: float = field(default=10.0, metadata={"above": 0})
    examples: bool = False
    ping_interval: float = field(default=20.0, metadata={"min": 0})
    ping_timeout: float = field(default=10.0, metadata={"above": 0})
    idle_timeout: float = field(default=60.0, metadata={"above": 0})
    max_request_body: int = field(default=16 * MiB, metadata={"min": 1})
    frame_type: str = field(default="auto", metadata={"choices": ("auto", "text", "binary")})
    access_log: bool = False

    @property
    def hosts(self) -> tuple[str, ...]:
        """The C{allowed_hosts} entries, split."""
        from qmq.web.guard import split_hosts  # noqa: PLC0415

        return split_hosts(self.allowed_hosts)

    @property
    def origins(self) -> tuple[str, ...]:
        """The C{allowed_origins} patterns, split."""
        return split_origins(self.allowed_origins)
