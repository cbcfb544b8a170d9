"""SockJS over real sockets: the WebSocket transports and a live HTTP stream.

A broker's SockJS resource and the protocol's test services on a
twisted.web Site on 127.0.0.1, and autobahn's Twisted WebSocket client: the
checks of the sockjs-protocol suite that need a real upgrade (Websocket,
RawWebsocket), STOMP over the SockJS WebSocket, and a STOMP session over
xhr-streaming read with twisted.web's Agent. Every wait has a deadline.
"""

from __future__ import annotations

import json
import uuid
from io import BytesIO
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.trial import unittest
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Site

from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.stomp.frame import StompParser, encode_frame
from qmq.stomp.settings import StompSettings
from qmq.web.sockjs.services import build_test_services
from qmq.web.sockjs.settings import SockJSSettings
from qmq.web.sockjs.stomp import stomp_sockjs_resource

WAIT = 10.0
CLOSED = object()


class _Client(WebSocketClientProtocol):
    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.received.put(payload.decode())

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        self.factory.closed_with = (code, reason)
        self.factory.received.put(CLOSED)
        if not self.factory.opened.called:
            self.factory.opened.errback(RuntimeError(f"not opened: {code} {reason}"))


class WebSocketClient:
    def __init__(self, url: str) -> None:
        self.factory = WebSocketClientFactory(url)
        self.factory.protocol = _Client
        self.factory.opened = defer.Deferred()
        self.factory.received = defer.DeferredQueue()

    async def connect(self, port: int) -> WebSocketClient:
        reactor.connectTCP("127.0.0.1", port, self.factory)
        self.proto = await self.factory.opened.addTimeout(WAIT, reactor)
        return self

    async def recv(self) -> Any:
        return await self.factory.received.get().addTimeout(WAIT, reactor)

    def send(self, text: str) -> None:
        self.proto.sendMessage(text.encode(), False)

    def close(self) -> None:
        self.proto.sendClose(1000)

    @property
    def closed_with(self) -> tuple[Any, Any]:
        """The server's close code and reason."""
        return self.factory.closed_with


class SockJSOverSockets(unittest.TestCase):
    def setUp(self) -> None:
        self.broker = Broker(clock=reactor)
        self.registry = ConnectionRegistry(clock=reactor)
        root = Resource()
        root.putChild(b"sockjs", stomp_sockjs_resource(
            self.broker, StompSettings(), SockJSSettings(), self.registry, "http", reactor))
        root.putChild(b"sockjs_test", build_test_services(clock=reactor))
        self.port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.base = f"ws://127.0.0.1:{self.port.getHost().port}"
        self.clients: list[WebSocketClient] = []

    async def ws(self, path: str) -> WebSocketClient:
        client = await WebSocketClient(self.base + path).connect(self.port.getHost().port)
        self.clients.append(client)
        return client

    def tearDown(self) -> Any:
        for c in self.clients:
            if c.proto.transport is not None and c.proto.transport.connected:
                c.proto.transport.abortConnection()
        # Sessions of the HTTP test end; their timers with them.
        for child in (self.port.factory.resource.children[b"sockjs"],):
            child.service.close_all()

    # WebsocketHybi10
    async def test_transport(self) -> None:
        ws = await self.ws(f"/sockjs_test/echo/000/{uuid.uuid4()}/websocket")
        self.assertEqual(await ws.recv(), "o")
        ws.send("")  # ignored
        ws.send('["a"]')
        self.assertEqual(await ws.recv(), 'a["a"]')
        ws.send('"b"')
        self.assertEqual(await ws.recv(), 'a["b"]')
        ws.close()
        self.assertIs(await ws.recv(), CLOSED)

    async def test_close(self) -> None:
        ws = await self.ws(f"/sockjs_test/close/000/{uuid.uuid4()}/websocket")
        self.assertEqual(await ws.recv(), "o")
        self.assertEqual(await ws.recv(), 'c[3000,"Go away!"]')
        self.assertIs(await ws.recv(), CLOSED)
        self.assertEqual(ws.closed_with, (3000, "Go away!"))

    async def test_empty_frame(self) -> None:
        """Empty messages and empty arrays are ignored."""
        ws = await self.ws(f"/sockjs_test/echo/000/{uuid.uuid4()}/websocket")
        self.assertEqual(await ws.recv(), "o")
        ws.send("")
        ws.send("[]")
        ws.send('["a"]')
        self.assertEqual(await ws.recv(), 'a["a"]')

    async def test_headersSanity(self) -> None:
        """A bare RFC 6455 upgrade (version 13, the old C{Sec-WebSocket-Origin}
        header and no C{Origin}) is answered 101 with the right accept key
        and no body length."""
        got = defer.Deferred()

        class Raw(Protocol):
            data = b""

            def dataReceived(self, data: bytes) -> None:
                self.data += data
                if b"\r\n\r\n" in self.data and not got.called:
                    got.callback(self.data.split(b"\r\n\r\n")[0])

        path = f"/sockjs_test/echo/000/{uuid.uuid4()}/websocket"
        proto = Raw()
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port),
                              proto)
        proto.transport.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Origin: http://asd\r\n"
            "Sec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n\r\n".encode())
        head = (await got.addTimeout(WAIT, reactor)).decode().lower()
        proto.transport.abortConnection()
        lines = head.split("\r\n")
        self.assertIn(" 101 ", lines[0] + " ")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        self.assertEqual(headers["sec-websocket-accept"], "HSmrc0sMlYUkAGmm5OPpG2HaGWk=".lower())
        self.assertEqual(headers["connection"], "upgrade")
        self.assertEqual(headers["upgrade"], "websocket")
        self.assertNotIn("content-length", headers)

    async def test_broken_json(self) -> None:
        ws = await self.ws(f"/sockjs_test/echo/000/{uuid.uuid4()}/websocket")
        self.assertEqual(await ws.recv(), "o")
        ws.send('["a')
        self.assertIs(await ws.recv(), CLOSED)
        self.assertEqual(ws.closed_with[0], 1006)  # no close handshake: abrupt, as the protocol asks

    async def test_reuseSessionId(self) -> None:
        url = f"/sockjs_test/echo/000/{uuid.uuid4()}/websocket"
        ws1, ws2 = await self.ws(url), await self.ws(url)
        self.assertEqual(await ws1.recv(), "o")
        self.assertEqual(await ws2.recv(), "o")
        ws1.send('["a"]')
        self.assertEqual(await ws1.recv(), 'a["a"]')
        ws2.send('["b"]')
        self.assertEqual(await ws2.recv(), 'a["b"]')
        ws1.close()
        ws2.close()
        self.assertIs(await ws1.recv(), CLOSED)
        self.assertIs(await ws2.recv(), CLOSED)
        # The id may be used again once they are closed.
        ws3 = await self.ws(url)
        self.assertEqual(await ws3.recv(), "o")
        ws3.send('["a"]')
        self.assertEqual(await ws3.recv(), 'a["a"]')

    # RawWebsocket
    async def test_raw_transport(self) -> None:
        ws = await self.ws("/sockjs_test/echo/websocket")
        ws.send("Hello world!\uffff")
        self.assertEqual(await ws.recv(), "Hello world!\uffff")

    async def test_raw_close(self) -> None:
        """The raw endpoint has no close frame: the session's code and
        reason are the WebSocket's close (issue 22: it closed 1000 "")."""
        ws = await self.ws("/sockjs_test/close/websocket")
        self.assertIs(await ws.recv(), CLOSED)
        self.assertEqual(ws.closed_with, (3000, "Go away!"))

    async def test_raw_stomp_error_close(self) -> None:
        """STOMP over the raw endpoint: an ERROR, then the WebSocket closes
        with 3000 and the error's message."""
        ws = await self.ws("/sockjs/websocket")
        ws.send(encode_frame("SEND", [("destination", "/queue/a")], b"x", "1.2").decode())
        self.assertTrue((await ws.recv()).startswith("ERROR\n"))
        self.assertIs(await ws.recv(), CLOSED)
        self.assertEqual(ws.closed_with, (3000, "not connected"))

    async def test_raw_refused_past_the_caps(self) -> None:
        """A WebSocket past the connection caps is closed with 3003 and the
        reason (it raised inside autobahn: 1013 is not a code it sends)."""
        self.registry = ConnectionRegistry(ConnectionSettings(max_per_address=1), clock=reactor)
        root = self.port.factory.resource
        root.putChild(b"capped", stomp_sockjs_resource(
            self.broker, StompSettings(), SockJSSettings(), self.registry, "http", reactor))
        first = await self.ws("/capped/websocket")
        second = await self.ws("/capped/websocket")
        self.assertIs(await second.recv(), CLOSED)
        self.assertEqual(second.closed_with[0], 3003)
        self.assertIn("max_per_address", second.closed_with[1])
        framed = await self.ws(f"/capped/000/{uuid.uuid4()}/websocket")
        self.assertTrue((await framed.recv()).startswith("c[3003,"))
        self.assertIs(await framed.recv(), CLOSED)
        self.assertEqual(framed.closed_with[0], 3003)
        first.close()
        self.assertIs(await first.recv(), CLOSED)

    # STOMP over the SockJS WebSocket
    async def test_stomp_over_websocket(self) -> None:
        ws = await self.ws(f"/sockjs/000/{uuid.uuid4()}/websocket")
        self.assertEqual(await ws.recv(), "o")
        parser = StompParser()

        def send(command: str, body: bytes = b"", **headers: str) -> None:
            ws.send(json.dumps([encode_frame(command, list(headers.items()), body, "1.2").decode()]))

        async def frames() -> list:
            while True:
                text = await ws.recv()
                if text.startswith("a"):
                    got = []
                    for m in json.loads(text[1:]):
                        got.extend(parser.feed(m.encode()))
                    if got:
                        return got

        send("CONNECT", **{"accept-version": "1.2", "host": "/"})
        self.assertEqual((await frames())[0].command, "CONNECTED")
        send("SUBSCRIBE", destination="/queue/ws", id="s1")
        send("SEND", b"hi", destination="/queue/ws")
        (message,) = await frames()
        self.assertEqual((message.command, message.body), ("MESSAGE", b"hi"))
        self.assertEqual(len(self.registry), 1)
        ws.close()
        self.assertIs(await ws.recv(), CLOSED)

    # STOMP over xhr-streaming, with a real HTTP client.
    async def test_stomp_over_xhr_streaming(self) -> None:
        port = self.port.getHost().port
        url = f"http://127.0.0.1:{port}/sockjs/000/{uuid.uuid4()}"
        agent = Agent(reactor)
        received: defer.DeferredQueue = defer.DeferredQueue()

        class Body(Protocol):
            def dataReceived(self, data: bytes) -> None:
                received.put(data)

        response = await agent.request(b"POST", (url + "/xhr_streaming").encode())
        self.assertEqual(response.code, 200)
        body = Body()
        response.deliverBody(body)
        self.addCleanup(lambda: body.transport.stopProducing())
        buffer = b""

        async def line() -> str:
            nonlocal buffer
            while b"\n" not in buffer:
                buffer += await received.get().addTimeout(WAIT, reactor)
            first, _, buffer = buffer.partition(b"\n")
            return first.decode()

        self.assertEqual(await line(), "h" * 2048)
        self.assertEqual(await line(), "o")

        async def send(command: str, body: bytes = b"", **headers: str) -> None:
            payload = json.dumps([encode_frame(command, list(headers.items()), body, "1.2").decode()])
            r = await agent.request(b"POST", (url + "/xhr_send").encode(), Headers(),
                                    FileBodyProducer(BytesIO(payload.encode())))
            await readBody(r)
            self.assertEqual(r.code, 204)

        await send("CONNECT", **{"accept-version": "1.2", "host": "/"})
        self.assertTrue((await line()).startswith('a["CONNECTED\\n'))
        await send("SUBSCRIBE", destination="/queue/stream", id="s1")
        await send("SEND", b"streamed", destination="/queue/stream")
        frame = await line()
        self.assertTrue(frame.startswith('a["MESSAGE\\n'), frame)
        self.assertIn("streamed", frame)
