"""The health checks (L{qmq.web.api.health}) with a broker on a Clock and
fakes: an alarm, a store that failed, a listener that is not bound; and the
handlers' answers through the API resource."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.web.api.health import CHECKS, readiness, run_check
from tests.web_api_helpers import ApiSiteMixin


class _Host:
    def __init__(self, port: int) -> None:
        self.port = port


class _Port:
    def __init__(self, port: int) -> None:
        self._host = _Host(port)

    def getHost(self) -> _Host:
        return self._host


class _Listener:
    def __init__(self, protocol: str, port: int | None) -> None:
        self.protocol = protocol
        self.spec = f"{protocol}:tcp:{port or 0}:interface=127.0.0.1"
        self.port = _Port(port) if port is not None else None


class _FailedStore:
    failure = "writing the commit log failed: [Errno 28] No space left on device"


class ChecksTests(unittest.TestCase):
    def setUp(self) -> None:
        self.broker = Broker(Clock())
        self.broker.listeners = [_Listener("stomp", 61613), _Listener("http", 15674)]

    def test_all_pass(self) -> None:
        ready, body = readiness(self.broker)
        self.assertTrue(ready)
        self.assertEqual(body, {"status": "ok", "checks": {
            "listeners": {"ok": True}, "store": {"ok": True}, "alarms": {"ok": True, "alarms": []}}})

    def test_no_listeners_configured(self) -> None:
        """A broker of a tool or a test, with no listener: nothing to bind."""
        self.broker.listeners = []
        self.assertEqual(run_check(self.broker, "listeners"), (True, {"listeners": []}))

    def test_listener_missing(self) -> None:
        self.broker.listeners[1] = _Listener("http", None)
        ready, body = readiness(self.broker)
        self.assertFalse(ready)
        self.assertEqual((body["status"], body["checks"]["listeners"]), ("failing", {"ok": False}))
        self.assertTrue(body["checks"]["store"]["ok"])
        ok, details = run_check(self.broker, "listeners")
        self.assertFalse(ok)
        self.assertEqual([(r["protocol"], r["port"], r["listening"]) for r in details["listeners"]],
                         [("stomp", 61613, True), ("http", None, False)])

    def test_alarm(self) -> None:
        self.broker.admission.hold("memory", "memory alarm: 2.0 GiB resident, above the high-water mark")
        ready, body = readiness(self.broker)
        self.assertFalse(ready)
        self.assertEqual(body["checks"]["alarms"], {"ok": False, "alarms": ["memory"]})
        # The anonymous answer names the alarm, never its text.
        self.assertNotIn("GiB", repr(body))
        ok, details = run_check(self.broker, "alarms")
        self.assertEqual((ok, details["alarms"][0]["detail"]),
                         (False, "memory alarm: 2.0 GiB resident, above the high-water mark"))
        self.broker.admission.release("memory")
        self.assertTrue(readiness(self.broker)[0])

    def test_store_failure(self) -> None:
        self.broker.store = _FailedStore()
        ready, body = readiness(self.broker)
        self.assertFalse(ready)
        self.assertEqual(body["checks"]["store"], {"ok": False})
        self.assertNotIn("Errno", repr(body))
        self.assertEqual(run_check(self.broker, "store"), (False, {"failure": _FailedStore.failure}))

    def test_names(self) -> None:
        self.assertEqual(list(CHECKS), ["listeners", "store", "alarms"])
        with self.assertRaises(KeyError):
            run_check(self.broker, "nothing")


class HandlerTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.start_site()

    @defer.inlineCallbacks
    def test_answers(self) -> Any:
        code, headers, _, doc = yield self.call("GET", "/api/v1/health/ready")
        self.assertEqual((code, doc["status"]), (200, "ok"))
        self.broker.admission.hold("disk", "disk alarm", persistent_only=True)
        for path in ("/api/v1/health/ready", "/api/v1/health"):
            code, headers, _, doc = yield self.call("GET", path)
            self.assertEqual((code, doc["status"], doc["checks"]["alarms"]["alarms"]), (503, "failing", ["disk"]))
            self.assertEqual(headers.getRawHeaders("retry-after"), ["5"])
        code, _, _, doc = yield self.call("GET", "/api/v1/health/live")
        self.assertEqual((code, doc), (200, {"status": "ok"}))
        code, _, _, doc = yield self.call("GET", "/api/v1/health/checks/alarms")
        self.assertEqual((code, doc["check"], doc["ok"], doc["alarms"][0]["persistent_only"]),
                         (503, "alarms", False, True))
        code, _, _, doc = yield self.call("GET", "/api/v1/health/checks/store")
        self.assertEqual((code, doc), (200, {"check": "store", "ok": True, "failure": None}))
        code, _, _, doc = yield self.call("GET", "/api/v1/health/checks/port-listener/0")
        self.assertEqual(code, 400)
