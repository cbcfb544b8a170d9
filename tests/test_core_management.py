"""Tests for L{qmq.core.management}: every topology operation with its
access check, and arguments that make the broker write somewhere (dead
letters) needing the declarer's write permission on their target.

A real L{Broker} on a L{Clock}, real L{qmq.auth.User}s; no sockets.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.auth.permissions import Permission, User
from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.core.errors import AccessRefused, NotFound, PreconditionFailed
from qmq.core.management import Management, authorize_arguments, writing_targets
from qmq.core.ownership import durable_queue_name
from qmq.stomp.destinations import DestinationChannel as Channel

#: Bob may configure, write and read his own queues (bob.*) and read and
#: write amq.topic; nothing else.
BOB = User("bob", permissions={"/": Permission.of(r"^bob\.", r"^(bob\.|amq\.topic$)", r"^(bob\.|amq\.topic$)")})
ALL = Permission.of(".*", ".*", ".*")

#: Dead-letter arguments aimed at queue C{target} through the default exchange.
def dead_letters_to(target: str) -> dict:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target, "x-message-ttl": 1}


class Sink(Consumer):
    def __init__(self) -> None:
        super().__init__(False, 100)
        self.got: list = []

    def deliver(self, message, queue) -> None:
        self.got.append(message)


class ManagementTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.vhost.declare_queue("alice.inbox")
        self.feed = durable_queue_name("alice", "feed")
        self.vhost.declare_queue(self.feed, subscription=True)
        self.addCleanup(self.broker.stop_timers)

    def bob(self, user: User | None = BOB) -> Management:
        return Management(self.vhost, user, "bob")


class OperationTests(ManagementTestCase):
    def test_queue_operations(self) -> None:
        m = self.bob()
        q, made = m.declare_queue("bob.q", arguments={"x-max-length": 5})
        self.assertTrue(made)
        self.assertEqual(m.declare_queue("bob.q")[1], False)
        self.assertIs(m.queue("bob.q"), q)
        self.assertEqual(m.purge_queue("bob.q"), 0)
        m.bind("bob.q", "amq.topic", "a.b")
        m.unbind("bob.q", "amq.topic", "a.b")
        self.assertEqual(m.delete_queue("bob.q"), 0)
        self.assertNotIn("bob.q", self.vhost.queues)

    def test_refusals(self) -> None:
        """Each operation asks its permission: RabbitMQ's configure for
        declare and delete, read for purge, describe and scan, write on
        the queue and read on the exchange for a binding."""
        m = self.bob()
        refused = [
            lambda: m.declare_queue("alice.new"),
            lambda: m.delete_queue("alice.inbox"),
            lambda: m.purge_queue("alice.inbox"),
            lambda: m.queue("alice.inbox"),
            lambda: m.scan("alice.inbox", 0, 1),
            lambda: m.bind("alice.inbox", "amq.topic", "k"),
            lambda: m.declare_exchange("ex", "fanout"),
            lambda: m.delete_exchange("amq.fanout"),
            lambda: m.exchange("amq.fanout"),
            lambda: m.declare_queue("amq.mine"),
            lambda: m.declare_exchange("amq.mine", "topic"),
        ]
        for call in refused:
            self.assertRaises(AccessRefused, call)
        self.assertNotIn("alice.new", self.vhost.queues)
        self.assertRaises(NotFound, m.delete_queue, "nowhere")
        m.declare_queue("bob.q")
        self.assertRaises(AccessRefused, m.bind, "bob.q", "amq.fanout", "")

    def test_binding_key_is_part_of_the_exchange_resource(self) -> None:
        """A token narrowed to some topics binds only with keys inside it."""
        user = User("web", "token", {"/": ALL}, Permission.of(configure=".*", write=".*", read=r"^/topic/chat\."))
        m = Management(self.vhost, user, "web")
        m.declare_queue("web.q")
        m.bind("web.q", "amq.topic", "chat.room1")
        self.assertRaises(AccessRefused, m.bind, "web.q", "amq.topic", "#")

    def test_durable_subscriptions_are_their_owners(self) -> None:
        """Whatever the permissions, with authentication on or off."""
        for user in (None, User("bob", permissions={"/": ALL})):
            m = self.bob(user)
            for call in (m.declare_queue, m.delete_queue, m.purge_queue, m.queue, m.may_read_queue):
                if call == m.may_read_queue:
                    self.assertFalse(call(self.feed))
                else:
                    self.assertRaises(AccessRefused, call, self.feed)
            self.assertRaises(AccessRefused, m.bind, self.feed, "amq.topic", "k")
            self.assertTrue(m.may_read_queue(self.feed, see_all=True))
        alice = Management(self.vhost, None, "alice")
        self.assertEqual(alice.purge_queue(self.feed), 0)

    def test_inequivalent_arguments(self) -> None:
        """Arguments given again for a queue that exists must be its own
        (as for a STOMP SUBSCRIBE); none at all is a plain redeclare."""
        m = self.bob()
        m.declare_queue("bob.q", arguments={"x-max-length": 5})
        self.assertEqual(m.declare_queue("bob.q", arguments={"max-length": "5"})[1], False)
        self.assertEqual(m.declare_queue("bob.q")[1], False)
        with self.assertRaises(PreconditionFailed) as e:
            m.declare_queue("bob.q", arguments={"x-max-length": 6})
        self.assertEqual(e.exception.short, "inequivalent queue arguments")
        self.assertEqual(self.vhost.queues["bob.q"].policy.max_length, 5)

    def test_allow_create(self) -> None:
        """A virtual host that does not let clients create queues refuses a
        declare of a new one as it refuses a STOMP SEND or SUBSCRIBE."""
        self.vhost.allow_create = False
        m = self.bob(None)
        with self.assertRaises(NotFound) as e:
            m.declare_queue("bob.new")
        self.assertIn("allow_create", e.exception.message)
        self.assertNotIn("bob.new", self.vhost.queues)
        self.assertEqual(m.declare_queue("alice.inbox")[1], False)

    def test_reserved_names(self) -> None:
        """amq. and new durable. names are the broker's (a durable SUBSCRIBE
        makes its queue); the owner may declare an existing one again."""
        m = Management(self.vhost, None, "alice")
        for name in ("amq.x", durable_queue_name("alice", "new")):
            self.assertRaises(AccessRefused, m.declare_queue, name)
            self.assertNotIn(name, self.vhost.queues)
        self.assertEqual(m.declare_queue(self.feed)[1], False)

    def test_exclusive_queue_not_deleted(self) -> None:
        self.vhost.declare_queue("bob.mine", exclusive_owner=object())
        self.assertRaises(AccessRefused, self.bob().delete_queue, "bob.mine")


class DeadLetterTests(ManagementTestCase):
    """The break: a queue of one's own whose dead letters land where one
    may not write (another user's queue, another owner's durable
    subscription)."""

    def test_targets(self) -> None:
        self.assertEqual(writing_targets("/", None), [])
        self.assertEqual(writing_targets("/", {"x-message-ttl": 5}), [])
        [(argument, target)] = writing_targets("/", {"dead-letter-exchange": "", "dead-letter-routing-key": "q"})
        self.assertEqual((argument, target.path), ("x-dead-letter-exchange", "/queue/q"))
        [(_, target)] = writing_targets("/", {"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "k"})
        self.assertEqual(target.path, "/topic/k")
        [(_, target)] = writing_targets("/", {"x-dead-letter-exchange": "dlx"})
        self.assertEqual(target.path, "/exchange/dlx")
        with self.assertRaises(PreconditionFailed) as e:
            writing_targets("/", {"x-dead-letter-exchange": ""})
        self.assertIn("x-dead-letter-routing-key", e.exception.message)
        self.assertRaises(PreconditionFailed, writing_targets, "/", {"x-dead-letter-exchange": 5})

    def test_declare_refused_and_nothing_lands(self) -> None:
        m = self.bob()
        for target in ("alice.inbox", self.feed):
            with self.assertRaises(AccessRefused) as e:
                m.declare_queue("bob.trap", arguments=dead_letters_to(target))
            self.assertIn("x-dead-letter-exchange", e.exception.message)
            self.assertEqual(e.exception.short, "access refused (write)")
            self.assertNotIn("bob.trap", self.vhost.queues)
        # Exchanges: write on the exchange (with the key), as publishing.
        self.assertRaises(AccessRefused, m.declare_queue, "bob.t2",
                          arguments={"x-dead-letter-exchange": "amq.fanout"})
        m.declare_queue("bob.t3", arguments={"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "k"})
        m.declare_queue("bob.t4", arguments=dead_letters_to("bob.dead"))
        self.assertEqual((len(self.vhost.queues["alice.inbox"]), len(self.vhost.queues[self.feed])), (0, 0))

    def test_over_the_defaults(self) -> None:
        """A routing key given over the virtual host's default dead-letter
        exchange aims it: checked as if both were given. What the defaults
        alone aim at is the operator's, not the declarer's."""
        self.vhost.set_queue_defaults({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "bob.dead"})
        m = self.bob()
        with self.assertRaises(AccessRefused):
            m.declare_queue("bob.trap", arguments={"x-dead-letter-routing-key": "alice.inbox", "x-message-ttl": 1})
        self.assertNotIn("bob.trap", self.vhost.queues)
        channel = Channel(self.broker, self.vhost, "bob", user=BOB)
        with self.assertRaises(AccessRefused):
            channel.subscribe(Sink(), "/queue/bob.trap", arguments={"dead-letter-routing-key": self.feed})
        self.vhost.set_queue_defaults({"x-dead-letter-exchange": ""})
        m.declare_queue("bob.capped", arguments={"x-max-length": 5})

    def test_ownership_without_authentication(self) -> None:
        """With authentication off every permission is granted, but another
        owner's durable subscription is still not a dead-letter target."""
        self.assertRaises(AccessRefused, authorize_arguments, None, "bob", "/", dead_letters_to(self.feed))
        authorize_arguments(None, "alice", "/", dead_letters_to(self.feed))
        authorize_arguments(None, "bob", "/", dead_letters_to("alice.inbox"))

    def test_stomp_subscribe_declares_through_the_same_check(self) -> None:
        """A channel declaring a queue with arguments (a STOMP SUBSCRIBE's
        headers) asks the same rule, for /queue/ and durable subscriptions."""
        channel = Channel(self.broker, self.vhost, "bob", user=BOB)
        for target in ("alice.inbox", self.feed):
            with self.assertRaises(AccessRefused):
                channel.subscribe(Sink(), "/queue/bob.trap", arguments=dead_letters_to(target))
            with self.assertRaises(AccessRefused):
                channel.subscribe(Sink(), "/topic/x", durable_name="d", arguments=dead_letters_to(target))
        self.assertNotIn("bob.trap", self.vhost.queues)
        self.assertNotIn(durable_queue_name("bob", "d"), self.vhost.queues)
        channel.subscribe(Sink(), "/queue/bob.ok", arguments=dead_letters_to("bob.dead"))
        anonymous = Channel(self.broker, self.vhost, "bob")
        with self.assertRaises(AccessRefused):
            anonymous.subscribe(Sink(), "/queue/bob.trap", arguments=dead_letters_to(self.feed))
