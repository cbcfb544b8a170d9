"""The core's one delivery-options parser (L{qmq.core.options}): its values,
its bounds and its errors, the same whatever frontend spelled them."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.core import options
from qmq.core.options import MAX_EPOCH_MS, MAX_SPAN_MS, OptionError


class ReadTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        self.assertEqual(options.read(100.0), (0, 0.0, 0.0, 0.0))

    def test_text_and_numbers_read_alike(self) -> None:
        """STOMP gives text, JSON and Avro numbers: the same values."""
        as_text = options.read(100.0, "7", "200000", "5000", "1500", "101000", "2.5")
        as_numbers = options.read(100.0, 7, 200000, 5000, 1500, 101000, 2.5)
        self.assertEqual(as_text, as_numbers)
        self.assertEqual(as_text, (7, 105.0, 101.5, 2.5))

    def test_ttl_from_publish(self) -> None:
        """A TTL counts from the publish, not from a delayed delivery: a
        message held 10 s with a TTL of 5 s expires before it is due."""
        priority, expires, deliver_at, _ = options.read(1000.0, ttl=5000, delay=10000)
        self.assertEqual((expires, deliver_at), (1005.0, 1010.0))

    def test_earlier_expiry_and_later_delivery_win(self) -> None:
        self.assertEqual(options.read_expiry(10.0, 12000, 5000), 12.0)
        self.assertEqual(options.read_expiry(10.0, 20000, 5000), 15.0)
        self.assertEqual(options.read_expiry(10.0, 0, 5000), 15.0)  # expires 0: never
        self.assertEqual(options.read_delivery_time(10.0, 5000, 12000), 15.0)
        self.assertEqual(options.read_delivery_time(10.0, 1000, 12000), 12.0)

    def test_delivery_time_past_is_now(self) -> None:
        self.assertEqual(options.read_delivery_time(10.0, 0), 0.0)
        self.assertEqual(options.read_delivery_time(10.0, None, 5000), 0.0)

    def test_bounds(self) -> None:
        self.assertEqual(options.read(0.0, ttl=MAX_SPAN_MS)[1], MAX_SPAN_MS / 1000)
        self.assertEqual(options.read(0.0, expires=MAX_EPOCH_MS)[1], MAX_EPOCH_MS / 1000)
        for kw in (
            {"priority": 10},
            {"priority": -1},
            {"ttl": MAX_SPAN_MS + 1},
            {"delay": MAX_SPAN_MS + 1},
            {"expires": MAX_EPOCH_MS + 1},
            {"deliver_at": MAX_EPOCH_MS + 1},
            {"ack_timeout": 0},
            {"ack_timeout": options.MAX_ACK_TIMEOUT * 2},
        ):
            with self.subTest(**kw):
                self.assertRaises(OptionError, options.read, 0.0, **kw)

    def test_strict_text(self) -> None:
        """Text is ASCII digits only: no sign, space, separator or other
        digits, and at most 19 of them (checked before any conversion)."""
        for bad in ("-1", " 5", "5 ", "1_000", "+3", "\u0661", "0x10", "", "1" * 20, "1e3"):
            with self.subTest(bad=bad):
                self.assertRaises(OptionError, options.read, 0.0, ttl=bad)
        self.assertEqual(options.read_priority("0009"), 9)
        for bad in ("1.5.", "-1", "1e3", "nan", "inf", ".", ""):
            with self.subTest(ack_timeout=bad):
                self.assertRaises(OptionError, options.read_ack_timeout, bad)
        self.assertEqual(options.read_ack_timeout("10."), 10.0)
        self.assertEqual(options.read_ack_timeout(".5"), 0.5)

    def test_other_types_refused(self) -> None:
        """A boolean is not a number; neither is a float where a whole
        number is meant."""
        for bad in (True, 1.5, None, [1], {"a": 1}):
            with self.subTest(bad=bad):
                self.assertRaises(OptionError, options.read_priority, bad)
                for name in ("expires", "ttl", "delay", "deliver_at"):
                    if bad is not None:  # None: not given
                        self.assertRaises(OptionError, options.read, 0.0, **{name: bad})
        self.assertRaises(OptionError, options.read_ack_timeout, float("nan"))
        self.assertRaises(OptionError, options.read_ack_timeout, True)

    def test_error_names_the_option_and_quotes_safely(self) -> None:
        e = self.assertRaises(OptionError, options.read, 0.0, ttl="x\x00y" * 30)
        self.assertEqual(e.option, "ttl")
        text = e.describe("the 'ttl' field")
        self.assertTrue(text.startswith("the 'ttl' field must be a whole number from 0 to"), text)
        self.assertNotIn("\x00", text)
        self.assertLess(len(text), 160)
        e = self.assertRaises(OptionError, options.read, 0.0, delay=MAX_SPAN_MS + 1)
        self.assertEqual(e.option, "delay")
        self.assertIn(str(MAX_SPAN_MS + 1), str(e))


class ParseTests(SynchronousTestCase):
    """L{options.parse} once, L{options.DeliveryOptions.at} per message:
    what L{options.read} and its pieces give, at every publish time."""

    COMBINATIONS = [
        {},
        {"priority": "4"},
        {"expires": "12000"},
        {"expires": "0"},
        {"ttl": "5000"},
        {"expires": "12000", "ttl": "5000"},
        {"expires": "20000", "ttl": "5000"},
        {"delay": "5000"},
        {"deliver_at": "12000"},
        {"deliver_at": "12000", "delay": "1000"},
        {"deliver_at": "0"},
        {"delay": "0"},
        {"ack_timeout": "2.5"},
        {"priority": 9, "expires": 30000, "ttl": 4000, "delay": 2000, "deliver_at": 11000,
         "ack_timeout": 3},
    ]

    def test_at_is_read(self) -> None:
        for given in self.COMBINATIONS:
            parsed = options.parse(**given)
            for now in (0.0, 10.0, 11.5, 13.0, 40.0):
                self.assertEqual(parsed.at(now), options.read(now, **given), (given, now))
                self.assertEqual(
                    parsed.at(now)[1],
                    options.read_expiry(now, given.get("expires"), given.get("ttl"))
                    if "expires" in given or "ttl" in given else 0.0,
                )
                self.assertEqual(
                    parsed.at(now)[2],
                    options.read_delivery_time(now, given.get("delay"), given.get("deliver_at")),
                )

    def test_equal_and_hashable(self) -> None:
        self.assertEqual(options.parse("4", ttl="5000"), options.parse(4, ttl=5000))
        self.assertNotEqual(options.parse(ttl="5000"), options.parse(delay="5000"))
        self.assertEqual(len({options.parse("4"), options.parse(4)}), 1)
        self.assertEqual(repr(options.parse("4", ttl="5000")), "DeliveryOptions(priority=4, ttl=5.0)")

    def test_first_bad_option_named(self) -> None:
        """Errors name the first bad option in read's order."""
        with self.assertRaises(OptionError) as e:
            options.parse("10", "x", "x", "x", "x", "x")
        self.assertEqual(e.exception.option, "priority")
        with self.assertRaises(OptionError) as e:
            options.parse(None, None, None, "x", "x")
        self.assertEqual(e.exception.option, "deliver-at")
        with self.assertRaises(OptionError) as e:
            options.read(0.0, None, None, None, "x", "x")
        self.assertEqual(e.exception.option, "deliver-at")
