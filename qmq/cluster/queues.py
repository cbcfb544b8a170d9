# -*- test-case-name: tests.test_cluster_queues -*-
"""Queues across nodes: the mesh's side of L{qmq.core.remote}.

L{RemoteQueues} is the broker's L{qmq.core.remote.Homes} in a mesh. It
places queues with a L{qmq.cluster.placement.Placement}, and speaks the
link frames of queues (L{qmq.cluster.wire}) on both sides of a link:

Where the client is (the stand-in's node):
    - a publish to a stand-in becomes a B{forward} frame with a sequence
      number; the Deferred the core hands the frontend fires on the home's
      B{confirm} (the home's store has it) or fails with its refusal, or
      when the link goes first (L{link_down}: the publisher hears that the
      message may not be there, and sends it again: at least once);
    - a consumer of a stand-in becomes a B{consume} frame (an id, the
      queue, a window: the consumer's prefetch, at most C{remote_window});
      B{deliver} frames come back with the home's delivery tags, and the
      channel's settles go back in one B{settle} frame per reactor turn;
      the consumer leaving is a B{cancel}. When the link goes, what the
      consumer holds was given back on the home (its channel there
      closed): later acks of it are dropped here, and the consumer is
      opened again on the home when the link is back.

On the home:
    - a forward is published through the link's channel to the queue
      (made on demand here if need be), and confirmed once the durability
      Deferred fires; a refusal is confirmed as failed, with its code;
    - a consume is a L{HomeConsumer} on the link's channel: a consumer
      that must ack, with the window as its prefetch; settles reach it by
      tag; a cancel, or the link closing (the channel closes), gives back
      everything it holds, as for any client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from qmq.cluster import wire
from qmq.cluster.placement import home_argument
from qmq.core.consumer import UNLIMITED, Consumer
from qmq.core.errors import BrokerError, NotFound, PreconditionFailed, ResourceLimit
from qmq.core.ownership import marked_node
from qmq.core.remote import RemoteQueue, Unavailable
from qmq.twisted_internals import deferred_unobserved

if TYPE_CHECKING:
    from qmq.cluster.link import LinkProtocol
    from qmq.cluster.mesh import Mesh
    from qmq.core.message import Message

__all__ = ["HomeConsumer", "RemoteQueues", "not_homed_here"]

log = Logger()

ACK, REQUEUE, DROP, CREDIT = wire.ACK, wire.REQUEUE, wire.DROP, wire.CREDIT

#: Queue names that live on their client's node (a connection's own
#: queues, the node its name marks: L{qmq.core.ownership.marked_node}).
#: Durable subscriptions' queues are placed as any queue, so that their
#: client finds them from any node.
LOCAL_PREFIXES = ("amq.",)

#: Most queues of other nodes' connections known here (L{RemoteQueues.owned}).
MAX_OWNED = 1_000_000

#: Most queues one link keeps resolved for what it forwards here.
TARGET_CACHE_SIZE = 1000

#: Seconds a forwarded publish waits for its confirm before it fails.
CONFIRM_TIMEOUT = 60.0
# A forward's deadline, from when it went (one a second: see forward).
_DEADLINE = CONFIRM_TIMEOUT + 1.0

#: Most forwarded publishes one link waits confirms for; past it a publish
#: to a queue homed over that link is refused.
MAX_UNCONFIRMED = 100_000

#: Most sequence numbers one confirm frame may name (a home confirms what
#: one turn took: far fewer; a bound on the work a frame can ask for).
MAX_CONFIRM_RANGE = 4 * MAX_UNCONFIRMED

#: Settle frames naming more tags than this are checked against the
#: windows of the peer's consumers (what they may hold unacked in all).
SETTLE_CHECKED = 100_000

#: Consumers without acks that went and whose home has not yet answered
#: their cancel (at most this many a node: a bound, not a working limit;
#: each is remembered for a round trip), so that what their home had sent
#: already goes back to the queue (L{RemoteQueues.delivered}).
GONE_REMEMBERED = 100_000
#: The largest window a peer may ask for (C{[cluster] remote_window}'s
#: maximum).
MAX_WINDOW = 1_000_000

#: The core's refusals by reply code, for a failed confirm.
_ERRORS: dict[int, type[BrokerError]] = {404: NotFound, 406: PreconditionFailed, 506: ResourceLimit}


class HomeConsumer(Consumer):
    """A peer's consumer of a queue homed here: each delivery goes over
    the link with its tag.

    A consumer that acks (C{auto} false) holds its deliveries unacked here
    until the peer settles them, at most its window. One that does not
    (C{auto}: STOMP's C{ack:auto}, AMQP's C{no-ack}) takes each message
    off the queue as it goes, as a local consumer without acks does, with
    tag 0; its window is credit, one spent a delivery and given back
    (L{RemoteQueues.settled}, outcome L{CREDIT}) once the peer handed the
    message to its client.
    """

    __slots__ = ("link", "sub")

    def __init__(self, link: LinkProtocol, sub: int, window: int, auto: bool = False) -> None:
        super().__init__(not auto, window)
        if auto:
            self.prefetch = self.credit = window
        self.link = link
        self.sub = sub

    def deliver(self, message: Message, queue: Any) -> None:
        if self.ack_required:
            tag = self.channel.track(self, message)  # type: ignore[union-attr]
        else:
            self.credit -= 1
            tag = 0
        self.link.mesh.queues.send_delivery(self.link, self.sub, tag, message, queue)

    def cancelled(self) -> None:
        """The queue was deleted here: the peer's consumer ends."""
        link = self.link
        if link.homed.pop(self.sub, None) is self and self.channel is not None:
            self.channel.consumer_cancelled(self)
        link.send(
            wire.encode_json(
                wire.CANCELLED, {"id": self.sub, "code": 404, "reason": "the queue was deleted on its home"}
            )
        )


class _Sub:
    """A consumer of a stand-in, as its home knows it: an id, the link it
    was opened on (None while the home is not linked), and what it holds
    unsettled (message -> the home's delivery tag)."""

    __slots__ = ("id", "queue", "consumer", "link", "tags", "window")

    def __init__(self, id: int, queue: RemoteQueue, consumer: Consumer) -> None:
        self.id = id
        self.queue = queue
        self.consumer = consumer
        self.link: LinkProtocol | None = None
        self.tags: dict[Any, int] = {}
        #: The window it was opened with on its home.
        self.window = 1


class RemoteQueues:
    """The mesh's L{qmq.core.remote.Homes} (see the module docstring).

    @ivar placement: the home-node rule: C{home(vhost, name) -> node id}
        (L{qmq.cluster.placement.Placement}, or another policy's).
    @ivar window: most deliveries a remote consumer may hold unacked
        (C{[cluster] remote_window}).
    """

    def __init__(self, mesh: Mesh, placement: Any, window: int) -> None:
        self.mesh = mesh
        self.placement = placement
        self.window = window
        self._subs: dict[int, _Sub] = {}
        self._by_consumer: dict[Consumer, _Sub] = {}
        self._next_sub = 1
        #: message (delivered here from a home) -> its sub.
        self._held: dict[Any, _Sub] = {}
        self._here = False
        self._vhost_bytes: dict[str, bytes] = {}
        self._seconds = mesh.clock.seconds
        #: Stand-ins made with arguments (told to their home at each link up).
        self._declared: dict[tuple[str, str], RemoteQueue] = {}
        #: Consumers without acks that went, until their home answers the
        #: cancel: their id -> (the link, the stand-in). A delivery in
        #: flight to one goes back to the queue.
        self._gone: dict[int, tuple[LinkProtocol, RemoteQueue]] = {}
        #: Queues exclusive to a connection of another node, as that node
        #: told (L{owned}): (vhost, name) -> the node. A publish to one here
        #: goes there, whatever the placement says of its name.
        self.owned: dict[tuple[str, str], str] = {}

    # -- Homes: what the core asks ------------------------------------------------

    def home(self, vhost: str, name: str, arguments: dict[str, Any] | None) -> str | None:
        if self._here:
            return None
        owner = self.owned.get((vhost, name)) if self.owned else None
        if owner is None and name.startswith(LOCAL_PREFIXES):
            # A connection's queue, on its node: named so (owned_token), or here.
            owner = marked_node(name)
            if owner is None:
                return None
        if owner is not None:
            return None if owner == self.mesh.node else owner
        home = self._placed(vhost, name, arguments)
        return None if home == self.mesh.node else home

    def _placed(self, vhost: str, name: str, arguments: dict[str, Any] | None) -> str:
        """The node the placement names for queue C{name}: C{x-home-node},
        else the virtual host's C{queue_defaults} may name a home for all;
        else the placement's rule (any object with C{home(vhost, name)}:
        Placement, or the workers' Placement over their fixed list)."""
        home = home_argument(arguments)
        if home is None:
            v = self.mesh.broker.vhosts.get(vhost)
            home = v.queue_defaults.home_node if v is not None else None
        return home or self.placement.home(vhost, name)

    def place_existing(self) -> None:
        """When the mesh starts: each queue made before it (declared in the
        configuration or by definitions on every node) whose home is
        another node becomes a stand-in, with its bindings gone (they
        are its home's: the home's binding is interest that brings
        messages published here to it). One that holds messages or has
        consumers stays here, with a warning: its messages are not moved."""
        for vhost in list(self.mesh.broker.vhosts.values()):
            for name, queue in list(vhost.queues.items()):
                if (
                    queue.remote is not None
                    or queue.exclusive_owner is not None
                    or name.startswith(LOCAL_PREFIXES)
                ):
                    continue
                try:
                    home = self.home(vhost.name, name, queue.arguments)
                except BrokerError as e:
                    log.warn("mesh: queue {queue!r}: {error}", queue=name, error=e.message)
                    continue
                if home is None:
                    continue
                if queue.subscription:
                    # A durable subscription's queue made here before it was
                    # placed (its bindings and messages are here): it stays,
                    # and every node is told, so its client finds it from any.
                    self.mesh.manage.pin(vhost.name, name)
                    continue
                if len(queue) or queue.delayed_count or queue.consumers:
                    log.warn(
                        "mesh: queue {queue!r} of virtual host {vhost!r} holds {count} messages on "
                        "this node, and its home is node {home!r}: it stays here (its clients here "
                        "use it) until it is deleted; move its messages with a shovel",
                        queue=name,
                        vhost=vhost.name,
                        count=len(queue),
                        home=home,
                    )
                    continue
                vhost.delete_queue(name)
                vhost.declare_queue(name, arguments=queue.arguments)  # the stand-in

    def owner(self, vhost: str, name: str) -> str | None:
        owner = self.owned.get((vhost, name)) if self.owned else None
        return owner if owner != self.mesh.node else None

    def placed_here(self, vhost: str, name: str) -> bool:
        """Whether the placement rule (the virtual host's default home, else
        the policy's) names this node for a queue C{name}, whatever a
        connection's queue of that name or C{x-home-node} says: a queue a
        peer names here that is not here is made here only then."""
        return self._placed(vhost, name, None) == self.mesh.node

    def owned_by(self, node: str, vhost_name: str, names: list[str], on: bool) -> None:
        """Node C{node} says queues C{names} are (C{on}) or are no longer
        exclusive to one of its connections. A stand-in here for such a
        name that reaches another node (made by the placement before the
        news came), or for one gone, goes while no consumer uses it: the
        next publish finds the queue's node again."""
        owned = self.owned
        vhost = self.mesh.broker.vhosts.get(vhost_name)
        for name in names:
            key = (vhost_name, name)
            if on:
                if key not in owned and len(owned) >= MAX_OWNED:
                    log.warn("mesh: {count} queues of other nodes' connections are known here "
                             "(at most {limit}): queue {queue!r} of node {node} is not", count=len(owned),
                             limit=MAX_OWNED, queue=name, node=node)
                    continue
                owned[key] = node
                stale = lambda queue: queue.home != node  # noqa: E731
            elif owned.get(key) == node:
                del owned[key]
                stale = lambda queue: queue.home == node  # noqa: E731
            else:
                continue
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is not None and queue.remote is not None and not queue.consumers and stale(queue):
                vhost.delete_queue(name)  # type: ignore[union-attr]

    def _forget_owned(self, node: str) -> None:
        """C{node}'s link went: what it said of its connections' queues
        goes (it tells it again when the link is back)."""
        by_vhost: dict[str, list[str]] = {}
        for (vhost, name), owner in self.owned.items():
            if owner == node:
                by_vhost.setdefault(vhost, []).append(name)
        for vhost, names in by_vhost.items():
            self.owned_by(node, vhost, names, False)

    @contextmanager
    def here(self) -> Iterator[None]:
        """Queues made meanwhile live on this node (what a peer sends here
        as their home)."""
        self._here = True
        try:
            yield
        finally:
            self._here = False

    def _link(self, queue: RemoteQueue) -> LinkProtocol:
        link = self.mesh.links.get(queue.home)
        if link is None or link.state != "up":
            raise Unavailable(
                f"Queue {queue.name!r} lives on node {queue.home!r}, which is down or not linked "
                f"to node {self.mesh.node!r} now: nothing was published or consumed; try again later.",
                "home node unavailable",
            )
        return link

    def declared(self, queue: RemoteQueue) -> None:
        """Tell the home the arguments a stand-in was declared with (now,
        and whenever the link comes up again), so that the queue is made
        there with them."""
        self._declared[(queue.vhost.name, queue.name)] = queue  # type: ignore[union-attr]
        link = self.mesh.links.get(queue.home)
        if link is not None and link.state == "up":
            self._declare(link, queue)

    def _declare(self, link: LinkProtocol, queue: RemoteQueue) -> None:
        try:
            data = wire.encode_json(
                wire.DECLARE,
                {"vhost": queue.vhost.name, "queue": queue.name, "arguments": queue.arguments},  # type: ignore[union-attr]
            )
        except (TypeError, ValueError) as e:
            log.warn(
                "mesh: queue {queue!r}: its arguments cannot be sent to its home {home}: {error}",
                queue=queue.name,
                home=queue.home,
                error=str(e),
            )
            return
        link.send(data)

    def _declare_here(self, link: LinkProtocol, value: dict[str, Any]) -> None:
        """A peer made a stand-in of a queue homed here, with arguments:
        made here with them (or checked against those it has)."""
        vhost_name, name, arguments = value.get("vhost"), value.get("queue"), value.get("arguments")
        if not (isinstance(vhost_name, str) and isinstance(name, str) and isinstance(arguments, dict)):
            raise wire.FrameError("bad declare: vhost, queue and arguments expected")
        mesh = self.mesh
        vhost = mesh.broker.vhosts.get(vhost_name)
        try:
            if vhost is None:
                raise NotFound(f"no virtual host {vhost_name!r} on node {mesh.node!r}")
            with self.here():
                mesh.channel_for(link, vhost).named_queue(name, "configure", arguments=arguments)
        except BrokerError as e:
            log.warn(
                "mesh: node {node} declared queue {queue!r} here with arguments {arguments}: {error}",
                node=link.node,
                queue=name,
                arguments=arguments,
                error=e.message,
            )

    def reachable(self, queue: RemoteQueue) -> None:
        self._link(queue)

    def get(self, queue: RemoteQueue, ack: bool) -> Deferred:
        """A basic.get on the home (L{qmq.cluster.manage.Manage.get})."""
        return self.mesh.manage.get(queue, ack)

    def scan(self, queue: RemoteQueue, start: float, end: float, cursor: str | None, limit: int) -> Deferred:
        """A range scan on the home (L{qmq.cluster.manage.Manage.scan})."""
        return self.mesh.manage.scan(queue, start, end, cursor, limit)

    def operate(self, queue: RemoteQueue, op: str, args: dict[str, Any]) -> Deferred:
        """A management operation on C{queue}, carried to its home
        (L{qmq.cluster.manage}): a Deferred of the home's answer."""
        return self.mesh.manage.ask(queue.home, op, {"vhost": queue.vhost.name, "queue": queue.name, **args})  # type: ignore[union-attr]

    def forward(self, queue: RemoteQueue, message: Message) -> Deferred:
        link = self.mesh.links.get(queue.home)
        if link is None or link.state != "up":
            link = self._link(queue)  # raises
        pending = link.pending
        if len(pending) >= MAX_UNCONFIRMED:
            raise Unavailable(
                f"Node {queue.home!r}, home of queue {queue.name!r}, has not confirmed "
                f"{len(pending)} messages yet: the message was not published; try again later.",
                "home node busy",
            )
        vhost = queue.vhost.name  # type: ignore[union-attr]
        name = self._vhost_bytes.get(vhost)
        if name is None:
            name = self._vhost_bytes[vhost] = vhost.encode()
        chunks, size = wire.encode_item(message)
        seq = link.next_seq
        if not link.send_message(wire.FORWARD, name, chunks, size, False, seq):
            raise Unavailable(
                f"The link to node {queue.home!r}, home of queue {queue.name!r}, holds "
                f"{link.mesh.settings.link_buffer} bytes it could not send yet (cluster.link_buffer): "
                "the message was not published; try again later.",
                "link to the home node full",
            )
        link.next_seq = seq + 1
        d = pending[seq] = Deferred()
        return d

    def batch_opened(self, link: LinkProtocol, seq: int) -> None:
        """A forward batch from C{seq} on opened on C{link} (its first
        forward of a reactor turn, or past L{wire.BATCH_BYTES}): its
        forwards' deadline, one a second at most. A forward fails no sooner
        than CONFIRM_TIMEOUT after it went, at most a second later."""
        deadline = self._seconds() + _DEADLINE
        deadlines = link.deadlines
        if not deadlines or deadlines[-1][1] + 1.0 <= deadline:
            deadlines.append((seq, deadline))

    def open(self, queue: RemoteQueue, consumer: Consumer) -> None:
        sub = _Sub(self._next_sub, queue, consumer)
        self._next_sub += 1
        self._subs[sub.id] = sub
        self._by_consumer[consumer] = sub
        link = self.mesh.links.get(queue.home)
        if link is not None and link.state == "up":
            self._consume(link, sub)

    def _consume(self, link: LinkProtocol, sub: _Sub) -> None:
        consumer = sub.consumer
        window = self.window
        if consumer.ack_required and consumer.prefetch < UNLIMITED:
            window = min(window, max(1, consumer.prefetch))
        sub.link = link
        sub.window = window
        link.send(
            wire.encode_json(
                wire.CONSUME,
                {
                    "id": sub.id,
                    "vhost": sub.queue.vhost.name,  # type: ignore[union-attr]
                    "queue": sub.queue.name,
                    "window": window,
                    "exclusive": consumer.exclusive,
                    "auto": not consumer.ack_required,
                },
            )
        )

    def close(self, queue: RemoteQueue, consumer: Consumer) -> None:
        sub = self._by_consumer.pop(consumer, None)
        if sub is None:
            return
        del self._subs[sub.id]
        self._forget(sub)
        link = sub.link
        if link is not None and link.state == "up":
            if not consumer.ack_required:
                # What the home sends before it hears of the cancel (it
                # answers with a cancelled frame, code 0) comes back.
                gone = self._gone
                if len(gone) >= GONE_REMEMBERED:
                    del gone[next(iter(gone))]
                gone[sub.id] = (link, queue)
            link.send(wire.encode_json(wire.CANCEL, {"id": sub.id}))

    def _forget(self, sub: _Sub) -> None:
        """Forget the home's tags of what C{sub} holds (given back there)."""
        held = self._held
        for message in sub.tags:
            held.pop(message, None)
        sub.tags = {}

    def settle(self, queue: RemoteQueue, messages: list[Message], ack: bool, requeue: bool) -> None:
        outcome = ACK if ack else REQUEUE if requeue else DROP
        held = self._held
        for message in messages:
            sub = held.pop(message, None)
            if sub is None:
                # Got by a basic.get (qmq.cluster.manage), or given back on
                # the home already (its link went).
                self.mesh.manage.settled(message, outcome)
                continue
            tag = sub.tags.pop(message)
            link = sub.link
            if link is not None and link.state == "up":
                link.settle(sub.id, tag, outcome, sub.window)

    # -- frames from the home -------------------------------------------------------

    def send_delivery(self, link: LinkProtocol, sub: int, tag: int, message: Message, queue: Any) -> None:
        vhost = queue.vhost.name if queue is not None and queue.vhost is not None else ""
        name = self._vhost_bytes.get(vhost)
        if name is None:
            name = self._vhost_bytes[vhost] = vhost.encode()
        chunks, size = wire.encode_delivery(sub, tag, message.delivery_count, message)
        # Never dropped (the window bounds what is out to a consumer): when
        # the link's buffer is full, the consumer pauses until it drains.
        link.send_message(wire.DELIVER, name, chunks, size, force=True)
        if link.full:
            consumer = link.homed.get(sub)
            if consumer is not None:
                consumer.paused = True
                link.held_back.add(consumer)

    def unblock(self, link: LinkProtocol) -> None:
        """C{link}'s buffer was written out: its paused consumers go on."""
        held, link.held_back = link.held_back, set()
        for consumer in held:
            if consumer.channel is not None and not consumer.channel.closed and link.homed.get(consumer.sub) is consumer:
                consumer.resume()

    def delivered(self, link: LinkProtocol, items: list[tuple[int, int, Message]]) -> None:
        """A deliver frame: hand each to the consumer of the stand-in."""
        subs = self._subs
        held = self._held
        ids = self.mesh.broker.message_ids
        for sub_id, tag, message in items:
            sub = subs.get(sub_id)
            if not tag:
                # To a consumer without acks: this node's now (taken off the
                # queue on the home); given back if the consumer went.
                message.id = next(ids)
                if sub is None:
                    self._give_back(sub_id, message)
                elif not sub.queue.from_home(sub.consumer, message):
                    sub.queue.publish(message)
                continue
            if sub is None or sub.link is not link:
                link.settle(sub_id, tag, REQUEUE)  # it went meanwhile: the home gives it back
                continue
            message.id = next(ids)
            held[message] = sub
            sub.tags[message] = tag
            if not sub.queue.from_home(sub.consumer, message):
                held.pop(message, None)
                sub.tags.pop(message, None)
                link.settle(sub_id, tag, REQUEUE)

    def _give_back(self, sub_id: int, message: Message) -> None:
        """A delivery without acks for consumer C{sub_id}, which went before
        it came: back to its queue (forwarded to the home again)."""
        gone = self._gone.get(sub_id)
        if gone is None:
            log.warn(
                "mesh: a message for consumer {sub}, which went, was lost: more than {n} consumers went "
                "before their homes answered",
                sub=sub_id,
                n=GONE_REMEMBERED,
            )
            return
        gone[1].publish(message)

    @property
    def unanswered_cancels(self) -> int:
        """Consumers without acks that went, whose home has not answered
        their cancel yet."""
        return len(self._gone)

    def credit(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """C{consumer} (without acks) handed a delivery of C{queue} to its
        client: its home may send one more."""
        sub = self._by_consumer.get(consumer)
        if sub is not None:
            link = sub.link
            if link is not None and link.state == "up":
                link.credit(sub.id, sub.window)

    def control(self, link: LinkProtocol, type_: int, value: dict[str, Any]) -> None:
        """A consume, declare, cancel or cancelled frame."""
        if type_ == wire.CONSUME:
            self._consume_here(link, value)
        elif type_ == wire.DECLARE:
            self._declare_here(link, value)
        elif type_ == wire.CANCEL:
            sub = _int(value.get("id"))
            consumer = link.homed.pop(sub, None)
            if consumer is not None and consumer.channel is not None and not consumer.channel.closed:
                consumer.channel.unsubscribe(consumer)
            # Nothing more goes to it: the peer may forget it.
            link.send(wire.encode_json(wire.CANCELLED, {"id": sub, "code": 0, "reason": "cancelled"}))
        else:
            self._cancelled(link, value)

    def confirmed(
        self, link: LinkProtocol, ranges: list[tuple[int, int]], failed: list[tuple[int, int, str]]
    ) -> None:
        """A confirm frame: the forwards it names as taken succeed, those
        refused fail with the home's reply code and reason. A confirm's
        Deferred that nothing holds and nothing waits on (a publish whose
        frontend did not wait, as STOMP's SEND without a receipt) is
        dropped rather than fired: no one could see it fire."""
        pending = link.pending
        if sum(count for _, count in ranges) > MAX_CONFIRM_RANGE:
            raise wire.FrameError(f"bad confirm: more than {MAX_CONFIRM_RANGE} sequence numbers in one")
        for first, count in ranges:
            if not pending:
                break
            if count <= len(pending):
                seqs: Any = range(first, first + count)
            else:  # bounded by what waits, whatever the frame says
                seqs = [s for s in pending if first <= s < first + count]
            for seq in seqs:
                d = pending.pop(seq, None)
                if d is not None and not deferred_unobserved(d):
                    d.callback(None)
        for seq, code, text in failed:
            d = pending.pop(seq, None)
            if d is not None:
                cls = _ERRORS.get(code, BrokerError)
                d.errback(cls(f"node {link.node!r} refused it: {text[:500]}", "refused by the home node"))
        if not pending:
            link.deadlines.clear()

    def expire(self, link: LinkProtocol, now: float) -> None:
        """Forwards unconfirmed past L{CONFIRM_TIMEOUT} fail (the link's
        heart-beat asks): their publishers hear it, and may send again."""
        pending = link.pending
        deadlines = link.deadlines
        while deadlines and deadlines[0][1] <= now:
            deadlines.popleft()
            limit = deadlines[0][0] if deadlines else link.next_seq
            expired = []
            for seq in pending:  # in sequence order: one pass, then failed
                if seq >= limit:
                    break
                expired.append(seq)
            for seq in expired:
                d = pending.pop(seq, None)
                if d is None:
                    continue
                d.errback(
                    Unavailable(
                        f"Node {link.node!r} did not confirm the message within {CONFIRM_TIMEOUT:g} s: "
                        "it may or may not be there; send it again.",
                        "no confirm from the home node",
                    )
                )

    def _cancelled(self, link: LinkProtocol, value: dict[str, Any]) -> None:
        sub_id = _int(value.get("id"))
        sub = self._subs.get(sub_id)
        if sub is None or sub.link is not link:
            # The answer to a cancel (code 0): nothing more comes for it.
            gone = self._gone.get(sub_id)
            if gone is not None and gone[0] is link:
                del self._gone[sub_id]
            return
        reason = str(value.get("reason", ""))[:500]
        log.info(
            "mesh: node {node} ended a consumer of queue {queue!r}: {reason}",
            node=link.node,
            queue=sub.queue.name,
            reason=reason,
        )
        del self._subs[sub.id]
        self._by_consumer.pop(sub.consumer, None)
        self._forget(sub)
        queue, consumer = sub.queue, sub.consumer
        consumers = queue.consumers
        if consumer in consumers:
            consumers.remove(consumer)  # type: ignore[union-attr]
            if not consumers:
                queue.consumers = ()
            consumer.queue = None
            queue.held.pop(consumer, None)
        consumer.cancelled()

    def settled(self, link: LinkProtocol, runs: list[tuple[int, int, int, int]]) -> None:
        """A settle frame: each run's deliveries are acked, given back or
        dropped. A run longer than its consumer's window (what it may
        hold unacked) is a protocol error."""
        homed = link.homed
        total = sum(run[2] for run in runs)
        if total > SETTLE_CHECKED and total > sum(c.prefetch for c in homed.values()):
            raise wire.FrameError(f"bad settle: {total} tags, more than the consumers' windows")
        for sub, first, count, outcome in runs:
            consumer = homed.get(sub)
            if consumer is None or consumer.channel is None:
                continue
            if count > consumer.prefetch:
                raise wire.FrameError(
                    f"bad settle: a run of {count} tags for consumer {sub}, whose window is {consumer.prefetch}"
                )
            if outcome == CREDIT:
                if consumer.ack_required:
                    raise wire.FrameError(f"bad settle: credit for consumer {sub}, which acks")
                if consumer.credit + count > consumer.prefetch:
                    raise wire.FrameError(f"bad settle: credit of {count} for consumer {sub}, more than it spent")
                consumer.credit += count
                queue = consumer.queue
                if queue is not None and not consumer.paused:
                    queue.drain()
                continue
            settle = consumer.channel.settle_delivery
            ack = outcome == ACK
            requeue = outcome == REQUEUE
            for tag in range(first, first + count):
                settle(consumer, tag, ack, requeue)

    # -- frames to the home ---------------------------------------------------------

    def forwarded(self, link: LinkProtocol, seq: int, vhost_name: str, messages: list[Message]) -> None:
        """Publishes forwarded by a peer to queues homed here (sequence
        numbers C{seq}, C{seq + 1}, ...): published through the link's
        channel (each queue resolved once per link, as STOMP's SEND
        resolves a destination), confirmed once each is as durable as the
        store makes it."""
        targets = link.queue_targets
        ids = self.mesh.broker.message_ids
        name = found = None
        # Taken at once (no store to wait for): confirmed as one range, from
        # taken to seq, when the run ends.
        taken = seq
        for message in messages:
            try:
                if message.routing_key is not name or found is None or found[1][4].deleted:
                    # A run to one queue (one string: the link's decoder
                    # shares it) looks it up once.
                    found = None
                    name = message.routing_key
                    key = (vhost_name, name)
                    found = targets.get(key)
                    if found is None or found[1][4].deleted:
                        found = self._resolve(link, vhost_name, name)
                        if len(targets) >= TARGET_CACHE_SIZE:
                            targets.clear()
                        targets[key] = found
                message.id = next(ids)
                durable = found[0].publish_target(found[1], message)
            except BrokerError as e:
                if taken < seq:
                    link.confirm(taken, seq - taken)
                link.refused += 1
                link.fail(seq, e.code, e.message)
                seq += 1
                taken = seq
                continue
            if durable is None:
                seq += 1
                continue
            if taken < seq:
                link.confirm(taken, seq - taken)
            taken = seq + 1
            if durable is link.group_waiter:
                # The store's group commit: one waiter for the turn's publishes.
                link.group.append(seq)  # type: ignore[union-attr]
            else:
                group = link.group = [seq]
                link.group_waiter = durable
                durable.addCallbacks(
                    self._stored, self._not_stored, callbackArgs=(link, group), errbackArgs=(link, group)
                )
            seq += 1
        if taken < seq:
            link.confirm(taken, seq - taken)

    def _resolve(self, link: LinkProtocol, vhost_name: str, name: str) -> tuple[Any, Any]:
        """(the link's channel, the target) of queue C{name} homed here."""
        mesh = self.mesh
        vhost = mesh.broker.vhosts.get(vhost_name)
        if vhost is None:
            raise NotFound(f"no virtual host {vhost_name!r} on node {mesh.node!r}")
        channel = mesh.channel_for(link, vhost)
        queue = self._homed(channel, name, "write")
        return channel, (queue, None, "", name, queue)

    def _homed(self, channel: Any, name: str, operation: str) -> Any:
        """Queue C{name} that a peer names as homed here (for a forward, or
        a consume), made on first use as a client's would be when this node
        is its home by placement (L{_check_makes}).
        @raise NotFound: not made, or this node places it elsewhere."""
        vhost = channel.vhost
        queue = vhost.queues.get(name)
        if queue is None:
            self._check_makes(vhost, name)
            with self.here():
                queue = channel.named_queue(name, operation)
        if queue.remote is not None:
            raise not_homed_here(self.mesh.node, queue)
        return queue

    @staticmethod
    def _stored(result: Any, link: LinkProtocol, group: list[int]) -> Any:
        # Returns its result unchanged: the store's waiter may be shared.
        if link.group is group:
            link.group = link.group_waiter = None
        for seq in group:
            link.confirm(seq)
        return result

    @staticmethod
    def _not_stored(failure: Any, link: LinkProtocol, group: list[int]) -> Any:
        # Passed on: the waiter may be shared with other publishers.
        if link.group is group:
            link.group = link.group_waiter = None
        text = f"not stored: {failure.getErrorMessage()}"
        for seq in group:
            link.fail(seq, 541, text)
        return failure

    def _check_makes(self, vhost: Any, name: str) -> None:
        """A peer names queue C{name}, which is not here: it is made here on
        first use only if this node is its home by the placement; else it
        was a queue of a connection here, gone with it (or the nodes'
        memberships differ).
        @raise NotFound: not made."""
        if not name.startswith(LOCAL_PREFIXES) and not self.placed_here(vhost.name, name):
            raise NotFound(
                f"no queue {name!r} in virtual host {vhost.name!r} on node {self.mesh.node!r}, which is not "
                "its home by placement (it was a queue of a connection here, gone with it; or the nodes' "
                "memberships differ)",
                "no such queue",
            )

    def _consume_here(self, link: LinkProtocol, value: dict[str, Any]) -> None:
        sub = _int(value.get("id"))
        window = value.get("window")
        vhost_name, name = value.get("vhost"), value.get("queue")
        if not (
            isinstance(window, int)
            and 0 < window <= MAX_WINDOW
            and isinstance(vhost_name, str)
            and isinstance(name, str)
        ):
            raise wire.FrameError("bad consume: id, vhost, queue and window expected")
        mesh = self.mesh
        consumer = HomeConsumer(link, sub, window, auto=value.get("auto") is True)
        try:
            old = link.homed.pop(sub, None)
            if old is not None and old.channel is not None:
                old.channel.unsubscribe(old)
            vhost = mesh.broker.vhosts.get(vhost_name)
            if vhost is None:
                raise NotFound(f"no virtual host {vhost_name!r} on node {mesh.node!r}")
            channel = mesh.channel_for(link, vhost)
            self._homed(channel, name, "read")
            link.homed[sub] = consumer
            channel.consume(consumer, name, exclusive=value.get("exclusive") is True)
        except BrokerError as e:
            link.homed.pop(sub, None)
            link.send(wire.encode_json(wire.CANCELLED, {"id": sub, "code": e.code, "reason": e.message}))

    # -- links ----------------------------------------------------------------------

    def link_up(self, link: LinkProtocol) -> None:
        """Stand-ins declared with arguments are declared there, and
        consumers of queues homed on C{link}'s peer consume there (again)."""
        for key, queue in list(self._declared.items()):
            if queue.deleted:
                del self._declared[key]
            elif queue.home == link.node:
                self._declare(link, queue)
        for sub in list(self._subs.values()):
            if sub.queue.home == link.node and sub.link is not link:
                self._consume(link, sub)

    def link_down(self, link: LinkProtocol) -> None:
        """What waited on C{link} fails or goes back; what its node said of
        its connections' queues is forgotten."""
        self._link_down(link)
        if self.owned and link.node:
            self._forget_owned(link.node)

    def _link_down(self, link: LinkProtocol) -> None:
        """Forwards not confirmed fail; what the peer's consumers of
        stand-ins held here was given back on the home (forgotten here:
        later acks of it go nowhere). The home side's consumers go with
        the link's channels (L{qmq.cluster.mesh.Mesh.link_down})."""
        pending, link.pending = link.pending, {}
        link.deadlines.clear()
        for d in pending.values():
            d.errback(
                Unavailable(
                    f"The link to node {link.node!r} went down before it confirmed the message "
                    f"({link.reason}): it may or may not be there; send it again.",
                    "home node link lost",
                )
            )
        link.homed.clear()
        link.held_back.clear()
        gone = self._gone
        for sub_id in [i for i, (went_on, _) in gone.items() if went_on is link]:
            del gone[sub_id]  # nothing more comes from that link
        for sub in self._subs.values():
            if sub.link is link:
                sub.link = None
                self._forget(sub)
                if sub.consumer.ack_required:  # given back on the home; without acks, this node's
                    sub.queue.held.pop(sub.consumer, None)


def not_homed_here(node: str, queue: Any) -> NotFound:
    """Node C{node} was asked for C{queue} as its home, and has only its
    stand-in: the nodes place it differently."""
    return NotFound(
        f"node {node!r} places queue {queue.name!r} on node {queue.home!r}: "
        "the nodes' memberships differ (name every node in cluster.peers)"
    )


def _int(value: Any) -> int:
    if not isinstance(value, int):
        raise wire.FrameError("bad frame: an integer id expected")
    return value
