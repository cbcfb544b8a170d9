"""The HTTP API against a real broker site on 127.0.0.1, with treq.

Every response is checked against the OpenAPI document
(L{tests.web_api_helpers.validate}). Long polls and visibility deadlines run
on a L{Clock} given to the API as its reactor, so nothing here sleeps: a
test advances the clock where the API would wait.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from urllib.parse import quote

import fastavro
from twisted.internet import defer, reactor
from twisted.internet.task import Clock, deferLater
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.web.api import codec
from qmq.web.api.settings import ApiSettings
from tests.web_api_helpers import ApiSiteMixin, until

Q = "/api/v1/vhosts/%2F/queues"


def turn() -> defer.Deferred:
    return deferLater(reactor, 0, lambda: None)


class ApiTestCase(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.start_site(ctx_extra={})
        self.api.clock = self.clock
        self.api.frontend.clock = self.clock

    @defer.inlineCallbacks
    def publish(self, queue: str, *bodies: str, **fields: object) -> defer.Deferred:
        if len(bodies) == 1:
            doc = {"body": bodies[0], **fields}
        else:
            doc = {"messages": [{"body": b, **fields} for b in bodies]}
        code, _, _, parsed = yield self.call("POST", f"{Q}/{queue}/messages", doc)
        self.assertEqual(code, 201, parsed)
        return parsed

    @defer.inlineCallbacks
    def receive(self, queue: str, query: str = "", accept: str | None = None) -> defer.Deferred:
        headers = {"Accept": accept} if accept else None
        result = yield self.call("POST", f"{Q}/{queue}/receive{query}", headers=headers)
        return result


class PublishTests(ApiTestCase):
    @defer.inlineCallbacks
    def test_publish_one_and_receive(self) -> None:
        published = yield self.publish("q", "hello", headers={"k": "v"}, priority=3)
        self.assertEqual(published["published"], 1)
        self.assertEqual(published["stored"], 0)
        code, _, _, doc = yield self.receive("q")
        self.assertEqual(code, 200)
        [m] = doc["messages"]
        self.assertEqual((m["body"], m["encoding"], m["headers"], m["priority"]), ("hello", "utf-8", {"k": "v"}, 3))
        self.assertEqual(m["destination"], "/queue/q")
        self.assertEqual(m["id"], published["ids"][0])
        self.assertFalse(m["redelivered"])

    @defer.inlineCallbacks
    def test_headers_checked_once(self) -> None:
        """A batch's headers are checked once each, before any message is
        published, not again by the channel (publish_target(checked=True))."""
        from qmq.core import channel as core_channel
        from qmq.core import names
        from qmq.web.api import frontend

        checked = []

        def counting(headers: dict) -> None:
            checked.append(headers)
            names.check_headers(headers)

        self.patch(frontend, "check_headers", counting)
        self.patch(core_channel, "check_headers", counting)
        yield self.publish("q", "a", "b", "c", headers={"k": "v"})
        self.assertEqual(len(checked), 3)
        code, _, _, parsed = yield self.call(
            "POST", f"{Q}/q/messages", {"messages": [{"body": "d"}, {"body": "e", "headers": {"k\x01": "v"}}]}
        )
        self.assertEqual(code, 400, parsed)
        code, _, _, got = yield self.receive("q", "?max=10")
        self.assertEqual([m["body"] for m in got["messages"]], ["a", "b", "c"])

    @defer.inlineCallbacks
    def test_batch_in_order_and_base64(self) -> None:
        raw = bytes(range(256))
        doc = {"messages": [{"body": "a"}, {"body": base64.b64encode(raw).decode(), "encoding": "base64"}, {"body": "c"}]}
        code, _, _, parsed = yield self.call("POST", f"{Q}/q/messages", doc)
        self.assertEqual((code, parsed["published"]), (201, 3))
        code, _, _, got = yield self.receive("q", "?max=10")
        bodies = [m["body"] for m in got["messages"]]
        self.assertEqual(bodies[0], "a")
        self.assertEqual(got["messages"][1]["encoding"], "base64")
        self.assertEqual(base64.b64decode(bodies[1]), raw)
        self.assertEqual(bodies[2], "c")

    @defer.inlineCallbacks
    def test_encoding_base64_asked(self) -> None:
        yield self.publish("q", "text")
        _, _, _, got = yield self.receive("q", "?encoding=base64")
        self.assertEqual(got["messages"][0]["encoding"], "base64")
        self.assertEqual(base64.b64decode(got["messages"][0]["body"]), b"text")

    @defer.inlineCallbacks
    def test_topic_and_exchange_and_named(self) -> None:
        vhost = self.broker.default_vhost
        vhost.declare_queue("t")
        vhost.bind("t", "amq.topic", "a.*")
        vhost.declare_exchange("fan", "fanout")
        vhost.declare_queue("f")
        vhost.bind("f", "fan", "")
        code, _, _, _ = yield self.call("POST", "/api/v1/vhosts/%2F/topics/a.b/messages", {"body": "T"})
        self.assertEqual(code, 201)
        code, _, _, _ = yield self.call("POST", "/api/v1/vhosts/%2F/exchanges/fan/messages",
                                        {"body": "F", "routing_key": "x"})
        self.assertEqual(code, 201)
        code, _, _, _ = yield self.call("POST", "/api/v1/vhosts/%2F/messages", {"messages": [
            {"body": "N1", "destination": "/queue/t"}, {"body": "N2", "destination": "/topic/a.c"}]})
        self.assertEqual(code, 201)
        self.assertEqual([m.body for m in vhost.queues["t"].messages()], [b"T", b"N1", b"N2"])
        [f] = vhost.queues["f"].messages()
        self.assertEqual((f.body, f.exchange, f.routing_key), (b"F", "fan", "x"))
        _, _, _, got = yield self.receive("t")
        self.assertEqual(got["messages"][0]["destination"], "/topic/a.b")

    @defer.inlineCallbacks
    def test_ttl_sets_expiry(self) -> None:
        yield self.publish("q", "x", ttl=5000)
        [m] = self.broker.default_vhost.queues["q"].messages()
        self.assertAlmostEqual(m.expires - m.timestamp, 5.0, delta=1.0)

    @defer.inlineCallbacks
    def test_persistent_waits_for_store(self) -> None:
        """A persistent message on a durable queue: the answer waits for the
        store's Deferred, as a STOMP RECEIPT does."""
        waiting: list[defer.Deferred] = []

        class SlowStore:
            def publish(self, vhost, message, queues):
                d = defer.Deferred()
                waiting.append(d)
                return d

            def flush(self):
                pass

            def __getattr__(self, name):
                return lambda *a, **k: None

        self.broker.store = SlowStore()
        self.broker._store_flush.store = self.broker.store
        self.broker.default_vhost.declare_queue("d")
        d = self.call("POST", f"{Q}/d/messages", {"body": "p", "persistent": True})
        yield until(lambda: waiting)
        self.assertEqual(len(waiting), 1)
        self.assertFalse(d.called)
        waiting[0].callback(None)
        code, _, _, doc = yield d
        self.assertEqual((code, doc["stored"]), (201, 1))

    @defer.inlineCallbacks
    def test_queue_full_says_how_many(self) -> None:
        self.broker.default_vhost.declare_queue("small", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        code, headers, _, doc = yield self.call("POST", f"{Q}/small/messages",
                                                {"messages": [{"body": "1"}, {"body": "2"}, {"body": "3"}]})
        self.assertEqual((code, doc["code"], doc["published"]), (429, "queue-full", 2))
        self.assertEqual(headers.getRawHeaders("retry-after"), ["1"])


class ErrorTests(ApiTestCase):
    @defer.inlineCallbacks
    def expect(self, status: int, code: str, method: str, path: str, body: object = None, **kw: object) -> defer.Deferred:
        got, _, raw, doc = yield self.call(method, path, body, **kw)
        self.assertEqual(got, status, raw)
        self.assertEqual(doc["code"], code, doc)
        self.assertEqual(doc["status"], status)
        self.assertTrue(doc["detail"])
        self.assertNotIn(b"Traceback", raw)
        return doc

    def test_bad_json(self) -> defer.Deferred:
        return self.expect(400, "bad-json", "POST", f"{Q}/q/messages", raw=b"{nope",
                           headers={"Content-Type": "application/json"})

    def test_not_utf8_json(self) -> defer.Deferred:
        return self.expect(400, "bad-json", "POST", f"{Q}/q/messages", raw=b'{"body": "\xff"}',
                           headers={"Content-Type": "application/json"})

    def test_bad_fields(self) -> defer.Deferred:
        cases = [
            {"body": 1},
            {"body": "x", "priority": 10},
            {"body": "x", "priority": True},
            {"body": "x", "ttl": -1},
            {"body": "x", "headers": {"a": [1]}},
            {"body": "x", "headers": {"a": {"base64": "!"}}},
            {"body": "x", "headers": {"a": {"x": 1}}},
            {"body": "x", "headers": {"priority": "1"}},
            {"body": "x", "properties": {"colour": "red"}},
            {"body": "x", "properties": {"type": 1}},
            {"body": "x", "headers": {"content-length": "3"}},
            {"body": "x", "persistent": "yes"},
            {"body": "x", "encoding": "latin-1"},
            {"body": "!!", "encoding": "base64"},
            {"body": "x", "destination": "/queue/other"},
            {"body": "x", "what": 1},
            {"messages": []},
            {"messages": "x"},
            [1, 2],
        ]
        return defer.gatherResults(
            [self.call("POST", f"{Q}/q/messages", c).addCallback(lambda r, c=c: self.assertEqual(r[0], 400, (c, r[3])))
             for c in cases]
        )

    def test_bad_destination(self) -> defer.Deferred:
        return defer.gatherResults([
            self.expect(400, "bad-destination", "POST", "/api/v1/vhosts/%2F/messages", {"body": "x", "destination": "nowhere"}),
            self.expect(400, "bad-destination", "POST", "/api/v1/vhosts/%2F/messages", {"body": "x", "destination": "/control/memory"}),
            self.expect(400, "bad-parameter", "POST", "/api/v1/vhosts/%2F/messages", {"body": "x"}),
            self.expect(404, "unknown-exchange", "POST", "/api/v1/vhosts/%2F/exchanges/nope/messages", {"body": "x"}),
        ])

    def test_unknown_things(self) -> defer.Deferred:
        return defer.gatherResults([
            self.expect(404, "unknown-queue", "POST", f"{Q}/nope/receive"),
            self.expect(404, "unknown-vhost", "POST", "/api/v1/vhosts/nope/queues/q/messages", {"body": "x"}),
            self.expect(404, "unknown-queue", "GET", f"{Q}/nope"),
            self.expect(404, "unknown-exchange", "GET", "/api/v1/vhosts/%2F/exchanges/nope"),
            self.expect(404, "not-found", "GET", "/api/v1/schemas/Nope.avsc"),
        ])

    @defer.inlineCallbacks
    def test_no_endpoint_and_wrong_method(self) -> None:
        code, _, _, doc = yield self.call("GET", "/api/v1/nothing/here", check=False)
        self.assertEqual((code, doc["code"]), (404, "no-such-endpoint"))
        code, headers, _, doc = yield self.call("GET", f"{Q}/q/receive")
        self.assertEqual((code, doc["code"]), (405, "method-not-allowed"))
        self.assertEqual(headers.getRawHeaders("allow"), ["POST"])

    @defer.inlineCallbacks
    def test_routes_remembered(self) -> None:
        """A method and path once matched is looked up, not matched again;
        what matches nothing is not remembered; the memory is bounded."""
        from qmq.web.api import resource as api_resource

        self.patch(api_resource, "_ROUTE_CACHE_SIZE", 3)
        self.broker.default_vhost.declare_queue("q")
        for _ in range(2):
            yield self.publish("q", "x")
        key = (b"POST", b"v1", b"vhosts", b"/", b"queues", b"q", b"messages")
        self.assertEqual(self.api._seen_routes[key][0].__name__, "h_publish_queue")
        self.assertEqual(self.api._seen_routes[key][1:], ({"vhost": "/", "queue": "q"}, "/"))
        for _ in range(2):
            code, _, _, doc = yield self.call("GET", "/api/v1/nothing/here", check=False)
            self.assertEqual((code, doc["code"]), (404, "no-such-endpoint"))
            code, _, _, doc = yield self.call("GET", f"{Q}/q/receive")
            self.assertEqual((code, doc["code"]), (405, "method-not-allowed"))
        self.assertEqual(list(self.api._seen_routes), [key])
        for name in ("a", "b", "c"):
            code, _, _, _ = yield self.call("GET", f"{Q}/{name}", check=False)
            self.assertEqual(code, 404)
        self.assertLessEqual(len(self.api._seen_routes), 3)
        self.assertNotIn(key, self.api._seen_routes)
        code, _, _, doc = yield self.call("GET", f"{Q}/q")
        self.assertEqual((code, doc["name"]), (200, "q"))

    def test_bad_query(self) -> defer.Deferred:
        self.broker.default_vhost.declare_queue("q")
        return defer.gatherResults([
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?max=0"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?max=abc"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?wait=1e9"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?wait=nan"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?visibility=0"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?encoding=hex"),
            self.expect(400, "bad-parameter", "POST", f"{Q}/q/receive?max=1&max=2"),
        ])

    def test_unsupported_media_type(self) -> defer.Deferred:
        return self.expect(415, "unsupported-media-type", "POST", f"{Q}/q/messages", raw=b"body=x",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})

    @defer.inlineCallbacks
    def test_body_too_large(self) -> None:
        self.factory.site.web_settings = dataclasses.replace(self.factory.site.web_settings, max_request_body=1000)
        code, _, raw, doc = yield self.call("POST", f"{Q}/q/messages", raw=b"x" * 5000,
                                            headers={"Content-Type": "application/json"})
        self.assertEqual((code, doc["code"]), (413, "body-too-large"))

    @defer.inlineCallbacks
    def test_batch_too_large(self) -> None:
        self.api.settings = ApiSettings(max_batch=2)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/messages", {"messages": [{"body": "x"}] * 3})
        self.assertEqual((code, doc["code"]), (413, "batch-too-large"))


class ReceiveTests(ApiTestCase):
    @defer.inlineCallbacks
    def handles(self, queue: str, n: int, query: str = "") -> defer.Deferred:
        _, _, _, got = yield self.receive(queue, f"?max={n}{query}")
        return [m["handle"] for m in got["messages"]]

    @defer.inlineCallbacks
    def test_ack(self) -> None:
        yield self.publish("q", "a", "b")
        handles = yield self.handles("q", 10)
        self.assertEqual(len(handles), 2)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": handles + ["zz.99"]})
        self.assertEqual((code, doc["settled"], doc["unknown"]), (200, 2, ["zz.99"]))
        queue = self.broker.default_vhost.queues["q"]
        self.assertEqual((len(queue), len(queue.consumers)), (0, 0))  # detached: nothing waits

    @defer.inlineCallbacks
    def test_nack_requeue_and_drop(self) -> None:
        yield self.publish("q", "a", "b")
        h = yield self.handles("q", 2)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/nack", {"handles": [h[0]]})
        self.assertEqual(doc["settled"], 1)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/nack", {"handles": [h[1]], "requeue": False})
        self.assertEqual(doc["settled"], 1)
        _, _, _, got = yield self.receive("q", "?max=10")
        self.assertEqual([(m["body"], m["redelivered"], m["delivery_count"]) for m in got["messages"]],
                         [("a", True, 1)])

    @defer.inlineCallbacks
    def test_visibility_timeout_and_extend(self) -> None:
        yield self.publish("q", "a", "b")
        h = yield self.handles("q", 2, "&visibility=10")
        code, _, _, doc = yield self.call("POST", f"{Q}/q/extend", {"handles": [h[1]], "visibility": 100})
        self.assertEqual(doc["settled"], 1)
        self.clock.advance(10)
        queue = self.broker.default_vhost.queues["q"]
        self.assertEqual([m.body for m in queue.messages()], [b"a"])
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": h})
        self.assertEqual((doc["settled"], doc["unknown"]), (1, [h[0]]))
        _, _, _, got = yield self.receive("q")
        self.assertEqual(got["messages"][0]["redelivered"], True)

    @defer.inlineCallbacks
    def test_long_poll_answered_by_publish(self) -> None:
        self.broker.default_vhost.declare_queue("q")
        d = self.receive("q", "?wait=5&max=5")
        queue = self.broker.default_vhost.queues["q"]
        yield until(lambda: queue.consumers)
        self.assertFalse(d.called)
        yield self.publish("q", "x", "y")
        self.clock.advance(0)  # the end-of-turn answer
        code, _, _, got = yield d
        self.assertEqual([m["body"] for m in got["messages"]], ["x", "y"])

    @defer.inlineCallbacks
    def test_long_poll_times_out_empty(self) -> None:
        self.broker.default_vhost.declare_queue("q")
        d = self.receive("q", "?wait=2")
        queue = self.broker.default_vhost.queues["q"]
        yield until(lambda: queue.consumers)
        self.clock.advance(2)
        code, _, _, got = yield d
        self.assertEqual((code, got["messages"]), (200, []))
        self.assertEqual(len(queue.consumers), 0)

    @defer.inlineCallbacks
    def test_waiters_served_in_order(self) -> None:
        self.broker.default_vhost.declare_queue("q")
        first = self.receive("q", "?wait=5&max=2")
        second = self.receive("q", "?wait=5&max=2")
        fe = self.api.frontend.vhost("/")
        yield until(lambda: "q" in fe.pollers and len(fe.pollers["q"].waiters) == 2)
        yield self.publish("q", "1", "2", "3")
        self.clock.advance(0)
        a = yield first
        b = yield second
        # The first to arrive (on either connection) gets the first two.
        got = sorted([[m["body"] for m in a[3]["messages"]], [m["body"] for m in b[3]["messages"]]])
        self.assertEqual(got, [["1", "2"], ["3"]])

    @defer.inlineCallbacks
    def test_queue_deleted_while_waiting(self) -> None:
        self.broker.default_vhost.declare_queue("q")
        d = self.receive("q", "?wait=5")
        fe = self.api.frontend.vhost("/")
        yield until(lambda: "q" in fe.pollers)
        code, _, _, _ = yield self.call("DELETE", f"{Q}/q")
        self.assertEqual(code, 200)
        code, _, _, doc = yield d
        self.assertEqual((code, doc["code"]), (404, "not-found"))

    @defer.inlineCallbacks
    def test_avro_receive(self) -> None:
        yield self.publish("q", "a", "b")
        code, headers, raw, _ = yield self.receive("q", "?max=5", accept="avro/binary")
        self.assertEqual(headers.getRawHeaders("content-type"), ["avro/binary"])
        records = list(fastavro.reader(io.BytesIO(raw)))
        self.assertEqual([r["body"] for r in records], [b"a", b"b"])
        handles = [r["handle"] for r in records]
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": handles})
        self.assertEqual(doc["settled"], 2)

    @defer.inlineCallbacks
    def test_bad_handles(self) -> None:
        self.broker.default_vhost.declare_queue("q")
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": ["not a handle"]})
        self.assertEqual((code, doc["code"]), (400, "bad-handle"))
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": []})
        self.assertEqual(code, 400)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handle": ["x.1"]})
        self.assertEqual(code, 400)
        code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": ["abc.1"]})
        self.assertEqual((code, doc["unknown"]), (200, ["abc.1"]))


class AvroPublishTests(ApiTestCase):
    def record(self, body: bytes, **kw: object) -> dict:
        rec = {"body": body, "headers": {}, "destination": None, "routing_key": None, "priority": 0,
               "ttl": None, "delay": None, "persistent": False}
        rec.update(kw)
        return rec

    @defer.inlineCallbacks
    def test_one_datum(self) -> None:
        data = codec.avro_datum("PublishMessage", self.record(b"\x00avro", headers={"h": "1"}))
        code, _, _, doc = yield self.call("POST", f"{Q}/q/messages", raw=data, headers={"Content-Type": "avro/binary"})
        self.assertEqual((code, doc["published"]), (201, 1))
        [m] = self.broker.default_vhost.queues["q"].messages()
        self.assertEqual((m.body, m.headers), (b"\x00avro", {"h": "1"}))

    @defer.inlineCallbacks
    def test_container_batch(self) -> None:
        out = io.BytesIO()
        fastavro.writer(out, codec.schema("PublishMessage"), [self.record(b"%d" % i) for i in range(100)])
        code, _, _, doc = yield self.call("POST", f"{Q}/q/messages", raw=out.getvalue(),
                                          headers={"Content-Type": "avro/binary"})
        self.assertEqual((code, doc["published"]), (201, 100))
        self.assertEqual([m.body for m in self.broker.default_vhost.queues["q"].messages()],
                         [b"%d" % i for i in range(100)])

    @defer.inlineCallbacks
    def test_bad_avro(self) -> None:
        for raw in (b"\x01", b"Obj\x01garbage", codec.avro_datum("PublishMessage", self.record(b"x")) + b"extra"):
            code, _, _, doc = yield self.call("POST", f"{Q}/q/messages", raw=raw, headers={"Content-Type": "avro/binary"})
            self.assertEqual((code, doc["code"]), (400, "bad-avro"), raw)
        data = codec.avro_datum("PublishMessage", self.record(b"x", priority=42))
        code, _, _, doc = yield self.call("POST", f"{Q}/q/messages", raw=data, headers={"Content-Type": "avro/binary"})
        self.assertEqual((code, doc["code"]), (400, "bad-parameter"))


class ManagementTests(ApiTestCase):
    @defer.inlineCallbacks
    def test_queue_lifecycle(self) -> None:
        code, _, _, doc = yield self.call("PUT", f"{Q}/orders", {"arguments": {"x-max-length": 10}})
        self.assertEqual((code, doc["name"], doc["arguments"]), (201, "orders", {"x-max-length": 10}))
        code, _, _, doc = yield self.call("PUT", f"{Q}/orders")
        self.assertEqual(code, 200)
        yield self.publish("orders", "a", "b")
        _, _, _, doc = yield self.call("GET", f"{Q}/orders")
        self.assertEqual((doc["messages_ready"], doc["consumers"]), (2, 0))
        yield self.receive("orders")
        _, _, _, doc = yield self.call("GET", f"{Q}/orders")
        self.assertEqual((doc["messages_ready"], doc["messages_unacknowledged"], doc["messages"]), (1, 1, 2))
        _, _, _, doc = yield self.call("GET", f"{Q}?prefix=ord")
        self.assertEqual([q["name"] for q in doc["queues"]], ["orders"])
        _, _, _, doc = yield self.call("DELETE", f"{Q}/orders/messages")
        self.assertEqual(doc["purged"], 1)
        _, _, _, doc = yield self.call("DELETE", f"{Q}/orders")
        self.assertEqual(doc["deleted"], "orders")
        code, _, _, _ = yield self.call("PUT", f"{Q}/amq.x")
        self.assertEqual(code, 403)
        code, _, _, doc = yield self.call("PUT", f"{Q}/bad", {"arguments": {"x-overflow": "explode"}})
        self.assertEqual(code, 409)

    @defer.inlineCallbacks
    def test_paging(self) -> None:
        for i in range(5):
            self.broker.default_vhost.declare_queue(f"q{i}")
        _, _, _, doc = yield self.call("GET", f"{Q}?limit=2")
        self.assertEqual(([q["name"] for q in doc["queues"]], doc["next_offset"]), (["q0", "q1"], 2))
        _, _, _, doc = yield self.call("GET", f"{Q}?limit=2&offset=4")
        self.assertEqual(([q["name"] for q in doc["queues"]], doc["next_offset"]), (["q4"], None))

    @defer.inlineCallbacks
    def test_headers_binding_with_arguments(self) -> None:
        """A headers exchange's binding made over HTTP with its arguments
        routes as one made over AMQP would (the core decides), is listed
        with them, and is deleted by naming them; bad arguments are a
        problem document."""
        E = "/api/v1/vhosts/%2F/exchanges"
        B = "/api/v1/vhosts/%2F/bindings"
        yield self.call("PUT", f"{E}/hx", {"type": "headers"})
        yield self.call("PUT", f"{Q}/hq")
        args = {"x-match": "any", "region": "eu", "tier": "gold"}
        code, _, _, doc = yield self.call("POST", B, {"queue": "hq", "exchange": "hx", "arguments": args})
        self.assertEqual((code, doc["arguments"]), (201, args))
        _, _, _, doc = yield self.call("GET", B)
        self.assertIn({"queue": "hq", "exchange": "hx", "routing_key": "", "arguments": args}, doc["bindings"])
        for headers in ({"region": "eu"}, {"tier": "gold"}, {"region": "us"}, {}):
            code, _, _, _ = yield self.call("POST", f"{E}/hx/messages", {"body": "m", "headers": headers})
            self.assertEqual(code, 201)
        self.assertEqual(len(self.broker.default_vhost.queues["hq"]), 2)
        code, _, _, doc = yield self.call("POST", B, {"queue": "hq", "exchange": "hx", "arguments": {"x-match": "some"}})
        self.assertEqual(code, 409, doc)
        self.assertIn("x-match", doc["detail"])
        code, _, _, doc = yield self.call("POST", B, {"queue": "hq", "exchange": "hx", "arguments": "x-match=all"})
        self.assertEqual(code, 400)
        code, _, _, doc = yield self.call("DELETE", f"{B}?queue=hq&exchange=hx&arguments=%5B1%5D")
        self.assertEqual((code, doc["status"]), (400, 400))
        self.assertIn("JSON object", doc["detail"])
        encoded = quote(json.dumps(args))
        code, _, _, doc = yield self.call("DELETE", f"{B}?queue=hq&exchange=hx&arguments={encoded}")
        self.assertEqual((code, doc["deleted"]["arguments"]), (200, args))
        _, _, _, doc = yield self.call("GET", B)
        self.assertNotIn("hx", [b["exchange"] for b in doc["bindings"]])

    @defer.inlineCallbacks
    def test_exchanges_and_bindings(self) -> None:
        E = "/api/v1/vhosts/%2F/exchanges"
        code, _, _, doc = yield self.call("PUT", f"{E}/ev", {"type": "fanout"})
        self.assertEqual((code, doc["type"]), (201, "fanout"))
        code, _, _, doc = yield self.call("PUT", f"{E}/ev", {"type": "topic"})
        self.assertEqual((code, doc["code"]), (409, "precondition-failed"))
        code, _, _, doc = yield self.call("PUT", f"{E}/ev2", {"type": "nope"})
        self.assertEqual(code, 400)
        yield self.call("PUT", f"{Q}/a")
        B = "/api/v1/vhosts/%2F/bindings"
        code, _, _, doc = yield self.call("POST", B, {"queue": "a", "exchange": "ev"})
        self.assertEqual(code, 201)
        _, _, _, doc = yield self.call("GET", B)
        self.assertEqual(doc["bindings"], [{"queue": "a", "exchange": "ev", "routing_key": "", "arguments": {}}])
        yield self.call("POST", f"{E}/ev/messages", {"body": "via"})
        self.assertEqual(len(self.broker.default_vhost.queues["a"]), 1)
        code, _, _, _ = yield self.call("DELETE", f"{B}?queue=a&exchange=ev")
        self.assertEqual(code, 200)
        _, _, _, doc = yield self.call("GET", B)
        self.assertEqual(doc["bindings"], [])
        code, _, _, _ = yield self.call("DELETE", f"{E}/amq.topic")
        self.assertEqual(code, 403)
        code, _, _, _ = yield self.call("DELETE", f"{E}/ev")
        self.assertEqual(code, 200)
        _, _, _, doc = yield self.call("GET", E)
        self.assertNotIn("ev", [e["name"] for e in doc["exchanges"]])

    @defer.inlineCallbacks
    def test_internal_and_alternate_exchanges(self) -> None:
        """PUT sets internal and alternate-exchange (shown by GET and the
        list); a publish to the internal exchange is a 403 problem; what the
        public one routes nowhere lands behind the alternate; a PUT that
        disagrees is 409 and a bad argument value too."""
        E = "/api/v1/vhosts/%2F/exchanges"
        code, _, _, doc = yield self.call("PUT", f"{E}/caught", {"type": "fanout", "internal": True})
        self.assertEqual((code, doc["internal"], doc["arguments"]), (201, True, {}))
        code, _, _, doc = yield self.call(
            "PUT", f"{E}/front", {"type": "direct", "arguments": {"alternate-exchange": "caught"}})
        self.assertEqual((code, doc["internal"], doc["arguments"]), (201, False, {"alternate-exchange": "caught"}))
        _, _, _, doc = yield self.call("GET", f"{E}/caught")
        self.assertTrue(doc["internal"])
        _, _, _, doc = yield self.call("GET", E)
        self.assertEqual({e["name"]: e["internal"] for e in doc["exchanges"]}["caught"], True)
        vhost = self.broker.default_vhost
        vhost.declare_queue("c")
        vhost.bind("c", "caught")
        code, _, _, _ = yield self.call("POST", f"{E}/front/messages", {"body": "lost?", "routing_key": "k"})
        self.assertEqual(code, 201)
        self.assertEqual([m.body for m in vhost.queues["c"].messages()], [b"lost?"])
        code, _, _, doc = yield self.call("POST", f"{E}/caught/messages", {"body": "x"})
        self.assertEqual(code, 403)
        self.assertIn("cannot publish to internal exchange 'caught'", doc["detail"])
        self.assertEqual(len(vhost.queues["c"]), 1)
        code, _, _, doc = yield self.call("PUT", f"{E}/caught", {"type": "fanout"})
        self.assertEqual((code, doc["code"]), (409, "precondition-failed"))
        code, _, _, doc = yield self.call("PUT", f"{E}/front", {"type": "direct"})
        self.assertEqual((code, doc["code"]), (409, "precondition-failed"))
        code, _, _, doc = yield self.call("PUT", f"{E}/bad", {"type": "direct", "arguments": {"alternate-exchange": 1}})
        self.assertEqual(code, 409)
        self.assertNotIn("bad", vhost.exchanges)

    @defer.inlineCallbacks
    def test_vhosts_and_documents(self) -> None:
        self.broker.add_vhost("other")
        _, _, _, doc = yield self.call("GET", "/api/v1/vhosts")
        self.assertEqual([v["name"] for v in doc["vhosts"]], ["/", "other"])
        code, _, _, doc = yield self.call("GET", "/api/v1/vhosts/other")
        self.assertEqual(code, 200)
        _, _, _, doc = yield self.call("GET", "/api/v1/schemas")
        self.assertEqual(doc["schemas"], ["PublishMessage.avsc", "Delivery.avsc"])
        _, _, _, doc = yield self.call("GET", "/api/v1/schemas/Delivery.avsc")
        self.assertEqual(doc["name"], "Delivery")
        _, _, _, doc = yield self.call("GET", "/api/v1/openapi.json")
        self.assertEqual(doc["openapi"], "3.1.0")
        _, _, _, doc = yield self.call("GET", "/api/v1/")
        self.assertEqual(doc["version"], "v1")


class CorsTests(ApiTestCase):
    @defer.inlineCallbacks
    def test_allowed_origin_and_preflight(self) -> None:
        self.api.origins = frozenset({"https://app.example"})
        # The site's gate trusts http_api.cors_origins too (qmq.web.guard).
        self.factory.site.guard.origins = ("https://app.example",)
        _, headers, _, _ = yield self.call("GET", "/api/v1/vhosts", headers={"Origin": "https://app.example"})
        self.assertEqual(headers.getRawHeaders("access-control-allow-origin"), ["https://app.example"])
        code, headers, _, doc = yield self.call("GET", "/api/v1/vhosts", check=False,
                                                headers={"Origin": "https://evil.example"})
        self.assertEqual((code, doc["code"]), (403, "origin-not-allowed"))
        self.assertIsNone(headers.getRawHeaders("access-control-allow-origin"))
        code, headers, _, _ = yield self.call("OPTIONS", f"{Q}/q/messages", check=False, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        self.assertEqual(code, 204)
        self.assertIn("POST", headers.getRawHeaders("access-control-allow-methods")[0])


class FollowTests(ApiTestCase):
    T = "/api/v1/vhosts/%2F/topics"

    @defer.inlineCallbacks
    def test_cursor_poll(self) -> None:
        code, _, _, doc = yield self.call("GET", f"{self.T}/news.%2A/poll")
        self.assertEqual((code, doc["messages"], doc["dropped"]), (200, [], 0))
        cursor = doc["cursor"]
        yield self.call("POST", f"{self.T}/news.a/messages", {"messages": [{"body": "1"}, {"body": "2"}]})
        yield self.call("POST", f"{self.T}/other/messages", {"body": "no"})
        _, _, _, doc = yield self.call("GET", f"{self.T}/news.%2A/poll?cursor={cursor}&max=1")
        self.assertEqual([m["body"] for m in doc["messages"]], ["1"])
        again = doc["cursor"]
        _, _, _, doc = yield self.call("GET", f"{self.T}/news.%2A/poll?cursor={cursor}")
        self.assertEqual([m["body"] for m in doc["messages"]], ["1", "2"])  # a lost answer, asked again
        _, _, _, doc = yield self.call("GET", f"{self.T}/news.%2A/poll?cursor={again}")
        self.assertEqual([(m["body"], m["seq"]) for m in doc["messages"]], [("2", 2)])
        last = doc["cursor"]
        d = self.call("GET", f"{self.T}/news.%2A/poll?cursor={last}&wait=5")
        yield until(lambda: any(f.waiter is not None for f in self.api.followers.values()))
        yield self.call("POST", f"{self.T}/news.b/messages", {"body": "3"})
        self.clock.advance(0)
        _, _, _, doc = yield d
        self.assertEqual([m["body"] for m in doc["messages"]], ["3"])
        d = self.call("GET", f"{self.T}/news.%2A/poll?cursor={doc['cursor']}&wait=5")
        yield until(lambda: any(f.waiter is not None for f in self.api.followers.values()))
        self.clock.advance(5)
        _, _, _, doc = yield d
        self.assertEqual(doc["messages"], [])

    @defer.inlineCallbacks
    def test_cursor_expires_and_bad_cursor(self) -> None:
        _, _, _, doc = yield self.call("GET", f"{self.T}/x/poll")
        self.clock.advance(self.api_settings.follow_idle_timeout + 1)
        code, _, _, doc = yield self.call("GET", f"{self.T}/x/poll?cursor={doc['cursor']}")
        self.assertEqual((code, doc["code"]), (410, "cursor-expired"))
        code, _, _, doc = yield self.call("GET", f"{self.T}/x/poll?cursor=junk")
        self.assertEqual((code, doc["code"]), (400, "bad-cursor"))
        self.assertEqual(self.broker.default_vhost.exchanges["amq.topic"].binding_count, 0)

    @defer.inlineCallbacks
    def test_backlog_drops_oldest(self) -> None:
        self.api.settings = ApiSettings(follow_backlog=2)
        _, _, _, doc = yield self.call("GET", f"{self.T}/x/poll")
        yield self.call("POST", f"{self.T}/x/messages", {"messages": [{"body": str(i)} for i in range(5)]})
        _, _, _, doc = yield self.call("GET", f"{self.T}/x/poll?cursor={doc['cursor']}")
        self.assertEqual(([m["body"] for m in doc["messages"]], doc["dropped"]), (["3", "4"], 3))

    @defer.inlineCallbacks
    def test_avro_poll(self) -> None:
        _, _, _, doc = yield self.call("GET", f"{self.T}/x/poll")
        yield self.call("POST", f"{self.T}/x/messages", {"body": "a"})
        code, headers, raw, _ = yield self.call("GET", f"{self.T}/x/poll?cursor={doc['cursor']}",
                                                headers={"Accept": "avro/binary"})
        self.assertEqual([r["body"] for r in fastavro.reader(io.BytesIO(raw))], [b"a"])
        self.assertTrue(headers.getRawHeaders("qmq-cursor")[0].endswith(".1"))

    @defer.inlineCallbacks
    def test_server_sent_events(self) -> None:
        import treq  # noqa: PLC0415

        response = yield treq.get(f"{self.base}{self.T}/ev.%23/events", pool=self.pool, unbuffered=True)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream; charset=utf-8"])
        chunks: list[bytes] = []
        done = treq.collect(response, chunks.append)
        yield until(lambda: self.api.streams)
        yield self.call("POST", f"{self.T}/ev.a.b/messages", {"body": "hot"})
        yield until(lambda: b"hot" in b"".join(chunks), "the event")
        self.clock.advance(self.api_settings.sse_keepalive)
        yield until(lambda: b": keep-alive" in b"".join(chunks), "a keep-alive")
        text = b"".join(chunks).decode()
        event = [e for e in text.split("\n\n") if "event: message" in e][0]
        data = json.loads(event.split("data: ", 1)[1])
        self.assertEqual((data["body"], data["destination"]), ("hot", "/topic/ev.a.b"))
        self.assertIn(f"id: {data['id']}", event)
        yield self.pool.closeCachedConnections()
        for stream in list(self.api.streams):
            stream.close()
        yield until(lambda: not self.api.streams, "the stream to close")
        yield done.addErrback(lambda _: None)
        self.assertEqual(self.broker.default_vhost.exchanges["amq.topic"].binding_count, 0)


class UploadTests(ApiTestCase):
    @defer.inlineCallbacks
    def test_slow_upload_times_out(self) -> None:
        """A client that sends a head and part of its body, then stalls, is
        answered 408 and closed once upload_timeout passes."""
        from twisted.internet.protocol import ClientFactory, Protocol  # noqa: PLC0415

        self.factory.site.reactor = self.clock
        got = defer.Deferred()

        class Slow(Protocol):
            data = b""

            def connectionMade(self) -> None:
                self.transport.write(b"POST /api/v1/vhosts/%2F/queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
                                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"bo")

            def dataReceived(self, data: bytes) -> None:
                self.data += data

            def connectionLost(self, reason: object) -> None:
                got.callback(self.data)

        factory = ClientFactory.forProtocol(Slow)
        reactor.connectTCP("127.0.0.1", self.port.getHost().port, factory)
        yield until(
            lambda: any(getattr(c.func, "__name__", "") == "_too_slow" for c in self.clock.getDelayedCalls()),
            "the request's deadline",
        )
        self.clock.advance(self.api_settings.upload_timeout)
        data = yield got
        self.assertTrue(data.startswith(b"HTTP/1.1 408 "), data[:100])
        self.assertIn(b'"code": "upload-timeout"', data)
        self.assertIn(b"content-type: application/problem+json", data)


class SiteMountTests(unittest.TestCase):
    """The API is mounted at /api on the http: listener's site, and lists
    that listener's connections."""

    @defer.inlineCallbacks
    def test_mounted(self) -> None:
        import treq  # noqa: PLC0415

        from qmq import config  # noqa: PLC0415
        from qmq.connections import ConnectionRegistry  # noqa: PLC0415
        from qmq.web.site import HttpFactory, WebContext  # noqa: PLC0415

        settings = config.load_string("")
        ctx = WebContext(Broker(reactor), reactor, settings, ConnectionRegistry(settings.connections, reactor),
                         "http:test")
        port = reactor.listenTCP(0, HttpFactory(ctx), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.assertIn(ctx.api.close, ctx.on_stop)  # the listener's stop ends the API's state
        base = f"http://127.0.0.1:{port.getHost().port}/api/v1"
        from twisted.web.client import HTTPConnectionPool  # noqa: PLC0415

        pool = HTTPConnectionPool(reactor)
        self.addCleanup(pool.closeCachedConnections)
        r = yield treq.post(f"{base}/vhosts/%2F/queues/m/messages", json={"body": "via site"}, pool=pool)
        self.assertEqual(r.code, 201)
        yield r.content()
        r = yield treq.post(f"{base}/vhosts/%2F/queues/m/receive", pool=pool)
        doc = yield r.json()
        self.assertEqual(doc["messages"][0]["body"], "via site")
        r = yield treq.post(f"{base}/vhosts/%2F/queues/m/ack", json={"handles": [doc["messages"][0]["handle"]]},
                            pool=pool)
        self.assertEqual((yield r.json())["settled"], 1)
        r = yield treq.get(f"{base}/connections", pool=pool)
        doc = yield r.json()
        self.assertEqual(len(doc["connections"]), 1)
        self.assertEqual(doc["connections"][0]["peer"].split(":")[0], "127.0.0.1")


class ScanTests(ApiSiteMixin, unittest.TestCase):
    """Range scans of a durable queue on the commit log."""

    def setUp(self) -> None:
        import os  # noqa: PLC0415

        from qmq.store.log import CommitLogStore  # noqa: PLC0415

        directory = self.mktemp()
        os.makedirs(directory)
        self.store = CommitLogStore(directory, reactor=reactor, compact_interval=0)
        self.start_site(broker=Broker(reactor, store=self.store))
        self.addCleanup(self.store.close)

    @defer.inlineCallbacks
    def test_scan_pages_without_consuming(self) -> None:
        self.broker.default_vhost.declare_queue("kept")
        code, _, _, doc = yield self.call("POST", f"{Q}/kept/messages", {
            "messages": [{"body": f"m{i}", "persistent": True} for i in range(5)]})
        self.assertEqual((code, doc["stored"]), (201, 5))
        got, cursor = [], None
        for _ in range(10):
            q = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
            code, _, _, page = yield self.call("GET", f"{Q}/kept/scan{q}")
            self.assertEqual(code, 200)
            got.extend(m["body"] for m in page["messages"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        self.assertEqual(got, [f"m{i}" for i in range(5)])
        self.assertEqual(len(self.broker.default_vhost.queues["kept"]), 5)
        code, _, _, page = yield self.call("GET", f"{Q}/kept/scan?start=0&end=1")
        self.assertEqual(page["messages"], [])
        code, headers, raw, _ = yield self.call("GET", f"{Q}/kept/scan?limit=1", headers={"Accept": "avro/binary"})
        self.assertEqual([r["body"] for r in fastavro.reader(io.BytesIO(raw))], [b"m0"])
        self.assertTrue(headers.getRawHeaders("qmq-next-cursor"))

    @defer.inlineCallbacks
    def test_scan_errors(self) -> None:
        self.broker.default_vhost.declare_queue("mem", durable=False)
        code, _, _, doc = yield self.call("GET", f"{Q}/mem/scan")
        self.assertEqual((code, doc["code"]), (400, "cannot-scan"))
        self.broker.default_vhost.declare_queue("kept")
        code, _, _, doc = yield self.call("GET", f"{Q}/kept/scan?cursor=nonsense")
        self.assertEqual((code, doc["code"]), (400, "bad-cursor"))
        # An end before the start is an empty range (the document cannot
        # say the order; the answer is what [5, 1) holds).
        code, _, _, doc = yield self.call("GET", f"{Q}/kept/scan?start=5&end=1")
        self.assertEqual((code, doc["messages"], doc["next_cursor"]), (200, [], None))
        code, _, _, doc = yield self.call("GET", f"{Q}/nope/scan")
        self.assertEqual(code, 404)


class AuthSetup(ApiTestCase):
    """Users alice (an admin, every permission) and bob (write jobs, read
    public), and a token key."""

    SECRET = b"s3cret-key-for-tests-only-32bytes!"

    def setUp(self) -> None:
        import time  # noqa: PLC0415

        from qmq.auth import (  # noqa: PLC0415
            Authenticator,
            AuthSettings,
            PermissionSettings,
            TokenSettings,
            UserSettings,
        )
        from qmq.auth.passwords import hash_password  # noqa: PLC0415

        super().setUp()
        self.now = time.time()
        hashed = hash_password("wonderland", 4)  # a cheap hash: tests only
        self.broker.auth = Authenticator(
            AuthSettings(failure_delay=0.01, failure_max_delay=0.02),
            reactor,
            users=[UserSettings("alice", hashed), UserSettings("bob", hashed)],
            permissions={"/": [PermissionSettings("alice", ".*", ".*", ".*"),
                               PermissionSettings("bob", "", "^jobs$", "^public$")]},
            tokens={"/": TokenSettings("HS256", self.SECRET, read=".*", write=".*")},
            run=lambda f, *a: defer.maybeDeferred(f, *a),
        )
        self.api.settings = self.api.frontend.settings = ApiSettings(admins="alice")
        self.broker.default_vhost.declare_queue("jobs")
        self.broker.default_vhost.declare_queue("public")

    def basic(self, user: str, password: str = "wonderland") -> dict:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}



class AuthTests(AuthSetup):
    """HTTP Basic and bearer tokens through the broker's authenticator; the
    core's permission checks through each user's channel."""

    @defer.inlineCallbacks
    def test_no_credentials(self) -> None:
        code, headers, _, doc = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"})
        self.assertEqual((code, doc["code"]), (401, "unauthorized"))
        self.assertIn("Basic", headers.getRawHeaders("www-authenticate")[0])
        code, _, _, _ = yield self.call("GET", "/api/v1/openapi.json")
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_bad_password_and_header(self) -> None:
        code, _, _, doc = yield self.call("GET", f"{Q}/jobs", headers=self.basic("alice", "nope"))
        self.assertEqual(code, 401)
        code, _, _, doc = yield self.call("GET", f"{Q}/jobs", headers={"Authorization": "Basic !!!"})
        self.assertEqual(code, 401)
        code, _, _, doc = yield self.call("GET", f"{Q}/jobs", headers={"Authorization": "Digest x"})
        self.assertEqual(code, 401)

    @defer.inlineCallbacks
    def test_permissions(self) -> None:
        bob = self.basic("bob")
        code, _, _, _ = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"}, headers=bob)
        self.assertEqual(code, 201)
        code, _, _, doc = yield self.call("POST", f"{Q}/public/messages", {"body": "x"}, headers=bob)
        self.assertEqual((code, doc["code"]), (403, "access-refused"))
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/receive", headers=bob)
        self.assertEqual(code, 403)
        code, _, _, doc = yield self.call("PUT", f"{Q}/newq", headers=bob)
        self.assertEqual(code, 403)
        _, _, _, doc = yield self.call("GET", Q, headers=bob)
        self.assertEqual([q["name"] for q in doc["queues"]], ["public"])
        code, _, _, _ = yield self.call("GET", "/api/v1/connections", headers=bob)
        self.assertEqual(code, 403)
        alice = self.basic("alice")
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/receive", headers=alice)
        self.assertEqual((code, doc["messages"][0]["body"]), (200, "x"))
        handle = doc["messages"][0]["handle"]
        # Bob cannot settle Alice's delivery: his receivers are his own.
        _, _, _, doc = yield self.call("POST", f"{Q}/jobs/ack", {"handles": [handle]}, headers=bob)
        self.assertEqual(doc["unknown"], [handle])
        _, _, _, doc = yield self.call("POST", f"{Q}/jobs/ack", {"handles": [handle]}, headers=alice)
        self.assertEqual(doc["settled"], 1)
        code, _, _, _ = yield self.call("GET", "/api/v1/connections", headers=alice)
        self.assertEqual(code, 200)
        # The mesh's links are admins' too (none here: no mesh).
        code, _, _, _ = yield self.call("GET", "/api/v1/links", headers=bob)
        self.assertEqual(code, 403)
        code, _, _, doc = yield self.call("GET", "/api/v1/links", headers=alice)
        self.assertEqual((code, doc["links"]), (200, []))

    @defer.inlineCallbacks
    def test_bearer_token(self) -> None:
        import jwt  # noqa: PLC0415

        token = jwt.encode({"sub": "web-1", "exp": self.now + 600}, self.SECRET, algorithm="HS256")
        code, _, _, _ = yield self.call("POST", f"{Q}/jobs/messages", {"body": "t"},
                                        headers={"Authorization": f"Bearer {token}"})
        self.assertEqual(code, 201)
        code, _, _, _ = yield self.call("POST", f"{Q}/jobs/messages", {"body": "t"},
                                        headers={"Authorization": "Bearer not.a.token"})
        self.assertEqual(code, 401)

    @defer.inlineCallbacks
    def test_login_remembered(self) -> None:
        calls = []
        auth = self.broker.auth
        original = auth.authenticate
        auth.authenticate = lambda *a: (calls.append(a), original(*a))[1]
        for _ in range(3):
            code, _, _, _ = yield self.call("GET", f"{Q}/public", headers=self.basic("bob"))
            self.assertEqual(code, 200)
        self.assertEqual(len(calls), 1)


class UserManagementTests(AuthSetup):
    """Users and permissions over HTTP (admins only), applied at run time."""

    @defer.inlineCallbacks
    def test_admins_only_and_no_hash_shown(self) -> None:
        code, _, _, doc = yield self.call("GET", "/api/v1/users", headers=self.basic("bob"))
        self.assertEqual((code, doc["code"]), (403, "access-refused"))
        code, _, raw, doc = yield self.call("GET", "/api/v1/users", headers=self.basic("alice"))
        self.assertEqual(code, 200)
        self.assertEqual([(u["name"], u["admin"], u["source"]) for u in doc["users"]],
                         [("alice", True, "config"), ("bob", False, "config")])
        self.assertNotIn(b"scrypt", raw)
        code, _, raw, doc = yield self.call("GET", "/api/v1/users/bob", headers=self.basic("alice"))
        self.assertEqual((code, doc["password"]), (200, True))
        self.assertNotIn(b"scrypt", raw)
        _, _, _, doc = yield self.call("GET", "/api/v1/permissions?user=bob", headers=self.basic("alice"))
        self.assertEqual(doc["permissions"], [{"vhost": "/", "user": "bob", "configure": "", "write": "^jobs$",
                                               "read": "^public$"}])

    @defer.inlineCallbacks
    def test_user_lifecycle_takes_effect(self) -> None:
        admin = self.basic("alice")
        carol = self.basic("carol", "c4rol")
        code, _, _, doc = yield self.call("PUT", "/api/v1/users/carol", {"password": "c4rol"}, headers=admin)
        self.assertEqual((code, doc["source"], doc["password"]), (201, "runtime", True))
        # No permissions yet: the virtual host is not open to her.
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"}, headers=carol)
        self.assertEqual(code, 403)
        code, _, _, doc = yield self.call("PUT", "/api/v1/permissions/%2F/carol",
                                          {"write": "^jobs$", "read": ".*"}, headers=admin)
        self.assertEqual((code, doc["write"], doc["configure"]), (201, "^jobs$", ""))
        code, _, _, _ = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"}, headers=carol)
        self.assertEqual(code, 201)
        # Narrowed: her next request (her login was cached) is refused.
        code, _, _, _ = yield self.call("PUT", "/api/v1/permissions/%2F/carol", {"read": ".*"}, headers=admin)
        self.assertEqual(code, 200)
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"}, headers=carol)
        self.assertEqual((code, doc["code"]), (403, "access-refused"))
        # A new password: the old one fails at once, cached or not.
        code, _, _, _ = yield self.call("PUT", "/api/v1/users/carol", {"password_hash": hash_cheap("n3w")},
                                        headers=admin)
        self.assertEqual(code, 200)
        code, _, _, _ = yield self.call("GET", f"{Q}/jobs", headers=carol)
        self.assertEqual(code, 401)
        code, _, _, _ = yield self.call("GET", f"{Q}/jobs", headers=self.basic("carol", "n3w"))
        self.assertEqual(code, 200)
        code, _, _, doc = yield self.call("DELETE", "/api/v1/permissions/%2F/carol", headers=admin)
        self.assertEqual(code, 200)
        code, _, _, _ = yield self.call("GET", f"{Q}/jobs", headers=self.basic("carol", "n3w"))
        self.assertEqual(code, 403)
        from types import SimpleNamespace  # noqa: PLC0415

        from qmq.auth import User  # noqa: PLC0415

        class Conn:
            peer_host = "127.0.0.1"
            closed = None

            def __init__(self, name: str, source: str = "password") -> None:
                self.session = SimpleNamespace(user=User(name, source), login=name)

            def shutdown(self, reason: str) -> None:
                self.closed = reason

        registry = self.ctx.connections
        hers, token, others = Conn("carol"), Conn("carol", "token"), Conn("bob")
        for conn in (hers, token, others):
            registry.add(conn, "test")
            self.addCleanup(registry.remove, conn)
        code, _, _, doc = yield self.call("DELETE", "/api/v1/users/carol", headers=admin)
        self.assertEqual((code, doc["deleted"], doc["connections_closed"]), (200, "carol", 1))
        self.assertIn("deleted", hers.closed)
        self.assertEqual((token.closed, others.closed), (None, None))
        code, _, _, _ = yield self.call("GET", f"{Q}/jobs", headers=self.basic("carol", "n3w"))
        self.assertEqual(code, 401)
        code, _, _, doc = yield self.call("GET", "/api/v1/users/carol", headers=admin)
        self.assertEqual((code, doc["code"]), (404, "unknown-user"))

    @defer.inlineCallbacks
    def test_bad_input(self) -> None:
        admin = self.basic("alice")
        for path, body, status in [
            ("/api/v1/users/dave", {}, 400),
            ("/api/v1/users/dave", {"password": ""}, 400),
            ("/api/v1/users/dave", {"password": "a", "password_hash": hash_cheap("a")}, 400),
            ("/api/v1/users/dave", {"password_hash": "plaintext"}, 400),
            ("/api/v1/users/dave", {"certificate_names": [1]}, 400),
            ("/api/v1/users/dave", {"hash": "x"}, 400),
            ("/api/v1/users/" + "d" * 200, {"password_hash": hash_cheap("a")}, 400),
            ("/api/v1/permissions/%2F/nobody", {"read": ".*"}, 404),
            ("/api/v1/permissions/nowhere/bob", {"read": ".*"}, 404),
            ("/api/v1/permissions/%2F/bob", {"read": "("}, 400),
            ("/api/v1/permissions/%2F/bob", {"read": 1}, 400),
        ]:
            code, _, _, doc = yield self.call("PUT", path, body, headers=admin)
            self.assertEqual(code, status, (path, body, doc))
        code, _, _, doc = yield self.call("PUT", "/api/v1/users/dave", raw=b"{", headers={
            **admin, "Content-Type": "application/json"})
        self.assertEqual((code, doc["code"]), (400, "bad-json"))
        code, _, _, doc = yield self.call("DELETE", "/api/v1/permissions/%2F/nobody", headers=admin)
        self.assertEqual(code, 404)
        code, _, _, doc = yield self.call("GET", "/api/v1/permissions/%2F/nobody", headers=admin)
        self.assertEqual(code, 404)
        # A certificate name is one user's.
        code, _, _, _ = yield self.call("PUT", "/api/v1/users/dave", {"certificate_names": ["d.example"]},
                                        headers=admin)
        self.assertEqual(code, 201)
        code, _, _, doc = yield self.call("PUT", "/api/v1/users/erin", {"certificate_names": ["d.example"]},
                                          headers=admin)
        self.assertEqual((code, doc["code"]), (409, "conflict"))


class LiveSessionTests(AuthSetup):
    @defer.inlineCallbacks
    def test_permission_changes_reach_open_sessions(self) -> None:
        """A session logged in before a change (here a STOMP session's
        channel) is checked against the new permissions from its next
        destination on, a send target it resolved before included."""
        from qmq.auth.checkers import Principal  # noqa: PLC0415
        from qmq.core.errors import AccessRefused  # noqa: PLC0415
        from qmq.stomp.destinations import DestinationChannel as Channel  # noqa: PLC0415

        auth = self.broker.auth
        channel = Channel(self.broker, self.broker.default_vhost, "bob",
                          user=auth.realm.user(Principal("bob", "password")), protocol="stomp")
        self.addCleanup(channel.close)
        channel.send_target("/queue/jobs")
        self.assertRaises(AccessRefused, channel.send_target, "/queue/public")
        admin = self.basic("alice")
        code, _, _, _ = yield self.call("PUT", "/api/v1/permissions/%2F/bob", {"write": "^public$"}, headers=admin)
        self.assertEqual(code, 200)
        self.assertRaises(AccessRefused, channel.send_target, "/queue/jobs")
        channel.send_target("/queue/public")
        code, _, _, _ = yield self.call("DELETE", "/api/v1/permissions/%2F/bob", headers=admin)
        self.assertEqual(code, 200)
        self.assertRaises(AccessRefused, channel.send_target, "/queue/public")


def hash_cheap(password: str) -> str:
    from qmq.auth.passwords import hash_password  # noqa: PLC0415

    return hash_password(password, 4)


class UsersWithoutAuthTests(ApiTestCase):
    @defer.inlineCallbacks
    def test_authentication_off(self) -> None:
        code, _, _, doc = yield self.call("GET", "/api/v1/users")
        self.assertEqual((code, doc["users"]), (200, []))
        code, _, _, doc = yield self.call("PUT", "/api/v1/users/x", {"password": "y"})
        self.assertEqual((code, doc["code"]), (409, "authentication-off"))
        code, _, _, doc = yield self.call("GET", "/api/v1/permissions")
        self.assertEqual((code, doc["permissions"]), (200, []))


class OwnershipTests(AuthSetup):
    """A durable subscription's queue is its owner's: nobody else receives
    from, purges, deletes, scans or binds it over HTTP."""

    @defer.inlineCallbacks
    def test_two_users(self) -> None:
        auth = self.broker.auth
        auth.set_permission("/", "bob", ".*", ".*", ".*")
        vhost = self.broker.default_vhost
        vhost.declare_queue("durable.alice.news")
        vhost.queues["durable.alice.news"].publish(self.broker_message(b"m1"))
        bob, alice = self.basic("bob"), self.basic("alice")
        path = f"{Q}/durable.alice.news"
        for method, suffix, body in [
            ("POST", "/receive", None),
            ("DELETE", "/messages", None),
            ("DELETE", "", None),
            ("POST", "/ack", {"handles": ["x.1"]}),
            ("POST", "/messages", {"body": "x"}),
            ("PUT", "", None),
        ]:
            code, _, _, doc = yield self.call(method, path + suffix, body, headers=bob)
            self.assertEqual((code, doc["code"]), (403, "access-refused"), (method, suffix, doc))
        code, _, _, doc = yield self.call("POST", "/api/v1/vhosts/%2F/bindings",
                                          {"queue": "durable.alice.news", "exchange": "amq.topic"}, headers=bob)
        self.assertEqual(code, 403)
        # Bob, not an admin, does not see it; alice (an admin and its owner) does.
        _, _, _, doc = yield self.call("GET", Q, headers=bob)
        self.assertNotIn("durable.alice.news", [q["name"] for q in doc["queues"]])
        code, _, _, _ = yield self.call("GET", path, headers=bob)
        self.assertEqual(code, 403)
        _, _, _, doc = yield self.call("GET", Q, headers=alice)
        self.assertIn("durable.alice.news", [q["name"] for q in doc["queues"]])
        code, _, _, doc = yield self.call("POST", path + "/receive", headers=alice)
        self.assertEqual((code, [m["body"] for m in doc["messages"]]), (200, ["m1"]))
        code, _, _, doc = yield self.call("DELETE", path + "/messages", headers=alice)
        self.assertEqual(code, 200)
        code, _, _, doc = yield self.call("DELETE", path, headers=alice)
        self.assertEqual(code, 200)

    def broker_message(self, body: bytes) -> object:
        from qmq.core.message import Message  # noqa: PLC0415

        return Message(next(self.broker.message_ids), "", "durable.alice.news", None, body)
