"""The container image: Dockerfile, .dockerignore, the configuration it
ships (docker/qmq.toml) and its entry point (L{qmq.container}).

No container engine runs on the machines that test QMQ (docs/running.rst,
"Container"), so the Dockerfile is read here instead of built: it installs
the package, declares the data volume that the configuration's data_dir
is, exposes the configuration's ports, runs as a user that is not root,
and starts the entry point.  The entry point is tested for real, with
C{execvp} stood in for: the configuration it writes is what QMQ loads, and
the service it describes refuses to listen on every interface without
users and accepts it with the environment's administrator.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import re
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from qmq import config, container
from qmq.auth import verify_password
from qmq.service import make_service

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "docker" / "qmq.toml"
# A hash of "s3cret" (qmq-passwd --cost 4: quick to check).
HASH = "$scrypt$ln=4,r=8,p=1$es4K7/ufPxWjDGskXjwwzw==$OcHVQH7ZWln7acwNeC0Yg6YGpM/R7XobP8R3f3SMr1E="


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, (KEYWORD, arguments), in order: comments
    dropped, continued lines joined (the default escape character)."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


class DockerfileTests(unittest.TestCase):
    def setUp(self) -> None:
        self.steps = instructions((ROOT / "Dockerfile").read_text(encoding="utf-8"))
        self.keywords = [k for k, _ in self.steps]
        self.shipped = config.load(SHIPPED)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.steps if k == keyword]

    def test_parser(self) -> None:
        """The reader joins continued lines and keeps the order."""
        self.assertEqual(instructions("# c\nFROM a\nRUN x \\\n  # inner\n  && y\nUSER u\n"),
                         [("FROM", "a"), ("RUN", "x  && y"), ("USER", "u")])

    def test_base(self) -> None:
        """One stage, on an official slim Python image QMQ supports."""
        [base] = self.args("FROM")
        m = re.fullmatch(r"python:3\.(\d+)-slim", base)
        self.assertIsNotNone(m, base)
        self.assertGreaterEqual(int(m.group(1)), 11)  # setup.py's python_requires
        self.assertEqual(self.keywords[0], "FROM")

    def test_installs_the_package(self) -> None:
        """The package is installed with pip from the copied tree, and what
        the build needs is copied (and not left out by .dockerignore)."""
        runs = " ".join(self.args("RUN"))
        self.assertRegex(runs, r"pip install \.(\s|$)")
        copied = {shlex.split(a)[0] for a in self.args("COPY")}
        copied |= set(shlex.split(self.args("COPY")[0])[:-1])
        for needed in ("setup.py", "pyproject.toml", "README.rst", "qmq", "twisted",
                       "docker/qmq.toml"):
            self.assertIn(needed, copied)
        ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                   if p.strip() and not p.startswith("#")]
        for path in ("setup.py", "pyproject.toml", "README.rst", "qmq/config.py",
                     "qmq/web/static/qmq.js", "twisted/plugins/qmq_plugin.py", "docker/qmq.toml"):
            hit = [p for p in ignored if fnmatch.fnmatch(path, p.removeprefix("**/"))
                   or path.startswith(p.rstrip("/") + "/")]
            self.assertEqual(hit, [], path)
        self.assertIn(".git", ignored)

    def test_volume_is_the_data_dir(self) -> None:
        """The volume is where the shipped configuration keeps its data."""
        volumes = [v for a in self.args("VOLUME") for v in exec_form(a)]
        self.assertEqual(volumes, ["/var/lib/qmq"])
        self.assertEqual(str(self.shipped.data_dir), "/var/lib/qmq")
        self.assertIn("chown qmq:qmq /var/lib/qmq", " ".join(self.args("RUN")))

    def test_not_root(self) -> None:
        """The broker runs as a user that is not root: the last USER comes
        after every RUN and before the entry point."""
        users = [i for i, k in enumerate(self.keywords) if k == "USER"]
        self.assertTrue(users)
        last = users[-1]
        self.assertNotIn(self.steps[last][1].split(":")[0], ("root", "0"))
        self.assertGreater(last, max(i for i, k in enumerate(self.keywords) if k == "RUN"))
        self.assertLess(last, self.keywords.index("ENTRYPOINT"))

    def test_ports(self) -> None:
        """EXPOSE names the shipped configuration's ports, and its listeners
        are on every interface (the container's)."""
        exposed = sorted(int(p.split("/")[0]) for a in self.args("EXPOSE") for p in a.split())
        ports = {}
        for spec in self.shipped.listen:
            fields = spec.split(":")
            self.assertEqual(fields[1], "tcp", spec)
            self.assertFalse(any(f.startswith("interface=") for f in fields), spec)
            ports[fields[0]] = int(fields[2])
        self.assertEqual(exposed, sorted(ports.values()))
        # Every protocol of the embedded default, on the same ports.
        default = {s.split(":")[0]: int(s.split(":")[2]) for s in config.load().listen}
        self.assertEqual(ports, default)
        health = " ".join(self.args("HEALTHCHECK"))
        self.assertIn(f"127.0.0.1:{ports['http']}/api/v1/health/live", health)

    def test_runs_the_entry_point(self) -> None:
        """The entry point (exec form, so it gets the signals) is
        qmq.container, which becomes twistd -n qmq."""
        self.assertEqual(exec_form(self.args("ENTRYPOINT")[-1]), ["python", "-m", "qmq.container"])
        self.assertEqual(exec_form(self.args("CMD")[-1]), [])
        self.assertEqual(self.args("STOPSIGNAL"), ["SIGTERM"])


class EntryPointTests(unittest.TestCase):
    def setUp(self) -> None:
        self.text = SHIPPED.read_text(encoding="utf-8")
        self.reactor = MemoryReactorClock()

    def service(self, text: str) -> Any:
        """Build (never start) the service the configuration describes."""
        s = config.load_string(text, "qmq.toml")
        s = dataclasses.replace(s, data_dir=Path(self.mktemp()), store="memory")
        return make_service(s, self.reactor)

    def test_shipped_refuses_without_users(self) -> None:
        """As shipped, without an administrator, the image does not start:
        its listeners are on every interface and authentication is off."""
        out = container.configuration({}, self.text, str(SHIPPED))
        e = self.assertRaises(config.ConfigError, self.service, out)
        self.assertIn("not only on loopback", str(e))

    def test_admin_from_hash(self) -> None:
        """QMQ_ADMIN_PASSWORD_HASH: the user, every permission on each
        virtual host, an API admin; the broker then accepts the listeners."""
        out = container.configuration(
            {"QMQ_ADMIN_USER": "root-ops", "QMQ_ADMIN_PASSWORD_HASH": HASH},
            self.text + '\n[[vhosts.shop.queues]]\nname = "orders"\n', "qmq.toml")
        s = config.load_string(out, "qmq.toml")
        self.assertEqual([(u.name, u.password) for u in s.users], [("root-ops", HASH)])
        self.assertEqual(s.section("http_api").admins.split(), ["root-ops"])
        for name in ("/", "shop"):
            [p] = [v for v in s.vhosts if v.name == name][0].permissions
            self.assertEqual((p.user, p.configure, p.write, p.read), ("root-ops", ".*", ".*", ".*"))
        svc = self.service(out)
        self.assertEqual(len(svc.listeners), 3)

    def test_admin_from_file(self) -> None:
        """QMQ_ADMIN_PASSWORD_FILE: the first line, hashed."""
        secret = Path(self.mktemp())
        secret.write_text("s3cret\nignored\n", encoding="utf-8")
        out = container.configuration({"QMQ_ADMIN_PASSWORD_FILE": str(secret)}, self.text, "x")
        [user] = config.load_string(out, "x").users
        self.assertEqual(user.name, "admin")
        self.assertTrue(verify_password("s3cret", user.password))

    def test_refusals(self) -> None:
        """Each bad environment is one message naming the variable."""
        missing = str(Path(self.mktemp()))
        cases = {
            "set one": {"QMQ_ADMIN_PASSWORD_HASH": HASH, "QMQ_ADMIN_PASSWORD_FILE": "/x"},
            "not a password": {"QMQ_ADMIN_PASSWORD_HASH": "s3cret"},
            "not a user name": {"QMQ_ADMIN_USER": "a b", "QMQ_ADMIN_PASSWORD_HASH": HASH},
            "cannot read": {"QMQ_ADMIN_PASSWORD_FILE": missing},
        }
        for expected, environ in cases.items():
            e = self.assertRaises(container.ContainerError, container.configuration,
                                  environ, self.text, "qmq.toml")
            self.assertIn(expected, str(e))
            self.assertIn("QMQ_ADMIN_", str(e))
        e = self.assertRaises(container.ContainerError, container.configuration,
                              {"QMQ_ADMIN_PASSWORD_HASH": HASH},
                              self.text + f'[users.admin]\npassword = "{HASH}"\n', "qmq.toml")
        self.assertIn("already has [users.admin]", str(e))
        # A configuration QMQ refuses: its own message, key and file.
        e = self.assertRaises(container.ContainerError, container.configuration,
                              {}, 'listen = ["nope:tcp:1"]\n[stomp]\nmax_headers = "many"\n',
                              "mine.toml")
        self.assertIn("mine.toml", str(e))
        self.assertIn("stomp.max_headers", str(e))

    def test_main_becomes_twistd(self) -> None:
        """main writes the checked configuration to a private file and
        replaces itself with twistd -n qmq, passing its arguments on."""
        calls = []

        class Replaced(Exception):
            pass

        def execvp(file: str, args: list[str]) -> None:
            calls.append(args)
            raise Replaced()

        self.patch(container.os, "execvp", execvp)
        env = {"QMQ_CONFIG": str(SHIPPED), "QMQ_ADMIN_PASSWORD_HASH": HASH}
        self.assertRaises(Replaced, container.main, ["--listen", "stomp:tcp:1"], env)
        [args] = calls
        self.assertEqual(args[:5] + args[6:],
                         ["twistd", "-n", "--pidfile=", "qmq", "--config", "--listen",
                          "stomp:tcp:1"])
        written = Path(args[5])
        self.addCleanup(written.unlink)
        self.assertEqual(written.stat().st_mode & 0o077, 0)
        self.assertEqual(written.read_text(encoding="utf-8"),
                         container.configuration(env, self.text, str(SHIPPED)))

    def test_main_refuses(self) -> None:
        """A configuration that cannot be read: a message and exit status 2,
        no twistd."""
        self.patch(container.os, "execvp", lambda *a: self.fail("started"))
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        missing = str(Path(self.mktemp()))
        e = self.assertRaises(SystemExit, container.main, [], {"QMQ_CONFIG": missing})
        self.assertEqual(e.code, 2)
        self.assertIn(f"qmq-container: {missing}: cannot read the configuration", err.getvalue())


_keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
_scalars = (st.booleans() | st.integers(-(2**63), 2**63 - 1)
            | st.floats(allow_nan=False) | st.text(st.characters(codec="utf-8"), max_size=12))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_keys, inner, max_size=3), max_leaves=8)


class DumpsTests(unittest.TestCase):
    def test_configurations(self) -> None:
        """The embedded default, the shipped file and docs' security example
        read back equal."""
        for text in (config.default_toml(), SHIPPED.read_text(encoding="utf-8")):
            tree = tomllib.loads(text)
            self.assertEqual(tomllib.loads(container.dumps(tree)), tree)

    @settings(max_examples=200, deadline=None)
    @given(st.dictionaries(_keys, _values, max_size=5))
    def test_round_trip(self, tree: dict) -> None:
        """Any tree of TOML values reads back equal (keys and strings with
        quotes, backslashes, control characters and any Unicode)."""
        self.assertEqual(tomllib.loads(container.dumps(tree)), tree)
