# -*- test-case-name: tests.test_core -*-
"""Queues: ordered buffers of messages handed to consumers within credit.

A queue keeps its ready messages in a list with a moving head (cheaper in
memory than a deque for the millions of small queues QMQ aims to hold: an
empty list is 56 bytes, an empty deque over 600) and its consumers in a list
served round robin.

Delivery rules:

  - A published message goes straight to a ready consumer when the queue is
    empty (the fast path); otherwise it waits at the tail.
  - A consumer is ready while it has credit and is not paused.
  - B{Requeue rule}: a message given back (nack with requeue, or its
    consumer went away without acking) returns to the B{head} of the queue,
    ahead of every message never delivered, and requeued messages keep their
    original publish order among themselves. It is delivered again marked
    redelivered, with its delivery count raised by one.
  - Bounded queues (C{max_length}) apply their overflow policy:
    C{drop-head} discards the oldest ready message, C{reject-publish} refuses
    the new one with L{ResourceLimit}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qmq.core.errors import PreconditionFailed, ResourceLimit

if TYPE_CHECKING:
    from qmq.core.consumer import Consumer
    from qmq.core.message import Message
    from qmq.core.vhost import VirtualHost

OVERFLOW_POLICIES = ("drop-head", "reject-publish")
_NO_CONSUMERS: tuple = ()


class Queue:
    """A named queue in a virtual host.

    @ivar name: its name.
    @ivar durable: survives a broker restart (with the commit-log store).
    @ivar exclusive_owner: the session that owns an exclusive queue, or None.
    @ivar auto_delete: deleted when its last consumer goes away.
    @ivar consumers: attached consumers, served round robin.
    @ivar bindings: (exchange, routing key, arguments) it is bound with.
    @ivar deleted: set once the queue has been deleted.
    @ivar max_length: most ready messages held, or None for unbounded.
    @ivar overflow: the policy when C{max_length} is reached.
    """

    __slots__ = (
        "name",
        "vhost",
        "durable",
        "exclusive_owner",
        "auto_delete",
        "arguments",
        "consumers",
        "bindings",
        "deleted",
        "max_length",
        "overflow",
        "_items",
        "_head",
        "_rr",
    )

    def __init__(
        self,
        vhost: VirtualHost | None,
        name: str,
        durable: bool = True,
        exclusive_owner: object = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or None
        # A shared empty tuple until the first consumer: most of a million
        # idle queues never have one, and an empty list costs 56 bytes.
        self.consumers: list[Consumer] | tuple = _NO_CONSUMERS
        self.bindings: list | None = None
        self.deleted = False
        self.max_length: int | None = None
        self.overflow = "drop-head"
        self._items: list[Message | None] = []
        self._head = 0
        self._rr = 0
        if arguments:
            self._apply_arguments(arguments)

    def _apply_arguments(self, arguments: dict) -> None:
        max_length = arguments.get("x-max-length")
        if max_length is not None:
            try:
                max_length = int(max_length)
            except (TypeError, ValueError):
                max_length = -1
            if max_length < 0:
                raise PreconditionFailed(
                    f"x-max-length must be a non-negative integer, got {arguments['x-max-length']!r}"
                )
            self.max_length = max_length
        overflow = arguments.get("x-overflow")
        if overflow is not None:
            if overflow not in OVERFLOW_POLICIES:
                raise PreconditionFailed(
                    f"x-overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {overflow!r}"
                )
            self.overflow = overflow

    def __len__(self) -> int:
        """The number of messages ready for delivery (not counting unacked ones)."""
        return len(self._items) - self._head

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} ready={len(self)} consumers={len(self.consumers)}>"

    # -- publishing -------------------------------------------------------

    def publish(self, message: Message) -> None:
        """Deliver C{message} to a ready consumer or keep it in order.

        @raise ResourceLimit: the queue is full and rejects publishes.
        """
        items = self._items
        if self._head == len(items) and self.consumers:
            consumer = self._ready_consumer()
            if consumer is not None:
                if consumer.ack_required:
                    consumer.credit -= 1
                consumer.deliver(message, self)
                return
        if self.max_length is not None and len(items) - self._head >= self.max_length:
            if self.overflow == "reject-publish":
                raise ResourceLimit(f"queue {self.name!r} is full ({self.max_length} messages)")
            if self.max_length == 0:
                return
            self._pop()
        items.append(message)

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
        items = self._items
        head = self._head
        message = items[head]
        items[head] = None
        head += 1
        if head == len(items):
            items.clear()
            head = 0
        elif head >= 1024 and head * 2 >= len(items):
            del items[:head]
            head = 0
        self._head = head
        return message  # type: ignore[return-value]

    def drain(self) -> None:
        """Hand waiting messages to ready consumers until one side runs out."""
        items = self._items
        while self._head < len(items):
            consumer = self._ready_consumer()
            if consumer is None:
                return
            message = self._pop()
            if consumer.ack_required:
                consumer.credit -= 1
            consumer.deliver(message, self)

    def get(self) -> Message | None:
        """Take the next ready message without a consumer (polling frontends)."""
        if self._head == len(self._items):
            return None
        return self._pop()

    def purge(self) -> int:
        """Drop every ready message; return how many were dropped."""
        n = len(self)
        self._items = []
        self._head = 0
        return n

    def messages(self) -> list[Message]:
        """The ready messages, oldest first (a copy; for inspection and tests)."""
        return [m for m in self._items[self._head :] if m is not None]

    # -- consumers --------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach C{consumer} and start delivering to it."""
        consumer.queue = self
        if self.consumers.__class__ is tuple:
            self.consumers = []
        self.consumers.append(consumer)
        self.drain()

    def remove_consumer(self, consumer: Consumer, unacked: list[Message] = ()) -> None:  # type: ignore[assignment]
        """Detach C{consumer}; its C{unacked} messages go back to the queue.

        An auto-delete queue is deleted when its last consumer leaves.
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
        if self.auto_delete and not self.consumers and self.vhost is not None and not self.deleted:
            self.vhost.delete_queue(self.name)

    # -- acknowledgements --------------------------------------------------

    def ack(self, consumer: Consumer, message: Message) -> None:
        """C{consumer} has processed C{message}: give its credit back."""
        consumer.credit += 1
        if self._head < len(self._items):
            self.drain()

    def reject(self, consumer: Consumer, messages: list[Message], requeue: bool) -> None:
        """C{consumer} refuses C{messages}; requeue them or drop them."""
        consumer.credit += len(messages)
        if requeue and not self.deleted:
            self.requeue(messages)
        elif self._head < len(self._items):
            self.drain()

    def requeue(self, messages: list[Message]) -> None:
        """Put delivered messages back at the head, in publish order (see module doc)."""
        if self.deleted:
            return
        back = sorted((m.redelivery() for m in messages), key=_message_id)
        items = self._items
        head = self._head
        # Messages requeued earlier and still waiting sit at the head: merge
        # with those older than the newest one coming back, so that requeued
        # messages keep their publish order whenever they were given back.
        end = head
        last = back[-1].id if back else 0
        while end < len(items) and items[end].delivery_count and items[end].id < last:
            end += 1
        if end > head:
            back = sorted(back + items[head:end], key=_message_id)
            head = end
        n = len(back)
        if head >= n:
            items[head - n : head] = back
            self._head = head - n
        else:
            self._items = back + items[head:]
            self._head = 0
        self.drain()

    def detach_all(self) -> list[Consumer]:
        """Mark deleted and detach every consumer; return them (the vhost tells them)."""
        self.deleted = True
        consumers = list(self.consumers)
        self.consumers = _NO_CONSUMERS
        for c in consumers:
            c.queue = None
        self._items = []
        self._head = 0
        return consumers


def _message_id(m: Message) -> int:
    return m.id
