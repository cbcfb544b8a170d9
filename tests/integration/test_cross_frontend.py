"""One message model across every frontend: a message published through
each (STOMP over TCP, over WebSocket, over SockJS; HTTP JSON; HTTP Avro) is
received through each other with the same properties, application headers
and body, binary bodies too.

A real broker (the service, as ``twistd qmq`` builds it) listens on
127.0.0.1 for STOMP and HTTP; the clients are real sockets: raw STOMP
frames over TCP, autobahn's WebSocket client for STOMP over WebSocket and
over SockJS's WebSocket transport, treq for the API. Every case reads the
received message back into the model (properties, headers, body, priority,
expiry, persistence) and compares it with what was published. Every wait
has a deadline.

On d8fe3b8 this failed everywhere a protocol crossed: an HTTP message
reached STOMP without ``priority``, ``expires`` or ``persistent``, a STOMP
one showed ``persistent``, ``priority`` and ``content-type`` to HTTP as
application headers, and HTTP had no properties at all.
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pika
import treq
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import ClientCreator, Factory, Protocol
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

from qmq import config
from qmq.service import make_service
from qmq.stomp.encoding import HEADER_PROPERTIES
from qmq.stomp.frame import StompParser, encode_frame
from qmq.web.api import codec

TIMEOUT = 10.0
TTL = 600_000

PROPERTIES = {
    "content_type": "application/x-qmq-test",
    "content_encoding": "identity",
    "correlation_id": "corr-42",
    "reply_to": "/queue/replies",
    "message_id": "msg-7",
    "user_id": "tester",
    "app_id": "cross-frontend",
    "type": "order.created",
}
HEADERS = {"lang": "en", "x-trace": "a=b;c", "empty": ""}
BODIES = {"text": "h\u00e9llo, world".encode(), "binary": bytes(range(256)) * 2}
# STOMP headers that are the frame's or a delivery's, not the message's.
_DELIVERY_HEADERS = frozenset(
    ("destination", "message-id", "subscription", "ack", "content-length", "redelivered", "x-delivery-count")
)


def model_of_stomp(headers: dict[str, str], body: bytes) -> dict:
    """The model a STOMP receiver reads from a MESSAGE frame."""
    properties = {}
    app = {}
    for k, v in headers.items():
        if k in _DELIVERY_HEADERS or k in ("priority", "expires", "persistent"):
            continue
        if k in HEADER_PROPERTIES:
            properties[HEADER_PROPERTIES[k]] = v
        else:
            app[k] = v
    return {
        "properties": properties,
        "headers": app,
        "body": body,
        "priority": int(headers.get("priority", "0")),
        "expires": int(headers["expires"]) if "expires" in headers else None,
        "persistent": headers.get("persistent") == "true",
    }


class _Stomp:
    """A STOMP client over some carrier: frames out with C{send}, MESSAGE
    frames in by subscription."""

    def __init__(self) -> None:
        self.parser = StompParser()
        self.frames: list = []
        self.waiters: list = []

    def feed(self, data: bytes) -> None:
        self.frames.extend(self.parser.feed(data))
        for item in list(self.waiters):
            test, d = item
            found = [f for f in self.frames if test(f)]
            if found:
                self.waiters.remove(item)
                d.callback(found[0])

    def wait(self, test: Any) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.waiters.append((test, d))
        self.feed(b"")
        return d.addTimeout(TIMEOUT, reactor)

    @defer.inlineCallbacks
    def connect(self) -> Any:
        self.send(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}))
        yield self.wait(lambda f: f.command in ("CONNECTED", "ERROR"))

    @defer.inlineCallbacks
    def subscribe(self, queue: str) -> Any:
        self.send(encode_frame("SUBSCRIBE", {"id": queue, "destination": "/queue/" + queue, "receipt": "s-" + queue}))
        yield self.wait(lambda f: f.command == "RECEIPT" and f.headers.get("receipt-id") == "s-" + queue)

    @defer.inlineCallbacks
    def publish(self, queue: str, body: bytes) -> Any:
        headers = {"destination": "/queue/" + queue, "receipt": "p-" + queue, "priority": "5",
                   "ttl": str(TTL), "persistent": "true", **HEADERS}
        headers.update({k: PROPERTIES[p] for k, p in HEADER_PROPERTIES.items()})
        self.send(encode_frame("SEND", headers, body, "1.2"))
        yield self.wait(lambda f: f.command == "RECEIPT" and f.headers.get("receipt-id") == "p-" + queue)

    @defer.inlineCallbacks
    def receive(self, queue: str) -> Any:
        frame = yield self.wait(lambda f: f.command == "MESSAGE" and f.headers.get("subscription") == queue)
        return model_of_stomp(frame.headers, frame.body)


class _TcpProtocol(Protocol):
    def dataReceived(self, data: bytes) -> None:
        self.factory.client.feed(data)


class StompTcp(_Stomp):
    name = "stomp-tcp"
    binary = True

    def __init__(self, test: Any) -> None:
        super().__init__()
        self.test = test

    @defer.inlineCallbacks
    def start(self) -> Any:
        factory = Factory.forProtocol(_TcpProtocol)
        factory.client = self
        self.proto = yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.test.stomp_port).connect(factory)
        self.test.addCleanup(self.proto.transport.abortConnection)
        yield self.connect()

    def send(self, data: bytes) -> None:
        self.proto.transport.write(data)


class _WsProtocol(WebSocketClientProtocol):
    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.client.received(payload)

    def connectionLost(self, reason: Any) -> None:
        if self.closeHandshakeTimeoutCall is not None:  # autobahn leaves it running
            self.closeHandshakeTimeoutCall.cancel()
            self.closeHandshakeTimeoutCall = None
        super().connectionLost(reason)


class StompWebSocket(_Stomp):
    name = "stomp-ws"
    binary = True
    path = "/stomp"
    protocols = ["v12.stomp"]

    def __init__(self, test: Any) -> None:
        super().__init__()
        self.test = test

    @defer.inlineCallbacks
    def start(self) -> Any:
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{self.test.http_port}{self.path}",
                                         protocols=self.protocols)
        factory.protocol = _WsProtocol
        factory.opened = defer.Deferred()
        factory.client = self
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.test.http_port).connect(factory)
        self.ws = yield factory.opened.addTimeout(TIMEOUT, reactor)
        self.test.addCleanup(lambda: self.ws.transport.abortConnection())
        yield self.connect()

    def received(self, payload: bytes) -> None:
        self.feed(payload)

    def send(self, data: bytes) -> None:
        # A frame with a binary body goes in a binary message.
        try:
            data.decode()
            self.ws.sendMessage(data, isBinary=False)
        except UnicodeDecodeError:
            self.ws.sendMessage(data, isBinary=True)


class StompSockJS(StompWebSocket):
    """STOMP over SockJS's WebSocket transport: its messages are JSON text,
    so it carries text bodies only (a binary one is refused with ERROR
    "binary body", docs/browsers.rst): the binary cases leave it out."""

    name = "stomp-sockjs"
    binary = False
    protocols: list[str] = []

    @property
    def path(self) -> str:  # type: ignore[override]
        return f"/sockjs/000/{uuid.uuid4().hex}/websocket"

    def received(self, payload: bytes) -> None:
        text = payload.decode()
        if text.startswith("a"):
            for message in json.loads(text[1:]):
                self.feed(message.encode("utf-8"))

    def send(self, data: bytes) -> None:
        self.ws.sendMessage(json.dumps([data.decode()]).encode(), isBinary=False)


class HttpJson:
    name = "http-json"
    binary = True

    def __init__(self, test: Any) -> None:
        self.test = test

    def start(self) -> None:
        pass

    def subscribe(self, queue: str) -> None:
        pass

    @defer.inlineCallbacks
    def publish(self, queue: str, body: bytes) -> Any:
        doc = {"body": base64.b64encode(body).decode(), "encoding": "base64", "headers": HEADERS,
               "properties": PROPERTIES, "priority": 5, "ttl": TTL, "persistent": True}
        response = yield treq.post(f"{self.test.api}/queues/{queue}/messages", json.dumps(doc).encode(),
                                   headers={"Content-Type": "application/json"}, pool=self.test.pool,
                                   timeout=TIMEOUT)
        text = yield response.text()
        self.test.assertEqual(response.code, 201, text)

    @defer.inlineCallbacks
    def receive(self, queue: str) -> Any:
        response = yield treq.post(f"{self.test.api}/queues/{queue}/receive?wait=5", pool=self.test.pool,
                                   timeout=TIMEOUT)
        doc = yield response.json()
        [m] = doc["messages"]
        body = base64.b64decode(m["body"]) if m["encoding"] == "base64" else m["body"].encode()
        return {
            "properties": m["properties"],
            "headers": m["headers"],
            "body": body,
            "priority": m["priority"],
            "expires": round(m["expires"] * 1000) if m["expires"] else None,
            "persistent": m["persistent"],
        }


class HttpAvro(HttpJson):
    name = "http-avro"

    @defer.inlineCallbacks
    def publish(self, queue: str, body: bytes) -> Any:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, codec.schema("PublishMessage"), {
            "body": body, "headers": HEADERS, "properties": PROPERTIES, "priority": 5, "ttl": TTL,
            "persistent": True, "destination": None, "routing_key": None, "delay": None,
        })
        response = yield treq.post(f"{self.test.api}/queues/{queue}/messages", out.getvalue(),
                                   headers={"Content-Type": "avro/binary"}, pool=self.test.pool,
                                   timeout=TIMEOUT)
        text = yield response.text()
        self.test.assertEqual(response.code, 201, text)

    @defer.inlineCallbacks
    def receive(self, queue: str) -> Any:
        response = yield treq.post(f"{self.test.api}/queues/{queue}/receive?wait=5",
                                   headers={"Accept": "avro/binary"}, pool=self.test.pool, timeout=TIMEOUT)
        data = yield response.content()
        [m] = list(fastavro.reader(io.BytesIO(data)))
        return {
            "properties": m["properties"],
            "headers": m["headers"],
            "body": m["body"],
            "priority": m["priority"],
            "expires": int(m["expires"].timestamp() * 1000) if m["expires"] else None,
            "persistent": m["persistent"],
        }


class AmqpPika:
    """AMQP 0-9-1 through pika's Twisted adapter: a publish declares its
    queue (as a STOMP SEND names one into being) and waits for its
    confirm; AMQP's timestamp has whole seconds, so an expiry read back
    from it (timestamp + expiration) is up to a second early."""

    name = "amqp"
    binary = True

    def __init__(self, test: Any) -> None:
        self.test = test
        self.queues: dict[str, Any] = {}

    @defer.inlineCallbacks
    def start(self) -> Any:
        params = pika.ConnectionParameters("127.0.0.1", self.test.amqp_port)
        cc = ClientCreator(reactor, TwistedProtocolConnection, params)
        self.proto = yield cc.connectTCP("127.0.0.1", self.test.amqp_port, timeout=TIMEOUT)
        self.test.addCleanup(lambda: self.proto.transport.abortConnection())
        yield self.proto.ready.addTimeout(TIMEOUT, reactor)
        self.channel = yield self.proto.channel()
        yield self.channel.confirm_delivery()

    @defer.inlineCallbacks
    def subscribe(self, queue: str) -> Any:
        yield self.channel.queue_declare(queue=queue)
        self.queues[queue], _tag = yield self.channel.basic_consume(queue=queue, auto_ack=True)

    @defer.inlineCallbacks
    def publish(self, queue: str, body: bytes) -> Any:
        yield self.channel.queue_declare(queue=queue)
        properties = pika.BasicProperties(
            headers=HEADERS, priority=5, expiration=str(TTL), delivery_mode=2,
            **PROPERTIES,
        )
        yield self.channel.basic_publish("", queue, body, properties)

    @defer.inlineCallbacks
    def receive(self, queue: str) -> Any:
        _ch, _method, p, body = yield self.queues[queue].get().addTimeout(TIMEOUT, reactor)
        properties = {k: getattr(p, k) for k in PROPERTIES if getattr(p, k) is not None}
        return {
            "properties": properties,
            "headers": p.headers or {},
            "body": body,
            "priority": p.priority or 0,
            "expires": p.timestamp * 1000 + int(p.expiration) if p.expiration else None,
            "persistent": p.delivery_mode == 2,
        }


FRONTENDS = (StompTcp, StompWebSocket, StompSockJS, HttpJson, HttpAvro, AmqpPika)


class CrossFrontendTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        settings = config.load_string(
            'listen = ["stomp:tcp:0:interface=127.0.0.1", "http:tcp:0:interface=127.0.0.1",'
            ' "amqp:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(Path(self.mktemp())))}\n"
            "[connections]\nclose_grace = 1.0\n"
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.stop)
        stomp_listener, http_listener, amqp_listener = self.service.listeners  # in the order of listen
        self.amqp_port = amqp_listener.port.getHost().port
        self.stomp_port = stomp_listener.port.getHost().port
        self.http_port = http_listener.port.getHost().port
        self.api = f"http://127.0.0.1:{self.http_port}/api/v1/vhosts/%2F"
        self.pool = HTTPConnectionPool(reactor, persistent=True)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        yield self.pool.closeCachedConnections()
        yield self.service.stopService()
        for vhost in self.service.broker.vhosts.values():
            if vhost.expiry is not None:
                vhost.expiry.stop()

    @defer.inlineCallbacks
    def test_every_frontend_to_every_other(self) -> Any:
        clients = {}
        for cls in FRONTENDS:
            client = clients[cls.name] = cls(self)
            yield client.start()
        checked = []
        for kind, body in BODIES.items():
            for publisher in clients.values():
                for receiver in clients.values():
                    if kind == "binary" and not (publisher.binary and receiver.binary):
                        continue  # SockJS carries text only (see StompSockJS)
                    queue = f"x.{publisher.name}.{receiver.name}.{kind}"
                    yield receiver.subscribe(queue)
                    before = time.time()
                    yield publisher.publish(queue, body)
                    after = time.time()
                    got = yield receiver.receive(queue)
                    case = f"{publisher.name} -> {receiver.name}, {kind} body"
                    expires = got.pop("expires")
                    self.assertEqual(got, {"properties": PROPERTIES, "headers": HEADERS, "body": body,
                                           "priority": 5, "persistent": True}, case)
                    # The TTL counts from the publish, on the broker's clock.
                    self.assertIsNotNone(expires, case)
                    early = 1000 if receiver.name == "amqp" else 1  # whole seconds (see AmqpPika)
                    self.assertTrue(before * 1000 + TTL - early <= expires <= after * 1000 + TTL + 1, case)
                    checked.append(case)
        self.assertEqual(len(checked), 36 + 25)

    @defer.inlineCallbacks
    def test_typed_headers(self) -> Any:
        """Typed application headers published over HTTP JSON come back
        typed over HTTP JSON, Avro and AMQP, and as text over STOMP."""
        typed = {"n": None, "t": True, "i": -7, "d": 2.5, "s": "x", "b": {"base64": "AP8="}}
        stomp = StompTcp(self)
        yield stomp.start()
        for queue in ("typed.json", "typed.avro", "typed.stomp"):
            yield stomp.subscribe(queue) if queue == "typed.stomp" else None
            response = yield treq.post(f"{self.api}/queues/{queue}/messages",
                                       json.dumps({"body": "x", "headers": typed}).encode(),
                                       headers={"Content-Type": "application/json"}, pool=self.pool,
                                       timeout=TIMEOUT)
            self.assertEqual(response.code, 201, (yield response.text()))
        got = yield HttpJson(self).receive("typed.json")
        self.assertEqual(got["headers"], typed)
        got = yield HttpAvro(self).receive("typed.avro")
        self.assertEqual(got["headers"], {**typed, "b": b"\x00\xff"})
        got = yield stomp.receive("typed.stomp")
        self.assertEqual(got["headers"], {"n": "", "t": "true", "i": "-7", "d": "2.5", "s": "x", "b": "AP8="})
        # AMQP's field table has every type: they arrive typed. (pika 1.3
        # decodes a float, 'f' or 'd', into an integer: the double on the
        # wire is checked in tests/test_amqp_session.py.)
        amqp = AmqpPika(self)
        yield amqp.start()
        yield amqp.subscribe("typed.amqp")
        response = yield treq.post(f"{self.api}/queues/typed.amqp/messages",
                                   json.dumps({"body": "x", "headers": typed}).encode(),
                                   headers={"Content-Type": "application/json"}, pool=self.pool, timeout=TIMEOUT)
        self.assertEqual(response.code, 201, (yield response.text()))
        got = yield amqp.receive("typed.amqp")
        expected = {**typed, "b": b"\x00\xff"}
        del expected["d"]
        self.assertEqual(got["headers"].pop("d"), 2)  # 2.5, as pika reads a float
        self.assertEqual(got["headers"], expected)
