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
       the remainder): it skips EOL heart-beats, finds the blank line that
       ends the command and headers with C{bytes.find}, decodes that block as
       UTF-8 in one go, splits it into lines with C{str.split} and builds the
       header dict in one call.  Repeated headers, escapes and malformed
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
"""

from __future__ import annotations

from itertools import repeat

__all__ = [
    "HEARTBEAT",
    "Frame",
    "FrameError",
    "StompParser",
    "encode_frame",
    "escape_header",
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
                f"{text[j : j + 2]!r} is not a STOMP {version} escape, in {text[:200]!r}",
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
            if (
                have < self.max_header_block
                and b"\n\n" not in data
                and b"\n\r\n" not in data
                and b"\n\n" not in edge
                and b"\n\r\n" not in edge
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
        pos = 0
        while pos < n:
            # EOL heart-beats between frames.
            c = buf[pos]
            if c == 10:
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
            if not crlf:
                end = find(b"\n\n", pos, lim)
                if end >= 0:
                    skip = 2
                    raw = buf[pos:end]
                    if b"\r" in raw:
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
                    alt = find(b"\n\n", pos, end + 2)
                    if alt >= 0:
                        end = alt
                        skip = 2
                        crlf = self._crlf = False
                else:
                    end = find(b"\n\n", pos, lim)
                    skip = 2
                    if end >= 0:
                        crlf = self._crlf = False
                if end >= 0:
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
                try:
                    head = raw.decode()
                except UnicodeDecodeError as e:
                    raise FrameError("invalid UTF-8 in frame header", str(e)) from None
                plain = "\r" not in head
                if not plain:
                    head = head.replace("\r\n", "\n")
                    if head[-1] == "\r":
                        head = head[:-1]
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
                                f" not {length[:40]!r}",
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
                        f"{buf[stop : stop + 1]!r}, not NUL",
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
            frame = Frame(command, headers, buf[body_start:stop])
            if relay is not None:
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
                    f"a line of {size} bytes starting {line[:60]!r}",
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
                raise FrameError("malformed header", f"header line without a colon: {line[:200]!r}")
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


def escape_header(value: str, version: str) -> str:
    """
    Escape a header name or value for the wire.

    @param value: the text to escape.
    @param version: C{"1.0"} (returned unchanged), C{"1.1"} (C{\\}, LF and
        C{:} escaped) or C{"1.2"} (CR as well).  Other versions follow 1.2.
    @return: the escaped text.
    """
    table = _ESCAPE.get(version, _ESCAPE_12)
    if table is None:
        return value
    return value.translate(table)


def encode_frame(
    command: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    version: str = "1.2",
) -> bytes:
    """
    Serialise one frame.

    @param command: the command, e.g. C{"MESSAGE"}.
    @param headers: header names to values (str), as a dict or a list of
        pairs (which may repeat a name; the receiver keeps the first).
    @param body: the body.
    @param version: the STOMP version whose escaping applies (see
        L{escape_header}); CONNECT and CONNECTED frames are never escaped.
    @return: command, headers, a C{content-length} header if C{body} is not
        empty and C{headers} holds none, a blank line, C{body} and a NUL.
    """
    if headers:
        items = headers.items() if isinstance(headers, dict) else headers
        lines = [f"{name}:{value}" for name, value in items]
        text = "\n".join(lines)
        table = None if command in _RAW_COMMANDS else _ESCAPE.get(version, _ESCAPE_12)
        # Escape only if some name or value holds a special character: then
        # the text holds an extra colon or LF, a backslash or a CR.
        if table is not None and (
            text.count(":") != len(lines)
            or text.count("\n") != len(lines) - 1
            or "\\" in text
            or (table is _ESCAPE_12 and "\r" in text)
        ):
            text = "\n".join(
                [f"{name.translate(table)}:{value.translate(table)}" for name, value in items]
            )
        if body:
            if isinstance(headers, dict):
                has_length = "content-length" in headers
            else:
                has_length = any(name == "content-length" for name, _ in headers)
            if not has_length:
                text = f"{text}\ncontent-length:{len(body)}"
        head = f"{command}\n{text}\n\n"
    elif body:
        head = f"{command}\ncontent-length:{len(body)}\n\n"
    else:
        head = f"{command}\n\n"
    return b"".join((head.encode(), body, b"\0"))
