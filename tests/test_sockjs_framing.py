"""Tests for the SockJS framing (L{qmq.web.sockjs.framing}), without I/O."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from qmq.web.sockjs.framing import (
    TRANSPORTS,
    PayloadError,
    close_frame,
    decode_messages,
    encode_string,
    htmlfile_prelude,
    messages_frame,
    valid_callback,
)

# sockjs-protocol's escapable_by_server, from U+00FF up (as its suite checks).
_SERVER_ESCAPES = [
    c
    for c in map(chr, range(255, 65536))
    if "\u200c" <= c <= "\u200f" or "\u2028" <= c <= "\u202f" or "\u2060" <= c <= "\u206f"
    or "\ufff0" <= c
]


class FramesTests(SynchronousTestCase):
    def test_messages(self) -> None:
        self.assertEqual(messages_frame(["a", 'b"c']), 'a["a","b\\"c"]')
        self.assertEqual(messages_frame([]), "a[]")

    def test_close(self) -> None:
        self.assertEqual(close_frame(3000, "Go away!"), 'c[3000,"Go away!"]')
        self.assertEqual(close_frame(2010, "Another connection still open"),
                         'c[2010,"Another connection still open"]')

    def test_stomp_frame_nul_and_newlines_escaped(self) -> None:
        frame = messages_frame(["MESSAGE\ndestination:/queue/a\n\nhi\x00"])
        self.assertEqual(frame, 'a["MESSAGE\\ndestination:/queue/a\\n\\nhi\\u0000"]')

    def test_server_escapes_what_the_protocol_lists(self) -> None:
        """Every character of the suite's escapable_by_server comes out as
        C{\\uXXXX}; the string decodes back to itself."""
        text = "".join(_SERVER_ESCAPES)
        encoded = encode_string(text)
        expected = '"' + "".join(f"\\u{ord(c):04x}" for c in _SERVER_ESCAPES) + '"'
        self.assertEqual(encoded, expected)
        self.assertEqual(json.loads(encoded), text)

    def test_plain_unicode_verbatim(self) -> None:
        self.assertEqual(encode_string("h\u00e9llo \u4e16"), '"h\u00e9llo \u4e16"')

    def test_lone_surrogate_escaped(self) -> None:
        encoded = messages_frame(["\ud800x"])
        self.assertEqual(encoded, 'a["\\ud800x"]')
        encoded.encode("utf-8")  # is valid UTF-8

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.text(max_size=50), max_size=10))
    def test_round_trip(self, messages: list[str]) -> None:
        frame = messages_frame(messages)
        self.assertTrue(frame.startswith("a"))
        frame.encode("utf-8")
        self.assertEqual(json.loads(frame[1:]), messages)
        self.assertNotIn("\u2028", frame)


class PayloadTests(SynchronousTestCase):
    def test_array(self) -> None:
        self.assertEqual(decode_messages('["a","b"]'), ["a", "b"])
        self.assertEqual(decode_messages(b'["\\u2028"]'), ["\u2028"])

    def test_empty(self) -> None:
        e = self.assertRaises(PayloadError, decode_messages, b"")
        self.assertEqual(e.message, "Payload expected.")

    def test_broken(self) -> None:
        for payload in ('["a', "{}", "[1]", '"a"', b"\xff\xfe", "null"):
            e = self.assertRaises(PayloadError, decode_messages, payload)
            self.assertEqual(e.message, "Broken JSON encoding.")

    def test_single_string_for_websocket(self) -> None:
        self.assertEqual(decode_messages('"a"', single_allowed=True), ["a"])


class WrappingTests(SynchronousTestCase):
    def test_xhr(self) -> None:
        self.assertEqual(TRANSPORTS["xhr"].wrap("o", ""), b"o\n")
        self.assertEqual(TRANSPORTS["xhr_streaming"].prelude(""), b"h" * 2048 + b"\n")

    def test_eventsource(self) -> None:
        self.assertEqual(TRANSPORTS["eventsource"].wrap('a["x"]', ""), b'data: a["x"]\r\n\r\n')
        self.assertEqual(TRANSPORTS["eventsource"].prelude(""), b"\r\n")

    def test_htmlfile(self) -> None:
        self.assertEqual(TRANSPORTS["htmlfile"].wrap('a["x"]', "cb"),
                         b'<script>\np("a[\\"x\\"]");\n</script>\r\n')
        prelude = htmlfile_prelude("cb")
        self.assertGreater(len(prelude), 1024)
        self.assertIn(b"var c = parent.cb;", prelude)

    def test_jsonp(self) -> None:
        self.assertEqual(TRANSPORTS["jsonp"].wrap("o", "callback"), b'/**/callback("o");\r\n')

    def test_callback_names(self) -> None:
        for name in ("callback", "a.b_c", "_jp.a1[0]"):
            self.assertTrue(valid_callback(name), name)
        for name in ("", "a(b)", "alert(1);x", "a b", "</script>", "x" * 257):
            self.assertFalse(valid_callback(name), name)
