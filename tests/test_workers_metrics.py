"""Tests for L{qmq.workers.metrics}: every worker's metrics in one answer."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.workers.metrics import WorkerMetrics, label, merge

W0 = """# HELP qmq_messages_total Messages.
# TYPE qmq_messages_total counter
qmq_messages_total{vhost="/"} 3.0
# HELP process_cpu_seconds_total CPU.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""
W1 = """# HELP qmq_messages_total Messages.
# TYPE qmq_messages_total counter
qmq_messages_total{vhost="/"} 4.0
# HELP qmq_only_here Only on w1.
# TYPE qmq_only_here gauge
qmq_only_here 1.0
"""


class MergeTests(unittest.TestCase):
    def test_label(self) -> None:
        self.assertEqual(label('a{b="c"} 1.0', "w1"), 'a{worker="w1",b="c"} 1.0')
        self.assertEqual(label("a 1.0", "w1"), 'a{worker="w1"} 1.0')
        self.assertEqual(label('a{b="x y"} 1.0 123', "w0"), 'a{worker="w0",b="x y"} 1.0 123')

    def test_merge(self) -> None:
        """One HELP and TYPE per family, every worker's samples under it."""
        self.assertEqual(
            merge({"w0": W0, "w1": W1}).splitlines(),
            [
                "# HELP qmq_messages_total Messages.",
                "# TYPE qmq_messages_total counter",
                'qmq_messages_total{worker="w0",vhost="/"} 3.0',
                'qmq_messages_total{worker="w1",vhost="/"} 4.0',
                "# HELP process_cpu_seconds_total CPU.",
                "# TYPE process_cpu_seconds_total counter",
                'process_cpu_seconds_total{worker="w0"} 1.5',
                "# HELP qmq_only_here Only on w1.",
                "# TYPE qmq_only_here gauge",
                'qmq_only_here{worker="w1"} 1.0',
            ],
        )


class GatherTests(unittest.TestCase):
    def test_gather(self) -> None:
        """The asked worker's own metrics, the others' that answered, and
        qmq_worker_up for each (0: no answer, its series missing)."""
        metrics = WorkerMetrics(Clock(), "w0", "http:unix:/r/w0.http", {"w1": "/r/w1.http", "w2": "/r/w2.http"})
        answers: dict[str, Any] = {"w1": W1, "w2": None}
        metrics.fetch = lambda node: defer.succeed(answers[node])  # type: ignore[method-assign]
        text = self.successResultOf(metrics.gather(lambda: W0.encode())).decode()
        self.assertIn('qmq_worker_up{worker="w0"} 1\n', text)
        self.assertIn('qmq_worker_up{worker="w1"} 1\n', text)
        self.assertIn('qmq_worker_up{worker="w2"} 0\n', text)
        self.assertIn('qmq_messages_total{worker="w1",vhost="/"} 4.0', text)
        self.assertNotIn('worker="w2",', text)

    def test_fetchTimeout(self) -> None:
        """A worker that does not answer within FETCH_TIMEOUT counts as down."""
        clock = Clock()
        metrics = WorkerMetrics(clock, "w0", "http:unix:/r/w0.http", {"w1": "/r/w1.http"})
        never: defer.Deferred[Any] = defer.Deferred()
        metrics.agent.request = lambda *a, **k: never  # type: ignore[method-assign]
        d = metrics.fetch("w1")
        self.assertNoResult(d)
        clock.advance(2.0)
        self.assertIsNone(self.successResultOf(d))
