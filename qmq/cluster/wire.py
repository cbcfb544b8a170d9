# -*- test-case-name: tests.test_cluster_wire -*-
"""The link protocol's bytes: frames, and messages in them.

A link carries frames back to back, each::

    u32 length   bytes after this field (the type and the payload), big-endian
    u8  type     one of the constants below
    ... payload

Control frames (hello, interest, sync, peers, close) are small JSON
objects; a ping and its pong carry the sender's clock as a big-endian double; a message frame
carries a publish record of the commit log (L{qmq.store.record}, with no
queue names), so a message crosses a link with everything the core's model
holds: exchange and routing key, properties, typed headers, body,
timestamp, priority, expiry, delivery time, ack timeout and persistence
(and the sender's id, which the receiving node replaces with one of its
own: L{qmq.cluster.mesh}). The record's
own frame (length, type, CRC) is kept: a damaged record is refused.

Why not STOMP frames: STOMP's headers are text, and the core's typed
headers and properties would need an encoding of their own on top; the
commit log's record already is that encoding, tested and versioned.

L{FrameReader} takes bytes as they come and returns whole frames; a frame
announced longer than the link's C{max_frame} is refused at its header,
before anything is buffered, so a link's input buffer never holds more than
one frame.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from qmq.core.message import Message
from qmq.store import record

__all__ = [
    "CANCEL",
    "CANCELLED",
    "CLOSE",
    "CONFIRM",
    "CONSUME",
    "DECLARE",
    "DELIVER",
    "FORWARD",
    "HELLO",
    "INTEREST",
    "MESSAGE",
    "PING",
    "PEERS",
    "PONG",
    "SETTLE",
    "SYNC",
    "VERSION",
    "FrameError",
    "FrameReader",
    "decode_json",
    "decode_message",
    "encode_json",
    "encode_message",
    "frame",
]

#: The link protocol's version, in every hello (2: queues across nodes).
VERSION = 2

# Frame types. Never renumber: peers of other versions read them.
HELLO = 1
PING = 2
PONG = 3
INTEREST = 4
SYNC = 5
MESSAGE = 6
CLOSE = 7
PEERS = 8
# Queues across nodes (qmq.cluster.queues).
FORWARD = 9  # u64 sequence number, then a message (a publish to the queue on its home)
CONFIRM = 10  # JSON: {"ok": [seq, ...], "failed": [[seq, code, text], ...]}
CONSUME = 11  # JSON: {"id": n, "vhost": v, "queue": q, "window": w}
DELIVER = 12  # u32 consumer id, u64 delivery tag, u32 delivery count, then a message
SETTLE = 13  # JSON: {"s": [[id, tag, outcome], ...]}: 0 ack, 1 requeue, 2 drop
CANCEL = 14  # JSON: {"id": n}: the consumer goes (its unacked messages go back)
CANCELLED = 15  # JSON: {"id": n, "code": c, "reason": text}: the home ended it
DECLARE = 16  # JSON: {"vhost": v, "queue": q, "arguments": {...}}: declared on another node

NAMES = {
    HELLO: "hello",
    PING: "ping",
    PONG: "pong",
    INTEREST: "interest",
    SYNC: "sync",
    MESSAGE: "message",
    CLOSE: "close",
    PEERS: "peers",
    FORWARD: "forward",
    CONFIRM: "confirm",
    CONSUME: "consume",
    DELIVER: "deliver",
    SETTLE: "settle",
    CANCEL: "cancel",
    CANCELLED: "cancelled",
    DECLARE: "declare",
}

_HEADER = struct.Struct(">IB")
HEADER_SIZE = _HEADER.size
_CLOCK = struct.Struct(">d")


class FrameError(ValueError):
    """The peer sent bytes that are not a frame of this protocol."""


def frame(type_: int, payload: bytes = b"") -> bytes:
    """One frame."""
    return _HEADER.pack(len(payload) + 1, type_) + payload


def encode_json(type_: int, value: Any) -> bytes:
    """A control frame."""
    return frame(type_, json.dumps(value, separators=(",", ":")).encode())


def decode_json(payload: bytes) -> Any:
    """@raise FrameError: not a JSON object."""
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameError(f"bad control frame: {e}") from None
    if not isinstance(value, dict):
        raise FrameError("bad control frame: not a JSON object")
    return value


def encode_clock(type_: int, seconds: float) -> bytes:
    """A ping or a pong."""
    return frame(type_, _CLOCK.pack(seconds))


def decode_clock(payload: bytes) -> float:
    if len(payload) != _CLOCK.size:
        raise FrameError("bad ping: 8 bytes expected")
    return float(_CLOCK.unpack(payload)[0])


#: A forward frame's sequence number.
SEQ = struct.Struct(">Q")
#: A deliver frame's consumer id, delivery tag and delivery count.
DELIVERY = struct.Struct(">IQI")


def encode_message(vhost: bytes, message: Message, type_: int = MESSAGE, prefix: bytes = b"") -> list[bytes]:
    """A message frame, as chunks to write (a large body is not copied):
    by default a C{message} frame; a C{forward} or C{deliver} frame with
    its C{prefix} (L{SEQ}, L{DELIVERY}) before the record."""
    head, tail = record.encode_publish(
        message.id,
        message.timestamp,
        message.expires,
        message.priority,
        message.persistent,
        vhost,
        message.exchange,
        message.routing_key,
        message.headers,
        message.body,
        (),
        message.properties,
        message.deliver_at,
        message.ack_timeout,
    )
    size = len(head) + len(tail) + len(prefix) + 1
    return [_HEADER.pack(size, type_) + prefix, head, tail] if tail else [
        _HEADER.pack(size, type_) + prefix + head
    ]


def decode_message(payload: bytes, start: int = 0, end: int | None = None) -> tuple[str, Message]:
    """The virtual host's name and the message in a message frame's
    payload, C{payload[start:end]} (L{Decoder} does the same faster).

    @raise FrameError: it is not a whole, undamaged publish record.
    """
    return Decoder().decode(payload, start, len(payload) if end is None else end, check=True)


class Decoder:
    """Decodes one link's message frames.

    The record's own frame is checked (its type and length) and, with
    C{check}, its CRC (a link leaves integrity to TCP and TLS, and does not
    pay it per message). A link's messages repeat their exchange, routing
    key, headers and properties: the last of each is reused when the same
    comes again, so a publisher's stream shares one headers dict (which
    nothing changes once published, L{qmq.core.message}) and the core checks
    it and the routing key once (L{qmq.core.channel.Channel.publish}).
    """

    __slots__ = ("_strings", "_model")

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}
        self._model: tuple[Any, Any, Any] = (None, None, None)

    def decode(self, data: bytes, start: int, end: int, check: bool = False) -> tuple[str, Message]:
        head = start + record.FRAME_SIZE
        if end - start < record.FRAME_SIZE:
            raise FrameError("bad message frame: too short")
        length, type_, crc = record.FRAME.unpack_from(data, start)
        if type_ != record.RECORD_PUBLISH or length != end - head:
            raise FrameError("bad message frame: not a publish record")
        if check and record.record_crc(type_, memoryview(data)[head:end]) != crc:
            raise FrameError("bad message frame: checksum")
        try:
            fields = record.decode_publish_fields(data, head, end)
        except record.RecordError as e:
            raise FrameError(f"bad message frame: {e}") from None
        (mid, ts, expiry, prio, flags, vhost, exchange, key, headers, _, body, extra) = fields
        strings = self._strings
        if len(strings) > 4096:
            strings.clear()
        exchange = strings.setdefault(exchange, exchange)
        key = strings.setdefault(key, key)
        message = Message(mid, exchange, key, headers, body, ts, bool(flags & record.FLAG_PERSISTENT), prio, expiry)
        if headers is not None or extra is not None:
            last_headers, last_properties, _ = self._model
            if headers is not None and headers == last_headers and _same_types(headers, last_headers):
                message.headers = last_headers
            properties = None
            if extra is not None:
                properties, message.deliver_at, message.ack_timeout = extra
                if properties is not None and properties == last_properties:
                    properties = last_properties
                message.properties = properties
            self._model = (message.headers, properties, None)
        return vhost, message


def _same_types(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal header dicts are the same only with values of the same types
    (C{1 == True == 1.0}, and a STOMP receiver reads C{1}, C{true} or
    C{1.0})."""
    return all(v.__class__ is b[k].__class__ for k, v in a.items())


class FrameReader:
    """Whole frames out of a byte stream (see the module docstring).

    A read that holds whole frames is parsed where it is (no copy); the
    tail of a frame still arriving is kept in chunks, joined once the frame
    is whole (a large frame is copied once, not once per read).

    @ivar max_frame: most bytes a frame may announce.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._chunks: list[bytes] = []
        self._size = 0
        self._need = 0

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet whole."""
        return self._size

    def feed(self, data: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
        """The frames completed by C{data}: the bytes they are in, and each
        frame as C{(type, start, end)} of its payload in them.

        @raise FrameError: a frame announces more than C{max_frame}, or none.
        """
        if self._chunks:
            self._chunks.append(data)
            self._size += len(data)
            if self._size < self._need:
                return b"", []
            buffer = b"".join(self._chunks)
            self._chunks = []
            self._size = 0
        else:
            buffer = data
        frames = []
        pos = 0
        end = len(buffer)
        unpack = _HEADER.unpack_from
        limit = self.max_frame
        need = HEADER_SIZE
        while end - pos >= HEADER_SIZE:
            length, type_ = unpack(buffer, pos)
            if length < 1 or length > limit:
                raise FrameError(f"a frame of {length} bytes (at most {limit})")
            stop = pos + 4 + length
            if stop > end:
                need = 4 + length
                break
            frames.append((type_, pos + HEADER_SIZE, stop))
            pos = stop
        if pos < end:
            rest = buffer[pos:]
            self._chunks = [rest]
            self._size = len(rest)
            self._need = need
        return buffer, frames
