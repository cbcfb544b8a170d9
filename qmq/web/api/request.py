# -*- test-case-name: tests.test_web_api -*-
"""The HTTP request of QMQ's site: a body cap and an upload deadline.

twisted.web reads a whole request body before any resource sees it, so
limits on bodies must act while it is read. L{limited_request} makes a
C{twisted.web.server.Request} class (the site's C{requestFactory}) that:

  - answers C{413} at once, and closes, when the declared length (or the
    bytes of a chunked body so far) pass C{max_body_size}; nothing past the
    cap is kept;
  - answers C{408}, and closes, a request whose head and body are not all
    in within C{upload_timeout} seconds of its first line (a slow upload
    cannot hold a connection and its buffer for ever);
  - keeps every body in memory (twisted.web's default spills bodies over
    100 kB into a temporary file: disk work for every batched publish),
    which the cap bounds.
"""

from __future__ import annotations

import io
from typing import Any

from twisted.web.server import Request

from qmq.web.api.problem import Problem, phrase


def _raw_problem(problem: Problem) -> bytes:
    body = problem.body()
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (problem.status, phrase(problem.status).encode(), len(body), body)
    )


class LimitedRequest(Request):
    """A request with a body cap and an upload deadline (see the module docstring).

    The class attributes are set by L{limited_request}.
    """

    max_body_size = 16 * 1024 * 1024
    upload_timeout = 30.0
    clock: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._received = 0
        self._refused = False
        clock = self.clock
        if clock is None:
            from twisted.internet import reactor as clock  # noqa: PLC0415
        self._deadline: Any = clock.callLater(self.upload_timeout, self._too_slow)

    def _stop_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _refuse(self, problem: Problem) -> None:
        """Answer C{problem} before the request is complete, and close."""
        if self._refused:
            return
        self._refused = True
        self._stop_deadline()
        self.content = io.BytesIO()
        channel = self.channel
        if channel is None:
            return
        transport = channel.transport
        # Only the oldest outstanding request may write: a pipelined one
        # behind it just closes the connection.
        requests = getattr(channel, "requests", None)
        if transport is not None and (not requests or requests[0] is self):
            transport.write(_raw_problem(problem))
        channel.loseConnection()

    def _too_large(self) -> None:
        self._refuse(
            Problem(
                413,
                "body-too-large",
                f"The request body is larger than this broker accepts ({self.max_body_size} bytes; "
                "http_api.max_body_size). Send fewer or smaller messages per request.",
            )
        )

    def _too_slow(self) -> None:
        self._deadline = None
        self._refuse(
            Problem(
                408,
                "upload-timeout",
                f"The request was not received within {self.upload_timeout:g} seconds "
                "(http_api.upload_timeout).",
            )
        )

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_body_size:
            self._too_large()
            return
        self.content = io.BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self.max_body_size:
            self._too_large()
            return
        self.content.write(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        self._stop_deadline()
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Any) -> None:
        self._stop_deadline()
        super().connectionLost(reason)


def limited_request(max_body_size: int, upload_timeout: float, clock: Any = None) -> type[LimitedRequest]:
    """A L{LimitedRequest} class with these limits (a site's C{requestFactory})."""
    return type(
        "LimitedRequest",
        (LimitedRequest,),
        {"max_body_size": max_body_size, "upload_timeout": upload_timeout, "clock": clock},
    )
