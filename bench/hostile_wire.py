"""Raw connections for the hostile-client runner (``bench/hostile.py``).

Attack clients need more control than a STOMP client library gives: send
half a frame, stop in the middle of a TLS handshake, keep hundreds of
sockets and notice exactly when the *broker* closes each one. So every
connection here is a plain non-blocking socket; TLS, when wanted, runs in
an ``ssl.SSLObject`` over memory BIOs, which lets a client send any prefix
of its handshake and tells a TCP FIN apart from a TLS ``close_notify``.

"Closed by the broker" means what PITFALLS.md says it must mean: the client
side reads end-of-stream (``recv() == b''``), gets a reset, or sees the TLS
close_notify. A log line proves nothing.

Everything takes an absolute ``time.monotonic()`` deadline; nothing blocks
past it. Only ``127.0.0.1``-style addresses are ever used by the runner.
"""

from __future__ import annotations

import errno
import re
import selectors
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path

NUL = b"\0"
_HDR_ESC = {"1.2": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"}),
            "1.1": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})}
ACK_RE = re.compile(rb"\nack:([^\n]*)")
MSGID_RE = re.compile(rb"\nmessage-id:([^\n]*)")


class WireError(Exception):
    """Timeout, refusal or an unexpected close on an attack connection."""


def frame(command: str, headers: Iterable[tuple[str, str]] | dict[str, str] = (), body: bytes = b"",
          version: str = "1.2") -> bytes:
    """Encode a frame; header values are escaped the way ``version`` does (1.0: not at all)."""
    items = headers.items() if isinstance(headers, dict) else headers
    table = _HDR_ESC.get(version)
    lines = [command]
    for k, v in items:
        v = str(v)
        if table is not None and command not in ("CONNECT", "STOMP"):
            k, v = k.translate(table), v.translate(table)
        lines.append(f"{k}:{v}")
    return ("\n".join(lines) + "\n\n").encode() + body + NUL


def connect_frame(version: str = "1.2", heart_beat: str | None = "0,0", host: str = "/",
                  extra: Iterable[tuple[str, str]] = ()) -> bytes:
    """A CONNECT frame (a 1.0 CONNECT names no accept-version)."""
    h: list[tuple[str, str]] = []
    if version != "1.0":
        h.append(("accept-version", version))
        h.append(("host", host))
        if heart_beat is not None:
            h.append(("heart-beat", heart_beat))
    h.extend(extra)
    return frame("CONNECT", h)


# ----------------------------------------------------------------- frame parsing
def parse_frames(buf: bytes | bytearray, limit: int = 0) -> tuple[list[tuple[str, dict[str, str], bytes]], int]:
    """Parse complete frames the way the STOMP spec reads them.

    The header block ends at the first blank line; the body is exactly
    ``content-length`` bytes when the header is there, else it runs to the
    first NUL. Header values are returned raw (not unescaped), first
    occurrence wins. Returns ``(frames, bytes consumed)``; at most ``limit``
    frames when it is not 0.
    """
    frames = []
    pos = 0
    n = len(buf)
    while pos < n:
        while pos < n and buf[pos] in (10, 13):  # heart-beats
            pos += 1
        if pos >= n:
            break
        end = buf.find(b"\n\n", pos)
        end_crlf = buf.find(b"\n\r\n", pos)
        if end < 0 and end_crlf < 0:
            break
        if end < 0 or (0 <= end_crlf < end):
            end, skip = end_crlf, 3
        else:
            skip = 2
        head = bytes(buf[pos:end]).decode("utf-8", "replace").replace("\r\n", "\n")
        lines = head.split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(k, v)
        start = end + skip
        length = headers.get("content-length", "")
        if length.isdigit():
            stop = start + int(length)
            if stop >= n:
                break
        else:
            stop = buf.find(NUL, start)
            if stop < 0:
                break
        frames.append((lines[0], headers, bytes(buf[start:stop])))
        pos = stop + 1
        if limit and len(frames) >= limit:
            break
    return frames, pos


def nul_split_frames(buf: bytes) -> list[tuple[str, bytes]]:
    """Read the stream the naive way many small clients do: split on every NUL.

    Returns ``(command, whole frame bytes)`` per piece. A broker that lets a
    NUL through inside a header makes such a client see frames the broker
    never sent.
    """
    out = []
    for piece in buf.split(NUL)[:-1]:
        piece = piece.lstrip(b"\r\n")
        if not piece:
            continue
        out.append((piece.split(b"\n", 1)[0].decode("utf-8", "replace"), piece))
    return out


# ----------------------------------------------------------------- TLS material
def make_cert(directory: Path) -> tuple[Path, Path]:
    """Write a throw-away self-signed key and certificate for 127.0.0.1 into ``directory``.

    Uses trustme when installed, else ``openssl req``. The files live in a
    temporary directory of the run; they are never committed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "hostile-key.pem", directory / "hostile-cert.pem"
    try:
        import trustme

        ca = trustme.CA()
        leaf = ca.issue_cert("localhost", "127.0.0.1")
        leaf.private_key_pem.write_to_path(str(key))
        leaf.cert_chain_pems[0].write_to_path(str(cert))
    except ImportError:  # pragma: no cover - trustme is in the venv
        import subprocess

        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
    return key, cert


def client_context() -> ssl.SSLContext:
    """A TLS client context that does not verify the (self-signed) server."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_hello(ctx: ssl.SSLContext) -> bytes:
    """The bytes of a real ClientHello (for attacks that send only part of one)."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_side=False, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


# ----------------------------------------------------------------- connections
class Conn:
    """One non-blocking client connection, optionally TLS over memory BIOs.

    :attr:`buf` collects the application bytes received; :attr:`eof` is set
    (with :attr:`eof_at`) once the broker closed the TCP connection or sent
    a TLS close_notify (:attr:`tls_eof`).
    """

    def __init__(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.received = 0
        self.eof = False
        self.eof_at: float | None = None
        self.tls_eof = False
        self.reset = False
        self.opened_at = time.monotonic()
        self.obj: ssl.SSLObject | None = None
        self.tag = ""
        if tls is not None:
            self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.obj = tls.wrap_bio(self._in, self._out, server_side=False, server_hostname="localhost")

    # -- opening
    @classmethod
    def open(cls, host: str, port: int, deadline: float, tls: ssl.SSLContext | None = None,
             source: str | None = None, handshake: bool = True, rcvbuf: int | None = None) -> Conn:
        """Connect (and finish the TLS handshake unless ``handshake`` is False).

        ``rcvbuf`` shrinks the socket's receive buffer before connecting, so
        a client that stops reading makes the broker's writes back up at once.
        """
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireError("deadline passed before connect")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            if source:
                sock.bind((source, 0))
            sock.settimeout(left)
            sock.connect((host, port))
        except OSError as e:
            sock.close()
            raise WireError(f"connect failed: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        c = cls(sock, tls)
        if tls is not None and handshake:
            c.handshake(deadline)
        return c

    def fileno(self) -> int:
        return self.sock.fileno()

    def handshake(self, deadline: float) -> None:
        """Finish the TLS handshake before ``deadline``."""
        assert self.obj is not None
        while True:
            try:
                self.obj.do_handshake()
                self._flush(deadline)
                return
            except ssl.SSLWantReadError:
                self._flush(deadline)
                if self.eof:
                    raise WireError("closed during the TLS handshake") from None
                self._wait_readable(deadline)
                self._pull()
            except ssl.SSLError as e:
                raise WireError(f"TLS handshake failed: {e}") from e

    # -- writing
    def send(self, data: bytes, deadline: float) -> None:
        """Write everything (through TLS if any) before ``deadline``."""
        if self.obj is not None:
            if data:
                self.obj.write(data)
            self._flush(deadline)
        else:
            self._sendall(data, deadline)

    def send_raw(self, data: bytes, deadline: float) -> None:
        """Write bytes on the TCP socket itself (below TLS)."""
        self._sendall(data, deadline)

    def try_send(self, data: bytes) -> int:
        """Write what the kernel takes now (no TLS); return the byte count."""
        try:
            return self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self._mark_eof(reset=True)
            return 0

    def _flush(self, deadline: float) -> None:
        data = self._out.read()
        if data:
            self._sendall(data, deadline)

    def _sendall(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
                view = view[sent:]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as e:
                self._mark_eof(reset=True)
                raise WireError(f"send failed: {e}") from e
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"send timeout ({len(view)} bytes left)")
            sel = selectors.DefaultSelector()
            try:
                sel.register(self.sock, selectors.EVENT_WRITE | selectors.EVENT_READ)
                for _key, ev in sel.select(min(left, 0.5)):
                    if ev & selectors.EVENT_READ:
                        self._pull()  # keep draining so the peer is not stuck on us
            finally:
                sel.close()

    # -- reading
    def _wait_readable(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireError("timeout")
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            if not sel.select(left):
                raise WireError("timeout")
        finally:
            sel.close()

    def _mark_eof(self, reset: bool = False) -> None:
        if not self.eof:
            self.eof = True
            self.eof_at = time.monotonic()
            self.reset = reset

    def _pull(self, limit: int = 1 << 22) -> int:
        """Read what the socket has now (up to ``limit`` bytes); return app bytes gained."""
        gained = 0
        got = 0
        while got < limit and not self.eof:
            try:
                data = self.sock.recv(262144)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionResetError:
                self._mark_eof(reset=True)
                break
            except OSError:
                self._mark_eof(reset=True)
                break
            if not data:
                self._mark_eof()
                break
            got += len(data)
            if self.obj is None:
                self.buf += data
                gained += len(data)
            else:
                self._in.write(data)
        if self.obj is not None:
            if self.eof:
                self._in.write_eof()
            while True:
                try:
                    data = self.obj.read(262144)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                except ssl.SSLZeroReturnError:
                    self.tls_eof = True
                    self._mark_eof()
                    break
                except ssl.SSLError:
                    self._mark_eof()
                    break
                if not data:
                    break
                self.buf += data
                gained += len(data)
        self.received += gained
        return gained

    def pump(self) -> int:
        """Non-blocking read of whatever arrived; return the app bytes gained."""
        return self._pull()

    def wait_for(self, pred: Callable[[Conn], bool], deadline: float) -> bool:
        """Read until ``pred(self)`` is true, EOF, or ``deadline``; return ``pred(self)``."""
        while True:
            if pred(self):
                return True
            if self.eof:
                return pred(self)
            try:
                self._wait_readable(deadline)
            except WireError:
                return pred(self)
            self._pull()

    def read_frame(self, deadline: float) -> tuple[str, dict[str, str], bytes]:
        """Return the next frame (spec parse); raise :class:`WireError` on timeout or EOF."""
        while True:
            got = first_frame(self.buf)
            if got is not None:
                one, used = got
                del self.buf[:used]
                return one
            if self.eof:
                raise WireError("connection closed by the broker")
            self._wait_readable(deadline)
            self._pull()

    def expect(self, command: str, deadline: float) -> dict[str, str]:
        """Read the next frame, which must be ``command`` (else raise, with the ERROR text)."""
        cmd, h, body = self.read_frame(deadline)
        if cmd != command:
            raise WireError(f"expected {command}, got {cmd} {h.get('message', '')} "
                            f"{body[:120].decode('utf-8', 'replace')}".strip())
        return h

    def stomp_connect(self, deadline: float, version: str = "1.2", heart_beat: str | None = "0,0",
                      extra: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
        """Send CONNECT and wait for CONNECTED."""
        self.send(connect_frame(version, heart_beat, extra=extra), deadline)
        return self.expect("CONNECTED", deadline)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close with a reset (SO_LINGER 0): the broker's kernel drops what it
        has not read yet, so a broker still busy with our frames stops."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()


def first_frame(buf: bytes | bytearray) -> tuple[tuple[str, dict[str, str], bytes], int] | None:
    """The first complete frame of ``buf`` (spec parse) and the bytes it used, or None."""
    frames, used = parse_frames(buf, limit=1)
    return (frames[0], used) if frames else None


def open_many(host: str, port: int, n: int, deadline: float, source: str | None = None,
              concurrency: int = 256) -> tuple[list[Conn], list[str]]:
    """Open up to ``n`` TCP connections concurrently (non-blocking connects).

    Returns the connections that completed the TCP handshake and the errors
    of the others. Connections the kernel accepted into the listen backlog
    count as open even if the broker has not called accept() yet.
    """
    conns: list[Conn] = []
    errors: list[str] = []
    pending: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    started = 0
    try:
        while (started < n or pending) and time.monotonic() < deadline:
            while started < n and len(pending) < concurrency:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                if source:
                    s.bind((source, 0))
                rc = s.connect_ex((host, port))
                started += 1
                if rc in (0, errno.EINPROGRESS):
                    pending[s.fileno()] = s
                    sel.register(s, selectors.EVENT_WRITE)
                else:
                    errors.append(errno.errorcode.get(rc, str(rc)))
                    s.close()
            for key, _ in sel.select(min(0.5, max(0.0, deadline - time.monotonic()))):
                s = key.fileobj  # type: ignore[assignment]
                sel.unregister(s)
                pending.pop(s.fileno(), None)
                rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if rc == 0:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns.append(Conn(s))
                else:
                    errors.append(errno.errorcode.get(rc, str(rc)))
                    s.close()
    finally:
        for s in pending.values():
            errors.append("connect timeout")
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        sel.close()
    return conns, errors


def watch(conns: list[Conn], deadline: float, until: Callable[[Conn], bool] | None = None,
          drain: bool = True) -> None:
    """Read from every connection until each is closed by the broker (or
    ``until(conn)`` holds), or ``deadline``. Received bytes go to each
    connection's :attr:`Conn.buf` (only the first 4 KiB when ``drain`` is
    False, so a broker's heart-beats cannot fill memory)."""
    sel = selectors.DefaultSelector()
    live = 0
    try:
        for c in conns:
            if c.eof or (until is not None and until(c)):
                continue
            try:
                sel.register(c.sock, selectors.EVENT_READ, c)
                live += 1
            except (ValueError, OSError):
                c._mark_eof(reset=True)
        while live and time.monotonic() < deadline:
            for key, _ in sel.select(min(0.5, max(0.0, deadline - time.monotonic()))):
                c = key.data
                c._pull()
                if not drain and len(c.buf) > 4096:
                    del c.buf[4096:]  # keep the first frames, drop heart-beats and floods
                if c.eof or (until is not None and until(c)):
                    sel.unregister(c.sock)
                    live -= 1
    finally:
        sel.close()


def close_all(conns: Iterable[Conn]) -> None:
    for c in conns:
        c.close()
