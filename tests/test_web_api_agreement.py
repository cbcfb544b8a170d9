"""The OpenAPI document and the server agree on which requests are valid.

Each case is a request schemathesis found the two disagreeing on (at
d8fe3b8: valid requests the server refused, invalid ones it accepted). For
each, the document's own schemas judge the request (its parameters and its
body), and the broker answers it; the test asserts they agree: a request the
document calls valid is not refused as malformed (no 400), one it calls
invalid is refused (4xx).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import jsonschema_rs
from twisted.internet import defer
from twisted.trial import unittest

from tests.web_api_helpers import DOC, ApiSiteMixin

Q = "/api/v1/vhosts/{vhost}/queues/{queue}"


def _validator(schema: dict) -> Any:
    return jsonschema_rs.Draft202012Validator({**schema, "components": DOC["components"]}, validate_formats=True)


def document_accepts(method: str, template: str, path: dict, query: dict, body: Any) -> bool:
    """Whether the document calls the request valid (parameters and JSON body)."""
    op = DOC["paths"][template][method]
    given = {"path": path, "query": query}
    for param in op.get("parameters", ()):
        values = given[param["in"]]
        if param["name"] not in values:
            if param.get("required"):
                return False
            continue
        value = values[param["name"]]
        schema = param["schema"]
        if schema.get("type") in ("integer", "number"):
            try:
                value = int(value) if schema["type"] == "integer" else float(value)
            except ValueError:
                return False
        if not _validator(schema).is_valid(value):
            return False
    if body is not None:
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        return _validator(schema).is_valid(body)
    return True


#: (method, template, path parameters, query, JSON body): requests the
#: document and the server judged differently at d8fe3b8.
CASES: list[tuple[str, str, dict, dict, Any]] = [
    ("get", Q + "/scan", {"queue": "orders"}, {"cursor": ""}, None),
    ("get", Q + "/scan", {"queue": "orders"}, {"cursor": "i10"}, None),
    ("get", Q + "/scan", {"queue": "orders"}, {"start": "5", "end": "2"}, None),
    ("get", "/api/v1/vhosts/{vhost}/topics/{topic}/poll", {"topic": "t"}, {"cursor": ""}, None),
    ("post", Q + "/ack", {"queue": "orders"}, {}, {"handles": [""]}),
    ("post", Q + "/nack", {"queue": "orders"}, {}, {"handles": ["x.1"]}),
    ("post", Q + "/extend", {"queue": "orders"}, {}, {"handles": ["x.1"], "visibility": 1e-9}),
    ("post", Q + "/receive", {"queue": "orders"}, {"visibility": "5e-324"}, None),
    ("post", Q + "/receive", {"queue": "orders"}, {"visibility": "0.5"}, None),
    ("delete", "/api/v1/vhosts/{vhost}/bindings", {}, {}, None),
    ("delete", "/api/v1/vhosts/{vhost}/bindings", {}, {"queue": "orders", "exchange": "amq.topic"}, None),
    ("get", "/api/v1/vhosts/{vhost}/queues", {}, {"limit": "10001"}, None),
    ("get", "/api/v1/health/checks/port-listener/{port}", {"port": "0"}, {}, None),
    ("put", Q, {"queue": "a\x0bb"}, {}, None),
    # destination null in a batch, on each endpoint whose path names it
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"messages": [{"body": "x", "destination": None}]}),
    ("post", "/api/v1/vhosts/{vhost}/topics/{topic}/messages", {"topic": "t"}, {},
     {"messages": [{"body": "x", "destination": None}]}),
    ("post", "/api/v1/vhosts/{vhost}/exchanges/{exchange}/messages", {"exchange": "amq.topic"}, {},
     {"messages": [{"body": "x", "destination": None}]}),
    ("post", "/api/v1/vhosts/{vhost}/messages", {}, {}, {"body": "x", "destination": ""}),
    ("post", "/api/v1/vhosts/{vhost}/messages", {}, {}, {"body": "x", "destination": "/queue/orders"}),
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"body": "x", "priority": 7.0, "delay": 5.0}),
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"body": "x", "destination": ""}),
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"body": "!!", "encoding": "base64"}),
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"body": "x", "headers": {"a\x02": "1"}}),
    ("post", Q + "/messages", {"queue": "orders"}, {}, {"body": "x", "expires": 1e17}),
    # definitions (found once the resource landed)
    ("post", "/api/v1/definitions", {}, {}, {"qmq_version": {}}),
    ("post", "/api/v1/definitions", {}, {}, {"users": [{"name": "u", "password_hash": "plain"}]}),
    ("post", "/api/v1/definitions", {}, {}, {"permissions": [{"vhost": "/", "user": "u", "read": "("}]}),
]


class AgreementTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.start_site()
        self.broker.default_vhost.declare_queue("orders")

    @defer.inlineCallbacks
    def test_document_and_server_agree(self) -> Any:
        disagreements = []
        for method, template, path, query, body in CASES:
            values = {"vhost": "/", **path}
            url = template
            for name, value in values.items():
                url = url.replace("{" + name + "}", quote(value, safe=""))
            if query:
                url += "?" + urlencode(query)
            valid = document_accepts(method, template, values, query, body)
            status, _, content, _ = yield self.call(method.upper(), url, body)
            # A queue without a commit log cannot be scanned: its state, not the request.
            malformed = (status == 400 and b"cannot-scan" not in content) or (not valid and status in (415, 422))
            if valid == malformed or (not valid and status < 400):
                disagreements.append(f"{method.upper()} {url} {body!r}: document says "
                                     f"{'valid' if valid else 'invalid'}, server {status} {content[:160]!r}")
        self.assertEqual(disagreements, [], "\n".join(disagreements))

    def test_links_name_operations(self) -> None:
        """Every link names an operation of the document and only
        parameters that operation has."""
        ops = {op["operationId"]: op for ops in DOC["paths"].values() for op in ops.values()}
        count = 0
        for ops_of_path in DOC["paths"].values():
            for op in ops_of_path.values():
                for response in op["responses"].values():
                    for link in response.get("links", {}).values():
                        target = ops[link["operationId"]]
                        names = {(p["in"], p["name"]) for p in target.get("parameters", ())}
                        for key in link["parameters"]:
                            where, name = key.split(".")
                            self.assertIn((where, name), names, link)
                        count += 1
        self.assertGreater(count, 20)
