# -*- test-case-name: tests.integration.test_tcp_writes -*-
"""Big frames and many small ones through a real TCP listener.

The STOMP protocol sends a batch straight to the socket when Twisted's
transport has nothing pending (L{qmq.twisted_internals.direct_writer}); what the
kernel does not take goes through Twisted's buffer. These tests push frames
larger than any socket buffer, and bursts of small ones, through a real
loopback connection and check that every byte arrives, in order.
"""

from __future__ import annotations

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString
from twisted.internet.protocol import Factory, Protocol
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.stomp.frame import StompParser, encode_frame
from qmq.stomp.protocol import StompFactory
from qmq.twisted_internals import direct_writer


class _Client(Protocol):
    """Collects MESSAGE frames until C{want} have arrived."""

    def __init__(self, want: int) -> None:
        self.parser = StompParser(max_body_size=64 * 1024 * 1024)
        self.parser.version = "1.2"
        self.frames: list = []
        self.want = want
        self.done: defer.Deferred = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        for frame in self.parser.feed(data):
            self.frames.append(frame)
            if frame.command == "ERROR" or (
                sum(f.command == "MESSAGE" for f in self.frames) >= self.want
            ):
                if not self.done.called:
                    self.done.callback(self.frames)


class DirectWriteTests(unittest.TestCase):
    def setUp(self) -> defer.Deferred:
        self.broker = Broker(reactor)
        self.factory = StompFactory(self.broker)
        d = serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(self.factory)

        def listening(port):
            self.port = port
            self.addCleanup(port.stopListening)

        return d.addCallback(listening)

    @defer.inlineCallbacks
    def _exchange(self, bodies: list[bytes]):
        client = _Client(len(bodies))
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port)
        proto = yield endpoint.connect(Factory.forProtocol(lambda: client))
        self.addCleanup(proto.transport.loseConnection)
        out = [
            encode_frame("CONNECT", {"accept-version": "1.2", "host": "/"}),
            encode_frame("SUBSCRIBE", {"destination": "/queue/big", "id": "0"}),
        ]
        out += [encode_frame("SEND", {"destination": "/queue/big"}, b) for b in bodies]
        proto.transport.write(b"".join(out))
        timeout = reactor.callLater(30, client.done.cancel)
        frames = yield client.done
        timeout.cancel()
        return [f for f in frames if f.command == "MESSAGE"]

    @defer.inlineCallbacks
    def test_frames_larger_than_socket_buffers(self) -> defer.Generator:
        """Three 4 MiB bodies arrive whole and in order."""
        bodies = [bytes([65 + i]) * (4 * 1024 * 1024) for i in range(3)]
        messages = yield self._exchange(bodies)
        self.assertEqual([m.body for m in messages], bodies)

    @defer.inlineCallbacks
    def test_many_small_frames_in_order(self) -> defer.Generator:
        """A burst of 5,000 small messages arrives complete and in order."""
        bodies = [b"%06d" % i for i in range(5000)]
        messages = yield self._exchange(bodies)
        self.assertEqual([m.body for m in messages], bodies)


class DirectWriterChoiceTests(unittest.SynchronousTestCase):
    def test_other_transports_keep_their_write(self) -> None:
        """Only Twisted's TCP server transport gets the direct path."""
        from twisted.internet.testing import StringTransport

        transport = StringTransport()
        self.assertEqual(direct_writer(transport), transport.write)
