# -*- test-case-name: tests.test_store_log -*-
"""Compaction: old segments whose records are mostly dead go.

A segment is deleted as soon as nothing in it is live (L{qmq.store.index}).
One that holds a few live records among many dead ones would stay for as
long as they live; compaction copies them forward so it can go. The flow,
every C{compact_interval} seconds (L{Compaction._compact_tick}), on the
reactor thread except the read:

  1. L{Compaction.compact} rolls the active segment if it is a quarter full
     of nothing live, then asks the index for the first sealed segment
     whose live records are at most C{compact_ratio} of its records (or
     whose retention time passed). One segment at a time; none while the
     store cannot write or is closing.
  2. The writer thread reads the segment whole (C{read_segment}).
  3. L{Compaction._copy_forward} walks its records: each still live one
     (a publish some queue holds, a requeue count, a queue or exchange
     declaration, a binding of a queue or an exchange) is encoded again at the head of the log
     (L{Compaction._copy_record}) and the index moves it there. The copies
     go out with the next batch; once that batch is synced, the index finds
     the old segment empty and the writer deletes it.

A segment that still has live records after its copy (damage it could not
read, or a bug) is noted and never tried again.

L{Compaction} is a part of L{qmq.store.log.CommitLogStore} (a base class of
it, with no state of its own): it reads and sets the store's attributes,
which C{CommitLogStore.__init__} makes, and writes through the store's
batch (C{_place}, C{_append}).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from qmq.store.record import (
    RECORD_BIND,
    RECORD_BIND_EXCHANGE,
    RECORD_DECLARE_EXCHANGE,
    RECORD_DECLARE_QUEUE,
    RECORD_PUBLISH,
    RECORD_REQUEUE,
    RecordError,
    arguments_key,
    decode_publish,
    decode_requeue,
    decode_topology,
    encode_publish,
    encode_requeue,
)
from qmq.store.segment import SegmentReader, read_segment, segment_name

_log = Logger()


class Compaction:
    """The commit log's compaction (see the module docstring); a base class
    of L{qmq.store.log.CommitLogStore}."""

    def _compact_tick(self) -> None:
        self._compact_call = None
        self.compact()
        if not self._closing:
            self._compact_call = self._reactor.callLater(self.compact_interval, self._compact_tick)

    def compact(self) -> Deferred | None:
        """Copy the live records of the first sparse segment forward, so it
        can go; return a Deferred that fires when the copies are queued, or
        None if no segment needs it. An active segment that is full of dead
        records is rolled, so it can go too."""
        if self._compacting is not None or self._closing or self._failed is not None:
            return None
        index = self._index
        info = index.segments.get(self._active)
        if info is not None and not info.live and self._active_size >= self.segment_size // 4:
            self._roll()
            self._place()
            self._want_flush()
        now = self._reactor.seconds()
        if index.kept_last:
            # Segments kept for retention go as time passes, not as records die.
            index.dirty = True
            if index.kept_last <= now:
                index.kept_last = 0.0
        number = index.compactable(self._sealed, self.compact_ratio, self._stuck, now)
        if number is None:
            if index.dirty:
                self._want_flush()
            return None
        self._compacting = number
        path = os.path.join(self.directory, segment_name(number))
        d = self._run(read_segment, path)
        d.addCallback(self._copy_forward, number, path)

        def done(result: Any) -> Any:
            self._compacting = None
            return result

        d.addBoth(done)
        d.addErrback(
            lambda f: _log.failure("commit log: compaction of {path} failed", f, path=path)
        )
        return d

    def _copy_forward(self, data: bytes, number: int, path: str) -> None:
        """Rewrite the live records of segment C{number} (read as C{data})
        at the head of the log."""
        index = self._index
        reader = SegmentReader(path, data, last=False)
        self.compactions += 1
        copied = 0
        for type_, start, end in reader.records():
            try:
                copied += self._copy_record(number, type_, data, start, end)
            except (RecordError, KeyError, TypeError) as e:
                _log.warn("commit log: compaction of {path}: {error}", path=path, error=e)
        info = index.segments.get(number)
        if info is not None and info.live:
            # Not tried again (a bug, or damage the copy could not read).
            self._stuck.add(number)
            _log.warn(
                "commit log: {path} still has {live} live records after compaction",
                path=path,
                live=info.live,
            )
        index.dirty = True
        self._want_flush()

    def _copy_record(self, number: int, type_: int, data: bytes, start: int, end: int) -> int:
        index = self._index
        if type_ == RECORD_PUBLISH:
            p = decode_publish(data, start, end)
            if index.where.get(p.id) != number:
                return 0
            holders = index.holders(p.id, p.vhost, p.queues)
            if not holders:
                return 0
            chunks = self._place()
            vname, vbytes = self._vhost(p.vhost)
            names = [name for name, _ in holders]
            head, tail = encode_publish(
                p.id, p.timestamp, p.expiry, p.priority, p.persistent, vbytes,
                p.exchange, p.routing_key, p.headers, p.body, [n.encode() for n in names],
                p.properties, p.deliver_at, p.ack_timeout,
            )  # fmt: skip
            index.forget(self._active, p.id, vname, p.queues)
            index.publish(self._active, p.id, vname, names, p.timestamp)
            chunks.append(head)
            if tail:
                chunks.append(tail)
            self._active_size += len(head) + len(tail)
            self._active_records += 1
            for name, count in holders:
                if count:
                    self._place()
                    index.requeue(self._active, vname, name, p.id, count)
                    self._append(encode_requeue(vbytes, name.encode(), p.id, count))
            return 1
        if type_ == RECORD_REQUEUE:
            vhost, queue, mid, _ = decode_requeue(data, start, end)
            qs = index.vhosts.get(vhost, {}).get(queue)
            if qs is None or not qs.requeued or qs.requeued.get(mid) != number:
                return 0
            count = qs.count(mid) or 0
            self._place()
            index.requeue(self._active, vhost, queue, mid, count)
            self._append(encode_requeue(vhost.encode(), queue.encode(), mid, count))
            return 1
        if type_ == RECORD_DECLARE_QUEUE:
            f = decode_topology(data, start, end, type_)
            qs = index.vhosts.get(f["vhost"], {}).get(f["queue"])
            if qs is None or qs.declared != number:
                return 0
            self._declare_queue(
                f["vhost"], f["queue"], qs.arguments, qs.flags, force=True, since=qs.since
            )
            return 1
        if type_ == RECORD_DECLARE_EXCHANGE:
            f = decode_topology(data, start, end, type_)
            ex = index.exchanges.get((f["vhost"], f["exchange"]))
            if ex is None or ex[2] != number:
                return 0
            self._declare_exchange(f["vhost"], f["exchange"], ex[0], ex[1], force=True, options=ex[3])
            return 1
        if type_ == RECORD_BIND or type_ == RECORD_BIND_EXCHANGE:
            f = decode_topology(data, start, end, type_)
            if type_ == RECORD_BIND:
                table, target, source = index.bindings, f["queue"], f["exchange"]
            else:
                table, target, source = index.exchange_bindings, f["destination"], f["source"]
            key = (f["vhost"], target, source, f["key"], arguments_key(f.get("arguments")))
            b = table.get(key)
            if b is None or b.segment != number:
                return 0
            self._binding(type_, f["vhost"], target, source, f["key"], b.arguments, True)
            return 1
        return 0
