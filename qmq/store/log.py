# -*- test-case-name: tests.test_store_log -*-
"""The commit-log store: durable queues in append-only segment files.

How a record travels (all of it on the reactor thread, except the write):

  1. The core calls L{CommitLogStore.publish} (or settle, requeue, a
     topology call). The store asks its L{Index} whether the record changes
     anything, encodes it (L{qmq.store.record}) and appends the bytes to the
     current L{_Batch}. With C{fsync="always"} a publish returns a Deferred
     that the batch will fire; otherwise None.
  2. At the end of the reactor turn the broker calls L{flush}: the batch
     goes to the B{one} writer thread, which writes it with one C{write}
     per segment touched and, for C{always}, one C{fdatasync} (group
     commit: every publish of the turn, from every connection, shares
     them). A batch holding only settles or topology is flushed by the
     store itself on the next turn.
  3. Back on the reactor thread the batch's Deferreds fire, in publish
     order. While a batch is being written the next turns' records gather
     in the next batch: one batch in flight at a time, so syncs never
     overtake each other.

With C{fsync="interval"} batches are written every turn and synced at
most C{interval_ms} apart; with C{"never"} the operating system decides
(a killed broker loses nothing written, a machine that loses power may).

Segments roll at C{segment_size}. A segment is deleted (after the batch
that made it unneeded is synced) once nothing in it is live and nothing
in it cancels a record still on disk (L{qmq.store.index}); an old segment
whose live records are a small part of it is compacted: they are copied
forward and it goes (L{qmq.store.compaction}).

At start L{recover} (or the first call that changes anything) reads every
segment in order and replays it into the index (L{qmq.store.startup});
damage is logged and kept in L{CommitLogStore.problems} (see
L{qmq.store.segment}).

A write that fails (a full disk) is refused to its publishers and kept, and
the store writes it again once the disk takes data: L{qmq.store.failure}.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from qmq.core.message import Message, OnDisk
from qmq.core.store import Recovery, collector_paused
from qmq.store.compaction import Compaction
from qmq.store.failure import StoreFailed, WriteFailure
from qmq.store.index import (
    QUEUE_AUTO_DELETE,
    QUEUE_EXCLUSIVE,
    QUEUE_SUBSCRIPTION,
    Index,
    exchange_options,
)
from qmq.store.record import (
    FLAG_HEADERS_JSON,
    FLAG_PERSISTENT,
    FRAME,
    FRAME_SIZE,
    RECORD_BIND,
    RECORD_BIND_EXCHANGE,
    RECORD_DECLARE_EXCHANGE,
    RECORD_DELETE_EXCHANGE,
    RECORD_DELETE_QUEUE,
    RECORD_PUBLISH,
    RECORD_UNBIND,
    RECORD_UNBIND_EXCHANGE,
    RecordError,
    decode_publish_fields,
    encode_declare_queue,
    encode_requeue,
    encode_settle,
    encode_topology,
    publish_record,
    publish_static,
    record_crc,
)
from qmq.store.replay import on_disk
from qmq.store.scan import RangeScans
from qmq.store.segment import (
    HEADER_SIZE,
    Problem,
    SegmentReader,
    SegmentWriter,
    encode_header,
    list_segments,
    read_segment,
    segment_name,
    sync_directory,
)
from qmq.store.startup import Startup

if TYPE_CHECKING:
    from qmq.core.exchange import Exchange
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost

FSYNC_POLICIES = ("always", "interval", "never")
MiB = 1024 * 1024

_log = Logger()

# A publish payload starts with the message id.
_ID = struct.Struct("<Q")


class _Batch:
    """Records on their way to disk together.

    @ivar parts: C{[segment, header or None, chunks]} in order; a header
        means the segment file is created by this part.
    @ivar waiters: Deferreds fired once the batch is written (and synced).
    @ivar done: the Deferred all of the batch's publishes returned, or None
        (also in C{waiters}).
    @ivar deletes: segments to delete after the batch is synced.
    @ivar sync: whether to fdatasync after writing.
    @ivar interval: whether to sync within the interval after writing.
    @ivar other: whether it holds records other than publishes.
    @ivar ends: segment -> its size once the batch is written.
    """

    __slots__ = (
        "parts",
        "waiters",
        "deletes",
        "sync",
        "interval",
        "other",
        "ends",
        "done",
        "offloads",
    )

    def __init__(self) -> None:
        self.parts: list[list] = []
        self.waiters: list[Deferred] = []
        self.done: Deferred | None = None
        self.deletes: list[int] = []
        self.sync = False
        # Holds a publish to a queue whose policy is "interval": synced
        # within the interval.
        self.interval = False
        # Holds records other than publishes (they follow the store's policy).
        self.other = False
        # Segment -> its size once this batch is written.
        self.ends: dict[int, int] = {}
        # Queue -> (message, placeholder) of publishes to offload once written.
        self.offloads: dict[Queue, list] | None = None

    def __bool__(self) -> bool:
        return bool(self.parts or self.waiters or self.deletes or self.sync)


#: Binding record type -> the index's call, and the record's names for the
#: bound target and the source exchange.
_BINDINGS: dict[int, tuple[Callable[..., bool], str, str]] = {
    RECORD_BIND: (Index.bind, "queue", "exchange"),
    RECORD_UNBIND: (Index.unbind, "queue", "exchange"),
    RECORD_BIND_EXCHANGE: (Index.bind_exchange, "destination", "source"),
    RECORD_UNBIND_EXCHANGE: (Index.unbind_exchange, "destination", "source"),
}


class CommitLogStore(Startup, WriteFailure, Compaction, RangeScans):
    """A L{qmq.core.store.MessageStore} on an append-only segmented log.

    @ivar directory: the data directory (made if missing).
    @ivar problems: damage found at start (L{qmq.store.segment.Problem}).

    Its cold jobs live in the modules of its base classes: opening the log
    at start (L{qmq.store.startup.Startup}); a failed write
    and the retries (L{qmq.store.failure.WriteFailure}); compaction
    (L{qmq.store.compaction.Compaction}); range scans
    (L{qmq.store.scan.RangeScans}).
    """

    def __init__(
        self,
        directory: str,
        fsync: str = "always",
        interval_ms: int = 100,
        segment_size: int = 64 * MiB,
        compact_ratio: float = 0.25,
        compact_interval: float = 1.0,
        reactor: Any = None,
        io: Callable[..., Deferred] | None = None,
        datasync: Callable[[int], None] = os.fdatasync,
        backlog_memory: int = 16 * MiB,
        retry_interval: float = 1.0,
        progress_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        @param fsync: C{"always"} (a publish's Deferred fires after its
            fdatasync), C{"interval"} (sync at most C{interval_ms} apart),
            or C{"never"}.
        @param segment_size: a segment is closed once it holds this many
            bytes (a record is never split, so it may hold a little more).
        @param compact_ratio: an old segment whose live records are at most
            this part of its records is compacted.
        @param compact_interval: seconds between looks for segments to
            compact.
        @param reactor: for timers and the writer thread's results; the
            global reactor by default.
        @param io: C{io(f, *args)} runs C{f} off the reactor thread and
            returns a Deferred of its result; by default a dedicated
            one-thread pool. Tests pass a synchronous one.
        @param datasync: what syncs a file descriptor (tests count calls).
        @param backlog_memory: a durable queue whose ready messages hold
            more body bytes than this leaves the bodies (and headers) of the
            persistent messages published to it then on disk, once written,
            and reads them back as consumers reach them; 0 never does.
        @param retry_interval: seconds between two tries to write again
            after a write failed (a full disk, an I/O error).
        @param progress_clock: the time replay's progress lines are spaced
            by (L{qmq.store.startup.PROGRESS_EVERY}); tests give a fake one.
        """
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        if segment_size < 4096:
            raise ValueError(f"segment_size must be at least 4096 bytes, got {segment_size}")
        if reactor is None:
            from twisted.internet import reactor  # noqa: PLC0415
        self.directory = directory
        self.fsync = fsync
        self.interval = interval_ms / 1000.0
        self.segment_size = segment_size
        self.compact_ratio = compact_ratio
        self.compact_interval = compact_interval
        self._reactor = reactor
        self._io = io
        self._pool: Any = None
        self._writer = SegmentWriter(directory, datasync)
        self._always = fsync == "always"
        self.problems: list[Problem] = []
        self._index = Index()
        self._opened = False
        self._lock_fd: int | None = None
        self._recovery: Recovery | None = None
        self._active = 0
        self._active_size = 0
        self._active_records = 0
        self._pending_header: bytes | None = None
        self._sealed = 0
        self._batch = _Batch()
        self._chunks: list[bytes] | None = None
        self._inflight: _Batch | None = None
        self._flush_wanted = False
        self._flush_call: Any = None
        self._sync_call: Any = None
        self._compact_call: Any = None
        self._compacting: int | None = None
        self._stuck: set[int] = set()
        self._failed: StoreFailed | None = None
        # After a failed write: the records not written yet (that batch and
        # the records made since), written again every retry_interval.
        self._retry_batch: _Batch | None = None
        self._retry_call: Any = None
        self.retry_interval = retry_interval
        self._progress_clock = progress_clock
        self._failed_at = 0.0
        self._retry_logged = 0.0
        self._watchers: list[Callable[[bool, str], object]] = []
        #: Writes that failed, and recoveries from them (figures, tests).
        self.failures = 0
        self.recoveries = 0
        self._closing = False
        self._closed: Deferred | None = None
        self._vhost_names: dict[str, bytes] = {}
        # Segment -> bytes of it written (what a range scan may read).
        self._sizes: dict[int, int] = {}
        # Range scans reading segments now: deletions wait for them.
        self._reading = 0
        # Range scans' marks of the segments (qmq.store.scan.Marks), used
        # and kept up to date by the reader thread only.
        self._scan_marks: dict = {}
        self._read_pool: Any = None
        self.backlog_memory = backlog_memory
        # Segment -> a descriptor open for reading bodies back (load).
        self._read_fds: dict[int, int] = {}
        #: Bodies read back from disk, and offloaded (figures, tests).
        self.loaded = 0
        self.offloaded = 0
        self._last_vhost: Any = None
        self._last_vnames: tuple[str, bytes] = ("", b"")
        self._last_queue: Any = None
        self._last_qnames: tuple[tuple[str, ...], tuple[bytes, ...]] = ((), ())
        # (vhost, exchange, routing key, queue names, a copy of the
        # headers, header flags, static part, a copy of the properties) of
        # the last publish.
        self._last_static: tuple = (None, None, None, None, None, 0, b"", None)
        #: Counts for tests and figures: writes done, segments deleted,
        #: segments compacted.
        self.writes = 0
        self.deleted = 0
        self.compactions = 0

    # -- start ----------------------------------------------------------------

    def recover(self) -> Recovery:
        """What the log kept (replayed on the first call; see L{_open})."""
        self._open()
        recovery, self._recovery = self._recovery, None
        return recovery if recovery is not None else Recovery(self._next_id())

    def _next_id(self) -> int:
        return self._index.max_id + 1

    def _open(self) -> None:
        """Read every segment, rebuild the index and the recovery, cut a torn
        tail, and choose the segment to append to."""
        if self._opened:
            return
        self._opened = True
        with collector_paused():  # replay's objects all live on
            self._replay()

    # -- the batch ------------------------------------------------------------

    def _place(self) -> list[bytes]:
        """The chunk list the next record goes into (in the active segment,
        rolled first if it is full)."""
        if self._active_size >= self.segment_size and self._active_records:
            self._roll()
        chunks = self._chunks
        if chunks is None:
            chunks = self._chunks = []
            self._batch.parts.append([self._active, self._pending_header, chunks])
            self._pending_header = None
        return chunks

    def _roll(self) -> None:
        """Start the next segment (its file is made by the next write)."""
        number = self._active + 1
        self._batch.ends[self._active] = self._active_size
        self._index.add_segment(number)
        self._index.dirty = True  # the old one may be deletable now
        self._active = number
        self._active_size = HEADER_SIZE
        self._active_records = 0
        self._pending_header = encode_header(number, self._index.max_id + 1)
        self._chunks = None

    def _append(self, record: bytes) -> None:
        """Append a whole record that is not a publish (the segment was
        chosen by the caller through L{_place})."""
        self._chunks.append(record)  # type: ignore[union-attr]
        self._active_size += len(record)
        self._active_records += 1
        self._batch.other = True
        self._want_flush()

    def _want_flush(self) -> None:
        """Records other than publishes go out on the next turn (the broker
        flushes only for publishes)."""
        if self._inflight is not None:
            self._flush_wanted = True
        elif self._flush_call is None and not self._closing:
            self._flush_call = self._reactor.callLater(0, self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_call = None
        self.flush()

    def _vhost(self, vhost: VirtualHost | str) -> tuple[str, bytes]:
        name = vhost if vhost.__class__ is str else vhost.name  # type: ignore[union-attr]
        encoded = self._vhost_names.get(name)  # type: ignore[arg-type]
        if encoded is None:
            encoded = self._vhost_names[name] = name.encode()  # type: ignore[union-attr]
        return name, encoded  # type: ignore[return-value]

    # -- MessageStore ---------------------------------------------------------

    def publish(self, vhost: VirtualHost, message: Message, queues: Sequence[Queue]) -> Any:
        # The hot path (twice the CPU of a memory publish before it was cut
        # down): the record encoded here (encode_publish's steps), its
        # static part (lengths, names, header block) reused from the last
        # publish when that one had the same stream (same objects, equal
        # headers), the queue's names and the vhost's cached, one call of
        # the index, the checks of _place inlined.
        if self._failed is not None or not self._opened:
            if not self._opened:
                self._open()
            if self._failed is not None:
                # Refused whatever the fsync policy (a queue's "always" too,
                # under a store-wide "never"): nothing is written until the
                # store writes again. Fails with the batch (see _submit).
                return self._shared_waiter()
        if vhost is self._last_vhost:
            vname, vbytes = self._last_vnames
        else:
            vname, vbytes = self._last_vnames = self._vhost(vhost)
            self._last_vhost = vhost
        if len(queues) == 1:
            q = queues[0]
            if q is self._last_queue:
                names, encoded = self._last_qnames
            else:
                name = q.name
                names, encoded = self._last_qnames = (name,), (name.encode(),)
                self._last_queue = q
            fsync = q.policy.fsync or vhost.fsync or self.fsync
        else:
            names = tuple([q.name for q in queues])
            encoded = tuple([n.encode() for n in names])
            fsync = self._strictest(vhost, queues)
        exchange = message.exchange
        routing_key = message.routing_key
        headers = message.headers
        properties = message.properties
        last = self._last_static
        if (
            encoded is last[3]
            and routing_key is last[2]
            and exchange is last[1]
            and vbytes is last[0]
            and headers == last[4]
            and properties == last[7]
        ):
            hflag = last[5]
            static = last[6]
        else:
            hflag, static = publish_static(vbytes, exchange, routing_key, headers, encoded, properties)
            if not hflag & FLAG_HEADERS_JSON:  # strings only (see encode_headers)
                # A copy: the message's own dict may change later.
                self._last_static = (
                    vbytes, exchange, routing_key, encoded,
                    None if headers is None else dict(headers), hflag, static,
                    None if properties is None else dict(properties),
                )  # fmt: skip
        mid = message.id
        timestamp = message.timestamp
        head, tail = publish_record(
            mid,
            timestamp,
            message.expires,
            message.priority,
            hflag | FLAG_PERSISTENT if message.persistent else hflag,
            static,
            message.body,
            message.deliver_at,
            message.ack_timeout,
        )
        if self._active_size >= self.segment_size and self._active_records:
            self._roll()
        chunks = self._chunks
        if chunks is None:
            chunks = self._place()
        if self._index.publish(self._active, mid, vname, names, timestamp):
            size = len(head) + len(tail)
            backlog = self.backlog_memory
            if backlog:
                if len(queues) == 1:
                    if q.ready_bytes > backlog:
                        self._offload_later(q, message, size)
                else:
                    for q in queues:
                        if q.ready_bytes > backlog:
                            self._offload_later(q, message, size)
            chunks.append(head)
            if tail:
                chunks.append(tail)
            self._active_size += size
            self._active_records += 1
        if fsync == "always":
            # One Deferred for every publish of the batch (see
            # qmq.core.store): a Deferred per publish, created, called back
            # and fired, cost more than encoding and indexing the record.
            batch = self._batch
            batch.sync = True
            d = batch.done
            return d if d is not None else self._shared_waiter()
        if fsync == "interval":
            self._batch.interval = True
        return None

    # -- bodies on disk -------------------------------------------------------

    def _offload_later(self, queue: Queue, message: Message, size: int) -> None:
        """C{message}, whose record of C{size} bytes goes next into the
        active segment, waits in C{queue}'s long backlog: once written, the
        queue may leave its body to the disk (L{qmq.core.queue.Queue.offload})."""
        place = on_disk(self._active, self._active_size, size, len(message.body))
        if place is None:
            return
        batch = self._batch
        if batch.offloads is None:
            batch.offloads = {}
        pairs = batch.offloads.get(queue)
        if pairs is None:
            pairs = batch.offloads[queue] = []
        pairs.append((message, place))

    def _offload(self, offloads: dict[Queue, list]) -> None:
        """The batch holding these publishes is written: offer them."""
        segments = self._index.segments
        for queue, pairs in offloads.items():
            if queue.deleted:
                continue
            for place in queue.offload(pairs):
                info = segments.get(place >> 102)
                if info is not None:
                    info.offloaded += 1
                    self.offloaded += 1

    def _unpin(self, place: int) -> None:
        info = self._index.segments.get(place >> 102)
        if info is not None and info.offloaded:
            info.offloaded -= 1

    def load(self, queue: Queue, messages: list[Message]) -> list[Message]:
        """Read back the bodies and headers of C{messages} (offloaded by
        C{queue}), on the reactor thread: C{pread} of the records, which
        lie close together (published one after the other), from the page
        cache as a rule. Records next to each other are read with one call.

        @return: the messages whose record could not be read (logged).
        """
        by_segment: dict[int, list[tuple[int, int, Message]]] = {}
        for m in messages:
            place = m.body
            by_segment.setdefault(place >> 102, []).append(
                ((place >> 62) & ((1 << 40) - 1), (place >> 31) & 0x7FFFFFFF, m)
            )
        failed = []
        for number, wanted in by_segment.items():
            wanted.sort(key=lambda w: w[0])
            i = 0
            while i < len(wanted):
                # One read for the records within 64 KiB of each other,
                # at most 4 MiB.
                start = wanted[i][0]
                j = i + 1
                while (
                    j < len(wanted)
                    and wanted[j][0] - (wanted[j - 1][0] + wanted[j - 1][1]) < 65536
                    and wanted[j][0] + wanted[j][1] - start <= 4 * MiB
                ):
                    j += 1
                end = wanted[j - 1][0] + wanted[j - 1][1]
                data = self._pread(number, start, end - start)
                for offset, size, m in wanted[i:j]:
                    if not self._fill(m, data, offset - start, size):
                        failed.append(m)
                i = j
        if failed:
            failed = self._find_moved(failed)
        for m in messages:
            if m.body.__class__ is not OnDisk:
                self.loaded += 1
        return failed

    def _pread(self, number: int, offset: int, size: int) -> bytes:
        fd = self._read_fds.get(number)
        try:
            if fd is None:
                if len(self._read_fds) >= 8:
                    os.close(self._read_fds.pop(next(iter(self._read_fds))))
                fd = os.open(os.path.join(self.directory, segment_name(number)), os.O_RDONLY)
                self._read_fds[number] = fd
            return os.pread(fd, size, offset)
        except OSError:
            return b""

    def _fill(self, message: Message, data: bytes, at: int, size: int) -> bool:
        """Set C{message}'s body and headers from its record at C{data[at:]}."""
        if at < 0 or at + size > len(data):
            return False
        length, type_, crc = FRAME.unpack_from(data, at)
        start = at + FRAME_SIZE
        end = start + length
        if (
            type_ != RECORD_PUBLISH
            or end != at + size
            or record_crc(type_, memoryview(data)[start:end]) != crc
        ):
            return False
        try:
            f = decode_publish_fields(data, start, end)
        except RecordError:
            return False
        if f[0] != message.id:
            return False
        self._unpin(message.body)  # type: ignore[arg-type]
        message.headers = f[8]
        message.body = f[10]
        return True

    def _find_moved(self, messages: list[Message]) -> list[Message]:
        """Find the records of C{messages} where the index says they are
        now (a copy made by compaction), reading those segments whole."""
        where = self._index.where
        by_segment: dict[int, dict[int, Message]] = {}
        lost = []
        for m in messages:
            number = where.get(m.id)
            if number is None:
                lost.append(m)
            else:
                by_segment.setdefault(number, {})[m.id] = m
        for number, wanted in by_segment.items():
            path = os.path.join(self.directory, segment_name(number))
            try:
                data = read_segment(path)
            except OSError:
                lost.extend(wanted.values())
                continue
            for type_, start, end in SegmentReader(path, data).records():
                if type_ != RECORD_PUBLISH:
                    continue
                (mid,) = _ID.unpack_from(data, start)
                m = wanted.get(mid)
                if m is not None:
                    if self._fill(m, data, start - FRAME_SIZE, end - start + FRAME_SIZE):
                        del wanted[mid]
            lost.extend(wanted.values())
        for m in lost:
            _log.error(
                "commit log: the body of message {id} in queue waiting on disk cannot be "
                "read back; the message is dropped",
                id=m.id,
            )
        return lost

    def _close_read_fds(self, numbers: Any = None) -> None:
        for number in list(self._read_fds) if numbers is None else numbers:
            fd = self._read_fds.pop(number, None)
            if fd is not None:
                os.close(fd)

    def _strictest(self, vhost: VirtualHost, queues: Sequence[Queue]) -> str:
        """The strictest fsync policy of C{queues} (a message routed to
        several waits for the strictest)."""
        default = vhost.fsync or self.fsync
        found = "never"
        for q in queues:
            policy = q.policy.fsync or default
            if policy == "always":
                return policy
            if policy == "interval":
                found = policy
        return found

    def _shared_waiter(self) -> Deferred:
        """The Deferred every publish of the current batch returns."""
        batch = self._batch
        d = batch.done
        if d is None:
            d = batch.done = Deferred()
            batch.waiters.append(d)
        return d

    def settle(self, queue: Queue, message: Message, reason: str) -> None:
        if not self._opened:
            self._open()
        vhost = queue.vhost
        if vhost is self._last_vhost:
            vname, vbytes = self._last_vnames
        else:
            vname, vbytes = self._vhost(vhost)  # type: ignore[arg-type]
        if self._active_size >= self.segment_size and self._active_records:
            self._roll()
        chunks = self._chunks
        if chunks is None:
            chunks = self._place()
        mid = message.id
        name = queue.name
        if message.body.__class__ is OnDisk:
            self._unpin(message.body)  # type: ignore[arg-type]
        retention = queue.policy.retention
        kept = self._reactor.seconds() + retention if retention and reason == "ack" else 0.0
        if self._index.settle(self._active, vname, name, mid, kept):
            record = encode_settle(vbytes, name.encode(), mid, reason, kept)
            chunks.append(record)
            self._active_size += len(record)
            self._active_records += 1
            self._batch.other = True
            if self._flush_call is None:
                self._want_flush()

    def requeue(self, queue: Queue, message: Message) -> None:
        if not self._opened:
            self._open()
        vname, vbytes = self._vhost(queue.vhost)  # type: ignore[arg-type]
        chunks = self._place()
        count = message.delivery_count
        if self._index.requeue(self._active, vname, queue.name, message.id, count):
            record = encode_requeue(vbytes, queue.name.encode(), message.id, count)
            chunks.append(record)
            self._active_size += len(record)
            self._active_records += 1
            self._want_flush()

    def declare_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        flags = 0
        if queue.auto_delete:
            flags |= QUEUE_AUTO_DELETE
        if queue.exclusive_owner is not None:
            flags |= QUEUE_EXCLUSIVE
        if queue.subscription:
            flags |= QUEUE_SUBSCRIPTION
        self._declare_queue(vhost.name, queue.name, queue.arguments, flags)

    def _declare_queue(
        self,
        vhost: str,
        name: str,
        arguments: dict | None,
        flags: int | None,
        force: bool = False,
        since: int | None = None,
    ) -> None:
        self._open()
        index = self._index
        vqueues = index.vhosts.get(vhost)
        if not force and vqueues is not None:
            # Declared alike already (every queue at recovery): nothing to do.
            qs = vqueues.get(name)
            if (
                qs is not None
                and qs.declared is not None
                and qs.arguments == arguments
                and qs.flags == flags
            ):
                return
        self._place()
        if index.declare_queue(self._active, vhost, name, arguments, force, flags, since):
            if vqueues is None:
                vqueues = index.vhosts[vhost]
            self._append(encode_declare_queue(vhost, name, arguments, vqueues[name].since, flags))

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        self._open()
        self._place()
        if self._index.delete_queue(self._active, vhost.name, queue.name) is not None:
            self._append(
                encode_topology(RECORD_DELETE_QUEUE, {"vhost": vhost.name, "queue": queue.name})
            )

    def declare_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        options = exchange_options({"internal": exchange.internal, "arguments": exchange.arguments})
        self._declare_exchange(vhost.name, exchange.name, exchange.type, exchange.auto_delete, options=options)

    def _declare_exchange(
        self,
        vhost: str,
        name: str,
        type_: str,
        auto_delete: bool,
        force: bool = False,
        options: dict | None = None,
    ) -> None:
        self._open()
        self._place()
        if self._index.declare_exchange(self._active, vhost, name, type_, auto_delete, force, options):
            fields = {"vhost": vhost, "exchange": name, "type": type_, "auto_delete": auto_delete}
            if options:
                # Optional keys (a record without them is a plain exchange).
                fields.update(options)
            self._append(encode_topology(RECORD_DECLARE_EXCHANGE, fields))

    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        self._open()
        self._place()
        if self._index.delete_exchange(self._active, vhost.name, exchange.name):
            self._append(
                encode_topology(
                    RECORD_DELETE_EXCHANGE, {"vhost": vhost.name, "exchange": exchange.name}
                )
            )

    def bind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        self._binding(RECORD_BIND, vhost.name, queue.name, exchange.name, key, arguments)

    def unbind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        self._binding(RECORD_UNBIND, vhost.name, queue.name, exchange.name, key, arguments)

    def bind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        self._binding(RECORD_BIND_EXCHANGE, vhost.name, destination.name, source.name, key, arguments)

    def unbind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        self._binding(
            RECORD_UNBIND_EXCHANGE, vhost.name, destination.name, source.name, key, arguments
        )

    def _binding(
        self,
        type_: int,
        vhost: str,
        target: str,
        source: str,
        key: str,
        arguments: dict | None,
        *force: bool,
    ) -> None:
        """Record a binding of C{target} (a queue or an exchange) to
        exchange C{source}, or its removal (C{type_}: L{_BINDINGS}), if the
        index says it changes anything; C{force} (binds only): write it
        even so (compaction moves it forward)."""
        change, target_field, source_field = _BINDINGS[type_]
        self._open()
        self._place()
        if change(self._index, self._active, vhost, target, source, key, arguments, *force):
            self._append(
                encode_topology(
                    type_,
                    {
                        "vhost": vhost,
                        target_field: target,
                        source_field: source,
                        "key": key,
                        "arguments": arguments,
                    },
                )
            )

    # -- writing --------------------------------------------------------------

    def flush(self) -> None:
        """Hand the batch to the writer thread, or, while a batch is being
        written, have it follow as soon as that one is done."""
        if self._inflight is not None:
            self._flush_wanted = True
            return
        self._submit()

    def _submit(self) -> None:
        """Send the batch to the writer thread (none may be in flight)."""
        batch = self._batch
        if self._index.dirty and not self._reading:
            gone = self._index.collect(self._active, self._reactor.seconds())
            batch.deletes.extend(gone)
            self.deleted += len(gone)
            for number in gone:
                self._sizes.pop(number, None)
        if not batch:
            return
        if batch.other and batch.parts:
            if self._always:
                batch.sync = True
            elif self.fsync == "interval":
                batch.interval = True
        if batch.parts:
            batch.ends[self._active] = self._active_size
        self._batch = _Batch()
        self._chunks = None
        self._flush_wanted = False
        if self._failed is not None:
            self._keep(batch)
            return
        self._inflight = batch
        self._run(self._write_batch, batch).addCallbacks(
            self._written, self._write_failed, callbackArgs=(batch,), errbackArgs=(batch,)
        )

    def _run(self, f: Callable, *args: Any) -> Deferred:
        """Run C{f} in the writer thread."""
        if self._io is None:
            from twisted.internet.threads import deferToThreadPool  # noqa: PLC0415
            from twisted.python.threadpool import ThreadPool  # noqa: PLC0415

            self._pool = ThreadPool(1, 1, name="qmq-commit-log")
            self._pool.start()
            self._reactor.addSystemEventTrigger("after", "shutdown", self._stop_pool)
            pool, reactor = self._pool, self._reactor
            self._io = lambda f, *a: deferToThreadPool(reactor, pool, f, *a)
        return self._io(f, *args)

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None

    def _write_batch(self, batch: _Batch) -> None:
        """In the writer thread: one write per segment part, one sync."""
        writer = self._writer
        for number, header, chunks in batch.parts:
            if writer.number != number:
                writer.open(number, header)
            if chunks:
                writer.write(b"".join(chunks))
                self.writes += 1
        if batch.sync or batch.deletes:
            writer.sync()
        if batch.deletes:
            for number in sorted(batch.deletes):
                writer.remove(number)
            sync_directory(self.directory)

    def _written(self, _: None, batch: _Batch) -> None:
        self._inflight = None
        if batch.parts:
            self._sealed = max(self._sealed, batch.parts[-1][0])
            sizes = self._sizes
            for number, size in batch.ends.items():
                if size > sizes.get(number, 0) and number not in batch.deletes:
                    sizes[number] = size
        if batch.deletes and self._read_fds:
            self._close_read_fds(batch.deletes)
        if batch.offloads is not None:
            self._offload(batch.offloads)
        for d in batch.waiters:
            d.callback(None)
        if (
            batch.interval
            and batch.parts
            and not batch.sync
            and self._sync_call is None
            and not self._closing
        ):
            self._sync_call = self._reactor.callLater(self.interval, self._sync_due)
        # (A waiter's callback may have flushed already: then that batch is
        # in flight and this one waits its turn.)
        if self._inflight is None and (self._flush_wanted or (self._closing and self._batch)):
            self._submit()

    def _sync_due(self) -> None:
        self._sync_call = None
        self._batch.sync = True
        self.flush()

    def observe_syncs(self, observer: Callable[[float], None]) -> bool:
        """Tell C{observer} the seconds each fdatasync of the segments took
        (for C{/metrics}), from the writer thread: it must be thread-safe
        (a Prometheus histogram's C{observe} is).

        @return: False if C{observer} was observing already.
        """
        observers = getattr(self, "_sync_observers", None)
        if observers is None:
            observers = self._sync_observers = []
            writer = self._writer
            sync = writer.datasync
            clock = time.perf_counter

            def timed(fd: int) -> None:
                start = clock()
                try:
                    sync(fd)
                finally:
                    took = clock() - start
                    for observe in list(observers):
                        observe(took)

            writer.datasync = timed
        if observer in observers:
            return False
        observers.append(observer)
        return True

    def disk_usage(self) -> int:
        """Bytes of segment files in the directory."""
        return sum(os.path.getsize(path) for _, path in list_segments(self.directory))

    # -- stop -----------------------------------------------------------------

    def close(self) -> Deferred:
        """Write and sync what is pending, close the segment, stop the
        writer thread. Returns a Deferred that fires when that is done."""
        if self._closed is not None:
            return self._closed
        for name in ("_flush_call", "_sync_call", "_compact_call", "_retry_call"):
            call = getattr(self, name)
            if call is not None and call.active():
                call.cancel()
            setattr(self, name, None)
        if not self._opened:
            self._closed = succeed(None)
            return self._closed
        self._closing = True
        if self._failed is not None and self._inflight is None:
            # One last try at what was kept since a write failed.
            self._retry()
        drained: Deferred = Deferred()
        self._batch.waiters.append(drained)
        self._batch.sync = True
        self.flush()

        def close_file(_: Any) -> Deferred:
            return self._run(self._writer.close)

        def unwritten(failure: Any) -> Any:
            if self._failed is not None:
                _log.error(
                    "commit log: closed while it could not write ({why}); the records kept "
                    "since then are not written (publishes among them were refused)",
                    why=str(self._failed),
                )
                return self._run(self._writer.abandon)
            return failure

        def stopped(result: Any) -> Any:
            self._close_read_fds()
            self._stop_pool()
            self._stop_read_pool()
            self._unlock()
            return result

        drained.addCallbacks(close_file, unwritten)
        drained.addBoth(stopped)
        self._closed = drained
        return drained
