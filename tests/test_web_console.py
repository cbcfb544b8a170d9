"""Tests for L{qmq.web.console}: the console's files at C{/console}, the
headers that keep the page to itself, and that nothing it loads or calls is
on another origin. (The page itself is driven in Chromium by
L{tests.integration.test_console}.)
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

from twisted.trial import unittest

from qmq.web.console import CONSOLE
from qmq.web.site import HttpFactory
from tests.test_web_site import Client, make_context, split

ROOT = Path(__file__).resolve().parents[1]


class ConsoleFilesTests(unittest.TestCase):
    def setUp(self) -> None:
        self.client = Client(HttpFactory(make_context()))

    def test_index(self) -> None:
        """C{/console} and C{/console/} are the page, framed by no one, from
        this origin only."""
        for path in ("/console", "/console/", "/console/index.html"):
            status, headers, body = split(self.client.request("GET", path))
            self.assertEqual(status, 200, path)
            self.assertEqual(headers["content-type"], "text/html; charset=utf-8")
            self.assertIn(b"<title>QMQ console</title>", body)
            csp = headers["content-security-policy"]
            self.assertIn("frame-ancestors 'none'", csp)
            self.assertIn("script-src 'self'", csp)
            self.assertIn("connect-src 'self'", csp)
            self.assertEqual(headers["x-frame-options"], "DENY")
            self.assertEqual(headers["referrer-policy"], "no-referrer")

    def test_assets(self) -> None:
        for path, kind in (("/console/console.js", "text/javascript; charset=utf-8"),
                           ("/console/console.css", "text/css; charset=utf-8")):
            status, headers, _ = split(self.client.request("GET", path))
            self.assertEqual((status, headers["content-type"]), (200, kind), path)
            self.assertEqual(headers["x-content-type-options"], "nosniff")

    def test_listedAtRoot(self) -> None:
        _, _, body = split(self.client.request("GET", "/"))
        self.assertIn(b'"/console"', body)

    def test_nothingElse(self) -> None:
        """No other file, no hidden one, no sub-path; GET only."""
        for path in ("/console/missing.js", "/console/.hidden", "/console/a/b.js"):
            status, _, _ = split(self.client.request("GET", path))
            self.assertEqual(status, 404, path)
        status, headers, _ = split(self.client.request(
            "POST", "/console/", b"{}", "Content-Type: application/json\r\n"))
        self.assertEqual(status, 405)
        self.assertEqual(headers["allow"], "GET, HEAD")

    def test_sameOriginOnly(self) -> None:
        """The page loads nothing from elsewhere (it works offline) and its
        script names no other origin: every URL it uses is a path."""
        html = (CONSOLE / "index.html").read_text()
        refs = re.findall(r'(?:src|href)="([^"#]*)"', html)
        self.assertEqual(sorted(refs), ["/console/console.css", "/console/console.js"])
        for name in ("index.html", "console.js", "console.css"):
            text = (CONSOLE / name).read_text()
            self.assertIsNone(re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), name)
            self.assertNotIn("@import", text)

    def test_noCookieNoStorage(self) -> None:
        """The credentials live in the page's memory: the script touches
        neither cookies nor storage, and its requests send no browser
        credentials of their own (so no prompt, no cached login)."""
        js = (CONSOLE / "console.js").read_text()
        for word in ("document.cookie", "localStorage", "sessionStorage", "indexedDB"):
            self.assertNotIn(word, js)
        self.assertIn('credentials: "omit"', js)

    def test_packageData(self) -> None:
        """C{pip install .} ships the console: setup.py's package_data
        names every file of it."""
        tree = ast.parse((ROOT / "setup.py").read_text())
        patterns: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "package_data":
                patterns = ast.literal_eval(node.value)["qmq"]
        files = sorted(p.relative_to(ROOT / "qmq").as_posix() for p in CONSOLE.iterdir())
        self.assertEqual(files, ["web/static/console/console.css", "web/static/console/console.js",
                                 "web/static/console/index.html"])
        for name in files:
            self.assertTrue(any(fnmatch.fnmatch(name, p) and "/" not in name[len(p.rstrip("*")):]
                                for p in patterns), name)
