# -*- test-case-name: tests.test_web_api -*-
"""Errors as RFC 9457 problem documents (C{application/problem+json}).

Every JSON error of an C{http:} listener is one of these, written by
L{Problem.render}: the API's, the guard's refusals (L{qmq.web.guard}), and
the site's own (L{qmq.web.site.json_error}: unknown paths, methods a
resource does not answer, the 408, 413 and 503 of the connection, a failed
answer) for every mount (C{/}, C{/metrics}, C{/console}, C{/sockjs}...).

A handler raises L{Problem} (or lets a core L{BrokerError} through); the
resource turns it into a response with the HTTP status, a C{title} (the
status phrase), a C{detail} that says what was wrong and what to do, and a
C{code}: a short stable name a program can test (C{bad-json},
C{unknown-queue}, ...). Nothing else reaches a client: an unexpected
exception is logged and answered with a generic problem, never a traceback.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from qmq.core.errors import (
    AccessRefused,
    BrokerError,
    NoSuchExchange,
    NoSuchQueue,
    NotFound,
    PreconditionFailed,
    ResourceLimit,
    ResourceLocked,
)
from qmq.core.names import InvalidName
from qmq.core.remote import Unavailable
from qmq.stomp.destinations import DestinationError

PROBLEM_TYPE = "application/problem+json"


class Problem(Exception):
    """An error answered as a problem document.

    @ivar status: the HTTP status.
    @ivar code: a short stable name of the error (the document's C{code}).
    @ivar detail: what was wrong, in a sentence.
    @ivar extra: more members of the document (e.g. C{published}).
    @ivar headers: response headers to add (e.g. C{Allow}, C{Retry-After}).
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra or {}
        self.headers = headers or {}

    def document(self) -> dict[str, Any]:
        """The problem document (a JSON object)."""
        doc: dict[str, Any] = {
            "type": "about:blank",
            "title": phrase(self.status),
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        doc.update(self.extra)
        return doc

    def body(self) -> bytes:
        """The document, encoded."""
        return json.dumps(self.document()).encode()

    def render(self, request: Any) -> bytes:
        """Set C{request}'s status and headers for this problem.

        @return: the body, for a C{render_*} method to return.
        """
        request.setResponseCode(self.status)
        request.setHeader(b"content-type", PROBLEM_TYPE.encode())
        request.setHeader(b"cache-control", b"no-store")
        for k, v in self.headers.items():
            request.setHeader(k.encode(), v.encode())
        return self.body()


def phrase(status: int) -> str:
    """The standard reason phrase of C{status}."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def bad_request(detail: str, code: str = "bad-parameter") -> Problem:
    """A 400 problem."""
    return Problem(400, code, detail)


#: Core errors, most specific first: (class, HTTP status, code).
_BROKER_ERRORS: tuple[tuple[type[BrokerError], int, str], ...] = (
    (DestinationError, 400, "bad-destination"),
    (InvalidName, 400, "invalid-name"),
    (Unavailable, 503, "home-unavailable"),
    (NoSuchQueue, 404, "unknown-queue"),
    (NoSuchExchange, 404, "unknown-exchange"),
    (NotFound, 404, "not-found"),
    (AccessRefused, 403, "access-refused"),
    (ResourceLocked, 409, "resource-locked"),
    (PreconditionFailed, 409, "precondition-failed"),
    (ResourceLimit, 429, "queue-full"),
)


def from_broker_error(e: BrokerError, extra: dict[str, Any] | None = None) -> Problem:
    """The problem a core error becomes."""
    for cls, status, code in _BROKER_ERRORS:
        if isinstance(e, cls):
            if cls is DestinationError and "does not exist" in e.message:
                status, code = 404, "not-found"
            headers = {"Retry-After": "1"} if status == 429 else None
            return Problem(status, code, e.message, extra, headers)
    return Problem(400, "refused", e.message, extra)
