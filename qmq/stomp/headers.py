# -*- test-case-name: tests.test_stomp_headers -*-
"""Reading STOMP header values: numbers, booleans, heart-beats.

The frame codec (L{qmq.stomp.frame}) hands the session every header value as
text; what a value means is the session's business, and every numeric or
boolean header it reads goes through one of the functions here, so that each
is read the same strict way:

    - L{parse_int}: ASCII digits only, at most 19 of them, within bounds.
      Python's C{int()} is too lenient for a wire format: it takes a sign,
      surrounding whitespace, C{_} separators and any Unicode digit
      (C{int("\\u0661\\u0662") == 12}), and a 400-digit value costs a
      conversion and later overflows wherever the number is used (a timer,
      a C{struct}).  The length is checked before any conversion.
    - L{parse_bool}: C{true} or C{false} in any case, as RabbitMQ reads them
      (C{requeue:False} must not silently mean C{True}); anything else is an
      error rather than a guess.
    - L{parse_heartbeat}: C{cx,cy}, two bounded L{parse_int} values.
    - L{parse_seconds}: a decimal number of seconds (C{"10"}, C{"1.5"},
      C{"10."} as OCaml prints floats), ASCII digits and at most one dot.

A bad value raises L{HeaderError}, whose C{message} and C{detail} fit an
ERROR frame's C{message} header and body; the detail quotes the value
through L{excerpt}, so it is short and holds no control character.
"""

from __future__ import annotations

from qmq.stomp.frame import excerpt

__all__ = ["HeaderError", "parse_bool", "parse_heartbeat", "parse_int", "parse_seconds"]

# Longest digit string converted: enough for any 64-bit value, with room for
# leading zeros; anything longer is refused before int() sees it.
_MAX_DIGITS = 19


class HeaderError(Exception):
    """
    A header value the session cannot accept.  The session answers it with
    an ERROR frame.

    @ivar message: a short description naming the header, for the ERROR
        frame's C{message} header.
    @ivar detail: a sentence saying what was expected, with an L{excerpt}
        of the value, for the ERROR frame's body.
    """

    def __init__(self, message: str, detail: str) -> None:
        """
        @param message: see L{message}.
        @param detail: see L{detail}.
        """
        super().__init__(message, detail)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message}: {self.detail}"


def parse_int(value: str, name: str, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
    """
    Read a header value as a non-negative whole number.

    @param value: the header value.
    @param name: the header's name, for the error.
    @param minimum: the smallest value accepted (0 or more: no sign is read).
    @param maximum: the largest value accepted.
    @return: the number.
    @raise HeaderError: C{"invalid NAME header"}, if C{value} is not 1 to 19
        ASCII digits (no sign, space, C{_}, C{0x} prefix or other digits),
        or is outside C{[minimum, maximum]}; the detail gives the bounds.
    """
    if not (len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit()):
        raise HeaderError(
            f"invalid {excerpt(name, 32)} header",
            f"The {excerpt(name, 32)} header must be a whole number from {minimum} to"
            f" {maximum}, in ASCII digits, not '{excerpt(value)}'.",
        )
    number = int(value)
    if not minimum <= number <= maximum:
        raise HeaderError(
            f"invalid {excerpt(name, 32)} header",
            f"The {excerpt(name, 32)} header must be from {minimum} to {maximum}, not {number}.",
        )
    return number


def parse_bool(value: str, name: str) -> bool:
    """
    Read a header value as a boolean.

    @param value: the header value.
    @param name: the header's name, for the error.
    @return: C{True} for C{true}, C{False} for C{false}, in any case.
    @raise HeaderError: C{"invalid NAME header"}, for any other value.
    """
    if value == "true":
        return True
    if value == "false":
        return False
    if value.isascii():  # no non-ASCII letter that lower() maps to ASCII
        lowered = value.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
    raise HeaderError(
        f"invalid {excerpt(name, 32)} header",
        f"The {excerpt(name, 32)} header must be true or false, not '{excerpt(value)}'.",
    )


def parse_heartbeat(value: str, maximum_ms: int = 24 * 3600 * 1000) -> tuple[int, int]:
    """
    Read a C{heart-beat} header: C{cx,cy} in milliseconds.

    @param value: the header value.
    @param maximum_ms: the largest C{cx} or C{cy} accepted (a day by
        default: the session multiplies and schedules them).
    @return: C{(cx, cy)}.
    @raise HeaderError: C{"invalid heart-beat header"}, unless C{value} is
        two L{parse_int} values within C{[0, maximum_ms]} separated by one
        comma (no spaces).
    """
    cx, comma, cy = value.partition(",")
    if comma:
        try:
            return (
                parse_int(cx, "heart-beat", 0, maximum_ms),
                parse_int(cy, "heart-beat", 0, maximum_ms),
            )
        except HeaderError:
            pass  # the error below says what both numbers must be
    raise HeaderError(
        "invalid heart-beat header",
        "The heart-beat header must be two whole numbers of milliseconds from 0 to"
        f" {maximum_ms}, as cx,cy, not '{excerpt(value)}'.",
    )


def parse_seconds(value: str, name: str, maximum: float = 2**31) -> float:
    """
    Read a header value as a positive decimal number of seconds.

    @param value: the header value: digits with at most one C{.} (C{"30"},
        C{"0.5"}, C{"10."}), at most 19 characters; no sign, exponent or
        space.
    @param name: the header's name, for the error.
    @param maximum: the largest value accepted.
    @return: the number of seconds, above 0.
    @raise HeaderError: C{"invalid NAME header"} for anything else, 0, or
        a value above C{maximum}.
    """
    whole, dot, fraction = value.partition(".")
    digits = whole + fraction
    if (
        len(value) <= _MAX_DIGITS
        and digits
        and digits.isascii()
        and digits.isdigit()
        and (whole or fraction)
    ):
        seconds = float(value if whole else "0" + value)
        if 0 < seconds <= maximum:
            return seconds
    raise HeaderError(
        f"invalid {excerpt(name, 32)} header",
        f"The {excerpt(name, 32)} header must be a number of seconds above 0 and at most"
        f" {maximum:g}, such as 30 or 1.5, not '{excerpt(value)}'.",
    )
