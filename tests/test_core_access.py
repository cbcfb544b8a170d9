"""Tests for L{qmq.core.access}: resources, the one narrowing rule, and
L{authorize} with real L{qmq.auth.User}s."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.auth.permissions import Permission, User
from qmq.core.access import (
    EXCHANGE,
    QUEUE,
    Resource,
    allowed,
    authorize,
    authorize_monitoring,
    may_monitor,
    resource_named,
)
from qmq.core.errors import AccessRefused
from qmq.core.ownership import durable_queue_name

EVERYTHING = Permission.of(".*", ".*", ".*")


def token_user(**narrowing: str) -> User:
    """A token user with every permission in C{/}, narrowed by C{narrowing}."""
    return User("web-1", "token", {"/": EVERYTHING}, Permission.of(**narrowing))


class ResourceTests(SynchronousTestCase):
    def test_paths(self) -> None:
        """One canonical text per resource, whatever named it."""
        cases = [
            (Resource.queue("/", "orders"), "/queue/orders"),
            (Resource.exchange("/", "amq.topic", "chat.room1"), "/topic/chat.room1"),
            (Resource.exchange("/", "amq.fanout", "k"), "/exchange/amq.fanout/k"),
            (Resource.exchange("/", "amq.fanout", ""), "/exchange/amq.fanout/"),
            (Resource.exchange("/", "ev"), "/exchange/ev"),
            (Resource.exchange("/", "amq.topic"), "/exchange/amq.topic"),
            # The default exchange with a key is the queue it routes to.
            (Resource.exchange("/", "", "orders"), "/queue/orders"),
        ]
        for resource, path in cases:
            self.assertEqual(resource.path, path, resource)
        self.assertEqual(Resource.exchange("/", "", "orders"), Resource.queue("/", "orders"))

    def test_channel_names(self) -> None:
        """The channel's (name, destination text) pairs map to resources:
        an exchange only when written or read through its own destination."""
        cases = [
            ("write", "orders", "/queue/orders", Resource("v", QUEUE, "orders")),
            ("configure", "orders", "/queue/orders", Resource("v", QUEUE, "orders")),
            ("write", "amq.topic", "/topic/a.b", Resource("v", EXCHANGE, "amq.topic", "a.b")),
            ("read", "amq.topic", "/topic/a.#", Resource("v", EXCHANGE, "amq.topic", "a.#")),
            ("read", "amq.topic", "/exchange/amq.topic/a.b", Resource("v", EXCHANGE, "amq.topic", "a.b")),
            ("write", "ev", "/exchange/ev/", Resource("v", EXCHANGE, "ev", "")),
            # A durable subscription's queue, made for a topic destination.
            ("configure", "durable.bob.s", "/topic/a", Resource("v", QUEUE, "durable.bob.s")),
            ("configure", "amq.tmp.T.r", "/temp-queue/r", Resource("v", QUEUE, "amq.tmp.T.r")),
            ("read", "orders", "/control/count-msgs/queue/orders", Resource("v", QUEUE, "orders")),
            ("read", "amq.topic", "/control/count-subscribers/topic/a",
             Resource("v", EXCHANGE, "amq.topic", "a")),
            ("configure", "durable.bob.s", "durable.bob.s", Resource("v", QUEUE, "durable.bob.s")),
        ]
        for operation, name, text, resource in cases:
            self.assertEqual(resource_named("v", operation, name, text), resource, text)

    def test_bare_names(self) -> None:
        """A check naming an exchange by its bare name (no destination) is
        about the exchange itself, never a queue of that name's path."""
        exchanges, queues = {"amq.topic", "ev", "both"}, {"orders", "both"}
        cases = [
            ("write", "amq.topic", Resource("v", EXCHANGE, "amq.topic")),
            ("read", "ev", Resource("v", EXCHANGE, "ev")),
            ("write", "orders", Resource("v", QUEUE, "orders")),
            ("write", "both", Resource("v", QUEUE, "both")),
            ("configure", "ev", Resource("v", QUEUE, "ev")),
        ]
        for operation, name, resource in cases:
            self.assertEqual(resource_named("v", operation, name, name, exchanges, queues), resource, name)
        self.assertEqual(resource_named("v", "write", "amq.topic", "amq.topic").path, "/queue/amq.topic")


class AuthorizeTests(SynchronousTestCase):
    def test_no_user_allows(self) -> None:
        authorize(None, "configure", Resource.queue("/", "x"))
        self.assertTrue(allowed(None, "read", Resource.queue("/", "x")))

    def test_permissions_on_the_name(self) -> None:
        bob = User("bob", permissions={"/": Permission.of("", "^orders$", "")})
        authorize(bob, "write", Resource.queue("/", "orders"))
        with self.assertRaises(AccessRefused) as e:
            authorize(bob, "write", Resource.queue("/", "jobs"), named="/queue/jobs")
        self.assertEqual(e.exception.short, "access refused (write)")
        for part in ("'bob'", "write", "/queue/jobs", "queue 'jobs'"):
            self.assertIn(part, e.exception.message)
        self.assertFalse(allowed(bob, "write", Resource.queue("other", "orders")))

    def test_one_narrowing_rule(self) -> None:
        """A token's narrowing is matched against the resource's path, so
        the same resource named two ways gets one verdict; a bare name
        (as the HTTP API had it) matches nothing the narrowing allows."""
        user = token_user(configure=r"^/queue/web\.", read=r"^/topic/chat\.", write=r"^/queue/web\.")
        self.assertTrue(allowed(user, "configure", Resource.queue("/", "web.1")))
        self.assertFalse(allowed(user, "configure", Resource.queue("/", "other")))
        via_topic = resource_named("/", "read", "amq.topic", "/topic/chat.a")
        via_exchange = resource_named("/", "read", "amq.topic", "/exchange/amq.topic/chat.a")
        self.assertEqual(via_topic, via_exchange)
        self.assertTrue(allowed(user, "read", via_exchange))
        # Bound with a key outside the narrowing, or named without one: no.
        self.assertFalse(allowed(user, "read", Resource.exchange("/", "amq.topic", "#")))
        self.assertFalse(allowed(user, "read", Resource.exchange("/", "amq.topic")))
        bare = token_user(configure=r"^web\.")
        self.assertFalse(allowed(bare, "configure", Resource.queue("/", "web.1")))
        with self.assertRaises(AccessRefused) as e:
            authorize(user, "read", via_exchange.__class__("/", EXCHANGE, "amq.topic", "news"),
                      named="/exchange/amq.topic/news")
        self.assertIn("matched against '/topic/news'", e.exception.message)

    def test_ownership(self) -> None:
        """Given an owner, another owner's durable subscription is refused
        whatever the permissions (also without a user)."""
        feed = Resource.queue("/", durable_queue_name("alice", "feed"))
        admin = User("bob", permissions={"/": EVERYTHING})
        for user in (None, admin):
            with self.assertRaises(AccessRefused):
                authorize(user, "write", feed, owner="bob")
            authorize(user, "write", feed, owner="alice")
            authorize(user, "write", feed)  # not asked without an owner


class MonitoringTests(SynchronousTestCase):
    """Who may read the metrics and the health checks' details: admins and
    monitors by account, with or without any virtual host."""

    def test_rule(self) -> None:
        admins, monitors = ["root"], ["prom"]
        self.assertTrue(may_monitor(None, admins, monitors))  # authentication off
        self.assertTrue(may_monitor(User("root", permissions={"/": EVERYTHING}), admins, monitors))
        self.assertTrue(may_monitor(User("prom"), admins, monitors))  # no virtual host at all
        self.assertFalse(may_monitor(User("joe", permissions={"/": EVERYTHING}), admins, monitors))
        # A token's subject is not the account of that name...
        self.assertFalse(may_monitor(User("prom", "token", {"/": EVERYTHING}), admins, monitors))
        self.assertFalse(may_monitor(User("root", "token", {"/": EVERYTHING}), admins, monitors))
        # ...unless its virtual host's speak_for maps it.
        self.assertTrue(may_monitor(User("p", "token", speaks_for="prom"), admins, monitors))

    def test_refusal_names_the_settings(self) -> None:
        with self.assertRaises(AccessRefused) as caught:
            authorize_monitoring(User("joe"), ["root"], ["prom"])
        self.assertIn("'joe'", caught.exception.message)
        self.assertIn("http_api.monitors", caught.exception.message)
        authorize_monitoring(User("prom"), ["root"], ["prom"])
