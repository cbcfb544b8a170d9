"""Tests for L{qmq.cluster.wire}: the link protocol's frames, batches of
messages in them, binary confirms and settles."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.cluster import wire
from qmq.core.message import Message


def sample() -> Message:
    message = Message(
        (1 << 50) + 7,
        "amq.topic",
        "x.y",
        {"s": "text", "n": 3, "f": 1.5, "b": True, "raw": b"\x00\xff", "none": None},
        b"body\x00bytes",
        1_700_000_000.25,
        True,
        5,
        1_700_000_100.0,
    )
    message.properties = {"content_type": "text/plain", "correlation_id": "c-1", "reply_to": "/queue/r"}
    message.deliver_at = 1_700_000_010.0
    message.ack_timeout = 30.0
    return message


FIELDS = (
    "exchange", "routing_key", "headers", "body", "timestamp", "persistent",
    "priority", "expires", "properties", "deliver_at", "ack_timeout",
)


def one_frame(data: bytes) -> tuple[int, bytes, int, int]:
    buffer, frames = wire.FrameReader(1 << 24).feed(data)
    (type_, start, end), = frames
    return type_, buffer, start, end


class MessageCodecTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        """Everything of the core's model crosses but the id (the receiver
        gives its own): exchange, key, typed headers, properties, body,
        time, persistence, priority, expiry, delivery time, ack timeout."""
        original = sample()
        plain = Message(2, "", "q", None, b"", 5.0)
        data = wire.encode_batch(wire.MESSAGE, b"/", [wire.encode_item(original), wire.encode_item(plain)])
        type_, buffer, start, end = one_frame(data)
        self.assertEqual(type_, wire.MESSAGE)
        vhost, seq, (message, other) = wire.Decoder().batch(type_, buffer, start, end)
        self.assertEqual((vhost, seq, message.id), ("/", 0, 0))
        for name in FIELDS:
            self.assertEqual(getattr(message, name), getattr(original, name), name)
            self.assertEqual(getattr(other, name), getattr(plain, name), name)
        self.assertIs(message.headers["b"], True)
        self.assertIs(message.headers["n"].__class__, int)

    def test_forward_batch_numbers(self) -> None:
        """A forward batch carries its first sequence number once."""
        items = [wire.encode_item(Message(i, "", f"q{i}", None, b"m%d" % i)) for i in range(3)]
        data = wire.encode_batch(wire.FORWARD, "vé".encode(), items, seq=(1 << 40) + 5)
        vhost, seq, got = wire.Decoder().batch(*one_frame(data))
        self.assertEqual((vhost, seq), ("vé", (1 << 40) + 5))
        self.assertEqual([(m.routing_key, m.body) for m in got], [("q0", b"m0"), ("q1", b"m1"), ("q2", b"m2")])

    def test_deliveries(self) -> None:
        """A deliver batch: each item's consumer, tag and delivery count."""
        m = sample()
        items = [wire.encode_delivery(7, (1 << 33) + i, i, m) for i in range(2)]
        vhost, _, got = wire.Decoder().batch(*one_frame(wire.encode_batch(wire.DELIVER, b"/", items)))
        self.assertEqual([(s, t, d.delivery_count) for s, t, d in got], [(7, 1 << 33, 0), (7, (1 << 33) + 1, 1)])
        for name in FIELDS:
            self.assertEqual(getattr(got[1][2], name), getattr(m, name), name)

    def test_large_body_not_joined(self) -> None:
        """A large body is its own chunk (not copied into the head)."""
        body = b"x" * 100_000
        chunks, size = wire.encode_item(Message(1, "e", "k", None, body))
        self.assertIs(chunks[-1], body)
        self.assertEqual(size, sum(map(len, chunks)))
        _, _, [got] = wire.Decoder().batch(*one_frame(wire.encode_batch(wire.MESSAGE, b"/", [(chunks, size)])))
        self.assertEqual(got.body, body)

    def test_malformed(self) -> None:
        """Bytes that do not decode, wherever they are cut or changed, are a
        FrameError naming the frame, never another exception."""
        items = [wire.encode_item(sample()), wire.encode_item(Message(1, "x", "y", {"a": "b"}, b"z"))]
        for type_ in (wire.MESSAGE, wire.FORWARD, wire.DELIVER):
            if type_ == wire.DELIVER:
                items = [wire.encode_delivery(1, 2, 0, sample()), wire.encode_delivery(1, 3, 0, sample())]
            payload = wire.encode_batch(type_, b"/", items, seq=1)[wire.HEADER_SIZE :]
            name = wire.NAMES[type_]
            for cut in range(len(payload)):
                if cut in (len(payload) - len(items[-1][0][0]),):
                    continue  # a whole first item: a valid batch
                e = self.assertRaises(wire.FrameError, wire.Decoder().batch, type_, payload[:cut], 0, cut)
                self.assertIn(f"bad {name}", str(e))
            for i in range(len(payload)):
                damaged = bytearray(payload)
                damaged[i] ^= 0xFF
                try:
                    wire.Decoder().batch(type_, bytes(damaged), 0, len(damaged))
                except wire.FrameError as e:
                    self.assertIn(f"bad {name}", str(e))

    def test_bad_header_block(self) -> None:
        """A static part whose header block does not decode is refused."""
        static = b"\x06\x00\x00\x00\x00\x00\x00" + b"{nope"  # JSON headers, FLAG_MODEL
        item = wire.ITEM.pack(wire.ITEM.size - 4 + len(static), 0, 0, 0.0, 0.0, len(static)) + static
        payload = wire.batch_prefix(wire.MESSAGE, b"/") + item
        e = self.assertRaises(wire.FrameError, wire.Decoder().batch, wire.MESSAGE, payload, 0, len(payload))
        self.assertIn("bad message", str(e))


class ConfirmSettleTests(SynchronousTestCase):
    def test_confirm_round_trip(self) -> None:
        data = wire.encode_confirm([[1, 3], [1 << 40, 1]], [(9, 506, "queue full é"), (10, 404, "x" * 900)])
        type_, buffer, start, end = one_frame(data)
        self.assertEqual(type_, wire.CONFIRM)
        ranges, failed = wire.decode_confirm(buffer, start, end)
        self.assertEqual(ranges, [(1, 3), (1 << 40, 1)])
        self.assertEqual(failed[0], (9, 506, "queue full é"))
        self.assertEqual(len(failed[1][2]), wire.MAX_REASON)

    def test_settle_round_trip(self) -> None:
        data = wire.encode_settle([[1, 5, 10, 0], [2, 1 << 40, 1, 2]])
        ranges = wire.decode_settle(*one_frame(data)[1:])
        self.assertEqual(ranges, [(1, 5, 10, 0), (2, 1 << 40, 1, 2)])

    def test_malformed(self) -> None:
        confirm = wire.encode_confirm([[1, 3]], [(9, 506, "full")])[wire.HEADER_SIZE :]
        for cut in range(len(confirm)):
            e = self.assertRaises(wire.FrameError, wire.decode_confirm, confirm, 0, cut)
            self.assertIn("bad confirm", str(e))
        settle = wire.encode_settle([[1, 5, 10, 0]])[wire.HEADER_SIZE :]
        for cut in range(len(settle)):
            e = self.assertRaises(wire.FrameError, wire.decode_settle, settle, 0, cut)
            self.assertIn("bad settle", str(e))
        bad = wire.RUN.pack(1, 1, 1, 4)
        self.assertRaises(wire.FrameError, wire.decode_settle, bad, 0, len(bad))


class FrameReaderTests(SynchronousTestCase):
    def test_byte_by_byte(self) -> None:
        data = wire.encode_json(wire.HELLO, {"node": "a", "version": 1}) + wire.encode_clock(wire.PING, 2.5)
        reader = wire.FrameReader(1024)
        got = []
        for i in range(len(data)):
            buffer, frames = reader.feed(data[i : i + 1])
            got += [(t, buffer[a:b]) for t, a, b in frames]
        self.assertEqual([t for t, _ in got], [wire.HELLO, wire.PING])
        self.assertEqual(wire.decode_json(got[0][1]), {"node": "a", "version": 1})
        self.assertEqual(wire.decode_clock(got[1][1]), 2.5)
        self.assertEqual(reader.buffered, 0)

    def test_large_frame_in_pieces(self) -> None:
        """A frame that comes in many reads is held once it started, and
        whole once its last byte came; what follows it is kept."""
        big = wire.frame(wire.MESSAGE, b"y" * 100_000) + wire.encode_clock(wire.PING, 1.0)[:3]
        reader = wire.FrameReader(1 << 20)
        done = []
        for i in range(0, len(big), 4096):
            buffer, frames = reader.feed(big[i : i + 4096])
            done += [buffer[a:b] for _, a, b in frames]
        self.assertEqual(done, [b"y" * 100_000])
        self.assertEqual(reader.buffered, 3)
        buffer, frames = reader.feed(wire.encode_clock(wire.PING, 1.0)[3:])
        self.assertEqual([(t, wire.decode_clock(buffer[a:b])) for t, a, b in frames], [(wire.PING, 1.0)])
        self.assertEqual(reader.buffered, 0)

    def test_repeats_shared(self) -> None:
        """A link's decoder gives a stream's repeated headers and
        properties as one dict each (checked once by the core), across
        batches."""
        decoder = wire.Decoder()
        got = []
        for _ in range(3):
            m = sample()
            m.headers = {"a": "b"}
            got += decoder.batch(*one_frame(wire.encode_batch(wire.MESSAGE, b"/", [wire.encode_item(m)])))[2]
        self.assertIs(got[0].headers, got[2].headers)
        self.assertIs(got[0].properties, got[2].properties)
        self.assertIs(got[0].routing_key, got[1].routing_key)
        self.assertEqual(got[2].headers, {"a": "b"})

    def test_too_large(self) -> None:
        """A frame announcing more than the limit is refused at its header,
        before its bytes are buffered."""
        reader = wire.FrameReader(1024)
        self.assertRaises(wire.FrameError, reader.feed, wire.frame(wire.MESSAGE, b"x" * 1024))
        self.assertRaises(wire.FrameError, wire.FrameReader(1024).feed, b"\x00\x00\x00\x00\x01")

    def test_bad_control(self) -> None:
        self.assertRaises(wire.FrameError, wire.decode_json, b"[1]")
        self.assertRaises(wire.FrameError, wire.decode_json, b"\xff")
        self.assertRaises(wire.FrameError, wire.decode_clock, b"1234")


class StompBlockTests(SynchronousTestCase):
    def test_decoded_stream_encoded_once(self) -> None:
        """A link's messages share their headers dict (the decoder reuses
        it): the STOMP header block is made once for the stream; an equal
        dict of other types (1 and True) is not mistaken for it."""
        from qmq.stomp.encoding import encode_message_headers  # noqa: PLC0415

        decoder = wire.Decoder()
        blocks = []
        for i in range(3):
            m = Message(i + 1, "amq.topic", "k", {"n": 1}, b"x", 1.0, False)
            (got,) = decoder.batch(*one_frame(wire.encode_batch(wire.MESSAGE, b"/", [wire.encode_item(m)])))[2]
            blocks.append(encode_message_headers(got))
        self.assertIs(blocks[1], blocks[0])
        self.assertIs(blocks[2], blocks[0])
        self.assertIn(b"\nn:1\n", blocks[0])
        other = Message(9, "amq.topic", "k", {"n": True}, b"x", 1.0, False)
        self.assertIn(b"\nn:true\n", encode_message_headers(other))
        # Nor does the decoder take {"n": True} for the {"n": 1} before it.
        (typed,) = decoder.batch(*one_frame(wire.encode_batch(wire.MESSAGE, b"/", [wire.encode_item(other)])))[2]
        self.assertIs(typed.headers["n"], True)
        moved = Message(10, "amq.topic", "k2", got.headers, b"x", 1.0, False)
        self.assertIn(b"destination:/topic/k2", encode_message_headers(moved))
