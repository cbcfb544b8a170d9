"""Invalid names over every frontend, against a real broker on loopback.

One broker (C{make_service}, memory store) with a STOMP listener and an
C{http:} listener; clients: raw STOMP over TCP (bytes read as a client that
ends each frame at NUL reads them), STOMP over WebSocket and over SockJS's
WebSocket transport (autobahn), and the HTTP API (treq). The core's rule
(L{qmq.core.names}) gives one refusal, which each frontend carries: the body
of a STOMP ERROR, the C{detail} of an HTTP 400 problem (C{invalid-name}).
Every wait has a deadline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import treq
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, reactor
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

from qmq import config
from qmq.service import make_service
from qmq.stomp.frame import StompParser, encode_frame

TIMEOUT = 10.0

#: (STOMP frame that names the invalid thing, HTTP request naming the same,
#: the refusal both get).
CASES = [
    (
        ("SEND", {"destination": "/queue/a\nb"}),
        ("POST", "/queues/a%0Ab/messages", {"messages": [{"body": "x"}]}),
        "queue name contains a control character (U+000A)",
    ),
    (
        ("SEND", {"destination": "/topic/a\tb"}),
        ("POST", "/topics/a%09b/messages", {"messages": [{"body": "x"}]}),
        "routing key contains a control character (U+0009)",
    ),
    (
        ("SUBSCRIBE", {"destination": "/queue/" + "é" * 128, "id": "s"}),
        ("PUT", "/queues/" + quote("é" * 128), None),
        "queue name is 256 bytes long in UTF-8; the limit is 255",
    ),
    (
        ("SEND", {"destination": "/exchange/amq.direct/" + "k" * 256}),
        ("POST", "/exchanges/amq.direct/messages", {"messages": [{"body": "x", "routing_key": "k" * 256}]}),
        "routing key is 256 bytes long; the limit is 255",
    ),
    (
        ("SUBSCRIBE", {"destination": "/topic/a.\rb", "id": "s"}),
        ("POST", "/bindings", {"queue": "bound", "exchange": "amq.topic", "routing_key": "a.\rb"}),
        "binding key contains a control character (U+000D)",
    ),
]


class _Frames:
    """What a STOMP client read: frames, waited on with deadlines."""

    def __init__(self) -> None:
        self.parser = StompParser()
        self.parser.version = "1.2"
        self.frames: list = []
        self.waiters: list = []

    def feed(self, data: bytes) -> None:
        self.frames.extend(self.parser.feed(data))
        for item in list(self.waiters):
            if len(self.frames) >= item[0]:
                self.waiters.remove(item)
                item[1].callback(self.frames[: item[0]])

    def wait(self, count: int) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.waiters.append((count, d))
        self.feed(b"")
        return d.addTimeout(TIMEOUT, reactor)


class _Tcp(Protocol):
    def connectionMade(self) -> None:
        self.raw = b""
        self.received = _Frames()
        self.factory.made.callback(self)

    def dataReceived(self, data: bytes) -> None:
        self.raw += data
        self.received.feed(data)

    def send(self, frame: bytes) -> None:
        self.transport.write(frame)


class _Ws(WebSocketClientProtocol):
    def onOpen(self) -> None:
        self.received = _Frames()
        self.factory.made.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if not self.factory.sockjs:
            self.received.feed(payload)
        elif payload.startswith(b"a"):
            for text in json.loads(payload[1:]):
                self.received.feed(text.encode())

    def send(self, frame: bytes) -> None:
        if self.factory.sockjs:
            self.sendMessage(json.dumps([frame.decode()]).encode(), False)
        else:
            self.sendMessage(frame, False)


class NamesTests(unittest.TestCase):
    timeout = 60

    def setUp(self) -> None:
        settings = config.load_string(
            'listen = ["stomp:tcp:0:interface=127.0.0.1", "http:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(Path(self.mktemp())))}\n"
            'store = "memory"\n'
            "[stomp]\nheartbeat_send_ms = 0\nheartbeat_receive_ms = 0\n"
            "[connections]\nclose_grace = 1.0\n"
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.stop)
        self.stomp_port = self.service.listeners[0].port.getHost().port
        self.http_port = self.service.listeners[1].port.getHost().port
        self.base = f"http://127.0.0.1:{self.http_port}/api/v1/vhosts/%2F"
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.clients: list = []

    @defer.inlineCallbacks
    def stop(self) -> Any:
        for client in self.clients:
            if client.transport is not None:
                client.transport.abortConnection()
        yield self.pool.closeCachedConnections()
        yield self.service.stopService()

    @defer.inlineCallbacks
    def http(self, method: str, path: str, body: Any = None) -> Any:
        kw = {"json": body} if body is not None else {}
        response = yield treq.request(method, self.base + path, pool=self.pool, timeout=TIMEOUT, **kw)
        content = yield response.content()
        return response.code, json.loads(content)

    @defer.inlineCallbacks
    def stomp(self, transport: str) -> Any:
        """A connected STOMP 1.2 client over C{transport}."""
        if transport == "tcp":
            factory = ClientFactory.forProtocol(_Tcp)
            factory.made = defer.Deferred()
            reactor.connectTCP("127.0.0.1", self.stomp_port, factory)
        else:
            path = "/stomp" if transport == "websocket" else "/sockjs/000/names/websocket"
            factory = WebSocketClientFactory(
                f"ws://127.0.0.1:{self.http_port}{path}",
                protocols=["v12.stomp"] if transport == "websocket" else None,
            )
            factory.protocol = _Ws
            factory.sockjs = transport == "sockjs"
            factory.made = defer.Deferred()
            reactor.connectTCP("127.0.0.1", self.http_port, factory)
        client = yield factory.made.addTimeout(TIMEOUT, reactor)
        self.clients.append(client)
        client.send(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}))
        (connected,) = yield client.received.wait(1)
        self.assertEqual(connected.command, "CONNECTED")
        return client

    @defer.inlineCallbacks
    def test_same_refusal_everywhere(self) -> None:
        """Each invalid name gets the same refusal over STOMP (TCP,
        WebSocket, SockJS) and HTTP, and makes nothing."""
        code, _ = yield self.http("PUT", "/queues/bound")
        self.assertEqual(code, 201)
        for (command, headers), (method, path, body), refusal in CASES:
            for transport in ("tcp", "websocket", "sockjs"):
                client = yield self.stomp(transport)
                client.send(encode_frame(command, headers, b"x" if command == "SEND" else b"", "1.2"))
                frames = yield client.received.wait(2)
                error = frames[1]
                self.assertEqual(error.command, "ERROR", (transport, refusal))
                self.assertEqual(error.headers["message"], "invalid name")
                self.assertEqual(error.body.decode(), refusal, transport)
            code, problem = yield self.http(method, path, body)
            self.assertEqual((code, problem["code"], problem["detail"]), (400, "invalid-name", refusal), path)
        broker = self.service.broker
        self.assertEqual(set(broker.default_vhost.queues), {"bound"})

    @defer.inlineCallbacks
    def test_nul_over_http_forges_nothing(self) -> None:
        """The break: a NUL in a topic or routing key published over HTTP
        (and a queue named with one) is refused with 400; a STOMP subscriber
        that ends frames at NUL receives no forged frame, only what follows."""
        client = yield self.stomp("tcp")
        client.send(encode_frame("SUBSCRIBE", {"destination": "/topic/#", "id": "all", "receipt": "r"}))
        yield client.received.wait(2)
        # No line break in them: nothing to escape, so (before names.py)
        # the destination header went out holding the NUL as it was.
        forged = "x\x00forged"
        for path, body in [
            ("/topics/" + quote(forged, safe="") + "/messages", {"messages": [{"body": "b"}]}),
            ("/exchanges/amq.topic/messages", {"messages": [{"body": "b", "routing_key": forged}]}),
        ]:
            code, problem = yield self.http("POST", path, body)
            self.assertEqual((code, problem["code"]), (400, "invalid-name"), path)
            self.assertEqual(problem["detail"], "routing key contains a control character (U+0000)")
        code, problem = yield self.http("PUT", "/queues/a%00b")
        self.assertEqual((code, problem["detail"]), (400, "queue name contains a control character (U+0000)"))
        code, _ = yield self.http("POST", "/topics/after/messages", {"messages": [{"body": "after"}]})
        self.assertEqual(code, 201)
        frames = yield client.received.wait(3)
        self.assertEqual(frames[2].body, b"after")
        # Read as a client that ends frames at NUL: CONNECTED, RECEIPT, one MESSAGE.
        pieces = [p.lstrip(b"\n") for p in client.raw.split(b"\x00") if p.strip(b"\n")]
        self.assertEqual([p.split(b"\n", 1)[0] for p in pieces], [b"CONNECTED", b"RECEIPT", b"MESSAGE"])
        self.assertNotIn(b"forged", client.raw)
        self.assertNotIn("a\x00b", self.service.broker.default_vhost.queues)
