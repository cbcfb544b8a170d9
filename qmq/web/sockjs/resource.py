# -*- test-case-name: tests.test_sockjs_resource,tests.test_sockjs_protocol -*-
"""The SockJS endpoint as a C{twisted.web} resource.

L{SockJSResource} serves one SockJS service (the STOMP one at C{/sockjs},
or a test service) under the URL it is mounted at::

    /                               "Welcome to SockJS!"
    /info                           GET: websocket, cookie_needed, origins, entropy
    /iframe.html, /iframe-X.html    the page of the iframe-based transports
    /websocket                      raw WebSocket (no SockJS framing)
    /SERVER/SESSION/TRANSPORT       a session's requests:
        websocket                       SockJS framing over a WebSocket
        xhr, xhr_streaming              receiving (POST)
        eventsource, htmlfile, jsonp    receiving (GET)
        xhr_send, jsonp_send            sending (POST)

A receiving request finds the session by its id (creating it if it is new)
and becomes its L{qmq.web.sockjs.session.Receiver} (L{HTTPReceiver}): it
writes frames wrapped the transport's way, registers as the response's
producer so a client that stops reading stops getting data (the session's
outbox then fills, and the application pauses), and tells the session when
the request ends, normally or by a network error. Sending requests hand the
session the messages they carry and answer at once.

B{Sessions are bound to who opened them.} A session id travels in every
URL of the session, so it leaks where URLs leak (logs, proxies, a shared
screen); it must not be all it takes to read a session's messages or to
speak in it. The service finds a session by its id I{and} by what the
opening request came with (L{SockJSService.key}): the verified TLS client
identity of its connection (a session whose client logged in with a
certificate answers only requests over connections with that certificate;
one whose client logged in with STOMP CONNECT inside it, only requests with
no certificate), and, unless C{sockjs.bind_to_address} is off, the client's
address. A request from elsewhere finds no session: a sending request gets
the protocol's 404, a receiving one opens a new, separate session (as for
any unknown id), so nothing tells it that the id is in use; it is logged
(with a digest of the id, not the id).

Errors the protocol prescribes keep its wording and codes (500 with
C{Broken JSON encoding.} or C{Payload expected.}, 404 for a sending request
to an unknown session); others are 4xx with a problem document, as every
error of the site (L{qmq.web.site.json_error}). CORS
follows the protocol (the request's C{Origin} echoed, C{null} included,
credentials allowed; C{*} without credentials when there is no C{Origin})
for the pages the service's C{origin_allowed} lets in; others get 403.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from qmq.logs import peer_address
from qmq.twisted_internals import request_disconnected
from qmq.web.site import json_error
from qmq.web.sockjs.framing import (
    TRANSPORTS,
    Budget,
    PayloadError,
    Wrapping,
    decode_messages,
    valid_callback,
)
from qmq.web.sockjs.session import CLOSED, SockJSSession, entropy
from qmq.web.sockjs.settings import SockJSSettings

__all__ = ["SockJSResource", "SockJSService"]

log = Logger()

ONE_YEAR = 31536000
_NO_CACHE = b"no-store, no-cache, no-transform, must-revalidate, max-age=0"
_IFRAME = re.compile(rb"^iframe[0-9a-z._-]*\.html$")
_COOKIE = re.compile(rb"^[A-Za-z0-9._~+/=-]{1,128}\Z")
_TEXT = b"text/plain; charset=UTF-8"
_IFRAME_PAGE = """<!DOCTYPE html>
<html>
<head>
  <meta http-equiv="X-UA-Compatible" content="IE=edge" />
  <meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
  <script src="%s"></script>
  <script>
    document.domain = document.domain;
    SockJS.bootstrap_iframe();
  </script>
</head>
<body>
  <h2>Don't panic!</h2>
  <p>This is a SockJS hidden iframe. It's used for cross domain magic.</p>
</body>
</html>"""


def _header(request: Any, name: bytes) -> str | None:
    value = request.getHeader(name)
    return value.decode("latin-1") if value is not None else None


def _identity(request: Any) -> Any:
    """The verified TLS client identity of the request's connection (the
    HTTP listener's connection wrapper knows it), or None."""
    channel = request.channel
    return getattr(getattr(channel, "transport", None), "identity", None)


def id_digest(session_id: str) -> str:
    """A short digest of a session id for logs: the id itself is a secret."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _peer(request: Any) -> tuple[str, str]:
    """(address for logs, host for caps) of the request's client."""
    peer = request.getClientAddress()
    return peer_address(peer), getattr(peer, "host", None) or ""


class SockJSService:
    """One SockJS service: its settings, its sessions and its application.

    @ivar settings: the L{SockJSSettings}.
    @ivar clock: the C{IReactorTime} of every session's timers.
    @ivar sessions: L{key} -> L{SockJSSession} (HTTP sessions only).
    @ivar handler_factory: C{handler_factory(session)} -> the application end
        (an L{qmq.web.sockjs.session.ISockJSHandler}) of a new session.
    @ivar admit: C{admit(host)} -> L{None}, or why a new session from
        C{host} is refused (the connection caps).
    @ivar origin_allowed: C{origin_allowed(request)} -> whether the page
        that made the request may use the service (L{None}: any page).
    """

    def __init__(
        self,
        handler_factory: Callable[[SockJSSession], Any],
        settings: SockJSSettings | None = None,
        clock: Any = None,
        admit: Callable[[str], str | None] | None = None,
        raw_handler_factory: Callable[[SockJSSession], Any] | None = None,
        origin_allowed: Callable[[Any], bool] | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor as clock  # noqa: PLC0415
        self.settings = settings if settings is not None else SockJSSettings()
        self.clock = clock
        self.handler_factory = handler_factory
        self.raw_handler_factory = raw_handler_factory or handler_factory
        self.admit = admit
        self.origin_allowed = origin_allowed
        self.sessions: dict[Any, SockJSSession] = {}
        #: With workers, what relays requests of sessions another worker
        #: owns (L{qmq.web.sockjs.relay.register}); None: every session is here.
        self.relay: Any = None
        # How many live HTTP sessions use each id (one, unless clients
        # elsewhere chose the same): a lookup that misses on an id in use
        # is a request from elsewhere, and is logged.
        self._ids: dict[str, int] = {}

    def key(self, session_id: str, host: str, identity: Any) -> tuple[str, str, Any]:
        """What a session is found by: its id, the client's address (unless
        C{bind_to_address} is off) and the connection's TLS client identity."""
        return (session_id, host if self.settings.bind_to_address else "", identity)

    def find(self, session_id: str, request: Any, transport: str) -> SockJSSession | None:
        """The live session C{request} names, if it came from where the
        session was opened (see the module docstring); None otherwise."""
        peer, host = _peer(request)
        session = self.sessions.get(self.key(session_id, host, _identity(request)))
        if session is None and session_id in self._ids:
            log.warn(
                "sockjs request from elsewhere into a session, treated as naming no session "
                "peer={peer} transport={transport} session_digest={digest}: the session was "
                "opened from another address or with another TLS identity",
                peer=peer, transport=transport, digest=id_digest(session_id),
            )
        return session

    def new_session(
        self, session_id: str, peer: str, peer_host: str, websocket: bool = False, raw: bool = False,
        identity: Any = None,
    ) -> SockJSSession:
        """A new session; an HTTP one is entered in L{sessions}."""
        settings = self.settings
        session = SockJSSession(
            session_id,
            None,
            self.clock,
            heartbeat_delay=0 if raw else settings.heartbeat_delay,
            disconnect_delay=settings.disconnect_delay,
            max_buffered=settings.max_buffered_bytes,
            peer=peer,
            peer_host=peer_host,
            websocket=websocket,
            forget=None if websocket else self._forget,
            identity=identity,
        )
        session.handler = (self.raw_handler_factory if raw else self.handler_factory)(session)
        if not websocket:
            key = session.key = self.key(session_id, peer_host, identity)
            old = self.sessions.get(key)
            if old is not None:
                # A closed session's id used again by the same client.
                self._forget(old)
            self.sessions[key] = session
            self._ids[session_id] = self._ids.get(session_id, 0) + 1
        return session

    def _forget(self, session: SockJSSession) -> None:
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]
            n = self._ids.get(session.id, 0) - 1
            if n > 0:
                self._ids[session.id] = n
            else:
                self._ids.pop(session.id, None)

    def refusal(self, host: str) -> str | None:
        return self.admit(host) if self.admit is not None else None

    def close_all(self, reason: str = "broker shutting down") -> None:
        """End every HTTP session now (the listener is stopping): an
        application that can say why (STOMP: an ERROR frame) does."""
        for session in list(self.sessions.values()):
            shutdown = getattr(session.handler, "shutdown", None)
            if shutdown is not None and session.state is not CLOSED:
                shutdown(reason)
            session.end()


@implementer(IPushProducer)
class HTTPReceiver(Budget):
    """A receiving HTTP request of a session (see the module docstring)."""

    def __init__(
        self, request: Any, wrapping: Wrapping, callback: str, limit: int, session: SockJSSession
    ) -> None:
        super().__init__(wrapping, callback, limit)
        self.request = request
        self.paused = False
        self.finished = False
        self.session = session
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(self._ended)

    def send_frame(self, frame: str) -> bool:
        data = self.wrapping.wrap(frame, self.callback)
        self.request.write(data)
        return self.spent(data)

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        request = self.request
        request.unregisterProducer()
        if not request_disconnected(request):
            request.finish()

    def _ended(self, result: Any) -> None:
        aborted = isinstance(result, Failure)
        self.finished = True
        self.session.detach(self, aborted=aborted)

    # IPushProducer: the response's transport is full, or drained.
    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        if self.paused:
            self.paused = False
            self.session.receiver_ready()

    def stopProducing(self) -> None:
        self.paused = True


@implementer(IPushProducer)
class _WebSocketProducer:
    """Tells a WebSocket session when its connection's buffer fills and drains."""

    def __init__(self, proto: SockJSWebSocketProtocol) -> None:
        self.proto = proto

    def pauseProducing(self) -> None:
        self.proto.paused = True

    def resumeProducing(self) -> None:
        proto = self.proto
        if proto.paused:
            proto.paused = False
            if proto.session is not None:
                proto.session.receiver_ready()

    def stopProducing(self) -> None:
        self.proto.paused = True


class SockJSWebSocketProtocol(WebSocketServerProtocol):
    """A SockJS session over a WebSocket: frames as text messages.

    The session's receiver for its whole life; it ends with the WebSocket.
    """

    streaming = True
    raw = False
    session: SockJSSession | None = None
    paused = False
    _finished = False
    #: The WebSocket close code and reason (those of the session's close frame).
    _close: tuple[int, str] = (1000, "")

    def onOpen(self) -> None:
        service: SockJSService = self.factory.service
        peer = self.transport.getPeer()
        host = getattr(peer, "host", "") or ""
        name = peer_address(peer)
        refusal = service.refusal(host)
        if refusal is not None:
            if not self.raw:
                self.sendMessage(b'c[3003,%s]' % json.dumps(refusal).encode())
            self._finished = True
            self.sendClose(3003, refusal)
            return
        if getattr(self.transport, "producer", None) is not None:
            # twisted.web's HTTPChannel stays registered on the transport
            # that autobahn took over from it: it has nothing to say now.
            self.transport.unregisterProducer()
        self.registerProducer(_WebSocketProducer(self), True)
        self.session = service.new_session("", name, host, websocket=True, raw=self.raw,
                                           identity=getattr(self.transport, "identity", None))
        self.session.attach(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        session = self.session
        if session is None or not payload:
            return  # empty messages are ignored, as the protocol asks
        if len(payload) > self.factory.service.settings.max_payload_bytes:
            self._finished = True
            self.dropConnection(abort=True)
            return
        try:
            text = payload.decode("utf-8")
            messages = [text] if self.raw else decode_messages(text, single_allowed=True)
        except (UnicodeDecodeError, PayloadError):
            # The protocol: broken framing ends the connection abruptly.
            # A TCP close, not a reset (what dropConnection(abort) sends):
            # a reset can overtake what the client has not read yet, and
            # clients report it as an error of their own.
            self._finished = True
            self.transport.loseConnection()
            return
        session.messages_received(messages)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self._finished = True
        session = self.session
        if session is not None:
            self.unregisterProducer()
            session.detach(self, aborted=True)

    # Receiver
    def send_frame(self, frame: str) -> bool:
        if self._finished:
            return False
        kind = frame[0]
        if kind == "c":
            # The session's close code and reason become the WebSocket's
            # own close (L{finish}): on the raw endpoint they are all the
            # client learns of why (sockjs-node does the same).
            self._close = _close_code(frame)
        if self.raw:
            if kind == "a":
                for message in json.loads(frame[1:]):
                    self.sendMessage(message.encode(), False)
            return kind == "c"
        self.sendMessage(frame.encode(), False)
        return False

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.sendClose(*self._close)

    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()


def _close_code(frame: str) -> tuple[int, str]:
    """The WebSocket close (code, reason) for a SockJS close frame
    C{c[code,"reason"]}: its own where WebSocket lets a server send it
    (1000, 3000-4999), else 1000 with the same reason (C{1002 Connection
    interrupted}, C{2010 Another connection still open} are SockJS's codes)."""
    try:
        code, reason = json.loads(frame[1:])
    except (ValueError, TypeError):
        return 1000, ""
    if not isinstance(code, int) or not (code == 1000 or 3000 <= code <= 4999):
        code = 1000
    return code, reason if isinstance(reason, str) else ""


class RawWebSocketProtocol(SockJSWebSocketProtocol):
    """The raw WebSocket entry (C{/websocket}): one message is one message."""

    raw = True


def _ws_factory(service: SockJSService, protocol: type) -> WebSocketServerFactory:
    factory = WebSocketServerFactory()
    factory.protocol = protocol
    factory.service = service
    factory.setProtocolOptions(
        maxMessagePayloadSize=service.settings.max_payload_bytes,
        maxFramePayloadSize=service.settings.max_payload_bytes,
        autoPingInterval=0,
    )
    return factory


class SockJSResource(Resource):
    """One SockJS service under the URL it is mounted at (see the module docstring)."""

    isLeaf = True

    def __init__(self, service: SockJSService) -> None:
        super().__init__()
        self.service = service
        settings = service.settings
        self.settings = settings
        self._iframe = (_IFRAME_PAGE % settings.sockjs_url).encode()
        self._etag = b'"' + hashlib.sha256(self._iframe).hexdigest()[:32].encode() + b'"'
        self._ws = WebSocketResource(_ws_factory(service, SockJSWebSocketProtocol))
        self._raw_ws = WebSocketResource(_ws_factory(service, RawWebSocketProtocol))

    # -- dispatch -----------------------------------------------------------------

    def render(self, request: Any) -> Any:
        path = request.postpath
        method = request.method
        if not self._origin_allowed(request):
            return self._json_error(
                request, 403, "origin not allowed",
                "Pages from this origin may not use this endpoint (web.allowed_origins).")
        n = len(path)
        if n == 0 or (n == 1 and path[0] == b""):
            if method not in (b"GET", b"HEAD"):
                return self._not_allowed(request, b"GET")
            request.setHeader(b"Content-Type", _TEXT)
            return b"Welcome to SockJS!\n"
        if n == 1:
            name = path[0]
            if name == b"info":
                return self._info(request)
            if name == b"websocket" and self.settings.websocket:
                return self._websocket(request, raw=True)
            if _IFRAME.match(name):
                return self._iframe_page(request)
        elif n == 3:
            server, session, transport = path
            if server and session and b"." not in server and b"." not in session:
                return self._session_request(request, session.decode("utf-8", "replace"),
                                             transport.decode("ascii", "replace"))
        return self._json_error(request, 404, "not found", "No such SockJS URL.")

    # -- static answers -----------------------------------------------------------------

    def _origin_allowed(self, request: Any) -> bool:
        check = self.service.origin_allowed
        return check is None or check(request)

    def _cors(self, request: Any) -> None:
        """CORS as sockjs-node answers: the page's origin echoed, with
        credentials (C{null}, a sandboxed or C{file:} page, included:
        browsers refuse C{*} with credentials); C{*} without credentials
        for a request that names no origin. Only origins that
        C{origin_allowed} let in get here."""
        origin = _header(request, b"origin")
        if origin:
            request.setHeader(b"Access-Control-Allow-Origin", origin.encode())
            request.setHeader(b"Access-Control-Allow-Credentials", b"true")
        else:
            request.setHeader(b"Access-Control-Allow-Origin", b"*")
        # Caches must keep answers for different origins apart.
        request.setHeader(b"Vary", b"Origin")
        wanted = _header(request, b"access-control-request-headers")
        if wanted:
            request.setHeader(b"Access-Control-Allow-Headers", wanted.encode())

    def _options(self, request: Any, methods: bytes) -> bytes:
        request.setResponseCode(204)
        self._cache_for_a_year(request)
        request.setHeader(b"Access-Control-Max-Age", str(ONE_YEAR).encode())
        request.setHeader(b"Access-Control-Allow-Methods", methods)
        self._cors(request)
        return b""

    @staticmethod
    def _cache_for_a_year(request: Any) -> None:
        request.setHeader(b"Cache-Control", b"public, max-age=%d" % ONE_YEAR)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=ONE_YEAR)
        request.setHeader(b"Expires", expires.strftime("%a, %d %b %Y %H:%M:%S GMT").encode())

    @staticmethod
    def _not_allowed(request: Any, allow: bytes) -> bytes:
        request.setResponseCode(405)
        request.setHeader(b"Allow", allow)
        request.defaultContentType = None
        return b""

    @staticmethod
    def _json_error(request: Any, code: int, error: str, detail: str = "") -> bytes:
        return json_error(request, code, error, detail)

    @staticmethod
    def _protocol_error(request: Any, message: str) -> bytes:
        """An error in the protocol's own words (it prescribes 500)."""
        request.setResponseCode(500)
        request.setHeader(b"Content-Type", _TEXT)
        request.setHeader(b"Cache-Control", _NO_CACHE)
        return message.encode()

    def _info(self, request: Any) -> bytes:
        if request.method == b"OPTIONS":
            return self._options(request, b"OPTIONS, GET")
        if request.method != b"GET":
            return self._not_allowed(request, b"OPTIONS, GET")
        request.setHeader(b"Content-Type", b"application/json; charset=UTF-8")
        request.setHeader(b"Cache-Control", _NO_CACHE)
        self._cors(request)
        settings = self.settings
        return json.dumps(
            {
                "websocket": settings.websocket,
                "cookie_needed": settings.cookie_needed,
                "origins": ["*:*"],
                "entropy": entropy(),
            }
        ).encode()

    def _iframe_page(self, request: Any) -> bytes:
        if request.method not in (b"GET", b"HEAD"):
            return self._not_allowed(request, b"GET")
        self._cache_for_a_year(request)
        request.setHeader(b"ETag", self._etag)
        if _header(request, b"if-none-match") == self._etag.decode():
            request.setResponseCode(304)
            return b""
        request.setHeader(b"Content-Type", b"text/html; charset=UTF-8")
        return self._iframe

    # -- sessions -------------------------------------------------------------------------

    def _no_cache(self, request: Any) -> None:
        request.setHeader(b"Cache-Control", _NO_CACHE)
        if self.settings.cookie_needed:
            value = request.getCookie(b"JSESSIONID")
            if value is None or not _COOKIE.match(value):
                value = b"dummy"
            request.addCookie(b"JSESSIONID", value, path=b"/")

    def _session_request(self, request: Any, session_id: str, transport: str) -> Any:
        method = request.method
        if transport == "websocket":
            if not self.settings.websocket:
                return self._json_error(request, 404, "not found", "No such SockJS URL.")
            return self._websocket(request, raw=False)
        if transport in ("xhr_send", "jsonp_send"):
            if transport == "xhr_send" and method == b"OPTIONS":
                return self._options(request, b"OPTIONS, POST")
            if method != b"POST":
                return self._not_allowed(request, b"OPTIONS, POST" if transport == "xhr_send"
                                         else b"POST")
            return self._send(request, session_id, transport)
        wrapping = TRANSPORTS.get(transport)
        if wrapping is None:
            return self._json_error(request, 404, "not found", "No such SockJS URL.")
        if method == b"OPTIONS" and wrapping.method == b"POST":
            return self._options(request, b"OPTIONS, POST")
        if method != wrapping.method:
            return self._not_allowed(request, wrapping.method)
        callback = ""
        if wrapping.needs_callback:
            values = request.args.get(b"c")
            if not values or not values[0]:
                return self._protocol_error(request, '"callback" parameter required')
            callback = values[0].decode("utf-8", "replace")
            if not valid_callback(callback):
                return self._protocol_error(request, 'invalid "callback" parameter')
        relay = self.service.relay
        owner = relay.owner(session_id) if relay is not None else None
        if owner is not None:
            return self._relay_receive(request, relay, owner, session_id, transport, wrapping, callback)
        session = self.service.find(session_id, request, transport)
        if session is None or session.state is CLOSED:
            peer, host = _peer(request)
            refusal = self.service.refusal(host)
            if refusal is not None:
                return self._json_error(request, 503, "too many connections", refusal)
            session = self.service.new_session(session_id, peer, host, identity=_identity(request))
        self._start_receiving(request, wrapping, callback)
        receiver = HTTPReceiver(request, wrapping, callback, self.settings.response_limit, session)
        session.attach(receiver)
        return NOT_DONE_YET

    def _start_receiving(self, request: Any, wrapping: Wrapping, callback: str) -> None:
        """A receiving response's headers and prelude."""
        request.setHeader(b"Content-Type", wrapping.content_type)
        self._no_cache(request)
        self._cors(request)
        if wrapping.streaming:
            # Proxies (nginx) must pass a stream on as it comes.
            request.setHeader(b"X-Accel-Buffering", b"no")
        if wrapping.prelude is not None:
            request.write(wrapping.prelude(callback))

    def _relay_receive(
        self, request: Any, relay: Any, owner: str, session_id: str, transport: str, wrapping: Wrapping,
        callback: str,
    ) -> Any:
        """A receiving request of a session another worker owns: relayed
        there (L{qmq.web.sockjs.relay}); its answer is written here."""
        peer, host = _peer(request)
        d = relay.receive(owner, request, lambda: self._start_receiving(request, wrapping, callback), wrapping,
                          transport, callback, self.settings.response_limit, session_id, peer, host,
                          _identity(request))

        def refused(reason: Any) -> None:
            if reason is not None and not request_disconnected(request):
                request.write(self._json_error(request, 503, "too many connections", str(reason)))
                request.finish()

        d.addCallbacks(refused, lambda failure: self._relay_failed(request, failure))
        return NOT_DONE_YET

    def _relay_failed(self, request: Any, failure: Failure) -> None:
        """The worker that owns the session did not answer (down, restarting)."""
        log.info("sockjs: a request relayed to another worker failed: {error}", error=failure.getErrorMessage())
        if not request_disconnected(request):
            request.write(self._json_error(request, 503, "session unavailable",
                                           "The worker that holds this session does not answer; try again."))
            request.finish()

    def _send(self, request: Any, session_id: str, transport: str) -> Any:
        relay = self.service.relay
        owner = relay.owner(session_id) if relay is not None else None
        session = None
        if owner is None:
            session = self.service.find(session_id, request, transport)
            if session is None or session.state is CLOSED:
                return self._no_session(request)
        self._no_cache(request)
        self._cors(request)
        content = request.content
        content.seek(0, 2)
        size = content.tell()
        if size > self.settings.max_payload_bytes:
            return self._json_error(
                request, 413, "payload too large",
                f"At most sockjs.max_payload_bytes = {self.settings.max_payload_bytes} bytes.")
        content.seek(0)
        body = content.read()
        if transport == "jsonp_send":
            ctype = _header(request, b"content-type") or ""
            if ctype.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
                values = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).get("d")
                body = values[0].encode() if values else b""
        try:
            messages = decode_messages(body)
        except PayloadError as e:
            return self._protocol_error(request, e.message)
        if session is None:
            # A session another worker owns: its messages go there.
            peer, host = _peer(request)
            d = relay.send(owner, session_id, host, _identity(request), messages)

            def answered(found: bool) -> None:
                if not request_disconnected(request):
                    request.write(self._sent(request, transport) if found else self._no_session(request))
                    request.finish()

            d.addCallbacks(answered, lambda failure: self._relay_failed(request, failure))
            return NOT_DONE_YET
        session.messages_received(messages)
        return self._sent(request, transport)

    def _no_session(self, request: Any) -> bytes:
        return self._json_error(request, 404, "no such session",
                                "The session is unknown or has ended; open a new one.")

    def _sent(self, request: Any, transport: str) -> bytes:
        """A sending request's answer, its messages delivered."""
        request.setHeader(b"Content-Type", _TEXT)
        if transport == "jsonp_send":
            return b"ok"
        request.setResponseCode(204)
        return b""

    def _websocket(self, request: Any, raw: bool) -> Any:
        if request.method != b"GET":
            return self._not_allowed(request, b"GET")
        upgrade = (_header(request, b"upgrade") or "").lower()
        if upgrade != "websocket":
            request.setResponseCode(400)
            request.setHeader(b"Content-Type", _TEXT)
            return b'Can "Upgrade" only to "WebSocket".'
        tokens = [t.strip().lower() for t in (_header(request, b"connection") or "").split(",")]
        if "upgrade" not in tokens:
            request.setResponseCode(400)
            request.setHeader(b"Content-Type", _TEXT)
            return b'"Connection" must be "Upgrade".'
        return (self._raw_ws if raw else self._ws).render(request)
