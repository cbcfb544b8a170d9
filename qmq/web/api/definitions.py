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

With workers or in a mesh (L{qmq.cluster.manage}) the node asked answers
for the whole broker: an export adds every other node's queues and their
bindings (each queue from its home) and names the nodes that did not
answer in C{missing}, as the listings do; an import first asks every node
for what it holds (a node that does not answer: 503 C{node-unavailable},
nothing changed), plans with it, and answers once the homes of the queues
homed elsewhere declared and bound them (their refusal: its problem,
naming the item).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList
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

    def h_get_definitions(self, request: Request) -> Response | Deferred:
        self._require_admin(request)
        user = getattr(request, "qmq_user", None)
        owner = self._owner(request)
        manage = _whole_broker(self.broker)
        if manage is None:
            return json_response(export_definitions(self.broker, user, owner))

        def merged(result: tuple[dict, dict]) -> Response:
            answers, missing = result
            doc = export_definitions(self.broker, user, owner, answers, manage.mesh.node)
            doc["missing"] = dict(sorted(missing.items()))
            truncated = sorted(node for node, answer in answers.items() if answer.get("truncated"))
            if truncated:
                doc["truncated"] = truncated
            return json_response(doc)

        return manage.ask_all("definitions", {}).addCallback(merged)

    def h_post_definitions(self, request: Request) -> Response | Deferred:
        self._require_admin(request)
        user = getattr(request, "qmq_user", None)
        try:
            definitions = parse(_json_body(request))
        except InvalidDefinitions as e:
            raise Problem(400, "bad-definitions", e.message, {"item": e.item}) from None
        manage = _whole_broker(self.broker)
        if manage is None:
            return self._import(request, definitions, user, None, None)

        def planned(result: tuple[dict, dict]) -> Response | Deferred:
            answers, missing = result
            if missing:
                nodes = ", ".join(f"{node} ({why})" for node, why in sorted(missing.items()))
                raise Problem(503, "node-unavailable",
                              f"Definitions are imported for the whole broker, planned with what every node "
                              f"holds, and these nodes did not answer: {nodes}. Nothing was changed; try "
                              "again later.", {"missing": dict(sorted(missing.items()))})
            pending: list[Deferred] = []
            response = self._import(request, definitions, user, answers, pending)
            if not pending:
                return response

            def homes_answered(results: list[tuple[bool, Any]]) -> Response:
                for ok, value in results:
                    if not ok:
                        value.raiseException()
                return response

            return DeferredList(pending, consumeErrors=True).addCallback(homes_answered)

        return manage.ask_all("definitions", {}).addCallback(planned)

    def _import(self, request: Request, definitions: Any, user: Any, others: Any,
                pending: list[Deferred] | None) -> Response:
        try:
            result = import_definitions(self.broker, definitions, user, self._owner(request), others, pending)
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


def _whole_broker(broker: Any) -> Any:
    """The mesh's management across nodes when there are other nodes to
    ask (L{qmq.cluster.manage}), else None: this node answers alone."""
    manage = getattr(getattr(broker, "mesh", None), "manage", None)
    return manage if manage is not None and manage.others() else None
