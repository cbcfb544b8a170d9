"""Admission across frontends, with a real broker on 127.0.0.1: the memory
alarm (a fake RSS source) holds back STOMP over TCP (stomp.py), over
WebSocket and over SockJS's raw WebSocket (autobahn), and HTTP publishers
(503), while a consumer still drains; once it clears they resume. Every
wait has a deadline."""

from __future__ import annotations

import json
import threading
from typing import Any

import stomp
import treq
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

from qmq import config
from qmq.core.alarm import MemoryAlarm, MiB
from qmq.service import make_service
from tests.integration.test_websocket import StompClient

TIMEOUT = 10.0


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frames: list = []
        self.receipts: set = set()
        self.errors: list = []

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.frames.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def wait(self, test: Any, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(test, TIMEOUT):
                raise AssertionError(f"timed out waiting for {what}")


def _session(conn: Any) -> Any:
    session = getattr(conn, "session", None)
    if session is None:
        session = getattr(getattr(conn, "wrappedProtocol", None), "session", None)
    return session


class BrokerTestCase(unittest.TestCase):
    timeout = 60
    store = "memory"

    def setUp(self) -> None:
        self.data_dir = self.data_directory()
        settings = config.load_string(
            'listen = ["stomp:tcp:0:interface=127.0.0.1", "http:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(self.data_dir)}\n"
            f"store = {json.dumps(self.store)}\n"
            "[connections]\nclose_grace = 1.0\n" + self.more_config()
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.broker = self.service.broker
        self.stomp_port = self.service.listeners[0].port.getHost().port
        self.http_port = self.service.listeners[1].port.getHost().port
        self.pool = HTTPConnectionPool(reactor)
        self.conns: list = []
        self.ws: list = []
        self.addCleanup(self._stop)

    def data_directory(self) -> str:
        return self.mktemp()

    def more_config(self) -> str:
        return ""

    @defer.inlineCallbacks
    def _stop(self) -> Any:
        for conn in self.conns:
            yield deferToThread(self._disconnect, conn)
        for client in self.ws:
            if client.transport is not None and client.transport.connected:
                client.transport.abortConnection()
        yield self.pool.closeCachedConnections()
        yield self.service.stopService()
        for vhost in self.broker.vhosts.values():
            if vhost.expiry is not None:
                vhost.expiry.stop()

    @staticmethod
    def _disconnect(conn: Any) -> None:
        try:
            conn.disconnect()
        except Exception:
            pass
        try:
            conn.transport.disconnect_socket()
        except Exception:
            pass

    def stomp_client(self) -> defer.Deferred:
        def go() -> tuple:
            conn = stomp.Connection12([("127.0.0.1", self.stomp_port)], auto_decode=False,
                                      reconnect_attempts_max=1, heartbeats=(0, 0))
            listener = Listener()
            conn.set_listener("l", listener)
            conn.connect(wait=True)
            self.conns.append(conn)
            return conn, listener

        return deferToThread(go)

    @defer.inlineCallbacks
    def ws_client(self, path: str) -> Any:
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{self.http_port}{path}",
                                         protocols=["v12.stomp"] if path == "/stomp" else [])
        factory.protocol = StompClient
        factory.opened = defer.Deferred()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.http_port).connect(factory)
        client = yield factory.opened.addTimeout(TIMEOUT, reactor)
        self.ws.append(client)
        client.stomp(b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\x00")
        [connected] = yield client.wait_frames(1)
        self.assertEqual(connected.command, "CONNECTED")
        client.frames.clear()
        return client

    @defer.inlineCallbacks
    def http(self, method: str, path: str, **kw: Any) -> Any:
        url = f"http://127.0.0.1:{self.http_port}/api/v1{path}"
        response = yield treq.request(method, url, pool=self.pool, timeout=TIMEOUT, **kw)
        body = yield response.content()
        return response, (json.loads(body) if body else None)

    @defer.inlineCallbacks
    def until(self, test: Any, what: str) -> Any:
        deadline = reactor.seconds() + TIMEOUT
        while not test():
            if reactor.seconds() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            yield deferLater(reactor, 0.01, lambda: None)

    def blocked(self, protocol: str) -> list:
        """The STOMP sessions of C{protocol} whose reading is held back."""
        found = []
        for conn in list(self.service.connections.connections()):
            session = _session(conn)
            name = getattr(conn, "protocol_name", "stomp")  # STOMP over TCP has none
            if session is not None and name == protocol and session.reading_blocked:
                found.append(session)
        return found


class MemoryAlarmAcrossFrontends(BrokerTestCase):
    @defer.inlineCallbacks
    def test_every_publisher_held_consumers_drain(self) -> Any:
        rss = [0]
        alarm = MemoryAlarm(reactor, 100 * MiB, read_rss=lambda: rss[0], trim=None)
        self.broker.memory_alarm = alarm
        response, _ = yield self.http("POST", "/vhosts/%2F/queues/q/messages", json={
            "messages": [{"body": "one"}, {"body": "two"}, {"body": "three"}]})
        self.assertEqual(response.code, 201)
        tcp, tcp_l = yield self.stomp_client()
        ws = yield self.ws_client("/stomp")
        sockjs = yield self.ws_client("/sockjs/websocket")

        rss[0] = 200 * MiB
        alarm.check()

        # HTTP: 503, Retry-After, a problem document; nothing published.
        response, problem = yield self.http("POST", "/vhosts/%2F/queues/q/messages",
                                            json={"body": "held"})
        self.assertEqual(response.code, 503)
        self.assertEqual(response.headers.getRawHeaders("retry-after"), ["5"])
        self.assertEqual((problem["code"], problem["alarm"]), ("publishers-held", "memory"))
        self.assertIn("high-water mark", problem["detail"])
        self.assertEqual(len(self.broker.default_vhost.queues["q"]), 3)
        response, health = yield self.http("GET", "/health")
        self.assertEqual((response.code, health["status"]), (503, "failing"))
        self.assertEqual(health["checks"]["alarms"], {"ok": False, "alarms": ["memory"]})

        # STOMP over TCP, WebSocket and SockJS: the SEND read is taken,
        # then the connection is not read.
        yield deferToThread(tcp.send, "/queue/p", b"tcp-1", receipt="t1")
        yield deferToThread(tcp_l.wait, lambda: "t1" in tcp_l.receipts, "t1")
        yield self.until(lambda: self.blocked("stomp"), "the TCP publisher held back")
        for client, name in ((ws, "websocket"), (sockjs, "sockjs")):
            client.stomp(b"SEND\ndestination:/queue/p\nreceipt:%s-1\n\nx\x00" % name.encode())
            yield client.wait_frames(1)
            yield self.until(lambda n=name: self.blocked(n), f"the {name} publisher held back")
        held = len(self.broker.default_vhost.queues["p"])
        self.assertEqual(held, 3)
        # What they send now waits unread.
        yield deferToThread(tcp.send, "/queue/p", b"tcp-2", receipt="t2")
        for client, name in ((ws, "websocket"), (sockjs, "sockjs")):
            client.stomp(b"SEND\ndestination:/queue/p\nreceipt:%s-2\n\nx\x00" % name.encode())

        # A consumer drains meanwhile.
        consumer, c_l = yield self.stomp_client()
        yield deferToThread(consumer.subscribe, "/queue/q", "s", ack="auto")
        yield deferToThread(c_l.wait, lambda: len(c_l.frames) == 3, "the queue drained")
        self.assertEqual([f.body for f in c_l.frames], [b"one", b"two", b"three"])

        # Cleared: everyone resumes; what waited is read and published.
        rss[0] = 0
        alarm.check()
        yield deferToThread(tcp_l.wait, lambda: "t2" in tcp_l.receipts, "t2 after the alarm")
        for client, name in ((ws, "websocket"), (sockjs, "sockjs")):
            frames = yield client.wait_frames(2)
            receipt = frames[1]
            self.assertEqual(receipt.headers["receipt-id"], f"{name}-2")
        self.assertEqual(len(self.broker.default_vhost.queues["p"]), 6)
        response, _ = yield self.http("POST", "/vhosts/%2F/queues/q/messages", json={"body": "ok"})
        self.assertEqual(response.code, 201)
        response, health = yield self.http("GET", "/health")
        self.assertEqual((response.code, health["status"], health["checks"]["alarms"]["alarms"]), (200, "ok", []))
