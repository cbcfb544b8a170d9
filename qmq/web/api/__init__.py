# -*- test-case-name: tests.test_web_api -*-
"""QMQ's HTTP API: JSON and Avro over HTTP, mounted at C{/api} on the web site.

  - L{api_resource}: the C{/api} resource (version 1 under C{/api/v1/}),
    built from the site's context (broker, reactor, settings, connection
    registry, portal);
  - L{ApiSettings}: the C{[http_api]} table.

docs/http-api.rst is the user's guide; C{/api/v1/openapi.json} the reference.
"""

from __future__ import annotations

from typing import Any

from qmq.web.api.resource import ApiResource, is_publish
from qmq.web.api.settings import ApiSettings


def api_settings(ctx: Any) -> ApiSettings:
    """The C{[http_api]} settings of a site context (defaults without settings)."""
    settings = getattr(ctx, "settings", None)
    if settings is None:
        return ApiSettings()
    return settings.section("http_api")


def api_resource(ctx: Any) -> ApiResource:
    """The C{/api} resource for the site whose context is C{ctx} (kept as
    C{ctx.api} too, where C{/metrics} finds its counters)."""
    resource = ApiResource(ctx, api_settings(ctx))
    try:
        ctx.api = resource
    except AttributeError:  # pragma: no cover - a frozen or slotted context
        pass
    on_stop = getattr(ctx, "on_stop", None)
    if on_stop is not None:
        # The listener stops: waiting receives are answered, what they
        # held goes back to its queues, followers and timers end.
        on_stop.append(resource.close)
    return resource


__all__ = ["ApiResource", "ApiSettings", "api_resource", "api_settings", "is_publish"]
