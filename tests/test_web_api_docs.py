"""docs/http-api.rst: every curl example runs as written, in order, against
a fresh broker (its address put in for 127.0.0.1:15674), and prints what the
page says (receipt handles and cursors are the broker's own)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.core.ids import MessageIds
from tests.web_api_helpers import ApiSiteMixin

PAGE = Path(__file__).parent.parent / "docs" / "http-api.rst"
DOC_ADDRESS = "127.0.0.1:15674"
DOC_TOKEN = "qmq-3f9a1c07.10apws3z0g1.Zt3kQ1nA"
#: The node id of the page's message ids.
DOC_NODE = "qmq-3f9a1c07"


def examples(text: str) -> list[tuple[str, str]]:
    """(command, expected output) of every C{$ curl} line of the page."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("$ curl"):
            expected = lines[i + 1].strip() if i + 1 < len(lines) else ""
            out.append((stripped[2:], "" if expected.startswith("$") else expected))
    return out


def _masked(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: ("*" if k in ("cursor", "handle", "timestamp") else _masked(v)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_masked(v) for v in doc]
    return doc


#: The examples with credentials run against a broker with authentication
#: on (users admin and the ones they make); the others against one without.
WITH_AUTH = " -u "


class CurlExamplesTests(ApiSiteMixin, unittest.TestCase):
    auth = False

    def setUp(self) -> None:
        if shutil.which("curl") is None:
            raise unittest.SkipTest("curl is not installed")
        # The page shows a broker's first messages: ids from 1, as a broker
        # on a clock at the epoch gives them (a real one starts at its time
        # floor, qmq.core.ids).
        broker = Broker(reactor, node=DOC_NODE)
        broker.message_ids = MessageIds(1, broker.node)
        self.start_site(broker=broker)

    @defer.inlineCallbacks
    def test_examples(self) -> None:
        cases = [(c, e) for c, e in examples(PAGE.read_text(encoding="utf-8")) if (WITH_AUTH in c) == self.auth]
        self.assertGreater(len(cases), 5)
        address = self.base.split("//", 1)[1]
        token = None
        for command, expected in cases:
            run = command.replace(DOC_ADDRESS, address)
            if token is not None:
                run = run.replace(DOC_TOKEN, token)
            result = yield deferToThread(
                subprocess.run, ["bash", "-c", run], capture_output=True, text=True, timeout=20
            )
            self.assertEqual(result.returncode, 0, (command, result.stderr))
            actual = result.stdout.strip()
            handles = re.findall(r'"handle":"([^"]+)\.[0-9]+"', actual)
            if handles:
                token = handles[0]
            if "..." in expected:
                prefix = expected.split("...", 1)[0]
                self.assertTrue(actual.startswith(prefix), (command, actual[:300]))
                continue
            self.assertEqual(_masked(json.loads(actual)), _masked(json.loads(expected)), command)


class CurlAuthExamplesTests(CurlExamplesTests):
    auth = True

    def setUp(self) -> None:
        super().setUp()
        from twisted.internet import reactor  # noqa: PLC0415

        from qmq.auth import Authenticator, AuthSettings, PermissionSettings, UserSettings  # noqa: PLC0415
        from qmq.auth.passwords import hash_password  # noqa: PLC0415
        from qmq.web.api.settings import ApiSettings  # noqa: PLC0415

        self.broker.auth = Authenticator(
            AuthSettings(), reactor, users=[UserSettings("admin", hash_password("Adm1n-pass", 4))],
            permissions={"/": [PermissionSettings("admin", ".*", ".*", ".*")]},
        )
        self.api.settings = self.api.frontend.settings = ApiSettings(admins="admin")
