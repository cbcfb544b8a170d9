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
  - L{request_disconnected}: C{twisted.web} C{Request._disconnected},
    whether the client went before the answer finished. Without it, the
    request's C{channel} (set to None by the same C{connectionLost}) tells.

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

Nothing else in QMQ may touch a private attribute of Twisted or autobahn
(tests/test_twisted_internals.py greps the frontends for it); a new trick
of this kind goes here, with its check, its fallback and its test.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from twisted.internet import endpoints, tcp
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol

__all__ = [
    "AUTOBAHN_FEED",
    "REQUEST_LINE_FIELDS",
    "TCP_BUFFER_FIELDS",
    "direct_writer",
    "endpoint_interface",
    "hold_batches_per_read",
    "no_delay_once",
    "request_disconnected",
    "request_line",
    "websocket_feed",
]

log = Logger()

#: The private fields of C{tcp.Server} that L{direct_writer} reads.
TCP_BUFFER_FIELDS = ("_tempDataLen", "dataBuffer", "offset")

#: The private fields of C{twisted.web.http.HTTPChannel} that L{request_line} reads.
REQUEST_LINE_FIELDS = ("_command", "_path")

_warned: set[str] = set()


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
