# -*- test-case-name: tests.test_web_websocket,tests.integration.test_websocket -*-
"""STOMP over WebSocket: autobahn carries the very session STOMP over TCP uses.

The site mounts one L{WebSocketResource} (autobahn's Twisted integration)
at C{/stomp} and at C{/ws}. A client's upgrade request reaches
L{StompWebSocketProtocol.onConnect}, which checks its C{Origin} against the
C{[web] allowed_origins} list (the broker's own origin is always allowed;
a request without an C{Origin} is not from a browser and is not checked)
and picks the subprotocol: the first of C{v12.stomp}, C{v11.stomp},
C{v10.stomp} the client offers, or none if it offers none. A client that
offers only other subprotocols is refused (400).

Once open, the connection is an L{qmq.transport.ITransport} for a
L{qmq.stomp.session.StompSession}, exactly as a TCP connection is:

  - B{In.} WebSocket message boundaries mean nothing to STOMP here: the
    payload of every data frame, text or binary, is fed as it arrives to the
    session's L{qmq.stomp.reader.StompReader}, so one message may carry
    several STOMP frames, a frame may span messages, and a heart-beat is a
    message holding an end-of-line. Nothing is buffered per message (the
    reader's limits, deadlines and share of the broker's budget for
    unfinished frames apply as over TCP). The whole socket read is one
    batch: the broker's write batcher is held around it, so a read of many
    SENDs becomes one write per receiving connection. Whole, unfragmented
    messages at the start of a read (what browsers send) skip autobahn's
    per-frame machinery (L{StompWebSocketProtocol._whole_messages}); the
    rest of the read (control frames, fragments, a cut frame, anything
    malformed) is autobahn's.
  - B{Out.} Each STOMP frame is one WebSocket message (what every STOMP
    client expects), written unmasked by L{encode_messages}, a batch in one
    socket write; a text message when the frame is valid UTF-8 and
    C{[web] frame_type} is C{auto}, binary otherwise.
  - B{Flow.} The protocol is the socket's streaming producer: a full write
    buffer pauses the session's deliveries; the session's
    C{pause_reading} (the memory alarm, the reader's turn budget) pauses the
    socket.
  - B{Liveness.} STOMP heart-beats work as over TCP; autobahn sends
    WebSocket pings every C{[web] ping_interval} seconds and drops a client
    that does not answer within C{ping_timeout}.
  - B{Close.} C{close(reason)} unregisters the producer (Twisted's TLS
    layer does not close while one is registered), sends a WebSocket close
    (1000, the reason) after the session's last frame, and aborts the
    connection if the client has not let it go C{close_grace} seconds later.
"""

from __future__ import annotations

import struct
from typing import Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet.interfaces import IPushProducer, ISSLTransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from qmq.logs import transport_peer
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.tls import PeerIdentity, peer_identity
from qmq.transport import IConnection, ITransport
from qmq.twisted_internals import (
    WebSocketState,
    cancel_close_timer,
    direct_writer,
    hold_batches_per_read,
    websocket_clock,
    websocket_feed,
    websocket_state,
)
from qmq.web.guard import origin_allowed
from qmq.web.site import HttpConnection, WebContext

__all__ = [
    "SUBPROTOCOLS",
    "StompWebSocketFactory",
    "StompWebSocketProtocol",
    "encode_messages",
    "origin_allowed",
    "stomp_resource",
    "unmask",
]

log = Logger()

#: The subprotocols QMQ speaks, in order of preference.
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")

#: The largest message the fast path takes (and the most it keeps of one
#: cut by the end of a read); larger ones are autobahn's, streamed.
FAST_MAX = 65535
_TEXT = 0x81  # FIN + opcode 1
_BINARY = 0x82  # FIN + opcode 2
_HEADERS = {
    opcode: [bytes((opcode, n)) for n in range(126)] for opcode in (_TEXT, _BINARY)
}
_MEDIUM = struct.Struct("!BBH").pack
_LARGE = struct.Struct("!BBQ").pack


def unmask(payload: bytes, key: bytes) -> bytes:
    """A client frame's payload, unmasked (XOR with the 4-byte C{key}).

    One big-integer XOR: C speed without a masker object per frame.
    """
    n = len(payload)
    if not n:
        return b""
    keys = (key * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")


def _is_text(frame: bytes) -> bool:
    if frame.isascii():
        return True
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def encode_messages(frames: list[bytes], frame_type: str = "auto") -> bytes:
    """Unmasked WebSocket messages (server to client), one per STOMP frame.

    @param frames: encoded STOMP frames (or heart-beat end-of-lines).
    @param frame_type: C{"auto"} (text if the frame is valid UTF-8, else
        binary), C{"text"} or C{"binary"}.
    @return: the bytes to write.
    """
    out = []
    append = out.append
    for frame in frames:
        if frame_type == "auto":
            opcode = _TEXT if _is_text(frame) else _BINARY
        else:
            opcode = _TEXT if frame_type == "text" else _BINARY
        n = len(frame)
        if n < 126:
            append(_HEADERS[opcode][n])
        elif n < 65536:
            append(_MEDIUM(opcode, 126, n))
        else:
            append(_LARGE(opcode, 127, n))
        append(frame)
    return b"".join(out)


@implementer(ITransport, IConnection, IPushProducer)
class StompWebSocketProtocol(WebSocketServerProtocol):
    """One STOMP-over-WebSocket connection: the session's L{ITransport}."""

    factory: StompWebSocketFactory
    heartbeats = True
    #: The protocol its messages are counted under (L{qmq.core.traffic}).
    traffic_name = "websocket"
    session: StompSession | None = None
    reader: StompReader | None = None

    peer_host = ""
    identity: PeerIdentity | None = None
    #: The start of a message cut by the end of a read (fast path only),
    #: and how many bytes of it the next step needs.
    _cut = b""
    _need = 0
    _write: Any = None
    _producing = False
    _closing = False
    _lost = False
    _grace: Any = None
    _frame_type = "auto"
    #: autobahn's state, read through the internals module (set on open).
    _ws: WebSocketState | None = None

    #: The listener's connection (L{qmq.web.site.HttpConnection}) that
    #: carried the upgrade, or None (a test's bare transport).
    connection: Any = None

    # -- the upgrade ----------------------------------------------------------

    def makeConnection(self, transport: Any) -> None:
        """Take the socket's own transport (TCP or TLS) from under the
        listener's L{HttpConnection}.

        autobahn's resource hands the upgraded protocol the connection the
        HTTP channel wrote to, our wrapper; it stays the connection the
        registry counts and keeps feeding us what it reads, but writing
        through it would cost a call per write, and autobahn reads TLS
        details (the channel binding) only from Twisted's own TLS transport.
        """
        # autobahn's parser entry, for what the fast path leaves to it.
        self._feed = websocket_feed(self)
        if isinstance(transport, HttpConnection):
            self.connection = transport
            transport = transport.transport
        super().makeConnection(transport)

    def onConnect(self, request: ConnectionRequest) -> str | None:
        ctx = self.factory.ctx
        web = ctx.web
        secure = ISSLTransport.providedBy(self.transport)
        host = request.headers.get("host")
        origins = ctx.guard.origins if ctx.guard is not None else web.origins
        if not origin_allowed(request.origin, host, secure, origins):
            log.info("websocket refused protocol=stomp peer={peer} origin={origin!r}",
                     peer=self._peer_address(), origin=request.origin)
            raise ConnectionDeny(
                403,
                f"Origin {request.origin[:200]} may not open a WebSocket here "
                "(add it to [web] allowed_origins).",
            )
        offered = request.protocols
        if not offered:
            return None
        for name in SUBPROTOCOLS:
            if name in offered:
                return name
        raise ConnectionDeny(
            400,
            "None of the offered subprotocols is spoken here; offer "
            + ", ".join(SUBPROTOCOLS) + " or none.",
        )

    def _peer_address(self) -> str:
        connection = self.connection
        if connection is not None:
            return connection.peer
        return transport_peer(self.transport)

    def onOpen(self) -> None:
        ctx = self.factory.ctx
        transport = self.transport
        self._frame_type = ctx.web.frame_type
        connection = self.connection
        if connection is not None:
            self.peer_host = connection.peer_host
            self.identity = connection.identity
        else:
            self.peer_host = _host(transport)
            self.identity = peer_identity(transport)
        # One format for peers in logs and listings (qmq.logs), not
        # autobahn's "tcp:HOST:PORT"; the session reads it from here.
        self.peer = self._peer_address()
        self._write = direct_writer(transport)
        self._ws = websocket_state(self)
        if ISSLTransport.providedBy(transport):
            hold_batches_per_read(transport, ctx.broker.batcher)
        self._batcher = ctx.broker.batcher
        # The HTTP channel that answered the upgrade is still the socket's
        # producer; the socket is ours now.
        transport.unregisterProducer()
        transport.registerProducer(self, True)
        self._producing = True
        self.session = session = StompSession(ctx.broker, ctx.settings.stomp, self, clock=ctx.clock)
        self.reader = StompReader(session)
        self.onMessageFrameData = self.reader.data_received  # type: ignore[method-assign]
        log.debug("connection open protocol=stomp+websocket peer={peer} session={session}",
                 peer=self.peer, session=session.id)

    # -- in ---------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        # One socket read is one batch, however many messages it carries.
        if self.reader is None:
            self._feed(data)
            return
        batcher = self._batcher
        batcher.hold()
        try:
            cut = self._cut
            if cut:
                # The rest of a cut message: gather (amortised O(1) per
                # read, so a client trickling bytes costs no quadratic
                # copying) until it is whole, then go on as usual.
                cut += data
                if len(cut) < self._need:
                    return
                data = bytes(cut)
                self._cut = bytearray()
            if self._ws.between_messages():  # type: ignore[union-attr]
                done = self._whole_messages(data)
                if done < len(data) and not self._cut:
                    self._feed(data[done:] if done else data)
            else:
                self._feed(data)
        finally:
            batcher.release()

    def _whole_messages(self, data: bytes) -> int:
        """The fast path: feed the reader every whole, unfragmented, masked
        text or binary message at the start of C{data}, without autobahn.

        autobahn spends tens of microseconds on each frame (a masker object
        per frame, its callbacks, its bookkeeping), more than the broker
        spends on the STOMP frame inside. A message a browser sends (one
        STOMP frame, one WebSocket frame) is handled here instead, and the
        payloads of a read reach the reader as one piece. A read that ends
        inside such a message (of at most L{FAST_MAX} bytes) keeps its start
        in C{_cut} for the next read. The first frame that is anything else
        (a control frame, a fragment, a larger frame, a reserved bit, an
        unmasked frame, a text frame that is not UTF-8) and everything after
        it go to autobahn, which meets them at a frame boundary with nothing
        buffered, as if it had read them alone; once autobahn is done with
        them (nothing buffered, no message open), reads come here again.

        @return: how many bytes of C{data} were consumed (or kept in C{_cut}).
        """
        payloads = []
        n = len(data)
        i = 0
        while i < n:
            b0 = data[i]
            if b0 != 0x81 and b0 != 0x82:
                break
            if n - i < 2:
                self._keep(data, i, 2)
                break
            b1 = data[i + 1]
            if b1 < 0x80:
                break
            length = b1 & 0x7F
            j = i + 2
            if length == 126:
                if n - j < 2:
                    self._keep(data, i, 4)
                    break
                length = (data[j] << 8) | data[j + 1]
                j += 2
            elif length == 127:
                break  # 64 KiB or more: autobahn streams it
            if length > FAST_MAX:
                break
            if n - j - 4 < length:
                self._keep(data, i, j + 4 + length - i)
                break
            payload = unmask(data[j + 4 : j + 4 + length], data[j : j + 4])
            if b0 == 0x81 and not payload.isascii():
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    break  # autobahn fails the connection
            i = j + 4 + length
            payloads.append(payload)
        if payloads:
            # One stream of STOMP bytes, as over TCP: the reader's work per
            # call is paid once per read, not once per message.
            self.reader.data_received(  # type: ignore[union-attr]
                payloads[0] if len(payloads) == 1 else b"".join(payloads)
            )
        return n if self._cut else i

    def _keep(self, data: bytes, start: int, need: int) -> None:
        """Keep C{data[start:]}, the start of a message, until C{need} bytes
        of it are there (at most L{FAST_MAX} and its header)."""
        self._cut = bytearray(data[start:])
        self._need = need

    def onMessageBegin(self, isBinary: bool) -> None:
        pass  # text or binary: both carry STOMP bytes

    def onMessageFrameBegin(self, length: int) -> None:
        pass  # the reader bounds frames; a message is not buffered

    def onMessageFrameData(self, payload: bytes) -> None:  # replaced in onOpen
        if self.reader is not None:
            self.reader.data_received(payload)

    def onMessageFrameEnd(self) -> None:
        pass

    def onMessageEnd(self) -> None:
        pass

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self._release()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        self._cut = bytearray()
        self._producing = False
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        self._grace = None
        # autobahn leaves its close-handshake timer running when the
        # connection goes first.
        cancel_close_timer(self)
        super().connectionLost(reason)
        self._release()
        session = self.session
        if session is not None:
            log.debug("connection closed protocol=stomp+websocket peer={peer} session={session}",
                     peer=self.peer, session=session.id)

    def _release(self) -> None:
        if self.reader is not None:
            self.reader.connection_lost()
        if self.session is not None:
            self.session.connection_lost()

    # -- ITransport ----------------------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        ws = self._ws
        if ws is None or not ws.is_open():
            return  # closing: nothing may follow the close frame
        self._write(encode_messages(frames, self._frame_type))

    def close(self, reason: str) -> None:
        """Close the WebSocket after what was written; abort after the grace."""
        if self._closing or self._lost:
            return
        self._closing = True
        self._cut = bytearray()
        if self.reader is not None:
            self.reader.discard()
        transport = self.transport
        self.unregisterProducer()
        ws = self._ws
        if ws is not None and ws.is_open():
            ws.closing = True
            self.sendClose(1000, reason[:100])
        else:
            transport.loseConnection()  # type: ignore[union-attr]
        if not self._lost:
            ctx = self.factory.ctx
            self._grace = ctx.clock.callLater(ctx.connections.settings.close_grace, self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        log.info("connection aborted after the close grace protocol=stomp+websocket peer={peer}",
                 peer=self.peer)
        self.abort()

    def pause_reading(self) -> None:
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        self.transport.resumeProducing()  # type: ignore[union-attr]

    # -- IConnection ------------------------------------------------------------------

    def shutdown(self, reason: str) -> None:
        """Send the client an C{ERROR} saying C{reason}, then close."""
        if self.session is not None:
            self.session.shutdown(reason)
        self.close(reason)

    def abort(self) -> None:
        if not self._lost:
            abort = getattr(self.transport, "abortConnection", None)
            if abort is not None:
                abort()
            else:
                self.transport.loseConnection()  # type: ignore[union-attr]

    def unregisterProducer(self) -> None:
        """Stop being the socket's producer (autobahn calls it on every drop)."""
        if self._producing:
            self._producing = False
            self.transport.unregisterProducer()  # type: ignore[union-attr]

    # -- IPushProducer: the socket's write buffer --------------------------------------

    def pauseProducing(self) -> None:
        if self.session is not None:
            self.session.pause()

    def resumeProducing(self) -> None:
        if self.session is not None:
            self.session.resume()

    def stopProducing(self) -> None:
        pass


def _host(transport: Any) -> str:
    try:
        return getattr(transport.getPeer(), "host", "") or ""
    except Exception:
        return ""


class StompWebSocketFactory(WebSocketServerFactory):
    """Builds L{StompWebSocketProtocol}s for one listener's site.

    @ivar ctx: the listener's context.
    """

    protocol = StompWebSocketProtocol

    def __init__(self, ctx: WebContext) -> None:
        super().__init__(server="QMQ", reactor=ctx.clock)
        self.ctx = ctx
        # autobahn's timers (handshake, ping, close) on the broker's clock.
        websocket_clock(self, ctx.clock)
        web = ctx.web
        grace = ctx.connections.settings.close_grace
        self.setProtocolOptions(
            # A message is streamed into the STOMP reader, never held whole:
            # the reader's limits bound it.
            maxFramePayloadSize=0,
            maxMessagePayloadSize=0,
            autoPingInterval=web.ping_interval,
            autoPingTimeout=web.ping_timeout,
            openHandshakeTimeout=ctx.connections.settings.handshake_timeout,
            closeHandshakeTimeout=grace,
            tcpNoDelay=True,
            webStatus=False,  # a GET without an upgrade is told to upgrade, no HTML page
        )


def stomp_resource(ctx: WebContext) -> WebSocketResource:
    """The resource mounted at C{/stomp} and C{/ws}."""
    return WebSocketResource(StompWebSocketFactory(ctx))
