# -*- test-case-name: tests.test_store_log,tests.test_store_full -*-
"""Opening the commit log at start: lock, replay, cut, choose where to append.

L{qmq.store.log.CommitLogStore.recover} (or the first call that changes
anything) opens the log once. The flow, on the reactor thread before any
listener binds:

  1. L{Startup._lock}: the directory's C{LOCK} file is held for as long as
     the store is open, so a second broker (or C{qmq-store}) pointed at the
     same directory fails at once instead of damaging the segments.
  2. L{Startup._replay} reads every segment in number order and hands each
     to L{qmq.store.replay.Replay}, which rebuilds the index and the
     messages queues still hold. Damage is logged and kept in the store's
     C{problems}; a torn tail is cut off (an empty segment is deleted). If
     damage hid records, message ids jump by L{ID_JUMP}, as ids never
     repeat.
  3. The store appends to the last segment if it ended clean, in this
     format and not full; otherwise a new segment is started, its header
     going out with the first batch. Compaction's timer starts.

Meanwhile L{_Progress} logs what there is to read, then how far replay got
every L{PROGRESS_EVERY} seconds, then the total.

L{Startup} is a part of L{qmq.store.log.CommitLogStore} (a base class of
it, with no state of its own): it sets the store's attributes, which
C{CommitLogStore.__init__} makes.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable

from twisted.logger import Logger

from qmq.store.record import VERSION
from qmq.store.replay import Replay
from qmq.store.segment import (
    HEADER_SIZE,
    SegmentReader,
    encode_header,
    list_segments,
    read_segment,
    sync_directory,
    truncate,
)

MiB = 1024 * 1024

#: How far message ids jump after damage hid some records (see L{Startup._replay}).
ID_JUMP = 1 << 32

#: Seconds between two lines of progress while the log is replayed at start.
PROGRESS_EVERY = 2.0

#: The file a store holds locked while it is open (one broker per directory).
LOCK_FILE = "LOCK"

_log = Logger()


class _Progress:
    """Lines an operator can watch while the log is replayed at start: what
    there is to read, then every L{PROGRESS_EVERY} seconds how far replay
    got (segments, bytes, percent, live messages), then the total. A
    million messages take seconds, and no listener is bound meanwhile."""

    def __init__(self, directory: str, segments: list, replay: Replay, clock: Callable[[], float]) -> None:
        self.directory = directory
        self.replay = replay
        self.clock = clock
        self.sizes = []
        for _, path in segments:
            try:
                self.sizes.append(os.path.getsize(path))
            except OSError:
                self.sizes.append(0)
        self.total = sum(self.sizes)
        self.read = 0
        self.started = self.last = clock()
        if segments:
            _log.info(
                "commit log: recovering {segments} segment(s), {mib:.1f} MiB, from {directory}; "
                "listeners bind once it is done",
                segments=len(segments),
                mib=self.total / MiB,
                bytes=self.total,
                directory=directory,
            )

    def step(self, i: int) -> None:
        """Segment C{i} is next: say how far replay got, if it is time."""
        if i:
            self.read += self.sizes[i - 1]
            now = self.clock()
            if now - self.last >= PROGRESS_EVERY:
                self.last = now
                _log.info(
                    "commit log: recovery at {percent:.0f}%: {done} of {segments} segment(s), "
                    "{mib:.1f} of {total_mib:.1f} MiB, {messages} live message(s) so far, "
                    "{seconds:.1f} s",
                    percent=100.0 * self.read / self.total if self.total else 100.0,
                    done=i,
                    segments=len(self.sizes),
                    mib=self.read / MiB,
                    total_mib=self.total / MiB,
                    messages=len(self.replay.messages),
                    seconds=now - self.started,
                )

    def done(self) -> None:
        if self.sizes:
            _log.info(
                "commit log: recovered {segments} segment(s), {mib:.1f} MiB, {messages} live "
                "message(s), in {seconds:.1f} s",
                segments=len(self.sizes),
                mib=self.total / MiB,
                messages=len(self.replay.messages),
                seconds=self.clock() - self.started,
            )


class Startup:
    """Opening the commit log (see the module docstring); a base class of
    L{qmq.store.log.CommitLogStore}."""

    def _lock(self) -> None:
        """Hold C{LOCK} in the directory for as long as the store is open:
        a second broker pointed at the same data directory would append to
        the same segments and damage them.

        @raise OSError: another process holds it (the message says so).
        """
        fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OSError(
                errno.EWOULDBLOCK,
                f"another process (a broker, or qmq-store?) holds {self.directory!r}",
            ) from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd = self._lock_fd
        if fd is not None:
            self._lock_fd = None
            os.close(fd)  # releases the lock

    def _replay(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._lock()
        index = self._index
        replay = Replay(index, backlog_memory=self.backlog_memory)
        segments = list_segments(self.directory)
        progress = _Progress(self.directory, segments, replay, self._progress_clock)
        floor = 1
        append_to = None
        for i, (number, path) in enumerate(segments):
            progress.step(i)
            last = i == len(segments) - 1
            data = read_segment(path)
            reader = SegmentReader(path, data, last)
            index.add_segment(number)
            replay.segment(number, data, reader)
            for problem in reader.problems:
                _log.warn("commit log: {problem}", problem=str(problem))
            self.problems.extend(reader.problems)
            if reader.header is not None and reader.header.crc_ok:
                floor = max(floor, reader.header.id_floor)
            if reader.cut is not None:
                if reader.cut == 0:
                    os.unlink(path)
                    sync_directory(self.directory)
                    del index.segments[number]
                    continue
                truncate(path, reader.cut)
                _log.warn("commit log: {path} cut at offset {offset}", path=path, offset=reader.cut)
            self._sizes[number] = reader.end
            if (
                last
                and reader.clean
                and reader.end < self.segment_size
                # Records of this format never go into an older one's segment.
                and reader.header is not None
                and reader.header.version == VERSION
            ):
                append_to = (number, reader.end, index.segments[number].records)
        index.max_id = max(index.max_id, floor - 1)
        if any(p.kind != "torn" for p in self.problems):
            # Records that could not be read may hold higher message ids
            # than any read: jump well past them, as ids never repeat.
            index.max_id += ID_JUMP
        index.dirty = True
        if append_to is not None:
            self._active, self._active_size, self._active_records = append_to
            self._pending_header = None
        else:
            self._active = segments[-1][0] + 1 if segments else 0
            index.add_segment(self._active)
            self._active_size = HEADER_SIZE
            self._pending_header = encode_header(self._active, index.max_id + 1)
            # The new segment's header (its id floor) goes out with the first
            # batch, even one that only deletes the old segments.
            self._place()
        self._sealed = self._active
        progress.done()
        self._recovery = replay.recovery()
        self._recovery.next_message_id = self._next_id()
        if self.compact_interval:
            self._compact_call = self._reactor.callLater(self.compact_interval, self._compact_tick)
