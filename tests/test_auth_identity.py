"""Identity is (how one logged in, name): a token's subject is not the
configured user of the same name (issue 21).

Unit tests of L{qmq.auth.User}'s identity and the realm's C{speak_for}
mapping, of L{qmq.core.ownership.Owner}, and the rule over the HTTP API
(admins, durable subscriptions). The same rule over STOMP and WebSocket,
with real clients, is in tests.integration.test_stomppy_auth and
tests.integration.test_websocket_auth.
"""

from __future__ import annotations

import time

import jwt
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from qmq.auth import (
    Authenticator,
    AuthSettings,
    PermissionSettings,
    TokenSettings,
    User,
    UserSettings,
    hash_password,
)
from qmq.auth.checkers import TokenCredentials
from qmq.core.errors import AccessRefused
from qmq.core.ownership import Owner, check_queue_access, durable_queue_name, owner_key
from tests.test_web_api import AuthSetup, Q

SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000.0


def run_now(f, *args):
    return defer.maybeDeferred(f, *args)


class OwnerTests(unittest.SynchronousTestCase):
    def test_no_user_name_is_a_token_owner(self) -> None:
        """A token's owner part holds a bare ':' that no escaped user name
        holds, so no user name, however chosen, names its queues."""
        token_alice = Owner("alice", "token")
        self.assertEqual(durable_queue_name(token_alice, "feed"), "durable.token:alice.feed")
        self.assertEqual(durable_queue_name("alice", "feed"), "durable.alice.feed")
        for name in ("alice", "token:alice", "token%3Aalice", "token", ":alice", "token:alice.feed"):
            self.assertNotEqual(owner_key(name), owner_key(token_alice), name)
            self.assertNotEqual(durable_queue_name(name, "feed"), durable_queue_name(token_alice, "feed"))
        self.assertNotEqual(owner_key(Owner("a.b", "token")), owner_key(Owner("a", "token")))
        self.assertRaises(ValueError, Owner, "alice", "to:ken")
        self.assertRaises(ValueError, Owner, "alice", "")

    def test_access(self) -> None:
        mine = durable_queue_name(Owner("alice", "token"), "feed")
        theirs = durable_queue_name("alice", "feed")
        check_queue_access(Owner("alice", "token"), mine, "read")
        check_queue_access("alice", theirs, "read")
        for owner, queue in ((Owner("alice", "token"), theirs), ("alice", mine), ("token:alice", mine)):
            with self.assertRaises(AccessRefused):
                check_queue_access(owner, queue, "read")


class UserIdentityTests(unittest.SynchronousTestCase):
    def test_configured_kinds_are_their_user(self) -> None:
        for kind in ("password", "certificate", "anonymous"):
            user = User("alice", kind)
            self.assertEqual((user.kind, user.identity, user.account, user.owner),
                             (kind, (kind, "alice"), "alice", "alice"))
            self.assertTrue(user.is_admin(["alice"]))
            self.assertFalse(user.is_admin(["bob"]))

    def test_a_token_is_its_own_identity(self) -> None:
        user = User("alice", "token")
        self.assertEqual((user.identity, user.account, user.owner),
                         (("token", "alice"), None, Owner("alice", "token")))
        self.assertFalse(user.is_admin(["alice"]))
        mapped = User("alice", "token", speaks_for="alice")
        self.assertEqual((mapped.identity, mapped.account, mapped.owner), (("token", "alice"), "alice", "alice"))
        self.assertTrue(mapped.is_admin(["alice"]))


class SpeakForTests(unittest.TestCase):
    """The realm maps a token's subject to a configured user only when the
    virtual host's C{[tokens] speak_for} names it."""

    def setUp(self) -> None:
        self.clock = task.Clock()
        self.clock.advance(NOW)
        self.auth = Authenticator(
            AuthSettings(),
            self.clock,
            users=[UserSettings("alice", hash_password("x", 4)), UserSettings("admin", hash_password("y", 4))],
            permissions={"app": [PermissionSettings("alice", "^alice\\.", "^alice\\.", "^alice\\."),
                                 PermissionSettings("admin", ".*", ".*", ".*")]},
            tokens={"app": TokenSettings("HS256", SECRET, read="^amq\\.topic$", speak_for=("alice",))},
            run=run_now,
        )

    def login(self, sub: str, **claims) -> User:
        t = jwt.encode({"sub": sub, "exp": NOW + 60, **claims}, SECRET, algorithm="HS256")
        return self.successResultOf(self.auth.authenticate("app", TokenCredentials(t, "app")))

    def test_unmapped_subject(self) -> None:
        """sub=admin is not the admin user: the token permissions, its own
        owner, no admin rights."""
        user = self.login("admin")
        self.assertEqual((user.kind, user.name, user.account), ("token", "admin", None))
        self.assertFalse(user.is_admin(["admin"]))
        self.assertTrue(user.can("read", "app", "amq.topic"))
        self.assertFalse(user.can("read", "app", "orders"))
        self.assertEqual(user.owner, Owner("admin", "token"))

    def test_mapped_subject(self) -> None:
        """sub=alice, named in speak_for, is the user alice in this virtual
        host: her permissions (narrowed by the token), her durable
        subscriptions."""
        user = self.login("alice")
        self.assertEqual((user.kind, user.account, user.owner), ("token", "alice", "alice"))
        self.assertTrue(user.can("write", "app", "alice.inbox"))
        self.assertFalse(user.can("read", "app", "amq.topic"))
        self.assertTrue(user.is_admin(["alice"]))
        narrowed = self.login("alice", destinations={"read": "^/queue/alice\\.in$"})
        self.assertTrue(narrowed.can("read", "app", "alice.in", "/queue/alice.in"))
        self.assertFalse(narrowed.can("read", "app", "alice.out", "/queue/alice.out"))
        # alice's permissions change: the mapped token follows them (an
        # unmapped one keeps the token permissions it carries).
        self.auth.set_permission("app", "alice", "", "", "^alice\\.in$")
        fresh = self.auth.refreshed(narrowed)
        self.assertEqual((fresh.identity, fresh.account, fresh.expires), (narrowed.identity, "alice", NOW + 60))
        self.assertFalse(fresh.can("write", "app", "alice.in", "/queue/alice.in"))
        self.assertTrue(fresh.can("read", "app", "alice.in", "/queue/alice.in"))
        self.assertFalse(fresh.can("read", "app", "alice.inbox", "/queue/alice.inbox"))
        self.assertIsNone(self.auth.refreshed(self.login("bob")))


class SpeakForConfigTests(unittest.SynchronousTestCase):
    def test_loaded_and_checked(self) -> None:
        import json  # noqa: PLC0415

        from qmq import config  # noqa: PLC0415

        key = self.mktemp()
        with open(key, "wb") as f:
            f.write(SECRET)
        table = f'[vhosts.app.tokens]\nalgorithm = "HS256"\nkey_file = {json.dumps(key)}\n'
        settings = config.load_string(table + 'speak_for = ["alice", "bob"]\n', "qmq.toml")
        [app] = [v for v in settings.vhosts if v.name == "app"]
        self.assertEqual(app.tokens.speak_for, ("alice", "bob"))
        with self.assertRaises(config.ConfigError) as caught:
            config.load_string(table + 'speak_for = "alice"\n', "qmq.toml")
        self.assertIn("speak_for", str(caught.exception))


def token(sub: str, secret: bytes = AuthSetup.SECRET) -> dict:
    t = jwt.encode({"sub": sub, "exp": time.time() + 600}, secret, algorithm="HS256")
    return {"Authorization": f"Bearer {t}"}


class HttpIdentityTests(AuthSetup):
    """Over HTTP: the admin check and durable subscriptions go by identity."""

    @defer.inlineCallbacks
    def test_token_subject_is_not_the_admin(self) -> None:
        """A token with sub=alice (alice is in http_api.admins) may not list
        or create users, nor list connections; the password user alice may."""
        for path in ("/api/v1/users", "/api/v1/connections", "/api/v1/permissions"):
            code, _, _, doc = yield self.call("GET", path, headers=token("alice"))
            self.assertEqual((code, doc["code"]), (403, "access-refused"), path)
            code, _, _, _ = yield self.call("GET", path, headers=self.basic("alice"))
            self.assertEqual(code, 200, path)
        code, _, _, doc = yield self.call("PUT", "/api/v1/users/mallory", {"password": "x"}, headers=token("alice"))
        self.assertEqual((code, doc["code"]), (403, "access-refused"))
        code, _, _, doc = yield self.call("PUT", "/api/v1/permissions/%2F/alice", {"configure": ".*"},
                                          headers=token("alice"))
        self.assertEqual(code, 403)
        self.assertNotIn("mallory", self.broker.auth.users)

    @defer.inlineCallbacks
    def test_speak_for_makes_the_token_the_admin(self) -> None:
        """Mapped explicitly ([tokens] speak_for), the token is alice."""
        auth = self.broker.auth
        settings = TokenSettings("HS256", self.SECRET, read=".*", write=".*", speak_for=("alice",))
        self.broker.auth = Authenticator(
            auth.settings, reactor, users=list(auth.users.values()),
            permissions={"/": [PermissionSettings("alice", ".*", ".*", ".*")]},
            tokens={"/": settings}, run=run_now,
        )
        code, _, _, _ = yield self.call("GET", "/api/v1/users", headers=token("alice"))
        self.assertEqual(code, 200)
        code, _, _, _ = yield self.call("GET", "/api/v1/users", headers=token("bob"))
        self.assertEqual(code, 403)

    @defer.inlineCallbacks
    def test_token_subject_cannot_read_the_users_durable_subscription(self) -> None:
        vhost = self.broker.default_vhost
        theirs = durable_queue_name("alice", "feed")
        vhost.declare_queue(theirs, durable=True, on_demand=True, subscription=True)
        code, _, _, _ = yield self.call("POST", f"{Q}/{theirs}/messages", {"body": "hers"}, headers=self.basic("alice"))
        self.assertEqual(code, 201)
        code, _, _, doc = yield self.call("POST", f"{Q}/{theirs}/receive", headers=token("alice"))
        self.assertEqual((code, doc["code"]), (403, "access-refused"))
        code, _, _, doc = yield self.call("GET", Q, headers=token("alice"))
        self.assertNotIn(theirs, [q["name"] for q in doc["queues"]])
        code, _, _, doc = yield self.call("POST", f"{Q}/{theirs}/receive", headers=self.basic("alice"))
        self.assertEqual((code, [m["body"] for m in doc["messages"]]), (200, ["hers"]))
