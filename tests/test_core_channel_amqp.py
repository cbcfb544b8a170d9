"""Tests for L{qmq.core.channel.Channel}'s structural operations, in AMQP's
words: publish by exchange and routing key (routed count, mandatory),
settle with multiple, nack and requeue, get with ack, exclusive consumers
and exclusive queues, consumer tags, prefetch windows by count and bytes
per consumer and per channel, and exchange-to-exchange bindings.

No destination strings: the plain core L{Channel}, a recording consumer
and a broker on a L{Clock}.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.channel import Channel, Connection, Got, Published
from qmq.core.errors import AccessRefused, NotAllowed, NotFound, PreconditionFailed, ResourceLocked
from qmq.core.exchange import Exchange
from tests.test_core_channel import Recorder

START = 1000.0


class StructuralTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.channel = self.open()

    def open(self, connection: Connection | None = None) -> Channel:
        channel = Channel(self.broker, self.vhost, "alice", connection=connection)
        self.addCleanup(channel.close)
        return channel

    def pub(
        self, exchange: str, key: str, body: bytes = b"m", mandatory: bool = False,
        channel: Channel | None = None,
    ) -> Published:
        channel = channel or self.channel
        message = channel.make_message(exchange, key, None, body)
        return channel.publish(exchange, key, message, mandatory)

    def consumer(self, channel: Channel | None = None, **kwargs: Any) -> Recorder:
        return Recorder(channel or self.channel, **kwargs)

    def ready(self, name: str) -> list[tuple[bytes, int]]:
        return [(m.body, m.delivery_count) for m in self.vhost.queues[name].messages()]


class PublishTests(StructuralTestCase):
    def test_routed_count(self) -> None:
        """publish returns how many queues took the message."""
        for name in ("a", "b"):
            self.channel.declare_queue(name, durable=False)
            self.vhost.bind(name, "amq.fanout")
        self.assertEqual(self.pub("amq.fanout", "k"), Published(2, None))
        self.assertEqual(self.pub("", "a"), Published(1, None))
        self.assertEqual(self.ready("a"), [(b"m", 0), (b"m", 0)])
        self.assertEqual(self.ready("b"), [(b"m", 0)])
        self.assertEqual(self.channel.published, 2)

    def test_unroutable_dropped(self) -> None:
        """Without mandatory, a message that reaches nothing is dropped and
        counted as published."""
        self.assertEqual(self.pub("", "nowhere"), Published(0, None))
        self.assertEqual(self.pub("amq.direct", "k"), Published(0, None))
        self.assertEqual(self.channel.published, 2)

    def test_mandatory_unroutable(self) -> None:
        """With mandatory, 0 routes: the frontend returns it; it is not
        counted as published, and no queue has it."""
        self.channel.declare_queue("q", durable=False)
        self.assertEqual(self.pub("amq.direct", "k", mandatory=True), Published(0, None))
        self.assertEqual(self.channel.published, 0)
        self.assertEqual(self.ready("q"), [])
        self.vhost.bind("q", "amq.direct", "k")
        self.assertEqual(self.pub("amq.direct", "k", mandatory=True).routed, 1)

    def test_unknown_exchange(self) -> None:
        self.assertRaises(NotFound, self.pub, "nope", "k")

    def test_target_for_missing_queue(self) -> None:
        """target() of the default exchange needs the queue to exist (no
        queue is made by naming it: that is STOMP's /queue/ grammar)."""
        self.assertRaises(NotFound, self.channel.target, "", "missing")
        self.assertNotIn("missing", self.vhost.queues)


class SettleTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        for name in ("a", "b"):
            self.channel.declare_queue(name, durable=False)
        self.ca = self.consumer()
        self.cb = self.consumer()
        self.channel.consume(self.ca, "a")
        self.channel.consume(self.cb, "b")
        for i in range(2):
            self.pub("", "a", b"a%d" % i)
            self.pub("", "b", b"b%d" % i)
        # Tags 1 (a0), 2 (b0), 3 (a1), 4 (b1).

    def test_multiple(self) -> None:
        """settle(tag, multiple) acks every delivery of the channel up to
        tag, whichever consumer it went to."""
        self.assertEqual(self.channel.settle(3, multiple=True), 3)
        self.assertEqual(list(self.ca.unacked), [])
        self.assertEqual(list(self.cb.unacked), [4])
        self.assertEqual(self.channel.acked, 3)
        self.assertEqual(self.channel.settle(4), 1)
        self.assertEqual(self.channel.owners, {})

    def test_multiple_zero_settles_all(self) -> None:
        self.assertEqual(self.channel.settle(0, multiple=True), 4)
        self.assertEqual(self.channel.owners, {})

    def test_nack_requeue(self) -> None:
        """A nack with requeue puts the message back, redelivered, and the
        consumer (whose credit came back) gets it again."""
        self.channel.settle(1, ack=False, requeue=True)
        self.assertEqual([(m.body, m.delivery_count) for _, m in self.ca.got], [
            (b"a0", 0), (b"a1", 0), (b"a0", 1),
        ])

    def test_nack_multiple_without_requeue(self) -> None:
        """A reject without requeue drops them (and nothing comes back)."""
        self.assertEqual(self.channel.settle(4, multiple=True, ack=False, requeue=False), 4)
        self.assertEqual(len(self.ca.got) + len(self.cb.got), 4)
        self.assertEqual(self.ready("a") + self.ready("b"), [])
        self.assertEqual(self.channel.acked, 0)

    def test_unknown_tag(self) -> None:
        """An unknown tag, or one settled already, is AMQP's 406."""
        e = self.assertRaises(PreconditionFailed, self.channel.settle, 99)
        self.assertEqual(e.code, 406)
        self.channel.settle(1)
        self.assertRaises(PreconditionFailed, self.channel.settle, 1)
        self.assertRaises(PreconditionFailed, self.channel.settle, 1, True)


class GetTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.channel.declare_queue("q", durable=False)
        for body in (b"1", b"2", b"3"):
            self.pub("", "q", body)

    def test_get_with_ack(self) -> None:
        got = self.channel.get("q")
        assert got is not None
        self.assertIsInstance(got, Got)
        self.assertEqual((got.message.body, got.remaining), (b"1", 2))
        self.assertIn(got.tag, self.channel.owners)
        self.channel.settle(got.tag)
        self.assertEqual(self.channel.owners, {})
        self.assertEqual(self.ready("q"), [(b"2", 0), (b"3", 0)])

    def test_get_nack_requeues(self) -> None:
        got = self.channel.get("q")
        assert got is not None
        self.channel.settle(got.tag, ack=False)
        self.assertEqual(self.ready("q")[0], (b"1", 1))

    def test_get_without_ack(self) -> None:
        got = self.channel.get("q", ack=False)
        assert got is not None
        self.assertNotIn(got.tag, self.channel.owners)
        self.assertRaises(PreconditionFailed, self.channel.settle, got.tag)
        self.assertEqual(len(self.ready("q")), 2)

    def test_get_empty(self) -> None:
        for _ in range(3):
            self.assertIsNotNone(self.channel.get("q", ack=False))
        self.assertIsNone(self.channel.get("q"))
        self.assertRaises(NotFound, self.channel.get, "missing")

    def test_unacked_get_back_on_close(self) -> None:
        """What a get took and did not settle goes back when the channel closes."""
        self.channel.get("q")
        self.channel.get("q")
        self.channel.close()
        self.assertEqual(self.ready("q"), [(b"1", 1), (b"2", 1), (b"3", 0)])

    def test_multiple_covers_gets_and_consumers(self) -> None:
        got = self.channel.get("q")
        c = self.consumer()
        self.channel.consume(c, "q")
        self.assertEqual(self.channel.settle(c.tags()[-1], multiple=True), 3)
        self.assertIsNotNone(got)


class ExclusiveConsumerTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.channel.declare_queue("q", durable=False)

    def test_second_consumer_refused(self) -> None:
        """A second consumer on a queue with an exclusive one: 403."""
        first = self.consumer()
        self.channel.consume(first, "q", exclusive=True)
        other = self.open()
        e = self.assertRaises(AccessRefused, other.consume, self.consumer(other), "q")
        self.assertEqual(e.code, 403)
        self.assertRaises(AccessRefused, other.get, "q")
        self.assertEqual(self.vhost.queues["q"].consumers, [first])
        self.channel.unsubscribe(first)
        other.consume(self.consumer(other), "q")

    def test_exclusive_refused_when_shared(self) -> None:
        self.channel.consume(self.consumer(), "q")
        e = self.assertRaises(AccessRefused, self.channel.consume, self.consumer(), "q", exclusive=True)
        self.assertEqual(e.code, 403)


class ConsumerTagTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.channel.declare_queue("q", durable=False)

    def test_tags(self) -> None:
        c = self.consumer()
        tag = self.channel.consume(c, "q", tag="")
        self.assertTrue(tag.startswith("amq.ctag-"))
        self.assertIs(self.channel.consumer_tags[tag], c)
        self.assertEqual(self.channel.consume(self.consumer(), "q", tag="mine"), "mine")
        e = self.assertRaises(NotAllowed, self.channel.consume, self.consumer(), "q", tag="mine")
        self.assertEqual(e.code, 530)
        self.assertIs(self.channel.cancel(tag), c)
        self.assertIsNone(c.queue)
        self.assertNotIn(tag, self.channel.consumer_tags)
        self.assertRaises(NotFound, self.channel.cancel, tag)

    def test_untagged(self) -> None:
        """Without a tag (a frontend with its own ids), nothing is kept."""
        self.assertEqual(self.channel.consume(self.consumer(), "q"), "")
        self.assertEqual(self.channel.consumer_tags, {})

    def test_cancelled_by_deletion(self) -> None:
        c = self.consumer()
        tag = self.channel.consume(c, "q", tag="t")
        self.vhost.delete_queue("q")
        self.assertEqual(c.cancels, 1)
        self.assertNotIn(tag, self.channel.consumer_tags)


class ExclusiveQueueTests(StructuralTestCase):
    def test_owned_by_connection(self) -> None:
        """An exclusive queue is the connection's: its other channels may use
        it, another connection's get 405; it goes when the connection closes."""
        connection = Connection()
        one = self.open(connection)
        two = self.open(connection)
        queue = one.declare_queue("ex", durable=False, exclusive=True)
        self.assertIs(queue.exclusive_owner, connection)
        self.assertIs(two.declare_queue("ex", passive=True), queue)
        two.consume(self.consumer(two), "ex")
        stranger = self.channel
        for call in (
            lambda: stranger.declare_queue("ex"),
            lambda: stranger.declare_queue("ex", passive=True),
            lambda: stranger.consume(self.consumer(), "ex"),
            lambda: stranger.get("ex"),
        ):
            e = self.assertRaises(ResourceLocked, call)
            self.assertEqual(e.code, 405)
        one.close()
        two.close()
        self.assertIn("ex", self.vhost.queues)
        connection.close()
        self.assertNotIn("ex", self.vhost.queues)
        self.assertTrue(queue.deleted)

    def test_own_connection_closes_with_channel(self) -> None:
        channel = self.open()
        channel.declare_queue("ex", durable=False, exclusive=True)
        channel.declare_queue("shared", durable=False)
        channel.close()
        self.assertNotIn("ex", self.vhost.queues)
        self.assertIn("shared", self.vhost.queues)


class QosTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        for name in ("a", "b"):
            self.channel.declare_queue(name, durable=False)

    def fill(self, name: str, n: int, size: int = 1) -> None:
        for i in range(n):
            self.pub("", name, bytes([48 + i]) * size)

    def test_count_per_consumer(self) -> None:
        """qos(n): the consumers made after hold at most n unacked each."""
        early = self.consumer()
        self.channel.consume(early, "b")
        self.channel.qos(2)
        c = self.consumer()
        self.channel.consume(c, "a")
        self.fill("a", 5)
        self.fill("b", 5)
        self.assertEqual(len(c.got), 2)
        self.assertEqual(len(early.got), 5)  # made before: unbounded
        self.channel.settle(c.tags()[0])
        self.assertEqual(len(c.got), 3)

    def test_bytes_per_consumer(self) -> None:
        """A window by bytes: deliveries go while fewer bytes than it are
        out (the one crossing it goes too); an ack reopens it."""
        self.channel.qos(prefetch_bytes=10)
        c = self.consumer()
        self.channel.consume(c, "a")
        self.fill("a", 4, size=6)
        self.assertEqual(len(c.got), 2)  # 6 < 10: the second goes; 12 >= 10
        self.channel.settle(c.tags()[0])
        self.assertEqual(len(c.got), 3)
        self.channel.settle(c.tags()[2], multiple=True)
        self.assertEqual(len(c.got), 4)

    def test_global_count(self) -> None:
        """qos(n, global): the channel's consumers together hold n; an ack
        on one queue lets the other's consumer take more."""
        ca = self.consumer()
        cb = self.consumer()
        self.channel.consume(ca, "a")
        self.channel.qos(3, global_=True)
        self.channel.consume(cb, "b")
        self.fill("a", 2)
        self.fill("b", 4)
        self.assertEqual((len(ca.got), len(cb.got)), (2, 1))
        self.channel.settle(ca.tags()[0])
        self.assertEqual((len(ca.got), len(cb.got)), (2, 2))
        self.channel.settle(ca.tags()[1])
        self.assertEqual(len(cb.got), 3)
        # Lifting it lets everything go.
        self.channel.qos(0, global_=True)
        self.assertEqual(len(cb.got), 4)

    def test_global_bytes(self) -> None:
        c = self.consumer()
        self.channel.consume(c, "a")
        self.channel.qos(prefetch_bytes=8, global_=True)
        self.fill("a", 3, size=5)
        self.assertEqual(len(c.got), 2)
        self.channel.settle(c.tags()[1], multiple=True)
        self.assertEqual(len(c.got), 3)

    def test_window_counts_what_is_out(self) -> None:
        """A global window set while deliveries are out counts them."""
        c = self.consumer()
        self.channel.consume(c, "a")
        self.fill("a", 2)
        self.channel.qos(2, global_=True)
        self.fill("a", 1)
        self.assertEqual(len(c.got), 2)
        self.channel.settle(c.tags()[0])
        self.assertEqual(len(c.got), 3)

    def test_transport_pause_and_window(self) -> None:
        """A window reopening while the transport is paused does not unpause;
        the transport's resume does not open a full window."""
        c = self.consumer()
        self.channel.qos(1, global_=True)
        self.channel.consume(c, "a")
        self.fill("a", 3)
        self.assertEqual(len(c.got), 1)
        self.channel.pause()
        self.channel.settle(c.tags()[0])
        self.assertEqual(len(c.got), 1)
        self.channel.resume()
        self.assertEqual(len(c.got), 2)
        self.channel.pause()
        self.channel.resume()
        self.assertEqual(len(c.got), 2)

    def test_negative_refused(self) -> None:
        self.assertRaises(PreconditionFailed, self.channel.qos, -1)

    def test_unsubscribe_gives_window_back(self) -> None:
        ca = self.consumer()
        cb = self.consumer()
        self.channel.qos(1, global_=True)
        self.channel.consume(ca, "a")
        self.channel.consume(cb, "b")
        self.fill("a", 1)
        self.fill("b", 1)
        self.assertEqual((len(ca.got), len(cb.got)), (1, 0))
        self.channel.unsubscribe(ca)
        self.assertEqual(len(cb.got), 1)


class ExchangeBindingTests(StructuralTestCase):
    def setUp(self) -> None:
        super().setUp()
        for name, kind in (("x", "fanout"), ("y", "fanout"), ("t", "topic")):
            self.vhost.declare_exchange(name, kind, durable=False)
        for name in ("qx", "qy", "qt"):
            self.channel.declare_queue(name, durable=False)
        self.vhost.bind("qx", "x")
        self.vhost.bind("qy", "y")
        self.vhost.bind("qt", "t", "a.*")

    def bodies(self, name: str) -> list[bytes]:
        return [b for b, _ in self.ready(name)]

    def test_routing_through(self) -> None:
        """What a source routes with a matching key goes on through the
        bound destination, with the same key."""
        self.channel.bind_exchange("x", "t", "a.*")
        self.assertEqual(self.pub("t", "a.b", b"1").routed, 2)
        self.assertEqual(self.pub("t", "b.c", b"2").routed, 0)
        self.assertEqual(self.bodies("qx"), [b"1"])
        self.assertEqual(self.bodies("qt"), [b"1"])
        # Through a resolved target too (the STOMP path), and vhost.route.
        target = self.channel.target("t", "a.c")
        self.channel.publish_target(target, self.channel.make_message("t", "a.c", None, b"3"))
        self.assertEqual(self.bodies("qx"), [b"1", b"3"])
        self.assertEqual(len(self.vhost.route("t", "a.d")), 2)
        self.channel.unbind_exchange("x", "t", "a.*")
        self.assertEqual(self.pub("t", "a.b", b"4").routed, 1)
        self.assertEqual(self.vhost.exchanges["t"].e2e, 0)

    def test_loop(self) -> None:
        """x -> y -> x (and x -> x): a publish visits each exchange once,
        each queue gets one copy."""
        self.channel.bind_exchange("y", "x")
        self.channel.bind_exchange("x", "y")
        self.channel.bind_exchange("x", "x")
        self.assertEqual(self.pub("x", "k", b"1").routed, 2)
        self.assertEqual(self.pub("y", "k", b"2").routed, 2)
        self.assertEqual(self.bodies("qx"), [b"1", b"2"])
        self.assertEqual(self.bodies("qy"), [b"1", b"2"])

    def test_diamond_one_copy(self) -> None:
        """Two paths to one queue: one copy."""
        self.channel.bind_exchange("y", "x")
        self.vhost.bind("qy", "x")
        self.assertEqual(self.pub("x", "k").routed, 2)
        self.assertEqual(self.bodies("qy"), [b"m"])

    def test_hops_bounded(self) -> None:
        """A chain longer than max_exchange_hops stops there."""
        self.vhost.max_exchange_hops = 3
        names = [f"c{i}" for i in range(6)]
        for name in names:
            self.vhost.declare_exchange(name, "fanout", durable=False)
        for a, b in zip(names, names[1:], strict=False):
            self.channel.bind_exchange(b, a)
        self.vhost.bind("qy", names[-1])
        self.vhost.bind("qx", names[2])
        self.assertEqual(self.pub(names[0], "k").routed, 1)
        self.assertEqual(self.bodies("qx"), [b"m"])
        self.assertEqual(self.bodies("qy"), [])

    def test_delete_either_end(self) -> None:
        self.channel.bind_exchange("y", "x")
        self.vhost.delete_exchange("y")
        self.assertEqual(self.vhost.exchanges["x"].e2e, 0)
        self.assertEqual(self.pub("x", "k").routed, 1)
        self.vhost.declare_exchange("y", "fanout", durable=False)
        self.channel.bind_exchange("y", "x")
        self.vhost.delete_exchange("x")
        self.assertIsNone(self.vhost.exchanges["y"].sources or None)

    def test_auto_delete_source(self) -> None:
        """An auto-delete source whose last binding (to an exchange) goes, goes."""
        self.vhost.declare_exchange("auto", "fanout", durable=False, auto_delete=True)
        self.channel.bind_exchange("x", "auto")
        self.channel.unbind_exchange("x", "auto")
        self.assertNotIn("auto", self.vhost.exchanges)

    def test_unknown_and_default(self) -> None:
        self.assertRaises(NotFound, self.channel.bind_exchange, "nope", "x")
        self.assertRaises(AccessRefused, self.channel.bind_exchange, "", "x")

    def test_targets_never_exchanges(self) -> None:
        """What a route through exchange bindings hands on holds queues
        only, never an exchange."""
        self.channel.bind_exchange("y", "x")
        targets = self.vhost.route("x", "k")
        self.assertEqual(
            sorted(t.name for t in targets), ["qx", "qy"]
        )
        self.assertFalse([t for t in targets if isinstance(t, Exchange)])


class PermissionTests(StructuralTestCase):
    """With a user, publish checks the write permission once per name (and
    again after the user changes); consume and get check read."""

    class User:
        name = "bob"

        def __init__(self, allowed: set[tuple[str, str]]) -> None:
            self.allowed = allowed
            self.asked: list[tuple[str, str]] = []

        def can(self, operation: str, vhost: str, resource: str, text: str) -> bool:
            self.asked.append((operation, resource))
            return (operation, resource) in self.allowed

    def test_publish_checked_once(self) -> None:
        user = self.User({("write", "amq.fanout")})
        channel = Channel(self.broker, self.vhost, "bob", user=user)
        self.addCleanup(channel.close)
        for _ in range(3):
            self.pub("amq.fanout", "k", channel=channel)
        self.assertEqual(user.asked, [("write", "amq.fanout")])
        self.assertRaises(AccessRefused, self.pub, "amq.topic", "k", channel=channel)
        self.assertRaises(AccessRefused, self.pub, "amq.topic", "k", channel=channel)
        self.assertEqual(user.asked.count(("write", "amq.topic")), 2)  # refusals are not kept
        narrower = self.User(set())
        channel.set_user(narrower)
        self.assertRaises(AccessRefused, self.pub, "amq.fanout", "k", channel=channel)

    def test_read(self) -> None:
        self.channel.declare_queue("q", durable=False)
        user = self.User(set())
        channel = Channel(self.broker, self.vhost, "bob", user=user)
        self.addCleanup(channel.close)
        self.assertRaises(AccessRefused, channel.consume, self.consumer(channel), "q")
        self.assertRaises(AccessRefused, channel.get, "q")
        self.assertRaises(AccessRefused, channel.consume, self.consumer(channel), exchange="amq.topic")


class _User:
    """A user whose token narrows writes to the destinations in C{allowed}."""

    name = "tok"
    owner = "tok"
    destinations = True

    def __init__(self, *allowed: str) -> None:
        self.allowed = allowed

    def can(self, operation: str, vhost: str, name: str, path: str) -> bool:
        return path in self.allowed


class PublishVerdictTests(StructuralTestCase):
    """A structural publish gets the verdict STOMP's and HTTP's get for the
    same resource (found over AMQP by tests/integration/test_verdicts.py)."""

    def test_exchange_with_key(self) -> None:
        """Publishing to amq.topic with a key is checked as /topic/KEY."""
        channel = Channel(self.broker, self.vhost, "tok", user=_User("/topic/chat.a"))
        self.addCleanup(channel.close)
        self.assertEqual(self.pub("amq.topic", "chat.a", channel=channel).routed, 0)
        self.assertRaises(AccessRefused, self.pub, "amq.topic", "news", channel=channel)
        self.assertRaises(AccessRefused, channel.target, "amq.topic", "news")

    def test_durable_subscription_queue(self) -> None:
        """Another owner's durable subscription queue is refused to a
        publish by name, authentication on or off."""
        self.vhost.declare_queue("durable.bob.feed", subscription=True)
        self.assertRaises(AccessRefused, self.pub, "", "durable.bob.feed")
        self.assertRaises(AccessRefused, self.channel.target, "", "durable.bob.feed")
        self.assertEqual(len(self.vhost.queues["durable.bob.feed"]), 0)
        bob = Channel(self.broker, self.vhost, "bob")
        self.addCleanup(bob.close)
        self.assertEqual(self.pub("", "durable.bob.feed", channel=bob).routed, 1)
