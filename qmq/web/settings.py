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


def split_origins(value: str) -> tuple[str, ...]:
    """The origin patterns of an C{allowed_origins} value, in order."""
    return tuple(part for part in value.replace(",", " ").split() if part)


@dataclass(frozen=True)
class WebSettings:
    """What an C{http:} listener serves and enforces.

    @ivar allowed_origins: the origins (scheme://host[:port], C{*} and C{?}
        wildcards allowed, whitespace- or comma-separated) whose pages may
        open a WebSocket to the broker, besides the broker's own origin
        (always allowed). C{"*"}: any page. A request without an C{Origin}
        header (not a browser) is not checked.
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
    examples: bool = False
    ping_interval: float = field(default=20.0, metadata={"min": 0})
    ping_timeout: float = field(default=10.0, metadata={"above": 0})
    idle_timeout: float = field(default=60.0, metadata={"above": 0})
    max_request_body: int = field(default=16 * MiB, metadata={"min": 1})
    frame_type: str = field(default="auto", metadata={"choices": ("auto", "text", "binary")})
    access_log: bool = False

    @property
    def origins(self) -> tuple[str, ...]:
        """The C{allowed_origins} patterns, split."""
        return split_origins(self.allowed_origins)
