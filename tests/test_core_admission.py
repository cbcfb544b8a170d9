"""Admission (L{qmq.core.admission}) and the disk free-space alarm
(L{qmq.core.alarm.DiskAlarm}): one decision for every frontend."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from qmq.core.admission import Admission
from qmq.core.alarm import DiskAlarm, MemoryAlarm, MiB, parse_disk_limit
from qmq.core.broker import Broker


class FakeFS:
    """A filesystem whose free space a test sets (C{os.statvfs}'s shape)."""

    def __init__(self, free: int, total: int = 1000 * MiB) -> None:
        self.free = free
        self.total = total
        self.fail = False
        self.asked: list[str] = []

    def __call__(self, path: str) -> Any:
        self.asked.append(path)
        if self.fail:
            raise OSError(5, "Input/output error")
        return os.statvfs_result((4096, 4096, self.total // 4096, self.free // 4096,
                                  self.free // 4096, 0, 0, 0, 0, 255))


class AdmissionTests(TestCase):
    def test_open_by_default(self) -> None:
        a = Admission()
        self.assertFalse(a.closed)
        self.assertTrue(a.admits(True))
        self.assertIsNone(a.refusal(False))

    def test_persistent_hold(self) -> None:
        """A hold for persistent publishes lets the others through."""
        a = Admission()
        a.hold("disk", "disk low", persistent_only=True)
        self.assertTrue(a.closed)
        self.assertFalse(a.held)
        self.assertTrue(a.admits(False))
        self.assertFalse(a.admits(True))
        self.assertEqual(a.refusal(True).name, "disk")
        a.release("disk")
        self.assertFalse(a.closed)
        self.assertTrue(a.admits(True))

    def test_memory_holds_everything(self) -> None:
        a = Admission()
        a.hold("memory", "memory high")
        self.assertTrue(a.held)
        self.assertEqual(a.refusal(False).detail, "memory high")

    def test_listeners_hear_changes(self) -> None:
        a = Admission()
        heard: list[bool] = []
        a.subscribe(lambda adm: heard.append(adm.closed))
        a.hold("store", "cannot write", persistent_only=True)
        a.hold("store", "still cannot write", persistent_only=True)  # no change: silent
        a.release("store")
        a.release("store")
        self.assertEqual(heard, [True, False])

    def test_failing_listener_logged(self) -> None:
        a = Admission()
        heard = []

        def bad(adm: Admission) -> None:
            raise RuntimeError("bug")

        a.subscribe(bad)
        a.subscribe(heard.append)
        a.hold("memory", "x")
        self.assertEqual(heard, [a])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_watch_alarm_and_replace(self) -> None:
        """The broker's alarm attributes feed admission; a replaced alarm
        no longer does."""
        clock = Clock()
        rss = [0]
        broker = Broker(clock=clock)
        alarm = MemoryAlarm(clock, 100 * MiB, read_rss=lambda: rss[0], trim=None)
        broker.memory_alarm = alarm
        rss[0] = 200 * MiB
        alarm.check()
        self.assertTrue(broker.admission.held)
        self.assertIn("high-water mark of 100 MiB", broker.admission.refusal(False).detail)
        broker.memory_alarm = None
        self.assertFalse(broker.admission.closed)
        rss[0] = 0
        alarm.check()
        rss[0] = 200 * MiB
        alarm.check()
        self.assertFalse(broker.admission.closed)

    def test_store_health(self) -> None:
        """A store that reports it cannot write holds persistent publishes."""

        class Store:
            def watch(self, callback: Any) -> None:
                self.callback = callback

        store = Store()
        a = Admission()
        a.watch_store(store)
        store.callback(False, "no space left on device")
        self.assertEqual(a.refusal(True).name, "store")
        self.assertTrue(a.admits(False))
        store.callback(True, "")
        self.assertFalse(a.closed)


class ParseDiskLimitTests(TestCase):
    def test_forms(self) -> None:
        total = 1000 * MiB
        self.assertEqual(parse_disk_limit("50MB", total), 50_000_000)
        self.assertEqual(parse_disk_limit("1GiB", total), 1 << 30)
        self.assertEqual(parse_disk_limit(12345, total), 12345)
        self.assertEqual(parse_disk_limit(0.1, total), 100 * MiB)
        self.assertEqual(parse_disk_limit("10%", total), 100 * MiB)
        self.assertEqual(parse_disk_limit("0.1", total), 100 * MiB)
        for off in (0, "0", "off", 0.0):
            self.assertEqual(parse_disk_limit(off, total), 0)
        # A fraction before the filesystem is known: resolved later.
        self.assertEqual(parse_disk_limit(0.1, 0), -1)

    def test_bad(self) -> None:
        for bad in (True, -1, "lots", "5 parsecs", 1.5, "150%", [1]):
            e = self.assertRaises(ValueError, parse_disk_limit, bad, MiB)
            self.assertIn("disk free limit", str(e))


class DiskAlarmTests(TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.fs = FakeFS(free=500 * MiB)
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def alarm(self, limit: Any = "100MiB") -> DiskAlarm:
        alarm = DiskAlarm(self.clock, "/data", limit, interval=1.0, statvfs=self.fs)
        self.addCleanup(alarm.stop)
        return alarm

    def logged(self, text: str) -> list[dict]:
        return [e for e in self.events if text in e.get("log_format", "")]

    def test_raised_and_cleared_on_the_clock(self) -> None:
        alarm = self.alarm()
        heard: list[bool] = []
        alarm.subscribe(heard.append)
        alarm.start()
        self.assertFalse(alarm.active)
        self.assertEqual(self.fs.asked, ["/data"])
        self.fs.free = 10 * MiB
        self.clock.advance(0.9)
        self.assertFalse(alarm.active)  # not sampled yet
        self.clock.advance(0.1)
        self.assertTrue(alarm.active)
        self.assertEqual(alarm.free, 10 * MiB)
        self.assertEqual(len(self.logged("Disk alarm raised")), 1)
        self.clock.advance(5)
        self.assertEqual(len(self.logged("Disk alarm raised")), 1)  # once
        self.fs.free = 100 * MiB
        self.clock.advance(1)
        self.assertFalse(alarm.active)
        self.assertEqual(len(self.logged("Disk alarm cleared")), 1)
        self.assertEqual(heard, [True, False])
        self.assertEqual(alarm.raised_count, 1)

    def test_fraction_of_the_filesystem(self) -> None:
        alarm = self.alarm(0.5)
        alarm.check()
        self.assertEqual(alarm.limit, 500 * MiB)
        self.assertFalse(alarm.active)
        self.fs.free -= 4096
        alarm.check()
        self.assertTrue(alarm.active)

    def test_sampling_failure_keeps_state(self) -> None:
        alarm = self.alarm()
        self.fs.free = 0
        alarm.check()
        self.fs.fail = True
        alarm.check()
        alarm.check()
        self.assertTrue(alarm.active)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_disabled(self) -> None:
        alarm = self.alarm(0)
        self.assertFalse(alarm.enabled)
        alarm.start()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_clears(self) -> None:
        alarm = self.alarm()
        alarm.start()
        self.fs.free = 0
        self.clock.advance(1)
        alarm.stop()
        self.assertFalse(alarm.active)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_holds_persistent_publishes_only(self) -> None:
        broker = Broker(clock=self.clock)
        alarm = self.alarm()
        broker.disk_alarm = alarm
        self.fs.free = 0
        alarm.check()
        adm = broker.admission
        self.assertFalse(adm.admits(True))
        self.assertTrue(adm.admits(False))
        self.assertIn("limits.disk_free_limit", adm.refusal(True).detail)
        self.fs.free = 200 * MiB
        alarm.check()
        self.assertTrue(adm.admits(True))
