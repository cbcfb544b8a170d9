# -*- test-case-name: tests.test_core_options -*-
"""Delivery options: how long a message lives, when it may first be
delivered, how it ranks, how long a consumer may hold it. One parser, one
set of bounds, for every frontend.

A publisher names these options in its protocol's spelling (a STOMP SEND's
C{ttl:60000} header, an HTTP message's C{"ttl": 60000} field, later an AMQP
property); the frontend hands the values to L{read} (or, on its hot path,
to the one piece it needs: L{read_priority}, L{read_expiry}) and sets what
comes back on the message. Nothing here knows a protocol: a value is a
whole number (or, for the ack timeout, a number of seconds) given either
as a Python number (decoded JSON or Avro) or as text (a STOMP header),
and text is read strictly (ASCII digits, at most 19 of them: no sign,
space, C{_} or other digits, which Python's C{int()} would take).

The options, with the names L{OptionError} gives them::

    priority      0 (the default, lowest) to 9
    expires       when the message expires, epoch milliseconds; 0 never
    ttl           milliseconds from the publish until it expires
    delay         milliseconds from the publish before its first delivery
    deliver-at    epoch milliseconds before which it is not delivered
    ack-timeout   seconds a consumer may hold it unacknowledged

A frontend whose publishers repeat the same options (a STOMP producer
sends the same header block with every message) may read them once with
L{parse}, keep the L{DeliveryOptions} it gets (keyed on exactly the text it
read), and apply it to each message with L{DeliveryOptions.at}: the values
are checked once, the times are still made per message, from its own
publish time. L{read} is the two steps at once.

Times are measured from the publish (the C{now} the frontend passes: the
time the core stamps on the message), whatever else the message asks
for: a message with C{delay} 10 s and C{ttl} 5 s expires before its
first delivery. With both C{expires} and C{ttl} the earlier time wins;
with both C{delay} and C{deliver-at}, the later.

A delivery time is kept by the core (the queue holds the message out of
sight until then, L{qmq.core.queue.Queue.publish}) and by every store, so a
delayed message survives a restart whichever frontend published it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DeliveryOptions",
    "MAX_ACK_TIMEOUT",
    "MAX_EPOCH_MS",
    "MAX_PRIORITY",
    "MAX_SPAN_MS",
    "OPTION_NAMES",
    "PRIORITIES",
    "OptionError",
    "parse",
    "read",
    "read_ack_timeout",
    "read_delivery_time",
    "read_expiry",
    "read_priority",
]

#: The highest priority (0 is the lowest and the default).
MAX_PRIORITY = 9
#: The latest time an option may name, in epoch milliseconds (year 6429).
MAX_EPOCH_MS = 1 << 47
#: The longest span (C{ttl}, C{delay}) in milliseconds (about 34 years).
MAX_SPAN_MS = 1 << 40
#: The longest ack timeout, in seconds (the same span).
MAX_ACK_TIMEOUT = MAX_SPAN_MS / 1000.0
#: The options' names, as L{OptionError} names them.
OPTION_NAMES = ("priority", "expires", "ttl", "delay", "deliver-at", "ack-timeout")

#: The priorities as text: a frontend reading text looks one up instead of
#: parsing it (the common SEND with a priority costs a dict lookup).
PRIORITIES = {str(i): i for i in range(MAX_PRIORITY + 1)}

# Longest digit string converted: any 64-bit value with leading zeros.
_MAX_DIGITS = 19
# Spans and epoch times already read from text: a producer repeats the
# same value, so a lookup replaces the parse (STOMP's hot path). Bounded:
# cleared when full.
_SPANS: dict[str, int] = {}
_EPOCHS: dict[str, int] = {}
_MEMO_MAX = 1024


class OptionError(ValueError):
    """A delivery option the core cannot accept.

    @ivar option: the option's name (one of L{OPTION_NAMES}).
    @ivar value: the value given (text or number).
    @ivar expected: what was expected, a phrase such as C{"a whole number
        from 0 to 9"}.
    """

    def __init__(self, option: str, value: Any, expected: str) -> None:
        super().__init__(option, value, expected)
        self.option = option
        self.value = value
        self.expected = expected

    def describe(self, name: str | None = None) -> str:
        """A sentence for the publisher, naming the option C{name} (its
        frontend's spelling; by default L{option})."""
        value = self.value
        if value.__class__ is str:
            shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
            shown = "".join(c if c.isprintable() else "?" for c in shown)
        else:
            shown = repr(value)[:40]
        return f"{name or self.option} must be {self.expected}, not {shown}"

    def __str__(self) -> str:
        return self.describe()


def _whole(value: Any, option: str, low: int, high: int) -> int:
    """C{value} (an int, or text of ASCII digits) as a whole number in
    C{[low, high]}."""
    cls = value.__class__
    if cls is int:
        number = value
    elif cls is str and len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit():
        number = int(value)
    else:
        raise OptionError(option, value, f"a whole number from {low} to {high}")
    if not low <= number <= high:
        raise OptionError(option, value, f"a whole number from {low} to {high}")
    return number  # type: ignore[no-any-return]


def _memo(memo: dict[str, int], value: Any, option: str, high: int) -> int:
    """C{value} read by L{_whole} (from 0 to C{high}), and remembered in
    C{memo} when it is text."""
    ms = _whole(value, option, 0, high)
    if value.__class__ is str:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[value] = ms
    return ms


def read_priority(value: Any) -> int:
    """A priority, 0 to L{MAX_PRIORITY}.

    @param value: an int or its text.
    @raise OptionError: anything else.
    """
    found = PRIORITIES.get(value) if value.__class__ is str else None
    if found is not None:
        return found
    return _whole(value, "priority", 0, MAX_PRIORITY)


def _epoch(expires: Any) -> float:
    """An C{expires} option (epoch milliseconds) in epoch seconds."""
    # Text seen before: a lookup (anything else is read, and may be
    # unhashable).
    ms = _EPOCHS.get(expires) if expires.__class__ is str else None
    if ms is None:
        ms = _memo(_EPOCHS, expires, "expires", MAX_EPOCH_MS)
    return ms / 1000.0


def read_expiry(now: float, expires: Any = None, ttl: Any = None) -> float:
    """When a message published at C{now} expires, in epoch seconds (0.0:
    never).

    @param expires: epoch milliseconds (0: never), or None.
    @param ttl: milliseconds from C{now}, or None.
    @raise OptionError: a value is malformed or out of bounds.
    """
    at = 0.0
    if expires is not None:
        at = _epoch(expires)
    if ttl is not None:
        ms = _SPANS.get(ttl) if ttl.__class__ is str else None
        if ms is None:
            ms = _memo(_SPANS, ttl, "ttl", MAX_SPAN_MS)
        by_ttl = now + ms / 1000.0
        if not at or by_ttl < at:
            at = by_ttl
    return at


def read_delivery_time(now: float, delay: Any = None, deliver_at: Any = None) -> float:
    """When a message published at C{now} may first be delivered, in epoch
    seconds (0.0: at once, also for a time already past).

    @param delay: milliseconds from C{now}, or None.
    @param deliver_at: epoch milliseconds, or None.
    @raise OptionError: a value is malformed or out of bounds.
    """
    at = 0.0
    if deliver_at is not None:
        at = _whole(deliver_at, "deliver-at", 0, MAX_EPOCH_MS) / 1000.0
    if delay is not None:
        ms = _SPANS.get(delay) if delay.__class__ is str else None
        if ms is None:
            ms = _memo(_SPANS, delay, "delay", MAX_SPAN_MS)
        at = max(at, now + ms / 1000.0)
    return at if at > now else 0.0


def read_ack_timeout(value: Any) -> float:
    """An ack timeout in seconds, above 0 and at most L{MAX_ACK_TIMEOUT}.

    @param value: an int or float, or its text: digits with at most one
        C{.} (C{"30"}, C{"1.5"}, C{"10."} as OCaml prints floats), at most 19
        characters.
    @raise OptionError: anything else.
    """
    cls = value.__class__
    seconds = -1.0
    if cls is int or cls is float:
        seconds = float(value)
    elif cls is str and len(value) <= _MAX_DIGITS:
        whole, _, fraction = value.partition(".")
        digits = whole + fraction
        if digits and digits.isascii() and digits.isdigit():
            seconds = float(value if whole else "0" + value)
    if not 0 < seconds <= MAX_ACK_TIMEOUT:  # also NaN
        raise OptionError(
            "ack-timeout", value, f"a number of seconds above 0 and at most {MAX_ACK_TIMEOUT:g}"
        )
    return seconds


class DeliveryOptions:
    """A message's delivery options as read by L{parse}: checked, but not
    yet made into times (those depend on the publish time, L{at}).

    Immutable: a frontend may keep one and apply it to every message that
    names the same options.

    @ivar priority: 0 to L{MAX_PRIORITY}.
    @ivar expires: the C{expires} option in epoch seconds, 0.0 if none.
    @ivar ttl: the C{ttl} option in seconds, or None.
    @ivar delay: the C{delay} option in seconds, or None.
    @ivar deliver_at: the C{deliver-at} option in epoch seconds, 0.0 if none.
    @ivar ack_timeout: seconds, 0.0 for the queue's rule.
    """

    __slots__ = ("priority", "expires", "ttl", "delay", "deliver_at", "ack_timeout", "_fixed")

    def __init__(
        self,
        priority: int = 0,
        expires: float = 0.0,
        ttl: float | None = None,
        delay: float | None = None,
        deliver_at: float = 0.0,
        ack_timeout: float = 0.0,
    ) -> None:
        self.priority = priority
        self.expires = expires
        self.ttl = ttl
        self.delay = delay
        self.deliver_at = deliver_at
        self.ack_timeout = ack_timeout
        # No option relative to the publish time (and none that a past
        # time turns off): the same answer for every publish.
        self._fixed = (
            (priority, expires, 0.0, ack_timeout)
            if ttl is None and delay is None and not deliver_at
            else None
        )

    def at(self, now: float) -> tuple[int, float, float, float]:
        """The options of a message published at C{now} (epoch seconds).

        @return: C{(priority, expires, deliver_at, ack_timeout)}, as L{read}.
        """
        fixed = self._fixed
        if fixed is not None:
            return fixed
        expires = self.expires
        ttl = self.ttl
        if ttl is not None:
            by_ttl = now + ttl
            if not expires or by_ttl < expires:
                expires = by_ttl
        deliver_at = self.deliver_at
        delay = self.delay
        if delay is not None:
            deliver_at = max(deliver_at, now + delay)
        return (
            self.priority,
            expires,
            deliver_at if deliver_at > now else 0.0,
            self.ack_timeout,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not DeliveryOptions:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__[:-1])

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__[:-1]))

    def __repr__(self) -> str:
        given = ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self.__slots__[:-1] if getattr(self, k) not in (0, 0.0, None)
        )
        return f"DeliveryOptions({given})"


def _span(value: Any, option: str) -> float:
    """A span option (C{ttl}, C{delay}) in seconds."""
    ms = _SPANS.get(value) if value.__class__ is str else None
    if ms is None:
        ms = _memo(_SPANS, value, option, MAX_SPAN_MS)
    return ms / 1000.0


def parse(
    priority: Any = None,
    expires: Any = None,
    ttl: Any = None,
    delay: Any = None,
    deliver_at: Any = None,
    ack_timeout: Any = None,
) -> DeliveryOptions:
    """Read a message's delivery options (each None when not given), with
    the same rules and bounds as L{read}, for L{DeliveryOptions.at}.

    @raise OptionError: a value is malformed or out of bounds (the first
        in the order of L{OPTION_NAMES}, C{deliver-at} before C{delay}).
    """
    level = 0 if priority is None else read_priority(priority)
    at = 0.0
    if expires is not None:
        at = _epoch(expires)
    span = None if ttl is None else _span(ttl, "ttl")
    first = 0.0 if deliver_at is None else _whole(deliver_at, "deliver-at", 0, MAX_EPOCH_MS) / 1000.0
    wait = None if delay is None else _span(delay, "delay")
    hold = 0.0 if ack_timeout is None else read_ack_timeout(ack_timeout)
    return DeliveryOptions(level, at, span, wait, first, hold)


def read(
    now: float,
    priority: Any = None,
    expires: Any = None,
    ttl: Any = None,
    delay: Any = None,
    deliver_at: Any = None,
    ack_timeout: Any = None,
) -> tuple[int, float, float, float]:
    """Every delivery option of a message published at C{now} (each None
    when not given): L{parse}, then L{DeliveryOptions.at}.

    @return: C{(priority, expires, deliver_at, ack_timeout)}: the priority,
        when it expires and when it may first be delivered (epoch seconds,
        0.0: never, at once), its ack timeout (seconds, 0.0: the queue's).
    @raise OptionError: a value is malformed or out of bounds.
    """
    return parse(priority, expires, ttl, delay, deliver_at, ack_timeout).at(now)
