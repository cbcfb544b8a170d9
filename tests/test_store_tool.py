"""Tests for L{qmq.store.tool}, the offline C{qmq-store} tool, on data
directories written by the commit-log store through a broker."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.store.log import CommitLogStore
from qmq.store.record import RECORD_PUBLISH
from qmq.store.segment import SegmentReader, list_segments, read_segment
from qmq.store.tool import main


class Taker(Consumer):
    def __init__(self, prefetch: int | None = None) -> None:
        super().__init__(True, prefetch)
        self.got: list = []

    def deliver(self, message, queue) -> None:
        self.got.append((message, queue))


class ToolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = self.mktemp()
        clock = Clock()
        store = CommitLogStore(
            self.dir,
            reactor=clock,
            io=lambda f, *a: maybeDeferred(f, *a),
            segment_size=4096,
            compact_interval=0,
        )
        broker = Broker(clock, store=store)
        broker.recover()
        v = broker.default_vhost
        v.declare_exchange("fan", "fanout")
        for name in ("a", "b"):
            v.declare_queue(name)
            v.bind(name, "fan")
        v.declare_queue("c", arguments={"x-max-length": 5})
        for i in range(30):
            v.publish(
                broker.new_message(
                    "fan", "", {"n": str(i)}, b"body %d " % i + b"x" * 200, persistent=True
                )
            )
        v.publish(broker.new_message("", "c", None, b"\x00binary", persistent=True))
        # b: 10 acked; a: one message given back (redelivered).
        taker = Taker(prefetch=10)
        v.queue("b").add_consumer(taker)
        for m, q in list(taker.got):
            q.ack(taker, m)
        giver = Taker(prefetch=1)
        v.queue("a").add_consumer(giver)
        v.queue("a").remove_consumer(giver, [m for m, _ in giver.got])
        broker.batcher.flush_all()
        store.flush()
        clock.advance(0)
        self.successResultOf(store.close())
        self.segments = [path for _, path in list_segments(self.dir)]

    def run_tool(self, *args: str) -> tuple[int, str]:
        out = io.StringIO()
        status = main([self.dir, *args], out)
        return status, out.getvalue()

    def test_list(self) -> None:
        status, text = self.run_tool("list")
        self.assertEqual(status, 0)
        lines = text.splitlines()
        self.assertEqual(len(lines), len(self.segments) + 2)
        self.assertGreater(len(self.segments), 1)
        self.assertIn("total", lines[-1])
        self.assertEqual(int(lines[-1].split()[1]), sum(os.path.getsize(p) for p in self.segments))

    def test_count(self) -> None:
        status, text = self.run_tool("count")
        self.assertEqual(status, 0)
        rows = {line.split()[1]: line.split()[2:] for line in text.splitlines()[1:-1]}
        self.assertEqual(rows, {"a": ["30", "1"], "b": ["20", "0"], "c": ["1", "0"]})
        self.assertIn("31 live messages (51 queue entries)", text)
        self.assertIn("1 exchanges, 2 bindings", text)

    def test_verify(self) -> None:
        status, text = self.run_tool("verify")
        self.assertEqual(status, 0, text)
        self.assertTrue(text.endswith(" 0 problems\n"), text)
        # Damage a record in the first segment: found, with file and offset.
        path = self.segments[0]
        reader = SegmentReader(path, read_segment(path))
        _, start, end = [r for r in reader.records() if r[0] == RECORD_PUBLISH][1]
        data = bytearray(read_segment(path))
        data[end - 1] ^= 0xFF
        with open(path, "wb") as f:
            f.write(data)
        status, text = self.run_tool("verify")
        self.assertEqual(status, 1)
        self.assertIn(f"{path} at offset {start - 9}: corrupt", text)
        # And the tool changed nothing.
        self.assertEqual(read_segment(path), bytes(data))

    def test_dump(self) -> None:
        status, text = self.run_tool("dump", "--bodies")
        self.assertEqual(status, 0)
        self.assertEqual(text.count(" publish "), 31)
        self.assertEqual(text.count(" settle "), 10)
        self.assertEqual(text.count(" requeue "), 1)
        self.assertIn("queues=['a', 'b']", text)
        self.assertIn('headers={"n": "0"}', text)
        self.assertIn("body: b'\\x00binary'", text)
        self.assertIn('"arguments": {"x-max-length": 5}', text)

    def test_module(self) -> None:
        """C{python -m qmq.store.tool} runs; a bad directory is status 2."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=root)
        done = subprocess.run(
            [sys.executable, "-m", "qmq.store.tool", self.dir, "count"],
            capture_output=True,
            env=env,
            timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(b"31 live messages", done.stdout)
        done = subprocess.run(
            [sys.executable, "-m", "qmq.store.tool", self.dir + "-missing", "list"],
            capture_output=True,
            env=env,
            timeout=60,
        )
        self.assertEqual(done.returncode, 2)
