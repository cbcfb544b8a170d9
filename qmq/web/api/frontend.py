# -*- test-case-name: tests.test_web_api -*-
"""The HTTP API's way into the core: one channel per virtual host.

An L{HttpFrontend} holds, per virtual host the API has used, one
L{qmq.core.channel.Channel} (owner C{"http"}), as a STOMP session holds one
per connection: HTTP requests are short and many, so they share it. Through
it the API publishes (L{HttpFrontend.publish}), receives from queues with
long polls (L{PollConsumer}), and settles by receipt handle.

Receiving (SQS-style):

  - A queue that an HTTP client receives from gets one L{PollConsumer},
    attached through the channel like a STOMP subscription with acks. It
    stays I{paused} (the queue skips it) while no request waits, so
    messages are taken only for a waiting request, never ahead of one.
  - A receive request is a L{Waiter}. Waiters queue in order; the queue
    hands messages to the first until it has what it asked for, then the
    next. A waiter that got some messages is answered at the end of the
    reactor turn (so a batch published in one turn is received together);
    one that got none is answered empty when its C{wait} runs out.
  - Every message handed out gets a receipt handle C{TOKEN.TAG} (the
    consumer's random token and the channel's delivery tag) and a
    visibility deadline: acked (L{PollConsumer.ack}) before it, the
    message is done; nacked, it goes back to the queue (or, without
    requeue, leaves it: the core's dead-letter path); not settled by then,
    it goes back to the queue marked redelivered. L{PollConsumer.extend}
    moves the deadline. Deadlines are kept per received batch: one timer
    for the batch, not one per message.
  - When nothing waits and nothing is unacknowledged the consumer detaches
    (the queue may then auto-delete or start its expiry, as for any
    consumer leaving); a later receive attaches a new one with a new token,
    so handles of the old one are unknown.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq.core import options
from qmq.core.admission import RETRY_AFTER
from qmq.core.consumer import Consumer
from qmq.core.errors import BrokerError, NotFound
from qmq.core.message import Message, check_user_id
from qmq.core.names import check_headers
from qmq.core.remote import Unavailable
from qmq.stomp.destinations import DestinationChannel
from qmq.web.api.codec import Parsed
from qmq.web.api.problem import Problem, from_broker_error

if TYPE_CHECKING:
    from qmq.core.broker import Broker
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost
    from qmq.web.api.settings import ApiSettings

log = Logger()

Delivered = list[tuple[int, "Message"]]


def _still_unknown(value: Any, asked: list[str]) -> list[str]:
    """What another node answered an C{http.settle}: the handles it did
    not know (only among those it was asked)."""
    unknown = value.get("unknown") if isinstance(value, dict) else None
    if not isinstance(unknown, list):
        return asked
    known = set(asked)
    return [h for h in unknown if h in known]


#: Seconds a first receive from a queue homed on another node waits at
#: least for the messages its home said it has (L{PollConsumer.first_wait}).
REMOTE_FIRST_WAIT = 1.0


class Waiter:
    """One receive request waiting for messages.

    @ivar want: how many messages it takes at most.
    @ivar got: (tag, message) handed to it so far.
    @ivar visibility: seconds its messages stay invisible.
    @ivar deferred: fires with C{got} when it is answered.
    """

    __slots__ = ("want", "got", "visibility", "deferred", "timer")

    def __init__(self, want: int, visibility: float) -> None:
        self.want = want
        self.got: Delivered = []
        self.visibility = visibility
        self.deferred: defer.Deferred[Delivered] = defer.Deferred()
        self.timer: Any = None


class _Batch:
    """Tags that share one visibility deadline, and its timer."""

    __slots__ = ("tags", "timer")

    def __init__(self, tags: set[int]) -> None:
        self.tags = tags
        self.timer: Any = None


class PollConsumer(Consumer):
    """The HTTP receivers of one queue (see the module docstring)."""

    __slots__ = ("frontend", "channel", "name", "token", "waiters", "flush_call", "batch_of", "clock", "first_wait")

    def __init__(self, frontend: VHostFrontend, name: str, max_unacked: int) -> None:
        super().__init__(True, max_unacked, owner=frontend.channel)
        self.frontend = frontend
        self.channel = frontend.channel
        self.clock = frontend.clock
        self.name = name
        # NODE.RUN.RANDOM (qmq.core.ids): a handle from another node or an
        # earlier run never names a delivery of this receiver.
        self.token = f"{frontend.broker.message_ids.prefix}.{secrets.token_urlsafe(6)}"
        self.waiters: deque[Waiter] = deque()
        self.flush_call: Any = None
        self.batch_of: dict[int, _Batch] = {}
        self.paused = True
        #: The least wait of the first receive: for a queue homed on another
        #: node that has messages, the time they may take to come.
        self.first_wait = 0.0

    # -- receiving -------------------------------------------------------------

    def receive(self, want: int, wait: float, visibility: float) -> Waiter:
        """A waiter for up to C{want} messages, answered within C{wait} seconds."""
        if self.first_wait:
            wait, self.first_wait = max(wait, self.first_wait), 0.0
        waiter = Waiter(want, visibility)
        self.waiters.append(waiter)
        if len(self.waiters) == 1:
            self.paused = False
            self.channel.deliver_waiting(self)
        if waiter.got and waiter.deferred.called is False and waiter in self.waiters:
            # Served at once from what was waiting in the queue.
            self._flush()
        elif not waiter.deferred.called:
            if wait <= 0:
                self._give_up(waiter)
            else:
                waiter.timer = self.clock.callLater(wait, self._give_up, waiter)
        return waiter

    def deliver(self, message: Message, queue: Queue | None) -> None:
        tag = self.channel.track(self, message)
        waiter = self.waiters[0]
        got = waiter.got
        got.append((tag, message))
        if len(got) >= waiter.want:
            self._answer_head()
        elif self.flush_call is None:
            self.flush_call = self.clock.callLater(0, self._flush)

    def _answer_head(self) -> None:
        waiter = self.waiters.popleft()
        if not self.waiters:
            self.paused = True
        self._answer(waiter)

    def _answer(self, waiter: Waiter) -> None:
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        got = waiter.got
        if got:
            batch = _Batch({tag for tag, _ in got})
            batch.timer = self.clock.callLater(waiter.visibility, self._expire, batch)
            batch_of = self.batch_of
            for tag in batch.tags:
                batch_of[tag] = batch
        waiter.deferred.callback(got)

    def _flush(self) -> None:
        call = self.flush_call
        self.flush_call = None
        if call is not None and call.active():
            call.cancel()
        waiters = self.waiters
        while waiters and waiters[0].got:
            self._answer_head()

    def _remove(self, waiter: Waiter) -> bool:
        """Take C{waiter} out of the waiting requests (with none left, the
        receiver takes no more); False if it was not there."""
        try:
            self.waiters.remove(waiter)
        except ValueError:
            return False
        if not self.waiters:
            self.paused = True
        return True

    def _give_up(self, waiter: Waiter) -> None:
        """The waiter's time is up with nothing for it: answer it empty."""
        waiter.timer = None
        if not self._remove(waiter):
            return
        self._answer(waiter)
        self._maybe_detach()

    def forget(self, waiter: Waiter) -> None:
        """The client went away before its answer: what it got goes back."""
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        if not self._remove(waiter):
            return
        for tag, _ in waiter.got:
            self.channel.settle_delivery(self, tag, False, True)
        waiter.got = []
        self._maybe_detach()

    # -- settling ----------------------------------------------------------------

    def _known(self, tag: int) -> bool:
        return tag in self.unacked

    def _unbatch(self, tag: int) -> None:
        batch = self.batch_of.pop(tag, None)
        if batch is not None:
            batch.tags.discard(tag)
            if not batch.tags and batch.timer is not None and batch.timer.active():
                batch.timer.cancel()

    def settle(self, tags: list[int], ack: bool, requeue: bool) -> list[int]:
        """Ack or nack C{tags}; return those that were not waiting."""
        unknown = []
        channel = self.channel
        unacked = self.unacked
        batch_of = self.batch_of
        settle = channel.settle_delivery
        for tag in tags:
            if tag not in unacked:
                unknown.append(tag)
                continue
            # _unbatch, inlined.
            batch = batch_of.pop(tag, None)
            if batch is not None:
                batch.tags.discard(tag)
                if not batch.tags and batch.timer is not None and batch.timer.active():
                    batch.timer.cancel()
            settle(self, tag, ack, requeue)
        self._maybe_detach()
        return unknown

    def extend(self, tags: list[int], visibility: float) -> list[int]:
        """Give C{tags} C{visibility} more seconds from now; return the unknown ones."""
        unknown = []
        moved = set()
        for tag in tags:
            if tag not in self.unacked:
                unknown.append(tag)
                continue
            self._unbatch(tag)
            moved.add(tag)
        if moved:
            batch = _Batch(moved)
            batch.timer = self.clock.callLater(visibility, self._expire, batch)
            for tag in moved:
                self.batch_of[tag] = batch
        return unknown

    def _expire(self, batch: _Batch) -> None:
        """A batch's visibility ran out: what is still unacked goes back."""
        batch.timer = None
        channel = self.channel
        for tag in list(batch.tags):
            self.batch_of.pop(tag, None)
            if tag in self.unacked:
                channel.settle_delivery(self, tag, False, True)
        batch.tags.clear()
        self._maybe_detach()

    def _maybe_detach(self) -> None:
        if not self.waiters and not self.unacked and self.queue is not None:
            self.frontend.detach(self)

    def cancelled(self) -> None:
        """The queue was deleted: waiting requests are told, handles forgotten."""
        self.channel.consumer_cancelled(self)
        self.frontend.pollers.pop(self.name, None)
        self.frontend._forget(self)
        for batch in set(self.batch_of.values()):
            if batch.timer is not None and batch.timer.active():
                batch.timer.cancel()
        self.batch_of.clear()
        waiters, self.waiters = self.waiters, deque()
        for waiter in waiters:
            if waiter.timer is not None and waiter.timer.active():
                waiter.timer.cancel()
            waiter.deferred.errback(
                Problem(404, "not-found", f"Queue {self.name!r} was deleted while this request waited.")
            )

    def stop(self) -> None:
        """The API is going away: answer the waiters, give everything back."""
        for waiter in list(self.waiters):
            self._give_up(waiter)
        for batch in set(self.batch_of.values()):
            if batch.timer is not None and batch.timer.active():
                batch.timer.cancel()
        self.batch_of.clear()
        if self.queue is not None:
            self.frontend.detach(self)


def refuse_held(admission: Any, persistent: bool) -> None:
    """Refuse a publish that admission holds back (the memory alarm for
    any, the disk alarm or a failing store for persistent messages): 503
    with C{Retry-After}, nothing published. Consumers are never held.

    @raise Problem: the publish is held back.
    """
    hold = admission.refusal(persistent)
    if hold is not None:
        raise Problem(
            503,
            "publishers-held",
            f"Publishing is held back: {hold.detail}. Retry later.",
            {"alarm": hold.name},
            {"Retry-After": str(RETRY_AFTER)},
        )


#: The attached receivers of each broker by token, whichever listener's
#: API made them: a handle is settled wherever it arrives
#: (L{settle_by_token}).
_receivers: WeakKeyDictionary[Any, dict[str, PollConsumer]] = WeakKeyDictionary()


def _identity(user: Any) -> tuple[str, str] | None:
    return user.identity if user is not None else None


def settle_by_token(
    broker: Broker,
    vhost: str,
    queue: str,
    identity: tuple[str, str] | None,
    handles: list[str],
    ack: bool,
    requeue: bool,
    visibility: float | None = None,
) -> list[str]:
    """Settle C{handles} of this node's receivers, whichever listener's
    API made them: acked, or nacked (C{requeue}), or with C{visibility}
    their deadline moved (extend). A handle counts only for a receiver of
    C{queue} in C{vhost} that C{identity} made (handles of one identity's
    receivers mean nothing to another's). Return those that were not."""
    receivers = _receivers.get(broker) or {}
    unknown: list[str] = []
    tags_of: dict[PollConsumer, list[int]] = {}
    for handle in handles:
        parsed = parse_handle(handle)
        poller = receivers.get(parsed[0]) if parsed is not None else None
        if (
            poller is None
            or poller.queue is None
            or poller.name != queue
            or poller.frontend.vhost.name != vhost
            or _identity(poller.frontend.user) != identity
        ):
            unknown.append(handle)
            continue
        tags_of.setdefault(poller, []).append(parsed[1])  # type: ignore[index]
    for poller, tags in tags_of.items():
        missed = poller.extend(tags, visibility) if visibility is not None else poller.settle(tags, ack, requeue)
        unknown.extend(f"{poller.token}.{tag}" for tag in missed)
    return unknown


def parse_handle(handle: Any) -> tuple[str, int] | None:
    """C{(token, tag)} of a receipt handle, or None if it is not one."""
    if handle.__class__ is not str or len(handle) > 128:
        return None
    token, _, tag = handle.rpartition(".")
    if not token or not tag.isdigit() or len(tag) > 19:
        return None
    return token, int(tag)


class VHostFrontend:
    """The API's channel into one virtual host and its pollers."""

    def __init__(
        self, broker: Broker, vhost: VirtualHost, settings: ApiSettings, clock: Any, user: Any = None
    ) -> None:
        self.broker = broker
        self.vhost = vhost
        self.settings = settings
        self.clock = clock
        self.user = user
        # With authentication, one channel per user: the core checks the
        # user's permissions on every destination, and receipt handles of
        # one user's receivers mean nothing to another's.
        # No session: /temp-queue/ and /control/ are refused by the channel
        # (qmq.stomp.destinations decides what a destination is).
        self.channel = DestinationChannel(
            broker, vhost, owner_name=user.owner if user is not None else "http", user=user, protocol="http",
            session=False,
        )
        self.pollers: dict[str, PollConsumer] = {}

    # -- publishing -------------------------------------------------------------

    def publish(
        self, messages: list[Parsed], destination: str | Callable[[Parsed], str]
    ) -> tuple[list[int], list[defer.Deferred]]:
        """Publish C{messages} in order.

        Every message's destination is resolved before any is published, so
        a bad name refuses the whole request. A refusal by the core while
        publishing (a full queue) stops there: the problem says how many
        went (C{published}) and their ids.

        @param destination: the destination of every message, or a
            function giving each message's.
        @return: the messages' numbers (their names, the answer's C{ids},
            are L{qmq.core.ids.message_name}: L{qmq.web.api.codec.published_json}) and
            the Deferreds of the store's writes the answer waits for.
        @raise Problem: a bad destination or header, a refusal.
        """
        admission = self.broker.admission
        if admission.closed:
            refuse_held(admission, any(m.__class__ is not bytes and m.persistent for m in messages))
        channel = self.channel
        same = destination if destination.__class__ is str else None
        targets: list | None = None
        try:
            if same is not None:
                target = channel.send_target(same)
            else:
                targets = []
            for m in messages:
                if m.__class__ is bytes:
                    if targets is not None:
                        text = destination(m)  # type: ignore[operator]
                        targets.append((text, channel.send_target(text)))
                    continue
                if m.headers:
                    # Before any is published (so publish_target is told
                    # they are checked).
                    check_headers(m.headers)
                check_user_id(m.properties, channel.user)
                if targets is not None:
                    text = destination(m)  # type: ignore[operator]
                    targets.append((text, channel.send_target(text)))
        except BrokerError as e:
            problem = from_broker_error(e)
            if targets is not None and len(messages) > 1:
                # Each message's target is added once it resolved.
                problem.detail = f"message {len(targets)}: {problem.detail}"
            raise problem from None
        # The messages' numbers: their names (NODE.NUMBER) are written by
        # C code, in the answer (codec.published_json) or a refusal's (_names).
        ids: list[int] = []
        append = ids.append
        waits = []
        publish = channel.publish_target
        # Channel.new_message, inlined: one clock reading for the batch.
        next_id = channel.id_source()
        now = channel.now()
        # One target for all (zip with repeat: no test a message), or each its own.
        each = repeat(target) if targets is None else [t[1] for t in targets]
        for m, target in zip(messages, each, strict=False):  # noqa: B020 - the target of m
            if m.__class__ is bytes:
                message = Message(next_id(), target[2], target[3], None, m, now, False)
            else:
                message = Message(next_id(), target[2], target[3], m.headers, m.body, now, m.persistent)
                message.properties = m.properties
                if m.priority or m.ttl is not None or m.delay is not None or m.timing is not None:
                    # The codec checked them (the same parser): no error
                    # here. A delivery time is held by the core and kept
                    # by the store with the message, as STOMP's.
                    expires, deliver_at, ack_timeout = m.timing or (None, None, None)
                    (message.priority, message.expires, message.deliver_at, message.ack_timeout) = options.read(
                        now, m.priority, expires, m.ttl, m.delay, deliver_at, ack_timeout
                    )
            try:
                w = publish(target, message, True)
            except BrokerError as e:
                raise from_broker_error(e, {"published": len(ids), "ids": self._names(ids)}) from None
            append(message.id)
            if w is not None:
                waits.append(w)
        return ids, waits

    def _names(self, ids: list[int]) -> list[str]:
        """The names of messages C{ids} (L{qmq.core.ids.message_name}, inlined)."""
        return list(map((self.broker.message_ids.node + ".").__add__, map(str, ids)))

    # -- receiving --------------------------------------------------------------

    def poller(self, name: str) -> PollConsumer | defer.Deferred:
        """The consumer of queue C{name} (attached on first use); for a
        queue whose home is another node, attached once the home said it
        has it (L{qmq.core.channel.Channel.find_queue}): a Deferred of it.

        @raise Problem: no such queue, or it is exclusive to a session.
        """
        poller = self.pollers.get(name)
        if poller is not None and poller.queue is not None:
            return poller
        try:
            found = self.channel.find_queue(name)
        except NotFound:
            raise self._unknown(name) from None
        if isinstance(found, defer.Deferred):
            return found.addCallbacks(self._attach_found, self._not_found, (name,), None, (name,))
        return self._attach(name, found)

    def _attach_found(self, found: tuple[Queue, dict[str, Any]], name: str) -> PollConsumer:
        """Attached to a queue homed on another node: when the home has
        messages, a first receive waits for them a little (they come from
        the home as its consumer there fills its window), even one that
        asked not to wait."""
        queue, facts = found
        poller = self._attach(name, queue)
        ready = facts.get("messages_ready")
        if isinstance(ready, int) and ready > 0:
            poller.first_wait = REMOTE_FIRST_WAIT
        return poller

    def _unknown(self, name: str) -> Problem:
        return Problem(404, "unknown-queue", f"No queue {name!r} in virtual host {self.vhost.name!r}.")

    def _not_found(self, failure: Failure, name: str) -> Failure:
        """The home of queue C{name} has no such queue: the same problem as here."""
        if failure.check(NotFound) and not failure.check(Unavailable):
            raise self._unknown(name)
        return failure

    def _attach(self, name: str, queue: Queue) -> PollConsumer:
        poller = self.pollers.get(name)
        if poller is not None and poller.queue is not None:
            return poller  # attached by another receive meanwhile
        if queue.exclusive_owner is not None:
            raise Problem(403, "access-refused", f"Queue {name!r} belongs to a session.")
        poller = PollConsumer(self, name, self.settings.max_unacked)
        try:
            self.channel.consume(poller, name, text="/queue/" + name)
        except BrokerError as e:
            raise from_broker_error(e) from None
        self.pollers[name] = poller
        receivers = _receivers.get(self.broker)
        if receivers is None:
            receivers = _receivers[self.broker] = {}
        receivers[poller.token] = poller
        return poller

    def find_poller(self, name: str) -> PollConsumer | None:
        """The attached consumer of queue C{name}, or None.

        @raise Problem: no such queue (here, or on another node that is its
            home).
        """
        if name not in self.vhost.queues and self.vhost.placed_elsewhere(name) is None:
            raise self._unknown(name)
        poller = self.pollers.get(name)
        return poller if poller is not None and poller.queue is not None else None

    def settle_elsewhere(
        self, name: str, handles: list[str], ack: bool, requeue: bool, visibility: float | None = None
    ) -> list[str] | defer.Deferred:
        """Settle (or extend) C{handles} that no receiver of this API's
        has: those of another listener's receivers here
        (L{settle_by_token}), and, in a mesh, those a receiver on another
        node made (a handle's token starts with its node's id: an HTTP
        client's next connection may land on another worker), asked of
        that node for this identity. Return the handles still unknown,
        or a Deferred of them; a node that does not answer leaves its
        handles unknown (their messages go back to the queue when their
        visibility runs out, as for any handle not settled)."""
        here = self.broker.message_ids.node
        identity = _identity(self.user)
        local: list[str] = []
        remote: dict[str, list[str]] = {}
        for handle in handles:
            parsed = parse_handle(handle)
            node = parsed[0].partition(".")[0] if parsed is not None else here
            (local if node == here else remote.setdefault(node, [])).append(handle)
        unknown = settle_by_token(self.broker, self.vhost.name, name, identity, local, ack, requeue, visibility)
        mesh = getattr(self.broker, "mesh", None)
        asked = []
        for node, some in remote.items():
            link = mesh.links.get(node) if mesh is not None else None
            if link is None or link.state != "up" or not link.manages:
                unknown += some
                continue
            d = mesh.manage.ask(node, "http.settle", {
                "vhost": self.vhost.name, "queue": name, "identity": identity, "handles": some,
                "ack": ack, "requeue": requeue, "visibility": visibility})
            asked.append(d.addCallbacks(_still_unknown, lambda _, some=some: some, (some,)))
        if not asked:
            return unknown
        position = {h: i for i, h in reversed(list(enumerate(handles)))}

        def in_order(lists: list[list[str]]) -> list[str]:
            return sorted(unknown + [h for hs in lists for h in hs], key=position.__getitem__)

        return defer.gatherResults(asked).addCallback(in_order)

    def detach(self, poller: PollConsumer) -> None:
        if self.pollers.get(poller.name) is poller:
            del self.pollers[poller.name]
        self._forget(poller)
        self.channel.unsubscribe(poller)

    def _forget(self, poller: PollConsumer) -> None:
        receivers = _receivers.get(self.broker)
        if receivers is not None and receivers.get(poller.token) is poller:
            del receivers[poller.token]

    def unacked(self, name: str) -> int:
        poller = self.pollers.get(name)
        return len(poller.unacked) if poller is not None else 0

    def close(self) -> None:
        for poller in list(self.pollers.values()):
            poller.stop()
        self.channel.close()


class HttpFrontend:
    """The HTTP API's state across virtual hosts: their L{VHostFrontend}s."""

    def __init__(self, broker: Broker, settings: ApiSettings, clock: Any) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.vhosts: dict[tuple[str, tuple[str, str] | None], VHostFrontend] = {}

    def vhost(self, name: str, user: Any = None) -> VHostFrontend:
        """The frontend of virtual host C{name} for C{user} (None: no
        authentication). @raise Problem: there is no such virtual host."""
        # Per identity (how it logged in, name): a token's "alice" is not
        # the password user "alice", and owns apart (qmq.auth.User.owner).
        key = (name, user.identity if user is not None else None)
        fe = self.vhosts.get(key)
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise Problem(404, "unknown-vhost", f"No virtual host {name!r}.")
        if fe is None or fe.vhost is not vhost:
            fe = self.vhosts[key] = VHostFrontend(self.broker, vhost, self.settings, self.clock, user)
        elif user is not None and fe.user is not user:
            # The same user logged in again (new credentials, a token's new
            # narrowing): the channel checks with the latest.
            fe.user = user
            fe.channel.set_user(user)
        return fe

    def close(self) -> None:
        for fe in self.vhosts.values():
            fe.close()


__all__ = ["HttpFrontend", "NotFound", "PollConsumer", "VHostFrontend", "Waiter", "parse_handle", "settle_by_token"]
