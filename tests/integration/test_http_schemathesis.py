"""A bounded schemathesis run against a real broker (the service a
configuration file makes, its C{http:} listener on 127.0.0.1), with the
OpenAPI document that broker serves.

Every phase runs: the document's examples, coverage (boundary and negative
values of every parameter and field), fuzzing, and stateful sequences that
follow the document's links (a declared queue's name feeding get, publish,
receive and delete; a received message's handle feeding ack, nack and
extend; a poll's cursor feeding the next poll; a binding feeding its
unbinding) and the links schemathesis infers. Every check is on: no 5xx, every
response as documented (status, content type, headers, schema), every
request the document calls valid accepted and every invalid one refused.
C{tests/integration/schemathesis.toml} says which statuses the broker's state
(not the request) may answer. The SSE stream (an endless response) is left
out. The number of examples is bounded so a run takes well under a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq import config
from qmq.auth import hash_password
from qmq.service import make_service

SETTINGS = Path(__file__).with_name("schemathesis.toml")
#: The admin of the run with authentication: a name the run does not make up.
ADMIN = "fuzz-admin-5b2e"


def _st() -> list[str] | None:
    path = shutil.which("st", path=os.path.dirname(sys.executable)) or shutil.which("st")
    return [path] if path else None


class SchemathesisTests(unittest.TestCase):
    """Every operation but the users' and the SSE stream, without
    authentication."""

    # About 30 s each on a quiet machine; the bounds are for a loaded one.
    timeout = 600
    #: Extra configuration (TOML) of the broker.
    extra = ""

    def setUp(self) -> None:
        self.st = _st()
        if self.st is None:
            raise unittest.SkipTest("schemathesis is not installed (pip install '.[test]')")
        data = Path(self.mktemp())
        # Long polls end within the request timeout: the document's maximum
        # wait is the broker's http_api.max_wait.
        settings = config.load_string(
            'listen = ["http:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(data))}\n"
            "[http_api]\nmax_wait = 1\n" + self.extra
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)
        self.base = f"http://127.0.0.1:{self.service.listeners[0].port.getHost().port}"
        self.service.broker.default_vhost.declare_queue("orders")

    @defer.inlineCallbacks
    def test_no_server_error_no_disagreement(self) -> Any:
        yield self.run_st("--exclude-path-regex", "/events$|/(users|permissions)/")

    @defer.inlineCallbacks
    def run_st(self, *selection: str, examples: int = 5) -> Any:
        command = [
            *self.st, "--config-file", str(SETTINGS), "run", f"{self.base}/api/v1/openapi.json",
            "--url", self.base, "--phases", "examples,coverage,fuzzing,stateful",
            "-n", str(examples), "--seed", "7", "--checks", "all", "--workers", "1",
            *selection,
            "--request-timeout", "10", "--suppress-health-check", "all", "--no-color",
        ]
        workdir = self.mktemp()  # schemathesis leaves a .schemathesis/ directory behind
        os.makedirs(workdir)
        result = yield deferToThread(
            subprocess.run, command, capture_output=True, text=True, timeout=540, cwd=workdir
        )
        out = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, out[-6000:])
        self.assertIn("Stateful", out)
        self.assertNotIn("Schema-valid request rejected", out)


class SchemathesisAuthTests(SchemathesisTests):
    """The users and permissions endpoints with authentication on, as an
    admin (they change the broker's users: a 409 without authentication)."""

    extra = (
        f'admins = "{ADMIN}"\n'
        "[auth]\nfailure_delay = 0.01\nfailure_max_delay = 0.02\n"
        f'[users.{ADMIN}]\npassword = "{hash_password("fuzz-admin", 4)}"\n'
        f'[vhosts."/".permissions.{ADMIN}]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
    )

    @defer.inlineCallbacks
    def test_no_server_error_no_disagreement(self) -> Any:
        # Not the listings of users and permissions (the run without
        # authentication has them): a link from them would feed the admin's
        # own name to PUT and DELETE /users/{user}, and the admin would lock
        # itself out for the rest of the run.
        yield self.run_st("--include-path-regex", "/(users|permissions)/", "--auth", f"{ADMIN}:fuzz-admin",
                          examples=12)
        # The run was the admin's to the end (else it tested 401s).
        response = yield treq.get(f"{self.base}/api/v1/users/{ADMIN}", auth=(ADMIN, "fuzz-admin"),
                                  persistent=False)
        yield response.content()
        self.assertEqual(response.code, 200)
