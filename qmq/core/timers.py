# -*- test-case-name: tests.test_core_delivery,tests.test_core_queue -*-
"""A queue's clock: delayed messages, message expiry, ack timeouts, queue expiry.

Most queues need no timer and pay nothing for this module: its state lives
in the queue's C{_rare} part, made on first use. The flow:

  - B{One timer per queue.} A queue that needs a timer has exactly one,
    set (L{QueueTimers._wake}) at the earliest of its next delayed
    message, its next ack deadline and its head message's expiry;
    L{QueueTimers._on_timer} does what is due, drains the queue if that
    made messages ready, and sets the timer again (or drops the C{_rare}
    part when nothing needs it any more).
  - B{Delayed messages} (a publish's C{deliver_at}, a redelivery backoff,
    C{x-redelivery-backoff}) wait out of sight in a heap
    (L{QueueTimers._delay}); when their time comes they are published at
    the tail, or given back at the head if they were given back.
  - B{Message expiry} (C{x-message-ttl}, a message's own expiry): a
    message's deadline is the earlier of the two (L{QueueTimers._deadline}).
    Expired messages at the head are discarded when the timer fires; those
    behind a message that expires later go when they reach the head or a
    consumer (L{QueueTimers._expired}, dead-lettered as C{expired}).
  - B{Ack timeouts} (C{x-ack-timeout}, or the consumer's own): each
    delivery arms a deadline (L{QueueTimers._arm_ack}); an ack, a nack or a
    give-back disarms it (L{QueueTimers._ack_done}, lazily: the heap entry
    is blanked, and the heap rebuilt when mostly blanks). A deadline that
    passes takes the message back from its consumer and requeues it.
  - B{Queue expiry} (C{x-expires}): an unused queue waits in its virtual
    host's L{qmq.core.expiry.ExpiryWheel}, one timer per quarter second of
    deadlines rather than one per queue (a million idle queues may have the
    policy). A consumer takes it out, a get or a redeclare moves its
    deadline (L{QueueTimers.touch}); when it is due the virtual host
    decides (L{QueueTimers.expired}).

L{QueueTimers} is a base class of L{qmq.core.queue.Queue} with no state of
its own (empty C{__slots__}): it reads the queue's slots.
"""

from __future__ import annotations

import itertools
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from qmq.core.errors import ResourceLimit

if TYPE_CHECKING:
    from qmq.core.consumer import Consumer
    from qmq.core.message import Message

#: "Never": a deadline no clock reaches.
_NEVER = float("inf")

# A tie-breaker for heap entries with equal times, so that the heaps never
# compare messages or consumers.
_timer_order = itertools.count()


class _Consumed:
    """L{CONSUMED}'s class: true, as every "not kept" answer of publish."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "CONSUMED"


#: What L{qmq.core.queue.Queue.publish} returns for a message a consumer that does not ack
#: took at once: the queue keeps nothing of it, so a publish does not store
#: it for this queue, and a message the store kept already (a delayed one
#: whose time came) is settled by the caller.
CONSUMED: Any = _Consumed()


class QueueTimers:
    """A queue's timers (see the module docstring); a base class of
    L{qmq.core.queue.Queue}."""

    __slots__ = ()

    def _now(self) -> float:
        return self.vhost.broker.clock.seconds()  # type: ignore[union-attr]

    @staticmethod
    def _deadline(message: Message, ttl: float) -> float:
        """When C{message} expires in a queue whose message TTL is C{ttl}
        seconds (0.0: none); infinity for never."""
        expires = message.expires or _NEVER
        if ttl:
            limit = message.timestamp + ttl
            if limit < expires:
                return limit
        return expires

    def _expired(self, message: Message, ttl: float) -> bool:
        """Whether C{message}, taken from the queue, has expired; if so it is
        discarded (dead-lettered as C{expired})."""
        if self._deadline(message, ttl) > self._now():
            return False
        self._discard(message, "expired")
        return True

    def _wake(self, when: float) -> None:
        """Have L{_on_timer} run at C{when} (or earlier, if it already will)."""
        if when == _NEVER or self.vhost is None:
            return
        rare = self._rare_state()
        timer = rare.timer
        if timer is not None:
            if rare.timer_at <= when:
                return
            timer.cancel()
        clock = self.vhost.broker.clock  # type: ignore[union-attr]
        rare.timer_at = when
        rare.timer = clock.callLater(max(0.0, when - clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        rare = self._rare
        if rare is None or self.deleted:
            return
        rare.timer = None
        now = self._now()
        # Delayed messages whose time came: ready, at the tail (or at the
        # head, among the messages given back, when they were given back).
        delayed = rare.delayed
        while delayed and delayed[0][0] <= now:
            _, _, message, given_back = heappop(delayed)
            if given_back:
                self._give_back(message)
                self._bytes += len(message.body)
            else:
                try:
                    if self.publish(message) is CONSUMED and message.persistent:
                        # Kept by the store while it waited; gone now.
                        if self.store is not None:
                            self.store.settle(self, message, "ack")
                except ResourceLimit:
                    # Full, and refusing publishes: it cannot wait any more.
                    self._discard(message, "maxlen")
        # Ack deadlines that passed: take those messages back.
        acks = rare.acks
        while acks and acks[0][0] <= now:
            _, _, consumer, message = heappop(acks)
            if consumer is not None:
                del rare.ack_entries[message]
                channel = consumer.channel
                if channel is not None and consumer.queue is self and channel.take_back(consumer, message):
                    self.requeue([message])
        while acks and acks[0][2] is None:
            heappop(acks)
        # Expired messages at the head go now; those behind a message that
        # expires later go when they reach the head or a consumer.
        ttl = self.policy.ttl
        head = self._peek()
        while head is not None and self._deadline(head, ttl) <= now:
            self._discard(self._pop(), "expired")
            head = self._peek()
        if self._items:
            self.drain()
        if self.deleted:
            return
        rare = self._rare_state()
        when = _NEVER
        if rare.delayed:
            when = rare.delayed[0][0]
        if rare.acks and rare.acks[0][0] < when:
            when = rare.acks[0][0]
        head = self._peek()
        if head is not None and (head.expires or ttl):
            deadline = self._deadline(head, ttl)
            if deadline < when:
                when = deadline
        if when != _NEVER:
            self._wake(when)
        elif rare.idle():
            self._rare = None

    def stop_timers(self) -> None:
        """Cancel the queue's timers (at shutdown): nothing fires any more."""
        rare = self._rare
        if rare is not None:
            for name in ("timer", "drain_call"):
                call = getattr(rare, name)
                if call is not None:
                    if call.active():
                        call.cancel()
                    setattr(rare, name, None)

    def _delay(self, message: Message, when: float, given_back: bool) -> None:
        """Keep C{message} out of sight until C{when}."""
        rare = self._rare_state()
        heappush(rare.delayed, (when, next(_timer_order), message, given_back))
        self._wake(when)

    def _arm_ack(self, consumer: Consumer, message: Message) -> None:
        """C{message} was just delivered to C{consumer}, which must ack it
        within its ack timeout (its own, else the queue's)."""
        if self.vhost is None:
            return
        rare = self._rare_state()
        when = self._now() + (message.ack_timeout or self.policy.ack_seconds)
        entry = [when, next(_timer_order), consumer, message]
        old = rare.ack_entries.get(message)
        if old is not None:
            old[2] = None
        rare.ack_entries[message] = entry
        acks = rare.acks
        heappush(acks, entry)
        if len(acks) > 64 and len(acks) > 2 * len(rare.ack_entries):
            # Mostly entries acked in time: rebuild without them.
            acks[:] = [e for e in acks if e[2] is not None]
            heapify(acks)
        self._wake(acks[0][0])

    def _ack_done(self, message: Message) -> None:
        """C{message} was acked, nacked or given back: no deadline any more."""
        entry = self._rare.ack_entries.pop(message, None)  # type: ignore[union-attr]
        if entry is not None:
            entry[2] = None

    # -- expiry ------------------------------------------------------------
    #
    # A queue that is unused and has an expiry policy waits in its virtual
    # host's ExpiryWheel (qmq.core.expiry): one timer per quarter second of
    # deadlines, not one DelayedCall (~380 bytes) per queue, since every
    # queue a client creates has the policy by default and a million of
    # them may sit unused. A consumer takes it out; a get or a redeclare
    # moves its deadline (two dict operations).

    def touch(self) -> None:
        """The queue was used (redeclared, polled): its expiry starts over."""
        if self.expiry_key is not None:
            if self.policy.expires is None:  # the policy changed under it
                self._disarm_expiry()
            else:
                self._arm_expiry()

    def _arm_expiry(self) -> None:
        vhost = self.vhost
        expires = self.policy.expires
        if vhost is None or vhost.expiry is None or expires is None or self.deleted:
            return
        vhost.expiry.schedule(self, expires / 1000.0)

    def _disarm_expiry(self) -> None:
        if self.expiry_key is not None:
            self.vhost.expiry.cancel(self)  # type: ignore[union-attr]

    def expired(self) -> None:
        """Unused for C{policy.expires} (called by the virtual host's
        L{qmq.core.expiry.ExpiryWheel}): the virtual host decides (it
        deletes the queue, or keeps one that still holds messages: then it
        is looked at again one period later)."""
        if self.deleted or self.consumers:
            return
        self.vhost.queue_expired(self)  # type: ignore[union-attr]
        if not self.deleted and not self.consumers:
            self._arm_expiry()
