"""Pinning tests for L{qmq.twisted_internals}'s private names of Twisted and
autobahn (they fail when an upgrade moves them, and the fallbacks are
exercised), a grep that keeps every other private access out of the
frontends, and C{verifyObject} of the STOMP session's TCP transport (the
WebSocket and SockJS ones are verified in their own modules, on live
connections)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autobahn.twisted.websocket import WebSocketServerProtocol
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel
from zope.interface.verify import verifyObject

from qmq import twisted_internals
from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from qmq.transport import IConnection, ITransport
from qmq.twisted_internals import AUTOBAHN_FEED, request_disconnected, websocket_feed

ROOT = Path(__file__).resolve().parent.parent


class AutobahnFeedTests(SynchronousTestCase):
    def test_pinned(self) -> None:
        """autobahn still has the private parser entry QMQ feeds."""
        self.assertTrue(callable(getattr(WebSocketServerProtocol, AUTOBAHN_FEED, None)))
        protocol = WebSocketServerProtocol()
        self.assertEqual(websocket_feed(protocol), getattr(protocol, AUTOBAHN_FEED))

    def test_fallback(self) -> None:
        """Without it, the base class's public dataReceived is used."""
        fed: list[bytes] = []

        class Changed(WebSocketServerProtocol):
            def dataReceived(self, data: bytes) -> None:  # the subclass's own fast path
                raise AssertionError("not the fallback")

        protocol: Any = Changed()
        self.patch(twisted_internals, "AUTOBAHN_FEED", "_gone")
        self.patch(WebSocketServerProtocol, "dataReceived", lambda self, data: fed.append(data))
        twisted_internals._warned.discard("websocket_feed")
        websocket_feed(protocol)(b"x")
        self.assertEqual(fed, [b"x"])


class RequestDisconnectedTests(SynchronousTestCase):
    def test_pinned(self) -> None:
        """twisted.web's Request still keeps _disconnected, set when the
        client goes."""
        request = Request(DummyChannel())
        self.assertIs(request._disconnected, False)
        self.assertFalse(request_disconnected(request))
        request.connectionLost(Exception("gone"))
        self.assertTrue(request_disconnected(request))

    def test_fallback(self) -> None:
        class Changed:
            channel: Any = object()

        twisted_internals._warned.discard("request_disconnected")
        changed = Changed()
        self.assertFalse(request_disconnected(changed))
        changed.channel = None
        self.assertTrue(request_disconnected(changed))


class NoPrivateReachTests(SynchronousTestCase):
    """The frontends touch no private attribute of another object: only
    L{qmq.twisted_internals} does (for Twisted and autobahn), and the core
    offers public calls for what frontends need."""

    # obj._name where obj is not self, cls or super().
    FOREIGN = re.compile(r"(?<![\w.])(?!self\b|cls\b)([a-z_][\w]*(?:\.[a-z_]\w*)*)\.(_[a-z]\w*)")

    def test_frontends(self) -> None:
        files = sorted(
            [*(ROOT / "qmq" / "web").rglob("*.py"), *(ROOT / "qmq" / "stomp").rglob("*.py"),
             ROOT / "qmq" / "service.py"]
        )
        found = []
        for path in files:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if "L{" in code or code.strip().startswith(('"', "'")):
                    continue
                for m in self.FOREIGN.finditer(code):
                    if m.group(1).startswith("self.") and m.group(1).count(".") == 0:
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)}")
        self.assertEqual(found, [])


class ChannelSeamTests(SynchronousTestCase):
    """Frontends tag deliveries and hand out waiting messages through the
    channel's public calls (Channel.track, Channel.deliver_waiting), never
    by writing its counters or driving a queue themselves."""

    REACHING = re.compile(r"\.next_tag\s*=[^=]|\.owners\[|\bqueue\.drain\(\)|\bchannel\._ids\b")

    def test_frontends(self) -> None:
        files = sorted(
            [*(ROOT / "qmq" / "web").rglob("*.py"), *(ROOT / "qmq" / "stomp").rglob("*.py"),
             ROOT / "qmq" / "service.py"]
        )
        found = [
            f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in files
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if self.REACHING.search(line.split("#", 1)[0])
        ]
        self.assertEqual(found, [])


class StompTransportTests(SynchronousTestCase):
    def test_verify_tcp_transport(self) -> None:
        """The STOMP session's TCP (and TLS) transport honours ITransport
        and IConnection."""
        factory = StompFactory(Broker(Clock()), StompSettings(), clock=Clock())
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransportWithDisconnection()
        transport.protocol = protocol
        protocol.makeConnection(transport)
        self.addCleanup(protocol.connectionLost, None)
        self.assertTrue(verifyObject(ITransport, protocol))
        self.assertTrue(verifyObject(IConnection, protocol))
