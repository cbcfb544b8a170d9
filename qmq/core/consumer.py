# -*- test-case-name: tests.test_core_channel -*-
"""Consumers: what a queue or an exchange hands messages to.

A frontend (a STOMP subscription, later an HTTP long poll or an AMQP
consumer) subclasses L{Consumer} and implements L{Consumer.deliver}: encode
the message for its client and buffer it, with no Deferred on the way. The
core owns the bookkeeping that must be the same for every protocol:

  - C{credit}: how many more messages the consumer may hold unacknowledged
    (its prefetch window). A queue never hands a message to a consumer whose
    credit is 0; an ack gives one credit back. Consumers that do not ack have
    unlimited credit.
  - C{paused}: set by the frontend while its transport's write buffer is
    full (Twisted's producer/consumer API); a paused consumer gets nothing
    until it resumes.
  - C{unacked}: delivery tag -> message, in delivery order, for consumers
    that ack (the tags come from the consumer's L{qmq.core.channel.Channel}).

A consumer is attached one of two ways (L{qmq.core.channel.Channel.consume}
chooses):

  - B{queue consumer}: attached to a queue (C{queue} is set), which hands it
    messages within its credit with L{deliver}.
  - B{live consumer}: bound straight to an exchange (C{exchange} is set), as
    a non-durable, auto-ack topic subscription is: nothing of it outlives
    it, nothing is acked or redelivered, so it needs no queue (a few hundred
    bytes each, so a million fit). The exchange routes to it like to a queue
    and calls L{publish}; while the consumer is paused, messages wait in a
    backlog made on demand and bounded by C{backlog_limit} (the oldest go
    first, ActiveMQ's pending-message limit), drained by L{drain_backlog}.

A consumer may state a buffer (L{SubscriberBuffer}, the QMQ notes'
per-subscriber buffer: STOMP's C{buffer-messages} and C{buffer-bytes}): how
far behind it may fall. What is held for it alone counts (a live consumer's
backlog, the private queue of a topic subscription that acks); a consumer
that would hold more is not dropped from silently but cut off: the core
calls its L{Consumer.overrun} once, with the reason, and the frontend ends
its client (a STOMP ERROR naming the reason). Everyone else keeps going: the
message it could not take is lost to it alone.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qmq.core.channel import Channel
    from qmq.core.exchange import Exchange
    from qmq.core.message import Message
    from qmq.core.queue import Queue

UNLIMITED = 1 << 62
# Consumers that do not ack share one empty mapping (a million topic
# subscriptions, 64 bytes each saved).
_NONE_UNACKED: Mapping[int, Message] = MappingProxyType({})


class _NeverRefuses:
    """The policy a live consumer shows the virtual host's atomic publish."""

    __slots__ = ()
    rejects = False


_NEVER_REFUSES = _NeverRefuses()


class BacklogBudget:
    """How many messages the backlogs of one channel's live consumers hold together.

    Each live consumer's backlog is bounded on its own, but a client with
    thousands of subscriptions that stops reading would otherwise hold
    thousands of full backlogs; the budget bounds their sum, per channel.

    @ivar limit: most messages waiting over all the backlogs.
    @ivar used: messages waiting now.
    @ivar dropped: messages dropped because a backlog or the budget was full.
    """

    __slots__ = ("limit", "used", "dropped")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.dropped = 0


class SubscriberBuffer:
    """How far behind one consumer may fall before it is cut off.

    @ivar messages: most messages held for it (0: no bound of its own).
    @ivar bytes: most body bytes held for it (0: no bound of its own).
    @ivar held: body bytes a live consumer's backlog holds now.
    @ivar cut: set once it was cut off (it takes nothing more).
    """

    __slots__ = ("messages", "bytes", "held", "cut")

    def __init__(self, messages: int = 0, bytes: int = 0) -> None:
        self.messages = messages
        self.bytes = bytes
        self.held = 0
        self.cut = False

    def __repr__(self) -> str:
        return f"<SubscriberBuffer messages={self.messages} bytes={self.bytes} held={self.held}>"


class Consumer:
    """A subscriber attached to one queue, or bound live to one exchange.

    @ivar queue: the queue it consumes from, once attached (queue consumer).
    @ivar channel: the L{qmq.core.channel.Channel} tracking its deliveries
        (set when it subscribes).
    @ivar exchange: the exchange it is bound to (live consumer).
    @ivar binding_key: the routing key pattern a live consumer is bound with.
    @ivar ack_required: whether deliveries must be acknowledged.
    @ivar cumulative: an ack settles every earlier delivery too (STOMP's
        C{ack:client}, AMQP's C{multiple}).
    @ivar credit: deliveries it may still receive before acking some.
    @ivar prefetch: the size of its window (C{credit} when nothing is unacked).
    @ivar paused: true while its transport cannot take more data.
    @ivar owner: the channel (or session) that created it (exclusive queues).
    @ivar unacked: delivery tag -> message, in delivery order.
    @ivar backlog: messages waiting for a paused live consumer, or None.
    @ivar backlog_limit: most messages that backlog holds (0: unbounded).
    @ivar budget: the L{BacklogBudget} its backlog shares with the other
        live consumers of its channel, or None.
    @ivar private: its queue was made for it and is deleted with it.
    @ivar durable: its queue is a durable subscription's.
    @ivar buffer: its L{SubscriberBuffer}, or None (then a full backlog
        drops its oldest message instead of cutting it off).
    @ivar exclusive: it holds its queue alone (AMQP's exclusive consumer:
        L{qmq.core.channel.Channel.consume} refuses any other).
    """

    __slots__ = (
        "queue",
        "channel",
        "exchange",
        "binding_key",
        "ack_required",
        "cumulative",
        "credit",
        "prefetch",
        "paused",
        "owner",
        "unacked",
        "backlog",
        "backlog_limit",
        "budget",
        "private",
        "durable",
        "buffer",
        "exclusive",
    )

    #: A consumer is never a durable queue: the store is never asked for it.
    store = None
    #: As a target of an exchange, a live consumer never refuses a publish
    #: (a queue's L{qmq.core.policy.QueuePolicy} says whether it may).
    policy = _NEVER_REFUSES

    def __init__(
        self,
        ack_required: bool,
        prefetch: int | None,
        owner: object = None,
        cumulative: bool = False,
    ) -> None:
        self.queue: Queue | None = None
        # The channel that tracks its deliveries (set by Channel.subscribe).
        self.channel: Channel | None = None
        self.exchange: Exchange | None = None
        self.binding_key = ""
        self.ack_required = ack_required
        self.cumulative = cumulative
        window = prefetch if (ack_required and prefetch) else UNLIMITED
        self.prefetch = window
        self.credit = window
        self.paused = False
        self.owner = owner
        # A cumulative ack pops from the front: an OrderedDict finds its first
        # live entry at once, where a dict's iterator walks every hole left by
        # earlier pops (quadratic over a long run of acks).
        self.unacked: dict[int, Message] = (
            (OrderedDict() if cumulative else {}) if ack_required else _NONE_UNACKED  # type: ignore[assignment]
        )
        self.backlog: deque[Message] | None = None
        self.backlog_limit = 0
        self.budget: BacklogBudget | None = None
        self.private = False
        self.durable = False
        self.buffer: SubscriberBuffer | None = None
        self.exclusive = False

    def deliver(self, message: Message, queue: Queue | None) -> None:
        """Hand C{message} to the client. Called by the core only.

        C{queue} is the queue it came from (None for a live consumer). The
        queue has already taken one credit if acks are required; the
        frontend records the delivery in C{unacked} under a tag from its
        channel, and the client's ack later settles it through the channel.
        """
        raise NotImplementedError

    def cancelled(self) -> None:
        """The queue or exchange was deleted under this consumer; it is detached already."""

    def overrun(self, reason: str) -> None:
        """It fell further behind than its L{buffer} allows (called once, by
        the core, from inside a publish): the frontend cuts its client off,
        naming C{reason}. It is marked cut already and takes nothing more.

        The frontend may detach it (close the client's channel) from here;
        the publish going on skips it.
        """

    # -- live consumers ------------------------------------------------------

    def would_refuse(self, message: Message) -> bool:
        """A live consumer never refuses a publish (it drops its oldest instead)."""
        return False

    def publish(self, message: Message) -> None:
        """A message routed to this live consumer by its exchange.

        Delivered at once, unless the consumer is paused: then it waits in a
        backlog made on demand, bounded by C{backlog_limit} and by the
        budget shared with the channel's other live consumers. When either
        is full the backlog's oldest message makes room (ActiveMQ's pending
        message limit); a consumer with an empty backlog under a full
        budget drops the new message. Either way the budget counts it.
        """
        backlog = self.backlog
        if backlog is None:
            if not self.paused:
                self.deliver(message, None)
                return
            backlog = self.backlog = deque()
        if self.buffer is not None:
            self._publish_buffered(message, backlog, self.buffer)
            return
        limit = self.backlog_limit
        budget = self.budget
        if budget is None:
            if limit and len(backlog) >= limit:
                backlog.popleft()
        elif (limit and len(backlog) >= limit) or budget.used >= budget.limit:
            budget.dropped += 1
            if not backlog:
                return
            backlog.popleft()
        else:
            budget.used += 1
        backlog.append(message)

    def _publish_buffered(
        self, message: Message, backlog: deque[Message], buffer: SubscriberBuffer
    ) -> None:
        """L{publish} to a paused consumer with a buffer: held, or, when any
        bound would be crossed (its own, C{backlog_limit}, the channel's
        budget), the consumer is cut off rather than dropped from."""
        if buffer.cut:
            return
        size = len(message.body)
        n = len(backlog)
        budget = self.budget
        if buffer.messages and n >= buffer.messages:
            reason = f"it holds {n} messages it has not read (buffer-messages {buffer.messages})"
        elif buffer.bytes and buffer.held + size > buffer.bytes:
            reason = (
                f"it holds {buffer.held} bytes it has not read and a message of {size} more "
                f"(buffer-bytes {buffer.bytes})"
            )
        elif self.backlog_limit and n >= self.backlog_limit:
            reason = f"it holds {n} messages it has not read (the broker's limit)"
        elif budget is not None and budget.used >= budget.limit:
            reason = f"its connection holds {budget.used} messages it has not read (the broker's limit)"
        else:
            backlog.append(message)
            buffer.held += size
            if budget is not None:
                budget.used += 1
            return
        if budget is not None:
            budget.dropped += 1
        self.cut_off(reason)

    def cut_off(self, reason: str) -> None:
        """Mark it cut (paused for good, its backlog gone) and tell the
        frontend (L{overrun}), once."""
        buffer = self.buffer
        if buffer is None:
            buffer = self.buffer = SubscriberBuffer()
        if buffer.cut:
            return
        buffer.cut = True
        self.paused = True
        self.discard_backlog()
        self.overrun(reason)

    def drain_backlog(self) -> None:
        """Deliver what waited while the consumer was paused."""
        backlog = self.backlog
        delivered = 0
        buffer = self.buffer
        if buffer is None:
            while backlog and not self.paused:
                self.deliver(backlog.popleft(), None)
                delivered += 1
        else:
            while backlog and not self.paused:
                message = backlog.popleft()
                buffer.held -= len(message.body)
                self.deliver(message, None)
                delivered += 1
        if self.budget is not None:
            self.budget.used -= delivered
        if not backlog:
            self.backlog = None

    def discard_backlog(self) -> None:
        """Forget what waits (the consumer is going), giving its budget back."""
        backlog = self.backlog
        if backlog is not None:
            if self.budget is not None:
                self.budget.used -= len(backlog)
            if self.buffer is not None:
                self.buffer.held = 0
            self.backlog = None

    def resume(self) -> None:
        """The frontend can take deliveries again: deliver what is waiting."""
        if self.buffer is not None and self.buffer.cut:
            return
        self.paused = False
        queue = self.queue
        if queue is not None:
            queue.drain()
        elif self.backlog:
            self.drain_backlog()

    def __repr__(self) -> str:
        where: Any = self.queue.name if self.queue is not None else self.exchange
        return f"<{type(self).__name__} on {where!r}>"
