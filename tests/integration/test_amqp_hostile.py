"""Hostile AMQP clients over real sockets (issue 23: "the same bounds and
deadlines as STOMP against hostile input").

A real broker on loopback (L{tests.integration.test_amqp_clients}'s), raw
blocking sockets with timeouts (run in threads): garbage before and after
the protocol header, a frame over frame_max, a body that never ends, more
channels than channel_max. Each gets its answer (the broker's protocol
header, or a C{connection.close} with the right reply code), and the socket
really closes (C{recv} returns C{b""}, or a reset after the close grace,
within a bounded wait); a pika client is served afterwards.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import pika
from pamqp import commands, frame, header
from twisted.internet import defer
from twisted.internet.threads import deferToThread

from qmq.amqp.codec import PROTOCOL_HEADER
from tests.integration.test_amqp_clients import AmqpBrokerCase

#: Seconds any one wait may take.
WAIT = 15.0


class RawClient:
    """A blocking socket speaking AMQP frames with pamqp."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.buffer = b""
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def method(self, method: Any, channel: int = 0) -> None:
        self.send(frame.marshal(method, channel))

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def raw(self, n: int) -> bytes:
        while len(self.buffer) < n and self._fill():
            pass
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def next(self) -> tuple[int, Any] | None:
        """The next frame, or None at the end of the stream."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.buffer:
                try:
                    used, channel, value = frame.unmarshal(self.buffer)
                except Exception:
                    used = 0
                if used:
                    self.buffer = self.buffer[used:]
                    return channel, value
            if not self._fill():
                return None
        raise AssertionError("no frame within the wait")

    def expect(self, cls: type) -> Any:
        got = self.next()
        assert got is not None and isinstance(got[1], cls), got
        return got[1]

    def closed(self) -> bool:
        """Whether the broker closes the socket within the wait (what it
        still sends is read and dropped)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if not self._fill():
                return True
            self.buffer = b""
        return False

    def handshake(self) -> None:
        self.send(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.method(commands.Connection.StartOk({}, "PLAIN", "\0guest\0guest"))
        self.expect(commands.Connection.Tune)
        self.method(commands.Connection.TuneOk(8, 8192, 0))
        self.method(commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)

    def connection_close(self) -> tuple[int, str]:
        """The broker's connection.close (what came before it is skipped),
        answered with close-ok."""
        while True:
            got = self.next()
            assert got is not None, "socket closed without a connection.close"
            if isinstance(got[1], commands.Connection.Close):
                self.method(commands.Connection.CloseOk())
                return got[1].reply_code, got[1].reply_text

    def close(self) -> None:
        self.sock.close()


class HostileSocketTests(AmqpBrokerCase):
    extra = "[amqp]\nframe_timeout = 1.0\nchannel_max = 8\n"

    def run_raw(self, scenario: Any) -> Any:
        def run() -> Any:
            c = RawClient(self.port)
            try:
                return scenario(c)
            finally:
                c.close()

        return deferToThread(run)

    @defer.inlineCallbacks
    def still_serving(self) -> Any:
        """The broker still serves a real client."""

        def pika_round() -> bytes | None:
            conn = pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", port=self.port, socket_timeout=WAIT,
                                          blocked_connection_timeout=WAIT))
            ch = conn.channel()
            ch.queue_declare("after")
            ch.basic_publish("", "after", b"still here")
            _method, _props, body = ch.basic_get("after", auto_ack=True)
            conn.close()
            return body

        self.assertEqual((yield deferToThread(pika_round)), b"still here")

    @defer.inlineCallbacks
    def test_garbage_before_header(self) -> Any:
        """Not AMQP: the header the broker speaks, then the socket closes."""

        def scenario(c: RawClient) -> tuple:
            c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            return c.raw(8), c.closed()

        answer, closed = yield self.run_raw(scenario)
        self.assertEqual(answer, PROTOCOL_HEADER)
        self.assertTrue(closed)
        yield self.still_serving()

    @defer.inlineCallbacks
    def test_garbage_after_header(self) -> Any:
        """Bytes that are no frame after the header: 501, then the close."""

        def scenario(c: RawClient) -> tuple:
            c.send(PROTOCOL_HEADER)
            c.expect(commands.Connection.Start)
            c.send(b"\xff" * 64)
            return c.connection_close(), c.closed()

        (code, text), closed = yield self.run_raw(scenario)
        self.assertEqual(code, 501)
        self.assertIn("frame", text)
        self.assertTrue(closed)
        yield self.still_serving()

    @defer.inlineCallbacks
    def test_garbage_without_close_ok(self) -> Any:
        """A client that keeps sending garbage and never answers the
        connection.close is cut off after the close grace."""

        def scenario(c: RawClient) -> tuple:
            c.handshake()
            c.send(b"\x01\x00\x01" + b"\x00" * 4 + b"\x00")  # a method frame of size 0
            got = c.next()
            for _ in range(20):
                try:
                    c.send(b"garbage " * 64)
                except OSError:
                    break
            return got, c.closed()

        got, closed = yield self.run_raw(scenario)
        self.assertIsInstance(got[1], commands.Connection.Close)
        self.assertEqual(got[1].reply_code, 501)
        self.assertTrue(closed)
        yield self.still_serving()

    @defer.inlineCallbacks
    def test_frame_over_frame_max(self) -> Any:
        """A frame larger than the negotiated frame_max (8192) is 501, before
        its payload is read."""

        def scenario(c: RawClient) -> tuple:
            c.handshake()
            c.method(commands.Channel.Open(), 1)
            c.expect(commands.Channel.OpenOk)
            c.send(struct.pack(">BHI", 3, 1, 200000) + b"x" * 100)
            return c.connection_close(), c.closed()

        (code, text), closed = yield self.run_raw(scenario)
        self.assertEqual(code, 501)
        self.assertIn("frame_max", text)
        self.assertTrue(closed)
        yield self.still_serving()

    @defer.inlineCallbacks
    def test_body_that_never_ends(self) -> Any:
        """A message whose body never comes is 501 after amqp.frame_timeout."""

        def scenario(c: RawClient) -> tuple:
            c.handshake()
            c.method(commands.Channel.Open(), 1)
            c.expect(commands.Channel.OpenOk)
            c.send(frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
                   + frame.marshal(header.ContentHeader(0, 1000, commands.Basic.Properties()), 1)
                   + struct.pack(">BHI", 3, 1, 500) + b"y" * 100)
            return c.connection_close(), c.closed()

        (code, text), closed = yield self.run_raw(scenario)
        self.assertEqual(code, 501)
        self.assertIn("frame_timeout", text)
        self.assertTrue(closed)
        yield self.still_serving()

    @defer.inlineCallbacks
    def test_many_channels(self) -> Any:
        """Channels up to channel_max (8) open; the next is 530."""

        def scenario(c: RawClient) -> tuple:
            c.handshake()
            for n in range(1, 9):
                c.method(commands.Channel.Open(), n)
                c.expect(commands.Channel.OpenOk)
            c.method(commands.Channel.Open(), 9)
            return c.connection_close(), c.closed()

        (code, text), closed = yield self.run_raw(scenario)
        self.assertEqual(code, 530)
        self.assertIn("channel_max", text)
        self.assertTrue(closed)
        yield self.still_serving()
