# -*- test-case-name: tests.test_core_channel -*-
"""The channel: every frontend's one way into the core.

A frontend session (STOMP over any transport; later HTTP, AMQP and peer
links) opens one L{Channel} per client connection, as an AMQP client opens a
channel, and does everything through it:

    resolve   destination name -> queue or exchange + routing key
              (L{send_target}; the grammar is L{qmq.core.destination})
    publish   L{new_message} (the core stamps the id and the time), then
              L{publish}: routed atomically, the store asked once, and the
              answer is None ("done") or a Deferred that fires when the
              message is as durable as the store makes it
    consume   L{subscribe} a L{Consumer} to a destination: a queue
              consumer, or a live consumer bound straight to an exchange
    settle    L{settle} a delivery tag: ack, or nack with or without requeue
              (one tag, or every earlier tag of a cumulative consumer)
    leave     L{unsubscribe}, and L{close} when the client goes: unacked
              messages go back to their queues, private queues go away

Deliveries are tagged by the channel: a frontend's C{Consumer.deliver} takes
a tag with L{track} (or inlines the same two lines on its hot path) and
names it to its client; the client's ack names it back.

The channel owns what is private to one client: its temporary reply queues
(C{/temp-queue/NAME}, named with an unguessable token so that only someone
given the name can reply), its private subscription queues, and the cache of
resolved send destinations.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from qmq.core.access import authorize, resource_named
from qmq.core.consumer import BacklogBudget, Consumer
from qmq.core.destination import Destination, DestinationError, parse_destination
from qmq.core.errors import AccessRefused, NotFound, PreconditionFailed
from qmq.core.management import authorize_arguments, check_equivalent
from qmq.core.message import Message
from qmq.core.names import (
    check_binding_key,
    check_destination,
    check_exchange,
    check_headers,
    check_queue,
    check_routing_key,
)
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX, check_queue_access, durable_queue_name
from qmq.core.queue import CUT_CONSUMERS, Queue, QueuePolicy

if TYPE_CHECKING:
    from qmq.core.broker import Broker
    from qmq.core.exchange import Exchange
    from qmq.core.vhost import VirtualHost

#: A resolved send destination: (queue or None, exchange or None, exchange
#: name, routing key, the object whose C{deleted} flag invalidates it).
SendTarget = tuple[Any, Any, Any, str, Any]

_TARGET_CACHE_SIZE = 1000


class Channel:
    """One client's way into the core (see the module docstring).

    @ivar broker: the broker.
    @ivar vhost: the virtual host the client chose.
    @ivar owner_name: who the client is (its user: until authentication,
        the login it gave or its TLS identity), owning its durable
        subscriptions (L{qmq.core.ownership}).
    @ivar owners: delivery tag -> the consumer it was delivered on.
    @ivar next_tag: the next delivery tag.
    @ivar temp_queues: temp-queue name -> its queue.
    @ivar backlog_budget: the budget the backlogs of its live consumers
        share, or None (each bounded only by its own C{backlog_limit}).
    @ivar user: the authenticated user whose permissions every new
        destination is checked against (L{qmq.auth.User}: anything with
        C{name} and C{can(operation, vhost, resource, destination)}), or
        None: no checks (authentication is off).
    """

    def __init__(
        self,
        broker: Broker,
        vhost: VirtualHost,
        owner_name: str = "",
        backlog_budget: int = 0,
        user: Any = None,
        protocol: str = "",
    ) -> None:
        """
        @param backlog_budget: most messages its live consumers' backlogs
            hold together (0: no shared bound).
        @param user: the authenticated user, or None (no permission checks).
        @param protocol: the frontend's name, for the counts by protocol
            (L{qmq.core.traffic}).
        """
        self.broker = broker
        self.protocol = protocol
        #: Messages published and deliveries acknowledged through it (plain
        #: counts, read by L{qmq.core.traffic.Traffic}); its deliveries are
        #: C{next_tag - 1}.
        self.published = 0
        self.acked = 0
        self.user = user
        self.backlog_budget = BacklogBudget(backlog_budget) if backlog_budget else None
        self.vhost = vhost
        self.owner_name = owner_name
        # Names of the channel's own queues carry a random token: they can be
        # published to by name (RPC replies), so they must not be guessable.
        self.token = secrets.token_urlsafe(12)
        self.owners: dict[int, Consumer] = {}
        self.next_tag = 1
        self.temp_queues: dict[str, Queue] = {}
        self.consumers: set[Consumer] = set()
        self.closed = False
        self._cumulative_upto = 0
        self._taken_back: dict[int, None] = {}
        self._targets: dict[str, SendTarget] = {}
        # The last headers dict whose names were checked (qmq.core.names):
        # a producer's messages share one, so it is checked once.
        self._checked_headers: Any = None
        self._ids = broker.message_ids
        self._seconds = broker.clock.seconds
        traffic = getattr(broker, "traffic", None)
        if traffic is not None:
            traffic.opened(self)

    def set_user(self, user: Any) -> None:
        """Check later destinations against C{user} (the same client logged
        in again, with permissions changed since): the send targets resolved
        under the old permissions are forgotten."""
        self.user = user
        self._targets.clear()

    # -- destinations ----------------------------------------------------------

    def send_target(self, text: str) -> SendTarget:
        """Resolve a destination to publish to (cached until its object is deleted).

        A C{/control/} destination resolves to C{(None, None, None, path, None)}.

        Names and keys are checked here (L{qmq.core.names}), once per
        destination and channel, not per message.

        @raise DestinationError: the name maps to nothing.
        @raise NotFound: the exchange does not exist, or an C{amq.} queue.
        @raise InvalidName: a name or key breaks a rule of L{qmq.core.names}.
        """
        target = self._targets.get(text)
        if target is not None and not target[4].deleted:
            return target
        target = self._resolve_send(text)
        if target[4] is not None:
            if len(self._targets) >= _TARGET_CACHE_SIZE:
                self._targets.clear()
            self._targets[text] = target
        return target

    def _resolve_send(self, text: str) -> SendTarget:
        if text.startswith("/queue/") and len(text) > 7:
            # parse_destination's first case, inlined: a client naming a
            # million queues resolves each once.
            name = text[7:]
            # Publishing to an existing queue is allowed even if it is
            # exclusive to another channel (a /temp-queue/ reply-to).
            queue = self.vhost.queues.get(name)
            if queue is None:
                check_queue(name)
            if self.user is not None:
                self._authorize("write", name, text)
                if queue is None:
                    self._authorize("configure", name, text)
            if queue is None:
                queue = self.named_queue(name, "write")
            elif name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                check_queue_access(self.owner_name, name, "write")
            return (queue, None, "", name, queue)
        dest = parse_destination(text)
        kind = dest.kind
        if kind == "temp-queue":
            queue = self.temp_queue(dest.name)
            return (queue, None, "", queue.name, queue)
        if kind == "control":
            check_destination(text)
            return (None, None, None, dest.name, None)
        exchange = self.vhost.exchanges.get(dest.name)
        if exchange is None:
            check_exchange(dest.name)
            exchange = self.vhost.exchange(dest.name)
        check_routing_key(dest.key, exchange)
        if self.user is not None:
            self._authorize("write", exchange.name, text)
        return (None, exchange, exchange.name, dest.key, exchange)

    def _authorize(self, operation: str, resource: str, text: str) -> None:
        """Check the user's C{operation} permission on C{resource}, named
        by the destination C{text}.

        Asked only when a destination is first resolved (send targets are
        cached per channel) or subscribed to: never per message.

        @raise AccessRefused: naming the operation and the destination.
        """
        user = self.user
        if user is not None:
            # The verdict is the core's (qmq.core.access), on the resource
            # itself: the same whichever frontend or text named it.
            vhost = self.vhost
            named = resource_named(vhost.name, operation, resource, text, vhost.exchanges, vhost.queues)
            authorize(user, operation, named, named=text)

    def named_queue(
        self, name: str, operation: str = "read", arguments: dict[str, Any] | None = None
    ) -> Queue:
        """The queue a C{/queue/NAME} destination names, created on first use.

        Names starting with C{amq.} are the broker's own (private
        subscription queues, temp queues): they are never created on demand,
        so a reply to a requester that has gone away is refused instead of
        leaving a stray queue behind. Nor are durable subscriptions' queues
        (C{durable.OWNER.NAME}): a durable SUBSCRIBE makes them, and only
        their owner may name them (L{check_queue_access}).
        """
        vhost = self.vhost
        if name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
            check_queue_access(self.owner_name, name, operation)
        if arguments:
            # Arguments that make the broker write somewhere (dead letters)
            # need the declarer's write permission there.
            authorize_arguments(self.user, self.owner_name, vhost.name, arguments, vhost.queue_defaults)
        if name.startswith(("amq.", DURABLE_SUBSCRIPTION_PREFIX)):
            queue = vhost.queues.get(name)
            if queue is None:
                raise NotFound(
                    f"Queue {name!r} does not exist; names starting with 'amq.' or 'durable.' "
                    "are reserved for the broker and are not created on demand (its owner may "
                    "have gone).",
                    "no such queue",
                )
            return queue
        if not vhost.allow_create:
            queue = vhost.queues.get(name)
            if queue is None:
                raise NotFound(
                    f"Queue {name!r} does not exist, and virtual host {vhost.name!r} does not "
                    "let clients create queues (allow_create = false): only queues declared "
                    "in the configuration can be used.",
                    "no such queue",
                )
            if arguments:
                self._check_arguments(queue, arguments)
            return queue
        if arguments:
            queue = vhost.queues.get(name)
            if queue is not None:
                self._check_arguments(queue, arguments)
                return vhost.declare_queue(name, on_demand=True)
        return vhost.declare_queue(name, on_demand=True, arguments=arguments)

    @staticmethod
    def _check_arguments(queue: Queue, arguments: dict[str, Any]) -> None:
        """C{arguments} given for C{queue}, which exists: they must agree
        with its policy (their values are checked, as for a new queue)."""
        check_equivalent(queue, arguments)

    def temp_queue(self, name: str) -> Queue:
        """This channel's private reply queue C{name} (made on first use:
        that needs the configure permission on its queue's name, as
        RabbitMQ's C{amq.gen-} reply queues do)."""
        queue = self.temp_queues.get(name)
        if queue is None or queue.deleted:
            if not name:
                raise DestinationError("a /temp-queue/ destination needs a name")
            queue_name = f"amq.tmp.{self.token}.{name}"
            if self.user is not None:
                self._authorize("configure", queue_name, "/temp-queue/" + name)
            queue = self.vhost.declare_queue(
                queue_name,
                durable=False,
                auto_delete=False,
                exclusive_owner=self,
            )
            self.temp_queues[name] = queue
        return queue

    # -- publishing --------------------------------------------------------------

    def new_message(
        self,
        target: SendTarget,
        headers: dict[str, str] | None,
        body: bytes,
        persistent: bool = False,
    ) -> Message:
        """A message for C{target}, stamped with a fresh id and the clock's time.

        The frontend may set C{message.cache} (its encoded form) before
        L{publish}. (L{Broker.new_message}, inlined: this is the publish path.)
        """
        return Message(next(self._ids), target[2], target[3], headers, body, self._seconds(), persistent)

    def publish(self, target: SendTarget, message: Message) -> Any:
        """Route C{message} to C{target}'s queues, atomically.

        Its headers are checked (L{qmq.core.names.check_headers}) unless
        they are the dict the previous publish checked.

        @return: None when the message is as safe as it will be, else a
            Deferred that fires once the store has made it durable.
        @raise ResourceLimit: a bounded queue refused it (then no queue has it).
        @raise PreconditionFailed: the routing key breaks a limit.
        @raise InvalidName: a header name or value breaks a rule.
        """
        headers = message.headers
        if headers is not None and headers is not self._checked_headers:
            check_headers(headers)
            self._checked_headers = headers
        self.published += 1
        queue = target[0]
        if queue is not None:
            # VirtualHost.publish_to for one queue, inlined (the hot path).
            dropped = queue.publish(message)
            if message.persistent and queue.store is not None and not dropped:
                return self.broker.store_publish(self.vhost, message, (queue,))
            return None
        return self.vhost.publish_to(target[1].route(message.routing_key, message.headers), message)

    # -- consuming ---------------------------------------------------------------

    def subscribe(
        self,
        consumer: Consumer,
        text: str,
        durable_name: str | None = None,
        live: bool = True,
        label: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Attach C{consumer} to the destination C{text}.

          - C{/queue/NAME}, C{/temp-queue/NAME}: a queue consumer on it.
          - C{/topic/KEY}, C{/exchange/NAME/KEY}: with C{durable_name}, a
            queue consumer on the durable queue C{durable.OWNER.NAME} bound
            with KEY (it keeps messages while the client is away); else, for
            an auto-ack consumer when C{live} is true, a live consumer bound
            straight to the exchange; else a queue consumer on a private,
            auto-delete queue bound with KEY (deleted with the consumer),
            named after C{label} (the client's subscription id) and the
            channel's token.

        C{arguments} are queue arguments (L{qmq.core.queue.QUEUE_ARGUMENTS})
        for the queue a C{/queue/} or durable subscription names: they apply
        when the subscription creates it, over the virtual host's defaults;
        a queue that exists must already have them, else
        L{PreconditionFailed} (RabbitMQ's "inequivalent arg").

        @raise DestinationError, NotFound, AccessRefused, PreconditionFailed.
        """
        dest = parse_destination(text)
        vhost = self.vhost
        kind = dest.kind
        consumer.channel = self
        if kind == "control":
            raise DestinationError(
                "Control destinations answer a SEND with a receipt; they cannot be "
                "subscribed to.",
                "cannot subscribe to a control destination",
            )
        if consumer.buffer is not None and (kind in ("queue", "temp-queue") or durable_name):
            raise PreconditionFailed(
                "A subscriber's buffer (buffer-messages, buffer-bytes) bounds what is held for "
                "it alone: it applies to non-durable topic and exchange subscriptions, not to "
                "a queue (shared, or kept for a durable subscription), whose own bounds apply.",
                "buffer not allowed here",
            )
        user = self.user
        if kind == "queue":
            if user is not None:
                self._authorize("read", dest.name, text)
                if dest.name not in vhost.queues:
                    self._authorize("configure", dest.name, text)
            queue = self.named_queue(dest.name, arguments=arguments)
        elif kind == "temp-queue":
            queue = self.temp_queue(dest.name)
        else:
            if dest.name not in vhost.exchanges:
                check_exchange(dest.name)
            exchange = vhost.exchange(dest.name)
            if user is not None:
                self._authorize("read", exchange.name, text)
            if durable_name is not None:
                name = durable_queue_name(self.owner_name, durable_name)
                existed = name in vhost.queues
                if user is not None and not existed:
                    self._authorize("configure", name, text)
                if arguments:
                    authorize_arguments(user, self.owner_name, vhost.name, arguments, vhost.queue_defaults)
                queue = vhost.declare_queue(
                    name, durable=True, on_demand=True, subscription=True, arguments=arguments
                )
                if existed and arguments:
                    self._check_arguments(queue, arguments)
                self._bind_or_undo(queue, exchange, dest.key, made=not existed)
                consumer.durable = True
            elif live and not consumer.ack_required:
                self._bind_live(consumer, exchange, dest)
                return
            else:
                name = f"amq.sub.{self.token}.{label or f'{id(consumer):x}'}"
                queue = vhost.declare_queue(
                    name,
                    durable=False,
                    auto_delete=True,
                    exclusive_owner=self,
                    arguments=None,
                    backlog=consumer.backlog_limit,
                    policy=_buffer_policy(consumer),
                )
                self._bind_or_undo(queue, exchange, dest.key, made=True)
                consumer.private = True
        if queue.exclusive_owner is not None and queue.exclusive_owner is not self:
            raise AccessRefused(f"Queue {queue.name!r} belongs to another session.")
        self.consumers.add(consumer)
        queue.add_consumer(consumer)

    def _bind_or_undo(self, queue: Queue, exchange: Exchange, key: str, made: bool) -> None:
        """Bind C{queue}; if that is refused (a key past the limits), delete
        the queue again when this subscription made it and it holds nothing,
        so a refused SUBSCRIBE leaves no queue behind."""
        try:
            self.vhost.bind(queue.name, exchange.name, key)
        except Exception:
            if made and not len(queue) and not queue.deleted:
                self.vhost.delete_queue(queue.name)
            raise

    def _bind_live(self, consumer: Consumer, exchange: Exchange, dest: Destination) -> None:
        check_binding_key(dest.key, exchange)
        exchange.bind(consumer, dest.key, None)  # type: ignore[arg-type]
        consumer.exchange = exchange
        consumer.binding_key = dest.key
        consumer.budget = self.backlog_budget
        self.consumers.add(consumer)

    def unsubscribe(self, consumer: Consumer, delete_durable: bool = False) -> None:
        """Detach C{consumer}: its unacked messages go back to their queue; a
        private queue goes with it, and a durable subscription's queue too
        when C{delete_durable}."""
        self.consumers.discard(consumer)
        exchange = consumer.exchange
        if exchange is not None:
            consumer.exchange = None
            consumer.discard_backlog()
            if not exchange.deleted:
                exchange.unbind(consumer, consumer.binding_key, None)  # type: ignore[arg-type]
                self.vhost.maybe_auto_delete_exchange(exchange)
            return
        unacked = self._forget_unacked(consumer)
        queue = consumer.queue
        if queue is None:
            return
        queue.remove_consumer(consumer, unacked)
        if delete_durable and consumer.durable:
            check_queue_access(self.owner_name, queue.name, "delete")
            if self.user is not None:
                self._authorize("configure", queue.name, queue.name)
        if (consumer.private or (delete_durable and consumer.durable)) and not queue.deleted:
            self.vhost.delete_queue(queue.name)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue or exchange under C{consumer} was deleted by someone else."""
        self.consumers.discard(consumer)
        consumer.discard_backlog()
        self._forget_unacked(consumer)

    def _forget_unacked(self, consumer: Consumer) -> list[Message]:
        """Stop tracking C{consumer}'s unacknowledged deliveries; return their messages."""
        unacked = consumer.unacked
        if not unacked:
            return []
        owners = self.owners
        for tag in unacked:
            owners.pop(tag, None)
        messages = list(unacked.values())
        unacked.clear()
        return messages

    # -- acknowledgements --------------------------------------------------------

    def track(self, consumer: Consumer, message: Message) -> int:
        """Tag a delivery on C{consumer}; record it as unacked if it must be acked."""
        tag = self.next_tag
        self.next_tag = tag + 1
        if consumer.ack_required:
            consumer.unacked[tag] = message
            self.owners[tag] = consumer
        return tag

    def owner_of(self, tag: int) -> Consumer | None:
        """The consumer delivery C{tag} waits on, or None.

        @raise NotFound: no delivery C{tag} waits for an acknowledgement and
            C{tag} is above the highest tag a cumulative ack settled on this
            channel (at or below it, an ack of a tag no longer waiting is a
            no-op: the mark is kept per channel, not per consumer, as a tag
            settled by a cumulative ack is not remembered one by one).
        """
        consumer = self.owners.get(tag)
        if consumer is None:
            if 0 < tag <= self._cumulative_upto:
                return None  # already covered by a cumulative ack
            if tag in self._taken_back:
                return None  # its ack timeout passed: the queue took it back
            raise NotFound(f"no delivery {tag} is waiting for an acknowledgement")
        return consumer

    def settle(self, consumer: Consumer | None, tag: int, ack: bool, requeue: bool = True) -> None:
        """Ack (or nack, requeueing or not) delivery C{tag} on C{consumer};
        for a cumulative consumer, every earlier delivery on it too.

        Each settled delivery is visited once: the cost is O(1) per message,
        however many acks name it (the consumer's unacked dict is in delivery
        order, so a cumulative ack pops from its front).
        """
        if consumer is None:
            return
        unacked = consumer.unacked
        owners = self.owners
        if consumer.cumulative:
            if tag > self._cumulative_upto:
                self._cumulative_upto = tag
            done = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                done.append(unacked.pop(first))
                owners.pop(first, None)
        else:
            message = unacked.pop(tag, None)
            owners.pop(tag, None)
            if message is None:
                return
            done = [message]
        queue = consumer.queue
        if queue is None or not done:
            return
        if ack:
            self.acked += len(done)
            for m in done:
                queue.ack(consumer, m)
        else:
            queue.reject(consumer, done, requeue)

    #: How many taken-back delivery tags a channel remembers, so that a
    #: late ack of one is a no-op rather than an error.
    taken_back_memory = 4096

    def take_back(self, consumer: Consumer, message: Message) -> bool:
        """The queue takes C{message} back from C{consumer} (its ack timeout
        passed): forget the delivery and give the consumer's credit back.

        A later ack or nack of its tag is ignored (the last
        L{taken_back_memory} tags are remembered).

        @return: whether C{message} was still waiting for an ack on C{consumer}.
        """
        unacked = consumer.unacked
        tag = next((t for t, m in unacked.items() if m is message), None)
        if tag is None:
            return False
        del unacked[tag]
        self.owners.pop(tag, None)
        taken = self._taken_back
        taken[tag] = None
        if len(taken) > self.taken_back_memory:
            del taken[next(iter(taken))]
        consumer.credit += 1
        return True

    # -- flow control ------------------------------------------------------------

    def pause(self) -> None:
        """The client's transport is full: no consumer of this channel gets more."""
        for consumer in self.consumers:
            consumer.paused = True

    def resume(self) -> None:
        """The transport drained: deliver what waits."""
        for consumer in list(self.consumers):
            consumer.resume()

    # -- control destinations ------------------------------------------------------

    def control(self, path: str) -> list[tuple[str, str]]:
        """Answer an ocamlmq control destination (counts).

        With a user, a count about a queue needs the read permission on it,
        a count of topic subscribers the read permission on C{amq.topic}.
        """
        vhost = self.vhost
        if self.user is not None:
            if path.startswith(("count-msgs/queue/", "count-subscribers/queue/")):
                self._authorize("read", path.partition("/queue/")[2], "/control/" + path)
            elif path.startswith("count-subscribers/topic/"):
                self._authorize("read", "amq.topic", "/control/" + path)
        if path.startswith("count-msgs/queue/"):
            name = path[17:]
            if name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                check_queue_access(self.owner_name, name, "read")
            queue = vhost.queues.get(name)
            return [("num-messages", str(len(queue) if queue is not None else 0))]
        if path.startswith("count-subscribers/queue/"):
            name = path[24:]
            if name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                check_queue_access(self.owner_name, name, "read")
            queue = vhost.queues.get(name)
            return [("num-subscribers", str(len(queue.consumers) if queue is not None else 0))]
        if path.startswith("count-subscribers/topic/"):
            targets = vhost.exchange("amq.topic").route(path[24:], None)
            # Queues count their consumers; a live consumer counts one.
            count = sum(len(t.consumers) if isinstance(t, Queue) else 1 for t in targets)
            return [("num-subscribers", str(count))]
        if path == "memory":
            alarm = getattr(self.broker, "memory_alarm", None)
            if alarm is None:
                return [("memory-alarm", "off")]
            return [
                ("memory-alarm", "on" if alarm.active else "off"),
                ("memory-rss", str(alarm.rss)),
                ("memory-high-watermark", str(alarm.high)),
            ]
        raise DestinationError(
            f"Unknown control destination '/control/{path}'; QMQ answers "
            "/control/count-msgs/queue/NAME, /control/count-subscribers/queue/NAME, "
            "/control/count-subscribers/topic/NAME and /control/memory.",
            "unknown control destination",
        )

    # -- the end -------------------------------------------------------------------

    #: Most consumers one reactor turn detaches when a channel closes; a
    #: client with 10,000 subscriptions is taken apart over several turns.
    close_batch = 256

    def close(self) -> None:
        """The client is gone: give back what it held (once).

        Its consumers are paused at once (no queue hands them anything
        more) and detached L{close_batch} per reactor turn: their unacked
        messages go back, their private queues go.
        """
        if self.closed:
            return
        self.closed = True
        traffic = getattr(self.broker, "traffic", None)
        if traffic is not None:
            traffic.close(self)
        consumers = list(self.consumers)
        if len(consumers) > self.close_batch:
            for consumer in consumers:
                consumer.paused = True
        self._detach(consumers)

    def _detach(self, consumers: list[Consumer]) -> None:
        batch = self.close_batch
        for consumer in consumers[:batch]:
            self.unsubscribe(consumer)
        if len(consumers) > batch:
            self.broker.clock.callLater(0, self._detach, consumers[batch:])
            return
        self.consumers.clear()
        self.owners.clear()
        vhost = self.vhost
        for queue in self.temp_queues.values():
            vhost.delete_queue(queue.name)
        self.temp_queues.clear()
        self._targets.clear()


def _buffer_policy(consumer: Consumer) -> QueuePolicy | None:
    """The policy of the private queue of a C{consumer} that states a
    buffer: its bounds (the smaller of its own and its C{backlog_limit}),
    and past them it is cut off (L{CUT_CONSUMERS}); None without a buffer."""
    buffer = consumer.buffer
    if buffer is None:
        return None
    limits = [n for n in (buffer.messages, consumer.backlog_limit) if n]
    return QueuePolicy.shared(
        max_length=min(limits) if limits else None,
        max_bytes=buffer.bytes or None,
        overflow=CUT_CONSUMERS,
    )


__all__ = ["Channel", "DestinationError", "PreconditionFailed", "SendTarget"]
