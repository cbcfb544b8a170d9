"""One error format on the C{http:} listener: every JSON error, under /api
or not, is the HTTP API's RFC 9457 problem document (L{Problem}), sent as
C{application/problem+json}: the site's unknown paths and methods, the
guard's refusals, /metrics, /console, /qmq.js, SockJS's HTTP errors, a
failing resource, the 408, 413 and 503 of a connection.

Each answer is checked the same way: its status, its content type, exactly
the members a L{Problem} has, its C{status} member the HTTP status, and the
OpenAPI document's C{Problem} schema (what clients of /api read).

No sockets: the factory's protocols run on string transports
(L{tests.test_web_site}).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest
from twisted.web.resource import Resource

from qmq.connections import ConnectionSettings
from qmq.web import site as site_module
from qmq.web.api.openapi import document
from qmq.web.site import MOUNTS, HttpFactory
from tests.test_web_site import Client, make_context, split

_DOC = document()
PROBLEM = jsonschema_rs.Draft202012Validator({"$ref": "#/components/schemas/Problem", **_DOC})
MEMBERS = {"type", "title", "status", "detail", "code"}


class ProblemFormatMixin:
    def assertProblem(self, response: bytes, status: int, code: str, extra: set[str] = frozenset()) -> dict:
        got, headers, body = split(response)
        self.assertEqual((got, headers.get("content-type")), (status, "application/problem+json"), body[:300])
        doc = json.loads(body)
        self.assertEqual(set(doc), MEMBERS | extra, doc)
        self.assertEqual((doc["status"], doc["code"], doc["type"]), (status, code, "about:blank"))
        self.assertTrue(doc["detail"])
        self.assertTrue(PROBLEM.is_valid(doc), doc)
        return doc


class ErrorFormatTests(ProblemFormatMixin, unittest.TestCase):
    """Every path of the site answers its errors in the one format."""

    def setUp(self) -> None:
        self.factory = HttpFactory(make_context())

    def call(self, method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
        return Client(self.factory).request(method, path, body, headers)

    def test_root(self) -> None:
        self.assertProblem(self.call("GET", "/nothing/here"), 404, "not-found")
        doc = self.assertProblem(self.call("POST", "/", b"{}", "Content-Type: application/json\r\n"),
                                 405, "method-not-allowed")
        self.assertIn("GET", doc["detail"])

    def test_api(self) -> None:
        self.assertProblem(self.call("GET", "/api/v1/nothing"), 404, "no-such-endpoint")

    def test_metrics_method(self) -> None:
        """A method /metrics does not answer: twisted.web's HTML page before."""
        response = self.call("POST", "/metrics", b"{}", "Content-Type: application/json\r\n")
        self.assertProblem(response, 405, "method-not-allowed")
        self.assertIn("GET", split(response)[1]["allow"])
        self.assertProblem(self.call("DELETE", "/metrics"), 405, "method-not-allowed")
        # HEAD of a GET resource is still answered (its headers, no body).
        status, headers, body = split(self.call("HEAD", "/metrics"))
        self.assertEqual((status, body), (200, b""))

    def test_console(self) -> None:
        self.assertProblem(self.call("GET", "/console/missing.js"), 404, "not-found")
        self.assertProblem(self.call("DELETE", "/console/index.html"), 405, "method-not-allowed")

    def test_client_file(self) -> None:
        # (a text/plain body would meet the guard first: a 415, also a problem)
        self.assertProblem(self.call("PUT", "/qmq.js", b"{}", "Content-Type: application/json\r\n"),
                           405, "method-not-allowed")

    def test_sockjs(self) -> None:
        self.assertProblem(self.call("GET", "/sockjs/nope/x"), 404, "not-found")
        self.assertProblem(self.call("POST", "/sockjs/000/nosession/xhr_send", b'["x"]',
                                     "Content-Type: text/plain\r\n"), 404, "no-such-session")

    def test_guard(self) -> None:
        """A refusal of the gate (qmq.web.guard), here of a Host that is not
        the broker's: the same document, no other member."""
        client = Client(self.factory)
        client.send(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        self.assertProblem(client.response(), 421, "host-not-allowed")

    def test_failure(self) -> None:
        class Broken(Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                raise RuntimeError("secret detail")

        self.patch(site_module, "MOUNTS", {**MOUNTS, "broken": lambda ctx: Broken()})
        factory = HttpFactory(make_context())
        doc = self.assertProblem(Client(factory).request("GET", "/broken"), 500, "internal-error")
        self.assertNotIn("secret", doc["detail"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_body_too_large(self) -> None:
        client = Client(HttpFactory(make_context("[web]\nmax_request_body = 10")))
        client.send(b"POST /api/v1/vhosts/%2F/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\n")
        self.assertProblem(client.response(), 413, "body-too-large")

    def test_head_timeout(self) -> None:
        clock = MemoryReactorClock()
        client = Client(HttpFactory(make_context("[web]\nhead_timeout = 2", clock=clock)))
        client.send(b"GET / HT")
        clock.advance(2)
        self.assertProblem(client.response(), 408, "head-timeout")

    def test_too_many_connections(self) -> None:
        ctx = make_context(connections=ConnectionSettings(max_per_listener=1, max_per_address=1))
        factory = HttpFactory(ctx)
        Client(factory)
        self.assertProblem(Client(factory, host="127.0.0.2").response(), 503, "too-many-connections")
