"""The shell examples of the documentation run as written.

- docs/ctl.rst: every C{$} line of its console blocks runs, in order, in
  bash against a real C{twistd -n qmq} configured as the page says (the
  user admin), with C{QMQ_CTL_URL} pointing at it and C{qmq-ctl} on the
  C{PATH} (this tree's, through C{python -m qmq.ctl}); what it prints
  (standard output and error) is what the page shows, a line ending in
  C{...} matching by its beginning.
- Every C{twistd ... qmq ...} command in docs/*.rst and README.rst: its
  options parse and the broker it describes builds and starts on a memory
  reactor (so a listener the start-up checks refuse, such as one on every
  interface without users, fails here), with the files it names made up
  (configurations with a user, TLS keys and certificates).

The curl examples of docs/http-api.rst run in L{tests.test_web_api_docs}.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from qmq import config, tap
from qmq.auth.passwords import hash_password
from qmq.service import make_service
from tests.integration import test_twistd
from tests.integration.certs import TestPKI
from tests.integration.test_twistd import environment, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

ADMIN_CONFIG = """
[users.admin]
password = "{hash}"

[vhosts."/".permissions.admin]
configure = ".*"
write = ".*"
read = ".*"

[http_api]
admins = "admin"
"""


def console_examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected lines) of every C{$ } line of the page's
    C{console} blocks; the expected lines are those up to the next command
    or the block's end."""
    out: list[tuple[str, list[str]]] = []
    in_block = False
    directive = indent = ""
    for line in text.splitlines():
        if line.strip().startswith(".. code-block:: console"):
            in_block, indent = True, ""
            directive = line[: len(line) - len(line.lstrip())]
            continue
        if not in_block:
            continue
        if not line.strip():
            continue
        if not indent:
            indent = line[: len(line) - len(line.lstrip())]
            if len(indent) <= len(directive):
                in_block = False
                continue
        if not line.startswith(indent):
            in_block = False
            continue
        body = line[len(indent):]
        if body.startswith("$ "):
            out.append((body[2:], []))
        elif out:
            out[-1][1].append(body)
    return out


def twistd_commands(text: str) -> list[list[str]]:
    """Every C{twistd} command of a page's literal blocks, with its
    continuation lines, as argv (from C{twistd})."""
    commands = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("$ "):
            line = line[2:]
        # "twistd qmq: ..." is an error message the page quotes.
        if line.startswith("twistd ") and " qmq" in line and not line.startswith("twistd qmq:"):
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            commands.append(shlex.split(line, comments=True))
        i += 1
    return commands


class CtlExamplesTests(unittest.TestCase):
    start = test_twistd.TwistdTests.start
    output = test_twistd.TwistdTests.output
    connect = test_twistd.TwistdTests.connect

    def test_ctl_page(self) -> None:
        examples = console_examples((DOCS / "ctl.rst").read_text(encoding="utf-8"))
        self.assertGreater(len(examples), 15)
        conf = Path(self.mktemp()).resolve()
        conf.write_text(ADMIN_CONFIG.format(hash=hash_password("Adm1n-pass", 4)))
        http = free_port()
        process = self.start("--config", str(conf), "--listen", f"http:tcp:{http}:interface=127.0.0.1")
        self.connect(process, http).close()
        bin_dir = Path(self.mktemp()).resolve()
        bin_dir.mkdir()
        script = bin_dir / "qmq-ctl"
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m qmq.ctl "$@"\n')
        script.chmod(0o755)
        env = environment()
        for name in ("QMQ_CTL_USER", "QMQ_CTL_PASSWORD", "QMQ_CTL_TOKEN"):
            env.pop(name, None)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["QMQ_CTL_URL"] = f"http://127.0.0.1:{http}"
        workdir = Path(self.mktemp()).resolve()
        workdir.mkdir()
        exports: list[str] = []
        for command, expected in examples:
            if command.startswith("export "):
                exports.append(command)
                continue
            result = subprocess.run(
                ["bash", "-c", "; ".join([*exports, command])], capture_output=True, text=True,
                env=env, cwd=workdir, timeout=60,
            )
            actual = (result.stdout + result.stderr).splitlines()
            self.assertNotIn("Traceback", result.stderr, command)
            if any(line.startswith("qmq-ctl:") for line in expected):
                self.assertNotEqual(result.returncode, 0, command)
            else:
                self.assertEqual(result.returncode, 0, (command, result.stdout, result.stderr))
            self.assertEqual(len(actual), len(expected), (command, actual))
            for want, got in zip(expected, actual, strict=True):
                if want.endswith("..."):
                    self.assertTrue(got.startswith(want[:-3]), (command, got))
                else:
                    self.assertEqual(got.rstrip(), want.rstrip(), command)


class CurlElsewhereTests(unittest.TestCase):
    """The curl examples outside docs/http-api.rst (whose own test runs
    those): every C{$ curl} line of the other pages, and README's, against
    a real C{twistd -n qmq} with the default configuration's listeners
    moved to free ports (the address the page names, 127.0.0.1:8080 or
    the default 127.0.0.1:15674, put in for the broker's)."""

    start = test_twistd.TwistdTests.start
    output = test_twistd.TwistdTests.output
    connect = test_twistd.TwistdTests.connect

    def test_curl(self) -> None:
        if shutil.which("curl") is None:
            raise unittest.SkipTest("curl is not installed")
        cases: list[tuple[str, str, list[str]]] = []
        for page in sorted(DOCS.glob("*.rst")):
            if page.name == "http-api.rst":
                continue
            cases += [(page.name, c, e) for c, e in console_examples(page.read_text("utf-8")) if c.startswith("curl ")]
        readme = (ROOT / "README.rst").read_text("utf-8")
        block = re.search(r"^ +(curl .*?)(?:\n\n)", readme, re.M | re.S)
        self.assertIsNotNone(block, "README shows a curl command")
        cases.append(("README.rst", " ".join(block.group(1).replace("\\\n", " ").split()), []))
        self.assertGreaterEqual(len(cases), 2)
        stomp, http = free_port(), free_port()
        process = self.start(
            "--listen", f"stomp:tcp:{stomp}:interface=127.0.0.1", "--listen", f"http:tcp:{http}:interface=127.0.0.1"
        )
        self.connect(process, http).close()
        for page, command, expected in cases:
            run = command.replace("127.0.0.1:8080", f"127.0.0.1:{http}").replace("127.0.0.1:15674", f"127.0.0.1:{http}")
            result = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, (page, command, result.stderr))
            answer = json.loads(result.stdout)
            if expected:
                self.assertEqual(answer, json.loads("\n".join(expected)), (page, command))
            else:  # README's publish, which shows no answer
                self.assertEqual(answer["published"], 1, (page, command, answer))


class TwistdExamplesTests(unittest.TestCase):
    """Every C{twistd ... qmq} command in the docs builds and starts."""

    def test_every_command(self) -> None:
        pages = sorted(DOCS.glob("*.rst")) + [ROOT / "README.rst"]
        commands = [(page.name, argv) for page in pages for argv in twistd_commands(page.read_text("utf-8"))]
        self.assertGreater(len(commands), 10)
        directory = Path(self.mktemp()).resolve()
        pki = TestPKI(directory)
        users = (
            'store = "memory"\n[users.admin]\npassword = "{}"\n'
            '[vhosts."/".permissions.admin]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
        ).format(hash_password("s3cret", 4))
        files = {".toml": users, ".pem": None}
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(directory)
        checked = 0
        failures = []
        for page, argv in commands:
            self.assertEqual(argv[0], "twistd", (page, argv))
            args = argv[argv.index("qmq") + 1 :]
            if {"--help", "--version", "--print-default-config"} & set(args):
                continue
            args = [self.local(a, directory, pki, files) for a in args]
            options = tap.Options()
            try:
                options.parseOptions(args)
            except SystemExit as e:  # a configuration the broker refuses
                failures.append(f"{page}: {' '.join(argv)}: exited {e.code}")
                continue
            settings = config.dataclasses.replace(options["settings"], data_dir=directory / "data", store="memory")
            try:
                service = make_service(settings, MemoryReactorClock())
            except config.ConfigError as e:
                failures.append(f"{page}: {' '.join(argv)}: {str(e)[:200]}")
                continue
            service.privilegedStartService()
            service.startService()
            self.assertTrue(all(listener.port is not None for listener in service.listeners), (page, argv))
            service.stopService()
            checked += 1
        self.assertEqual(failures, [])
        self.assertGreater(checked, 10)

    @staticmethod
    def local(arg: str, directory: Path, pki: TestPKI, files: dict[str, str | None]) -> str:
        """The argument with each file it names made up in C{directory}:
        a C{.toml} is a configuration with a user; C{key.pem},
        C{cert.pem}, C{ca.pem} are the test PKI's."""
        def path(name: str) -> str:
            base = Path(name).name
            if base.endswith(".toml"):
                target = directory / base
                if not target.exists():
                    target.write_text(files[".toml"] or "")
                return str(target)
            if base.endswith((".pem", ".key", ".crt")):
                if "ca" in base or "client" in base:
                    return str(pki.ca_pem)
                return str(pki.server_key if "key" in base else pki.server_cert)
            return name

        if arg.startswith("/") or arg.endswith(".toml"):
            return path(arg)
        return re.sub(r"(?<=[=])([^:=]+\.(?:pem|key|crt))", lambda m: path(m.group(1)), arg)
