# -*- test-case-name: tests.test_web_site -*-
"""The HTTP listener: one C{twisted.web} site that every web frontend shares.

C{--listen http:tcp:8080:interface=127.0.0.1} (or C{http:ssl:...},
C{http:qmqtls:...}) makes one L{HttpFactory}. On one port it serves::

    /stomp, /ws     STOMP over WebSocket (L{qmq.web.websocket})
    /qmq.js         QMQ's browser client (an ES module)
    /examples/      the example pages, when [web] examples = true
    /sockjs         STOMP over SockJS (L{qmq.web.sockjs})
    /sockjs_test    SockJS protocol test services, when [sockjs] test_services = true
    /api, /metrics  the JSON/Avro HTTP API and the metrics (qmq.web.api)
    /console        the web console, a static page over the API (L{qmq.web.console})

The contract for a part mounted here is small. It is one entry in
L{MOUNTS}: a path segment and a function that takes the listener's
L{WebContext} and returns the C{twisted.web} resource to mount there (or
L{None}: not mounted, a 404). Everything a resource needs of the broker is
in the context: the broker, the clock, the settings (its own section through
C{ctx.settings.section(NAME)}), the connection registry, and the cred portal
(L{None} until authentication exists). Errors are answered with
L{json_error}: a 4xx or 5xx status and an RFC 9457 problem document, the
HTTP API's own (L{qmq.web.api.problem.Problem}), never an HTML page or a
traceback; a method a resource does not answer is one too (L{QMQRequest}).

A connection's life, as this module sees it:

    1. L{HttpFactory.buildProtocol} asks the broker's
       L{qmq.connections.ConnectionRegistry} whether this listener may take
       one more connection from this address, exactly as the STOMP listener
       does. If not, the client gets a L{RefusedHttpProtocol}: a C{503} with
       a JSON body, and the connection is closed.
    2. Otherwise the site's HTTP channel is wrapped in an L{HttpConnection},
       which is the connection as the registry sees it (added when made,
       removed when lost) for the whole life of the socket, also after a
       WebSocket upgrade hands the socket from the HTTP channel to a STOMP
       session: the upgrade replaces the wrapped protocol, not the wrapper.
       Over TLS the handshake must finish within C{handshake_timeout}
       seconds or the connection is aborted.
    3. Requests: a request's head must be in within C{[web] head_timeout}
       seconds of the read that began it (else C{408} and the connection is
       closed: L{HttpConnection}); L{QMQRequest} refuses a body larger than
       C{[web] max_request_body} (C{413}, then the connection is closed);
       every request then passes the site's L{Guard} (Host, Origin, no
       state change from what a form can send: L{qmq.web.guard}) before
       any resource sees it; and a failure inside a resource becomes a
       C{500} with a JSON body. A kept-alive connection idle for
       C{[web] idle_timeout} seconds is closed (Twisted's own timeout,
       which does not run while a request is being answered).
    4. At a graceful shutdown the registry calls L{HttpConnection.shutdown}:
       a WebSocket carrying STOMP sends its client an C{ERROR} and closes;
       a plain HTTP connection is closed once what was written is flushed.
       Either is aborted if it has not gone C{close_grace} seconds later.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import (
    IHandshakeListener,
    IProtocolNegotiationFactory,
    ISSLTransport,
)
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.server import UnsupportedMethod
from zope.interface import implementer

from qmq import __version__
from qmq.connections import ConnectionRegistry
from qmq.core.admission import RETRY_AFTER, release_input, take_input
from qmq.core.broker import Broker
from qmq.logs import peer_address
from qmq.tls import PeerIdentity, peer_identity
from qmq.transport import IConnection
from qmq.twisted_internals import request_line
from qmq.web.api.problem import Problem
from qmq.web.guard import Guard, HostRule
from qmq.web.settings import WebSettings

__all__ = [
    "MOUNTS",
    "HttpConnection",
    "HttpFactory",
    "JsonError",
    "QMQRequest",
    "RefusedHttpProtocol",
    "StaticFile",
    "WebContext",
    "build_guard",
    "build_root",
    "build_site",
    "json_error",
]

log = Logger()

#: Where the site's own files are (C{qmq.js}, the example pages).
STATIC = Path(__file__).parent / "static"
EXAMPLES = Path(__file__).parent / "examples"


@dataclass
class WebContext:
    """What a resource mounted on the site may use of the broker.

    @ivar broker: the broker.
    @ivar clock: the reactor (C{IReactorTime}; the real reactor in the
        service, a L{twisted.internet.task.Clock} in tests).
    @ivar settings: the whole configuration (L{qmq.config.Settings});
        a part reads its own table with C{settings.section(NAME)}.
    @ivar connections: the broker's connection registry (caps, shutdown).
    @ivar listener: this listener's name in the registry (its listen spec).
    @ivar portal: the C{twisted.cred} portal that authenticates clients, or
        L{None} while QMQ has no authentication.
    @ivar on_stop: what to call once the listener stops listening (a mount
        that keeps state beyond connections, such as SockJS sessions, ends
        it there).
    @ivar guard: the listener's gate (L{qmq.web.guard}), once the site is
        built: a mount that checks an origin again asks it
        (C{guard.origins}).
    """

    broker: Broker
    clock: Any
    settings: Any
    connections: ConnectionRegistry
    listener: str = "http"
    portal: Any = None
    on_stop: list[Callable[[], Any]] = field(default_factory=list)
    guard: Guard | None = None

    @property
    def web(self) -> WebSettings:
        """The C{[web]} settings."""
        return self.settings.section("web")


#: A mount: the context in, the resource to put at its path out (or None).
MountBuilder = Callable[[WebContext], "Resource | None"]


def _stomp(ctx: WebContext) -> Resource:
    from qmq.web.websocket import stomp_resource  # noqa: PLC0415

    return stomp_resource(ctx)


def _sockjs(ctx: WebContext) -> Resource:
    from qmq.web.sockjs.stomp import sockjs_mount  # noqa: PLC0415

    return sockjs_mount(ctx)


def _sockjs_test(ctx: WebContext) -> Resource | None:
    from qmq.web.sockjs.stomp import sockjs_test_mount  # noqa: PLC0415

    return sockjs_test_mount(ctx)


def _client(ctx: WebContext) -> Resource:
    return StaticFile(str(STATIC / "qmq.js"))


def _examples(ctx: WebContext) -> Resource | None:
    if not ctx.web.examples:
        return None
    return StaticFile(str(EXAMPLES))


def _api(ctx: WebContext) -> Resource:
    from qmq.web.api import api_resource  # noqa: PLC0415

    return api_resource(ctx)


def _metrics(ctx: WebContext) -> Resource:
    from qmq.web.metrics import metrics_resource  # noqa: PLC0415

    return metrics_resource(ctx, getattr(ctx, "api", None))


def _console(ctx: WebContext) -> Resource:
    from qmq.web.console import console_resource  # noqa: PLC0415

    return console_resource(ctx)


#: The site's paths: the first segment -> what builds the resource there.
#: A part of QMQ that serves HTTP adds one line here (see the module
#: docstring); C{/ws} is the same resource as C{/stomp} (RabbitMQ's path).
MOUNTS: dict[str, MountBuilder] = {
    "stomp": _stomp,
    "ws": _stomp,
    "qmq.js": _client,
    "examples": _examples,
    "sockjs": _sockjs,
    "sockjs_test": _sockjs_test,
    "api": _api,
    "metrics": _metrics,
    "console": _console,
}


def json_error(request: Any, code: int, error: str, detail: str = "") -> bytes:
    """Answer C{request} with status C{code} and a problem document (the
    HTTP API's L{Problem}: one format for every error of the listener).

    @param request: the request.
    @param code: the HTTP status (4xx, 5xx).
    @param error: a short reason (C{"not found"}); the document's C{code}
        is it in kebab case (C{not-found}).
    @param detail: what the client can do about it.
    @return: the body, for a C{render_*} method to return.
    """
    return Problem(code, error.replace(" ", "-"), detail or error).render(request)


class _ProblemMethods:
    """A resource's stand-in for L{QMQRequest.render}: a method the
    resource has no C{render_*} for is a 405 problem document, where
    twisted.web would answer an HTML page (a HEAD of a resource that
    answers GET is still twisted's: the GET's headers without the body)."""

    def __init__(self, resource: Any) -> None:
        self.resource = resource

    def render(self, request: Any) -> Any:
        try:
            return self.resource.render(request)
        except UnsupportedMethod as e:
            allowed = [m.decode("ascii", "replace") for m in e.allowedMethods or ()]
            if request.method == b"HEAD" and "GET" in allowed:
                raise
            if allowed:
                request.setHeader(b"allow", ", ".join(allowed).encode())
            path = request.path.decode("utf-8", "replace")[:200]
            return json_error(request, 405, "method not allowed",
                              f"{path} answers {', '.join(allowed) or 'no method'} only.")


class JsonError(Resource):
    """A resource that answers every request with one JSON error."""

    isLeaf = True
    answers_every_method = True  # QMQRequest.render: no 405 to make

    def __init__(self, code: int, error: str, detail: str = "") -> None:
        super().__init__()
        self.code = code
        self.error = error
        self.detail = detail

    def render(self, request: Any) -> bytes:
        return json_error(request, self.code, self.error, self.detail)


def _not_found(request: Any) -> JsonError:
    path = request.path.decode("utf-8", "replace")[:200]
    return JsonError(404, "not found", f"Nothing is served at {path}.")


class Root(Resource):
    """The site's root: the mounts, a JSON index at C{/}, JSON 404s."""

    def __init__(self, ctx: WebContext) -> None:
        super().__init__()
        self.ctx = ctx

    def getChild(self, path: bytes, request: Any) -> Resource:
        if path == b"":
            return self
        return _not_found(request)

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        paths = sorted("/" + name.decode() for name in self.children)
        return json.dumps({"server": "QMQ", "version": __version__, "paths": paths}).encode()

    def render(self, request: Any) -> bytes:
        if request.method in (b"GET", b"HEAD"):
            return super().render(request)
        request.setHeader(b"allow", b"GET, HEAD")
        return json_error(request, 405, "method not allowed", "/ answers GET only.")


def build_root(ctx: WebContext) -> Resource:
    """The site's root resource with every mount of L{MOUNTS} that is on.

    @param ctx: the listener's context.
    @return: the root.
    """
    root = Root(ctx)
    for name, build in MOUNTS.items():
        resource = build(ctx)
        if resource is not None:
            root.putChild(name.encode(), resource)
    return root


class StaticFile(Resource):
    """A file, or a directory of files, of the site's own (the client, the
    example pages).

    Small files only, read when asked for (no cooperator, no ranges);
    revalidated on every use (C{no-cache}, with C{Last-Modified}):
    C{/qmq.js} keeps its URL across versions, so a browser must not run a
    stale copy. Names are plain file names (no hidden files, no
    sub-directories, no C{..}); directories are not listed.
    """

    isLeaf = True

    #: Content types by suffix; any other file is not served.
    TYPES = {
        ".js": b"text/javascript; charset=utf-8",
        ".mjs": b"text/javascript; charset=utf-8",
        ".html": b"text/html; charset=utf-8",
        ".css": b"text/css; charset=utf-8",
        ".json": b"application/json",
        ".png": b"image/png",
        ".svg": b"image/svg+xml",
        ".txt": b"text/plain; charset=utf-8",
    }
    #: The largest file served.
    MAX_SIZE = 4 * 1024 * 1024

    def __init__(self, path: str | Path, index: str = "index.html") -> None:
        super().__init__()
        self.path = Path(path)
        self.index = index

    def _file(self, request: Any) -> Path | None:
        segments = [s.decode("utf-8", "replace") for s in request.postpath]
        if self.path.is_file():
            return self.path if not any(segments) else None
        if not segments or segments == [""]:
            segments = [self.index]
        if len(segments) != 1:
            return None
        name = segments[0]
        if not name or name.startswith(".") or "/" in name or "\\" in name:
            return None
        candidate = self.path / name
        return candidate if candidate.is_file() else None

    def render(self, request: Any) -> bytes:
        if request.method not in (b"GET", b"HEAD"):
            request.setHeader(b"allow", b"GET, HEAD")
            return json_error(request, 405, "method not allowed", "Files answer GET only.")
        path = self._file(request)
        kind = self.TYPES.get(path.suffix) if path is not None else None
        if path is None or kind is None:
            return _not_found(request).render(request)
        try:
            stat = path.stat()
            if stat.st_size > self.MAX_SIZE:
                return _not_found(request).render(request)
            request.setHeader(b"content-type", kind)
            request.setHeader(b"cache-control", b"no-cache")
            request.setHeader(b"x-content-type-options", b"nosniff")
            if request.setLastModified(stat.st_mtime) == http.CACHED:
                return b""
            return path.read_bytes()
        except OSError:
            return _not_found(request).render(request)


class QMQRequest(server.Request):
    """A request whose body is capped, whose upload has a deadline, and
    whose failures answer in JSON.

    The body is kept in memory (twisted.web spills bodies over 100 kB to a
    temporary file: disk work for every batched publish), which the cap
    bounds. A request whose head and body are not all in within the site's
    C{upload_timeout} (C{[http_api] upload_timeout}) seconds of its first
    line is answered 408 and closed: a slow upload cannot hold a connection
    and its buffer for ever. The 413 and 408 bodies are RFC 9457 problem
    documents, as every error of the site is (L{json_error}).
    """

    _refused = False
    _received = 0
    _counted = 0
    _deadline: Any = None
    _forced_secure: Any = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What this request reads of its site and connection, read once
        # here (not at each chunk, at the head's end, at the finish): the
        # body cap, the broker (admission, the input budget) and the
        # connection's hooks (L{HttpConnection}; absent on a test's bare
        # transport).
        site = getattr(self.channel, "site", None)
        web = getattr(site, "web_settings", None)
        self._max_body = web.max_request_body if web is not None else WebSettings.max_request_body
        self._broker_of_site = getattr(site, "broker", None)
        connection = self.channel.transport if self.channel is not None else None
        self._connection = connection if isinstance(connection, HttpConnection) else None
        timeout = getattr(site, "upload_timeout", None)
        if timeout:
            clock = getattr(site, "reactor", None)
            if clock is None:
                from twisted.internet import reactor as clock  # noqa: PLC0415
            self._deadline = clock.callLater(timeout, self._too_slow, timeout)

    @property
    def body_size(self) -> int:
        """The bytes of the body read so far (the whole body once the
        request is received): what the guard checks, without seeking in
        C{content}."""
        return self._received

    def isSecure(self) -> bool:
        """Whether the request came over TLS (or L{setHost} said so).

        Twisted asks C{ISSLTransport(transport, None)} each time: for a
        plain TCP connection a failed adaptation through every adapter
        hook, a few microseconds a request. The listener's connection
        knows it once (L{HttpConnection.secure}).
        """
        if self._forced_secure:
            return True
        connection = self._connection
        if connection is not None and connection.secure is not None:
            return connection.secure
        return super().isSecure()

    def setHost(self, host: bytes, port: int, ssl: Any = 0) -> None:
        self._forced_secure = ssl  # before super(), which asks isSecure
        super().setHost(host, port, ssl)

    def _limit(self) -> int:
        return self._max_body

    def _stop_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def gotLength(self, length: int | None) -> None:
        # The head is complete (twisted.web calls this after the last header).
        connection = self._connection
        if connection is not None:
            connection.head_received()
        if length is not None and length > self._max_body:
            self._refuse(length)
            return
        broker = self._broker_of_site
        if broker is not None and broker.admission.held and self._held_back():
            return
        self.content = io.BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self._max_body:
            self._refuse(None)
            return
        broker = self._broker_of_site
        if broker is not None:
            # The body counts in the broker-wide budget for input still
            # being received, with STOMP's unfinished frames.
            self._counted += len(data)
            if not take_input(broker, len(data)):
                self._answer_early(
                    503, "Service Unavailable", "broker busy", "input-budget",
                    "Too many bytes of request bodies and frames are being received across all "
                    f"connections (limits.max_unfinished_bytes = {broker.max_unfinished_bytes}); "
                    "retry later.", retry_after=RETRY_AFTER,
                )
                return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        self._stop_deadline()
        if self._counted:
            self._release_input()
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Failure) -> None:
        self._stop_deadline()
        self._release_input()
        super().connectionLost(reason)

    def finish(self) -> None:
        # Answered: what the connection reads next is another request's head
        # (told before finishing, which may hand the channel the next one).
        connection = self._connection
        if connection is not None:
            connection.request_done()
        super().finish()

    def _broker(self) -> Any:
        return self._broker_of_site

    def _release_input(self) -> None:
        counted, self._counted = self._counted, 0
        if counted:
            release_input(self._broker(), counted)

    def _held_back(self) -> bool:
        """While admission holds every publisher (the memory alarm), answer
        a publish 503 before reading its body (the API refuses it all the
        same where the request line cannot be read early)."""
        broker = self._broker()
        if broker is None or not broker.admission.held:
            return False
        from qmq.web.api import is_publish  # noqa: PLC0415 - the API loads on demand

        line = request_line(self)
        hold = broker.admission.refusal(False)
        if line is None or hold is None or not is_publish(*line):
            return False
        self._answer_early(
            503, "Service Unavailable", "publishers held back", "publishers-held",
            f"Publishing is held back: {hold.detail}. Retry later.",
            retry_after=RETRY_AFTER, extra={"alarm": hold.name},
        )
        return True

    def _refuse(self, length: int | None) -> None:
        """Answer 413 at once, before the body is read, and close."""
        limit = self._limit()
        size = f"{length} bytes" if length is not None else "more"
        self._answer_early(
            413, "Content Too Large", "request body too large", "body-too-large",
            f"The body has {size}; this broker takes at most {limit} ([web] max_request_body).",
        )

    def _too_slow(self, timeout: float) -> None:
        self._deadline = None
        self._answer_early(
            408, "Request Timeout", "request timeout", "upload-timeout",
            f"The request was not received within {timeout:g} seconds ([http_api] upload_timeout).",
        )

    def _answer_early(
        self, status: int, title: str, error: str, code: str, detail: str,
        retry_after: int | None = None, extra: dict | None = None,
    ) -> None:
        """Answer before the request is complete (a problem document), and close."""
        if self._refused:
            return
        self._refused = True
        self._stop_deadline()
        self._release_input()
        self.content = io.BytesIO()
        body = Problem(status, code, detail, extra).body()
        more = b"retry-after: %d\r\n" % retry_after if retry_after is not None else b""
        channel = self.channel
        transport = channel.transport if channel is not None else None
        if transport is None:
            return
        requests = getattr(channel, "requests", None)
        if not requests or requests[0] is self:
            # Only the oldest outstanding request may write; a pipelined one
            # behind it just closes the connection.
            transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/problem+json\r\n"
                b"connection: close\r\n%scontent-length: %d\r\n\r\n%s"
                % (status, title.encode(), more, len(body), body)
            )
        close = getattr(transport, "close_after_writes", None)
        if close is not None:
            close()  # the listener's connection: really closed, also over TLS
        else:
            transport.loseConnection()

    def render(self, resrc: Any) -> None:
        """Render C{resrc}, a method it does not answer as a problem document
        (L{_ProblemMethods}). A resource whose own C{render} answers every
        method (its class says C{answers_every_method = True}: the API) is
        rendered as it is, without a wrapper a request."""
        if getattr(resrc, "answers_every_method", False):
            super().render(resrc)
        else:
            super().render(_ProblemMethods(resrc))

    def processingFailed(self, reason: Failure) -> None:
        log.failure("while answering {method} {uri}", reason,
                    method=self.method.decode("ascii", "replace"),
                    uri=self.uri.decode("ascii", "replace")[:200])
        if self.finished or self.startedWriting:
            self.loseConnection()
            return
        body = json_error(self, 500, "internal error", "The broker failed to answer; see its log.")
        self.setHeader(b"content-length", b"%d" % len(body))
        self.write(body)
        self.finish()


class QMQSite(server.Site):
    """A site whose every request passes its L{Guard} before any resource
    sees it (L{qmq.web.guard}), and that writes its access log only when
    asked (C{[web] access_log}).

    @ivar guard: the gate, or L{None} (none: a test's bare site).
    """

    access_log = True
    guard: Guard | None = None

    def getResourceFor(self, request: Any) -> Resource:
        """The resource for C{request}, or the gate's refusal of it."""
        guard = self.guard
        if guard is not None:
            if request.__class__ is QMQRequest:
                # Guard.check_request, read off the site's own request.
                refusal = guard.check(
                    request.method, request.path, request.requestHeaders, request._received,
                    request.isSecure(), request.clientproto,
                )
            else:
                refusal = guard.check_request(request)
            if refusal is not None:
                return refusal.resource()
        return super().getResourceFor(request)

    def log(self, request: Any) -> None:
        if self.access_log:
            super().log(request)


def build_guard(ctx: WebContext) -> Guard:
    """The gate of the listener of C{ctx}: its host names and the trusted
    origins (C{[web] allowed_origins} and C{[http_api] cors_origins}).

    @param ctx: the listener's context.
    @return: the guard.
    """
    web = ctx.web
    cors = ctx.settings.section("http_api").allowed_origins()
    return Guard(HostRule.for_listener(web.hosts, ctx.listener), (*web.origins, *sorted(cors)))


def build_site(ctx: WebContext) -> server.Site:
    """The listener's C{twisted.web} site (the root of L{build_root}).

    @param ctx: the listener's context.
    @return: the site, on the context's clock.
    """
    web = ctx.web
    ctx.guard = build_guard(ctx)  # before the mounts, which may ask it
    # twisted.web parses the Content-Type of every POST (with the email
    # package: a tenth of a one-message publish) to read HTML form fields;
    # nothing here takes forms (SockJS's jsonp_send reads its own body).
    site = QMQSite(build_root(ctx), timeout=web.idle_timeout, reactor=ctx.clock, parsePOSTFormSubmission=False)
    site.access_log = web.access_log
    site.requestFactory = QMQRequest
    site.displayTracebacks = False
    site.noisy = False
    site.guard = ctx.guard
    site.web_settings = web  # read by QMQRequest for its body cap
    site.broker = ctx.broker  # and for admission and the input budget
    site.upload_timeout = ctx.settings.section("http_api").upload_timeout  # and its deadline
    return site


def _abort(transport: Any) -> None:
    abort = getattr(transport, "abortConnection", None)
    if abort is not None:
        abort()
    else:
        transport.loseConnection()


#: Reads longer than this are cut after their first header block
#: (L{HttpConnection.dataReceived}), found in their first L{_HEAD_SCAN} bytes.
_SPLIT_ABOVE = 8192
_HEAD_SCAN = 16384


@implementer(IConnection, IHandshakeListener)
class HttpConnection(ProtocolWrapper):
    """One connection of an C{http:} listener, as the registry sees it.

    It wraps the site's HTTP channel, and after a WebSocket upgrade the
    protocol that took the socket over (the upgrade replaces the wrapped
    protocol, so this object stays the connection for its whole life).

    @ivar peer_host: the client's address (for the per-address cap).
    @ivar peer: the client's address and port, for logs and listings
        (L{qmq.logs.peer_address}).
    @ivar identity: the client's verified TLS identity, once known.
    """

    factory: HttpFactory
    peer = "?"
    #: Whether the connection is over TLS, once made (L{QMQRequest.isSecure}).
    secure: bool | None = None

    def __init__(self, factory: HttpFactory, wrapped: Protocol, peer_host: str) -> None:
        super().__init__(factory, wrapped)
        self.peer_host = peer_host
        self.identity: PeerIdentity | None = None
        self._handshake: Any = None
        self._grace: Any = None
        self._lost = False
        #: The HTTP channel, while it is the wrapped protocol (not after a
        #: WebSocket upgrade).
        self._channel: Protocol | None = wrapped
        #: Between requests or in a head (not in a body, nor while a
        #: request is being answered): bytes read now are a head's.
        self._in_head = True
        #: Heads completed so far, and the deadline of the head being read.
        self._heads = 0
        self._head_timer: Any = None

    @property
    def protocol_name(self) -> str:
        """What it carries, for C{/metrics} and the connection listing:
        C{websocket} once upgraded to STOMP over WebSocket, else C{http}."""
        return getattr(self.wrappedProtocol, "traffic_name", "http")

    def dataReceived(self, data: bytes) -> None:
        channel = self._channel
        fresh = self._in_head and self._head_timer is None and self.wrappedProtocol is channel
        heads = self._heads
        # twisted.web reads a request's head a line at a time from a buffer
        # that also holds the body, and each line's split copies the rest:
        # ten header lines over a 100 kB batch copied a megabyte (0.4 of
        # the request's CPU). Handing it the head first and the body after
        # keeps the body out of the line buffer; a byte stream cut in two is
        # the same stream, so this is harmless whatever the data is.
        if len(data) > _SPLIT_ABOVE:
            end = data.find(b"\r\n\r\n", 0, _HEAD_SCAN)
            if end != -1:
                self.wrappedProtocol.dataReceived(data[: end + 4])
                data = data[end + 4 :]
        self.wrappedProtocol.dataReceived(data)
        if fresh and self._in_head and self._heads == heads and self.wrappedProtocol is channel:
            self._head_started()

    # -- the head's deadline ([web] head_timeout) ---------------------------------
    #
    # Twisted restarts its idle timeout at every read, and a request exists
    # (with its upload deadline, QMQRequest) only once its first line is in:
    # a head dribbled a byte at a time would hold the connection for ever.
    # The deadline runs from the read that began a head to its last header.
    # It is armed only when a read ends inside a head, so a head that comes
    # in one read (nearly all) costs no timer.

    def _head_started(self) -> None:
        if self._lost:
            return
        timeout = self.factory.ctx.web.head_timeout
        self._head_timer = self.factory.ctx.clock.callLater(timeout, self._head_timeout, timeout)

    def head_received(self) -> None:
        """A request's head is complete (from L{QMQRequest.gotLength})."""
        self._in_head = False
        self._heads += 1
        timer, self._head_timer = self._head_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def request_done(self) -> None:
        """A request was answered (L{QMQRequest.finish}): the next read
        starts a head."""
        self._in_head = True

    def _head_timeout(self, timeout: float) -> None:
        self._head_timer = None
        if self._lost or self.wrappedProtocol is not self._channel:
            return
        log.info("request head timeout protocol=http peer={peer}", peer=self.peer)
        body = Problem(
            408, "head-timeout",
            f"The request's head was not received within {timeout:g} seconds ([web] head_timeout).",
        ).body()
        self.transport.write(  # type: ignore[union-attr]
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.close_after_writes()

    def close_after_writes(self) -> None:
        """Close once what was written is sent; abort C{close_grace} later.

        The HTTP channel registered itself as the socket's producer, and
        Twisted's TLS starts its shutdown only once no producer is
        registered (a TLS connection otherwise waited for the abort), so it
        is unregistered first: nothing more is read or answered anyway.
        """
        if self._lost:
            return
        transport = self.transport
        try:
            transport.unregisterProducer()  # type: ignore[union-attr]
        except RuntimeError:  # a test's StringTransport with none registered
            pass
        transport.loseConnection()  # type: ignore[union-attr]
        if not self._lost and self._grace is None:
            ctx = self.factory.ctx
            self._grace = ctx.clock.callLater(ctx.connections.settings.close_grace, self.abort)

    def connectionMade(self) -> None:
        ctx = self.factory.ctx
        ctx.connections.add(self, ctx.listener)
        self.secure = ISSLTransport.providedBy(self.transport)
        if self.secure:
            self._handshake = ctx.clock.callLater(
                ctx.connections.settings.handshake_timeout, self._handshake_timeout
            )

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done: stop its clock, read who the client is."""
        timer, self._handshake = self._handshake, None
        if timer is not None and timer.active():
            timer.cancel()
        self.identity = peer_identity(self.transport)
        wrapped = self.wrappedProtocol
        if IHandshakeListener.providedBy(wrapped):
            wrapped.handshakeCompleted()

    def _handshake_timeout(self) -> None:
        self._handshake = None
        log.info("tls handshake timeout protocol=http peer={peer}", peer=self.peer)
        self.abort()

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._lost = True
        for timer in (self._handshake, self._grace, self._head_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._handshake = self._grace = self._head_timer = None
        self.factory.ctx.connections.remove(self)
        super().connectionLost(reason)

    # IConnection
    def shutdown(self, reason: str) -> None:
        """The broker is going away: tell the client if its protocol can, close."""
        wrapped = self.wrappedProtocol
        if IConnection.providedBy(wrapped):
            wrapped.shutdown(reason)
            return
        self.close_after_writes()

    def abort(self) -> None:
        """Drop the connection now."""
        if not self._lost:
            _abort(self.transport)


class RefusedHttpProtocol(Protocol):
    """A connection the registry refused: a 503 with a JSON body, then closed."""

    def __init__(self, factory: HttpFactory, detail: str) -> None:
        self.factory = factory
        self.detail = detail
        self._grace: Any = None
        self._lost = False

    def connectionMade(self) -> None:
        body = Problem(503, "too-many-connections", self.detail).body()
        transport = self.transport
        transport.write(  # type: ignore[union-attr]
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n"
            b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        transport.loseConnection()  # type: ignore[union-attr]
        if not self._lost:
            ctx = self.factory.ctx
            self._grace = ctx.clock.callLater(
                ctx.connections.settings.close_grace, _abort, transport
            )

    def dataReceived(self, data: bytes) -> None:
        pass  # the answer is already on its way

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        self._grace = None


@implementer(IProtocolNegotiationFactory)
class HttpFactory(WrappingFactory):
    """The factory of an C{http:} listener: the site, behind the registry's caps.

    Over TLS it offers ALPN C{http/1.1} only: a WebSocket needs HTTP/1.1
    (Twisted has no WebSocket over HTTP/2), and a TLS listener whose factory
    names no protocol answers a client that offers ALPN (every browser) with
    an C{internal error} alert.

    @ivar ctx: the listener's L{WebContext}.
    @ivar site: the C{twisted.web} site it serves.
    """

    protocol = HttpConnection  # type: ignore[assignment]
    noisy = False

    def __init__(self, ctx: WebContext) -> None:
        self.ctx = ctx
        self.site = build_site(ctx)
        super().__init__(self.site)

    @property
    def listener(self) -> str:
        return self.ctx.listener

    def acceptableProtocols(self) -> list[bytes]:
        """ALPN: HTTP/1.1 (see the class docstring)."""
        return [b"http/1.1"]

    def buildProtocol(self, addr: Any) -> Protocol | None:  # type: ignore[override]
        host = getattr(addr, "host", None) or ""
        refusal = self.ctx.connections.admit(self.ctx.listener, host)
        if refusal is not None:
            return RefusedHttpProtocol(self, refusal)
        channel = self.site.buildProtocol(addr)
        if channel is None:
            return None
        connection = HttpConnection(self, channel, host)
        connection.peer = peer_address(addr)
        return connection

    def stopFactory(self) -> None:
        """The listener stopped: the mounts' C{on_stop} callbacks run."""
        super().stopFactory()
        for stop in self.ctx.on_stop:
            try:
                stop()
            except Exception:
                log.failure("while stopping a part of the HTTP listener")

    def registerProtocol(self, p: Any) -> None:
        pass  # the registry counts connections; no second book

    def unregisterProtocol(self, p: Any) -> None:
        pass

    @property
    def connections(self) -> Any:
        """This listener's open connections (a live view)."""
        return self.ctx.connections.connections(self.ctx.listener)
