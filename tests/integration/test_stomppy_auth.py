"""Integration tests of authentication and authorization: a real QMQ STOMP
listener on 127.0.0.1 and real stomp.py clients, over TCP and over
C{qmqtls:} with client certificates.

The broker's users, permissions and token key come from TOML, as in a
deployment; passwords are checked in threads, as in production.  Every
authentication path has a negative test with a real client here; the timing
rules (delays that grow per address) are tested on a L{task.Clock} in
tests.test_auth and tests.test_auth_session.
"""

from __future__ import annotations

import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from stomp.exception import ConnectFailedException
from twisted.internet import reactor
from twisted.trial import unittest

from qmq import config
from qmq.auth import PermissionSettings
from qmq.service import build_authenticator
from tests import auth_toml
from tests.integration.certs import TestPKI
from tests.integration.test_stomppy import BrokerTestCase, Client

SECRET = "an application's secret, 32+ bytes long"
#: The signing key of the virtual host "kiosk", whose tokens are ES256.
KIOSK_KEY = ec.generate_private_key(ec.SECP256R1())


def settings_for(directory: Path) -> config.Settings:
    key = directory / "token.key"
    key.write_text(SECRET + "\n")
    kiosk = directory / "kiosk.pub"
    kiosk.write_bytes(
        KIOSK_KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return config.load_string(
        "\n".join(
            [
                "[auth]\nfailure_delay = 0.05\nfailure_max_delay = 0.2\n",
                auth_toml.ALICE,
                auth_toml.users(bob="builder"),
                auth_toml.ALICE_APP,
                auth_toml.permissions("app", "bob", write=r"^orders$"),
                auth_toml.everything("other", "bob"),
                auth_toml.tokens("app", str(key), write=r"^amq\.topic$", read=r"^amq\.topic$"),
                auth_toml.tokens("kiosk", str(kiosk), "ES256", write=r"^amq\.topic$", read=r"^amq\.topic$"),
                auth_toml.everything("shared", "alice"),
                auth_toml.tokens("shared", str(key), configure=".*", write=".*", read=".*"),
                auth_toml.queues("app", "orders"),
            ]
        ),
        "qmq.toml",
    )


class AuthClient(Client):
    """A stomp.py client that names a virtual host in its CONNECT."""

    def __init__(self, version: str, port: int, vhost: str | None = "app", **kwargs) -> None:
        super().__init__(version, port, **kwargs)
        if vhost is not None:
            self.conn.transport.vhost = vhost

    def login(self, login: str | None = None, passcode: str | None = None):
        headers = {}
        if login is not None:
            headers["login"] = login
        if passcode is not None:
            headers["passcode"] = passcode
        return self.connect(**headers)

    #: Tells whether the broker has closed this client's connection (set by
    #: the test case: stomp.py does not report every close over TLS).
    gone = staticmethod(lambda: False)

    def refused(self, short: str = "access refused"):
        """The ERROR that refused this client (after which it was closed)."""
        rec = self.rec
        [error] = rec.wait(lambda: rec.errors, "ERROR")
        assert rec.connected is None, rec.connected
        assert error.headers["message"] == short, error.headers
        rec.wait(
            lambda: rec.disconnected or self.gone(), "the broker closing the connection", poll=0.05
        )
        return error


class AuthTestCase(BrokerTestCase):
    def listen(self, description: str):
        directory = Path(self.mktemp())
        directory.mkdir(parents=True)
        self.qmq_settings = settings_for(directory)
        d = super().listen(description)

        def configure(port):
            for v in self.qmq_settings.vhosts:
                vhost = self.broker.add_vhost(v.name)
                for q in v.queues:
                    vhost.declare_queue(q.name)
            self.broker.auth = build_authenticator(self.qmq_settings, reactor)
            return port

        return d.addCallback(configure)

    def auth_client(self, vhost: str | None = "app", **kwargs) -> AuthClient:
        c = AuthClient("1.2", self.port_number, vhost=vhost, **kwargs)
        lost = self.factory.lost
        c.gone = lambda: self.factory.lost > lost
        self.clients.append(c)
        return c


class PasswordTests(AuthTestCase):
    def test_login_and_use(self):
        def scenario():
            c = self.auth_client()
            connected = c.login("alice", "wonderland")
            assert connected is not None, c.rec.errors
            c.conn.subscribe("/queue/alice.inbox", id="in", headers={"receipt": "sub"})
            c.rec.wait_receipt("sub")
            c.conn.send("/queue/alice.inbox", "hello", receipt="sent")
            c.rec.wait_receipt("sent")
            [m] = c.rec.wait_messages(1, "in")
            assert m.body == "hello", m

        return self.in_thread(scenario)

    def test_wrong_password_and_unknown_user_get_the_same_error(self):
        def scenario():
            answers = []
            for login, passcode in (("alice", "nope"), ("mallory", "wonderland"), (None, None)):
                c = self.auth_client()
                c.login(login, passcode)
                e = c.refused()
                answers.append((e.headers["message"], e.body))
            assert len(set(answers)) == 1, answers

        return self.in_thread(scenario)

    def test_cross_vhost_and_unknown_vhost(self):
        """alice may not use "other"; an unknown virtual host (stomp.py's
        default host header is the server's address) gets the same ERROR."""

        def scenario():
            bodies = []
            for vhost in ("other", None, "nowhere"):
                c = self.auth_client(vhost=vhost)
                c.login("alice", "wonderland")
                bodies.append(c.refused().body.split("'")[0])
            assert len(set(bodies)) == 1, bodies
            ok = self.auth_client(vhost="other")
            assert ok.login("bob", "builder") is not None

        return self.in_thread(scenario)

    def test_each_permission_refused(self):
        """A denial names the operation and the destination; nothing else
        of the session is harmed before it (the ERROR closes it)."""
        cases = [
            ("bob", "send", "/queue/alice.inbox", "write"),
            ("bob", "send", "/topic/news", "write"),
            ("bob", "send", "/queue/new-queue", "write"),
            ("bob", "subscribe", "/queue/orders", "read"),
            ("bob", "subscribe", "/topic/news", "read"),
            ("alice", "subscribe", "/queue/fresh", "read"),
            ("alice", "send", "/queue/alice.x", None),
            ("alice", "subscribe", "/exchange/amq.fanout/", "read"),
            ("alice", "send", "/exchange/amq.fanout/k", "write"),
            ("bob", "reply-to", "/queue/orders", "configure"),
            ("bob", "send", "/control/count-msgs/queue/orders", "read"),
        ]

        def scenario():
            for user, what, destination, operation in cases:
                c = self.auth_client()
                assert c.login(user, {"alice": "wonderland", "bob": "builder"}[user])
                if what == "send":
                    c.conn.send(destination, "x", receipt="r")
                elif what == "reply-to":
                    c.conn.send(destination, "x", receipt="r", headers={"reply-to": "/temp-queue/a"})
                else:
                    c.conn.subscribe(destination, id="1", headers={"receipt": "r"})
                if operation is None:
                    c.rec.wait_receipt("r")
                    continue
                e = c.rec.wait(lambda c=c: c.rec.errors, "ERROR")[0]
                assert e.headers["message"] == f"access refused ({operation})", (destination, e.headers)
                assert destination.split("/")[1] in e.body and operation in e.body, e.body
                assert e.headers.get("receipt-id") == "r", e.headers

        return self.in_thread(scenario)


def token(**claims) -> str:
    claims.setdefault("sub", "web-1")
    claims.setdefault("exp", int(time.time()) + 600)
    return jwt.encode(claims, SECRET, algorithm="HS256")


class TokenTests(AuthTestCase):
    def test_token(self):
        def scenario():
            c = self.auth_client()
            t = token(destinations={"read": "^/topic/chat\\.", "write": "^/topic/chat\\."})
            assert c.login(None, t) is not None, c.rec.errors
            c.conn.subscribe("/topic/chat.room1", id="t", headers={"receipt": "s"})
            c.rec.wait_receipt("s")
            c.conn.send("/topic/chat.room1", "hi", receipt="r")
            c.rec.wait_receipt("r")
            [m] = c.rec.wait_messages(1, "t")
            assert m.body == "hi"
            c.conn.subscribe("/topic/news", id="n")
            [e] = c.rec.wait(lambda: c.rec.errors, "ERROR")
            assert e.headers["message"] == "access refused (read)", e.headers

        return self.in_thread(scenario)

    def test_expired_token(self):
        def scenario():
            c = self.auth_client()
            c.login(None, token(exp=int(time.time()) - 5))
            c.refused("token expired")

        return self.in_thread(scenario)

    def test_bad_signature(self):
        def scenario():
            c = self.auth_client()
            forged = jwt.encode({"sub": "web-1", "exp": int(time.time()) + 60}, "x" * 40, "HS256")
            c.login(None, forged)
            c.refused()

        return self.in_thread(scenario)

    def test_asymmetric_key(self):
        """The kiosk's tokens are signed with its private key (ES256): one
        signed with another key, or an HMAC token, is refused."""

        def scenario():
            claims = {"sub": "kiosk-1", "exp": int(time.time()) + 60}
            c = self.auth_client(vhost="kiosk")
            assert c.login(None, jwt.encode(claims, KIOSK_KEY, "ES256")) is not None, c.rec.errors
            c.conn.send("/topic/screen", "x", receipt="r")
            c.rec.wait_receipt("r")
            other = ec.generate_private_key(ec.SECP256R1())
            for forged in (jwt.encode(claims, other, "ES256"), token(sub="kiosk-1")):
                c = self.auth_client(vhost="kiosk")
                c.login(None, forged)
                c.refused()

        return self.in_thread(scenario)

    def test_connection_closed_when_the_token_expires(self):
        def scenario():
            c = self.auth_client()
            assert c.login(None, token(exp=time.time() + 1.0)) is not None, c.rec.errors
            [e] = c.rec.wait(lambda: c.rec.errors, "ERROR at expiry", timeout=10)
            assert e.headers["message"] == "token expired", e.headers
            c.rec.wait(lambda: c.rec.disconnected, "the broker closing the connection")

        return self.in_thread(scenario)


class IdentityTests(AuthTestCase):
    """Identity is (how one logged in, name): a token whose subject is
    C{alice} is not the password user alice, even with every permission in
    the virtual host "shared" (issue 21)."""

    def test_token_subject_cannot_attach_to_the_users_durable_subscription(self):
        def scenario():
            alice = self.auth_client(vhost="shared")
            assert alice.login("alice", "wonderland") is not None, alice.rec.errors
            alice.conn.subscribe("/topic/feed", id="feed", headers={"durable": "true", "receipt": "s"})
            alice.rec.wait_receipt("s")
            alice.close()
            publisher = self.auth_client(vhost="shared")
            assert publisher.login("alice", "wonderland") is not None, publisher.rec.errors
            publisher.conn.send("/topic/feed", "hers", receipt="p")
            publisher.rec.wait_receipt("p")
            assert publisher.count("durable.alice.feed") == 1
            # The token's durable subscription of the same name is its own...
            tok = self.auth_client(vhost="shared")
            assert tok.login(None, token(sub="alice")) is not None, tok.rec.errors
            tok.conn.subscribe("/topic/feed", id="feed", headers={"durable": "true", "receipt": "t"})
            tok.rec.wait_receipt("t")
            # ... and naming alice's queue is refused.
            tok.conn.subscribe("/queue/durable.alice.feed", id="steal", headers={"receipt": "u"})
            [e] = tok.rec.wait(lambda: tok.rec.errors, "ERROR")
            assert e.headers["message"] == "access refused (read)", e.headers
            assert not tok.rec.messages, tok.rec.messages
            assert publisher.count("durable.alice.feed") == 1
            # alice's message waited for her.
            again = self.auth_client(vhost="shared")
            assert again.login("alice", "wonderland") is not None, again.rec.errors
            again.conn.subscribe("/topic/feed", id="feed", headers={"durable": "true"})
            [m] = again.rec.wait_messages(1, "feed")
            assert m.body == "hers", m

        return self.in_thread(scenario)


class CertificateTests(AuthTestCase):
    def setUp(self):
        self.clients = []
        self.pki = TestPKI(self.mktemp())
        return self.listen(self.pki.qmqtls(verify="require"))

    def ssl(self, certificate) -> dict:
        return {
            "ca_certs": str(self.pki.ca_pem),
            "cert_file": str(certificate.pem),
            "key_file": str(certificate.pem),
        }

    def test_certificate_names_the_user(self):
        alice = self.pki.client("alice.example.org")  # trustme: SANs only, no CN

        def scenario():
            c = self.auth_client(ssl=self.ssl(alice))
            assert c.login() is not None, c.rec.errors
            c.conn.send("/queue/alice.certs", "x", receipt="r")
            c.rec.wait_receipt("r")
            c.conn.send("/queue/orders.private", "x", receipt="r2")
            [e] = c.rec.wait(lambda: c.rec.errors, "ERROR")
            assert e.headers["message"] == "access refused (write)", e.headers

        return self.in_thread(scenario)

    def test_certificate_of_nobody(self):
        eve = self.pki.client("eve.example.org")

        def scenario():
            c = self.auth_client(ssl=self.ssl(eve))
            c.login()
            c.refused()

        return self.in_thread(scenario)

    def test_certificate_from_another_ca(self):
        self.quiet_stomppy()
        stranger = TestPKI(self.mktemp()).client("alice.example.org")

        def scenario():
            c = self.auth_client(ssl=self.ssl(stranger))
            before = self.factory.lost
            try:
                c.conn.connect(wait=False)
            except ConnectFailedException:
                return
            rec = c.rec
            rec.wait(
                lambda: rec.connected or rec.errors or rec.disconnected or self.factory.lost > before,
                "the connection to be refused",
                poll=0.05,
            )
            assert rec.connected is None, rec.connected

        return self.in_thread(scenario)


del BrokerTestCase  # not collected again from here
_ = unittest


class TwistdExposureTests(unittest.TestCase):
    """C{twistd -n qmq} refuses to listen on every interface without
    authentication: it exits with status 1 and names the key, before binding."""

    def test_refused(self):
        import subprocess

        from tests.integration.test_twistd import environment, twistd_command

        workdir = Path(self.mktemp()).resolve()
        workdir.mkdir(parents=True)
        done = subprocess.run(
            [*twistd_command(), "-n", "qmq", "--listen", "stomp:tcp:0"],
            cwd=workdir,
            env=environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        output = (done.stdout + done.stderr).decode()
        self.assertEqual(done.returncode, 1, output)
        self.assertIn("auth.allow_unauthenticated_remote = true", output)
        self.assertIn("'stomp:tcp:0' listens on every interface", output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("listening on", output)


class AnonymousTests(AuthTestCase):
    """auth.anonymous = true: a client without credentials gets the
    anonymous user's permissions, and no more."""

    def listen(self, description: str):
        d = super().listen(description)

        def anonymous(port):
            from dataclasses import replace

            settings = replace(
                self.qmq_settings,
                auth=replace(self.qmq_settings.auth, anonymous=True),
                vhosts=tuple(
                    replace(
                        v,
                        permissions=(
                            *v.permissions,
                            PermissionSettings("anonymous", read="^amq\\.topic$"),
                        ),
                    )
                    if v.name == "app"
                    else v
                    for v in self.qmq_settings.vhosts
                ),
            )
            self.broker.auth = build_authenticator(settings, reactor)
            return port

        return d.addCallback(anonymous)

    def test_anonymous(self):
        def scenario():
            c = self.auth_client()
            assert c.login() is not None, c.rec.errors
            c.conn.subscribe("/topic/news", id="t", headers={"receipt": "s"})
            c.rec.wait_receipt("s")
            c.conn.send("/topic/news", "x", receipt="r")
            [e] = c.rec.wait(lambda: c.rec.errors, "ERROR")
            assert e.headers["message"] == "access refused (write)", e.headers
            # Another virtual host is not open to anonymous clients.
            other = self.auth_client(vhost="other")
            other.login()
            other.refused()

        return self.in_thread(scenario)
