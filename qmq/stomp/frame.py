# -*- test-case-name: tests.test_stomp_frame -*-
"""The STOMP 1.0/1.1/1.2 frame codec, sans I/O.

Nothing here touches a socket, a reactor or a clock: bytes go in, L{Frame}s
come out, and L{encode_frame} turns a command, headers and a body back into
bytes.  The STOMP session feeds it from any transport (TCP, WebSocket, SockJS).

Data flow of the parser (L{StompParser.feed}), the hottest path of the broker:

    1. C{feed(data)} takes one whole read buffer.  When no frame is pending it
       parses C{data} directly; otherwise it first decides, looking at the new
       chunk only, whether the pending frame can now be completed (or must
       fail).  If not, the chunk is appended to a list of pending chunks and
       nothing is copied or re-scanned.  If so, the pending chunks and C{data}
       are joined once and parsing restarts at the beginning of the pending
       frame.  Every byte is thus copied and scanned a bounded number of
       times: a 16 MiB body arriving in 64 KiB pieces is joined once.
    2. The main loop walks one buffer by advancing an offset (never slicing
       the remainder): it skips EOL heart-beats and stray NULs, finds the
       blank line that ends the command and headers with C{bytes.find},
       checks that block for control characters (see below), decodes it as
       UTF-8 in one go, splits it into lines with C{str.split} and builds
       the header dict in one call.  Repeated headers, escapes and malformed
       lines send it to a slower, careful path.  A producer usually repeats
       its header block byte for byte: when a block equals the previous
       frame's (one C{bytes} comparison), the previous parse is reused and
       only the dict is copied.  The body is either exactly
       C{content-length} bytes followed by a NUL, or runs to the first NUL.
       A header block that needs no decoding (no escape, no CR) is also
       handed on as bytes (L{Frame.raw}), so a SEND's headers can be relayed
       into MESSAGE frames without re-encoding.
    3. When the buffer ends inside a frame, the loop records what the frame
       still needs (the end of its header block, a byte count, or a NUL) and
       keeps the unparsed tail as the first pending chunk.

Limits (body size, header count, header line length, header block size) are
enforced as early as the bytes allow, so a peer cannot make the parser buffer
more than about C{max_header_block} or C{max_body_size} bytes for one frame.
Any violation raises L{FrameError}, after which the parser refuses more input.

Header escaping follows the version in L{StompParser.version}: none in STOMP
1.0; C{\\\\}, C{\\n} and C{\\c} in 1.1; also C{\\r} in 1.2.  CONNECT and
CONNECTED frames are never escaped.

What a header block may hold, and why it is checked here
========================================================

The session relays a SEND's header block byte for byte into MESSAGE frames
to other clients (L{Frame.raw}), so a byte the grammar gives a meaning to
must never sit inside a header: a NUL in a value would end the relayed
MESSAGE there and let the rest of the value read, at the receiver, as a
frame of the sender's choosing.  So the command line and the headers may
not hold a NUL, nor any other C0 control character (0x00-0x08, 0x0B, 0x0C,
0x0E-0x1F), nor DEL (0x7F: no header text needs it, HTTP field values
exclude it, terminals act on it, and refusing it costs nothing more).  TAB
is allowed.  LF only ends a line, and CR only as part of a CRLF line ending
(in every version): a bare CR inside a line is refused (a 1.2 client sends
C{\\r}).  Such a block fails with L{FrameError} C{"control character in
header"} or C{"bare CR in header"}.  The check is one translate of the block
and a byte search, and only for a block that differs from the previous one
(a repeated block is not parsed again, see above).

The encoders keep the same rule from the other side: L{encode_frame} and
L{escape_header} raise C{ValueError} rather than write a control character
into a header (an LF or CR that the version cannot escape included), and
L{check_header_text} lets other frontends (HTTP, WebSocket) check the
header text they accept against the same rule.  Bodies may hold any byte:
L{encode_frame} always gives a non-empty body a C{content-length}, so a
NUL in it cannot end the frame early.

Between frames, EOLs (heart-beats) and stray NULs (a terminator sent twice,
as some clients do) are skipped.

Every piece of client input that a L{FrameError} quotes goes through
L{excerpt}: at most 64 characters, non-printable characters escaped, so an
ERROR frame never carries a control byte or a forged frame back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import repeat

__all__ = [
    "HEARTBEAT",
    "Frame",
    "FrameError",
    "StompParser",
    "check_header_text",
    "encode_frame",
    "escape_header",
    "excerpt",
]

HEARTBEAT = b"\n"
"""An EOL heart-beat, as sent between frames."""

# Frames whose headers are never escaped (STOMP 1.2, "Value Encoding").
_RAW_COMMANDS = frozenset({"CONNECT", "CONNECTED"})
# Frames after which the parser provisionally adopts the negotiated version.
_HANDSHAKE_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
_KNOWN_VERSIONS = ("1.2", "1.1", "1.0")  # best first
_COLONS = repeat(":")
# Longest header block whose parse is kept for reuse (see StompParser._parse).
_REUSE_LIMIT = 2048

_UNESCAPE_12 = {"\\": "\\", "n": "\n", "c": ":", "r": "\r"}
_UNESCAPE_11 = {"\\": "\\", "n": "\n", "c": ":"}
# Version -> unescape table; None: no escaping.  Unknown versions use 1.2 rules.
_UNESCAPE: dict[str, dict[str, str] | None] = {
    "1.0": None,
    "1.1": _UNESCAPE_11,
    "1.2": _UNESCAPE_12,
}

_ESCAPE_12 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"})
_ESCAPE_11 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})
_ESCAPE: dict[str, dict[int, str] | None] = {"1.0": None, "1.1": _ESCAPE_11, "1.2": _ESCAPE_12}

# The bytes no header block may hold: C0 controls but TAB, LF and CR; DEL.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
# A translate table mapping each of them to NUL, so that one translate and a
# search for NUL (the int form of `in`: a memchr) find any of them.  Measured
# on a 100-byte block: 0.23 us, against 0.40 us for translate-with-delete and
# a length comparison and 0.83 us for a precompiled regex search.
_FLAG_CONTROL = bytes(0 if b in _CONTROL_BYTES else b for b in range(256))
# The same set, to locate one once it is known to be there (error path).
_CONTROL_RE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Header text that no version can carry; with CR (a 1.1 receiver would read
# a bare CR); with LF and CR (1.0, CONNECT, CONNECTED: nothing is escaped).
# TAB is allowed everywhere.
_UNSENDABLE_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_UNSENDABLE_11 = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_UNSENDABLE_RAW = re.compile("[\x00-\x08\x0a-\x1f\x7f]")
# Version -> what its headers cannot carry.  Unknown versions use 1.2 rules.
_UNSENDABLE = {"1.0": _UNSENDABLE_RAW, "1.1": _UNSENDABLE_11, "1.2": _UNSENDABLE_TEXT}
# The bytes that, in encoded header lines, are either separators (one colon
# per line, one LF between lines) or need escaping or refusing.
_SPECIAL_BYTES = _CONTROL_BYTES + b":\n\r\\"
# Command lines, encoded once: the standard commands skip the check below.
_COMMAND_LINES = {
    command: f"{command}\n".encode()
    for command in (
        "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
        "DISCONNECT", "CONNECT", "STOMP", "CONNECTED", "MESSAGE", "RECEIPT", "ERROR",
    )
}  # fmt: skip

# Parser states: what the pending frame (if any) is waiting for.
_IDLE = 0  # nothing pending
_HEAD = 1  # the blank line that ends the command and headers
_LENGTH = 2  # a known number of bytes (content-length body + NUL)
_NUL = 3  # the NUL that ends a body without content-length


class FrameError(Exception):
    """
    A malformed or over-limit frame.  The session answers it with an ERROR
    frame and closes the connection.

    @ivar message: a short description, for the ERROR frame's C{message}
        header.
    @ivar detail: a longer explanation, for the ERROR frame's body.
    @ivar frames: the frames that were completed by the same
        L{StompParser.feed} call before the error, in order (they arrived
        before the offending bytes, so a session may process them first).
    """

    def __init__(self, message: str, detail: str = "") -> None:
        """
        @param message: see L{message}.
        @param detail: see L{detail}.
        """
        super().__init__(message, detail)
        self.message = message
        self.detail = detail
        self.frames: list[Frame] = []

    def __str__(self) -> str:
        return f"{self.message}: {self.detail}" if self.detail else self.message


class Frame:
    """
    One STOMP frame.

    @ivar command: the command line, as received (e.g. C{"SEND"}).
    @ivar headers: header names to values, unescaped; for a repeated header
        only the first occurrence is kept.
    @ivar body: the body bytes (without the terminating NUL).
    @ivar raw: the header lines exactly as received, as C{b"\\nname:value"}
        for each line plus a final C{b"\\n"}, when they hold no escape and
        no CR (so they read the same in every STOMP version); else C{None}.
        The session relays a SEND's headers into MESSAGE frames from it
        without re-encoding them.
    """

    __slots__ = ("command", "headers", "body", "raw")

    def __init__(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        """
        @param command: see L{command}.
        @param headers: see L{headers}; C{None} for none.  Not copied.
        @param body: see L{body}.
        """
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body
        self.raw: bytes | None = None

    def __repr__(self) -> str:
        body = self.body
        if len(body) > 64:
            shown = f"{body[:64]!r}...<{len(body)} bytes>"
        else:
            shown = repr(body)
        return f"Frame({self.command!r}, {self.headers!r}, {shown})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (
            self.command == other.command
            and self.headers == other.headers
            and self.body == other.body
        )

    __hash__ = None  # type: ignore[assignment]  # mutable


def excerpt(data: bytes | str, limit: int = 64) -> str:
    """
    A short, printable rendering of client input, for an error message.

    Whatever a client sent, the result holds no control character and no
    character a terminal or a STOMP parser would act on, so it can go into
    an ERROR frame or a log line as is.

    @param data: the input: bytes (read as UTF-8; a byte that is not is
        shown as C{\\xNN}) or text.
    @param limit: the most characters to return, at least 4.
    @return: C{data} with every non-printable character and the backslash
        escaped as in a Python literal (C{\\x00}, C{\\n}, C{\\\\},
        C{\\u2028}), cut to C{limit} characters, the last three C{...} if
        anything was cut.
    """
    limit = max(limit, 4)
    undecodable = ""  # no lone surrogate in text stands for a byte
    if isinstance(data, str):
        text = data[: limit + 1]
        more = len(data) > limit + 1
    else:
        undecodable = "\udcff"
        # No character takes more than 4 bytes: decode just enough.
        size = 4 * (limit + 1)
        text = bytes(data[:size]).decode("utf-8", "surrogateescape")
        more = len(data) > size
    out = []
    used = 0
    for ch in text:
        if ch.isprintable() and ch != "\\":
            shown = ch
        elif "\udc80" <= ch <= undecodable:  # a byte that is not UTF-8
            shown = f"\\x{ord(ch) - 0xDC00:02x}"
        else:
            shown = ch.encode("unicode_escape").decode("ascii")
        if used + len(shown) > limit:
            more = True
            break
        out.append(shown)
        used += len(shown)
    if more:
        # Drop whole pieces (never half an escape) to make room for "...".
        while out and used > limit - 3:
            used -= len(out.pop())
        out.append("...")
    return "".join(out)


def check_header_text(text: str) -> None:
    """
    Check a header name or value for characters no STOMP header may carry.

    Frontends other than STOMP (HTTP, WebSocket) call this on the header
    text they accept, before it can reach a STOMP client.  Refused: the C0
    control characters but TAB, LF and CR (0x00-0x08, 0x0B, 0x0C,
    0x0E-0x1F), and DEL (0x7F).  LF and CR pass: STOMP 1.2 escapes both
    (1.1 only LF; L{encode_frame} and L{escape_header} refuse what the
    receiver's version cannot carry).

    @param text: a header name or value.
    @raise ValueError: C{"control character U+0000 in header text at index
        3: ..."} with an L{excerpt} of C{text}.
    """
    found = _UNSENDABLE_TEXT.search(text)
    if found is not None:
        raise ValueError(
            f"control character U+{ord(found.group()):04X} in header text"
            f" at index {found.start()}: {excerpt(text)}"
        )


def _unescape(text: str, table: dict[str, str], version: str) -> str:
    """
    Undo STOMP header escaping.

    @param text: an escaped header name or value containing a backslash.
    @param table: escape character to replacement, for C{version}.
    @param version: the STOMP version, for the error message.
    @return: C{text} unescaped.
    @raise FrameError: on an escape sequence undefined in C{version}.
    """
    out = []
    i = 0
    find = text.find
    while True:
        j = find("\\", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        replacement = table.get(text[j + 1 : j + 2])
        if replacement is None:
            raise FrameError(
                "undefined escape sequence in header",
                f"{excerpt(text[j : j + 2])} is not a STOMP {version} escape, in {excerpt(text)}",
            )
        out.append(replacement)
        i = j + 2


class StompParser:
    """
    An incremental STOMP frame parser: feed it bytes as they arrive, get
    complete frames back.  Any split of a byte stream yields the same frames.

    @ivar version: the STOMP version that governs header unescaping:
        C{"1.0"} (none, the default until a CONNECT is seen), C{"1.1"} or
        C{"1.2"}.  The session sets it to the negotiated version after
        CONNECT.  So that frames a client pipelines behind its CONNECT (in
        the same read) decode right, the parser itself switches,
        provisionally, to the highest version named in a CONNECT/STOMP
        frame's C{accept-version} (or a CONNECTED frame's C{version}).
    @ivar max_body_size: largest body accepted, in bytes.
    @ivar max_headers: most header lines in one frame.
    @ivar max_header_line: longest line (command or header, without its
        EOL) in bytes.
    @ivar max_header_block: largest command + headers block, including the
        EOLs and the blank line, in bytes.
    """

    __slots__ = (
        "_version",
        "max_body_size",
        "max_headers",
        "max_header_line",
        "max_header_block",
        "_state",
        "_chunks",
        "_have",
        "_need",
        "_tail",
        "_error",
        "_joins",
        "_crlf",
        "_last_raw",
        "_last",
    )

    def __init__(
        self,
        max_body_size: int = 16 * 1024 * 1024,
        max_headers: int = 1000,
        max_header_line: int = 8192,
        max_header_block: int = 65536,
    ) -> None:
        """
        @param max_body_size: see L{max_body_size}.
        @param max_headers: see L{max_headers}.
        @param max_header_line: see L{max_header_line}.
        @param max_header_block: see L{max_header_block}.
        """
        self._version = "1.0"
        self.max_body_size = max_body_size
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        self.max_header_block = max_header_block
        self._state = _IDLE
        # The pending frame: its bytes so far (from its first byte), their
        # total length, and what it needs (_LENGTH: the total length it will
        # have including the NUL; _NUL: the offset of its body).
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0
        self._tail = b""  # _HEAD: the last two pending bytes
        self._error: FrameError | None = None
        self._joins = 0  # how often pending chunks were joined (for tests)
        self._crlf = False  # the last header block ended in CRLF (a search hint)
        # The last header block (bytes), and if it was seen twice in a row,
        # its parse: (command, headers, content-length or None, relay bytes).
        self._last_raw: bytes | None = None
        self._last: tuple[str, dict[str, str], int | None, bytes | None] | None = None

    @property
    def version(self) -> str:
        """
        The STOMP version that governs header unescaping (see the class
        docstring).
        """
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        self._version = value
        self._last_raw = None  # a kept parse may depend on the version
        self._last = None

    def discard(self) -> None:
        """
        Forget the unfinished frame (the connection is closing: its bytes
        are not wanted and should not be held through the close).
        """
        self._state = _IDLE
        self._chunks = []
        self._have = 0
        self._tail = b""
        self._last_raw = None
        self._last = None

    @property
    def pending_bytes(self) -> int:
        """
        How many bytes of an unfinished frame the parser holds (0: none), so
        that a transport can put a deadline and a memory budget on frames
        that arrive slowly.  A lone CR that may begin a CRLF heart-beat
        counts as 1.
        """
        return self._have if self._state else 0

    def feed(self, data: bytes) -> list[Frame]:
        """
        Parse more bytes.

        @param data: the next bytes of the stream, of any length.
        @return: every frame completed by C{data}, in order (possibly none).
        @raise FrameError: if the stream holds a malformed or over-limit
            frame.  The parser is then dead: any further call raises again.
        """
        if self._error is not None:
            raise FrameError(self._error.message, self._error.detail)
        frames: list[Frame] = []
        if type(data) is not bytes:
            data = bytes(data)
        try:
            if self._state:
                if not data:
                    return frames
                joined = self._resume(data)
                if joined is None:
                    return frames
                data = joined
            self._parse(data, frames)
        except FrameError as e:
            e.frames = frames
            self._error = e
            raise
        return frames

    def _resume(self, data: bytes) -> bytes | None:
        """
        Add a chunk to the pending frame, joining all pending chunks only if
        the frame can now be completed (or be found to be invalid).  Looks at
        C{data} only, never at the earlier chunks.

        @param data: a new, non-empty chunk.
        @return: the pending bytes and C{data} joined, to parse from the
            start of the pending frame; or C{None} if the frame needs more.
        @raise FrameError: if a body without content-length grows too large.
        """
        chunks = self._chunks
        state = self._state
        have = self._have + len(data)
        if state == _LENGTH:
            if have < self._need:
                chunks.append(data)
                self._have = have
                return None
        elif state == _NUL:
            nul = data.find(b"\0")
            body = (have if nul < 0 else self._have + nul) - self._need
            if body > self.max_body_size:
                raise self._body_too_large(
                    f"body without content-length exceeds {self.max_body_size} bytes"
                )
            if nul < 0:
                chunks.append(data)
                self._have = have
                return None
        else:  # _HEAD
            edge = self._tail + data[:2]
            # find() rather than `in`: bytes.__contains__ first tries the
            # needle as an int and builds and drops a TypeError (0.5 us a
            # test, against 0.2 us).
            if (
                have < self.max_header_block
                and data.find(b"\n\n") < 0
                and data.find(b"\n\r\n") < 0
                and edge.find(b"\n\n") < 0
                and edge.find(b"\n\r\n") < 0
                and self._tail != b"\r"  # a lone CR: maybe a CRLF heart-beat
            ):
                chunks.append(data)
                self._have = have
                self._tail = (self._tail + data[-2:])[-2:]
                return None
        chunks.append(data)
        joined = b"".join(chunks)
        self._joins += 1
        self._state = _IDLE
        self._chunks = []
        self._have = 0
        self._tail = b""
        return joined

    def _pend(self, state: int, buf: bytes, start: int, need: int = 0) -> None:
        """
        Keep the unfinished frame at the end of C{buf}.

        @param state: what the frame waits for (C{_HEAD}, C{_LENGTH}, C{_NUL}).
        @param buf: the buffer being parsed.
        @param start: where the unfinished frame starts in C{buf}.
        @param need: for C{_LENGTH} the frame's total length, for C{_NUL} the
            offset of its body, both counted from C{start}.
        """
        pending = buf[start:]
        self._state = state
        self._chunks = [pending]
        self._have = len(pending)
        self._need = need
        self._tail = pending[-2:]

    def _body_too_large(self, detail: str) -> FrameError:
        return FrameError(f"frame body exceeds max_body_size ({self.max_body_size} bytes)", detail)

    def _parse(self, buf: bytes, frames: list[Frame]) -> None:
        """
        Parse every complete frame in C{buf}, appending them to C{frames},
        and keep an unfinished last frame pending.

        @param buf: bytes that start at a frame boundary.
        @param frames: where to append complete frames.
        @raise FrameError: on a malformed or over-limit frame.
        """
        n = len(buf)
        find = buf.find
        append = frames.append
        max_block = self.max_header_block
        max_line = self.max_header_line
        max_headers = self.max_headers
        max_body = self.max_body_size
        crlf = self._crlf
        partition = str.partition
        new_frame = object.__new__
        pos = 0
        while pos < n:
            # Between frames: EOL heart-beats, and stray NULs (a terminator
            # sent twice), skipped.  A command's first byte takes one
            # comparison to get past this.
            c = buf[pos]
            if c < 14:
                if c == 10 or c == 0:
                    pos += 1
                    continue
                if c == 13:
                    if pos + 1 == n:
                        self._pend(_HEAD, buf, pos)
                        return
                    if buf[pos + 1] == 10:
                        pos += 2
                        continue

            # The end of the command and headers: the first "\n\n" or
            # "\n\r\n" within the limit.  Look first for the style of the
            # previous frame, then for the other style only before that.
            lim = pos + max_block
            unsure = False
            if not crlf:
                end = find(b"\n\n", pos, lim)
                if end >= 0:
                    skip = 2
                    raw = buf[pos:end]
                    # The int form of `in` is a plain memchr: 0.05 us where
                    # b"\r" in raw takes 0.5 us (it first tries the needle
                    # as an int, and builds and drops a TypeError).
                    if 13 in raw:
                        alt = find(b"\n\r\n", pos, end + 2)
                        if alt >= 0:
                            end = alt
                            skip = 3
                            raw = buf[pos:end]
                            crlf = self._crlf = True
                else:
                    end = find(b"\n\r\n", pos, lim)
                    if end >= 0:
                        skip = 3
                        raw = buf[pos:end]
                        crlf = self._crlf = True
            else:
                end = find(b"\n\r\n", pos, lim)
                if end >= 0:
                    skip = 3
                    raw = buf[pos:end]
                    # Unless an LF blank line comes first ("\n\n" in raw,
                    # or raw ending in LF): checked below on the decoded
                    # text of a block not seen before (a block seen before
                    # passed then), which saves a search of the bytes
                    # (0.1 us instead of 0.3 us).  "retry" marks where the
                    # block is parsed again from pos, the LF way.
                    unsure = True
                else:
                    end = find(b"\n\n", pos, lim)
                    skip = 2
                    if end >= 0:
                        crlf = self._crlf = False
                        raw = buf[pos:end]
            if end < 0:
                if n - pos >= max_block:
                    raise FrameError(
                        f"header block exceeds max_header_block ({max_block} bytes)",
                        f"no blank line within the first {max_block} bytes of a frame",
                    )
                self._pend(_HEAD, buf, pos)
                return

            # A producer usually repeats its header block, and the same bytes
            # parse to the same command, headers and content-length: the
            # second time a block is seen in a row its parse is kept, and
            # reused while it repeats (each frame gets its own dict).
            seen = raw == self._last_raw
            last = self._last if seen else None
            if last is not None:
                command, headers, size, relay = last
                headers = headers.copy()
            else:
                if not seen:
                    self._last_raw = raw if end - pos <= _REUSE_LIMIT else None
                    self._last = None
                    # Control characters (see the module docstring).  Not
                    # needed when seen: these bytes passed for the last frame.
                    if 0 in raw.translate(_FLAG_CONTROL):
                        if unsure and find(b"\n\n", pos, end + 2) >= 0:  # retry
                            crlf = self._crlf = False
                            self._last_raw = None
                            continue
                        raise _control_error(raw)
                try:
                    head = raw.decode()
                except UnicodeDecodeError as e:
                    if unsure and find(b"\n\n", pos, end + 2) >= 0:  # retry
                        crlf = self._crlf = False
                        self._last_raw = None
                        continue
                    raise _utf8_error(raw, e) from None
                if unsure and ("\n\n" in head or head[-1] == "\n"):  # retry
                    crlf = self._crlf = False
                    self._last_raw = None
                    continue
                plain = "\r" not in head
                if not plain:
                    head = head.replace("\r\n", "\n")
                    if head[-1] == "\r":
                        head = head[:-1]
                    if "\r" in head:
                        raise _bare_cr_error(raw)
                if end - pos > max_line:
                    self._check_lines(raw)
                lines = head.split("\n")
                command = lines[0]
                count = len(lines) - 1
                size = None
                relay = None
                if count:
                    if count > max_headers:
                        raise FrameError(
                            f"too many headers (max_headers is {max_headers})",
                            f"the frame has {count} header lines",
                        )
                    del lines[0]
                    # Lines without a colon and repeated names both make the
                    # dict too short; the careful path then finds out which.
                    headers = {
                        name: value for name, sep, value in map(partition, lines, _COLONS) if sep
                    }
                    escaped = "\\" in head
                    if len(headers) != count or escaped:
                        headers = self._careful_headers(command, lines)
                    if command in _HANDSHAKE_COMMANDS:
                        self._adopt_version(command, headers)
                        seen = False
                    length = headers.get("content-length")
                    if length is not None:
                        try:
                            if not (length.isdigit() and length.isascii()):
                                raise ValueError(length)
                            size = int(length)
                        except ValueError:
                            raise FrameError(
                                "invalid content-length",
                                "content-length must be a non-negative decimal integer,"
                                f" not {excerpt(length)}",
                            ) from None
                        if size > max_body:
                            raise self._body_too_large(f"content-length is {size}")
                    if plain and not escaped:
                        relay = buf[pos + raw.find(b"\n") : end + 1]
                else:
                    headers = {}
                if seen:
                    self._last = (command, headers.copy(), size, relay)

            body_start = end + skip
            if size is not None:
                stop = body_start + size
                if stop >= n:
                    self._pend(_LENGTH, buf, pos, stop + 1 - pos)
                    return
                if buf[stop]:
                    raise FrameError(
                        "frame not terminated by NUL",
                        f"the byte after the {size}-byte body (content-length) is "
                        f"{excerpt(buf[stop : stop + 1])}, not NUL",
                    )
            else:
                stop = find(b"\0", body_start, body_start + max_body + 1)
                if stop < 0:
                    if n - body_start > max_body:
                        raise self._body_too_large(
                            f"body without content-length exceeds {max_body} bytes"
                        )
                    self._pend(_NUL, buf, pos, body_start - pos)
                    return
            # Frame.__init__ skipped (this sets each of its slots): a
            # Python-level call saved, 0.16 us a frame.
            frame = new_frame(Frame)
            frame.command = command
            frame.headers = headers
            frame.body = buf[body_start:stop]
            frame.raw = relay
            append(frame)
            pos = stop + 1

    def _check_lines(self, raw: bytes) -> None:
        """
        @param raw: a command + headers block, without the final EOL.
        @raise FrameError: if a line of C{raw} is longer than
            L{max_header_line} bytes, its EOL not counted.
        """
        limit = self.max_header_line
        for line in raw.split(b"\n"):
            size = len(line)
            if size > limit and size - line.endswith(b"\r") > limit:
                raise FrameError(
                    f"header line exceeds max_header_line ({limit} bytes)",
                    f"a line of {size} bytes starting {excerpt(line)}",
                )

    def _careful_headers(self, command: str, lines: list[str]) -> dict[str, str]:
        """
        The header dict for the uncommon cases: repeated headers (the first
        occurrence wins) and escape sequences.

        @param command: the frame's command (CONNECT and CONNECTED are never
            unescaped).
        @param lines: the header lines.
        @return: header names to values, unescaped per L{version}.
        @raise FrameError: on a line without a colon or an undefined escape
            sequence.
        """
        version = self._version
        table = None if command in _RAW_COMMANDS else _UNESCAPE.get(version, _UNESCAPE_12)
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise FrameError(
                    "malformed header", f"header line without a colon: {excerpt(line)}"
                )
            if table is not None:
                if "\\" in name:
                    name = _unescape(name, table, version)
                if "\\" in value:
                    value = _unescape(value, table, version)
            if name not in headers:
                headers[name] = value
        return headers

    def _adopt_version(self, command: str, headers: dict[str, str]) -> None:
        """
        Provisionally switch L{version} after a handshake frame.

        @param command: C{CONNECT}, C{STOMP} or C{CONNECTED}.
        @param headers: its headers.
        """
        if command == "CONNECTED":
            offered = [headers.get("version", "1.0")]
        else:
            offered = headers.get("accept-version", "1.0").split(",")
        for version in _KNOWN_VERSIONS:
            if version in offered:
                self.version = version
                return


def _where(raw: bytes, at: int) -> tuple[int, int, bytes]:
    """
    @param raw: a command + headers block.
    @param at: an offset in C{raw}.
    @return: the line number (1 for the command line), the column (from 1)
        and the line of C{raw} at C{at}.
    """
    start = raw.rfind(b"\n", 0, at) + 1
    stop = raw.find(b"\n", at)
    return raw.count(b"\n", 0, at) + 1, at - start + 1, raw[start : stop if stop >= 0 else None]


def _control_error(raw: bytes) -> FrameError:
    """
    @param raw: a command + headers block holding a control character.
    @return: the error that names the first one and where it is.
    """
    found = _CONTROL_RE.search(raw)
    at = found.start() if found is not None else 0
    line, column, text = _where(raw, at)
    return FrameError(
        "control character in header",
        f"byte 0x{raw[at]:02x} at line {line}, column {column} of the frame's header"
        f" (line 1 is the command); no header may carry a control character: {excerpt(text)}",
    )


def _bare_cr_error(raw: bytes) -> FrameError:
    """
    @param raw: a command + headers block holding a CR that does not end a
        line.
    @return: the error that says where the first one is.
    """
    at = raw.find(b"\r")
    while 0 <= at < len(raw) - 1 and raw[at + 1] == 10:
        at = raw.find(b"\r", at + 1)
    at = max(at, 0)
    line, column, text = _where(raw, at)
    return FrameError(
        "bare CR in header",
        f"a CR not followed by LF at line {line}, column {column} of the frame's header"
        f" (STOMP 1.2 clients send it escaped, as \\r): {excerpt(text)}",
    )


def _utf8_error(raw: bytes, e: UnicodeDecodeError) -> FrameError:
    """
    @param raw: a command + headers block that is not UTF-8.
    @param e: the decoding error.
    @return: the error that says where.
    """
    line, column, text = _where(raw, e.start)
    return FrameError(
        "invalid UTF-8 in frame header",
        f"byte 0x{raw[e.start]:02x} at line {line}, column {column} of the frame's header"
        f" ({e.reason}): {excerpt(text)}",
    )


def _unsendable(text: str, found: re.Match[str], where: str) -> ValueError:
    """
    @param text: a command, header name or value.
    @param found: the character of C{text} that cannot be sent.
    @param where: what cannot carry it, e.g. C{"a STOMP 1.1 header"}.
    @return: the error to raise.
    """
    return ValueError(
        f"control character U+{ord(found.group()):04X} cannot be sent in {where}"
        f" (at index {found.start()}): {excerpt(text)}"
    )


def escape_header(value: str, version: str) -> str:
    """
    Escape a header name or value for the wire.

    @param value: the text to escape.
    @param version: C{"1.0"} (returned unchanged), C{"1.1"} (C{\\}, LF and
        C{:} escaped) or C{"1.2"} (CR as well).  Other versions follow 1.2.
    @return: the escaped text.
    @raise ValueError: C{"control character U+000D cannot be sent in a STOMP
        1.1 header (at index 3): ..."} if C{value} holds a character
        C{version} can neither carry nor escape: a C0 control character
        other than TAB, or DEL; in 1.1 a CR; in 1.0 an LF or a CR.
    """
    found = _UNSENDABLE.get(version, _UNSENDABLE_TEXT).search(value)
    if found is not None:
        raise _unsendable(value, found, f"a STOMP {version} header")
    table = _ESCAPE.get(version, _ESCAPE_12)
    if table is None:
        return value
    return value.translate(table)


def _command_line(command: str) -> bytes:
    """
    @param command: a command other than the standard ones.
    @return: C{command} and an LF, encoded.
    @raise ValueError: if C{command} is empty or holds a control character
        (TAB aside).
    """
    if not command:
        raise ValueError("empty command")
    found = _UNSENDABLE_RAW.search(command)
    if found is not None:
        raise _unsendable(command, found, "a command")
    return f"{command}\n".encode()


def _encode_careful(command: str, items: Iterable[tuple[str, str]], version: str) -> bytes:
    """
    The header lines for the uncommon cases: some name or value holds a
    colon, an LF, a CR, a backslash or a control character.

    @param command: the frame's command (CONNECT and CONNECTED are never
        escaped).
    @param items: the header names and values.
    @param version: the STOMP version whose escaping applies.
    @return: the lines, escaped per C{version}, LF between them.
    @raise ValueError: if a name or value holds a character that cannot be
        sent unescaped or escaped (see L{escape_header}), or, where nothing
        is escaped, a name holds a colon.
    """
    if command in _RAW_COMMANDS:
        table = None
        unsendable = _UNSENDABLE_RAW
        where = f"a {command} header"
    else:
        table = _ESCAPE.get(version, _ESCAPE_12)
        unsendable = _UNSENDABLE.get(version, _UNSENDABLE_TEXT)
        where = f"a STOMP {version} header"
    lines = []
    for name, value in items:
        for text in (name, value):
            found = unsendable.search(text)
            if found is not None:
                raise _unsendable(text, found, where)
        if table is not None:
            name = name.translate(table)
            value = value.translate(table)
        elif ":" in name:
            raise ValueError(f"a colon cannot be sent in the name of {where}: {excerpt(name)}")
        lines.append(f"{name}:{value}")
    return "\n".join(lines).encode()


def encode_frame(
    command: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    version: str = "1.2",
) -> bytes:
    """
    Serialise one frame.

    Never writes a control character into the command or a header (see
    the module docstring): better a loud error than a frame that another
    parser reads as two.

    @param command: the command, e.g. C{"MESSAGE"}.
    @param headers: header names to values (str), as a dict or a list of
        pairs (which may repeat a name; the receiver keeps the first).
    @param body: the body (any bytes, NULs included).
    @param version: the STOMP version whose escaping applies (see
        L{escape_header}); CONNECT and CONNECTED frames are never escaped.
    @return: command, headers, a C{content-length} header if C{body} is not
        empty and C{headers} holds none, a blank line, C{body} and a NUL.
    @raise ValueError: if the command is empty or holds a control character;
        if a header name or value holds a character C{version} cannot carry
        (see L{escape_header}), or, in STOMP 1.0 and CONNECT and CONNECTED
        frames, a name holds a colon; if C{headers} has a C{content-length}
        other than C{len(body)} (the receiver would cut the frame there).
    """
    prefix = _COMMAND_LINES.get(command)
    if prefix is None:
        prefix = _command_line(command)
    if headers:
        items = headers.items() if isinstance(headers, dict) else headers
        lines = [f"{name}:{value}" for name, value in items]
        data = "\n".join(lines).encode()
        # Deleting the special bytes leaves exactly one colon per line and
        # one LF between lines missing unless some name or value holds a
        # colon, an LF, a CR, a backslash or a control character: one
        # translate instead of four scans (0.3 us, was 0.5 us for the
        # counts and `in` tests, which missed control characters).
        if len(data) - len(data.translate(None, _SPECIAL_BYTES)) != 2 * len(lines) - 1:
            data = _encode_careful(command, items, version)
        if isinstance(headers, dict):
            length = headers.get("content-length")
        else:
            length = next((value for name, value in headers if name == "content-length"), None)
        if length is None:
            tail = b"\ncontent-length:%d\n\n" % len(body) if body else b"\n\n"
        else:
            if not (
                len(length) <= 19
                and length.isdigit()
                and length.isascii()
                and int(length) == len(body)
            ):
                raise ValueError(
                    f"content-length header {excerpt(length)} does not match"
                    f" the {len(body)}-byte body"
                )
            tail = b"\n\n"
        return b"".join((prefix, data, tail, body, b"\0"))
    if body:
        return b"".join((prefix, b"content-length:%d\n\n" % len(body), body, b"\0"))
    return prefix + b"\n\0"
