# -*- test-case-name: tests.test_store_log -*-
"""Recovery: replaying a log's records into an index, and what comes back.

The store replays every segment in number order at start
(L{qmq.store.log.CommitLogStore.recover}); the offline tool replays the same
way to count live messages. L{Replay.segment} applies each whole record to
the L{Index} (the same calls the store makes as it writes) and keeps a
L{Message} for every message some queue still holds; a message settled by
every queue it reached is dropped as soon as its last settle is read, so
replay holds at most the live messages. L{Replay.recovery} then orders each
queue's messages by id (publish order, which is queue order: a queue hands
out messages in id order, and gives back requeued ones ahead of the rest in
id order) and gives each copy its delivery count.

A record that passes its checksum but does not decode is reported as
damage and skipped, like one that fails it.
"""

from __future__ import annotations

from twisted.logger import Logger

from qmq.core.message import Message, OnDisk
from qmq.core.store import RecoveredQueue, Recovery
from qmq.core.vhost import DURABLE_SUBSCRIPTION_PREFIX
from qmq.store.index import (
    QUEUE_AUTO_DELETE,
    QUEUE_EXCLUSIVE,
    QUEUE_SUBSCRIPTION,
    Index,
    exchange_options,
    queue_flags,
)
from qmq.store.record import (
    DECLARE_BINARY,
    FLAG_PERSISTENT,
    FRAME_SIZE,
    RECORD_BIND,
    RECORD_BIND_EXCHANGE,
    RECORD_DECLARE_EXCHANGE,
    RECORD_DECLARE_QUEUE,
    RECORD_DELETE_EXCHANGE,
    RECORD_DELETE_QUEUE,
    RECORD_PUBLISH,
    RECORD_REQUEUE,
    RECORD_SETTLE,
    RECORD_UNBIND,
    RECORD_UNBIND_EXCHANGE,
    RecordError,
    decode_declare_queue,
    decode_recovered_publish,
    decode_requeue,
    decode_settle,
    decode_topology,
)
from qmq.store.segment import Problem, SegmentReader

_log = Logger()

# The virtual host most messages are in (see Replay.segment).
DEFAULT_VHOST = "/"


class Replay:
    """Replays segments into an L{Index} at start and gathers the messages
    and topology that come back (L{recovery})."""

    def __init__(self, index: Index, bodies: bool = True, backlog_memory: int = 0) -> None:
        """
        @param bodies: False leaves every message's body empty (a tool that
            only counts).
        @param backlog_memory: past this many body bytes of a queue's live
            messages (as replay goes), later ones come back with their body
            left on disk (L{qmq.core.message.OnDisk}), as the store does for
            a long backlog; 0 keeps every body.
        """
        self.index = index
        self.bodies = bodies
        self.backlog = backlog_memory
        # vhost -> queue -> body bytes of its live messages replay keeps
        # (no (vhost, queue) tuple per queue: a million of them would live
        # until the end of replay).
        self.in_memory: dict[str, dict[str, int]] = {}
        # Message id -> message: only messages some queue still holds (its
        # cache says where its publish record sent it, see segment()).
        self.messages: dict[int, Message] = {}
        self.replayed = 0
        # Queue names as their declarations gave them: the names in publish
        # records become these strings (decode_recovered_publish).
        self.names: dict[str, str] = {}

    def segment(self, number: int, data: bytes, reader: SegmentReader) -> None:
        index = self.index
        messages = self.messages
        where = index.where
        bodies = self.bodies
        names = self.names
        for type_, start, end in reader.records():
            try:
                if type_ == RECORD_PUBLISH:
                    (mid, ts, expires, priority, flags, vhost, exchange, key, headers, queues, size, extra) = (
                        decode_recovered_publish(data, start, end, names)
                    )
                    if mid in messages:
                        old = messages.pop(mid).cache
                        if old.__class__ is str:
                            index.forget(number, mid, DEFAULT_VHOST, [old])
                        else:
                            index.forget(number, mid, old[0], old[1])
                    if index.publish(number, mid, vhost, queues, ts):
                        if not bodies:
                            body = b""
                        elif self.backlog and self._over(vhost, queues, size):
                            body = on_disk(number, start - FRAME_SIZE, end - start + FRAME_SIZE, size)
                            if body is None:
                                body = data[end - size : end]
                        else:
                            body = data[end - size : end]
                        m = Message(
                            mid,
                            exchange,
                            key,
                            headers,
                            body,
                            ts,
                            flags & FLAG_PERSISTENT != 0,
                            priority,
                            expires or 0.0,  # one float for "never", not one each
                        )
                        if extra is not None:
                            m.properties, m.deliver_at, m.ack_timeout = extra
                        if body.__class__ is OnDisk:
                            # The headers come back with the body.
                            m.headers = None
                        # Where its publish record sent it, for a copy of the
                        # record that replaces it (forget): kept in the
                        # message's frontend cache, unused until recovery()
                        # empties it, so that a million messages cost no
                        # tuple and no list each until then.
                        if vhost == DEFAULT_VHOST and len(queues) == 1:
                            m.cache = queues[0]
                        else:
                            m.cache = (vhost, queues)
                        messages[mid] = m
                    self.replayed += 1
                elif type_ == RECORD_SETTLE:
                    vhost, queue, mid, _, kept = decode_settle(data, start, end)
                    if index.settle(number, vhost, queue, mid, kept):
                        if self.backlog:
                            self._settled(vhost, queue, mid)
                        if mid not in where:
                            messages.pop(mid, None)
                elif type_ == RECORD_REQUEUE:
                    vhost, queue, mid, count = decode_requeue(data, start, end)
                    index.requeue(number, vhost, queue, mid, count)
                elif type_ == RECORD_DECLARE_QUEUE and data[start] == DECLARE_BINARY:
                    # Format 3: one per durable queue, binary, no dict.
                    vhost, name, arguments, flags, since = decode_declare_queue(data, start, end)
                    index.declare_queue(
                        number,
                        vhost,
                        names.setdefault(name, name),
                        arguments,
                        flags=flags,
                        since=since,
                    )
                else:
                    self.topology(number, type_, decode_topology(data, start, end, type_))
            except (RecordError, KeyError, TypeError) as e:
                reader.problems.append(
                    Problem(
                        reader.path,
                        start - FRAME_SIZE,
                        "corrupt",
                        f"record does not decode ({e}), skipped",
                    )
                )

    def _over(self, vhost: str, queues: list[str], size: int) -> bool:
        """Whether a message of C{size} body bytes for C{queues} is past a
        queue's backlog in memory; if not, count it in."""
        counts = self.in_memory.get(vhost)
        if counts is None:
            counts = self.in_memory[vhost] = {}
        get = counts.get
        if len(queues) == 1:
            q = queues[0]
            held = get(q, 0)
            if held > self.backlog:
                return True
            counts[q] = held + size
            return False
        backlog = self.backlog
        for q in queues:
            if get(q, 0) > backlog:
                return True
        for q in queues:
            counts[q] = get(q, 0) + size
        return False

    def _settled(self, vhost: str, queue: str, mid: int) -> None:
        entry = self.messages.get(mid)
        if entry is not None and entry.body.__class__ is bytes:
            counts = self.in_memory.get(vhost)
            if counts is None:
                return
            left = counts.get(queue, 0) - len(entry.body)
            if left > 0:
                counts[queue] = left
            else:
                counts.pop(queue, None)

    def topology(self, number: int, type_: int, f: dict) -> None:
        index = self.index
        if type_ == RECORD_DECLARE_QUEUE:
            since = f.get("since")
            name = f["queue"]
            index.declare_queue(
                number,
                f["vhost"],
                self.names.setdefault(name, name),
                f.get("arguments"),
                flags=queue_flags(f),
                # Format 1 did not say: every message may be the queue's.
                since=since if since.__class__ is int else 0,
            )
        elif type_ == RECORD_DELETE_QUEUE:
            gone = index.delete_queue(number, f["vhost"], f["queue"])
            self.in_memory.get(f["vhost"], {}).pop(f["queue"], None)
            for mid in gone or ():
                self.messages.pop(mid, None)
        elif type_ == RECORD_DECLARE_EXCHANGE:
            index.declare_exchange(
                number, f["vhost"], f["exchange"], f["type"], bool(f["auto_delete"]),
                options=exchange_options(f),
            )
        elif type_ == RECORD_DELETE_EXCHANGE:
            index.delete_exchange(number, f["vhost"], f["exchange"])
        elif type_ == RECORD_BIND:
            index.bind(number, f["vhost"], f["queue"], f["exchange"], f["key"], f.get("arguments"))
        elif type_ == RECORD_UNBIND:
            index.unbind(
                number, f["vhost"], f["queue"], f["exchange"], f["key"], f.get("arguments")
            )
        elif type_ == RECORD_BIND_EXCHANGE:
            index.bind_exchange(
                number, f["vhost"], f["destination"], f["source"], f["key"], f.get("arguments")
            )
        elif type_ == RECORD_UNBIND_EXCHANGE:
            index.unbind_exchange(
                number, f["vhost"], f["destination"], f["source"], f["key"], f.get("arguments")
            )

    def recovery(self) -> Recovery:
        """The topology and messages to put back, and drop what replay kept."""
        index = self.index
        messages = self.messages
        recovery = Recovery()
        shared: set[int] = set()
        for (vhost, name), (type_, auto_delete, _, options) in index.exchanges.items():
            recovery.exchanges.append((vhost, name, type_, auto_delete, options))
        for vhost, queues in index.vhosts.items():
            unknown = []
            for name, qs in queues.items():
                if qs.declared is None:
                    if not len(qs) and not qs.bindings:
                        unknown.append(name)
                        continue
                    _log.warn(
                        "commit log: queue {queue!r} in vhost {vhost!r} has messages but its "
                        "declaration was lost; it is declared again with no arguments",
                        queue=name,
                        vhost=vhost,
                    )
                flags = qs.flags
                if flags is None:
                    # Format 1: only the name tells a durable subscription.
                    flags = QUEUE_SUBSCRIPTION if name.startswith(DURABLE_SUBSCRIPTION_PREFIX) else 0
                recovery.queues.append(
                    RecoveredQueue(
                        vhost,
                        name,
                        qs.arguments,
                        bool(flags & QUEUE_AUTO_DELETE),
                        bool(flags & QUEUE_EXCLUSIVE),
                        bool(flags & QUEUE_SUBSCRIPTION),
                    )
                )
                one = qs.one()
                if one is not None:
                    # One message (a million queues with one each): no sort.
                    m = messages.get(one)
                    if m is not None:
                        m.cache = None
                        if qs.count(one) or m.body.__class__ is OnDisk:
                            m = self._restored(m, qs.count(one), shared)  # type: ignore[arg-type]
                        recovery.messages[(vhost, name)] = [m]
                elif len(qs):
                    restored = []
                    for mid, count in sorted(qs.items()):
                        m = messages.get(mid)
                        if m is None:
                            continue
                        m.cache = None
                        if count or m.body.__class__ is OnDisk:
                            m = self._restored(m, count, shared)
                        restored.append(m)
                    recovery.messages[(vhost, name)] = restored
            for name in unknown:
                del queues[name]
        for b in index.bindings.values():
            recovery.bindings.append((b.vhost, b.queue, b.exchange, b.key, b.arguments))
        for e in index.exchange_bindings.values():
            recovery.exchange_bindings.append(
                (e.vhost, e.destination, e.source, e.key, e.arguments)
            )
        self.messages = {}
        self.names = {}
        return recovery

    def _restored(self, m: Message, count: int, shared: set[int]) -> Message:
        """The copy of C{m} a queue gets back: delivered C{count} times; one
        whose body is on disk is its queue's own (loading it back fills it
        in place), and pins its segment."""
        if count:
            m = _with_count(m, count)
        if m.body.__class__ is OnDisk:
            if m.id in shared:
                m = m.offloaded(m.body)  # type: ignore[arg-type]
            shared.add(m.id)
            self.index.segments[m.body >> 102].offloaded += 1  # type: ignore[operator]
        return m


def on_disk(segment: int, offset: int, size: int, body: int) -> OnDisk | None:
    """The placeholder of a body left on disk: the record of C{size} bytes
    at C{offset} in C{segment}, its body C{body} bytes long (None if a
    length is too large to say)."""
    if body >= 1 << 31 or size >= 1 << 31 or offset >= 1 << 40:
        return None
    return OnDisk(((segment << 40 | offset) << 31 | size) << 31 | body)


def _with_count(message: Message, count: int) -> Message:
    """A copy of C{message} delivered C{count} times already."""
    m = message.redelivery()
    m.delivery_count = count
    return m
