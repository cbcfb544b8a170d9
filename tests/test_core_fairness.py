"""Tests that one client's backlog cannot hold the reactor or the memory.

  - L{qmq.core.queue.Queue.drain} hands out at most C{drain_batch} messages
    per call and goes on at the next reactor turn;
  - the live consumers of one channel share a L{BacklogBudget}: a client with
    thousands of topic subscriptions that stops reading holds at most the
    budget's messages, not thousands of full backlogs.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.expiry import ExpiryWheel
from qmq.core.names import InvalidName
from qmq.stomp.destinations import DestinationChannel as Channel
from tests.test_core_channel import Recorder


class DrainBatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.channel = Channel(self.broker, self.vhost, "alice")
        self.queue = self.vhost.declare_queue("q", durable=False)
        # A class attribute (queues have no __dict__), patched for the test.
        self.patch(type(self.queue), "drain_batch", 100)

    def turn(self) -> None:
        """One reactor turn: run what is due now, not what that schedules
        (L{Clock.advance} would run those too)."""
        due = list(self.clock.calls)
        self.clock.calls.clear()
        for call in due:
            call.called = True
            call.func(*call.args, **call.kw)

    def publish(self, n: int) -> None:
        for i in range(n):
            self.vhost.publish(self.broker.new_message("", "q", None, b"%d" % i))

    def test_backlog_drained_over_turns(self) -> None:
        """A consumer arriving at 250 waiting messages gets 100 per turn, in order."""
        self.publish(250)
        c = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(c, "/queue/q")
        self.assertEqual(len(c.got), 100)
        self.turn()
        self.assertEqual(len(c.got), 200)
        self.turn()
        self.assertEqual(c.bodies(), [b"%d" % i for i in range(250)])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_one_continuation_however_often_asked(self) -> None:
        """Publishes during a stopped drain deliver their own batch but
        schedule no second continuation."""
        self.publish(150)
        c = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(c, "/queue/q")
        self.publish(150)  # each publish drains another batch
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual(len(c.got), 300)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_deleted_queue_cancels_continuation(self) -> None:
        self.publish(150)
        c = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(c, "/queue/q")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.vhost.delete_queue("q")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_credit_still_bounds(self) -> None:
        """The batch never lets a consumer past its credit."""
        self.publish(250)
        c = Recorder(self.channel, ack_required=True, prefetch=30)
        self.channel.subscribe(c, "/queue/q")
        self.clock.advance(0)
        self.assertEqual(len(c.got), 30)


class BacklogBudgetTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.channel = Channel(self.broker, self.vhost, "alice", backlog_budget=10)

    def send(self, key: str, body: bytes) -> None:
        self.vhost.publish(self.broker.new_message("amq.topic", key, None, body))

    def paused_subscribers(self, n: int, limit: int = 1000) -> list[Recorder]:
        subs = []
        for _ in range(n):
            c = Recorder(self.channel, ack_required=False, backlog_limit=limit)
            self.channel.subscribe(c, "/topic/k")
            c.paused = True
            subs.append(c)
        return subs

    def test_budget_bounds_the_sum(self) -> None:
        """Three stalled subscriptions of one channel hold 10 messages
        together, not 3 x 1000; the rest is counted as dropped."""
        subs = self.paused_subscribers(3)
        for i in range(100):
            self.send("k", b"%d" % i)
        budget = self.channel.backlog_budget
        assert budget is not None
        held = sum(len(c.backlog or ()) for c in subs)
        self.assertEqual((held, budget.used), (10, 10))
        self.assertEqual(budget.dropped, 300 - 10)
        # Each still holds its newest: the oldest made room.
        for c in subs:
            self.assertEqual(c.backlog[-1].body, b"99")  # type: ignore[index]

    def test_resume_gives_budget_back(self) -> None:
        a, b = self.paused_subscribers(2)
        for i in range(8):
            self.send("k", b"%d" % i)
        budget = self.channel.backlog_budget
        assert budget is not None
        self.assertEqual(budget.used, 10)
        a.resume()
        self.assertEqual(budget.used, len(b.backlog or ()))
        self.assertEqual(a.bodies()[-1], b"7")
        b.resume()
        self.assertEqual(budget.used, 0)

    def test_unsubscribe_gives_budget_back(self) -> None:
        a, b = self.paused_subscribers(2)
        for i in range(4):
            self.send("k", b"%d" % i)
        budget = self.channel.backlog_budget
        assert budget is not None
        self.assertEqual(budget.used, 8)
        self.channel.unsubscribe(a)
        self.assertEqual(budget.used, 4)
        self.channel.close()
        self.assertEqual(budget.used, 0)

    def test_deleted_exchange_gives_budget_back(self) -> None:
        """A live consumer cancelled by its exchange's deletion returns its share."""
        self.vhost.declare_exchange("t", "topic")
        c = Recorder(self.channel, ack_required=False, backlog_limit=100)
        self.channel.subscribe(c, "/exchange/t/k")
        c.paused = True
        for i in range(4):
            self.vhost.publish(self.broker.new_message("t", "k", None, b"%d" % i))
        budget = self.channel.backlog_budget
        assert budget is not None
        self.assertEqual(budget.used, 4)
        self.vhost.delete_exchange("t")
        self.assertEqual((c.cancels, budget.used), (1, 0))

    def test_other_channels_unaffected(self) -> None:
        """The budget is per channel: another client's subscriber still gets everything."""
        self.paused_subscribers(5)
        other = Channel(self.broker, self.vhost, "bob", backlog_budget=10)
        c = Recorder(other, ack_required=False)
        other.subscribe(c, "/topic/k")
        for i in range(50):
            self.send("k", b"%d" % i)
        self.assertEqual(len(c.got), 50)

    def test_no_budget_keeps_per_consumer_limit(self) -> None:
        channel = Channel(self.broker, self.vhost, "carol")
        c = Recorder(channel, ack_required=False, backlog_limit=3)
        channel.subscribe(c, "/topic/k")
        c.paused = True
        for i in range(5):
            self.send("k", b"%d" % i)
        self.assertEqual([m.body for m in c.backlog or ()], [b"2", b"3", b"4"])


class QueueNameTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost

    def test_name_length(self) -> None:
        """Names up to 255 characters; a longer one is refused, naming the limit."""
        self.vhost.declare_queue("q" * 255)
        e = self.assertRaises(InvalidName, self.vhost.declare_queue, "q" * 256)
        self.assertIn("the limit is 255", e.message)
        self.assertNotIn("q" * 256, self.vhost.queues)

    def test_redeclare_restarts_expiry(self) -> None:
        """Redeclaring an unused queue is a use: its x-expires starts over."""
        q = self.vhost.declare_queue("q", arguments={"x-expires": 2000})
        self.clock.advance(1.5)
        self.vhost.declare_queue("q")
        self.clock.advance(1.5)
        self.assertFalse(q.deleted)
        self.clock.advance(0.6)
        self.assertTrue(q.deleted)

    def test_durable_subscription_never_expires(self) -> None:
        """The queue of a durable subscription ignores the vhost's default
        x-expires (its client may stay away longer); other on-demand queues
        keep it."""
        self.vhost.set_queue_defaults({"x-expires": 1000})
        channel = Channel(self.broker, self.vhost, "alice")
        c = Recorder(channel, ack_required=True, prefetch=1)
        channel.subscribe(c, "/topic/k", durable_name="feed")
        channel.close()
        plain = self.vhost.declare_queue("plain", on_demand=True)
        self.clock.advance(10)
        self.assertTrue(plain.deleted)
        self.assertIn("durable.alice.feed", self.vhost.queues)


class _Item:
    def __init__(self, log: list) -> None:
        self.expiry_key: int | None = None
        self.log = log

    def expired(self) -> None:
        self.log.append(self)


class ExpiryWheelTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.wheel = ExpiryWheel(self.clock, tick=0.25)
        self.fired: list[_Item] = []

    def test_one_timer_per_tick(self) -> None:
        """A thousand deadlines in one tick share one DelayedCall."""
        items = [_Item(self.fired) for _ in range(1000)]
        for i, item in enumerate(items):
            self.wheel.schedule(item, 10.01 + i / 10_000)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(len(self.wheel), 1000)
        # One int object for the bucket, not one each (memory per queue).
        self.assertEqual(len({id(item.expiry_key) for item in items}), 1)
        self.clock.advance(10.25)
        self.assertEqual(len(self.fired), 1000)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_never_early_at_most_a_tick_late(self) -> None:
        item = _Item(self.fired)
        self.clock.advance(0.1)
        self.wheel.schedule(item, 1.0)  # due at 1.1: fires at 1.25
        self.clock.advance(0.99)
        self.assertEqual(self.fired, [])
        self.clock.advance(0.16)
        self.assertEqual(self.fired, [item])
        self.assertIsNone(item.expiry_key)

    def test_reschedule_and_cancel(self) -> None:
        a, b = _Item(self.fired), _Item(self.fired)
        self.wheel.schedule(a, 1)
        self.wheel.schedule(b, 1)
        self.wheel.schedule(a, 5)  # moved: its old bucket keeps b only
        self.wheel.cancel(b)  # the bucket is empty: its timer goes
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(2)
        self.assertEqual(self.fired, [])
        self.clock.advance(3)
        self.assertEqual(self.fired, [a])
        self.wheel.cancel(a)  # no longer scheduled: nothing to do
        self.assertEqual(len(self.wheel), 0)

    def test_failure_does_not_stop_the_bucket(self) -> None:
        class Broken(_Item):
            def expired(self) -> None:
                raise RuntimeError("boom")

        bad, good = Broken(self.fired), _Item(self.fired)
        self.wheel.schedule(bad, 1)
        self.wheel.schedule(good, 1)
        self.clock.advance(1)
        self.assertEqual(self.fired, [good])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_stop(self) -> None:
        item = _Item(self.fired)
        self.wheel.schedule(item, 1)
        self.wheel.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(item.expiry_key)


class CloseBatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.patch(Channel, "close_batch", 10)

    def test_many_subscriptions_detached_over_turns(self) -> None:
        """25 private-queue subscriptions: 10 detached per turn; meanwhile
        the rest get nothing more; in the end every queue is gone."""
        channel = Channel(self.broker, self.vhost, "alice")
        subs = []
        for i in range(25):
            c = Recorder(channel, ack_required=True, prefetch=10)
            channel.subscribe(c, "/exchange/amq.fanout/k", label=f"s{i}")
            subs.append(c)
        self.assertEqual(sum(n.startswith("amq.sub.") for n in self.vhost.queues), 25)
        channel.close()
        self.assertEqual(sum(n.startswith("amq.sub.") for n in self.vhost.queues), 15)
        self.vhost.publish(self.broker.new_message("amq.fanout", "k", None, b"late"))
        self.assertTrue(all(c.got == [] for c in subs))
        self.clock.advance(0)
        self.assertEqual(sum(n.startswith("amq.sub.") for n in self.vhost.queues), 0)
        self.assertEqual(channel.owners, {})

    def test_unacked_requeued(self) -> None:
        """Unacked deliveries of a consumer detached in a later turn go back to their queue."""
        self.vhost.declare_queue("work", durable=False)
        for i in range(30):
            self.vhost.publish(self.broker.new_message("", "work", None, b"%d" % i))
        channel = Channel(self.broker, self.vhost, "alice")
        subs = [Recorder(channel, ack_required=True, prefetch=1) for _ in range(20)]
        for c in subs:
            channel.subscribe(c, "/queue/work")
        channel.close()
        self.clock.advance(0)
        self.assertEqual(len(self.vhost.queues["work"]), 30)
