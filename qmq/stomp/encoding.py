# -*- test-case-name: tests.test_stomp_session -*-
"""STOMP's mapping of the message model: SEND headers in, MESSAGE headers out.

B{In}: a SEND's headers split into the model (L{qmq.core.message}): the
frame's own lines (C{receipt}, C{transaction}, C{content-length}) and the
C{destination} (the core records the exchange and routing key) are not the
message's; the delivery options (C{priority}, C{expires}, C{ttl},
C{delay}, C{deliver-at}, C{ack-timeout}; C{persistent}) are read by the
session into the model's fields; the headers of L{HEADER_PROPERTIES}
become properties; every other header is an application header
(L{split_headers}).

B{Out}: a MESSAGE frame is written as its subscription's fixed prefix, the
delivery tag, then the message's header block, then the body. The header
block says the model in STOMP's words: C{destination} (derived from the
exchange and routing key), the properties by their STOMP names,
C{priority} (when not 0), C{expires} (epoch ms, when set),
C{persistent:true}, then the application headers as text (L{header_text}).
It is computed once per message (not once per delivery) and cached on the
message (C{Message.cache}, a frontend-owned slot the core never reads):

  - A SEND from a STOMP client keeps its header lines as received (the
    parser's C{Frame.raw}) less the lines the model does not keep (frame
    lines, destination, delivery options: L{relay_block}), behind the
    derived destination: relayed without re-encoding, and the same for
    every message of a producer that repeats its headers; only an
    C{expires} line is added per message. Its other lines say what the
    model says (a property's or an application header's value as sent,
    C{priority} and C{persistent} as the client spelled them). A unique
    block (one with a receipt or transaction line) is cached raw in a
    1-tuple and made on its first delivery, so a publish that nobody
    receives costs nothing here.
  - Anything else (a message from another frontend or recovered by a
    store, a header block the parser could not keep raw, a value with a
    colon from a STOMP 1.0 client) is encoded from the model
    (L{encode_message_headers}): once as bytes when every STOMP version
    reads it the same, else as a 3-tuple of the 1.2, 1.1 and 1.0 forms
    (L{VERSION_INDEX}).

The parser has already refused any header carrying a control character, so
relaying raw lines can never forge a frame.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from qmq.core.message import Message
from qmq.stomp.destinations import destination_of
from qmq.stomp.frame import escape_header

VERSIONS = ("1.2", "1.1", "1.0")
#: Index of a version's form in a 3-tuple header block.
VERSION_INDEX = {"1.2": 0, "1.1": 1, "1.0": 2}

#: STOMP header -> the model's property (RabbitMQ's spellings; AMQP's
#: C{message-id} is C{amqp-message-id}, since STOMP's own C{message-id}
#: names a delivery).
HEADER_PROPERTIES = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "amqp-message-id": "message_id",
    "user-id": "user_id",
    "app-id": "app_id",
    "type": "type",
}
#: The model's property -> its STOMP header.
PROPERTY_HEADERS = {p: h for h, p in HEADER_PROPERTIES.items()}
#: SEND headers read into the model's fields (the session reads them).
OPTION_HEADERS = frozenset(
    ("persistent", "priority", "expires", "ttl", "delay", "deliver-at", "ack-timeout")
)
# SEND headers that are not the message's at all.
_FRAME_HEADERS = frozenset(("destination", "receipt", "transaction", "content-length"))
# SEND headers that are no application header, property or not.
_NOT_APPLICATION = _FRAME_HEADERS | OPTION_HEADERS | HEADER_PROPERTIES.keys()
# ... and those that are no property either.
_NEITHER = _FRAME_HEADERS | OPTION_HEADERS
#: Header names a MESSAGE frame uses for something else than an
#: application header: a protocol that could name an application header so
#: (the HTTP API) refuses to, since a STOMP receiver could not tell them
#: apart.
RESERVED_NAMES = _NOT_APPLICATION | {
    "message-id",
    "subscription",
    "ack",
    "redelivered",
    "x-delivery-count",
}

# The lines of a SEND's headers the model does not keep as they are: the
# frame's own, its destination (derived from the exchange and routing key)
# and the delivery options that are times (the model keeps when, which an
# expires line says). Every one of them, if repeated: one pass of a
# compiled pattern.
_NOT_RELAYED = re.compile(
    rb"\n(?:receipt|transaction|content-length|destination|expires|ttl|delay|deliver-at|ack-timeout)"
    rb":[^\n]*"
)


def split_headers(h: dict[str, str]) -> tuple[dict[str, str] | None, dict[str, Any] | None]:
    """The model's C{(properties, application headers)} of a SEND's
    headers C{h} (each None when empty)."""
    if h.keys() <= _NEITHER:
        return None, None  # the common SEND: destination, persistent, receipt
    properties: dict[str, str] | None = None
    headers: dict[str, Any] | None = None
    for k, v in h.items():
        if k in _NOT_APPLICATION:
            name = HEADER_PROPERTIES.get(k)
            if name is not None:
                if properties is None:
                    properties = {name: v}
                else:
                    properties[name] = v
        elif headers is None:
            headers = {k: v}
        else:
            headers[k] = v
    return properties, headers


def header_text(value: Any) -> str:
    """An application header's value as STOMP text: a string as it is,
    C{true}/C{false}, a number in decimal, C{None} as the empty string,
    bytes in base64."""
    cls = value.__class__
    if cls is str:
        return value  # type: ignore[no-any-return]
    if cls is bool:
        return "true" if value else "false"
    if value is None:
        return ""
    if cls is bytes:
        return base64.b64encode(value).decode()
    return str(value) if cls is int else repr(float(value))


def _escaped(text: str, version: str) -> str:
    if version == "1.0":
        # STOMP 1.0 has no escapes: a line break would end the header (or the
        # header block) early and let a publisher forge headers or frames.
        return text.replace("\r", " ").replace("\n", " ")
    if version == "1.1" and "\r" in text:
        # STOMP 1.1 escapes LF but not CR (a 1.2 sender's "\r").
        text = text.replace("\r", " ")
    return escape_header(text, version)


def message_items(message: Message) -> list[tuple[str, str]]:
    """The MESSAGE headers (name, text) that say C{message}'s model, in
    order: destination, properties, options, application headers."""
    items = [("destination", destination_of(message.exchange, message.routing_key))]
    properties = message.properties
    if properties:
        items.extend([(PROPERTY_HEADERS[k], v) for k, v in properties.items()])
    if message.priority:
        items.append(("priority", str(message.priority)))
    if message.expires:
        items.append(("expires", str(round(message.expires * 1000))))
    if message.persistent:
        items.append(("persistent", "true"))
    headers = message.headers
    if headers:
        items.extend([(k, header_text(v)) for k, v in headers.items()])
    return items


def encode_message_headers(message: Message) -> bytes | tuple:
    """Encode the headers every MESSAGE frame of C{message} shares (see
    L{message_items}).

    The block is one C{"\\nname:value"} per header, then a final C{"\\n"}:
    the session writes it right after the message-id. It is the 1.2-escaped
    block as bytes when every STOMP version reads it the same (the common
    case), else a tuple of the 1.2, 1.1 and 1.0 forms (L{VERSION_INDEX}).
    The result is cached on the message, and the last one is kept: a
    stream of messages that share their headers and properties dicts (a
    publisher's, or those a mesh link decodes: L{qmq.cluster.wire.Decoder})
    and their options is encoded once.
    """
    last = _last
    if (
        message.headers is last[0]
        and message.properties is last[1]
        and message.routing_key == last[2]
        and message.exchange == last[3]
        and message.priority == last[4]
        and message.expires == last[5]
        and message.persistent == last[6]
    ):
        block = message.cache = last[7]
        return block
    items = message_items(message)
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
    _last[:] = (
        message.headers,
        message.properties,
        message.routing_key,
        message.exchange,
        message.priority,
        message.expires,
        message.persistent,
        block,
    )
    return block


# The last block encode_message_headers made, with what it depends on
# (headers and properties by identity: equal dicts may hold 1 and True).
_last: list[Any] = [object(), object(), None, None, None, None, None, None]


def destination_line(exchange: str, routing_key: str) -> bytes | None:
    """The C{destination} line of a relayed block for a publish to
    C{exchange} with C{routing_key}, or None when its text would need
    escaping (then the block is encoded from the model)."""
    text = destination_of(exchange, routing_key)
    if ":" in text or "\\" in text or "\n" in text or "\r" in text:
        return None
    return b"\ndestination:" + text.encode()


def relay_block(raw: bytes, destination: bytes | None) -> bytes | None:
    """The MESSAGE header block made from a SEND's raw header lines, less
    its C{expires} line (L{with_expiry} adds the message's), or None when
    they cannot be relayed as they are.

    @param destination: the derived destination line (L{destination_line}),
        or None (then nothing is relayed).
    """
    if destination is None or raw.count(b":") != raw.count(b"\n") - 1:
        # A colon inside a value (sent unescaped by a STOMP 1.0 client):
        # encode properly for 1.1/1.2 receivers.
        return None
    return destination + _NOT_RELAYED.sub(b"", raw)


def with_expiry(block: bytes, message: Message) -> bytes:
    """A relayed C{block} with C{message}'s C{expires} line, if it has one."""
    expires = message.expires
    if not expires:
        return block
    return b"%b\nexpires:%d\n" % (block[:-1], round(expires * 1000))


def block_for_version(message: Message, cached: tuple, version_index: int) -> bytes:
    """The header block of C{message} for a receiver, from a tuple cache.

    A 3-tuple holds the block per STOMP version (L{VERSION_INDEX}); a
    1-tuple holds a SEND's raw header lines, made into a block here on
    first delivery and cached.
    """
    if len(cached) == 1:
        block = relay_block(cached[0], destination_line(message.exchange, message.routing_key))
        if block is None:
            block = encode_message_headers(message)
            if block.__class__ is not tuple:
                return block  # type: ignore[return-value]
            cached = block  # type: ignore[assignment]
        else:
            block = message.cache = with_expiry(block, message)
            return block
    return cached[version_index]  # type: ignore[no-any-return]
