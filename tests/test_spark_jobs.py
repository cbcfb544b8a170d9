"""The Spark jobs: archive (incremental, no duplicates on a rerun) and report
(numbers checked against a known traffic pattern written as a log)."""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from datetime import UTC

from twisted.internet import defer
from twisted.trial import unittest

from tests.spark_helpers import SKIP, BrokerSiteMixin, in_thread, spark_session

T0 = 1_700_000_040.0  # on a minute


def write_log(directory: str) -> None:
    """A segment holding a known traffic pattern:

      - orders (x-retention 3600), minute 0: ids 1-10, 100 bytes each, from
        p1, each acked 2 s after its publish;
      - orders, minute 1: ids 11-15, 200 bytes, from p2; 11 and 12 given
        back once, then acked 5 s after publish; 13 dead-lettered; 14 and 15
        not settled;
      - audit (no retention), minute 0: ids 16-18, 50 bytes, no producer,
        acked (the ack time is not in the log); minute 3: id 19, the same
        (minutes 1 and 2 without traffic).
    """
    from qmq.store.record import (  # noqa: PLC0415
        RECORD_DECLARE_QUEUE,
        encode_publish,
        encode_requeue,
        encode_settle,
        encode_topology,
    )
    from qmq.store.segment import encode_header, segment_name  # noqa: PLC0415

    out = [encode_header(1, 1)]
    out.append(encode_topology(RECORD_DECLARE_QUEUE, {"vhost": "/", "queue": "orders",
                                                      "arguments": {"x-retention": 3600}}))
    out.append(encode_topology(RECORD_DECLARE_QUEUE, {"vhost": "/", "queue": "audit",
                                                      "arguments": None}))

    def publish(mid: int, ts: float, queue: str, size: int, producer: str | None) -> None:
        headers = {"producer": producer} if producer else {"x": "y"}
        head, tail = encode_publish(mid, ts, 0.0, 0, True, b"/", "", queue, headers,
                                    b"b" * size, [queue.encode()])
        out.append(head + tail)

    def settle(mid: int, queue: str, reason: str, kept: float = 0.0) -> None:
        out.append(encode_settle(b"/", queue.encode(), mid, reason, kept))

    for i in range(10):
        publish(1 + i, T0 + i, "orders", 100, "p1")
        settle(1 + i, "orders", "ack", T0 + i + 2 + 3600)
    for i in range(5):
        publish(11 + i, T0 + 60 + i, "orders", 200, "p2")
    for mid in (11, 12):
        out.append(encode_requeue(b"/", b"orders", mid, 1))
        settle(mid, "orders", "ack", T0 + 60 + (mid - 11) + 5 + 3600)
    settle(13, "orders", "dead-letter")
    for i in range(3):
        publish(16 + i, T0 + 5, "audit", 50, None)
        settle(16 + i, "audit", "ack")
    publish(19, T0 + 185, "audit", 50, None)
    settle(19, "audit", "ack")
    with open(os.path.join(directory, segment_name(1)), "wb") as f:
        f.write(b"".join(out))


class MasterTests(unittest.TestCase):
    skip = SKIP

    def test_master(self) -> None:
        """--master wins; under spark-submit (its gateway in the
        environment) the job keeps spark-submit's master; alone, local[*]."""
        from qmq.spark import jobs  # noqa: PLC0415

        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
        self.patch(os, "environ", env)
        self.assertEqual(jobs._master("spark://h:7077"), "spark://h:7077")
        self.assertEqual(jobs._master(None), "local[*]")
        env["PYSPARK_GATEWAY_PORT"] = "40001"
        self.assertIsNone(jobs._master(None))
        self.assertEqual(jobs._master("local[2]"), "local[2]")


class ReportTests(unittest.TestCase):
    skip = SKIP
    timeout = 180

    def test_known_pattern(self) -> None:
        """The report's per-minute numbers, top producers and files; its
        summary line; the chart's data breaks the line where a destination
        had no traffic."""
        from qmq.spark import jobs  # noqa: PLC0415

        spark_session()
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        write_log(data)
        out = os.path.abspath(self.mktemp())
        charted = []

        def chart_series(rows: list[dict], *a: object) -> tuple:
            charted.append(real(rows, *a))
            return charted[-1]

        real = jobs.chart_series
        self.patch(jobs, "chart_series", chart_series)
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        self.assertEqual(jobs.main(["--master", "local[2]", "report", "--path", data,
                                    "--out", out]), 0)
        summary = err.getvalue().splitlines()[-1]
        self.assertRegex(summary, r"^qmq-spark report: done: 19 row\(s\) read, 7 row\(s\) written, "
                                  r"\d+ file\(s\), \d+\.\d s$")
        # Parquet parts (at least one a table) and the four files.
        self.assertGreaterEqual(int(summary.split(", ")[2].split()[0]), 6)
        [(series, left_out)] = charted
        self.assertEqual((sorted(series), left_out), (["/queue/audit", "/queue/orders"], []))
        audit = series["/queue/audit"]
        self.assertEqual([m.astimezone(UTC).strftime("%H:%M") for m in audit["minute"]][::2], ["22:14", "22:17"])
        self.assertEqual(audit["messages"][::2], [3, 1])
        self.assertTrue(math.isnan(audit["messages"][1]), audit)
        self.assertEqual(series["/queue/orders"]["messages"], [10, 5])
        with open(os.path.join(out, "per_minute.csv"), encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        got = {(r["destination"], r["minute"][11:16]): r for r in rows}
        self.assertEqual(sorted(got), [("/queue/audit", "22:14"), ("/queue/audit", "22:17"),
                                       ("/queue/orders", "22:14"), ("/queue/orders", "22:15")])
        o0, o1, a0 = got["/queue/orders", "22:14"], got["/queue/orders", "22:15"], got["/queue/audit", "22:14"]
        self.assertEqual((o0["messages"], o0["bytes"], o0["acked"]), ("10", "1000", "10"))
        self.assertEqual((float(o0["ack_delay_avg_ms"]), float(o0["ack_delay_max_ms"])),
                         (2000.0, 2000.0))
        self.assertEqual((o0["redelivered"], o0["dead_lettered"]), ("0", "0"))
        self.assertEqual((o1["messages"], o1["bytes"], o1["acked"]), ("5", "1000", "2"))
        self.assertEqual(float(o1["ack_delay_avg_ms"]), 5000.0)
        self.assertEqual((float(o1["redelivery_rate"]), float(o1["dead_letter_rate"])), (0.4, 0.2))
        self.assertEqual((a0["messages"], a0["bytes"], a0["acked"]), ("3", "150", "3"))
        self.assertEqual(a0["ack_delay_avg_ms"], "")  # not known without retention
        with open(os.path.join(out, "top_producers.csv"), encoding="utf-8") as f:
            top = [(r["destination"], r["rank"], r["producer"], r["messages"])
                   for r in csv.DictReader(f)]
        self.assertEqual(top, [("/queue/audit", "1", "(none)", "4"),
                               ("/queue/orders", "1", "p1", "10"),
                               ("/queue/orders", "2", "p2", "5")])
        with open(os.path.join(out, "report.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertIn("/queue/orders", page)
        self.assertIn("data:image/png;base64,", page)
        back = spark_session().read.parquet(os.path.join(out, "per_minute"))
        self.assertEqual(back.count(), 4)


class ArchiveTests(BrokerSiteMixin, unittest.TestCase):
    skip = SKIP
    timeout = 180

    def setUp(self) -> None:
        self.start_broker()
        self.spark = spark_session()

    @defer.inlineCallbacks
    def run_job(self, *extra: str) -> defer.Deferred:
        """Run the archive job; its summary line (the last on stderr)."""
        from qmq.spark import jobs  # noqa: PLC0415

        err, saved = io.StringIO(), sys.stderr
        sys.stderr = err
        try:
            yield in_thread(jobs.main, ["--master", "local[2]", "archive", "--url", self.base,
                                        "--pattern", "a*", "--out", self.out, *extra])
        finally:
            sys.stderr = saved
        return err.getvalue().splitlines()[-1]

    def assertSummary(self, line: str, read: int, added: int, files: str) -> None:
        self.assertRegex(line, rf"^qmq-spark archive: done: {read} row\(s\) read, "
                               rf"{added} row\(s\) added, {files} file\(s\), \d+\.\d s$")

    def archived(self) -> list:
        return sorted((r["destination"], r["message_id"], bytes(r["body"]))
                      for r in self.spark.read.parquet(self.out).collect())

    @defer.inlineCallbacks
    def test_twice_no_duplicates(self) -> None:
        """Run twice over one range: the second adds nothing; after more
        traffic a run adds just that; partitions by destination and date."""
        self.out = os.path.abspath(self.mktemp())
        for q in ("a1", "a2"):
            self.vhost.declare_queue(q, arguments={"x-retention": 3600})
        yield self.publish("a1", [{"body": f"x{i}"} for i in range(20)])
        yield self.publish("a2", [{"body": f"y{i}"} for i in range(10)])
        self.assertSummary((yield self.run_job("--start", "0", "--end", "1e10")), 30, 30, "[2-9]")
        first = yield in_thread(self.archived)
        self.assertEqual(len(first), 30)
        self.assertSummary((yield self.run_job("--start", "0", "--end", "1e10")), 30, 0, "0")
        self.assertEqual((yield in_thread(self.archived)), first)
        yield self.publish("a1", [{"body": f"x{i}"} for i in range(20, 25)])
        self.assertSummary((yield self.run_job()), 35, 5, "[1-9]")
        final = yield in_thread(self.archived)
        self.assertEqual(len(final), 35)
        self.assertEqual(len(set(final)), 35)
        dirs = sorted(os.listdir(self.out))
        self.assertIn("destination=%2Fqueue%2Fa1", dirs)
        dates = os.listdir(os.path.join(self.out, "destination=%2Fqueue%2Fa1"))
        self.assertTrue(dates and all(d.startswith("date=") for d in dates), dates)

    @defer.inlineCallbacks
    def test_streaming_checkpoint(self) -> None:
        """With --checkpoint: each run reads what is new since the last."""
        self.out = os.path.abspath(self.mktemp())
        cp = os.path.abspath(self.mktemp())
        self.vhost.declare_queue("a3", arguments={"x-retention": 3600})
        yield self.publish("a3", [{"body": f"z{i}"} for i in range(12)])
        line = yield self.run_job("--checkpoint", cp, "--max-rows", "5")
        self.assertSummary(line, 12, 12, "[1-9]")
        self.assertEqual(len((yield in_thread(self.archived))), 12)
        self.assertSummary((yield self.run_job("--checkpoint", cp)), 0, 0, "0")
        yield self.publish("a3", [{"body": f"z{i}"} for i in range(12, 15)])
        self.assertSummary((yield self.run_job("--checkpoint", cp)), 3, 3, "1")
        final = yield in_thread(self.archived)
        self.assertEqual([b for _, _, b in final], [f"z{i}".encode() for i in range(15)])
