# -*- test-case-name: tests.test_core_delivery,tests.test_core_queue,tests.test_config -*-
"""Queue policies: what a queue may hold, for how long, and how it delivers.

A queue's settings come from the arguments it is declared with (RabbitMQ's
C{x-...} names) over defaults (the virtual host's C{queue_defaults}, a
frontend's bounded backlog). The flow, all of it cold (it runs when a queue
is declared, never per message):

  1. A frontend or the configuration hands the arguments to
     L{QueuePolicy.from_arguments} (L{qmq.core.queue.Queue} does it in its
     constructor). Each key is looked up in L{QUEUE_ARGUMENTS}, with or
     without its C{x-} prefix (L{argument_name}); a known argument's value is
     read by its parser, which raises L{PreconditionFailed} (or
     L{InvalidName}) naming the argument; unknown arguments mean nothing
     here, as in RabbitMQ.
  2. The changes are merged over the defaults into a frozen L{QueuePolicy}.
     Policies are shared: equal settings give the one object
     (L{QueuePolicy.shared}, L{QueuePolicy.merge}; a bounded cache), so a
     million queues declared alike hold one policy between them.
  3. The policy derives at construction the few values the hot paths read
     (C{bounded}, C{length_room}, C{bytes_room}, C{rejects}, C{ttl},
     C{ack_seconds}), so a publish tests one flag, never a None.

Every argument a queue understands is listed once, in L{QUEUE_ARGUMENTS}
(name, policy field, parser); configuration and every frontend fill
policies only through L{QueuePolicy.from_arguments}, so an argument added
there is accepted everywhere. What each setting does to a queue is told in
L{qmq.core.queue}.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from qmq.core.errors import PreconditionFailed
from qmq.core.names import InvalidName, problem
from qmq.core.options import MAX_PRIORITY

OVERFLOW_POLICIES = ("drop-head", "reject-publish")
#: The overflow of a subscriber's own queue when the subscriber stated a
#: buffer (L{qmq.core.consumer.SubscriberBuffer}): a publish that finds it
#: full cuts the subscriber off (L{qmq.core.consumer.Consumer.cut_off}) and
#: is lost to it alone. The core sets it; no argument names it.
CUT_CONSUMERS = "cut-consumers"
#: The commit log's fsync policies a queue may ask for (C{x-fsync}).
FSYNC_POLICIES = ("always", "interval", "never")


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """What a queue may hold, for how long, and how it delivers (see the
    module docstring and L{QUEUE_ARGUMENTS}).

    Policies are shared: build them with L{QueuePolicy.shared},
    L{QueuePolicy.from_arguments} or L{QueuePolicy.merge}, which return one
    object for equal settings.

    @ivar max_length: most ready messages (C{x-max-length}), or None.
    @ivar max_bytes: most body bytes of ready messages
        (C{x-max-length-bytes}), or None.
    @ivar overflow: what a full queue does with a publish (C{x-overflow}):
        C{"drop-head"} or C{"reject-publish"}.
    @ivar expires: milliseconds a queue may stay unused before it is
        reported expired (C{x-expires}), or None.
    @ivar delivery_limit: most times a message may be given back; past it the
        message is discarded or dead-lettered (C{x-delivery-limit}), or None.
    @ivar max_priority: the highest message priority the queue honours
        (C{x-max-priority}, 1 to 255 as in RabbitMQ, kept as at most 9:
        a message's priority is 0 to 9), or None for a plain FIFO queue.
    @ivar message_ttl: milliseconds a message may wait in the queue
        (C{x-message-ttl}), or None.
    @ivar ack_timeout: milliseconds a consumer may hold a message unacked
        before it is taken back and redelivered (C{x-ack-timeout}), or None.
    @ivar dead_letter_exchange: where discarded messages are republished
        (C{x-dead-letter-exchange}; C{""} is the default exchange), or None.
    @ivar dead_letter_routing_key: the routing key they get
        (C{x-dead-letter-routing-key}), or None to keep their own.
    @ivar redelivery_backoff: milliseconds a message given back waits before
        it is ready again, by delivery count (the last repeats), or None
        (C{x-redelivery-backoff}).
    @ivar guarantee: what the queue promises about each message
        (C{x-delivery-guarantee}, L{GUARANTEES}; see L{qmq.core.guarantee}).
    @ivar dedup_window: milliseconds an effectively-once queue remembers a
        publisher's dedup id (C{x-dedup-window}).
    @ivar dedup_max_ids: most dedup ids it remembers (C{x-dedup-max-ids}).
    @ivar retention: seconds the commit log keeps a persistent message after
        it was acked, for range scans (C{x-retention}), or None.
    @ivar fsync: the commit log's fsync policy for this queue's publishes
        (C{x-fsync}: C{"always"}, C{"interval"}, C{"never"}), or None for
        the virtual host's or the store's.
    @ivar home_node: in a mesh, the node the queue lives on (C{x-home-node};
        docs/cluster.rst), or None for the placement's hash.
    @ivar bounded: whether C{max_length} or C{max_bytes} is set (derived; the
        publish path reads this one flag).
    @ivar length_room: C{max_length}, or a number no queue reaches (derived:
        the publish path compares with it without a None test).
    @ivar bytes_room: C{max_bytes}, likewise.
    @ivar rejects: bounded with C{reject-publish}: a publish may be refused
        (derived: an atomic fan-out asks only such queues first).
    @ivar ttl: C{message_ttl} in seconds, or 0.0 (derived).
    @ivar ack_seconds: C{ack_timeout} in seconds, or 0.0 (derived).
    """

    max_length: int | None = None
    max_bytes: int | None = None
    overflow: str = "drop-head"
    expires: int | None = None
    delivery_limit: int | None = None
    max_priority: int | None = None
    message_ttl: int | None = None
    ack_timeout: int | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    redelivery_backoff: tuple[int, ...] | None = None
    guarantee: str = "at-least-once"
    dedup_window: int = 600_000
    dedup_max_ids: int = 10_000
    retention: int | None = None
    fsync: str | None = None
    home_node: str | None = None
    bounded: bool = field(init=False, repr=False, compare=False)
    length_room: int = field(init=False, repr=False, compare=False)
    bytes_room: int = field(init=False, repr=False, compare=False)
    rejects: bool = field(init=False, repr=False, compare=False)
    ttl: float = field(init=False, repr=False, compare=False)
    ack_seconds: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounded", self.max_length is not None or self.max_bytes is not None)
        never = 1 << 62
        object.__setattr__(self, "length_room", never if self.max_length is None else self.max_length)
        object.__setattr__(self, "bytes_room", never if self.max_bytes is None else self.max_bytes)
        object.__setattr__(self, "rejects", self.bounded and self.overflow == "reject-publish")
        ttl = self.message_ttl
        # A TTL of 0 still expires (a message not deliverable at once is
        # dropped): keep it above 0.0, which means "no TTL".
        object.__setattr__(self, "ttl", 0.0 if ttl is None else max(ttl / 1000.0, 1e-9))
        ack = self.ack_timeout
        object.__setattr__(self, "ack_seconds", 0.0 if ack is None else ack / 1000.0)

    @staticmethod
    def shared(**settings: Any) -> QueuePolicy:
        """The shared policy with these settings (field names, see the class)."""
        return DEFAULT_POLICY.merge(**settings) if settings else DEFAULT_POLICY

    def merge(self, **changes: Any) -> QueuePolicy:
        """The shared policy with C{changes} applied to this one."""
        p = replace(self, **changes)
        return _shared_policy(*[getattr(p, name) for name in _POLICY_FIELDS])

    @classmethod
    def from_arguments(
        cls, arguments: Mapping[str, Any] | None, defaults: QueuePolicy | None = None
    ) -> QueuePolicy:
        """The policy of a queue declared with C{arguments}.

        Arguments given override C{defaults} (the virtual host's defaults for
        queues created on demand, a frontend's bounded backlog); settings
        not given keep the default. Each argument may be spelled with or
        without its C{x-} prefix (L{argument_name}); arguments QMQ does not
        know are kept with the queue but mean nothing to it, as in
        RabbitMQ. C{x-delivery-limit} of -1 turns a default limit off, as in
        RabbitMQ 4.

        @raise PreconditionFailed: an argument has a bad value; the message
            names it.
        """
        base = defaults if defaults is not None else DEFAULT_POLICY
        if not arguments:
            return base
        changes: dict[str, Any] = {}
        for key, value in arguments.items():
            spec = QUEUE_ARGUMENTS.get(argument_name(key))
            if spec is not None and value is not None:
                changes[spec.field] = spec.parse(key, value)
        if changes.get("delivery_limit") == -1:
            changes["delivery_limit"] = None
        return base.merge(**changes) if changes else base


@dataclass(frozen=True)
class QueueArgument:
    """One queue argument: its name (RabbitMQ's spelling, C{x-...}), the
    L{QueuePolicy} field it sets, and how a value is read.

    Configuration (TOML queue declarations and C{queue_defaults}) and every
    frontend (STOMP SUBSCRIBE headers) fill queue arguments through
    L{QueuePolicy.from_arguments}, so an argument added to
    L{QUEUE_ARGUMENTS} is accepted everywhere at once.

    @ivar name: its name, e.g. C{x-max-priority}; C{max-priority} is
        accepted too (L{argument_name}).
    @ivar field: the L{QueuePolicy} field.
    @ivar parse: C{(spelling, value) -> setting}; raises
        L{PreconditionFailed} naming the argument.
    @ivar expected: what a value must be, in words (for documentation and
        errors).
    """

    name: str
    field: str
    parse: Callable[[str, object], Any]
    expected: str


_EXPECTED = {
    1: "a positive integer",
    0: "a non-negative integer",
    -1: "a non-negative integer, or -1 for no limit",
}


def _integer_argument(minimum: int, maximum: int | None = None) -> Callable[[str, object], int]:
    if maximum is not None:
        expected = f"an integer from {minimum} to {maximum}"
    else:
        expected = _EXPECTED[minimum]

    def parse(argument: str, value: object) -> int:
        return _integer(argument, value, minimum, maximum, expected)

    return parse


#: The largest C{x-max-priority} accepted (RabbitMQ's).
MAX_PRIORITY_ARGUMENT = 255


def _max_priority_argument(argument: str, value: object) -> int:
    # 1 to 255 as in RabbitMQ (kombu and Celery declare 10), but a message's
    # priority is 0 to 9 (qmq.core.options.MAX_PRIORITY): levels above 9
    # would never be used, and each costs the queue a FIFO.
    n = _integer(argument, value, 1, MAX_PRIORITY_ARGUMENT, f"an integer from 1 to {MAX_PRIORITY_ARGUMENT}")
    return n if n < MAX_PRIORITY else MAX_PRIORITY


def _string_argument(argument: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > 255:
        raise PreconditionFailed(f"{argument} must be a string of at most 255 characters, got {value!r}")
    return value


def _name_argument(kind: str, slash: bool = False) -> Any:
    """An argument that names an exchange or gives a routing key: a string
    that follows L{qmq.core.names} (its messages are published with it)."""

    def check(argument: str, value: object) -> str:
        value = _string_argument(argument, value)
        reason = problem(kind, value, slash)
        if reason is not None:
            raise InvalidName(f"{argument}: {reason}")
        return value

    return check


def _overflow_argument(argument: str, value: object) -> str:
    if value not in OVERFLOW_POLICIES:
        raise PreconditionFailed(
            f"{argument} must be one of {', '.join(OVERFLOW_POLICIES)}, got {value!r}"
        )
    return value  # type: ignore[return-value]


def _fsync_argument(argument: str, value: object) -> str:
    if value not in FSYNC_POLICIES:
        raise PreconditionFailed(
            f"{argument} must be one of {', '.join(FSYNC_POLICIES)}, got {value!r}"
        )
    return value  # type: ignore[return-value]


def _home_argument(argument: str, value: object) -> str:
    from qmq.core.ids import NODE_ID  # noqa: PLC0415

    if not isinstance(value, str) or not NODE_ID.match(value):
        raise PreconditionFailed(
            f"{argument} must be a node id (1 to 32 letters, digits, '_' or '-'), got {value!r}"
        )
    return value


def _retention_argument(argument: str, value: object) -> int | None:
    # Seconds; 0 is none.
    return _integer(argument, value, 0, MAX_TIME_MS // 1000, _EXPECTED[0]) or None


#: The longest time a queue argument may give, in milliseconds (about 35 years).
MAX_TIME_MS = 2**40

#: Most steps of a redelivery backoff schedule, and the longest step (a day).
MAX_BACKOFF_STEPS = 32
MAX_BACKOFF_MS = 86_400_000


def _backoff_argument(argument: str, value: object) -> tuple[int, ...] | None:
    # A TOML array of integers, or a header string "1000,5000,30000".
    items: list[object]
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")] if value.strip() else []
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    expected = (
        f"a list of 1 to {MAX_BACKOFF_STEPS} delays in milliseconds (0 to {MAX_BACKOFF_MS}), "
        'such as "1000,5000,30000"'
    )
    if not 1 <= len(items) <= MAX_BACKOFF_STEPS:
        raise PreconditionFailed(f"{argument} must be {expected}, got {value!r}")
    steps = tuple(_integer(argument, v, 0, MAX_BACKOFF_MS, expected) for v in items)
    return steps if any(steps) else None


#: What a queue may promise about each message (C{x-delivery-guarantee};
#: L{qmq.core.guarantee} says what each means).
GUARANTEES = ("at-most-once", "at-least-once", "effectively-once")

#: Most dedup ids one effectively-once queue may remember (C{x-dedup-max-ids}).
MAX_DEDUP_IDS = 1_000_000


def _guarantee_argument(argument: str, value: object) -> str:
    if value not in GUARANTEES:
        raise PreconditionFailed(f"{argument} must be one of {', '.join(GUARANTEES)}, got {value!r}")
    return value  # type: ignore[return-value]


#: Every queue argument QMQ understands, by name (see L{QueueArgument}).
QUEUE_ARGUMENTS: dict[str, QueueArgument] = {
    a.name: a
    for a in (
        QueueArgument("x-max-length", "max_length", _integer_argument(0), "an integer >= 0"),
        QueueArgument("x-max-length-bytes", "max_bytes", _integer_argument(0), "an integer >= 0"),
        QueueArgument(
            "x-overflow", "overflow", _overflow_argument, "one of " + ", ".join(OVERFLOW_POLICIES)
        ),
        QueueArgument("x-expires", "expires", _integer_argument(1), "an integer >= 1"),
        QueueArgument("x-delivery-limit", "delivery_limit", _integer_argument(-1), "an integer >= -1"),
        QueueArgument(
            "x-max-priority", "max_priority", _max_priority_argument,
            f"an integer from 1 to {MAX_PRIORITY_ARGUMENT} (above 9 counts as 9)"
        ),
        QueueArgument(
            "x-message-ttl", "message_ttl", _integer_argument(0, MAX_TIME_MS), "an integer >= 0"
        ),
        QueueArgument(
            "x-ack-timeout", "ack_timeout", _integer_argument(1, MAX_TIME_MS), "an integer >= 1"
        ),
        QueueArgument(
            "x-dead-letter-exchange",
            "dead_letter_exchange",
            _name_argument("exchange name", slash=True),
            "an exchange name",
        ),
        QueueArgument(
            "x-dead-letter-routing-key",
            "dead_letter_routing_key",
            _name_argument("routing key"),
            "a routing key",
        ),
        QueueArgument(
            "x-redelivery-backoff",
            "redelivery_backoff",
            _backoff_argument,
            "a list of delays in milliseconds",
        ),
        QueueArgument(
            "x-delivery-guarantee", "guarantee", _guarantee_argument, "one of " + ", ".join(GUARANTEES)
        ),
        QueueArgument(
            "x-dedup-window", "dedup_window", _integer_argument(1, MAX_TIME_MS), "an integer >= 1"
        ),
        QueueArgument(
            "x-dedup-max-ids",
            "dedup_max_ids",
            _integer_argument(1, MAX_DEDUP_IDS),
            f"an integer from 1 to {MAX_DEDUP_IDS}",
        ),
        QueueArgument("x-retention", "retention", _retention_argument, "an integer >= 0 (seconds)"),
        QueueArgument(
            "x-fsync", "fsync", _fsync_argument, "one of " + ", ".join(FSYNC_POLICIES)
        ),
        QueueArgument("x-home-node", "home_node", _home_argument, "a node id (docs/cluster.rst)"),
    )
}


def argument_name(key: str) -> str:
    """The name of queue argument C{key} as L{QUEUE_ARGUMENTS} knows it:
    C{max-priority} and C{x-max-priority} are the same argument. A key
    that names no argument is returned as it is."""
    if key in QUEUE_ARGUMENTS:
        return key
    prefixed = "x-" + key
    return prefixed if prefixed in QUEUE_ARGUMENTS else key


def _integer(
    argument: str,
    value: object,
    minimum: int,
    maximum: int | None = None,
    expected: str | None = None,
) -> int:
    # Arguments come as TOML values or as STOMP header strings: accept an
    # int or a string of one, never a bool (an int to Python) or a float.
    n = None
    if value.__class__ is int:
        n = value
    elif isinstance(value, str) and len(value) <= 19:
        try:
            n = int(value)
        except ValueError:
            pass
    if n is None or n < minimum or (maximum is not None and n > maximum):  # type: ignore[operator]
        what = expected or _EXPECTED[minimum]
        raise PreconditionFailed(f"{argument} must be {what}, got {value!r}")
    return n  # type: ignore[return-value]


_POLICY_FIELDS = tuple(f.name for f in fields(QueuePolicy) if f.init)


# Bounded: a client declaring queues with ever new limits makes at worst
# equal policies that are not the same object, never a leak.
@functools.lru_cache(maxsize=1024)
def _shared_policy(*settings: Any) -> QueuePolicy:
    return QueuePolicy(*settings)


#: The policy of a queue declared with no arguments and no defaults.
DEFAULT_POLICY = _shared_policy(*[f.default for f in fields(QueuePolicy) if f.init])
