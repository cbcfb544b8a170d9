"""The qmq PySpark data source: batch reads over HTTP and from segment files,
body decoding, writes, streaming reads; a real broker on 127.0.0.1 and one
local[2] SparkSession (tests/spark_helpers.py)."""

from __future__ import annotations

import json
import os

from twisted.internet import defer
from twisted.trial import unittest

from tests.spark_helpers import SKIP, BrokerSiteMixin, in_thread, spark_session


def rows_by_queue(rows: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r["queue"], []).append(r)
    return out


class BatchReadTests(BrokerSiteMixin, unittest.TestCase):
    skip = SKIP
    timeout = 120

    def setUp(self) -> None:
        self.start_broker()
        self.spark = spark_session()

    @defer.inlineCallbacks
    def fill(self) -> defer.Deferred:
        """Two queues with retention, 60 and 40 messages; a third not read."""
        for q in ("orders", "clicks", "other"):
            self.vhost.declare_queue(q, arguments={"x-retention": 3600})
        published: dict[str, list] = {"orders": [], "clicks": []}
        for q, n in (("orders", 60), ("clicks", 40)):
            msgs = [{"body": f"{q}-{i}", "headers": {"n": str(i), "kind": q}, "priority": i % 10}
                    for i in range(n)]
            ids = yield self.publish(q, msgs)
            published[q] = list(zip(ids, msgs, strict=True))
        yield self.publish("other", [{"body": "x"}])
        # a binary body and one consumed (acked): a scan still reads it
        yield self.publish("orders", [{"body": "AAEC/w==", "encoding": "base64"}])
        return published

    def check(self, rows: list, published: dict) -> None:
        by_queue = rows_by_queue(rows)
        self.assertEqual(sorted(by_queue), ["clicks", "orders"])
        self.assertEqual(len(by_queue["orders"]), 61)
        self.assertEqual(len(by_queue["clicks"]), 40)
        for q, sent in published.items():
            got = by_queue[q][: len(sent)]
            self.assertEqual([r["message_id"] for r in got], [i for i, _ in sent])
            self.assertEqual([bytes(r["body"]) for r in got], [m["body"].encode() for _, m in sent])
            self.assertEqual([dict(r["headers"]) for r in got], [m["headers"] for _, m in sent])
            self.assertEqual([r["priority"] for r in got], [m["priority"] for _, m in sent])
            self.assertEqual({r["destination"] for r in got}, {f"/queue/{q}"})
        self.assertEqual(bytes(by_queue["orders"][-1]["body"]), b"\x00\x01\x02\xff")

    @defer.inlineCallbacks
    def test_http_equals_published(self) -> None:
        """Over HTTP, several destinations, three time slices each: every
        message once, in order per destination, headers and bodies intact."""
        published = yield self.fill()
        df = (self.spark.read.format("qmq").option("url", self.base)
              .option("destinations", "orders,/queue/clicks")
              .option("partitionsPerDestination", "3").option("pageSize", "7").load())
        self.assertEqual(df.schema.fieldNames()[:6],
                         ["destination", "message_id", "timestamp", "priority", "headers", "body"])
        parts = yield in_thread(lambda: df.rdd.getNumPartitions())
        self.assertEqual(parts, 6)
        rows = yield in_thread(df.collect)
        self.check(rows, published)

    @defer.inlineCallbacks
    def test_http_pattern_and_time_range(self) -> None:
        """A pattern picks queues; the time range bounds what is read."""
        published = yield self.fill()
        q = self.vhost.queues["orders"]
        self.assertTrue(q)
        df = (self.spark.read.format("qmq").option("url", self.base)
              .option("pattern", "[oc]*").load())
        rows = yield in_thread(df.collect)
        self.assertEqual({r["queue"] for r in rows}, {"orders", "clicks", "other"})
        first = min(r["timestamp"] for r in rows).timestamp()
        df = (self.spark.read.format("qmq").option("url", self.base).option("destination", "orders")
              .option("startingTimestamp", str(first + 3600)).load())
        self.assertEqual((yield in_thread(df.count)), 0)
        df = (self.spark.read.format("qmq").option("url", self.base).option("destination", "orders")
              .option("endingTimestamp", str(first + 3600)).load())
        self.assertEqual((yield in_thread(df.count)), len(published["orders"]) + 1)

    @defer.inlineCallbacks
    def test_segments_equal_published(self) -> None:
        """The path option reads segment files: the same rows as HTTP."""
        published = yield self.fill()
        df = (self.spark.read.format("qmq").option("path", self.data)
              .option("destinations", "orders,clicks").option("splitBytes", "700").load())
        # the segment is cut in byte ranges: each record read by one split
        parts = yield in_thread(lambda: df.rdd.getNumPartitions())
        self.assertGreater(parts, 5)
        rows = yield in_thread(lambda: df.orderBy("queue", "message_id").collect())
        self.check(rows, published)
        over_http = (self.spark.read.format("qmq").option("url", self.base)
                     .option("destinations", "orders,clicks").load())
        a = yield in_thread(lambda: sorted(tuple(r) for r in df.drop("headers").collect()))
        b = yield in_thread(lambda: sorted(tuple(r) for r in over_http.drop("headers").collect()))
        self.assertEqual(a, b)

    @defer.inlineCallbacks
    def test_decode_json_and_avro(self) -> None:
        """bodyFormat decodes JSON (schema given) and Avro bodies (a project
        schema) into columns; a body that does not decode gives nulls."""
        import io  # noqa: PLC0415

        import fastavro  # noqa: PLC0415

        from qmq.spark import message_schema  # noqa: PLC0415
        from qmq.spark.client import project_schema  # noqa: PLC0415

        self.vhost.declare_queue("j")
        self.vhost.declare_queue("a")
        yield self.publish("j", [{"body": json.dumps({"sku": "x1", "qty": 3})},
                                 {"body": json.dumps({"sku": "x2", "qty": 5})},
                                 {"body": "not json"}])
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, project_schema("PublishMessage"), {
            "body": b"inner", "headers": {"a": "b"}, "destination": "/queue/z", "routing_key": None,
            "priority": 4, "ttl": None, "delay": None, "persistent": True})
        import base64  # noqa: PLC0415

        yield self.publish("a", [{"body": base64.b64encode(buf.getvalue()).decode(),
                                  "encoding": "base64"}])
        df = (self.spark.read.format("qmq").schema(message_schema("sku STRING, qty INT"))
              .option("url", self.base).option("destination", "j").option("bodyFormat", "json")
              .load())
        rows = yield in_thread(df.select("sku", "qty").collect)
        self.assertEqual([tuple(r) for r in rows], [("x1", 3), ("x2", 5), (None, None)])
        df = (self.spark.read.format("qmq").option("path", self.data).option("destination", "a")
              .option("bodyFormat", "avro").option("avroSchema", "PublishMessage").load())
        rows = yield in_thread(df.select("destination", "body_body", "body_headers",
                                         "body_destination", "body_priority", "persistent").collect)
        # fields named like a message column are body_NAME
        self.assertEqual([tuple(r) for r in rows],
                         [("/queue/a", b"inner", {"a": "b"}, "/queue/z", 4, True)])


class SegmentDecoderTests(unittest.TestCase):
    """qmq.spark.segments alone (pyarrow, no Spark)."""

    skip = SKIP

    def segment(self, bodies: list[bytes]) -> tuple[str, list[int]]:
        from qmq.store.record import encode_publish  # noqa: PLC0415
        from qmq.store.segment import encode_header  # noqa: PLC0415

        out, starts = [encode_header(1, 1)], []
        pos = len(out[0])
        for i, b in enumerate(bodies):
            head, tail = encode_publish(i + 1, 1000.0 + i, 0.0, 0, True, b"/", "", "q",
                                        {"k": str(i)}, b, [b"q"])
            starts.append(pos)
            out.append(head + tail)
            pos += len(head) + len(tail)
        path = os.path.abspath(self.mktemp())
        with open(path, "wb") as f:
            f.write(b"".join(out))
        return path, starts

    def read(self, path: str, **kw: int) -> list[int]:
        from qmq.spark import segments  # noqa: PLC0415

        match = segments.queue_matcher(["q"], None)
        return [i for b in segments.read_messages(path, "/", match, **kw)
                for i in b.column("message_id").to_pylist()]

    def test_damage_skipped_and_tail_cut(self) -> None:
        """A record failing its checksum is skipped; a torn tail ends the
        read; splits partition the records."""
        path, starts = self.segment([b"a" * 10, b"b" * 5000, b"c", b"d"])
        self.assertEqual(self.read(path), [1, 2, 3, 4])
        self.assertEqual(self.read(path, lo=0, hi=starts[2]) + self.read(path, lo=starts[2]),
                         [1, 2, 3, 4])
        self.assertEqual(self.read(path, lo=starts[1] + 1, hi=starts[3]), [3])
        with open(path, "r+b") as f:
            f.seek(starts[1] + 20)
            f.write(b"X")  # inside record 2's payload: its checksum fails
        self.assertEqual(self.read(path), [1, 3, 4])
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 2)  # record 4 torn
        self.assertEqual(self.read(path), [1, 3])


class EmptyTests(unittest.TestCase):
    skip = SKIP

    def test_empty_directory(self) -> None:
        """A directory with no segment reads as no rows."""
        path = os.path.abspath(self.mktemp())
        os.makedirs(path)
        spark = spark_session()
        df = spark.read.format("qmq").option("path", path).load()
        self.assertEqual(df.count(), 0)


class WriteTests(BrokerSiteMixin, unittest.TestCase):
    skip = SKIP
    timeout = 120

    def setUp(self) -> None:
        self.start_broker()
        self.spark = spark_session()

    @defer.inlineCallbacks
    def test_round_trip(self) -> None:
        """Rows written (destination column, headers, priority, string and
        binary bodies) read back the same, after the write confirmed them
        durable."""
        self.vhost.declare_queue("w1", arguments={"x-retention": 3600})
        self.vhost.declare_queue("w2", arguments={"x-retention": 3600})
        rows = [(f"/queue/w{1 + i % 2}", bytes([i % 256]) * (i % 5 + 1), {"i": str(i)}, i % 10)
                for i in range(250)]
        df = self.spark.createDataFrame(rows, "destination STRING, body BINARY, "
                                              "headers MAP<STRING,STRING>, priority INT").repartition(3)
        yield in_thread(lambda: df.write.format("qmq").option("url", self.base)
                        .option("batchSize", "40").mode("append").save())
        self.assertEqual(len(self.vhost.queues["w1"]) + len(self.vhost.queues["w2"]), 250)
        back = (self.spark.read.format("qmq").option("url", self.base)
                .option("destinations", "w1,w2").load())
        got = yield in_thread(back.collect)
        self.assertEqual(
            sorted((r["destination"], bytes(r["body"]), r["headers"]["i"], r["priority"]) for r in got),
            sorted((d, b, h["i"], p) for d, b, h, p in rows))
        # every row carried a dedup id, unique
        ids = {r["headers"]["dedup-id"] for r in got}
        self.assertEqual(len(ids), 250)

    @defer.inlineCallbacks
    def test_destination_option_topic(self) -> None:
        """The destination option may name a topic: its rows reach the
        queues bound to it."""
        self.vhost.declare_queue("t1", arguments={"x-retention": 3600})
        self.vhost.bind("t1", "amq.topic", "prices.#")
        df = self.spark.createDataFrame([(f"p{i}",) for i in range(7)], "body STRING")
        yield in_thread(lambda: df.write.format("qmq").option("url", self.base)
                        .option("destination", "/topic/prices.eu").mode("append").save())
        back = self.spark.read.format("qmq").option("url", self.base).option("destination", "t1").load()
        rows = yield in_thread(back.collect)
        self.assertEqual(sorted(bytes(r["body"]) for r in rows), [f"p{i}".encode() for i in range(7)])
        self.assertEqual({r["destination"] for r in rows}, {"/topic/prices.eu"})

    @defer.inlineCallbacks
    def test_retried_batch_no_duplicates(self) -> None:
        """The same write retried (same dedup prefix, as a retried task or
        micro-batch has) into an effectively-once queue adds nothing."""
        self.vhost.declare_queue("once", arguments={"x-delivery-guarantee": "effectively-once"})
        df = self.spark.createDataFrame([(f"m{i}",) for i in range(30)], "body STRING").coalesce(1)

        def write() -> None:
            (df.write.format("qmq").option("url", self.base).option("destination", "once")
             .option("dedupPrefix", "job-7").option("batchSize", "8").mode("append").save())

        yield in_thread(write)
        yield in_thread(write)
        self.assertEqual(len(self.vhost.queues["once"]), 30)


class StreamingTests(BrokerSiteMixin, unittest.TestCase):
    skip = SKIP
    timeout = 180

    def setUp(self) -> None:
        self.start_broker()
        self.spark = spark_session()

    @defer.inlineCallbacks
    def test_restart_from_checkpoint(self) -> None:
        """A streaming query stopped and restarted from its checkpoint reads
        every message once: the first run reads what was there, in batches
        of at most the per-trigger limit; the second run reads only what
        came after."""
        for q in ("s1", "s2"):
            self.vhost.declare_queue(q, arguments={"x-retention": 3600})
        yield self.publish("s1", [{"body": f"a{i}"} for i in range(25)])
        yield self.publish("s2", [{"body": f"b{i}"} for i in range(10)])
        base = os.path.abspath(self.mktemp())
        out, checkpoint = os.path.join(base, "out"), os.path.join(base, "cp")

        def run() -> list:
            q = (self.spark.readStream.format("qmq").option("url", self.base)
                 .option("pattern", "s*").option("maxRowsPerTrigger", "12").load()
                 .writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            q.awaitTermination(120)
            sizes = [p["numInputRows"] for p in q.recentProgress]
            q.stop()
            return sizes

        sizes = yield in_thread(run)
        self.assertEqual(sum(sizes), 35)
        self.assertEqual(max(sizes), 12)  # the per-trigger limit
        yield self.publish("s1", [{"body": f"a{i}"} for i in range(25, 30)])
        yield self.publish("s2", [{"body": f"b{i}"} for i in range(10, 13)])
        sizes2 = yield in_thread(run)
        self.assertEqual(sum(sizes2), 8)
        got = yield in_thread(lambda: self.spark.read.parquet(out).collect())
        bodies = sorted(bytes(r["body"]).decode() for r in got)
        self.assertEqual(bodies, sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(13)]))

    @defer.inlineCallbacks
    def test_stream_write_replayed_batch(self) -> None:
        """A streaming write's dedup ids are the query's and the micro-batch's:
        a micro-batch replayed after a restart (its commit lost) publishes
        nothing new into an effectively-once queue."""
        self.vhost.declare_queue("src", arguments={"x-retention": 3600})
        self.vhost.declare_queue("dst", arguments={"x-delivery-guarantee": "effectively-once"})
        yield self.publish("src", [{"body": f"m{i}"} for i in range(20)])
        checkpoint = os.path.abspath(self.mktemp())

        def run() -> str:
            q = (self.spark.readStream.format("qmq").option("url", self.base)
                 .option("destination", "src").option("maxRowsPerTrigger", "8").load()
                 .select("body", "headers")
                 .writeStream.format("qmq").option("url", self.base).option("destination", "dst")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            q.awaitTermination(120)
            q.stop()
            return str(q.id)

        query = yield in_thread(run)
        dst = self.vhost.queues["dst"]
        self.assertEqual(len(dst), 20)
        back = (self.spark.read.format("qmq").option("url", self.base)
                .option("destination", "dst").load())
        rows = yield in_thread(back.collect)
        ids = {r["headers"]["dedup-id"] for r in rows}
        self.assertEqual(len(ids), 20)
        self.assertEqual({i.rsplit(".", 3)[0] for i in ids}, {query})
        commits = os.path.join(checkpoint, "commits")
        last = max(int(n) for n in os.listdir(commits) if n.isdigit())
        for name in (str(last), f".{last}.crc"):  # the commit and its checksum file
            if os.path.exists(os.path.join(commits, name)):
                os.remove(os.path.join(commits, name))
        yield in_thread(run)
        self.assertEqual(len(dst), 20)
        # the last micro-batch (8, 8, then 4 rows) ran again: 4 duplicates dropped
        self.assertEqual(dst.window.duplicates, 4)


class AuthTests(BrokerSiteMixin, unittest.TestCase):
    """Reads and writes with HTTP Basic against a broker that authenticates."""

    skip = SKIP
    timeout = 120

    def setUp(self) -> None:
        from twisted.internet import reactor  # noqa: PLC0415

        from qmq.auth import Authenticator, AuthSettings, PermissionSettings, UserSettings  # noqa: PLC0415
        from qmq.auth.passwords import hash_password  # noqa: PLC0415

        self.start_broker()
        self.spark = spark_session()
        hashed = hash_password("wonderland", 4)  # a cheap hash: tests only
        self.broker.auth = Authenticator(
            AuthSettings(failure_delay=0.01, failure_max_delay=0.02),
            reactor,
            users=[UserSettings("alice", hashed)],
            permissions={"/": [PermissionSettings("alice", ".*", ".*", ".*")]},
            run=lambda f, *a: defer.maybeDeferred(f, *a),
        )
        self.vhost.declare_queue("locked", arguments={"x-retention": 3600})

    @defer.inlineCallbacks
    def test_basic_auth(self) -> None:
        """user and password authenticate the writes and the reads; a wrong
        password fails the job, saying why."""
        df = self.spark.createDataFrame([(f"m{i}",) for i in range(5)], "body STRING")

        def write() -> None:
            (df.write.format("qmq").option("url", self.base).option("destination", "locked")
             .option("user", "alice").option("password", "wonderland").mode("append").save())

        yield in_thread(write)
        self.assertEqual(len(self.vhost.queues["locked"]), 5)

        def read(password: str) -> int:
            return int(self.spark.read.format("qmq").option("url", self.base)
                       .option("destination", "locked").option("user", "alice")
                       .option("password", password).load().count())

        self.assertEqual((yield in_thread(read, "wonderland")), 5)
        try:
            yield in_thread(read, "nope")
        except Exception as e:  # noqa: BLE001 - PySpark's wrapped Python error
            self.assertIn("401", str(e))
        else:
            self.fail("a wrong password read something")
