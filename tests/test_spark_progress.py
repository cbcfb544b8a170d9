"""What the Spark jobs say while they run (qmq.spark.progress) and the data
their chart draws (qmq.spark.jobs.chart_series): no Spark needed."""

from __future__ import annotations

import io
import math
from datetime import datetime, timedelta
from types import SimpleNamespace

from twisted.trial import unittest

from qmq.spark import jobs
from qmq.spark.jobs import chart_series
from qmq.spark.progress import Progress, StageWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ProgressTests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = FakeClock()
        self.out = io.StringIO()

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()

    def test_rate_bounded(self) -> None:
        """However often it is called, a line at most once per interval."""
        p = Progress("archive", 5.0, self.out, self.clock)
        self.assertTrue(p.note("a"))
        for _ in range(1000):
            self.clock.now += 0.001
            p.note("b")
        self.assertEqual(len(self.lines()), 1)
        self.clock.now = 105.0
        self.assertTrue(p.note("c"))
        self.assertEqual(self.lines(), ["qmq-spark archive: a (0.0 s)",
                                        "qmq-spark archive: c (5.0 s)"])

    def test_off(self) -> None:
        """Interval 0: no progress line, the summary all the same."""
        p = Progress("report", 0, self.out, self.clock)
        self.assertFalse(p.note("a", force=True))
        self.clock.now += 61.25
        line = p.summary(1200, 3, None)
        self.assertEqual(self.lines(), [line])
        self.assertEqual(line, "qmq-spark report: done: 1,200 row(s) read, 3 row(s) written, "
                               "? file(s), 61.2 s")

    def test_stage_watch(self) -> None:
        """The active stages' tasks, summed; nothing when none runs."""
        stages = {3: SimpleNamespace(numCompletedTasks=2, numTasks=8),
                  4: SimpleNamespace(numCompletedTasks=1, numTasks=2)}
        active = [4, 3, 9]  # 9 ended between the two calls
        tracker = SimpleNamespace(getActiveStageIds=lambda: list(active),
                                  getStageInfo=stages.get)
        sc = SimpleNamespace(statusTracker=lambda: tracker)
        p = Progress("archive", 1.0, self.out, self.clock)
        watch = StageWatch(sc, p)
        self.assertEqual(watch.poll(), "stage 3, 4: 3/10 task(s) done")
        active.clear()
        self.assertIsNone(watch.poll())
        self.assertEqual(self.lines(), ["qmq-spark archive: stage 3, 4: 3/10 task(s) done (0.0 s)"])

    def test_stage_watch_thread_stops(self) -> None:
        """The watch's thread ends when the block does; none when lines are off."""
        sc = SimpleNamespace(statusTracker=lambda: None)
        with StageWatch(sc, Progress("archive", 3600.0, self.out)) as w:
            self.assertTrue(w._thread.is_alive())
        self.assertFalse(w._thread.is_alive())
        with StageWatch(sc, Progress("archive", 0, self.out)) as w:
            self.assertIsNone(w._thread)


def row(dest: str, minute: datetime, messages: int, ack: float | None = None) -> dict:
    return {"destination": dest, "minute": minute, "messages": messages,
            "bytes": messages * 1024, "ack_delay_p50_ms": ack}


class ChartSeriesTests(unittest.TestCase):
    t0 = datetime(2026, 11, 26, 12, 0)

    def test_gaps_are_nan(self) -> None:
        """Minutes without traffic break the line: one NaN point after the
        last minute with traffic; adjacent minutes are joined."""
        m = [self.t0 + timedelta(minutes=i) for i in range(10)]
        series, left = chart_series([row("/queue/a", m[5], 4), row("/queue/a", m[0], 2, 7.0),
                                     row("/queue/a", m[1], 3)])
        self.assertEqual(left, [])
        s = series["/queue/a"]
        self.assertEqual(s["minute"], [m[0], m[1], m[2], m[5]])
        self.assertEqual(s["messages"][:2] + s["messages"][3:], [2, 3, 4])
        self.assertEqual(s["bytes"][:2] + s["bytes"][3:], [2.0, 3.0, 4.0])  # KiB
        self.assertTrue(all(math.isnan(s[k][2]) for k in ("messages", "bytes", "ack_delay_p50_ms")))
        self.assertEqual(s["ack_delay_p50_ms"][0], 7.0)
        self.assertTrue(math.isnan(s["ack_delay_p50_ms"][1]))  # not known

    def test_busiest_kept(self) -> None:
        """Each destination its own series (its own chart and scale); past
        the limit the quietest are left out and named."""
        rows = [row("/queue/big", self.t0, 200_000)]
        rows += [row(f"/queue/q{i}", self.t0, i + 1) for i in range(5)]
        series, left = chart_series(rows, limit=3)
        self.assertEqual(sorted(series), ["/queue/big", "/queue/q3", "/queue/q4"])
        self.assertEqual(left, ["/queue/q0", "/queue/q1", "/queue/q2"])
        self.assertEqual(series["/queue/q3"]["messages"], [4])


class MainTests(unittest.TestCase):
    def test_no_console_bar(self) -> None:
        """The jobs turn Spark's console progress bar off: their own lines
        take its place on standard error."""
        asked = []

        class Stop(Exception):
            pass

        def session(master: str, app: str, **conf: str) -> None:
            asked.append((master, app, conf))
            raise Stop()

        self.patch(jobs, "session", session)
        self.assertRaises(Stop, jobs.main, ["--master", "local[1]", "report", "--path", "d",
                                            "--out", "o"])
        self.assertEqual(asked, [("local[1]", "qmq-report",
                                  {"spark.ui.showConsoleProgress": "false"})])
