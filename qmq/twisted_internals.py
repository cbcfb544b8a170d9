# -*- test-case-name: tests.integration.test_tcp_writes -*-
"""The one place where QMQ relies on Twisted's internals.

Twisted's public API is enough for everything QMQ does, except two hot
paths where going around it was measured to matter. Both live here, each
behind a check that falls back to the public API (and logs once) if the
internals they rely on are gone, and each is pinned by tests
(C{tests/integration/test_tcp_writes.py}) that fail loudly when a Twisted
upgrade changes them:

  - L{direct_writer}: send a batch straight to a TCP socket when Twisted's
    transport has nothing pending. It reads three private fields of
    C{twisted.internet.tcp.Server} (L{TCP_BUFFER_FIELDS}): the data waiting
    to be written is C{dataBuffer[offset:]} plus C{_tempDataLen} bytes not
    yet joined into it.
  - L{hold_batches_per_read}: make a TLS connection flush the broker's
    write batch once per TCP read rather than once per TLS record, by
    wrapping the C{dataReceived} of the connection's
    L{TLSMemoryBIOProtocol} instance (the TCP transport looks that method
    up on every read).

Two private names of other libraries, each read through one function here:

  - L{websocket_feed}: autobahn's C{WebSocketProtocol._dataReceived}, the
    entry of its frame parser, which QMQ's WebSocket transport feeds the
    bytes its own fast path did not take (L{AUTOBAHN_FEED}). Without it,
    autobahn's public Twisted C{dataReceived} of the base class does the
    same (with a debug log call more per read).
  - L{websocket_state}: autobahn's parser and connection state of a
    WebSocket protocol (L{AUTOBAHN_PARSER_FIELDS}: C{state}, C{data},
    C{current_frame}, C{inside_message}; public names, but no documented
    API), which QMQ's WebSocket transport reads to know when its own fast
    path may take a read (autobahn is between messages, nothing buffered)
    and whether a frame may still be written (the close frame not sent).
    Without them, every read goes through autobahn (slower, correct), and
    the transport's own closing flag stands for the connection's state.
  - L{websocket_clock}: autobahn's C{WebSocketServerFactory._batched_timer}
    (L{AUTOBAHN_TIMER}), the timer every protocol of a factory schedules its
    handshake, ping and close timeouts with, replaced by one on the clock
    QMQ was given (L{ClockTimer}), so tests drive them with a C{Clock} and
    the service with its reactor. Without it, autobahn's own timer (txaio's
    global reactor) stays.
  - L{cancel_close_timer}: autobahn's close-handshake timer of a protocol
    (L{AUTOBAHN_CLOSE_TIMER}), which autobahn leaves running when the
    connection goes first; cancelled when it does. Without the field,
    nothing is cancelled (the timer then finds the connection gone).
  - L{request_disconnected}: C{twisted.web} C{Request._disconnected},
    whether the client went before the answer finished. Without it, the
    request's C{channel} (set to None by the same C{connectionLost}) tells.

  - L{header_table}: the dictionary a C{twisted.web} C{Headers} keeps its
    values in (C{_rawHeaders}: canonical name, such as C{b"Content-Type"},
    to the list of raw values), read by the site's guard
    (L{qmq.web.guard.Guard.check}) and the API's content type: a lookup
    there is a tenth of what C{getRawHeaders} costs (a name encoding and
    two calls), on every HTTP request. Without it (L{None}), they call
    C{getRawHeaders}.

And one check at start-up, not a hot path:

  - L{endpoint_interface}: the address a server endpoint will bind, read
    from the C{_interface} field that Twisted's TCP and SSL server
    endpoints keep (there is no public accessor), so that a listener on a
    non-loopback interface without authentication refuses to start.  An
    endpoint without the field counts as listening everywhere (the safe
    answer).

And one read of a request's head, not a hot path:

  - L{request_line}: the method and path of an HTTP request whose head is
    in but whose body is not. C{twisted.web} sets C{Request.method} and
    C{Request.path} only once the body is complete; until then the channel
    keeps them as C{_command} and C{_path} (L{REQUEST_LINE_FIELDS}). The
    site reads them to refuse a publish before its body while every
    publisher is held back (the memory alarm); without them it reads the
    body and the API refuses the publish then (the same answer, later).
    Pinned by C{tests/test_web_admission.py}.

And one on the mesh's hot path:

  - L{deferred_unobserved}: whether a Deferred has no callbacks (its
    private C{_callbacks} list, L{DEFERRED_CALLBACKS}: the public
    C{callbacks} is deprecated since Twisted 25.5 and warns on each read)
    and nothing but its caller holds it. A forwarded publish's confirm
    (L{qmq.cluster.queues}) is such a Deferred when the frontend did not
    wait on it (a STOMP SEND without a receipt): it is dropped rather than
    fired (firing it costs more than the rest of a confirm). Without the
    field it answers False: every confirm fires.

Nothing else in QMQ may touch a private attribute of Twisted or autobahn
(tests/test_twisted_internals.py greps the frontends for it); a new trick
of this kind goes here, with its check, its fallback and its test.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from twisted.internet import endpoints, tcp
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol

__all__ = [
    "AUTOBAHN_FEED",
    "AUTOBAHN_CLOSE_TIMER",
    "AUTOBAHN_PARSER_FIELDS",
    "AUTOBAHN_TIMER",
    "ClockTimer",
    "DEFERRED_CALLBACKS",
    "WebSocketState",
    "cancel_close_timer",
    "REQUEST_LINE_FIELDS",
    "TCP_BUFFER_FIELDS",
    "deferred_unobserved",
    "direct_writer",
    "endpoint_interface",
    "header_table",
    "hold_batches_per_read",
    "no_delay_once",
    "request_disconnected",
    "request_line",
    "websocket_clock",
    "websocket_feed",
    "websocket_state",
]

log = Logger()

#: The private fields of C{tcp.Server} that L{direct_writer} reads.
TCP_BUFFER_FIELDS = ("_tempDataLen", "dataBuffer", "offset")

#: The private fields of C{twisted.web.http.HTTPChannel} that L{request_line} reads.
REQUEST_LINE_FIELDS = ("_command", "_path")

#: The private field of C{Deferred} that L{deferred_unobserved} reads.
DEFERRED_CALLBACKS = "_callbacks"

_warned: set[str] = set()
_MISSING = object()


def _warn_once(what: str, problem: str) -> None:
    if what in _warned:
        return
    _warned.add(what)
    log.warn(
        "Twisted internals changed: {what} falls back to the public API "
        "(slower, still correct): {problem}",
        what=what,
        problem=problem,
    )


def direct_writer(transport: Any) -> Callable[[bytes], None]:
    """A write function for C{transport} that skips a reactor turn when it can.

    Twisted's TCP transport buffers every write and sends it on the next
    reactor iteration, after registering the socket for writability and
    before unregistering it: two C{epoll_ctl} calls and a loop turn for every
    batch. The broker already writes one batch per turn, so when nothing is
    pending in the transport this sends the batch at once and leaves only
    what the kernel did not take to Twisted's buffering (and to its
    producer/consumer back-pressure).

    @param transport: a connection's transport.
    @return: the direct writer for Twisted's own TCP server transport;
        C{transport.write} for any other (TLS, unix sockets, test
        transports), and for a TCP transport whose private fields are
        missing (a Twisted that changed them).
    """
    write: Callable[[bytes], None] = transport.write
    if type(transport) is not tcp.Server:
        return write
    missing = [name for name in TCP_BUFFER_FIELDS if not hasattr(transport, name)]
    if missing:
        _warn_once("direct_writer", f"tcp.Server has no {', '.join(missing)}")
        return write
    sock = transport.getHandle()

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


def hold_batches_per_read(tls: Any, batcher: Any) -> bool:
    """Batch writes over a whole TCP read of a TLS connection.

    Twisted's TLS layer hands the decrypted bytes of one TCP read to the
    protocol one TLS record (at most 16 KiB) at a time, so the broker would
    flush its deliveries, and encrypt them, once per record. Holding the
    write batcher around the TLS layer's own C{dataReceived} makes that one
    flush (and one TLS write) per TCP read, as over plain TCP.

    @param tls: a connection's transport.
    @param batcher: the broker's L{qmq.core.batch.WriteBatcher}.
    @return: whether the hold is in place (C{False} for a transport that is
        not Twisted's memory-BIO TLS, or one whose C{dataReceived} is gone).
    """
    if not isinstance(tls, TLSMemoryBIOProtocol):
        return False
    inner = getattr(tls, "dataReceived", None)
    if not callable(inner):
        _warn_once("hold_batches_per_read", "TLSMemoryBIOProtocol has no dataReceived")
        return False
    hold = batcher.hold
    release = batcher.release

    def dataReceived(data: bytes) -> None:
        hold()
        try:
            inner(data)
        finally:
            release()

    tls.dataReceived = dataReceived
    return True


def endpoint_interface(endpoint: Any) -> str | None:
    """The interface a server endpoint binds.

    @return: the address (C{""}: every interface), or None for a unix
        socket (local by nature).  An endpoint of another kind, or a TCP or
        SSL endpoint whose C{_interface} field is gone, gives C{""}.
    """
    if isinstance(endpoint, endpoints.UNIXServerEndpoint):
        return None
    interface = getattr(endpoint, "_interface", None)
    if isinstance(interface, str):
        return interface
    if isinstance(endpoint, endpoints.TCP4ServerEndpoint | endpoints.SSL4ServerEndpoint):
        _warn_once("endpoint_interface", "the server endpoint has no _interface")
    return ""


#: The private method of autobahn's C{WebSocketProtocol} that
#: L{websocket_feed} hands bytes to.
AUTOBAHN_FEED = "_dataReceived"


def websocket_feed(protocol: Any) -> Callable[[bytes], None]:
    """What feeds bytes to autobahn's WebSocket parser for C{protocol} (a
    subclass of autobahn's Twisted C{WebSocketServerProtocol} that
    overrides C{dataReceived} with a fast path of its own).

    @return: autobahn's C{_dataReceived} of C{protocol}; if autobahn lost
        it, the base class's public C{dataReceived} (which calls it),
        bound to C{protocol}.
    """
    feed = getattr(protocol, AUTOBAHN_FEED, None)
    if callable(feed):
        return feed
    _warn_once("websocket_feed", f"autobahn's WebSocketProtocol has no {AUTOBAHN_FEED}")
    from autobahn.twisted.websocket import WebSocketServerProtocol  # noqa: PLC0415

    def fallback(data: bytes) -> None:
        WebSocketServerProtocol.dataReceived(protocol, data)

    return fallback


#: The attributes of autobahn's C{WebSocketProtocol} that L{websocket_state}
#: reads: the connection's state, the bytes its parser holds, the frame and
#: the message it is inside of.
AUTOBAHN_PARSER_FIELDS = ("state", "data", "current_frame", "inside_message")


class WebSocketState:
    """What QMQ reads of autobahn's state for one open WebSocket (see the
    module docstring); made by L{websocket_state}.

    @ivar complete: whether autobahn has every field read here (else the
        fallbacks answer).
    """

    __slots__ = ("protocol", "open_state", "complete", "closing")

    def __init__(self, protocol: Any, complete: bool) -> None:
        from autobahn.websocket.protocol import WebSocketProtocol  # noqa: PLC0415

        self.protocol = protocol
        self.open_state = WebSocketProtocol.STATE_OPEN
        self.complete = complete
        #: The fallback's state: set by L{closing} (the transport sent, or
        #: is about to send, its close frame).
        self.closing = False

    def is_open(self) -> bool:
        """Whether frames may still be written: the connection is open
        (no close frame sent either way)."""
        if self.complete:
            return self.protocol.state == self.open_state
        return not self.closing

    def between_messages(self) -> bool:
        """Whether autobahn's parser is open, holds no bytes and is inside
        no frame or message: a read may then be parsed without it. Always
        False without the fields (autobahn parses every read)."""
        p = self.protocol
        return (
            self.complete
            and p.state == self.open_state
            and not p.data
            and p.current_frame is None
            and not p.inside_message
        )


def websocket_state(protocol: Any) -> WebSocketState:
    """The reads of autobahn's state of C{protocol}, an open (handshake
    done) autobahn WebSocket protocol.

    @return: a L{WebSocketState}; if autobahn lost a field of
        L{AUTOBAHN_PARSER_FIELDS}, one whose fallbacks answer (logged once).
    """
    missing = [name for name in AUTOBAHN_PARSER_FIELDS if not hasattr(protocol, name)]
    if missing:
        _warn_once("websocket_state", f"autobahn's WebSocketProtocol has no {', '.join(missing)}")
    return WebSocketState(protocol, not missing)


#: The private field of autobahn's C{WebSocketServerFactory} that
#: L{websocket_clock} sets.
AUTOBAHN_TIMER = "_batched_timer"

#: The field of autobahn's C{WebSocketProtocol} that L{cancel_close_timer}
#: reads and clears.
AUTOBAHN_CLOSE_TIMER = "closeHandshakeTimeoutCall"


class ClockTimer:
    """autobahn's timer interface (txaio's C{IBatchedTimer}: C{call_later})
    on a clock QMQ was given."""

    __slots__ = ("clock",)

    def __init__(self, clock: Any) -> None:
        self.clock = clock

    def call_later(self, delay: float, fun: Any, *args: Any, **kwargs: Any) -> Any:
        return self.clock.callLater(delay, fun, *args, **kwargs)


def websocket_clock(factory: Any, clock: Any) -> bool:
    """Have the timers of autobahn's protocols of C{factory} (an autobahn
    C{WebSocketServerFactory}) run on C{clock}.

    @return: whether they do (False: autobahn lost the field; its own
        timer stays, logged once).
    """
    if not hasattr(factory, AUTOBAHN_TIMER):
        _warn_once("websocket_clock", f"autobahn's WebSocketServerFactory has no {AUTOBAHN_TIMER}")
        return False
    setattr(factory, AUTOBAHN_TIMER, ClockTimer(clock))
    return True


def cancel_close_timer(protocol: Any) -> None:
    """Cancel the close-handshake timer autobahn may have left running on
    C{protocol} (an autobahn WebSocket protocol whose connection is gone)."""
    timer = getattr(protocol, AUTOBAHN_CLOSE_TIMER, _MISSING)
    if timer is _MISSING:
        _warn_once("cancel_close_timer", f"autobahn's WebSocketProtocol has no {AUTOBAHN_CLOSE_TIMER}")
        return
    setattr(protocol, AUTOBAHN_CLOSE_TIMER, None)
    if timer is not None:
        timer.cancel()


def request_disconnected(request: Any) -> bool:
    """Whether the client of C{request} (a C{twisted.web} request) went away
    before the answer finished.

    @return: Twisted's private C{_disconnected} flag; without it, whether
        the request lost its channel (set to None on the same event).
    """
    flag = getattr(request, "_disconnected", None)
    if isinstance(flag, bool):
        return flag
    _warn_once("request_disconnected", "twisted.web's Request has no _disconnected")
    return request.channel is None


def header_table(headers: Any) -> dict[bytes, list[bytes]] | None:
    """The values of C{headers} (C{twisted.web.http_headers.Headers}) by
    canonical name (C{b"Host"}, C{b"Content-Type"}): read only, never
    changed. L{None} where Twisted keeps them otherwise (logged once):
    ask C{getRawHeaders}."""
    table = getattr(headers, "_rawHeaders", None)
    if table.__class__ is dict:
        return table  # type: ignore[return-value]
    _warn_once("header_table", "twisted.web's Headers keeps no _rawHeaders dict")
    return None


# HTTP channels already set to TCP_NODELAY (weakly: they come and go).
_no_delay: weakref.WeakSet[Any] = weakref.WeakSet()


def no_delay_once(channel: Any) -> None:
    """Turn Nagle's algorithm off on the connection of C{channel} (an HTTP
    channel), once per channel; a transport that is not TCP is left as it
    is. Kept here, not as an attribute of Twisted's object: nothing of QMQ's
    is written onto another library's instances."""
    if channel is None or channel in _no_delay:
        return
    _no_delay.add(channel)
    try:
        channel.transport.setTcpNoDelay(True)
    except Exception:  # noqa: S110 - not TCP (unix socket, a test transport)
        pass


def request_line(request: Any) -> tuple[bytes, bytes] | None:
    """The method and path of C{request} once its head is in, before its
    body is (see the module docstring).

    @return: C{(method, path)}, or None where Twisted keeps them no more
        (logged once).
    """
    channel = getattr(request, "channel", None)
    command = getattr(channel, "_command", None)
    path = getattr(channel, "_path", None)
    if command.__class__ is bytes and path.__class__ is bytes:
        return command, path  # type: ignore[return-value]
    if channel is not None:
        _warn_once("request_line", "HTTPChannel keeps no _command and _path")
    return None


_getrefcount = sys.getrefcount


def deferred_unobserved(d: Any) -> bool:
    """Whether C{d}, a Deferred its caller holds in one local variable
    only, has no callbacks and no other holder: then nothing can ever see
    it fire (see the module docstring).

    @return: False where Deferreds keep their callbacks elsewhere now
        (logged once), or on an interpreter without reference counts.
    """
    callbacks = getattr(d, DEFERRED_CALLBACKS, _MISSING)
    if callbacks.__class__ is not list:
        _warn_once("deferred_unobserved", "Deferred has no _callbacks list")
        return False
    # The caller's variable, this function's argument, getrefcount's own.
    return not callbacks and _getrefcount(d) <= 3
