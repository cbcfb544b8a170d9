"""C{/metrics} on the real site: Prometheus text read back with
prometheus-client's parser."""

from __future__ import annotations

import os

from prometheus_client import Histogram
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.web.metrics import MetricsResource, instrument_fsync, issued_ids
from tests.web_api_helpers import ApiSiteMixin

Q = "/api/v1/vhosts/%2F/queues"


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class MetricsTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.start_site()

    @defer.inlineCallbacks
    def scrape(self, headers: dict | None = None) -> defer.Deferred:
        import treq  # noqa: PLC0415

        r = yield treq.get(self.base + "/metrics", headers=headers, pool=self.pool)
        body = yield r.text()
        return r.code, r.headers, body

    @defer.inlineCallbacks
    def test_scrape(self) -> None:
        yield self.call("POST", f"{Q}/work/messages", {"messages": [{"body": "a"}, {"body": "b"}, {"body": "c"}]})
        yield self.call("POST", f"{Q}/work/receive")
        code, headers, body = yield self.scrape()
        self.assertEqual(code, 200)
        self.assertTrue(headers.getRawHeaders("content-type")[0].startswith("text/plain"))
        got = samples(body)
        q = (("queue", "work"), ("vhost", "/"))
        self.assertEqual(got[("qmq_queue_messages_ready", q)], 2)
        self.assertEqual(got[("qmq_queue_messages_unacked", q)], 1)
        self.assertEqual(got[("qmq_queue_consumers", q)], 1)
        self.assertEqual(got[("qmq_vhost_messages_ready", (("vhost", "/"),))], 2)
        self.assertGreaterEqual(got[("qmq_connections", (("protocol", "http"),))], 1)
        self.assertEqual(got[("qmq_memory_alarm", ())], 0)
        http = (("protocol", "http"),)
        self.assertEqual(got[("qmq_messages_published_total", http)], 3)
        self.assertEqual(got[("qmq_messages_delivered_total", http)], 1)
        self.assertEqual(got[("qmq_messages_acked_total", http)], 0)
        self.assertEqual(got[("qmq_queue_messages_published_total", q)], 3)
        self.assertEqual(got[("qmq_queue_messages_delivered_total", q)], 1)

    @defer.inlineCallbacks
    def test_protocols_and_queue_rates(self) -> None:
        """STOMP and HTTP counted apart; a queue's rates in its description."""
        from qmq.core.consumer import Consumer  # noqa: PLC0415
        from qmq.stomp.destinations import DestinationChannel as Channel  # noqa: PLC0415

        clock = self.api.clock = Clock()
        stomp = Channel(self.broker, self.broker.default_vhost, "s", protocol="stomp")
        target = stomp.send_target("/queue/work")
        for i in range(4):
            stomp.publish_target(target, stomp.new_message(target, None, b"m%d" % i, False))
        yield self.call("GET", f"{Q}/work")  # the first reading: rates 0
        _, _, _, doc = yield self.call("POST", f"{Q}/work/receive?max=3")
        yield self.call("POST", f"{Q}/work/ack", {"handles": [m["handle"] for m in doc["messages"][:2]]})
        class Taker(Consumer):
            def deliver(self, message: object, queue: object) -> None:
                stomp.track(self, message)

        taker = Taker(True, 10)
        stomp.subscribe(taker, "/queue/work")
        stomp.settle_delivery(taker, next(iter(taker.unacked)), True)
        clock.advance(2.0)
        _, _, _, doc = yield self.call("GET", f"{Q}/work")
        # The four were published before the first reading, delivered after it.
        self.assertEqual(doc["message_stats"], {"publish": 4, "deliver": 4, "publish_rate": 0.0,
                                                "deliver_rate": 2.0})
        _, _, body = yield self.scrape()
        got = samples(body)
        stomp_label, http = (("protocol", "stomp"),), (("protocol", "http"),)
        self.assertEqual(got[("qmq_messages_published_total", stomp_label)], 4)
        self.assertEqual(got[("qmq_messages_delivered_total", stomp_label)], 1)
        self.assertEqual(got[("qmq_messages_acked_total", stomp_label)], 1)
        self.assertEqual(got[("qmq_messages_delivered_total", http)], 3)
        self.assertEqual(got[("qmq_messages_acked_total", http)], 2)
        # A closed channel's counts stay.
        stomp.close()
        _, _, body = yield self.scrape()
        self.assertEqual(samples(body)[("qmq_messages_published_total", stomp_label)], 4)

    def test_issued_ids_takes_none(self) -> None:
        broker = Broker(reactor)
        self.assertEqual(issued_ids(broker), 0)
        next(broker.message_ids)
        self.assertEqual(issued_ids(broker), 1)
        self.assertEqual(issued_ids(broker), 1)

    def test_max_queues(self) -> None:
        for i in range(5):
            self.broker.default_vhost.declare_queue(f"q{i}")
        resource = MetricsResource(self.ctx, None, max_queues=2)
        got = samples(resource._answer(_FakeRequest()).decode())
        per_queue = [k for k in got if k[0] == "qmq_queue_messages_ready"]
        self.assertEqual(len(per_queue), 2)
        self.assertEqual(got[("qmq_vhost_queues", (("vhost", "/"),))], 5)


class _FakeRequest:
    def setHeader(self, name: bytes, value: bytes) -> None:
        pass


class FsyncTests(unittest.TestCase):
    def test_commit_log_fsyncs_timed(self) -> None:
        """The adapter reaches the commit log's writer (fails if the store
        changes under it) and times each sync."""
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        from qmq.store.log import CommitLogStore  # noqa: PLC0415

        directory = self.mktemp()
        os.makedirs(directory)
        syncs = []
        store = CommitLogStore(directory, reactor=reactor, compact_interval=0, datasync=syncs.append)
        self.addCleanup(store.close)
        histogram = Histogram("t_fsync_seconds", "x", registry=CollectorRegistry())
        self.assertTrue(instrument_fsync(store, histogram))
        self.assertFalse(instrument_fsync(store, histogram))  # once
        broker = Broker(reactor, store=store)
        broker.default_vhost.declare_queue("d")
        broker.default_vhost.publish(broker.new_message("", "d", None, b"x", persistent=True))
        broker.batcher.flush_all()
        d = defer.Deferred()

        def check() -> None:
            if not syncs:
                reactor.callLater(0.01, check)
                return
            count = [s.value for s in histogram.collect()[0].samples if s.name.endswith("_count")][0]
            self.assertGreaterEqual(count, 1)
            d.callback(None)

        check()
        return d


class MetricsAuthTests(ApiSiteMixin, unittest.TestCase):
    """Who may read /metrics (L{qmq.core.access.may_monitor}): an admin, a
    monitoring identity with no permission anywhere, not an ordinary user
    nor a token whose subject is a monitor's name; a refusal is a 403 that
    is not logged as a failed login."""

    def setUp(self) -> None:
        self.start_site()

    @defer.inlineCallbacks
    def test_who_may_read(self) -> None:
        import base64  # noqa: PLC0415

        import jwt  # noqa: PLC0415
        import treq  # noqa: PLC0415
        from twisted.logger import globalLogPublisher  # noqa: PLC0415

        from qmq.auth import (  # noqa: PLC0415
            Authenticator,
            AuthSettings,
            PermissionSettings,
            TokenSettings,
            UserSettings,
        )
        from qmq.auth.passwords import hash_password  # noqa: PLC0415
        from qmq.web.api.settings import ApiSettings  # noqa: PLC0415

        secret = b"s" * 32
        hashed = hash_password("pw", 4)
        self.broker.auth = Authenticator(
            AuthSettings(failure_delay=0.01, failure_max_delay=0.02), reactor,
            users=[UserSettings("root", hashed), UserSettings("joe", hashed), UserSettings("prom", hashed)],
            # prom has no permission in any virtual host: it only monitors.
            permissions={"/": [PermissionSettings("root", ".*", ".*", ".*"), PermissionSettings("joe", "", "", ".*")]},
            tokens={"/": TokenSettings("HS256", secret, read=".*")},
            run=lambda f, *a: defer.maybeDeferred(f, *a),
        )
        self.api.settings = ApiSettings(admins="root", monitors="prom")
        logged: list[str] = []

        def observer(event: dict) -> None:
            if "login failed" in str(event.get("log_format", "")):
                logged.append(event.get("reason", ""))

        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)

        def basic(user: str, password: str = "pw") -> dict:
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

        def bearer(sub: str) -> dict:
            t = jwt.encode({"sub": sub, "exp": reactor.seconds() + 600}, secret, algorithm="HS256")
            return {"Authorization": f"Bearer {t}"}

        cases = (
            ("anonymous", None, 401, None),
            ("admin", basic("root"), 200, None),
            ("monitor", basic("prom"), 200, None),
            ("ordinary user", basic("joe"), 403, "access-refused"),
            ("token named as the monitor", bearer("prom"), 403, "access-refused"),
            ("token named as the admin", bearer("root"), 403, "access-refused"),
        )
        for what, headers, status, code in cases:
            for path in ("/metrics", "/api/v1/health/checks/alarms"):
                r = yield treq.get(self.base + path, headers=headers, pool=self.pool)
                body = yield r.content()
                self.assertEqual(r.code, status, (what, path))
                if code is not None:
                    self.assertIn(code.encode(), body, (what, path))
                    self.assertIn(b"monitors", body)
            if headers is None:
                del logged[:]  # no credentials: a failed login, logged
        self.assertEqual(logged, [], "a refused monitoring read is not a failed login")
        r = yield treq.get(self.base + "/metrics", headers=basic("prom", "wrong"), pool=self.pool)
        yield r.content()
        self.assertEqual(r.code, 401)
        self.assertEqual(len(logged), 1, "bad credentials still are")
        # Liveness and readiness stay open to anyone.
        for path in ("/api/v1/health/live", "/api/v1/health/ready", "/api/v1/health"):
            r = yield treq.get(self.base + path, pool=self.pool)
            yield r.content()
            self.assertEqual(r.code, 200, path)


class DocsTests(unittest.TestCase):
    def test_every_family_documented(self) -> None:
        """docs/monitoring.rst names every family, as it is exposed (a
        counter with its C{_total}), and its RabbitMQ counterpart table
        names no family that does not exist."""
        import re  # noqa: PLC0415

        from qmq.web.metrics import FAMILIES  # noqa: PLC0415

        path = os.path.join(os.path.dirname(__file__), "..", "docs", "monitoring.rst")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, kind in FAMILIES.items():
            exposed = name + "_total" if kind == "counter" else name
            self.assertIn(f"``{exposed}", text, name)
        for named in set(re.findall(r"``(qmq_[a-z_]*[a-z])(?:``|\{)", text)):
            base = named[:-6] if named.endswith("_total") else named
            self.assertIn(base, FAMILIES, named)
            if named.endswith("_total"):
                self.assertEqual(FAMILIES[base], "counter", named)
