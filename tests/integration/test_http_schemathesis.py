"""A bounded schemathesis run against the API's served OpenAPI document,
on a real broker site on 127.0.0.1: no 5xx, and every response conforms to
the document (status, content type, schema). The SSE stream (an endless
response) is left out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from tests.web_api_helpers import ApiSiteMixin


def _st() -> list[str] | None:
    path = shutil.which("st", path=os.path.dirname(sys.executable)) or shutil.which("st")
    return [path] if path else None


class SchemathesisTests(ApiSiteMixin, unittest.TestCase):
    timeout = 240

    def setUp(self) -> None:
        self.st = _st()
        if self.st is None:
            raise unittest.SkipTest("schemathesis is not installed (pip install '.[test]')")
        self.start_site()
        vhost = self.broker.default_vhost
        vhost.declare_queue("orders")

    @defer.inlineCallbacks
    def test_no_server_error_no_schema_violation(self) -> None:
        yield self.run_st("--exclude-path-regex", "/events$")

    @defer.inlineCallbacks
    def run_st(self, *selection: str) -> defer.Deferred:
        command = [
            *self.st, "run", f"{self.base}/api/v1/openapi.json", "--url", self.base,
            "--phases", "examples,fuzzing", "-n", "4", "--seed", "7",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
            "response_schema_conformance",
            *selection,
            "--request-timeout", "10", "--suppress-health-check", "all", "--no-color",
        ]
        workdir = self.mktemp()  # schemathesis leaves a .schemathesis/ directory behind
        os.makedirs(workdir)
        result = yield deferToThread(
            subprocess.run, command, capture_output=True, text=True, timeout=200, cwd=workdir
        )
        tail = (result.stdout + result.stderr)[-4000:]
        self.assertEqual(result.returncode, 0, tail)
        self.assertIn("passed", tail)


class SchemathesisAuthTests(SchemathesisTests):
    """The users and permissions endpoints with authentication on, as an
    admin (they change the broker's users: a 409 without authentication)."""

    def setUp(self) -> None:
        super().setUp()
        from twisted.internet import reactor  # noqa: PLC0415

        from qmq.auth import Authenticator, AuthSettings, PermissionSettings, UserSettings  # noqa: PLC0415
        from qmq.auth.passwords import hash_password  # noqa: PLC0415
        from qmq.web.api.settings import ApiSettings  # noqa: PLC0415

        self.broker.auth = Authenticator(
            AuthSettings(failure_delay=0.01, failure_max_delay=0.02), reactor,
            users=[UserSettings("admin", hash_password("fuzz-admin", 4)), UserSettings("alice", None, ("a.example",))],
            permissions={"/": [PermissionSettings("admin", ".*", ".*", ".*")]},
        )
        self.api.settings = self.api.frontend.settings = ApiSettings(admins="admin")

    @defer.inlineCallbacks
    def test_no_server_error_no_schema_violation(self) -> None:
        yield self.run_st("--include-path-regex", "/(users|permissions)", "--auth", "admin:fuzz-admin")
