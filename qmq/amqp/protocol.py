# -*- test-case-name: tests.test_amqp_session -*-
"""Twisted glue for AMQP 0-9-1 over a stream transport (TCP, TLS, unix sockets).

L{AmqpProtocol} connects a Twisted transport to an
L{qmq.amqp.session.AmqpSession} the way L{qmq.stomp.protocol.StompProtocol}
does for STOMP, with the same life:

    1. L{AmqpFactory.buildProtocol} asks the broker's connection registry
       to admit the connection (per listener and per address caps); a
       refused one gets a L{RefusedAmqpProtocol}: the AMQP header, a
       C{connection.close} (530, too many connections) and a close.
    2. C{connectionMade}: the session, the streaming producer, the
       registry; over TLS a handshake deadline (C{handshake_timeout}),
       after which C{handshakeCompleted} reads the client certificate's
       identity (for SASL EXTERNAL).
    3. L{AmqpProtocol.close}: unregister the producer, close (TCP: after
       what was written; TLS: loseConnection), abort after C{close_grace}.
    4. C{connectionLost}: the session gives back what it held, timers stop,
       the registry forgets the connection.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands
from pamqp import frame as pamqp_frame
from twisted.internet import defer
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.amqp.codec import PROTOCOL_HEADER
from qmq.amqp.session import AmqpSession
from qmq.amqp.settings import AmqpSettings
from qmq.connections import ConnectionRegistry
from qmq.logs import transport_peer
from qmq.stomp.protocol import _abort
from qmq.tls import PeerIdentity, peer_identity
from qmq.transport import IConnection
from qmq.twisted_internals import direct_writer, hold_batches_per_read

__all__ = ["AmqpFactory", "AmqpProtocol", "RefusedAmqpProtocol"]

log = Logger()


@implementer(IPushProducer, IConnection, IHandshakeListener)
class AmqpProtocol(Protocol):
    """An AMQP connection over a stream transport: the session's transport.

    @ivar peer_host: the client's address, for the registry's caps.
    @ivar identity: the client's verified TLS identity once the handshake
        is done, else None.
    """

    session: AmqpSession
    #: The protocol's name in the metrics (qmq_connections{protocol}).
    protocol_name = "amqp"

    def __init__(self, factory: AmqpFactory, peer_host: str = "") -> None:
        self.factory = factory
        self.peer = "?"
        self.peer_host = peer_host
        self.identity: PeerIdentity | None = None
        self.close_grace = factory.registry.settings.close_grace
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
        self.session = AmqpSession(factory.broker, factory.settings, self, clock=factory.clock)
        self.dataReceived = self.session.data_received  # type: ignore[method-assign]
        if ISSLTransport.providedBy(transport):
            hold_batches_per_read(transport, factory.broker.batcher)
            self._handshake = factory.clock.callLater(
                factory.registry.settings.handshake_timeout, self._handshake_timeout
            )
        transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._producing = True
        factory.registry.add(self, factory.listener)
        log.info("connection open protocol=amqp peer={peer} session={session}",
                 peer=self.peer, session=self.session.id)

    def dataReceived(self, data: bytes) -> None:  # replaced per instance in connectionMade
        self.session.data_received(data)

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done: stop its clock, read who the client is."""
        timer, self._handshake = self._handshake, None
        if timer is not None and timer.active():
            timer.cancel()
        self.identity = peer_identity(self.transport)

    def _handshake_timeout(self) -> None:
        self._handshake = None
        log.info("tls handshake timeout protocol=amqp peer={peer}", peer=self.peer)
        self.abort()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        self._producing = False
        for timer in (self._grace, self._handshake):
            if timer is not None and timer.active():
                timer.cancel()
        self._grace = self._handshake = None
        self.session.connection_lost()
        factory = self.factory
        factory.registry.remove(self)
        log.info("connection closed protocol=amqp peer={peer} session={session} reason={reason}",
                 peer=self.peer, session=self.session.id,
                 reason=reason.getErrorMessage() if reason is not None else "")
        factory.connection_lost(self)

    # What the session calls.
    def write_frames(self, frames: list[bytes]) -> None:
        self._write(frames[0] if len(frames) == 1 else b"".join(frames))

    def close(self, reason: str) -> None:
        """Flush what was written, close, and abort after C{close_grace} seconds."""
        if self._closing or self._lost:
            return
        self._closing = True
        transport = self.transport
        if self._producing:
            # Twisted's TLS layer starts its close only once no producer is
            # registered (see qmq.stomp.protocol).
            self._producing = False
            transport.unregisterProducer()  # type: ignore[union-attr]
        if ISSLTransport.providedBy(transport) or not hasattr(transport, "loseWriteConnection"):
            transport.loseConnection()  # type: ignore[union-attr]
        else:
            # Plain TCP: what was written (the close) and a FIN go out while
            # the broker reads and discards, so no reset drops the close.
            transport.loseWriteConnection()  # type: ignore[union-attr]
            transport.resumeProducing()  # type: ignore[union-attr]
        if not self._lost:
            self._grace = self.factory.clock.callLater(self.close_grace, self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        log.info("connection aborted after the close grace protocol=amqp peer={peer}", peer=self.peer)
        self.abort()

    def pause_reading(self) -> None:
        if not self._closing:
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        if not self._closing:
            self.transport.resumeProducing()  # type: ignore[union-attr]

    # IConnection: what the registry calls.
    def shutdown(self, reason: str) -> None:
        """Send the client a connection.close (320) saying C{reason}; the
        socket closes at its close-ok or after the grace."""
        self.session.shutdown(reason)

    def abort(self) -> None:
        if not self._lost:
            _abort(self.transport)

    # IPushProducer: the transport's write buffer.
    def pauseProducing(self) -> None:
        self.session.pause()

    def resumeProducing(self) -> None:
        self.session.resume()

    def stopProducing(self) -> None:
        pass


class RefusedAmqpProtocol(Protocol):
    """A connection over the registry's caps: once the client's protocol
    header is in, a C{connection.close} (530, the reason) and a close."""

    def __init__(self, factory: AmqpFactory, detail: str) -> None:
        self.factory = factory
        self.detail = detail
        self._grace: Any = None
        self._lost = False
        self._answered = False

    def connectionMade(self) -> None:
        self._grace = self.factory.clock.callLater(
            self.factory.registry.settings.close_grace, _abort, self.transport
        )

    def dataReceived(self, data: bytes) -> None:
        if self._answered:
            return
        self._answered = True
        transport = self.transport
        if data.startswith(PROTOCOL_HEADER[:4]):
            text = f"NOT_ALLOWED - too many connections: {self.detail}"[:255]
            transport.write(pamqp_frame.marshal(commands.Connection.Close(530, text, 0, 0), 0))  # type: ignore[union-attr]
        transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        self._grace = None


class AmqpFactory(Factory):
    """Builds L{AmqpProtocol}s sharing one broker and one set of settings."""

    protocol = AmqpProtocol

    def __init__(
        self,
        broker: Any,
        settings: AmqpSettings | None = None,
        clock: Any = None,
        registry: ConnectionRegistry | None = None,
        listener: str = "amqp",
    ) -> None:
        self.broker = broker
        self.settings = settings if settings is not None else AmqpSettings()
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
            return RefusedAmqpProtocol(self, refusal)
        return AmqpProtocol(self, host)

    def connection_lost(self, proto: AmqpProtocol) -> None:
        """A connection is gone (a hook for tests)."""

    def shutdown(self, reason: str = "broker shutting down", timeout: float = 5.0) -> defer.Deferred:
        return self.registry.shutdown(reason, timeout, listener=self.listener)
