# -*- test-case-name: tests.integration.test_close -*-
"""Every way the broker closes a connection, seen from the client's socket.

A log line saying "closed" proves nothing: these tests hold the other end of
a real connection to a STOMP listener on 127.0.0.1 and check that it sees the
end of the stream within the stated time, over plain TCP (C{tcp:}), over
Twisted's TLS (C{ssl:}) and over C{qmqtls:} with a client certificate:

  - the STOMP close paths: an C{ERROR} after a bad frame, C{DISCONNECT}
    with a receipt, the connect timeout, the heart-beat timeout and the
    broker's shutdown: the client reads its last frame, then EOF (over TLS:
    the close alert; and once it answers the alert, the TCP FIN);
  - over TLS, a client that never answers the close alert: the broker
    aborts the socket after C{close_grace};
  - over TLS, a client that never sends a ClientHello, or stops halfway
    through one: the broker drops it after C{handshake_timeout};
  - the connection caps: past the cap a client gets C{ERROR
    message:too many connections} and EOF; once a connection closes, a new
    one gets in.

The client side is a blocking socket (TLS through C{ssl.SSLObject} over
memory BIOs, so the test sees both the TLS stream and the TCP socket under
it) run in a thread with L{deferToThread} while the reactor serves the
broker. Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import quoteStringArgument, serverFromString
from twisted.internet.threads import blockingCallFromThread, deferToThread
from twisted.trial import unittest

from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from tests.integration.certs import TestPKI

#: The deadlines the broker runs with here: short, so the tests are quick.
FAST = ConnectionSettings(handshake_timeout=0.3, close_grace=0.3)
#: What a close may take beyond its deadline on a busy test machine.
SLACK = 2.0
#: How long a client waits for anything at all before the test fails.
WAIT = 10.0

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\x00"


class PeerClosed(Exception):
    """Raised by L{Peer.read_frames} when the stream ended early."""


class Peer:
    """The client end of one connection, blocking, with deadlines.

    @ivar sock: the TCP socket.
    @ivar tls: the client side of TLS (an L{ssl.SSLObject}), or L{None}.
    @ivar data: bytes received on the STOMP stream so far.
    @ivar end: how the stream ended, once it did: C{"eof"} (TCP FIN),
        C{"close_notify"} (the TLS close alert), C{"reset"} (RST).
    """

    def __init__(
        self,
        port: int,
        context: ssl.SSLContext | None,
        handshake: bool = True,
        rcvbuf: int | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Set before connecting: a fixed buffer, not auto-tuned upwards.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", port))
        self.data = b""
        self.end: str | None = None
        self.tls: ssl.SSLObject | None = None
        if context is not None:
            self._in = ssl.MemoryBIO()
            self._out = ssl.MemoryBIO()
            self.tls = context.wrap_bio(self._in, self._out, server_hostname="localhost")
            if handshake:
                self.handshake()

    # -- the TCP socket -----------------------------------------------------------

    def _flush(self) -> None:
        pending = self._out.read()
        if pending:
            self.sock.sendall(pending)

    def _recv_raw(self, deadline: float) -> bytes | None:
        """Bytes from the socket; C{b""} at EOF, L{None} on a reset."""
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return None
        except TimeoutError:
            raise AssertionError("timed out waiting for the broker") from None

    def handshake(self) -> None:
        assert self.tls is not None
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                chunk = self._recv_raw(deadline)
                if not chunk:
                    raise AssertionError(f"the handshake failed: {chunk!r}") from None
                self._in.write(chunk)
        else:
            raise AssertionError("timed out in the TLS handshake")
        self._flush()

    def client_hello(self) -> bytes:
        """The first flight of a TLS handshake, without sending it."""
        assert self.tls is not None
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        return self._out.read()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    # -- the STOMP stream ------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.tls is None:
            self.sock.sendall(data)
        else:
            self.tls.write(data)
            self._flush()

    def _read_some(self, deadline: float) -> bytes:
        """Stream bytes; C{b""} once the stream has ended (see L{end})."""
        if self.end is not None:
            return b""
        while True:
            if self.tls is not None:
                try:
                    data = self.tls.read(65536)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    self.end = "close_notify"
                    return b""
                except ssl.SSLEOFError:
                    self.end = "eof"  # a TCP FIN without the close alert
                    return b""
                else:
                    if not data:  # how an SSLObject reports the close alert
                        self.end = "close_notify"
                    return data
            chunk = self._recv_raw(deadline)
            if chunk is None:
                self.end = "reset"
                return b""
            if self.tls is None:
                if not chunk:
                    self.end = "eof"
                return chunk
            if chunk:
                self._in.write(chunk)
            else:
                self._in.write_eof()

    def read_frames(self, count: int) -> list[str]:
        """Read until C{count} whole frames have arrived; return every command."""
        deadline = time.monotonic() + WAIT
        while self.data.count(b"\x00") < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {count} frames: {self.data!r}")
            chunk = self._read_some(deadline)
            if not chunk and self.end is not None:
                raise PeerClosed(f"{self.end} after {self.data!r}")
            self.data += chunk
        return self.commands()

    def commands(self) -> list[str]:
        frames = self.data.lstrip(b"\r\n").split(b"\x00")[:-1]
        return [frame.lstrip(b"\r\n").split(b"\n", 1)[0].decode() for frame in frames]

    def header(self, frame: int, name: str) -> str | None:
        block = self.data.split(b"\x00")[frame].lstrip(b"\r\n").split(b"\n\n", 1)[0]
        for line in block.decode().split("\n")[1:]:
            key, _, value = line.partition(":")
            if key == name:
                return value
        return None

    def read_to_end(self, within: float) -> float:
        """Read the stream to its end, which must come within C{within} s.

        @return: the seconds it took.
        """
        start = time.monotonic()
        deadline = start + within
        while self.end is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream did not end within {within} s")
            self.data += self._read_some(deadline)
        return time.monotonic() - start

    def socket_closed(self, within: float) -> str:
        """Wait for the TCP connection itself to end (after the TLS stream did).

        @return: C{"eof"} or C{"reset"}.
        """
        deadline = time.monotonic() + within
        while True:
            chunk = self._recv_raw(deadline)
            if chunk is None:
                return "reset"
            if not chunk:
                return "eof"

    def answer_close(self) -> None:
        """Send our own TLS close alert, as a well-behaved client does."""
        assert self.tls is not None
        try:
            self.tls.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass
        self._flush()

    def close(self) -> None:
        self.sock.close()


class CloseTestMixin:
    """The close paths of one kind of listener (C{kind}: tcp, ssl, qmqtls)."""

    kind = "tcp"
    timeout = 60

    pki: TestPKI
    port: int
    registry: ConnectionRegistry
    addCleanup: Callable[..., Any]
    assertEqual: Callable[..., Any]
    assertIn: Callable[..., Any]
    assertLess: Callable[..., Any]
    assertGreater: Callable[..., Any]
    assertRaises: Callable[..., Any]
    assertIsNone: Callable[..., Any]
    mktemp: Callable[[], str]

    # -- the broker ----------------------------------------------------------------

    def description(self) -> str:
        if self.kind == "tcp":
            return "tcp:0:interface=127.0.0.1"
        self.pki = TestPKI(self.mktemp())
        if self.kind == "ssl":
            return (
                "ssl:0:interface=127.0.0.1"
                f":privateKey={quoteStringArgument(str(self.pki.server_key))}"
                f":certKey={quoteStringArgument(str(self.pki.server_cert))}"
            )
        return self.pki.qmqtls(verify="require")

    def context(self) -> ssl.SSLContext | None:
        if self.kind == "tcp":
            return None
        if self.kind == "ssl":
            return ssl.create_default_context(cafile=str(self.pki.ca_pem))
        return self.alice.ssl_context(self.pki.ca_pem)

    @defer.inlineCallbacks
    def listen(
        self, stomp: StompSettings | None = None, connections: ConnectionSettings = FAST
    ) -> Any:
        """Start a broker listening on 127.0.0.1 with these settings."""
        self.broker = Broker(reactor)
        self.registry = ConnectionRegistry(connections, reactor)
        self.factory = StompFactory(
            self.broker, stomp or StompSettings(), reactor, self.registry, self.kind
        )
        description = self.description()
        if self.kind == "qmqtls":
            self.alice = self.pki.client("alice.example.org", common_name="alice")
        port = yield serverFromString(reactor, description).listen(self.factory)
        self.port = port.getHost().port
        self.addCleanup(port.stopListening)
        self.addCleanup(self.registry.shutdown, "test over", 1.0)

    def peer(self, handshake: bool = True, rcvbuf: int | None = None) -> Peer:
        """A client connection (in the scenario's thread); closed at cleanup."""
        p = Peer(self.port, self.context(), handshake, rcvbuf)
        self.addCleanup(p.close)
        return p

    def expect_close(self, p: Peer, within: float, commands: list[str]) -> None:
        """C{p} reads C{commands}, then the end of the stream within C{within} s;
        over TLS, once it answers the close alert the socket closes too."""
        took = p.read_to_end(within)
        self.assertEqual(p.commands(), commands)
        self.assertLess(took, within)
        if p.tls is None:
            self.assertEqual(p.end, "eof")
        else:
            self.assertEqual(p.end, "close_notify")
            p.answer_close()
            # The broker closes the socket once both alerts are exchanged,
            # well before it would abort it.
            started = time.monotonic()
            self.assertEqual(p.socket_closed(SLACK), "eof")
            self.assertLess(time.monotonic() - started, FAST.close_grace)

    def serve(self, scenario: Callable[[], object], **settings: Any) -> defer.Deferred:
        """Start a broker with C{settings}, then run C{scenario} in a thread."""
        d = self.listen(**settings)
        d.addCallback(lambda _: deferToThread(scenario))
        return d

    # -- the STOMP close paths -----------------------------------------------------------

    def test_error(self):
        """A bad frame: ERROR, then EOF."""

        def scenario():
            p = self.peer()
            p.send(CONNECT)
            p.read_frames(1)
            p.send(b"NOPE\n\n\x00")
            self.expect_close(p, SLACK, ["CONNECTED", "ERROR"])
            self.assertEqual(p.header(1, "message"), "unknown command")

        return self.serve(scenario)

    def test_disconnect(self):
        """DISCONNECT with a receipt: the RECEIPT, then EOF."""

        def scenario():
            p = self.peer()
            p.send(CONNECT)
            p.read_frames(1)
            p.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
            self.expect_close(p, SLACK, ["CONNECTED", "RECEIPT"])
            self.assertEqual(p.header(1, "receipt-id"), "bye")

        return self.serve(scenario)

    def test_connect_timeout(self):
        """No CONNECT within C{connect_timeout}: ERROR, then EOF."""

        def scenario():
            p = self.peer()
            self.expect_close(p, 0.3 + SLACK, ["ERROR"])
            self.assertEqual(p.header(0, "message"), "connect timeout")
            # Counted from the connection's start, the handshake included.
            self.assertGreater(time.monotonic() - p.started, 0.25)

        return self.serve(scenario, stomp=StompSettings(connect_timeout=0.3))

    def test_heartbeat_timeout(self):
        """A client that promised heart-beats and sends none: ERROR, then EOF."""

        def scenario():
            p = self.peer()
            p.send(CONNECT.replace(b"heart-beat:0,0", b"heart-beat:100,0"))
            p.read_frames(1)
            # Closed between 1.5 and 2 intervals after the last byte.
            self.expect_close(p, 0.2 + SLACK, ["CONNECTED", "ERROR"])
            self.assertEqual(p.header(1, "message"), "heart-beat timeout")

        return self.serve(
            scenario,
            stomp=StompSettings(heartbeat_receive_ms=100, heartbeat_send_ms=0, heartbeat_grace=1.5),
        )

    def test_shutdown(self):
        """The broker shuts down: ERROR, then EOF, for every client."""

        def scenario():
            peers = [self.peer() for _ in range(3)]
            for p in peers:
                p.send(CONNECT)
                p.read_frames(1)
            reactor.callFromThread(self.registry.shutdown, "going down", 5.0)
            for p in peers:
                self.expect_close(p, SLACK, ["CONNECTED", "ERROR"])
                self.assertEqual(p.header(1, "message"), "going down")

        return self.serve(scenario)

    def test_slow_reader_aborted(self):
        """A client that stops reading cannot keep a closed connection open:
        the broker aborts it C{close_grace} after closing."""
        body = b"x" * 60_000

        def scenario():
            p = self.peer(rcvbuf=32 * 1024)
            p.send(CONNECT)
            p.read_frames(1)
            p.send(b"SUBSCRIBE\ndestination:/queue/q\nid:0\n\n\x00")
            # More deliveries than the socket buffers hold; never read them.
            sends = b"SEND\ndestination:/queue/q\n\n" + body + b"\x00"
            for _ in range(100):
                p.send(sends)
            started = time.monotonic()
            blockingCallFromThread(reactor, self.registry.shutdown, "going down", 30.0)
            # That Deferred fires once the broker has let go of the connection:
            # after the close grace, not at the 30 s shutdown timeout.
            self.assertLess(time.monotonic() - started, FAST.close_grace + SLACK)
            self.assertEqual(len(self.registry), 0)
            p.read_to_end(WAIT)
            self.assertIn(p.end, ("reset", "eof", "close_notify"))

        return self.serve(scenario)


class TLSCloseTestMixin(CloseTestMixin):
    """What only TLS connections can do: stall the handshake or the close."""

    def test_close_alert_unanswered(self):
        """A client that never answers the close alert: the socket is aborted
        after C{close_grace} (Twisted alone would wait for ever)."""

        def scenario():
            p = self.peer()
            p.send(CONNECT)
            p.read_frames(1)
            p.send(b"DISCONNECT\n\n\x00")
            p.read_to_end(SLACK)
            self.assertEqual(p.end, "close_notify")
            started = time.monotonic()
            self.assertIn(p.socket_closed(FAST.close_grace + SLACK), ("eof", "reset"))
            self.assertGreater(time.monotonic() - started, FAST.close_grace - 0.1)

        return self.serve(scenario)

    def test_no_client_hello(self):
        """A client that connects and sends nothing is dropped after
        C{handshake_timeout}."""

        def scenario():
            p = self.peer(handshake=False)
            started = time.monotonic()
            self.assertIn(p.socket_closed(FAST.handshake_timeout + SLACK), ("eof", "reset"))
            self.assertGreater(time.monotonic() - started, FAST.handshake_timeout - 0.1)

        return self.serve(scenario, stomp=StompSettings(connect_timeout=60))

    def test_half_client_hello(self):
        """A client that stops halfway through its ClientHello is dropped after
        C{handshake_timeout}."""

        def scenario():
            p = self.peer(handshake=False)
            hello = p.client_hello()
            p.send_raw(hello[: len(hello) // 2])
            started = time.monotonic()
            self.assertIn(p.socket_closed(FAST.handshake_timeout + SLACK), ("eof", "reset"))
            self.assertGreater(time.monotonic() - started, FAST.handshake_timeout - 0.1)

        return self.serve(scenario, stomp=StompSettings(connect_timeout=60))

    def test_handshake_then_quiet(self):
        """The handshake timer stops once the handshake is done: a client that
        is slow to CONNECT gets the connect timeout, not a dropped socket."""

        def scenario():
            p = self.peer()
            started = time.monotonic()
            self.expect_close(p, 0.6 + SLACK, ["ERROR"])
            self.assertEqual(p.header(0, "message"), "connect timeout")
            self.assertGreater(time.monotonic() - started, FAST.handshake_timeout)

        return self.serve(scenario, stomp=StompSettings(connect_timeout=0.6))


class CapTestMixin:
    """Connection caps, seen from the clients."""

    def test_cap(self):
        """Past C{max_per_listener}, a client gets ERROR C{too many
        connections} and EOF; once one closes, a new one gets in."""

        def scenario():
            admitted = [self.peer() for _ in range(5)]
            for p in admitted:
                p.send(CONNECT)
                p.read_frames(1)
            refused = self.peer()
            self.expect_close(refused, SLACK, ["ERROR"])
            self.assertEqual(refused.header(0, "message"), "too many connections")
            self.assertIn(b"max_per_listener", refused.data)
            self.assertEqual(len(self.registry), 5)
            admitted[0].send(b"DISCONNECT\n\n\x00")
            self.expect_close(admitted[0], SLACK, ["CONNECTED"])
            deadline = time.monotonic() + WAIT
            while len(self.registry) > 4:
                assert time.monotonic() < deadline, "the broker kept the closed connection"
                blockingCallFromThread(reactor, lambda: None)  # a reactor turn
            again = self.peer()
            again.send(CONNECT)
            self.assertEqual(again.read_frames(1), ["CONNECTED"])
            self.assertEqual(self.registry.refused(self.kind), 1)

        return self.serve(
            scenario, connections=ConnectionSettings(max_per_listener=5, close_grace=0.3)
        )

    def test_address_cap(self):
        """Past C{max_per_address}, over all listeners, the same."""

        def scenario():
            for _ in range(3):
                p = self.peer()
                p.send(CONNECT)
                p.read_frames(1)
            refused = self.peer()
            self.expect_close(refused, SLACK, ["ERROR"])
            self.assertEqual(refused.header(0, "message"), "too many connections")
            self.assertIn(b"max_per_address", refused.data)

        return self.serve(
            scenario, connections=ConnectionSettings(max_per_address=3, close_grace=0.3)
        )


class TCPCloseTests(CloseTestMixin, CapTestMixin, unittest.TestCase):
    kind = "tcp"

    def test_error_reaches_a_client_behind_on_reading(self):
        """An ERROR queued behind deliveries the client has not read yet still
        reaches it: the broker half-closes and goes on sending (reading and
        discarding what the client sends) until the client has it all or the
        grace ends. Closing the socket with unread input would make the kernel
        reset the connection and drop everything still unsent, ERROR
        included."""

        def scenario():
            feeder = self.peer()
            feeder.send(CONNECT)
            feeder.read_frames(1)
            body = b"m" * 8000
            feeder.send(b"".join(
                b"SEND\ndestination:/queue/big\n\n" + body + b"\x00" for _ in range(60)
            ) + b"SEND\ndestination:/queue/big\nreceipt:r\n\nlast\x00")
            feeder.read_frames(2)
            p = self.peer(rcvbuf=4096)
            p.send(CONNECT)
            p.read_frames(1)
            # 480 KB of deliveries wait for a client that does not read yet.
            p.send(b"SUBSCRIBE\nid:s\ndestination:/queue/big\n\n\x00")
            time.sleep(0.1)
            p.send(b"NOPE\n\n\x00")
            # More input than one read takes, still arriving as the broker closes.
            p.sock.settimeout(0.5)
            try:
                for _ in range(100):
                    p.sock.sendall(b"\n" * 8192)
            except OSError:
                pass
            p.sock.settimeout(None)
            try:
                p.read_to_end(WAIT)
            except OSError:
                pass  # a reset: the assertion below says what was lost
            self.assertEqual(p.commands()[-1], "ERROR")
            self.assertEqual(p.commands().count("MESSAGE"), 61)

        return self.serve(scenario, connections=ConnectionSettings(close_grace=5.0))


class SSLCloseTests(TLSCloseTestMixin, CapTestMixin, unittest.TestCase):
    kind = "ssl"


class QMQTLSCloseTests(TLSCloseTestMixin, CapTestMixin, unittest.TestCase):
    kind = "qmqtls"
