# -*- test-case-name: tests.test_core_guarantee -*-
"""Delivery guarantees per queue (Queuey): what a queue promises about each message.

A queue's C{x-delivery-guarantee} argument (L{qmq.core.policy.GUARANTEES})
picks its class when the virtual host makes it (L{queue_class_for}); a queue
with the default guarantee is a plain L{Queue}, so the others cost the
common case nothing:

  - B{at-least-once} (the default, L{Queue}): a message leaves the queue
    when a consumer acknowledges it; one given back (NACK, a consumer gone
    without acking, an ack timeout) is delivered again. With the commit log,
    a persistent message on a durable queue survives a restart until it is
    acknowledged, so it may be delivered twice (once before, once after).
  - B{at-most-once} (L{AtMostOnceQueue}): a message handed to a consumer is
    settled then: it is never given back (a NACK, a consumer gone, an ack
    timeout drop it, or dead-letter it where the queue has a dead-letter
    exchange; an ACK only returns credit), and its messages never reach the
    store, so a restart never brings one back: messages not yet delivered
    when the broker stops are lost. A persistent SEND to it is receipted at
    once (nothing waits for the disk).
  - B{effectively-once} (L{EffectivelyOnceQueue}): at-least-once, and a
    publish whose dedup id (L{DEDUP_HEADERS}) the queue has accepted within
    its window (C{x-dedup-window} ms since it was accepted, at most
    C{x-dedup-max-ids} ids: the oldest is forgotten first) is acknowledged
    to its publisher (the receipt is sent) but not enqueued. The window
    lives in memory; across a restart it holds only the ids of the messages
    the store brought back (those still in the queue), so a duplicate of a
    message consumed before the restart is enqueued again.

The window keeps a 16-byte digest of each id, never the id itself, so its
memory is bounded by C{x-dedup-max-ids} whatever the publishers send (about
120 bytes an id).
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b
from typing import TYPE_CHECKING

from qmq.core.queue import Queue

if TYPE_CHECKING:
    from qmq.core.message import Message

#: The message headers that carry a publisher's dedup id, first found wins:
#: QMQ's own, ActiveMQ Artemis's duplicate id, and the header the RabbitMQ
#: message deduplication plugin reads.
DEDUP_HEADERS = ("dedup-id", "_AMQ_DUPL_ID", "x-deduplication-header")


def dedup_id(message: Message) -> str | None:
    """The publisher's dedup id of C{message}, or None."""
    headers = message.headers
    if headers:
        for name in DEDUP_HEADERS:
            value = headers.get(name)
            if value is not None:
                return value
    return None


class DedupWindow:
    """The dedup ids one queue accepted lately, bounded in time and in number.

    @ivar seconds: how long an id is remembered after it was accepted.
    @ivar max_ids: most ids remembered (the oldest is forgotten first).
    @ivar duplicates: publishes it found to be duplicates.
    """

    __slots__ = ("seconds", "max_ids", "duplicates", "_until")

    def __init__(self, seconds: float, max_ids: int) -> None:
        self.seconds = seconds
        self.max_ids = max_ids
        self.duplicates = 0
        # digest -> when it is forgotten; in the order accepted, which is
        # the order of those times (one window for all), so expiry pops
        # from the front.
        self._until: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    @staticmethod
    def key(text: str) -> bytes:
        return blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def _expire(self, now: float) -> None:
        until = self._until
        while until:
            first, when = next(iter(until.items()))
            if when > now:
                return
            del until[first]

    def seen(self, key: bytes, now: float) -> bool:
        """Whether C{key} was accepted within the window (counted as a duplicate)."""
        self._expire(now)
        if key in self._until:
            self.duplicates += 1
            return True
        return False

    def accept(self, key: bytes, now: float, accepted_at: float | None = None) -> None:
        """Remember C{key}, accepted at C{accepted_at} (default: now)."""
        until = self._until
        when = (now if accepted_at is None else accepted_at) + self.seconds
        if when <= now or key in until:
            return
        while len(until) >= self.max_ids:
            until.popitem(last=False)
        until[key] = when


class AtMostOnceQueue(Queue):
    """A queue that never gives a delivered message back (see the module
    docstring); the virtual host keeps it off the store."""

    __slots__ = ()

    def requeue(self, messages: list[Message]) -> None:
        if self.deleted:
            return
        for m in messages:
            self._discard(m, "rejected")
        if self._items:
            self.drain()

    def restore(self, messages: list[Message]) -> None:
        # Kept by the store before the queue became at-most-once: delivered
        # from memory at most once, and settled in the store now so that
        # the next restart does not bring them back.
        vhost = self.vhost
        if vhost is not None and vhost.broker is not None:
            store = vhost.broker.store
            for m in messages:
                if m.persistent:
                    store.settle(self, m, "ack")
        super().restore(messages)


class EffectivelyOnceQueue(Queue):
    """An at-least-once queue that drops duplicate publishes within its
    dedup window (see the module docstring).

    @ivar window: its L{DedupWindow}.
    """

    __slots__ = ("window",)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        policy = self.policy
        self.window = DedupWindow(policy.dedup_window / 1000.0, policy.dedup_max_ids)

    def _now(self) -> float:
        vhost = self.vhost
        return vhost.broker.clock.seconds() if vhost is not None and vhost.broker is not None else 0.0

    def publish(self, message: Message) -> bool | None:
        """Enqueue C{message} unless its dedup id was accepted within the
        window (then it is dropped, and True returned so the store is not
        told; the publisher's receipt is sent all the same). An id is
        remembered only once the message is accepted: a publish refused by
        a full queue may be retried."""
        text = dedup_id(message)
        if text is None:
            return Queue.publish(self, message)
        window = self.window
        key = window.key(text)
        now = self._now()
        if window.seen(key, now):
            return True
        dropped = Queue.publish(self, message)
        window.accept(key, now)
        return dropped

    def would_refuse(self, message: Message) -> bool:
        # A duplicate is never refused: it is dropped.
        text = dedup_id(message)
        if text is not None and self.window.seen(self.window.key(text), self._now()):
            self.window.duplicates -= 1  # counted when it is published
            return False
        return Queue.would_refuse(self, message)

    def restore(self, messages: list[Message]) -> None:
        """Messages the store kept: their ids go back in the window, for
        what is left of it (from each message's publish time)."""
        now = self._now()
        window = self.window
        for m in messages:
            text = dedup_id(m)
            if text is not None:
                window.accept(window.key(text), now, m.timestamp)
        super().restore(messages)


_CLASSES: dict[str, type[Queue]] = {
    "at-least-once": Queue,
    "at-most-once": AtMostOnceQueue,
    "effectively-once": EffectivelyOnceQueue,
}


def queue_class_for(guarantee: str) -> type[Queue]:
    """The class of a queue with C{guarantee} (L{qmq.core.policy.GUARANTEES})."""
    return _CLASSES[guarantee]
