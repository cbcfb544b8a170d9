"""Tests for bodies of long backlogs left on disk (L{qmq.core.queue.Queue.offload},
L{qmq.store.log.CommitLogStore.load}): a real broker on a L{Clock}, real
segment files in a temporary directory."""

from __future__ import annotations

from twisted.internet.defer import gatherResults
from twisted.trial.unittest import TestCase

from qmq.core.broker import Broker
from qmq.core.message import OnDisk
from qmq.store.log import CommitLogStore
from qmq.store.segment import list_segments
from tests.test_store_log import StoreTestCase, Taker


class OffloadCase(StoreTestCase):
    backlog = 1000

    def start(self, io=None, **kw):
        kw.setdefault("backlog_memory", self.backlog)
        if io is None:
            return super().start(**kw)
        return super().start(io, **kw)

    def fill(self, queue: str = "q", n: int = 50, size: int = 100) -> list:
        sent = []
        for i in range(n):
            sent.append(self.send(queue, bytes([65 + i % 26]) * size, {"n": str(i)}))
            if i % 10 == 9:
                self.turn()
        self.turn()
        return sent

    def on_disk(self, queue: str = "q") -> int:
        return sum(m.body.__class__ is OnDisk for m in self.vhost.queue(queue).messages())


class OffloadTests(OffloadCase):

    def test_offload_and_read_back(self) -> None:
        """Past the threshold, bodies and headers leave memory once written;
        delivery reads them back, in order, as they were sent."""
        q = self.vhost.declare_queue("q")
        sent = self.fill()
        offloaded = self.on_disk()
        self.assertGreater(offloaded, 30)
        self.assertEqual(q.ready_bytes, 50 * 100)
        for m in q.messages():
            if m.body.__class__ is OnDisk:
                self.assertIsNone(m.headers)
                self.assertEqual(len(m.body), 100)
        # The first ~threshold bytes stay in memory.
        self.assertEqual(q.messages()[0].body, sent[0].body)
        taker = Taker(prefetch=1000)
        q.add_consumer(taker)
        got = [m for m, _ in taker.got]
        self.assertEqual([m.id for m in got], [m.id for m in sent])
        self.assertEqual([m.body for m in got], [m.body for m in sent])
        self.assertEqual([m.headers for m in got], [m.headers for m in sent])
        self.assertEqual(self.store.loaded, offloaded)
        self.assertEqual(q.ready_bytes, 0)
        pinned = sum(i.offloaded for i in self.store._index.segments.values())
        self.assertEqual(pinned, 0)

    def test_get_reads_back(self) -> None:
        q = self.vhost.declare_queue("q")
        sent = self.fill(n=30)
        got = [q.get() for _ in range(30)]
        self.assertEqual([m.body for m in got], [m.body for m in sent])
        self.assertIsNone(q.get())

    def test_shared_message_not_touched(self) -> None:
        """A message also held by a memory-only queue keeps its body there:
        the durable queue swaps in its own light copy."""
        self.vhost.declare_exchange("fan", "fanout")
        self.vhost.declare_queue("d")
        self.vhost.declare_queue("m", durable=False)
        self.vhost.bind("d", "fan")
        self.vhost.bind("m", "fan")
        sent = [self.send("", b"x" * 100, exchange="fan") for _ in range(30)]
        self.turn()
        self.assertGreater(self.on_disk("d"), 0)
        self.assertEqual(self.on_disk("m"), 0)
        self.assertEqual([m.body for m in self.vhost.queue("m").messages()], [m.body for m in sent])
        self.assertTrue(all(m.body == b"x" * 100 for m in sent))

    def test_not_written_not_offloaded(self) -> None:
        """Only messages already written leave memory."""
        q = self.vhost.declare_queue("q")
        for _ in range(30):
            self.send("q", b"y" * 100)
        self.assertEqual(self.on_disk(), 0)
        self.turn()
        self.assertGreater(self.on_disk(), 0)
        self.assertEqual(len(q), 30)

    def test_discard_unpins(self) -> None:
        """Purging or deleting offloaded messages settles them and lets their
        segments be compacted again."""
        q = self.vhost.declare_queue("q")
        self.fill()
        segments = self.store._index.segments
        self.assertGreater(sum(i.offloaded for i in segments.values()), 0)
        q.purge()
        self.assertEqual(sum(i.offloaded for i in segments.values()), 0)
        self.restart()
        self.assertEqual(len(self.vhost.queue("q")), 0)

    def test_recovery_leaves_bodies_on_disk(self) -> None:
        """A long backlog comes back after a restart with its bodies on disk
        past the threshold; delivery reads them back."""
        self.vhost.declare_queue("q")
        sent = self.fill(n=60)
        self.restart()
        q = self.vhost.queue("q")
        self.assertGreater(self.on_disk(), 40)
        self.assertEqual(q.ready_bytes, 60 * 100)
        taker = Taker(prefetch=1000)
        q.add_consumer(taker)
        self.assertEqual([m.body for m, _ in taker.got], [m.body for m in sent])
        self.assertEqual([m.headers for m, _ in taker.got], [m.headers for m in sent])
        taker.ack_all()
        self.restart()
        self.assertEqual(len(self.vhost.queue("q")), 0)

    def test_moved_by_compaction(self) -> None:
        """A record copied forward by compaction is still found: the store
        looks where the index says it is now."""
        q = self.vhost.declare_queue("q")
        sent = self.fill(n=30)
        for info in self.store._index.segments.values():
            info.offloaded = 0  # as if the pins were lost: compaction may copy
        self.store.compact_ratio = 1.0
        self.store._roll()
        self.store._place()
        self.turn()
        self.store._sealed = self.store._active
        places = [m.body for m in q.messages() if m.body.__class__ is OnDisk]
        for _ in range(20):
            if self.store.compact() is None:
                break
            self.turn()
        self.turn()
        gone = {n for n, _ in list_segments(self.dir)}
        self.assertTrue(any(p >> 102 not in gone for p in places))
        taker = Taker(prefetch=1000)
        q.add_consumer(taker)
        self.assertEqual([m.body for m, _ in taker.got], [m.body for m in sent])

    def test_damaged_record_dropped(self) -> None:
        """A body that cannot be read back is not delivered: its message is
        dropped (settled), the rest are delivered."""
        q = self.vhost.declare_queue("q")
        sent = self.fill(n=40)
        victim = q.messages()[-5]
        self.assertIs(victim.body.__class__, OnDisk)
        number = victim.body >> 102
        offset = (victim.body >> 62) & ((1 << 40) - 1)
        path = dict(list_segments(self.dir))[number]
        with open(path, "r+b") as f:
            f.seek(offset + 30)
            byte = f.read(1)
            f.seek(offset + 30)
            f.write(bytes([byte[0] ^ 0xFF]))
        self.store._close_read_fds()
        taker = Taker(prefetch=1000)
        q.add_consumer(taker)
        got = [m.id for m, _ in taker.got]
        self.assertEqual(got, [m.id for m in sent if m.id != victim.id])
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        taker.ack_all()
        self.turn()
        self.assertEqual(self.store._index.live_messages(), 0)

    def test_off(self) -> None:
        """backlog_memory = 0 keeps every body in memory."""
        self.restart(backlog_memory=0)
        self.vhost.declare_queue("q")
        self.fill()
        self.assertEqual(self.on_disk(), 0)
        self.restart(backlog_memory=0)
        self.assertEqual(self.on_disk(), 0)


class ThreadOffloadTests(TestCase):
    """The real writer thread: bodies leave memory once their batch is
    written, and come back on delivery."""

    def test_real_thread(self):
        from twisted.internet import reactor

        directory = self.mktemp()
        store = CommitLogStore(directory, reactor=reactor, compact_interval=0, backlog_memory=500)
        broker = Broker(reactor, store=store)
        vhost = broker.default_vhost
        q = vhost.declare_queue("q")
        waiters = []
        sent = []
        for i in range(40):
            m = broker.new_message("", "q", {"i": str(i)}, b"%03d" % i * 20, persistent=True)
            sent.append(m)
            waiters.append(vhost.publish_to((q,), m))
        broker.batcher.flush_all()

        def written(_):
            self.assertGreater(sum(m.body.__class__ is OnDisk for m in q.messages()), 20)
            taker = Taker(prefetch=100)
            q.add_consumer(taker)
            self.assertEqual([m.body for m, _ in taker.got], [m.body for m in sent])
            self.assertEqual([m.headers for m, _ in taker.got], [m.headers for m in sent])
            return store.close()

        return gatherResults(waiters).addCallback(written)


class OffloadDeliveryTests(OffloadCase):
    """Bodies on disk meet the delivery rules: dead letters, priorities."""

    def test_dead_letter_reads_back(self) -> None:
        """A message expiring with its body on disk is dead-lettered whole."""
        self.vhost.declare_exchange("dlx", "fanout")
        self.vhost.declare_queue("dlq", durable=False)
        self.vhost.bind("dlq", "dlx")
        self.vhost.declare_queue(
            "q", arguments={"x-message-ttl": 5000, "x-dead-letter-exchange": "dlx"}
        )
        sent = self.fill(n=30)
        self.assertGreater(self.on_disk(), 10)
        self.clock.advance(10)
        self.turn()
        dead = self.vhost.queue("dlq").messages()
        self.assertEqual([m.body for m in dead], [m.body for m in sent])
        self.assertEqual([m.headers["n"] for m in dead], [m.headers["n"] for m in sent])

    def test_priority_queue_recovered(self) -> None:
        """A priority queue's recovered backlog with bodies on disk is read
        back one by one, in priority order."""
        self.vhost.declare_queue("p", arguments={"x-max-priority": 5})
        sent = []
        for i in range(30):
            m = self.broker.new_message("", "p", {"i": str(i)}, b"%03d" % i * 40, persistent=True)
            m.priority = i % 3
            self.vhost.publish(m)
            sent.append(m)
        self.turn()
        self.restart()
        q = self.vhost.queue("p")
        taker = Taker(prefetch=100)
        q.add_consumer(taker)
        want = sorted(sent, key=lambda m: (-m.priority, m.id))
        self.assertEqual([m.body for m, _ in taker.got], [m.body for m in want])
        self.assertEqual([m.headers for m, _ in taker.got], [m.headers for m in want])
