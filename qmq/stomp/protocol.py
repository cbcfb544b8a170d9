# -*- test-case-name: tests.test_stomp_protocol -*-
"""Twisted glue for STOMP over a stream transport (TCP, TLS, unix sockets).

L{StompProtocol} only connects a Twisted transport to a
L{qmq.stomp.session.StompSession}: bytes in, bytes out, and the transport's
producer/consumer signals, so a client that stops reading stops getting
deliveries instead of growing the broker's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, tcp
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.core.broker import Broker
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from qmq.transport import ITransport

log = Logger()


def _peer_name(transport: Any) -> str:
    try:
        peer = transport.getPeer()
    except Exception:
        return "?"
    host = getattr(peer, "host", None)
    port = getattr(peer, "port", None)
    if host is None:
        return str(peer)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def direct_writer(transport: Any) -> Callable[[bytes], None]:
    """A write function for C{transport} that skips a reactor turn when it can.

    Twisted's TCP transport buffers every write and sends it on the next
    reactor iteration, after registering the socket for writability and
    before unregistering it: two C{epoll_ctl} calls and a loop turn for every
    batch. The session already writes one batch per turn, so when nothing is
    pending in the transport this sends the batch at once and leaves only
    what the kernel did not take to Twisted's buffering (and to its
    producer/consumer back-pressure). Other transports (TLS, unix sockets,
    test transports) get their own C{write}.
    """
    write = transport.write
    if type(transport) is not tcp.Server:
        return write  # type: ignore[no-any-return]
    sock = transport.socket

    def send(data: bytes) -> None:
        if (
            transport._tempDataLen
            or len(transport.dataBuffer) > transport.offset
            or not transport.connected
            or transport.disconnecting
        ):
            write(data)
            return
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            write(data)  # let Twisted meet the error and close the connection
            return
        if sent < len(data):
            write(data[sent:])

    return send


def hold_batches_per_read(tls: TLSMemoryBIOProtocol, batcher: Any) -> None:
    """Batch writes over a whole TCP read of a TLS connection.

    Twisted's TLS layer hands the decrypted bytes of one TCP read to the
    protocol one TLS record (at most 16 KiB) at a time, so the session would
    flush its deliveries, and encrypt them, once per record. Holding the
    write batcher around the TLS layer's own C{dataReceived} makes that one
    flush (and one TLS write) per TCP read, as over plain TCP.
    """
    inner = tls.dataReceived

    def dataReceived(data: bytes) -> None:
        batcher.hold()
        try:
            inner(data)
        finally:
            batcher.release()

    tls.dataReceived = dataReceived  # type: ignore[method-assign]


@implementer(IPushProducer, ITransport)
class StompProtocol(Protocol):
    """A STOMP connection over a stream transport: the session's L{ITransport}."""

    session: StompSession
    heartbeats = True
    identity = None

    def __init__(self, factory: StompFactory) -> None:
        self.factory = factory
        self.peer = "?"
        self._write = None

    def connectionMade(self) -> None:
        factory = self.factory
        transport = self.transport
        self.peer = _peer_name(transport)
        self._write = direct_writer(transport)
        self.session = StompSession(factory.broker, factory.settings, self, clock=factory.clock)
        self.reader = StompReader(self.session)
        self.dataReceived = self.reader.data_received  # type: ignore[method-assign]
        if isinstance(transport, TLSMemoryBIOProtocol):
            hold_batches_per_read(transport, factory.broker.batcher)
        transport.registerProducer(self, True)  # type: ignore[union-attr]
        factory.connections.add(self)
        log.info("connection open protocol=stomp peer={peer} session={session}",
                 peer=self.peer, session=self.session.id)

    def dataReceived(self, data: bytes) -> None:  # replaced per instance in connectionMade
        self.reader.data_received(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        session = self.session
        session.connection_lost()
        self.factory.connections.discard(self)
        log.info("connection closed protocol=stomp peer={peer} session={session} reason={reason}",
                 peer=self.peer, session=session.id,
                 reason=reason.getErrorMessage() if reason is not None else "")
        self.factory._lost(self)

    # ITransport: what the session calls.
    def write_frames(self, frames: list[bytes]) -> None:
        self._write(frames[0] if len(frames) == 1 else b"".join(frames))  # type: ignore[misc]

    def close(self, reason: str) -> None:
        self.transport.loseConnection()  # type: ignore[union-attr]

    def pause_reading(self) -> None:
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        self.transport.resumeProducing()  # type: ignore[union-attr]

    # IPushProducer: the transport tells us when its buffer is full or drained.
    def pauseProducing(self) -> None:
        self.session.pause()

    def resumeProducing(self) -> None:
        self.session.resume()

    def stopProducing(self) -> None:
        pass


class StompFactory(Factory):
    """Builds L{StompProtocol}s sharing one broker and one set of settings.

    @ivar connections: the open connections.
    """

    protocol = StompProtocol

    def __init__(self, broker: Broker, settings: StompSettings | None = None, clock: Any = None) -> None:
        self.broker = broker
        self.settings = settings if settings is not None else StompSettings()
        self.clock = clock if clock is not None else broker.clock
        self.connections: set[StompProtocol] = set()
        self._drained: list[defer.Deferred] = []

    def buildProtocol(self, addr: Any) -> StompProtocol:
        return StompProtocol(self)

    def _lost(self, proto: StompProtocol) -> None:
        if not self.connections and self._drained:
            waiting, self._drained = self._drained, []
            for d in waiting:
                d.callback(None)

    def shutdown(self, reason: str = "broker shutting down", timeout: float = 5.0) -> defer.Deferred:
        """Send every client an ERROR frame and close it.

        @return: a Deferred that fires once every connection is closed, or
            after C{timeout} seconds, when the stragglers are aborted.
        """
        if not self.connections:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._drained.append(d)
        for proto in list(self.connections):
            proto.session.shutdown(reason)

        def abort() -> None:
            for proto in list(self.connections):
                transport = proto.transport
                if transport is not None and hasattr(transport, "abortConnection"):
                    transport.abortConnection()
            # A transport that cannot abort must not hold the shutdown up.
            if self._drained and d in self._drained:
                self._drained.remove(d)
                d.callback(None)

        timer = self.clock.callLater(timeout, abort)

        def done(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(done)
