"""STOMP over WebSocket with autobahn's Python client against a real broker.

The broker runs in this process on trial's reactor, with an C{http:}
listener over TCP (C{ws://}) and over TLS (C{wss://}, a C{trustme} test
CA); the client is autobahn's Twisted WebSocket client on real sockets.
Every wait has a deadline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, reactor
from twisted.internet.endpoints import SSL4ClientEndpoint, TCP4ClientEndpoint, quoteStringArgument
from twisted.trial import unittest

from qmq import config
from qmq.service import make_service
from qmq.stomp.frame import StompParser
from tests.integration.certs import TestPKI

TIMEOUT = 10.0


class StompClient(WebSocketClientProtocol):
    """Collects the STOMP frames of a WebSocket; waits for them with deadlines."""

    def onConnect(self, response: Any) -> None:
        self.subprotocol = response.protocol
        self.parser = StompParser()
        self.frames: list = []
        self.waiters: list = []
        self.closed = defer.Deferred()
        self.close_info: tuple | None = None

    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.frames.extend(self.parser.feed(payload))
        self._check()

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_info = (wasClean, code, reason)

    def connectionLost(self, reason: Any) -> None:
        if self.closeHandshakeTimeoutCall is not None:  # autobahn leaves it running
            self.closeHandshakeTimeoutCall.cancel()
            self.closeHandshakeTimeoutCall = None
        super().connectionLost(reason)
        if not self.closed.called:
            self.closed.callback(self.close_info)

    def stomp(self, data: bytes) -> None:
        self.sendMessage(data, isBinary=False)

    def _check(self) -> None:
        for item in list(self.waiters):
            count, d = item
            if len(self.frames) >= count:
                self.waiters.remove(item)
                d.callback(self.frames[:count])

    def wait_frames(self, count: int) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.waiters.append((count, d))
        self._check()
        return d.addTimeout(TIMEOUT, reactor)


class WebSocketMixin:
    tls = False

    def setUp(self) -> None:
        pki = self.pki = TestPKI(self.mktemp())  # type: ignore[attr-defined]
        params = ":".join(
            f"{k}={quoteStringArgument(str(v))}"
            for k, v in (("privateKey", pki.server_key), ("certKey", pki.server_cert),
                         ("interface", "127.0.0.1"))
        )
        http = f"http:ssl:0:{params}" if self.tls else "http:tcp:0:interface=127.0.0.1"
        settings = config.load_string(
            f"listen = [{json.dumps(http)}]\n"
            f"data_dir = {json.dumps(str(Path(self.mktemp())))}\n"  # type: ignore[attr-defined]
            "[connections]\nclose_grace = 1.0\n"
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.stop)  # type: ignore[attr-defined]
        self.port = self.service.listeners[0].port.getHost().port
        self.clients: list[StompClient] = []

    @defer.inlineCallbacks
    def stop(self) -> Any:
        for client in self.clients:
            if client.transport is not None and client.transport.connected:
                client.transport.abortConnection()
        yield self.service.stopService()
        for vhost in self.service.broker.vhosts.values():
            if vhost.expiry is not None:
                vhost.expiry.stop()

    @defer.inlineCallbacks
    def connect(self, path: str = "/stomp", protocols: list[str] | None = None,
                stomp: bool = True) -> Any:
        scheme = "wss" if self.tls else "ws"
        factory = WebSocketClientFactory(
            f"{scheme}://127.0.0.1:{self.port}{path}",
            protocols=protocols if protocols is not None else ["v12.stomp"],
        )
        factory.protocol = StompClient
        factory.opened = defer.Deferred()
        if self.tls:
            endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", self.port,
                                          self.pki.client_options(hostname="127.0.0.1"))
        else:
            endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port)
        yield endpoint.connect(factory)
        client = yield factory.opened.addTimeout(TIMEOUT, reactor)
        self.clients.append(client)
        if stomp:
            client.stomp(b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\x00")
            [connected] = yield client.wait_frames(1)
            self.assertEqual(connected.command, "CONNECTED")  # type: ignore[attr-defined]
            client.frames.clear()
        return client

    @defer.inlineCallbacks
    def test_roundTrip(self) -> Any:
        """SEND and MESSAGE; several frames per message and a frame over two."""
        client = yield self.connect()
        self.assertEqual(client.subprotocol, "v12.stomp")  # type: ignore[attr-defined]
        client.stomp(b"SUBSCRIBE\nid:1\ndestination:/queue/ws\nreceipt:s\n\n\x00")
        yield client.wait_frames(1)
        client.stomp(b"SEND\ndestination:/queue/ws\n\none\x00SEND\ndestination:/queue/ws\n\ntw")
        client.sendMessage(b"o\x00", isBinary=True)
        frames = yield client.wait_frames(3)
        self.assertEqual([f.body for f in frames[1:]], [b"one", b"two"])  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_ws(self) -> Any:
        """/ws with no subprotocol works too."""
        client = yield self.connect(path="/ws", protocols=[])
        self.assertIsNone(client.subprotocol)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_disconnectCloses(self) -> Any:
        """DISCONNECT: RECEIPT, a clean WebSocket close, and the socket really closes."""
        client = yield self.connect()
        client.stomp(b"DISCONNECT\nreceipt:bye\n\n\x00")
        [receipt] = yield client.wait_frames(1)
        self.assertEqual(receipt.headers["receipt-id"], "bye")  # type: ignore[attr-defined]
        info = yield client.closed.addTimeout(TIMEOUT, reactor)
        self.assertEqual(info[:2], (True, 1000))  # type: ignore[attr-defined]
        self.assertEqual(len(self.service.connections), 0)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_errorCloses(self) -> Any:
        """A STOMP error: ERROR, then the WebSocket is closed with its message."""
        client = yield self.connect()
        client.stomp(b"NONSENSE\n\n\x00")
        [error] = yield client.wait_frames(1)
        self.assertEqual(error.command, "ERROR")  # type: ignore[attr-defined]
        info = yield client.closed.addTimeout(TIMEOUT, reactor)
        self.assertEqual(info, (True, 1000, "unknown command"))  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_slowReader(self) -> Any:
        """A client that stops reading pauses its deliveries, then gets them all."""
        reader = yield self.connect()
        reader.stomp(b"SUBSCRIBE\nid:1\ndestination:/topic/flood\nreceipt:s\n\n\x00")
        yield reader.wait_frames(1)
        reader.frames.clear()
        reader.transport.pauseProducing()  # stop reading: the broker's writes back up
        sender = yield self.connect()
        body = b"x" * 10_000
        count = 2_000
        for _ in range(count):
            sender.stomp(b"SEND\ndestination:/topic/flood\n\n" + body + b"\x00")
        sender.stomp(b"SEND\ndestination:/queue/done\nreceipt:sent\n\n\x00")
        yield sender.wait_frames(1)
        [conn] = [c for c in self.service.connections.connections() if c.wrappedProtocol.session
                  is not None and c.wrappedProtocol.session.subscriptions]
        session = conn.wrappedProtocol.session
        deadline = reactor.seconds() + TIMEOUT
        while not session.paused and reactor.seconds() < deadline:
            yield deferLater(0.05)
        self.assertTrue(session.paused)  # type: ignore[attr-defined]
        reader.transport.resumeProducing()
        frames = yield reader.wait_frames(count)
        self.assertEqual({len(f.body) for f in frames}, {10_000})  # type: ignore[attr-defined]
        self.assertFalse(session.paused)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_shutdown(self) -> Any:
        """A graceful shutdown sends ERROR broker shutting down, then closes."""
        client = yield self.connect()
        d = self.service.connections.shutdown("broker shutting down", timeout=5)
        [error] = yield client.wait_frames(1)
        self.assertEqual(error.headers["message"], "broker shutting down")  # type: ignore[attr-defined]
        yield client.closed.addTimeout(TIMEOUT, reactor)
        yield d


def deferLater(seconds: float) -> defer.Deferred:
    from twisted.internet import task  # noqa: PLC0415

    return task.deferLater(reactor, seconds, lambda: None)


class WSTests(WebSocketMixin, unittest.TestCase):
    """ws:// on a plain TCP listener."""


class WSSTests(WebSocketMixin, unittest.TestCase):
    """wss:// on a TLS listener: the same, and the closes are real over TLS too."""

    tls = True
