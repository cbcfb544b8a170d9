"""Tests for L{qmq.stomp.frame}: the sans-I/O STOMP frame codec."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from qmq.stomp.frame import (
    HEARTBEAT,
    Frame,
    FrameError,
    StompParser,
    check_header_text,
    encode_frame,
    escape_header,
    excerpt,
)

MiB = 1024 * 1024


def feed_all(parser: StompParser, *chunks: bytes) -> list[Frame]:
    """
    Feed chunks in order.

    @return: all frames returned.
    """
    frames: list[Frame] = []
    for chunk in chunks:
        frames.extend(parser.feed(chunk))
    return frames


def parse(data: bytes, version: str = "1.2", **limits: int) -> list[Frame]:
    """
    Parse C{data} at once with a new parser.

    @return: the frames.
    """
    parser = StompParser(**limits)
    parser.version = version
    return parser.feed(data)


def parse_bytewise(data: bytes, version: str = "1.2", **limits: int) -> list[Frame]:
    """
    Parse C{data} one byte at a time with a new parser.

    @return: the frames.
    """
    parser = StompParser(**limits)
    parser.version = version
    return feed_all(parser, *(data[i : i + 1] for i in range(len(data))))


class FrameTests(SynchronousTestCase):
    """
    L{Frame} is a plain value.
    """

    def test_defaults(self) -> None:
        frame = Frame("SEND")
        self.assertEqual(frame.command, "SEND")
        self.assertEqual(frame.headers, {})
        self.assertEqual(frame.body, b"")
        self.assertIsNone(frame.raw)

    def test_slots(self) -> None:
        with self.assertRaises(AttributeError):
            Frame("SEND").extra = 1  # type: ignore[attr-defined]

    def test_equality(self) -> None:
        self.assertEqual(Frame("SEND", {"a": "b"}, b"x"), Frame("SEND", {"a": "b"}, b"x"))
        self.assertNotEqual(Frame("SEND", {"a": "b"}, b"x"), Frame("SEND", {"a": "c"}, b"x"))
        self.assertNotEqual(Frame("SEND", {}, b"x"), Frame("SEND", {}, b"y"))
        self.assertNotEqual(Frame("SEND"), Frame("MESSAGE"))
        self.assertNotEqual(Frame("SEND"), ("SEND", {}, b""))

    def test_repr(self) -> None:
        self.assertEqual(repr(Frame("SEND", {"a": "b"}, b"x")), "Frame('SEND', {'a': 'b'}, b'x')")

    def test_repr_long_body(self) -> None:
        """
        A long body is cut short in the repr, so a failing test on a big
        frame stays readable.
        """
        text = repr(Frame("SEND", {}, b"y" * 1000))
        self.assertIn("<1000 bytes>", text)
        self.assertLess(len(text), 200)


class FrameErrorTests(SynchronousTestCase):
    def test_attributes(self) -> None:
        error = FrameError("malformed header", "line 'x'")
        self.assertEqual(error.message, "malformed header")
        self.assertEqual(error.detail, "line 'x'")
        self.assertEqual(str(error), "malformed header: line 'x'")
        self.assertEqual(str(FrameError("short")), "short")
        self.assertEqual(FrameError("short").detail, "")


class EncodeTests(SynchronousTestCase):
    """
    L{encode_frame} and L{escape_header}.
    """

    def test_heartbeat(self) -> None:
        self.assertEqual(HEARTBEAT, b"\n")

    def test_bare(self) -> None:
        self.assertEqual(encode_frame("DISCONNECT"), b"DISCONNECT\n\n\0")
        self.assertEqual(encode_frame("DISCONNECT", {}), b"DISCONNECT\n\n\0")

    def test_headers_and_body(self) -> None:
        self.assertEqual(
            encode_frame("SEND", {"destination": "/queue/a", "x": "1"}, b"hi"),
            b"SEND\ndestination:/queue/a\nx:1\ncontent-length:2\n\nhi\0",
        )

    def test_body_without_headers(self) -> None:
        self.assertEqual(encode_frame("SEND", None, b"a\0b"), b"SEND\ncontent-length:3\n\na\0b\0")

    def test_empty_body_no_content_length(self) -> None:
        self.assertEqual(
            encode_frame("RECEIPT", {"receipt-id": "7"}), b"RECEIPT\nreceipt-id:7\n\n\0"
        )

    def test_content_length_kept(self) -> None:
        """
        A content-length already in the headers is not added again.
        """
        self.assertEqual(
            encode_frame("SEND", {"content-length": "2"}, b"hi"),
            b"SEND\ncontent-length:2\n\nhi\0",
        )
        self.assertEqual(
            encode_frame("SEND", [("a", "1"), ("content-length", "2")], b"hi"),
            b"SEND\na:1\ncontent-length:2\n\nhi\0",
        )

    def test_list_of_pairs(self) -> None:
        """
        Headers may be a list of pairs, kept in order, repeats included.
        """
        self.assertEqual(
            encode_frame("MESSAGE", [("b", "1"), ("a", "2"), ("b", "3")]),
            b"MESSAGE\nb:1\na:2\nb:3\n\n\0",
        )

    def test_unicode(self) -> None:
        self.assertEqual(
            encode_frame("SEND", {"n\u00e9": "\u2603"}),
            "SEND\nn\u00e9:\u2603\n\n\0".encode(),
        )

    def test_escape_header(self) -> None:
        value = "a\\b\nc:d\re"
        self.assertEqual(escape_header("a\\b:c\td", "1.0"), "a\\b:c\td")
        self.assertEqual(escape_header("a\\b\nc:d", "1.1"), "a\\\\b\\nc\\cd")
        self.assertEqual(escape_header(value, "1.2"), "a\\\\b\\nc\\cd\\re")
        self.assertEqual(escape_header("plain", "1.2"), "plain")

    def test_escape_unknown_version(self) -> None:
        """
        A version other than 1.0 and 1.1 follows the 1.2 rules.
        """
        self.assertEqual(escape_header("\r", "1.3"), "\\r")

    def test_escaping_per_version(self) -> None:
        self.assertEqual(encode_frame("SEND", {"k": "v:\\"}, version="1.0"), b"SEND\nk:v:\\\n\n\0")
        self.assertEqual(
            encode_frame("SEND", {"k:\n": "v\\"}, version="1.1"), b"SEND\nk\\c\\n:v\\\\\n\n\0"
        )
        self.assertEqual(
            encode_frame("SEND", {"k:\n": "v\\\r"}, version="1.2"),
            b"SEND\nk\\c\\n:v\\\\\\r\n\n\0",
        )

    def test_escaping_only_when_needed(self) -> None:
        """
        A colon in one value is escaped even though the others need nothing.
        """
        self.assertEqual(
            encode_frame("MESSAGE", {"a": "b", "message-id": "h:1"}),
            b"MESSAGE\na:b\nmessage-id:h\\c1\n\n\0",
        )

    def test_connect_not_escaped(self) -> None:
        """
        CONNECT and CONNECTED frames are never escaped.
        """
        for command in ("CONNECT", "CONNECTED"):
            self.assertEqual(
                encode_frame(command, {"passcode": "a:b\\c"}, version="1.2"),
                command.encode() + b"\npasscode:a:b\\c\n\n\0",
            )


class ParserTests(SynchronousTestCase):
    """
    L{StompParser} on well-formed input.
    """

    def test_default_version(self) -> None:
        self.assertEqual(StompParser().version, "1.0")

    def test_one_frame(self) -> None:
        self.assertEqual(
            parse(b"SEND\ndestination:/queue/a\n\nhello\0"),
            [Frame("SEND", {"destination": "/queue/a"}, b"hello")],
        )

    def test_no_headers_no_body(self) -> None:
        self.assertEqual(parse(b"DISCONNECT\n\n\0"), [Frame("DISCONNECT")])

    def test_many_frames_one_buffer(self) -> None:
        data = b"SEND\na:1\n\nx\0SEND\na:2\n\ny\0SEND\na:3\n\n\0"
        self.assertEqual(
            parse(data),
            [
                Frame("SEND", {"a": "1"}, b"x"),
                Frame("SEND", {"a": "2"}, b"y"),
                Frame("SEND", {"a": "3"}, b""),
            ],
        )

    def test_incomplete(self) -> None:
        """
        Nothing is returned until a frame is complete; then it is.
        """
        parser = StompParser()
        self.assertEqual(parser.feed(b"SEND\na:1\n"), [])
        self.assertEqual(parser.feed(b"\nbo"), [])
        self.assertEqual(parser.feed(b"dy"), [])
        self.assertEqual(parser.feed(b"\0SEN"), [Frame("SEND", {"a": "1"}, b"body")])
        self.assertEqual(parser.feed(b"D\n\n\0"), [Frame("SEND")])

    def test_pending_bytes(self) -> None:
        """
        The parser tells how many bytes of an unfinished frame it holds.
        """
        parser = StompParser()
        self.assertEqual(parser.pending_bytes, 0)
        parser.feed(b"\nSEND\na:1")
        self.assertEqual(parser.pending_bytes, 8)
        parser.feed(b"\n\n")
        self.assertEqual(parser.pending_bytes, 10)
        parser.feed(b"body")
        self.assertEqual(parser.pending_bytes, 14)
        parser.feed(b"\0SEND\ncontent-length:3\n\nab")
        self.assertEqual(parser.pending_bytes, 25)
        parser.feed(b"c\0\n")
        self.assertEqual(parser.pending_bytes, 0)

    def test_empty_feed(self) -> None:
        parser = StompParser()
        self.assertEqual(parser.feed(b""), [])
        parser.feed(b"SEND\n")
        self.assertEqual(parser.feed(b""), [])
        self.assertEqual(parser.feed(b"\n\0"), [Frame("SEND")])

    def test_bytearray_and_memoryview(self) -> None:
        parser = StompParser()
        self.assertEqual(parser.feed(bytearray(b"SEND\n\n")), [])
        self.assertEqual(parser.feed(memoryview(b"x\0")), [Frame("SEND", {}, b"x")])

    def test_heartbeats(self) -> None:
        """
        EOLs before, between and after frames are heart-beats, skipped.
        """
        data = b"\n\r\n\nSEND\n\n\0\n\r\n\r\nSEND\n\n\0\n\n"
        self.assertEqual(parse(data), [Frame("SEND"), Frame("SEND")])
        self.assertEqual(parse_bytewise(data), [Frame("SEND"), Frame("SEND")])
        self.assertEqual(parse(b"\n" * 100), [])

    def test_heartbeat_cr_split(self) -> None:
        """
        A CRLF heart-beat split between two reads is still a heart-beat.
        """
        parser = StompParser()
        self.assertEqual(parser.feed(b"SEND\n\n\0\r"), [Frame("SEND")])
        self.assertEqual(parser.feed(b"\nSEND\n\n\0"), [Frame("SEND")])

    def test_crlf_lines(self) -> None:
        """
        Lines may end in CRLF, in every version, mixed with LF.
        """
        for version in ("1.0", "1.1", "1.2"):
            self.assertEqual(
                parse(b"SEND\r\na:1\r\nb:2\r\n\r\nbody\0", version),
                [Frame("SEND", {"a": "1", "b": "2"}, b"body")],
            )
            self.assertEqual(
                parse(b"SEND\r\na:1\nb:2\r\n\nbody\0", version),
                [Frame("SEND", {"a": "1", "b": "2"}, b"body")],
            )
            self.assertEqual(
                parse(b"SEND\na:1\r\n\r\nbody\0", version),
                [Frame("SEND", {"a": "1"}, b"body")],
            )
            self.assertEqual(parse(b"SEND\r\n\r\n\0", version), [Frame("SEND")])

    def test_crlf_then_lf_frames(self) -> None:
        """
        A stream may switch between CRLF and LF frames.
        """
        data = (
            b"SEND\r\na:1\r\n\r\n\0SEND\r\na:2\r\n\r\n\0SEND\na:3\n\n\0"
            b"SEND\na:4\n\nx\n\r\n\0SEND\r\na:5\r\n\r\n\n\n\0"
        )
        expected = [
            Frame("SEND", {"a": "1"}),
            Frame("SEND", {"a": "2"}),
            Frame("SEND", {"a": "3"}),
            Frame("SEND", {"a": "4"}, b"x\n\r\n"),
            Frame("SEND", {"a": "5"}, b"\n\n"),
        ]
        self.assertEqual(parse(data), expected)
        self.assertEqual(parse_bytewise(data), expected)

    def test_tab_kept(self) -> None:
        """
        TAB is the one control character a header may hold.
        """
        for version in VERSIONS:
            self.assertEqual(
                parse(b"SEND\na\tb:\tx\ty\t\n\n\0", version), [Frame("SEND", {"a\tb": "\tx\ty\t"})]
            )

    def test_content_length_body_with_nuls(self) -> None:
        self.assertEqual(
            parse(b"SEND\ncontent-length:5\n\n\0a\0b\0\0"),
            [Frame("SEND", {"content-length": "5"}, b"\0a\0b\0")],
        )

    def test_content_length_zero(self) -> None:
        self.assertEqual(
            parse(b"SEND\ncontent-length:0\n\n\0"), [Frame("SEND", {"content-length": "0"})]
        )

    def test_content_length_leading_zeros(self) -> None:
        self.assertEqual(
            parse(b"SEND\ncontent-length:002\n\nab\0"),
            [Frame("SEND", {"content-length": "002"}, b"ab")],
        )

    def test_content_length_body_split(self) -> None:
        data = b"SEND\ncontent-length:4\n\n\0\0\0\0\0SEND\n\n\0"
        expected = [Frame("SEND", {"content-length": "4"}, b"\0\0\0\0"), Frame("SEND")]
        self.assertEqual(parse_bytewise(data), expected)

    def test_body_with_newlines(self) -> None:
        self.assertEqual(parse(b"SEND\n\n\n\nx\n\n\0"), [Frame("SEND", {}, b"\n\nx\n\n")])

    def test_repeated_headers_first_wins(self) -> None:
        self.assertEqual(
            parse(b"MESSAGE\nfoo:World\nfoo:Hello\nbar:1\n\n\0"),
            [Frame("MESSAGE", {"foo": "World", "bar": "1"})],
        )

    def test_repeated_content_length_first_wins(self) -> None:
        self.assertEqual(
            parse(b"SEND\ncontent-length:1\ncontent-length:3\n\nx\0"),
            [Frame("SEND", {"content-length": "1"}, b"x")],
        )

    def test_spaces_kept(self) -> None:
        """
        Header names and values are not stripped.
        """
        self.assertEqual(
            parse(b"SEND\n a : b \n\n\0"),
            [Frame("SEND", {" a ": " b "})],
        )

    def test_first_colon_splits(self) -> None:
        self.assertEqual(
            parse(b"SEND\na:b:c\n:empty-name\nempty-value:\n\n\0", "1.0"),
            [Frame("SEND", {"a": "b:c", "": "empty-name", "empty-value": ""})],
        )

    def test_command_as_given(self) -> None:
        """
        The command is returned as received; the session validates it.
        """
        self.assertEqual(parse(b"send\n\n\0"), [Frame("send")])
        self.assertEqual(parse(b"BOGUS COMMAND\n\n\0"), [Frame("BOGUS COMMAND")])

    def test_unicode_headers(self) -> None:
        data = "SEND\nn\u00e9:\u2603 \U0001f600\n\n\0".encode()
        self.assertEqual(parse(data), [Frame("SEND", {"n\u00e9": "\u2603 \U0001f600"})])
        self.assertEqual(parse_bytewise(data), [Frame("SEND", {"n\u00e9": "\u2603 \U0001f600"})])

    def test_repeated_header_blocks(self) -> None:
        """
        Frames with the same header block (whose parse the parser reuses)
        each get their own header dict.
        """
        parser = StompParser()
        frame = b"SEND\ndestination:/queue/a\ncontent-length:1\n\nx\0"
        frames = parser.feed(frame * 4)
        frames += parser.feed(frame * 2)
        self.assertEqual(len(frames), 6)
        for got in frames:
            self.assertEqual(
                got, Frame("SEND", {"destination": "/queue/a", "content-length": "1"}, b"x")
            )
        self.assertEqual(len({id(got.headers) for got in frames}), 6)
        frames[2].headers["mutated"] = "yes"
        del frames[3].headers["destination"]
        self.assertEqual(
            parser.feed(frame),
            [Frame("SEND", {"destination": "/queue/a", "content-length": "1"}, b"x")],
        )

    def test_repeated_header_blocks_bad_length(self) -> None:
        """
        A reused header block still gets its body checked.
        """
        parser = StompParser()
        frame = b"SEND\ncontent-length:1\n\nx\0"
        self.assertEqual(len(parser.feed(frame * 3)), 3)
        with self.assertRaises(FrameError) as caught:
            parser.feed(b"SEND\ncontent-length:1\n\nxy\0")
        self.assertEqual(caught.exception.message, "frame not terminated by NUL")

    def test_raw_header_block(self) -> None:
        """
        C{Frame.raw} holds the header lines as received when they need no
        decoding (no escape, no CR), so the session can relay them.
        """
        frames = parse(b"SEND\ndestination:/queue/a\nx:1\n\nbody\0" * 3)
        for frame in frames:
            self.assertEqual(frame.raw, b"\ndestination:/queue/a\nx:1\n")
        self.assertIsNone(parse(b"SEND\r\na:1\r\n\r\n\0")[0].raw)
        self.assertIsNone(parse(b"SEND\na:\\c\n\n\0")[0].raw)
        self.assertIsNone(parse(b"SEND\n\n\0")[0].raw)
        unicode = "S\u00c9ND\na:\u00e9\n\n\0".encode()
        self.assertEqual(parse(unicode)[0].raw, "\na:\u00e9\n".encode())


class EscapingTests(SynchronousTestCase):
    """
    Header unescaping follows L{StompParser.version}.
    """

    escaped = b"SEND\nk\\c\\n\\\\:v\\c\\n\\\\\n\n\0"

    def test_version_10_literal(self) -> None:
        self.assertEqual(
            parse(self.escaped, "1.0"), [Frame("SEND", {"k\\c\\n\\\\": "v\\c\\n\\\\"})]
        )
        self.assertEqual(parse(b"SEND\na:\\t\\r\n\n\0", "1.0"), [Frame("SEND", {"a": "\\t\\r"})])

    def test_version_11(self) -> None:
        self.assertEqual(parse(self.escaped, "1.1"), [Frame("SEND", {"k:\n\\": "v:\n\\"})])

    def test_version_12(self) -> None:
        self.assertEqual(parse(self.escaped, "1.2"), [Frame("SEND", {"k:\n\\": "v:\n\\"})])
        self.assertEqual(parse(b"SEND\na:x\\ry\n\n\0", "1.2"), [Frame("SEND", {"a": "x\ry"})])

    def test_cr_escape_undefined_in_11(self) -> None:
        with self.assertRaises(FrameError) as caught:
            parse(b"SEND\na:x\\ry\n\n\0", "1.1")
        self.assertEqual(caught.exception.message, "undefined escape sequence in header")
        self.assertIn("\\\\r", caught.exception.detail)

    def test_undefined_escape(self) -> None:
        for version in ("1.1", "1.2"):
            for bad in (b"a:\\t", b"a:x\\", b"\\ta:x", b"a:\\C"):
                with self.assertRaises(FrameError, msg=repr(bad)) as caught:
                    parse(b"SEND\n" + bad + b"\n\n\0", version)
                self.assertEqual(caught.exception.message, "undefined escape sequence in header")

    def test_repeated_after_unescaping(self) -> None:
        """
        Names are compared after unescaping; the first still wins.
        """
        self.assertEqual(
            parse(b"SEND\na\\cb:1\na:b:2\n\n\0", "1.2"),
            [Frame("SEND", {"a:b": "1", "a": "b:2"})],
        )
        self.assertEqual(
            parse(b"SEND\na\\cb:1\na\\cb:2\n\n\0", "1.2"), [Frame("SEND", {"a:b": "1"})]
        )

    def test_connect_never_unescaped(self) -> None:
        for command in (b"CONNECT", b"CONNECTED"):
            frames = parse(command + b"\nlogin:a\\c\\t\npasscode:x\\\\y\n\n\0", "1.2")
            self.assertEqual(
                frames, [Frame(command.decode(), {"login": "a\\c\\t", "passcode": "x\\\\y"})]
            )

    def test_version_change_applies(self) -> None:
        """
        Setting the version changes how the next (even identical) header
        block reads.
        """
        parser = StompParser()
        frame = b"SEND\na:b\\cc\n\n\0"
        self.assertEqual(parser.feed(frame * 3), [Frame("SEND", {"a": "b\\cc"})] * 3)
        parser.version = "1.2"
        self.assertEqual(parser.feed(frame * 3), [Frame("SEND", {"a": "b:c"})] * 3)
        parser.version = "1.0"
        self.assertEqual(parser.feed(frame), [Frame("SEND", {"a": "b\\cc"})])

    def test_connect_adopts_version(self) -> None:
        """
        After a CONNECT or STOMP frame, frames pipelined behind it are
        decoded with the best version the client offers.
        """
        for command, offer, version in [
            (b"CONNECT", b"1.0,1.1,1.2", "1.2"),
            (b"STOMP", b"1.1", "1.1"),
            (b"CONNECT", b"1.1,2.0", "1.1"),
            (b"CONNECT", b"1.0", "1.0"),
        ]:
            parser = StompParser()
            frames = parser.feed(
                command + b"\naccept-version:" + offer + b"\nhost:h\n\n\0SEND\na:\\c\n\n\0"
            )
            self.assertEqual(parser.version, version)
            expected = "\\c" if version == "1.0" else ":"
            self.assertEqual(frames[1], Frame("SEND", {"a": expected}))

    def test_connect_without_accept_version(self) -> None:
        parser = StompParser()
        parser.feed(b"CONNECT\nlogin:x\n\n\0")
        self.assertEqual(parser.version, "1.0")

    def test_connected_adopts_version(self) -> None:
        parser = StompParser()
        parser.feed(b"CONNECTED\nversion:1.1\n\n\0")
        self.assertEqual(parser.version, "1.1")


class ErrorTests(SynchronousTestCase):
    """
    Malformed input raises L{FrameError}, after which the parser is dead.
    """

    def assertFrameError(self, data: bytes, message: str, version: str = "1.2") -> FrameError:
        """
        Assert that parsing C{data}, whole or byte by byte, fails with
        C{message}.

        @return: the error of the whole parse.
        """
        with self.assertRaises(FrameError) as bytewise:
            parse_bytewise(data, version)
        self.assertEqual(bytewise.exception.message, message)
        with self.assertRaises(FrameError) as caught:
            parse(data, version)
        self.assertEqual(caught.exception.message, message)
        return caught.exception

    def test_no_colon(self) -> None:
        error = self.assertFrameError(b"SEND\ndestination\n\n\0", "malformed header")
        self.assertIn("destination", error.detail)

    def test_no_colon_among_repeats(self) -> None:
        """
        A line without a colon is found even when a repeated header also
        shortens the dict.
        """
        self.assertFrameError(b"SEND\na:1\na:2\nb:1:2\nnocolon\n\n\0", "malformed header")

    def test_invalid_utf8(self) -> None:
        self.assertFrameError(b"SEND\na:\xff\xfe\n\n\0", "invalid UTF-8 in frame header")
        self.assertFrameError(b"S\xc3\n\n\0", "invalid UTF-8 in frame header")

    def test_invalid_utf8_body_is_fine(self) -> None:
        self.assertEqual(parse(b"SEND\n\n\xff\0"), [Frame("SEND", {}, b"\xff")])

    def test_bad_content_length(self) -> None:
        for value in (
            b"-1",
            b"abc",
            b"",
            b" 5",
            b"5 ",
            b"+5",
            b"1.5",
            b"0x10",
            b"1_0",
            "\u0663".encode(),
            b"9" * 5000,
        ):
            error = self.assertFrameError(
                b"SEND\ncontent-length:" + value + b"\n\nabc\0", "invalid content-length"
            )
            self.assertIn("non-negative decimal integer", error.detail)

    def test_missing_nul_after_content_length_body(self) -> None:
        self.assertFrameError(b"SEND\ncontent-length:2\n\nabc\0", "frame not terminated by NUL")
        self.assertFrameError(
            b"SEND\ncontent-length:2\n\nab\nSEND\n\n\0", "frame not terminated by NUL"
        )

    def test_garbage(self) -> None:
        self.assertFrameError(b"\x00\x01\x02garbage\n\x7fmore\n\n\0", "control character in header")
        self.assertFrameError(b"garbage\nmore\n\n\0", "malformed header")
        self.assertFrameError(b"GET / HTTP/1.1\r\nHost: x\r\nbad line\r\n\r\n", "malformed header")

    def test_dead_after_error(self) -> None:
        parser = StompParser()
        with self.assertRaises(FrameError):
            parser.feed(b"SEND\nbad\n\n\0")
        for _ in range(2):
            with self.assertRaises(FrameError) as caught:
                parser.feed(b"SEND\n\n\0")
            self.assertEqual(caught.exception.message, "malformed header")
            self.assertIn("bad", caught.exception.detail)

    def test_frames_before_error(self) -> None:
        """
        The frames completed before the error in the same read ride on it.
        """
        parser = StompParser()
        with self.assertRaises(FrameError) as caught:
            parser.feed(b"SEND\na:1\n\n\0SEND\na:2\n\n\0SEND\nbad\n\n\0")
        self.assertEqual(
            caught.exception.frames, [Frame("SEND", {"a": "1"}), Frame("SEND", {"a": "2"})]
        )


class LimitTests(SynchronousTestCase):
    """
    Each limit: just under passes, just over fails, as early as the bytes
    allow, with a message naming the limit and its value.
    """

    def test_body_content_length(self) -> None:
        self.assertEqual(
            len(parse(b"SEND\ncontent-length:100\n\n" + b"x" * 100 + b"\0", max_body_size=100)), 1
        )
        parser = StompParser(max_body_size=100)
        with self.assertRaises(FrameError) as caught:
            parser.feed(b"SEND\ncontent-length:101\n\n")  # up front: no body yet
        self.assertEqual(caught.exception.message, "frame body exceeds max_body_size (100 bytes)")
        self.assertIn("101", caught.exception.detail)

    def test_body_nul_terminated(self) -> None:
        head = b"SEND\na:b\n\n"
        self.assertEqual(len(parse(head + b"x" * 100 + b"\0", max_body_size=100)), 1)
        self.assertEqual(len(parse_bytewise(head + b"x" * 100 + b"\0", max_body_size=100)), 1)
        with self.assertRaises(FrameError) as caught:
            parse(head + b"x" * 101 + b"\0", max_body_size=100)
        self.assertEqual(caught.exception.message, "frame body exceeds max_body_size (100 bytes)")

    def test_body_nul_terminated_fails_early(self) -> None:
        """
        A body without content-length fails as soon as it exceeds the limit,
        however it arrives.
        """
        head = b"SEND\na:b\n\n"
        parser = StompParser(max_body_size=100)
        self.assertEqual(parser.feed(head + b"x" * 60), [])
        self.assertEqual(parser.feed(b"x" * 40), [])
        with self.assertRaises(FrameError):
            parser.feed(b"x")
        parser = StompParser(max_body_size=100)
        self.assertEqual(parser.feed(head + b"x" * 100), [])
        with self.assertRaises(FrameError):
            parser.feed(b"x")
        parser = StompParser(max_body_size=100)
        self.assertEqual(parser.feed(head[:4]), [])
        with self.assertRaises(FrameError):
            parser.feed(head[4:] + b"x" * 101)
        with self.assertRaises(FrameError):
            parse_bytewise(head + b"x" * 101, max_body_size=100)

    def test_headers_count(self) -> None:
        three = b"SEND\na:1\nb:2\nc:3\n\n\0"
        self.assertEqual(
            parse(three, max_headers=3), [Frame("SEND", {"a": "1", "b": "2", "c": "3"})]
        )
        with self.assertRaises(FrameError) as caught:
            parse(b"SEND\na:1\nb:2\nc:3\na:4\n\n\0", max_headers=3)
        self.assertEqual(caught.exception.message, "too many headers (max_headers is 3)")
        self.assertIn("4", caught.exception.detail)

    def test_header_line(self) -> None:
        line = b"a:" + b"x" * 18  # 20 bytes
        self.assertEqual(len(parse(b"SEND\n" + line + b"\n\n\0", max_header_line=20)), 1)
        self.assertEqual(len(parse(b"SEND\r\n" + line + b"\r\n\r\n\0", max_header_line=20)), 1)
        for data in (b"SEND\n" + line + b"x\n\n\0", b"SEND\r\n" + line + b"x\r\n\r\n\0"):
            with self.assertRaises(FrameError) as caught:
                parse(data, max_header_line=20)
            self.assertEqual(
                caught.exception.message, "header line exceeds max_header_line (20 bytes)"
            )

    def test_header_line_counts_bytes(self) -> None:
        """
        The line length is in bytes (of UTF-8), not characters.
        """
        line = "a:" + "\u00e9" * 9  # 20 bytes
        self.assertEqual(len(parse(f"SEND\n{line}\n\n\0".encode(), max_header_line=20)), 1)
        with self.assertRaises(FrameError):
            parse(f"SEND\n{line}x\n\n\0".encode(), max_header_line=20)

    def test_command_line(self) -> None:
        with self.assertRaises(FrameError):
            parse(b"X" * 21 + b"\na:1\n\n\0", max_header_line=20)

    def test_header_block(self) -> None:
        head = b"SEND\na:" + b"x" * 55 + b"\n\n"  # 64 bytes with the blank line
        self.assertEqual(len(head), 64)
        for split in (parse, parse_bytewise):
            self.assertEqual(len(split(head + b"\0", max_header_block=64)), 1)
            with self.assertRaises(FrameError) as caught:
                split(head[:-2] + b"x\n\n\0", max_header_block=64)
            self.assertEqual(
                caught.exception.message, "header block exceeds max_header_block (64 bytes)"
            )
        crlf = b"SEND\r\na:" + b"x" * 52 + b"\r\n\r\n"
        self.assertEqual(len(crlf), 64)
        self.assertEqual(len(parse(crlf + b"\0", max_header_block=64)), 1)
        with self.assertRaises(FrameError):
            parse(b"SEND\r\na:" + b"x" * 53 + b"\r\n\r\n\0", max_header_block=64)

    def test_header_block_fails_early(self) -> None:
        """
        The block fails as soon as that many bytes arrive with no blank line.
        """
        parser = StompParser(max_header_block=64)
        self.assertEqual(parser.feed(b"SEND\n"), [])
        self.assertEqual(parser.feed(b"a:" + b"x" * 56), [])  # 63 bytes
        with self.assertRaises(FrameError):
            parser.feed(b"\n")
        parser = StompParser(max_header_block=64)
        with self.assertRaises(FrameError):
            parser.feed(b"SEND\na:" + b"x" * 57)
        with self.assertRaises(FrameError):
            parse_bytewise(b"SEND\na:" + b"x" * 57, max_header_block=64)

    def test_defaults(self) -> None:
        parser = StompParser()
        self.assertEqual(
            (
                parser.max_body_size,
                parser.max_headers,
                parser.max_header_line,
                parser.max_header_block,
            ),
            (16 * MiB, 1000, 8192, 65536),
        )


class BigFrameTests(SynchronousTestCase):
    """
    Big frames arriving in pieces are gathered in a chunk list and joined
    once, not re-joined or re-scanned per piece.
    """

    chunk = 64 * 1024

    def feed_in_chunks(self, parser: StompParser, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        for i in range(0, len(data), self.chunk):
            frames.extend(parser.feed(data[i : i + self.chunk]))
            if not frames and i >= 10 * self.chunk:
                # Still pending: the pieces are kept as they came.
                self.assertGreater(len(parser._chunks), 10)
        return frames

    def test_content_length_16mib(self) -> None:
        body = bytes(range(256)) * (16 * MiB // 256)
        data = encode_frame("SEND", {"destination": "/queue/big"}, body) + b"\nSEND\n\n\0"
        parser = StompParser()
        frames = self.feed_in_chunks(parser, data)
        self.assertEqual(len(frames), 2)
        self.assertEqual(frames[0].headers["content-length"], str(16 * MiB))
        self.assertTrue(frames[0].body == body)  # not assertEqual: no 16 MiB diff
        self.assertEqual(frames[1], Frame("SEND"))
        self.assertEqual(parser._joins, 1)

    def test_nul_terminated_16mib(self) -> None:
        body = b"y" * (16 * MiB)
        data = b"SEND\ndestination:/queue/big\n\n" + body + b"\0"
        parser = StompParser()
        frames = self.feed_in_chunks(parser, data)
        self.assertEqual(len(frames), 1)
        self.assertTrue(frames[0].body == body)
        self.assertEqual(parser._joins, 1)

    def test_header_block_bytewise(self) -> None:
        """
        A big header block fed a byte at a time is joined once.
        """
        head = b"SEND\n" + b"".join(b"h%d:%s\n" % (i, b"v" * 50) for i in range(900)) + b"\n"
        parser = StompParser()
        frames = feed_all(parser, *(head[i : i + 1] for i in range(len(head))), b"\0")
        self.assertEqual(len(frames), 1)
        self.assertEqual(len(frames[0].headers), 900)
        # Once when the blank line arrives, once when the NUL does.
        self.assertEqual(parser._joins, 2)


# Property tests -------------------------------------------------------------

VERSIONS = ("1.0", "1.1", "1.2")
# Commands of the property tests; CONNECT, CONNECTED and STOMP are left out
# of streams because the parser adopts the version they announce.
# The characters no command or header may hold (TAB may).
CONTROLS = "".join(map(chr, [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]))
COMMANDS = st.one_of(
    st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ACK", "RECEIPT", "ERROR", "BEGIN"]),
    st.text(
        st.characters(blacklist_characters="\n\r" + CONTROLS, blacklist_categories=("Cs",)),
        min_size=1,
        max_size=10,
    ),
).filter(lambda c: c not in ("CONNECT", "CONNECTED", "STOMP"))
ANY_TEXT = st.text(
    st.characters(blacklist_characters=CONTROLS, blacklist_categories=("Cs",)), max_size=12
)
SPECIAL_TEXT = st.text(st.sampled_from("ab:\\\n\r\t \u00e9\u2603"), max_size=8)
# Anything, control characters first of all: what the encoders must refuse
# or get right.
HOSTILE_TEXT = st.one_of(
    st.text(st.sampled_from("ab:\\\n\r\t\0\x01\x0b\x0c\x1b\x1f\x7f \u00e9\u2028"), max_size=8),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
)
BODIES = st.binary(max_size=200)


def header_text(version: str, name: bool) -> st.SearchStrategy[str]:
    """
    Header names or values that can travel in C{version}.

    @param name: C{True} for names.
    """
    text = st.one_of(ANY_TEXT, SPECIAL_TEXT)
    if version == "1.0":
        # No escaping: no LF, no CR, no colon in a name.
        text = text.filter(lambda t: "\n" not in t and "\r" not in t)
        if name:
            text = text.filter(lambda t: ":" not in t)
    elif version == "1.1":
        # CR is not escaped in 1.1.
        text = text.filter(lambda t: "\r" not in t)
    return text


@st.composite
def frames_of(draw: st.DrawFn, version: str) -> tuple[Frame, bytes]:
    """
    A random frame and its encoding in C{version}, with a content-length
    body (which may hold NULs) or a NUL-terminated one.

    @return: the frame the parser must return, and the bytes.
    """
    command = draw(COMMANDS)
    pairs = draw(
        st.lists(
            st.tuples(header_text(version, True), header_text(version, False)), max_size=6
        ).filter(lambda ps: all(name != "content-length" for name, _ in ps))
    )
    # Repeat some names: the first occurrence must win.
    if pairs and draw(st.booleans()):
        pairs.append((pairs[0][0], "repeated"))
    body = draw(BODIES)
    expected: dict[str, str] = {}
    for name, value in pairs:
        expected.setdefault(name, value)
    if body and b"\0" not in body and draw(st.booleans()):
        data = encode_frame(command, pairs, b"", version)[:-1] + body + b"\0"
    else:
        data = encode_frame(command, pairs, body, version)
        if body:
            expected["content-length"] = str(len(body))
    return Frame(command, expected, body), data


# EOL heart-beats, and stray NULs, which are skipped the same way.
HEARTBEATS = st.lists(st.sampled_from([b"\n", b"\r\n", b"\0"]), max_size=3).map(b"".join)


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, list[Frame], bytes, list[bytes]]:
    """
    Random frames of one version, with random heart-beats, split at random
    points.

    @return: the version, the frames, the whole stream, and its pieces.
    """
    version = draw(st.sampled_from(VERSIONS))
    items = draw(st.lists(frames_of(version), max_size=6))
    parts = [draw(HEARTBEATS)]
    for _, data in items:
        parts.append(data)
        parts.append(draw(HEARTBEATS))
    stream = b"".join(parts)
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return version, [frame for frame, _ in items], stream, pieces


class PropertyTests(SynchronousTestCase):
    """
    Random frames survive encoding, heart-beats and any split of the stream.
    """

    @settings(max_examples=200, deadline=None)
    @given(streams())
    def test_any_split(self, case: tuple[str, list[Frame], bytes, list[bytes]]) -> None:
        version, expected, stream, pieces = case
        parser = StompParser()
        parser.version = version
        self.assertEqual(feed_all(parser, *pieces), expected)
        self.assertEqual(parse(stream, version), expected)

    @settings(max_examples=50, deadline=None)
    @given(streams())
    def test_bytewise(self, case: tuple[str, list[Frame], bytes, list[bytes]]) -> None:
        version, expected, stream, _ = case
        self.assertEqual(parse_bytewise(stream, version), expected)

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def test_round_trip(self, data: st.DataObject) -> None:
        """
        Each version, CONNECT and CONNECTED included: encode then parse
        gives the frame back.
        """
        version = data.draw(st.sampled_from(VERSIONS))
        command = data.draw(st.one_of(COMMANDS, st.sampled_from(["CONNECT", "CONNECTED"])))
        # CONNECT and CONNECTED are never escaped: 1.0 rules for them.
        rules = "1.0" if command in ("CONNECT", "CONNECTED") else version
        headers = data.draw(
            st.dictionaries(
                header_text(rules, True).filter(lambda name: name != "content-length"),
                header_text(rules, False),
                max_size=6,
            )
        )
        body = data.draw(BODIES)
        frames = parse(encode_frame(command, headers, body, version), version)
        if body:
            headers["content-length"] = str(len(body))
        self.assertEqual(frames, [Frame(command, headers, body)])


# Pieces that make frames, near-frames and garbage.
TOKENS = st.sampled_from(
    [
        b"SEND",
        b"CONNECT\naccept-version:1.2",
        b"\n",
        b"\r\n",
        b"\r",
        b"\n\n",
        b":",
        b"a",
        b"xyz",
        b"\\",
        b"\\c",
        b"\\t",
        b"\0",
        b"content-length:",
        b"3",
        b"0",
        b"\xc3\xa9",
        b"\xff",
    ]
)


def outcome(parser: StompParser, pieces: list[bytes]) -> tuple[list[Frame], str | None]:
    """
    Feed C{pieces} until an error.

    @return: every frame returned (including those carried by the error),
        and the error's message or C{None}.
    """
    frames: list[Frame] = []
    for piece in pieces:
        try:
            frames.extend(parser.feed(piece))
        except FrameError as e:
            return frames + e.frames, e.message
    return frames, None


class FuzzTests(SynchronousTestCase):
    """
    On any input, valid or not, the split of the stream changes nothing: the
    same frames, then the same error (if any).
    """

    @settings(max_examples=300, deadline=None)
    @given(st.lists(TOKENS, max_size=40).map(b"".join), st.data())
    def test_split_invariance(self, stream: bytes, data: st.DataObject) -> None:
        limits = {
            "max_body_size": 8,
            "max_headers": 3,
            "max_header_line": 16,
            "max_header_block": 40,
        }
        version = data.draw(st.sampled_from(VERSIONS))
        cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        whole = StompParser(**limits)
        whole.version = version
        split = StompParser(**limits)
        split.version = version
        bytewise = StompParser(**limits)
        bytewise.version = version
        expected = outcome(whole, [stream])
        self.assertEqual(outcome(split, pieces), expected)
        self.assertEqual(
            outcome(bytewise, [stream[i : i + 1] for i in range(len(stream))]), expected
        )


# Attacks and hardening ------------------------------------------------------


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    """
    @return: C{data} cut at the offsets C{cuts} (in any order).
    """
    cuts = sorted(cuts)
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def assertQuotesSafely(case: SynchronousTestCase, error: FrameError) -> None:
    """
    Assert that an error's message and detail can go into an ERROR frame as
    they are: short, and no control character or other non-printable one.
    """
    case.assertTrue(error.message.isprintable(), repr(error.message))
    case.assertTrue(error.detail.isprintable(), repr(error.detail))
    case.assertLessEqual(len(error.detail), 300, error.detail)


# A SEND whose relayed header block would end a MESSAGE early at the
# receiver and forge a MESSAGE to another subscription, then an ERROR.
INJECTION = (
    b"SEND\ndestination:/queue/a\nx:\0MESSAGE\nsubscription:victim\nmessage-id:1\n"
    b"destination:/queue/secret\ncontent-length:6\n\nforged\0ERROR\nmessage:forged\n\n\0"
)
GOOD = b"SEND\ndestination:/queue/a\n\nok\0"


class InjectionTests(SynchronousTestCase):
    """
    No control character gets through a header block: not NUL (which would
    let a relayed header block end a frame and forge the next), nor any
    other C0 control but TAB, nor DEL, nor a CR that does not end a line.
    """

    def test_nul_injection(self) -> None:
        """
        The injection fails in every version, at once or piecewise, and
        nothing of it becomes a frame; the frame before it still does.
        """
        for version in VERSIONS:
            for pieces in (
                [GOOD + INJECTION],
                [GOOD + INJECTION[:30], INJECTION[30:]],
                [bytes([b]) for b in GOOD + INJECTION],
            ):
                parser = StompParser()
                parser.version = version
                frames, message = outcome(parser, pieces)
                self.assertEqual(message, "control character in header", version)
                self.assertEqual(frames, [Frame("SEND", {"destination": "/queue/a"}, b"ok")])

    @settings(max_examples=100, deadline=None)
    @given(st.sampled_from(VERSIONS), st.lists(st.integers(0, len(GOOD + INJECTION))))
    def test_nul_injection_any_split(self, version: str, cuts: list[int]) -> None:
        parser = StompParser()
        parser.version = version
        frames, message = outcome(parser, splits(GOOD + INJECTION, cuts))
        self.assertEqual(message, "control character in header")
        self.assertEqual(frames, [Frame("SEND", {"destination": "/queue/a"}, b"ok")])

    def test_error_says_where(self) -> None:
        with self.assertRaises(FrameError) as caught:
            parse(INJECTION)
        error = caught.exception
        self.assertEqual(error.message, "control character in header")
        self.assertIn("0x00 at line 3, column 3", error.detail)
        self.assertIn("x:\\x00MESSAGE", error.detail)
        assertQuotesSafely(self, error)

    def test_every_control_character(self) -> None:
        for code in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]:
            c = bytes([code])
            for data in (
                b"SEND\na:x" + c + b"y\n\n\0",
                b"SEND\na" + c + b":x\n\n\0",
                b"SE" + c + b"ND\n\n\0",
                b"SEND\r\na:" + c + b"\r\n\r\n\0",
            ):
                for version in VERSIONS:
                    with self.assertRaises(FrameError, msg=repr(data)) as caught:
                        parse(data, version)
                    self.assertEqual(caught.exception.message, "control character in header")
                    self.assertIn(f"byte 0x{code:02x}", caught.exception.detail)
                    assertQuotesSafely(self, caught.exception)
                    with self.assertRaises(FrameError):
                        parse_bytewise(data, version)

    def test_checked_after_repeats(self) -> None:
        """
        A block that differs from the one repeated before it (whose parse
        is reused unchecked) is checked.
        """
        good = b"SEND\na:xy\n\n\0"
        parser = StompParser()
        self.assertEqual(len(parser.feed(good * 3)), 3)
        with self.assertRaises(FrameError) as caught:
            parser.feed(b"SEND\na:x\0\n\n\0")  # the same length
        self.assertEqual(caught.exception.message, "control character in header")

    def test_bare_cr(self) -> None:
        """
        A CR must end a line (CRLF, in every version); anywhere else it is
        refused, even in 1.0.
        """
        for data, where in (
            (b"SEND\na:x\ry\n\n\0", "line 2, column 4"),
            (b"SE\rND\n\n\0", "line 1, column 3"),
            (b"SEND\r\na:1\r\r\n\r\n\0", "line 2, column 4"),
            (b"SEND\r\na\r:1\r\n\r\n\0", "line 2, column 2"),
            (b"SEND\na:1\rb:2\n\n\0", "line 2, column 4"),
        ):
            for version in VERSIONS:
                with self.assertRaises(FrameError, msg=repr(data)) as caught:
                    parse(data, version)
                self.assertEqual(caught.exception.message, "bare CR in header")
                self.assertIn(where, caught.exception.detail)
                assertQuotesSafely(self, caught.exception)
                with self.assertRaises(FrameError):
                    parse_bytewise(data, version)

    def test_crlf_then_lf_block_with_odd_body(self) -> None:
        """
        After a CRLF frame the parser looks for a CRLF blank line first; an
        LF frame whose body holds a control character, bytes that are not
        UTF-8, a bare CR, or starts with CRLF, is still read right.
        """
        for body in (b"\x01\r\n\r\n", b"\xff\r\n\r\n", b"x\ry\r\n\r\n", b"\r\n"):
            data = b"SEND\r\na:1\r\n\r\n\0SEND\na:2\n\n" + body + b"\0SEND\r\n\r\n\0"
            expected = [Frame("SEND", {"a": "1"}), Frame("SEND", {"a": "2"}, body), Frame("SEND")]
            self.assertEqual(parse(data), expected)
            self.assertEqual(parse_bytewise(data), expected)


class StrayNulTests(SynchronousTestCase):
    """
    A NUL between frames (a terminator sent twice) is skipped, like an EOL
    heart-beat; inside a header block it is an error.
    """

    def test_skipped(self) -> None:
        data = b"\0SEND\n\n\0\0\0\nSEND\na:1\n\nbody\0\0\r\n\0"
        expected = [Frame("SEND"), Frame("SEND", {"a": "1"}, b"body")]
        self.assertEqual(parse(data), expected)
        self.assertEqual(parse_bytewise(data), expected)
        self.assertEqual(parse(b"\0" * 100), [])

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.lists(st.sampled_from([b"\0", b"\n", b"\r\n"]), max_size=4), min_size=3, max_size=3
        ),
        st.lists(st.integers(0, 100)),
    )
    def test_any_split(self, gaps: list[list[bytes]], cuts: list[int]) -> None:
        frames = [b"SEND\na:1\n\nx\0", b"SEND\ncontent-length:2\n\n\0\0\0"]
        data = b"".join(gaps[0]) + frames[0] + b"".join(gaps[1]) + frames[1] + b"".join(gaps[2])
        parser = StompParser()
        self.assertEqual(
            feed_all(parser, *splits(data, [cut for cut in cuts if cut <= len(data)])),
            [Frame("SEND", {"a": "1"}, b"x"), Frame("SEND", {"content-length": "2"}, b"\0\0")],
        )

    def test_inside_header_block(self) -> None:
        for data in (b"SEND\n\0a:1\n\n\0", b"SEND\0\n\n\0", b"SEND\na:1\n\0\n\n\0"):
            with self.assertRaises(FrameError, msg=repr(data)) as caught:
                parse(data)
            self.assertEqual(caught.exception.message, "control character in header")


class ExcerptTests(SynchronousTestCase):
    """
    L{excerpt} makes client input safe and short to quote.
    """

    def test_plain(self) -> None:
        self.assertEqual(excerpt("destination"), "destination")
        self.assertEqual(excerpt(b"/queue/a"), "/queue/a")
        self.assertEqual(excerpt("caf\u00e9 \u2603"), "caf\u00e9 \u2603")
        self.assertEqual(excerpt(""), "")

    def test_escapes(self) -> None:
        self.assertEqual(excerpt("a\0b\nc\rd\te\x7f"), "a\\x00b\\nc\\rd\\te\\x7f")
        self.assertEqual(excerpt("back\\slash"), "back\\\\slash")
        # C1 controls, line separators, bidi overrides: not printable.
        self.assertEqual(excerpt("\x9b\u2028\u202e"), "\\x9b\\u2028\\u202e")
        self.assertEqual(excerpt(b"ok\xff\xfe"), "ok\\xff\\xfe")
        # A lone surrogate in text is not taken for a byte.
        self.assertEqual(excerpt("\udcff"), "\\udcff")

    def test_truncation(self) -> None:
        self.assertEqual(excerpt("x" * 64), "x" * 64)
        self.assertEqual(excerpt("x" * 65), "x" * 61 + "...")
        self.assertEqual(excerpt(b"x" * 10_000_000), "x" * 61 + "...")
        self.assertEqual(excerpt("abcdefghij", 8), "abcde...")
        # An escape is never cut in half.
        self.assertEqual(excerpt("abcd\0fghij", 8), "abcd...")
        self.assertEqual(excerpt("\u00e9" * 100, 10), "\u00e9" * 7 + "...")

    def test_injection(self) -> None:
        text = excerpt(INJECTION)
        self.assertEqual(len(text), 64)
        self.assertTrue(text.endswith("..."))
        self.assertTrue(text.isprintable())
        self.assertIn("\\x00MESSAGE\\n", text)

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.binary(max_size=300), st.text(max_size=300)), st.integers(4, 100))
    def test_always_short_and_printable(self, data: bytes | str, limit: int) -> None:
        text = excerpt(data, limit)
        self.assertLessEqual(len(text), limit)
        self.assertTrue(text.isprintable(), repr(text))
        if isinstance(data, str) and len(data) <= limit and data.isprintable() and "\\" not in data:
            self.assertEqual(text, data)


class ErrorDetailTests(SynchronousTestCase):
    """
    An error quotes at most a short excerpt of the client's input.
    """

    def test_quotes_short(self) -> None:
        long = b"y" * 5000
        for data, version, message in (
            (b"SEND\n" + long + b"\n\n\0", "1.2", "malformed header"),
            (b"SEND\na:" + long + b"\\t\n\n\0", "1.2", "undefined escape sequence in header"),
            (b"SEND\ncontent-length:" + long + b"\n\n\0", "1.2", "invalid content-length"),
            (b"SEND\na:" + long + b"\xff\n\n\0", "1.2", "invalid UTF-8 in frame header"),
            (b"SEND\na:" + long + b"\x01\n\n\0", "1.0", "control character in header"),
            (b"SEND\na:" + long + b"\ry\n\n\0", "1.0", "bare CR in header"),
            (b"SEND\ncontent-length:1\n\nab\0", "1.2", "frame not terminated by NUL"),
        ):
            with self.assertRaises(FrameError, msg=message) as caught:
                parse(data, version)
            self.assertEqual(caught.exception.message, message)
            assertQuotesSafely(self, caught.exception)
        with self.assertRaises(FrameError) as caught:
            parse(b"SEND\n" + long + b"\n\n\0", max_header_line=100)
        assertQuotesSafely(self, caught.exception)

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(st.one_of(TOKENS, st.binary(max_size=3)), max_size=40).map(b"".join),
        st.sampled_from(VERSIONS),
    )
    def test_any_error(self, stream: bytes, version: str) -> None:
        parser = StompParser(max_body_size=8, max_headers=3, max_header_line=16)
        parser.version = version
        try:
            parser.feed(stream)
        except FrameError as e:
            assertQuotesSafely(self, e)


def sendable(text: str, rules: str, name: bool) -> bool:
    """
    @param rules: the STOMP version whose escaping applies.
    @param name: C{True} for a header name.
    @return: whether a header name or value can be written in C{rules}.
    """
    if any(c in CONTROLS for c in text):
        return False
    if rules == "1.0":
        return "\n" not in text and "\r" not in text and not (name and ":" in text)
    if rules == "1.1":
        return "\r" not in text
    return True


class EncoderSafetyTests(SynchronousTestCase):
    """
    The encoders never write a control character into a header: what the
    version can escape they escape, the rest is a C{ValueError}.
    """

    def test_control_characters_refused(self) -> None:
        for char in CONTROLS:
            for version in VERSIONS:
                for command in ("SEND", "CONNECT"):
                    for headers in ({"a": f"x{char}y"}, {f"a{char}": "x"}, [("a", f"{char}")]):
                        with self.assertRaises(ValueError, msg=repr(headers)) as caught:
                            encode_frame(command, headers, b"", version)
                        self.assertIn(f"control character U+{ord(char):04X}", str(caught.exception))
                        self.assertTrue(str(caught.exception).isprintable())
                with self.assertRaises(ValueError):
                    escape_header(f"x{char}", version)

    def test_line_breaks_per_version(self) -> None:
        """
        LF and CR are escaped where the version can, refused where not.
        """
        for value, refused in (("a\nb", ("1.0",)), ("a\rb", ("1.0", "1.1"))):
            for version in VERSIONS:
                if version in refused:
                    with self.assertRaises(ValueError):
                        encode_frame("SEND", {"k": value}, b"", version)
                    with self.assertRaises(ValueError):
                        escape_header(value, version)
                else:
                    self.assertNotIn(
                        value.encode(), encode_frame("SEND", {"k": value}, b"", version)
                    )
            with self.assertRaises(ValueError):
                encode_frame("CONNECT", {"passcode": value}, b"", "1.2")

    def test_colon_in_unescaped_name(self) -> None:
        """
        Without escaping, a colon in a name would move the name/value split.
        """
        with self.assertRaises(ValueError):
            encode_frame("SEND", {"a:b": "c"}, b"", "1.0")
        with self.assertRaises(ValueError):
            encode_frame("CONNECTED", {"a:b": "c"}, b"", "1.2")
        self.assertEqual(encode_frame("SEND", {"a": "b:c"}, b"", "1.0"), b"SEND\na:b:c\n\n\0")

    def test_command(self) -> None:
        for command in ("", "SEND\nx:y", "\0SEND", "SE\rND", "SE\x7fND"):
            with self.assertRaises(ValueError, msg=repr(command)):
                encode_frame(command)
        self.assertEqual(encode_frame("FOO\tBAR"), b"FOO\tBAR\n\n\0")

    def test_content_length(self) -> None:
        """
        A body with a NUL always gets a content-length; one given must
        match the body, or the receiver would cut the frame elsewhere.
        """
        for headers in (None, {}, {"a": "1"}, [("a", "1")]):
            data = encode_frame("SEND", headers, b"a\0b")
            self.assertIn(b"\ncontent-length:3\n", data)
            self.assertEqual(parse(data)[0].body, b"a\0b")
        self.assertEqual(
            encode_frame("SEND", {"content-length": "003"}, b"a\0b"),
            b"SEND\ncontent-length:003\n\na\0b\0",
        )
        for length in ("2", "4", "", "x", "+3", "\u0663"):
            for headers in ({"content-length": length}, [("content-length", length)]):
                with self.assertRaises(ValueError, msg=repr(headers)):
                    encode_frame("SEND", headers, b"a\0b")
        with self.assertRaises(ValueError):
            encode_frame("SEND", {"content-length": "5"})

    def test_check_header_text(self) -> None:
        for text in ("", "plain", "tab\there", "line\nbreak\r", "caf\u00e9:\\"):
            check_header_text(text)
        for char in CONTROLS:
            with self.assertRaises(ValueError) as caught:
                check_header_text(f"ab{char}cd")
            self.assertEqual(
                str(caught.exception),
                f"control character U+{ord(char):04X} in header text at index 2:"
                f" ab{excerpt(char)}cd",
            )

    @settings(max_examples=500, deadline=None)
    @given(st.data())
    def test_round_trip_or_refused(self, data: st.DataObject) -> None:
        """
        Whatever the encoder accepts parses back to the same frame, with no
        control character in the header block and, for a body without
        NUL, exactly one NUL; what it refuses could not have been sent.
        """
        version = data.draw(st.sampled_from(VERSIONS))
        command = data.draw(st.one_of(COMMANDS, st.sampled_from(["CONNECT", "CONNECTED"])))
        rules = "1.0" if command in ("CONNECT", "CONNECTED") else version
        headers = data.draw(
            st.dictionaries(
                HOSTILE_TEXT.filter(lambda name: name != "content-length"),
                HOSTILE_TEXT,
                max_size=4,
            )
        )
        body = data.draw(BODIES)
        ok = all(
            sendable(name, rules, True) and sendable(value, rules, False)
            for name, value in headers.items()
        )
        try:
            encoded = encode_frame(command, headers, body, version)
        except ValueError:
            self.assertFalse(ok, repr(headers))
            return
        self.assertTrue(ok, repr(headers))
        head, _, _ = encoded.partition(b"\n\n")
        self.assertFalse(any(byte in CONTROLS.encode() for byte in head.replace(b"\n", b"")))
        if b"\0" not in body:
            self.assertEqual(encoded.count(b"\0"), 1)
        if body:
            headers["content-length"] = str(len(body))
        self.assertEqual(parse(encoded, version), [Frame(command, headers, body)])


class FrameSlotsTests(SynchronousTestCase):
    def test_parser_sets_every_slot(self) -> None:
        """
        The parser makes frames without calling C{Frame.__init__}: it must
        still set every slot.
        """
        for data in (b"SEND\na:1\n\nx\0" * 3, b"SEND\r\n\r\n\0"):
            for frame in parse(data):
                for slot in Frame.__slots__:
                    getattr(frame, slot)
                self.assertEqual(repr(frame), repr(Frame(frame.command, frame.headers, frame.body)))


class RelayBlockTests(SynchronousTestCase):
    """A SEND's raw header lines relayed on MESSAGE frames, less the lines
    that describe the SEND itself, its destination (the derived one goes
    first) and its timing options (the model's expiry is added per
    message)."""

    def test_frame_lines_stripped(self) -> None:
        from qmq.stomp.encoding import relay_block

        raw = (
            b"\nreceipt:1\ndestination:/queue/a\nreceipt:2\ntransaction:t\n"
            b"content-length:5\nreceipt-note:kept\nttl:5\nexpires:9\ndelay:1\ndeliver-at:3\n"
            b"ack-timeout:2\npriority:4\nx:receipt:no\n"
        )
        line = b"\ndestination:/queue/b"
        # x:receipt:no has a colon in its value: encoded from the model instead.
        self.assertIsNone(relay_block(raw, line))
        self.assertEqual(
            relay_block(raw.replace(b"x:receipt:no\n", b""), line),
            b"\ndestination:/queue/b\nreceipt-note:kept\npriority:4\n",
        )
        # No destination line (it would need escaping): not relayed.
        self.assertIsNone(relay_block(b"\ndestination:/queue/a\n", None))

    def test_nothing_to_strip(self) -> None:
        from qmq.stomp.encoding import relay_block

        raw = b"\npersistent:true\n"
        self.assertEqual(relay_block(raw, b"\ndestination:/queue/a"), b"\ndestination:/queue/a" + raw)
