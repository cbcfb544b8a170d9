# -*- test-case-name: tests.test_stomp_session,tests.integration.test_close -*-
"""Twisted glue for STOMP over a stream transport (TCP, TLS, unix sockets).

L{StompProtocol} only connects a Twisted transport to a
L{qmq.stomp.session.StompSession}: bytes in, bytes out, and the transport's
producer/consumer signals, so a client that stops reading stops getting
deliveries instead of growing the broker's memory.

A connection's life, as this module sees it:

    1. L{StompFactory.buildProtocol} asks the broker's
       L{qmq.connections.ConnectionRegistry} whether the listener may take
       one more connection from this address. If not, the client gets a
       L{RefusedStompProtocol}: one C{ERROR} frame
       (C{message:too many connections}) and a close, nothing more.
    2. C{connectionMade}: the session is created, the protocol registers as
       the transport's streaming producer and in the registry. Over TLS the
       handshake must finish within C{handshake_timeout} seconds
       (C{handshakeCompleted} stops that clock and reads the client's
       certificate), or the connection is aborted: a client that never sends
       a ClientHello cannot hold a socket.
    3. The session closes the connection with L{StompProtocol.close} (after
       an C{ERROR}, a C{DISCONNECT}, a timeout, a shutdown). Closing
       unregisters the producer first: Twisted's TLS layer does not start its
       close while a producer is registered, so without this a TLS socket
       outlived its session. Then C{loseConnection()} flushes what was
       written and closes; a peer that does not let it close within
       C{close_grace} seconds is aborted.
    4. C{connectionLost}: the session lets go of what it held, every timer
       of the connection is cancelled, the registry forgets it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.connections import ConnectionRegistry
from qmq.core.broker import Broker
from qmq.logs import transport_peer
from qmq.stomp.frame import encode_frame
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from qmq.tls import PeerIdentity, peer_identity
from qmq.transport import IConnection, ITransport
from qmq.twisted_internals import direct_writer, hold_batches_per_read

__all__ = ["RefusedStompProtocol", "StompFactory", "StompProtocol"]

log = Logger()


def _abort(transport: Any) -> None:
    abort = getattr(transport, "abortConnection", None)
    if abort is not None:
        abort()
    else:
        transport.loseConnection()


@implementer(IPushProducer, ITransport, IConnection, IHandshakeListener)
class StompProtocol(Protocol):
    """A STOMP connection over a stream transport: the session's L{ITransport}.

    @ivar peer_host: the client's address, for the registry's caps (C{""}
        for a unix socket).
    @ivar identity: the client's verified TLS identity once the handshake is
        done, else L{None}.
    """

    session: StompSession
    heartbeats = True

    def __init__(self, factory: StompFactory, peer_host: str = "") -> None:
        self.factory = factory
        self.peer = "?"
        self.peer_host = peer_host
        self.identity: PeerIdentity | None = None
        self._write: Any = None
        self._producing = False
        self._closing = False
        self._lost = False
        self._grace: Any = None
        self._handshake: Any = None

    def connectionMade(self) -> None:
        factory = self.factory
        transport = self.transport
        self.peer = transport_peer(transport)
        self._write = direct_writer(transport)
        self.session = StompSession(factory.broker, factory.settings, self, clock=factory.clock)
        self.reader = StompReader(self.session)
        self.dataReceived = self.reader.data_received  # type: ignore[method-assign]
        if ISSLTransport.providedBy(transport):
            hold_batches_per_read(transport, factory.broker.batcher)
            self._handshake = factory.clock.callLater(
                factory.registry.settings.handshake_timeout, self._handshake_timeout
            )
        transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._producing = True
        factory.registry.add(self, factory.listener)
        log.debug("connection open protocol=stomp peer={peer} session={session}",
                 peer=self.peer, session=self.session.id)

    def dataReceived(self, data: bytes) -> None:  # replaced per instance in connectionMade
        self.reader.data_received(data)

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done: stop its clock, read who the client is."""
        timer, self._handshake = self._handshake, None
        if timer is not None and timer.active():
            timer.cancel()
        self.identity = peer_identity(self.transport)

    def _handshake_timeout(self) -> None:
        self._handshake = None
        log.info("tls handshake timeout protocol=stomp peer={peer} session={session}",
                 peer=self.peer, session=self.session.id)
        # Nothing can have been sent over TLS yet: there is nothing to flush.
        self.abort()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        self._producing = False
        for timer in (self._grace, self._handshake):
            if timer is not None and timer.active():
                timer.cancel()
        self._grace = self._handshake = None
        session = self.session
        self.reader.connection_lost()
        session.connection_lost()
        factory = self.factory
        factory.registry.remove(self)
        log.debug("connection closed protocol=stomp peer={peer} session={session} reason={reason}",
                 peer=self.peer, session=session.id,
                 reason=reason.getErrorMessage() if reason is not None else "")
        factory.connection_lost(self)

    # ITransport: what the session calls.
    def write_frames(self, frames: list[bytes]) -> None:
        self._write(frames[0] if len(frames) == 1 else b"".join(frames))

    def close(self, reason: str) -> None:
        """Flush what was written, close, and abort after C{close_grace} seconds.

        @param reason: why (for the log; the session told the client).
        """
        if self._closing or self._lost:
            return
        self._closing = True
        self.reader.discard()
        transport = self.transport
        if self._producing:
            # Twisted's TLS layer starts its close only once no producer is
            # registered: unregister first, or the socket stays open.
            self._producing = False
            transport.unregisterProducer()  # type: ignore[union-attr]
        if ISSLTransport.providedBy(transport) or not hasattr(transport, "loseWriteConnection"):
            transport.loseConnection()  # type: ignore[union-attr]
        else:
            # Plain TCP: send what was written (the ERROR) and a FIN, and
            # keep reading (and discarding) until the client closes or the
            # grace ends. Closing a socket whose client is still sending
            # makes the kernel answer with a reset, and the client may lose
            # the ERROR that explains why it was cut off.
            transport.loseWriteConnection()  # type: ignore[union-attr]
            transport.resumeProducing()  # type: ignore[union-attr]
        if not self._lost:  # some transports lose the connection at once
            self._grace = self.factory.clock.callLater(
                self.factory.registry.settings.close_grace, self._grace_over
            )

    def _grace_over(self) -> None:
        self._grace = None
        log.info("connection aborted after the close grace protocol=stomp peer={peer} "
                 "session={session}", peer=self.peer, session=self.session.id)
        self.abort()

    def pause_reading(self) -> None:
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        self.transport.resumeProducing()  # type: ignore[union-attr]

    # IConnection: what the registry calls.
    def shutdown(self, reason: str) -> None:
        """Send the client an C{ERROR} saying C{reason}, then close."""
        self.session.shutdown(reason)
        # A session that had already closed sends nothing; the close must
        # still be under way.
        self.close(reason)

    def abort(self) -> None:
        """Drop the connection now."""
        if not self._lost:
            _abort(self.transport)

    # IPushProducer: the transport tells us when its buffer is full or drained.
    def pauseProducing(self) -> None:
        self.session.pause()

    def resumeProducing(self) -> None:
        self.session.resume()

    def stopProducing(self) -> None:
        pass


class RefusedStompProtocol(Protocol):
    """A connection the registry refused: one C{ERROR} frame, then closed.

    Cheap by design: no session, not counted in the registry. Over TLS the
    frame waits for the handshake; a client that does not finish it (or
    does not read) is aborted after C{close_grace} seconds.
    """

    def __init__(self, factory: StompFactory, detail: str) -> None:
        self.factory = factory
        self.detail = detail
        self._grace: Any = None
        self._lost = False

    def connectionMade(self) -> None:
        transport = self.transport
        transport.write(  # type: ignore[union-attr]
            encode_frame(
                "ERROR",
                [("message", "too many connections"), ("content-type", "text/plain")],
                self.detail.encode(),
                "1.0",
            )
        )
        transport.loseConnection()  # type: ignore[union-attr]
        if not self._lost:
            self._grace = self.factory.clock.callLater(
                self.factory.registry.settings.close_grace, _abort, transport
            )

    def dataReceived(self, data: bytes) -> None:
        pass  # whatever it sends, the answer is already on its way

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        self._grace = None


class StompFactory(Factory):
    """Builds L{StompProtocol}s sharing one broker and one set of settings.

    @ivar registry: the connection registry (the broker's, shared with
        every listener; a registry of its own if none is given).
    @ivar listener: this listener's name in the registry.
    """

    protocol = StompProtocol

    def __init__(
        self,
        broker: Broker,
        settings: StompSettings | None = None,
        clock: Any = None,
        registry: ConnectionRegistry | None = None,
        listener: str = "stomp",
    ) -> None:
        self.broker = broker
        self.settings = settings if settings is not None else StompSettings()
        self.clock = clock if clock is not None else broker.clock
        self.registry = registry if registry is not None else ConnectionRegistry(clock=self.clock)
        self.listener = listener

    @property
    def connections(self) -> Any:
        """This listener's open connections (a live view)."""
        return self.registry.connections(self.listener)

    def buildProtocol(self, addr: Any) -> Protocol:
        host = getattr(addr, "host", None) or ""
        refusal = self.registry.admit(self.listener, host)
        if refusal is not None:
            return RefusedStompProtocol(self, refusal)
        return StompProtocol(self, host)

    def connection_lost(self, proto: StompProtocol) -> None:
        """A connection is gone (a hook for tests that count them)."""

    def shutdown(self, reason: str = "broker shutting down", timeout: float = 5.0) -> defer.Deferred:
        """Send this listener's clients an ERROR frame and close them.

        The broker's service shuts every listener down at once through the
        registry (L{ConnectionRegistry.shutdown}); this is the same for one
        listener.

        @return: a Deferred that fires once every connection is closed, or
            after C{timeout} seconds, when the stragglers are aborted.
        """
        return self.registry.shutdown(reason, timeout, listener=self.listener)
