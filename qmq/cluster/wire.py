# -*- test-case-name: tests.test_cluster_wire -*-
"""The link protocol's bytes: frames, and messages in them.

A link carries frames back to back, each::

    u32 length   bytes after this field (the type and the payload), big-endian
    u8  type     one of the constants below
    ... payload

Control frames (hello, interest, close) are small JSON objects; a ping and
its pong carry the sender's clock as a big-endian double; a message frame
carries a publish record of the commit log (L{qmq.store.record}, with no
queue names), so a message crosses a link with everything the core's model
holds: its id, exchange and routing key, properties, typed headers, body,
priority, expiry, delivery time, ack timeout and persistence. The record's
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
    "CLOSE",
    "HELLO",
    "INTEREST",
    "MESSAGE",
    "PING",
    "PONG",
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

#: The link protocol's version, in every hello.
VERSION = 1

# Frame types. Never renumber: peers of other versions read them.
HELLO = 1
PING = 2
PONG = 3
INTEREST = 4
SYNC = 5
MESSAGE = 6
CLOSE = 7

NAMES = {HELLO: "hello", PING: "ping", PONG: "pong", INTEREST: "interest", SYNC: "sync", MESSAGE: "message", CLOSE: "close"}

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


def encode_message(vhost: bytes, message: Message) -> list[bytes]:
    """A message frame, as chunks to write (a large body is not copied)."""
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
    return [_HEADER.pack(len(head) + len(tail) + 1, MESSAGE), head, tail] if tail else [
        _HEADER.pack(len(head) + 1, MESSAGE) + head
    ]


def decode_message(payload: bytes) -> tuple[str, Message]:
    """The virtual host's name and the message in a message frame.

    @raise FrameError: it is not a whole, undamaged publish record.
    """
    if len(payload) < record.FRAME_SIZE:
        raise FrameError("bad message frame: too short")
    length, type_, crc = record.FRAME.unpack_from(payload)
    if type_ != record.RECORD_PUBLISH or length != len(payload) - record.FRAME_SIZE:
        raise FrameError("bad message frame: not a publish record")
    body = memoryview(payload)[record.FRAME_SIZE :]
    if record.record_crc(type_, body) != crc:
        raise FrameError("bad message frame: checksum")
    try:
        fields = record.decode_publish_fields(payload, record.FRAME_SIZE, len(payload))
    except record.RecordError as e:
        raise FrameError(f"bad message frame: {e}") from None
    (mid, ts, expiry, prio, flags, vhost, exchange, key, headers, _, body_bytes, extra) = fields
    message = Message(
        mid, exchange, key, headers, bytes(body_bytes), ts, bool(flags & record.FLAG_PERSISTENT), prio, expiry
    )
    if extra is not None:
        message.properties, message.deliver_at, message.ack_timeout = extra
    return vhost, message


class FrameReader:
    """Whole frames out of a byte stream (see the module docstring).

    @ivar max_frame: most bytes a frame may announce.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames completed by C{data}, as C{(type, payload)}.

        @raise FrameError: a frame announces more than C{max_frame}, or none.
        """
        buffer = self._buffer
        buffer += data
        frames = []
        pos = 0
        end = len(buffer)
        while end - pos >= HEADER_SIZE:
            length, type_ = _HEADER.unpack_from(buffer, pos)
            if length < 1 or length > self.max_frame:
                raise FrameError(f"a frame of {length} bytes (at most {self.max_frame})")
            stop = pos + 4 + length
            if stop > end:
                break
            frames.append((type_, bytes(buffer[pos + HEADER_SIZE : stop])))
            pos = stop
        if pos:
            del buffer[:pos]
        return frames
