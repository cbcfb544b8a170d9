# -*- test-case-name: tests.test_web_api_codec -*-
"""The API's two encodings of messages: JSON and Avro (sans I/O).

Publishing, a request body becomes a list of L{Outgoing} messages:

  - JSON (C{application/json}): one message object, or C{{"messages": [...]}};
    a body is C{"body"} with C{"encoding"} saying how it is written:
    C{"utf-8"} (the default: the text is the body) or C{"base64"}.
  - Avro (C{avro/binary}): one datum of C{PublishMessage.avsc} written
    without a header, or an Avro object container file of them (a batch;
    told apart by the container's magic bytes, which a datum never starts
    with since its first field is a byte string whose length is not
    negative).

Delivering, messages become a JSON object C{{"messages": [...]}} whose bodies
say their encoding (C{utf-8} when the body is valid UTF-8, else C{base64};
the client may ask for C{base64} always), or an Avro object container file
of C{Delivery.avsc} records.

Every check names the message (its index in the batch) and the field, so a
client knows what to fix. A container written with QMQ's own schema is
decoded here (L{_read_container}: a varint, a slice and a compare for a
body-only message, strided slices for a block of them of one length), and
deliveries are written here (L{avro_deliveries}); fastavro (several times
faster than the C{avro} package) reads single datums and other schemas.
The tests check both libraries read what QMQ writes and the other way.
JSON goes through orjson.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import io
import json
import os
import struct
import zlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
import orjson
from fastavro.schema import to_parsing_canonical_form

from qmq.core import options
from qmq.core.ids import message_name
from qmq.core.message import PROPERTY_NAMES, Message
from qmq.stomp.destinations import destination_of
from qmq.stomp.encoding import RESERVED_NAMES
from qmq.web.api.problem import Problem, bad_request

JSON = "application/json"
AVRO = "avro/binary"
#: Content types read as Avro.
AVRO_TYPES = (AVRO, "application/avro", "application/x-avro-binary")
OCF_MAGIC = b"Obj\x01"

#: Names of the schema files (in C{qmq/web/api/schemas/}).
SCHEMA_NAMES = ("PublishMessage", "Delivery")

_MESSAGE_FIELDS = frozenset(
    (
        "body",
        "encoding",
        "headers",
        "properties",
        "destination",
        "routing_key",
        "priority",
        "ttl",
        "delay",
        "persistent",
        "expires",
        "deliver_at",
        "ack_timeout",
    )
)
#: The properties a message may carry (the model's, L{PROPERTY_NAMES}).
_PROPERTIES = frozenset(PROPERTY_NAMES)
#: An integer header value is an Avro long.
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
#: The longest header name or value accepted, in characters.
MAX_HEADER_TEXT = 8192
#: Most headers one message carries.
MAX_HEADERS = 1000


def schema_text(name: str) -> str:
    """The text of schema C{name} (a member of L{SCHEMA_NAMES})."""
    return resources.files("qmq.web.api").joinpath("schemas", f"{name}.avsc").read_text("utf-8")


_SCHEMAS = {name: fastavro.parse_schema(json.loads(schema_text(name))) for name in SCHEMA_NAMES}
#: Parsing Canonical Forms: a container written with our own schema is read
#: without resolving each record against it.
_CANONICAL = {name: to_parsing_canonical_form(sch) for name, sch in _SCHEMAS.items()}


def schema(name: str) -> Any:
    """The parsed (fastavro) schema C{name}."""
    return _SCHEMAS[name]


@dataclass(slots=True)
class Outgoing:
    """A message to publish, checked.

    @ivar destination: the destination named in the message, or None.
    @ivar routing_key: the routing key named in the message, or None.
    @ivar headers: application headers (typed values), or None.
    @ivar body: the payload.
    @ivar priority: 0 to 9.
    @ivar ttl: milliseconds from the publish until it expires, or None.
    @ivar delay: milliseconds from the publish before its first delivery,
        or None.
    @ivar persistent: keep on disk in durable queues.
    @ivar properties: the model's text properties, or None.
    @ivar timing: C{(expires, deliver at, ack timeout)} as the core's
        options parser reads them (epoch ms, epoch ms, seconds; each None
        when not given), or None for none of them.
    """

    destination: str | None
    routing_key: str | None
    headers: dict[str, Any] | None
    body: bytes
    priority: int = 0
    ttl: int | None = None
    delay: int | None = None
    persistent: bool = False
    properties: dict[str, str] | None = None
    timing: tuple | None = None


#: A message to publish as parsed: an L{Outgoing}, or for the common
#: message that has only a body (no headers, priority 0, no TTL or delay,
#: not persistent) just the body's bytes (no object per message).
Parsed = Outgoing | bytes


def outgoing(m: Parsed) -> Outgoing:
    """C{m} as an L{Outgoing} (a bare body becomes one with the defaults)."""
    return Outgoing(None, None, None, m) if m.__class__ is bytes else m  # type: ignore[return-value,arg-type]


def _where(index: int | None) -> str:
    return "the message" if index is None else f"message {index}"


def _header_value(value: Any, name: str, where: str, json: bool) -> Any:
    """An application header's value as the model keeps it (JSON writes
    bytes as C{{"base64": TEXT}})."""
    cls = value.__class__
    if cls is str:
        if len(value) > MAX_HEADER_TEXT:
            raise bad_request(f"{where}: header {name[:40]!r} is longer than {MAX_HEADER_TEXT} characters")
        if "\x00" in value:
            raise bad_request(f"{where}: header {name[:40]!r} contains a NUL character")
        return value
    if cls is int:
        if not _LONG_MIN <= value <= _LONG_MAX:
            raise bad_request(f"{where}: header {name[:40]!r} is an integer out of the 64-bit range")
        return value
    if value is None or cls is bool or cls is float:
        return value
    if cls is bytes and not json:
        if len(value) > MAX_HEADER_TEXT:
            raise bad_request(f"{where}: header {name[:40]!r} is longer than {MAX_HEADER_TEXT} bytes")
        return value
    if json and cls is dict and value.keys() == {"base64"} and value["base64"].__class__ is str:
        try:
            data = base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{where}: header {name[:40]!r} is not valid base64", "bad-base64") from None
        return _header_value(data, name, where, False)
    raise bad_request(
        f"{where}: header {name[:40]!r} must be a string, a number, true, false, null or "
        f'{{"base64": "..."}} (bytes), not {type(value).__name__}'
    )


def _check_headers(headers: Any, where: str, json: bool = True) -> dict[str, Any] | None:
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise bad_request(f"{where}: 'headers' must be an object")
    if len(headers) > MAX_HEADERS:
        raise bad_request(f"{where}: more than {MAX_HEADERS} headers")
    out = None
    for k, v in headers.items():
        if not k or len(k) > MAX_HEADER_TEXT:
            raise bad_request(f"{where}: header {k[:40]!r} is empty or longer than {MAX_HEADER_TEXT} characters")
        if "\x00" in k:
            raise bad_request(f"{where}: header {k[:40]!r} contains a NUL character")
        kept = _header_value(v, k, where, json)
        if kept is not v:
            if out is None:
                out = dict(headers)
            out[k] = kept
    if not headers.keys().isdisjoint(RESERVED_NAMES):
        bad = sorted(headers.keys() & RESERVED_NAMES)
        raise bad_request(
            f"{where}: header(s) {', '.join(bad)} are the broker's (a property, a delivery option or "
            "a STOMP frame's own header): use the message's fields"
        )
    return (out if out is not None else headers) or None


def _check_properties(properties: Any, where: str) -> dict[str, str] | None:
    if properties is None:
        return None
    if properties.__class__ is not dict:
        raise bad_request(f"{where}: 'properties' must be an object of strings")
    if not properties.keys() <= _PROPERTIES:
        unknown = sorted(properties.keys() - _PROPERTIES)
        raise bad_request(f"{where}: unknown propert(ies) {', '.join(map(repr, unknown))}; a message has "
                          f"{', '.join(PROPERTY_NAMES)}")
    for k, v in properties.items():
        if v.__class__ is not str:
            raise bad_request(f"{where}: property {k!r} must be a string")
        if len(v) > MAX_HEADER_TEXT or "\x00" in v:
            raise bad_request(f"{where}: property {k!r} is longer than {MAX_HEADER_TEXT} characters or "
                              "contains a NUL character")
    return properties or None


def _optional_text(value: Any, name: str, where: str) -> str | None:
    if value is None or value.__class__ is str:
        return value
    raise bad_request(f"{where}: {name!r} must be a string")


def check_message(
    body: bytes,
    headers: Any,
    destination: Any,
    routing_key: Any,
    priority: Any,
    ttl: Any,
    delay: Any,
    persistent: Any,
    where: str,
    properties: Any = None,
    json: bool = True,
    timing: tuple | None = None,
) -> Outgoing:
    """An L{Outgoing} from decoded fields. @raise Problem: a field is bad.

    The delivery options (C{priority}, C{ttl}, C{delay}, and C{timing}:
    expires, deliver at, ack timeout in the core's units) are checked by
    the core's one parser (L{qmq.core.options}), with the bounds every
    frontend shares; the frontend reads their times at publish.
    """
    if persistent.__class__ is not bool:
        raise bad_request(f"{where}: 'persistent' must be true or false")
    if timing is not None and timing == (None, None, None):
        timing = None
    if (
        priority != 0
        or priority.__class__ is not int
        or ttl is not None
        or delay is not None
        or timing is not None
    ):
        for name, value in (("priority", priority), ("ttl", ttl), ("delay", delay)):
            if value.__class__ is str:  # text is STOMP's spelling, not this API's
                raise bad_request(f"{where}: {name!r} must be a number, not a string")
        expires, deliver_at, ack_timeout = timing or (None, None, None)
        try:
            options.read(0.0, priority, expires, ttl, delay, deliver_at, ack_timeout)
        except options.OptionError as e:
            name = _FIELD_NAMES.get(e.option, e.option)
            raise bad_request(f"{where}: {e.describe(repr(name))}") from None
    return Outgoing(
        _optional_text(destination, "destination", where),
        _optional_text(routing_key, "routing_key", where),
        _check_headers(headers, where, json),
        body,
        priority,
        ttl,
        delay,
        persistent,
        _check_properties(properties, where),
        timing,
    )


#: The options parser's names of the options this API spells otherwise.
_FIELD_NAMES = {"deliver-at": "deliver_at", "ack-timeout": "ack_timeout"}


def _json_seconds(obj: dict, name: str, where: str, ms: bool) -> Any:
    """A JSON time field (seconds, as the API's deliveries write times) as
    the options parser reads it: epoch ms (C{ms}), or seconds."""
    value = obj.get(name)
    if value is None:
        return None
    if value.__class__ not in (int, float) or not value >= 0:
        raise bad_request(f"{where}: {name!r} must be a number of seconds, not {value!r}"[:200])
    if not ms:
        return value
    if value > options.MAX_EPOCH_MS / 1000:
        raise bad_request(f"{where}: {name!r} must be at most {options.MAX_EPOCH_MS // 1000} seconds")
    return round(value * 1000)


def _whole(value: Any) -> Any:
    """A JSON number that is whole (C{7.0}: JSON Schema's integers include
    it, and some encoders write every number so) as an int."""
    if value.__class__ is float and value.is_integer():
        return int(value)
    return value


def _json_message(obj: Any, index: int | None) -> Outgoing:
    where = _where(index)
    if obj.__class__ is not dict:
        raise bad_request(f"{where} must be a JSON object")
    if not obj.keys() <= _MESSAGE_FIELDS:
        unknown = sorted(obj.keys() - _MESSAGE_FIELDS)
        raise bad_request(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a message has "
                          f"{', '.join(sorted(_MESSAGE_FIELDS))}")
    # JSON spells "not given" by leaving a field out (the OpenAPI document
    # allows no null): a null destination must not pass for an absent one.
    for name, value in obj.items():
        if value is None:
            raise bad_request(f"{where}: {name!r} is null; leave the field out or give a value")
    text = obj.get("body")
    if text.__class__ is not str:
        raise bad_request(f"{where}: 'body' must be a string (UTF-8 text, or base64 with \"encoding\": \"base64\")")
    encoding = obj.get("encoding", "utf-8")
    if encoding == "utf-8":
        try:
            body = text.encode()
        except UnicodeEncodeError:
            raise bad_request(f"{where}: 'body' holds a lone surrogate (not UTF-8 text)") from None
    elif encoding == "base64":
        try:
            body = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{where}: 'body' is not valid base64", "bad-base64") from None
    else:
        raise bad_request(f"{where}: 'encoding' must be \"utf-8\" or \"base64\", got {encoding!r}")
    return check_message(
        body,
        obj.get("headers"),
        obj.get("destination"),
        obj.get("routing_key"),
        _whole(obj.get("priority", 0)),
        _whole(obj.get("ttl")),
        _whole(obj.get("delay")),
        obj.get("persistent", False),
        where,
        obj.get("properties"),
        True,
        (
            _json_seconds(obj, "expires", where, True),
            _json_seconds(obj, "deliver_at", where, True),
            _json_seconds(obj, "ack_timeout", where, False),
        )
        if "expires" in obj or "deliver_at" in obj or "ack_timeout" in obj
        else None,
    )


def parse_json(data: bytes, max_batch: int) -> tuple[list[Outgoing], bool]:
    """The messages of a JSON publish body and whether it was a batch.

    @raise Problem: bad JSON, a bad message, too many messages.
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"The body is not valid JSON: {e}", "bad-json") from None
    if doc.__class__ is dict and "messages" in doc:
        if len(doc) != 1:
            raise bad_request("A batch is {\"messages\": [...]} with no other field")
        items = doc["messages"]
        if items.__class__ is not list:
            raise bad_request("'messages' must be an array of message objects")
        if not items:
            raise bad_request("'messages' is empty")
        if len(items) > max_batch:
            raise too_many(len(items), max_batch)
        # The common batch, every message {"body": "text"}, in one
        # comprehension: any other message (not an object, another or one
        # more field, a body that is not text or not UTF-8) raises here or
        # is left out, and the loop below reads each message as it is.
        try:
            bodies: list[Parsed] = [m["body"].encode() for m in items if len(m) == 1]
        except (TypeError, KeyError, AttributeError, UnicodeEncodeError):
            pass
        else:
            if len(bodies) == len(items):
                return bodies, True
        out: list[Parsed] = []
        append = out.append
        for i, m in enumerate(items):
            # The common message, {"body": "text"}, without a call.
            if m.__class__ is dict and len(m) == 1:
                text = m.get("body")
                if text.__class__ is str:
                    try:
                        append(text.encode())
                        continue
                    except UnicodeEncodeError:
                        pass
            append(_json_message(m, i))
        return out, True
    # The common message, {"body": "text"}, without a call, as in a batch.
    if doc.__class__ is dict and len(doc) == 1:
        text = doc.get("body")
        if text.__class__ is str:
            try:
                return [text.encode()], False
            except UnicodeEncodeError:
                pass
    return [_json_message(doc, None)], False


def too_many(n: int, max_batch: int) -> Problem:
    return Problem(
        413,
        "batch-too-large",
        f"{n} messages in one request; this broker takes at most {max_batch} (http_api.max_batch).",
    )


def _avro_message(rec: Any, index: int | None) -> Outgoing:
    return check_message(
        rec["body"],
        rec["headers"],
        rec["destination"],
        rec["routing_key"],
        rec["priority"],
        rec["ttl"],
        rec["delay"],
        rec["persistent"],
        _where(index),
        rec.get("properties"),
        False,
        (_millis(rec.get("expires")), _millis(rec.get("deliver_at")), rec.get("ack_timeout")),
    )


def _millis(value: Any) -> Any:
    """A timestamp-millis as fastavro reads it (a datetime) back to epoch
    ms, as the container reader here gives it."""
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    return value


class _Bad(ValueError):
    """Bad Avro found by L{_read_container}."""


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag varint (an Avro int or long) at C{pos}, and the position after it."""
    b = data[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    n = b & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise _Bad("a varint longer than 10 bytes")


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _long(data, pos)
    end = pos + n
    if n < 0 or end > len(data):
        raise _Bad("a byte string runs past its block")
    return data[pos:end], end


def _string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _bytes(data, pos)
    try:
        return raw.decode(), pos
    except UnicodeDecodeError:
        raise _Bad("a string is not UTF-8") from None


def _read_map(data: bytes, pos: int, kind: Any) -> tuple[dict[str, Any], int]:
    """An Avro map whose values C{kind} reads (its blocks, a negative
    count followed by the block's size)."""
    out: dict[str, Any] = {}
    while True:
        count, pos = _long(data, pos)
        if count == 0:
            return out, pos
        if count < 0:
            count = -count
            _, pos = _long(data, pos)
        for _ in range(count):
            key, pos = _string(data, pos)
            out[key], pos = kind(data, pos)


_unpack_double = struct.Struct("<d").unpack_from


def _double(data: bytes, pos: int) -> tuple[float, int]:
    if pos + 8 > len(data):
        raise _Bad("a double runs past its block")
    return _unpack_double(data, pos)[0], pos + 8


def _typed(data: bytes, pos: int) -> tuple[Any, int]:
    """An application header's value: a union of null, boolean, long,
    double, string and bytes (in that order, L{HEADER_UNION})."""
    branch, pos = _long(data, pos)
    if branch == 4:
        return _string(data, pos)
    if branch == 0:
        return None, pos
    if branch == 1:
        flag = data[pos]
        if flag > 1:
            raise _Bad(f"a boolean byte is {flag}")
        return flag == 1, pos + 1
    if branch == 2:
        return _long(data, pos)
    if branch == 3:
        return _double(data, pos)
    if branch == 5:
        return _bytes(data, pos)
    raise _Bad(f"union branch {branch} of a 6-branch union")


def _optional(data: bytes, pos: int, kind: Any) -> tuple[Any, int]:
    branch, pos = _long(data, pos)
    if branch == 0:
        return None, pos
    if branch != 1:
        raise _Bad(f"union branch {branch} of a 2-branch union")
    return kind(data, pos)


#: After a message's body, the rest of a PublishMessage with every default
#: (empty headers, null destination and routing key, priority 0, null TTL
#: and delay, no properties, null expires, deliver_at and ack_timeout) and
#: persistent false, or true.
_DEFAULT_TAIL = b"\x00" * 11
_PERSISTENT_TAIL = b"\x00" * 6 + b"\x01" + b"\x00" * 4
_TAIL = len(_DEFAULT_TAIL)
#: Most bytes one deflated block of a container may inflate to.
MAX_INFLATED = 64 << 20
#: Container headers seen (their bytes) -> (codec, whether the writer schema
#: is ours), so a client's repeated header costs one parse.
_HEADERS: dict[bytes, tuple[str, bool]] = {}


def _header(data: bytes) -> tuple[str, bool, bytes, int]:
    """A container's codec, whether its writer schema is QMQ's, its sync
    marker and where its first block starts."""
    meta, pos = _read_map(data, 4, _bytes)
    sync = data[pos : pos + 16]
    if len(sync) != 16:
        raise _Bad("the header ends early")
    head = data[:pos]
    known = _HEADERS.get(head)
    if known is None:
        codec_name = meta.get("avro.codec", b"null").decode("utf-8", "replace")
        try:
            ours = to_parsing_canonical_form(fastavro.parse_schema(json.loads(meta["avro.schema"]))) == _CANONICAL[
                "PublishMessage"
            ]
        except Exception:  # noqa: BLE001 - fastavro will say what is wrong with it
            ours = False
        known = (codec_name, ours)
        if len(_HEADERS) >= 64:
            _HEADERS.clear()
        _HEADERS[head] = known
    return known[0], known[1], sync, pos + 16


def _uniform(block: bytes, count: int) -> list[bytes] | None:
    """The bodies of a block whose C{count} records are body-only messages
    (every other field at its default) with bodies of one length, or None.

    Such a block is one record's layout repeated: the same length prefix,
    then a body, then L{_DEFAULT_TAIL}. That is checked a column at a time
    (each byte position outside the bodies, over every record, by one
    strided slice), and the bodies are cut with one more slice each: no
    per-record decoding at all.
    """
    if count < 2 or not block:
        return None
    try:
        n, start = _long(block, 0)
    except (_Bad, IndexError):
        return None
    size = start + n + _TAIL
    if n < 0 or size * count != len(block) or not block.startswith(_DEFAULT_TAIL, start + n):
        return None
    for j in (*range(start), *range(start + n, size)):
        if block[j::size] != block[j : j + 1] * count:
            return None
    return [block[i : i + n] for i in range(start, len(block), size)]


def _read_container(data: bytes, max_batch: int) -> list[Parsed] | None:
    """The messages of an object container file written with QMQ's own
    schema, uncompressed or deflated, decoded here: a body-only message
    (the common case) costs a varint, a slice and a compare, a third of
    fastavro's record (which builds a dict of eight fields). None for
    another schema or codec (fastavro reads those).

    @raise _Bad: bad Avro. @raise Problem: a bad message, too many.
    """
    codec_name, ours, sync, pos = _header(data)
    if not ours or codec_name not in ("null", "deflate"):
        return None
    out: list[Parsed] = []
    append = out.append
    end = len(data)
    while pos < end:
        count, pos = _long(data, pos)
        size, pos = _long(data, pos)
        if count < 0 or size < 0 or pos + size + 16 > end:
            raise _Bad("a block runs past the end of the file")
        block = data[pos : pos + size]
        pos += size
        if data[pos : pos + 16] != sync:
            raise _Bad("a block is not followed by the file's sync marker")
        pos += 16
        if codec_name == "deflate":
            inflater = zlib.decompressobj(-15)
            try:
                block = inflater.decompress(block, MAX_INFLATED)
            except zlib.error as e:
                raise _Bad(f"a deflated block does not inflate: {e}") from None
            if inflater.unconsumed_tail:
                raise _Bad(f"a deflated block inflates to more than {MAX_INFLATED} bytes")
        if len(out) + count > max_batch:
            raise too_many(len(out) + count, max_batch)
        blen = len(block)
        bodies = _uniform(block, count)
        if bodies is not None:
            out += bodies
            continue
        p = 0
        startswith = block.startswith
        for _ in range(count):
            # _bytes, inlined for the body.
            b = block[p]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = block[p + 1]
                if c < 0x80:  # 64 to 8191 bytes
                    v = (b & 0x7F) | (c << 7)
                    n = (v >> 1) ^ -(v & 1)
                    p += 2
                else:
                    n, p = _long(block, p)
            q = p + n
            if n < 0 or q > blen:
                raise _Bad("a body runs past its block")
            body = block[p:q]
            if startswith(_DEFAULT_TAIL, q):
                append(body)
                p = q + _TAIL
                continue
            if startswith(_PERSISTENT_TAIL, q):
                append(Outgoing(None, None, None, body, persistent=True))
                p = q + _TAIL
                continue
            headers, p = _read_map(block, q, _typed)
            destination, p = _optional(block, p, _string)
            routing_key, p = _optional(block, p, _string)
            priority, p = _long(block, p)
            ttl, p = _optional(block, p, _long)
            delay, p = _optional(block, p, _long)
            flag = block[p]
            if flag > 1:
                raise _Bad(f"a boolean byte is {flag}")
            p += 1
            properties, p = _read_map(block, p, _string)
            expires, p = _optional(block, p, _long)
            deliver_at, p = _optional(block, p, _long)
            ack_timeout, p = _optional(block, p, _double)
            append(check_message(body, headers, destination, routing_key, priority, ttl, delay, flag == 1,
                                 _where(len(out)), properties, False, (expires, deliver_at, ack_timeout)))
        if p != blen:
            raise _Bad(f"a block has {blen - p} bytes after its {count} records")
    return out


def parse_avro(data: bytes, max_batch: int) -> tuple[list[Parsed], bool]:
    """The messages of an Avro publish body and whether it was a batch.

    @raise Problem: bad Avro, a bad message, too many messages.
    """
    sch = _SCHEMAS["PublishMessage"]
    if data.startswith(OCF_MAGIC):
        try:
            fast = _read_container(data, max_batch)
        except (_Bad, IndexError) as e:
            detail = str(e) if isinstance(e, _Bad) else "it ends early"
            raise bad_request(
                f"The body is not an Avro object container file of qmq.api.v1.PublishMessage: {detail}",
                "bad-avro",
            ) from None
        if fast is not None:
            if not fast:
                raise bad_request("The Avro container file holds no message")
            return fast, True
        out: list[Parsed] = []
        try:
            reader = fastavro.reader(io.BytesIO(data))
            if to_parsing_canonical_form(reader.writer_schema) != _CANONICAL["PublishMessage"]:
                # Another (compatible) schema: resolve every record against
                # ours (about twice the cost of reading our own).
                reader = fastavro.reader(io.BytesIO(data), sch)
            for i, rec in enumerate(reader):
                if i >= max_batch:
                    raise too_many(i + 1, max_batch)
                out.append(_avro_message(rec, i))
        except Problem:
            raise
        except Exception as e:  # fastavro raises many kinds on bad input
            raise bad_request(
                f"The body is not an Avro object container file of qmq.api.v1.PublishMessage: {e}",
                "bad-avro",
            ) from None
        if not out:
            raise bad_request("The Avro container file holds no message")
        return out, True
    buf = io.BytesIO(data)
    try:
        rec = fastavro.schemaless_reader(buf, sch, None)
    except Exception as e:
        raise bad_request(f"The body is not an Avro datum of qmq.api.v1.PublishMessage: {e}", "bad-avro") from None
    if buf.tell() != len(data):
        raise bad_request(
            f"The body has {len(data) - buf.tell()} bytes after its Avro datum (a batch must be an "
            "object container file)",
            "bad-avro",
        )
    return [_avro_message(rec, None)], False


# -- deliveries ------------------------------------------------------------------


def message_destination(message: Message) -> str:
    """The destination a message was published to (named by its exchange
    and routing key, as every frontend names it)."""
    return destination_of(message.exchange, message.routing_key)


def _json_headers(headers: dict[str, Any] | None) -> dict[str, Any]:
    """Application headers as JSON values (bytes as C{{"base64": TEXT}})."""
    if not headers:
        return {}
    for v in headers.values():
        if v.__class__ is bytes:
            return {k: {"base64": base64.b64encode(v).decode()} if v.__class__ is bytes else v
                    for k, v in headers.items()}
    return headers


def published_json(node: str, ids: list[int], stored: int) -> bytes:
    """The answer to a publish, C{{"published": N, "ids": [NAME, ...],
    "stored": K}}, as C{orjson.dumps} writes it, the names
    C{NODE.NUMBER} (L{qmq.core.ids.message_name}).

    orjson writes a list of numbers six times as fast as Python makes their
    names (C{str} of a 16-digit number, then a concatenation, a message):
    the names are the numbers' JSON with the node put before each.

    @param node: the broker's node id.
    @param ids: the messages' numbers.
    @param stored: how many the store made durable.
    """
    if ids:
        name = orjson.dumps(node + ".")[:-1]  # '"NODE.', escaped as JSON needs
        names = b"[" + name + orjson.dumps(ids)[1:-1].replace(b",", b'",' + name) + b'"]'
    else:
        names = b"[]"
    return b'{"published":%d,"ids":%s,"stored":%d}' % (len(ids), names, stored)


def json_delivery(
    message: Message, handle: str | None, seq: int | None, force_base64: bool, node: str
) -> dict:
    """A delivered message as a JSON object.

    @param node: the broker's node id: the C{id} is the message's name,
        C{NODE.NUMBER} (L{qmq.core.ids.message_name}), its C{number} the
        integer."""
    body = message.body
    if force_base64:
        text, encoding = base64.b64encode(body).decode(), "base64"
    else:
        try:
            text, encoding = body.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(body).decode(), "base64"
    d = {
        "id": message_name(node, message.id),
        "number": message.id,
        "destination": message_destination(message),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "headers": _json_headers(message.headers),
        "properties": message.properties or {},
        "body": text,
        "encoding": encoding,
        "timestamp": message.timestamp,
        "redelivered": message.delivery_count > 0,
        "delivery_count": message.delivery_count,
        "priority": message.priority,
        "persistent": message.persistent,
        "expires": message.expires or None,
    }
    if handle is not None:
        d["handle"] = handle
    if seq is not None:
        d["seq"] = seq
    return d


def json_deliveries(
    got: list[tuple[int, Message]], token: str, force_base64: bool, node: str
) -> list[dict]:
    """Received messages (delivery tag, message) as JSON objects with their
    receipt handles (C{TOKEN.TAG}): L{json_delivery} for a batch, without a
    call or a destination's text built per message."""
    if force_base64:
        return [json_delivery(m, f"{token}.{tag}", None, True, node) for tag, m in got]
    out = []
    append = out.append
    names: dict[tuple[str, str], str] = {}
    prefix = token + "."
    named = node + "."  # message_name, inlined
    for tag, m in got:
        if m.headers or m.properties:
            append(json_delivery(m, prefix + str(tag), None, False, node))
            continue
        body = m.body
        try:
            text, encoding = body.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(body).decode(), "base64"
        key = (m.exchange, m.routing_key)
        destination = names.get(key)
        if destination is None:
            destination = names[key] = destination_of(*key)
        count = m.delivery_count
        mid = m.id
        append({
            "id": named + str(mid),
            "number": mid,
            "destination": destination,
            "exchange": m.exchange,
            "routing_key": m.routing_key,
            "headers": {},
            "properties": {},
            "body": text,
            "encoding": encoding,
            "timestamp": m.timestamp,
            "redelivered": count > 0,
            "delivery_count": count,
            "priority": m.priority,
            "persistent": m.persistent,
            "expires": m.expires or None,
            "handle": prefix + str(tag),
        })
    return out


def avro_delivery(message: Message, handle: str | None, seq: int | None, node: str) -> dict:
    """A delivered message as a C{Delivery} record (C{node}: see
    L{json_delivery})."""
    return {
        "handle": handle,
        "id": message_name(node, message.id),
        "number": message.id,
        "seq": seq,
        "destination": message_destination(message),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "headers": message.headers or {},
        "body": message.body,
        "timestamp": int(message.timestamp * 1000),
        "redelivered": message.delivery_count > 0,
        "delivery_count": message.delivery_count,
        "priority": message.priority,
        "persistent": message.persistent,
        "expires": int(message.expires * 1000) if message.expires else None,
        "properties": message.properties or {},
    }


def avro_container(records: list[dict]) -> bytes:
    """An Avro object container file of C{Delivery} records."""
    out = io.BytesIO()
    fastavro.writer(out, _SCHEMAS["Delivery"], records, validator=False)
    return out.getvalue()


def _zigzag(n: int) -> bytes:
    """An Avro int or long (zig-zag varint)."""
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _text(value: str | bytes) -> bytes:
    data = value.encode() if value.__class__ is str else value
    return _zigzag(len(data)) + data  # type: ignore[operator]


def _map(values: dict[str, str] | None) -> bytes:
    """An Avro map of strings."""
    if not values:
        return b"\x00"
    return _zigzag(len(values)) + b"".join(_text(k) + _text(v) for k, v in values.items()) + b"\x00"


_pack_double = struct.Struct("<d").pack


def _typed_value(value: Any) -> bytes:
    """An application header's value in the union of L{_typed}."""
    cls = value.__class__
    if cls is str:
        return b"\x08" + _text(value)
    if value is None:
        return b"\x00"
    if cls is bool:
        return b"\x02\x01" if value else b"\x02\x00"
    if cls is int:
        return b"\x04" + _zigzag(value)
    if cls is float:
        return b"\x06" + _pack_double(value)
    return b"\x0a" + _text(value)  # bytes


def _typed_map(headers: dict[str, Any]) -> bytes:
    """Application headers as an Avro map of the union of L{_typed}."""
    return (
        _zigzag(len(headers))
        + b"".join(_text(k) + _typed_value(v) for k, v in headers.items())
        + b"\x00"
    )


#: The header of QMQ's Delivery containers (their schema; no compression)
#: and their sync marker.
_SYNC = os.urandom(16)
_DELIVERY_HEAD = (
    OCF_MAGIC
    + _zigzag(2)
    + _text("avro.schema")
    + _text(json.dumps(json.loads(schema_text("Delivery")), separators=(",", ":")))
    + _text("avro.codec")
    + _text("null")
    + b"\x00"
    + _SYNC
)


def avro_deliveries(entries: list[tuple[Message, str | None, int | None]], node: str) -> bytes:
    """An Avro object container file of C{Delivery} records, one for each
    (message, receipt handle or None, seq or None), C{node} the broker's
    node id (L{json_delivery}), written here: what
    L{avro_container} of L{avro_delivery} records writes, without a dict
    and fastavro's pass over it per message (8 times as fast)."""
    if not entries:
        return _DELIVERY_HEAD
    parts = []
    append = parts.append
    names: dict[tuple[str, str], bytes] = {}
    stamp = None
    stamp_bytes = size_bytes = b""
    last_size = -1
    named = node + "."  # message_name, inlined
    for m, handle, seq in entries:
        headers = m.headers
        key = (m.exchange, m.routing_key)
        fields = names.get(key)  # type: ignore[assignment]
        if fields is None:
            fields = names[key] = _text(destination_of(*key)) + _text(key[0]) + _text(key[1])
        count = m.delivery_count
        expires = m.expires
        if m.timestamp != stamp:
            stamp = m.timestamp
            stamp_bytes = _zigzag(int(stamp * 1000))
        body = m.body
        size = len(body)
        if size != last_size:
            last_size = size
            size_bytes = _zigzag(size)
        properties = m.properties
        if not (count or m.priority or m.persistent or expires or properties):
            # redelivered, delivery_count, priority, persistent, expires,
            # properties
            tail = b"\x00\x00\x00\x00\x00\x00"
        else:
            tail = (
                (b"\x01" if count > 0 else b"\x00")
                + _zigzag(count)
                + _zigzag(m.priority)
                + (b"\x01" if m.persistent else b"\x00")
                + (b"\x02" + _zigzag(int(expires * 1000)) if expires else b"\x00")
                + _map(properties)
            )
        mid = m.id
        append(b"%b%b%b%b%b%b%b%b%b%b" % (
            b"\x02" + _text(handle) if handle is not None else b"\x00",
            _text(named + str(mid)),
            _zigzag(mid),
            b"\x02" + _zigzag(seq) if seq is not None else b"\x00",
            fields,
            _typed_map(headers) if headers else b"\x00",
            size_bytes,
            body,
            stamp_bytes,
            tail,
        ))
    block = b"".join(parts)
    return _DELIVERY_HEAD + _zigzag(len(entries)) + _zigzag(len(block)) + block + _SYNC


def avro_datum(name: str, record: dict) -> bytes:
    """One datum of schema C{name}, without a header."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _SCHEMAS[name], record)
    return out.getvalue()


def wants_avro(accept: str | bytes | None) -> bool:
    """Whether an C{Accept} header asks for Avro (before JSON)."""
    if not accept:
        return False
    text = (accept.decode("latin-1") if isinstance(accept, bytes) else accept).lower()
    best_avro = best_json = -1.0
    for part in text.split(","):
        kind, _, params = part.strip().partition(";")
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        kind = kind.strip()
        if kind in AVRO_TYPES:
            best_avro = max(best_avro, q)
        elif kind in (JSON, "application/*", "*/*"):
            best_json = max(best_json, q)
    return best_avro > 0 and best_avro >= best_json
