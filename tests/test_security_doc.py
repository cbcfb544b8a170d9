"""docs/security.rst's deployment, run as written.

The shell commands make the CA, the certificates, the token secret and a
password hash (openssl, qmq-passwd); the configuration is loaded as the page
shows it (only its listeners moved to 127.0.0.1 and free ports, as the page
says); the broker starts from it; and the page's Python clients run as
separate processes (their host and ports substituted the same way).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import stomp
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from qmq import config
from qmq.auth import verify_password
from qmq.service import make_service

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.rst"

_BLOCK = re.compile(
    r"^\.\. code-block:: (?P<lang>\w+)\n(?:   :caption: (?P<caption>\S+)\n)?\n(?P<body>(?:(?:    .*)?\n)+)",
    re.M,
)


def blocks() -> list[tuple[str, str | None, str]]:
    """The code blocks of the deployment section: (language, caption, text)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("A deployment, end to end") :]
    section = section[: section.index("\nThe API for frontends")]
    found = []
    for m in _BLOCK.finditer(section):
        body = "\n".join(line[4:] for line in m["body"].splitlines()).strip() + "\n"
        found.append((m["lang"], m["caption"], body))
    return found


class SecurityDocTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        self.dir = Path(self.mktemp()).resolve()
        self.dir.mkdir(parents=True)
        self.env = dict(
            os.environ,
            PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            PYTHONPATH=str(ROOT),
        )

    def shell(self, text: str) -> None:
        for line in text.splitlines():
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", line],
                cwd=self.dir,
                env=self.env,
                capture_output=True,
                timeout=60,
            )
            self.assertEqual(done.returncode, 0, f"{line}\n{done.stderr.decode()}")

    def run_script(self, name: str, text: str, ports: dict[int, int]) -> defer.Deferred:
        text = text.replace('"broker.example.org"', '"127.0.0.1"')
        for documented, actual in ports.items():
            text = text.replace(str(documented), str(actual))
        (self.dir / name).write_text(text)
        return getProcessOutputAndValue(
            sys.executable, [name], env=self.env, path=str(self.dir), reactor=reactor
        )

    @defer.inlineCallbacks
    def test_deployment_as_written(self):
        found = blocks()
        shells = [b for lang, _, b in found if lang == "shell"]
        files = {caption: b for _, caption, b in found if caption}
        self.assertEqual(len(shells), 2)
        self.assertEqual(
            set(files), {"qmq.toml", "billing.py", "alice.py", "issue_token.py"}
        )

        # 1. The CA, the certificates, the token secret, the password hash.
        self.shell(shells[0])
        self.shell(shells[1])
        printed = (self.dir / "alice.hash").read_text().strip()
        self.assertTrue(verify_password("s3cret-alice", printed))
        documented = re.search(r'password = "(.*)"', files["qmq.toml"])[1]
        self.assertTrue(verify_password("s3cret-alice", documented))

        # 2. The configuration as written; the listeners moved to loopback.
        (self.dir / "qmq.toml").write_text(files["qmq.toml"])
        cwd = os.getcwd()
        os.chdir(self.dir)  # the page's paths are relative to the broker's directory
        self.addCleanup(os.chdir, cwd)
        settings = config.load("qmq.toml")
        documented_ports = [int(spec.split(":")[2]) for spec in settings.listen]
        self.assertEqual(documented_ports, [61613, 61614])
        self.assertTrue(all("interface=0.0.0.0" in spec for spec in settings.listen))
        listen = [
            re.sub(r"^(stomp:\w+:)\d+", r"\g<1>0", spec).replace(
                "interface=0.0.0.0", "interface=127.0.0.1"
            )
            for spec in settings.listen
        ]
        settings = replace(settings, listen=listen, data_dir=self.dir / "data")
        service = make_service(settings, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        os.chdir(cwd)
        ports = {
            61613: service.listeners[0].port.getHost().port,
            61614: service.listeners[1].port.getHost().port,
        }

        # 3. billing sends with its certificate, alice takes it with her password.
        out, err, code = yield self.run_script("billing.py", files["billing.py"], ports)
        self.assertEqual(code, 0, err.decode())
        out, err, code = yield self.run_script("alice.py", files["alice.py"], ports)
        self.assertEqual(code, 0, err.decode())
        self.assertEqual(out.decode().strip(), "order 1")

        # 4. A token from the shop's web server lets a page chat, and only chat.
        out, err, code = yield self.run_script("issue_token.py", files["issue_token.py"], ports)
        self.assertEqual(code, 0, err.decode())
        token = out.decode().strip()
        errors = yield deferToThread(self.token_client, ports[61613], token)
        self.assertEqual(errors, ["access refused (write)"])

        # 5. A wrong password is refused.
        errors = yield deferToThread(self.password_client, ports[61613], "s3cret-bob")
        self.assertEqual(errors, ["access refused"])

    @staticmethod
    def collect(conn) -> list:
        errors: list = []

        class Listener(stomp.ConnectionListener):
            def on_error(self, frame):
                errors.append(frame.headers["message"])

        conn.set_listener("", Listener())
        return errors

    def token_client(self, port: int, token: str) -> list[str]:
        conn = stomp.Connection12([("127.0.0.1", port)], vhost="shop")
        errors = self.collect(conn)
        conn.connect(passcode=token, wait=True)
        conn.send("/topic/chat.lobby", "hello", receipt="ok")
        conn.send("/topic/news", "spam", receipt="no")
        self.wait(lambda: errors or not conn.is_connected())
        conn.disconnect()
        return errors

    def password_client(self, port: int, password: str) -> list[str]:
        conn = stomp.Connection12([("127.0.0.1", port)], vhost="shop")
        errors = self.collect(conn)
        try:
            conn.connect("alice", password, wait=True, timeout=5)
        except Exception:
            pass
        self.wait(lambda: errors)
        return errors

    @staticmethod
    def wait(predicate, timeout: float = 10.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("timed out")
            time.sleep(0.02)
