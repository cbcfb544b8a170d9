"""The consumer interface between a queue and a frontend.

A frontend (a STOMP subscription, later an AMQP consumer or an HTTP long
poll) subclasses L{Consumer} and implements L{Consumer.deliver}. The queue
owns the bookkeeping that must be the same for every protocol:

  - C{credit}: how many more messages the consumer may hold unacknowledged
    (its prefetch window). A queue never hands a message to a consumer whose
    credit is 0; an ack gives one credit back. Consumers that do not ack have
    unlimited credit.
  - C{paused}: set by the frontend while its transport's write buffer is
    full (Twisted's producer/consumer API); a paused consumer gets nothing
    until it resumes.

Delivery is a plain method call with no Deferred on the way: the frontend
encodes and buffers the message and returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qmq.core.message import Message
    from qmq.core.queue import Queue

UNLIMITED = 1 << 62


class Consumer:
    """A subscriber attached to one queue.

    @ivar queue: the queue it consumes from, once attached.
    @ivar ack_required: whether deliveries must be acknowledged.
    @ivar credit: deliveries it may still receive before acking some.
    @ivar prefetch: the size of its window (C{credit} when nothing is unacked).
    @ivar paused: true while its transport cannot take more data.
    @ivar owner: the session that created it (for exclusive queues).
    """

    __slots__ = ("queue", "ack_required", "credit", "prefetch", "paused", "owner")

    def __init__(self, ack_required: bool, prefetch: int | None, owner: object = None) -> None:
        self.queue: Queue | None = None
        self.ack_required = ack_required
        window = prefetch if (ack_required and prefetch) else UNLIMITED
        self.prefetch = window
        self.credit = window
        self.paused = False
        self.owner = owner

    def deliver(self, message: Message, queue: Queue) -> None:
        """Hand C{message} to the client. Called by C{queue} only.

        The queue has already taken one credit if acks are required; the
        frontend must later call C{queue.ack} or C{queue.reject} for it.
        """
        raise NotImplementedError

    def cancelled(self) -> None:
        """The queue was deleted under this consumer; it is detached already."""
