# -*- test-case-name: tests.test_stomp_session -*-
"""MESSAGE header blocks: how a message's headers reach STOMP receivers.

A MESSAGE frame is written as its subscription's fixed prefix, the delivery
tag, then the message's header block, then the body. The header block is
computed once per message (not once per delivery) and cached on the message
(C{Message.cache}, a frontend-owned slot the core never reads):

  - A SEND from a STOMP client keeps its header lines exactly as received
    (the parser's C{Frame.raw}): relayed without re-encoding, only stripped of
    the lines that describe the SEND frame itself (receipt, transaction,
    content-length; L{relay_block}). A unique block (one with a receipt or
    transaction line) is cached raw in a 1-tuple and stripped on its first
    delivery, so a publish that nobody receives costs nothing here.
  - Anything else (a message from another frontend, a header block the
    parser could not keep raw, a value with a colon from a STOMP 1.0 client)
    is encoded from C{Message.headers} (L{encode_message_headers}): once as
    bytes when every STOMP version reads it the same, else as a 3-tuple of
    the 1.2, 1.1 and 1.0 forms (L{VERSION_INDEX}).

The parser has already refused any header carrying a control character, so
relaying raw lines can never forge a frame.
"""

from __future__ import annotations

import re

from qmq.core.message import Message
from qmq.stomp.destinations import destination_of
from qmq.stomp.frame import escape_header

VERSIONS = ("1.2", "1.1", "1.0")
#: Index of a version's form in a 3-tuple header block.
VERSION_INDEX = {"1.2": 0, "1.1": 1, "1.0": 2}
# The lines of a SEND's headers that describe the frame, not the message
# (every one of them, if repeated): one pass of a compiled pattern.
_FRAME_LINES = re.compile(rb"\n(?:receipt|transaction|content-length):[^\n]*")


def _escaped(text: str, version: str) -> str:
    if version == "1.0":
        # STOMP 1.0 has no escapes: a line break would end the header (or the
        # header block) early and let a publisher forge headers or frames.
        return text.replace("\r", " ").replace("\n", " ")
    if version == "1.1" and "\r" in text:
        # STOMP 1.1 escapes LF but not CR (a 1.2 sender's "\r").
        text = text.replace("\r", " ")
    return escape_header(text, version)


def encode_message_headers(message: Message, destination: str | None = None) -> bytes | tuple:
    """Encode the headers every MESSAGE frame of C{message} shares.

    The block is one C{"\\nname:value"} per header, then a final C{"\\n"}:
    the session writes it right after the message-id. It is the 1.2-escaped
    block as bytes when every STOMP version reads it the same (the common
    case), else a tuple of the 1.2, 1.1 and 1.0 forms (L{VERSION_INDEX}).
    The result is cached on the message.
    """
    headers = message.headers
    if destination is None:
        # The destination a STOMP publisher named, else the one its
        # exchange and routing key name.
        destination = (headers or {}).get("destination") or destination_of(
            message.exchange, message.routing_key
        )
    items = [("destination", destination)]
    if headers:
        items.extend(kv for kv in headers.items() if kv[0] != "destination")
    raw = "".join([f"\n{k}:{v}" for k, v in items])
    n = len(items)
    if raw.count(":") == n and raw.count("\n") == n and "\\" not in raw and "\r" not in raw:
        block: bytes | tuple = (raw + "\n").encode()
    else:
        block = tuple(
            ("".join([f"\n{_escaped(k, v_)}:{_escaped(v, v_)}" for k, v in items]) + "\n").encode()
            for v_ in VERSIONS
        )
    message.cache = block
    return block


def relay_block(raw: bytes, message: Message, destination: str | None) -> bytes | tuple:
    """The MESSAGE header block made from a SEND's raw header lines.

    The lines that describe the SEND frame (receipt, transaction,
    content-length) are removed; the rest is relayed as received.
    """
    if raw.count(b":") != raw.count(b"\n") - 1:
        # A colon inside a value (sent unescaped by a STOMP 1.0 client):
        # encode properly for 1.1/1.2 receivers.
        return encode_message_headers(message, destination)
    return _FRAME_LINES.sub(b"", raw)


def block_for_version(message: Message, cached: tuple, version_index: int) -> bytes:
    """The header block of C{message} for a receiver, from a tuple cache.

    A 3-tuple holds the block per STOMP version (L{VERSION_INDEX}); a
    1-tuple holds a SEND's raw header lines not yet stripped of its frame
    lines, done here on first delivery and cached.
    """
    if len(cached) == 1:
        block = relay_block(cached[0], message, None)
        message.cache = block
        if block.__class__ is not tuple:
            return block  # type: ignore[return-value]
        cached = block  # type: ignore[assignment]
    return cached[version_index]  # type: ignore[no-any-return]
