"""Authentication and authorization as a STOMP client sees them, in memory.

Sessions are driven through L{StompProtocol} on in-memory transports and a
L{Clock} (see L{tests.test_stomp_session}); the broker's authenticator is
built from TOML the way the service builds it, with password checks run
synchronously.  Every authentication path and every permission has a
negative test here; tests.integration.test_stomppy_auth does the same with
real clients.
"""

from __future__ import annotations

import jwt
from twisted.internet import defer

from qmq import config
from qmq.auth import Authenticator
from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.tls import PeerIdentity
from tests import auth_toml
from tests.test_stomp_session import Client, SessionTestCase

SECRET = "0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000.0


def run_now(f, *args):
    return defer.maybeDeferred(f, *args)


def make_toml(key_file: str, extra: str = "", auth: str = "") -> str:
    return "\n".join(
        [
            f"[auth]\nfailure_delay = 1.0\nfailure_max_delay = 8.0\n{auth}\n",
            auth_toml.ALICE,
            auth_toml.users(bob="builder", carol="carol", dave="dave"),
            auth_toml.ALICE_APP,
            auth_toml.permissions("app", "bob", configure="", write=r"^orders$", read=""),
            auth_toml.permissions("app", "carol", write=".*"),
            auth_toml.permissions("app", "dave", read=".*"),
            auth_toml.tokens(
                "app", key_file, max_lifetime=3600, write=r"^amq\.topic$", read=r"^amq\.topic$"
            ),
            auth_toml.everything("other", "bob"),
            auth_toml.queues("app", "orders"),
            extra,
        ]
    )


class AuthSessionTestCase(SessionTestCase):
    extra = ""
    auth = ""

    def setUp(self) -> None:
        super().setUp()
        self.clock.advance(NOW)
        key_file = self.mktemp()
        with open(key_file, "w") as f:
            f.write(SECRET + "\n")
        settings = config.load_string(make_toml(key_file, self.extra, self.auth), "qmq.toml")
        self.settings_ = settings
        self.broker = Broker(self.clock)
        for v in settings.vhosts:
            vhost = self.broker.add_vhost(v.name)
            for q in v.queues:
                vhost.declare_queue(q.name)
        self.broker.auth = Authenticator(
            settings.auth,
            self.clock,
            users=settings.users,
            permissions={v.name: v.permissions for v in settings.vhosts},
            tokens={v.name: v.tokens for v in settings.vhosts if v.tokens is not None},
            run=run_now,
        )
        self.factory = StompFactory(self.broker, self.settings, clock=self.clock)

    def attempt(self, address: str = "192.0.2.1", **headers) -> Client:
        """A client that sends CONNECT (not waiting for the answer)."""
        c = Client(self.factory)
        c.proto.peer_host = address
        c.version = "1.2"
        c.send("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0", **headers})
        return c

    def login(self, **headers) -> Client:
        c = self.attempt(**headers)
        frames = c.read()
        assert [f.command for f in frames] == ["CONNECTED"], frames
        return c

    def error(self, c: Client) -> object:
        """The one ERROR the broker answered, after which it closed."""
        frames = c.read()
        self.assertEqual([f.command for f in frames], ["ERROR"], frames)
        self.assertFalse(c.open)
        return frames[0]

    def token(self, **claims) -> str:
        claims.setdefault("sub", "web-1")
        claims.setdefault("exp", NOW + 600)
        return jwt.encode(claims, SECRET, algorithm="HS256")


class LoginTests(AuthSessionTestCase):
    def test_password(self):
        c = self.login(host="app", login="alice", passcode="wonderland")
        self.assertEqual(c.session.user.name, "alice")
        self.assertEqual(c.session.vhost.name, "app")

    def test_wrong_password_and_unknown_user_look_alike(self):
        answers = []
        for i, (login, passcode) in enumerate(
            [("alice", "nope"), ("mallory", "wonderland"), ("alice", "")]
        ):
            c = self.attempt(f"198.51.100.{i}", host="app", login=login, passcode=passcode)
            self.assertEqual(c.read(), [])  # the delay: nothing yet
            self.clock.advance(0.999)
            self.assertEqual(c.read(), [])
            self.clock.advance(0.001)
            e = self.error(c)
            answers.append((e.headers["message"], e.body))
        self.assertEqual(len(set(answers)), 1, answers)
        self.assertEqual(answers[0][0], "access refused")

    def test_no_credentials_refused(self):
        c = self.attempt(host="app", receipt="c1")
        self.clock.advance(1)
        e = self.error(c)
        self.assertEqual(e.headers["message"], "access refused")
        self.assertEqual(e.headers["receipt-id"], "c1")

    def test_repeated_failures_slow_down(self):
        """Failures from one address: each answer takes twice as long; other
        addresses are not slowed."""
        delays = []
        for _ in range(4):
            c = self.attempt(host="app", login="alice", passcode="guess")
            waited = 0.0
            while not c.transport.value():
                self.clock.advance(0.25)
                waited += 0.25
                self.assertLess(waited, 60)
            delays.append(waited)
            self.error(c)
        self.assertEqual(delays, [1.0, 2.0, 4.0, 8.0])
        self.login(address="203.0.113.5", host="app", login="alice", passcode="wonderland")

    def test_frames_after_connect_wait_for_the_answer(self):
        c = Client(self.factory)
        c.proto.peer_host = "192.0.2.1"
        c.version = "1.2"
        # CONNECT and SEND in one read: the SEND is acted on once logged in.
        c.raw(
            b"CONNECT\naccept-version:1.2\nhost:app\nlogin:alice\npasscode:wonderland\n\n\x00"
            b"SEND\ndestination:/queue/alice.q\nreceipt:r\n\nhi\x00"
        )
        frames = c.read()
        self.assertEqual([f.command for f in frames], ["CONNECTED", "RECEIPT"])
        self.assertEqual(len(self.broker.vhosts["app"].queues["alice.q"]), 1)

    def test_frames_after_a_failed_connect_are_not_acted_on(self):
        c = Client(self.factory)
        c.proto.peer_host = "192.0.2.1"
        c.raw(
            b"CONNECT\naccept-version:1.2\nhost:app\nlogin:alice\npasscode:bad\n\n\x00"
            b"SEND\ndestination:/queue/alice.q\nreceipt:r\n\nhi\x00"
        )
        self.clock.advance(1)
        self.assertEqual(self.error(c).headers["message"], "access refused")
        self.assertNotIn("alice.q", self.broker.vhosts["app"].queues)

    def test_unknown_vhost_refused_once_authentication_is_on(self):
        """No fallback to the default virtual host, and an unknown one looks
        like one the user may not use."""
        a = self.attempt(host="127.0.0.1", login="bob", passcode="builder")
        b = self.attempt(host="app", login="bob", passcode="builder")
        c = self.attempt(host="/", login="bob", passcode="builder")
        b.read()
        ea, ec = self.error(a), self.error(c)
        self.assertEqual(ea.headers["message"], "access refused")
        self.assertEqual(ea.body.replace(b"127.0.0.1", b"X"), ec.body.replace(b"/", b"X"))

    def test_cross_vhost(self):
        """alice may use app, not other (which exists: bob uses it)."""
        c = self.attempt(host="other", login="alice", passcode="wonderland")
        self.assertEqual(self.error(c).headers["message"], "access refused")
        self.login(host="other", login="bob", passcode="builder")

    def test_certificate(self):
        c = Client(self.factory)
        c.proto.identity = PeerIdentity(None, "", "", dns_names=("alice.example.org",))
        c.version = "1.2"
        c.send("CONNECT", {"accept-version": "1.2", "host": "app"})
        [connected] = c.read()
        self.assertEqual(connected.command, "CONNECTED")
        self.assertEqual((c.session.user.name, c.session.user.source), ("alice", "certificate"))

    def test_certificate_naming_nobody(self):
        c = Client(self.factory)
        c.proto.identity = PeerIdentity(None, "", "", dns_names=("eve.example.org",))
        c.send("CONNECT", {"accept-version": "1.2", "host": "app"})
        self.clock.advance(1)
        self.assertEqual(self.error(c).headers["message"], "access refused")

    def test_token(self):
        c = self.login(host="app", passcode=self.token())
        self.assertEqual((c.session.user.name, c.session.user.source), ("web-1", "token"))

    def test_token_expired(self):
        c = self.attempt(host="app", passcode=self.token(exp=NOW - 1))
        self.clock.advance(1)
        e = self.error(c)
        self.assertEqual(e.headers["message"], "token expired")

    def test_token_bad_signature(self):
        bad = jwt.encode({"sub": "web-1", "exp": NOW + 60}, "x" * 32, algorithm="HS256")
        c = self.attempt(host="app", passcode=bad)
        self.clock.advance(1)
        self.assertEqual(self.error(c).headers["message"], "access refused")

    def test_token_for_another_vhost(self):
        """A token is for its own virtual host: other has no token key, so
        the token is taken as a password, and fails."""
        c = self.attempt(host="other", login="bob", passcode=self.token(sub="bob"))
        self.clock.advance(1)
        self.assertEqual(self.error(c).headers["message"], "access refused")

    def test_connection_closed_when_its_token_expires(self):
        c = self.login(host="app", passcode=self.token(exp=NOW + 30))
        c.send("SUBSCRIBE", {"destination": "/topic/chat", "id": "t"})
        self.clock.advance(29.9)
        self.assertTrue(c.open)
        self.clock.advance(0.1)
        e = self.error(c)
        self.assertEqual(e.headers["message"], "token expired")
        self.assertIn(b"expired", e.body)


class AnonymousTests(AuthSessionTestCase):
    auth = "anonymous = true"
    extra = """
[vhosts.app.permissions.anonymous]
read = "^amq\\\\.topic$"
"""

    def test_anonymous_when_enabled(self):
        c = self.login(host="app")
        self.assertEqual(c.session.user.name, "anonymous")
        c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "t", "receipt": "r"})
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.send("SEND", {"destination": "/topic/news"}, b"x")
        e = self.error(c)
        self.assertEqual(e.headers["message"], "access refused (write)")


class PermissionTests(AuthSessionTestCase):
    """Each operation allowed and refused, with the ERROR naming the
    operation and the destination."""

    def refused(self, c: Client, operation: str, destination: str) -> None:
        e = self.error(c)
        self.assertEqual(e.headers["message"], f"access refused ({operation})")
        self.assertIn(destination.encode(), e.body)
        self.assertIn(operation.encode(), e.body)

    def alice(self) -> Client:
        return self.login(host="app", login="alice", passcode="wonderland")

    def bob(self) -> Client:
        return self.login(host="app", login="bob", passcode="builder")

    def test_send_needs_write(self):
        c = self.bob()
        c.send("SEND", {"destination": "/queue/orders", "receipt": "r"}, b"x")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.send("SEND", {"destination": "/queue/alice.inbox"}, b"x")
        self.refused(c, "write", "/queue/alice.inbox")

    def carol(self) -> Client:
        return self.login(host="app", login="carol", passcode="carol")

    def dave(self) -> Client:
        return self.login(host="app", login="dave", passcode="dave")

    def test_send_creating_a_queue_needs_configure(self):
        c = self.carol()
        c.send("SEND", {"destination": "/queue/new-one"}, b"x")
        self.refused(c, "configure", "/queue/new-one")
        self.assertNotIn("new-one", self.broker.vhosts["app"].queues)

    def test_send_to_topic_needs_write_on_amq_topic(self):
        c = self.alice()
        c.send("SEND", {"destination": "/topic/a.b", "receipt": "r"}, b"x")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c = self.bob()
        c.send("SEND", {"destination": "/topic/a.b"}, b"x")
        self.refused(c, "write", "/topic/a.b")

    def test_send_to_exchange_needs_write(self):
        c = self.alice()
        c.send("SEND", {"destination": "/exchange/amq.fanout/k"}, b"x")
        self.refused(c, "write", "/exchange/amq.fanout/k")

    def test_subscribe_needs_read(self):
        c = self.alice()
        c.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "1", "receipt": "r"})
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c = self.bob()
        c.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "1"})
        self.refused(c, "read", "/queue/orders")

    def test_subscribe_creating_a_queue_needs_configure(self):
        c = self.dave()
        c.send("SUBSCRIBE", {"destination": "/queue/fresh", "id": "1"})
        self.refused(c, "configure", "/queue/fresh")
        self.assertNotIn("fresh", self.broker.vhosts["app"].queues)

    def test_subscribe_to_topic_needs_read_on_the_exchange(self):
        c = self.alice()
        c.send("SUBSCRIBE", {"destination": "/topic/x", "id": "1", "receipt": "r"})
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.send("SUBSCRIBE", {"destination": "/exchange/amq.fanout/", "id": "2"})
        self.refused(c, "read", "/exchange/amq.fanout/")

    def test_durable_subscription_needs_configure(self):
        c = self.dave()
        c.send("SUBSCRIBE", {"destination": "/topic/x", "id": "d", "durable": "true"})
        self.refused(c, "configure", "/topic/x")

    def test_temp_queue_needs_configure(self):
        c = self.alice()
        c.send("SEND", {"destination": "/queue/orders", "reply-to": "/temp-queue/r", "receipt": "r"})
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c = self.bob()
        c.send("SEND", {"destination": "/queue/orders", "reply-to": "/temp-queue/r"})
        self.refused(c, "configure", "/temp-queue/r")

    def test_control_needs_read(self):
        c = self.alice()
        c.send("SEND", {"destination": "/control/count-msgs/queue/orders", "receipt": "r"})
        [receipt] = c.read()
        self.assertEqual(receipt.headers["num-messages"], "0")
        c = self.bob()
        c.send("SEND", {"destination": "/control/count-msgs/queue/orders"})
        self.refused(c, "read", "/control/count-msgs/queue/orders")

    def test_token_narrowed_to_destinations(self):
        t = self.token(destinations={"read": "^/topic/chat\\.", "write": "^/topic/chat\\.room1$"})
        c = self.login(host="app", passcode=t)
        c.send("SUBSCRIBE", {"destination": "/topic/chat.room2", "id": "1", "receipt": "r"})
        c.send("SEND", {"destination": "/topic/chat.room1", "receipt": "s"}, b"x")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT", "RECEIPT"])
        c.send("SEND", {"destination": "/topic/chat.room2"}, b"x")
        self.refused(c, "write", "/topic/chat.room2")
        c = self.login(host="app", passcode=t)
        c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1"})
        self.refused(c, "read", "/topic/news")

    def test_cached_target_not_rechecked(self):
        """A destination is checked once per connection, not per message."""
        c = self.bob()
        calls = []
        user = c.session.user
        real = type(user).can
        self.patch(type(user), "can", lambda self, *a: calls.append(a) or real(self, *a))
        for _ in range(5):
            c.send("SEND", {"destination": "/queue/orders"}, b"x")
        self.assertEqual(len(calls), 1)


class AnonymousModeTests(SessionTestCase):
    """Without users the broker is as before: no credentials asked, the host
    header falls back to the default virtual host."""

    def test_no_auth(self):
        self.assertIsNone(self.broker.auth)
        c = self.client(host="127.0.0.1")
        self.assertIsNone(c.session.user)
        self.assertEqual(c.session.vhost.name, "/")
