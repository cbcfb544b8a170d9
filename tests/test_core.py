"""Tests for the broker core: L{qmq.core.broker}, L{qmq.core.vhost},
L{qmq.core.queue}, L{qmq.core.consumer} and L{qmq.core.batch}.

Everything runs on a L{Clock}; no sockets, no reactor.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.batch import WriteBatcher
from qmq.core.broker import DEFAULT_VHOST, Broker
from qmq.core.consumer import UNLIMITED, Consumer
from qmq.core.errors import (
    AccessRefused,
    BrokerError,
    NotFound,
    PreconditionFailed,
    ResourceLimit,
)
from qmq.core.exchange import (
    DirectExchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from qmq.core.limits import LimitSettings
from qmq.core.message import Message
from qmq.core.policy import DEFAULT_POLICY, QueuePolicy
from qmq.core.queue import Queue
from qmq.core.store import NullStore, Recovery


class RecordingConsumer(Consumer):
    """A consumer that keeps what it is given and can ack, reject or leave."""

    __slots__ = ("got", "unacked", "cancels")

    def __init__(self, ack_required: bool = True, prefetch: int | None = None, owner=None) -> None:
        super().__init__(ack_required, prefetch, owner)
        self.got: list[Message] = []
        self.unacked: list[Message] = []
        self.cancels = 0

    def deliver(self, message: Message, queue: Queue) -> None:
        self.got.append(message)
        if self.ack_required:
            self.unacked.append(message)

    def cancelled(self) -> None:
        self.cancels += 1

    def bodies(self) -> list[bytes]:
        return [m.body for m in self.got]

    def ack_first(self, n: int = 1) -> None:
        """Ack the C{n} oldest unacked messages."""
        for _ in range(n):
            message = self.unacked.pop(0)
            self.queue.ack(self, message)

    def leave(self) -> None:
        """Detach, giving back every unacked message."""
        unacked, self.unacked = self.unacked, []
        self.queue.remove_consumer(self, unacked)


class CoreTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost

    def publish(self, queue_or_key: str, *bodies: bytes, exchange: str = "", headers=None) -> int:
        n = 0
        for body in bodies:
            n += self.vhost.publish(
                self.broker.new_message(exchange, queue_or_key, headers, body)
            )
        return n


class BrokerTests(CoreTestCase):
    def test_default_vhost(self) -> None:
        """The broker starts with the virtual host C{/}, the default."""
        self.assertEqual(DEFAULT_VHOST, "/")
        self.assertIs(self.broker.vhosts["/"], self.vhost)
        self.assertIs(self.broker.vhost(None), self.vhost)
        self.assertIs(self.broker.vhost("/"), self.vhost)
        self.assertEqual(self.vhost.name, "/")

    def test_vhost_lookup(self) -> None:
        """C{vhost} returns None for an unknown name; C{add_vhost} is idempotent."""
        self.assertIsNone(self.broker.vhost("prod"))
        prod = self.broker.add_vhost("prod")
        self.assertIs(self.broker.add_vhost("prod"), prod)
        self.assertIs(self.broker.vhost("prod"), prod)
        self.assertIsNot(prod, self.vhost)
        # Separate namespaces.
        prod.declare_queue("q")
        self.assertNotIn("q", self.vhost.queues)

    def test_new_message(self) -> None:
        """Messages get increasing ids and the clock's time."""
        m1 = self.broker.new_message("", "q", {"a": "b"}, b"one", persistent=True)
        self.clock.advance(5)
        m2 = self.broker.new_message("amq.topic", "k", None, b"two")
        self.assertLess(m1.id, m2.id)
        self.assertEqual(m1.timestamp, 1000.0)
        self.assertEqual(m2.timestamp, 1005.0)
        self.assertEqual(
            (m1.exchange, m1.routing_key, m1.headers, m1.body, m1.persistent, m1.delivery_count),
            ("", "q", {"a": "b"}, b"one", True, 0),
        )
        self.assertFalse(m2.persistent)
        self.assertIn("3 bytes", repr(m1))

    def test_redelivery_copy(self) -> None:
        """C{redelivery} copies with the count raised and leaves the original alone."""
        m = self.broker.new_message("", "q", {"h": "v"}, b"body")
        m.cache = b"cached"
        r = m.redelivery()
        rr = r.redelivery()
        self.assertEqual((m.delivery_count, r.delivery_count, rr.delivery_count), (0, 1, 2))
        self.assertEqual((r.id, r.body, r.headers, r.cache), (m.id, b"body", {"h": "v"}, b"cached"))
        self.assertIsNot(r, m)

    def test_error_codes(self) -> None:
        """Core errors carry their AMQP reply code and message."""
        for cls, code in [
            (NotFound, 404),
            (PreconditionFailed, 406),
            (AccessRefused, 403),
            (ResourceLimit, 506),
        ]:
            e = cls("why")
            self.assertIsInstance(e, BrokerError)
            self.assertEqual((e.code, e.message, str(e)), (code, "why", "why"))


class VirtualHostExchangeTests(CoreTestCase):
    def test_standard_exchanges(self) -> None:
        """Every virtual host has amq.direct, amq.fanout, amq.topic, amq.headers."""
        for vhost in (self.vhost, self.broker.add_vhost("other")):
            ex = vhost.exchanges
            self.assertIsInstance(ex["amq.direct"], DirectExchange)
            self.assertIsInstance(ex["amq.fanout"], FanoutExchange)
            self.assertIsInstance(ex["amq.topic"], TopicExchange)
            self.assertIsInstance(ex["amq.headers"], HeadersExchange)
            self.assertEqual(
                {name: e.type for name, e in ex.items()},
                {
                    "amq.direct": "direct",
                    "amq.fanout": "fanout",
                    "amq.topic": "topic",
                    "amq.headers": "headers",
                },
            )
        self.assertIsNot(self.vhost.exchanges["amq.topic"], self.broker.vhost("other").exchanges["amq.topic"])

    def test_declare_exchange(self) -> None:
        """Declaring returns the same exchange while the type agrees."""
        ex = self.vhost.declare_exchange("logs", "fanout")
        self.assertIs(self.vhost.declare_exchange("logs", "fanout"), ex)
        self.assertIs(self.vhost.exchange("logs"), ex)
        self.assertEqual((ex.name, ex.type, ex.durable, ex.auto_delete), ("logs", "fanout", True, False))

    def test_declare_exchange_errors(self) -> None:
        """Another type, an unknown type and the default exchange are refused."""
        self.vhost.declare_exchange("logs", "fanout")
        e = self.assertRaises(PreconditionFailed, self.vhost.declare_exchange, "logs", "topic")
        self.assertIn("logs", e.message)
        self.assertRaises(PreconditionFailed, self.vhost.declare_exchange, "x", "x-consistent-hash")
        self.assertRaises(AccessRefused, self.vhost.declare_exchange, "", "direct")
        self.assertNotIn("x", self.vhost.exchanges)

    def test_exchange_not_found(self) -> None:
        e = self.assertRaises(NotFound, self.vhost.exchange, "nope")
        self.assertIn("nope", e.message)
        self.assertRaises(NotFound, self.vhost.route, "nope", "k")
        self.assertRaises(NotFound, self.publish, "k", b"x", exchange="nope")

    def test_delete_builtin_exchange_refused(self) -> None:
        self.assertRaises(AccessRefused, self.vhost.delete_exchange, "amq.topic")
        self.assertIn("amq.topic", self.vhost.exchanges)
        self.assertRaises(NotFound, self.vhost.delete_exchange, "nope")

    def test_delete_exchange_removes_bindings(self) -> None:
        """Deleting an exchange unbinds its queues (and only its bindings)."""
        self.vhost.declare_exchange("ex", "direct")
        q = self.vhost.declare_queue("q")
        self.vhost.bind("q", "ex", "k")
        self.vhost.bind("q", "amq.direct", "k")
        self.vhost.delete_exchange("ex")
        self.assertNotIn("ex", self.vhost.exchanges)
        self.assertEqual([(b[0].name, b[1]) for b in q.bindings], [("amq.direct", "k")])
        self.assertEqual(self.publish("k", b"m", exchange="amq.direct"), 1)

    def test_delete_auto_delete_exchange_with_bindings(self) -> None:
        """An auto-delete exchange that still has bindings can be deleted."""
        self.vhost.declare_exchange("tmp", "fanout", auto_delete=True)
        q = self.vhost.declare_queue("q")
        self.vhost.bind("q", "tmp")
        self.vhost.delete_exchange("tmp")
        self.assertNotIn("tmp", self.vhost.exchanges)
        self.assertEqual(q.bindings, [])

    def test_auto_delete_exchange(self) -> None:
        """An auto-delete exchange goes when its last binding goes."""
        self.vhost.declare_exchange("tmp", "direct", auto_delete=True)
        self.vhost.declare_queue("a")
        self.vhost.declare_queue("b")
        self.vhost.bind("a", "tmp", "k")
        self.vhost.bind("b", "tmp", "k")
        self.vhost.unbind("a", "tmp", "k")
        self.assertIn("tmp", self.vhost.exchanges)
        self.vhost.delete_queue("b")
        self.assertNotIn("tmp", self.vhost.exchanges)

    def test_bind_errors(self) -> None:
        self.vhost.declare_queue("q")
        self.assertRaises(NotFound, self.vhost.bind, "nope", "amq.direct", "k")
        self.assertRaises(NotFound, self.vhost.bind, "q", "nope", "k")
        self.assertRaises(AccessRefused, self.vhost.bind, "q", "", "q")

    def test_bind_twice_and_unbind(self) -> None:
        """A repeated bind is one binding; unbind of an unknown binding is quiet."""
        q = self.vhost.declare_queue("q")
        self.vhost.bind("q", "amq.direct", "k")
        self.vhost.bind("q", "amq.direct", "k")
        self.assertEqual(len(q.bindings), 1)
        self.assertEqual(self.vhost.exchanges["amq.direct"].binding_count, 1)
        self.assertEqual(self.publish("k", b"m", exchange="amq.direct"), 1)
        self.assertEqual(len(q), 1)
        self.vhost.unbind("q", "amq.direct", "other")
        self.assertEqual(len(q.bindings), 1)
        self.vhost.unbind("q", "amq.direct", "k")
        self.assertEqual(q.bindings, [])
        self.assertEqual(self.publish("k", b"m", exchange="amq.direct"), 0)


class VirtualHostQueueTests(CoreTestCase):
    def test_default_exchange_routes_by_name(self) -> None:
        """The default exchange delivers to the queue named by the routing key."""
        a = self.vhost.declare_queue("a")
        b = self.vhost.declare_queue("b")
        self.assertEqual(self.publish("a", b"1", b"2"), 2)
        self.assertEqual(self.publish("b", b"3"), 1)
        self.assertEqual(self.publish("missing", b"4"), 0)
        self.assertEqual([m.body for m in a.messages()], [b"1", b"2"])
        self.assertEqual([m.body for m in b.messages()], [b"3"])
        self.assertEqual(self.vhost.route("", "a"), (a,))
        self.assertEqual(tuple(self.vhost.route("", "missing")), ())

    def test_declare_queue(self) -> None:
        q = self.vhost.declare_queue("q", durable=False, auto_delete=True)
        self.assertIs(self.vhost.declare_queue("q"), q)
        self.assertIs(self.vhost.queue("q"), q)
        self.assertEqual((q.name, q.durable, q.auto_delete, q.vhost), ("q", False, True, self.vhost))
        self.assertIn("'q'", repr(q))

    def test_declare_queue_errors(self) -> None:
        """Empty names and bad arguments are PreconditionFailed; lookups NotFound."""
        self.assertRaises(PreconditionFailed, self.vhost.declare_queue, "")
        for bad in ("x", -1, "1.5"):
            self.assertRaises(
                PreconditionFailed, self.vhost.declare_queue, "q", arguments={"x-max-length": bad}
            )
        self.assertRaises(
            PreconditionFailed, self.vhost.declare_queue, "q", arguments={"x-overflow": "reject-all"}
        )
        for name, bad in (
            ("x-max-length-bytes", -1),
            ("x-expires", 0),
            ("x-delivery-limit", "never"),
        ):
            e = self.assertRaises(
                PreconditionFailed, self.vhost.declare_queue, "q", arguments={name: bad}
            )
            self.assertIn(name, e.message)
        self.assertNotIn("q", self.vhost.queues)
        self.assertRaises(NotFound, self.vhost.queue, "q")

    def test_exclusive_queue(self) -> None:
        """An exclusive queue is refused to every other owner, even no owner."""
        alice, bob = object(), object()
        q = self.vhost.declare_queue("mine", exclusive_owner=alice)
        self.assertIs(self.vhost.declare_queue("mine", exclusive_owner=alice), q)
        e = self.assertRaises(AccessRefused, self.vhost.declare_queue, "mine", exclusive_owner=bob)
        self.assertEqual(e.code, 403)
        self.assertRaises(AccessRefused, self.vhost.declare_queue, "mine")
        # A shared queue is shared whoever asks.
        s = self.vhost.declare_queue("shared")
        self.assertIs(self.vhost.declare_queue("shared", exclusive_owner=bob), s)

    def test_delete_queue(self) -> None:
        """Deleting returns the ready count, unbinds, and cancels consumers."""
        q = self.vhost.declare_queue("q")
        self.vhost.bind("q", "amq.fanout")
        c = RecordingConsumer(prefetch=1)
        q.add_consumer(c)
        self.publish("q", b"1", b"2", b"3")
        self.assertEqual(self.vhost.delete_queue("q"), 2)
        self.assertTrue(q.deleted)
        self.assertEqual(c.cancels, 1)
        self.assertIsNone(c.queue)
        self.assertEqual(list(q.consumers), [])
        self.assertNotIn("q", self.vhost.queues)
        self.assertEqual(self.publish("", b"x", exchange="amq.fanout"), 0)
        self.assertEqual(self.vhost.delete_queue("q"), 0)
        # Acks and requeues on a deleted queue go nowhere.
        q.reject(c, c.unacked, True)
        self.assertEqual(len(q), 0)


class QueueDeliveryTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.q = self.vhost.declare_queue("q")

    def test_fifo(self) -> None:
        """Messages published before a consumer arrives are delivered in order."""
        self.publish("q", *[b"%d" % i for i in range(10)])
        self.assertEqual(len(self.q), 10)
        c = RecordingConsumer(ack_required=False)
        self.q.add_consumer(c)
        self.publish("q", b"10", b"11")
        self.assertEqual(c.bodies(), [b"%d" % i for i in range(12)])
        self.assertEqual(len(self.q), 0)

    def test_fifo_long_queue(self) -> None:
        """Order holds across the queue's internal compaction."""
        n = 5000
        self.publish("q", *[b"%d" % i for i in range(n)])
        got = []
        while True:
            m = self.q.get()
            if m is None:
                break
            got.append(int(m.body))
            if len(got) % 1500 == 0:
                self.publish("q", b"%d" % n)
                n += 1
        self.assertEqual(got, list(range(n)))

    def test_round_robin(self) -> None:
        """Ready consumers take turns."""
        consumers = [RecordingConsumer(ack_required=False) for _ in range(3)]
        for c in consumers:
            self.q.add_consumer(c)
        self.publish("q", *[b"%d" % i for i in range(9)])
        self.assertEqual([len(c.got) for c in consumers], [3, 3, 3])
        # Strict rotation: the consumer of message i also gets i+3 and i+6.
        owner = {m.body: i for i, c in enumerate(consumers) for m in c.got}
        for i in range(6):
            self.assertEqual(owner[b"%d" % i], owner[b"%d" % (i + 3)])
        self.assertEqual(len({owner[b"0"], owner[b"1"], owner[b"2"]}), 3)

    def test_round_robin_backlog(self) -> None:
        """A backlog is spread too, not given all to the first consumer."""
        self.publish("q", *[b"%d" % i for i in range(6)])
        a, b = RecordingConsumer(prefetch=2), RecordingConsumer(prefetch=10)
        self.q.add_consumer(a)
        self.assertEqual(a.bodies(), [b"0", b"1"])
        self.q.add_consumer(b)
        self.assertEqual(b.bodies(), [b"2", b"3", b"4", b"5"])

    def test_credit_stops_and_resumes(self) -> None:
        """Delivery stops at zero credit and resumes, one per ack."""
        c = RecordingConsumer(prefetch=2)
        self.q.add_consumer(c)
        self.assertEqual((c.prefetch, c.credit), (2, 2))
        self.publish("q", b"a", b"b", b"c", b"d", b"e")
        self.assertEqual(c.bodies(), [b"a", b"b"])
        self.assertEqual(c.credit, 0)
        self.assertEqual(len(self.q), 3)
        c.ack_first()
        self.assertEqual(c.bodies(), [b"a", b"b", b"c"])
        self.assertEqual(c.credit, 0)
        c.ack_first(2)
        self.assertEqual(c.bodies(), [b"a", b"b", b"c", b"d", b"e"])
        self.assertEqual(c.credit, 0)
        c.ack_first(2)
        self.assertEqual(c.credit, 2)
        self.publish("q", b"f")
        self.assertEqual(c.bodies()[-1], b"f")

    def test_credit_skips_full_consumer(self) -> None:
        """A consumer without credit is passed over for one that has some."""
        a, b = RecordingConsumer(prefetch=1), RecordingConsumer(prefetch=1)
        self.q.add_consumer(a)
        self.q.add_consumer(b)
        self.publish("q", b"1", b"2", b"3")
        self.assertEqual(sorted(a.bodies() + b.bodies()), [b"1", b"2"])
        self.assertEqual(len(self.q), 1)
        first = a if a.got[0].body == b"1" else b
        first.ack_first()
        self.assertEqual(first.bodies(), [b"1", b"3"])

    def test_no_ack_unlimited_credit(self) -> None:
        """Consumers that do not ack ignore prefetch."""
        c = RecordingConsumer(ack_required=False, prefetch=1)
        self.assertEqual(c.credit, UNLIMITED)
        self.q.add_consumer(c)
        self.publish("q", *[b"x"] * 50)
        self.assertEqual(len(c.got), 50)
        # prefetch None or 0 with acks also means unlimited.
        self.assertEqual(RecordingConsumer(prefetch=None).credit, UNLIMITED)
        self.assertEqual(RecordingConsumer(prefetch=0).credit, UNLIMITED)

    def test_paused_consumer_skipped(self) -> None:
        """A paused consumer gets nothing; drain resumes it in order."""
        a, b = RecordingConsumer(ack_required=False), RecordingConsumer(ack_required=False)
        self.q.add_consumer(a)
        self.q.add_consumer(b)
        a.paused = True
        self.publish("q", b"1", b"2")
        self.assertEqual((a.bodies(), b.bodies()), ([], [b"1", b"2"]))
        b.paused = True
        self.publish("q", b"3", b"4")
        self.assertEqual(len(self.q), 2)
        self.assertEqual(a.got, [])
        a.paused = False
        self.q.drain()
        self.assertEqual(a.bodies(), [b"3", b"4"])
        self.assertEqual(len(self.q), 0)

    def test_paused_single_consumer(self) -> None:
        c = RecordingConsumer(ack_required=False)
        self.q.add_consumer(c)
        c.paused = True
        self.publish("q", b"1", b"2")
        self.assertEqual(c.got, [])
        self.publish("q", b"3")
        c.paused = False
        self.q.drain()
        self.assertEqual(c.bodies(), [b"1", b"2", b"3"])

    def test_get_and_purge(self) -> None:
        self.assertIsNone(self.q.get())
        self.publish("q", b"1", b"2", b"3")
        self.assertEqual(self.q.get().body, b"1")
        self.assertEqual(self.q.purge(), 2)
        self.assertEqual(len(self.q), 0)
        self.assertEqual(self.q.messages(), [])
        self.assertIsNone(self.q.get())


class RequeueTests(CoreTestCase):
    """The requeue rule of L{qmq.core.queue}."""

    def setUp(self) -> None:
        super().setUp()
        self.q = self.vhost.declare_queue("q")

    def ready(self, q: Queue | None = None) -> list[tuple[bytes, int]]:
        return [(m.body, m.delivery_count) for m in (q or self.q).messages()]

    def test_requeue_goes_to_head_in_publish_order(self) -> None:
        """Requeued messages go ahead of never-delivered ones, oldest first."""
        c = RecordingConsumer(prefetch=3)
        self.q.add_consumer(c)
        self.publish("q", b"1", b"2", b"3", b"4", b"5")
        self.assertEqual(c.bodies(), [b"1", b"2", b"3"])
        # Give them back out of order.
        self.q.remove_consumer(c, [c.got[2], c.got[0], c.got[1]])
        self.assertEqual(
            self.ready(), [(b"1", 1), (b"2", 1), (b"3", 1), (b"4", 0), (b"5", 0)]
        )
        d = RecordingConsumer(ack_required=False)
        self.q.add_consumer(d)
        self.assertEqual(d.bodies(), [b"1", b"2", b"3", b"4", b"5"])
        self.assertEqual([m.delivery_count for m in d.got], [1, 1, 1, 0, 0])

    def test_separate_requeues_keep_publish_order(self) -> None:
        """Messages requeued at different times still come back oldest first."""
        a, b = RecordingConsumer(prefetch=1), RecordingConsumer(prefetch=1)
        self.q.add_consumer(a)
        self.q.add_consumer(b)
        self.publish("q", b"1", b"2", b"3")
        self.assertEqual(sorted(a.bodies() + b.bodies()), [b"1", b"2"])
        holder_of = {c.got[0].body: c for c in (a, b)}
        # The holder of the older message leaves first: nobody can take it.
        holder_of[b"1"].leave()
        self.assertEqual(self.ready(), [(b"1", 1), (b"3", 0)])
        holder_of[b"2"].leave()
        self.assertEqual(self.ready(), [(b"1", 1), (b"2", 1), (b"3", 0)])

    def test_nack_one_at_a_time_keeps_order(self) -> None:
        c = RecordingConsumer(prefetch=4)
        self.q.add_consumer(c)
        self.publish("q", b"1", b"2", b"3", b"4", b"5")
        c.paused = True  # nothing is redelivered while we give them back
        for i in (3, 1, 2, 0):
            self.q.reject(c, [c.got[i]], True)
        self.assertEqual(
            self.ready(), [(b"1", 1), (b"2", 1), (b"3", 1), (b"4", 1), (b"5", 0)]
        )
        self.assertEqual(c.credit, 4)

    def test_redelivery_count_grows(self) -> None:
        """Each requeue raises the delivery count of the copy by one."""
        c = RecordingConsumer(prefetch=1)
        self.q.add_consumer(c)
        self.publish("q", b"m")
        for expected in (1, 2, 3):
            m = c.unacked.pop()
            self.q.reject(c, [m], True)
            self.assertEqual(c.got[-1].delivery_count, expected)
            self.assertEqual(c.got[-1].body, b"m")
        self.assertEqual(c.got[0].delivery_count, 0)
        self.assertEqual(len(c.got), 4)

    def test_requeue_copies_independent_across_fanout(self) -> None:
        """A redelivery in one queue of a fanout never marks the other copies."""
        self.vhost.declare_queue("other")
        self.vhost.bind("q", "amq.fanout")
        self.vhost.bind("other", "amq.fanout")
        a = RecordingConsumer(prefetch=5)
        self.q.add_consumer(a)
        self.assertEqual(self.publish("", b"x", exchange="amq.fanout"), 2)
        self.q.reject(a, [a.unacked.pop()], True)
        self.assertEqual([m.delivery_count for m in a.got], [0, 1])
        other = self.vhost.queue("other")
        self.assertEqual(self.ready(other), [(b"x", 0)])
        b = RecordingConsumer(ack_required=False)
        other.add_consumer(b)
        self.assertEqual(b.got[0].delivery_count, 0)
        self.assertIs(b.got[0], a.got[0])  # one shared object until redelivered

    def test_requeue_with_wrapped_head(self) -> None:
        """Requeue works whether or not there is room before the head."""
        c = RecordingConsumer(prefetch=3)
        self.publish("q", *[b"%d" % i for i in range(6)])
        self.q.add_consumer(c)
        self.assertEqual(c.bodies(), [b"0", b"1", b"2"])
        c.paused = True
        self.q.reject(c, c.unacked[:2], True)
        self.assertEqual(
            [b for b, _ in self.ready()], [b"0", b"1", b"3", b"4", b"5"]
        )
        self.q.get()
        self.q.get()
        self.q.get()
        self.q.reject(c, [c.unacked[2]], True)
        self.assertEqual(self.ready(), [(b"2", 1), (b"4", 0), (b"5", 0)])

    def test_reject_without_requeue_drops(self) -> None:
        c = RecordingConsumer(prefetch=1)
        self.q.add_consumer(c)
        self.publish("q", b"1", b"2")
        self.q.reject(c, [c.unacked.pop()], False)
        self.assertEqual(c.bodies(), [b"1", b"2"])
        self.q.reject(c, [c.unacked.pop()], False)
        self.assertEqual(len(self.q), 0)
        self.assertEqual(c.credit, 1)
        self.assertEqual([m.delivery_count for m in c.got], [0, 0])

    def test_remove_consumer_requeues_unacked(self) -> None:
        """Unacked messages of a leaving consumer go to the others, marked."""
        a, b = RecordingConsumer(prefetch=2), RecordingConsumer(prefetch=10)
        self.q.add_consumer(a)
        self.publish("q", b"1", b"2", b"3")
        a.ack_first()
        self.assertEqual(a.bodies(), [b"1", b"2", b"3"])
        self.q.add_consumer(b)
        self.publish("q", b"4")
        a.leave()
        self.assertIsNone(a.queue)
        self.assertEqual(self.q.consumers, [b])
        self.assertEqual(b.bodies(), [b"4", b"2", b"3"])
        self.assertEqual([m.delivery_count for m in b.got], [0, 1, 1])
        # Removing twice is harmless.
        self.q.remove_consumer(a, [])
        self.assertEqual(len(self.q), 0)

    def test_auto_delete_queue(self) -> None:
        """An auto-delete queue is deleted when its last consumer leaves."""
        q = self.vhost.declare_queue("ad", auto_delete=True)
        self.vhost.bind("ad", "amq.topic", "a.b")
        a, b = RecordingConsumer(), RecordingConsumer()
        q.add_consumer(a)
        q.add_consumer(b)
        a.leave()
        self.assertIn("ad", self.vhost.queues)
        b.leave()
        self.assertNotIn("ad", self.vhost.queues)
        self.assertTrue(q.deleted)
        self.assertEqual(self.publish("a.b", b"x", exchange="amq.topic"), 0)
        # A plain queue stays.
        plain = RecordingConsumer()
        self.q.add_consumer(plain)
        plain.leave()
        self.assertIn("q", self.vhost.queues)


class MaxLengthTests(CoreTestCase):
    def test_drop_head(self) -> None:
        """drop-head (the default) discards the oldest ready message."""
        q = self.vhost.declare_queue("q", arguments={"x-max-length": "3"})
        self.assertEqual((q.max_length, q.overflow), (3, "drop-head"))
        self.assertEqual((q.policy.max_length, q.policy.overflow), (3, "drop-head"))
        self.publish("q", b"1", b"2", b"3", b"4", b"5")
        self.assertEqual([m.body for m in q.messages()], [b"3", b"4", b"5"])
        self.assertEqual((q.dropped, q.ready_bytes), (2, 3))

    def test_reject_publish(self) -> None:
        q = self.vhost.declare_queue(
            "q", arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        self.publish("q", b"1", b"2")
        e = self.assertRaises(ResourceLimit, self.publish, "q", b"3")
        self.assertEqual(e.code, 506)
        self.assertEqual([m.body for m in q.messages()], [b"1", b"2"])
        q.get()
        self.publish("q", b"4")
        self.assertEqual([m.body for m in q.messages()], [b"2", b"4"])

    def test_max_length_counts_ready_only(self) -> None:
        """Unacked messages held by consumers do not count against the bound."""
        q = self.vhost.declare_queue(
            "q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        c = RecordingConsumer(prefetch=2)
        q.add_consumer(c)
        self.publish("q", b"1", b"2", b"3")
        self.assertEqual(c.bodies(), [b"1", b"2"])
        self.assertRaises(ResourceLimit, self.publish, "q", b"4")

    def test_max_length_zero(self) -> None:
        """With room for nothing, only a ready consumer gets the message."""
        q = self.vhost.declare_queue("q", arguments={"x-max-length": 0})
        self.publish("q", b"lost")
        self.assertEqual(len(q), 0)
        c = RecordingConsumer(ack_required=False)
        q.add_consumer(c)
        self.publish("q", b"kept")
        self.assertEqual(c.bodies(), [b"kept"])


class LimitsTests(SynchronousTestCase):
    """The broker's L{LimitSettings} reach every topic exchange and the frontends."""

    def test_defaults(self) -> None:
        """Without limits, a broker has L{LimitSettings}'s defaults."""
        broker = Broker(Clock())
        self.assertEqual(broker.limits, LimitSettings())
        self.assertEqual(broker.max_unfinished_bytes, LimitSettings().max_unfinished_bytes)
        topic = broker.default_vhost.exchange("amq.topic")
        self.assertEqual((topic.max_words, topic.max_key_length), (32, 255))

    def test_topic_words(self) -> None:
        """
        A pattern with more words than C{limits.max_topic_words} is refused
        on C{amq.topic}, on a declared topic exchange and in a virtual host
        added later; one at the limit is accepted.
        """
        broker = Broker(Clock(), limits=LimitSettings(max_topic_words=3))
        vhost = broker.default_vhost
        vhost.declare_queue("q")
        vhost.declare_exchange("events", "topic")
        other = broker.add_vhost("other")
        other.declare_queue("q")
        for where, exchange in [(vhost, "amq.topic"), (vhost, "events"), (other, "amq.topic")]:
            where.bind("q", exchange, "a.*.#")
            e = self.assertRaises(PreconditionFailed, where.bind, "q", exchange, "a.b.c.d")
            self.assertIn("limits.max_topic_words", e.message)
            self.assertIn("the limit is 3", e.message)

    def test_routing_key_length(self) -> None:
        """A key longer than C{limits.max_routing_key_length} is refused."""
        broker = Broker(Clock(), limits=LimitSettings(max_routing_key_length=8))
        vhost = broker.default_vhost
        vhost.declare_queue("q")
        vhost.bind("q", "amq.topic", "abcdefgh")
        e = self.assertRaises(PreconditionFailed, vhost.bind, "q", "amq.topic", "abcdefghi")
        self.assertIn("limits.max_routing_key_length", e.message)

    def test_other_exchange_types_untouched(self) -> None:
        """Only topic exchanges have word limits: a long direct key binds."""
        broker = Broker(Clock(), limits=LimitSettings(max_topic_words=1))
        vhost = broker.default_vhost
        vhost.declare_queue("q")
        vhost.bind("q", "amq.direct", "a.b.c")
        self.assertEqual(len(vhost.route("amq.direct", "a.b.c")), 1)

    def test_max_unfinished_bytes(self) -> None:
        broker = Broker(Clock(), limits=LimitSettings(max_unfinished_bytes=1234))
        self.assertEqual(broker.max_unfinished_bytes, 1234)


class QueueDefaultsTests(CoreTestCase):
    """
    L{VirtualHost.queue_defaults} apply to queues created on demand, not to
    queues declared with their own arguments.
    """

    ARGUMENTS = {
        "x-max-length": 2,
        "x-max-length-bytes": 1000,
        "x-overflow": "reject-publish",
        "x-expires": 60_000,
        "x-delivery-limit": 5,
    }

    def test_none_by_default(self) -> None:
        """A virtual host starts with no defaults: on-demand queues are unbounded."""
        self.assertIs(self.vhost.queue_defaults, DEFAULT_POLICY)
        q = self.vhost.declare_queue("q", on_demand=True)
        self.assertIs(q.policy, DEFAULT_POLICY)

    def test_set(self) -> None:
        policy = self.vhost.set_queue_defaults(self.ARGUMENTS)
        self.assertEqual(policy, QueuePolicy(2, 1000, "reject-publish", 60_000, 5))
        self.assertIs(self.vhost.queue_defaults, policy)
        self.assertIs(self.vhost.set_queue_defaults(None), DEFAULT_POLICY)

    def test_bad_value(self) -> None:
        e = self.assertRaises(
            PreconditionFailed, self.vhost.set_queue_defaults, {"x-overflow": "explode"}
        )
        self.assertIn("x-overflow", e.message)

    def test_on_demand(self) -> None:
        """An on-demand queue gets every default."""
        self.vhost.set_queue_defaults(self.ARGUMENTS)
        q = self.vhost.declare_queue("q", on_demand=True)
        self.assertEqual(
            (
                q.policy.max_length,
                q.policy.max_bytes,
                q.policy.overflow,
                q.policy.expires,
                q.policy.delivery_limit,
            ),
            (2, 1000, "reject-publish", 60_000, 5),
        )

    def test_on_demand_arguments_override(self) -> None:
        """Arguments given with an on-demand declaration override the defaults."""
        self.vhost.set_queue_defaults(self.ARGUMENTS)
        q = self.vhost.declare_queue("q", on_demand=True, arguments={"x-max-length": 7})
        self.assertEqual((q.policy.max_length, q.policy.max_bytes), (7, 1000))

    def test_declared_queue_keeps_its_arguments(self) -> None:
        """A queue declared (not on demand) gets none of the defaults."""
        self.vhost.set_queue_defaults(self.ARGUMENTS)
        plain = self.vhost.declare_queue("plain")
        self.assertIs(plain.policy, DEFAULT_POLICY)
        own = self.vhost.declare_queue("own", arguments={"x-max-length": 9})
        self.assertEqual(own.policy, QueuePolicy(max_length=9))

    def test_reject_publish(self) -> None:
        """
        With C{x-overflow = reject-publish}, a publish past the default
        length is refused and the queue keeps what it had.
        """
        self.vhost.set_queue_defaults(self.ARGUMENTS)
        q = self.vhost.declare_queue("q", on_demand=True)
        self.publish("q", b"1", b"2")
        e = self.assertRaises(ResourceLimit, self.publish, "q", b"3")
        self.assertIn("'q' is full", e.message)
        self.assertEqual([m.body for m in q.messages()], [b"1", b"2"])

    def test_max_bytes(self) -> None:
        """The default byte bound holds too."""
        self.vhost.set_queue_defaults({"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
        q = self.vhost.declare_queue("q", on_demand=True)
        self.publish("q", b"x" * 6)
        self.assertRaises(ResourceLimit, self.publish, "q", b"x" * 6)
        self.assertEqual(len(q), 1)

    def test_expires(self) -> None:
        """The default C{x-expires} deletes an unused, empty on-demand queue."""
        self.vhost.set_queue_defaults({"x-expires": 5000})
        self.vhost.declare_queue("q", on_demand=True)
        self.clock.advance(4.9)
        self.assertIn("q", self.vhost.queues)
        self.clock.advance(0.2)
        self.assertNotIn("q", self.vhost.queues)

    def test_existing_queues_keep_their_policy(self) -> None:
        q = self.vhost.declare_queue("q", on_demand=True)
        self.vhost.set_queue_defaults(self.ARGUMENTS)
        self.assertIs(self.vhost.declare_queue("q", on_demand=True).policy, DEFAULT_POLICY)
        self.assertIs(q.policy, DEFAULT_POLICY)


class RecordingStore(NullStore):
    """A store that records topology calls and recovers what it is given."""

    def __init__(self, recovery: Recovery | None = None) -> None:
        self.recovery = recovery or Recovery()
        self.calls: list[tuple] = []

    def recover(self) -> Recovery:
        self.calls.append(("recover",))
        return self.recovery

    def declare_queue(self, vhost, queue) -> None:
        self.calls.append(("declare_queue", vhost.name, queue.name))

    def declare_exchange(self, vhost, exchange) -> None:
        self.calls.append(("declare_exchange", vhost.name, exchange.name))

    def close(self) -> str:
        self.calls.append(("close",))
        return "closed"


class RecoverTests(SynchronousTestCase):
    """L{Broker.recover} after the declarations."""

    def test_declarations_reach_the_store(self) -> None:
        """Durable declarations reach the store; non-durable ones and amq.* do not."""
        store = RecordingStore()
        broker = Broker(Clock(), store=store)
        vhost = broker.default_vhost
        vhost.declare_exchange("events", "fanout")
        vhost.declare_queue("kept")
        vhost.declare_queue("lost", durable=False)
        self.assertEqual(
            store.calls,
            [("declare_exchange", "/", "events"), ("declare_queue", "/", "kept")],
        )
        self.assertIs(vhost.queues["kept"].store, store)
        self.assertIsNone(vhost.queues["lost"].store)

    def test_declared_first_wins(self) -> None:
        """
        A queue declared before recovery keeps its declared arguments; the
        store's messages go back into it; message ids continue.
        """
        kept = Message(7, "", "q", None, b"old", 1.0, True)
        store = RecordingStore(
            Recovery(
                next_message_id=100,
                queues=[("/", "q", {"x-max-length": 1})],
                messages={("/", "q"): [kept]},
            )
        )
        broker = Broker(Clock(), store=store)
        declared = broker.default_vhost.declare_queue("q", arguments={"x-max-length": 5})
        broker.recover()
        self.assertIs(broker.default_vhost.queues["q"], declared)
        self.assertEqual(declared.policy.max_length, 5)
        self.assertEqual([m.body for m in declared.messages()], [b"old"])
        self.assertEqual(broker.new_message("", "q", None, b"").id, 100)

    def test_recovered_queue_on_demand(self) -> None:
        """
        A kept queue nobody declared was made by a client: it gets its
        virtual host's on-demand defaults, its own arguments over them.
        """
        store = RecordingStore(Recovery(queues=[("/", "a", None), ("/", "b", {"x-max-length": 9})]))
        broker = Broker(Clock(), store=store)
        broker.default_vhost.set_queue_defaults({"x-max-length": 3, "x-max-length-bytes": 10})
        broker.recover()
        a, b = broker.default_vhost.queues["a"], broker.default_vhost.queues["b"]
        self.assertEqual((a.policy.max_length, a.policy.max_bytes), (3, 10))
        self.assertEqual((b.policy.max_length, b.policy.max_bytes), (9, 10))
        self.assertTrue(a.durable)

    def test_recovered_exchange_conflict(self) -> None:
        """A kept exchange of another type than declared is refused."""
        store = RecordingStore(Recovery(exchanges=[("/", "events", "topic", False)]))
        broker = Broker(Clock(), store=store)
        broker.default_vhost.declare_exchange("events", "fanout")
        self.assertRaises(PreconditionFailed, broker.recover)

    def test_recovered_topic_exchange_limits(self) -> None:
        """A recovered topic exchange gets the broker's topic limits."""
        store = RecordingStore(Recovery(exchanges=[("/", "t", "topic", False)]))
        broker = Broker(Clock(), store=store, limits=LimitSettings(max_topic_words=2))
        broker.recover()
        self.assertEqual(broker.default_vhost.exchange("t").max_words, 2)

    def test_close(self) -> None:
        """L{Broker.close} closes the store and returns what it returns."""
        store = RecordingStore()
        self.assertEqual(Broker(Clock(), store=store).close(), "closed")
        self.assertEqual(store.calls, [("close",)])


class Target:
    def __init__(self, log: list, name: str) -> None:
        self.log = log
        self.name = name

    def flush(self) -> None:
        self.log.append(self.name)


class WriteBatcherTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.batcher = WriteBatcher(self.clock)
        self.log: list[str] = []

    def test_outside_hold_flushes_next_turn(self) -> None:
        """Without a hold, a flush waits for callLater(0)."""
        self.batcher.want_flush(Target(self.log, "a"))
        self.batcher.want_flush(Target(self.log, "b"))
        self.assertEqual(self.log, [])
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [0])
        self.clock.advance(0)
        self.assertEqual(self.log, ["a", "b"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_hold_release(self) -> None:
        """While held nothing is scheduled; the outermost release flushes all."""
        self.batcher.hold()
        self.batcher.hold()
        self.batcher.want_flush(Target(self.log, "a"))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.batcher.release()
        self.assertEqual(self.log, [])
        self.batcher.want_flush(Target(self.log, "b"))
        self.batcher.release()
        self.assertEqual(self.log, ["a", "b"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(0)
        self.assertEqual(self.log, ["a", "b"])

    def test_flush_all_cancels_call(self) -> None:
        self.batcher.want_flush(Target(self.log, "a"))
        calls = list(self.clock.getDelayedCalls())
        self.batcher.flush_all()
        self.assertEqual(self.log, ["a"])
        self.assertFalse(calls[0].active())
        self.clock.advance(0)
        self.assertEqual(self.log, ["a"])

    def test_release_after_scheduled(self) -> None:
        """A flush scheduled before a hold happens at the release, once."""
        self.batcher.want_flush(Target(self.log, "a"))
        self.batcher.hold()
        self.batcher.want_flush(Target(self.log, "b"))
        self.batcher.release()
        self.assertEqual(self.log, ["a", "b"])
        self.clock.advance(0)
        self.assertEqual(self.log, ["a", "b"])

    def test_flush_during_flush(self) -> None:
        """Targets that ask during a flush are flushed in the same pass."""
        batcher = self.batcher
        log = self.log

        class Chain:
            def flush(self) -> None:
                log.append("chain")
                batcher.want_flush(Target(log, "late"))

        batcher.want_flush(Chain())
        self.clock.advance(0)
        self.assertEqual(log, ["chain", "late"])

    def test_broker_batcher_uses_clock(self) -> None:
        """The broker's batcher runs on the broker's clock."""
        broker = Broker(self.clock)
        broker.batcher.want_flush(Target(self.log, "x"))
        self.assertEqual(self.log, [])
        self.clock.advance(0)
        self.assertEqual(self.log, ["x"])
