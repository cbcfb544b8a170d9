"""Browser tests: a real headless Chromium against a real broker.

Each test starts QMQ in this process (on trial's reactor) with an C{http:}
listener over TCP or TLS (a C{trustme} test CA) and a STOMP listener, then
runs C{tests/browser/run.mjs} with node: playwright-core drives Debian's
C{/usr/bin/chromium} (never a downloaded browser) through a scenario and
prints one JSON line. Scenarios: C{@stomp/stompjs} over native WebSocket
and over C{sockjs-client} (xhr-streaming, xhr-polling; a binary body refused),
sockjs-client
against the SockJS test services, C{qmq.js} (its reconnection, its SockJS
transports and its fallback to them), a click-through of both example pages
(the task queue with C{examples/worker.py} running as a real worker), and a
page of another site that posts forms to the API (refused, nothing hidden).

Over HTTPS Chromium is told to accept exactly the test server's key
(C{--ignore-certificate-errors-spki-list} with its SPKI hash); nothing else
about certificates is relaxed.

Requirements (C{.ci/run} installs them): the C{chromium} package, node, and
C{npm ci} in C{tests/browser}. A test is skipped, saying why, only when one
of them is missing or Chromium cannot start.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import quoteStringArgument
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest
from twisted.web.server import Site
from twisted.web.static import Data

from qmq import config
from qmq.service import make_service
from tests.integration.certs import TestPKI
from tests.integration.test_workers import WorkersCase

ROOT = Path(__file__).resolve().parents[2]
BROWSER = ROOT / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")
#: Seconds a whole scenario may take (node, Chromium, the pages).
TIMEOUT = 90


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if NODE is None:
        return "no node on PATH (apt-get install nodejs npm)"
    if not (BROWSER / "node_modules" / "playwright-core").is_dir():
        return "tests/browser has no node_modules (run: npm ci --prefix tests/browser)"
    return None


def spki_hash(cert_pem: Path) -> str:
    """The base64 SHA-256 of a certificate's public key (Chromium's SPKI pin)."""
    cert = x509.load_pem_x509_certificate(cert_pem.read_bytes())
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@defer.inlineCallbacks
def run_scenario(test: Any, name: str, base: str, *args: str) -> Any:
    """Run scenario C{name} of C{run.mjs} against C{base}: its JSON result,
    which must say C{ok} (exit 3: Chromium cannot start here, a skip)."""
    d = getProcessOutputAndValue(NODE, [str(BROWSER / "run.mjs"), name, base, *args], env=dict(os.environ),
                                 path=str(BROWSER))
    d.addTimeout(TIMEOUT, reactor)
    out, err, code = yield d
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        test.fail(f"{name}: no result from run.mjs (exit {code}): {err.decode()[-2000:]}")
    if code == 3:
        raise unittest.SkipTest(result["error"])
    test.assertTrue(result.get("ok"), f"{name}: {json.dumps(result)[:3000]}")
    test.assertEqual(code, 0)
    return result


class Scenarios:
    """Runs a scenario of C{tests/browser/run.mjs} in Chromium against
    C{self.base}."""

    tls = False
    spki = ""
    base = ""

    def scenario(self, name: str, *extra: str) -> Any:
        args = list(extra)
        if self.tls:
            args += ["--spki", self.spki]
        screenshots = os.environ.get("QMQ_SCREENSHOTS")
        if screenshots:
            args += ["--screenshots", screenshots]
        return run_scenario(self, name, self.base, *args)


class BrowserMixin(Scenarios):
    """Starts the broker; runs a scenario in Chromium."""

    reason = missing()
    skip = reason

    def setUp(self) -> Any:
        pki = TestPKI(self.mktemp())  # type: ignore[attr-defined]
        self.spki = spki_hash(pki.server_cert)
        if self.tls:
            params = ":".join(
                f"{k}={quoteStringArgument(str(v))}"
                for k, v in (("privateKey", pki.server_key), ("certKey", pki.server_cert),
                             ("interface", "127.0.0.1"))
            )
            http = f"http:ssl:0:{params}"
        else:
            http = "http:tcp:0:interface=127.0.0.1"
        data = Path(self.mktemp())  # type: ignore[attr-defined]
        settings = config.load_string(
            f"listen = [{json.dumps(http)}, \"stomp:tcp:0:interface=127.0.0.1\"]\n"
            f"data_dir = {json.dumps(str(data))}\n"
            "[web]\nexamples = true\n"
            # A closed SockJS session lingers this long (the protocol's
            # answer to a late poll); the test waits it out at the end.
            "[sockjs]\ndisconnect_delay = 1.0\ntest_services = true\n"
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.stop)  # type: ignore[attr-defined]
        web, stomp = self.service.listeners
        scheme = "https" if self.tls else "http"
        self.base = f"{scheme}://127.0.0.1:{web.port.getHost().port}/"
        self.stomp_port = stomp.port.getHost().port

    @defer.inlineCallbacks
    def stop(self) -> Any:
        yield self.service.stopService()
        # The queues' expiry deadlines (an hour) are the broker's last timers.
        for vhost in self.service.broker.vhosts.values():
            if vhost.expiry is not None:
                vhost.expiry.stop()
        # Closed SockJS sessions expire disconnect_delay after their end.
        deadline = reactor.seconds() + 10
        while reactor.seconds() < deadline and any(
            "SockJS" in getattr(call.func, "__qualname__", "") for call in reactor.getDelayedCalls()
        ):
            yield task.deferLater(reactor, 0.1, lambda: None)

    def start_worker(self) -> None:
        """Run examples/worker.py against the STOMP listener until the test ends."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "worker.py"), "--port", str(self.stomp_port),
             "--delay", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def stop() -> None:
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(10)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()

        self.addCleanup(stop)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_stompjs(self) -> Any:
        """@stomp/stompjs over native WebSocket at /ws: queue, topic, UTF-8, binary, 70 KB."""
        result = yield self.scenario("stompjs")
        self.assertEqual(result["version"], "1.2")  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_sockjsXhrStreaming(self) -> Any:
        """@stomp/stompjs over sockjs-client with WebSocket disabled: xhr-streaming."""
        result = yield self.scenario("sockjs-xhr-streaming")
        self.assertEqual(result["transport"], "xhr-streaming")  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_sockjsXhrPolling(self) -> Any:
        """@stomp/stompjs over sockjs-client with WebSocket disabled: xhr-polling."""
        result = yield self.scenario("sockjs-xhr-polling")
        self.assertEqual(result["transport"], "xhr-polling")  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_sockjsBinaryBody(self) -> Any:
        """Issue 22: a body that is not UTF-8 (published over HTTP) reaches
        stomp.js over sockjs-client as an ERROR, not as a mangled MESSAGE
        that desynchronises its parser; it stays queued and arrives intact
        over /ws."""
        result = yield self.scenario("sockjs-binary")
        self.assertEqual(result["close"], [3000, "binary body"])  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_sockjsServices(self) -> Any:
        """sockjs-client against the SockJS test services (echo, cookie, close)."""
        yield self.scenario("sockjs-services")

    @defer.inlineCallbacks
    def test_qmqjs(self) -> Any:
        """qmq.js: receipts, client acks with a prefetch, request/reply."""
        yield self.scenario("qmqjs")

    @defer.inlineCallbacks
    def test_qmqjsReconnect(self) -> Any:
        """qmq.js: a cut connection comes back, subscribed again; a send waits for it."""
        yield self.scenario("qmqjs-reconnect")

    @defer.inlineCallbacks
    def test_qmqjsTransaction(self) -> Any:
        """qmq.js transactions: sends in an aborted transaction never
        arrive, committed ones do, at the commit; acks likewise."""
        result = yield self.scenario("qmqjs-transaction")
        self.assertEqual(result["beforeCommit"], ["plain"])  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_qmqjsXhrStreaming(self) -> Any:
        """qmq.js over SockJS xhr-streaming (/sockjs)."""
        yield self.scenario("qmqjs-xhr-streaming")

    @defer.inlineCallbacks
    def test_qmqjsXhrPolling(self) -> Any:
        """qmq.js over SockJS xhr-polling."""
        yield self.scenario("qmqjs-xhr-polling")

    @defer.inlineCallbacks
    def test_qmqjsFallback(self) -> Any:
        """qmq.js falls back to xhr-streaming when its WebSocket cannot open."""
        yield self.scenario("qmqjs-fallback")

    @defer.inlineCallbacks
    def test_chat(self) -> Any:
        """The chat example, clicked through by two people."""
        yield self.scenario("chat")

    @defer.inlineCallbacks
    def test_crossSiteForm(self) -> Any:
        """A page of another site (evil.test, mapped to 127.0.0.1, on a port
        of its own) posts real HTML forms (each encoding) and no-cors
        fetches to a queue's receive: every one is refused (403 or 415), and
        the broker's own page then receives all the messages (on d8fe3b8 the
        first form hid them for 12 hours)."""
        page = Data(b"<!doctype html><title>elsewhere</title><p>Another site.</p>", "text/html")
        port = reactor.listenTCP(0, Site(page), interface="127.0.0.1")
        self.addCleanup(port.stopListening)  # type: ignore[attr-defined]
        evil = f"http://evil.test:{port.getHost().port}/"
        result = yield self.scenario("cross-site-form", "--evil", evil)
        self.assertEqual(result["received"], ["a", "b", "c"])  # type: ignore[attr-defined]
        # Each carried the other site's Origin (a form's is seen here; a
        # no-cors fetch's only by the broker), and the broker refused it: a
        # form body alone would have been a 415.
        self.assertEqual([a["status"] for a in result["attempts"]], [403] * 5)  # type: ignore[attr-defined]
        self.assertEqual([a["origin"] for a in result["attempts"][:3]], [evil.rstrip("/")] * 3)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_consoleOpen(self) -> Any:
        """The console without authentication: no login, every tab; a STOMP
        client over WebSocket is listed and closed from the Connections tab
        (it gets an ERROR, then the close). With authentication:
        L{tests.integration.test_console}."""
        result = yield self.scenario("console-open")
        self.assertEqual(result["tabs"], ["Overview", "Queues", "Exchanges", "Connections", "Links", "Users"])  # type: ignore[attr-defined]
        self.assertEqual(result["closed"][0], 1000)  # type: ignore[attr-defined]

    @defer.inlineCallbacks
    def test_tasks(self) -> Any:
        """The live task queue example with examples/worker.py as the worker."""
        self.start_worker()
        yield self.scenario("tasks")


class HTTPTests(BrowserMixin, unittest.TestCase):
    """Over http:// and ws://."""


class HTTPSTests(BrowserMixin, unittest.TestCase):
    """Over https:// and wss://, the server's certificate from a test CA."""

    tls = True


class WorkersTests(Scenarios, WorkersCase):
    """SockJS's HTTP transports against C{twistd qmq --workers 2}: Chromium's
    requests of one session go over several connections, which the kernel
    spreads over the workers; the session's worker takes them all
    (relayed: qmq.web.sockjs.relay)."""

    reason = missing()
    skip = reason
    extra = '\n[web]\nexamples = true\n\n[sockjs]\ndisconnect_delay = 1.0\n'

    def setUp(self) -> None:
        super().setUp()
        self.base = f"http://127.0.0.1:{self.http_port}/"

    @defer.inlineCallbacks
    def test_sockjsXhrStreaming(self) -> Any:
        result = yield self.scenario("sockjs-xhr-streaming")
        self.assertEqual(result["transport"], "xhr-streaming")

    @defer.inlineCallbacks
    def test_sockjsXhrPolling(self) -> Any:
        result = yield self.scenario("sockjs-xhr-polling")
        self.assertEqual(result["transport"], "xhr-polling")

    @defer.inlineCallbacks
    def test_qmqjsXhrPolling(self) -> Any:
        """qmq.js over SockJS xhr-polling: receipts, acks, request/reply."""
        yield self.scenario("qmqjs-xhr-polling")
