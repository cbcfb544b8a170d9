# -*- test-case-name: tests.test_web_api_definitions -*-
"""The HTTP API's definitions handlers: C{/api/v1/definitions}.

A thin adapter over L{qmq.core.definitions}: C{GET} exports the broker's
users, virtual hosts, permissions, exchanges, queues and bindings as one
JSON document; C{POST} imports such a document.  Both are an
administrator's (C{http_api.admins}); the permissions on each exchange and
queue are checked by the core (L{qmq.core.management.Management}).  The
core's errors become problems here: a document that is not definitions is
a 400 C{bad-definitions}, an item that disagrees with the broker a 409
C{definitions-conflict}, both with the item in C{item}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.core.definitions import (
    DefinitionConflict,
    InvalidDefinitions,
    export_definitions,
    import_definitions,
    parse,
)
from qmq.web.api.params import Response, _json_body, json_response
from qmq.web.api.problem import Problem

if TYPE_CHECKING:
    from twisted.web.server import Request

log = Logger(namespace="qmq.web.api.resource")


class DefinitionsMixin:
    """Export and import definitions (see the module docstring)."""

    # Set by ApiResource; declared for type checkers.
    broker: Any

    def h_get_definitions(self, request: Request) -> Response:
        self._require_admin(request)
        user = getattr(request, "qmq_user", None)
        return json_response(export_definitions(self.broker, user, self._owner(request)))

    def h_post_definitions(self, request: Request) -> Response:
        self._require_admin(request)
        user = getattr(request, "qmq_user", None)
        try:
            definitions = parse(_json_body(request))
            result = import_definitions(self.broker, definitions, user, self._owner(request))
        except InvalidDefinitions as e:
            raise Problem(400, "bad-definitions", e.message, {"item": e.item}) from None
        except DefinitionConflict as e:
            raise Problem(409, "definitions-conflict", e.message, {"item": e.item}) from None
        auth = getattr(self.broker, "auth", None)
        if auth is not None and result["created"]["permissions"]:
            for name in {p.user for p in definitions.permissions}:
                self._refresh_sessions(auth, name)
        log.info("http api: definitions imported by {admin}: created {created}", admin=self._who(request),
                 created=result["created"])
        return json_response(result)
