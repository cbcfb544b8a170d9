"""An HTTP client for trial tests of twisted.web resources, with no sockets.

Each L{Exchange} is one connection to a L{twisted.web.server.Site} over a
L{StringTransport}: the request goes through twisted.web's real parser, the
response is read back as it grows (streams too), and the Site's timers run
on the test's L{Clock}.
"""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

_ports = itertools.count(41000)


class Exchange:
    """One request and its response, over one in-memory connection."""

    def __init__(
        self,
        site: Any,
        method: str,
        path: str,
        body: bytes | str = b"",
        headers: dict[str, str] | None = None,
        http: str = "1.1",
        identity: Any = None,
        peer_host: str = "127.0.0.1",
    ) -> None:
        addr = IPv4Address("TCP", peer_host, next(_ports))
        self.transport = StringTransport(peerAddress=addr)
        # What the HTTP listener's connection wrapper says of a TLS client.
        self.transport.identity = identity  # type: ignore[attr-defined]
        self.proto = site.buildProtocol(addr)
        self.proto.makeConnection(self.transport)
        if isinstance(body, str):
            body = body.encode()
        lines = [f"{method} {path} HTTP/{http}", "Host: 127.0.0.1"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        self.proto.dataReceived(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        self._read = 0

    # -- the response -------------------------------------------------------------

    def _split(self) -> tuple[bytes, bytes]:
        raw = self.transport.value()
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError(f"no response head yet: {raw[:200]!r}")
        return head, rest

    @property
    def status(self) -> int:
        return int(self._split()[0].split(b" ", 2)[1])

    def header(self, name: str) -> str | None:
        """The first header C{name} of the response (case-insensitive), or None."""
        for line in self._split()[0].split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None

    @property
    def body(self) -> bytes:
        """The body received so far (chunked transfer-coding undone)."""
        head, rest = self._split()
        if b"transfer-encoding: chunked" not in head.lower():
            return rest
        out = []
        while rest:
            size_line, sep, rest = rest.partition(b"\r\n")
            if not sep:
                break
            size = int(size_line, 16)
            if size == 0 or len(rest) < size + 2:
                break
            out.append(rest[:size])
            rest = rest[size + 2 :]
        return b"".join(out)

    @property
    def text(self) -> str:
        return self.body.decode()

    def read(self) -> str:
        """What arrived since the last read."""
        body = self.body
        new = body[self._read :]
        self._read = len(body)
        return new.decode()

    @property
    def finished(self) -> bool:
        """Whether the response is complete (chunked: the last chunk came)."""
        if b"\r\n\r\n" not in self.transport.value():
            return False
        head, rest = self._split()
        if b"transfer-encoding: chunked" in head.lower():
            return rest.endswith(b"0\r\n\r\n")
        length = self.header("content-length")
        if length is not None:
            return len(rest) >= int(length)
        return self.transport.disconnecting

    def abort(self) -> None:
        """The client goes away (a network error)."""
        self.proto.connectionLost(Failure(ConnectionLost("client went away")))

    def close(self) -> None:
        self.proto.connectionLost(Failure(ConnectionDone()))
