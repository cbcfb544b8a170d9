"""Delivery options through the frontends: STOMP and the HTTP API both read
them with the core's one parser (L{qmq.core.options}), with the same
bounds, the same meaning (a TTL counts from the publish), and delays the
core holds (durably with the commit log, whichever frontend published).

Clocks are L{Clock}s: the broker's, so expiry and delays are driven by the
test. The HTTP API is the real site on 127.0.0.1.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.core.options import MAX_SPAN_MS
from qmq.store.log import CommitLogStore
from tests.test_stomp_session import Client
from tests.test_store_log import sync_io
from tests.web_api_helpers import ApiSiteMixin

Q = "/api/v1/vhosts/%2F/queues"


class FrontendsTestCase(ApiSiteMixin, unittest.TestCase):
    """A broker on a L{Clock} (starting at 1000 s) with the HTTP API and a
    STOMP factory."""

    store = None

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock, store=self.store)
        self.broker.recover()
        self.start_site(broker=self.broker)
        from qmq.stomp.protocol import StompFactory  # noqa: PLC0415
        from qmq.stomp.settings import StompSettings  # noqa: PLC0415

        self.factory = StompFactory(self.broker, StompSettings(), clock=self.clock)

    def stomp(self) -> Client:
        c = Client(self.factory)
        c.connect("1.2")
        return c

    @defer.inlineCallbacks
    def http_publish(self, queue: str, **fields: object) -> defer.Deferred:
        code, _, _, doc = yield self.call("POST", f"{Q}/{queue}/messages", {"body": "x", **fields})
        return code, doc

    def ready(self, queue: str) -> list[bytes]:
        return [m.body for m in self.broker.default_vhost.queues[queue].messages()]


class TtlFromPublishTests(FrontendsTestCase):
    """A TTL counts from the publish in every frontend, also for a delayed
    message (on d8fe3b8 the HTTP API counted it from the delayed publish:
    this message lived on after its time)."""

    @defer.inlineCallbacks
    def test_http_ttl_counts_from_publish(self) -> None:
        code, doc = yield self.http_publish("q", ttl=5000, delay=2000)
        self.assertEqual(code, 201, doc)
        [m] = self.broker.default_vhost.queues["q"].delayed_messages()
        self.assertEqual((m.timestamp, m.expires, m.deliver_at), (1000.0, 1005.0, 1002.0))
        self.clock.advance(4)
        self.assertEqual(self.ready("q"), [b"x"])
        self.clock.advance(1.5)  # 5.5 s after the publish, 3.5 s after the delay
        self.assertEqual(self.ready("q"), [])

    @defer.inlineCallbacks
    def test_ttl_shorter_than_delay_never_delivered(self) -> None:
        """Both frontends: a message due after its expiry is never seen."""
        yield self.http_publish("q", ttl=1000, delay=2000)
        c = self.stomp()
        c.publish("/queue/q", b"y", ttl="1000", delay="2000")
        queue = self.broker.default_vhost.queues["q"]
        self.assertEqual([m.body for m in queue.delayed_messages()], [b"x", b"y"])
        self.clock.advance(2.5)
        self.assertEqual((self.ready("q"), queue.delayed_messages()), ([], []))

    def test_stomp_ttl_counts_from_publish(self) -> None:
        c = self.stomp()
        c.publish("/queue/q", b"x", ttl="5000", delay="2000")
        [m] = self.broker.default_vhost.queues["q"].delayed_messages()
        self.assertEqual((m.timestamp, m.expires, m.deliver_at), (1000.0, 1005.0, 1002.0))


class SameBoundsTests(FrontendsTestCase):
    """One set of bounds: a delay the core takes over STOMP it takes over
    HTTP (on d8fe3b8 the HTTP API refused any delay above a day)."""

    @defer.inlineCallbacks
    def test_long_delay_both(self) -> None:
        week = 7 * 86_400_000
        code, doc = yield self.http_publish("q", delay=week)
        self.assertEqual(code, 201, doc)
        c = self.stomp()
        c.send("SEND", {"destination": "/queue/q", "delay": str(week), "receipt": "r"})
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        self.assertEqual(len(self.broker.default_vhost.queues["q"].delayed_messages()), 2)

    @defer.inlineCallbacks
    def test_over_the_bound_refused_by_both(self) -> None:
        code, doc = yield self.http_publish("q", delay=MAX_SPAN_MS + 1)
        self.assertEqual(code, 400)
        self.assertIn(f"'delay' must be a whole number from 0 to {MAX_SPAN_MS}", doc["detail"])
        c = self.stomp()
        c.send("SEND", {"destination": "/queue/q", "delay": str(MAX_SPAN_MS + 1)})
        [error] = c.read()
        self.assertEqual((error.command, error.headers["message"]), ("ERROR", "invalid delay header"))
        self.assertIn(f"from 0 to {MAX_SPAN_MS}", error.body.decode())


class HttpDelayTests(FrontendsTestCase):
    @defer.inlineCallbacks
    def test_core_holds_it(self) -> None:
        """A delayed HTTP message is published at once (it has its id)
        and held by its queue until due, as a STOMP one."""
        code, doc = yield self.http_publish("q", delay=1500)
        self.assertEqual(code, 201, doc)
        queue = self.broker.default_vhost.queues["q"]
        [m] = queue.delayed_messages()
        self.assertEqual(doc["ids"], [f"local.{m.id}"])
        self.assertEqual(self.ready("q"), [])
        self.clock.advance(1.5)
        self.assertEqual(self.ready("q"), [b"x"])


class HttpTimesTests(FrontendsTestCase):
    @defer.inlineCallbacks
    def test_expires_deliver_at_ack_timeout(self) -> None:
        """The HTTP API's expires and deliver_at (seconds, as it writes
        times) and ack_timeout reach the same fields as STOMP's headers."""
        code, doc = yield self.http_publish("q", expires=1060.5, deliver_at=1002, ack_timeout=2.5, ttl=90_000)
        self.assertEqual(code, 201, doc)
        c = self.stomp()
        c.publish("/queue/q", b"y", expires="1060500", **{"deliver-at": "1002000", "ack-timeout": "2.5",
                                                           "ttl": "90000"})
        got = self.broker.default_vhost.queues["q"].delayed_messages()
        self.assertEqual([(m.expires, m.deliver_at, m.ack_timeout) for m in got], [(1060.5, 1002.0, 2.5)] * 2)


class DurableHttpDelayTests(FrontendsTestCase):
    """An HTTP delayed message survives a restart of a log-store broker (on
    d8fe3b8 it waited in the frontend's memory, and a restart lost it)."""

    def setUp(self) -> None:
        self.dir = self.mktemp()
        self.store = self.open_store()
        super().setUp()
        self.broker.default_vhost.declare_queue("q", durable=True)

    def open_store(self) -> CommitLogStore:
        return CommitLogStore(self.dir, fsync="never", reactor=Clock(), io=sync_io, compact_interval=0)

    @defer.inlineCallbacks
    def test_survives_restart(self) -> None:
        code, doc = yield self.http_publish("q", delay=60_000, persistent=True, headers={"k": "v"})
        self.assertEqual(code, 201, doc)
        self.broker.batcher.flush_all()
        self.store.flush()
        self.successResultOf(self.store.close())
        self.broker.stop_timers()

        clock = Clock()
        clock.advance(1030)  # half-way through the delay
        store = self.open_store()
        broker = Broker(clock, store=store)
        broker.recover()
        self.addCleanup(store.close)
        self.addCleanup(broker.stop_timers)
        queue = broker.default_vhost.queues["q"]
        self.assertEqual(list(queue.messages()), [])
        [m] = queue.delayed_messages()
        self.assertEqual((f"local.{m.id}", m.body, m.deliver_at), (doc["ids"][0], b"x", 1060.0))
        self.assertEqual(m.headers.get("k"), "v")
        clock.advance(30)
        self.assertEqual([m.body for m in queue.messages()], [b"x"])
