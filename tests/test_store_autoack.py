"""Persistent messages a consumer that does not ack (STOMP's ``ack:auto``,
AMQP's ``no_ack``) took leave the commit log: none is delivered again
after a restart, and the log keeps none live (its segments can go).

Before, such a message was never settled: every one came back after a
restart (found with a real twistd: a STOMP ``ack:auto`` subscriber's
messages, delivered, came back) and held its segment for ever. Three ways
a message reaches such a consumer: at once on publish (the queue keeps
nothing: not written), from the queue's backlog, and a delayed message
whose time came (both written, then settled as an ack).
"""

from __future__ import annotations

from qmq.core.consumer import Consumer
from qmq.core.message import Message
from qmq.core.queue import Queue
from tests.test_store_log import StoreTestCase, Taker


class NoAck(Consumer):
    """Takes everything, acks nothing (ack_required False)."""

    def __init__(self) -> None:
        super().__init__(False, None)
        self.got: list[bytes] = []

    def deliver(self, message: Message, queue: Queue | None) -> None:
        self.got.append(message.body)


class NoAckStoreTests(StoreTestCase):
    def live(self) -> int:
        self.turn()
        return self.store._index.live_messages()

    def test_at_once(self) -> None:
        q = self.vhost.declare_queue("q")
        consumer = NoAck()
        q.add_consumer(consumer)
        for i in range(20):
            self.send("q", b"%d" % i)
        self.assertEqual(len(consumer.got), 20)
        self.assertEqual(self.live(), 0)
        self.restart()
        self.assertEqual(self.ready("q"), [])

    def test_from_the_backlog(self) -> None:
        q = self.vhost.declare_queue("q")
        for i in range(20):
            self.send("q", b"%d" % i)
        self.assertEqual(self.live(), 20)
        consumer = NoAck()
        q.add_consumer(consumer)
        self.assertEqual(len(consumer.got), 20)
        self.assertEqual(self.live(), 0)
        self.restart()
        self.assertEqual(self.ready("q"), [])

    def test_delayed(self) -> None:
        q = self.vhost.declare_queue("q")
        consumer = NoAck()
        q.add_consumer(consumer)
        m = self.broker.new_message("", "q", None, b"later", persistent=True)
        m.deliver_at = self.clock.seconds() + 5
        self.vhost.publish(m)
        self.assertEqual(self.live(), 1)
        self.clock.advance(5)
        self.assertEqual(consumer.got, [b"later"])
        self.assertEqual(self.live(), 0)
        self.restart()
        self.assertEqual(self.ready("q"), [])

    def test_fan_out(self) -> None:
        """One publish to two queues: the one whose consumer took it at
        once is not written; the other keeps it."""
        self.vhost.declare_exchange("fan", "fanout")
        for name in ("a", "b"):
            self.vhost.declare_queue(name)
            self.vhost.bind(name, "fan")
        self.vhost.queue("a").add_consumer(NoAck())
        self.send("", b"x", exchange="fan")
        self.assertEqual(self.live(), 1)
        self.restart()
        self.assertEqual([b for _, b, _ in self.ready("a")], [])
        self.assertEqual([b for _, b, _ in self.ready("b")], [b"x"])

    def test_acking_consumer_unchanged(self) -> None:
        """A consumer that acks: unacked messages are kept, and come back."""
        q = self.vhost.declare_queue("q")
        taker = Taker()
        q.add_consumer(taker)
        self.send("q", b"kept")
        self.assertEqual(self.live(), 1)
        self.restart()
        self.assertEqual([b for _, b, _ in self.ready("q")], [b"kept"])
