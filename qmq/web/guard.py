# -*- test-case-name: tests.test_web_guard -*-
"""The gate every request to an C{http:} listener passes first.

A browser visiting any web site will send requests to the broker on that
site's behalf: an HTML form posts to any URL, C{fetch()} in C{no-cors} mode
and C{navigator.sendBeacon} do the same without a form, and a name the site
controls can be made to resolve to 127.0.0.1 (DNS rebinding), after which
the page talks to the broker as if it were its own origin. The broker's
answer to all three is one L{Guard}, asked by the site
(L{qmq.web.site.QMQSite.getResourceFor}) about every request before any
resource sees it: before authentication, before a WebSocket upgrade, before
SockJS. Its checks, in order:

  1. B{Host} (DNS rebinding). The request's C{Host} must name this broker:
     an IP address (an address cannot be rebound), C{localhost} or a name
     under C{.localhost} (browsers resolve those to loopback themselves),
     the machine's host name, the listener's C{interface} when it is a
     name, or a name in C{[web] allowed_hosts} (C{"*"}: any). Another name
     is answered C{421 Misdirected Request}; a missing C{Host} (in
     HTTP/1.1), several, or a malformed one C{400}.
  2. B{Origin}. A request that carries an C{Origin} (every browser sends
     one with every request that is not a C{GET} or C{HEAD}, and with
     WebSocket handshakes and CORS requests) must come from the broker's own
     origin (the scheme of the connection and the C{Host}, which step 1
     vouched for) or from an origin in C{[web] allowed_origins} or
     C{[http_api] cors_origins}; else C{403}. C{Origin: null} (a sandboxed
     frame, a C{data:} page) is a foreign origin. Requests without an
     C{Origin} (not from a browser) are not checked.
  3. B{Body} (what a form can send). A state-changing request (any method
     but C{GET}, C{HEAD} and C{OPTIONS}) carries a JSON body
     (C{application/json} or C{*/*+json}), an Avro one (the API's Avro
     types), or no body and no C{Content-Type} at all; else C{415}. A form
     can only send C{application/x-www-form-urlencoded},
     C{multipart/form-data} or C{text/plain}, and C{no-cors} requests only
     those or none, so no cross-site page can make a state-changing request
     this lets through without a CORS preflight, which the broker answers
     only for the origins of step 2. Only the SockJS transports whose
     protocol posts form-like bodies (L{SOCKJS_FORM_TRANSPORTS}) are exempt
     from this step, not from the others.

The rules are pure functions of the request's method, path and headers
(L{Guard.check}); L{Guard.check_request} reads them off a C{twisted.web}
request. A refusal is an RFC 9457 problem document (L{Refusal}).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from twisted.web.resource import Resource

from qmq.twisted_internals import header_table
from qmq.web.api.problem import Problem

__all__ = [
    "BODY_TYPES",
    "SOCKJS_FORM_TRANSPORTS",
    "Guard",
    "HostRule",
    "Refusal",
    "check_host_pattern",
    "host_name",
    "origin_allowed",
    "split_hosts",
]

#: Methods that change nothing (RFC 9110's safe methods, and the CORS
#: preflight): only steps 1 and 2 apply to them.
SAFE_METHODS = frozenset((b"GET", b"HEAD", b"OPTIONS"))

#: The media types a state-changing request's body may have besides
#: C{*/*+json}: JSON and the HTTP API's Avro types (L{qmq.web.api.codec}).
BODY_TYPES = frozenset(("application/json", "avro/binary", "application/avro", "application/x-avro-binary"))

#: C{Content-Type} values as clients send them most, accepted unparsed.
_COMMON_TYPES = frozenset((b"application/json", b"application/json; charset=utf-8", b"avro/binary"))

#: The mounts that serve SockJS, and the transports of a session
#: (C{/MOUNT/.../SERVER/SESSION/TRANSPORT}) whose requests the SockJS
#: protocol makes form-like: C{xhr} and C{xhr_streaming} post an empty body
#: (sockjs-client sends no type, some clients C{text/plain}), C{xhr_send}
#: posts its JSON as C{text/plain} (a type that needs no CORS preflight, on
#: purpose) and C{jsonp_send} a form (C{d=...}, from a hidden form in the
#: page). Their protection is the Origin check (step 2) and the session:
#: an id the client chose at random, bound to its login
#: (docs/security.rst, "Browsers").
SOCKJS_MOUNTS = frozenset((b"sockjs", b"sockjs_test"))
SOCKJS_FORM_TRANSPORTS = frozenset((b"xhr", b"xhr_streaming", b"xhr_send", b"jsonp_send"))
#: The mount of the SockJS protocol's test services (C{[sockjs]
#: test_services}, for the protocol's own test suite, which sends foreign
#: and C{null} origins): echo services that reach no queue, exempt from
#: the Origin check.
SOCKJS_TEST_MOUNT = b"sockjs_test"

#: Names browsers resolve to loopback without asking DNS (RFC 6761), so no
#: other site can own them.
LOOPBACK_NAMES = ("localhost", "*.localhost")

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*\.?")


@dataclass(frozen=True)
class Refusal:
    """Why the gate refuses a request: a status and a problem document.

    @ivar status: the HTTP status (400, 403, 415, 421).
    @ivar code: the document's C{code} (C{host-not-allowed}, ...).
    @ivar detail: what was wrong and what to do about it.
    """

    status: int
    code: str
    detail: str

    def problem(self) -> Problem:
        """The refusal as the API's problem (one format for every error)."""
        return Problem(self.status, self.code, self.detail)

    def document(self) -> dict[str, Any]:
        """The RFC 9457 problem document."""
        return self.problem().document()

    def body(self) -> bytes:
        return self.problem().body()

    def resource(self) -> Resource:
        """A leaf resource that answers every request with this refusal."""
        return _RefusalResource(self)


class _RefusalResource(Resource):
    isLeaf = True
    answers_every_method = True  # qmq.web.site.QMQRequest.render: no 405 to make

    def __init__(self, refusal: Refusal) -> None:
        super().__init__()
        self.refusal = refusal

    def render(self, request: Any) -> bytes:
        return self.refusal.problem().render(request)


# -- Host -------------------------------------------------------------------------


def split_hosts(value: str) -> tuple[str, ...]:
    """The entries of an C{allowed_hosts} value (whitespace- or
    comma-separated), lower-cased, in order."""
    return tuple(part.lower() for part in value.replace(",", " ").split() if part)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def check_host_pattern(entry: str) -> str:
    """Check one C{allowed_hosts} entry: C{*}, a host name, C{*.} and a
    domain (every name under it), or an IP address.

    @return: the entry.
    @raise ValueError: it is none of these (a URL, a port...).
    """
    if entry == "*" or _ip(entry) is not None or _NAME.fullmatch(entry):
        return entry
    raise ValueError(
        "expected host names such as \"broker.example.com\", \"*.example.com\" or \"*\" "
        f"(no scheme, no port), got {entry!r}"
    )


def host_name(value: str) -> str | None:
    """The host of a C{Host} header value, without its port, lower-cased,
    without a final dot; or L{None} if it is not a valid C{Host}.

    >>> host_name("LocalHost:8080"), host_name("[::1]:15674"), host_name("a b")
    ('localhost', '[::1]', None)
    """
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end == -1 or _ip(value[: end + 1]) is None:
            return None
        host, rest = value[: end + 1], value[end + 1 :]
    else:
        host, sep, rest = value.partition(":")
        rest = sep + rest
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6):
        return None
    if host.startswith("["):
        return host
    if _ip(host) is None and not (_NAME.fullmatch(host) and not host.startswith("*")):
        return None
    return host[:-1] if host.endswith(".") else host


class HostRule:
    """Which C{Host} names a listener answers to (see the module docstring).

    @ivar any: C{"*"} is configured: every name.
    @ivar names: the exact names allowed.
    @ivar suffixes: the domains (C{".example.com"}) every name under which
        is allowed.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.any = False
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        for pattern in patterns:
            pattern = pattern.lower().rstrip(".")
            if pattern == "*":
                self.any = True
            elif pattern.startswith("*."):
                self.suffixes.append(pattern[1:])
            else:
                self.names.add(pattern)

    @classmethod
    def for_listener(cls, configured: Iterable[str], listener: str = "") -> HostRule:
        """The rule of one listener: the loopback names, the machine's host
        name, the listener's C{interface=} when it is a name, and the
        configured entries.

        @param configured: the C{[web] allowed_hosts} entries.
        @param listener: the listen spec (C{http:tcp:8080:interface=...}).
        """
        names = [*LOOPBACK_NAMES, *configured]
        try:
            names.append(socket.gethostname().lower())
        except OSError:  # pragma: no cover - a host without a name
            pass
        # Twisted keeps the parsed interface private; the spec says it too
        # (a name has no colons, so no escaping to undo).
        m = re.search(r"(?:^|:)interface=([^:\\]+)(?::|$)", listener)
        if m and _ip(m.group(1)) is None:
            names.append(m.group(1).lower())
        return cls(names)

    def allows(self, host: str) -> bool:
        """Whether C{host} (from L{host_name}) names this broker."""
        if self.any or host in self.names or host[0] == "[" or _ip(host) is not None:
            return True
        return any(host.endswith(suffix) for suffix in self.suffixes)


# -- Origin -----------------------------------------------------------------------


def _normal_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def origin_allowed(origin: str | None, host: str | None, secure: bool, patterns: Iterable[str]) -> bool:
    """May a page from C{origin} use this broker?

    @param origin: the request's C{Origin} header, or L{None} or C{""} (none:
        not a browser, allowed).
    @param host: the request's C{Host} header (the broker's own origin is
        always allowed).
    @param secure: whether the request came over TLS.
    @param patterns: the allowed origins (C{*}, C{?} wildcards).
    @return: whether it may.
    """
    if not origin:
        return True  # autobahn reports a missing header as ""
    origin = _normal_origin(origin)
    if host:
        own = ("https://" if secure else "http://") + host.strip().lower()
        if origin == own:
            return True
    for pattern in patterns:
        if pattern == "*" or fnmatch.fnmatchcase(origin, _normal_origin(pattern)):
            return True
    return False


# -- the gate ---------------------------------------------------------------------


def _mount(path: bytes) -> bytes:
    """The first segment of a path (C{b"api"} of C{/api/v1/...})."""
    segments = path.split(b"/", 2)
    return segments[1] if len(segments) > 1 else b""


def _media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().lower().decode("latin-1")


class Guard:
    """The checks of the module docstring, for one listener.

    @ivar hosts: the listener's L{HostRule}.
    @ivar origins: the trusted origin patterns besides the broker's own.
    """

    #: Most entries of each verdict cache: a listener sees few Host and
    #: Origin values, and a client that sends many only empties the cache.
    CACHE_SIZE = 256

    def __init__(self, hosts: HostRule, origins: Iterable[str] = ()) -> None:
        self.hosts = hosts
        self._origins = tuple(origins)
        # Parsing a Host (ipaddress, a regex) and matching an origin cost
        # tens of microseconds; a request costs a dictionary lookup.
        self._host_verdicts: dict[bytes, Refusal | str] = {}
        self._origin_verdicts: dict[tuple[bytes, str | None, bool], bool] = {}

    @property
    def origins(self) -> tuple[str, ...]:
        """The trusted origin patterns besides the broker's own."""
        return self._origins

    @origins.setter
    def origins(self, value: Iterable[str]) -> None:
        self._origins = tuple(value)
        self._origin_verdicts.clear()

    def _host(self, raw: bytes) -> Refusal | str:
        """The verdict on one C{Host} value: a refusal, or the host as given."""
        verdict = self._host_verdicts.get(raw)
        if verdict is not None:
            return verdict
        text = raw.decode("latin-1")
        name = host_name(text)
        if name is None:
            verdict = Refusal(400, "bad-host", f"The Host header {text[:100]!r} is not a host[:port].")
        elif not self.hosts.allows(name):
            verdict = Refusal(
                421, "host-not-allowed",
                f"This broker does not answer to the name {name[:100]!r}; its operator may add it to "
                "[web] allowed_hosts (a name that is not the broker's may be a DNS rebinding attack).",
            )
        else:
            verdict = text
        if len(self._host_verdicts) >= self.CACHE_SIZE:
            self._host_verdicts.clear()
        self._host_verdicts[raw] = verdict
        return verdict

    def _origin_allowed(self, raw: bytes, host: str | None, secure: bool) -> bool:
        key = (raw, host, secure)
        allowed = self._origin_verdicts.get(key)
        if allowed is None:
            allowed = origin_allowed(raw.decode("latin-1"), host, secure, self._origins)
            if len(self._origin_verdicts) >= self.CACHE_SIZE:
                self._origin_verdicts.clear()
            self._origin_verdicts[key] = allowed
        return allowed

    def check(
        self,
        method: bytes,
        path: bytes,
        headers: Any,
        body_size: int,
        secure: bool = False,
        version: bytes = b"HTTP/1.1",
    ) -> Refusal | None:
        """Whether a request may proceed.

        @param method: its method.
        @param path: its path (without the query).
        @param headers: its headers (C{twisted.web.http_headers.Headers}).
        @param body_size: the length of its body.
        @param secure: whether it came over TLS.
        @param version: its HTTP version.
        @return: L{None}, or why it is refused.
        """
        table = header_table(headers)
        get = table.get if table is not None else headers.getRawHeaders
        hosts = get(b"Host")
        if not hosts:
            host = None
            if version != b"HTTP/1.0":
                return Refusal(400, "missing-host", "An HTTP/1.1 request needs a Host header.")
        elif len(hosts) > 1:
            return Refusal(400, "bad-host", "The request has more than one Host header.")
        else:
            verdict = self._host(hosts[0])
            if verdict.__class__ is Refusal:
                return verdict  # type: ignore[return-value]
            host = verdict  # type: ignore[assignment]
        origins = get(b"Origin")
        if origins:
            if _mount(path) != SOCKJS_TEST_MOUNT and (
                len(origins) > 1 or not self._origin_allowed(origins[0], host, secure)
            ):
                origin = origins[-1].decode("latin-1")
                return Refusal(
                    403, "origin-not-allowed",
                    f"Pages from {origin[:100]} may not use this broker; its operator may add the origin to "
                    "[web] allowed_origins.",
                )
        if method in SAFE_METHODS:
            return None
        types = get(b"Content-Type") or None
        if types is not None and len(types) == 1:
            if types[0] in _COMMON_TYPES:
                return None
            kind = _media_type(types[0])
            if kind in BODY_TYPES or kind.endswith("+json"):
                return None
        if path.rsplit(b"/", 1)[-1] in SOCKJS_FORM_TRANSPORTS and _mount(path) in SOCKJS_MOUNTS:
            return None
        if types is None:
            if body_size:
                return Refusal(
                    415, "unsupported-media-type",
                    "A request body needs a Content-Type: application/json (or an Avro type for the API's "
                    "Avro endpoints).",
                )
            return None
        kind = _media_type(types[-1])
        return Refusal(
            415, "unsupported-media-type",
            f"{method.decode('latin-1')} takes a JSON body (application/json, or an Avro type for the "
            f"API's Avro endpoints) or none, not {kind[:60]!r}: what an HTML form sends is refused "
            "(docs/security.rst, Browsers).",
        )

    def check_request(self, request: Any) -> Refusal | None:
        """L{check} a C{twisted.web} request (its body already read)."""
        # The site's requests count their body as it comes
        # (L{qmq.web.site.QMQRequest.body_size}); another's is measured.
        size = getattr(request, "body_size", None)
        if size is None:
            size = 0
            content = request.content
            if content is not None:
                at = content.tell()
                size = content.seek(0, 2)
                content.seek(at)
        path = getattr(request, "path", None)
        if path is None:
            path = request.uri.split(b"?", 1)[0]
        return self.check(
            request.method,
            path,
            request.requestHeaders,
            size,
            request.isSecure(),
            getattr(request, "clientproto", b"HTTP/1.1"),
        )
