"""C{/api/v1/definitions} over real HTTP: export, import into a fresh
broker (the same definitions), conflicts and bad documents as problems
naming the item, and only administrators.  Responses are validated
against the OpenAPI document (L{tests.web_api_helpers.validate})."""

from __future__ import annotations

import base64

from twisted.internet import defer, reactor
from twisted.trial import unittest

from qmq.auth import Authenticator, AuthSettings, PermissionSettings, UserSettings
from qmq.auth.passwords import hash_password
from qmq.core.broker import Broker
from qmq.core.definitions import export_definitions
from qmq.core.management import Management
from qmq.web.api.settings import ApiSettings
from tests.web_api_helpers import ApiSiteMixin

HASH = hash_password("wonderland", 4)


def with_auth(broker: Broker) -> Broker:
    broker.auth = Authenticator(
        AuthSettings(failure_delay=0.01, failure_max_delay=0.02), reactor,
        users=[UserSettings("alice", HASH), UserSettings("bob", HASH)],
        permissions={"/": [PermissionSettings("alice", ".*", ".*", ".*")]},
        run=lambda f, *a: defer.maybeDeferred(f, *a),
    )
    return broker


def basic(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:wonderland".encode()).decode()}


ALICE = basic("alice")


class DefinitionsApiTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.start_site(broker=with_auth(Broker(reactor)))
        self.api.settings = self.api.frontend.settings = ApiSettings(admins="alice")
        mgmt = Management(self.broker.default_vhost)
        mgmt.declare_exchange("events", "topic")
        mgmt.declare_queue("orders", arguments={"x-max-length": 10})
        mgmt.bind("orders", "events", "order.*")

    @defer.inlineCallbacks
    def test_export(self) -> None:
        code, _, _, doc = yield self.call("GET", "/api/v1/definitions", headers=ALICE)
        self.assertEqual(code, 200)
        self.assertEqual(doc, export_definitions(self.broker))
        self.assertEqual([u["name"] for u in doc["users"]], ["alice", "bob"])
        self.assertEqual(doc["queues"], [{"vhost": "/", "name": "orders", "durable": True, "auto_delete": False,
                                          "arguments": {"x-max-length": 10}}])

    @defer.inlineCallbacks
    def test_adminsOnly(self) -> None:
        for method, body in (("GET", None), ("POST", {})):
            code, _, _, doc = yield self.call(method, "/api/v1/definitions", body, headers=basic("bob"))
            self.assertEqual((code, doc["code"]), (403, "access-refused"))
            code, _, _, doc = yield self.call(method, "/api/v1/definitions", body)
            self.assertEqual(code, 401)

    @defer.inlineCallbacks
    def test_importIntoFresh(self) -> None:
        """
        The export imported into a fresh broker through the API gives the
        same definitions; a second import creates nothing.
        """
        _, _, _, doc = yield self.call("GET", "/api/v1/definitions", headers=ALICE)
        source = self.broker
        fresh = with_auth(Broker(reactor))
        fresh.auth.delete_user("bob")
        self.api.broker = fresh
        code, _, _, result = yield self.call("POST", "/api/v1/definitions", doc, headers=ALICE)
        self.assertEqual(code, 200, result)
        self.assertEqual(result["created"], {"users": 1, "vhosts": 0, "permissions": 0, "exchanges": 1,
                                             "queues": 1, "bindings": 1})
        self.assertEqual(export_definitions(fresh), export_definitions(source))
        code, _, _, result = yield self.call("POST", "/api/v1/definitions", doc, headers=ALICE)
        self.assertEqual(sum(result["created"].values()), 0)
        fresh.stop_timers()

    @defer.inlineCallbacks
    def test_conflict(self) -> None:
        doc = {"queues": [{"vhost": "/", "name": "new"},
                          {"vhost": "/", "name": "orders", "arguments": {"x-max-length": 99}}]}
        code, _, _, problem = yield self.call("POST", "/api/v1/definitions", doc, headers=ALICE)
        self.assertEqual((code, problem["code"]), (409, "definitions-conflict"))
        self.assertTrue(problem["item"].startswith("queues[1]"), problem)
        self.assertIn("'orders'", problem["detail"])
        self.assertNotIn("new", self.broker.default_vhost.queues)

    @defer.inlineCallbacks
    def test_bad(self) -> None:
        code, _, _, problem = yield self.call(
            "POST", "/api/v1/definitions", {"queues": [{"vhost": "/", "name": 3}]}, headers=ALICE
        )
        self.assertEqual((code, problem["code"], problem["item"]), (400, "bad-definitions", "queues[0].name"))
        code, _, _, problem = yield self.call(
            "POST", "/api/v1/definitions", raw=b"{not json", headers={**ALICE, "Content-Type": "application/json"}
        )
        self.assertEqual(code, 400)

    @defer.inlineCallbacks
    def test_invalid_arguments_one_verdict(self) -> None:
        """
        A queue argument with a bad value gets the same status from a
        definitions import as from a PUT of the queue (the core's
        PreconditionFailed, 409), for a new queue and for one that exists.
        """
        Q = "/api/v1/vhosts/%2F/queues"
        for name, arguments in (("fresh", {"x-max-length": -1}), ("fresh", {"x-overflow": "nope"}),
                                ("orders", {"x-max-length": "abc"})):
            put, _, _, doc = yield self.call("PUT", f"{Q}/{name}", {"arguments": arguments}, headers=ALICE)
            imported, _, _, problem = yield self.call(
                "POST", "/api/v1/definitions", {"queues": [{"vhost": "/", "name": name, "arguments": arguments}]},
                headers=ALICE,
            )
            self.assertEqual((put, imported), (409, 409), (arguments, doc, problem))
            self.assertIn(next(iter(arguments)), problem["detail"])
        self.assertNotIn("fresh", self.broker.default_vhost.queues)
