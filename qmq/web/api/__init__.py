# -*- test-case-name: tests.test_web_api -*-
"""QMQ's HTTP API: JSON and Avro over HTTP, mounted at C{/api} on the web site.

  - L{api_resource}: the C{/api} resource (version 1 under C{/api/v1/}),
    built from the site's context (broker, reactor, settings, connection
    registry, portal);
  - L{limited_request}: the request class the site uses so that bodies are
    capped and uploads have a deadline (C{[http_api]} settings);
  - L{ApiSettings}: the C{[http_api]} table.

docs/http-api.rst is the user's guide; C{/api/v1/openapi.json} the reference.
"""

from __future__ import annotations

from typing import Any

from qmq.web.api.request import LimitedRequest, limited_request
from qmq.web.api.resource import ApiResource
from qmq.web.api.settings import ApiSettings


def api_settings(ctx: Any) -> ApiSettings:
    """The C{[http_api]} settings of a site context (defaults without settings)."""
    settings = getattr(ctx, "settings", None)
    if settings is None:
        return ApiSettings()
    return settings.section("http_api")


def api_resource(ctx: Any) -> ApiResource:
    """The C{/api} resource for the site whose context is C{ctx}."""
    return ApiResource(ctx, api_settings(ctx))


def request_factory(ctx: Any) -> type[LimitedRequest]:
    """The site's request class, with the C{[http_api]} body cap and upload deadline."""
    s = api_settings(ctx)
    clock = getattr(ctx, "clock", None) or getattr(ctx, "reactor", None)
    return limited_request(s.max_body_size, s.upload_timeout, clock)


__all__ = ["ApiResource", "ApiSettings", "LimitedRequest", "api_resource", "api_settings", "request_factory"]
