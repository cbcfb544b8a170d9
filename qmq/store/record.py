# -*- test-case-name: tests.test_store_log -*-
"""The commit log's record format: how each change is written as bytes.

A segment file is a header followed by records, back to back. This module
only turns values into bytes and back; L{qmq.store.segment} reads and
writes files, L{qmq.store.index} decides which records are still needed,
L{qmq.store.log} batches them to disk. docs/storage.rst is the reference
for the format; a change to the bytes here changes L{VERSION} and that page.

Every record is framed the same way (little-endian)::

    u32 length   bytes of payload
    u8  type     one of the RECORD_* constants
    u32 crc      zlib.crc32 of the type byte followed by the payload
    ... payload

so a reader can skip a record it does not understand, and a record torn by
a crash or damaged on disk fails its checksum. Messages and their fate
(publish, settle, requeue) have compact C{struct} payloads: they are most
of what is written. Topology changes are rare and small, and their
arguments are free-form: their payload is a JSON object.

A publish record carries every durable queue the message reached, so a
message routed to many queues is written once, and the body goes out as
its own chunk (L{encode_publish} returns the framed head and the body
apart), so a large body is copied once, by the writer's join.

A publish record keeps the message model (L{qmq.core.message}) and nothing
of a protocol: the properties, the typed application headers, the delivery
time and ack timeout (format 4, L{FLAG_MODEL}). Records of formats 1 to 3
kept a STOMP SEND's headers as they came (its destination, its delivery
options, its property headers); they are read into the model
(L{legacy_model}), so what a frontend shows of a recovered message is the
same whatever format kept it.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from qmq.core.message import PROPERTY_NAMES

#: The segment format version written in every segment header. Version 2
#: adds a settle's "kept until" time and the declare-queue flags; version 3
#: writes declare-queue records in binary (L{encode_declare_queue});
#: version 4 writes the message model in publish records (properties, typed
#: headers, delivery time, ack timeout: L{FLAG_MODEL}); a reader of version
#: 4 reads versions 1 to 3 (docs/storage.rst).
VERSION = 4

#: The first bytes of every segment file.
MAGIC = b"\x89QMQLOG\n"

# Record types. Values are on disk: never renumber, only add.
RECORD_PUBLISH = 1
RECORD_SETTLE = 2
RECORD_REQUEUE = 3
RECORD_DECLARE_QUEUE = 4
RECORD_DELETE_QUEUE = 5
RECORD_DECLARE_EXCHANGE = 6
RECORD_DELETE_EXCHANGE = 7
RECORD_BIND = 8
RECORD_UNBIND = 9
#: Exchange-to-exchange bindings (added in 4 without a new format version:
#: a reader that does not know them skips them whole, see docs/storage.rst).
RECORD_BIND_EXCHANGE = 10
RECORD_UNBIND_EXCHANGE = 11

#: Record type -> name (the offline tool prints these).
RECORD_NAMES = {
    RECORD_PUBLISH: "publish",
    RECORD_SETTLE: "settle",
    RECORD_REQUEUE: "requeue",
    RECORD_DECLARE_QUEUE: "declare-queue",
    RECORD_DELETE_QUEUE: "delete-queue",
    RECORD_DECLARE_EXCHANGE: "declare-exchange",
    RECORD_DELETE_EXCHANGE: "delete-exchange",
    RECORD_BIND: "bind",
    RECORD_UNBIND: "unbind",
    RECORD_BIND_EXCHANGE: "bind-exchange",
    RECORD_UNBIND_EXCHANGE: "unbind-exchange",
}

#: Topology records: JSON payloads.
TOPOLOGY_RECORDS = frozenset(
    (
        RECORD_DECLARE_QUEUE,
        RECORD_DELETE_QUEUE,
        RECORD_DECLARE_EXCHANGE,
        RECORD_DELETE_EXCHANGE,
        RECORD_BIND,
        RECORD_UNBIND,
        RECORD_BIND_EXCHANGE,
        RECORD_UNBIND_EXCHANGE,
    )
)

#: Settle reasons on disk, by index (L{qmq.core.store.SETTLE_REASONS} order;
#: only ever appended to).
SETTLE_REASONS = ("ack", "drop", "expire", "purge", "delete", "dead-letter")
_REASON_INDEX = {r: i for i, r in enumerate(SETTLE_REASONS)}

#: Record frame: payload length, type, CRC.
FRAME = struct.Struct("<IBI")
FRAME_SIZE = FRAME.size  # 9

#: The most payload bytes a record may claim: a longer length read back is
#: damage, not a record.
MAX_RECORD = 1 << 30

# Bodies up to this size are copied into the record's head (see
# encode_publish).
_INLINE_BODY = 4096

# Publish payload, fixed part: id, timestamp, expiry (0: none), priority,
# flags, then the lengths of vhost, exchange, routing key, header block, and
# the number of queue names.
_PUBLISH = struct.Struct("<QddBBHHHII")
PUBLISH_FIXED = _PUBLISH.size

#: Publish flags.
FLAG_PERSISTENT = 0x01
#: Headers are C{key NUL value NUL key NUL value} in UTF-8 (no NUL in any).
FLAG_HEADERS_PAIRS = 0x02
#: Headers are a JSON object (a NUL or a value that is not a string; bytes
#: are C{{"base64": TEXT}}).
FLAG_HEADERS_JSON = 0x04
_HEADERS_MASK = FLAG_HEADERS_PAIRS | FLAG_HEADERS_JSON
#: Format 4: the headers are the message's application headers, and
#: nothing else (without it, a record of formats 1 to 3: L{legacy_model}).
FLAG_MODEL = 0x08
#: The header block starts with the properties (L{encode_properties}).
FLAG_PROPERTIES = 0x10
#: The record has a delivery time and an ack timeout (L{TIMING}) between
#: its queue names and its body.
FLAG_TIMING = 0x20
#: Delivery time (epoch seconds, 0: at once) and ack timeout (seconds, 0:
#: the queue's) of a L{FLAG_TIMING} record.
TIMING = struct.Struct("<dd")
# A property: its index in PROPERTY_NAMES and its length; then its UTF-8.
_PROPERTY = struct.Struct("<BI")
_PROPERTIES_LENGTH = struct.Struct("<I")
_PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTY_NAMES)}

# A queue name in a publish record: its length, then its UTF-8 bytes.
_NAME = struct.Struct("<H")

#: The publish payload's fixed part and a queue name's length, public for
#: readers of the format outside the store (L{qmq.spark.segments} reads
#: segment files itself).
PUBLISH_STRUCT = _PUBLISH
NAME_STRUCT = _NAME

# Settle payload: id, reason, vhost length, queue length; then the names,
# then (version 2, a queue with retention) the time the message is kept
# until.
_SETTLE = struct.Struct("<QBHH")
_KEPT = struct.Struct("<d")
# Requeue payload: id, delivery count, vhost length, queue length; names.
_REQUEUE = struct.Struct("<QIHH")

#: CRC of each type byte, the start of every record's checksum.
TYPE_CRC = _TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(256)]

_pack_frame = FRAME.pack
# The same fixed part in two: what changes with every message (id, times,
# priority, flags), and the lengths, which a publisher's stream repeats.
_pack_publish_head = struct.Struct("<QddBB").pack
_pack_publish_lengths = struct.Struct("<HHHII").pack
assert struct.calcsize("<QddBB") + struct.calcsize("<HHHII") == PUBLISH_FIXED
_pack_name = _NAME.pack
_crc32 = zlib.crc32


class RecordError(ValueError):
    """A record's payload does not decode (it passed its checksum: a bug or a
    newer writer)."""


def record_crc(type_: int, payload: bytes | memoryview) -> int:
    """The checksum a record of C{type_} with C{payload} carries."""
    return _crc32(payload, _TYPE_CRC[type_])


def frame(type_: int, payload: bytes) -> bytes:
    """A whole record: frame then payload."""
    return _pack_frame(len(payload), type_, _crc32(payload, _TYPE_CRC[type_])) + payload


# -- publish --------------------------------------------------------------


# Header blocks recently encoded and decoded. Publishers repeat the same
# headers (destination, persistent, content-type), so most publishes find
# theirs here: a hit costs a third of encoding a block and a fifteenth of
# decoding one (recovery). Bounded: emptied when full.
_ENCODED: dict[tuple, tuple[int, bytes]] = {}
_DECODED: dict[bytes, dict] = {}
_MEMO_SIZE = 4096
#: Header names, and values up to this long, decoded once and shared.
_STRINGS: dict[str, str] = {}
_SHARED_VALUE = 16


def _json_value(value: Any) -> Any:
    """A header value JSON has no type for: bytes as C{{"base64": TEXT}}
    (anything else, which no frontend sends, as its text)."""
    if value.__class__ is bytes:
        return {"base64": base64.b64encode(value).decode()}
    return str(value)


def _from_json(headers: dict) -> dict:
    """Headers read from JSON: C{{"base64": TEXT}} values back to bytes."""
    for k, v in headers.items():
        if v.__class__ is dict:
            headers[k] = base64.b64decode(v.get("base64", ""))
    return headers


def encode_headers(headers: dict | None) -> tuple[int, bytes]:
    """The header block of a publish record and its flag.

    The common case (string keys and values with no NUL) is the pairs joined
    by NUL: one join and one encode, about four times cheaper than JSON.
    """
    if headers is None:
        return 0, b""
    try:
        key = tuple(headers.items())
        found = _ENCODED.get(key)
    except TypeError:  # a value that is not hashable
        key = found = None
    if found is not None:
        return found
    try:
        text = "\0".join([x for kv in headers.items() for x in kv])
        if text.count("\0") == 2 * len(headers) - 1 or not headers:
            found = FLAG_HEADERS_PAIRS, text.encode()
    except (TypeError, UnicodeEncodeError):
        pass
    if found is None:
        found = FLAG_HEADERS_JSON, json.dumps(headers, default=_json_value).encode()
    if key is not None and found[0] == FLAG_HEADERS_PAIRS:
        # Only strings are remembered: 1, 1.0 and True are equal keys but
        # different JSON, and no string equals anything but itself.
        if len(_ENCODED) >= _MEMO_SIZE:
            _ENCODED.clear()
        _ENCODED[key] = found
    return found


def decode_headers(flags: int, block: bytes) -> dict | None:
    """The headers dict that L{encode_headers} encoded (a new dict each
    time: the caller may change it); of a L{FLAG_PROPERTIES} block, the
    headers after the properties."""
    if flags & FLAG_PROPERTIES:
        block = block[decode_properties(block)[1] :]
    kind = flags & _HEADERS_MASK
    if kind == FLAG_HEADERS_PAIRS:
        if not block:
            return {}
        return _pairs(block).copy()
    if kind == FLAG_HEADERS_JSON:
        return _from_json(json.loads(block))
    return None


_ENCODED_PROPERTIES: dict[tuple, bytes] = {}
_DECODED_PROPERTIES: dict[bytes, dict[str, str]] = {}


def encode_properties(properties: dict[str, str]) -> bytes:
    """The properties part of a L{FLAG_PROPERTIES} header block: its
    length (u32), then per property its index in L{PROPERTY_NAMES} (u8),
    its length (u32) and its UTF-8 (memoized: publishers repeat them)."""
    key = tuple(properties.items())
    found = _ENCODED_PROPERTIES.get(key)
    if found is None:
        parts = []
        for k, v in key:
            data = v.encode()
            parts.append(_PROPERTY.pack(_PROPERTY_INDEX[k], len(data)) + data)
        body = b"".join(parts)
        found = _PROPERTIES_LENGTH.pack(len(body)) + body
        if len(_ENCODED_PROPERTIES) >= _MEMO_SIZE:
            _ENCODED_PROPERTIES.clear()
        _ENCODED_PROPERTIES[key] = found
    return found


def decode_properties(block: bytes) -> tuple[dict[str, str], int]:
    """The properties at the start of a L{FLAG_PROPERTIES} header block (one
    dict shared by the records with the same ones: never change it) and
    where the headers start."""
    (n,) = _PROPERTIES_LENGTH.unpack_from(block, 0)
    end = 4 + n
    part = block[4:end]
    if len(part) != n:
        raise ValueError("properties longer than their block")
    found = _DECODED_PROPERTIES.get(part)
    if found is None:
        found = {}
        pos = 0
        while pos < n:
            index, length = _PROPERTY.unpack_from(part, pos)
            pos += 5
            if index >= len(PROPERTY_NAMES) or pos + length > n:
                raise ValueError(f"property {index} of {length} bytes does not fit")
            found[PROPERTY_NAMES[index]] = part[pos : pos + length].decode()
            pos += length
        if len(_DECODED_PROPERTIES) >= _MEMO_SIZE:
            _DECODED_PROPERTIES.clear()
        _DECODED_PROPERTIES[part] = found
    return found, end


def encode_model(properties: dict[str, str] | None, headers: dict | None) -> tuple[int, bytes]:
    """The header block of a format 4 publish record and its flags (with
    L{FLAG_MODEL}): the properties if any, then the headers."""
    hflag, hblock = encode_headers(headers)
    if not properties:
        return hflag | FLAG_MODEL, hblock
    return hflag | FLAG_MODEL | FLAG_PROPERTIES, encode_properties(properties) + hblock


# -- formats 1 to 3 ---------------------------------------------------------

# What a STOMP SEND's headers meant (kept as they came by formats 1 to 3):
# the property headers, and the headers that were the frame's or read into
# the message's fields (its destination, derived from the exchange and
# routing key; its options). The STOMP frontend's table as it was: the
# store never imports a protocol.
_LEGACY_PROPERTIES = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "amqp-message-id": "message_id",
    "user-id": "user_id",
    "app-id": "app_id",
    "type": "type",
}
_LEGACY_DROPPED = frozenset(
    ("destination", "persistent", "priority", "expires", "ttl", "delay", "receipt", "transaction",
     "content-length")
)
_LEGACY: dict[bytes, tuple] = {}


def legacy_model(headers: dict | None) -> tuple[dict | None, dict | None, float, float]:
    """The model of the headers a record of formats 1 to 3 kept:
    C{(properties, application headers, delivery time, ack timeout)}
    (None for none; 0.0 for no time)."""
    if not headers:
        return None, None, 0.0, 0.0
    properties = None
    kept = None
    deliver_at = ack_timeout = 0.0
    for k, v in headers.items():
        if k in _LEGACY_DROPPED:
            continue
        name = _LEGACY_PROPERTIES.get(k)
        if name is not None:
            if properties is None:
                properties = {}
            properties[name] = v
        elif k == "deliver-at" or k == "ack-timeout":
            # As formats 1 to 3 were read: a value that does not read is
            # ignored.
            if v.__class__ is not str or len(v) > 19:
                continue
            if k == "deliver-at":
                if v.isascii() and v.isdigit():
                    deliver_at = int(v) / 1000.0
            else:
                try:
                    seconds = float(v)
                except ValueError:
                    continue
                if 0 < seconds < 2**31:
                    ack_timeout = seconds
        else:
            if kept is None:
                kept = {}
            kept[k] = v
    return properties, kept, deliver_at, ack_timeout


def _legacy_block(flags: int, block: bytes) -> tuple:
    """L{legacy_model} of a header block of formats 1 to 3 (memoized for a
    pairs block: one tuple, and dicts, shared by every message that had
    the same headers)."""
    if flags & _HEADERS_MASK != FLAG_HEADERS_PAIRS:
        return legacy_model(decode_headers(flags, block))
    found = _LEGACY.get(block)
    if found is None:
        found = legacy_model(_pairs(block)) if block else (None, None, 0.0, 0.0)
        if len(_LEGACY) >= _MEMO_SIZE:
            _LEGACY.clear()
        _LEGACY[block] = found
    return found


def _pairs(block: bytes) -> dict:
    """The headers of a non-empty pairs block, shared by every caller (a
    memo: copy it before changing it)."""
    found = _DECODED.get(block)
    if found is None:
        parts = block.decode().split("\0")
        if len(parts) & 1:
            raise ValueError("an odd number of header parts")
        # Names and short values are shared between the messages that
        # carry them (a recovered million each held its own "destination",
        # "persistent" and "true": a fifth of its memory).
        strings = _STRINGS
        if len(strings) >= _MEMO_SIZE:
            strings.clear()
        found = {}
        for i in range(0, len(parts), 2):
            k, v = parts[i], parts[i + 1]
            k = strings.setdefault(k, k)
            if len(v) <= _SHARED_VALUE:
                v = strings.setdefault(v, v)
            found[k] = v
        if len(_DECODED) >= _MEMO_SIZE:
            _DECODED.clear()
        _DECODED[block] = found
    return found


# (vhost, exchange, routing key, queues, header items, property items) ->
# (header flags, the publish payload from the lengths to the queue names).
_STATIC: dict[tuple, tuple[int, bytes]] = {}


def _static_part(
    vhost: bytes,
    exchange: str,
    routing_key: str,
    headers: dict | None,
    queues: Sequence[bytes],
    properties: dict | None,
) -> tuple[int, bytes]:
    hflag, hblock = encode_model(properties, headers)
    ex = exchange.encode()
    rk = routing_key.encode()
    qblock = b"".join([_pack_name(len(q)) + q for q in queues])
    lengths = _pack_publish_lengths(len(vhost), len(ex), len(rk), len(hblock), len(queues))
    return hflag, b"".join((lengths, vhost, ex, rk, hblock, qblock))


def publish_static(
    vhost: bytes,
    exchange: str,
    routing_key: str,
    headers: dict | None,
    queues: Sequence[bytes],
    properties: dict | None = None,
) -> tuple[int, bytes]:
    """The part of a publish payload after the id, times, priority and
    flags (the lengths, the names, the header block), which repeats in a
    publisher's stream (memoized), and the header flags to add to the
    flags (L{FLAG_MODEL} and the header block's).

    L{publish_record} makes the record from it.
    """
    try:
        key = (
            vhost,
            exchange,
            routing_key,
            queues,
            tuple(headers.items()) if headers else headers,
            tuple(properties.items()) if properties else None,
        )
        found = _STATIC.get(key)
    except TypeError:  # a header value that is not hashable
        key = found = None
    if found is None:
        found = _static_part(vhost, exchange, routing_key, headers, queues, properties)
        if key is not None and not found[0] & FLAG_HEADERS_JSON:  # strings only (see encode_headers)
            if len(_STATIC) >= _MEMO_SIZE:
                _STATIC.clear()
            _STATIC[key] = found
    return found


def encode_publish(
    message_id: int,
    timestamp: float,
    expiry: float,
    priority: int,
    persistent: bool,
    vhost: bytes,
    exchange: str,
    routing_key: str,
    headers: dict | None,
    body: bytes,
    queues: Sequence[bytes],
    properties: dict | None = None,
    deliver_at: float = 0.0,
    ack_timeout: float = 0.0,
) -> tuple[bytes, bytes]:
    """A publish record as C{(head, tail)}: written one after the other they
    are the record. A small body is inside C{head} (C{tail} is empty); a
    large one is C{tail}, so it is copied once, by the writer's join.

    @param vhost: the virtual host's name, UTF-8 (callers cache it).
    @param queues: the durable queues' names, UTF-8.
    @param expiry: when the message expires (seconds since the epoch), 0
        for never.
    @param properties: the message's properties (L{PROPERTY_NAMES}), or None.
    @param deliver_at: when it may first be delivered (epoch seconds), 0
        for at once.
    @param ack_timeout: its own ack timeout (seconds), 0 for the queue's.
    """
    hflag, static = publish_static(vhost, exchange, routing_key, headers, queues, properties)
    return publish_record(
        message_id,
        timestamp,
        expiry,
        priority,
        hflag | FLAG_PERSISTENT if persistent else hflag,
        static,
        body,
        deliver_at,
        ack_timeout,
    )


_PUBLISH_CRC = _TYPE_CRC[RECORD_PUBLISH]
_pack_timing = TIMING.pack


def publish_record(
    message_id: int,
    timestamp: float,
    expiry: float,
    priority: int,
    flags: int,
    static: bytes,
    body: bytes,
    deliver_at: float = 0.0,
    ack_timeout: float = 0.0,
) -> tuple[bytes, bytes]:
    """A publish record as C{(head, tail)} (see L{encode_publish}) from its
    fields, C{flags} with the header flags in, and its static part (see
    L{publish_static})."""
    if deliver_at or ack_timeout:
        payload = _pack_publish_head(
            message_id, timestamp, expiry, priority, flags | FLAG_TIMING
        ) + static + _pack_timing(deliver_at, ack_timeout)
    else:
        payload = _pack_publish_head(message_id, timestamp, expiry, priority, flags) + static
    if len(body) <= _INLINE_BODY:
        # One checksum call and one chunk instead of two of each.
        payload += body
        return _pack_frame(len(payload), RECORD_PUBLISH, _crc32(payload, _PUBLISH_CRC)) + payload, b""
    crc = _crc32(body, _crc32(payload, _PUBLISH_CRC))
    return _pack_frame(len(payload) + len(body), RECORD_PUBLISH, crc) + payload, body


class Publish:
    """A decoded publish record (what compaction and the tool read back):
    the message model, whatever format wrote it."""

    __slots__ = (
        "id",
        "timestamp",
        "expiry",
        "priority",
        "flags",
        "vhost",
        "exchange",
        "routing_key",
        "headers",
        "queues",
        "body",
        "properties",
        "deliver_at",
        "ack_timeout",
    )

    def __init__(self, fields: tuple) -> None:
        (
            self.id,
            self.timestamp,
            self.expiry,
            self.priority,
            self.flags,
            self.vhost,
            self.exchange,
            self.routing_key,
            self.headers,
            self.queues,
            self.body,
            extra,
        ) = fields
        if extra is None:
            self.properties = None
            self.deliver_at = self.ack_timeout = 0.0
        else:
            self.properties, self.deliver_at, self.ack_timeout = extra

    def __repr__(self) -> str:
        return f"<Publish id={self.id} vhost={self.vhost!r} queues={self.queues!r}>"

    @property
    def persistent(self) -> bool:
        return bool(self.flags & FLAG_PERSISTENT)


def decode_publish(data: bytes, start: int, end: int, with_body: bool = True) -> Publish:
    """Decode the publish payload in C{data[start:end]} (see
    L{decode_publish_fields}).

    @raise RecordError: it does not decode.
    """
    return Publish(decode_publish_fields(data, start, end, with_body))


_unpack_publish = _PUBLISH.unpack_from
_unpack_name = _NAME.unpack_from
_unpack_timing = TIMING.unpack_from


def _model(flags: int, block: bytes, shared: bool) -> tuple:
    """C{(headers, extra)} of a header block: the application headers and
    C{(properties, deliver at, ack timeout)} or None (before the timing
    part is read: its times are 0.0).

    @param shared: the headers dict may be shared (recovery, which never
        changes it); else a caller's own.
    """
    if not flags & FLAG_MODEL:
        properties, headers, deliver_at, ack_timeout = _legacy_block(flags, block)
        if headers is not None and not shared:
            headers = headers.copy()
        if properties is None and not deliver_at and not ack_timeout:
            return headers, None
        return headers, (properties, deliver_at, ack_timeout)
    properties = None
    if flags & FLAG_PROPERTIES:
        properties, cut = decode_properties(block)
        block = block[cut:]
    if not flags & _HEADERS_MASK:
        headers = None
    elif shared and flags & FLAG_HEADERS_PAIRS:
        headers = _pairs(block) if block else {}
    else:
        headers = decode_headers(flags & ~FLAG_PROPERTIES, block)
    return headers, (None if properties is None else (properties, 0.0, 0.0))


def decode_publish_fields(data: bytes, start: int, end: int, with_body: bool = True) -> tuple:
    """The fields of the publish payload in C{data[start:end]}, as a tuple:
    C{(id, timestamp, expiry, priority, flags, vhost, exchange, routing
    key, headers, queue names, body, extra)}, where C{headers} are the
    application headers and C{extra} is None or C{(properties, deliver at,
    ack timeout)} (recovery's hot path: no object).

    @param with_body: False gives the body's length instead of the body
        (a tool counting, recovery leaving bodies on disk).
    @raise RecordError: it does not decode.
    """
    try:
        (mid, ts, expiry, prio, flags, lv, le, lr, lh, nq) = _unpack_publish(data, start)
        pos = start + PUBLISH_FIXED
        b = pos + lv
        vhost = data[pos:b].decode()
        pos = b + le
        exchange = data[b:pos].decode() if le else ""
        b = pos + lr
        routing_key = data[pos:b].decode()
        pos = b + lh
        if flags & (_HEADERS_MASK | FLAG_PROPERTIES):
            headers, extra = _model(flags, data[b:pos], False)
        else:
            headers = extra = None
        if nq == 1:
            (n,) = _unpack_name(data, pos)
            pos += 2
            b = pos + n
            queues: list[str] = [data[pos:b].decode()]
            pos = b
        else:
            queues = []
            for _ in range(nq):
                (n,) = _unpack_name(data, pos)
                pos += 2
                queues.append(data[pos : pos + n].decode())
                pos += n
        if queues and routing_key == queues[0]:
            # Through the default exchange: one string for both.
            routing_key = queues[0]
        if flags & FLAG_TIMING:
            deliver_at, ack_timeout = _unpack_timing(data, pos)
            pos += 16
            extra = (None if extra is None else extra[0], deliver_at, ack_timeout)
        if pos > end:
            raise RecordError("publish record shorter than its fields")
        body = data[pos:end] if with_body else end - pos
    except (struct.error, UnicodeDecodeError, ValueError, TypeError) as e:
        raise RecordError(f"bad publish record: {e}") from None
    return (mid, ts, expiry, prio, flags, vhost, exchange, routing_key, headers, queues, body, extra)


def decode_recovered_publish(data: bytes, start: int, end: int, names: dict[str, str]) -> tuple:
    """L{decode_publish_fields} without the body (its length instead), for
    recovery, which keeps what it decodes for as long as the message
    waits: the headers dict is shared by every message with the same
    headers (the core never changes a message's headers), and each queue
    name found in C{names} (the queues' declarations, as recovery read
    them) is that string, so a queue's name, and the routing key of a
    message sent through the default exchange, are one string, not one
    each.

    @raise RecordError: it does not decode.
    """
    try:
        (mid, ts, expiry, prio, flags, lv, le, lr, lh, nq) = _unpack_publish(data, start)
        pos = start + PUBLISH_FIXED
        b = pos + lv
        vhost = data[pos:b].decode()
        pos = b + le
        exchange = data[b:pos].decode() if le else ""
        b = pos + lr
        routing_key = data[pos:b].decode()
        hstart = b
        pos = b + lh
        hend = pos
        if nq == 1:
            (n,) = _unpack_name(data, pos)
            pos += 2
            b = pos + n
            name = data[pos:b].decode()
            queues: list[str] = [names.get(name, name)]
            pos = b
        else:
            queues = []
            for _ in range(nq):
                (n,) = _unpack_name(data, pos)
                pos += 2
                name = data[pos : pos + n].decode()
                queues.append(names.get(name, name))
                pos += n
        if queues and routing_key == queues[0]:
            routing_key = queues[0]
        if flags & (_HEADERS_MASK | FLAG_PROPERTIES):
            headers, extra = _model(flags, data[hstart:hend], True)
        else:
            headers = extra = None
        if flags & FLAG_TIMING:
            deliver_at, ack_timeout = _unpack_timing(data, pos)
            pos += 16
            extra = (None if extra is None else extra[0], deliver_at, ack_timeout)
        if pos > end:
            raise RecordError("publish record shorter than its fields")
    except (struct.error, UnicodeDecodeError, ValueError, TypeError) as e:
        raise RecordError(f"bad publish record: {e}") from None
    return (mid, ts, expiry, prio, flags, vhost, exchange, routing_key, headers, queues, end - pos, extra)


# -- settle, requeue ------------------------------------------------------


def encode_settle(
    vhost: bytes, queue: bytes, message_id: int, reason: str, kept_until: float = 0.0
) -> bytes:
    """A whole settle record: C{message_id} left C{queue} for C{reason}.

    @param kept_until: with retention, the time (seconds since the epoch)
        until which the log keeps the message for range scans; 0 for none.
    """
    payload = (
        _SETTLE.pack(message_id, _REASON_INDEX[reason], len(vhost), len(queue)) + vhost + queue
    )
    if kept_until:
        payload += _KEPT.pack(kept_until)
    return (
        _pack_frame(len(payload), RECORD_SETTLE, _crc32(payload, _TYPE_CRC[RECORD_SETTLE]))
        + payload
    )


def decode_settle(data: bytes, start: int, end: int) -> tuple[str, str, int, str, float]:
    """C{(vhost, queue, message id, reason, kept until)} of a settle payload
    (kept until is 0.0 when the record has none)."""
    try:
        mid, reason, lv, lq = _SETTLE.unpack_from(data, start)
        pos = start + _SETTLE.size
        names = pos + lv + lq
        if names == end:
            kept = 0.0
        elif names + 8 == end:
            (kept,) = _KEPT.unpack_from(data, names)
        else:
            raise RecordError("settle record of the wrong length")
        vhost = data[pos : pos + lv].decode()
        queue = data[pos + lv : names].decode()
        name = SETTLE_REASONS[reason] if reason < len(SETTLE_REASONS) else f"reason-{reason}"
        return vhost, queue, mid, name, kept
    except (struct.error, UnicodeDecodeError) as e:
        raise RecordError(f"bad settle record: {e}") from None


def encode_requeue(vhost: bytes, queue: bytes, message_id: int, delivery_count: int) -> bytes:
    """A whole requeue record: C{message_id} is back in C{queue}, delivered
    C{delivery_count} times."""
    payload = _REQUEUE.pack(message_id, delivery_count, len(vhost), len(queue)) + vhost + queue
    return (
        _pack_frame(len(payload), RECORD_REQUEUE, _crc32(payload, _TYPE_CRC[RECORD_REQUEUE]))
        + payload
    )


def decode_requeue(data: bytes, start: int, end: int) -> tuple[str, str, int, int]:
    """C{(vhost, queue, message id, delivery count)} of a requeue payload."""
    try:
        mid, count, lv, lq = _REQUEUE.unpack_from(data, start)
        pos = start + _REQUEUE.size
        if pos + lv + lq != end:
            raise RecordError("requeue record of the wrong length")
        return data[pos : pos + lv].decode(), data[pos + lv : end].decode(), mid, count
    except (struct.error, UnicodeDecodeError) as e:
        raise RecordError(f"bad requeue record: {e}") from None


# -- topology -------------------------------------------------------------


#: The first byte of a binary declare-queue payload (format 3); a JSON
#: payload (formats 1 and 2) starts with "{".
DECLARE_BINARY = 1
# Binary declare-queue payload: the tag, flags, since, vhost length, queue
# length; then the names, then the arguments as JSON (none: absent).
_DECLARE = struct.Struct("<BBQHH")
# Its flags byte: the QUEUE_* bits of qmq.store.index, and whether the
# declaration carries them at all (a copy of a format 1 one does not).
_DECLARE_FLAGS_KNOWN = 0x80
_DECLARE_FLAG_BITS = 0x07


def encode_declare_queue(
    vhost: str, queue: str, arguments: dict | None, since: int, flags: int | None
) -> bytes:
    """A whole declare-queue record, binary (format 3): one per durable
    queue, a million of them at times, so not JSON (a third of the time of
    recovering a queue holding one message went to decoding it).

    @param flags: the C{QUEUE_*} bits of L{qmq.store.index}, or None if
        unknown (a copy of a format 1 declaration).
    """
    v = vhost.encode()
    q = queue.encode()
    bits = _DECLARE_FLAGS_KNOWN | flags if flags is not None else 0
    parts = [_DECLARE.pack(DECLARE_BINARY, bits, since, len(v), len(q)), v, q]
    if arguments is not None:
        parts.append(json.dumps(arguments, separators=(",", ":"), default=str).encode())
    payload = b"".join(parts)
    # frame(), inlined: one record per queue made.
    return (
        _pack_frame(len(payload), RECORD_DECLARE_QUEUE, _crc32(payload, _TYPE_CRC[RECORD_DECLARE_QUEUE]))
        + payload
    )


def decode_declare_queue(
    data: bytes, start: int, end: int
) -> tuple[str, str, dict | None, int | None, int]:
    """C{(vhost, queue, arguments, flags, since)} of a binary declare-queue
    payload (one whose first byte is L{DECLARE_BINARY}); flags None when
    the record does not carry them.

    @raise RecordError: it does not decode.
    """
    try:
        tag, bits, since, lv, lq = _DECLARE.unpack_from(data, start)
        if tag != DECLARE_BINARY:
            raise RecordError(f"declare-queue record of unknown kind {tag}")
        pos = start + _DECLARE.size
        names = pos + lv + lq
        if names > end:
            raise RecordError("declare-queue record shorter than its names")
        vhost = data[pos : pos + lv].decode()
        queue = data[pos + lv : names].decode()
        arguments = json.loads(data[names:end]) if names < end else None
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"bad declare-queue record: {e}") from None
    if arguments is not None and not isinstance(arguments, dict):
        raise RecordError("declare-queue arguments are not a JSON object")
    flags = bits & _DECLARE_FLAG_BITS if bits & _DECLARE_FLAGS_KNOWN else None
    return vhost, queue, arguments, flags, since


def encode_topology(type_: int, fields: dict[str, Any]) -> bytes:
    """A whole topology record (a JSON object payload; see docs/storage.rst
    for the keys of each type)."""
    return frame(type_, json.dumps(fields, separators=(",", ":"), default=str).encode())


_scan_json = json.JSONDecoder().scan_once

#: The keys each topology record must have.
TOPOLOGY_FIELDS = {
    RECORD_DECLARE_QUEUE: ("vhost", "queue"),
    RECORD_DELETE_QUEUE: ("vhost", "queue"),
    RECORD_DECLARE_EXCHANGE: ("vhost", "exchange", "type", "auto_delete"),
    RECORD_DELETE_EXCHANGE: ("vhost", "exchange"),
    RECORD_BIND: ("vhost", "queue", "exchange", "key"),
    RECORD_UNBIND: ("vhost", "queue", "exchange", "key"),
    RECORD_BIND_EXCHANGE: ("vhost", "destination", "source", "key"),
    RECORD_UNBIND_EXCHANGE: ("vhost", "destination", "source", "key"),
}


def decode_topology(data: bytes, start: int, end: int, type_: int) -> dict[str, Any]:
    """The JSON object of a topology payload of C{type_}.

    @raise RecordError: not a JSON object, or a key of L{TOPOLOGY_FIELDS}
        is missing.
    """
    if type_ == RECORD_DECLARE_QUEUE and start < end and data[start] == DECLARE_BINARY:
        vhost, queue, arguments, flags, since = decode_declare_queue(data, start, end)
        declared: dict[str, Any] = {
            "vhost": vhost,
            "queue": queue,
            "arguments": arguments,
            "since": since,
        }
        if flags is not None:
            # The bits of qmq.store.index's QUEUE_* (which imports this module).
            declared["auto_delete"] = bool(flags & 1)
            declared["exclusive"] = bool(flags & 2)
            declared["subscription"] = bool(flags & 4)
        return declared
    try:
        text = bytes(data[start:end]).decode()
        try:
            # The C scanner alone: a third of json.loads (recovery reads one
            # declaration per durable queue, a million of them at times).
            fields, stop = _scan_json(text, 0)
            if stop != len(text):
                raise ValueError
        except (StopIteration, ValueError):
            fields = json.loads(text)  # whitespace, or the error message
    except ValueError as e:
        raise RecordError(f"bad topology record: {e}") from None
    if not isinstance(fields, dict):
        raise RecordError("a topology record is not a JSON object")
    missing = [k for k in TOPOLOGY_FIELDS[type_] if k not in fields]
    if missing:
        raise RecordError(f"{RECORD_NAMES[type_]} record without {', '.join(missing)}")
    return fields


def arguments_key(arguments: dict | None) -> str:
    """A canonical text for an arguments dict (bindings are told apart by it)."""
    if not arguments:
        return ""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
