"""Per-subscriber buffers (the QMQ notes): a SUBSCRIBE stating
C{buffer-messages} or C{buffer-bytes} is cut off with an ERROR naming the
reason once what is held for it alone passes the bound, while the topic,
its publisher and every other subscriber go on. The core's side is
L{qmq.core.consumer.SubscriberBuffer} and the C{cut-consumers} overflow of
a private queue; a real socket that stops reading is in
L{tests.integration.test_subscriptions}.
"""

from __future__ import annotations

from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from tests.test_stomp_session import SessionTestCase


class BufferTests(SessionTestCase):
    def stalled(self, sub_id: str = "slow", destination: str = "/topic/t", **headers):
        """A client subscribed with C{headers} whose transport stopped taking data."""
        c = self.client()
        c.subscribe(destination, sub_id, receipt="r", **headers)
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.proto.pauseProducing()
        return c

    def test_live_messages(self) -> None:
        """ack:auto, buffer-messages 3: it holds 3, the 4th cuts it off (ERROR
        "slow consumer" naming the subscription and the bound); the fast
        subscriber and the publisher see nothing of it."""
        slow = self.stalled(**{"buffer-messages": "3"})
        fast = self.client()
        fast.subscribe("/topic/t", "fast")
        p = self.client()
        for i in range(3):
            p.publish("/topic/t", b"%d" % i)
        self.assertTrue(slow.open)
        self.assertEqual(slow.read(), [])
        for i in range(3, 10):
            p.publish("/topic/t", b"%d" % i, receipt=f"r{i}")
        self.assertEqual([f.command for f in p.read()], ["RECEIPT"] * 7)
        self.assertEqual(fast.bodies(), [b"%d" % i for i in range(10)])
        error = self.assertError(slow, "slow consumer")
        self.assertEqual(error.headers["message"], "slow consumer")
        self.assertIn("'slow'", error.body.decode())
        self.assertIn("buffer-messages 3", error.body.decode())
        # Unbound: only the fast subscriber is left on the topic.
        self.assertEqual(len(self.vhost.exchange("amq.topic").bindings()), 1)

    def test_live_bytes(self) -> None:
        """buffer-bytes 10: two 4-byte bodies fit, a third crosses it."""
        slow = self.stalled(**{"buffer-bytes": "10"})
        p = self.client()
        p.publish("/topic/t", b"aaaa")
        p.publish("/topic/t", b"bbbb")
        self.assertTrue(slow.open)
        p.publish("/topic/t", b"cccc")
        error = self.assertError(slow, "buffer-bytes 10")
        self.assertIn("8 bytes", error.body.decode())

    def test_resume_gives_room_back(self) -> None:
        """What was delivered on resume no longer counts: a subscriber that
        catches up between bursts is never cut off."""
        slow = self.stalled(**{"buffer-messages": "2", "buffer-bytes": "8"})
        p = self.client()
        for _burst in range(5):
            p.publish("/topic/t", b"abcd")
            p.publish("/topic/t", b"efgh")
            slow.proto.resumeProducing()
            self.clock.advance(0)
            self.assertEqual(slow.bodies(), [b"abcd", b"efgh"])
            slow.proto.pauseProducing()
        self.assertTrue(slow.open)

    def test_private_queue(self) -> None:
        """ack:client: the subscription's private queue is bounded by the
        buffer and cuts it off, whether it is paused or just not acking."""
        slow = self.client()
        slow.subscribe("/topic/t", "slow", ack="client", **{"prefetch-count": "2", "buffer-messages": "3"})
        p = self.client()
        for i in range(5):
            p.publish("/topic/t", b"%d" % i)
        # Two delivered (its prefetch), three held.
        self.assertEqual(slow.bodies(), [b"0", b"1"])
        [queue] = [q for q in self.vhost.queues.values() if q.name.startswith("amq.sub.")]
        self.assertEqual(len(queue), 3)
        p.publish("/topic/t", b"5", receipt="r")
        self.assertEqual([f.command for f in p.read()], ["RECEIPT"])
        self.assertError(slow, "at most 3")
        self.assertTrue(queue.deleted)

    def test_private_queue_bytes(self) -> None:
        slow = self.stalled(ack="client-individual", **{"buffer-bytes": "5"})
        p = self.client()
        p.publish("/topic/t", b"abc")
        self.assertTrue(slow.open)
        p.publish("/topic/t", b"def")
        self.assertError(slow, "at most 5")

    def test_topic_backlog_cuts_instead_of_dropping(self) -> None:
        """A subscriber that states a buffer is never dropped from silently:
        the broker's own bound (topic_backlog) cuts it off too."""
        self.factory = StompFactory(self.broker, StompSettings(topic_backlog=2), clock=self.clock)
        slow = self.stalled(**{"buffer-bytes": "1000000"})
        p = self.client()
        p.publish("/topic/t", b"1")
        p.publish("/topic/t", b"2")
        self.assertTrue(slow.open)
        p.publish("/topic/t", b"3")
        self.assertError(slow, "the broker's limit")

    def test_without_buffer_drops_oldest(self) -> None:
        """Without a buffer, nothing changes: the oldest are dropped."""
        self.factory = StompFactory(self.broker, StompSettings(topic_backlog=2), clock=self.clock)
        slow = self.stalled()
        p = self.client()
        for i in range(5):
            p.publish("/topic/t", b"%d" % i)
        slow.proto.resumeProducing()
        self.clock.advance(0)
        self.assertEqual(slow.bodies(), [b"3", b"4"])

    def test_own_publish_cuts_itself(self) -> None:
        """A client whose own SEND overruns its own subscription is cut off
        in the middle of its frames; the rest are not acted on."""
        c = self.stalled(**{"buffer-messages": "1"})
        c.publish("/topic/t", b"1")
        c.publish("/topic/t", b"2")
        c.publish("/queue/after", b"never")
        self.assertError(c, "slow consumer")
        self.assertNotIn("after", self.vhost.queues)

    def test_bad_values(self) -> None:
        for headers in (
            {"buffer-messages": "0"},
            {"buffer-messages": "-1"},
            {"buffer-bytes": "lots"},
            {"buffer-bytes": "0"},
        ):
            c = self.client()
            c.subscribe("/topic/t", "s", **headers)
            name = next(iter(headers))
            self.assertError(c, f"invalid {name} header")

    def test_refused_on_queues(self) -> None:
        """A buffer bounds what is held for one subscriber alone: on a queue
        (shared, temporary, a durable subscription's) it is refused."""
        for destination, extra in (
            ("/queue/q", {}),
            ("/temp-queue/r", {}),
            ("/topic/t", {"durable": "true"}),
        ):
            c = self.client()
            c.subscribe(destination, "s", receipt="r", **{"buffer-messages": "5"}, **extra)
            error = self.assertError(c, "buffer not allowed here")
            self.assertEqual(error.headers["receipt-id"], "r")
        self.assertFalse([n for n in self.vhost.queues if n.startswith("durable.")])
