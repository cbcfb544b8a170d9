"""Tests for retention and range scans (L{qmq.store.scan},
L{qmq.core.vhost.VirtualHost.scan}) on the commit log: a real broker on a
L{Clock}, real segment files in a temporary directory."""

from __future__ import annotations

import itertools
import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from qmq.core.broker import Broker
from qmq.core.errors import NotFound, PreconditionFailed
from qmq.core.store import ScanPage
from qmq.core.vhost import make_cursor, parse_cursor
from qmq.store.log import CommitLogStore
from qmq.store.scan import read_page
from tests.test_store_log import ManualIO, StoreTestCase, Taker


class ScanTestCase(StoreTestCase):
    def scan(self, queue: str, start: float, end: float, **kw) -> ScanPage:
        page = self.successResultOf(self.vhost.scan(queue, start, end, **kw))
        self.assertIsInstance(page, ScanPage)
        return page

    def scan_all(self, queue: str, start: float, end: float, limit: int = 3) -> list[int]:
        """Every id of a scan, page by page (bounded)."""
        ids: list[int] = []
        cursor = None
        for _ in range(1000):
            page = self.scan(queue, start, end, cursor=cursor, limit=limit)
            self.assertLessEqual(len(page.messages), limit)
            ids.extend(m.id for m in page.messages)
            if page.next_cursor is None:
                return ids
            cursor = page.next_cursor
        self.fail("the scan did not end")

    def publish_at(self, queue: str, times: list[float], **kw) -> list:
        sent = []
        for t in times:
            self.clock.advance(t - self.clock.seconds())
            m = self.broker.new_message("", queue, {"n": str(t)}, b"body %r" % t, persistent=True)
            m.priority = 3
            self.vhost.publish(m)
            sent.append(m)
        self.turn()
        return sent


class RangeScanTests(ScanTestCase):
    def test_range_and_fields(self) -> None:
        """A scan returns the messages published in [start, end), with their
        fields, by id, without consuming them."""
        self.vhost.declare_queue("q")
        sent = self.publish_at("q", [100.0 + i for i in range(10)])
        page = self.scan("q", 102, 107)
        self.assertEqual([m.id for m in page.messages], [m.id for m in sent[2:7]])
        self.assertIsNone(page.next_cursor)
        got = page.messages[0]
        self.assertEqual(got.id, sent[2].id)
        self.assertEqual(
            (got.timestamp, got.headers, got.body, got.priority, got.routing_key, got.persistent),
            (102.0, {"n": "102.0"}, b"body 102.0", 3, "q", True),
        )
        # Not consumed.
        self.assertEqual(len(self.vhost.queue("q")), 10)

    def test_pages(self) -> None:
        """Pages of a bounded size, each resuming exactly after the last."""
        self.vhost.declare_queue("q")
        sent = self.publish_at("q", [float(i) for i in range(1, 12)])
        first = self.scan("q", 0, 100, limit=4)
        self.assertEqual([m.id for m in first.messages], [m.id for m in sent[:4]])
        self.assertEqual(parse_cursor(first.next_cursor), sent[3].id)
        self.assertEqual(self.scan_all("q", 0, 100, limit=4), [m.id for m in sent])
        self.assertEqual(self.scan_all("q", 0, 100, limit=1), [m.id for m in sent])

    def test_page_decodes_about_its_limit(self) -> None:
        """A page decodes the records it returns, not every record of the
        queue in the segment: a record above the page's ids is passed over
        on its id (a scan of a big segment paged by 1,000 read every
        message of it per page)."""
        import qmq.store.scan as scan  # noqa: PLC0415

        self.vhost.declare_queue("q")
        sent = self.publish_at("q", [float(i) for i in range(1, 301)])
        calls = []
        real = scan.decode_publish_fields

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(args[1])
            return real(*args, **kwargs)

        self.patch(scan, "decode_publish_fields", counting)
        page = self.scan("q", 0, 1000, limit=10)
        self.assertEqual([m.id for m in page.messages], [m.id for m in sent[:10]])
        self.assertLessEqual(len(calls), 2 * 10)
        del calls[:]
        self.assertEqual(self.scan_all("q", 0, 1000, limit=10), [m.id for m in sent])
        self.assertLessEqual(len(calls), 2 * 300 + 2 * 10)

    def test_other_queues_and_vhosts(self) -> None:
        """Only the queue asked for, in its virtual host."""
        self.vhost.declare_queue("q")
        self.vhost.declare_queue("qq")
        other = self.broker.add_vhost("other")
        other.declare_queue("q")
        mine = self.publish_at("q", [1.0, 2.0])
        self.publish_at("qq", [3.0])
        other.publish(self.broker.new_message("", "q", None, b"o", persistent=True))
        self.vhost.publish(self.broker.new_message("", "q", None, b"np", persistent=False))
        self.turn()
        self.assertEqual(self.scan_all("q", 0, 100), [m.id for m in mine])

    def test_unacked_and_retained(self) -> None:
        """Acked messages of a queue with retention are still scanned;
        queued and delivered-unacked ones too."""
        self.vhost.declare_queue("q", arguments={"x-retention": 3600})
        sent = self.publish_at("q", [float(i) for i in range(1, 7)])
        taker = Taker(prefetch=4)
        self.vhost.queue("q").add_consumer(taker)
        taker.got[:2] = [(m, q) for m, q in taker.got[:2]]
        acked, unacked = taker.got[:2], taker.got[2:]
        for m, q in acked:
            q.ack(taker, m)
        self.turn()
        self.assertEqual(self.scan_all("q", 0, 100), [m.id for m in sent])
        self.assertEqual(len(unacked), 2)

    def test_new_queue_of_the_same_name(self) -> None:
        """A queue deleted and declared again does not show its
        predecessor's messages."""
        self.vhost.declare_queue("q", arguments={"x-retention": 3600})
        self.publish_at("q", [1.0])
        self.vhost.delete_queue("q")
        self.turn()
        self.vhost.declare_queue("q")
        new = self.publish_at("q", [2.0])
        self.assertEqual(self.scan_all("q", 0, 100), [new[0].id])
        self.restart()
        self.assertEqual(self.scan_all("q", 0, 100), [new[0].id])

    def test_waits_for_the_write(self) -> None:
        """A page sees every publish made before it: it waits until they are
        written."""
        io = ManualIO()
        self.restart(io=io)
        self.vhost.declare_queue("q")
        while io.jobs:
            io.run()
        m = self.broker.new_message("", "q", None, b"x", persistent=True)
        self.vhost.publish(m)
        d = self.vhost.scan("q", 0, 100)
        self.assertNoResult(d)
        while io.jobs:
            io.run()
        page = self.successResultOf(d)
        self.assertEqual([x.id for x in page.messages], [m.id])

    def test_errors(self) -> None:
        """Bad arguments, an unknown queue and a queue without a log are
        clear errors."""
        self.vhost.declare_queue("q")
        self.vhost.declare_queue("mem", durable=False)
        self.assertRaises(NotFound, self.vhost.scan, "nope", 0, 1)
        bad = [
            ((0, 1), {"limit": 0}),
            ((0, 1), {"limit": 1001}),
            ((0, 1), {"limit": True}),
            ((2, 1), {}),
            ((float("nan"), 1), {}),
            (("0", 1), {}),
            ((0, 1), {"cursor": "x12"}),
            ((0, 1), {"cursor": "i" + "f" * 17}),
            ((0, 1), {"cursor": 5}),
        ]
        for args, kw in bad:
            with self.assertRaises(PreconditionFailed, msg=(args, kw)):
                self.vhost.scan("q", *args, **kw)
        e = self.assertRaises(PreconditionFailed, self.vhost.scan, "mem", 0, 1)
        self.assertIn("not durable", str(e))
        self.assertEqual(parse_cursor(make_cursor(12345)), 12345)

    def test_memory_store(self) -> None:
        """With the memory store even a durable queue has nothing to scan."""
        broker = Broker(Clock())
        broker.default_vhost.declare_queue("q")
        e = self.assertRaises(PreconditionFailed, broker.default_vhost.scan, "q", 0, 1)
        self.assertIn('store = "log"', str(e))


class RetentionTests(ScanTestCase):
    segment_size = 4096

    def fill(self, queue: str, n: int, t0: float) -> list:
        """Publish and ack C{n} messages of 300 bytes, one per second."""
        q = self.vhost.queue(queue)
        taker = Taker()
        q.add_consumer(taker)
        sent = []
        for i in range(n):
            self.clock.advance(t0 + i - self.clock.seconds())
            sent.append(self.send(queue, b"r" * 300))
            taker.ack_all()
            self.turn()
        q.remove_consumer(taker)
        return sent

    def settle_space(self) -> None:
        for _ in range(3):
            self.store.compact()
            self.turn()

    def test_kept_then_deleted(self) -> None:
        """Segments of acked messages of a queue with retention stay for
        the retention period after the ack, then go; a queue without
        retention gives its space back at once."""
        self.vhost.declare_queue("plain")
        self.fill("plain", 40, 10.0)
        self.settle_space()
        self.assertLessEqual(self.store.disk_usage(), 2 * 4096)

        self.vhost.declare_queue("kept", arguments={"x-retention": 100})
        sent = self.fill("kept", 40, 100.0)
        self.settle_space()
        self.assertGreater(self.store.disk_usage(), 40 * 300)
        self.assertEqual(self.scan_all("kept", 0, 1000, limit=7), [m.id for m in sent])
        # 100 s after the first acks, the oldest segments go; the rest stay.
        self.clock.advance(100 + 100 + 15 - self.clock.seconds())
        self.settle_space()
        left = self.scan_all("kept", 0, 1000, limit=7)
        self.assertTrue(0 < len(left) < 40, len(left))
        self.assertEqual(left, [m.id for m in sent[-len(left) :]])
        self.clock.advance(1000)
        self.settle_space()
        self.assertEqual(self.scan_all("kept", 0, 1000), [])
        self.assertLessEqual(self.store.disk_usage(), 2 * 4096)

    def test_survives_restart(self) -> None:
        """The time an acked message is kept until is in its settle record:
        a restart keeps it just as long."""
        self.vhost.declare_queue("kept", arguments={"x-retention": 100})
        sent = self.fill("kept", 20, 100.0)
        now = self.clock.seconds()
        self.restart()
        self.clock.advance(now)
        self.settle_space()
        self.assertEqual(self.scan_all("kept", 0, 1000), [m.id for m in sent])
        self.clock.advance(200)
        self.settle_space()
        self.assertEqual(self.scan_all("kept", 0, 1000), [])

    def test_not_compacted_away(self) -> None:
        """A sparse segment kept for retention is not compacted (its
        retained messages are not live records to copy)."""
        self.vhost.declare_queue("kept", arguments={"x-retention": 100})
        self.vhost.declare_queue("held")
        held = self.send("held", b"h" * 10)  # one live record in segment 0
        sent = self.fill("kept", 30, 1.0)
        self.settle_space()
        self.assertEqual(self.store.compactions, 0)
        self.assertEqual(self.scan_all("kept", 0, 1000), [m.id for m in sent])
        self.clock.advance(500)
        self.settle_space()
        self.assertGreater(self.store.compactions, 0)
        self.assertEqual(self.scan_all("held", 0, 1000), [held.id])
        self.assertEqual(self.scan_all("kept", 0, 1000), [])

    def test_retention_defaults(self) -> None:
        """x-retention comes from a queue's arguments or its virtual host's
        queue_defaults; 0 is none."""
        self.vhost.set_queue_defaults({"x-retention": 50})
        self.assertEqual(self.vhost.declare_queue("a", on_demand=True).policy.retention, 50)
        q = self.vhost.declare_queue("b", on_demand=True, arguments={"x-retention": 0})
        self.assertIsNone(q.policy.retention)
        with self.assertRaises(PreconditionFailed):
            self.vhost.declare_queue("c", arguments={"x-retention": -1})

    def test_compaction_during_scan(self) -> None:
        """A message copied forward by compaction is scanned once, and a
        scan paged across the copy neither repeats nor skips."""
        self.vhost.declare_queue("q")
        self.vhost.declare_queue("fast")
        old = self.send("q", b"old")
        self.turn()
        for _ in range(30):
            m = self.send("fast", b"f" * 300)
            self.turn()
            self.store.settle(self.vhost.queue("fast"), m, "ack")
            self.vhost.queue("fast").purge()
        self.turn()
        newer = [self.send("q", b"new %d" % i) for i in range(3)]
        self.turn()
        first = self.scan("q", 0, 10, limit=2)
        self.assertEqual([m.id for m in first.messages], [old.id, newer[0].id])
        self.settle_space()
        self.assertGreater(self.store.compactions, 0)
        rest = self.scan("q", 0, 10, cursor=first.next_cursor, limit=10)
        self.assertEqual([m.id for m in rest.messages], [m.id for m in newer[1:]])
        self.assertEqual(self.scan_all("q", 0, 10), [old.id] + [m.id for m in newer])


class PageTests(SynchronousTestCase):
    """L{read_page} on its own: exact pages across many segments whatever
    the read budget."""

    def test_budget(self) -> None:
        directory = self.mktemp()
        clock = Clock()
        store = CommitLogStore(
            directory, reactor=clock, io=lambda f, *a: _now(f, *a), segment_size=4096,
            compact_interval=0,
        )  # fmt: skip
        broker = Broker(clock, store=store)
        vhost = broker.default_vhost
        vhost.declare_queue("q")
        vhost.declare_queue("r")
        ids = []
        for i in range(200):
            clock.advance(1)
            m = broker.new_message("", "q" if i % 3 else "r", None, b"x" * 100, persistent=True)
            vhost.publish(m)
            if i % 3:
                ids.append(m.id)
            broker.batcher.flush_all()
        store.flush()
        plan = sorted(
            (info.min_id, n, store._sizes[n])
            for n, info in store._index.segments.items()
            if store._sizes.get(n)
        )
        self.assertGreater(len(plan), 5)
        for budget, limit, marks in itertools.product((0, 1, 5000, 1 << 30), (1, 7, 1000),
                                                      (None, {})):
            if True:
                got, after = [], 0
                for _ in range(1000):
                    page, following = read_page(
                        directory, plan, "/", "q", 0, 1e9, after, limit, budget, marks
                    )
                    self.assertLessEqual(len(page), limit)
                    got.extend(m.id for m in page)
                    if following is None:
                        break
                    self.assertGreaterEqual(following, after)
                    after = following
                self.assertEqual(got, ids, (budget, limit, marks))
        self.successResultOf(store.close())


class MarksTests(SynchronousTestCase):
    """A page begins near its cursor and stops early with the segment's
    marks (L{qmq.store.scan.Marks}), ids out of order included."""

    def test_out_of_order_ids(self) -> None:
        from qmq.store import scan  # noqa: PLC0415
        from qmq.store.record import encode_publish  # noqa: PLC0415
        from qmq.store.segment import SegmentReader, encode_header, segment_name  # noqa: PLC0415

        # ids 1-1500, with copies of 5, 6, 7 and 1200 (as compaction writes
        # them) in the middle, and records of another queue between
        order = list(range(1, 1001)) + [5, 6, 7, 1200] + list(range(1001, 1501))
        out = [encode_header(1, 1)]
        for i, mid in enumerate(order):
            q = b"q" if i % 4 else b"r"
            head, tail = encode_publish(mid, 10.0, 0.0, 0, True, b"/", "", q.decode(), None,
                                        b"x", [q])
            out.append(head + tail)
        directory = self.mktemp()
        os.makedirs(directory)
        data = b"".join(out)
        with open(os.path.join(directory, segment_name(1)), "wb") as f:
            f.write(data)
        want = sorted({mid for i, mid in enumerate(order) if i % 4})
        walked = []
        real = SegmentReader.records

        def counting(reader, start=None):  # type: ignore[no-untyped-def]
            for r in real(reader, start):
                walked.append(r)
                yield r

        self.patch(SegmentReader, "records", counting)
        plan = [(1, 1, len(data))]
        for limit in (1, 7, 50):
            marks: dict = {}
            got, after, pages = [], 0, 0
            del walked[:]
            for _ in range(5000):
                page, following = scan.read_page(directory, plan, "/", "q", 0, 100, after,
                                                 limit, scan.PAGE_BYTES, marks)
                pages += 1
                got.extend(m.id for m in page)
                if following is None:
                    break
                after = following
            self.assertEqual(got, want, limit)
            # one walk to make the marks, then a few chunks and a page a
            # page (the copies hold some pages back), not the segment a page
            self.assertLess(len(walked), len(order) + pages * (3 * scan.CHUNK + 4 * limit + 8),
                            limit)
            self.assertLess(len(walked), pages * len(order) / 2, limit)
            self.assertEqual(marks[1].walked, len(data))


def _now(f, *args):
    from twisted.internet.defer import maybeDeferred

    return maybeDeferred(f, *args)


class ThreadScanTests(TestCase):
    """The real reader thread."""

    def test_real_thread(self):
        from twisted.internet import reactor

        directory = self.mktemp()
        os.makedirs(directory)
        store = CommitLogStore(directory, reactor=reactor, compact_interval=0)
        broker = Broker(reactor, store=store)
        vhost = broker.default_vhost
        vhost.declare_queue("q")
        m = broker.new_message("", "q", None, b"threaded", persistent=True)
        vhost.publish(m)
        broker.batcher.flush_all()

        def check(page):
            self.assertEqual([(x.id, x.body) for x in page.messages], [(m.id, b"threaded")])
            return store.close()

        return vhost.scan("q", 0, 1e12).addCallback(check)
