"""Tests for L{qmq.cluster.wire}: the link protocol's frames, and messages
in them as the commit log's publish records."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.cluster import wire
from qmq.core.message import Message
from qmq.store import record


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


class MessageCodecTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        """Everything of the core's model crosses: id, exchange, key, typed
        headers, properties, body, time, persistence, priority, expiry,
        delivery time, ack timeout."""
        original = sample()
        chunks = wire.encode_message(b"/", original)
        buffer, frames = wire.FrameReader(1 << 20).feed(b"".join(chunks))
        self.assertEqual(len(frames), 1)
        type_, start, end = frames[0]
        payload = buffer[start:end]
        self.assertEqual(type_, wire.MESSAGE)
        vhost, message = wire.decode_message(payload)
        self.assertEqual(vhost, "/")
        for name in (
            "id", "exchange", "routing_key", "headers", "body", "timestamp", "persistent",
            "priority", "expires", "properties", "deliver_at", "ack_timeout",
        ):
            self.assertEqual(getattr(message, name), getattr(original, name), name)

    def test_is_a_commit_log_record(self) -> None:
        """The payload is the commit log's publish record, read back by the
        store's own decoder."""
        original = sample()
        payload = b"".join(wire.encode_message(b"v", original))[wire.HEADER_SIZE :]
        length, type_, _ = record.FRAME.unpack_from(payload)
        self.assertEqual(type_, record.RECORD_PUBLISH)
        decoded = record.decode_publish(payload, record.FRAME_SIZE, len(payload))
        self.assertEqual((decoded.id, decoded.vhost, decoded.queues), (original.id, "v", []))

    def test_large_body_not_joined(self) -> None:
        """A large body is its own chunk (not copied into the head)."""
        body = b"x" * 100_000
        message = Message(1, "e", "k", None, body)
        chunks = wire.encode_message(b"/", message)
        self.assertIs(chunks[-1], body)
        buffer, [(_, start, end)] = wire.FrameReader(1 << 20).feed(b"".join(chunks))
        self.assertEqual(wire.decode_message(buffer, start, end)[1].body, body)

    def test_damaged(self) -> None:
        """A damaged record fails its checksum; a frame that is no record is refused."""
        payload = bytearray(b"".join(wire.encode_message(b"/", sample()))[wire.HEADER_SIZE :])
        payload[-1] ^= 1
        self.assertRaises(wire.FrameError, wire.decode_message, bytes(payload))
        self.assertRaises(wire.FrameError, wire.decode_message, b"short")
        head = record.frame(record.RECORD_SETTLE, b"12345")
        self.assertRaises(wire.FrameError, wire.decode_message, head)


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
        properties as one dict each (checked once by the core)."""
        decoder = wire.Decoder()
        got = []
        for _ in range(3):
            m = sample()
            m.headers = {"a": "b"}
            payload = b"".join(wire.encode_message(b"/", m))[wire.HEADER_SIZE :]
            got.append(decoder.decode(payload, 0, len(payload))[1])
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
        from qmq.core.message import Message  # noqa: PLC0415
        from qmq.stomp.encoding import encode_message_headers  # noqa: PLC0415

        decoder = wire.Decoder()
        blocks = []
        for i in range(3):
            m = Message(i + 1, "amq.topic", "k", {"n": 1}, b"x", 1.0, False)
            chunks = wire.encode_message(b"/", m)
            data = b"".join(chunks)
            _, got = decoder.decode(data, wire.HEADER_SIZE, len(data))
            blocks.append(encode_message_headers(got))
        self.assertIs(blocks[1], blocks[0])
        self.assertIs(blocks[2], blocks[0])
        self.assertIn(b"\nn:1\n", blocks[0])
        other = Message(9, "amq.topic", "k", {"n": True}, b"x", 1.0, False)
        self.assertIn(b"\nn:true\n", encode_message_headers(other))
        # Nor does the decoder take {"n": True} for the {"n": 1} before it.
        data = b"".join(wire.encode_message(b"/", other))
        _, typed = decoder.decode(data, wire.HEADER_SIZE, len(data))
        self.assertIs(typed.headers["n"], True)
        moved = Message(10, "amq.topic", "k2", got.headers, b"x", 1.0, False)
        self.assertIn(b"destination:/topic/k2", encode_message_headers(moved))
