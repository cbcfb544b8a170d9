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
from twisted.web.http_headers import Headers
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel
from zope.interface.verify import verifyObject

from qmq import twisted_internals
from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from qmq.transport import IConnection, ITransport
from qmq.twisted_internals import (
    AUTOBAHN_CLOSE_TIMER,
    AUTOBAHN_FEED,
    AUTOBAHN_PARSER_FIELDS,
    AUTOBAHN_TIMER,
    ClockTimer,
    cancel_close_timer,
    header_table,
    request_disconnected,
    websocket_clock,
    websocket_feed,
    websocket_state,
)

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


def _websocket(test: SynchronousTestCase) -> Any:
    """A STOMP WebSocket client connected to a site on a fake clock."""
    from twisted.internet.testing import MemoryReactorClock  # noqa: PLC0415

    from qmq.web.site import HttpFactory  # noqa: PLC0415
    from tests.test_web_site import make_context  # noqa: PLC0415
    from tests.test_web_websocket import CONNECT, WSClient  # noqa: PLC0415

    test.clock = MemoryReactorClock()
    ctx = make_context("[web]\nping_interval = 0", clock=test.clock)
    client = WSClient(HttpFactory(ctx))
    test.assertEqual(client.status, 101, client.head)
    client.send(CONNECT)
    client.messages()
    return client


class WebSocketStateTests(SynchronousTestCase):
    def test_pinned(self) -> None:
        """autobahn still keeps the parser and connection state QMQ reads,
        with the meaning it reads it with."""
        from tests.test_web_websocket import client_frame  # noqa: PLC0415

        client = _websocket(self)
        ws = client.ws
        for name in AUTOBAHN_PARSER_FIELDS:
            self.assertTrue(hasattr(ws, name), name)
        state = ws._ws
        self.assertTrue(state.complete)
        self.assertTrue(state.is_open())
        self.assertTrue(state.between_messages())
        # A message begun in a fragment: autobahn is inside it.
        client.send_raw(client_frame(b"SEND\ndestination:/qu", 1, fin=False))
        self.assertTrue(ws.inside_message)
        self.assertFalse(state.between_messages())
        # Its last frame cut by the end of a read: autobahn holds the bytes.
        last = client_frame(b"eue/q\n\nhi\x00", 0, fin=True)
        client.send_raw(last[:3])
        self.assertTrue(ws.data or ws.current_frame is not None)
        self.assertFalse(state.between_messages())
        client.send_raw(last[3:])
        self.assertTrue(state.between_messages())
        ws.close("bye")
        self.assertFalse(state.is_open())
        self.assertFalse(state.between_messages())

    def test_fallback(self) -> None:
        """Without the fields, autobahn parses every read and the
        transport's own closing flag says whether it is open."""

        class Changed:
            pass

        twisted_internals._warned.discard("websocket_state")
        state = websocket_state(Changed())
        self.assertFalse(state.complete)
        self.assertFalse(state.between_messages())
        self.assertTrue(state.is_open())
        state.closing = True
        self.assertFalse(state.is_open())


class WebSocketTimerTests(SynchronousTestCase):
    def test_clock_pinned(self) -> None:
        """autobahn's factory still schedules its protocols' timers through
        its private timer field, which QMQ points at its clock."""
        from autobahn.twisted.websocket import WebSocketServerFactory  # noqa: PLC0415

        factory = WebSocketServerFactory()
        self.assertTrue(hasattr(factory, AUTOBAHN_TIMER))
        clock = Clock()
        self.assertTrue(websocket_clock(factory, clock))
        timer = getattr(factory, AUTOBAHN_TIMER)
        self.assertIsInstance(timer, ClockTimer)
        fired: list[int] = []
        timer.call_later(5, fired.append, 1)
        clock.advance(5)
        self.assertEqual(fired, [1])

    def test_clock_fallback(self) -> None:
        twisted_internals._warned.discard("websocket_clock")
        self.assertFalse(websocket_clock(object(), Clock()))

    def test_close_timer_pinned(self) -> None:
        """An open autobahn protocol keeps its close-handshake timer in the
        field QMQ cancels; the site's protocols' timers run on its clock."""
        client = _websocket(self)
        ws = client.ws
        self.assertTrue(hasattr(ws, AUTOBAHN_CLOSE_TIMER))
        self.assertIsInstance(getattr(ws.factory, AUTOBAHN_TIMER), ClockTimer)
        fired: list[int] = []
        call = self.clock.callLater(10, fired.append, 1)
        setattr(ws, AUTOBAHN_CLOSE_TIMER, call)
        cancel_close_timer(ws)
        self.assertIsNone(getattr(ws, AUTOBAHN_CLOSE_TIMER))
        self.clock.advance(10)
        self.assertEqual(fired, [])

    def test_close_timer_fallback(self) -> None:
        class Changed:
            pass

        twisted_internals._warned.discard("cancel_close_timer")
        cancel_close_timer(Changed())  # nothing to cancel, no error


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
    # A private name a module defines: self._x = / self._x: , def _x, or a
    # class-level _x = / _x: .
    DEFINED = re.compile(r"(?:\bself\.(_[a-z]\w*)\s*[:=](?!=)|\bdef (_[a-z]\w*)|^\s+(_[a-z]\w*)\s*[:=](?!=))", re.M)

    def test_frontends(self) -> None:
        # Every frontend and what sits beside them (a frontend package
        # added later, amqp or cluster, is read as soon as it exists).
        packages = ("web", "stomp", "auth", "spark", "cluster", "amqp")
        files = sorted(
            [*(p for name in packages for p in (ROOT / "qmq" / name).rglob("*.py"))]
            + [ROOT / "qmq" / name for name in ("service.py", "connections.py", "tls.py", "tap.py")]
        )
        found = []
        for path in files:
            text = path.read_text()
            # A module's own private names (its classes' fields and
            # methods) are its to share between its classes.
            own = {n for names in self.DEFINED.findall(text) for n in names if n}
            for number, line in enumerate(text.splitlines(), 1):
                code = line.split("#", 1)[0]
                if "L{" in code or code.strip().startswith(('"', "'")):
                    continue
                for m in self.FOREIGN.finditer(code):
                    if m.group(1).startswith("self.") and m.group(1).count(".") == 0:
                        continue
                    if m.group(2) in own:
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)}")
        self.assertEqual(found, [])

    def test_no_private_imports(self) -> None:
        """No frontend imports a private name of the core, the store,
        Twisted or autobahn (AMQP once imported STOMP's protocol's _abort:
        what both need is public in qmq.stream now)."""
        import ast  # noqa: PLC0415

        packages = ("web", "stomp", "auth", "spark", "cluster", "amqp")
        files = sorted(
            [*(p for name in packages for p in (ROOT / "qmq" / name).rglob("*.py"))]
            + [ROOT / "qmq" / name for name in ("service.py", "connections.py", "tls.py", "stream.py")]
        )
        guarded = ("qmq.core", "qmq.store", "qmq.stomp", "qmq.amqp", "qmq.web", "twisted", "autobahn")
        found = []
        for path in files:
            package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:2])
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.module is None:
                    continue
                if not node.module.startswith(guarded) or node.module.startswith(package):
                    continue
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
        self.assertEqual(found, [])

    def test_module_privates_only(self) -> None:
        """What the module's own exemption lets through is what it defines."""
        text = "self._a = 1\n    def _b(self):\n    _c: int = 0\n    if x._d == 1:\n"
        own = {n for names in self.DEFINED.findall(text) for n in names if n}
        self.assertEqual(own, {"_a", "_b", "_c"})
        self.assertEqual([m.group(2) for m in self.FOREIGN.finditer("x.transport._tempDataLen")],
                         ["_tempDataLen"])


def _library_privates(cls: type) -> set[str]:
    """The private names a library base of C{cls} (Twisted, autobahn) has
    on its class or sets on a new instance, less those C{cls}'s own QMQ
    classes define at class level (a method or attribute of their own)."""
    from autobahn.twisted.websocket import WebSocketServerFactory  # noqa: PLC0415
    from twisted.internet.protocol import Factory, Protocol  # noqa: PLC0415
    from twisted.web.http import HTTPChannel, HTTPFactory  # noqa: PLC0415
    from twisted.web.resource import Resource  # noqa: PLC0415

    instances = {
        WebSocketServerFactory: WebSocketServerFactory,
        WebSocketServerProtocol: WebSocketServerProtocol,
        Protocol: Protocol,
        Factory: Factory,
        HTTPChannel: HTTPChannel,
        HTTPFactory: HTTPFactory,
        Resource: Resource,
    }
    names: set[str] = set()
    ours: set[str] = set()
    for base in cls.__mro__:
        if base is object:
            continue
        if base.__module__.startswith("qmq"):
            ours.update(vars(base))
            continue
        names.update(vars(base))
        make = instances.get(base)
        if make is not None:
            names.update(vars(make()))
    return {n for n in names - ours if n.startswith("_") and not n.startswith("__")}


class LibraryPrivateTests(SynchronousTestCase):
    """A frontend class that subclasses a Twisted or autobahn class touches
    none of its base's private names (C{self._name}) nor the autobahn state
    L{qmq.twisted_internals} reads for it: only that module does."""

    def test_subclasses(self) -> None:
        import ast  # noqa: PLC0415
        import importlib  # noqa: PLC0415

        from autobahn.websocket.protocol import WebSocketProtocol  # noqa: PLC0415

        autobahn_state = {*AUTOBAHN_PARSER_FIELDS, AUTOBAHN_CLOSE_TIMER, AUTOBAHN_FEED, AUTOBAHN_TIMER}
        files = sorted([*(ROOT / "qmq" / "web").rglob("*.py"), *(ROOT / "qmq" / "stomp").rglob("*.py")])
        found = []
        checked = 0
        for path in files:
            module = importlib.import_module(
                ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            )
            for node in ast.parse(path.read_text()).body:
                if not isinstance(node, ast.ClassDef):
                    continue
                cls = getattr(module, node.name, None)
                if not isinstance(cls, type):
                    continue
                forbidden = _library_privates(cls)
                if issubclass(cls, WebSocketProtocol):
                    forbidden |= autobahn_state
                if not forbidden:
                    continue
                checked += 1
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                        and sub.attr in forbidden
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{sub.lineno}: self.{sub.attr}")
        self.assertGreater(checked, 5)
        self.assertEqual(found, [])

    def test_catches_a_reach(self) -> None:
        """The names it forbids include what websocket.py once read."""
        from qmq.web.websocket import StompWebSocketFactory, StompWebSocketProtocol  # noqa: PLC0415

        self.assertIn(AUTOBAHN_TIMER, _library_privates(StompWebSocketFactory))
        self.assertNotIn("_cut", _library_privates(StompWebSocketProtocol))


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


class HeaderTableTests(SynchronousTestCase):
    def test_pinned(self) -> None:
        """twisted.web's Headers keeps its values in _rawHeaders, a dict by
        canonical name: what the guard and the API's content type read."""
        headers = Headers()
        headers.addRawHeader(b"host", b"a")
        headers.addRawHeader(b"CONTENT-TYPE", b"application/json")
        headers.addRawHeader(b"origin", b"http://x")
        headers.addRawHeader(b"Origin", b"http://y")
        table = header_table(headers)
        self.assertEqual(
            (table[b"Host"], table[b"Content-Type"], table[b"Origin"]),
            ([b"a"], [b"application/json"], [b"http://x", b"http://y"]),
        )
        self.assertEqual(table, {k: list(v) for k, v in headers.getAllRawHeaders()})
        self.assertIsNone(table.get(b"Accept"))

    def test_fallback(self) -> None:
        """Without the dict, the guard and the API ask getRawHeaders."""
        from qmq.web.api.params import _content_type  # noqa: PLC0415
        from qmq.web.guard import Guard, HostRule  # noqa: PLC0415

        class Changed:
            def __init__(self, **values: bytes) -> None:
                self.values = {k.replace("_", "-").encode(): [v] for k, v in values.items()}

            def getRawHeaders(self, name: bytes, default: Any = None) -> Any:
                return self.values.get(name.lower(), default)

        twisted_internals._warned.discard("header_table")
        self.assertIsNone(header_table(Changed()))
        guard = Guard(HostRule.for_listener(()))
        ok = Changed(host=b"localhost", content_type=b"application/json")
        self.assertIsNone(guard.check(b"POST", b"/api/v1/x", ok, 2))
        refused = guard.check(b"POST", b"/api/v1/x", Changed(host=b"evil.example"), 0)
        self.assertEqual(refused.status, 421)
        refused = guard.check(b"POST", b"/api/v1/x", Changed(host=b"localhost", content_type=b"text/plain"), 2)
        self.assertEqual(refused.status, 415)

        class Request:
            requestHeaders = Changed(content_type=b"Application/JSON; charset=utf-8")

        self.assertEqual(_content_type(Request()), "application/json")


class DeferredUnobservedTests(SynchronousTestCase):
    def test_pinned(self) -> None:
        """Deferred still keeps its callbacks in the private list read."""
        from twisted.internet.defer import Deferred  # noqa: PLC0415

        from qmq.twisted_internals import DEFERRED_CALLBACKS, deferred_unobserved  # noqa: PLC0415

        self.assertIsInstance(getattr(Deferred(), DEFERRED_CALLBACKS), list)
        table = {1: Deferred(), 2: Deferred(), 3: Deferred()}
        held = table[2]
        table[3].addCallback(lambda _: None)
        d = table.pop(1)
        self.assertTrue(deferred_unobserved(d))
        d = table.pop(2)
        self.assertFalse(deferred_unobserved(d))  # the test holds it too
        d = table.pop(3)
        self.assertFalse(deferred_unobserved(d))  # it has a callback
        del held

    def test_fallback(self) -> None:
        """Without the field every Deferred counts as observed (fired)."""
        from twisted.internet.defer import Deferred  # noqa: PLC0415

        self.patch(twisted_internals, "DEFERRED_CALLBACKS", "_gone")
        d = {1: Deferred()}.pop(1)
        self.assertFalse(twisted_internals.deferred_unobserved(d))
        twisted_internals._warned.discard("deferred_unobserved")
