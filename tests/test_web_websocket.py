"""Tests for L{qmq.web.websocket}: STOMP over WebSocket without sockets.

The HTTP listener's factory builds a connection on a string transport; the
test speaks the WebSocket protocol to it byte by byte (the upgrade request,
masked client frames) and reads the unmasked frames it writes back. The
clock is a L{MemoryReactorClock}, so pings, heart-beats, timeouts and the
close grace are driven by advancing it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.trial import unittest

from qmq.connections import ConnectionSettings
from qmq.web.site import HttpFactory
from qmq.web.websocket import StompWebSocketProtocol, encode_messages, origin_allowed
from tests.test_web_site import make_context

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\x00"


def client_frame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A masked client-to-server WebSocket frame."""
    mask = os.urandom(4)
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """Parse unmasked server frames: [(opcode, payload)]."""
    frames = []
    i = 0
    while i < len(data):
        opcode = data[i] & 0x0F
        assert data[i] & 0x80, "fragmented server frame"
        n = data[i + 1]
        assert not n & 0x80, "masked server frame"
        i += 2
        if n == 126:
            (n,) = struct.unpack("!H", data[i : i + 2])
            i += 2
        elif n == 127:
            (n,) = struct.unpack("!Q", data[i : i + 8])
            i += 8
        frames.append((opcode, data[i : i + n]))
        i += n
    assert i == len(data), "truncated server frame"
    return frames


class WSClient:
    """A WebSocket client speaking to an L{HttpFactory} over a string transport."""

    def __init__(self, factory: HttpFactory, path: str = "/stomp", headers: dict | None = None,
                 protocols: str | None = "v12.stomp") -> None:
        addr = IPv4Address("TCP", "127.0.0.1", 40001)
        self.protocol = factory.buildProtocol(addr)
        self.transport = StringTransportWithDisconnection(peerAddress=addr)
        self.transport.protocol = self.protocol
        self.protocol.makeConnection(self.transport)
        key = base64.b64encode(os.urandom(16))
        self.accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            "Host: 127.0.0.1:8080",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key.decode()}",
            "Sec-WebSocket-Version: 13",
        ]
        if protocols is not None:
            lines.append(f"Sec-WebSocket-Protocol: {protocols}")
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        self.protocol.dataReceived(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = self.transport.value()
        head, _, rest = raw.partition(b"\r\n\r\n")
        self.head = head.decode()
        self.status = int(self.head.split()[1])
        self.transport.clear()
        self.pending = rest if self.status == 101 else b""

    @property
    def ws(self) -> StompWebSocketProtocol:
        return self.protocol.wrappedProtocol

    def send(self, payload: bytes, opcode: int = 1) -> None:
        self.protocol.dataReceived(client_frame(payload, opcode))

    def send_raw(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def frames(self) -> list[tuple[int, bytes]]:
        data = self.pending + self.transport.value()
        self.pending = b""
        self.transport.clear()
        return server_frames(data)

    def messages(self) -> list[bytes]:
        return [payload for opcode, payload in self.frames() if opcode in (1, 2)]


class EncodingTests(unittest.TestCase):
    """L{encode_messages}: one unmasked message per STOMP frame."""

    def test_sizes(self) -> None:
        for n in (0, 1, 125, 126, 65535, 65536, 70000):
            frame = b"x" * n
            self.assertEqual(server_frames(encode_messages([frame])), [(1, frame)])

    def test_batch(self) -> None:
        frames = [b"MESSAGE\n\nA\x00", b"\n", b"MESSAGE\n\n" + b"B" * 300 + b"\x00"]
        self.assertEqual(server_frames(encode_messages(frames)), [(1, f) for f in frames])

    def test_types(self) -> None:
        utf8 = "MESSAGE\n\nh\u00e9llo\x00".encode()
        binary = b"MESSAGE\n\n\xff\xfe\x00"
        self.assertEqual(
            [op for op, _ in server_frames(encode_messages([utf8, binary]))], [1, 2]
        )
        self.assertEqual(
            [op for op, _ in server_frames(encode_messages([utf8, binary], "binary"))], [2, 2]
        )
        self.assertEqual(
            [op for op, _ in server_frames(encode_messages([utf8, binary], "text"))], [1, 1]
        )


class OriginTests(unittest.TestCase):
    def test_noOrigin(self) -> None:
        self.assertTrue(origin_allowed(None, "h:1", False, ()))
        self.assertTrue(origin_allowed("", "h:1", False, ()))

    def test_sameOrigin(self) -> None:
        self.assertTrue(origin_allowed("http://H:1", "h:1", False, ()))
        self.assertTrue(origin_allowed("https://h:1/", "h:1", True, ()))
        self.assertFalse(origin_allowed("http://h:1", "h:1", True, ()))
        self.assertFalse(origin_allowed("http://h:2", "h:1", False, ()))
        self.assertFalse(origin_allowed("null", "h:1", False, ()))

    def test_patterns(self) -> None:
        patterns = ("https://*.example.com", "http://localhost:*")
        self.assertTrue(origin_allowed("https://app.example.com", "h", False, patterns))
        self.assertTrue(origin_allowed("http://localhost:3000", "h", False, patterns))
        self.assertFalse(origin_allowed("https://example.org", "h", False, patterns))
        self.assertTrue(origin_allowed("https://evil.org", "h", False, ("*",)))


class WebSocketTests(unittest.TestCase):
    """A STOMP session over a WebSocket, end to end in memory."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.ctx = make_context(
            "[web]\nping_interval = 0\nallowed_origins = \"https://app.example.com\"",
            clock=self.clock,
            connections=ConnectionSettings(close_grace=2.0),
        )
        self.factory = HttpFactory(self.ctx)

    def connect(self, **kwargs: Any) -> WSClient:
        client = WSClient(self.factory, **kwargs)
        self.assertEqual(client.status, 101, client.head)
        client.send(CONNECT)
        [connected] = client.messages()
        self.assertTrue(connected.startswith(b"CONNECTED\n"), connected)
        return client

    def test_upgrade(self) -> None:
        client = WSClient(self.factory)
        self.assertEqual(client.status, 101)
        self.assertIn(f"Sec-WebSocket-Accept: {client.accept}", client.head)
        self.assertIn("Sec-WebSocket-Protocol: v12.stomp", client.head)
        self.assertIsInstance(client.ws, StompWebSocketProtocol)
        # The real transport of a session honours the session's interface.
        from zope.interface.verify import verifyObject  # noqa: PLC0415

        from qmq.transport import IConnection, ITransport  # noqa: PLC0415

        self.assertTrue(verifyObject(ITransport, client.ws))
        self.assertTrue(verifyObject(IConnection, client.ws))
        # The connection stays the registry's one entry across the upgrade.
        self.assertEqual(list(self.ctx.connections.connections()), [client.protocol])

    def test_ws(self) -> None:
        """C{/ws} is the same endpoint (RabbitMQ's path)."""
        self.connect(path="/ws")

    def test_counted_as_websocket(self) -> None:
        client = self.connect()
        client.send(b"SEND\ndestination:/queue/w\n\nx\x00")
        self.assertEqual(self.ctx.broker.traffic.totals(), {"websocket": (1, 0, 0)})
        self.assertEqual(client.protocol.protocol_name, "websocket")

    def test_subprotocols(self) -> None:
        for offered, chosen in (
            ("v10.stomp", "v10.stomp"),
            ("v10.stomp, v11.stomp", "v11.stomp"),
            ("mqtt, v11.stomp, v12.stomp", "v12.stomp"),
        ):
            client = WSClient(self.factory, protocols=offered)
            self.assertIn(f"Sec-WebSocket-Protocol: {chosen}", client.head)
        client = WSClient(self.factory, protocols=None)
        self.assertEqual(client.status, 101)
        self.assertNotIn("Sec-WebSocket-Protocol", client.head)

    def test_unknownSubprotocol(self) -> None:
        client = WSClient(self.factory, protocols="mqtt")
        self.assertEqual(client.status, 400)
        self.assertIn("v12.stomp", client.transport.value().decode() + client.head)

    def test_origins(self) -> None:
        self.assertEqual(WSClient(self.factory, headers={"Origin": "https://app.example.com"}).status, 101)
        self.assertEqual(WSClient(self.factory, headers={"Origin": "http://127.0.0.1:8080"}).status, 101)
        refused = WSClient(self.factory, headers={"Origin": "https://evil.example.org"})
        self.assertEqual(refused.status, 403)

    def test_frames(self) -> None:
        """Several frames in a message, a frame over several messages, binary messages."""
        client = self.connect()
        client.send(
            b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\x00"
            b"SEND\ndestination:/queue/q\n\nfirst\x00SEND\ndestination:/queue/q\n\nsec"
        )
        client.send(b"ond\x00\n", opcode=2)  # the rest of it, and a heart-beat, in binary
        client.send(b"SEND\ndestination:/queue/q\ncontent-length:3\n\n\xff\x00\xfe\x00", opcode=2)
        frames = client.frames()
        self.assertEqual([op for op, _ in frames], [1, 1, 2])
        bodies = [payload.partition(b"\n\n")[2] for _, payload in frames]
        self.assertEqual(bodies, [b"first\x00", b"second\x00", b"\xff\x00\xfe\x00"])

    def test_fragmented(self) -> None:
        """A WebSocket message in fragments is fed as it comes."""
        client = self.connect()
        client.send(b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\x00")
        client.send_raw(client_frame(b"SEND\ndestination:/qu", 1, fin=False))
        client.send_raw(client_frame(b"eue/q\n\nhi\x00", 0, fin=True))
        [message] = client.messages()
        self.assertTrue(message.endswith(b"\n\nhi\x00"))

    def test_batchPerRead(self) -> None:
        """Messages of one socket read are answered in one write."""
        client = self.connect()
        client.send(b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\x00")
        writes = []
        client.ws._write = writes.append
        client.send_raw(b"".join(
            client_frame(b"SEND\ndestination:/queue/q\n\n%d\x00" % i) for i in range(10)
        ))
        self.assertEqual(len(writes), 1)
        self.assertEqual(len(server_frames(writes[0])), 10)

    def test_mixedRead(self) -> None:
        """One read of whole messages, a ping, a fragmented message and half a
        message: every byte reaches STOMP in order, the ping is answered."""
        client = self.connect()
        client.send(b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\x00")
        send = b"SEND\ndestination:/queue/q\n\n%d\x00"
        last = client_frame(send % 5, 2)
        client.send_raw(
            client_frame(send % 1)
            + client_frame(b"hi", 9)  # ping
            + client_frame(send % 2, 2)
            + client_frame((send % 3)[:10], 1, fin=False)
            + client_frame((send % 3)[10:], 0, fin=True)
            + client_frame(send % 4)
            + last[:7]
        )
        client.send_raw(last[7:])
        frames = client.frames()
        self.assertIn((10, b"hi"), frames)
        bodies = [p.partition(b"\n\n")[2] for op, p in frames if op in (1, 2)]
        self.assertEqual(bodies, [b"%d\x00" % i for i in range(1, 6)])

    def test_anySplit(self) -> None:
        """Messages cut anywhere by the reads (small, 126-byte-length and
        64-bit-length frames among them) arrive whole and in order; a 60 KB
        message trickled a byte per read is gathered, not copied over and
        over."""
        client = self.connect()
        client.send(b"SUBSCRIBE\nid:1\ndestination:/queue/q\n\n\x00")
        client.frames()
        bodies = [b"a", b"b" * 200, b"c" * 70_000, b"d" * 3, b"e" * 60_000]
        stream = b"".join(
            client_frame(b"SEND\ndestination:/queue/q\n\n" + body + b"\x00") for body in bodies
        )
        for size in (1, 7, 1000, 65536):
            for k in range(0, len(stream), size):
                client.send_raw(stream[k : k + size])
            got = [p.partition(b"\n\n")[2] for op, p in client.frames() if op in (1, 2)]
            self.assertEqual(got, [body + b"\x00" for body in bodies], size)

    def test_badUtf8(self) -> None:
        """A text message that is not UTF-8 fails the connection (autobahn
        drops it: failByDrop) and nothing of it is published."""
        client = self.connect()
        client.send_raw(client_frame(b"SEND\ndestination:/queue/q\n\n\xff\x00", 1))
        self.assertFalse(client.transport.connected)
        self.assertNotIn("q", self.ctx.broker.default_vhost.queues)

    def test_unmasked(self) -> None:
        """An unmasked client frame is a protocol error: the connection is dropped."""
        client = self.connect()
        client.send_raw(b"\x81\x05hello")
        self.assertFalse(client.transport.connected)

    def test_unmask(self) -> None:
        from qmq.web.websocket import unmask  # noqa: PLC0415

        for n in (0, 1, 3, 4, 5, 1000):
            payload = os.urandom(n)
            key = os.urandom(4)
            masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
            self.assertEqual(unmask(masked, key), payload)

    def test_stompError(self) -> None:
        """A STOMP error: ERROR, then a WebSocket close; abort after the grace."""
        client = self.connect()
        client.send(b"BOGUS\n\n\x00")
        frames = client.frames()
        self.assertEqual(frames[0][0], 1)
        self.assertTrue(frames[0][1].startswith(b"ERROR\n"))
        self.assertEqual(frames[1][0], 8)
        self.assertEqual(struct.unpack("!H", frames[1][1][:2])[0], 1000)
        self.assertEqual(frames[1][1][2:], b"unknown command")
        # Nothing more is written after the close frame.
        client.ws.write_frames([b"MESSAGE\n\n\x00"])
        self.assertEqual(client.frames(), [])
        aborted = []
        client.transport.abortConnection = lambda: aborted.append(True)
        self.clock.advance(2.0)
        self.assertTrue(aborted)

    def test_disconnect(self) -> None:
        """DISCONNECT: RECEIPT, close; the client's close reply ends the connection."""
        client = self.connect()
        client.send(b"DISCONNECT\nreceipt:7\n\n\x00")
        frames = client.frames()
        self.assertEqual(frames[0], (1, b"RECEIPT\nreceipt-id:7\n\n\x00"))
        self.assertEqual(frames[1][0], 8)
        client.send(struct.pack("!H", 1000), opcode=8)
        self.assertFalse(client.transport.connected)
        self.assertEqual(len(self.ctx.connections), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_clientCloses(self) -> None:
        """The client's close gives the session's messages back."""
        client = self.connect()
        client.send(b"SUBSCRIBE\nid:1\ndestination:/queue/q\nack:client\n\n\x00")
        client.send(b"SEND\ndestination:/queue/q\n\nx\x00")
        self.assertEqual(len(client.messages()), 1)
        queue = self.ctx.broker.default_vhost.queues["q"]
        client.send(struct.pack("!H", 1000), opcode=8)
        self.assertEqual(len(queue), 1)  # requeued
        self.assertFalse(client.transport.connected)

    def test_backPressure(self) -> None:
        """A full socket buffer pauses deliveries; the session can pause reading."""
        client = self.connect()
        ws = client.ws
        self.assertIs(client.transport.producer, client.protocol.transport.producer)
        self.assertIs(client.transport.producer, ws)
        ws.pauseProducing()
        self.assertTrue(ws.session.paused)
        ws.resumeProducing()
        self.assertFalse(ws.session.paused)
        ws.pause_reading()
        self.assertEqual(client.transport.producerState, "paused")
        ws.resume_reading()
        self.assertEqual(client.transport.producerState, "producing")

    def test_heartbeats(self) -> None:
        client = WSClient(self.factory)
        client.send(b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:1000,1000\n\n\x00")
        [connected] = client.messages()
        self.assertIn(b"heart-beat:10000,10000", connected)
        self.clock.advance(5)
        self.clock.advance(5)
        self.clock.advance(0)  # the end of the turn: the batch is written
        self.assertIn(b"\n", client.messages())
        client.send(b"\n")
        # The client's heart-beats keep it alive; silence ends it.
        for _ in range(3):
            self.clock.advance(5)
            client.send(b"\n")
        self.assertTrue(client.transport.connected)
        self.clock.advance(16)
        frames = client.frames()
        self.assertTrue(any(p.startswith(b"ERROR\nmessage:heart-beat timeout") for _, p in frames))

    def test_pings(self) -> None:
        """WebSocket pings every ping_interval; a client that does not pong is dropped."""
        ctx = make_context("[web]\nping_interval = 5\nping_timeout = 3", clock=self.clock)
        client = WSClient(HttpFactory(ctx))
        client.send(CONNECT)
        client.frames()
        self.clock.advance(5)
        [(opcode, payload)] = client.frames()
        self.assertEqual(opcode, 9)
        client.send(payload, opcode=10)  # pong
        self.clock.advance(5)
        self.assertEqual(client.frames()[0][0], 9)
        self.assertTrue(client.transport.connected)
        self.clock.advance(3.1)  # no pong this time
        self.assertFalse(client.transport.connected)

    def test_shutdown(self) -> None:
        """A graceful shutdown sends every WebSocket client an ERROR, then closes."""
        client = self.connect()
        d = self.ctx.connections.shutdown("broker shutting down", timeout=5)
        frames = client.frames()
        self.assertTrue(frames[0][1].startswith(b"ERROR\nmessage:broker shutting down"))
        self.assertEqual(frames[1][0], 8)
        client.send(struct.pack("!H", 1000), opcode=8)
        self.successResultOf(d)

    def test_frameTooLarge(self) -> None:
        """The STOMP limits apply: a body past max_body_size is an ERROR."""
        ctx = make_context("[stomp]\nmax_body_size = 100\n[web]\nping_interval = 0", clock=self.clock)
        client = WSClient(HttpFactory(ctx))
        client.send(CONNECT)
        client.frames()
        client.send(b"SEND\ndestination:/queue/q\n\n" + b"x" * 200)
        frames = client.frames()
        self.assertTrue(frames[0][1].startswith(b"ERROR\n"), frames)
        self.assertEqual(frames[1][0], 8)

    def test_connectTimeout(self) -> None:
        client = WSClient(self.factory)
        self.clock.advance(30)
        frames = client.frames()
        self.assertTrue(frames[0][1].startswith(b"ERROR\nmessage:connect timeout"))

    def test_notUpgrade(self) -> None:
        """A plain GET at /stomp is told it needs a WebSocket."""
        addr = IPv4Address("TCP", "127.0.0.1", 40001)
        protocol = self.factory.buildProtocol(addr)
        transport = StringTransportWithDisconnection(peerAddress=addr)
        transport.protocol = protocol
        protocol.makeConnection(transport)
        protocol.dataReceived(b"GET /stomp HTTP/1.1\r\nHost: localhost\r\n\r\n")
        self.assertIn(transport.value().split()[1], (b"400", b"426"))
