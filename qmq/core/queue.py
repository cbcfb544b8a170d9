# -*- test-case-name: tests.test_core_queue,tests.test_core,tests.test_core_delivery -*-
"""Queues: ordered buffers of messages handed to consumers within credit.

A queue keeps its never-delivered ready messages in a list with a moving
head (cheaper in memory than a deque for the millions of small queues QMQ
aims to hold: an empty list is 56 bytes, an empty deque over 600) and its
consumers in a list served round robin. Messages given back wait in a
min-heap by message id that sits I{in} that list, at the head, while it has
any (see L{Queue.requeue}); so "is anything waiting?" stays one test of
that list on every hot path.

Delivery rules:

  - A published message goes straight to a ready consumer when nothing at
    all waits in the queue (the fast path); otherwise it waits at the tail.
  - A consumer is ready while it has credit and is not paused.
  - B{Requeue rule}: a message given back (nack with requeue, or its
    consumer went away without acking) returns to the B{head} of the queue,
    ahead of every message never delivered, and requeued messages keep their
    original publish order among themselves. It is delivered again marked
    redelivered, with its delivery count raised by one. Each message given
    back costs O(log n), however many wait.
  - What a queue may hold and for how long is its
    L{QueuePolicy<qmq.core.policy.QueuePolicy>} (parsed from its arguments
    in L{qmq.core.policy}), one frozen object shared by every queue with
    the same settings (a million queues declared alike hold one policy
    between them):

      - C{x-max-length} (messages) and C{x-max-length-bytes} (body bytes)
        bound the B{ready} messages, requeued ones included. When a publish
        would cross a bound, C{x-overflow} decides: C{drop-head} (the
        default) discards messages from the head (the oldest requeued one
        first) until the new one fits, and discards the new one instead if
        it can never fit; C{reject-publish} refuses it with
        L{ResourceLimit}. A message given back is put back whatever the
        bounds.
      - C{x-delivery-limit}: a message that would be given back more often
        than this is discarded instead of requeued.
      - C{x-expires} (milliseconds): a queue unused that long (no consumer,
        no L{Queue.get}, not redeclared: L{Queue.touch}) is reported to its
        virtual host, which deletes it (see L{Queue.expired}).
      - C{x-retention} (seconds) and C{x-fsync}: how the commit log keeps
        the persistent messages of a durable queue (acked messages kept
        for range scans; when a publish is confirmed); see docs/storage.rst.
        Other stores and non-durable queues ignore them.

    Every argument a queue understands is listed once, in
    L{qmq.core.policy.QUEUE_ARGUMENTS} (name, policy field, parser);
    configuration and frontends fill policies only through
    L{QueuePolicy.from_arguments<qmq.core.policy.QueuePolicy.from_arguments>},
    so an argument added there is accepted everywhere.

Delayed messages, message TTLs, ack timeouts and queue expiry
(C{x-expires}) run on one timer per queue that needs one, in
L{qmq.core.timers} (a base class of L{Queue}); queues that need none pay
nothing.

Every message that leaves a queue for good without an ack goes through
L{Queue._discard}, the one place where a dead-letter exchange will receive
them. For a persistent message on a durable queue (one with a C{store}) the
queue tells the store when it leaves for good (C{settle}) and when it is
given back (C{requeue}); messages that are not persistent never reach the
store, and that test is the only cost they pay.
"""

from __future__ import annotations

import itertools
from collections import deque
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from qmq.core.errors import ResourceLimit
from qmq.core.message import Message, OnDisk
from qmq.core.policy import (
    CUT_CONSUMERS,
    DEFAULT_POLICY,
    OVERFLOW_POLICIES,
    QueuePolicy,
)
from qmq.core.timers import CONSUMED, QueueTimers

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

    from qmq.core.consumer import Consumer
    from qmq.core.store import MessageStore
    from qmq.core.vhost import VirtualHost

# The policy names are re-exported for the modules that still import them
# from here (their home is qmq.core.policy).
__all__ = [
    "CONSUMED",
    "DEAD_LETTER_REASONS",
    "DISCARD_REASONS",
    "Queue",
]

_NO_CONSUMERS: tuple = ()

#: Why a message was discarded (L{Queue._discard}), in RabbitMQ's dead-letter
#: words where it has one, and what the store is told for each.
DISCARD_REASONS = {
    "rejected": "drop",  # nacked without requeue
    "maxlen": "drop",  # drop-head overflow (x-max-length, x-max-length-bytes)
    "delivery_limit": "drop",  # given back more often than x-delivery-limit
    "expired": "expire",  # its TTL or expiry time passed
    "purge": "purge",
    "delete": "delete",  # the queue was deleted with it
}
# Discards that a limit of the queue caused, counted in Queue.dropped.
_LIMIT_REASONS = ("maxlen", "delivery_limit")
#: Discards that go to the queue's dead-letter exchange when it has one.
DEAD_LETTER_REASONS = ("rejected", "maxlen", "delivery_limit", "expired")

# A tie-breaker for requeued messages with equal ids (the same message
# published twice to one queue), so that the heap never compares messages.
_requeue_order = itertools.count()


class _Requeued(list):
    """The min-heap of messages given back: C{(id, tie-breaker, message)}.

    It sits in the queue's list at the head while it holds any message.
    """

    __slots__ = ()


class _Levels:
    """The ready messages of a priority queue (C{x-max-priority}): a FIFO
    per priority level, each with a heap of the messages given back ahead
    of it (by id, as L{_Requeued}). It sits in the queue's list, alone, while
    the queue holds any ready message.

    A publish appends to its level's deque (O(1)); taking the next message
    looks down from the highest level used, at most C{max_priority + 1}
    levels. RabbitMQ's priority queues are made the same way.
    """

    __slots__ = ("fifos", "given", "count", "top")

    def __init__(self, levels: int) -> None:
        self.fifos: list[deque[Message]] = [deque() for _ in range(levels)]
        self.given: list[list | None] = [None] * levels
        self.count = 0
        self.top = 0

    def __len__(self) -> int:
        return self.count

    def push(self, message: Message, level: int) -> None:
        self.fifos[level].append(message)
        self.count += 1
        if level > self.top:
            self.top = level

    def push_back(self, message: Message, level: int) -> None:
        heap = self.given[level]
        if heap is None:
            heap = self.given[level] = []
        heappush(heap, (message.id, next(_requeue_order), message))
        self.count += 1
        if level > self.top:
            self.top = level

    def pop(self) -> Message:
        level = self.top
        given = self.given
        fifos = self.fifos
        while True:
            heap = given[level]
            if heap:
                message = heappop(heap)[2]
                break
            fifo = fifos[level]
            if fifo:
                message = fifo.popleft()
                break
            level -= 1
        self.top = level
        self.count -= 1
        return message

    def peek(self) -> Message:
        level = self.top
        while True:
            heap = self.given[level]
            if heap:
                return heap[0][2]
            fifo = self.fifos[level]
            if fifo:
                return fifo[0]
            level -= 1

    def ordered(self) -> list[Message]:
        out: list[Message] = []
        for level in range(len(self.fifos) - 1, -1, -1):
            heap = self.given[level]
            if heap:
                out.extend(entry[2] for entry in sorted(heap))
            out.extend(self.fifos[level])
        return out


class _Rare:
    """Per-queue state most queues never need, made on first use so that an
    idle queue pays one pointer for all of it."""

    __slots__ = ("dropped", "drain_call", "timer", "timer_at", "delayed", "acks", "ack_entries")

    def __init__(self) -> None:
        self.dropped = 0
        # The next turn's drain, while a drain stopped at its batch.
        self.drain_call: IDelayedCall | None = None
        # The queue's one timer, at the earliest of: a delayed message's
        # time, an ack deadline, the head message's expiry.
        self.timer: IDelayedCall | None = None
        self.timer_at = 0.0
        # Messages not yet visible: a heap of (time, tie, message, given back).
        self.delayed: list[tuple[float, int, Message, bool]] = []
        # Ack deadlines: a heap of [deadline, tie, consumer or None, message]
        # (None: acked in time, dropped when it reaches the top), and the
        # live entries by message.
        self.acks: list[list] = []
        self.ack_entries: dict[Message, list] = {}

    def idle(self) -> bool:
        """Whether nothing in it is needed any more."""
        return not (
            self.dropped or self.drain_call or self.timer or self.delayed or self.ack_entries
        )


class Queue(QueueTimers):
    """A named queue in a virtual host.

    @ivar name: its name.
    @ivar durable: survives a broker restart (with the commit-log store).
    @ivar exclusive_owner: the session that owns an exclusive queue, or None.
    @ivar auto_delete: deleted when its last consumer goes away.
    @ivar subscription: the queue of a durable topic subscription (a store
        keeps the flag, so a restart knows it without guessing from the
        name).
    @ivar arguments: the arguments it was declared with, or None.
    @ivar consumers: attached consumers, served round robin.
    @ivar bindings: (exchange, routing key, arguments) it is bound with.
    @ivar deleted: set once the queue has been deleted.
    @ivar policy: its L{QueuePolicy} (limits, overflow, expiry, delivery
        limit), shared with every queue that has the same settings.
    @ivar store: the store keeping its persistent messages: set by the
        virtual host for a durable queue; None keeps the store off the hot
        path.
    """

    #: Most messages one L{drain} hands out before the rest waits for the
    #: next reactor turn (about 5 ms of work here).
    drain_batch = 2048

    #: The L{qmq.core.remote.Homes} of a queue whose home is another node
    #: (a L{qmq.core.remote.RemoteQueue}); None for a queue that lives here.
    remote: Any = None

    __slots__ = (
        "name",
        "vhost",
        "durable",
        "exclusive_owner",
        "auto_delete",
        "subscription",
        "arguments",
        "consumers",
        "bindings",
        "deleted",
        "policy",
        "store",
        "expiry_key",
        "_items",
        "_head",
        "_rr",
        "_bytes",
        "_rare",
        "published",
        "delivered",
    )

    def __init__(
        self,
        vhost: VirtualHost | None,
        name: str,
        durable: bool = True,
        exclusive_owner: object = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
        policy: QueuePolicy | None = None,
        store: MessageStore | None = None,
        subscription: bool = False,
    ) -> None:
        """
        @param policy: the policy before C{arguments} apply (defaults);
            arguments given override it.
        @param store: see L{store}.
        @raise PreconditionFailed: bad arguments.
        """
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.subscription = subscription
        self.arguments = arguments or None
        # from_arguments' first case inlined: a queue made on demand has no
        # arguments of its own, its policy the virtual host's shared one.
        self.policy = (
            QueuePolicy.from_arguments(arguments, policy)
            if arguments
            else policy if policy is not None else DEFAULT_POLICY
        )
        self.store = store
        # A shared empty tuple until the first consumer: most of a million
        # idle queues never have one, and an empty list costs 56 bytes.
        self.consumers: list[Consumer] | tuple = _NO_CONSUMERS
        self.bindings: list | None = None
        self.deleted = False
        # Never-delivered messages from _head on, preceded at _head by a
        # _Requeued heap while messages given back wait (see the module
        # docstring); the slots before _head are None. The list is empty
        # exactly when nothing waits (taking the last message resets it), so
        # the hot paths test "anything waiting?" as the list's truth: no
        # len() call, no _head read.
        self._items: list[Any] = []
        self._head = 0
        self._rr = 0
        self._bytes = 0
        self._rare: _Rare | None = None
        #: Messages routed to it and messages it handed out (to consumers
        #: or L{get}), since it was made: plain counts, read when asked
        #: (C{/metrics}, the HTTP API's rates).
        self.published = 0
        self.delivered = 0
        # The bucket of the virtual host's ExpiryWheel this queue waits in.
        self.expiry_key: int | None = None
        expires = self.policy.expires
        if expires is not None and vhost is not None and vhost.expiry is not None:
            vhost.expiry.schedule(self, expires / 1000.0)  # _arm_expiry, inlined

    # -- policy ------------------------------------------------------------

    @property
    def max_length(self) -> int | None:
        """Most ready messages held (C{policy.max_length}), or None."""
        return self.policy.max_length

    @max_length.setter
    def max_length(self, value: int | None) -> None:
        # For callers that bound a queue after making it; passing a policy
        # to the constructor is better.
        self.policy = self.policy.merge(max_length=value)

    @property
    def overflow(self) -> str:
        """What a full queue does with a publish (C{policy.overflow})."""
        return self.policy.overflow

    @overflow.setter
    def overflow(self, value: str) -> None:
        if value not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {value!r}")
        self.policy = self.policy.merge(overflow=value)

    # -- counts ------------------------------------------------------------

    def __len__(self) -> int:
        """The number of messages ready for delivery (not counting unacked ones)."""
        items = self._items
        head = self._head
        n = len(items) - head
        if n and items[head].__class__ is not Message:
            n += len(items[head]) - 1
        return n

    @property
    def ready_bytes(self) -> int:
        """Body bytes of the ready messages (requeued ones included)."""
        return self._bytes

    @property
    def dropped(self) -> int:
        """Messages this queue discarded because of its limits (overflow,
        delivery limit) since it was made."""
        rare = self._rare
        return rare.dropped if rare is not None else 0

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} ready={len(self)} consumers={len(self.consumers)}>"

    # -- publishing -------------------------------------------------------

    def publish(self, message: Message) -> bool | None:
        """Deliver C{message} to a ready consumer or keep it in order.

        @return: None, or a true value when the queue did not keep the
            message (it could never fit, it had expired already; a
            duplicate, for L{qmq.core.guarantee}; L{CONSUMED}: a consumer
            that does not ack took it at once): then the store is not told
            of it for this queue.

        A message whose expiry time has passed is discarded (dead-lettered
        as C{expired}); one whose delivery time has not come waits, out of
        sight, until it has (the queue took it).

        @raise ResourceLimit: the queue is full and rejects publishes.
        """
        self.published += 1
        expires = message.expires
        if message.deliver_at or (
            # _held_back, inlined for an expiry alone (a TTL on every message).
            expires and expires <= self.vhost.broker.clock.seconds()  # type: ignore[union-attr]
        ):
            held = self._held_back(message)
            if held is not None:
                return held or None
        items = self._items
        if not items:
            consumers = self.consumers
            if consumers:
                # One consumer is the common case: testing it here saves
                # the _ready_consumer call on the hottest path.
                if len(consumers) == 1:
                    c = consumers[0]
                    if c.credit <= 0 or c.paused:
                        c = None
                else:
                    c = self._ready_consumer()
                if c is not None:
                    self.delivered += 1
                    if c.ack_required:
                        c.credit -= 1
                        c.deliver(message, self)
                        if message.ack_timeout or self.policy.ack_seconds:
                            self._arm_ack(c, message)
                    else:
                        c.deliver(message, self)
                        # Gone for good (nobody acks it): nothing to keep.
                        return CONSUMED
                    return
        size = len(message.body)
        policy = self.policy
        if policy.bounded:
            # The common case decided inline: clearly room for it. The list
            # holds at least as many entries as ready messages, except for
            # a requeue heap or a priority queue's levels (one entry, many
            # messages) at its head: then count exactly.
            n = len(items)
            if n:
                first = items[self._head]
                if first.__class__ is not Message:
                    n += len(first) - 1 - self._head
            if (n >= policy.length_room or self._bytes + size > policy.bytes_room) and not (
                self._make_room(message)
            ):
                return True
        top = policy.max_priority
        if top is None:
            items.append(message)
        else:
            # _Levels.push, inlined.
            levels = items[self._head] if items else self._levels(top)
            p = message.priority
            level = p if p < top else top
            levels.fifos[level].append(message)
            levels.count += 1
            if level > levels.top:
                levels.top = level
        self._bytes += size
        if message.expires or policy.ttl:
            # With the queue's TTL alone, later messages expire later: a
            # timer already set (for an earlier one) will do.
            # A message of its own expiry needs the timer only if it
            # expires before the timer is due.
            rare = self._rare
            if (
                rare is None
                or rare.timer is None
                or (message.expires and message.expires < rare.timer_at)
            ):
                self._wake(self._deadline(message, policy.ttl))

    def _levels(self, top: int) -> _Levels:
        """The levels of a priority queue, put in its list if it had none."""
        items = self._items
        if items:
            return items[self._head]  # type: ignore[no-any-return]
        levels = _Levels(top + 1)
        items.append(levels)
        return levels

    def _give_back(self, message: Message) -> None:
        """Put C{message} (given back) at the head, in id order (the
        requeue rule); in a priority queue, at the head of its level."""
        top = self.policy.max_priority
        if top is None:
            heappush(self._requeued_heap(), (message.id, next(_requeue_order), message))
        else:
            p = message.priority
            self._levels(top).push_back(message, p if p < top else top)

    def _held_back(self, message: Message) -> bool | None:
        """Keep C{message}, which has an expiry or a delivery time, from the
        ready messages if it must be.

        @return: True: it had expired, and was discarded; False: it waits
            for its delivery time; None: neither, publish it.
        """
        now = self._now()
        if message.expires and message.expires <= now:
            self._discard(message, "expired")
            return True
        if message.deliver_at > now:
            self._delay(message, message.deliver_at, False)
            return False
        return None

    def would_refuse(self, message: Message) -> bool:
        """Whether L{publish} would raise L{ResourceLimit} for C{message} now
        (checked for every queue of a fan-out before any gets it)."""
        policy = self.policy
        if not policy.rejects:
            return False
        if not self._items and self._ready_consumer() is not None:
            return False
        return self._full(len(message.body))

    def _full(self, size: int) -> bool:
        """Whether a message of C{size} body bytes would cross a bound."""
        policy = self.policy
        max_length = policy.max_length
        if max_length is not None and len(self) >= max_length:
            return True
        max_bytes = policy.max_bytes
        return max_bytes is not None and self._bytes + size > max_bytes

    def _make_room(self, message: Message) -> bool:
        """Apply the overflow policy before C{message} is kept.

        @return: whether C{message} is to be kept (False: it was discarded,
            since it can never fit).
        @raise ResourceLimit: the queue is full and rejects publishes.
        """
        size = len(message.body)
        if not self._full(size):
            return True
        policy = self.policy
        if policy.overflow == "reject-publish":
            if policy.max_length is not None and len(self) >= policy.max_length:
                raise ResourceLimit(f"queue {self.name!r} is full ({policy.max_length} messages)")
            raise ResourceLimit(f"queue {self.name!r} is full ({policy.max_bytes} bytes)")
        if policy.overflow == CUT_CONSUMERS:
            # A subscriber's own queue past its buffer: the subscriber is
            # cut off, the publisher and everyone else go on.
            if policy.max_length is not None and len(self) >= policy.max_length:
                reason = f"it holds {len(self)} messages it has not taken (at most {policy.max_length})"
            else:
                reason = (
                    f"it holds {self._bytes} bytes it has not taken and a message of {size} "
                    f"more (at most {policy.max_bytes})"
                )
            self._discard(message, "maxlen")
            for consumer in list(self.consumers):
                consumer.cut_off(reason)
            return False
        max_bytes = policy.max_bytes
        if policy.max_length == 0 or (max_bytes is not None and size > max_bytes):
            # Emptying the queue would not make room: lose only this one.
            self._discard(message, "maxlen")
            return False
        while self._full(size):
            self._discard(self._pop(), "maxlen")
        return True

    def restore(self, messages: list[Message]) -> None:
        """Put back messages a store recovered, in queue order (at start).

        A message still delayed (its store kept its delivery time) waits
        again, one that expired meanwhile is discarded when its turn comes.
        """
        policy = self.policy
        if len(messages) == 1:
            # A queue holding one message (a million of them at times): the
            # same, without the loops.
            m = messages[0]
            if policy.max_priority is None and not m.deliver_at:
                self._items.extend(messages)  # room for one (append makes four)
                self._bytes += len(m.body)
            else:
                self.publish_waiting(m)
            if not (policy.ttl or m.expires):
                return
            head = self._peek()
            if head is not None:
                self._wake(self._deadline(head, policy.ttl))
            return
        if policy.max_priority is None and not any(m.deliver_at for m in messages):
            self._items.extend(messages)
            self._bytes += sum(len(m.body) for m in messages)
        else:
            for m in messages:
                self.publish_waiting(m)
        if policy.ttl or any(m.expires for m in messages):
            head = self._peek()
            if head is not None:
                self._wake(self._deadline(head, self.policy.ttl))

    def publish_waiting(self, message: Message) -> None:
        """Keep C{message} in order without handing it to a consumer (for
        recovery, before consumers exist), whatever the bounds."""
        if message.deliver_at and message.deliver_at > self._now():
            self._delay(message, message.deliver_at, False)
            return
        top = self.policy.max_priority
        if top is None:
            self._items.append(message)
        else:
            p = message.priority
            self._levels(top).push(message, p if p < top else top)
        self._bytes += len(message.body)

    # -- delivery ---------------------------------------------------------

    def _ready_consumer(self) -> Consumer | None:
        consumers = self.consumers
        n = len(consumers)
        if n == 1:
            c = consumers[0]
            if c.credit > 0 and not c.paused:
                return c
            return None
        i = self._rr
        for _ in range(n):
            i += 1
            if i >= n:
                i = 0
            c = consumers[i]
            if c.credit > 0 and not c.paused:
                self._rr = i
                return c
        return None

    def _pop(self) -> Message:
        """Take the message at the head (a waiting one must exist)."""
        items = self._items
        head = self._head
        message = items[head]
        if message.__class__ is not Message:
            if message.__class__ is _Requeued:
                heap = message
                message = heappop(heap)[2]
                left = len(heap)
            else:
                # _Levels.pop, inlined.
                levels = message
                level = levels.top
                given = levels.given
                fifos = levels.fifos
                while True:
                    heap = given[level]
                    if heap:
                        message = heappop(heap)[2]
                        break
                    fifo = fifos[level]
                    if fifo:
                        message = fifo.popleft()
                        break
                    level -= 1
                levels.top = level
                left = levels.count = levels.count - 1
            if left:
                self._bytes -= len(message.body)
                return message
        items[head] = None
        head += 1
        if head == len(items):
            items.clear()
            head = 0
        elif head >= 1024 and head * 2 >= len(items):
            del items[:head]
            head = 0
        self._head = head
        self._bytes -= len(message.body)
        return message

    def drain(self) -> None:
        """Hand waiting messages to ready consumers until one side runs out.

        One call hands out at most L{drain_batch} messages; if more could go,
        the rest goes on the next reactor turn, so a consumer arriving at a
        backlog of a million messages (whose client reads as fast as the
        broker writes) does not hold the reactor, and every other client,
        for seconds.
        """
        # _pop is inlined for never-delivered messages (a call per message
        # saved); state is read again every turn since a consumer's deliver
        # may publish, get, settle or leave. The list itself is never
        # replaced, only cleared in place, so holding it is safe.
        items = self._items
        budget = self.drain_batch if self.vhost is not None else -1
        policy = self.policy
        ttl = policy.ttl
        ack_seconds = policy.ack_seconds
        now = 0.0  # read once per drain (one reactor turn), when first needed
        while items:
            if not budget:
                self._drain_next_turn()
                return
            budget -= 1
            consumers = self.consumers
            if len(consumers) == 1:
                c = consumers[0]
                if c.credit <= 0 or c.paused:
                    return
            else:
                c = self._ready_consumer()
                if c is None:
                    return
            head = self._head
            message = items[head]
            if message.__class__ is not Message:
                message = self._pop()
                if message.body.__class__ is OnDisk and not self._load_one(message):
                    continue
            else:
                if message.body.__class__ is OnDisk:
                    # Its body waits on disk (a long backlog): load a batch
                    # from the head, then look again.
                    self._load_head()
                    continue
                items[head] = None
                head += 1
                if head == len(items):
                    items.clear()
                    head = 0
                elif head >= 1024 and head * 2 >= len(items):
                    del items[:head]
                    head = 0
                self._head = head
                self._bytes -= len(message.body)
            expires = message.expires
            if expires or ttl:
                # _expired, inlined.
                if not now:
                    now = self._now()
                if ttl and (not expires or message.timestamp + ttl < expires):
                    expires = message.timestamp + ttl
                if expires <= now:
                    self._discard(message, "expired")
                    continue
            self.delivered += 1
            if c.ack_required:
                c.credit -= 1
                c.deliver(message, self)
                if message.ack_timeout or ack_seconds:
                    self._arm_ack(c, message)
            else:
                c.deliver(message, self)
                if message.persistent and self.store is not None:
                    # Delivered to a consumer that does not ack: it left
                    # the queue for good, as an ack says (the store kept it).
                    self.store.settle(self, message, "ack")

    def _drain_next_turn(self) -> None:
        """Go on draining on the next reactor turn (once, however often asked)."""
        rare = self._rare_state()
        if rare.drain_call is None:
            rare.drain_call = self.vhost.broker.clock.callLater(0, self._drain_later)  # type: ignore[union-attr]

    def _drain_later(self) -> None:
        rare = self._rare
        rare.drain_call = None  # type: ignore[union-attr]
        if rare.idle():  # type: ignore[union-attr]
            self._rare = None  # nothing else kept in it: an idle queue pays one pointer
        if not self.deleted:
            self.drain()

    def get(self) -> Message | None:
        """Take the next ready message without a consumer (polling frontends).

        A get uses the queue: its expiry starts over.
        """
        if self.expiry_key is not None:
            self.touch()
        ttl = self.policy.ttl
        items = self._items
        while items:
            first = items[self._head]
            if first.__class__ is Message and first.body.__class__ is OnDisk:
                self._load_head()
                continue
            message = self._pop()
            if message.body.__class__ is OnDisk and not self._load_one(message):
                continue
            if not ((message.expires or ttl) and self._expired(message, ttl)):
                self.delivered += 1
                return message
        return None

    # -- bodies on disk ------------------------------------------------------
    #
    # A durable queue's long backlog of persistent messages need not keep
    # their bodies in memory: the store has them. Past a threshold of ready
    # bytes the store hands the queue, once they are written, the messages
    # just published with where their records are (offload); the queue
    # swaps each for a light copy whose body is an OnDisk placeholder and
    # whose headers are gone. When delivery reaches one, a batch from the
    # head is read back (_load_head). Copies, not the shared message: the
    # same message may wait in queues that keep it in memory. Only messages
    # in the plain list are swapped (not in a priority queue's levels); a
    # message recovered with its body on disk into levels is read back
    # alone when taken (_load_one).

    #: Most places L{offload} looks back from the tail for messages.
    offload_search = 4096
    #: Most messages, and body bytes, one load reads back.
    load_batch = 512
    load_bytes = 1 << 20

    def offload(self, pairs: list[tuple[Message, OnDisk]]) -> list[OnDisk]:
        """Swap the ready messages of C{pairs} (just published, in publish
        order) for copies whose body is on disk. Messages gone from the
        backlog since (delivered, dropped) are skipped.

        @return: the placeholders put in the backlog.
        """
        items = self._items
        wanted = {id(m): (m, body) for m, body in pairs}
        placed = []
        stop = max(self._head, len(items) - len(pairs) - self.offload_search)
        for i in range(len(items) - 1, stop - 1, -1):
            found = wanted.pop(id(items[i]), None)
            if found is not None:
                m, body = found
                if m.body.__class__ is not OnDisk:
                    items[i] = m.offloaded(body)
                    placed.append(body)
                if not wanted:
                    break
        return placed

    def _load_head(self) -> None:
        """Read back the bodies of a batch of messages from the head (the
        first of which is on disk). One the store cannot read is dropped
        (the store logs it): its bytes are not what was sent."""
        items = self._items
        head = self._head
        batch = []
        size = 0
        for i in range(head, min(len(items), head + self.load_batch)):
            m = items[i]
            body = m.body
            if body.__class__ is OnDisk:
                batch.append(m)
                size += len(body)
                if size >= self.load_bytes:
                    break
        store = self.store
        if store is not None:
            store.load(self, batch)
        lost = [m for m in batch if m.body.__class__ is OnDisk]
        if lost:
            gone = {id(m) for m in lost}
            items[head:] = [m for m in items[head:] if id(m) not in gone]
            if head == len(items):
                items.clear()
                self._head = 0
            for m in lost:
                self._bytes -= len(m.body)
                self._discard(m, "rejected")

    def _load_one(self, message: Message) -> bool:
        """Read back the body of C{message}, taken from the queue; False
        (and it is dropped) if it cannot be read."""
        store = self.store
        if store is not None and not store.load(self, [message]):
            return True
        self._discard(message, "rejected")
        return False

    def purge(self) -> int:
        """Drop every ready message, and every delayed one; return how many
        were dropped."""
        gone = self._take_all() + self._take_delayed()
        if self.store is not None:
            for m in gone:
                self._discard(m, "purge")
        return len(gone)

    def _take_delayed(self) -> list[Message]:
        """Forget the delayed messages; return them."""
        rare = self._rare
        if rare is None or not rare.delayed:
            return []
        gone = [entry[2] for entry in sorted(rare.delayed)]
        rare.delayed = []
        return gone

    @property
    def delayed_count(self) -> int:
        """How many messages wait for their delivery time (or their
        redelivery backoff), out of sight."""
        rare = self._rare
        return len(rare.delayed) if rare is not None else 0

    def delayed_messages(self) -> list[Message]:
        """The messages waiting for their delivery time, soonest first (a
        copy; for inspection and tests)."""
        rare = self._rare
        return [entry[2] for entry in sorted(rare.delayed)] if rare is not None else []

    def _take_all(self) -> list[Message]:
        """Empty the queue in place; return what was ready, in order."""
        gone = self.messages()
        self._items.clear()
        self._head = 0
        self._bytes = 0
        return gone

    def messages(self) -> list[Message]:
        """The ready messages, in delivery order (a copy; for inspection and tests)."""
        rest = self._items[self._head :]
        if rest and rest[0].__class__ is _Requeued:
            return [entry[2] for entry in sorted(rest[0])] + rest[1:]
        if rest and rest[0].__class__ is _Levels:
            return rest[0].ordered()
        return rest

    # -- consumers --------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach C{consumer} and start delivering to it."""
        consumer.queue = self
        if self.consumers.__class__ is tuple:
            self.consumers = []
            self._disarm_expiry()
        self.consumers.append(consumer)
        self.drain()

    def remove_consumer(self, consumer: Consumer, unacked: list[Message] = ()) -> None:  # type: ignore[assignment]
        """Detach C{consumer}; its C{unacked} messages go back to the queue.

        When the last consumer leaves, the virtual host is told
        (C{queue_unused}: it deletes an auto-delete queue), and a queue with
        an expiry policy starts counting.
        """
        try:
            self.consumers.remove(consumer)  # type: ignore[union-attr]
        except (ValueError, AttributeError):
            return
        consumer.queue = None
        if self._rr >= len(self.consumers):
            self._rr = 0
        if unacked:
            self.requeue(unacked)
        if not self.consumers and not self.deleted:
            # Back to the shared tuple: an unused queue holds no list.
            self.consumers = _NO_CONSUMERS
            if self.vhost is not None:
                self.vhost.queue_unused(self)
            if not self.deleted and self.policy.expires is not None:
                self._arm_expiry()

    # -- acknowledgements --------------------------------------------------

    def ack(self, consumer: Consumer, message: Message) -> None:
        """C{consumer} has processed C{message}: give its credit back."""
        consumer.credit += 1
        rare = self._rare
        if rare is not None and rare.ack_entries:
            self._ack_done(message)
        if message.persistent:
            store = self.store
            if store is not None and not self.deleted:
                store.settle(self, message, "ack")
        if self._items:
            self.drain()

    def reject(self, consumer: Consumer, messages: list[Message], requeue: bool) -> None:
        """C{consumer} refuses C{messages}; requeue them or drop them."""
        consumer.credit += len(messages)
        if self.deleted:
            return
        if requeue:
            self.requeue(messages)
            return
        rare = self._rare
        for m in messages:
            if rare is not None and rare.ack_entries:
                self._ack_done(m)
            self._discard(m, "rejected")
        if self._items:
            self.drain()

    def requeue(self, messages: list[Message]) -> None:
        """Put delivered messages back at the head, in publish order (see
        module doc), each with its delivery count raised; one given back more
        often than the policy's delivery limit is discarded instead.

        Each message costs O(log n): it goes into the heap at the head.
        With a redelivery backoff (C{x-redelivery-backoff}) a message given
        back waits out of sight for the step of its delivery count first.
        """
        if self.deleted:
            return
        policy = self.policy
        limit = policy.delivery_limit
        backoff = policy.redelivery_backoff
        store = self.store
        rare = self._rare
        added = given = 0
        for m in messages:
            if rare is not None and rare.ack_entries:
                self._ack_done(m)
            if limit is not None and m.delivery_count >= limit:
                self._discard(m, "delivery_limit")
                continue
            m = m.redelivery()
            given += 1
            if store is not None and m.persistent:
                store.requeue(self, m)
            if backoff is not None:
                step = backoff[min(m.delivery_count, len(backoff)) - 1]
                if step:
                    self._delay(m, self._now() + step / 1000.0, True)
                    continue
            self._give_back(m)
            added += len(m.body)
        self._bytes += added
        if self.vhost is not None:
            self.vhost.redelivered += given
        # Even when every message given back was dropped: the consumer's
        # credit came back and messages behind them may be waiting.
        if self._items:
            self.drain()

    def _requeued_heap(self) -> _Requeued:
        """The heap at the head, put there if there is none."""
        items = self._items
        head = self._head
        if head < len(items):
            first = items[head]
            if first.__class__ is _Requeued:
                return first
        heap = _Requeued()
        if head:
            # The slot before the head is free (None): O(1).
            head -= 1
            items[head] = heap
            self._head = head
        else:
            # O(n), but only once per compaction of the list: the heap's
            # slot is freed by moving the head past it.
            items.insert(0, heap)
        return heap

    # -- leaving for good --------------------------------------------------

    def _discard(self, message: Message, reason: str) -> None:
        """C{message} leaves this queue for good without an ack, for C{reason}
        (a key of L{DISCARD_REASONS}).

        Every such message passes here: with a dead-letter exchange
        (C{x-dead-letter-exchange}) and a reason in L{DEAD_LETTER_REASONS}
        the virtual host republishes it there (L{VirtualHost.dead_letter}).
        (A purge or delete of a queue with no store skips it, as neither is
        dead-lettered.)
        """
        dead_letter = self.policy.dead_letter_exchange is not None and reason in DEAD_LETTER_REASONS
        store = self.store
        if dead_letter and message.body.__class__ is OnDisk and store is not None:
            if store.load(self, [message]):
                dead_letter = False  # its body cannot be read back: not republished
        if store is not None and message.persistent:
            store.settle(self, message, "dead-letter" if dead_letter else DISCARD_REASONS[reason])
        if reason in _LIMIT_REASONS:
            self._rare_state().dropped += 1
        if dead_letter and self.vhost is not None:
            self.vhost.dead_letter(self, message, reason)

    def detach_all(self) -> list[Consumer]:
        """Mark deleted and detach every consumer; return them (the vhost tells them)."""
        self.deleted = True
        self._disarm_expiry()
        rare = self._rare
        delayed = self._take_delayed()
        if rare is not None:
            if rare.drain_call is not None:
                rare.drain_call.cancel()
                rare.drain_call = None
            if rare.timer is not None:
                rare.timer.cancel()
                rare.timer = None
            rare.acks = []
            rare.ack_entries = {}
        consumers = list(self.consumers)
        self.consumers = _NO_CONSUMERS
        for c in consumers:
            c.queue = None
        gone = self._take_all() + delayed
        if self.store is not None:
            for m in gone:
                self._discard(m, "delete")
        return consumers

    def _peek(self) -> Message | None:
        """The message at the head, or None."""
        items = self._items
        if not items:
            return None
        first = items[self._head]
        if first.__class__ is _Requeued:
            return first[0][2]
        if first.__class__ is _Levels:
            return first.peek()
        return first

    def _rare_state(self) -> _Rare:
        rare = self._rare
        if rare is None:
            rare = self._rare = _Rare()
        return rare
