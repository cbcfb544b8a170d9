# -*- test-case-name: tests.test_cluster_wire -*-
"""The link protocol's bytes: frames, and messages in them.

A link carries frames back to back, each::

    u32 length   bytes after this field (the type and the payload), big-endian
    u8  type     one of the constants below
    ... payload

Control frames (hello, interest, sync, peers, consume, cancel, cancelled,
declare, close) are small JSON objects; a ping and its pong carry the
sender's clock as a big-endian double.

Messages travel in batches (version 3): a B{message}, B{forward} or
B{deliver} frame holds every message of its kind that one reactor turn
produced for the link in one virtual host (up to L{BATCH_BYTES}, and
never more than C{max_frame}), and B{confirm} and B{settle} frames are
binary and ranged. The payloads, big-endian:

    message   u16 vhost length, vhost, then items
    forward   u64 first sequence number, u16 vhost length, vhost, then
              items (the n-th item has sequence number first + n)
    deliver   u16 vhost length, vhost, then delivery items
    confirm   u32 n, n x (u64 first, u32 count): sequence numbers taken;
              u32 m, m x (u64 seq, u16 code, u16 length, UTF-8 reason):
              those refused
    settle    runs, each u32 consumer id, u64 first delivery tag, u32
              count, u8 outcome (0 ack, 1 requeue, 2 drop): the tags
              first, first + 1, ... of that consumer; or outcome 3
              (credit, first 0): a consumer without acks took count
              more deliveries (version 4)

An item (L{ITEM}) is u32 size (of the rest of the item), u8 flags (the
commit log's L{qmq.store.record.FLAG_PERSISTENT} and FLAG_TIMING), u8
priority, f64 timestamp, f64 expiry, u32 length of what follows up to the
body, then the static part: u8 header flags (the commit log's), u16
exchange length, u32 routing key length, the exchange, the routing key
and the header block (properties and typed headers, encoded as the commit
log encodes them: L{qmq.store.record.encode_model}); then, with the
timing flag, f64 delivery time and f64 ack timeout; then the body (the
rest). A delivery item (L{DELIVERY_ITEM}) has u32 consumer id, u64
delivery tag and u32 delivery count after its size. A message crosses
with everything of the core's model but its id (the receiving node gives
it one of its own: L{qmq.cluster.mesh}).

The static part repeats in a publisher's stream: the sender encodes it
once for a run of messages with the same exchange, key, headers and
properties, and the receiver decodes each distinct one once (a bounded
cache keyed by its bytes), so a stream shares one headers dict (which
nothing changes once published, L{qmq.core.message}) and the core checks
it and the routing key once (L{qmq.core.channel.Channel.publish}). Any
bytes that do not decode close the link with a protocol error naming the
frame (L{FrameError}).

Why not STOMP frames, or the commit log's records (version 2): STOMP's
headers are text; a record carries a CRC, an id and queue names a link
does not need, and one frame per message costs a dispatch each.

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
    "ACK",
    "BATCH_BYTES",
    "CANCEL",
    "CANCELLED",
    "CLOSE",
    "CONFIRM",
    "CONSUME",
    "CREDIT",
    "DECLARE",
    "DELIVER",
    "DROP",
    "FORWARD",
    "HELLO",
    "INTEREST",
    "MESSAGE",
    "PING",
    "PEERS",
    "PONG",
    "REQUEUE",
    "SETTLE",
    "SYNC",
    "VERSION",
    "Decoder",
    "FrameError",
    "FrameReader",
    "batch_prefix",
    "decode_confirm",
    "decode_json",
    "decode_settle",
    "encode_batch",
    "encode_confirm",
    "encode_delivery",
    "encode_item",
    "encode_json",
    "encode_settle",
    "frame",
]

#: The link protocol's version, in every hello (2: queues across nodes;
#: 3: batched messages, binary ranged confirms and settles; 4: consumers
#: without acks take credit, their deliveries untracked on the home).
VERSION = 4

# Frame types. Never renumber: peers of other versions read them.
HELLO = 1
PING = 2
PONG = 3
INTEREST = 4
SYNC = 5
MESSAGE = 6  # a batch of messages (fan-out)
CLOSE = 7
PEERS = 8
# Queues across nodes (qmq.cluster.queues).
FORWARD = 9  # a batch of publishes to queues homed on the receiver
CONFIRM = 10  # binary: ranges of sequence numbers taken, and those refused
CONSUME = 11  # JSON: {"id": n, "vhost": v, "queue": q, "window": w, "exclusive": b}
DELIVER = 12  # a batch of deliveries to consumers of the sender's queues
SETTLE = 13  # binary: runs of delivery tags of one consumer: ack, requeue or drop
CANCEL = 14  # JSON: {"id": n}: the consumer goes (its unacked messages go back)
CANCELLED = 15  # JSON: {"id": n, "code": c, "reason": text}: the home ended it (code 0: answers a cancel)
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

#: A batch frame closes once it holds this many bytes (a message larger
#: than that goes alone in its frame; every frame stays within max_frame).
BATCH_BYTES = 64 * 1024


class FrameError(ValueError):
    """The peer sent bytes that are not a frame of this protocol."""


def frame(type_: int, payload: bytes = b"") -> bytes:
    """One frame."""
    return _HEADER.pack(len(payload) + 1, type_) + payload


def header(type_: int, size: int) -> bytes:
    """The header of a frame whose payload is C{size} bytes."""
    return _HEADER.pack(size + 1, type_)


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


# -- messages -------------------------------------------------------------------

#: An item: size, flags, priority, timestamp, expiry, static part length.
ITEM = struct.Struct(">IBBddI")
#: A delivery item: size, consumer id, delivery tag, delivery count, then
#: as an item.
DELIVERY_ITEM = struct.Struct(">IIQIBBddI")
#: The start of a static part: header flags, exchange length, routing key length.
_STATIC = struct.Struct(">BHI")
_VHOST = struct.Struct(">H")
_FIRST_SEQ = struct.Struct(">QH")
_TIMING = record.TIMING
_U32 = struct.Struct(">I")
_RANGE = struct.Struct(">QI")
_FAILED = struct.Struct(">QHH")
#: A settle run: consumer id, first tag, count, outcome.
RUN = struct.Struct(">IQIB")
#: A settle run's outcomes: its tags acked, requeued or dropped; or, for a
#: consumer without acks, credit (first tag 0, count deliveries taken).
ACK, REQUEUE, DROP, CREDIT = 0, 1, 2, 3

_PERSISTENT = record.FLAG_PERSISTENT
_FLAG_TIMING = record.FLAG_TIMING
_ITEM_HEAD = ITEM.size - 4
_DELIVERY_HEAD = DELIVERY_ITEM.size - 4
#: A body up to this long is copied into its item's head (one chunk).
_INLINE_BODY = 4096

# The static part of the last message encoded: (exchange, routing key,
# headers, properties, static part).
_last: tuple[Any, ...] = (None, None, None, None, b"")
_MAX_STATIC = 0xFFFF


def _static(message: Message) -> bytes:
    """The static part of C{message} (see the module docstring), the last
    one's again when it has the same fields."""
    global _last
    last = _last
    headers = message.headers
    properties = message.properties
    exchange = message.exchange
    key = message.routing_key
    if headers is last[2] and properties is last[3] and exchange == last[0] and key == last[1]:
        return last[4]  # type: ignore[no-any-return]
    hflags, block = record.encode_model(properties, headers)
    ex = exchange.encode()
    rk = key.encode()
    if len(ex) > _MAX_STATIC:
        raise ValueError(f"an exchange name of {len(ex)} bytes")
    static = _STATIC.pack(hflags, len(ex), len(rk)) + ex + rk + block
    _last = (exchange, key, headers, properties, static)
    return static


def _static_flags(message: Message) -> tuple[bytes, int]:
    """What an item of C{message} shares with the last one encoded when they
    share their headers and properties (exchange, key, headers, properties,
    then its timing), and its flags."""
    last = _last
    if (
        message.headers is last[2]
        and message.properties is last[3]
        and message.exchange == last[0]
        and message.routing_key == last[1]
    ):
        static = last[4]
    else:
        static = _static(message)
    flags = _PERSISTENT if message.persistent else 0
    if message.deliver_at or message.ack_timeout:
        flags |= _FLAG_TIMING
        static = static + _TIMING.pack(message.deliver_at, message.ack_timeout)
    return static, flags


def encode_item(message: Message) -> tuple[list[bytes], int]:
    """An item of a message or forward batch: its chunks (a large body is
    not copied) and their size."""
    static, flags = _static_flags(message)
    body = message.body
    size = _ITEM_HEAD + len(static) + len(body)
    head = ITEM.pack(size, flags, message.priority, message.timestamp, message.expires, len(static)) + static
    if len(body) <= _INLINE_BODY:
        return [head + body], size + 4
    return [head, body], size + 4


def encode_delivery(sub: int, tag: int, count: int, message: Message) -> tuple[list[bytes], int]:
    """An item of a deliver batch: consumer C{sub}'s delivery C{tag}
    (C{count} as its delivery count)."""
    static, flags = _static_flags(message)
    body = message.body
    size = _DELIVERY_HEAD + len(static) + len(body)
    head = DELIVERY_ITEM.pack(
        size, sub, tag, count, flags, message.priority, message.timestamp, message.expires, len(static)
    ) + static
    if len(body) <= _INLINE_BODY:
        return [head + body], size + 4
    return [head, body], size + 4


def batch_prefix(type_: int, vhost: bytes, seq: int = 0) -> bytes:
    """The start of a batch frame's payload: (for a forward batch, the
    first sequence number) the virtual host."""
    if type_ == FORWARD:
        return _FIRST_SEQ.pack(seq, len(vhost)) + vhost
    return _VHOST.pack(len(vhost)) + vhost


def encode_batch(type_: int, vhost: bytes, items: list[tuple[list[bytes], int]], seq: int = 0) -> bytes:
    """A whole batch frame of C{items} (L{encode_item}, L{encode_delivery}):
    what a link builds piece by piece (tests, tools)."""
    prefix = batch_prefix(type_, vhost, seq)
    chunks = [c for item in items for c in item[0]]
    return b"".join([header(type_, len(prefix) + sum(n for _, n in items)), prefix, *chunks])


class Decoder:
    """Decodes one link's batch frames.

    Each distinct static part (exchange, key, header block) is decoded
    once and kept (up to L{CACHE_SIZE}, then forgotten all at once): a
    publisher's stream shares one exchange and key string, one headers
    dict and one properties dict.
    """

    __slots__ = ("_statics",)

    CACHE_SIZE = 4096

    def __init__(self) -> None:
        self._statics: dict[bytes, tuple[str, str, Any, Any]] = {}

    def batch(self, type_: int, data: bytes, start: int, end: int) -> tuple[str, int, list[Any]]:
        """The virtual host, the first sequence number (forward) and the
        messages of a batch frame's payload C{data[start:end]}: for a
        deliver batch, C{(consumer id, tag, message)} triples (the message's
        delivery count set). Its messages' ids are 0.

        @raise FrameError: it does not decode, wholly (nothing of a frame
            that does not is handled).
        """
        name = NAMES.get(type_, str(type_))
        try:
            if type_ == FORWARD:
                seq, n = _FIRST_SEQ.unpack_from(data, start)
                pos = start + _FIRST_SEQ.size
            else:
                seq = 0
                (n,) = _VHOST.unpack_from(data, start)
                pos = start + _VHOST.size
            if pos + n > end:
                raise FrameError(f"bad {name}: the virtual host does not fit")
            vhost = data[pos : pos + n].decode()
        except (struct.error, UnicodeDecodeError) as e:
            raise FrameError(f"bad {name}: {e}") from None
        pos += n
        if pos >= end:
            raise FrameError(f"bad {name}: no message")
        try:
            if type_ == DELIVER:
                return vhost, seq, self._deliveries(data, pos, end)
            return vhost, seq, self._items(data, pos, end)
        except FrameError as e:
            raise FrameError(f"bad {name}: {e}") from None
        except (struct.error, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError) as e:
            raise FrameError(f"bad {name}: {e.__class__.__name__}: {e}") from None

    def _items(self, data: bytes, pos: int, end: int) -> list[Message]:
        out: list[Message] = []
        append = out.append
        unpack = ITEM.unpack_from
        fixed = ITEM.size
        new = Message
        # The static part of the item before (a stream repeats it): compared
        # as a slice (cheaper than bytes.startswith's argument parsing);
        # decoded (or found in the cache) when it changes.
        last = b""
        exchange = key = ""
        headers = properties = None
        while pos < end:
            if end - pos < fixed:
                raise FrameError("a message cut short")
            size, flags, priority, timestamp, expires, n = unpack(data, pos)
            stop = pos + 4 + size
            s = pos + fixed
            b = s + n
            if stop > end or b > stop:
                raise FrameError("a message longer than its frame")
            if flags & _FLAG_TIMING:
                b -= 16
            if b - s != len(last) or not last or data[s:b] != last:
                last = data[s:b]
                exchange, key, headers, properties = self._found(last)
            if flags & _FLAG_TIMING:
                message = new(0, exchange, key, headers, data[b + 16 : stop], timestamp, flags & 1 != 0, priority, expires)
                message.deliver_at, message.ack_timeout = _TIMING.unpack_from(data, b)
            else:
                message = new(0, exchange, key, headers, data[b:stop], timestamp, flags & 1 != 0, priority, expires)
            if properties is not None:
                message.properties = properties
            append(message)
            pos = stop
        return out

    def _deliveries(self, data: bytes, pos: int, end: int) -> list[tuple[int, int, Message]]:
        # _items' loop, with a consumer id, a tag and a delivery count.
        out: list[tuple[int, int, Message]] = []
        append = out.append
        unpack = DELIVERY_ITEM.unpack_from
        fixed = DELIVERY_ITEM.size
        new = Message
        last = b""
        exchange = key = ""
        headers = properties = None
        while pos < end:
            if end - pos < fixed:
                raise FrameError("a message cut short")
            size, sub, tag, count, flags, priority, timestamp, expires, n = unpack(data, pos)
            stop = pos + 4 + size
            s = pos + fixed
            b = s + n
            if stop > end or b > stop:
                raise FrameError("a message longer than its frame")
            if flags & _FLAG_TIMING:
                b -= 16
            if b - s != len(last) or not last or data[s:b] != last:
                last = data[s:b]
                exchange, key, headers, properties = self._found(last)
            if flags & _FLAG_TIMING:
                message = new(0, exchange, key, headers, data[b + 16 : stop], timestamp, flags & 1 != 0, priority, expires)
                message.deliver_at, message.ack_timeout = _TIMING.unpack_from(data, b)
            else:
                message = new(0, exchange, key, headers, data[b:stop], timestamp, flags & 1 != 0, priority, expires)
            message.delivery_count = count
            if properties is not None:
                message.properties = properties
            append((sub, tag, message))
            pos = stop
        return out

    def _found(self, static: bytes) -> tuple[str, str, Any, Any]:
        """A static part decoded: from the cache, or decoded now."""
        found = self._statics.get(static)
        return self._static(static) if found is None else found

    def _static(self, static: bytes) -> tuple[str, str, Any, Any]:
        """Decode a static part (and keep it)."""
        if len(static) < _STATIC.size:
            raise FrameError("a static part cut short")
        flags, le, lr = _STATIC.unpack_from(static, 0)
        a = _STATIC.size + le
        b = a + lr
        if b > len(static):
            raise FrameError("names longer than their part")
        exchange = static[_STATIC.size : a].decode()
        key = static[a:b].decode()
        block = static[b:]
        properties = None
        if flags & record.FLAG_PROPERTIES:
            properties, cut = record.decode_properties(block)
            block = block[cut:]
        kinds = flags & (record.FLAG_HEADERS_PAIRS | record.FLAG_HEADERS_JSON)
        if kinds:
            if kinds == record.FLAG_HEADERS_PAIRS | record.FLAG_HEADERS_JSON:
                raise FrameError("a header block of two kinds")
            headers = record.decode_headers(kinds, block)
            if not isinstance(headers, dict):
                raise FrameError("headers that are not an object")
        elif block:
            raise FrameError("a header block with no kind")
        else:
            headers = None
        found = (exchange, key, headers, properties)
        statics = self._statics
        if len(statics) >= self.CACHE_SIZE:
            statics.clear()
        statics[static] = found
        return found


# -- confirms and settles ----------------------------------------------------------

#: Most bytes of a refusal's reason in a confirm.
MAX_REASON = 500


def encode_confirm(ranges: list[list[int]], failed: list[tuple[int, int, str]]) -> bytes:
    """A confirm frame: C{[first, count]} ranges of sequence numbers taken,
    and C{(seq, code, reason)} of those refused."""
    parts = [_U32.pack(len(ranges))]
    parts += [_RANGE.pack(first, count) for first, count in ranges]
    parts.append(_U32.pack(len(failed)))
    for seq, code, text in failed:
        data = text.encode()[:MAX_REASON]
        parts.append(_FAILED.pack(seq, code, len(data)) + data)
    payload = b"".join(parts)
    return header(CONFIRM, len(payload)) + payload


def decode_confirm(data: bytes, start: int, end: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
    """C{(ranges, refused)} of a confirm payload.

    @raise FrameError: it does not decode.
    """
    try:
        (n,) = _U32.unpack_from(data, start)
        pos = start + 4
        if pos + n * _RANGE.size + 4 > end:
            raise FrameError("bad confirm: more ranges than bytes")
        ranges = [_RANGE.unpack_from(data, pos + i * _RANGE.size) for i in range(n)]
        pos += n * _RANGE.size
        (m,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + m * _FAILED.size > end:
            raise FrameError("bad confirm: more refusals than bytes")
        failed = []
        for _ in range(m):
            seq, code, length = _FAILED.unpack_from(data, pos)
            pos += _FAILED.size
            if pos + length > end:
                raise FrameError("bad confirm: a reason longer than its frame")
            failed.append((seq, code, data[pos : pos + length].decode(errors="replace")))
            pos += length
    except struct.error as e:
        raise FrameError(f"bad confirm: {e}") from None
    if pos != end:
        raise FrameError("bad confirm: bytes after its refusals")
    return ranges, failed


def encode_settle(runs: list[list[int]]) -> bytes:
    """A settle frame: C{[consumer id, first tag, count, outcome]} runs."""
    payload = b"".join([RUN.pack(*run) for run in runs])
    return header(SETTLE, len(payload)) + payload


def decode_settle(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """The runs of a settle payload.

    @raise FrameError: it does not decode.
    """
    size = RUN.size
    if (end - start) % size or end == start:
        raise FrameError(f"bad settle: {end - start} bytes is no whole number of runs")
    runs = list(RUN.iter_unpack(data[start:end]))
    for _, _, count, outcome in runs:
        if outcome > CREDIT or count < 1:
            raise FrameError(f"bad settle: a run of {count} with outcome {outcome}")
    return runs


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
