# -*- test-case-name: tests.test_store_scan -*-
"""Range scans: one queue's kept messages between two times, read from the log.

A scan never consumes: it reads segment files, not queues. The store
(L{qmq.store.log.CommitLogStore.scan}) plans a page on the reactor thread
from its index: the segments whose publish times meet the range and that
hold ids above the cursor, ordered by their lowest id, each with the bytes
of it written so far. L{read_page} then runs on the store's reader thread:
it reads those segments in that order and keeps the publish records that
name the queue, fall in the range and have ids above the cursor.

Pages go by message id (publish order), so a cursor is just the last id
returned: it resumes exactly after it, whatever was written, acked or
compacted since. Compaction copies a record forward and then deletes the
old segment, so the same id can be read twice in one page (kept once) but
is never lost: the store deletes no segment while a scan reads.

L{RangeScans} is the store's part (a base class of
L{qmq.store.log.CommitLogStore}, with no state of its own: it reads the
store's index, batch and sizes, which C{CommitLogStore.__init__} makes).

A page reads at most L{PAGE_BYTES} (past the first segment) before it
stops; it returns what it may prove complete (every id below the next
unread segment's lowest), and a cursor past it.
"""

from __future__ import annotations

import heapq
import os
import struct
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, fail, succeed

from qmq.core.message import Message
from qmq.store.record import FLAG_PERSISTENT, RECORD_PUBLISH, RecordError, decode_publish_fields
from qmq.store.segment import FRAME_SIZE, SegmentReader, segment_name

if TYPE_CHECKING:
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost

MiB = 1024 * 1024

# A publish payload starts with the message id.
_ID = struct.Struct("<Q")

#: Most bytes one page reads past its first segment.
PAGE_BYTES = 32 * MiB


def read_page(
    directory: str,
    plan: Sequence[tuple[int, int, int]],
    vhost: str,
    queue: str,
    start: float,
    end: float,
    after: int,
    limit: int,
    budget: int = PAGE_BYTES,
    marks: dict[int, Marks] | None = None,
) -> tuple[list[Message], int | None]:
    """Read one page of a range scan (in the store's reader thread).

    @param plan: C{(lowest id, segment number, bytes to read)} of the
        segments to read, by lowest id.
    @param after: only ids above this one.
    @param marks: the store's L{Marks} of its segments, by number (kept
        between pages, made and extended here): with them a page begins
        near its cursor and stops once the rest of a segment holds only
        higher ids than it keeps, instead of walking every segment whole.
    @return: at most C{limit} messages by id, and the id to go on after
        (None: nothing more in the range).
    """
    found: dict[int, Message] = {}
    # The largest ids kept, as a heap of negated ids: a page keeps only its
    # `limit` smallest ids, so a record whose id is above all of them (once
    # it has that many) is passed over on its id alone, not decoded. Ids
    # grow through a segment (but for records compaction copied forward),
    # so a page decodes about `limit` records, not every record of the
    # queue in the segments it reads.
    largest: list[int] = []
    over: int | None = None  # the smallest id passed over or dropped, if any
    qname = queue.encode()
    read = 0
    bound: int | None = None  # every id below it was read, when set
    for k, (low, number, size) in enumerate(plan):
        if len(found) >= limit and sorted(found)[limit - 1] < low:
            bound = low
            break
        if k and read >= budget and (low - 1 > after or any(i < low for i in found)):
            bound = low
            break
        data = _read(directory, number, size)
        if data is None:
            continue
        read += len(data)
        path = os.path.join(directory, segment_name(number))
        reader = SegmentReader(path, data)
        m = None
        if marks is not None:
            m = marks.get(number)
            if m is None:
                if len(marks) >= MAX_MARKED:
                    marks.clear()
                m = marks[number] = Marks()
            m.extend(SegmentReader(path, data), data)
        if m is not None and m.offsets:
            chunk = bisect_right(m.prefix_max, after) - 1
            begin: int | None = m.offsets[chunk]
            following_mark = m.offsets[chunk + 1] if chunk + 1 < len(m.offsets) else None
        else:
            chunk, begin, following_mark = 0, None, None
        for type_, rstart, rend in reader.records(begin):
            if following_mark is not None and rstart - FRAME_SIZE >= following_mark:
                chunk += 1  # type: ignore[union-attr]
                following_mark = m.offsets[chunk + 1] if chunk + 1 < len(m.offsets) else None  # type: ignore[union-attr]
                if len(largest) >= limit and m.suffix_min[chunk] > -largest[0]:  # type: ignore[union-attr]
                    # Every id from here on is above the page's: done here.
                    low_rest = m.suffix_min[chunk]  # type: ignore[union-attr]
                    if over is None or low_rest < over:
                        over = low_rest
                    break
            if type_ != RECORD_PUBLISH or data.find(qname, rstart, rend) < 0:
                continue
            try:
                (mid,) = _ID.unpack_from(data, rstart)
            except struct.error:
                continue
            if mid <= after:
                continue
            if len(largest) >= limit and mid > -largest[0]:
                if over is None or mid < over:
                    over = mid
                continue
            try:
                f = decode_publish_fields(data, rstart, rend, False)
            except RecordError:
                continue  # damage: the store reports it at start, never shows it
            ts = f[1]
            if not start <= ts < end or f[5] != vhost or queue not in f[9]:
                continue
            body = decode_publish_fields(data, rstart, rend)[10]
            if mid not in found:
                heapq.heappush(largest, -mid)
            got = found[mid] = Message(
                mid, f[6], f[7], f[8], bytes(body), ts, f[4] & FLAG_PERSISTENT != 0, f[3], f[2]
            )
            if f[11] is not None:
                got.properties, got.deliver_at, got.ack_timeout = f[11]
            if len(largest) > limit:
                dropped = -heapq.heappop(largest)
                del found[dropped]
                if over is None or dropped < over:
                    over = dropped
    ids = sorted(found)
    if bound is not None:
        ids = [i for i in ids if i < bound]
    page = ids[:limit]
    if len(page) == limit and over is not None and (bound is None or over < bound):
        # more (perhaps) after the page: go on after its last id
        following: int | None = page[-1]
    elif bound is not None:
        following = max(bound - 1, after)
    else:
        following = None
    return [found[i] for i in page], following


#: Records per chunk of L{Marks}.
CHUNK = 256
#: Segments whose marks a store keeps (all are forgotten past it).
MAX_MARKED = 4096


class Marks:
    """What a store remembers of one segment's message ids, so a range-scan
    page need not walk the segment from its start to its end: the offset of
    every L{CHUNK}th record, the highest publish id before it
    (C{prefix_max}: a page with a cursor at or above it may begin there),
    and the lowest publish id from it to the end (C{suffix_min}: a page
    that holds C{limit} messages below it may stop there). Ids grow through
    a segment but for records that compaction copied forward, which these
    bounds allow for. A segment only grows while it lives: L{extend}
    walks what was appended since (from the last mark).
    """

    __slots__ = ("offsets", "prefix_max", "chunk_min", "suffix_min", "walked")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.prefix_max: list[int] = []
        self.chunk_min: list[int] = []
        self.suffix_min: list[int] = []
        self.walked = 0

    def extend(self, reader: SegmentReader, data: bytes) -> None:
        """Cover C{data} (the segment's bytes so far) with marks."""
        size = len(data)
        if size <= self.walked:
            return
        if self.offsets:
            # Walk the last chunk again (it may have grown), from its mark.
            start: int | None = self.offsets.pop()
            high = self.prefix_max.pop()
            self.chunk_min.pop()
        else:
            start, high = None, 0
        unpack = _ID.unpack_from
        offsets, prefix_max, chunk_min = self.offsets, self.prefix_max, self.chunk_min
        n = 0
        low = _NO_ID
        for type_, rstart, _rend in reader.records(start):
            if n % CHUNK == 0:
                if offsets and len(offsets) > len(chunk_min):
                    chunk_min.append(low)
                offsets.append(rstart - FRAME_SIZE)
                prefix_max.append(high)
                low = _NO_ID
            n += 1
            if type_ == RECORD_PUBLISH:
                try:
                    (mid,) = unpack(data, rstart)
                except struct.error:
                    continue
                if mid > high:
                    high = mid
                if mid < low:
                    low = mid
        if len(offsets) > len(chunk_min):
            chunk_min.append(low)
        self.walked = size
        suffix = [_NO_ID] * len(chunk_min)
        rest = _NO_ID
        for i in range(len(chunk_min) - 1, -1, -1):
            if chunk_min[i] < rest:
                rest = chunk_min[i]
            suffix[i] = rest
        self.suffix_min = suffix


# Above every message id.
_NO_ID = 1 << 64


def _read(directory: str, number: int, size: int) -> bytes | None:
    """The first C{size} bytes of segment C{number}, or None if it is gone."""
    try:
        fd = os.open(os.path.join(directory, segment_name(number)), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(size - offset, 16 * MiB), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class RangeScans:
    """The commit log's range scans, on the reactor thread: wait for what
    was published so far to be written, plan the page, run L{read_page} in
    the reader thread; a base class of L{qmq.store.log.CommitLogStore}."""

    def scan(
        self,
        vhost: VirtualHost,
        queue: Queue,
        start: float,
        end: float,
        after: int,
        limit: int,
    ) -> Deferred:
        """A page of a range scan (see L{qmq.store.scan}): once what was
        published so far is written, read the segments in the reader
        thread. The Deferred fires with C{(messages, next id or None)}."""
        self._open()
        if self._failed is not None:
            return fail(self._failed)
        qs = self._index.vhosts.get(vhost.name, {}).get(queue.name)
        if qs is None:
            return succeed(([], None))
        after = max(after, qs.since - 1)
        batch = self._batch
        if batch.parts or self._inflight is not None:
            # Written first, so the page sees every publish made before it.
            written: Deferred = Deferred()
            batch.waiters.append(written)
            self.flush()
        else:
            written = succeed(None)
        vname, qname = vhost.name, queue.name
        written.addCallback(lambda _: self._read_page(vname, qname, start, end, after, limit))
        return written

    def _read_page(
        self, vhost: str, queue: str, start: float, end: float, after: int, limit: int
    ) -> Deferred:
        sizes = self._sizes
        plan = []
        for number, info in self._index.segments.items():
            size = sizes.get(number)
            if (
                size
                and info.max_id > after
                and info.min_ts < end
                and info.max_ts >= start
            ):
                plan.append((info.min_id, number, size))
        if not plan:
            return succeed(([], None))
        plan.sort()
        self._reading += 1

        def done(result: Any) -> Any:
            self._reading -= 1
            if self._index.dirty:
                self._want_flush()
            return result

        d = self._read(read_page, self.directory, plan, vhost, queue, start, end, after, limit,
                       PAGE_BYTES, self._scan_marks)
        return d.addBoth(done)

    def _read(self, f: Callable, *args: Any) -> Deferred:
        """Run C{f} in the reader thread (range scans), so that reads never
        hold up the writer's group commit. With an injected C{io}, there."""
        if self._io is not None and self._pool is None:
            return self._io(f, *args)
        if self._read_pool is None:
            from twisted.python.threadpool import ThreadPool  # noqa: PLC0415

            self._read_pool = ThreadPool(1, 1, name="qmq-commit-log-read")
            self._read_pool.start()
            self._reactor.addSystemEventTrigger("after", "shutdown", self._stop_read_pool)
        from twisted.internet.threads import deferToThreadPool  # noqa: PLC0415

        return deferToThreadPool(self._reactor, self._read_pool, f, *args)

    def _stop_read_pool(self) -> None:
        if self._read_pool is not None:
            self._read_pool.stop()
            self._read_pool = None
