# -*- test-case-name: tests.test_sockjs_framing -*-
"""SockJS framing, without I/O (the SockJS protocol as sockjs-node speaks it to sockjs-client 1.x).

The server sends the browser four kinds of frame, each a short string:

  - C{o}: the session is open (the first frame of every new session);
  - C{h}: a heart-beat, sent when nothing else was sent for a while, so
    proxies keep an idle connection open;
  - C{a["msg1","msg2"]}: messages, a JSON array of strings;
  - C{c[3000,"Go away!"]}: the session is closed, with a code and a reason.

The browser sends messages back as a JSON array of strings (a WebSocket
message may also be a single JSON string); there is no other framing in that
direction. L{decode_messages} turns such a payload into the list of strings,
or raises L{PayloadError} with the text the protocol prescribes.

Each HTTP transport wraps a frame its own way (L{TRANSPORTS}): xhr and
xhr_streaming end it with a newline, eventsource makes it an event
(C{data: FRAME\\r\\n\\r\\n}; an event stream is UTF-8 by definition, so
its content type names no charset), htmlfile a C{<script>} calling the page's
callback, jsonp a call of the client's callback after an empty comment
(C{/**/cb("o");}, so that no response starts with bytes the caller chose:
the Rosetta Flash mitigation). Streaming transports also
send a prelude first (2 KiB of C{h} for xhr_streaming, a newline for
eventsource, an HTML page padded past 1 KiB for htmlfile), so browsers and
proxies start handing the stream to the page at once.

B{Escaping}. JSON may carry any string, but browsers and proxies mangle some
characters on the way: the protocol makes the server escape, as C{\\uXXXX},
the control characters, U+200C-U+200F, U+2028-U+202F, U+2060-U+206F and
U+FFF0-U+FFFF; lone surrogates are escaped too (they cannot be UTF-8). The
hot path skips the scan for all-ASCII text, which is what STOMP frames
usually are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

__all__ = [
    "HEARTBEAT",
    "OPEN",
    "PayloadError",
    "TRANSPORTS",
    "Wrapping",
    "close_frame",
    "decode_messages",
    "encode_string",
    "htmlfile_prelude",
    "messages_frame",
    "valid_callback",
]

OPEN = "o"
HEARTBEAT = "h"

# What the server must send escaped (sockjs-protocol's escapable_by_server,
# plus the surrogates, which no UTF-8 text can hold).
_ESCAPABLE = re.compile("[\u200c-\u200f\u2028-\u202f\u2060-\u206f\ufff0-\uffff\ud800-\udfff]")
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group(0)):04x}"


def encode_string(text: str) -> str:
    """C{text} as a JSON string literal, escaped as the protocol requires."""
    encoded = _encode(text)
    if encoded.isascii():
        return encoded
    return _ESCAPABLE.sub(_escape, encoded)


def messages_frame(messages: Iterable[str]) -> str:
    """The C{a[...]} frame carrying C{messages}, in order."""
    encoded = _encode(list(messages))
    if not encoded.isascii():
        encoded = _ESCAPABLE.sub(_escape, encoded)
    return "a" + encoded


def close_frame(code: int, reason: str) -> str:
    """The C{c[code,"reason"]} frame."""
    return f"c[{code},{encode_string(reason)}]"


class PayloadError(ValueError):
    """A payload from the client is not what the protocol allows.

    @ivar message: the text for the client (the protocol's wording).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def decode_messages(payload: str | bytes, single_allowed: bool = False) -> list[str]:
    """The messages in a client's payload: a JSON array of strings.

    @param payload: the request body or WebSocket message.
    @param single_allowed: whether a single JSON string is accepted as one
        message (WebSocket messages may be either).
    @raise PayloadError: C{"Payload expected."} for an empty payload,
        C{"Broken JSON encoding."} for anything that is not JSON, or not an
        array of strings.
    """
    if not payload:
        raise PayloadError("Payload expected.")
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise PayloadError("Broken JSON encoding.") from None
    if isinstance(value, str) and single_allowed:
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PayloadError("Broken JSON encoding.")
    return value


# -- transports' wrapping --------------------------------------------------------

_CALLBACK = re.compile(r"^[A-Za-z0-9_.\[\]]{1,256}\Z")


def valid_callback(name: str) -> bool:
    """Whether C{name} may be used as a jsonp/htmlfile callback: letters,
    digits, C{_}, C{.} and brackets only, so it cannot inject script."""
    return bool(_CALLBACK.match(name))


_HTMLFILE_HEAD = """<!doctype html>
<html><head>
  <meta http-equiv="X-UA-Compatible" content="IE=edge" />
  <meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
</head><body><h2>Don't panic!</h2>
  <script>
    document.domain = document.domain;
    var c = parent.%s;
    c.start();
    function p(d) {c.message(d);};
    window.onload = function() {c.stop();};
  </script>
"""


def htmlfile_prelude(callback: str) -> bytes:
    """The page that starts an htmlfile stream, padded past 1 KiB (browsers
    render nothing of a page before its first KiB).

    @param callback: a name that passed L{valid_callback}.
    """
    head = (_HTMLFILE_HEAD % callback).encode()
    return head + b" " * max(0, 1025 - len(head)) + b"\r\n\r\n"


class Wrapping:
    """How one HTTP transport puts frames on the wire.

    @ivar name: the transport's name in the session URL.
    @ivar content_type: the response's content type.
    @ivar streaming: whether one response carries many frames.
    @ivar wrap: frame text -> bytes on the wire (C{callback} is the
        client's callback name for jsonp and htmlfile).
    """

    __slots__ = ("name", "content_type", "streaming", "wrap", "prelude", "needs_callback", "method")

    def __init__(
        self,
        name: str,
        content_type: bytes,
        streaming: bool,
        wrap: Callable[[str, str], bytes],
        prelude: Callable[[str], bytes] | None = None,
        needs_callback: bool = False,
        method: bytes = b"POST",
    ) -> None:
        self.name = name
        self.content_type = content_type
        self.streaming = streaming
        self.wrap = wrap
        self.prelude = prelude
        self.needs_callback = needs_callback
        self.method = method


class Budget:
    """What one receiving response has carried: a poll is done after one
    frame, a stream once its bytes reach C{limit} (the request's own
    receiver and a relayed one count alike)."""

    def __init__(self, wrapping: Wrapping, callback: str, limit: int) -> None:
        self.wrapping = wrapping
        self.callback = callback
        self.streaming = wrapping.streaming
        self.limit = limit
        self.sent = 0

    def spent(self, data: bytes) -> bool:
        """C{data} went: whether the response is done."""
        if not self.streaming:
            return True
        self.sent += len(data)
        return self.sent >= self.limit


def _xhr(frame: str, callback: str) -> bytes:
    return (frame + "\n").encode()


def _eventsource(frame: str, callback: str) -> bytes:
    return ("data: " + frame + "\r\n\r\n").encode()


def _htmlfile(frame: str, callback: str) -> bytes:
    return ("<script>\np(" + encode_string(frame) + ");\n</script>\r\n").encode()


def _jsonp(frame: str, callback: str) -> bytes:
    # The leading comment keeps a response from being read as a Flash file
    # whose first bytes an attacker chose (Rosetta Flash, CVE-2014-4671).
    return ("/**/" + callback + "(" + encode_string(frame) + ");\r\n").encode()


_XHR_STREAMING_PRELUDE = b"h" * 2048 + b"\n"
_JS = b"application/javascript; charset=UTF-8"

#: The receiving transports by their name in the session URL.
TRANSPORTS: dict[str, Wrapping] = {
    "xhr": Wrapping("xhr", _JS, False, _xhr),
    "xhr_streaming": Wrapping(
        "xhr_streaming", _JS, True, _xhr, prelude=lambda _c: _XHR_STREAMING_PRELUDE
    ),
    "eventsource": Wrapping(
        "eventsource", b"text/event-stream", True, _eventsource,
        prelude=lambda _c: b"\r\n", method=b"GET",
    ),
    "htmlfile": Wrapping(
        "htmlfile", b"text/html; charset=UTF-8", True, _htmlfile,
        prelude=htmlfile_prelude, needs_callback=True, method=b"GET",
    ),
    "jsonp": Wrapping("jsonp", _JS, False, _jsonp, needs_callback=True, method=b"GET"),
}
