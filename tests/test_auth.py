"""Unit tests of qmq.auth: hashes, permissions, the throttle, tokens, the portal.

Everything runs on a L{task.Clock}; password checks run synchronously (the
broker runs them in a thread).
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import replace

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from twisted.cred.credentials import Anonymous, UsernamePassword
from twisted.internet import defer, task
from twisted.trial import unittest

from qmq.auth import (
    Authenticator,
    AuthSettings,
    Busy,
    LoginFailed,
    Permission,
    PermissionSettings,
    TokenRejected,
    TokenSettings,
    TooManyFailures,
    User,
    UserSettings,
    VhostRefused,
    hash_password,
    passwords,
    verify_password,
)
from qmq.auth.checkers import CertificateCredentials, TokenCredentials
from qmq.auth.passwords import HashError, parse_hash
from qmq.auth.throttle import LoginThrottle
from qmq.auth.tokens import InvalidToken, TokenExpired, TokenVerifier, looks_like_token
from qmq.tls import PeerIdentity

#: A cheap cost for tests (the default is 15).
COST = 4
SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000.0


def run_now(f, *args):
    return defer.maybeDeferred(f, *args)


def identity(*dns: str, cn: str | None = None) -> PeerIdentity:
    return PeerIdentity(common_name=cn, subject="", issuer="", dns_names=dns)


class PasswordTests(unittest.TestCase):
    def test_round_trip(self):
        hashed = hash_password("s3cret", COST)
        self.assertTrue(hashed.startswith(f"$scrypt$ln={COST},r=8,p=1$"))
        self.assertNotIn("s3cret", hashed)
        self.assertTrue(verify_password("s3cret", hashed))
        self.assertFalse(verify_password("s3cret ", hashed))
        self.assertFalse(verify_password("", hashed))

    def test_salted(self):
        self.assertNotEqual(hash_password("x", COST), hash_password("x", COST))

    def test_plaintext_refused(self):
        e = self.assertRaises(HashError, parse_hash, "hunter2")
        self.assertIn("never a plaintext password", str(e))

    def test_cost_bounded(self):
        hashed = hash_password("x", COST).replace(f"ln={COST}", "ln=30")
        self.assertRaises(HashError, parse_hash, hashed)
        self.assertRaises(ValueError, hash_password, "x", 40)

    def test_qmq_passwd_reads_stdin(self):
        self.patch(sys, "stdin", io.StringIO("pa ss\n"))
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        self.assertEqual(passwords.main(["--cost", str(COST)]), 0)
        hashed = out.getvalue().strip()
        self.assertTrue(verify_password("pa ss", hashed))

    def test_qmq_passwd_refuses_empty(self):
        self.patch(sys, "stdin", io.StringIO("\n"))
        self.patch(sys, "stderr", io.StringIO())
        self.assertEqual(passwords.main([]), 1)


class PermissionTests(unittest.TestCase):
    def test_empty_allows_nothing(self):
        p = Permission.of()
        for op in ("configure", "write", "read"):
            self.assertFalse(p.allows(op, ""))
            self.assertFalse(p.allows(op, "x"))

    def test_unanchored_like_rabbitmq(self):
        p = Permission.of(write="orders", read="^orders$")
        self.assertTrue(p.allows("write", "old-orders-2"))
        self.assertTrue(p.allows("read", "orders"))
        self.assertFalse(p.allows("read", "orders2"))
        self.assertFalse(p.allows("delete", "orders"))

    def test_dollar_is_the_end_of_the_name(self):
        """C{^orders$} allows C{orders} and not C{"orders\\n"} (Python's C{$}
        also matches before a final newline); a literal dollar stays one."""
        p = Permission.of(configure="^orders$", write=r"^a\$b$|^[$]x$", read="^(in|out)$")
        self.assertTrue(p.allows("configure", "orders"))
        for name in ("orders\n", "orders\n\n", "orders\nx"):
            self.assertFalse(p.allows("configure", name), repr(name))
        self.assertTrue(p.allows("write", "a$b"))
        self.assertTrue(p.allows("write", "$x"))
        self.assertFalse(p.allows("write", "a$b\n"))
        self.assertFalse(p.allows("write", "$x\n"))
        self.assertTrue(p.allows("read", "out"))
        self.assertFalse(p.allows("read", "out\n"))
        # A token's narrowing over destination texts is anchored the same way.
        user = User("t", permissions={"app": Permission.of(".*", ".*", ".*")},
                    destinations=Permission.of(read="^/topic/chat$"))
        self.assertTrue(user.can("read", "app", "amq.topic", "/topic/chat"))
        self.assertFalse(user.can("read", "app", "amq.topic", "/topic/chat\n"))

    def test_end_anchored(self):
        from qmq.auth.permissions import end_anchored

        cases = {
            "^a$": "^a\\Z",
            "a": "a",
            r"a\$": r"a\$",
            "[$]$": "[$]\\Z",
            "[]$]$": "[]$]\\Z",
            "[^]$]$": "[^]$]\\Z",
            "(a$|b$)": "(a\\Z|b\\Z)",
            r"[\]$]$": r"[\]$]\Z",
            # A verbose pattern's comment is not a class, whatever it holds.
            "(?x) ^a$  # [a comment\n | ^b$": "(?x) ^a\\Z  # [a comment\n | ^b\\Z",
        }
        for pattern, expected in cases.items():
            self.assertEqual(end_anchored(pattern), expected, pattern)
            re.compile(end_anchored(pattern))

    def test_user_substitution_is_escaped(self):
        p = Permission.of(read=r"^user\.{user}\.", user="a.b")
        self.assertTrue(p.allows("read", "user.a.b.inbox"))
        self.assertFalse(p.allows("read", "user.aXb.inbox"))

    def test_user_can(self):
        user = User("alice", permissions={"app": Permission.of(".*", "^in$", "^out$")})
        self.assertTrue(user.may_use("app"))
        self.assertFalse(user.may_use("/"))
        self.assertTrue(user.can("write", "app", "in"))
        self.assertFalse(user.can("write", "app", "out"))
        self.assertFalse(user.can("read", "app", "in"))
        # Another virtual host: nothing.
        self.assertFalse(user.can("configure", "/", "anything"))

    def test_narrowed_user(self):
        user = User(
            "bob",
            permissions={"app": Permission.of(".*", ".*", ".*")},
            destinations=Permission.of(read=r"^/topic/chat\."),
        )
        self.assertTrue(user.can("read", "app", "amq.topic", "/topic/chat.room1"))
        self.assertFalse(user.can("read", "app", "amq.topic", "/topic/news"))
        self.assertFalse(user.can("write", "app", "amq.topic", "/topic/chat.room1"))
        self.assertFalse(user.can("read", "app", "amq.topic"))


class ThrottleTests(unittest.TestCase):
    def setUp(self):
        self.clock = task.Clock()
        self.throttle = LoginThrottle(self.clock, delay=1.0, max_delay=8.0, window=60.0, max_addresses=3)

    def test_no_failures_no_wait(self):
        self.assertEqual(self.throttle.wait("a"), 0.0)
        self.assertEqual(len(self.throttle), 0)

    def test_delay_doubles_then_caps(self):
        delays = [self.throttle.failed("a") for _ in range(6)]
        self.assertEqual(delays, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0])
        self.assertEqual(self.throttle.failed("b"), 1.0)

    def test_attempts_take_slots(self):
        """Parallel attempts from one address are spaced, not parallel."""
        self.throttle.failed("a")
        self.throttle.failed("a")  # 2 failures: delay 2 s, next slot at 2 s
        waits = [self.throttle.wait("a") for _ in range(3)]
        self.assertEqual(waits, [2.0, 4.0, 6.0])
        # Other addresses are not slowed.
        self.assertEqual(self.throttle.wait("b"), 0.0)

    def test_too_long_a_wait_is_refused(self):
        for _ in range(4):
            self.throttle.failed("a")
        waits = []
        for _ in range(10):
            waits.append(self.throttle.wait("a"))
        self.assertIn(None, waits)
        self.assertTrue(all(w is None or w <= self.throttle.max_wait for w in waits))

    def test_window_forgets(self):
        self.throttle.failed("a")
        self.throttle.failed("a")
        self.clock.advance(61)
        self.assertEqual(self.throttle.failures("a"), 0)
        self.assertEqual(self.throttle.wait("a"), 0.0)
        self.assertEqual(self.throttle.failed("a"), 1.0)

    def test_table_is_bounded(self):
        for i in range(10):
            self.throttle.failed(f"10.0.0.{i}")
        self.assertEqual(len(self.throttle), 3)
        self.assertEqual(self.throttle.failures("10.0.0.9"), 1)
        self.assertEqual(self.throttle.failures("10.0.0.0"), 0)
        self.assertEqual(self.throttle.address_failures("10.0.0.0"), 0)
        for i in range(10):
            self.throttle.failed("10.0.0.9", f"user{i}")
        self.assertEqual(len(self.throttle), 3)

    def test_keyed_on_address_and_user(self):
        """One user's failures do not slow another user behind the same
        address (a NAT)."""
        self.throttle.failed("a", "alice")
        self.throttle.failed("a", "alice")
        self.assertEqual(self.throttle.wait("a", "bob"), 0.0)
        self.assertEqual(self.throttle.wait("b", "alice"), 0.0)
        self.assertEqual(self.throttle.wait("a", "alice"), 2.0)
        self.assertEqual(self.throttle.failures("a", "alice"), 2)
        self.assertEqual(self.throttle.address_failures("a"), 2)

    def test_success_forgets_the_pair(self):
        self.throttle.failed("a", "alice")
        self.throttle.failed("a", "alice")
        self.clock.advance(2)
        self.assertEqual(self.throttle.wait("a", "alice"), 0.0)
        self.throttle.succeeded("a", "alice")
        self.assertEqual(self.throttle.failures("a", "alice"), 0)
        self.assertEqual([self.throttle.wait("a", "alice") for _ in range(3)], [0.0, 0.0, 0.0])
        # The next failure starts over at the first delay.
        self.assertEqual(self.throttle.failed("a", "alice"), 1.0)

    def test_spraying_slows_the_address(self):
        """Past the address threshold, failures over many user names slow
        every attempt from the address, and a success does not reset it."""
        throttle = LoginThrottle(self.clock, delay=1.0, max_delay=8.0, window=60.0, address_threshold=3)
        delays = [throttle.failed("a", f"user{i}") for i in range(6)]
        # Each name's first failure: 1 s; from the fourth on, the address's
        # own delay (1, 2, 4 s beyond the threshold) is larger.
        self.assertEqual(delays, [1.0, 1.0, 1.0, 1.0, 2.0, 4.0])
        self.assertEqual(throttle.wait("a", "someone-else"), 4.0)
        self.assertEqual(throttle.wait("a", "someone-else"), 8.0)
        throttle.succeeded("a", "someone-else")
        self.assertEqual(throttle.wait("a", "user0"), 12.0)
        # A name that logged in from the address passes the address's
        # count (not its own failures); the count stays for the others.
        self.assertEqual(throttle.wait("a", "someone-else"), 0.0)
        self.assertEqual(throttle.address_failures("a"), 6)
        self.assertEqual(throttle.wait("a", "user9"), 16.0)
        # Another address is not slowed; the window forgets the address.
        self.assertEqual(throttle.wait("b", "user0"), 0.0)
        self.clock.advance(61)
        self.assertEqual(throttle.address_failures("a"), 0)
        self.assertEqual(throttle.wait("a", "user9"), 0.0)


def token(claims: dict, key=SECRET, algorithm="HS256", headers=None) -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


class TokenTests(unittest.TestCase):
    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(NOW)
        self.settings = TokenSettings(algorithm="HS256", key=SECRET, max_lifetime=3600)
        self.verifier = TokenVerifier(self.settings, self.clock)

    def test_valid(self):
        claims = self.verifier.verify(token({"sub": "web-1", "exp": NOW + 60}))
        self.assertEqual(claims["sub"], "web-1")

    def test_expired_by_the_injected_clock(self):
        t = token({"sub": "web-1", "exp": NOW + 60})
        self.verifier.verify(t)
        self.clock.advance(61)
        self.assertRaises(TokenExpired, self.verifier.verify, t)

    def test_not_yet_valid(self):
        t = token({"sub": "u", "exp": NOW + 60, "nbf": NOW + 30})
        self.assertRaises(TokenExpired, self.verifier.verify, t)

    def test_bad_signature(self):
        t = token({"sub": "u", "exp": NOW + 60}, key=b"another secret of 32 bytes......")
        self.assertRaises(InvalidToken, self.verifier.verify, t)

    def test_tampered(self):
        t = token({"sub": "u", "exp": NOW + 60})
        head, body, sig = t.split(".")
        other = token({"sub": "admin", "exp": NOW + 60}).split(".")[1]
        self.assertRaises(InvalidToken, self.verifier.verify, f"{head}.{other}.{sig}")

    def test_alg_none_refused(self):
        t = jwt.encode({"sub": "u", "exp": NOW + 60}, None, algorithm="none")
        self.assertRaises(InvalidToken, self.verifier.verify, t)

    def test_exp_and_sub_required(self):
        self.assertRaises(InvalidToken, self.verifier.verify, token({"sub": "u"}))
        self.assertRaises(InvalidToken, self.verifier.verify, token({"exp": NOW + 60}))
        self.assertRaises(InvalidToken, self.verifier.verify, token({"sub": 3, "exp": NOW + 60}))

    def test_short_lived_only(self):
        self.assertRaises(InvalidToken, self.verifier.verify, token({"sub": "u", "exp": NOW + 7200}))
        t = token({"sub": "u", "exp": NOW + 7200, "iat": NOW - 7200 + 10})
        self.assertRaises(InvalidToken, self.verifier.verify, t)

    def test_lifetime_from_now_not_from_a_future_iat(self):
        """An C{iat} in the future cannot make a long-lived token look short:
        C{max_lifetime} (an hour here) counts from now, and an C{iat} past
        now + leeway is refused."""
        for iat in (NOW + 7000, NOW + 1):
            t = token({"sub": "u", "exp": NOW + 7200, "iat": iat})
            with self.assertRaises(InvalidToken) as caught:
                self.verifier.verify(t)
            self.assertNotIsInstance(caught.exception, TokenExpired)
        # Issued in the future but within the leeway, and living at most an
        # hour from now: accepted.
        lenient = TokenVerifier(replace(self.settings, leeway=5), self.clock)
        self.assertEqual(lenient.verify(token({"sub": "u", "exp": NOW + 3600, "iat": NOW + 5}))["sub"], "u")
        self.assertRaises(InvalidToken, lenient.verify, token({"sub": "u", "exp": NOW + 3600, "iat": NOW + 6}))
        self.assertRaises(InvalidToken, lenient.verify, token({"sub": "u", "exp": NOW + 3601, "iat": NOW}))
        # An hour exactly, from now: accepted.
        self.verifier.verify(token({"sub": "u", "exp": NOW + 3600, "iat": NOW}))
        self.verifier.verify(token({"sub": "u", "exp": NOW + 3600}))

    def test_audience_and_issuer(self):
        verifier = TokenVerifier(replace(self.settings, audience="qmq", issuer="app"), self.clock)
        good = {"sub": "u", "exp": NOW + 60, "aud": "qmq", "iss": "app"}
        verifier.verify(token(good))
        self.assertRaises(InvalidToken, verifier.verify, token({**good, "aud": "other"}))
        self.assertRaises(InvalidToken, verifier.verify, token({**good, "iss": "other"}))
        self.assertRaises(InvalidToken, verifier.verify, token({"sub": "u", "exp": NOW + 60}))

    def test_destinations(self):
        claims = self.verifier.verify(
            token({"sub": "u", "exp": NOW + 60, "destinations": {"read": "^/topic/a"}})
        )
        narrowing = claims["destinations"]
        self.assertTrue(narrowing.allows("read", "/topic/a.b"))
        self.assertFalse(narrowing.allows("write", "/topic/a.b"))
        for bad in ("x", {"read": 3}, {"read": "("}):
            t = token({"sub": "u", "exp": NOW + 60, "destinations": bad})
            self.assertRaises(InvalidToken, self.verifier.verify, t)

    def test_asymmetric(self):
        private = ec.generate_private_key(ec.SECP256R1())
        public = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        verifier = TokenVerifier(TokenSettings(algorithm="ES256", key=public), self.clock)
        self.assertEqual(
            verifier.verify(token({"sub": "u", "exp": NOW + 60}, private, "ES256"))["sub"], "u"
        )
        other = ec.generate_private_key(ec.SECP256R1())
        self.assertRaises(
            InvalidToken, verifier.verify, token({"sub": "u", "exp": NOW + 60}, other, "ES256")
        )
        # An HMAC token "signed" with the public key: the algorithm is fixed.
        self.assertRaises(
            InvalidToken, verifier.verify, token({"sub": "u", "exp": NOW + 60}, SECRET, "HS256")
        )

    def test_looks_like_token(self):
        self.assertTrue(looks_like_token(token({"sub": "u", "exp": 1})))
        self.assertFalse(looks_like_token("a password"))
        self.assertFalse(looks_like_token(None))
        self.assertFalse(looks_like_token("a.b.c" * 5000))
        self.assertFalse(looks_like_token(token({"sub": "u", "exp": 1}) + "\n"))


class AuthenticatorTests(unittest.TestCase):
    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(NOW)
        self.settings = AuthSettings(failure_delay=1.0, failure_max_delay=8.0)
        self.auth = self.make()

    def make(self, **changes) -> Authenticator:
        return Authenticator(
            changes.pop("settings", self.settings),
            self.clock,
            users=[
                UserSettings("alice", hash_password("wonderland", COST), ("alice.example.org",)),
                UserSettings("bob", hash_password("builder", COST)),
                UserSettings("anonymous"),
            ],
            permissions={
                "app": [
                    PermissionSettings("alice", ".*", ".*", ".*"),
                    PermissionSettings("anonymous", "", "", "^public$"),
                ],
                "other": [PermissionSettings("bob", "", "^x$", "")],
            },
            tokens={"app": TokenSettings("HS256", SECRET, read="^amq\\.topic$")},
            run=run_now,
        )

    def login(self, vhost, credentials, address="192.0.2.1"):
        return self.auth.authenticate(vhost, credentials, address)

    def test_enabled(self):
        self.assertTrue(self.auth.enabled)
        self.assertFalse(Authenticator(AuthSettings(), self.clock).enabled)

    def test_password(self):
        user = self.successResultOf(self.login("app", UsernamePassword("alice", "wonderland")))
        self.assertEqual((user.name, user.source), ("alice", "password"))
        self.assertTrue(user.can("read", "app", "anything"))
        self.assertIsNone(user.expires)

    def test_wrong_password_and_unknown_user_look_the_same(self):
        results = []
        for credentials in (
            UsernamePassword("alice", "wrong"),
            UsernamePassword("mallory", "wonderland"),
            UsernamePassword("anonymous", ""),  # a user without a password
        ):
            d = self.login("app", credentials, address=f"198.51.100.{len(results)}")
            self.assertNoResult(d)  # the delay
            self.clock.advance(0.999)
            self.assertNoResult(d)
            self.clock.advance(0.001)
            results.append(self.failureResultOf(d, LoginFailed).value)
        self.assertEqual({(e.short, e.message) for e in results}, {(results[0].short, results[0].message)})
        self.assertEqual(results[0].short, "access refused")

    def test_unknown_user_costs_what_the_costliest_user_does(self):
        """The dummy hash an unknown user is checked against has the
        parameters of the costliest hash in use, including one set at run
        time (the HTTP users API hashes at the default cost, costlier than
        the configured ones): a wrong password and an unknown user then
        cost the same scrypt work."""
        checked = []

        def record(f, password, hashed):
            checked.append(hashed)
            return defer.succeed(False)

        self.auth.passwords._run = record

        def cost_of(credentials, address):
            del checked[:]
            d = self.login("app", credentials, address)
            self.settle(d)
            self.failureResultOf(d, LoginFailed)
            [hashed] = checked
            return (hashed.ln, hashed.r, hashed.p, len(hashed.key))

        alice = cost_of(UsernamePassword("alice", "wrong"), "198.51.100.1")
        self.assertEqual(alice, (COST, 8, 1, 32))
        self.assertEqual(cost_of(UsernamePassword("mallory", "x"), "198.51.100.2"), alice)
        # A costlier user added at run time (as PUT /api/v1/users/NAME does).
        self.auth.set_user("carol", "$scrypt$ln=15,r=8,p=1$" + "c2FsdHNhbHRzYWx0c2FsdA==$"
                           "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=")
        carol = cost_of(UsernamePassword("carol", "wrong"), "198.51.100.3")
        self.assertEqual(carol, (15, 8, 1, 32))
        self.assertEqual(cost_of(UsernamePassword("mallory", "x"), "198.51.100.4"), carol)
        self.assertEqual(cost_of(UsernamePassword("anonymous", ""), "198.51.100.5"), carol)
        # Gone again: the dummy follows the costliest hash left.
        self.auth.delete_user("carol")
        self.assertEqual(cost_of(UsernamePassword("mallory", "x"), "198.51.100.6"), alice)

    def settle(self, d, step=0.5, limit=1000):
        """Advance the clock until C{d} has a result; return the seconds it took."""
        done = []
        d.addBoth(lambda r: done.append(r) or r)
        start = self.clock.seconds()
        for _ in range(limit):
            if done:
                break
            self.clock.advance(step)
        return self.clock.seconds() - start

    def test_failures_from_one_address_slow_down(self):
        delays = []
        for _ in range(4):
            d = self.login("app", UsernamePassword("alice", "nope"))
            delays.append(self.settle(d))
            self.failureResultOf(d, LoginFailed)
        # One connection trying again and again: each answer takes twice as long.
        self.assertEqual(delays, [1.0, 2.0, 4.0, 8.0])
        # Two guesses at once from that address: the second is not even
        # checked before its slot (8 s), then answered 8 s later.
        first = self.login("app", UsernamePassword("alice", "guess1"))
        second = self.login("app", UsernamePassword("alice", "guess2"))
        self.assertEqual(self.settle(first), 8.0)
        self.failureResultOf(first, LoginFailed)
        self.assertNoResult(second)
        self.assertEqual(self.settle(second), 8.0)
        self.failureResultOf(second, LoginFailed)
        # Another address is not slowed.
        d = self.login("app", UsernamePassword("alice", "wonderland"), "203.0.113.9")
        self.assertEqual(self.successResultOf(d).name, "alice")
        # The right password, once its slot has come, forgets alice's
        # failures from this address.
        d = self.login("app", UsernamePassword("alice", "wonderland"))
        self.assertEqual(self.successResultOf(d).name, "alice")
        self.assertEqual(self.auth.throttle.failures("192.0.2.1", "alice"), 0)
        d = self.login("app", UsernamePassword("alice", "wonderland"))
        self.assertEqual(self.successResultOf(d).name, "alice")

    def test_success_is_not_slowed_by_earlier_failures(self):
        """Two failures from an address, then right logins from it: none
        waits (they waited 2 s each for the whole window), and other users
        behind the same address never did."""
        for _ in range(2):
            d = self.login("app", UsernamePassword("alice", "nope"))
            self.settle(d)
            self.failureResultOf(d, LoginFailed)
        d = self.login("app", UsernamePassword("bob", "builder"), "192.0.2.1")
        self.failureResultOf(d, VhostRefused)  # right credentials, at once
        for _ in range(3):
            d = self.login("app", UsernamePassword("alice", "wonderland"))
            self.assertEqual(self.successResultOf(d).name, "alice")

    def test_spraying_from_one_address_is_slowed(self):
        self.auth = self.make(settings=replace(self.settings, failure_address_threshold=2))
        delays = []
        for name in ("u1", "u2", "u3", "u4"):
            d = self.login("app", UsernamePassword(name, "guess"))
            delays.append(self.settle(d, step=0.25))
            self.failureResultOf(d, LoginFailed)
        self.assertEqual(delays, [1.0, 1.0, 1.0, 2.0])
        # Attempts from that address, as any user, are spaced now: the
        # second of two at once waits its turn (the address's 2 s).
        first = self.login("app", UsernamePassword("alice", "wonderland"))
        second = self.login("app", UsernamePassword("u5", "guess"))
        self.assertEqual(self.successResultOf(first).name, "alice")
        self.assertNoResult(second)
        self.clock.advance(1.99)
        self.assertNoResult(second)
        self.settle(second)
        self.failureResultOf(second, LoginFailed)
        # alice's success did not clear the address's count, but alice,
        # who logged in from there, is not held back by it any more.
        self.assertEqual(self.auth.throttle.address_failures("192.0.2.1"), 5)
        first = self.login("app", UsernamePassword("u6", "guess"))
        second = self.login("app", UsernamePassword("alice", "wonderland"))
        self.assertEqual(self.successResultOf(second).name, "alice")
        self.assertNoResult(first)
        self.settle(first)
        self.failureResultOf(first, LoginFailed)

    def test_too_many_failures(self):
        for _ in range(4):
            self.auth.throttle.failed("192.0.2.1", "alice")
        attempts = [self.login("app", UsernamePassword("alice", "wonderland")) for _ in range(20)]
        refused = [d for d in attempts if d.called]
        waiting = [d for d in attempts if not d.called]
        self.assertTrue(refused and waiting)
        for d in refused:
            e = self.failureResultOf(d, TooManyFailures).value
        self.assertEqual(e.short, "too many failed logins")
        for d in waiting:
            self.settle(d)
            self.assertEqual(self.successResultOf(d).name, "alice")

    def test_vhost_refused_same_for_unknown(self):
        d1 = self.login("other", UsernamePassword("alice", "wonderland"))
        d2 = self.login("no-such-vhost", UsernamePassword("alice", "wonderland"))
        e1 = self.failureResultOf(d1, VhostRefused).value
        e2 = self.failureResultOf(d2, VhostRefused).value
        self.assertEqual(e1.short, e2.short)
        self.assertNotIn("exist", e1.message + e2.message)

    def test_certificate(self):
        creds = self.auth.credentials("app", None, None, identity("alice.example.org"))
        self.assertIsInstance(creds, CertificateCredentials)
        user = self.successResultOf(self.login("app", creds))
        self.assertEqual((user.name, user.source), ("alice", "certificate"))
        # A certificate naming no user, or a login naming another user.
        d = self.login("app", self.auth.credentials("app", None, None, identity("eve.example.org")))
        self.clock.advance(10)
        self.failureResultOf(d, LoginFailed)
        d = self.login("app", CertificateCredentials(identity("alice.example.org"), "bob"), "192.0.2.7")
        self.clock.advance(10)
        self.failureResultOf(d, LoginFailed)

    def test_token(self):
        t = token({"sub": "web-42", "exp": NOW + 60, "destinations": {"read": "^/topic/chat\\."}})
        creds = self.auth.credentials("app", "", t)
        self.assertIsInstance(creds, TokenCredentials)
        user = self.successResultOf(self.login("app", creds))
        self.assertEqual((user.name, user.source, user.expires), ("web-42", "token", NOW + 60))
        self.assertTrue(user.can("read", "app", "amq.topic", "/topic/chat.x"))
        self.assertFalse(user.can("read", "app", "amq.topic", "/topic/news"))
        self.assertFalse(user.can("write", "app", "amq.topic", "/topic/chat.x"))
        # The token is for "app" only.
        self.assertFalse(user.may_use("other"))

    def test_token_expired(self):
        t = token({"sub": "web-42", "exp": NOW - 1})
        d = self.login("app", self.auth.credentials("app", None, t))
        self.clock.advance(1)
        e = self.failureResultOf(d, TokenRejected).value
        self.assertEqual(e.short, "token expired")

    def test_token_bad_signature(self):
        t = token({"sub": "web-42", "exp": NOW + 60}, key=b"x" * 32)
        d = self.login("app", self.auth.credentials("app", None, t))
        self.clock.advance(1)
        self.failureResultOf(d, LoginFailed)

    def test_token_for_vhost_without_tokens_is_a_password(self):
        t = token({"sub": "web-42", "exp": NOW + 60})
        creds = self.auth.credentials("other", "bob", t)
        self.assertIsInstance(creds, UsernamePassword)

    def test_anonymous_off(self):
        creds = self.auth.credentials("app")
        self.assertIsInstance(creds, Anonymous)
        d = self.login("app", creds)
        self.clock.advance(1)
        self.failureResultOf(d, LoginFailed)

    def test_anonymous_on(self):
        self.auth = self.make(settings=replace(self.settings, anonymous=True))
        user = self.successResultOf(self.login("app", Anonymous()))
        self.assertEqual((user.name, user.source), ("anonymous", "anonymous"))
        self.assertTrue(user.can("read", "app", "public"))
        self.assertFalse(user.can("write", "app", "public"))
        d = self.login("other", Anonymous())
        self.failureResultOf(d, VhostRefused)

    def test_failure_is_logged(self):
        events = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        d = self.login("app", UsernamePassword("mallory", "x"))
        self.clock.advance(1)
        self.failureResultOf(d, LoginFailed)
        texts = [e.get("log_format", "") for e in events]
        self.assertTrue(any(t.startswith("login failed") for t in texts), texts)
        [event] = [e for e in events if e.get("log_format", "").startswith("login failed")]
        self.assertEqual(event["user"], "mallory")
        self.assertEqual(event["address"], "192.0.2.1")
        self.assertNotIn("x", re.sub(r"\w{2,}", "", str(event.get("reason"))))


class PasswordGateTests(unittest.TestCase):
    """Password checks (scrypt in threads) are bounded per address and overall."""

    def setUp(self):
        self.clock = task.Clock()
        self.started: list[defer.Deferred] = []

        def run(f, *args):
            d = defer.Deferred()
            d.addCallback(lambda _: f(*args))
            self.started.append(d)
            return d

        self.auth = Authenticator(
            AuthSettings(),
            self.clock,
            users=[UserSettings("alice", hash_password("pw", COST))],
            permissions={"/": [PermissionSettings("alice", "", "", ".*")]},
            run=run,
        )

    def test_two_at_a_time_per_address(self):
        attempts = [self.auth.authenticate("/", UsernamePassword("alice", "pw"), "a") for _ in range(5)]
        other = self.auth.authenticate("/", UsernamePassword("alice", "pw"), "b")
        self.assertEqual(len(self.started), 3)  # two from a, one from b
        while self.started:
            self.started.pop(0).callback(None)
        for d in [*attempts, other]:
            self.assertEqual(self.successResultOf(d).name, "alice")
        self.assertEqual(self.auth.gate.pending, 0)

    def test_busy_past_the_bound(self):
        self.auth.gate.max_pending = 3
        attempts = [
            self.auth.authenticate("/", UsernamePassword("alice", "pw"), f"10.0.0.{i}") for i in range(4)
        ]
        e = self.failureResultOf(attempts[3], Busy).value
        self.assertEqual(e.short, "broker busy")
        # Cheap credentials are not gated.
        self.assertEqual(self.auth.gate.pending, 3)
        for d in self.started:
            d.callback(None)
        for d in attempts[:3]:
            self.successResultOf(d)


class LoginRefusalTests(unittest.TestCase):
    """L{login_refusal}: the one reading of a failed login check that STOMP's
    CONNECT and AMQP's connection.open share."""

    def test_refusal(self) -> None:
        from twisted.python.failure import Failure

        from qmq.auth import LoginFailed, login_refusal

        e = LoginFailed("Wrong login or passcode.")
        self.assertIs(login_refusal(Failure(e), "s1"), e)

    def test_broken_check_is_logged(self) -> None:
        from twisted.python.failure import Failure

        from qmq.auth import login_refusal

        self.assertIsNone(login_refusal(Failure(RuntimeError("checker broke")), "s2"))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
