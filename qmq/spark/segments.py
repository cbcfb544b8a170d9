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
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from itertools import accumulate, chain
from typing import Any

import pyarrow as pa

from qmq.store.record import (
    FLAG_HEADERS_JSON,
    FLAG_HEADERS_PAIRS,
    FLAG_TIMING,
    FRAME,
    FRAME_SIZE,
    MAX_RECORD,
    RECORD_DECLARE_QUEUE,
    RECORD_PUBLISH,
    RECORD_REQUEUE,
    RECORD_SETTLE,
    TIMING,
    TYPE_CRC,
    RecordError,
    decode_headers,
    decode_publish_fields,
    decode_requeue,
    decode_settle,
    decode_topology,
)
from qmq.store.record import NAME_STRUCT as NAME
from qmq.store.record import PUBLISH_STRUCT as PUBLISH
from qmq.store.segment import HEADER_SIZE, SegmentReader, list_segments, read_segment

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
    lo: int = 0,
    hi: int | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The message rows of one segment file: publishes of C{vhost} to a
    queue that C{match}es, published in [C{start}, C{end}).

    @param lo: with C{hi}, read only the records that begin in [lo, hi)
        (a split of the file: every split walks the same chain of record
        frames from the header, so each record belongs to exactly one).

    Damage is handled as the broker does: a record failing its checksum is
    skipped, reading stops at a frame that runs past the end of the file.
    """
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= HEADER_SIZE:
            return
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield from _read_messages(data, size, vhost, match, start, end, lo,
                                  size if hi is None else min(hi, size), batch_rows)
    finally:
        data.close()


#: Caches of the fast decoder (bounded: emptied when full).
_CACHE_SIZE = 4096


def _read_messages(data: Any, size: int, vhost: str, match: Callable[[str], bool],
                   start: float, end: float, lo: int, hi: int,
                   batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The loop of L{read_messages}: the publish payload decoded inline (the
    format of L{qmq.store.record.decode_publish_fields}), with what repeats
    from message to message (header blocks, queue names, exchange and
    routing key) decoded once and cached by its bytes."""
    unpack = FRAME.unpack_from
    unpack_publish = PUBLISH.unpack_from
    unpack_name = NAME.unpack_from
    crc32 = zlib.crc32
    publish_crc = TYPE_CRC[RECORD_PUBLISH]
    view = memoryview(data)
    vname = vhost.encode()
    nv = len(vname)
    fixed = PUBLISH.size
    headers_mask = FLAG_HEADERS_PAIRS | FLAG_HEADERS_JSON
    # header block -> (keys, values, destination header or None)
    header_cache: dict[bytes, tuple[list[str], list[str], str | None]] = {}
    # exchange + routing key bytes, exchange length -> destination
    dest_cache: dict[tuple[bytes, int], str] = {}
    # queue name bytes -> name if selected, else None
    queue_cache: dict[bytes, str | None] = {}
    rows: list[tuple] = []
    row = rows.append
    pos = HEADER_SIZE
    try:
        while pos + FRAME_SIZE <= size and pos < hi:
            length, type_, crc = unpack(data, pos)
            rstart = pos + FRAME_SIZE
            rend = rstart + length
            if rend > size or length > MAX_RECORD:
                break  # a torn tail, or damage: nothing after it is found safely
            if pos < lo or type_ != RECORD_PUBLISH:
                pos = rend
                continue
            pos = rend
            if crc32(view[rstart:rend], publish_crc) != crc:
                continue  # damage: never shown (as the broker)
            try:
                (mid, ts, _exp, prio, flags, lv, le, lr, lh, nq) = unpack_publish(data, rstart)
                p = rstart + fixed
                if lv != nv or data[p : p + lv] != vname or not start <= ts < end:
                    continue
                p += lv
                q = p + le + lr
                h = q + lh
                if flags & headers_mask:
                    block = data[q:h]
                    found = header_cache.get(block)
                    if found is None:
                        hd = decode_headers(flags, block) or {}
                        d = hd.pop("destination", None)
                        found = ([str(k) for k in hd], [v if v.__class__ is str else str(v)
                                                        for v in hd.values()], d)
                        if len(header_cache) >= _CACHE_SIZE:
                            header_cache.clear()
                        header_cache[block] = found
                    keys, values, dest = found
                else:
                    keys, values, dest = [], [], None
                if dest is None:
                    exrk = data[p:q]
                    dest = dest_cache.get((exrk, le))
                    if dest is None:
                        ex = exrk[:le].decode()
                        rk = exrk[le:].decode()
                        if not ex:
                            dest = "/queue/" + rk
                        elif ex == "amq.topic":
                            dest = "/topic/" + rk
                        else:
                            dest = f"/exchange/{ex}/{rk}"
                        if len(dest_cache) >= _CACHE_SIZE:
                            dest_cache.clear()
                        dest_cache[(exrk, le)] = dest
                names = []
                for _ in range(nq):
                    (n,) = unpack_name(data, h)
                    h += 2
                    raw = data[h : h + n]
                    h += n
                    if raw in queue_cache:
                        name = queue_cache[raw]
                    else:
                        text = raw.decode()
                        name = text if match(text) else None
                        if len(queue_cache) >= _CACHE_SIZE:
                            queue_cache.clear()
                        queue_cache[raw] = name
                    if name is not None:
                        names.append(name)
                if flags & FLAG_TIMING:
                    h += TIMING.size  # delivery time, ack timeout (format 4)
                if h > rend:
                    continue  # shorter than its fields: damage
                if not names:
                    continue
                body = data[h:rend]
            except (struct.error, UnicodeDecodeError, ValueError):
                continue
            us = int(ts * 1000) * 1000
            for name in names:
                row((dest, mid, us, prio, keys, values, body, name))
            if len(rows) >= batch_rows:
                yield _rows_batch(rows)
                rows.clear()
        if rows:
            yield _rows_batch(rows)
    finally:
        view.release()


def _rows_batch(rows: list[tuple]) -> pa.RecordBatch:
    """A record batch of C{(destination, id, microseconds, priority, header
    names, header values, body, queue)} rows (transposed by C{zip})."""
    dest, ids, ts, prio, keys, values, body, queue = zip(*rows, strict=True)
    offsets = [0]
    offsets.extend(accumulate(map(len, keys)))
    headers = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(list(chain.from_iterable(keys)), pa.string()),
        pa.array(list(chain.from_iterable(values)), pa.string()),
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(dest, pa.string()),
            pa.array(ids, pa.int64()),
            pa.array(ts, pa.int64()).cast(TIMESTAMP),
            pa.array(prio, pa.int32()),
            headers.cast(HEADERS),
            pa.array(body, pa.binary()),
            pa.array(queue, pa.string()),
        ],
        schema=MESSAGE_SCHEMA,
    )


def splits(path: str, split_bytes: int) -> list[tuple[int, str, int, int]]:
    """C{(segment number, file, lo, hi)}: the segments under C{path}, each
    cut into byte ranges of about C{split_bytes} (see L{read_messages})."""
    out = []
    for number, file in segment_files(path):
        size = os.path.getsize(file)
        n = max(1, -(-size // max(1, split_bytes)))
        step = -(-size // n)
        for k in range(n):
            out.append((number, file, k * step, size if k == n - 1 else (k + 1) * step))
    return out


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
    # The columns in EVENT_SCHEMA's order, which add's parameters follow.
    columns = list(rows.values())
    count = 0

    def add(kind: str, vh: str, queue: str, mid: int | None, ts: int | None, dest: str | None,
            size: int | None, producer: str | None, reason: str | None, kept: int | None,
            dc: int | None, retention: float | None) -> None:
        values = (kind, vh, queue, mid, ts, dest, size, producer, reason, kept, dc, retention, number)
        for column, value in zip(columns, values, strict=True):
            column.append(value)

    for type_, rstart, rend in reader.records():
        try:
            if type_ == RECORD_PUBLISH:
                (mid, ts, _e, _p, _f, vh, exchange, rk, headers, queues, size, _x) = (
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
