# -*- test-case-name: tests.test_stomp_session,tests.integration.test_close -*-
"""Twisted glue for STOMP over a stream transport (TCP, TLS, unix sockets).

L{StompProtocol} only connects a Twisted transport to a
L{qmq.stomp.session.StompSession}: bytes in, bytes out, and the transport's
producer/consumer signals, so a client that stops reading stops getting
deliveries instead of growing the broker's memory.

The life below is L{qmq.stream.StreamConnection}'s, which AMQP's
connections share; this module adds STOMP's session, reader and refusal.
A connection's life:

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

from twisted.internet.protocol import Protocol
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.core.broker import Broker
from qmq.stomp.frame import encode_frame
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from qmq.stream import ListenerFactory, StreamConnection, abort_transport
from qmq.transport import ITransport

__all__ = ["RefusedStompProtocol", "StompFactory", "StompProtocol"]


@implementer(ITransport)
class StompProtocol(StreamConnection):
    """A STOMP connection over a stream transport: the session's
    L{ITransport} (the connection's life is L{StreamConnection}'s).

    @ivar peer_host: the client's address, for the registry's caps (C{""}
        for a unix socket).
    @ivar identity: the client's verified TLS identity once the handshake is
        done, else L{None}.
    """

    session: StompSession
    heartbeats = True
    protocol_name = "stomp"
    log_namespace = __name__
    log_level = LogLevel.debug

    def open_session(self) -> None:
        factory = self.factory
        self.session = StompSession(factory.broker, factory.settings, self, clock=factory.clock)
        self.reader = StompReader(self.session)
        self.dataReceived = self.reader.data_received  # type: ignore[method-assign]

    def dataReceived(self, data: bytes) -> None:  # replaced per instance in open_session
        self.reader.data_received(data)

    def session_lost(self) -> None:
        self.reader.connection_lost()
        self.session.connection_lost()

    def discard_input(self) -> None:
        self.reader.discard()

    def shutdown(self, reason: str) -> None:
        """Send the client an C{ERROR} saying C{reason}, then close."""
        self.session.shutdown(reason)
        # A session that had already closed sends nothing; the close must
        # still be under way.
        self.close(reason)


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
                self.factory.registry.settings.close_grace, abort_transport, transport
            )

    def dataReceived(self, data: bytes) -> None:
        pass  # whatever it sends, the answer is already on its way

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        self._grace = None


class StompFactory(ListenerFactory):
    """Builds L{StompProtocol}s sharing one broker and one set of settings
    (L{ListenerFactory}: C{shutdown} sends this listener's clients an
    C{ERROR} frame and closes them).

    @ivar registry: the connection registry (the broker's, shared with
        every listener; a registry of its own if none is given).
    @ivar listener: this listener's name in the registry.
    """

    protocol = StompProtocol
    refused = RefusedStompProtocol
    settings_class = StompSettings
    default_listener = "stomp"
    broker: Broker
    settings: StompSettings
