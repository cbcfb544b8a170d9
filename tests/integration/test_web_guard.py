"""The HTTP listener's edges over real sockets: a broker started from its
configuration (L{make_service}) on 127.0.0.1, and blocking clients in a
thread (L{deferToThread}) that see exactly what the broker sends.

  - the probe's cross-site receive (a form's body, a foreign Origin) hides
    no message: the messages are still there for the next real receive;
  - a rebound name (Host and Origin of another site) is refused with the
    same 421 by the API, the WebSocket endpoint and SockJS;
  - a request head dribbled slower than C{[web] head_timeout} gets a 408,
    and a body over C{max_request_body} a 413, then the end of the stream
    (C{recv()} returns C{b""}) at once, over TCP and TLS.

Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import quoteStringArgument
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq import config
from qmq.service import make_service
from tests.integration.certs import TestPKI

WAIT = 10.0
Q = "/api/v1/vhosts/%2F/queues"
UPGRADE = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


class Raw:
    """One blocking client connection (plain or TLS), with deadlines."""

    def __init__(self, port: int, context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.sock: Any = context.wrap_socket(sock, server_hostname="localhost") if context else sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_to_end(self) -> tuple[bytes, float]:
        """Everything up to the end of the stream (or the head of a 101: the
        WebSocket stays open), and how long it took."""
        started = time.monotonic()
        data = b""
        while not (data.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in data):
            try:
                chunk = self.sock.recv(65536)
            except ssl.SSLEOFError:  # pragma: no cover - a TLS EOF without close_notify
                chunk = b""
            if not chunk:
                return data, time.monotonic() - started
            data += chunk
        return data, time.monotonic() - started

    def request(self, method: str, path: str, body: bytes = b"", host: str = "127.0.0.1",
                headers: str = "") -> tuple[int, dict]:
        """One request on a connection of its own (closed after the answer)."""
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}"
        if body or method in ("POST", "PUT"):
            head += f"Content-Length: {len(body)}\r\n"
        self.send(head.encode() + b"\r\n" + body)
        data, _ = self.read_to_end()
        self.sock.close()
        head, _, text = data.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        try:
            return status, json.loads(text)
        except ValueError:
            return status, {}

    def close(self) -> None:
        self.sock.close()


class ListenerMixin:
    tls = False

    def setUp(self) -> Any:
        self.context = None
        if self.tls:
            pki = TestPKI(self.mktemp())  # type: ignore[attr-defined]
            params = ":".join(f"{k}={quoteStringArgument(str(v))}" for k, v in (
                ("privateKey", pki.server_key), ("certKey", pki.server_cert), ("interface", "127.0.0.1")))
            listen = f"http:ssl:0:{params}"
            self.context = ssl.create_default_context(cafile=str(pki.ca_pem))
        else:
            listen = "http:tcp:0:interface=127.0.0.1"
        settings = config.load_string(
            f"listen = [{json.dumps(listen)}]\nstore = \"memory\"\n"
            "[web]\nhead_timeout = 0.5\nmax_request_body = 1000\n[connections]\nclose_grace = 5.0\n"
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)  # type: ignore[attr-defined]
        self.port = self.service.listeners[0].port.getHost().port

    def raw(self) -> Raw:
        return Raw(self.port, self.context)

    def call(self, *args: Any, **kwargs: Any) -> tuple[int, dict]:
        return self.raw().request(*args, **kwargs)

    @defer.inlineCallbacks
    def test_head_timeout_closes(self) -> Any:
        """A head that stops halfway gets a 408 at C{head_timeout} and the
        end of the stream: the peer's C{recv()} returns C{b""}."""

        def scenario() -> tuple[bytes, float]:
            client = self.raw()
            client.send(b"GET /api/v1/vhosts HT")
            try:
                return client.read_to_end()
            finally:
                client.close()

        data, took = yield deferToThread(scenario)
        self.assertTrue(data.startswith(b"HTTP/1.1 408 "), data[:100])  # type: ignore[attr-defined]
        self.assertIn(b'"head-timeout"', data)  # type: ignore[attr-defined]
        # Closed, not aborted close_grace (5 s) later: over TLS too.
        self.assertLess(took, 5.0)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_body_too_large_closes(self) -> Any:
        """A body over C{max_request_body}: a 413 before it is read, and the
        end of the stream, over TLS too (not the abort C{close_grace} later)."""

        def scenario() -> tuple[bytes, float]:
            client = self.raw()
            client.send(b"POST /api/v1/vhosts/%2F/queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
            try:
                return client.read_to_end()
            finally:
                client.close()

        data, took = yield deferToThread(scenario)
        self.assertTrue(data.startswith(b"HTTP/1.1 413 "), data[:100])  # type: ignore[attr-defined]
        self.assertLess(took, 5.0)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_cross_site_receive_hides_nothing(self) -> Any:
        def scenario() -> list[Any]:
            body = json.dumps({"messages": [{"body": str(i)} for i in range(3)]}).encode()
            results: list[Any] = [self.call("POST", f"{Q}/q/messages", body,
                                            headers="Content-Type: application/json\r\n")[0]]
            form = b"max=10000&visibility=43200"
            results.append(self.call("POST", f"{Q}/q/receive?max=10000&visibility=43200", form,
                                     headers="Content-Type: application/x-www-form-urlencoded\r\n"
                                             "Origin: http://evil.example\r\n"))
            results.append(self.call("POST", f"{Q}/q/receive?max=10000&visibility=43200", form,
                                     headers="Content-Type: application/x-www-form-urlencoded\r\n"))
            results.append(self.call("POST", f"{Q}/q/receive?max=10000&visibility=43200",
                                     headers="Origin: http://evil.example\r\n"))
            results.append(self.call("POST", f"{Q}/q/receive?max=10"))
            return results

        published, with_origin, old_browser, no_cors, real = yield deferToThread(scenario)
        self.assertEqual(published, 201)  # type: ignore[attr-defined]
        self.assertEqual((with_origin[0], with_origin[1]["code"]), (403, "origin-not-allowed"))  # type: ignore[attr-defined]
        self.assertEqual((old_browser[0], old_browser[1]["code"]), (415, "unsupported-media-type"))  # type: ignore[attr-defined]
        self.assertEqual(no_cors[0], 403)  # type: ignore[attr-defined]
        self.assertEqual(real[0], 200)  # type: ignore[attr-defined]
        self.assertEqual([m["body"] for m in real[1]["messages"]], ["0", "1", "2"])  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_rebound_name_one_verdict(self) -> Any:
        """A page on a rebound name: 421 from the API, the WebSocket
        endpoint and SockJS alike; the broker's own name passes all three."""
        paths = [("GET", "/api/v1/vhosts", ""), ("GET", "/ws", UPGRADE),
                 ("GET", "/sockjs/info", ""), ("POST", "/sockjs/000/abc/xhr", "")]

        def scenario() -> list[list[int]]:
            verdicts = []
            for host in ("rebound.example", "localhost"):
                scheme = "https" if self.tls else "http"
                origin = f"Origin: {scheme}://{host}:{self.port}\r\n"
                verdicts.append([self.call(method, path, host=f"{host}:{self.port}", headers=origin + extra)[0]
                                 for method, path, extra in paths])
            return verdicts

        rebound, own = yield deferToThread(scenario)
        self.assertEqual(rebound, [421] * 4)  # type: ignore[attr-defined]
        self.assertEqual(own, [200, 101, 200, 200])  # type: ignore[attr-defined]


class TCPTests(ListenerMixin, unittest.TestCase):
    """Over plain TCP."""


class TLSTests(ListenerMixin, unittest.TestCase):
    """Over TLS (a test CA)."""

    tls = True
