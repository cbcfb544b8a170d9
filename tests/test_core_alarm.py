"""Tests for L{qmq.core.alarm}: the memory alarm and its helpers.

The alarm runs on a L{Clock} with a fake C{read_rss} that returns the
samples a test lists; nothing sleeps and no real memory is allocated.
"""

from __future__ import annotations

import os

from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel
from twisted.python.filepath import FilePath
from twisted.trial.unittest import SynchronousTestCase

from qmq.core import alarm as alarm_module
from qmq.core.alarm import (
    DEFAULT_LOW_RATIO,
    MIN_MARK,
    GiB,
    KiB,
    MemoryAlarm,
    MiB,
    TiB,
    current_rss,
    parse_memory_mark,
    total_memory,
    trim_heap,
)

HIGH = 1000 * MiB
LOW = 800 * MiB


class Samples:
    """A fake C{read_rss}: returns the values it is given, in order, then
    keeps returning the last one. An exception in the list is raised."""

    def __init__(self, *values: int | Exception) -> None:
        self.values = list(values)
        self.calls = 0

    def then(self, *values: int | Exception) -> None:
        """Replace the samples still to come."""
        self.values = list(values)

    def __call__(self) -> int:
        self.calls += 1
        value = self.values.pop(0) if len(self.values) > 1 else self.values[0]
        if isinstance(value, Exception):
            raise value
        return value


class AlarmTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.events: list[dict] = []
        self.patch(alarm_module, "log", Logger(observer=self.events.append))

    def make(self, *samples: int | Exception, high: int = HIGH, low: int | None = LOW, **kw):
        self.samples = Samples(*samples)
        kw.setdefault("trim", None)
        return MemoryAlarm(self.clock, high, low, read_rss=self.samples, **kw)

    def record(self, alarm: MemoryAlarm) -> list[bool]:
        calls: list[bool] = []
        alarm.subscribe(calls.append)
        return calls

    def levels(self, level: LogLevel) -> list[dict]:
        return [e for e in self.events if e["log_level"] == level]


class MarksTests(AlarmTestCase):
    def test_raiseAtHigh(self) -> None:
        """The alarm is raised by a sample at the high-water mark, not below."""
        alarm = self.make(HIGH - 1, HIGH)
        self.assertFalse(alarm.check())
        self.assertFalse(alarm.active)
        self.assertTrue(alarm.check())
        self.assertTrue(alarm.active)
        self.assertEqual((alarm.rss, alarm.peak, alarm.raised_count), (HIGH, HIGH, 1))

    def test_hysteresisHolds(self) -> None:
        """Between the marks the state does not change, rising or falling."""
        alarm = self.make(LOW + 1, HIGH - 1, HIGH + 5, HIGH - 1, LOW, LOW + 1)
        self.assertEqual([alarm.check() for _ in range(6)], [False, False, True, True, True, True])
        self.assertEqual(alarm.raised_count, 1)
        self.assertEqual(alarm.peak, HIGH + 5)
        self.assertEqual(alarm.rss, LOW + 1)

    def test_clearBelowLow(self) -> None:
        """A raised alarm clears at the first sample below the low-water mark."""
        alarm = self.make(HIGH, LOW - 1, HIGH, HIGH * 2)
        self.assertEqual([alarm.check() for _ in range(4)], [True, False, True, True])
        self.assertEqual(alarm.raised_count, 2)
        self.assertEqual(alarm.peak, HIGH * 2)

    def test_defaultLow(self) -> None:
        """Without a low-water mark it is 90% of the high one."""
        alarm = self.make(0, low=None)
        self.assertEqual(alarm.low, int(HIGH * DEFAULT_LOW_RATIO))
        self.assertEqual(alarm.low, 900 * MiB)

    def test_lowEqualsHigh(self) -> None:
        """Equal marks mean no hysteresis but still no flapping on one value."""
        alarm = self.make(HIGH, HIGH, HIGH - 1, high=HIGH, low=HIGH)
        self.assertEqual([alarm.check() for _ in range(3)], [True, True, False])

    def test_badMarks(self) -> None:
        """A low-water mark above the high one, or not positive, is refused,
        as is an interval that is not positive."""
        self.assertRaises(ValueError, self.make, 0, high=HIGH, low=HIGH + 1)
        self.assertRaises(ValueError, self.make, 0, high=HIGH, low=0)
        self.assertRaises(ValueError, self.make, 0, high=HIGH, low=-1)
        self.assertRaises(ValueError, self.make, 0, interval=0)
        self.assertRaises(ValueError, self.make, 0, interval=-0.1)

    def test_disabled(self) -> None:
        """With C{high} 0 or less the alarm never raises, starts no loop,
        and still samples for metrics."""
        for high in (0, -1):
            alarm = self.make(10 * GiB, high=high, low=LOW)
            self.assertFalse(alarm.enabled)
            self.assertEqual((alarm.high, alarm.low), (0, 0))
            calls = self.record(alarm)
            self.assertFalse(alarm.check())
            self.assertEqual((alarm.rss, alarm.peak, alarm.raised_count), (10 * GiB, 10 * GiB, 0))
            alarm.start()
            self.assertEqual(self.clock.getDelayedCalls(), [])
            self.assertEqual(calls, [])
            alarm.stop()
        self.assertIn("disabled", self.events[-1]["log_format"])

    def test_logLines(self) -> None:
        """One warning when raised and one info line when cleared, with RSS
        and both marks in MiB; nothing for samples that change nothing."""
        alarm = self.make(HIGH, HIGH + MiB, LOW - MiB, LOW - 2 * MiB)
        for _ in range(4):
            alarm.check()
        from twisted.logger import formatEvent

        warnings = [formatEvent(e) for e in self.levels(LogLevel.warn)]
        infos = [formatEvent(e) for e in self.levels(LogLevel.info)]
        self.assertEqual(len(warnings), 1)
        self.assertEqual(len(infos), 1)
        self.assertIn("raised", warnings[0])
        self.assertIn("RSS 1000 MiB", warnings[0])
        self.assertIn("1000 MiB", warnings[0])
        self.assertIn("800 MiB", warnings[0])
        self.assertIn("cleared", infos[0])
        self.assertIn("RSS 799 MiB", infos[0])
        self.assertIn("800 MiB", infos[0])
        self.assertEqual(self.levels(LogLevel.warn)[0]["rss"], HIGH)


class SubscriberTests(AlarmTestCase):
    def test_inOrder(self) -> None:
        """Subscribers hear each change once, in the order they subscribed,
        and see C{active} already updated."""
        alarm = self.make(HIGH, HIGH, LOW - 1, LOW - 1, HIGH)
        calls = []
        alarm.subscribe(lambda active: calls.append(("a", active, alarm.active)))
        alarm.subscribe(lambda active: calls.append(("b", active, alarm.active)))
        for _ in range(5):
            alarm.check()
        self.assertEqual(
            calls,
            [
                ("a", True, True),
                ("b", True, True),
                ("a", False, False),
                ("b", False, False),
                ("a", True, True),
                ("b", True, True),
            ],
        )

    def test_unsubscribe(self) -> None:
        """An unsubscribed callback is not called; unsubscribing twice or a
        stranger is harmless; subscribing twice calls once."""
        alarm = self.make(HIGH)
        calls = self.record(alarm)
        alarm.subscribe(calls.append)
        other: list[bool] = []
        alarm.subscribe(other.append)
        alarm.unsubscribe(other.append)
        alarm.unsubscribe(other.append)
        alarm.unsubscribe(print)
        alarm.check()
        self.assertEqual((calls, other), ([True], []))

    def test_boundMethods(self) -> None:
        """A bound method fetched again unsubscribes the one subscribed."""

        class Session:
            def __init__(self) -> None:
                self.calls: list[bool] = []

            def on_memory_alarm(self, active: bool) -> None:
                self.calls.append(active)

        alarm = self.make(HIGH, LOW - 1, HIGH)
        one, two = Session(), Session()
        alarm.subscribe(one.on_memory_alarm)
        alarm.subscribe(two.on_memory_alarm)
        alarm.check()
        alarm.unsubscribe(one.on_memory_alarm)
        alarm.check()
        alarm.check()
        self.assertEqual(one.calls, [True])
        self.assertEqual(two.calls, [True, False, True])

    def test_unsubscribeDuringCallback(self) -> None:
        """A callback may unsubscribe itself or a later one (which is then
        not called); one subscribed meanwhile waits for the next change."""
        alarm = self.make(HIGH, LOW - 1)
        calls = []
        late: list[bool] = []

        def first(active: bool) -> None:
            calls.append(("first", active))
            alarm.unsubscribe(first)
            alarm.unsubscribe(third)
            alarm.subscribe(late.append)

        def second(active: bool) -> None:
            calls.append(("second", active))

        def third(active: bool) -> None:
            calls.append(("third", active))

        for callback in (first, second, third):
            alarm.subscribe(callback)
        alarm.check()
        self.assertEqual(calls, [("first", True), ("second", True)])
        self.assertEqual(late, [])
        alarm.check()
        self.assertEqual(calls[2:], [("second", False)])
        self.assertEqual(late, [False])

    def test_callbackExceptions(self) -> None:
        """A failing callback is logged and the others are still called."""
        self.patch(alarm_module, "log", Logger())
        alarm = self.make(HIGH, LOW - 1)
        calls = []

        def broken(active: bool) -> None:
            calls.append(("broken", active))
            raise ZeroDivisionError("broken subscriber")

        alarm.subscribe(broken)
        alarm.subscribe(lambda active: calls.append(("after", active)))
        self.assertTrue(alarm.check())
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertFalse(alarm.check())
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(
            calls, [("broken", True), ("after", True), ("broken", False), ("after", False)]
        )

    def test_reentrantCheck(self) -> None:
        """A callback that samples again and changes the state stops the
        older notification: everyone ends with the newest state."""
        alarm = self.make(HIGH, LOW - 1)
        calls = []

        def first(active: bool) -> None:
            calls.append(("first", active))
            if active:
                alarm.check()

        alarm.subscribe(first)
        alarm.subscribe(lambda active: calls.append(("second", active)))
        alarm.check()
        self.assertEqual(calls, [("first", True), ("first", False), ("second", False)])
        self.assertFalse(alarm.active)


class LoopTests(AlarmTestCase):
    def test_samplesOnClock(self) -> None:
        """Started, the alarm samples at once and every C{interval}."""
        alarm = self.make(0, 0, HIGH, HIGH, LOW - 1, interval=0.5)
        calls = self.record(alarm)
        alarm.start()
        self.assertEqual(self.samples.calls, 1)
        self.clock.advance(0.5)
        self.assertEqual(calls, [])
        self.clock.advance(0.5)
        self.assertEqual(calls, [True])
        self.assertTrue(alarm.active)
        self.clock.advance(0.5)
        self.clock.advance(0.5)
        self.assertEqual(calls, [True, False])
        self.assertEqual(self.samples.calls, 5)

    def test_defaultInterval(self) -> None:
        """The default interval is a tenth of a second."""
        alarm = self.make(0)
        alarm.start()
        self.clock.pump([0.1] * 10)
        self.assertEqual(self.samples.calls, 11)
        alarm.stop()

    def test_startTwice(self) -> None:
        """Starting a started alarm does not add a second loop."""
        alarm = self.make(0)
        alarm.start()
        alarm.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        alarm.stop()

    def test_stop(self) -> None:
        """Stopping ends sampling; it is idempotent; the alarm can start again."""
        alarm = self.make(0)
        alarm.stop()
        alarm.start()
        alarm.stop()
        alarm.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(10)
        self.assertEqual(self.samples.calls, 1)
        alarm.start()
        self.assertEqual(self.samples.calls, 2)
        alarm.stop()

    def test_stopClearsRaised(self) -> None:
        """Stopping a raised alarm clears it: nothing would clear it later."""
        alarm = self.make(HIGH)
        calls = self.record(alarm)
        alarm.start()
        self.assertEqual(calls, [True])
        alarm.stop()
        self.assertEqual(calls, [True, False])
        self.assertFalse(alarm.active)
        self.assertEqual(alarm.raised_count, 1)

    def test_samplingFailure(self) -> None:
        """A failing sample is logged once per run of failures, keeps the
        state, and the loop goes on."""
        alarm = self.make(HIGH, OSError("gone"), OSError("gone"), OSError("gone"), LOW - 1)
        self.patch(alarm_module, "log", Logger())
        calls = self.record(alarm)
        alarm.start()
        for _ in range(3):
            self.clock.advance(0.1)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.assertTrue(alarm.active)
        self.assertEqual(alarm.rss, HIGH)
        self.clock.advance(0.1)
        self.assertEqual(calls, [True, False])
        self.samples.then(OSError("again"), LOW)
        self.clock.advance(0.1)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.clock.advance(0.1)
        self.assertEqual(alarm.rss, LOW)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        alarm.stop()

    def test_startLogsMarks(self) -> None:
        """Starting logs the marks once."""
        alarm = self.make(0)
        alarm.start()
        alarm.stop()
        from twisted.logger import formatEvent

        self.assertIn("1000 MiB", formatEvent(self.events[0]))
        self.assertIn("800 MiB", formatEvent(self.events[0]))


class TrimTests(AlarmTestCase):
    def trimmer(self, after: int | None):
        trims: list[int] = []

        def trim() -> None:
            trims.append(self.samples.calls)
            if after is not None:
                self.samples.values.insert(0, after)

        return trims, trim

    def test_notBelowMarks(self) -> None:
        """Below the marks the heap is never trimmed."""
        trims, trim = self.trimmer(None)
        alarm = self.make(HIGH - 1, LOW, trim=trim)
        alarm.check()
        alarm.check()
        self.assertEqual(trims, [])

    def test_trimAvoidsRaise(self) -> None:
        """Memory the allocator gives back does not raise the alarm."""
        trims, trim = self.trimmer(LOW)
        alarm = self.make(HIGH, trim=trim)
        self.assertFalse(alarm.check())
        self.assertEqual(trims, [1])
        self.assertEqual((alarm.rss, alarm.peak), (LOW, LOW))

    def test_trimClears(self) -> None:
        """While raised, each sample that would keep the alarm trims first,
        so freed but retained memory lets the alarm clear."""
        trims: list[int] = []

        def trim() -> None:
            trims.append(self.samples.calls)
            if len(trims) == 3:
                self.samples.values.insert(0, LOW - 1)

        alarm = self.make(HIGH, HIGH, HIGH, HIGH, HIGH, trim=trim)
        self.assertEqual([alarm.check() for _ in range(3)], [True, True, False])
        self.assertEqual(trims, [1, 3, 5])

    def test_trimFailure(self) -> None:
        """A failing trim counts as a failed sample."""
        self.patch(alarm_module, "log", Logger())

        def trim() -> None:
            raise RuntimeError("no")

        alarm = self.make(HIGH, trim=trim)
        self.assertFalse(alarm.check())
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_disabledNeverTrims(self) -> None:
        """A disabled alarm never trims."""
        trims, trim = self.trimmer(None)
        alarm = self.make(10 * GiB, high=0, trim=trim)
        alarm.check()
        self.assertEqual(trims, [])

    def test_trimHeap(self) -> None:
        """The real trim runs without error."""
        self.assertIsNone(trim_heap())


class ParseMemoryMarkTests(SynchronousTestCase):
    total = 24 * GiB

    def test_accepted(self) -> None:
        """Every accepted form, in bytes."""
        cases = [
            (2 * GiB, 2 * GiB),
            (MIN_MARK, MIN_MARK),
            (0.4, int(self.total * 0.4)),
            (1.0, self.total),
            (0.5, 12 * GiB),
            ("512MiB", 512 * MiB),
            ("512mib", 512 * MiB),
            ("512 MiB", 512 * MiB),
            (" 512MiB ", 512 * MiB),
            ("2GB", 2 * 10**9),
            ("2gb", 2 * 10**9),
            ("2G", 2 * GiB),
            ("2GiB", 2 * GiB),
            ("1.5GiB", int(1.5 * GiB)),
            ("800M", 800 * MiB),
            ("800MB", 800 * 10**6),
            ("20000K", 20000 * KiB),
            ("20000KiB", 20000 * KiB),
            ("20000kB", 20000 * 10**3),
            ("1T", TiB),
            ("1TiB", TiB),
            ("1TB", 10**12),
            ("2147483648", 2 * GiB),
            ("2147483648B", 2 * GiB),
            ("40%", int(self.total * 0.4)),
            ("40 %", int(self.total * 0.4)),
            ("12.5%", self.total // 8),
            ("100%", self.total),
            ("0.4", int(self.total * 0.4)),
        ]
        for value, expected in cases:
            self.assertEqual(parse_memory_mark(value, self.total), expected, value)

    def test_disabled(self) -> None:
        """Zero in any form, and C{"off"}, mean disabled."""
        for value in (0, 0.0, "0", "off", "OFF", " Off ", "0%", "0MiB", "0.0"):
            self.assertEqual(parse_memory_mark(value, self.total), 0, value)

    def test_refused(self) -> None:
        """Anything else is a C{ValueError} whose message lists the forms."""
        refused = [
            -1,
            -0.4,
            1.5,
            2.0,
            float("nan"),
            float("inf"),
            1,
            512,
            MIN_MARK - 1,
            0.0000001,
            "512",
            "512K",
            "-1GiB",
            "-40%",
            "140%",
            "1.5",
            "",
            "  ",
            "lots",
            "on",
            "2 GiBs",
            "2XB",
            "1e9",
            "1,5GiB",
            "GiB",
            "40%%",
            ".5",
            "nan",
            True,
            False,
            None,
            [1],
            b"2GiB",
        ]
        for value in refused:
            error = self.assertRaises(ValueError, parse_memory_mark, value, self.total)
            self.assertIn(repr(value), str(error))

    def test_messages(self) -> None:
        """The messages say what went wrong and what is accepted."""
        error = self.assertRaises(ValueError, parse_memory_mark, 512, self.total)
        self.assertIn("forget a unit", str(error))
        error = self.assertRaises(ValueError, parse_memory_mark, "2XB", self.total)
        self.assertIn("unknown unit 'xb'", str(error))
        error = self.assertRaises(ValueError, parse_memory_mark, 1.5, self.total)
        self.assertIn("<= 1", str(error))
        self.assertIn("'512MiB'", str(error))

    def test_fractionWithoutTotal(self) -> None:
        """A fraction of an unknown total is refused; a size is not."""
        self.assertRaises(ValueError, parse_memory_mark, 0.4, 0)
        self.assertRaises(ValueError, parse_memory_mark, "40%", 0)
        self.assertEqual(parse_memory_mark("1GiB", 0), GiB)


class MemoryHelperTests(SynchronousTestCase):
    def test_currentRss(self) -> None:
        """RSS is positive and plausible for a Python process."""
        rss = current_rss()
        self.assertIsInstance(rss, int)
        self.assertGreater(rss, 4 * MiB)
        self.assertLess(rss, total_memory())

    def test_currentRssWithoutProc(self) -> None:
        """Without C{/proc}, the peak RSS from C{getrusage} stands in."""
        now = current_rss()
        self.patch(alarm_module, "_STATM", self.mktemp())
        peak = current_rss()
        self.assertGreaterEqual(peak, now - MiB)

    def test_totalMemory(self) -> None:
        """Total memory is positive and at least this process's RSS."""
        total = total_memory()
        self.assertIsInstance(total, int)
        self.assertGreater(total, 64 * MiB)

    def test_physicalMemoryFromMeminfo(self) -> None:
        """Without C{sysconf}, C{/proc/meminfo} gives the RAM."""
        meminfo = FilePath(self.mktemp())
        meminfo.setContent(b"MemTotal:       24683656 kB\nMemFree:        2 kB\n")

        def sysconf(name: str) -> int:
            raise ValueError(name)

        self.patch(os, "sysconf", sysconf)
        self.patch(alarm_module, "_MEMINFO", meminfo.path)
        self.assertEqual(alarm_module._physical_memory(), 24683656 * KiB)
        self.patch(alarm_module, "_MEMINFO", self.mktemp())
        self.assertRaises(OSError, alarm_module._physical_memory)

    def cgroups(self, own: str, limits: dict[str, bytes]) -> tuple[str, str]:
        root = FilePath(self.mktemp())
        root.makedirs()
        for path, content in limits.items():
            child = root.preauthChild(path)
            child.parent().makedirs(ignoreExistingDirectory=True)
            child.setContent(content)
        proc = FilePath(self.mktemp())
        proc.setContent(own.encode())
        return root.path, proc.path

    def test_cgroupLimit(self) -> None:
        """The smallest numeric C{memory.max} from the root down this
        process's cgroup path; C{max} is no limit."""
        root, proc = self.cgroups(
            "0::/system.slice/qmq.service\n",
            {
                "memory.max": b"max\n",
                "system.slice/memory.max": b"8589934592\n",
                "system.slice/qmq.service/memory.max": b"4294967296\n",
                "other.slice/memory.max": b"1\n",
            },
        )
        self.assertEqual(alarm_module._cgroup_limit(root, proc), 4 * GiB)

    def test_cgroupContainer(self) -> None:
        """In a container the root's C{memory.max} is the container's limit."""
        root, proc = self.cgroups("0::/\n", {"memory.max": b"2147483648\n"})
        self.assertEqual(alarm_module._cgroup_limit(root, proc), 2 * GiB)

    def test_cgroupV1(self) -> None:
        """cgroup v1's C{memory.limit_in_bytes} counts too."""
        root, proc = self.cgroups(
            "12:memory:/docker/abc\n", {"memory/memory.limit_in_bytes": b"1073741824\n"}
        )
        self.assertEqual(alarm_module._cgroup_limit(root, proc), GiB)

    def test_noCgroup(self) -> None:
        """No limit anywhere is None."""
        root, proc = self.cgroups("0::/user.slice\n", {"memory.max": b"max\n"})
        self.assertIsNone(alarm_module._cgroup_limit(root, proc))
        self.assertIsNone(alarm_module._cgroup_limit(self.mktemp(), self.mktemp()))

    def test_totalMemoryUsesSmallerLimit(self) -> None:
        """A cgroup limit below RAM is the total; one above RAM is ignored."""
        self.patch(alarm_module, "_physical_memory", lambda: 24 * GiB)
        self.patch(alarm_module, "_cgroup_limit", lambda: 4 * GiB)
        self.assertEqual(total_memory(), 4 * GiB)
        self.patch(alarm_module, "_cgroup_limit", lambda: 2**63 - 4096)
        self.assertEqual(total_memory(), 24 * GiB)
        self.patch(alarm_module, "_cgroup_limit", lambda: None)
        self.assertEqual(total_memory(), 24 * GiB)
