# -*- test-case-name: tests.test_stream,tests.test_stomp_session,tests.test_amqp_session,tests.integration.test_close -*-
"""What every frontend over a byte stream (TCP, TLS, unix sockets) does
with its connection, whatever protocol it speaks: STOMP
(L{qmq.stomp.protocol}) and AMQP (L{qmq.amqp.protocol}) subclass these.

L{StreamConnection} is a connection's life:

    1. L{ListenerFactory.buildProtocol} asks the broker's
       L{qmq.connections.ConnectionRegistry} whether the listener may take
       one more connection from this address; if not, the client gets the
       factory's C{refused} protocol (the protocol's own "too many
       connections" and a close).
    2. C{connectionMade}: the subclass makes its session
       (L{StreamConnection.open_session}); the connection registers as the
       transport's streaming producer and in the registry. Over TLS the
       handshake must finish within C{handshake_timeout} seconds
       (C{handshakeCompleted} stops that clock and reads the client's
       certificate), or the connection is aborted: a client that never
       sends a ClientHello cannot hold a socket.
    3. The session closes the connection with L{StreamConnection.close}.
       Closing unregisters the producer first: Twisted's TLS layer does not
       start its close while a producer is registered. Over plain TCP what
       was written and a FIN go out while the broker keeps reading (and
       discarding), so the kernel does not answer a client still sending
       with a reset that could overtake the last frame; a peer that does
       not let the connection close within C{close_grace} seconds is
       aborted.
    4. C{connectionLost}: every timer of the connection is cancelled, the
       subclass's session lets go of what it held
       (L{StreamConnection.session_lost}), the registry forgets it.

L{BatchedOutput} is the other half every protocol shares, on the session's
side: what a session writes during a reactor turn is buffered and handed to
its transport in one call at the end of the turn (the broker's
L{qmq.core.batch.WriteBatcher}), or early once it holds the session's
threshold. The STOMP session (over TCP, WebSocket and SockJS alike) and the
AMQP session write through it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.connections import ConnectionRegistry
from qmq.logs import transport_peer
from qmq.tls import PeerIdentity, peer_identity
from qmq.transport import IConnection
from qmq.twisted_internals import direct_writer, hold_batches_per_read

__all__ = ["BatchedOutput", "ListenerFactory", "StreamConnection", "abort_transport"]

_loggers: dict[str, Logger] = {}


def _logger(namespace: str) -> Logger:
    """One logger per namespace: a subclass logs under its own module's
    name (what logging settings and readers of the log go by)."""
    logger = _loggers.get(namespace)
    if logger is None:
        logger = _loggers[namespace] = Logger(namespace=namespace)
    return logger


def abort_transport(transport: Any) -> None:
    """Drop C{transport}'s connection now (close it where it cannot abort)."""
    abort = getattr(transport, "abortConnection", None)
    if abort is not None:
        abort()
    else:
        transport.loseConnection()


class BatchedOutput:
    """A session's outgoing frames, written once per reactor turn (see the
    module docstring). A subclass calls L{init_output} in its constructor
    and has C{closed} and C{transport} (anything with C{write_frames}).

    @ivar wrote: set whenever a flush hands frames to the transport; a
        heart-beat timer reads and clears it (nothing written since its
        last tick: time for a heart-beat).
    """

    _out: list[bytes]
    _out_size: int
    _batcher: Any
    _threshold: int
    wrote: bool
    closed: bool
    transport: Any

    def init_output(self, batcher: Any, threshold: int) -> None:
        """
        @param batcher: the broker's L{qmq.core.batch.WriteBatcher}.
        @param threshold: flush early once this many bytes are buffered, so
            one turn never piles up much more than that per connection
            before the transport's back-pressure can act.
        """
        self._out = []
        self._out_size = 0
        self._batcher = batcher
        # On the instance, not the class: an instance attribute is the
        # faster read on the per-frame path (CPython 3.11 specializes it).
        self._threshold = threshold
        self.wrote = True

    def write_frame(self, data: bytes) -> None:
        """Buffer one outgoing frame; it goes out at the end of this reactor turn."""
        out = self._out
        out.append(data)
        self._out_size += len(data)
        if len(out) == 1:
            self._batcher.want_flush(self)
        elif self._out_size > self._threshold:
            self.flush()

    def write_frames(self, frames: list[bytes]) -> None:
        """Buffer several outgoing frames (L{write_frame} for each)."""
        out = self._out
        was_empty = not out
        out.extend(frames)
        self._out_size += sum(map(len, frames))
        if was_empty:
            self._batcher.want_flush(self)
        if self._out_size > self._threshold:
            self.flush()

    def flush(self) -> None:
        """Hand everything buffered to the transport in one call."""
        out = self._out
        if not out:
            return
        self._out = []
        self._out_size = 0
        self.wrote = True
        if not self.closed:
            self.transport.write_frames(out)


@implementer(IPushProducer, IConnection, IHandshakeListener)
class StreamConnection(Protocol):
    """A frontend's connection over a stream transport (see the module
    docstring); a subclass makes the session.

    @ivar peer_host: the client's address, for the registry's caps (C{""}
        for a unix socket).
    @ivar identity: the client's verified TLS identity once the handshake is
        done, else L{None}.
    @cvar protocol_name: the protocol, in log lines.
    @cvar log_namespace: the namespace of its log lines.
    @cvar log_level: the level of the open and close log lines: debug, as
        for every protocol (a line per connection at info would bury the
        rest of the log, L{qmq.logs}).
    """

    session: Any
    protocol_name = "stream"
    log_namespace = __name__
    log_level = LogLevel.debug

    def __init__(self, factory: ListenerFactory, peer_host: str = "") -> None:
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

    # -- what a subclass provides -----------------------------------------------

    def open_session(self) -> Any:
        """Make the session (C{self.session}) and route C{dataReceived} to
        what reads its input; called once the transport is connected."""
        raise NotImplementedError

    def session_lost(self) -> None:
        """The connection is gone: the session lets go of what it held."""
        self.session.connection_lost()

    def discard_input(self) -> None:
        """Closing: whatever the client still sends is not read."""

    # -- the connection's life ----------------------------------------------------

    def connectionMade(self) -> None:
        factory = self.factory
        transport = self.transport
        self.peer = transport_peer(transport)
        self._write = direct_writer(transport)
        self.open_session()
        if ISSLTransport.providedBy(transport):
            hold_batches_per_read(transport, factory.broker.batcher)
            self._handshake = factory.clock.callLater(
                factory.registry.settings.handshake_timeout, self._handshake_timeout
            )
        transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._producing = True
        factory.registry.add(self, factory.listener)
        _logger(self.log_namespace).emit(
            self.log_level,
            # One format for every protocol (a JSON log's reader matches the
            # line by it), the protocol a field of its own.
            "connection open protocol={protocol} peer={peer} session={session}",
            protocol=self.protocol_name,
            peer=self.peer,
            session=self.session.id,
        )

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done: stop its clock, read who the client is."""
        timer, self._handshake = self._handshake, None
        if timer is not None and timer.active():
            timer.cancel()
        self.identity = peer_identity(self.transport)

    def _handshake_timeout(self) -> None:
        self._handshake = None
        _logger(self.log_namespace).info(
            "tls handshake timeout protocol={protocol} peer={peer} session={session}",
            protocol=self.protocol_name,
            peer=self.peer,
            session=self.session.id,
        )
        # Nothing can have been sent over TLS yet: there is nothing to flush.
        self.abort()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        self._producing = False
        for timer in (self._grace, self._handshake):
            if timer is not None and timer.active():
                timer.cancel()
        self._grace = self._handshake = None
        self.session_lost()
        factory = self.factory
        factory.registry.remove(self)
        _logger(self.log_namespace).emit(
            self.log_level,
            "connection closed protocol={protocol} peer={peer} session={session} reason={reason}",
            protocol=self.protocol_name,
            peer=self.peer,
            session=self.session.id,
            reason=reason.getErrorMessage() if reason is not None else "",
        )
        factory.connection_lost(self)

    # -- what the session calls ---------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        self._write(frames[0] if len(frames) == 1 else b"".join(frames))

    def close(self, reason: str) -> None:
        """Flush what was written, close, and abort after C{close_grace} seconds.

        @param reason: why (for the log; the session told the client).
        """
        if self._closing or self._lost:
            return
        self._closing = True
        self.discard_input()
        transport = self.transport
        if self._producing:
            # Twisted's TLS layer starts its close only once no producer is
            # registered: unregister first, or the socket stays open.
            self._producing = False
            transport.unregisterProducer()  # type: ignore[union-attr]
        if ISSLTransport.providedBy(transport) or not hasattr(transport, "loseWriteConnection"):
            transport.loseConnection()  # type: ignore[union-attr]
        else:
            # Plain TCP: send what was written (the protocol's last word)
            # and a FIN, and keep reading (and discarding) until the client
            # closes or the grace ends. Closing a socket whose client is
            # still sending makes the kernel answer with a reset, and the
            # client may lose the frame that explains why it was cut off.
            transport.loseWriteConnection()  # type: ignore[union-attr]
            transport.resumeProducing()  # type: ignore[union-attr]
        if not self._lost:  # some transports lose the connection at once
            self._grace = self.factory.clock.callLater(
                self.factory.registry.settings.close_grace, self._grace_over
            )

    def _grace_over(self) -> None:
        self._grace = None
        _logger(self.log_namespace).info(
            "connection aborted after the close grace protocol={protocol} peer={peer} "
            "session={session}",
            protocol=self.protocol_name,
            peer=self.peer,
            session=self.session.id,
        )
        self.abort()

    def pause_reading(self) -> None:
        # Closing reads on (and discards) until the client closes.
        if not self._closing:
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        if not self._closing:
            self.transport.resumeProducing()  # type: ignore[union-attr]

    # -- IConnection: what the registry calls ---------------------------------------

    def shutdown(self, reason: str) -> None:
        """Tell the client C{reason} the protocol's way; the session closes."""
        self.session.shutdown(reason)

    def abort(self) -> None:
        """Drop the connection now."""
        if not self._lost:
            abort_transport(self.transport)

    # -- IPushProducer: the transport's write buffer is full or drained ---------------

    def pauseProducing(self) -> None:
        self.session.pause()

    def resumeProducing(self) -> None:
        self.session.resume()

    def stopProducing(self) -> None:
        pass


class ListenerFactory(Factory):
    """Builds a listener's connections, sharing one broker and one set of
    settings (see the module docstring).

    @ivar registry: the connection registry (the broker's, shared with
        every listener; a registry of its own if none is given).
    @ivar listener: this listener's name in the registry.
    @cvar refused: the protocol a connection over the caps gets, made with
        C{(factory, detail)}.
    @cvar settings_class: the settings made when none are given.
    """

    refused: Any = None
    settings_class: Any = None
    default_listener = "stream"

    def __init__(
        self,
        broker: Any,
        settings: Any = None,
        clock: Any = None,
        registry: ConnectionRegistry | None = None,
        listener: str | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings if settings is not None else self.settings_class()
        self.clock = clock if clock is not None else broker.clock
        self.registry = registry if registry is not None else ConnectionRegistry(clock=self.clock)
        self.listener = listener if listener is not None else self.default_listener

    @property
    def connections(self) -> Any:
        """This listener's open connections (a live view)."""
        return self.registry.connections(self.listener)

    def buildProtocol(self, addr: Any) -> Protocol:
        host = getattr(addr, "host", None) or ""
        refusal = self.registry.admit(self.listener, host)
        if refusal is not None:
            return self.refused(self, refusal)
        return self.protocol(self, host)  # type: ignore[misc]

    def connection_lost(self, proto: Any) -> None:
        """A connection is gone (a hook for tests that count them)."""

    def shutdown(self, reason: str = "broker shutting down", timeout: float = 5.0) -> defer.Deferred:
        """Tell this listener's clients C{reason} and close them (the
        broker's service shuts every listener down at once through the
        registry, L{ConnectionRegistry.shutdown}; this is the same for one
        listener).

        @return: a Deferred that fires once every connection is gone, or
            after C{timeout} seconds, when the rest are aborted.
        """
        return self.registry.shutdown(reason, timeout, listener=self.listener)
