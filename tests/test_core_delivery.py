"""Tests for the delivery semantics of L{qmq.core.queue}: queue arguments,
priorities, message expiry, delayed delivery, ack timeouts, redelivery
backoff and dead-lettering.

Every timing rule runs on a L{Clock}: no test sleeps.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.core.errors import PreconditionFailed
from qmq.core.message import Message
from qmq.core.policy import QUEUE_ARGUMENTS, QueuePolicy, argument_name
from qmq.core.queue import Queue
from qmq.stomp.destinations import DestinationChannel as Channel


class QueueArgumentTests(SynchronousTestCase):
    def test_both_spellings(self) -> None:
        """Every argument is accepted with and without its x- prefix."""
        for name in QUEUE_ARGUMENTS:
            self.assertEqual(argument_name(name), name)
            self.assertEqual(argument_name(name[2:]), name)
        self.assertEqual(argument_name("x-unknown"), "x-unknown")
        a = QueuePolicy.from_arguments(
            {
                "max-priority": "5",
                "message-ttl": 1000,
                "ack-timeout": "30000",
                "dead-letter-exchange": "dlx",
                "dead-letter-routing-key": "dead",
                "redelivery-backoff": "100, 1000,10000",
            }
        )
        b = QueuePolicy.from_arguments(
            {
                "x-max-priority": 5,
                "x-message-ttl": "1000",
                "x-ack-timeout": 30000,
                "x-dead-letter-exchange": "dlx",
                "x-dead-letter-routing-key": "dead",
                "x-redelivery-backoff": [100, 1000, 10000],
            }
        )
        self.assertIs(a, b)
        self.assertEqual(
            (
                a.max_priority,
                a.message_ttl,
                a.ttl,
                a.ack_timeout,
                a.ack_seconds,
                a.dead_letter_exchange,
                a.dead_letter_routing_key,
                a.redelivery_backoff,
            ),
            (5, 1000, 1.0, 30000, 30.0, "dlx", "dead", (100, 1000, 10000)),
        )
        self.assertGreater(QueuePolicy.from_arguments({"x-message-ttl": 0}).ttl, 0.0)
        self.assertIsNone(QueuePolicy.from_arguments({"x-redelivery-backoff": "0"}).redelivery_backoff)

    def test_bad_values(self) -> None:
        bad = [
            ("x-max-priority", 0),
            ("max-priority", "256"),
            ("x-message-ttl", -1),
            ("message-ttl", "soon"),
            ("x-ack-timeout", 0),
            ("x-dead-letter-exchange", 5),
            ("x-dead-letter-routing-key", "k" * 256),
            ("x-redelivery-backoff", ""),
            ("x-redelivery-backoff", "1,x"),
            ("x-redelivery-backoff", ",".join(["1"] * 33)),
            ("x-redelivery-backoff", [-1]),
            ("x-message-ttl", "9" * 30),
        ]
        for name, value in bad:
            e = self.assertRaises(PreconditionFailed, QueuePolicy.from_arguments, {name: value})
            self.assertTrue(e.message.startswith(name + " must be"), e.message)

    def test_max_priority_range(self) -> None:
        """x-max-priority takes RabbitMQ's 1 to 255 (kombu and Celery declare
        10); a message's priority is 0 to 9, so the queue keeps at most 9."""
        self.assertEqual(QueuePolicy.from_arguments({"x-max-priority": 10}).max_priority, 9)
        self.assertEqual(QueuePolicy.from_arguments({"x-max-priority": "255"}).max_priority, 9)
        self.assertEqual(QueuePolicy.from_arguments({"x-max-priority": 4}).max_priority, 4)



class Receiver(Consumer):
    """A consumer that tags its deliveries through its channel, as a frontend does."""

    __slots__ = ("got",)

    def __init__(self, ack_required: bool = True, prefetch: int | None = None) -> None:
        super().__init__(ack_required, prefetch)
        self.got: list[tuple[int, Message]] = []

    def deliver(self, message: Message, queue: Queue | None) -> None:
        self.got.append((self.channel.track(self, message), message))

    def bodies(self) -> list[bytes]:
        return [m.body for _, m in self.got]


class DeliveryTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.channel = Channel(self.broker, self.vhost)

    def declare(self, name: str = "q", **arguments: object) -> Queue:
        return self.vhost.declare_queue(name, durable=False, arguments=dict(arguments))

    def send(
        self,
        key: str,
        body: bytes,
        priority: int = 0,
        expires: float = 0.0,
        deliver_at: float = 0.0,
        ack_timeout: float = 0.0,
        headers: dict | None = None,
    ) -> Message:
        m = self.broker.new_message("", key, headers, body)
        m.priority = priority
        m.expires = expires
        m.deliver_at = deliver_at
        m.ack_timeout = ack_timeout
        self.vhost.publish(m)
        return m

    def subscribe(self, name: str = "q", ack: bool = True, prefetch: int | None = None) -> Receiver:
        r = Receiver(ack, prefetch)
        self.channel.subscribe(r, "/queue/" + name)
        return r


class PriorityTests(DeliveryTestCase):
    def test_higher_first_equal_in_order(self) -> None:
        q = self.declare(**{"x-max-priority": 9})
        sent = [(b"a", 0), (b"b", 5), (b"c", 9), (b"d", 5), (b"e", 0), (b"f", 9)]
        for body, p in sent:
            self.send("q", body, priority=p)
        self.assertEqual([m.body for m in q.messages()], [b"c", b"f", b"b", b"d", b"a", b"e"])
        r = self.subscribe(ack=False)
        self.assertEqual(r.bodies(), [b"c", b"f", b"b", b"d", b"a", b"e"])
        self.assertEqual(len(q), 0)

    def test_above_maximum_counts_as_maximum(self) -> None:
        self.declare(**{"max-priority": 3})
        self.send("q", b"a", priority=3)
        self.send("q", b"b", priority=9)
        self.send("q", b"c", priority=4)
        self.send("q", b"d", priority=2)
        r = self.subscribe(ack=False)
        self.assertEqual(r.bodies(), [b"a", b"b", b"c", b"d"])

    def test_fifo_queue_ignores_priority(self) -> None:
        self.declare()
        for body, p in [(b"a", 0), (b"b", 9), (b"c", 5)]:
            self.send("q", body, priority=p)
        r = self.subscribe(ack=False)
        self.assertEqual(r.bodies(), [b"a", b"b", b"c"])

    def test_requeued_by_priority_then_before_new(self) -> None:
        """A message given back goes before newer messages of its priority,
        after messages of higher priority."""
        q = self.declare(**{"x-max-priority": 9})
        r = self.subscribe(prefetch=1)
        self.send("q", b"low", priority=1)  # delivered at once
        self.send("q", b"low2", priority=1)
        self.send("q", b"high", priority=7)
        tag, m = r.got[0]
        self.channel.settle_delivery(r, tag, False, True)
        self.assertEqual([m.body for m in q.messages()], [b"low", b"low2"])
        self.assertEqual(r.bodies(), [b"low", b"high"])
        self.assertEqual(r.got[1][1].delivery_count, 0)

    def test_drop_head_bounded(self) -> None:
        q = self.declare(**{"x-max-priority": 5, "x-max-length": 2, "x-overflow": "drop-head"})
        self.send("q", b"a", priority=1)
        self.send("q", b"b", priority=2)
        self.send("q", b"c", priority=3)
        # Drop-head drops the head: the highest priority waiting.
        self.assertEqual([m.body for m in q.messages()], [b"c", b"a"])

    def test_bound_counts_every_level(self) -> None:
        # The bound is counted over all levels: exactly x-max-length kept.
        q = self.declare(**{"x-max-priority": 9, "x-max-length": 5, "x-overflow": "drop-head"})
        for i in range(5):
            self.send("q", b"%d" % i, priority=i % 3)
        self.assertEqual(len(q), 5)
        self.send("q", b"5", priority=0)
        self.assertEqual(len(q), 5)
        self.assertEqual(q.dropped, 1)
        self.assertEqual([m.body for m in q.messages()], [b"1", b"4", b"0", b"3", b"5"])


class ExpiryTests(DeliveryTestCase):
    def test_queue_ttl_never_delivered(self) -> None:
        q = self.declare(**{"x-message-ttl": 1000})
        self.send("q", b"old")
        self.clock.advance(0.5)
        self.send("q", b"new")
        self.clock.advance(0.499)
        self.assertEqual(len(q), 2)
        self.clock.advance(0.001)
        # The head expired and was swept by the queue's timer.
        self.assertEqual([m.body for m in q.messages()], [b"new"])
        self.clock.advance(0.4)
        r = self.subscribe(ack=False)
        self.assertEqual(r.bodies(), [b"new"])
        # The timer set for "new" finds nothing to do, and is not set again.
        self.clock.advance(1)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(q._rare)

    def test_per_message_expiry(self) -> None:
        q = self.declare()
        now = self.clock.seconds()
        self.send("q", b"a", expires=now + 2)
        self.send("q", b"b", expires=now + 1)
        self.send("q", b"c")
        self.clock.advance(1)
        # "b" is not at the head: it stays until its turn, but is never delivered.
        self.assertEqual(len(q), 3)
        self.clock.advance(1)
        self.assertEqual([m.body for m in q.messages()], [b"c"])

    def test_expired_not_delivered_when_consumer_comes(self) -> None:
        self.declare()
        now = self.clock.seconds()
        self.send("q", b"a")
        self.send("q", b"b", expires=now + 1)
        self.send("q", b"c")
        self.clock.advance(5)
        r = self.subscribe(ack=False)
        self.assertEqual(r.bodies(), [b"a", b"c"])

    def test_expired_on_arrival(self) -> None:
        q = self.declare()
        self.send("q", b"late", expires=self.clock.seconds() - 1)
        self.assertEqual(len(q), 0)
        r = self.subscribe(ack=False)
        self.send("q", b"late", expires=self.clock.seconds())
        self.assertEqual(r.got, [])

    def test_queue_ttl_with_message_expiry_earlier_wins(self) -> None:
        q = self.declare(**{"x-message-ttl": 10_000})
        self.send("q", b"a", expires=self.clock.seconds() + 1)
        self.clock.advance(1)
        self.assertEqual(len(q), 0)

    def test_get_skips_expired(self) -> None:
        q = self.declare(**{"x-message-ttl": 1000})
        self.send("q", b"a")
        self.clock.advance(0.5)
        self.send("q", b"b")
        self.clock.advance(0.6)
        self.assertEqual(q.get().body, b"b")
        self.assertIsNone(q.get())


class DelayTests(DeliveryTestCase):
    def test_invisible_until_due(self) -> None:
        q = self.declare()
        r = self.subscribe(ack=False)
        now = self.clock.seconds()
        self.send("q", b"later", deliver_at=now + 2)
        self.send("q", b"soon", deliver_at=now + 1)
        self.send("q", b"now")
        self.assertEqual(r.bodies(), [b"now"])
        self.assertEqual((len(q), q.delayed_count), (0, 2))
        self.clock.advance(0.999)
        self.assertEqual(r.bodies(), [b"now"])
        self.clock.advance(0.001)
        self.assertEqual(r.bodies(), [b"now", b"soon"])
        self.clock.advance(1)
        self.assertEqual(r.bodies(), [b"now", b"soon", b"later"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_delayed_message_keeps_queue(self) -> None:
        """An unused queue holding only delayed messages does not expire."""
        q = self.vhost.declare_queue("q", arguments={"x-expires": 1000})
        self.send("q", b"x", deliver_at=self.clock.seconds() + 5)
        self.clock.advance(2)
        self.assertFalse(q.deleted)
        self.clock.advance(3)
        self.assertEqual([m.body for m in q.messages()], [b"x"])

    def test_purge_and_delete_take_delayed(self) -> None:
        q = self.declare()
        self.send("q", b"x", deliver_at=self.clock.seconds() + 5)
        self.assertEqual(q.purge(), 1)
        self.send("q", b"y", deliver_at=self.clock.seconds() + 5)
        self.vhost.delete_queue("q")
        self.assertEqual(q.delayed_count, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class AckTimeoutTests(DeliveryTestCase):
    def test_taken_back_and_given_to_another(self) -> None:
        q = self.declare(**{"x-ack-timeout": 1000})
        a = self.subscribe(prefetch=1)
        b = self.subscribe(prefetch=1)
        self.send("q", b"m")
        first = a if a.got else b
        other = b if first is a else a
        self.assertEqual(len(first.got), 1)
        self.clock.advance(0.999)
        self.assertEqual(other.got, [])
        self.clock.advance(0.001)
        self.assertEqual(other.bodies(), [b"m"])
        redelivered = other.got[0][1]
        self.assertEqual(redelivered.delivery_count, 1)
        self.assertEqual(first.unacked, {})
        self.assertEqual(first.credit, 1)
        # A late ack of the taken-back delivery is ignored, not an error.
        late_tag = first.got[0][0]
        self.channel.settle_delivery(self.channel.owner_of(late_tag), late_tag, True)
        # Acking the redelivery in time settles it for good.
        tag = other.got[0][0]
        self.channel.settle_delivery(self.channel.owner_of(tag), tag, True)
        self.clock.advance(10)
        self.assertEqual(len(q), 0)
        self.assertEqual(len(first.got) + len(other.got), 2)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_message_timeout_wins(self) -> None:
        self.declare(**{"x-ack-timeout": 60_000})
        a = self.subscribe(prefetch=5)
        self.send("q", b"m", ack_timeout=0.5)
        self.send("q", b"n")
        self.clock.advance(0.5)
        self.assertEqual(a.bodies(), [b"m", b"n", b"m"])

    def test_acked_in_time_never_taken(self) -> None:
        q = self.declare(**{"x-ack-timeout": 1000})
        a = self.subscribe(prefetch=100)
        for i in range(100):
            self.send("q", b"%d" % i)
        for tag, _ in list(a.got):
            self.channel.settle_delivery(a, tag, True)
        self.clock.advance(2)
        self.assertEqual(len(a.got), 100)
        self.assertIsNone(q._rare)

    def test_ack_timeout_to_delivery_limit_dead_letters(self) -> None:
        self.declare("dlq")
        self.declare(
            **{"x-ack-timeout": 1000, "x-delivery-limit": 1, "x-dead-letter-exchange": "",
               "x-dead-letter-routing-key": "dlq"}
        )
        a = self.subscribe(prefetch=1)
        self.send("q", b"m")
        self.clock.advance(1)
        self.clock.advance(1)
        self.assertEqual(len(a.got), 2)
        dead = self.vhost.queues["dlq"].messages()
        self.assertEqual([m.body for m in dead], [b"m"])
        self.assertEqual(dead[0].headers["x-death-reason"], "delivery_limit")


class BackoffTests(DeliveryTestCase):
    def test_delay_grows_per_attempt(self) -> None:
        self.declare(**{"x-redelivery-backoff": "1000,3000"})
        a = self.subscribe(prefetch=1)
        self.send("q", b"m")
        times = []
        for _ in range(3):
            tag = a.got[-1][0]
            self.channel.settle_delivery(a, tag, False, True)
            start = self.clock.seconds()
            n = len(a.got)
            while len(a.got) == n:
                self.clock.advance(0.25)
            times.append(self.clock.seconds() - start)
        self.assertEqual(times, [1.0, 3.0, 3.0])
        self.assertEqual([m.delivery_count for _, m in a.got], [0, 1, 2, 3])


class DeadLetterTests(DeliveryTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.vhost.declare_exchange("dlx", "fanout")
        self.dlq = self.declare("dlq")
        self.vhost.bind("dlq", "dlx")

    def test_rejected(self) -> None:
        self.declare(**{"x-dead-letter-exchange": "dlx"})
        a = self.subscribe()
        self.send("q", b"m", headers={"destination": "/queue/q", "app": "1"})
        self.channel.settle_delivery(a, a.got[0][0], False, False)
        [dead] = self.dlq.messages()
        self.assertEqual(dead.body, b"m")
        h = dead.headers
        self.assertEqual(
            {k: v for k, v in h.items() if k != "x-death-time"},
            {
                "app": "1",
                "x-death-queue": "q",
                "x-death-reason": "rejected",
                "x-death-count": "1",
                "x-death-exchange": "",
                "x-death-routing-key": "q",
                "x-first-death-queue": "q",
                "x-first-death-reason": "rejected",
                "x-first-death-exchange": "",
                "x-last-death-queue": "q",
                "x-last-death-reason": "rejected",
                "x-last-death-exchange": "",
            },
        )
        self.assertEqual(h["x-death-time"], str(int(self.clock.seconds())))
        self.assertEqual((dead.exchange, dead.routing_key), ("dlx", "q"))

    def test_expired(self) -> None:
        self.declare(**{"x-dead-letter-exchange": "dlx", "x-message-ttl": 100})
        self.send("q", b"m")
        self.clock.advance(0.1)
        [dead] = self.dlq.messages()
        self.assertEqual(dead.headers["x-death-reason"], "expired")
        self.assertEqual(dead.expires, 0.0)

    def test_maxlen(self) -> None:
        self.declare(**{"x-dead-letter-exchange": "dlx", "x-max-length": 1})
        self.send("q", b"a")
        self.send("q", b"b")
        self.assertEqual([m.headers["x-death-reason"] for m in self.dlq.messages()], ["maxlen"])

    def test_missing_exchange_drops(self) -> None:
        q = self.declare(**{"x-dead-letter-exchange": "nowhere"})
        a = self.subscribe()
        self.send("q", b"m")
        self.channel.settle_delivery(a, a.got[0][0], False, False)
        self.assertEqual(len(q), 0)

    def test_self_cycle_dropped(self) -> None:
        q = self.declare(**{"x-dead-letter-exchange": "", "x-message-ttl": 100})
        self.send("q", b"m")
        self.clock.advance(0.1)
        self.assertEqual([m.headers["x-death-count"] for m in q.messages()], ["1"])
        self.clock.advance(0.1)
        self.assertEqual(len(q), 0)

    def test_rejected_again_counts(self) -> None:
        """A retry loop through rejection is allowed; x-death-count counts."""
        self.declare(**{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"})
        a = self.subscribe()
        self.send("q", b"m")
        for _ in range(3):
            self.channel.settle_delivery(a, a.got[-1][0], False, False)
        self.assertEqual(a.got[-1][1].headers["x-death-count"], "3")
        self.assertEqual(a.got[-1][1].headers["x-first-death-reason"], "rejected")
