# -*- test-case-name: tests.test_core_names -*-
"""What a valid name or key is: one rule for every frontend.

Every name a client gives the broker ends up somewhere another client reads
it: a queue name in a STOMP C{destination} header, a routing key in a
MESSAGE frame, an application header in both. A NUL there ends a STOMP
frame early (a client that reads up to the NUL sees a destination and a
frame the publisher forged), and a CR or LF ends a header line. So the core
refuses such names once, where every frontend passes (the virtual host's
declarations and bindings, the channel's send targets and publishes), and
each frontend only maps the refusal (L{InvalidName}) to its own error: a
STOMP ERROR frame, an HTTP 400 problem document (code C{invalid-name}).

The rules, for virtual host, queue and exchange names, routing and binding
keys, destinations and application header names:

  - no control character: nothing from U+0000 to U+001F, nor U+007F (DEL);
  - valid Unicode: no lone surrogate (a JSON C{"\\ud800"}), which could not
    be written as UTF-8 on any wire or disk;
  - at most L{MAX_NAME_BYTES} bytes in UTF-8 (AMQP 0-9-1's short string;
    a destination, made of a prefix, a name and a key, is checked part by
    part; a topic exchange's keys are bounded by its own configurable
    C{limits.max_routing_key_length} instead);
  - an exchange name holds no C{/}: STOMP names exchanges as
    C{/exchange/NAME/KEY}, which would split such a name at its first slash.

Header I{values} may be long and may hold a TAB, CR or LF (STOMP escapes the
last two); any other control character is refused, as STOMP's own parser
refuses it.

Each refusal names the rule and the character, e.g. C{"queue name contains
a control character (U+0000)"}. L{problem} says the same without raising,
for recovery: a durable queue whose name was accepted by an older version
stays reachable, and the broker logs a warning instead of refusing to start.

The checks are cheap, and cheaper where they are repeated: send targets are
checked when a channel resolves a destination (it caches the resolution),
header names once per distinct headers dict (a producer's messages share
one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from qmq.core.errors import PreconditionFailed

#: Most bytes (UTF-8) in a name or key: AMQP 0-9-1's short string.
MAX_NAME_BYTES = 255

# Control characters no name holds: C0 and DEL.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
# In header values TAB, LF and CR are allowed (STOMP escapes LF and CR).
_VALUE_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidName(PreconditionFailed):
    """A name or key breaks a rule of L{qmq.core.names}; the message names it.

    A L{PreconditionFailed} (AMQP's 406), so callers that caught a name
    that was too long still catch it; frontends map it first (HTTP: 400
    C{invalid-name}, not the 409 of other preconditions).
    """

    def __init__(self, message: str, short: str = "invalid name") -> None:
        super().__init__(message, short)


def _character(found: str) -> str:
    return f"U+{ord(found):04X}"


def problem(kind: str, text: str, slash: bool = False, limit: int = MAX_NAME_BYTES) -> str | None:
    """What is wrong with C{text} as a C{kind} (C{"queue name"}, ...), or None.

    @param slash: refuse a C{/} too (exchange names).
    @param limit: most UTF-8 bytes (0: no limit).
    """
    if text.isascii():
        size = len(text)
        if text.isprintable() and not (slash and "/" in text):
            return f"{kind} is {size} bytes long; the limit is {limit}" if limit and size > limit else None
    else:
        found = _SURROGATE.search(text)
        if found is not None:
            return f"{kind} is not valid Unicode (a lone surrogate, {_character(found.group())})"
        size = len(text.encode())
    found = _CONTROL.search(text)
    if found is not None:
        return f"{kind} contains a control character ({_character(found.group())})"
    if slash and "/" in text:
        return (
            f"{kind} contains '/': STOMP names an exchange as /exchange/NAME/KEY, "
            "which would split the name at its slash"
        )
    if limit and size > limit:
        return f"{kind} is {size} bytes long in UTF-8; the limit is {limit}"
    return None


def check(kind: str, text: str, slash: bool = False) -> str:
    """Return C{text} if it is a valid C{kind}. @raise InvalidName: it is not."""
    reason = problem(kind, text, slash)
    if reason is not None:
        raise InvalidName(reason)
    return text


def check_vhost(name: str) -> str:
    """@raise InvalidName: C{name} is not a valid virtual host name."""
    return check("virtual host name", name)


def check_queue(name: str) -> str:
    """@raise InvalidName: C{name} is not a valid queue name."""
    # The common case (printable ASCII within the limit) without the two
    # calls of check() and problem(): every queue made on demand comes here.
    if name.isascii() and name.isprintable() and len(name) <= MAX_NAME_BYTES:
        return name
    return check("queue name", name)


def check_exchange(name: str) -> str:
    """@raise InvalidName: C{name} is not a valid exchange name."""
    return check("exchange name", name, slash=True)


def _key(kind: str, key: str, exchange: object) -> str:
    # A topic exchange bounds its keys itself (limits.max_routing_key_length,
    # which may be raised past 255, and names the setting when refusing).
    limit = 0 if hasattr(exchange, "max_key_length") else MAX_NAME_BYTES
    reason = problem(kind, key, limit=limit)
    if reason is not None:
        raise InvalidName(reason)
    return key


def check_routing_key(key: str, exchange: object = None) -> str:
    """@param exchange: the exchange it is for (a topic exchange bounds
        the length itself). @raise InvalidName: C{key} is not a valid
        routing key."""
    return _key("routing key", key, exchange)


def check_binding_key(key: str, exchange: object = None) -> str:
    """@param exchange: the exchange it is for (a topic exchange bounds
        the length itself). @raise InvalidName: C{key} is not a valid
        binding key (pattern)."""
    return _key("binding key", key, exchange)


def check_destination(text: str) -> str:
    """A destination as a whole: no control character, valid Unicode (its
    parts' lengths are checked as names and keys).

    @raise InvalidName: C{text} breaks one.
    """
    reason = problem("destination", text, limit=0)
    if reason is not None:
        raise InvalidName(reason)
    return text


def check_headers(headers: Mapping[str, Any]) -> None:
    """Application headers: each name a valid name, each string value free
    of control characters but TAB, CR and LF, and valid Unicode (typed
    values that are not strings carry no text to check).

    @raise InvalidName: naming the header.
    """
    # The common case in two C-level passes: every name, then every value,
    # joined (printable ASCII has nothing to refuse).
    names = "".join(headers)
    if not (
        names.isascii()
        and names.isprintable()
        and (len(names) <= MAX_NAME_BYTES or max(map(len, headers)) <= MAX_NAME_BYTES)
    ):
        for name in headers:
            reason = problem("header name", name)
            if reason is not None:
                raise InvalidName(f"{reason}: {name[:40]!r}")
    try:
        values = "".join(headers.values())
    except TypeError:
        # Typed values (qmq.core.message): numbers, booleans, None and bytes
        # carry no text to check; only the strings among them are.
        values = None
    if values is not None and values.isascii() and values.isprintable():
        return
    for name, value in headers.items():
        if value.__class__ is not str:
            continue
        found = _VALUE_CONTROL.search(value) or _SURROGATE.search(value)
        if found is not None:
            what = "a lone surrogate" if found.group() >= "\ud800" else "a control character"
            raise InvalidName(
                f"header {name[:40]!r} has a value with {what} ({_character(found.group())})"
            )


__all__ = [
    "MAX_NAME_BYTES",
    "InvalidName",
    "check",
    "check_binding_key",
    "check_destination",
    "check_exchange",
    "check_headers",
    "check_queue",
    "check_routing_key",
    "check_vhost",
    "problem",
]
