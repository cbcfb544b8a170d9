# -*- test-case-name: tests.test_spark -*-
"""Reading commit-log segment files straight into Arrow record batches.

The ``path`` option of the ``qmq`` data source (and the report job's
events) read a data directory's segments without a broker: one Spark
partition per segment file, each turned into C{pyarrow.RecordBatch}es here
(no pyspark needed, so this is testable and benchmarkable alone). The
records are decoded with L{qmq.store.record}, the same code the store
recovers with.

A publish record names every durable queue it reached: it becomes one row
per queue that the read selects. A segment holds what the log still has:
messages still queued, acked ones kept for C{x-retention}, and older ones
whose segment is still on disk (as with a range scan). Compaction copies
live records forward into a newer segment: reading a directory that a
running broker compacts meanwhile may show a message twice (same queue and
id); C{dropDuplicates(["queue", "message_id"])} removes those.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from qmq.store.record import (
    RECORD_DECLARE_QUEUE,
    RECORD_PUBLISH,
    RECORD_REQUEUE,
    RECORD_SETTLE,
    RecordError,
    decode_publish_fields,
    decode_requeue,
    decode_settle,
    decode_topology,
)
from qmq.store.segment import SegmentReader, list_segments, read_segment

#: Rows per record batch.
BATCH_ROWS = 8192

TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.map_(pa.string(), pa.string())

#: The Arrow schema of a message row (the data source's columns).
MESSAGE_SCHEMA = pa.schema(
    [
        ("destination", pa.string()),
        ("message_id", pa.int64()),
        ("timestamp", TIMESTAMP),
        ("priority", pa.int32()),
        ("headers", HEADERS),
        ("body", pa.binary()),
        ("queue", pa.string()),
    ]
)

#: The Arrow schema of a log event (C{records=events}, the report job).
EVENT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("vhost", pa.string()),
        ("queue", pa.string()),
        ("message_id", pa.int64()),
        ("timestamp", TIMESTAMP),
        ("destination", pa.string()),
        ("bytes", pa.int64()),
        ("producer", pa.string()),
        ("reason", pa.string()),
        ("kept_until", TIMESTAMP),
        ("delivery_count", pa.int32()),
        ("retention", pa.float64()),
        ("segment", pa.int64()),
    ]
)


def log_directory(path: str) -> str:
    """The directory holding the segments: C{path} itself, or its C{log}
    subdirectory (a broker's C{data_dir})."""
    if any(n.endswith(".seg") for n in os.listdir(path)):
        return path
    sub = os.path.join(path, "log")
    if os.path.isdir(sub):
        return sub
    return path


def segment_files(path: str) -> list[tuple[int, str]]:
    """C{(number, file)} of every segment under C{path}, in order."""
    return list_segments(log_directory(path))


def queue_matcher(queues: list[str] | None, pattern: str | None) -> Callable[[str], bool]:
    """A predicate on queue names: in C{queues}, or matching the glob
    C{pattern}; everything when neither is given."""
    wanted = frozenset(queues or ())
    if pattern:
        regex = fnmatch.translate(pattern)
        import re  # noqa: PLC0415

        match = re.compile(regex).match
        if wanted:
            return lambda q: q in wanted or match(q) is not None
        return lambda q: match(q) is not None
    if wanted:
        return wanted.__contains__
    return lambda q: True


def _destination(headers: dict | None, exchange: str, routing_key: str) -> str:
    if headers:
        d = headers.get("destination")
        if d:
            return d  # type: ignore[no-any-return]
    if not exchange:
        return "/queue/" + routing_key
    if exchange == "amq.topic":
        return "/topic/" + routing_key
    return f"/exchange/{exchange}/{routing_key}"


def _ms(ts: float) -> int:
    """Seconds since the epoch as microseconds, at millisecond precision
    (what the HTTP API's Avro gives: both ways read the same values)."""
    return int(ts * 1000) * 1000


class _MessageColumns:
    """Columns of message rows being gathered."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.dest: list[str] = []
        self.ids: list[int] = []
        self.ts: list[int] = []
        self.prio: list[int] = []
        self.offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str] = []
        self.body: list[bytes] = []
        self.queue: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, dest: str, mid: int, ts_us: int, prio: int, headers: dict | None,
            body: bytes, queue: str) -> None:
        self.dest.append(dest)
        self.ids.append(mid)
        self.ts.append(ts_us)
        self.prio.append(prio)
        if headers:
            for k, v in headers.items():
                if k != "destination":
                    self.keys.append(k)
                    self.values.append(v if v.__class__ is str else str(v))
        self.offsets.append(len(self.keys))
        self.body.append(body)
        self.queue.append(queue)

    def batch(self) -> pa.RecordBatch:
        headers = pa.MapArray.from_arrays(
            pa.array(self.offsets, pa.int32()),
            pa.array(self.keys, pa.string()),
            pa.array(self.values, pa.string()),
        )
        b = pa.RecordBatch.from_arrays(
            [
                pa.array(self.dest, pa.string()),
                pa.array(self.ids, pa.int64()),
                pa.array(self.ts, pa.int64()).cast(TIMESTAMP),
                pa.array(self.prio, pa.int32()),
                headers.cast(HEADERS),
                pa.array(self.body, pa.binary()),
                pa.array(self.queue, pa.string()),
            ],
            schema=MESSAGE_SCHEMA,
        )
        self.clear()
        return b


def read_messages(
    file: str,
    vhost: str,
    match: Callable[[str], bool],
    start: float = 0.0,
    end: float = float("inf"),
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The message rows of one segment file: publishes of C{vhost} to a
    queue that C{match}es, published in [C{start}, C{end})."""
    data = read_segment(file)
    reader = SegmentReader(file, data)
    cols = _MessageColumns()
    vname = vhost.encode()
    for type_, rstart, rend in reader.records():
        if type_ != RECORD_PUBLISH:
            continue
        if data.find(vname, rstart, rend) < 0:
            continue
        try:
            (mid, ts, _exp, prio, _flags, vh, exchange, rk, headers, queues, body) = (
                decode_publish_fields(data, rstart, rend)
            )
        except RecordError:
            continue  # damage: never shown (as the broker)
        if vh != vhost or not start <= ts < end:
            continue
        dest = None
        for q in queues:
            if match(q):
                if dest is None:
                    dest = _destination(headers, exchange, rk)
                cols.add(dest, mid, _ms(ts), prio, headers, body, q)
        if len(cols) >= batch_rows:
            yield cols.batch()
    if len(cols):
        yield cols.batch()


def read_events(
    file: str,
    number: int,
    vhost: str | None,
    match: Callable[[str], bool],
    producer_header: str = "producer",
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The log events of one segment file, as rows of L{EVENT_SCHEMA}:

      - C{publish}: a message reaching a queue (one row per queue): its
        time, destination, body size and producer (the C{producer_header}
        header, if any);
      - C{settle}: a message leaving a queue, its C{reason} (C{ack},
        C{dead-letter}, C{expire}, ...) and, for a queue with retention,
        C{kept_until} (the ack time plus the retention);
      - C{requeue}: a message given back, with its delivery count;
      - C{declare}: a queue declared, with its C{x-retention} (seconds, or
        null).
    """
    data = read_segment(file)
    reader = SegmentReader(file, data)
    rows: dict[str, list[Any]] = {n: [] for n in EVENT_SCHEMA.names}
    count = 0

    def add(kind: str, vh: str, queue: str, mid: int | None, ts: int | None, dest: str | None,
            size: int | None, producer: str | None, reason: str | None, kept: int | None,
            dc: int | None, retention: float | None) -> None:
        rows["kind"].append(kind)
        rows["vhost"].append(vh)
        rows["queue"].append(queue)
        rows["message_id"].append(mid)
        rows["timestamp"].append(ts)
        rows["destination"].append(dest)
        rows["bytes"].append(size)
        rows["producer"].append(producer)
        rows["reason"].append(reason)
        rows["kept_until"].append(kept)
        rows["delivery_count"].append(dc)
        rows["retention"].append(retention)
        rows["segment"].append(number)

    for type_, rstart, rend in reader.records():
        try:
            if type_ == RECORD_PUBLISH:
                (mid, ts, _e, _p, _f, vh, exchange, rk, headers, queues, size) = (
                    decode_publish_fields(data, rstart, rend, False)
                )
                if vhost is not None and vh != vhost:
                    continue
                dest = _destination(headers, exchange, rk)
                producer = headers.get(producer_header) if headers else None
                for q in queues:
                    if match(q):
                        add("publish", vh, q, mid, _ms(ts), dest, size, producer,
                            None, None, None, None)
                        count += 1
            elif type_ == RECORD_SETTLE:
                vh, q, mid, reason, kept = decode_settle(data, rstart, rend)
                if (vhost is None or vh == vhost) and match(q):
                    add("settle", vh, q, mid, None, None, None, None, reason,
                        _ms(kept) if kept else None, None, None)
                    count += 1
            elif type_ == RECORD_REQUEUE:
                vh, q, mid, dc = decode_requeue(data, rstart, rend)
                if (vhost is None or vh == vhost) and match(q):
                    add("requeue", vh, q, mid, None, None, None, None, None, None, dc, None)
                    count += 1
            elif type_ == RECORD_DECLARE_QUEUE:
                fields = decode_topology(data, rstart, rend, type_)
                vh, q = fields["vhost"], fields["queue"]
                if (vhost is None or vh == vhost) and match(q):
                    args = fields.get("arguments") or {}
                    retention = args.get("x-retention")
                    add("declare", vh, q, None, None, None, None, None, None, None, None,
                        float(retention) if retention else None)
                    count += 1
        except RecordError:
            continue
        if count >= batch_rows:
            yield _event_batch(rows)
            count = 0
    if count:
        yield _event_batch(rows)


def _event_batch(rows: dict[str, list[Any]]) -> pa.RecordBatch:
    arrays = []
    for f in EVENT_SCHEMA:
        values = rows[f.name]
        if f.type == TIMESTAMP:
            arrays.append(pa.array(values, pa.int64()).cast(TIMESTAMP))
        else:
            arrays.append(pa.array(values, f.type))
        values.clear()
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)
