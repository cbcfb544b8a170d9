"""A real full disk: a 16 MiB tmpfs holds the data directory of a real
broker (commit-log store), filled with a ballast file, then emptied.

  - the disk alarm: below ``limits.disk_free_limit`` persistent publishes
    are held back (STOMP not read, HTTP 503 ``alarm: disk``), others go on,
    and they resume once space is freed;
  - the store's own refusal when the disk fills between samples (the alarm
    off): stomp.py gets ``ERROR message not stored``, HTTP 503 ``not-stored``
    (without ``published``), then admission holds persistent publishers; once
    space returns the store writes again by itself (logged), and after a
    restart every message that was receipted is there.

Mounting needs root: the tests skip, saying so, where it is not allowed
(tests/test_store_full.py injects ENOSPC and always runs). Every wait has a
deadline.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from qmq import config
from qmq.service import make_service
from qmq.store.failure import StoreFailed
from tests.integration.test_admission import TIMEOUT, BrokerTestCase

MiB = 1 << 20


def mount_tmpfs(test: unittest.TestCase, size: str = "16m") -> str:
    """A fresh tmpfs of C{size} for C{test}, unmounted in its cleanup."""
    directory = os.path.abspath(test.mktemp())
    os.makedirs(directory)
    if os.geteuid() != 0:
        raise unittest.SkipTest("mounting a tmpfs needs root (the ENOSPC unit tests always run)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", directory],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise unittest.SkipTest(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    test.addCleanup(subprocess.run, ["umount", "-l", directory], capture_output=True, timeout=30)
    return directory


class FullDiskCase(BrokerTestCase):
    store = "log"
    limit = "0"

    def data_directory(self) -> str:
        self.mount = mount_tmpfs(self)
        return os.path.join(self.mount, "data")

    def more_config(self) -> str:
        return (f'[limits]\ndisk_free_limit = "{self.limit}"\n'
                "[commit_log]\nsegment_size = 1048576\n")

    def setUp(self) -> None:
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        super().setUp()
        self.ballast = os.path.join(self.mount, "ballast")

    def free(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """Grow the ballast until C{leave} bytes are free."""
        with open(self.ballast, "ab") as f:
            while self.free() > leave:
                f.write(b"\0" * min(MiB, self.free() - leave))
                f.flush()

    def empty(self) -> None:
        os.unlink(self.ballast)

    def logged(self, text: str) -> list[dict]:
        return [e for e in self.events if text in (e.get("log_format") or "")]


class DiskAlarmTests(FullDiskCase):
    limit = "4MiB"

    @defer.inlineCallbacks
    def test_alarm_holds_persistent_publishers(self) -> Any:
        alarm = self.service.disk_alarm
        self.assertEqual(alarm.limit, 4 * MiB)
        tcp, tcp_l = yield self.stomp_client()
        self.fill(leave=2 * MiB)
        alarm.check()  # as its timer would within a second
        self.assertTrue(alarm.active)
        self.assertEqual(len(self.logged("Disk alarm raised")), 1)

        response, problem = yield self.http("POST", "/vhosts/%2F/queues/d/messages",
                                            json={"body": "p", "persistent": True})
        self.assertEqual(response.code, 503)
        self.assertEqual((problem["code"], problem["alarm"]), ("publishers-held", "disk"))
        response, _ = yield self.http("POST", "/vhosts/%2F/queues/d/messages", json={"body": "t"})
        self.assertEqual(response.code, 201, "a transient message is not held back")
        response, health = yield self.http("GET", "/health")
        self.assertEqual(health["checks"]["alarms"]["alarms"], ["disk"])
        response, check = yield self.http("GET", "/health/checks/alarms")
        self.assertEqual((response.code, check["ok"]), (503, False))
        self.assertLess(check["disk"]["free_bytes"], 4 * MiB)
        metrics = yield self.metrics()
        figures = dict(line.split(" ", 1) for line in metrics.splitlines()
                       if line.startswith("qmq_disk") or line.startswith("qmq_store"))
        self.assertEqual(float(figures["qmq_disk_alarm"]), 1)
        self.assertEqual(float(figures["qmq_disk_free_limit_bytes"]), 4 * MiB)
        self.assertLess(float(figures["qmq_disk_free_bytes"]), 4 * MiB)
        self.assertEqual(float(figures["qmq_store_failed"]), 0)

        # STOMP: the persistent SEND read is taken, then the connection waits.
        headers = {"persistent": "true"}
        yield deferToThread(tcp.send, "/queue/d", b"s1", headers=headers, receipt="s1")
        yield deferToThread(tcp_l.wait, lambda: "s1" in tcp_l.receipts, "s1")
        yield self.until(lambda: self.blocked("stomp"), "the persistent publisher held back")
        yield deferToThread(tcp.send, "/queue/d", b"s2", headers=headers, receipt="s2")

        self.empty()
        alarm.check()
        self.assertFalse(alarm.active)
        self.assertEqual(len(self.logged("Disk alarm cleared")), 1)
        yield deferToThread(tcp_l.wait, lambda: "s2" in tcp_l.receipts, "s2 once space is back")
        response, _ = yield self.http("POST", "/vhosts/%2F/queues/d/messages",
                                      json={"body": "p", "persistent": True})
        self.assertEqual(response.code, 201)

    @defer.inlineCallbacks
    def metrics(self) -> Any:
        import treq  # noqa: PLC0415

        response = yield treq.get(f"http://127.0.0.1:{self.http_port}/metrics", pool=self.pool,
                                  timeout=TIMEOUT)
        body = yield response.text()
        return body


class StoreRefusalTests(FullDiskCase):
    """The alarm off: the disk fills under the store, which refuses, holds
    persistent publishers back, and writes again once space returns."""

    @defer.inlineCallbacks
    def test_refused_recovered_nothing_receipted_lost(self) -> Any:
        self.assertIsNone(self.service.disk_alarm)
        self.fill(leave=1 * MiB)
        tcp, tcp_l = yield self.stomp_client()
        body = b"m" * (100 * 1024)

        def publish_until_refused() -> list[int]:
            receipted = []
            for i in range(100):  # 10 MB: more than the disk has left
                tcp.send("/queue/full", body + b"%d" % i, headers={"persistent": "true"},
                         receipt=f"r{i}")
                tcp_l.wait(lambda i=i: f"r{i}" in tcp_l.receipts or tcp_l.errors,
                           f"receipt r{i} or an ERROR")
                if tcp_l.errors:
                    return receipted
                receipted.append(i)
            raise AssertionError("the disk never filled")

        receipted = yield deferToThread(publish_until_refused)
        [error] = tcp_l.errors
        self.assertEqual(error.headers["message"], "message not stored")
        self.assertIn(b"No space left on device", error.body)
        self.assertGreater(len(receipted), 0)
        [failed] = self.logged("failed ({why})")
        self.assertEqual(failed["log_level"].name, "error")

        response, problem = yield self.http("POST", "/vhosts/%2F/queues/full/messages",
                                            json={"body": "p", "persistent": True})
        self.assertEqual(response.code, 503)
        self.assertEqual((problem["code"], problem["alarm"]), ("publishers-held", "store"))
        self.assertNotIn("published", problem)
        response, health = yield self.http("GET", "/health")
        self.assertEqual((response.code, health["checks"]["store"]), (503, {"ok": False}))
        response, check = yield self.http("GET", "/health/checks/store")
        self.assertEqual((response.code, check["ok"]), (503, False))
        self.assertIn("No space left on device", check["failure"])

        self.empty()
        yield self.until(lambda: self.broker.store.failure is None, "the store writing again")
        self.assertEqual(len(self.logged("writing again after")), 1)
        response, answer = yield self.http("POST", "/vhosts/%2F/queues/full/messages",
                                           json={"body": "after", "persistent": True})
        self.assertEqual((response.code, answer["stored"]), (201, 1))
        tcp2, tcp2_l = yield self.stomp_client()
        yield deferToThread(tcp2.send, "/queue/full", b"after-stomp",
                            headers={"persistent": "true"}, receipt="a")
        yield deferToThread(tcp2_l.wait, lambda: "a" in tcp2_l.receipts, "a receipt")

        # A restart: every receipted message is there.
        yield self.restart()
        kept = [m.body for m in self.broker.default_vhost.queues["full"].messages()]
        for i in receipted:
            self.assertIn(body + b"%d" % i, kept)
        self.assertIn(b"after", kept)
        self.assertIn(b"after-stomp", kept)
        self.assertEqual(self.broker.store.problems, [])
        # The refused publish's session logged why, with the failure.
        self.assertEqual(len(self.flushLoggedErrors(StoreFailed)), 1)

    @defer.inlineCallbacks
    def restart(self) -> Any:
        for conn in self.conns:
            yield deferToThread(self._disconnect, conn)
        self.conns = []
        yield self.pool.closeCachedConnections()
        yield self.service.stopService()
        settings = config.load_string(
            'listen = ["stomp:tcp:0:interface=127.0.0.1", "http:tcp:0:interface=127.0.0.1"]\n'
            f'data_dir = "{self.data_dir}"\nstore = "log"\n' + self.more_config()
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.broker = self.service.broker
