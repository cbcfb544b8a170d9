# -*- test-case-name: tests.test_spark -*-
"""The ``qmq`` PySpark data source: batch and streaming reads, batch and
streaming writes (docs/spark.rst is the guide).

Spark runs a Python data source's methods in Python worker processes: the
classes here are pickled with their options, so they hold only plain
values (a L{Client} connects on first use, in the worker that uses it).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from qmq.spark import segments
from qmq.spark.client import Client, cursor_after, project_schema

#: The message columns, in order (docs/spark.rst, "Schema").
MESSAGE_SCHEMA = StructType(
    [
        StructField("destination", StringType(), False),
        StructField("message_id", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("priority", IntegerType(), False),
        StructField("headers", MapType(StringType(), StringType(), True), False),
        StructField("body", BinaryType(), False),
        StructField("queue", StringType(), False),
    ]
)

#: The columns of C{records=events} (a path read): see L{segments.read_events}.
EVENT_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("vhost", StringType()),
        StructField("queue", StringType()),
        StructField("message_id", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("destination", StringType()),
        StructField("bytes", LongType()),
        StructField("producer", StringType()),
        StructField("reason", StringType()),
        StructField("kept_until", TimestampType()),
        StructField("delivery_count", IntegerType()),
        StructField("retention", DoubleType()),
        StructField("segment", LongType()),
    ]
)

#: The farthest time the HTTP API takes (seconds since the epoch).
FAR = 1e11


def message_schema(body: StructType | str | None = None) -> StructType:
    """The message columns followed by C{body}'s fields (a StructType, or a
    DDL string parsed by the active SparkSession): the schema to give
    C{spark.read.format("qmq").schema(...)} with C{bodyFormat=json}."""
    if body is None:
        return MESSAGE_SCHEMA
    if isinstance(body, str):
        from pyspark.sql import SparkSession  # noqa: PLC0415

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("message_schema(DDL) needs an active SparkSession")
        body = spark.createDataFrame([], body).schema
    return StructType(MESSAGE_SCHEMA.fields + body.fields)


# -- options ----------------------------------------------------------------------------


def _timestamp(text: str | None) -> float | None:
    """Seconds since the epoch from a number (seconds) or an ISO-8601 text
    (UTC unless it says otherwise)."""
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:

        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _queue_name(text: str) -> str:
    text = text.strip()
    if text.startswith("/queue/"):
        return text[len("/queue/"):]
    if text.startswith("/"):
        raise ValueError(f"{text!r}: only queues are read (/queue/NAME or NAME); a topic's messages "
                         "are read from a durable queue bound to it")
    return text


class Options:
    """The options of one read or write, checked (a plain, picklable object)."""

    def __init__(self, options: Any) -> None:
        o = {k.lower(): v for k, v in dict(options).items()}
        self.raw = o
        self.url: str | None = o.get("url")
        self.path: str | None = o.get("path")
        self.vhost: str = o.get("vhost", "/")
        names = o.get("destinations") or o.get("destination") or ""
        #: The destinations as given (a write's may be a topic or an exchange).
        self.destinations: list[str] = [n.strip() for n in names.split(",") if n.strip()]
        self.pattern: str | None = o.get("pattern")
        self.start = _timestamp(o.get("startingtimestamp"))
        self.end = _timestamp(o.get("endingtimestamp"))
        self.slices = int(o.get("partitionsperdestination", "1"))
        self.page = min(1000, int(o.get("pagesize", "1000")))
        self.split_bytes = int(o.get("splitbytes", str(8 * 1024 * 1024)))
        self.user = o.get("user")
        self.password = o.get("password")
        self.token = o.get("token")
        self.body_format = (o.get("bodyformat") or "").lower() or None
        self.avro_schema = o.get("avroschema")
        self.records = o.get("records", "messages")
        self.producer_header = o.get("producerheader", "producer")
        self.max_rows = int(o["maxrowspertrigger"]) if o.get("maxrowspertrigger") else None
        self.starting_offsets = o.get("startingoffsets", "earliest")
        self.batch_size = int(o.get("batchsize", "1000"))
        self.persistent = o.get("persistent", "true").lower() == "true"
        self.dedup_column = o.get("dedupidcolumn")
        self.dedup_prefix = o.get("dedupprefix")
        self.retries = int(o.get("retries", "3"))
        if self.body_format not in (None, "json", "avro"):
            raise ValueError(f"bodyFormat is json or avro, not {self.body_format!r}")
        if self.records not in ("messages", "events"):
            raise ValueError(f"records is messages or events, not {self.records!r}")
        if self.records == "events" and not self.path:
            raise ValueError("records=events reads segment files: give path")
        if self.slices < 1:
            raise ValueError("partitionsPerDestination must be at least 1")

    @property
    def queues(self) -> list[str]:
        """The queues a read covers, by name (a read takes queues only)."""
        return [_queue_name(n) for n in self.destinations]

    def client(self) -> Client:
        if not self.url:
            raise ValueError("the qmq source needs the option url (the broker's HTTP API) or path "
                             "(a data directory)")
        return Client(self.url, self.user, self.password, self.token)

    def matcher(self) -> Any:
        return segments.queue_matcher(self.queues, self.pattern)

    def select_queues(self, client: Client) -> list[str]:
        """The queues a read over HTTP covers: those named, and the durable
        queues matching the pattern."""
        found = list(self.queues)
        if self.pattern or not found:
            match = segments.queue_matcher(None, self.pattern)
            for q in client.queues(self.vhost):
                if q["durable"] and match(q["name"]) and q["name"] not in found:
                    found.append(q["name"])
        return found


def _text(value: Any) -> str:
    """A typed header value as text, as STOMP writes it (bytes in base64)."""
    if value.__class__ is bool:
        return "true" if value else "false"
    if value.__class__ is bytes:
        import base64  # noqa: PLC0415

        return base64.b64encode(value).decode()
    return str(value)


# -- body decoding ------------------------------------------------------------------------


def avro_to_spark(schema: Any) -> DataType:
    """The Spark type of an Avro schema (parsed, as fastavro gives it)."""
    if isinstance(schema, list):
        kinds = [s for s in schema if s != "null"]
        if len(kinds) == 1:
            return avro_to_spark(kinds[0])
        return StringType()  # a union of several kinds: its text
    if isinstance(schema, str):
        return {
            "boolean": BooleanType(), "int": IntegerType(), "long": LongType(),
            "float": FloatType(), "double": DoubleType(), "bytes": BinaryType(),
            "string": StringType(), "null": StringType(),
        }.get(schema, StringType())
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return TimestampType()
    if kind == "record":
        return StructType([StructField(f["name"], avro_to_spark(f["type"])) for f in schema["fields"]])
    if kind == "array":
        return ArrayType(avro_to_spark(schema["items"]))
    if kind == "map":
        return MapType(StringType(), avro_to_spark(schema["values"]))
    if kind == "enum":
        return StringType()
    if kind == "fixed":
        return BinaryType()
    return avro_to_spark(kind)


def _avro_body_schema(text: str) -> Any:
    """An Avro schema from a project schema's name, a file, or JSON text."""
    import fastavro  # noqa: PLC0415

    text = text.strip()
    if text.startswith("{") or text.startswith("["):
        return fastavro.parse_schema(json.loads(text))
    if text.endswith(".avsc"):
        with open(text, encoding="utf-8") as f:
            return fastavro.parse_schema(json.load(f))
    return project_schema(text)


class BodyDecoder:
    """Turns bodies (JSON objects, or Avro datums written without a header)
    into the columns that follow the message columns. A body that does
    not decode gives nulls."""

    def __init__(self, fmt: str, extra: StructType, avro_schema: Any = None) -> None:
        from pyspark.sql.pandas.types import to_arrow_type  # noqa: PLC0415

        self.fmt = fmt
        base = set(MESSAGE_SCHEMA.fieldNames())
        # A decoded field named like a message column is "body_NAME".
        self.names = [n[5:] if n.startswith("body_") and n[5:] in base else n
                      for n in extra.fieldNames()]
        self.types = [to_arrow_type(f.dataType, timezone="UTC") for f in extra.fields]
        self.avro_schema = avro_schema

    def columns(self, bodies: pa.Array) -> list[pa.Array]:
        rows: list[Any] = []
        if self.fmt == "json":
            loads = json.loads
            for b in bodies.to_pylist():
                try:
                    doc = loads(b)
                except ValueError:
                    doc = None
                rows.append(doc if isinstance(doc, dict) else {})
        else:
            import io  # noqa: PLC0415

            from fastavro import schemaless_reader  # noqa: PLC0415

            for b in bodies.to_pylist():
                try:
                    rows.append(schemaless_reader(io.BytesIO(b), self.avro_schema, None))
                except Exception:  # noqa: BLE001 - a bad body is a null row
                    rows.append({})
        out = []
        for name, t in zip(self.names, self.types, strict=True):
            values = [r.get(name) for r in rows]
            try:
                out.append(pa.array(values, t))
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                out.append(pa.array([_coerce(v, t) for v in values], t))
        return out


def _coerce(value: Any, t: pa.DataType) -> Any:
    try:
        pa.array([value], t)
        return value
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None


def _with_bodies(batch: pa.RecordBatch, decoder: BodyDecoder | None,
                 schema: pa.Schema) -> pa.RecordBatch:
    if decoder is None:
        return batch
    columns = batch.columns + decoder.columns(batch.column("body"))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    return to_arrow_schema(schema, timezone="UTC")


def _decoder(opts: Options, schema: StructType) -> BodyDecoder | None:
    if opts.records == "events" or not opts.body_format:
        return None
    extra = StructType(schema.fields[len(MESSAGE_SCHEMA.fields):])
    avro = _avro_body_schema(opts.avro_schema) if opts.body_format == "avro" else None
    return BodyDecoder(opts.body_format, extra, avro)


def _base_batch(batch: pa.RecordBatch, nullable: pa.Schema) -> pa.RecordBatch:
    """C{batch} with the message columns' nullability as Spark expects."""
    return pa.RecordBatch.from_arrays(batch.columns, schema=nullable)


# -- partitions and reading ------------------------------------------------------------------


class ScanPartition(InputPartition):
    """One queue's messages over HTTP: published in [start, end), ids in
    (after, until] (until None: no bound)."""

    def __init__(self, queue: str, start: float, end: float, after: int = 0,
                 until: int | None = None) -> None:
        self.queue = queue
        self.start = start
        self.end = end
        self.after = after
        self.until = until

    def __repr__(self) -> str:
        return (f"ScanPartition({self.queue!r}, {self.start}, {self.end}, after={self.after}, "
                f"until={self.until})")


class SegmentPartition(InputPartition):
    """A segment file of a data directory, or the records that begin in
    its bytes [lo, hi)."""

    def __init__(self, file: str, number: int, lo: int = 0, hi: int | None = None) -> None:
        self.file = file
        self.number = number
        self.lo = lo
        self.hi = hi

    def __repr__(self) -> str:
        return f"SegmentPartition({self.file!r}, {self.lo}, {self.hi})"


def scan_batches(client: Client, vhost: str, p: ScanPartition, page: int,
                 rows: int = segments.BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Record batches of the message columns read by range-scanning
    partition C{p} through C{client}."""
    cursor = cursor_after(p.after) if p.after else None
    until = p.until
    dest: list[str] = []
    ids: list[int] = []
    ts: list[Any] = []
    prio: list[int] = []
    headers: list[Any] = []
    bodies: list[bytes] = []
    queue = p.queue
    while True:
        records, cursor = client.scan(vhost, queue, p.start, p.end, cursor, page)
        done = cursor is None
        for r in records:
            mid = r["number"]
            if until is not None and mid > until:
                done = True
                break
            dest.append(r["destination"])
            ids.append(mid)
            ts.append(r["timestamp"])
            prio.append(r["priority"])
            # Typed header values (the message model's) as text: the
            # headers column is a map of strings.
            headers.append([(k, v if v.__class__ is str or v is None else _text(v))
                            for k, v in r["headers"].items()])
            bodies.append(r["body"])
        if len(ids) >= rows or (done and ids):
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(dest, pa.string()),
                    pa.array(ids, pa.int64()),
                    pa.array(ts, segments.TIMESTAMP),
                    pa.array(prio, pa.int32()),
                    pa.array(headers, segments.HEADERS),
                    pa.array(bodies, pa.binary()),
                    pa.array([queue] * len(ids), pa.string()),
                ],
                schema=segments.MESSAGE_SCHEMA,
            )
            dest, ids, ts, prio, headers, bodies = [], [], [], [], [], []
        if done:
            return


class _Reading:
    """What the batch and stream readers share: reading one partition."""

    opts: Options
    schema: StructType

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        opts = self.opts
        arrow = _arrow_schema(self.schema)
        client: Client | None = None
        if isinstance(partition, SegmentPartition):
            if opts.records == "events":
                nullable = _arrow_schema(EVENT_SCHEMA)
                for b in segments.read_events(partition.file, partition.number, opts.vhost,
                                              opts.matcher(), opts.producer_header):
                    yield pa.RecordBatch.from_arrays(b.columns, schema=nullable)
                return
            source = segments.read_messages(partition.file, opts.vhost, opts.matcher(),
                                            opts.start or 0.0, opts.end or math.inf,
                                            partition.lo, partition.hi)
        elif isinstance(partition, ScanPartition):
            client = opts.client()
            source = scan_batches(client, opts.vhost, partition, opts.page)
        else:
            return  # no partition planned: Spark reads one empty one
        decoder = _decoder(opts, self.schema)
        base = _arrow_schema(MESSAGE_SCHEMA)
        try:
            for b in source:
                b = _base_batch(b, base)
                yield _with_bodies(b, decoder, arrow)
        finally:
            if client is not None:
                client.close()  # no idle connection left behind in a reused worker


class QmqReader(_Reading, DataSourceReader):
    """Batch reads: one partition per segment file (C{path}), or per queue
    and time slice (C{url})."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        if opts.path:
            if opts.records == "events":
                return [SegmentPartition(f, n) for n, f in segments.segment_files(opts.path)]
            return [SegmentPartition(f, n, lo, hi)
                    for n, f, lo, hi in segments.splits(opts.path, opts.split_bytes)]
        client = opts.client()
        try:
            parts: list[InputPartition] = []
            for q in opts.select_queues(client):
                parts.extend(self._slices(client, q))
            return parts
        finally:
            client.close()

    def _slices(self, client: Client, queue: str) -> list[ScanPartition]:
        opts = self.opts
        start = opts.start if opts.start is not None else 0.0
        end = opts.end if opts.end is not None else FAR
        if opts.slices == 1:
            return [ScanPartition(queue, start, end)]
        lo = opts.start
        if lo is None:
            first, _ = client.scan(opts.vhost, queue, start, end, None, 1)
            if not first:
                return [ScanPartition(queue, start, end)]
            lo = first[0]["timestamp"].timestamp()
        hi = opts.end if opts.end is not None else time.time()
        if hi <= lo:
            return [ScanPartition(queue, start, end)]
        step = (hi - lo) / opts.slices
        bounds = [lo + i * step for i in range(opts.slices)] + [end]
        bounds[0] = start
        return [ScanPartition(queue, bounds[i], bounds[i + 1]) for i in range(opts.slices)]


class QmqStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads over HTTP. An offset is, per queue, the last message
    id read (C{{"orders": 1042}}); a micro-batch reads each queue's ids in
    (start, end] with range scans, which go by id, so a query restarted from
    its checkpoint reads on exactly after what it had committed."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        if opts.path:
            raise ValueError("streaming reads go through the HTTP API (url), not path")
        self.opts = opts
        self.schema = schema
        self._client: Client | None = None
        self._available_now = False
        self._target: dict[str, int] | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.opts.client()
        return self._client

    def _window(self) -> tuple[float, float]:
        return (self.opts.start or 0.0, self.opts.end or FAR)

    def _last_ids(self, queue: str, after: int, budget: int | None,
                  cap: int | None = None) -> tuple[int, int]:
        """The id C{budget} messages after C{after} (all, if None; none
        above C{cap}), and how many messages that is."""
        opts = self.opts
        start, end = self._window()
        cursor = cursor_after(after) if after else None
        last, count = after, 0
        while budget is None or count < budget:
            limit = opts.page if budget is None else max(1, min(opts.page, budget - count))
            records, cursor = self.client.scan(opts.vhost, queue, start, end, cursor, limit)
            for r in records[: None if budget is None else budget - count]:
                if cap is not None and r["number"] > cap:
                    return last, count
                last = r["number"]
                count += 1
            if cursor is None:
                break
        return last, count

    def prepareForTriggerAvailableNow(self) -> None:
        """C{trigger(availableNow=True)}: the first micro-batch's planning
        fixes, per queue, the last id there is (L{latestOffset}); batches of
        the per-trigger limit then go up to it, and no further."""
        self._available_now = True
        self._target = None

    def initialOffset(self) -> dict:
        try:
            return self._initial_offset()
        finally:
            self.stop()  # no connection idles between micro-batches

    def _initial_offset(self) -> dict:
        queues = self.opts.select_queues(self.client)
        how = self.opts.starting_offsets
        if how == "earliest":
            return {q: 0 for q in queues}
        if how == "latest":
            return {q: self._last_ids(q, 0, None)[0] for q in queues}
        given = json.loads(how)
        return {q: int(given.get(q, 0)) for q in queues}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows:
            return ReadMaxRows(self.opts.max_rows)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        try:
            return self._latest_offset(start, limit)
        finally:
            self.stop()

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        queues = self.opts.select_queues(self.client)
        for q in start:
            if q not in queues:
                queues.append(q)
        if self._available_now:
            if self._target is None:
                self._target = {q: self._last_ids(q, int(start.get(q, 0)), None)[0]
                                for q in queues}
            queues = [q for q in queues if q in self._target]
        target = self._target or {}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = dict(start)
        for i, q in enumerate(queues):
            share = None if budget is None else math.ceil(budget / (len(queues) - i))
            if share == 0:
                end.setdefault(q, 0)
                continue
            last, count = self._last_ids(q, int(start.get(q, 0)), share, target.get(q))
            end[q] = last
            if budget is not None:
                budget -= count
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = self._window()
        return [
            ScanPartition(q, lo, hi, int(start.get(q, 0)), int(last))
            for q, last in end.items()
            if int(last) > int(start.get(q, 0))
        ]

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# -- writing -----------------------------------------------------------------------------------


class Written(WriterCommitMessage):
    """What one task published."""

    def __init__(self, published: int, ids: list[int]) -> None:
        self.published = published
        self.ids = ids


def _task() -> tuple[int, str | None, str | None]:
    """This task's partition id and, in a streaming query, its query id and
    micro-batch id (Spark's local properties)."""
    from pyspark import TaskContext  # noqa: PLC0415

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None, None
    return (ctx.partitionId(), ctx.getLocalProperty("sql.streaming.queryId"),
            ctx.getLocalProperty("streaming.sql.batchId"))


def _normalize_destination(text: str) -> str:
    return text if text.startswith("/") else "/queue/" + text


class _Writing:
    """Rows to messages, published in batches over HTTP."""

    opts: Options
    prefix: str

    def _prefix(self) -> tuple[int, str]:
        partition, query, batch = _task()
        if self.opts.dedup_prefix:
            return partition, self.opts.dedup_prefix
        if query is not None and batch is not None:
            return partition, f"{query}.{batch}"
        return partition, self.prefix

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        opts = self.opts
        partition, prefix = self._prefix()
        client = opts.client()
        fixed = _normalize_destination(opts.destinations[0]) if opts.destinations else None
        pending: list[dict] = []
        ids: list[int] = []
        published = 0
        index = 0
        try:
            for batch in iterator:
                names = batch.schema.names
                cols = {n: batch.column(n).to_pylist() for n in names}
                if "body" not in cols:
                    raise ValueError("writing to qmq needs a body column (binary or string)")
                if fixed is None and "destination" not in cols:
                    raise ValueError("writing to qmq needs a destination column or option")
                for i in range(batch.num_rows):
                    body = cols["body"][i]
                    if body is None:
                        body = b""
                    elif isinstance(body, str):
                        body = body.encode()
                    headers = dict(cols["headers"][i] or ()) if "headers" in cols else {}
                    headers = {str(k): str(v) for k, v in headers.items() if v is not None}
                    dedup = None
                    if opts.dedup_column:
                        dedup = cols[opts.dedup_column][i]
                    if dedup is None and "dedup-id" not in headers:
                        dedup = f"{prefix}.{partition}.{index}"
                    if dedup is not None:
                        headers["dedup-id"] = str(dedup)
                    dest = cols["destination"][i] if fixed is None else fixed
                    prio = cols["priority"][i] if "priority" in cols else 0
                    pending.append({
                        "body": body,
                        "headers": headers,
                        "destination": _normalize_destination(dest),
                        "routing_key": None,
                        "priority": int(prio or 0),
                        "ttl": None,
                        "delay": None,
                        "persistent": opts.persistent,
                    })
                    index += 1
                    if len(pending) >= opts.batch_size:
                        doc = client.publish(opts.vhost, pending, opts.retries)
                        published += doc["published"]
                        ids.extend(i for i in doc["ids"] if i is not None)
                        pending = []
            if pending:
                doc = client.publish(opts.vhost, pending, opts.retries)
                published += doc["published"]
                ids.extend(i for i in doc["ids"] if i is not None)
        finally:
            client.close()
        return Written(published, ids)


class QmqWriter(_Writing, DataSourceArrowWriter):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        # Made on the driver, pickled to every task: a retried task
        # publishes with the same dedup ids as the attempt it replaces.
        self.prefix = uuid.uuid4().hex

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class QmqStreamWriter(_Writing, DataSourceStreamArrowWriter):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.prefix = uuid.uuid4().hex

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


# -- the data source ----------------------------------------------------------------------------


class QmqDataSource(DataSource):
    """``format("qmq")``: see docs/spark.rst."""

    @classmethod
    def name(cls) -> str:
        return "qmq"

    def schema(self) -> StructType:
        opts = Options(self.options)
        if opts.records == "events":
            return EVENT_SCHEMA
        if opts.body_format == "avro":
            if not opts.avro_schema:
                raise ValueError("bodyFormat=avro needs avroSchema (a project schema's name, "
                                 "an .avsc file or the schema's JSON)")
            body = avro_to_spark(_avro_body_schema(opts.avro_schema))
            base = set(MESSAGE_SCHEMA.fieldNames())
            fields = [StructField("body_" + f.name if f.name in base else f.name, f.dataType)
                      for f in body.fields]  # type: ignore[attr-defined]
            return StructType(MESSAGE_SCHEMA.fields + fields)
        if opts.body_format == "json":
            text = opts.raw.get("bodyschema")
            if not text:
                raise ValueError("bodyFormat=json needs the body's columns: .schema(qmq.spark."
                                 "message_schema('a INT, b STRING')) or option bodySchema "
                                 "(a StructType's JSON)")
            body = StructType.fromJson(json.loads(text))
            return StructType(MESSAGE_SCHEMA.fields + body.fields)
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return QmqReader(Options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QmqStreamReader(Options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> QmqWriter:
        return QmqWriter(Options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> QmqStreamWriter:
        return QmqStreamWriter(Options(self.options))
