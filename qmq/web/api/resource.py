# -*- test-case-name: tests.test_web_api -*-
"""The C{/api} resource: routes, parameters, encodings, problems.

L{ApiResource} is a leaf C{twisted.web} resource: it matches the request's
method and path against L{ApiResource.routes} (one table, which the
OpenAPI document is checked against), reads and checks parameters, calls
the handler and writes what it returns, now or when its Deferred fires.
Handlers return a L{Response} (or a Deferred of one) or raise a
L{Problem}; core errors become problems too (L{from_broker_error}); an
unexpected exception is logged and answered with a bare problem, never a
traceback.

This module keeps routing and dispatch, login, the documents and the
message handlers (publish, receive, ack, scan, follow: the API's hot
paths) whole; the rest is mixed in from beside it:
L{qmq.web.api.topology.TopologyMixin} (queues, exchanges, bindings) and
L{qmq.web.api.admin.AdminMixin} (connections, users, permissions). The
request and response helpers every handler uses are in
L{qmq.web.api.params}.

CORS: a request whose C{Origin} is in C{http_api.cors_origins} (or any
origin with C{"*"}) gets C{Access-Control-Allow-Origin}; a preflight
(C{OPTIONS} with C{Access-Control-Request-Method}) is answered 204.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from itertools import islice
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from qmq.core.access import authorize_monitoring
from qmq.core.admission import RETRY_AFTER
from qmq.core.errors import BrokerError
from qmq.core.management import Management
from qmq.core.names import check_exchange
from qmq.twisted_internals import no_delay_once
from qmq.web.api import codec
from qmq.web.api.admin import AdminMixin
from qmq.web.api.codec import AVRO, AVRO_TYPES, JSON, SCHEMA_NAMES
from qmq.web.api.definitions import DefinitionsMixin
from qmq.web.api.follow import CursorFollower, SseFollower, _SseProducer
from qmq.web.api.frontend import HttpFrontend, parse_handle
from qmq.web.api.health import HealthHandlers
from qmq.web.api.params import (
    Response,
    _arg,
    _content_type,
    _encoding_arg,
    _float_arg,
    _handles,
    _int_arg,
    _object_body,
    json_response,
)
from qmq.web.api.problem import Problem, bad_request, from_broker_error
from qmq.web.api.settings import ApiSettings
from qmq.web.api.topology import TopologyMixin

if TYPE_CHECKING:
    from twisted.web.server import Request

log = Logger()

API_VERSION = "v1"


# -- the resource -----------------------------------------------------------------------


Route = tuple[str, tuple[str, ...], str]


#: Handlers anyone may call, also with authentication on (the documents).
PUBLIC = frozenset(("h_index", "h_openapi", "h_schemas", "h_schema", "h_health", "h_health_live",
                    "h_health_ready", "h_health_check", "h_health_port"))  # the checks ask monitor_check
#: Handlers of the broker as a whole (users, permissions): their caller
#: logs in to the default virtual host whatever the path names.
GLOBAL = frozenset(("h_get_permission", "h_put_permission", "h_delete_permission"))
DEFAULT_VHOST = "/"
_USER_CACHE_SIZE = 10_000
#: Most routes L{ApiResource.render} remembers (emptied when full).
_ROUTE_CACHE_SIZE = 1024


def is_publish(method: bytes, path: bytes) -> bool:
    """Whether a request line (C{POST}, C{/api/v1/vhosts/%2F/queues/q/messages?x=1})
    names one of the API's publish operations: the site refuses those
    before reading their body while admission holds every publisher."""
    if method != b"POST":
        return False
    segments = path.split(b"?", 1)[0].split(b"/")
    if len(segments) < 3 or segments[0] != b"" or segments[1] != b"api":
        return False
    segments = segments[2:]
    if segments and segments[-1] == b"":
        segments.pop()
    for route_method, template, name in ApiResource.routes:
        if route_method == "POST" and name.startswith("publish") and len(template) == len(segments):
            if all(t.startswith("{") or t.encode() == p for t, p in zip(template, segments, strict=True)):
                return True
    return False


def _unauthorized(detail: str) -> Problem:
    return Problem(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Basic realm="QMQ", Bearer'})


class ApiResource(HealthHandlers, TopologyMixin, AdminMixin, DefinitionsMixin, Resource):
    """C{/api}: version 1 of QMQ's HTTP API (see the module docstring)."""

    isLeaf = True
    #: L{render} answers every method (a 405 problem of its own): the site
    #: renders it without its per-request wrapper (L{qmq.web.site.QMQRequest.render}).
    answers_every_method = True

    #: (method, path segments after C{/api}, handler name); C{{name}} is a
    #: parameter. The OpenAPI document lists exactly these.
    routes: tuple[Route, ...] = (
        ("GET", ("v1",), "index"),
        ("GET", ("v1", "openapi.json"), "openapi"),
        ("GET", ("v1", "health"), "health"),
        ("GET", ("v1", "health", "live"), "health_live"),
        ("GET", ("v1", "health", "ready"), "health_ready"),
        ("GET", ("v1", "health", "checks", "{check}"), "health_check"),
        ("GET", ("v1", "health", "checks", "port-listener", "{port}"), "health_port"),
        ("GET", ("v1", "schemas"), "schemas"),
        ("GET", ("v1", "schemas", "{schema}"), "schema"),
        ("GET", ("v1", "vhosts"), "list_vhosts"),
        ("GET", ("v1", "vhosts", "{vhost}"), "get_vhost"),
        ("POST", ("v1", "vhosts", "{vhost}", "messages"), "publish_any"),
        ("GET", ("v1", "vhosts", "{vhost}", "queues"), "list_queues"),
        ("GET", ("v1", "vhosts", "{vhost}", "queues", "{queue}"), "get_queue"),
        ("PUT", ("v1", "vhosts", "{vhost}", "queues", "{queue}"), "put_queue"),
        ("DELETE", ("v1", "vhosts", "{vhost}", "queues", "{queue}"), "delete_queue"),
        ("POST", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "messages"), "publish_queue"),
        ("DELETE", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "messages"), "purge_queue"),
        ("POST", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "receive"), "receive"),
        ("POST", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "ack"), "ack"),
        ("POST", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "nack"), "nack"),
        ("POST", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "extend"), "extend"),
        ("GET", ("v1", "vhosts", "{vhost}", "queues", "{queue}", "scan"), "scan"),
        ("POST", ("v1", "vhosts", "{vhost}", "topics", "{topic}", "messages"), "publish_topic"),
        ("GET", ("v1", "vhosts", "{vhost}", "topics", "{topic}", "events"), "topic_events"),
        ("GET", ("v1", "vhosts", "{vhost}", "topics", "{topic}", "poll"), "topic_poll"),
        ("GET", ("v1", "vhosts", "{vhost}", "exchanges"), "list_exchanges"),
        ("GET", ("v1", "vhosts", "{vhost}", "exchanges", "{exchange}"), "get_exchange"),
        ("PUT", ("v1", "vhosts", "{vhost}", "exchanges", "{exchange}"), "put_exchange"),
        ("DELETE", ("v1", "vhosts", "{vhost}", "exchanges", "{exchange}"), "delete_exchange"),
        ("POST", ("v1", "vhosts", "{vhost}", "exchanges", "{exchange}", "messages"), "publish_exchange"),
        ("GET", ("v1", "vhosts", "{vhost}", "bindings"), "list_bindings"),
        ("POST", ("v1", "vhosts", "{vhost}", "bindings"), "add_binding"),
        ("DELETE", ("v1", "vhosts", "{vhost}", "bindings"), "delete_binding"),
        ("GET", ("v1", "connections"), "list_connections"),
        ("DELETE", ("v1", "connections", "{connection}"), "close_connection"),
        ("GET", ("v1", "links"), "list_links"),
        ("GET", ("v1", "users"), "list_users"),
        ("GET", ("v1", "users", "{user}"), "get_user"),
        ("PUT", ("v1", "users", "{user}"), "put_user"),
        ("DELETE", ("v1", "users", "{user}"), "delete_user"),
        ("GET", ("v1", "permissions"), "list_permissions"),
        ("GET", ("v1", "permissions", "{vhost}", "{user}"), "get_permission"),
        ("PUT", ("v1", "permissions", "{vhost}", "{user}"), "put_permission"),
        ("DELETE", ("v1", "permissions", "{vhost}", "{user}"), "delete_permission"),
        ("GET", ("v1", "definitions"), "get_definitions"),
        ("POST", ("v1", "definitions"), "post_definitions"),
    )

    def __init__(self, ctx: Any, settings: ApiSettings | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.broker = ctx.broker
        self.clock = getattr(ctx, "clock", None) or getattr(ctx, "reactor", None) or self.broker.clock
        if settings is None:
            app_settings = getattr(ctx, "settings", None)
            settings = app_settings.section("http_api") if app_settings is not None else ApiSettings()
        self.settings = settings
        self.origins = settings.allowed_origins()
        self.frontend = HttpFrontend(self.broker, settings, self.clock)
        self.followers: dict[str, CursorFollower] = {}
        self.streams: set[SseFollower] = set()
        self._openapi: bytes | None = None
        self._users: dict[tuple, tuple[Any, float, int]] = {}
        self._rates: dict[tuple[str, str], tuple[float, int, int, float, float]] = {}
        self._by_shape: dict[tuple[int, str], list[Route]] = {}
        #: (method, raw path segments) -> (handler, parameters, the virtual
        #: host to log in to or None: a public handler), for L{render}.
        self._seen_routes: dict[tuple[bytes, ...], tuple[Any, dict[str, str], str | None]] = {}
        for route in self.routes:
            self._by_shape.setdefault((len(route[1]), route[1][1] if len(route[1]) > 1 else ""), []).append(route)
        #: Messages published and delivered over HTTP (for /metrics).
        self.published = 0
        self.delivered = 0
        self.acked = 0

    # -- dispatch ----------------------------------------------------------------

    def render(self, request: Request) -> Any:
        # twisted.web writes a response's head and body apart: with
        # Nagle's algorithm on, the body waits for the client's delayed
        # ACK (40 ms a request on a kept-alive connection).
        no_delay_once(request.channel)
        if self.origins:
            self._cors(request)
        # A client asks for the same few paths again and again (a publisher
        # its queue's): the route of a method and raw path, once matched, is
        # a dictionary lookup (the match and the segments' decoding were a
        # tenth of a one-message publish's Python).
        key = (request.method, *request.postpath)
        route = self._seen_routes.get(key)
        if route is None:
            method = request.method.decode("ascii", "replace")
            try:
                segments = [s.decode("utf-8") for s in request.postpath]
            except UnicodeDecodeError:
                return self._write(request, Problem(400, "bad-path", "The path is not UTF-8."))
            if len(segments) > 1 and segments[-1] == "":
                segments.pop()  # a trailing slash
            if method == "OPTIONS":
                return self._options(request, segments)
            try:
                handler, params = self._match(method, segments)
            except Exception as e:  # noqa: BLE001 - a 404 or 405 problem
                return self._write(request, self._problem(e))
            name = handler.__name__
            login = (
                None if name in PUBLIC
                else DEFAULT_VHOST if name in GLOBAL
                else params.get("vhost", DEFAULT_VHOST)
            )
            route = (handler, params, login)
            if len(self._seen_routes) >= _ROUTE_CACHE_SIZE:
                self._seen_routes.clear()
            self._seen_routes[key] = route
        handler, params, login = route
        try:
            if login is None or getattr(self.broker, "auth", None) is None:
                request.qmq_user = None
                result = handler(request, **params)
            else:
                result = self._login(request, login).addCallback(self._call, handler, request, params)
        except Exception as e:  # noqa: BLE001 - every error becomes a problem
            return self._write(request, self._problem(e))
        if isinstance(result, defer.Deferred):
            gone: list[bool] = []
            request.notifyFinish().addErrback(lambda _: gone.append(True))
            result.addErrback(lambda f: self._problem(f.value))
            result.addCallback(lambda r: None if gone else self._write_later(request, r))
            result.addErrback(lambda f: log.failure("writing an API response", f))
            return NOT_DONE_YET
        return self._write(request, result)

    @staticmethod
    def _call(user: Any, handler: Any, request: Request, params: dict[str, str]) -> Any:
        request.qmq_user = user
        return handler(request, **params)

    # -- authentication ----------------------------------------------------------

    def _login(self, request: Request, vhost: str, use_vhost: bool = True) -> defer.Deferred:
        """The user of C{request} (HTTP Basic, or a bearer token), logged in
        to C{vhost} through the broker's authenticator, as STOMP's CONNECT
        is; remembered for C{auth_cache} seconds per virtual host and
        C{Authorization} header (and TLS client)."""
        auth = self.broker.auth
        header = request.getHeader("authorization")
        identity = getattr(getattr(request.channel, "transport", None), "identity", None)
        key = (vhost, use_vhost, hashlib.sha256(header.encode()).digest() if header else None, identity)
        now = self.clock.seconds()
        cached = self._users.get(key)
        generation = auth.generation
        if cached is not None:
            user, until, seen = cached
            if until > now and seen == generation and (user.expires is None or user.expires > now):
                return defer.succeed(user)
            del self._users[key]
        login = passcode = None
        if header:
            scheme, _, value = header.strip().partition(" ")
            scheme = scheme.lower()
            if scheme == "basic":
                try:
                    login, sep, passcode = base64.b64decode(value.strip(), validate=True).decode().partition(":")
                except (binascii.Error, ValueError):
                    sep = ""
                if not sep:
                    raise _unauthorized("The Basic credentials are not base64 of 'user:password'.")
            elif scheme == "bearer" and value.strip():
                passcode = value.strip()
            else:
                raise _unauthorized("Send credentials as 'Authorization: Basic ...' or 'Authorization: Bearer TOKEN'.")
        credentials = auth.credentials(vhost, login, passcode, identity)
        address = getattr(request.getClientAddress(), "host", "") or ""
        d = auth.authenticate(vhost, credentials, address, use_vhost)

        def logged_in(user: Any) -> Any:
            if self.settings.auth_cache > 0:
                if len(self._users) >= _USER_CACHE_SIZE:
                    self._users.pop(next(iter(self._users)))
                self._users[key] = (user, now + self.settings.auth_cache, generation)
            return user

        def refused(failure: Any) -> Any:
            from qmq.auth import AuthError, Busy, TooManyFailures, VhostRefused  # noqa: PLC0415

            e = failure.value
            if isinstance(e, TooManyFailures | Busy):
                raise Problem(429, "too-many-logins", e.message, headers={"Retry-After": "5"})
            if isinstance(e, VhostRefused):
                raise Problem(403, "access-refused", e.message)
            if isinstance(e, AuthError):
                raise _unauthorized(e.message)
            return failure

        return d.addCallbacks(logged_in, refused)

    def admin_check(self, request: Request) -> defer.Deferred:
        """Fires once C{request}'s user is an admin (L{_login} against the
        default virtual host); fails with a L{Problem} otherwise. For the
        site's other resources (C{/metrics})."""
        if getattr(self.broker, "auth", None) is None:
            request.qmq_user = None
            return defer.succeed(None)

        def check(user: Any) -> None:
            request.qmq_user = user
            self._require_admin(request)

        return defer.maybeDeferred(self._login, request, DEFAULT_VHOST).addCallback(check)

    def monitor_check(self, request: Request) -> defer.Deferred:
        """Fires once C{request}'s user may read the monitoring answers
        (L{qmq.core.access.may_monitor}: an admin or one of
        C{http_api.monitors}); fails with a L{Problem} otherwise (401 for
        bad credentials, 403 for an identity without the right, which is
        not a failed login). The identity needs no virtual host."""
        if getattr(self.broker, "auth", None) is None:
            request.qmq_user = None
            return defer.succeed(None)

        def check(user: Any) -> None:
            request.qmq_user = user
            try:
                authorize_monitoring(user, self.settings.admins.split(), self.settings.monitors.split())
            except BrokerError as e:
                raise from_broker_error(e) from None

        return defer.maybeDeferred(self._login, request, DEFAULT_VHOST, False).addCallback(check)

    def finish_later(self, request: Request, d: defer.Deferred) -> Any:
        """Write what C{d} fires with (bytes), or the problem it fails with."""

        def ok(body: bytes) -> None:
            request.write(body)
            request.finish()

        d.addCallbacks(ok, lambda f: self._write_later(request, self._problem(f.value)))
        return NOT_DONE_YET

    def _is_admin(self, request: Request) -> bool:
        user = getattr(request, "qmq_user", None)
        # By the identity's account, never the bare name: a token's subject
        # "admin" is not the configured user admin (qmq.auth.User.is_admin).
        return user is None or user.is_admin(self.settings.admins.split())

    def _require_admin(self, request: Request) -> None:
        if not self._is_admin(request):
            raise Problem(403, "access-refused", "Only the users named in http_api.admins may do this.")

    def _management(self, request: Request, vhost: str) -> Management:
        """The core's management operations for the request's identity in
        C{vhost}: every access check of the queue, exchange and binding
        endpoints is made there (L{qmq.core.management}), not here.
        @raise Problem: 404, no such virtual host."""
        return Management(self._vhost(vhost), getattr(request, "qmq_user", None), self._owner(request))

    def _listed(self, request: Request, mgmt: Management, queue: str) -> bool:
        """Whether a listing shows queue C{queue}: the identity may read it
        (L{Management.may_read_queue}); an admin also sees other users'
        durable subscriptions, if its permissions allow reading them."""
        return mgmt.may_read_queue(queue, see_all=self._is_admin(request))

    @staticmethod
    def _owner(request: Request) -> Any:
        """Who the request's client is for what it owns (the owner name of its channel)."""
        user = getattr(request, "qmq_user", None)
        return user.owner if user is not None else "http"

    def _own(self, request: Request, vhost: str, queue: str) -> None:
        """Receiving from a queue and settling its deliveries: the core's
        L{Management.check_owner} (a durable subscription's queue is its
        owner's alone), asked before a receiver is looked up, so the answer
        is a 403 rather than unknown handles."""
        self._management(request, vhost).check_owner(queue, "read")

    def _fe(self, request: Request, vhost: str) -> Any:
        return self.frontend.vhost(vhost, getattr(request, "qmq_user", None))

    def _node(self) -> str:
        """The node id every message name starts with (L{qmq.core.ids})."""
        return self.broker.message_ids.node

    def _match(self, method: str, segments: list[str]) -> tuple[Any, dict[str, str]]:
        candidates = self._by_shape.get((len(segments), segments[1] if len(segments) > 1 else ""), ())
        allowed = []
        for verb, pattern, name in candidates:
            params = {}
            for want, got in zip(pattern, segments, strict=True):
                if want[0] == "{":
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                if verb == method:
                    return getattr(self, "h_" + name), params
                allowed.append(verb)
        if allowed:
            raise Problem(
                405,
                "method-not-allowed",
                f"{method} is not allowed here; use {', '.join(allowed)}.",
                headers={"Allow": ", ".join(allowed)},
            )
        raise Problem(404, "no-such-endpoint", "No API endpoint has this path; see /api/v1/openapi.json.")

    def _problem(self, e: BaseException) -> Problem:
        if isinstance(e, Problem):
            return e
        if isinstance(e, BrokerError):
            return from_broker_error(e)
        log.failure("unexpected error in the HTTP API", Failure(e))
        return Problem(500, "internal-error", "The broker failed to answer this request; see its log.")

    def _write(self, request: Request, result: Response | Problem) -> bytes:
        if isinstance(result, Problem):
            return result.render(request)
        request.setResponseCode(result.status)
        request.setHeader(b"content-type", result.content_type.encode())
        for k, v in result.headers.items():
            request.setHeader(k.encode(), v.encode())
        if request.startedWriting:  # pragma: no cover - a streamed response
            return b""
        if result.status == 204:
            return b""
        return result.body

    def _write_later(self, request: Request, result: Response | Problem) -> None:
        body = self._write(request, result)
        # With its length known, twisted.web sends the body as is, not in
        # chunks (as it does for anything written after render returned).
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()

    def _cors(self, request: Request) -> None:
        if not self.origins:
            return
        origin = request.getHeader("origin")
        if origin is None:
            return
        if "*" in self.origins:
            request.setHeader(b"access-control-allow-origin", b"*")
        elif origin in self.origins:
            request.setHeader(b"access-control-allow-origin", origin.encode())
            request.setHeader(b"vary", b"Origin")
        else:
            return
        request.setHeader(b"access-control-expose-headers", b"Retry-After, Allow")

    def _options(self, request: Request, segments: list[str]) -> bytes:
        verbs = sorted(
            {verb for verb, pattern, _ in self.routes if len(pattern) == len(segments)
             and all(p[0] == "{" or p == s for p, s in zip(pattern, segments, strict=True))}
        )
        if not verbs:
            return self._write(request, Problem(404, "no-such-endpoint", "No API endpoint has this path."))
        allow = ", ".join([*verbs, "OPTIONS"])
        request.setHeader(b"allow", allow.encode())
        if request.getHeader("origin") is not None and self.origins and request.getHeader(
            "access-control-request-method"
        ):
            request.setHeader(b"access-control-allow-methods", allow.encode())
            request.setHeader(b"access-control-allow-headers", b"Content-Type, Accept, Authorization")
            request.setHeader(b"access-control-max-age", b"600")
        request.setResponseCode(204)
        return b""

    # -- documents ------------------------------------------------------------------

    def h_index(self, request: Request) -> Response:
        return json_response(
            {
                "version": API_VERSION,
                "openapi": "/api/v1/openapi.json",
                "schemas": "/api/v1/schemas",
                "vhosts": "/api/v1/vhosts",
            }
        )

    def h_openapi(self, request: Request) -> Response:
        if self._openapi is None:
            from qmq.web.api.openapi import document  # noqa: PLC0415

            self._openapi = json.dumps(document(self.settings)).encode()
        return Response(200, self._openapi, JSON)

    def h_schemas(self, request: Request) -> Response:
        return json_response({"schemas": [f"{n}.avsc" for n in SCHEMA_NAMES]})

    def h_schema(self, request: Request, schema: str) -> Response:
        name = schema[:-5] if schema.endswith(".avsc") else schema
        if name not in SCHEMA_NAMES:
            raise Problem(404, "not-found", f"No schema {schema!r}; there are {', '.join(SCHEMA_NAMES)}.")
        return Response(200, codec.schema_text(name).encode(), JSON)

    # -- virtual hosts --------------------------------------------------------------

    def _vhost(self, name: str) -> Any:
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise Problem(404, "unknown-vhost", f"No virtual host {name!r}.")
        return vhost

    def _vhost_doc(self, vhost: Any) -> dict:
        return {"name": vhost.name, "queues": len(vhost.queues), "exchanges": len(vhost.exchanges)}

    def h_list_vhosts(self, request: Request) -> Response:
        user = request.qmq_user
        vhosts = [v for v in self.broker.vhosts.values()
                  if user is None or self._is_admin(request) or user.may_use(v.name)]
        return json_response({"vhosts": [self._vhost_doc(v) for v in vhosts]})

    def h_get_vhost(self, request: Request, vhost: str) -> Response:
        return json_response(self._vhost_doc(self._vhost(vhost)))

    # -- publishing ---------------------------------------------------------------------

    def _outgoing(self, request: Request) -> tuple[list[codec.Outgoing], bool]:
        kind = _content_type(request)
        data = request.content.read() if request.content is not None else b""
        s = self.settings
        if kind in AVRO_TYPES:
            return codec.parse_avro(data, s.max_batch)
        if kind == JSON or kind.endswith("+json"):
            return codec.parse_json(data, s.max_batch)
        raise Problem(
            415, "unsupported-media-type", f"Publish with Content-Type {JSON} or {AVRO}, not {kind!r}."
        )

    def _publish(self, request: Request, vhost: str, destination: Any, path_names: str) -> Any:
        fe = self._fe(request, vhost)
        messages, _ = self._outgoing(request)
        if path_names:
            for i, m in enumerate(messages):
                if m.__class__ is not bytes and m.destination is not None:
                    raise bad_request(f"message {i}: the path names the {path_names}; drop 'destination'")
        if path_names == "exchange":
            destination = destination(messages)
        ids, waits = fe.publish(messages, destination)
        self.published += len(messages)
        body = codec.published_json(self._node(), ids, len(waits))
        if not waits:
            return Response(201, body, JSON)
        d = defer.gatherResults(waits, consumeErrors=True)

        def stored(_: Any) -> Response:
            return Response(201, body, JSON)

        def failed(f: Any) -> Problem:
            # Not "published": the answer promises nothing about them.
            if isinstance(f.value, defer.FirstError):
                f = f.value.subFailure
            return Problem(
                503,
                "not-stored",
                "The broker could not store the messages ("
                f"{f.value.__class__.__name__}: {f.getErrorMessage()}); they are not accepted, "
                "publish them again later.",
                {"stored": 0},
                {"Retry-After": str(RETRY_AFTER)},
            )

        return d.addCallbacks(stored, failed)

    def h_publish_any(self, request: Request, vhost: str) -> Any:
        def destination(m: codec.Parsed) -> str:
            if m.__class__ is bytes or m.destination is None:  # type: ignore[union-attr]
                raise bad_request("every message needs a 'destination' (/queue/NAME, /topic/KEY, /exchange/NAME/KEY)")
            return m.destination  # type: ignore[union-attr,return-value]

        return self._publish(request, vhost, destination, "")

    def h_publish_queue(self, request: Request, vhost: str, queue: str) -> Any:
        return self._publish(request, vhost, "/queue/" + queue, "queue")

    def h_publish_topic(self, request: Request, vhost: str, topic: str) -> Any:
        return self._publish(request, vhost, "/topic/" + topic, "topic")

    def h_publish_exchange(self, request: Request, vhost: str, exchange: str) -> Any:
        if not exchange:
            raise bad_request("an exchange needs a name (the default exchange is the queue endpoint)")
        # A '/' would split the destination below at the wrong place.
        check_exchange(exchange)
        prefix = f"/exchange/{exchange}/"

        def destination(messages: list[codec.Parsed]) -> Any:
            if not any(m.__class__ is not bytes and m.routing_key for m in messages):
                return prefix  # one destination for the batch: resolved once
            return lambda m: prefix + (m.__class__ is not bytes and m.routing_key or "")

        return self._publish(request, vhost, destination, "exchange")

    # -- receiving -------------------------------------------------------------------

    def h_receive(self, request: Request, vhost: str, queue: str) -> Any:
        s = self.settings
        want = _int_arg(request, "max", 1, 1, s.max_batch)
        wait = _float_arg(request, "wait", 0.0, 0.0, s.max_wait)
        visibility = _float_arg(request, "visibility", s.default_visibility, 0.001, s.max_visibility)
        force64 = _encoding_arg(request)
        avro = codec.wants_avro(request.getHeader("accept"))
        self._own(request, vhost, queue)
        fe = self._fe(request, vhost)
        poller = fe.poller(queue)
        if isinstance(poller, defer.Deferred):
            # A queue homed on another node, asked there first.
            return poller.addCallback(self._receive, request, want, wait, visibility, force64, avro)
        return self._receive(poller, request, want, wait, visibility, force64, avro)

    def _receive(
        self, poller: Any, request: Request, want: int, wait: float, visibility: float, force64: bool, avro: bool
    ) -> Any:
        waiter = poller.receive(want, wait, visibility)
        token = poller.token

        def answer(got: list) -> Response:
            self.delivered += len(got)
            if avro:
                body = codec.avro_deliveries([(m, f"{token}.{tag}", None) for tag, m in got], self._node())
                return Response(200, body, AVRO)
            return json_response(
                {
                    "messages": codec.json_deliveries(got, token, force64, self._node()),
                    "visibility": visibility,
                }
            )

        if waiter.deferred.called:
            return waiter.deferred.addCallback(answer)
        request.notifyFinish().addErrback(lambda _: poller.forget(waiter))
        return waiter.deferred.addCallback(answer)

    def _settle_body(self, request: Request, fields: dict) -> tuple[dict, list[str]]:
        doc = _object_body(request, {"handles": (list,), **fields}, ("handles",))
        return doc, _handles(doc, self.settings.max_batch)

    def _tags(self, poller: Any, handles: list[str]) -> tuple[list[int], list[str]]:
        tags: list[int] = []
        unknown: list[str] = []
        append = tags.append
        prefix = poller.token + "." if poller is not None else "\x00"
        start = len(prefix)
        for h in handles:
            # The common handle, this receiver's TOKEN.TAG, without a call.
            if h.__class__ is str and h.startswith(prefix):
                tag = h[start:]
                if tag.isascii() and tag.isdigit() and len(tag) < 19:
                    append(int(tag))
                    continue
            parsed = parse_handle(h)
            if parsed is None:
                raise bad_request(f"{str(h)[:80]!r} is not a receipt handle", "bad-handle")
            if poller is None or parsed[0] != poller.token:
                unknown.append(h)
            else:
                tags.append(parsed[1])
        return tags, unknown

    def _settle(
        self,
        request: Request,
        vhost: str,
        queue: str,
        handles: list[str],
        ack: bool,
        requeue: bool,
        visibility: float | None = None,
    ) -> Any:
        """Ack, nack or (with C{visibility}) extend C{handles}: those of this
        API's receiver of C{queue} at once; the others where their receiver
        is (another listener, another node: L{VHostFrontend.settle_elsewhere})."""
        self._own(request, vhost, queue)
        fe = self._fe(request, vhost)
        poller = fe.find_poller(queue)
        tags, unknown = self._tags(poller, handles)
        if tags:
            if visibility is not None:
                missed = set(poller.extend(tags, visibility))
            else:
                missed = set(poller.settle(tags, ack, requeue))
            if missed:
                token = poller.token
                unknown.extend(f"{token}.{t}" for t in tags if t in missed)
        if unknown:
            still = fe.settle_elsewhere(queue, unknown, ack, requeue, visibility)
            if isinstance(still, defer.Deferred):
                return still.addCallback(self._settled, handles, ack and visibility is None)
            unknown = still
        return self._settled(unknown, handles, ack and visibility is None)

    def _settled(self, unknown: list[str], handles: list[str], acked: bool) -> Response:
        done = len(handles) - len(unknown)
        if acked:
            self.acked += done
        return json_response({"settled": done, "unknown": unknown})

    def h_ack(self, request: Request, vhost: str, queue: str) -> Any:
        _, handles = self._settle_body(request, {})
        return self._settle(request, vhost, queue, handles, True, True)

    def h_nack(self, request: Request, vhost: str, queue: str) -> Any:
        doc, handles = self._settle_body(request, {"requeue": (bool,)})
        return self._settle(request, vhost, queue, handles, False, doc.get("requeue", True))

    def h_extend(self, request: Request, vhost: str, queue: str) -> Any:
        doc, handles = self._settle_body(request, {"visibility": (int, float)})
        visibility = doc.get("visibility", self.settings.default_visibility)
        # The bounds of receive's visibility parameter.
        if not (math.isfinite(visibility) and 0.001 <= visibility <= self.settings.max_visibility):
            raise bad_request(f"'visibility' must be from 0.001 to {self.settings.max_visibility:g}")
        return self._settle(request, vhost, queue, handles, False, False, float(visibility))

    # -- range scans ------------------------------------------------------------------

    def h_scan(self, request: Request, vhost: str, queue: str) -> Any:
        from qmq.core.vhost import MAX_SCAN_LIMIT  # noqa: PLC0415

        mgmt = self._management(request, vhost)
        start = _float_arg(request, "start", 0.0, 0.0, 1e11)
        end = _float_arg(request, "end", 1e11, 0.0, 1e11)
        # [start, end) with end before start is an empty range, as when they are equal.
        end = max(start, end)
        limit = _int_arg(request, "limit", 100, 1, MAX_SCAN_LIMIT)
        cursor = _arg(request, "cursor")
        force64 = _encoding_arg(request)
        avro = codec.wants_avro(request.getHeader("accept"))
        def problem(e: BrokerError) -> Problem:
            problem = from_broker_error(e)
            if problem.status == 409:
                # A bad cursor or a queue with no log: the request's fault.
                problem = Problem(400, "cannot-scan" if cursor is None or "cursor" not in e.message
                                  else "bad-cursor", e.message)
            return problem

        def refused(failure: Failure) -> Any:
            # Refused by the queue's home node: as if refused here.
            failure.trap(BrokerError)
            raise problem(failure.value)

        try:
            d = mgmt.scan(queue, start, end, cursor, limit)
        except BrokerError as e:
            raise problem(e) from None

        def page(p: Any) -> Response:
            node = p.node or self._node()  # the home's ids, from another node
            if avro:
                body = codec.avro_deliveries([(m, None, None) for m in p.messages], node)
                headers = {"QMQ-Next-Cursor": p.next_cursor} if p.next_cursor else {}
                return Response(200, body, AVRO, headers)
            return json_response(
                {
                    "messages": [codec.json_delivery(m, None, None, force64, node) for m in p.messages],
                    "next_cursor": p.next_cursor,
                }
            )

        return d.addCallbacks(page, refused)

    # -- following topics ------------------------------------------------------------------

    def _follower_room(self) -> None:
        if len(self.followers) + len(self.streams) >= self.settings.max_followers:
            raise Problem(
                429,
                "too-many-followers",
                f"{self.settings.max_followers} topic followers are open (http_api.max_followers).",
                headers={"Retry-After": "5"},
            )

    def h_topic_events(self, request: Request, vhost: str, topic: str) -> Any:
        fe = self._fe(request, vhost)
        self._follower_room()
        follower = SseFollower(request, self.settings.follow_backlog, self.clock, self._node())
        try:
            fe.channel.subscribe(follower, "/topic/" + topic)
        except BrokerError as e:
            raise from_broker_error(e) from None
        self.streams.add(follower)
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-accel-buffering", b"no")
        request.registerProducer(_SseProducer(follower), True)
        request.write(b"retry: 3000\n: following /topic/%s\n\n" % topic.encode())
        keepalive = self.settings.sse_keepalive

        def ping() -> None:
            if follower.open:
                request.write(b": keep-alive\n\n")
                follower.keepalive = self.clock.callLater(keepalive, ping)

        follower.keepalive = self.clock.callLater(keepalive, ping)

        def gone(_: Any) -> None:
            self.streams.discard(follower)
            fe.channel.unsubscribe(follower)
            follower.open = False
            if follower.keepalive is not None and follower.keepalive.active():
                follower.keepalive.cancel()

        request.notifyFinish().addBoth(gone)
        return defer.Deferred()  # never fires: the stream ends when the client goes

    def _parse_cursor(self, text: str, fe: Any, topic: str) -> tuple[CursorFollower, int]:
        fid, _, seq = text.rpartition(".")
        if not fid or not seq.isdigit() or len(seq) > 19:
            raise bad_request(f"{text[:80]!r} is not a cursor", "bad-cursor")
        follower = self.followers.get(fid)
        if follower is None or follower.fe is not fe or follower.topic != topic:
            raise Problem(
                410,
                "cursor-expired",
                "This cursor's follower is gone (not polled within http_api.follow_idle_timeout, "
                "or the broker restarted); poll without a cursor to follow again.",
            )
        return follower, int(seq)

    def _idle(self, follower: CursorFollower) -> None:
        if follower.idle is not None and follower.idle.active():
            follower.idle.cancel()
        follower.idle = self.clock.callLater(self.settings.follow_idle_timeout, self._drop_follower, follower)

    def _drop_follower(self, follower: CursorFollower) -> None:
        idle, follower.idle = follower.idle, None
        if idle is not None and idle.active():
            idle.cancel()
        if self.followers.get(follower.fid) is follower:
            del self.followers[follower.fid]
        follower.fe.channel.unsubscribe(follower)
        follower.cancelled()

    def h_topic_poll(self, request: Request, vhost: str, topic: str) -> Any:
        s = self.settings
        want = _int_arg(request, "max", 100, 1, s.max_batch)
        wait = _float_arg(request, "wait", 0.0, 0.0, s.max_wait)
        force64 = _encoding_arg(request)
        cursor = _arg(request, "cursor")
        avro = codec.wants_avro(request.getHeader("accept"))
        fe = self._fe(request, vhost)
        if cursor is None:
            self._follower_room()
            follower = CursorFollower(fe, topic, s.follow_backlog)
            try:
                fe.channel.subscribe(follower, "/topic/" + topic)
            except BrokerError as e:
                raise from_broker_error(e) from None
            self.followers[follower.fid] = follower
            after = 0
        else:
            follower, after = self._parse_cursor(cursor, fe, topic)
        self._idle(follower)
        node = self._node()

        def answer(got: list) -> Response:
            last = got[-1][0] if got else max(after, follower.kept[0][0] - 1 if follower.kept else follower.seq)
            dropped, follower.dropped = follower.dropped, 0
            cursor_out = f"{follower.fid}.{last}"
            if avro:
                body = codec.avro_deliveries([(m, None, seq) for seq, m in got], node)
                return Response(200, body, AVRO, {"QMQ-Cursor": cursor_out, "QMQ-Dropped": str(dropped)})
            return json_response(
                {
                    "messages": [codec.json_delivery(m, None, seq, force64, node) for seq, m in got],
                    "cursor": cursor_out,
                    "dropped": dropped,
                }
            )

        got = follower.take(after, want)
        if got or wait <= 0:
            return answer(got)
        return follower.wait(want, wait).addCallback(answer)

    # -- lists ----------------------------------------------------------------------

    def _page(self, request: Request, items: Any, total: int) -> tuple[list, dict]:
        limit = _int_arg(request, "limit", min(1000, self.settings.max_list), 1, self.settings.max_list)
        offset = _int_arg(request, "offset", 0, 0, 1 << 62)
        page = list(islice(items, offset, offset + limit))
        more = offset + len(page) < total
        return page, {"total": total, "offset": offset, "next_offset": offset + len(page) if more else None}

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Give back everything the API holds (the service is stopping)."""
        for follower in list(self.followers.values()):
            self._drop_follower(follower)
        for stream in list(self.streams):
            stream.close()
        self.frontend.close()


