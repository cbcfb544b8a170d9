"""Admission at the HTTP edge (no sockets): a publish is refused 503 before
its body is read while every publisher is held back, request bodies count
in the broker-wide budget for unfinished input, the API refuses held
publishes and answers a store failure without claiming anything was
published; and the pin of L{qmq.twisted_internals.request_line}."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport
from twisted.trial import unittest
from twisted.web import http

from qmq.twisted_internals import REQUEST_LINE_FIELDS, request_line
from qmq.web.api import is_publish
from qmq.web.site import HttpFactory
from tests.test_web_site import Client, make_context, split

PUBLISH = "/api/v1/vhosts/%2F/queues/q/messages"


class RequestLinePin(unittest.TestCase):
    """Fails when a Twisted upgrade stops keeping the request line on the
    channel until the body is in (then the site falls back to reading the
    body before the API refuses it)."""

    def test_head_before_body(self) -> None:
        seen: list[Any] = []

        class Probe(http.Request):
            def gotLength(self, length: int | None) -> None:
                seen.append(request_line(self))
                super().gotLength(length)

        channel = http.HTTPChannel()
        channel.requestFactory = Probe
        channel.makeConnection(StringTransport())
        channel.dataReceived(b"POST /api/v1/x?y=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n")
        self.assertEqual(seen, [(b"POST", b"/api/v1/x?y=1")])
        for name in REQUEST_LINE_FIELDS:
            self.assertTrue(hasattr(channel, name), name)
        channel.connectionLost(None)

    def test_fallback(self) -> None:
        class Bare:
            channel = object()

        self.assertIsNone(request_line(Bare()))


class IsPublishTests(unittest.TestCase):
    def test_routes(self) -> None:
        for path in (PUBLISH, "/api/v1/vhosts/v/messages", "/api/v1/vhosts/v/topics/a.b/messages?x",
                     "/api/v1/vhosts/v/exchanges/e/messages/"):
            self.assertTrue(is_publish(b"POST", path.encode()), path)
        for method, path in (("GET", PUBLISH), ("POST", "/api/v1/vhosts/v/queues/q/ack"),
                             ("POST", "/api/v1/vhosts"), ("POST", "/stomp"), ("POST", "/api/v2/x")):
            self.assertFalse(is_publish(method.encode(), path.encode()), path)


class SiteAdmissionTests(unittest.TestCase):
    def setUp(self) -> None:
        self.ctx = make_context()
        self.broker = self.ctx.broker
        self.factory = HttpFactory(self.ctx)

    def test_publish_refused_before_its_body(self) -> None:
        """Under the memory alarm the head of a publish is enough: 503,
        Retry-After, a problem document, the connection closed; nothing
        of the body is read or kept."""
        self.broker.admission.hold("memory", "memory alarm: 500 MiB above 400 MiB")
        client = Client(self.factory)
        client.send(f"POST {PUBLISH} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                    "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n".encode())
        status, headers, body = split(client.response())
        self.assertEqual(status, 503)
        self.assertEqual(headers["retry-after"], "5")
        self.assertEqual(headers["content-type"], "application/problem+json")
        problem = json.loads(body)
        self.assertEqual((problem["code"], problem["alarm"]), ("publishers-held", "memory"))
        self.assertIn("500 MiB above 400 MiB", problem["detail"])
        self.assertFalse(client.transport.connected)
        self.assertEqual(self.broker.unfinished_bytes, 0)
        self.assertNotIn("q", self.broker.default_vhost.queues)

    def test_other_requests_go_on(self) -> None:
        """Under the memory alarm, reading (a GET, an ack) is not held."""
        self.broker.admission.hold("memory", "memory alarm")
        status, _, _ = split(Client(self.factory).request("GET", "/api/v1/vhosts"))
        self.assertEqual(status, 200)

    def test_persistent_only_hold_waits_for_the_body(self) -> None:
        """The disk alarm holds persistent messages only: the body tells,
        so the API refuses once it is read (transient ones go)."""
        self.broker.admission.hold("disk", "disk alarm", persistent_only=True)
        client = Client(self.factory)
        body = json.dumps({"body": "x", "persistent": True}).encode()
        status, headers, answer = split(client.request(
            "POST", PUBLISH, body, "Content-Type: application/json\r\n"))
        self.assertEqual(status, 503)
        self.assertEqual(headers["retry-after"], "5")
        self.assertEqual(json.loads(answer)["alarm"], "disk")
        status, _, _ = split(client.request(
            "POST", PUBLISH, b'{"body": "y"}', "Content-Type: application/json\r\n"))
        self.assertEqual(status, 201)

    def test_bodies_count_in_the_input_budget(self) -> None:
        """Bodies still being received count with STOMP's unfinished frames;
        the one that crosses limits.max_unfinished_bytes is refused 503, and
        what each held is given back when it completes or goes."""
        self.broker.max_unfinished_bytes = 1000
        head = (f"POST {PUBLISH} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                "Content-Type: application/json\r\nContent-Length: 700\r\n\r\n").encode()
        first, second = Client(self.factory), Client(self.factory)
        first.send(head + b'{"body": "' + b"a" * 500)
        self.assertEqual(self.broker.unfinished_bytes, 510)
        second.send(head + b'{"body": "' + b"b" * 500)
        status, headers, body = split(second.response())
        self.assertEqual(status, 503)
        self.assertEqual(json.loads(body)["code"], "input-budget")
        self.assertIn("limits.max_unfinished_bytes = 1000", json.loads(body)["detail"])
        self.assertEqual(self.broker.unfinished_bytes, 510)
        first.send(b"a" * 188 + b'"}')
        status, _, _ = split(first.response())
        self.assertEqual(status, 201)
        self.assertEqual(self.broker.unfinished_bytes, 0)
        third = Client(self.factory)
        third.send(head + b"{")
        self.assertEqual(self.broker.unfinished_bytes, 1)
        third.transport.loseConnection()
        self.assertEqual(self.broker.unfinished_bytes, 0)


class FailingStore:
    """A store whose writes fail once flushed (what the commit log does
    when the disk is full)."""

    def __init__(self) -> None:
        self.waiting: list[Deferred] = []

    def recover(self) -> Any:
        from qmq.core.store import Recovery  # noqa: PLC0415

        return Recovery()

    def publish(self, vhost: Any, message: Any, queues: Any) -> Deferred:
        d: Deferred = Deferred()
        self.waiting.append(d)
        return d

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.errback(OSError(28, "No space left on device"))

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


class NotStoredTests(unittest.TestCase):
    def test_not_stored_is_not_published(self) -> None:
        """A publish the store failed to keep is answered 503 not-stored
        with the reason, and does not also claim to be published."""
        from qmq.core.broker import Broker  # noqa: PLC0415

        ctx = make_context()
        ctx.broker = Broker(clock=ctx.clock, store=FailingStore())
        ctx.broker.default_vhost.declare_queue("q", durable=True)
        factory = HttpFactory(ctx)
        client = Client(factory)
        self.assertEqual(client.request("POST", PUBLISH, b'{"body": "x", "persistent": true}',
                                        "Content-Type: application/json\r\n"), b"")
        ctx.broker.batcher.flush_all()  # the end of the turn: the store flushes, and fails
        status, headers, body = split(client.response())
        self.assertEqual(status, 503)
        problem = json.loads(body)
        self.assertEqual(problem["code"], "not-stored")
        self.assertNotIn("published", problem)
        self.assertNotIn("ids", problem)
        self.assertEqual(problem["stored"], 0)
        self.assertIn("No space left on device", problem["detail"])
        self.assertEqual(headers["retry-after"], "5")
