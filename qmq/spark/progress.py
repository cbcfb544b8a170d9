# -*- test-case-name: tests.test_spark_progress -*-
"""What a long job says while it runs: progress lines and a summary.

The jobs (L{qmq.spark.jobs}) make one L{Progress} per run.  It writes to
standard error (standard output keeps the jobs' results), never more often
than once per C{interval} seconds whatever calls it, and ends with one
summary line: rows read, rows written, files, elapsed time.

While a Spark action runs the driver has nothing to say by itself, so
L{StageWatch} polls Spark's status tracker (the public
C{SparkContext.statusTracker()}) from a daemon thread, once per
C{interval}, and reports the running stages' tasks done out of total.  A
streaming archive also reports each micro-batch's rows as it ends.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO


class Progress:
    """Rate-limited progress lines and the summary of one job.

    @param job: the job's name, first on every line.
    @param interval: seconds between two progress lines at least; 0 or
        less turns progress lines off (the summary is still written).
    @param out: where to write; None: C{sys.stderr} at the time of writing.
    @param clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, job: str, interval: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.interval = interval
        self._out = out
        self._clock = clock
        self.started = clock()
        self._last: float | None = None
        self._lock = threading.Lock()  # the watch thread and the driver both write

    def elapsed(self) -> float:
        return self._clock() - self.started

    def _write(self, text: str) -> None:
        out = self._out if self._out is not None else sys.stderr
        out.write(f"qmq-spark {self.job}: {text}\n")
        out.flush()

    def note(self, text: str, force: bool = False) -> bool:
        """Write C{text} as a progress line unless one was written less than
        C{interval} seconds ago (C{force}: unless lines are off); whether it
        was written."""
        if self.interval <= 0:
            return False
        with self._lock:
            now = self._clock()
            if not force and self._last is not None and now - self._last < self.interval:
                return False
            self._last = now
            self._write(f"{text} ({self.elapsed():.1f} s)")
            return True

    def summary(self, read: int | None, written: int | None, files: int | None,
                written_as: str = "written") -> str:
        """Write and return the summary line (None: not known)."""

        def n(v: int | None) -> str:
            return "?" if v is None else f"{v:,}"

        line = (f"done: {n(read)} row(s) read, {n(written)} row(s) {written_as}, "
                f"{n(files)} file(s), {self.elapsed():.1f} s")
        with self._lock:
            self._write(line)
        return f"qmq-spark {self.job}: {line}"


class StageWatch:
    """Polls Spark's status tracker while a job runs and notes the active
    stages' progress on a L{Progress}.  A context manager: the thread
    starts on entry and is stopped (and joined) on exit."""

    def __init__(self, spark_context: Any, progress: Progress) -> None:
        self._sc = spark_context
        self._progress = progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> str | None:
        """One look at the active stages: the line noted, or None when no
        stage runs."""
        tracker = self._sc.statusTracker()
        done = total = 0
        stages = []
        for sid in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(sid)
            if info is None:  # finished between the two calls
                continue
            stages.append(str(sid))
            done += info.numCompletedTasks
            total += info.numTasks
        if not stages:
            return None
        text = f"stage {', '.join(stages)}: {done}/{total} task(s) done"
        self._progress.note(text)
        return text

    def _run(self) -> None:
        # Bounded by the job: the driver sets the event when its action ends.
        while not self._stop.wait(self._progress.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - progress must never break the job
                return

    def __enter__(self) -> StageWatch:
        if self._progress.interval > 0:
            self._thread = threading.Thread(target=self._run, name="qmq-spark-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
