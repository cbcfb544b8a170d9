# -*- test-case-name: tests.test_amqp_session -*-
"""Twisted glue for AMQP 0-9-1 over a stream transport (TCP, TLS, unix sockets).

L{AmqpProtocol} connects a Twisted transport to an
L{qmq.amqp.session.AmqpSession} the way L{qmq.stomp.protocol.StompProtocol}
does for STOMP, with the same life (L{qmq.stream.StreamConnection}'s, which
both subclass):

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
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from qmq.amqp.codec import PROTOCOL_HEADER
from qmq.amqp.session import AmqpSession
from qmq.amqp.settings import AmqpSettings
from qmq.stream import ListenerFactory, StreamConnection, abort_transport

__all__ = ["AmqpFactory", "AmqpProtocol", "RefusedAmqpProtocol"]


class AmqpProtocol(StreamConnection):
    """An AMQP connection over a stream transport: the session's transport
    (the connection's life is L{StreamConnection}'s).

    @ivar peer_host: the client's address, for the registry's caps.
    @ivar identity: the client's verified TLS identity once the handshake
        is done, else None.
    """

    session: AmqpSession
    protocol_name = "amqp"
    log_namespace = __name__

    def open_session(self) -> None:
        factory = self.factory
        self.session = AmqpSession(factory.broker, factory.settings, self, clock=factory.clock)
        self.dataReceived = self.session.data_received  # type: ignore[method-assign]

    def dataReceived(self, data: bytes) -> None:  # replaced per instance in open_session
        self.session.data_received(data)

    @property
    def close_grace(self) -> float:
        """Seconds a closing connection may take before it is aborted."""
        return self.factory.registry.settings.close_grace

    def shutdown(self, reason: str) -> None:
        """Send the client a connection.close (320) saying C{reason}; the
        socket closes at its close-ok or after the grace."""
        self.session.shutdown(reason)


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
            self.factory.registry.settings.close_grace, abort_transport, self.transport
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


class AmqpFactory(ListenerFactory):
    """Builds L{AmqpProtocol}s sharing one broker and one set of settings."""

    protocol = AmqpProtocol
    refused = RefusedAmqpProtocol
    settings_class = AmqpSettings
    default_listener = "amqp"
    settings: AmqpSettings
