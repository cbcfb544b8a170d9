"""Tests for internal and alternate exchanges in the core.

An internal exchange (L{qmq.core.exchange.Exchange.internal}) refuses every
client's publish in L{qmq.core.channel.Channel} while bindings from other
exchanges still route into it; an exchange with an C{alternate-exchange}
argument hands what it cannot route to that exchange
(L{qmq.core.vhost.VirtualHost.expand}), and declaring one needs the
declarer's write permission there (L{qmq.core.management.writing_targets},
the place dead-letter targets are checked). Both survive a restart through
the commit log. A real L{Broker} on a L{Clock}; no sockets.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.auth.permissions import Permission, User
from qmq.core.broker import Broker
from qmq.core.channel import Channel
from qmq.core.errors import AccessRefused, PreconditionFailed
from qmq.core.exchange import alternate_of
from qmq.core.management import Management, writing_targets
from qmq.core.names import InvalidName
from tests.test_store_log import StoreTestCase

#: Bob configures anything of his (bob.*), writes to his own exchanges only.
BOB = User("bob", permissions={"/": Permission.of(r"^bob\.", r"^bob\.", r"^bob\.")})


class CoreTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.addCleanup(self.broker.stop_timers)
        self.channel = Channel(self.broker, self.vhost)

    def publish(self, exchange: str, key: str, mandatory: bool = False) -> int:
        message = self.channel.make_message(exchange, key, None, b"x")
        return self.channel.publish(exchange, key, message, mandatory).routed


class InternalTests(CoreTestCase):
    def test_publish_refused_everywhere_in_the_channel(self) -> None:
        """Channel.publish and Channel.target (every frontend's two ways in)
        refuse it with RabbitMQ's words; nothing is routed."""
        self.vhost.declare_exchange("in", "fanout", internal=True)
        self.vhost.declare_queue("q")
        self.vhost.bind("q", "in")
        e = self.assertRaises(AccessRefused, self.publish, "in", "k")
        self.assertEqual(e.message, "cannot publish to internal exchange 'in' in vhost '/'")
        self.assertTrue(e.short.startswith("access refused ("))
        self.assertRaises(AccessRefused, self.channel.target, "in", "k")
        self.assertEqual(len(self.vhost.queues["q"]), 0)

    def test_bindings_still_route_into_it(self) -> None:
        self.vhost.declare_exchange("in", "fanout", internal=True)
        self.vhost.declare_exchange("front", "direct")
        self.vhost.declare_queue("q")
        self.vhost.bind("q", "in")
        self.vhost.bind_exchange("in", "front", "k")
        self.assertEqual(self.publish("front", "k"), 1)
        target = self.channel.target("front", "k")
        self.channel.publish_target(target, self.channel.new_message(target, None, b"y"))
        self.assertEqual(len(self.vhost.queues["q"]), 2)

    def test_redeclare_must_agree(self) -> None:
        """406 when internal differs (RabbitMQ's inequivalent arg)."""
        self.vhost.declare_exchange("in", "topic", internal=True)
        e = self.assertRaises(PreconditionFailed, self.vhost.declare_exchange, "in", "topic")
        self.assertEqual(
            e.message, "inequivalent arg 'internal' for exchange 'in' in vhost '/': received 'false' but current is 'true'"
        )
        self.vhost.declare_exchange("out", "topic")
        self.assertRaises(PreconditionFailed, self.vhost.declare_exchange, "out", "topic", internal=True)
        self.assertIs(self.vhost.declare_exchange("in", "topic", internal=True), self.vhost.exchanges["in"])


class AlternateTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.vhost.declare_exchange("ae", "fanout", internal=True)
        self.vhost.declare_queue("unrouted")
        self.vhost.bind("unrouted", "ae")
        self.vhost.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
        self.vhost.declare_queue("orders")
        self.vhost.bind("orders", "main", "order")

    def test_unroutable_goes_to_the_alternate_and_counts_as_routed(self) -> None:
        self.assertEqual(self.publish("main", "order", mandatory=True), 1)
        self.assertEqual(self.publish("main", "other", mandatory=True), 1)
        self.assertEqual((len(self.vhost.queues["orders"]), len(self.vhost.queues["unrouted"])), (1, 1))
        self.assertEqual(self.vhost.unroutable, 0)

    def test_resolved_target_and_vhost_route_too(self) -> None:
        target = self.channel.target("main", "nowhere")
        self.channel.publish_target(target, self.channel.new_message(target, None, b"y"))
        self.assertEqual(self.vhost.route("main", "nowhere"), [self.vhost.queues["unrouted"]])
        self.assertEqual(len(self.vhost.queues["unrouted"]), 1)

    def test_alternate_that_routes_nowhere_is_unroutable(self) -> None:
        self.vhost.unbind("unrouted", "ae")
        self.assertEqual(self.publish("main", "other", mandatory=True), 0)

    def test_missing_alternate_is_ignored(self) -> None:
        """As in RabbitMQ: an alternate named but not declared routes nothing."""
        self.vhost.declare_exchange("lone", "direct", arguments={"alternate-exchange": "not-there"})
        self.assertEqual(self.publish("lone", "k", mandatory=True), 0)

    def test_alternates_of_exchanges_reached_by_bindings(self) -> None:
        """Each exchange passed through that routes to nothing uses its own
        alternate, as RabbitMQ's route walk does."""
        self.vhost.declare_exchange("front", "fanout")
        self.vhost.bind_exchange("main", "front")
        self.assertEqual(self.publish("front", "other"), 1)
        self.assertEqual(len(self.vhost.queues["unrouted"]), 1)

    def test_cycle_of_alternates_terminates(self) -> None:
        self.vhost.declare_exchange("a", "direct", arguments={"alternate-exchange": "b"})
        self.vhost.declare_exchange("b", "direct", arguments={"alternate-exchange": "a"})
        self.assertEqual(self.publish("a", "k", mandatory=True), 0)
        self.vhost.declare_queue("qb")
        self.vhost.bind("qb", "b", "k")
        self.assertEqual(self.publish("a", "k", mandatory=True), 1)
        self.assertEqual(len(self.vhost.queues["qb"]), 1)

    def test_long_chain_is_bounded(self) -> None:
        """A chain longer than max_exchange_hops stops there."""
        n = self.vhost.max_exchange_hops + 5
        for i in range(n):
            self.vhost.declare_exchange(f"c{i}", "direct", arguments={"alternate-exchange": f"c{i + 1}"})
        self.vhost.declare_exchange(f"c{n}", "fanout")
        self.vhost.declare_queue("end")
        self.vhost.bind("end", f"c{n}")
        self.assertEqual(self.publish("c0", "k", mandatory=True), 0)
        self.assertEqual(self.publish(f"c{n - 3}", "k", mandatory=True), 1)

    def test_redeclare_must_agree(self) -> None:
        self.assertRaises(PreconditionFailed, self.vhost.declare_exchange, "main", "direct")
        self.assertRaises(
            PreconditionFailed, self.vhost.declare_exchange, "main", "direct", arguments={"alternate-exchange": "x"}
        )
        self.vhost.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae", "other": 1})

    def test_bad_values(self) -> None:
        for bad in (1, "", True, ["ae"]):
            self.assertRaises(PreconditionFailed, alternate_of, {"alternate-exchange": bad})
        self.assertRaises(InvalidName, alternate_of, {"alternate-exchange": "a\x00b"})
        self.assertIsNone(alternate_of({"x-other": "ae"}))


class PermissionTests(CoreTestCase):
    def test_same_check_as_dead_letter_targets(self) -> None:
        self.assertEqual(
            [(a, r.name) for a, r in writing_targets("/", {"alternate-exchange": "ae"}, of="exchange")],
            [("alternate-exchange", "ae")],
        )
        # A queue argument of that name means nothing.
        self.assertEqual(writing_targets("/", {"alternate-exchange": "ae"}), [])

    def test_declare_needs_write_on_the_alternate(self) -> None:
        bob = Management(self.vhost, BOB, "bob")
        e = self.assertRaises(
            AccessRefused, bob.declare_exchange, "bob.x", "direct", arguments={"alternate-exchange": "amq.fanout"}
        )
        self.assertIn("alternate-exchange would make the broker write to", e.message)
        self.assertNotIn("bob.x", self.vhost.exchanges)
        ex, made = bob.declare_exchange("bob.y", "direct", arguments={"alternate-exchange": "bob.ae"})
        self.assertTrue(made)
        self.assertEqual(ex.alternate, "bob.ae")


class RestartTests(StoreTestCase):
    """The commit log keeps both (optional keys of the declare-exchange
    record), and compaction carries them forward."""

    segment_size = 8192

    def declare(self) -> None:
        v = self.vhost
        v.declare_exchange("in", "fanout", internal=True)
        v.declare_exchange("main", "direct", arguments={"alternate-exchange": "in", "x-kept": "yes"})
        v.declare_exchange("plain", "topic")

    def check(self) -> None:
        v = self.vhost
        self.assertTrue(v.exchanges["in"].internal)
        self.assertEqual(v.exchanges["main"].alternate, "in")
        self.assertEqual(v.exchanges["main"].arguments, {"alternate-exchange": "in", "x-kept": "yes"})
        self.assertFalse(v.exchanges["plain"].internal)
        self.assertIsNone(v.exchanges["plain"].arguments)

    def test_kept_across_a_restart(self) -> None:
        self.declare()
        self.restart()
        self.check()
        # Declared again as they are: nothing new is written.
        self.declare()
        self.restart()
        self.check()

    def test_kept_by_compaction(self) -> None:
        self.declare()
        self.vhost.declare_queue("fast")
        for _ in range(200):
            m = self.send("fast", b"f" * 300)
            self.turn()
            self.store.settle(self.vhost.queue("fast"), m, "ack")
            self.turn()
        first = self.segments()[0]
        self.store.compact()
        self.turn()
        self.store.compact()
        self.turn()
        self.assertNotIn(first, self.segments())
        self.restart()
        self.check()
