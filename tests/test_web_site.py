"""Tests for L{qmq.web.site}: the HTTP listener's factory, its connections
as the registry sees them, and the site's mounts and JSON errors.

No sockets: the factory builds protocols on L{StringTransport}s and the
clock is a L{MemoryReactorClock}.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import ISSLTransport
from twisted.internet.testing import (
    MemoryReactorClock,
    StringTransport,
    StringTransportWithDisconnection,
)
from twisted.trial import unittest
from twisted.web.resource import Resource
from zope.interface import directlyProvides

from qmq import config
from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.web import site as site_module
from qmq.web.settings import WebSettings, split_origins
from qmq.web.site import MOUNTS, HttpConnection, HttpFactory, RefusedHttpProtocol, WebContext


def make_context(
    web: str = "", clock: Any = None, connections: ConnectionSettings | None = None
) -> WebContext:
    clock = clock if clock is not None else MemoryReactorClock()
    settings = config.load_string(web)
    registry = ConnectionRegistry(connections or settings.connections, clock)
    return WebContext(Broker(clock=clock), clock, settings, registry, "http:test")


class Client:
    """One connection to an L{HttpFactory}, over a string transport."""

    def __init__(self, factory: HttpFactory, host: str = "127.0.0.1", tls: bool = False) -> None:
        addr = IPv4Address("TCP", host, 40000)
        self.protocol = factory.buildProtocol(addr)
        self.transport = StringTransportWithDisconnection(peerAddress=addr)
        if tls:
            directlyProvides(self.transport, ISSLTransport)
            self.transport.setTcpNoDelay = lambda flag: None
        self.transport.protocol = self.protocol
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n{headers}"
        if body or method == "POST":
            head += f"Content-Length: {len(body)}\r\n"
        self.send(head.encode() + b"\r\n" + body)
        return self.response()

    def response(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data


def split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


class SettingsTests(unittest.TestCase):
    """The C{[web]} table."""

    def test_defaults(self) -> None:
        web = config.load().section("web")
        self.assertEqual(web, WebSettings())
        self.assertEqual(web.origins, ())
        self.assertFalse(web.examples)

    def test_origins(self) -> None:
        web = config.load_string(
            '[web]\nallowed_origins = "https://a.example.com, http://localhost:*"'
        ).section("web")
        self.assertEqual(web.origins, ("https://a.example.com", "http://localhost:*"))
        self.assertEqual(split_origins(" * "), ("*",))

    def test_badOrigin(self) -> None:
        with self.assertRaises(config.ConfigError) as e:
            config.load_string('[web]\nallowed_origins = "example.com"', "q.toml")
        self.assertIn("q.toml: web.allowed_origins: expected origins such as", str(e.exception))

    def test_badFrameType(self) -> None:
        with self.assertRaises(config.ConfigError) as e:
            config.load_string('[web]\nframe_type = "utf16"', "q.toml")
        self.assertEqual(
            str(e.exception),
            'q.toml: web.frame_type: expected one of auto, text, binary, got "utf16"',
        )

    def test_httpListener(self) -> None:
        """C{http:} is a protocol a listen spec may name."""
        from qmq import service  # noqa: PLC0415

        self.assertIn("http", service.PROTOCOLS)
        settings = config.load_string('listen = ["http:tcp:0:interface=127.0.0.1"]')
        svc = service.make_service(settings, MemoryReactorClock())
        factory = svc.listeners[0].factory
        self.assertIsInstance(factory, HttpFactory)
        self.assertIs(factory.ctx.connections, svc.connections)
        self.assertEqual(factory.listener, "http:tcp:0:interface=127.0.0.1")


class SiteTests(unittest.TestCase):
    """What the site serves."""

    def setUp(self) -> None:
        self.ctx = make_context()
        self.factory = HttpFactory(self.ctx)

    def test_index(self) -> None:
        status, headers, body = split(Client(self.factory).request("GET", "/"))
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "application/json")
        index = json.loads(body)
        self.assertEqual(index["server"], "QMQ")
        self.assertIn("/stomp", index["paths"])
        self.assertIn("/ws", index["paths"])
        self.assertIn("/qmq.js", index["paths"])
        self.assertNotIn("/examples", index["paths"])

    def test_notFound(self) -> None:
        status, headers, body = split(Client(self.factory).request("GET", "/nothing/here"))
        self.assertEqual(status, 404)
        self.assertEqual(headers["content-type"], "application/problem+json")
        self.assertEqual(json.loads(body)["code"], "not-found")
        self.assertIn("/nothing/here", json.loads(body)["detail"])

    def test_methodNotAllowed(self) -> None:
        status, headers, body = split(Client(self.factory).request(
            "POST", "/", b"{}", "Content-Type: application/json\r\n"))
        self.assertEqual(status, 405)
        self.assertEqual(json.loads(body)["code"], "method-not-allowed")

    def test_client(self) -> None:
        """C{/qmq.js} is the client, as a JavaScript module, revalidated."""
        status, headers, body = split(Client(self.factory).request("GET", "/qmq.js"))
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "text/javascript; charset=utf-8")
        self.assertEqual(headers["cache-control"], "no-cache")
        self.assertEqual(headers["x-content-type-options"], "nosniff")
        self.assertIn(b"export class", body)

    def test_examplesOff(self) -> None:
        status, _, _ = split(Client(self.factory).request("GET", "/examples/"))
        self.assertEqual(status, 404)

    def test_examplesOn(self) -> None:
        factory = HttpFactory(make_context("[web]\nexamples = true"))
        client = Client(factory)
        status, headers, body = split(client.request("GET", "/examples/chat.html"))
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "text/html; charset=utf-8")
        status, _, body = split(client.request("GET", "/examples/missing.html"))
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(body)["code"], "not-found")
        status, _, body = split(client.request("GET", "/examples/../site.py"))
        self.assertIn(status, (403, 404))
        self.assertNotIn(b"import", body)

    def test_mountContract(self) -> None:
        """A mount is one line in L{MOUNTS}: the context in, a resource (or None) out."""
        seen = []

        class Hello(Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                return b"hello"

        def hello(ctx: WebContext) -> Resource:
            seen.append(ctx)
            return Hello()

        self.patch(site_module, "MOUNTS", {**MOUNTS, "hello": hello, "off": lambda ctx: None})
        factory = HttpFactory(self.ctx)
        self.assertEqual(seen, [self.ctx])
        client = Client(factory)
        self.assertEqual(split(client.request("GET", "/hello"))[2], b"hello")
        self.assertEqual(split(client.request("GET", "/off"))[0], 404)

    def test_failureIsJson(self) -> None:
        """An exception in a resource is a 500 with a JSON body, no traceback."""


        class Broken(Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                raise RuntimeError("secret detail")

        self.patch(site_module, "MOUNTS", {**MOUNTS, "broken": lambda ctx: Broken()})
        status, headers, body = split(Client(HttpFactory(self.ctx)).request("GET", "/broken"))
        self.assertEqual(status, 500)
        self.assertEqual(json.loads(body)["code"], "internal-error")
        self.assertNotIn(b"secret", body)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_accessLog(self) -> None:
        """No access log line unless C{[web] access_log} asks for one."""
        for toml, lines in (("", 0), ("[web]\naccess_log = true", 1)):
            factory = HttpFactory(make_context(toml))
            written: list[Any] = []
            factory.site._logFile = type("F", (), {"write": lambda self, line, w=written: w.append(line),
                                                   "close": lambda self: None})()
            client = Client(factory)
            client.send(b"GET /nothing-here HTTP/1.1\r\nHost: localhost\r\n\r\n")
            self.assertTrue(client.response())
            self.assertEqual(len(written), lines, toml)

    def test_formNotParsed(self) -> None:
        """A form POST's body is not read into C{args} (nothing takes forms),
        and the site's gate refuses the form before any resource sees it."""
        factory = HttpFactory(make_context(""))
        client = Client(factory)
        seen = []
        factory.site.resource.putChild(b"form", type("R", (), {
            "isLeaf": True, "render": lambda self, request: seen.append(dict(request.args)) or b"ok"})())
        form = (b"POST /form HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 3\r\n\r\na=1")
        client.send(form)
        self.assertEqual(split(client.response())[0], 415)
        self.assertEqual(seen, [])
        factory.site.guard = None
        client.send(form)
        self.assertTrue(client.response())
        self.assertEqual(seen, [{}])

    def test_headAndBigBodyInOneRead(self) -> None:
        """A read holding a head, a large body and the next request is cut
        after the head (the body never sits in the line buffer); both
        requests are answered as usual."""
        factory = HttpFactory(make_context(""))
        seen = []
        factory.site.resource.putChild(b"size", type("R", (), {
            "isLeaf": True, "render": lambda self, request: seen.append(len(request.content.read())) or b"ok"})())
        client = Client(factory)
        body = b"x" * 50_000
        head = b"POST /size HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        client.send(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    + head + b"Content-Length: 3\r\n\r\nabc")
        self.assertEqual(client.response().count(b"HTTP/1.1 200"), 2)
        self.assertEqual(seen, [50_000, 3])

    def test_bodyTooLarge(self) -> None:
        """A body over C{max_request_body} is refused before it is read."""
        factory = HttpFactory(make_context("[web]\nmax_request_body = 10"))
        client = Client(factory)
        client.send(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\n")
        status, headers, body = split(client.response())
        self.assertEqual(status, 413)
        self.assertEqual(json.loads(body)["code"], "body-too-large")
        self.assertIn("max_request_body", json.loads(body)["detail"])
        self.assertFalse(client.transport.connected)

    def test_chunkedBodyTooLarge(self) -> None:
        factory = HttpFactory(make_context("[web]\nmax_request_body = 10"))
        client = Client(factory)
        client.send(b"POST / HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        client.send(b"8\r\n12345678\r\n")
        self.assertEqual(client.response(), b"")
        client.send(b"8\r\n12345678\r\n")
        status, _, body = split(client.response())
        self.assertEqual(status, 413)
        self.assertFalse(client.transport.connected)

    def test_bodyWithinLimit(self) -> None:
        factory = HttpFactory(make_context("[web]\nmax_request_body = 10"))
        status, _, _ = split(Client(factory).request(
            "POST", "/", b"0123456789", "Content-Type: application/json\r\n"))
        self.assertEqual(status, 405)


class HeadTimeoutTests(unittest.TestCase):
    """C{[web] head_timeout}: a request's head has a deadline from its first
    read, which Twisted's idle timeout (restarted by every byte) is not."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.ctx = make_context(clock=self.clock)
        self.factory = HttpFactory(self.ctx)
        self.client = Client(self.factory)

    def test_dribbled_head(self) -> None:
        """The probe: a byte every 20 s outlived C{idle_timeout} (60 s); now
        the connection gets a 408 problem at 10 s and is closed."""
        for byte in b"GET /":
            self.assertTrue(self.client.transport.connected)
            self.client.send(bytes([byte]))
            self.clock.advance(20)
            if not self.client.transport.connected:
                break
        self.assertLessEqual(self.clock.seconds(), 20)
        status, headers, body = split(self.client.response())
        self.assertEqual(status, 408)
        self.assertEqual(headers["connection"], "close")
        self.assertEqual(json.loads(body)["code"], "head-timeout")
        self.assertFalse(self.client.transport.connected)
        self.assertEqual(len(self.factory.connections), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_silent_partial_head(self) -> None:
        self.client.send(b"GET / HTTP/1.1\r\nHost: loc")
        self.clock.advance(9.9)
        self.assertTrue(self.client.transport.connected)
        self.clock.advance(0.1)
        self.assertEqual(split(self.client.response())[0], 408)
        self.assertFalse(self.client.transport.connected)

    def test_head_in_one_read_arms_nothing(self) -> None:
        before = len(self.clock.getDelayedCalls())
        self.client.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        self.assertEqual(split(self.client.response())[0], 200)
        self.assertEqual(len(self.clock.getDelayedCalls()), before)

    def test_in_time_and_kept_alive(self) -> None:
        """A head in pieces within the deadline is answered; the next one on
        the kept-alive connection gets its own deadline; a body is not a head
        (C{http_api.upload_timeout} bounds it)."""
        self.client.send(b"GET / HTTP/1.1\r\n")
        self.clock.advance(9)
        self.client.send(b"Host: localhost\r\n\r\n")
        self.assertEqual(split(self.client.response())[0], 200)
        self.clock.advance(9)
        self.client.send(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 4\r\n\r\n{")
        self.clock.advance(15)
        self.client.send(b"}\r\n")
        self.assertEqual(split(self.client.response())[0], 405)
        self.assertTrue(self.client.transport.connected)
        self.client.send(b"GET / HT")
        self.clock.advance(10)
        self.assertEqual(split(self.client.response())[0], 408)
        self.assertFalse(self.client.transport.connected)

    def test_setting(self) -> None:
        ctx = make_context("[web]\nhead_timeout = 2.5", clock=self.clock)
        client = Client(HttpFactory(ctx))
        client.send(b"G")
        self.clock.advance(2.5)
        self.assertEqual(split(client.response())[0], 408)


class ConnectionTests(unittest.TestCase):
    """The listener's connections in the broker's registry."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.ctx = make_context(
            clock=self.clock,
            connections=ConnectionSettings(max_per_listener=2, max_per_address=2,
                                           handshake_timeout=5.0, close_grace=2.0),
        )
        self.factory = HttpFactory(self.ctx)
        self.registry = self.ctx.connections

    def test_counted(self) -> None:
        client = Client(self.factory)
        self.assertIsInstance(client.protocol, HttpConnection)
        self.assertEqual(list(self.factory.connections), [client.protocol])
        self.assertEqual(self.registry.count_address("127.0.0.1"), 1)
        client.transport.loseConnection()
        self.assertEqual(len(self.registry), 0)

    def test_capped(self) -> None:
        """Past a cap the client gets a 503 with a JSON body and is closed."""
        Client(self.factory)
        Client(self.factory, host="127.0.0.2")
        refused = Client(self.factory, host="127.0.0.3")
        self.assertIsInstance(refused.protocol, RefusedHttpProtocol)
        status, headers, body = split(refused.response())
        self.assertEqual(status, 503)
        self.assertEqual(json.loads(body)["code"], "too-many-connections")
        self.assertIn("max_per_listener", json.loads(body)["detail"])
        self.assertFalse(refused.transport.connected)
        self.assertEqual(len(self.registry), 2)
        self.assertEqual(self.registry.refused("http:test"), 1)

    def test_refusedAbortedAfterGrace(self) -> None:
        Client(self.factory)
        Client(self.factory)
        refused = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        transport = StringTransport()  # the client does not let go
        aborted = []
        transport.abortConnection = lambda: aborted.append(True)
        refused.makeConnection(transport)
        self.clock.advance(1.9)
        self.assertEqual(aborted, [])
        self.clock.advance(0.1)
        self.assertEqual(aborted, [True])

    def test_handshakeTimeout(self) -> None:
        """A TLS client that does not finish its handshake is aborted."""
        client = Client(self.factory, tls=True)
        aborted = []
        client.transport.abortConnection = lambda: aborted.append(True)
        self.clock.advance(4.9)
        self.assertEqual(aborted, [])
        self.clock.advance(0.2)
        self.assertEqual(aborted, [True])

    def test_handshakeCompleted(self) -> None:
        client = Client(self.factory, tls=True)
        client.transport.getPeerCertificate = lambda: None
        aborted = []
        client.transport.abortConnection = lambda: aborted.append(True)
        client.protocol.handshakeCompleted()
        self.clock.advance(10)
        self.assertEqual(aborted, [])
        self.assertIsNone(client.protocol.identity)

    def test_secureOnce(self) -> None:
        """A request knows it came over TLS from its connection (read once,
        not adapted a request): the guard takes the https origin of the
        broker's own name over TLS, and only there."""
        own = "Origin: https://127.0.0.1:8080\r\n"
        plain = Client(self.factory)
        self.assertIs(plain.protocol.secure, False)
        self.assertEqual(split(plain.request("GET", "/api/v1/vhosts", headers=own))[0], 403)
        tls = Client(self.factory, host="127.0.0.2", tls=True)
        self.assertIs(tls.protocol.secure, True)
        self.assertEqual(split(tls.request("GET", "/api/v1/vhosts", headers=own))[0], 200)
        self.assertEqual(
            split(tls.request("GET", "/api/v1/vhosts", headers="Origin: http://127.0.0.1:8080\r\n"))[0], 403
        )

    def test_setHostSecure(self) -> None:
        """C{setHost(..., ssl=True)} makes a request secure, as in Twisted."""
        seen = []

        class Probe(Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                before = request.isSecure()
                request.setHost(b"broker.example", 443, ssl=True)
                seen.append((before, request.isSecure(), request.getHeader(b"host")))
                return b"{}"

        self.factory.site.resource.putChild(b"probe", Probe())
        client = Client(self.factory)
        self.assertEqual(split(client.request("GET", "/probe"))[0], 200)
        self.assertEqual(seen, [(False, True, b"broker.example")])

    def test_shutdown(self) -> None:
        """A plain HTTP connection is closed at a shutdown; its timers stop."""
        client = Client(self.factory)
        d = self.registry.shutdown("bye", timeout=5.0)
        self.assertFalse(client.transport.connected)
        self.successResultOf(d)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_shutdownAbortsStraggler(self) -> None:
        client = Client(self.factory)
        aborted = []
        client.transport.loseConnection = lambda: None  # never goes
        client.transport.abortConnection = lambda: aborted.append(True)
        client.protocol.shutdown("bye")
        self.clock.advance(2.0)
        self.assertEqual(aborted, [True])


class ContextTests(unittest.TestCase):
    def test_fields(self) -> None:
        ctx = make_context()
        names = [f.name for f in dataclasses.fields(ctx)]
        self.assertEqual(names, ["broker", "clock", "settings", "connections", "listener", "portal",
                                 "on_stop", "guard"])
        self.assertIsNone(ctx.portal)
        self.assertIs(ctx.web, ctx.settings.section("web"))
