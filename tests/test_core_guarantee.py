"""Tests for L{qmq.core.guarantee}: at-most-once, at-least-once and
effectively-once queues, with a L{Clock} for the dedup window, the fake
store for what reaches the store, and the real commit log for what a
restart brings back."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.core.errors import PreconditionFailed, ResourceLimit
from qmq.core.guarantee import AtMostOnceQueue, DedupWindow, EffectivelyOnceQueue
from qmq.core.queue import Queue
from tests.test_core_channel import ChannelTestCase, FakeStore
from tests.test_store_log import StoreTestCase

ONCE = {"x-delivery-guarantee": "effectively-once", "x-dedup-window": 60_000}


class DedupWindowTests(SynchronousTestCase):
    def test_time_and_count_bounds(self) -> None:
        w = DedupWindow(10.0, 3)
        for i, text in enumerate("abc"):
            w.accept(w.key(text), float(i))
        self.assertTrue(w.seen(w.key("a"), 9.9))
        # Accepted at 0, remembered until 10.
        self.assertFalse(w.seen(w.key("a"), 10.0))
        self.assertEqual(len(w), 2)
        # Past max_ids the oldest is forgotten first.
        w.accept(w.key("d"), 10.0)
        w.accept(w.key("e"), 10.0)
        self.assertEqual(len(w), 3)
        self.assertFalse(w.seen(w.key("b"), 10.0))
        self.assertTrue(w.seen(w.key("e"), 10.0))
        self.assertEqual(w.duplicates, 2)

    def test_keys_are_digests(self) -> None:
        """Memory per id does not grow with the id."""
        w = DedupWindow(10.0, 10)
        self.assertEqual(len(w.key("x" * 8000)), 16)
        self.assertNotEqual(w.key("a"), w.key("b"))
        self.assertEqual(w.key("\udcff"), w.key("\udcff"))  # never raises

    def test_accepted_in_the_past(self) -> None:
        """A restored id keeps only what is left of its window."""
        w = DedupWindow(10.0, 10)
        w.accept(w.key("old"), 100.0, accepted_at=85.0)
        w.accept(w.key("recent"), 100.0, accepted_at=95.0)
        self.assertFalse(w.seen(w.key("old"), 100.0))
        self.assertTrue(w.seen(w.key("recent"), 104.9))
        self.assertFalse(w.seen(w.key("recent"), 105.0))


class ArgumentTests(ChannelTestCase):
    def test_classes(self) -> None:
        v = self.vhost
        self.assertIs(type(v.declare_queue("plain")), Queue)
        self.assertIs(
            type(v.declare_queue("amo", arguments={"x-delivery-guarantee": "at-most-once"})),
            AtMostOnceQueue,
        )
        q = v.declare_queue("eo", arguments={"delivery-guarantee": "effectively-once"})
        self.assertIs(type(q), EffectivelyOnceQueue)
        self.assertEqual((q.window.seconds, q.window.max_ids), (600.0, 10_000))

    def test_on_demand_from_defaults(self) -> None:
        self.vhost.set_queue_defaults({"x-delivery-guarantee": "at-most-once"})
        self.assertIs(type(self.channel.send_target("/queue/x")[0]), AtMostOnceQueue)

    def test_bad_values(self) -> None:
        for arguments in (
            {"x-delivery-guarantee": "exactly-once"},
            {"x-dedup-window": 0},
            {"x-dedup-max-ids": 1_000_001},
        ):
            with self.assertRaises(PreconditionFailed):
                self.vhost.declare_queue("q", arguments=arguments)
        self.assertNotIn("q", self.vhost.queues)


class EffectivelyOnceTests(ChannelTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.queue = self.vhost.declare_queue("eo", arguments=ONCE)

    def test_duplicate_dropped_within_window(self) -> None:
        for _ in range(3):
            self.assertIsNone(self.send("/queue/eo", b"first", headers={"dedup-id": "A"}))
        self.send("/queue/eo", b"other", headers={"dedup-id": "B"})
        self.send("/queue/eo", b"no id")
        self.send("/queue/eo", b"no id")
        self.assertEqual(self.ready("eo"), [(b"first", 0), (b"other", 0), (b"no id", 0), (b"no id", 0)])
        self.assertEqual(self.queue.window.duplicates, 2)
        # Consumed and acked: still a duplicate within the window.
        c = self.consumer()
        self.channel.subscribe(c, "/queue/eo")
        for tag in c.tags():
            self.channel.settle_delivery(c, tag, True)
        self.send("/queue/eo", b"again", headers={"dedup-id": "A"})
        self.assertEqual(len(c.got), 4)
        # After the window, the same id is a new message.
        self.clock.advance(60)
        self.send("/queue/eo", b"later", headers={"_AMQ_DUPL_ID": "A"})
        self.assertEqual(c.bodies()[-1], b"later")

    def test_spellings(self) -> None:
        self.send("/queue/eo", b"1", headers={"dedup-id": "X"})
        self.send("/queue/eo", b"2", headers={"_AMQ_DUPL_ID": "X"})
        self.send("/queue/eo", b"3", headers={"x-deduplication-header": "X"})
        self.assertEqual(len(self.queue), 1)

    def test_refused_publish_not_remembered(self) -> None:
        """A publish a full queue refuses leaves no id: the retry goes in."""
        q = self.vhost.declare_queue(
            "small", arguments={**ONCE, "x-max-length": 1, "x-overflow": "reject-publish"}
        )
        self.send("/queue/small", b"1", headers={"dedup-id": "1"})
        with self.assertRaises(ResourceLimit):
            self.send("/queue/small", b"2", headers={"dedup-id": "2"})
        # A duplicate of what is in it is never refused: it is dropped.
        self.send("/queue/small", b"1", headers={"dedup-id": "1"})
        q.get()
        self.send("/queue/small", b"2", headers={"dedup-id": "2"})
        self.assertEqual([m.body for m in q.messages()], [b"2"])

    def test_fanout_drops_only_in_that_queue(self) -> None:
        plain = self.vhost.declare_queue("plain")
        self.vhost.declare_exchange("fan", "fanout")
        self.vhost.bind("eo", "fan")
        self.vhost.bind("plain", "fan")
        for _ in range(2):
            self.send("/exchange/fan", b"m", headers={"dedup-id": "A"})
        self.assertEqual(len(self.queue), 1)
        self.assertEqual(len(plain), 2)


class StoreTests(ChannelTestCase):
    store = FakeStore()

    def setUp(self) -> None:
        self.store = FakeStore()
        super().setUp()

    def test_duplicate_not_stored(self) -> None:
        """A persistent duplicate reaches the store for no queue that dropped it."""
        eo = self.vhost.declare_queue("eo", arguments=ONCE)
        plain = self.vhost.declare_queue("plain")
        self.vhost.declare_exchange("fan", "fanout")
        self.vhost.bind("eo", "fan")
        self.vhost.bind("plain", "fan")
        self.send("/queue/eo", b"1", persistent=True, headers={"dedup-id": "A"})
        self.assertIsNone(self.send("/queue/eo", b"1", persistent=True, headers={"dedup-id": "A"}))
        self.send("/exchange/fan", b"2", persistent=True, headers={"dedup-id": "A"})
        publishes = [[q.name for q in queues] for _, _, queues in self.store.named("publish")]
        self.assertEqual(publishes, [["eo"], ["plain"]])
        self.assertEqual((len(eo), len(plain)), (1, 1))

    def test_at_most_once_messages_never_stored(self) -> None:
        """Its declaration and bindings reach the store, its messages never."""
        q = self.vhost.declare_queue("amo", arguments={"x-delivery-guarantee": "at-most-once"})
        self.assertIsNone(q.store)
        self.vhost.bind("amo", "amq.fanout")
        self.assertIsNone(self.send("/queue/amo", b"x", persistent=True))
        self.assertIsNone(self.send("/exchange/amq.fanout", b"y", persistent=True))
        self.assertEqual(len(self.store.named("declare_queue")), 1)
        self.assertEqual(len(self.store.named("bind")), 1)
        self.assertEqual(self.store.named("publish"), [])
        self.vhost.delete_queue("amo")
        self.assertEqual(len(self.store.named("delete_queue")), 1)


class AtMostOnceTests(ChannelTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.queue = self.vhost.declare_queue(
            "amo", arguments={"x-delivery-guarantee": "at-most-once"}
        )

    def test_never_given_back(self) -> None:
        """NACK with requeue, and a consumer going away with unacked
        messages: nothing is delivered twice."""
        c = self.consumer(prefetch=10)
        self.channel.subscribe(c, "/queue/amo")
        for i in range(4):
            self.send("/queue/amo", b"%d" % i)
        tags = c.tags()
        self.channel.settle_delivery(c, tags[0], True)
        self.channel.settle_delivery(c, tags[1], False, requeue=True)
        self.channel.unsubscribe(c)
        other = self.consumer()
        self.channel.subscribe(other, "/queue/amo")
        self.assertEqual(other.got, [])
        self.assertEqual(len(self.queue), 0)
        # Credit came back: new messages still flow.
        self.send("/queue/amo", b"4")
        self.assertEqual(other.bodies(), [b"4"])


class RestartTests(StoreTestCase):
    """What each guarantee promises across a restart, with the commit log."""

    def test_at_least_once_redelivers_unacked(self) -> None:
        self.vhost.declare_queue("alo")
        self.send("alo", b"m")
        self.turn()
        self.restart()
        self.assertEqual([b for _, b, _ in self.ready("alo")], [b"m"])

    def test_at_most_once_loses_undelivered(self) -> None:
        args = {"x-delivery-guarantee": "at-most-once"}
        self.vhost.declare_queue("amo", arguments=args)
        self.send("amo", b"m")
        self.turn()
        self.restart()
        # The queue comes back (its topology is stored), empty.
        self.assertIs(type(self.vhost.queue("amo")), AtMostOnceQueue)
        self.assertEqual(self.ready("amo"), [])

    def test_becoming_at_most_once_settles_what_was_kept(self) -> None:
        """Messages kept while the queue was at-least-once come back once
        and are settled, so the next restart does not bring them back."""
        self.vhost.declare_queue("q")
        self.send("q", b"kept")
        self.turn()
        self.successResultOf(self.store.close())
        # The configuration now declares it at-most-once, before recovery.
        from qmq.core.broker import Broker
        from qmq.store.log import CommitLogStore
        from tests.test_store_log import sync_io

        self.store = CommitLogStore(self.dir, reactor=self.clock, io=sync_io, compact_interval=0)
        self.broker = Broker(self.clock, store=self.store)
        self.vhost = self.broker.default_vhost
        self.vhost.declare_queue("q", arguments={"x-delivery-guarantee": "at-most-once"})
        self.broker.recover()
        self.assertEqual([b for _, b, _ in self.ready("q")], [b"kept"])
        self.restart()
        self.assertEqual(self.ready("q"), [])

    def test_effectively_once_window_rebuilt_from_kept_messages(self) -> None:
        """The ids of messages still in the queue come back with them; the
        ids of messages consumed before the restart do not."""
        self.vhost.declare_queue("eo", arguments=ONCE)
        self.send("eo", b"consumed", {"dedup-id": "gone"})
        self.send("eo", b"kept", {"dedup-id": "here"})
        q = self.vhost.queue("eo")
        first = q.get()
        q.store.settle(q, first, "ack")
        self.turn()
        self.restart()
        q = self.vhost.queue("eo")
        self.send("eo", b"kept again", {"dedup-id": "here"})
        self.send("eo", b"consumed again", {"dedup-id": "gone"})
        self.assertEqual([b for _, b, _ in self.ready("eo")], [b"kept", b"consumed again"])
        # And the rebuilt window still ends one window after the publish.
        self.clock.advance(60)
        self.send("eo", b"new", {"dedup-id": "here"})
        self.assertEqual(len(q), 3)
