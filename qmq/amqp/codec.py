# -*- test-case-name: tests.test_amqp_codec -*-
"""AMQP 0-9-1 frames and the message model, both ways.

pamqp (the Python AMQP 0-9-1 frame library) encodes and decodes every
method; this module adds what the hot path needs around it, sans I/O:

    in   L{decode_properties}: a content header's property list to the
         core's message model (L{qmq.core.message}): text properties, typed
         headers, persistence, priority, expiration (a TTL from now).
         Publishers repeat their properties, so the session keeps the last
         decoding per channel and skips pamqp when the bytes are the same.
    out  L{PropertiesEncoder}: a message's model to a property list,
         remembered for the last properties/headers dicts it saw (a
         producer's messages share them); L{deliver_frames} builds
         C{basic.deliver} + content header + body frames with C{struct}
         and bytes formatting, no object per delivery.

The mapping is docs/architecture.rst's table (and docs/amqp.rst): the
AMQP property C{type} is the model's C{type} (pamqp calls it
C{message_type}), C{delivery-mode} 2 is C{persistent}, C{expiration}
(milliseconds, text) is the time from publish at which the message expires,
C{timestamp} is the broker's clock at publish. Header values: AMQP's field
table types map to C{str}, C{int}, C{float}, C{bool}, C{bytes}, C{None},
and nested tables and arrays to C{dict} and C{list}; a timestamp becomes
its epoch seconds (C{int}) and a decimal a C{float}.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

from pamqp import commands, frame

from qmq.core.errors import PreconditionFailed
from qmq.core.message import Message
from qmq.core.options import MAX_PRIORITY, OptionError, read_expiry

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "HEARTBEAT",
    "PROTOCOL_HEADER",
    "PropertiesEncoder",
    "decode_properties",
    "deliver_frames",
    "from_table",
    "method_frame",
]

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
#: A frame's header: type, channel, payload size.
HEAD = struct.Struct(">BHI")
#: The start of a content header's payload: class, weight, body size.
CONTENT = struct.Struct(">HHQ")
_U64 = struct.Struct(">Q")
_TAG = struct.Struct(">QB")

_BASIC = commands.Basic.frame_id  # 60

# Property flags, in wire order (AMQP 0-9-1, basic class).
_F_CONTENT_TYPE = 0x8000
_F_CONTENT_ENCODING = 0x4000
_F_HEADERS = 0x2000
_F_DELIVERY_MODE = 0x1000
_F_PRIORITY = 0x0800
_F_CORRELATION_ID = 0x0400
_F_REPLY_TO = 0x0200
_F_EXPIRATION = 0x0100
_F_MESSAGE_ID = 0x0080
_F_TIMESTAMP = 0x0040
_F_TYPE = 0x0020
_F_USER_ID = 0x0010
_F_APP_ID = 0x0008

#: pamqp's property attribute -> the model's text property.
_TEXT_PROPERTIES = (
    ("content_type", "content_type"),
    ("content_encoding", "content_encoding"),
    ("correlation_id", "correlation_id"),
    ("reply_to", "reply_to"),
    ("message_id", "message_id"),
    ("message_type", "type"),
    ("user_id", "user_id"),
    ("app_id", "app_id"),
)


def method_frame(channel: int, method: Any) -> bytes:
    """A method frame (pamqp's encoder)."""
    return frame.marshal(method, channel)


def short(text: str) -> bytes:
    """An AMQP short string; text over 255 bytes of UTF-8 (a routing key
    STOMP or HTTP allowed: the core bounds keys in characters) is cut at
    a character boundary, as a client could not read more."""
    data = text.encode()
    if len(data) > 255:
        data = fit_short(text).encode()
    return bytes((len(data),)) + data


def fit_short(text: str) -> str:
    """C{text} cut to at most 255 bytes of UTF-8 (for pamqp's encoder)."""
    data = text.encode()
    if len(data) <= 255:
        return text
    return data[:255].decode("utf-8", "ignore")


# -- field tables ---------------------------------------------------------------


def from_table(table: dict | None) -> dict | None:
    """An AMQP field table (as pamqp decodes it) as the model's typed
    headers: bytearray -> bytes, timestamp -> epoch seconds, decimal ->
    float, nested tables and arrays converted alike."""
    if not table:
        return None
    return {k: _from_value(v) for k, v in table.items()}


def _from_value(value: Any) -> Any:
    cls = value.__class__
    if cls is str or cls is int or cls is bool or cls is float or value is None:
        return value
    if cls is bytearray or cls is bytes:
        return bytes(value)
    if cls is dict:
        return {k: _from_value(v) for k, v in value.items()}
    if cls is list:
        return [_from_value(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def encode_table(headers: dict) -> bytes:
    """A field table, its length first (RabbitMQ's types: a float is a
    double, C{d}; pamqp's encoder writes a single-precision C{f}, which
    would change a typed header's value on the way out)."""
    body = b"".join(short(str(k)) + _encode_value(v) for k, v in headers.items())
    return struct.pack(">I", len(body)) + body


_DOUBLE = struct.Struct(">d")


def _encode_value(value: Any) -> bytes:
    cls = value.__class__
    if cls is str:
        data = value.encode()
        return b"S" + struct.pack(">I", len(data)) + data
    if cls is bool:
        return b"t\x01" if value else b"t\x00"
    if cls is int:
        if -(1 << 31) <= value < (1 << 31):
            return b"I" + struct.pack(">i", value)
        if -(1 << 63) <= value < (1 << 63):
            return b"l" + struct.pack(">q", value)
        return _encode_value(str(value))
    if cls is float:
        return b"d" + _DOUBLE.pack(value)
    if value is None:
        return b"V"
    if cls is bytes or cls is bytearray:
        return b"x" + struct.pack(">I", len(value)) + bytes(value)
    if cls is dict:
        return b"F" + encode_table(value)
    if cls is list or cls is tuple:
        body = b"".join(_encode_value(v) for v in value)
        return b"A" + struct.pack(">I", len(body)) + body
    return _encode_value(str(value))


# -- in: a content header's properties ----------------------------------------------


class Decoded:
    """A content header's properties read into the model (see the module
    docstring); shared by the messages of a producer that repeats them.

    @ivar properties: the text properties, or None.
    @ivar headers: the typed headers, or None.
    @ivar persistent: delivery-mode 2.
    @ivar priority: 0 to 9 (AMQP's 10 to 255 count as 9).
    @ivar ttl: the expiration, text as sent, or None.
    @ivar direct_reply: C{reply-to} is C{amq.rabbitmq.reply-to}.
    """

    __slots__ = ("properties", "headers", "persistent", "priority", "ttl", "direct_reply")

    def __init__(self, properties: dict | None, headers: dict | None, persistent: bool,
                 priority: int, ttl: str | None) -> None:
        self.properties = properties
        self.headers = headers
        self.persistent = persistent
        self.priority = priority
        self.ttl = ttl
        #: reply-to names RabbitMQ's direct reply-to pseudo-queue.
        self.direct_reply = properties is not None and properties.get("reply_to") == "amq.rabbitmq.reply-to"

    def expires(self, now: float) -> float:
        """When a message published now expires (0.0: never).
        @raise PreconditionFailed: the expiration is not a count of
            milliseconds (RabbitMQ's "invalid expiration")."""
        if self.ttl is None:
            return 0.0
        try:
            return read_expiry(now, None, self.ttl)
        except OptionError as e:
            raise PreconditionFailed(f"invalid expiration {self.ttl[:40]!r}: {e}", "invalid expiration") from None


def decode_properties(payload: bytes) -> Decoded:
    """A content header's payload (after class, weight and size: the flags
    and property list) read into the model.

    @raise ValueError: the property list is malformed.
    """
    header = commands.Basic.Properties()
    flags = 0
    pos = 0
    index = 0
    while True:
        if len(payload) < pos + 2:
            raise ValueError("content header flags are truncated")
        (part,) = struct.unpack_from(">H", payload, pos)
        pos += 2
        flags |= part << (index * 16)
        index += 1
        if not part & 1:
            break
    try:
        header.unmarshal(flags, payload[pos:])
    except (struct.error, TypeError, KeyError, IndexError, RecursionError) as e:
        raise ValueError(f"malformed property list: {str(e)[:100]}") from None
    properties = None
    for attribute, name in _TEXT_PROPERTIES:
        value = getattr(header, attribute)
        if value is not None:
            if properties is None:
                properties = {}
            properties[name] = value
    priority = header.priority or 0
    if priority > MAX_PRIORITY:
        priority = MAX_PRIORITY
    return Decoded(
        properties,
        from_table(header.headers),
        header.delivery_mode == 2,
        priority,
        header.expiration,
    )


# -- out: a message's properties --------------------------------------------------------


class PropertiesEncoder:
    """A message's property list (content header payload after class,
    weight and size), remembering the last one: a producer's messages
    share their properties and headers dicts (the core never changes them
    in place), their persistence, priority and TTL, and the timestamp
    changes once a second."""

    __slots__ = ("_key", "_value", "_headers", "_table")

    def __init__(self) -> None:
        self._key: tuple = ()
        self._value = b""
        self._headers: Any = None
        self._table = b""

    def encode(self, message: Message) -> bytes:
        properties = message.properties
        headers = message.headers
        ts = int(message.timestamp)
        ttl = round((message.expires - message.timestamp) * 1000) if message.expires else -1
        key = self._key
        if (
            key
            and key[0] is properties
            and key[1] is headers
            and key[2] == ts
            and key[3] == ttl
            and key[4] == message.persistent
            and key[5] == message.priority
        ):
            return self._value
        value = self._encode(properties, headers, ts, ttl, message.persistent, message.priority)
        self._key = (properties, headers, ts, ttl, message.persistent, message.priority)
        self._value = value
        return value

    def _encode(self, properties: dict | None, headers: dict | None, ts: int, ttl: int,
                persistent: bool, priority: int) -> bytes:
        flags = 0
        parts: list[bytes] = []
        get = properties.get if properties else {}.get
        extra: dict[str, Any] = {}

        def text(name: str, flag: int) -> None:
            nonlocal flags
            value = get(name)
            if value is None:
                return
            data = value.encode()
            if len(data) > 255:
                # A short string holds 255 bytes; STOMP and HTTP allow more:
                # carried as a header of the same name rather than cut.
                extra[name] = value
                return
            flags |= flag
            parts.append(bytes((len(data),)) + data)

        text("content_type", _F_CONTENT_TYPE)
        text("content_encoding", _F_CONTENT_ENCODING)
        table_at = len(parts)
        if persistent:
            flags |= _F_DELIVERY_MODE
            parts.append(b"\x02")
        if priority:
            flags |= _F_PRIORITY
            parts.append(bytes((priority,)))
        text("correlation_id", _F_CORRELATION_ID)
        text("reply_to", _F_REPLY_TO)
        if ttl >= 0:
            flags |= _F_EXPIRATION
            parts.append(short(str(ttl)))
        text("message_id", _F_MESSAGE_ID)
        flags |= _F_TIMESTAMP
        parts.append(_U64.pack(ts))
        text("type", _F_TYPE)
        text("user_id", _F_USER_ID)
        text("app_id", _F_APP_ID)
        if headers or extra:
            flags |= _F_HEADERS
            if extra:
                table = encode_table({**(headers or {}), **extra})
            elif headers is self._headers:
                table = self._table
            else:
                table = encode_table(headers)  # type: ignore[arg-type]
                self._headers = headers
                self._table = table
            parts.insert(table_at, table)
        return struct.pack(">H", flags) + b"".join(parts)


def content_frames(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """A content header frame and the body frames (each at most
    C{frame_max} bytes with its header and end octet; none for an empty
    body)."""
    header = CONTENT.pack(_BASIC, 0, len(body)) + properties
    head = HEAD.pack(FRAME_HEADER, channel, len(header)) + header + b"\xce"
    if not body:
        return head
    room = frame_max - 8
    if len(body) <= room:
        return b"%s%s%s\xce" % (head, HEAD.pack(FRAME_BODY, channel, len(body)), body)
    parts = [head]
    for start in range(0, len(body), room):
        chunk = body[start : start + room]
        parts.append(HEAD.pack(FRAME_BODY, channel, len(chunk)))
        parts.append(chunk)
        parts.append(b"\xce")
    return b"".join(parts)


def deliver_frames(
    channel: int, prefix: bytes, tag: int, message: Message, properties: bytes, frame_max: int,
    shorts: dict[str, bytes],
) -> bytes:
    """C{basic.deliver} with its content, in one bytes object.

    @param prefix: the method's class and method ids and the consumer tag
        as a short string (fixed per consumer).
    @param shorts: a cache of encoded short strings (exchange names and
        routing keys repeat).
    """
    exchange = message.exchange
    ex = shorts.get(exchange)
    if ex is None:
        ex = shorts[exchange] = short(exchange)
    key = message.routing_key
    rk = shorts.get(key)
    if rk is None:
        if len(shorts) > 4096:
            shorts.clear()
        rk = shorts[key] = short(key)
    method = b"%s%s%s%s" % (prefix, _TAG.pack(tag, 1 if message.delivery_count else 0), ex, rk)
    body = message.body
    if len(body) <= frame_max - 8 and body:
        header = CONTENT.pack(_BASIC, 0, len(body)) + properties
        return b"%s%s\xce%s%s\xce%s%s\xce" % (
            HEAD.pack(FRAME_METHOD, channel, len(method)), method,
            HEAD.pack(FRAME_HEADER, channel, len(header)), header,
            HEAD.pack(FRAME_BODY, channel, len(body)), body,
        )
    return b"%s%s\xce%s" % (
        HEAD.pack(FRAME_METHOD, channel, len(method)), method,
        content_frames(channel, properties, body, frame_max),
    )
