"""Helpers of the HTTP API tests: a real broker site on 127.0.0.1, a treq
client, and a check of every response against the OpenAPI document."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import jsonschema_rs
import treq
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool

from qmq.core.broker import Broker
from qmq.web.api import ApiResource
from qmq.web.api.openapi import document
from qmq.web.api.settings import ApiSettings

DOC = document()
_VALIDATORS: dict[tuple[str, str, str, str], Any] = {}


@dataclass
class Ctx:
    """A stand-in for the site's WebContext."""

    broker: Any
    clock: Any
    settings: Any = None
    connections: Any = None
    portal: Any = None
    extra: dict = field(default_factory=dict)


def _template(path: str) -> str:
    """The OpenAPI path template a concrete /api/... path matches."""
    parts = [p for p in path.split("/")[2:]]
    if parts and parts[-1] == "":
        parts.pop()
    for _, pattern, _ in ApiResource.routes:
        if len(pattern) == len(parts) and all(a[0] == "{" or a == b for a, b in zip(pattern, parts, strict=False)):
            return "/api/" + "/".join(pattern)
    raise AssertionError(f"no route for {path}")


def validate(method: str, url: str, status: int, content_type: str, body: bytes) -> None:
    """Fail unless the response is one the OpenAPI document describes."""
    template = _template(urlsplit(url).path)
    op = DOC["paths"][template].get(method.lower())
    if op is None:
        assert status == 405, f"{method} {template} answered {status}, not 405"
        op = next(iter(DOC["paths"][template].values()))
    responses = op["responses"]
    assert str(status) in responses, f"{method} {template}: status {status} is not documented"
    kind = content_type.split(";")[0].strip()
    content = responses[str(status)].get("content")
    if content is None:
        assert not body, f"{method} {template} {status}: a body where none is documented"
        return
    assert kind in content, f"{method} {template} {status}: {kind} not documented ({list(content)})"
    if kind.endswith("json"):
        key = (template, method, str(status), kind)
        validator = _VALIDATORS.get(key)
        if validator is None:
            schema = dict(content[kind]["schema"])
            schema["components"] = DOC["components"]
            validator = _VALIDATORS[key] = jsonschema_rs.Draft202012Validator(schema)
        doc = json.loads(body)
        errors = [str(e) for e in validator.iter_errors(doc)]
        assert not errors, f"{method} {template} {status}: {errors[:3]} in {body[:300]!r}"


@defer.inlineCallbacks
def until(condition: Any, what: str = "condition") -> Any:
    """Wait (up to 5 s, in 10 ms steps) until C{condition()} is true."""
    for _ in range(500):
        if condition():
            return
        yield deferLater(reactor, 0.01, lambda: None)
    raise AssertionError(f"timed out waiting for {what}")


def vh(name: str = "/") -> str:
    return quote(name, safe="")


class ApiSiteMixin:
    """Starts a broker's http: listener (the real site, with the API at
    /api) on 127.0.0.1 (call C{start_site} in setUp)."""

    def start_site(self, settings: ApiSettings | None = None, broker: Broker | None = None,
                   toml: str = "", ctx_extra: dict | None = None) -> ApiResource:
        from qmq import config  # noqa: PLC0415
        from qmq.connections import ConnectionRegistry  # noqa: PLC0415
        from qmq.web.site import HttpFactory, WebContext  # noqa: PLC0415

        self.broker = broker if broker is not None else Broker(reactor)
        app = config.load_string(toml)
        self.api_settings = settings or app.section("http_api")
        self.ctx = WebContext(self.broker, reactor, app, ConnectionRegistry(app.connections, reactor), "http:test")
        self.factory = HttpFactory(self.ctx)
        self.api = self.factory.site.resource.children[b"api"]
        self.api.settings = self.api.frontend.settings = self.api_settings
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.base = f"http://127.0.0.1:{self.port.getHost().port}"
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.addCleanup(self._stop_site)
        return self.api

    @defer.inlineCallbacks
    def _stop_site(self) -> Any:
        self.api.close()
        # The service closes the broker, which stops the core's timers (a
        # message TTL or delay arms its queue's); here the test does.
        self.broker.stop_timers()
        yield self.pool.closeCachedConnections()
        yield self.port.stopListening()
        # Let closed client connections finish on the server side.
        yield deferLater(reactor, 0, lambda: None)

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None,
             raw: bytes | None = None, check: bool = True) -> Any:
        """Make a request; return (status, headers, body bytes, parsed JSON or None)."""
        url = self.base + path
        hdrs = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        response = yield treq.request(method, url, data=data, headers=hdrs, pool=self.pool, timeout=10)
        content = yield response.content()
        kind = (response.headers.getRawHeaders("content-type") or [""])[0]
        if check:
            validate(method, url, response.code, kind, content)
        parsed = json.loads(content) if "json" in kind and content else None
        return response.code, response.headers, content, parsed
