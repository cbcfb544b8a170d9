"""Tests for L{qmq.stomp.headers}: strict reading of header values."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from qmq.stomp.headers import HeaderError, parse_bool, parse_heartbeat, parse_int

# Values int() accepts (or chokes on) that a header must not.
HOSTILE_NUMBERS = [
    "",
    "\u0661\u0662",  # ARABIC-INDIC DIGITS ONE, TWO: int() reads 12
    "\uff15",  # FULLWIDTH DIGIT FIVE
    "\u00b2",  # SUPERSCRIPT TWO: isdigit() is True, int() fails
    "+5",
    "-5",
    " 5",
    "5 ",
    "\t5",
    "5\n",
    "5_000",
    "0x10",
    "1e3",
    "1.0",
    "five",
    "5\0",
    "9" * 20,
    "9" * 400,
]


class HeaderErrorTests(SynchronousTestCase):
    def test_attributes(self) -> None:
        error = HeaderError("invalid x header", "The x header must be ...")
        self.assertEqual(error.message, "invalid x header")
        self.assertEqual(error.detail, "The x header must be ...")
        self.assertEqual(str(error), "invalid x header: The x header must be ...")

    def test_not_a_value_error(self) -> None:
        """
        A bad header is the client's error, not a bug: it must not be
        caught as one.
        """
        self.assertFalse(issubclass(HeaderError, ValueError))


class ParseIntTests(SynchronousTestCase):
    def test_valid(self) -> None:
        self.assertEqual(parse_int("0", "n"), 0)
        self.assertEqual(parse_int("42", "n"), 42)
        self.assertEqual(parse_int("007", "n"), 7)
        self.assertEqual(parse_int("2147483647", "n"), 2**31 - 1)
        self.assertEqual(parse_int("0" * 18 + "1", "n"), 1)  # 19 characters

    def test_hostile(self) -> None:
        for value in HOSTILE_NUMBERS:
            with self.assertRaises(HeaderError, msg=repr(value)) as caught:
                parse_int(value, "prefetch-count")
            error = caught.exception
            self.assertEqual(error.message, "invalid prefetch-count header")
            self.assertIn("from 0 to 2147483647", error.detail)
            self.assertTrue(error.detail.isprintable(), repr(error.detail))
            self.assertLess(len(error.detail), 200)

    def test_bounds(self) -> None:
        self.assertEqual(parse_int("5", "n", 5, 5), 5)
        for value in ("4", "6", "0" * 18 + "6"):
            with self.assertRaises(HeaderError) as caught:
                parse_int(value, "priority", 5, 5)
            self.assertEqual(caught.exception.message, "invalid priority header")
            self.assertIn("from 5 to 5", caught.exception.detail)
        with self.assertRaises(HeaderError):
            parse_int("2147483648", "n")
        self.assertEqual(parse_int(str(2**40), "n", maximum=2**62), 2**40)

    def test_long_refused_before_conversion(self) -> None:
        """
        A value too long to be a bounded number is refused without
        converting it (int() of a long digit string is slow, and its result
        overflows where it is used).
        """
        value = "9" * 100_000
        start = time.perf_counter()
        for _ in range(100):
            with self.assertRaises(HeaderError):
                parse_int(value, "n")
        self.assertLess(time.perf_counter() - start, 0.5)

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=25))
    def test_only_ascii_digits(self, value: str) -> None:
        try:
            number = parse_int(value, "n", maximum=10**19)
        except HeaderError:
            self.assertFalse(value and len(value) <= 19 and set(value) <= set("0123456789"))
        else:
            self.assertTrue(set(value) <= set("0123456789"))
            self.assertEqual(str(number), value.lstrip("0") or "0")


class ParseBoolTests(SynchronousTestCase):
    def test_valid(self) -> None:
        for value in ("true", "True", "TRUE", "tRuE"):
            self.assertIs(parse_bool(value, "durable"), True)
        for value in ("false", "False", "FALSE", "fAlSe"):
            self.assertIs(parse_bool(value, "requeue"), False)

    def test_hostile(self) -> None:
        for value in ("", "1", "0", "yes", "no", "t", " true", "true ", "false\0", "tru\u0435"):
            with self.assertRaises(HeaderError, msg=repr(value)) as caught:
                parse_bool(value, "requeue")
            self.assertEqual(caught.exception.message, "invalid requeue header")
            self.assertIn("true or false", caught.exception.detail)
            self.assertTrue(caught.exception.detail.isprintable())


class ParseHeartbeatTests(SynchronousTestCase):
    def test_valid(self) -> None:
        self.assertEqual(parse_heartbeat("0,0"), (0, 0))
        self.assertEqual(parse_heartbeat("10000,4000"), (10000, 4000))
        self.assertEqual(parse_heartbeat("86400000,1"), (86_400_000, 1))
        self.assertEqual(parse_heartbeat("5,6", maximum_ms=6), (5, 6))

    def test_hostile(self) -> None:
        for value in (
            "",
            ",",
            "1",
            "1,",
            ",1",
            "1,2,3",
            "1, 2",
            " 1,2",
            "-1,0",
            "+1,0",
            "1;2",
            "\u0661,\u0662",
            "86400001,0",
            "0,86400001",
            "9" * 400 + ",0",
            "0," + "9" * 400,
        ):
            with self.assertRaises(HeaderError, msg=repr(value)) as caught:
                parse_heartbeat(value)
            error = caught.exception
            self.assertEqual(error.message, "invalid heart-beat header")
            self.assertIn("from 0 to 86400000, as cx,cy", error.detail)
            self.assertLess(len(error.detail), 200)
        with self.assertRaises(HeaderError):
            parse_heartbeat("5,7", maximum_ms=6)
