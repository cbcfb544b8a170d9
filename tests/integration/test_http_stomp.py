"""Interop: publish over HTTP and consume over STOMP (stomp.py), and the
reverse, in JSON and in Avro; one broker, a STOMP listener and the API site
on 127.0.0.1. stomp.py runs in threads; every wait is bounded."""

from __future__ import annotations

import base64
import io
import threading

import fastavro
import stomp
import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from qmq.web.api import ApiResource, codec
from qmq.web.api.settings import ApiSettings
from tests.web_api_helpers import Ctx, validate

TIMEOUT = 10.0
BINARY = bytes(range(256)) * 3


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frames: list = []
        self.receipts: set = set()

    def on_message(self, frame) -> None:
        with self.cond:
            self.frames.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def wait(self, test, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(test, TIMEOUT):
                raise AssertionError(f"timed out waiting for {what}")


class InteropTests(unittest.TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.broker = Broker(reactor)
        settings = StompSettings(heartbeat_send_ms=0, heartbeat_receive_ms=0)
        self.stomp_port = reactor.listenTCP(0, StompFactory(self.broker, settings), interface="127.0.0.1")
        self.api = ApiResource(Ctx(self.broker, reactor), ApiSettings())
        root = Resource()
        root.putChild(b"api", self.api)
        self.http_port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
        self.base = f"http://127.0.0.1:{self.http_port.getHost().port}/api/v1/vhosts/%2F"
        self.pool = HTTPConnectionPool(reactor)
        self.conns: list = []
        self.addCleanup(self._stop)

    @defer.inlineCallbacks
    def _stop(self) -> defer.Deferred:
        for conn in self.conns:
            yield deferToThread(self._disconnect, conn)
        self.api.close()
        yield self.pool.closeCachedConnections()
        yield self.http_port.stopListening()
        yield self.stomp_port.stopListening()

    @staticmethod
    def _disconnect(conn) -> None:
        try:
            conn.disconnect()
        except Exception:
            pass
        try:
            conn.transport.disconnect_socket()
        except Exception:
            pass

    def stomp_client(self) -> tuple:
        conn = stomp.Connection12([("127.0.0.1", self.stomp_port.getHost().port)], auto_decode=False,
                                  reconnect_attempts_max=1)
        listener = Listener()
        conn.set_listener("l", listener)
        conn.connect(wait=True)
        self.conns.append(conn)
        return conn, listener

    @defer.inlineCallbacks
    def http(self, method: str, path: str, **kw) -> defer.Deferred:
        url = self.base + path
        response = yield treq.request(method, url, pool=self.pool, timeout=TIMEOUT, **kw)
        body = yield response.content()
        kind = (response.headers.getRawHeaders("content-type") or [""])[0]
        validate(method, url, response.code, kind, body)
        return response.code, kind, body

    def subscribe(self, destination: str) -> defer.Deferred:
        def go():
            conn, listener = self.stomp_client()
            conn.subscribe(destination, id="s1", ack="auto", receipt="sub")
            listener.wait(lambda: "sub" in listener.receipts, "the SUBSCRIBE receipt")
            return conn, listener

        return deferToThread(go)

    @defer.inlineCallbacks
    def test_http_json_to_stomp(self) -> None:
        conn, listener = yield self.subscribe("/queue/interop")
        code, _, _ = yield self.http("POST", "/queues/interop/messages", json={
            "messages": [{"body": "héllo", "headers": {"colour": "blue"}},
                         {"body": base64.b64encode(BINARY).decode(), "encoding": "base64"}]})
        self.assertEqual(code, 201)
        yield deferToThread(listener.wait, lambda: len(listener.frames) == 2, "two MESSAGEs")
        first, second = listener.frames
        self.assertEqual(first.body, "héllo".encode())
        self.assertEqual((first.headers["colour"], first.headers["destination"]), ("blue", "/queue/interop"))
        self.assertEqual(second.body, BINARY)

    @defer.inlineCallbacks
    def test_http_avro_to_stomp_topic(self) -> None:
        conn, listener = yield self.subscribe("/topic/sensors.*")
        out = io.BytesIO()
        records = [{"body": BINARY, "headers": {"n": str(i)}, "destination": None, "routing_key": None,
                    "priority": 0, "ttl": None, "delay": None, "persistent": False} for i in range(3)]
        fastavro.writer(out, codec.schema("PublishMessage"), records)
        code, _, _ = yield self.http("POST", "/topics/sensors.t1/messages", data=out.getvalue(),
                                     headers={"Content-Type": "avro/binary"})
        self.assertEqual(code, 201)
        yield deferToThread(listener.wait, lambda: len(listener.frames) == 3, "three MESSAGEs")
        self.assertEqual([f.body for f in listener.frames], [BINARY] * 3)
        self.assertEqual([f.headers["n"] for f in listener.frames], ["0", "1", "2"])
        self.assertEqual(listener.frames[0].headers["destination"], "/topic/sensors.t1")

    def stomp_send(self, destination: str, bodies: list, **headers) -> defer.Deferred:
        def go():
            conn, listener = self.stomp_client()
            for i, body in enumerate(bodies):
                conn.send(destination, body, receipt=f"r{i}", **headers)
            listener.wait(lambda: len(listener.receipts) == len(bodies), "the SEND receipts")

        return deferToThread(go)

    @defer.inlineCallbacks
    def test_stomp_to_http_json(self) -> None:
        yield self.stomp_send("/queue/back", [b"from stomp", BINARY], colour="red")
        code, _, body = yield self.http("POST", "/queues/back/receive?max=10")
        import json  # noqa: PLC0415

        doc = json.loads(body)
        m1, m2 = doc["messages"]
        self.assertEqual((m1["body"], m1["encoding"], m1["headers"]["colour"]), ("from stomp", "utf-8", "red"))
        self.assertEqual((m2["encoding"], base64.b64decode(m2["body"])), ("base64", BINARY))
        self.assertEqual(m1["destination"], "/queue/back")
        code, _, body = yield self.http("POST", "/queues/back/ack", json={"handles": [m1["handle"], m2["handle"]]})
        self.assertEqual(json.loads(body)["settled"], 2)
        self.assertEqual(len(self.broker.default_vhost.queues["back"]), 0)

    @defer.inlineCallbacks
    def test_stomp_to_http_avro(self) -> None:
        yield self.stomp_send("/queue/back", [BINARY, b"two"], colour="green")
        code, kind, body = yield self.http("POST", "/queues/back/receive?max=10",
                                           headers={"Accept": "avro/binary"})
        self.assertEqual(kind, "avro/binary")
        records = list(fastavro.reader(io.BytesIO(body)))
        self.assertEqual([r["body"] for r in records], [BINARY, b"two"])
        self.assertEqual(records[0]["headers"]["colour"], "green")
        self.assertEqual(records[0]["destination"], "/queue/back")
