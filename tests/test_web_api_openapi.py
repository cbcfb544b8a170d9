"""The OpenAPI document is complete and true: its paths and methods are
exactly the API's routes, it is valid OpenAPI 3.1, and every schema in it
compiles; the responses of the other tests are validated against it
(L{tests.web_api_helpers.validate})."""

from __future__ import annotations

import jsonschema_rs
from twisted.trial import unittest

from qmq.web.api import ApiResource
from qmq.web.api.openapi import document


class DocumentTests(unittest.SynchronousTestCase):
    def test_paths_are_the_routes(self) -> None:
        doc = document()
        routes = {("/api/" + "/".join(p), m.lower()) for m, p, _ in ApiResource.routes}
        documented = {(path, m) for path, ops in doc["paths"].items() for m in ops}
        self.assertEqual(documented, routes)

    def test_every_operation_complete(self) -> None:
        doc = document()
        ids = set()
        for path, ops in doc["paths"].items():
            names = {p[1:-1] for p in path.split("/") if p.startswith("{")}
            for method, op in ops.items():
                params = {p["name"] for p in op.get("parameters", ()) if p["in"] == "path"}
                self.assertEqual(params, names, (path, method))
                self.assertIn("400", op["responses"], (path, method))
                self.assertTrue(any(c.startswith("2") for c in op["responses"]), (path, method))
                self.assertNotIn(op["operationId"], ids)
                ids.add(op["operationId"])

    def test_schemas_compile(self) -> None:
        doc = document()
        for name in doc["components"]["schemas"]:
            jsonschema_rs.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **doc})

    def test_valid_openapi(self) -> None:
        try:
            from schemathesis.specs.openapi import definitions  # noqa: F401
        except ImportError:  # pragma: no cover
            pass
        import schemathesis  # noqa: PLC0415

        schema = schemathesis.openapi.from_dict(document())
        self.assertGreater(len(list(schema.get_all_operations())), 25)
