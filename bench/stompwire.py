"""Minimal, fast STOMP client plumbing for the load generator.

Nothing here parses frame by frame in Python when it can be avoided: a
consumer that only needs a count counts NUL bytes in whole buffers
(``bytes.count`` runs in C), and a consumer that must ACK pulls the ack ids
out of all complete frames of a buffer with one regular expression. This
works because the scenarios control the bodies (printable, no NUL), so a NUL
byte ends a frame and ``\\nack:`` can only be a header.

Two client flavours share the frame helpers:

* :class:`StompProtocol`, an ``asyncio.Protocol`` (uvloop when installed)
  whose ``data_received`` hook is swapped per scenario; writes are batched.
* :func:`sync_connect`, a blocking socket for the latency ping-pong.

:class:`WebSocketStompProtocol` carries the same STOMP bytes over a WebSocket
(``open_connection(..., ws_path="/ws")``): it upgrades the connection, sends
each STOMP frame as one masked text message (as browser clients do; or
``ws_batch`` frames per message), and hands the handlers the payloads of the
server's messages as one STOMP byte stream, so every scenario runs unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import ssl
import struct
import time
from collections.abc import Callable

from profiles import Profile

NUL = b"\0"
_HDR_ESC = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"})
ACK_ID_RE = re.compile(rb"\nack:([^\n]*)")
MSG_ID_RE = re.compile(rb"\nmessage-id:([^\n]*)")
ERROR_MARK = b"ERROR\n"


class StompError(Exception):
    """The broker sent an ERROR frame, closed the connection, or timed out."""


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """Encode one STOMP frame (header values escaped the STOMP 1.2 way)."""
    lines = [command]
    for k, v in (headers or {}).items():
        lines.append(f"{k}:{str(v).translate(_HDR_ESC)}")
    return ("\n".join(lines) + "\n\n").encode() + body + NUL


def connect_frame(p: Profile, heart_beat: str = "0,0") -> bytes:
    """Return the CONNECT frame for profile ``p``."""
    h = {"accept-version": p.version, "host": p.vhost, "heart-beat": heart_beat}
    if p.login is not None:
        h["login"] = p.login
    if p.passcode is not None:
        h["passcode"] = p.passcode
    return frame("CONNECT", h)


#: Headers added to every SUBSCRIBE and SEND the scenarios make (run.py's
#: --subscribe-header and --send-header: queue arguments, priorities, TTLs).
#: Set in the parent before the workers fork.
EXTRA_HEADERS: dict[str, dict[str, str]] = {"SUBSCRIBE": {}, "SEND": {}}


def subscribe_frame(
    p: Profile,
    dest: str,
    sub_id: str,
    ack: str = "auto",
    prefetch: int | None = None,
    receipt: str | None = None,
) -> bytes:
    """Return a SUBSCRIBE frame, with the profile's prefetch header(s)."""
    h = {"destination": dest, "id": sub_id, "ack": ack}
    if prefetch is not None:
        for name in p.prefetch_headers:
            h[name] = str(prefetch)
    if receipt is not None:
        h["receipt"] = receipt
    h.update(EXTRA_HEADERS["SUBSCRIBE"])
    return frame("SUBSCRIBE", h)


def send_frame(dest: str, body: bytes, receipt: str | None = None) -> bytes:
    """Return a non-persistent SEND frame with content-length."""
    h = {"destination": dest, "content-length": str(len(body))}
    if receipt is not None:
        h["receipt"] = receipt
    h.update(EXTRA_HEADERS["SEND"])
    return frame("SEND", h, body)


def parse_frame(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """Parse one complete frame (without its NUL); leading EOLs are skipped."""
    raw = raw.lstrip(b"\r\n")
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode("utf-8", "replace").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.rstrip("\r").partition(":")
        headers.setdefault(k, v)
    return lines[0].strip(), headers, body


def error_text(buf: bytes) -> str:
    """Describe the first ERROR frame found in ``buf``."""
    i = buf.find(ERROR_MARK)
    end = buf.find(NUL, i)
    cmd, headers, body = parse_frame(buf[i : end if end >= 0 else len(buf)])
    msg = headers.get("message", "")
    return f"ERROR frame: {msg} {body[:200].decode('utf-8', 'replace').strip()}".strip()


def client_ssl_context() -> ssl.SSLContext:
    """Return a TLS client context that does not verify the server."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class StompProtocol(asyncio.Protocol):
    """A STOMP connection whose data handler is a swappable callable.

    After :meth:`handshake`, set :attr:`on_data` to a function taking the raw
    bytes of each read. Errors and disconnects set :attr:`failure` and the
    :attr:`closed` future, which the scenarios watch.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.on_data: Callable[[bytes], None] = self._collect
        self.failure: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_rx = time.monotonic()

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Remember the transport."""
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Hand the bytes to the current handler."""
        self.on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """Record the disconnect."""
        if self.failure is None:
            self.failure = f"connection lost: {exc or 'closed by broker'}"
        self._wake()
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        """The transport buffer is full."""
        self._can_write.clear()

    def resume_writing(self) -> None:
        """The transport buffer drained."""
        self._can_write.set()

    # -- helpers
    def fail(self, reason: str) -> None:
        """Record a failure and wake any waiter."""
        if self.failure is None:
            self.failure = reason
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _collect(self, data: bytes) -> None:
        self.buf += data
        self.last_rx = time.monotonic()
        if NUL in data:
            self._wake()

    async def drain(self) -> None:
        """Wait until the transport accepts more data."""
        if not self._can_write.is_set():
            await self._can_write.wait()
        if self.failure:
            raise StompError(self.failure)

    def write(self, data: bytes) -> None:
        """Write bytes (no-op once the connection failed)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def read_frame(self, timeout: float) -> tuple[str, dict[str, str], bytes]:
        """Return the next whole frame collected by the default handler."""
        deadline = time.monotonic() + timeout
        while True:
            stripped = self.buf.lstrip(b"\r\n")
            i = stripped.find(NUL)
            if i >= 0:
                self.buf = stripped[i + 1 :]
                f = parse_frame(stripped[:i])
                if f[0] == "ERROR":
                    self.fail(error_text(stripped[: i + 1]))
                    raise StompError(self.failure or "ERROR")
                return f
            if self.failure:
                raise StompError(self.failure)
            left = deadline - time.monotonic()
            if left <= 0:
                raise StompError(f"timeout after {timeout:.0f}s waiting for a frame")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, left)
            except TimeoutError:
                pass
            finally:
                self._waiter = None

    async def request(self, data: bytes, expect: str, timeout: float) -> dict[str, str]:
        """Write ``data`` and wait for a frame whose command is ``expect``."""
        self.write(data)
        cmd, headers, _ = await self.read_frame(timeout)
        if cmd != expect:
            raise StompError(f"expected {expect}, got {cmd} {headers}")
        return headers

    def close(self) -> None:
        """Close the transport (without DISCONNECT: the benchmark is over)."""
        if self.transport is not None:
            self.transport.close()


def _mask(data: bytes, key: bytes) -> bytes:
    """XOR ``data`` with the 4-byte ``key`` repeated (one big-int XOR, in C)."""
    n = len(data)
    if not n:
        return data
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")


class WebSocketStompProtocol(StompProtocol):
    """:class:`StompProtocol` over a WebSocket (RFC 6455, client side).

    :meth:`upgraded` resolves once the server answered 101; until then
    nothing else is written. Writes are STOMP bytes: split at NULs into
    frames, each sent as one masked text message (``ws_batch`` > 1 puts that
    many frames in a message). Reads: the server's message payloads, joined,
    go to ``on_data``; a ping is answered, a close fails the connection.
    """

    def __init__(self, host: str, path: str, ws_batch: int = 1) -> None:
        super().__init__()
        self.host = host
        self.path = path
        self.ws_batch = ws_batch
        self.key = os.urandom(4)
        self._head = b""
        self._in = bytearray()
        self._upgrade: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._partial = b""  # the unfinished STOMP frame of the last write
        self._last = (b"", b"")  # the last text message: payload, masked frame

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the upgrade request."""
        super().connection_made(transport)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: v12.stomp, v11.stomp, v10.stomp\r\n\r\n"
        )
        transport.write(request.encode())  # type: ignore[attr-defined]

    async def upgraded(self, timeout: float) -> None:
        """Wait for the 101 answer."""
        await asyncio.wait_for(asyncio.shield(self._upgrade), timeout)

    def data_received(self, data: bytes) -> None:
        """Upgrade answer first, then WebSocket frames."""
        if not self._upgrade.done():
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self._head.split(b"\r\n", 1)[0]
            rest = self._head[end + 4 :]
            if b" 101 " not in status + b" ":
                self.fail(f"WebSocket upgrade refused: {status.decode('latin-1')}")
                self._upgrade.set_exception(StompError(self.failure or "upgrade refused"))
                return
            self._upgrade.set_result(None)
            if not rest:
                return
            data = rest
        buf = self._in
        buf += data
        spans = []
        i = 0
        n = len(buf)
        while n - i >= 2:
            b0 = buf[i]
            length = buf[i + 1] & 0x7F
            j = i + 2
            if length == 126:
                if n - j < 2:
                    break
                length = (buf[j] << 8) | buf[j + 1]
                j += 2
            elif length == 127:
                if n - j < 8:
                    break
                length = int.from_bytes(buf[j : j + 8], "big")
                j += 8
            if n - j < length:
                break
            i = j + length
            opcode = b0 & 0x0F
            if opcode <= 2:
                spans.append((j, i))
            else:
                payload = bytes(buf[j:i])
                if opcode == 8:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                    self.fail(f"WebSocket closed by the broker: {code} "
                              f"{payload[2:].decode('utf-8', 'replace')}")
                elif opcode == 9:
                    self._send_ws(payload, 0xA)
        stream = b""
        if spans:
            with memoryview(buf) as view:
                stream = b"".join([view[a:b] for a, b in spans])
        del buf[:i]
        if stream:
            super().data_received(stream)

    def _send_ws(self, payload: bytes, opcode: int = 0x1) -> bytes:
        if opcode == 0x1 and payload == self._last[0]:
            # A producer repeats one frame: mask it once (one key per
            # connection; the server cannot tell, and its work is the same).
            return self._last[1]
        n = len(payload)
        if n < 126:
            head = bytes((0x80 | opcode, 0x80 | n))
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        key = self.key
        frame = head + key + _mask(payload, key)
        if opcode != 0x1:
            super().write(frame)
        else:
            self._last = (payload, frame)
        return frame

    def write(self, data: bytes) -> None:
        """Write STOMP bytes: one masked message per frame (or per ``ws_batch``)."""
        data = self._partial + data
        cut = data.rfind(NUL) + 1
        self._partial = data[cut:]
        if not cut:
            return
        frames = data[:cut].split(NUL)[:-1]
        step = self.ws_batch
        out = []
        for k in range(0, len(frames), step):
            group = frames[k : k + step]
            out.append(self._send_ws(NUL.join(group) + NUL))
        super().write(b"".join(out))


async def open_connection(
    host: str,
    port: int,
    p: Profile,
    tls: bool = False,
    heart_beat: str = "0,0",
    timeout: float = 15.0,
    ws_path: str | None = None,
    ws_batch: int = 1,
) -> tuple[StompProtocol, dict[str, str]]:
    """Connect, send CONNECT and wait for CONNECTED; return protocol and headers.

    With ``ws_path``, over a WebSocket to that path (:class:`WebSocketStompProtocol`).
    """
    loop = asyncio.get_running_loop()
    ctx = client_ssl_context() if tls else None

    def factory() -> StompProtocol:
        if ws_path is None:
            return StompProtocol()
        return WebSocketStompProtocol(f"{host}:{port}", ws_path, ws_batch)

    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(factory, host, port, ssl=ctx), timeout
        )
    except TimeoutError as e:
        raise StompError(f"TCP connect timeout after {timeout:.0f}s") from e
    except OSError as e:
        raise StompError(f"TCP connect failed: {e}") from e
    sock = proto.transport.get_extra_info("socket") if proto.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if isinstance(proto, WebSocketStompProtocol):
            await proto.upgraded(timeout)
        headers = await proto.request(connect_frame(p, heart_beat), "CONNECTED", timeout)
    except StompError:
        proto.close()
        raise
    return proto, headers


def install_uvloop() -> str:
    """Use uvloop's event loop policy when available; return the loop name."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the bench extra
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


# ---------------------------------------------------------------- blocking client
class SyncConn:
    """A blocking STOMP connection (used by the latency ping-pong)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def read_frame(self, deadline: float) -> tuple[str, dict[str, str], bytes]:
        """Return the next frame; raise :class:`StompError` on error or timeout."""
        while True:
            stripped = self.buf.lstrip(b"\r\n")
            i = stripped.find(NUL)
            if i >= 0:
                self.buf = stripped[i + 1 :]
                f = parse_frame(stripped[:i])
                if f[0] == "ERROR":
                    raise StompError(error_text(stripped[: i + 1]))
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise StompError("timeout waiting for a frame")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError as e:
                raise StompError("timeout waiting for a frame") from e
            if not data:
                raise StompError("connection lost: closed by broker")
            self.buf += data

    def request(self, data: bytes, expect: str, timeout: float) -> dict[str, str]:
        """Send ``data`` and wait for an ``expect`` frame."""
        self.sock.sendall(data)
        cmd, headers, _ = self.read_frame(time.monotonic() + timeout)
        if cmd != expect:
            raise StompError(f"expected {expect}, got {cmd} {headers}")
        return headers


def sync_connect(
    host: str, port: int, p: Profile, tls: bool = False, timeout: float = 15.0
) -> SyncConn:
    """Open a blocking STOMP connection (CONNECT/CONNECTED done)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise StompError(f"TCP connect failed: {e}") from e
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        sock = client_ssl_context().wrap_socket(sock, server_hostname=host)
    conn = SyncConn(sock)
    conn.request(connect_frame(p), "CONNECTED", timeout)
    return conn
