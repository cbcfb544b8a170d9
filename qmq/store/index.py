# -*- test-case-name: tests.test_store_log -*-
"""The commit log's index: what is live, and which segments may go.

The store keeps this index in memory, on the reactor thread. It is built
twice the same way: by replaying every record at start (recovery), and by
applying each record as it is written. Each method applies one record and
says whether it changes anything (a record that changes nothing, such as a
settle of a message the queue does not hold, is not written).

B{Live records.} A record is live while a restart still needs it:

  - a publish, while at least one queue still holds the message and no
    later copy of it was written (compaction copies live records forward);
  - a requeue, while it is the newest one for its (queue, message) and the
    queue still holds the message;
  - a queue or exchange declaration, while the queue or exchange exists
    and was not declared again with other arguments; a binding, while it
    exists.

Settles, deletions and unbindings are never live: they only cancel older
records. Each segment counts its live records.

B{When a segment may be deleted.} A segment with no live record may still
hold records that cancel older ones (a settle of a message published two
segments earlier): deleting it while that older segment is still on disk
would bring the message back at the next start. So each segment remembers
the oldest segment any of its records cancels (C{cancel_min}), and it may
be deleted only once no segment from there up to itself remains
(L{Index.collect}). Records that cancel nothing older than their own
segment (the common case: a message settled soon after it was published)
let segments go in any order.

B{Memory.} Per stored message: one entry in its queue's dict (id to
delivery count; no dict at all for a queue holding one message) and one in
L{Index.where} (id to segment); a message held by several queues has one
more in L{Index.refs}. Per durable queue: one L{QueueState}, 88 bytes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from qmq.store.record import arguments_key

_INF = float("inf")

#: Flags of a declared queue (L{QueueState.flags}; the declare-queue record
#: carries them by name, see docs/storage.rst).
QUEUE_AUTO_DELETE = 1
QUEUE_EXCLUSIVE = 2
QUEUE_SUBSCRIPTION = 4
_FLAG_NAMES = (
    ("auto_delete", QUEUE_AUTO_DELETE),
    ("exclusive", QUEUE_EXCLUSIVE),
    ("subscription", QUEUE_SUBSCRIPTION),
)


def queue_flags(fields: dict) -> int | None:
    """The C{QUEUE_*} bits of a declare-queue record, or None if it carries
    none (format 1)."""
    # Once per durable queue at recovery: plain lookups, no generators.
    get = fields.get
    auto_delete = get("auto_delete")
    exclusive = get("exclusive")
    subscription = get("subscription")
    if auto_delete is None and exclusive is None and subscription is None:
        if not any(name in fields for name, _ in _FLAG_NAMES):
            return None
    return (
        (QUEUE_AUTO_DELETE if auto_delete else 0)
        | (QUEUE_EXCLUSIVE if exclusive else 0)
        | (QUEUE_SUBSCRIPTION if subscription else 0)
    )


class SegmentInfo:
    """What the index knows of one segment.

    @ivar live: its live records.
    @ivar records: every record it holds (live or not).
    @ivar cancel_min: the oldest segment its records cancel something in
        (itself when they cancel nothing older).
    @ivar kept_until: the segment is kept until then (seconds since the
        epoch) for the messages acked on a queue with retention whose
        publish records it holds; 0.0 for none.
    @ivar min_ts: the earliest publish time of its publish records (inf
        when it holds none); C{max_ts} the latest; C{min_id} and
        C{max_id} likewise for message ids. Range scans read only the
        segments whose ranges meet theirs.
    @ivar offloaded: messages waiting in queues with their body left in
        this segment (L{qmq.core.queue.Queue.offload}): it is not compacted
        while there are any, so the places they point to stay right.
    """

    __slots__ = (
        "number",
        "live",
        "records",
        "cancel_min",
        "kept_until",
        "min_ts",
        "max_ts",
        "min_id",
        "max_id",
        "offloaded",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.live = 0
        self.records = 0
        self.cancel_min = number
        self.kept_until = 0.0
        self.min_ts = _INF
        self.max_ts = -_INF
        self.min_id = 1 << 64
        self.max_id = 0
        self.offloaded = 0

    def published(self, message_id: int, timestamp: float) -> None:
        """Widen the ranges for a publish record of C{message_id} at C{timestamp}."""
        if timestamp < self.min_ts:
            self.min_ts = timestamp
        if timestamp > self.max_ts:
            self.max_ts = timestamp
        if message_id < self.min_id:
            self.min_id = message_id
        if message_id > self.max_id:
            self.max_id = message_id

    def __repr__(self) -> str:
        return (
            f"<Segment {self.number} live={self.live}/{self.records} cancel_min={self.cancel_min}>"
        )


class QueueState:
    """A durable queue as the index sees it.

    The messages it holds (id -> delivery count) are kept the cheapest way
    for their number: none, one (two slots), or a dict. A million idle or
    one-message queues save the dict: 64 bytes each empty, 224 with one
    entry.

    @ivar requeued: message id -> segment of its live requeue record, or None.
    @ivar declared: segment of its live declaration, or None (a queue known
        only from its messages, its declaration lost to damage).
    @ivar arguments: its declared arguments.
    @ivar bindings: keys (in L{Index.bindings}) of its bindings, or None.
    @ivar since: the first message id this queue (this incarnation of its
        name) can hold; a range scan shows nothing older, so a queue
        deleted and declared again does not show its predecessor's
        messages.
    @ivar flags: C{QUEUE_*} bits of its declaration, or None when the
        declaration did not say (format 1).
    """

    __slots__ = (
        "_one",
        "_count",
        "_ids",
        "requeued",
        "declared",
        "arguments",
        "bindings",
        "since",
        "flags",
    )

    def __init__(self) -> None:
        self._one: int | None = None  # the id, when it holds exactly one
        self._count = 0
        self._ids: dict[int, int] | None = None  # when it holds more
        self.requeued: dict[int, int] | None = None
        self.declared: int | None = None
        self.arguments: dict | None = None
        self.bindings: set | None = None
        self.since = 0
        self.flags: int | None = None

    def hold(self, message_id: int) -> bool:
        """Hold C{message_id} (delivery count 0); False if it did already."""
        ids = self._ids
        if ids is not None:
            if message_id in ids:
                return False
            ids[message_id] = 0
            return True
        one = self._one
        if one is None:
            self._one = message_id
            self._count = 0
            return True
        if one == message_id:
            return False
        self._ids = {one: self._count, message_id: 0}
        self._one = None
        return True

    def release(self, message_id: int) -> int:
        """Let C{message_id} go; return its delivery count, or -1 if it was
        not held."""
        ids = self._ids
        if ids is not None:
            count = ids.pop(message_id, -1)
            if not ids:
                self._ids = None
            return count
        if self._one == message_id:
            self._one = None
            return self._count
        return -1

    def one(self) -> int | None:
        """The id of the message it holds when it holds exactly one, else None."""
        return self._one

    def count(self, message_id: int) -> int | None:
        """The delivery count of C{message_id}, or None if it is not held."""
        ids = self._ids
        if ids is not None:
            return ids.get(message_id)
        return self._count if self._one == message_id else None

    def set_count(self, message_id: int, count: int) -> None:
        """Set the delivery count of a message it holds."""
        if self._ids is not None:
            self._ids[message_id] = count
        else:
            self._count = count

    def items(self) -> list[tuple[int, int]]:
        """C{(message id, delivery count)} of what it holds."""
        if self._ids is not None:
            return list(self._ids.items())
        if self._one is not None:
            return [(self._one, self._count)]
        return []

    def __contains__(self, message_id: int) -> bool:
        ids = self._ids
        if ids is not None:
            return message_id in ids
        return self._one == message_id

    def __len__(self) -> int:
        if self._ids is not None:
            return len(self._ids)
        return 0 if self._one is None else 1


@dataclass
class Binding:
    vhost: str
    queue: str
    exchange: str
    key: str
    arguments: dict | None
    segment: int


@dataclass
class ExchangeBinding:
    """An exchange-to-exchange binding: what C{source} routes with C{key}
    goes on through C{destination}."""

    vhost: str
    destination: str
    source: str
    key: str
    arguments: dict | None
    segment: int



def exchange_options(fields: dict) -> dict | None:
    """The options of a declare-exchange record's fields (or of an exchange's
    C{internal} and C{arguments}): None when it has none, so that the
    records of plain exchanges stay as they were."""
    options = {}
    if fields.get("internal"):
        options["internal"] = True
    if fields.get("arguments"):
        options["arguments"] = dict(fields["arguments"])
    return options or None

class Index:
    """Live records, per queue and per segment (see the module docstring).

    @ivar segments: segment number -> L{SegmentInfo}, in number order.
    @ivar vhosts: vhost name -> queue name -> L{QueueState}.
    @ivar where: message id -> segment of its live publish record.
    @ivar refs: message id -> how many queues hold it, when more than one.
    @ivar exchanges: (vhost, name) -> (type, auto_delete, segment, options):
        options is None, or a dict with C{internal} and/or C{arguments}
        (L{exchange_options}).
    @ivar bindings: (vhost, queue, exchange, key, arguments key) -> L{Binding}.
    @ivar exchange_bindings: (vhost, destination, source, key, arguments
        key) -> L{ExchangeBinding}.
    @ivar max_id: the highest message id seen.
    @ivar dirty: a segment's live count fell to zero, or a segment went:
        L{collect} may find something.
    @ivar kept_last: see L{keep}.
    """

    def __init__(self) -> None:
        self.segments: dict[int, SegmentInfo] = {}
        self.vhosts: dict[str, dict[str, QueueState]] = {}
        self.where: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.exchanges: dict[tuple[str, str], tuple[str, bool, int, dict | None]] = {}
        self.bindings: dict[tuple, Binding] = {}
        self.exchange_bindings: dict[tuple, ExchangeBinding] = {}
        self.max_id = 0
        self.dirty = False
        #: The latest time a segment is kept until for retention (0.0: none):
        #: while the clock has not passed it, the store looks for segments
        #: to delete as time passes, not only as records die.
        self.kept_last = 0.0

    # -- segments -----------------------------------------------------------

    def add_segment(self, number: int) -> SegmentInfo:
        info = self.segments[number] = SegmentInfo(number)
        return info

    def _dead(self, segment: int) -> None:
        """One live record of C{segment} died."""
        info = self.segments[segment]
        info.live -= 1
        if not info.live:
            self.dirty = True

    def _cancels(self, segment: int, older: int) -> None:
        """A record in C{segment} cancels one in C{older}."""
        info = self.segments[segment]
        if older < info.cancel_min:
            info.cancel_min = older

    def collect(self, active: int, now: float = 0.0) -> list[int]:
        """Remove and return the segments that may be deleted now (see the
        module docstring), oldest first; never C{active}, nor one kept for
        retention past C{now}."""
        self.dirty = False
        existing = list(self.segments)
        gone = []
        for number in list(existing):
            info = self.segments[number]
            if info.live or number == active or info.kept_until > now:
                continue
            # No segment remaining in [cancel_min, number): the first one at
            # or after cancel_min is this one.
            if existing[bisect_left(existing, info.cancel_min)] == number:
                existing.remove(number)
                del self.segments[number]
                gone.append(number)
        return gone

    def compactable(
        self,
        below: int,
        ratio: float,
        skip: set[int] = frozenset(),  # type: ignore[assignment]
        now: float = 0.0,
    ) -> int | None:
        """The first segment under C{below} (and not in C{skip}) worth
        compacting: live records are at most C{ratio} of its records, and
        once they are copied forward it may be deleted. A segment kept for
        retention past C{now} is not: compaction copies only live records,
        and a retained message is not live."""
        existing = list(self.segments)
        for number in existing:
            if number >= below:
                break
            info = self.segments[number]
            if number in skip or info.kept_until > now or info.offloaded:
                continue
            if info.live and info.live <= ratio * info.records:
                if existing[bisect_left(existing, info.cancel_min)] == number:
                    return number
        return None

    def _queue(self, vhost: str, name: str) -> QueueState:
        queues = self.vhosts.get(vhost)
        if queues is None:
            queues = self.vhosts[vhost] = {}
        qs = queues.get(name)
        if qs is None:
            qs = queues[name] = QueueState()
        return qs

    # -- messages -----------------------------------------------------------

    def publish(
        self,
        segment: int,
        message_id: int,
        vhost: str,
        queues: Sequence[str],
        timestamp: float,
    ) -> int:
        """A publish record of C{message_id} for C{queues}, published at
        C{timestamp}; return how many queues took it. (A copy made by
        compaction comes after L{forget}.)"""
        info = self.segments[segment]
        info.records += 1
        # SegmentInfo.published, inlined (once per publish).
        if timestamp < info.min_ts:
            info.min_ts = timestamp
        if timestamp > info.max_ts:
            info.max_ts = timestamp
        if message_id < info.min_id:
            info.min_id = message_id
        if message_id > info.max_id:
            info.max_id = message_id
        if message_id > self.max_id:
            self.max_id = message_id
        vqueues = self.vhosts.get(vhost)
        if vqueues is None:
            vqueues = self.vhosts[vhost] = {}
        if len(queues) == 1:
            # The common case, without the loop.
            qs = vqueues.get(queues[0])
            if qs is None:
                qs = vqueues[queues[0]] = QueueState()
            ids = qs._ids
            if ids is not None:
                # QueueState.hold's common case, inlined (once per publish).
                if message_id in ids:
                    return 0
                ids[message_id] = 0
            elif not qs.hold(message_id):
                return 0
            if qs.since == message_id:
                # The queue's first message (a queue made by a publish to
                # it): one int object for both, not 32 bytes more a queue.
                qs.since = message_id
            self.where[message_id] = segment
            info.live += 1
            return 1
        n = 0
        for name in queues:
            qs = vqueues.get(name)
            if qs is None:
                qs = vqueues[name] = QueueState()
            if qs.hold(message_id):
                n += 1
        if n:
            self.where[message_id] = segment
            info.live += 1
            if n > 1:
                self.refs[message_id] = n
        return n

    def _unref(self, segment: int, message_id: int) -> bool:
        """A queue let C{message_id} go, by a record in C{segment}; return
        whether no queue holds it any more."""
        self._cancels(segment, self.where[message_id])
        refs = self.refs.get(message_id)
        if refs is not None:
            if refs > 2:
                self.refs[message_id] = refs - 1
            else:
                del self.refs[message_id]
            return False
        self._dead(self.where.pop(message_id))
        return True

    def settle(
        self, segment: int, vhost: str, queue: str, message_id: int, kept_until: float = 0.0
    ) -> bool:
        """A settle record: C{queue} let C{message_id} go for good. Return
        False (write nothing) if the queue did not hold it.

        @param kept_until: the segment of its publish record is kept until
            then (retention), even once nothing in it is live.
        """
        vqueues = self.vhosts.get(vhost)
        if vqueues is None:
            return False
        qs = vqueues.get(queue)
        if qs is None or qs.release(message_id) < 0:
            return False
        requeued = qs.requeued
        if requeued:
            rseg = requeued.pop(message_id, None)
            if rseg is not None:
                self._dead(rseg)
        segments = self.segments
        info = segments[segment]
        info.records += 1
        # _unref, inlined (one settle per ack).
        where = self.where
        published = where[message_id]
        if published < info.cancel_min:
            info.cancel_min = published
        if kept_until:
            self.keep(published, kept_until)
        refs = self.refs
        if refs and message_id in refs:
            n = refs[message_id]
            if n > 2:
                refs[message_id] = n - 1
            else:
                del refs[message_id]
            return True
        del where[message_id]
        info = segments[published]
        info.live -= 1
        if not info.live:
            self.dirty = True
        return True

    def keep(self, segment: int, until: float) -> None:
        """Keep C{segment} until C{until} (retention)."""
        info = self.segments[segment]
        if until > info.kept_until:
            info.kept_until = until
            if until > self.kept_last:
                self.kept_last = until

    def requeue(self, segment: int, vhost: str, queue: str, message_id: int, count: int) -> bool:
        """A requeue record: C{message_id} is back in C{queue}, delivered
        C{count} times. Return False if the queue does not hold it.

        """
        vqueues = self.vhosts.get(vhost)
        if vqueues is None:
            return False
        qs = vqueues.get(queue)
        if qs is None or message_id not in qs:
            return False
        qs.set_count(message_id, count)
        requeued = qs.requeued
        if requeued is None:
            requeued = qs.requeued = {}
        old = requeued.get(message_id)
        if old is not None:
            self._dead(old)
        requeued[message_id] = segment
        info = self.segments[segment]
        info.live += 1
        info.records += 1
        return True

    def forget(self, segment: int, message_id: int, vhost: str, queues: list[str]) -> None:
        """Drop C{message_id} from C{queues} before a copy of its publish
        record (written in C{segment}) replaces the old one."""
        if message_id not in self.where:
            return
        self._cancels(segment, self.where[message_id])
        vqueues = self.vhosts.get(vhost, {})
        for name in queues:
            qs = vqueues.get(name)
            if qs is not None and qs.release(message_id) >= 0 and qs.requeued:
                rseg = qs.requeued.pop(message_id, None)
                if rseg is not None:
                    self._dead(rseg)
        self.refs.pop(message_id, None)
        self._dead(self.where.pop(message_id))

    def holders(self, message_id: int, vhost: str, queues: list[str]) -> list[tuple[str, int]]:
        """C{(queue, delivery count)} of those of C{queues} that hold C{message_id}."""
        vqueues = self.vhosts.get(vhost, {})
        held = []
        for name in queues:
            qs = vqueues.get(name)
            if qs is not None:
                count = qs.count(message_id)
                if count is not None:
                    held.append((name, count))
        return held

    # -- topology -----------------------------------------------------------

    def declare_queue(
        self,
        segment: int,
        vhost: str,
        name: str,
        arguments: dict | None,
        force: bool = False,
        flags: int | None = None,
        since: int | None = None,
    ) -> bool:
        """A queue declaration; False if it is declared alike already.

        @param force: write it even so (compaction moves it forward).
        @param flags: C{QUEUE_*} bits, or None if the record has none.
        @param since: the queue's L{QueueState.since} as the record says;
            None: a new queue starts above every id seen, a known one keeps
            its own.
        """
        vqueues = self.vhosts.get(vhost)
        qs = vqueues.get(name) if vqueues is not None else None
        if (
            qs is not None
            and qs.declared is not None
            and qs.arguments == arguments
            and qs.flags == flags
            and not force
        ):
            return False
        if qs is None:
            qs = self._queue(vhost, name)
            qs.since = self.max_id + 1
        elif qs.declared is not None:
            self._dead(qs.declared)
            self._cancels(segment, qs.declared)
        if since is not None:
            qs.since = since
        qs.declared = segment
        qs.arguments = arguments
        qs.flags = flags
        info = self.segments[segment]
        info.live += 1
        info.records += 1
        return True

    def delete_queue(self, segment: int, vhost: str, name: str) -> list[int] | None:
        """A queue deletion; return the ids no queue holds any more, or None
        if the queue was unknown (nothing to write).

        """
        vqueues = self.vhosts.get(vhost)
        if vqueues is None or name not in vqueues:
            return None
        qs = vqueues.pop(name)
        self.segments[segment].records += 1
        gone = [mid for mid, _ in qs.items() if self._unref(segment, mid)]
        if qs.requeued:
            for rseg in qs.requeued.values():
                self._dead(rseg)
        if qs.declared is not None:
            self._dead(qs.declared)
            self._cancels(segment, qs.declared)
        if qs.bindings:
            for key in qs.bindings:
                b = self.bindings.pop(key)
                self._dead(b.segment)
                self._cancels(segment, b.segment)
        return gone

    def declare_exchange(
        self,
        segment: int,
        vhost: str,
        name: str,
        type_: str,
        auto_delete: bool,
        force: bool = False,
        options: dict | None = None,
    ) -> bool:
        key = (vhost, name)
        old = self.exchanges.get(key)
        if old is not None and old[0] == type_ and old[1] == auto_delete and old[3] == options and not force:
            return False
        if old is not None:
            self._dead(old[2])
            self._cancels(segment, old[2])
        self.exchanges[key] = (type_, auto_delete, segment, options)
        info = self.segments[segment]
        info.live += 1
        info.records += 1
        return True

    def delete_exchange(self, segment: int, vhost: str, name: str) -> bool:
        old = self.exchanges.get((vhost, name))
        if old is None:
            return False
        del self.exchanges[(vhost, name)]
        self.segments[segment].records += 1
        self._dead(old[2])
        self._cancels(segment, old[2])
        for key in [k for k in self.bindings if k[0] == vhost and k[2] == name]:
            self._drop_binding(segment, key)
        for key in [
            k for k in self.exchange_bindings if k[0] == vhost and (k[1] == name or k[2] == name)
        ]:
            self._drop_exchange_binding(segment, key)
        return True

    def bind(
        self,
        segment: int,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: dict | None,
        force: bool = False,
    ) -> bool:
        key = (vhost, queue, exchange, routing_key, arguments_key(arguments))
        if not self._renew(self.bindings, key, segment, force):
            return False
        self.bindings[key] = Binding(vhost, queue, exchange, routing_key, arguments, segment)
        qs = self._queue(vhost, queue)
        if qs.bindings is None:
            qs.bindings = set()
        qs.bindings.add(key)
        return True

    def unbind(
        self,
        segment: int,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: dict | None,
    ) -> bool:
        key = (vhost, queue, exchange, routing_key, arguments_key(arguments))
        if not self._removal(self.bindings, key, segment):
            return False
        self._drop_binding(segment, key)
        return True

    def _drop_binding(self, segment: int, key: tuple) -> None:
        b = self.bindings.pop(key)
        self._dead(b.segment)
        self._cancels(segment, b.segment)
        qs = self.vhosts.get(b.vhost, {}).get(b.queue)
        if qs is not None and qs.bindings:
            qs.bindings.discard(key)

    def bind_exchange(
        self,
        segment: int,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: dict | None,
        force: bool = False,
    ) -> bool:
        """An exchange-to-exchange binding; False if it is known already
        (nothing to write) unless C{force} (compaction moves it forward)."""
        key = (vhost, destination, source, routing_key, arguments_key(arguments))
        if not self._renew(self.exchange_bindings, key, segment, force):
            return False
        self.exchange_bindings[key] = ExchangeBinding(
            vhost, destination, source, routing_key, arguments, segment
        )
        return True

    def unbind_exchange(
        self,
        segment: int,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: dict | None,
    ) -> bool:
        """Its removal; False if it was not known (nothing to write)."""
        key = (vhost, destination, source, routing_key, arguments_key(arguments))
        if not self._removal(self.exchange_bindings, key, segment):
            return False
        self._drop_exchange_binding(segment, key)
        return True

    def _drop_exchange_binding(self, segment: int, key: tuple) -> None:
        b = self.exchange_bindings.pop(key)
        self._dead(b.segment)
        self._cancels(segment, b.segment)

    def _renew(self, table: dict, key: tuple, segment: int, force: bool) -> bool:
        """A binding record of C{key} in C{segment} (the caller puts it in
        C{table}): False if C{table} has it already and not C{force}
        (nothing to write); else the one it replaces dies, and C{segment}
        counts a live record more."""
        old = table.get(key)
        if old is not None:
            if not force:
                return False
            self._dead(old.segment)
            self._cancels(segment, old.segment)
        info = self.segments[segment]
        info.live += 1
        info.records += 1
        return True

    def _removal(self, table: dict, key: tuple, segment: int) -> bool:
        """An unbind record of C{key} in C{segment}: False if C{table} has
        no such binding (nothing to write); else C{segment} counts it."""
        if key not in table:
            return False
        self.segments[segment].records += 1
        return True

    # -- counts ---------------------------------------------------------------

    def live_messages(self) -> int:
        """Messages some queue still holds."""
        return len(self.where)
