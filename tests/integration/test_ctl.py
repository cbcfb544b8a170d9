"""C{qmq-ctl} against real brokers: C{twistd -n qmq} in a subprocess with
authentication on, and C{qmq-ctl} run as a user runs it (a subprocess,
C{python -m qmq.ctl}, the console script's module), its output and exit
status read.  Definitions exported from one broker and imported into a
fresh one give the same export."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from twisted.trial import unittest

from qmq.auth.passwords import hash_password
from tests.integration import test_twistd
from tests.integration.test_twistd import FrameReader, environment, frame, free_port

PASSWORD = "Adm1n-pass"
CONFIG = """
[users.admin]
password = "{hash}"

[vhosts."/".permissions.admin]
configure = ".*"
write = ".*"
read = ".*"

[http_api]
admins = "admin"
"""


class CtlTests(unittest.TestCase):
    # The helpers of the twistd tests (importing the class would run its
    # tests here too).
    start = test_twistd.TwistdTests.start
    output = test_twistd.TwistdTests.output
    connect = test_twistd.TwistdTests.connect

    def broker(self) -> tuple[str, int]:
        """Start a broker with authentication on; its base URL and STOMP port."""
        config = Path(self.mktemp()).resolve()
        config.write_text(CONFIG.format(hash=hash_password(PASSWORD, 4)))
        stomp, http = free_port(), free_port()
        process = self.start(
            "--config", str(config),
            "--listen", f"stomp:tcp:{stomp}:interface=127.0.0.1",
            "--listen", f"http:tcp:{http}:interface=127.0.0.1",
        )
        self.connect(process, http).close()
        self.connect(process, stomp).close()
        return f"http://127.0.0.1:{http}", stomp

    def ctl(self, url: str, *argv: str, stdin: str = "", auth: bool = True) -> tuple[int, str, str]:
        env = environment()
        env.pop("QMQ_CTL_USER", None)
        env.pop("QMQ_CTL_PASSWORD", None)
        if auth:
            env["QMQ_CTL_USER"] = "admin"
            env["QMQ_CTL_PASSWORD"] = PASSWORD
        result = subprocess.run(
            [sys.executable, "-m", "qmq.ctl", "--url", url, *argv],
            input=stdin, capture_output=True, text=True, env=env, timeout=60, cwd=self.mktemp_dir(),
        )
        self.assertNotIn("Traceback", result.stderr)
        return result.returncode, result.stdout, result.stderr

    def mktemp_dir(self) -> str:
        path = getattr(self, "_cwd", None)
        if path is None:
            path = self._cwd = Path(self.mktemp()).resolve()
            path.mkdir()
        return str(path)

    def ok(self, url: str, *argv: str, stdin: str = "") -> str:
        status, out, err = self.ctl(url, *argv, stdin=stdin)
        self.assertEqual(status, 0, (argv, out, err))
        return out

    def test_commands(self) -> None:
        url, stomp = self.broker()
        self.assertIn("status: ok", self.ok(url, "health"))
        definitions = Path(self.mktemp_dir()) / "topology.json"
        definitions.write_text(json.dumps({
            "exchanges": [{"vhost": "/", "name": "events", "type": "topic"}],
            "queues": [{"vhost": "/", "name": "orders", "arguments": {"x-max-length": 100}}],
            "bindings": [{"vhost": "/", "source": "events", "destination": "orders", "routing_key": "order.#"}],
        }))
        out = self.ok(url, "import", "definitions", str(definitions))
        self.assertRegex(out, r"queues\s+1\s+0")
        out = self.ok(url, "list", "queues")
        self.assertEqual(out.splitlines()[0].split(), list(("name", "messages_ready", "messages_unacknowledged",
                                                            "consumers", "durable", "auto_delete")))
        self.assertIn("orders", out)
        queues = json.loads(self.ok(url, "--json", "list", "queues"))
        self.assertEqual([q["name"] for q in queues], ["orders"])
        self.assertIn("events", self.ok(url, "list", "exchanges"))
        self.assertRegex(self.ok(url, "list", "bindings"), r"events\s+orders\s+order\.#")
        self.assertRegex(self.ok(url, "list", "vhosts"), r"/\s+1\s+5")
        # A broker without a mesh has no links: the table's head alone.
        self.assertEqual(self.ok(url, "list", "links").split(),
                         ["node", "direction", "state", "rtt_ms", "messages_out", "messages_in", "dropped"])
        self.assertEqual(json.loads(self.ok(url, "--json", "list", "links")), [])
        self.assertRegex(self.ok(url, "list", "users"), r"admin\s+yes\s+config\s+yes")

        # A STOMP client: listed, its message purged, then closed by id.
        sock = socket.create_connection(("127.0.0.1", stomp), timeout=30)
        self.addCleanup(sock.close)
        reader = FrameReader(sock)
        sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "admin",
                                       "passcode": PASSWORD}))
        self.assertEqual(reader.read()[0], "CONNECTED")
        sock.sendall(frame("SEND", {"destination": "/queue/orders", "receipt": "r"}, b"x"))
        self.assertEqual(reader.read()[0], "RECEIPT")
        self.assertIn("purged 1 message(s)", self.ok(url, "purge", "queue", "orders"))
        connections = json.loads(self.ok(url, "--json", "list", "connections"))
        # The HTTP API's own connections have no STOMP user.
        [stomp_conn] = [c for c in connections if c["user"] == "admin"]
        self.assertEqual(stomp_conn["peer"], f"127.0.0.1:{sock.getsockname()[1]}")
        self.assertIn(f"closed connection {stomp_conn['id']}", self.ok(url, "close", "connection", stomp_conn["id"]))
        command, headers, _ = reader.read()
        self.assertEqual(command, "ERROR")
        self.assertIsNone(reader.read())

        # Users and permissions; the new user works with its password.
        self.assertIn("saved", self.ok(url, "add", "user", "carol", "-", stdin="s3cret-carol\n"))
        out = self.ok(url, "set", "permissions", "carol", "--configure", "^carol-", "--read", ".*")
        self.assertRegex(out, r"/\s+carol\s+\^carol-\s+\.\*")
        env = {**os.environ, "QMQ_CTL_USER": "carol", "QMQ_CTL_PASSWORD": "s3cret-carol"}
        listed = subprocess.run([sys.executable, "-m", "qmq.ctl", "--url", url, "--json", "list", "queues"],
                                env={**environment(), **env}, capture_output=True, text=True, timeout=60)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual([q["name"] for q in json.loads(listed.stdout)], ["orders"])
        self.assertIn("carol", self.ok(url, "list", "permissions"))
        self.assertIn("deleted user 'carol'", self.ok(url, "delete", "user", "carol"))
        self.assertIn("deleted queue 'orders'", self.ok(url, "delete", "queue", "orders"))

    def test_definitionsToAFreshBroker(self) -> None:
        """
        Exported from one broker, imported into a fresh one: the second's
        export is the first's.
        """
        first, _ = self.broker()
        topology = Path(self.mktemp_dir()) / "t.json"
        topology.write_text(json.dumps({
            "users": [{"name": "dave", "password_hash": hash_password("d", 4), "certificate_names": ["dave.lan"]}],
            "permissions": [{"vhost": "/", "user": "dave", "configure": "", "write": "^in$", "read": "^out$"}],
            "exchanges": [{"vhost": "/", "name": "fan", "type": "fanout", "durable": False},
                          {"vhost": "/", "name": "hub", "type": "topic"}],
            "queues": [{"vhost": "/", "name": "in", "arguments": {"x-message-ttl": 60000}},
                       {"vhost": "/", "name": "out", "auto_delete": True, "durable": False}],
            "bindings": [{"vhost": "/", "source": "hub", "destination": "fan", "destination_type": "exchange",
                          "routing_key": "#"},
                         {"vhost": "/", "source": "fan", "destination": "out"}],
        }))
        self.ok(first, "import", "definitions", str(topology))
        exported = Path(self.mktemp_dir()) / "exported.json"
        self.ok(first, "export", "definitions", str(exported))
        second, _ = self.broker()
        out = self.ok(second, "import", "definitions", str(exported))
        self.assertRegex(out, r"bindings\s+2\s+0")
        again = json.loads(self.ok(second, "export", "definitions"))
        original = json.loads(exported.read_text())
        # Each broker's admin has its own hash (made at each start).
        for doc in (again, original):
            for user in doc["users"]:
                if user["name"] == "admin":
                    user["password_hash"] = "*"
        self.assertEqual(again, original)
        self.assertEqual([q["name"] for q in again["queues"]], ["in", "out"])
        # Importing it again changes nothing; a conflicting one is refused.
        self.assertRegex(self.ok(second, "import", "definitions", str(exported)), r"queues\s+0\s+2")

    def test_errors(self) -> None:
        """One line on standard error and an exit status, never a traceback."""
        url, _ = self.broker()
        status, out, err = self.ctl(url, "purge", "queue", "nope")
        self.assertEqual((status, out), (1, ""))
        self.assertEqual(err, "qmq-ctl: 404 Not Found: no queue 'nope' in virtual host '/'\n")
        status, _, err = self.ctl(url, "list", "users", auth=False)
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("qmq-ctl: 401 Unauthorized"), err)
        status, _, err = self.ctl(url, "--password", "wrong", "list", "queues")
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("qmq-ctl: 401 Unauthorized"), err)
        status, _, err = self.ctl(f"http://127.0.0.1:{free_port()}", "list", "queues")
        self.assertEqual(status, 3)
        self.assertIn("cannot reach", err)
        status, _, err = self.ctl(url, "list", "things")
        self.assertEqual(status, 2)
        self.assertIn("invalid choice: 'things'", err)
        status, _, err = self.ctl(url, "import", "definitions", "missing.json")
        self.assertEqual((status, err), (1, "qmq-ctl: cannot read missing.json: No such file or directory\n"))
        bad = Path(self.mktemp_dir()) / "bad.json"
        bad.write_text('{"queues": [{"vhost": "/", "name": "q", "durable": "yes"}]}')
        status, _, err = self.ctl(url, "import", "definitions", str(bad))
        self.assertEqual(status, 1)
        self.assertIn("400 Bad Request: queues[0].durable: expected true or false", err)
        status, _, err = self.ctl(url, "add", "user", "x")
        self.assertEqual(status, 2)
        self.assertIn("give a PASSWORD", err)
