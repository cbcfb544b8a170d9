"""The service's part of security: the authenticator built from the
configuration, and listeners that refuse to expose an unauthenticated broker."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from qmq import config
from qmq.auth import hash_password
from qmq.config import ConfigError
from qmq.service import build_authenticator, is_loopback, make_service
from qmq.twisted_internals import endpoint_interface

USERS = f"""
[users.alice]
password = "{hash_password('x', 4)}"

[vhosts."/".permissions.alice]
read = ".*"
"""


class ExposureTests(unittest.TestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()

    def service(self, text: str, listen: list[str]):
        settings = config.load_string(text, "qmq.toml")
        settings = config.dataclasses.replace(
            settings, listen=listen, data_dir=Path(self.mktemp())
        )
        return make_service(settings, self.reactor)

    def test_default_is_loopback_and_anonymous(self):
        svc = make_service(
            config.dataclasses.replace(config.load(), data_dir=Path(self.mktemp())), self.reactor
        )
        self.assertIsNone(svc.broker.auth)

    def test_remote_without_auth_refused(self):
        for spec in (
            "stomp:tcp:61613",
            "stomp:tcp:61613:interface=0.0.0.0",
            "stomp:tcp:61613:interface=192.0.2.1",
            "stomp:tcp6:61613:interface=\\:\\:",
        ):
            e = self.assertRaises(ConfigError, self.service, "", [spec])
            self.assertIn("auth.allow_unauthenticated_remote", str(e))
            self.assertIn("authentication is off", str(e))
            self.assertIn(repr(spec), str(e))

    def test_loopback_and_unix_allowed(self):
        for spec in (
            "stomp:tcp:61613:interface=127.0.0.1",
            "stomp:tcp:61613:interface=127.0.0.2",
            "stomp:tcp6:61613:interface=\\:\\:1",
            "stomp:unix:" + self.mktemp(),
        ):
            self.assertIsNone(self.service("", [spec]).broker.auth)

    def test_remote_with_users_allowed(self):
        svc = self.service(USERS, ["stomp:tcp:61613"])
        self.assertTrue(svc.broker.auth.enabled)

    def test_remote_with_anonymous_refused(self):
        e = self.assertRaises(
            ConfigError, self.service, USERS + "[auth]\nanonymous = true\n", ["stomp:tcp:61613"]
        )
        self.assertIn("auth.anonymous", str(e))

    def test_explicitly_allowed(self):
        svc = self.service("[auth]\nallow_unauthenticated_remote = true\n", ["stomp:tcp:61613"])
        self.assertIsNone(svc.broker.auth)

    def test_error_names_the_listen_key(self):
        e = self.assertRaises(
            ConfigError,
            self.service,
            'listen = ["stomp:tcp:1:interface=127.0.0.1", "stomp:tcp:2"]',
            ["stomp:tcp:1:interface=127.0.0.1", "stomp:tcp:2"],
        )
        self.assertIn("listen[1]: 'stomp:tcp:2'", str(e))

    def test_is_loopback(self):
        self.assertTrue(is_loopback(None))
        self.assertTrue(is_loopback("127.0.0.1"))
        self.assertTrue(is_loopback("::1"))
        self.assertTrue(is_loopback("localhost"))
        self.assertFalse(is_loopback(""))
        self.assertFalse(is_loopback("0.0.0.0"))
        self.assertFalse(is_loopback("10.0.0.1"))
        self.assertFalse(is_loopback("example.org"))

    def test_endpoint_interface_reads_twisted(self):
        """Pinned: Twisted's TCP endpoints keep the interface in C{_interface}."""
        from twisted.internet.endpoints import serverFromString

        self.assertEqual(
            endpoint_interface(serverFromString(self.reactor, "tcp:1:interface=127.0.0.1")),
            "127.0.0.1",
        )
        self.assertEqual(endpoint_interface(serverFromString(self.reactor, "tcp:1")), "")
        self.assertIsNone(endpoint_interface(serverFromString(self.reactor, "unix:/x")))
        self.assertEqual(endpoint_interface(object()), "")


class ConfigTests(unittest.TestCase):
    def load(self, text: str):
        return config.load_string(text, "qmq.toml")

    def test_users_and_permissions(self):
        s = self.load(USERS)
        [alice] = s.users
        self.assertEqual(alice.name, "alice")
        self.assertEqual(s.vhosts[0].permissions[0].read, ".*")
        auth = build_authenticator(s, MemoryReactorClock())
        self.assertTrue(auth.enabled)

    def test_plaintext_password_refused(self):
        e = self.assertRaises(ConfigError, self.load, '[users.alice]\npassword = "hunter2"\n')
        self.assertIn("qmq.toml: users.alice.password:", str(e))
        self.assertIn("never a plaintext password", str(e))

    def test_bad_pattern(self):
        e = self.assertRaises(
            ConfigError, self.load, '[vhosts."/".permissions.alice]\nread = "("\n'
        )
        self.assertIn('vhosts."/".permissions.alice.read: not a regular expression', str(e))

    def test_token_key_file(self):
        e = self.assertRaises(
            ConfigError,
            self.load,
            '[vhosts.app.tokens]\nalgorithm = "HS256"\nkey_file = "/nonexistent/key"\n',
        )
        self.assertIn("vhosts.app.tokens.key_file: cannot read", str(e))
        short = self.mktemp()
        Path(short).write_text("too short\n")
        e = self.assertRaises(
            ConfigError,
            self.load,
            f'[vhosts.app.tokens]\nalgorithm = "HS256"\nkey_file = "{short}"\n',
        )
        self.assertIn("at least 32 bytes", str(e))
        e = self.assertRaises(
            ConfigError,
            self.load,
            f'[vhosts.app.tokens]\nalgorithm = "RS256"\nkey_file = "{short}"\n',
        )
        self.assertIn("no PEM public key", str(e))
        e = self.assertRaises(ConfigError, self.load, '[vhosts.app.tokens]\nalgorithm = "none"\n')
        self.assertIn("vhosts.app.tokens.algorithm", str(e))

    def test_tokens_alone_turn_authentication_on(self):
        key = self.mktemp()
        Path(key).write_text("k" * 40)
        s = self.load(f'[vhosts.app.tokens]\nalgorithm = "HS256"\nkey_file = "{key}"\nread = ".*"\n')
        self.assertEqual(s.vhosts[-1].tokens.key, b"k" * 40)
        self.assertTrue(build_authenticator(s, MemoryReactorClock()).enabled)


class ProtocolExposureTests(unittest.TestCase):
    """An http: listener authenticates every client when authentication is
    on (STOMP over WebSocket and SockJS at CONNECT, the HTTP API on every
    request), so it may listen off loopback then; without users it may not."""

    def test_http_remote_allowed_with_users(self):
        settings = config.dataclasses.replace(
            config.load_string(USERS, "qmq.toml"),
            listen=["http:tcp:8080"],
            data_dir=Path(self.mktemp()),
        )
        make_service(settings, MemoryReactorClock())

    def test_http_remote_refused_without_users(self):
        settings = config.dataclasses.replace(
            config.load_string("", "qmq.toml"),
            listen=["http:tcp:8080"],
            data_dir=Path(self.mktemp()),
        )
        e = self.assertRaises(ConfigError, make_service, settings, MemoryReactorClock())
        self.assertIn("authentication is off", str(e))

    def test_http_loopback_allowed(self):
        settings = config.dataclasses.replace(
            config.load_string(USERS, "qmq.toml"),
            listen=["http:tcp:8080:interface=127.0.0.1"],
            data_dir=Path(self.mktemp()),
        )
        make_service(settings, MemoryReactorClock())
