# -*- test-case-name: tests.test_stomp_destinations,tests.test_core_channel -*-
"""STOMP's destination names, and how they translate onto the core's channel.

The core speaks AMQP (exchanges, routing keys, queues:
L{qmq.core.channel.Channel}); STOMP names destinations with strings, and
this module is the one place that reads them. The HTTP API uses the same
names, so it borrows this module as an adapter (as RabbitMQ's web-STOMP and
STOMP plugins share C{rabbit_routing_util}):

=====================  ==================================================
destination            core
=====================  ==================================================
``/queue/NAME``        queue NAME (made on first use) through the default
                       exchange
``/topic/KEY``         exchange ``amq.topic``, routing key KEY
``/exchange/NAME/KEY`` exchange NAME, routing key KEY (may be empty)
``/temp-queue/NAME``   the session's private reply queue NAME (exclusive
                       to its connection)
``/control/...``       counts answered in the RECEIPT (ocamlmq)
=====================  ==================================================

C{/temp-queue/} and C{/control/} belong to a session (its private reply
queues; answers in its RECEIPT): a frontend without sessions (the HTTP API)
opens its channel with C{session=False}, and the channel refuses them with
L{session_only} as its reason, so what a destination is, and who may name
it, is decided here for every frontend.

L{parse_destination} reads a name; L{DestinationChannel} is a
L{Channel} that also takes names: L{DestinationChannel.send_target}
resolves one to publish to (cached per channel: a SEND resolves its
destination once, not per message), L{DestinationChannel.subscribe}
translates a SUBSCRIBE into L{Channel.consume}, and
L{DestinationChannel.control} answers a C{/control/} destination.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from qmq.core.channel import Channel, SendTarget
from qmq.core.consumer import Consumer
from qmq.core.errors import BrokerError, NotFound
from qmq.core.names import check_destination, check_exchange, check_queue, check_routing_key
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX, check_queue_access
from qmq.core.queue import Queue
from qmq.core.remote import Unavailable

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

PREFIXES = ("/queue/", "/topic/", "/exchange/", "/temp-queue/", "/control/")

#: The kinds of destination only a session has (see the module docstring).
SESSION_KINDS = frozenset(("temp-queue", "control"))


class DestinationError(BrokerError):
    """A destination QMQ cannot map; the message names the rule broken."""

    code = 404

    def __init__(self, message: str, short: str = "unknown destination") -> None:
        super().__init__(message, short)


class Destination(NamedTuple):
    """A parsed destination.

    @ivar kind: C{queue}, C{topic}, C{exchange}, C{temp-queue} or C{control}.
    @ivar name: queue name, exchange name, temp-queue name or control path.
    @ivar key: the routing key (topics and exchanges), else C{""}.
    """

    kind: str
    name: str
    key: str


def parse_destination(text: str) -> Destination:
    """Parse a destination name. @raise DestinationError: it maps to nothing."""
    if text.startswith("/queue/"):
        name = text[7:]
        if not name:
            raise DestinationError("a /queue/ destination needs a queue name")
        return Destination("queue", name, name)
    if text.startswith("/topic/"):
        key = text[7:]
        if not key:
            raise DestinationError("a /topic/ destination needs a topic name")
        return Destination("topic", "amq.topic", key)
    if text.startswith("/exchange/"):
        name, _, key = text[10:].partition("/")
        if not name:
            raise DestinationError("an /exchange/ destination needs an exchange name")
        return Destination("exchange", name, key)
    if text.startswith("/temp-queue/"):
        name = text[12:]
        if not name:
            raise DestinationError("a /temp-queue/ destination needs a name")
        return Destination("temp-queue", name, "")
    if text.startswith("/control/"):
        return Destination("control", text[9:], "")
    raise DestinationError(
        f"unknown destination {text!r}: a destination starts with one of {', '.join(PREFIXES)}"
    )


def destination_of(exchange: str, routing_key: str) -> str:
    """The destination naming a publish to C{exchange} with C{routing_key}."""
    if not exchange:
        return "/queue/" + routing_key
    if exchange == "amq.topic":
        return "/topic/" + routing_key
    return f"/exchange/{exchange}/{routing_key}"


def session_only(text: str) -> DestinationError:
    """The refusal of C{text}, a destination of a L{SESSION_KINDS} kind, on a
    channel without a session."""
    return DestinationError(
        f"{text.split('/')[1]!r} destinations are for STOMP sessions; without a session "
        "publish to /queue/, /topic/ and /exchange/ destinations",
        "session destination",
    )


_TARGET_CACHE_SIZE = 1000


class DestinationChannel(Channel):
    """A L{Channel} that also takes STOMP destination names (see the module
    docstring): what the STOMP session and the HTTP API open.

    @ivar temp_queues: temp-queue name -> its queue.
    @ivar session: whether the channel is a session's, which may name
        L{SESSION_KINDS} destinations (False: the HTTP API's).
    """

    def __init__(self, *args: Any, session: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session = session
        self.temp_queues: dict[str, Queue] = {}
        self._targets: dict[str, SendTarget] = {}

    def forget_targets(self) -> None:
        self._targets.clear()

    def _closed(self) -> None:
        self.temp_queues.clear()
        super()._closed()

    # -- sending -------------------------------------------------------------

    def send_target(self, text: str) -> SendTarget:
        """Resolve a destination to publish to with L{Channel.publish_target}
        (cached until its object is deleted).

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
                queue = self.named_queue(name, "write", checked=True)
            elif name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                check_queue_access(self.owner_name, name, "write")
            return (queue, None, "", name, queue)
        dest = parse_destination(text)
        kind = dest.kind
        if kind in SESSION_KINDS and not self.session:
            raise session_only(text)
        if kind == "temp-queue":
            queue = self.temp_queue(dest.name)
            return (queue, None, "", queue.name, queue)
        if kind == "control":
            check_destination(text)
            return (None, None, None, dest.name, None)
        if dest.name not in self.vhost.exchanges:
            check_exchange(dest.name)
        # The core's verdict: no such exchange, or an internal one.
        exchange = self.publishable_exchange(dest.name)
        check_routing_key(dest.key, exchange)
        if self.user is not None:
            self._authorize("write", exchange.name, text)
        return (None, exchange, exchange.name, dest.key, exchange)

    def temp_queue(self, name: str) -> Queue:
        """This channel's private reply queue C{name} (made on first use:
        that needs the configure permission on its queue's name, as
        RabbitMQ's C{amq.gen-} reply queues do), exclusive to its connection."""
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
                exclusive_owner=self.connection,
            )
            self.connection.owns(queue)
            self.temp_queues[name] = queue
        return queue

    # -- subscribing ---------------------------------------------------------

    def subscribe(
        self,
        consumer: Consumer,
        text: str,
        durable_name: str | None = None,
        live: bool = True,
        label: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Attach C{consumer} to the destination C{text} (L{Channel.consume}):

          - C{/queue/NAME} (made on first use, with C{arguments}: over the
            virtual host's defaults; a queue that exists must already have
            them, else L{PreconditionFailed}), C{/temp-queue/NAME}: a queue
            consumer on it.
          - C{/topic/KEY}, C{/exchange/NAME/KEY}: a consumer on the
            exchange with KEY as its binding pattern, durable with
            C{durable_name}, live or on a private queue named after
            C{label} (see L{Channel.consume}).

        @raise DestinationError, NotFound, AccessRefused, PreconditionFailed.
        """
        dest = parse_destination(text)
        kind = dest.kind
        if kind in SESSION_KINDS and not self.session:
            raise session_only(text)
        consumer.channel = self
        if kind == "control":
            raise DestinationError(
                "Control destinations answer a SEND with a receipt; they cannot be "
                "subscribed to.",
                "cannot subscribe to a control destination",
            )
        if kind == "queue":
            self._check_buffer(consumer, True)
            if self.user is not None:
                self._authorize("read", dest.name, text)
                if dest.name not in self.vhost.queues:
                    self._authorize("configure", dest.name, text)
            self._attach(consumer, self.named_queue(dest.name, arguments=arguments), False)
        elif kind == "temp-queue":
            self._check_buffer(consumer, True)
            self._attach(consumer, self.temp_queue(dest.name), False)
        else:
            self._check_buffer(consumer, durable_name is not None)
            self._consume_exchange(
                consumer, dest.name, dest.key, durable_name, live, label, arguments, text
            )

    # -- control destinations ------------------------------------------------

    def _counted_on_home(self, queue: Queue, header: str, fact: str) -> Deferred:
        """A count of C{queue}, a stand-in, as its home says: a Deferred of
        the RECEIPT headers (0 for a queue the home does not have either,
        as for one here)."""

        def counted(facts: Any) -> list[tuple[str, str]]:
            value = facts.get(fact) if isinstance(facts, dict) else None
            return [(header, str(value if isinstance(value, int) and value >= 0 else 0))]

        def missing(failure: Any) -> Any:
            failure.trap(NotFound)
            if failure.check(Unavailable):
                return failure
            return [(header, "0")]

        return self.vhost.home_facts(queue).addCallbacks(counted, missing)  # type: ignore[no-any-return]

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
        for prefix, header, fact in (("count-msgs/queue/", "num-messages", "messages_ready"),
                                     ("count-subscribers/queue/", "num-subscribers", "consumers")):
            if path.startswith(prefix):
                name = path[len(prefix):]
                if name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                    check_queue_access(self.owner_name, name, "read")
                queue = vhost.queues.get(name)
                if queue is None:
                    queue = vhost.stand_in(name)  # homed on another node, not named here yet
                if queue is None:
                    return [(header, "0")]
                if queue.remote is not None:
                    return self._counted_on_home(queue, header, fact)  # counted on its home
                return [(header, str(len(queue) if fact == "messages_ready" else len(queue.consumers)))]
        if path.startswith("count-subscribers/topic/"):
            targets = vhost.route("amq.topic", path[24:], None)
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


__all__ = [
    "PREFIXES",
    "Destination",
    "DestinationChannel",
    "DestinationError",
    "destination_of",
    "parse_destination",
]
