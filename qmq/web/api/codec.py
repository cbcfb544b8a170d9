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
client knows what to fix. Avro is read and written with fastavro (measured
several times faster than the C{avro} package, whose output it reads and
which reads its output: see the interop tests).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from qmq.core.destination import destination_of
from qmq.core.message import Message
from qmq.web.api.problem import Problem, bad_request

JSON = "application/json"
AVRO = "avro/binary"
#: Content types read as Avro.
AVRO_TYPES = (AVRO, "application/avro", "application/x-avro-binary")
OCF_MAGIC = b"Obj\x01"

#: Names of the schema files (in C{qmq/web/api/schemas/}).
SCHEMA_NAMES = ("PublishMessage", "Delivery")

_MESSAGE_FIELDS = frozenset(
    ("body", "encoding", "headers", "destination", "routing_key", "priority", "ttl", "delay", "persistent")
)
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
    @ivar headers: application headers, or None.
    @ivar body: the payload.
    @ivar priority: 0 to 9.
    @ivar ttl: milliseconds to live, or None.
    @ivar delay: milliseconds to wait before publishing, or None.
    @ivar persistent: keep on disk in durable queues.
    """

    destination: str | None
    routing_key: str | None
    headers: dict[str, str] | None
    body: bytes
    priority: int = 0
    ttl: int | None = None
    delay: int | None = None
    persistent: bool = False


def _where(index: int | None) -> str:
    return "the message" if index is None else f"message {index}"


def _check_headers(headers: Any, where: str) -> dict[str, str] | None:
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise bad_request(f"{where}: 'headers' must be an object of strings")
    if len(headers) > MAX_HEADERS:
        raise bad_request(f"{where}: more than {MAX_HEADERS} headers")
    for k, v in headers.items():
        if not isinstance(v, str):
            raise bad_request(f"{where}: header {k!r} must be a string, not {type(v).__name__}")
        if not k or len(k) > MAX_HEADER_TEXT or len(v) > MAX_HEADER_TEXT:
            raise bad_request(f"{where}: header {k[:40]!r} is empty or longer than {MAX_HEADER_TEXT} characters")
        if "\x00" in k or "\x00" in v:
            raise bad_request(f"{where}: header {k[:40]!r} contains a NUL character")
    return headers or None


def _check_int(value: Any, name: str, where: str, low: int, high: int) -> int:
    if value.__class__ is not int or not low <= value <= high:
        raise bad_request(f"{where}: {name!r} must be an integer from {low} to {high}, got {value!r}")
    return value


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
    max_delay: int,
) -> Outgoing:
    """An L{Outgoing} from decoded fields. @raise Problem: a field is bad."""
    if persistent.__class__ is not bool:
        raise bad_request(f"{where}: 'persistent' must be true or false")
    return Outgoing(
        _optional_text(destination, "destination", where),
        _optional_text(routing_key, "routing_key", where),
        _check_headers(headers, where),
        body,
        0 if priority == 0 else _check_int(priority, "priority", where, 0, 9),
        None if ttl is None else _check_int(ttl, "ttl", where, 0, 1 << 40),
        None if delay is None else _check_int(delay, "delay", where, 0, max_delay),
        persistent,
    )


def _json_message(obj: Any, index: int | None, max_delay: int) -> Outgoing:
    where = _where(index)
    if obj.__class__ is not dict:
        raise bad_request(f"{where} must be a JSON object")
    if not obj.keys() <= _MESSAGE_FIELDS:
        unknown = sorted(obj.keys() - _MESSAGE_FIELDS)
        raise bad_request(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a message has "
                          f"{', '.join(sorted(_MESSAGE_FIELDS))}")
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
        obj.get("priority", 0),
        obj.get("ttl"),
        obj.get("delay"),
        obj.get("persistent", False),
        where,
        max_delay,
    )


def parse_json(data: bytes, max_batch: int, max_delay: int) -> tuple[list[Outgoing], bool]:
    """The messages of a JSON publish body and whether it was a batch.

    @raise Problem: bad JSON, a bad message, too many messages.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
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
        return [_json_message(m, i, max_delay) for i, m in enumerate(items)], True
    return [_json_message(doc, None, max_delay)], False


def too_many(n: int, max_batch: int) -> Problem:
    return Problem(
        413,
        "batch-too-large",
        f"{n} messages in one request; this broker takes at most {max_batch} (http_api.max_batch).",
    )


def _avro_message(rec: Any, index: int | None, max_delay: int) -> Outgoing:
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
        max_delay,
    )


def parse_avro(data: bytes, max_batch: int, max_delay: int) -> tuple[list[Outgoing], bool]:
    """The messages of an Avro publish body and whether it was a batch.

    @raise Problem: bad Avro, a bad message, too many messages.
    """
    sch = _SCHEMAS["PublishMessage"]
    if data.startswith(OCF_MAGIC):
        out = []
        try:
            reader = fastavro.reader(io.BytesIO(data))
            if to_parsing_canonical_form(reader.writer_schema) != _CANONICAL["PublishMessage"]:
                # Another (compatible) schema: resolve every record against
                # ours (about twice the cost of reading our own).
                reader = fastavro.reader(io.BytesIO(data), sch)
            for i, rec in enumerate(reader):
                if i >= max_batch:
                    raise too_many(i + 1, max_batch)
                out.append(_avro_message(rec, i, max_delay))
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
    return [_avro_message(rec, None, max_delay)], False


# -- deliveries ------------------------------------------------------------------


def message_destination(message: Message) -> str:
    """The destination a message was published to."""
    headers = message.headers
    if headers:
        d = headers.get("destination")
        if d:
            return d
    return destination_of(message.exchange, message.routing_key)


def _app_headers(message: Message) -> dict[str, str]:
    headers = message.headers
    if not headers:
        return {}
    if "destination" in headers:
        return {k: v for k, v in headers.items() if k != "destination"}
    return headers


def json_delivery(message: Message, handle: str | None, seq: int | None, force_base64: bool) -> dict:
    """A delivered message as a JSON object."""
    body = message.body
    if force_base64:
        text, encoding = base64.b64encode(body).decode(), "base64"
    else:
        try:
            text, encoding = body.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(body).decode(), "base64"
    d = {
        "id": message.id,
        "destination": message_destination(message),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "headers": _app_headers(message),
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


def avro_delivery(message: Message, handle: str | None, seq: int | None) -> dict:
    """A delivered message as a C{Delivery} record."""
    return {
        "handle": handle,
        "id": message.id,
        "seq": seq,
        "destination": message_destination(message),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "headers": _app_headers(message),
        "body": message.body,
        "timestamp": int(message.timestamp * 1000),
        "redelivered": message.delivery_count > 0,
        "delivery_count": message.delivery_count,
        "priority": message.priority,
        "persistent": message.persistent,
        "expires": int(message.expires * 1000) if message.expires else None,
    }


def avro_container(records: list[dict]) -> bytes:
    """An Avro object container file of C{Delivery} records."""
    out = io.BytesIO()
    fastavro.writer(out, _SCHEMAS["Delivery"], records, validator=False)
    return out.getvalue()


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
