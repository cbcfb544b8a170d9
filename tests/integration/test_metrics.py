"""C{/metrics} and the health checks of a real broker on 127.0.0.1, driven
by stomp.py and the HTTP API: the exposition parsed with prometheus-client's
parser (each family once, with its documented type), and every counter
moves after the traffic that should move it. Every wait has a deadline."""

from __future__ import annotations

import sys
from typing import Any

import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.internet.threads import deferToThread

from qmq.web.metrics import FAMILIES
from tests.integration.test_admission import TIMEOUT, BrokerTestCase


def families(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"family {family.name} twice"
        out[family.name] = family
    return out


def value(found: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of the sample C{sample} with exactly C{labels} (0 if absent)."""
    for family in found.values():
        for s in family.samples:
            if s.name == sample and s.labels == labels:
                return s.value
    return 0.0


class MetricsAfterTraffic(BrokerTestCase):
    @defer.inlineCallbacks
    def scrape(self) -> Any:
        response = yield treq.get(f"http://127.0.0.1:{self.http_port}/metrics", pool=self.pool, timeout=TIMEOUT)
        self.assertEqual(response.code, 200)
        text = yield response.text()
        # A family's TYPE line appears once: no name under two families.
        types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        self.assertEqual(len(types), len(set(types)), "a family is exposed twice")
        return families(text)

    @defer.inlineCallbacks
    def test_names_types_and_every_counter_moves(self) -> Any:
        before = yield self.scrape()
        for name, kind in FAMILIES.items():
            if name.startswith(("qmq_memory_", "qmq_disk_free", "qmq_disk_alarm_")) and name not in before:
                continue  # no memory alarm or disk alarm in this configuration
            self.assertIn(name, before)
            self.assertEqual(before[name].type, kind, name)
        self.assertIn("python_info", before)
        if sys.platform.startswith("linux"):
            self.assertEqual(before["process_resident_memory_bytes"].type, "gauge")
            self.assertEqual(before["process_cpu_seconds"].type, "counter")
        self.assertEqual(value(before, "qmq_build_info", version=__import__("qmq").__version__,
                               python=sys.version.split()[0]), 1)
        for name, family in before.items():
            if name.startswith("qmq_"):
                self.assertTrue(family.documentation, name)
                if family.type == "counter":
                    self.assertTrue(all(s.name.endswith(("_total", "_created")) for s in family.samples), name)

        # STOMP: a connection, a publish to a queue, one to a topic nobody
        # hears (unroutable), a delivery and an ack, then it closes.
        conn, listener = yield self.stomp_client()
        yield deferToThread(conn.send, "/queue/m", b"one", receipt="r1")
        yield deferToThread(listener.wait, lambda: "r1" in listener.receipts, "r1")
        yield deferToThread(conn.send, "/topic/nobody.listens", b"lost", receipt="r2")
        yield deferToThread(listener.wait, lambda: "r2" in listener.receipts, "r2")
        yield deferToThread(conn.subscribe, "/queue/m", "s1", ack="client-individual")
        yield deferToThread(listener.wait, lambda: listener.frames, "a MESSAGE")
        frame = listener.frames[0]
        yield deferToThread(conn.ack, frame.headers["ack"], receipt="r3")
        yield deferToThread(listener.wait, lambda: "r3" in listener.receipts, "r3")
        yield deferToThread(self._disconnect, conn)
        self.conns.remove(conn)
        yield self.until(lambda: not any(True for c in self.service.connections.connections()
                                         if type(c).__name__.lower().startswith("stomp")), "the STOMP close")

        # HTTP: a queue dead-lettering to the default exchange's queue
        # "dead"; a message received and given back (redelivered), then
        # received and nacked without requeue (dead-lettered).
        response, _ = yield self.http("PUT", "/vhosts/%2F/queues/dead")
        self.assertIn(response.code, (200, 201))
        response, _ = yield self.http("PUT", "/vhosts/%2F/queues/h", json={"arguments": {
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}})
        self.assertIn(response.code, (200, 201))
        response, _ = yield self.http("POST", "/vhosts/%2F/queues/h/messages", json={"body": "x"})
        self.assertEqual(response.code, 201)
        for requeue in (True, False):
            response, got = yield self.http("POST", "/vhosts/%2F/queues/h/receive")
            handles = [m["handle"] for m in got["messages"]]
            self.assertEqual(len(handles), 1)
            response, _ = yield self.http("POST", "/vhosts/%2F/queues/h/nack",
                                          json={"handles": handles, "requeue": requeue})
            self.assertEqual(response.code, 200)
        self.assertEqual(len(self.broker.default_vhost.queues["dead"]), 1)

        after = yield self.scrape()
        stomp_listener = self.service.listeners[0].spec
        moved = {
            ("qmq_messages_published_total", (("protocol", "stomp"),)): 2,
            ("qmq_messages_delivered_total", (("protocol", "stomp"),)): 1,
            ("qmq_messages_acked_total", (("protocol", "stomp"),)): 1,
            ("qmq_messages_published_total", (("protocol", "http"),)): 1,
            ("qmq_messages_delivered_total", (("protocol", "http"),)): 2,
            ("qmq_messages_unroutable_dropped_total", (("vhost", "/"),)): 1,
            ("qmq_messages_redelivered_total", (("vhost", "/"),)): 1,
            ("qmq_messages_dead_lettered_total", (("vhost", "/"),)): 1,
            ("qmq_connections_opened_total", (("listener", stomp_listener),)): 1,
            ("qmq_connections_closed_total", (("listener", stomp_listener),)): 1,
            ("qmq_queue_messages_published_total", (("queue", "m"), ("vhost", "/"))): 1,
            ("qmq_queue_messages_delivered_total", (("queue", "m"), ("vhost", "/"))): 1,
            ("qmq_queue_messages_published_total", (("queue", "h"), ("vhost", "/"))): 1,
        }
        for (sample, labels), delta in moved.items():
            was = value(before, sample, **dict(labels))
            now = value(after, sample, **dict(labels))
            self.assertEqual(now - was, delta, f"{sample}{dict(labels)}: {was} -> {now}")

    @defer.inlineCallbacks
    def test_health_answers(self) -> Any:
        response, body = yield self.http("GET", "/health/live")
        self.assertEqual((response.code, body), (200, {"status": "ok"}))
        response, body = yield self.http("GET", "/health/ready")
        self.assertEqual(response.code, 200)
        self.assertEqual(body, {"status": "ok", "checks": {
            "listeners": {"ok": True}, "store": {"ok": True}, "alarms": {"ok": True, "alarms": []}}})
        response, body = yield self.http("GET", "/health/checks/listeners")
        self.assertEqual((response.code, body["ok"]), (200, True))
        self.assertEqual(sorted(r["port"] for r in body["listeners"]), sorted([self.stomp_port, self.http_port]))
        response, body = yield self.http("GET", f"/health/checks/port-listener/{self.stomp_port}")
        self.assertEqual((response.code, body["ok"], body["listeners"][0]["protocol"]), (200, True, "stomp"))
        # A listener that stops: readiness fails, naming the check.
        yield self.service.listeners[0].stopService()
        response, body = yield self.http("GET", "/health/ready")
        self.assertEqual((response.code, body["status"], body["checks"]["listeners"]), (503, "failing", {"ok": False}))
        self.assertEqual(response.headers.getRawHeaders("retry-after"), ["5"])
        response, body = yield self.http("GET", f"/health/checks/port-listener/{self.stomp_port}")
        self.assertEqual((response.code, body["ok"]), (503, False))
        response, body = yield self.http("GET", "/health/checks/nothing")
        self.assertEqual((response.code, body["code"]), (404, "not-found"))
        response, body = yield self.http("GET", "/health/checks/port-listener/http")
        self.assertEqual(response.code, 400)
