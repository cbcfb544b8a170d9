"""The message model's rules that every frontend gets from the core
(L{qmq.core.message}): a C{user_id} property must be the publisher's own
user when authentication is on (RabbitMQ's rule, so a receiver may trust
it), over STOMP and over HTTP alike."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.errors import AccessRefused
from qmq.core.message import check_user_id
from tests.test_auth_session import AuthSessionTestCase
from tests.test_web_api import AuthSetup, Q


class _User:
    name = "alice"


class CheckUserIdTests(SynchronousTestCase):
    def test_rule(self) -> None:
        check_user_id(None, _User())
        check_user_id({"type": "x"}, _User())
        check_user_id({"user_id": "alice"}, _User())
        check_user_id({"user_id": "anyone"}, None)  # no authentication
        e = self.assertRaises(AccessRefused, check_user_id, {"user_id": "mallory"}, _User())
        self.assertIn("'mallory'", e.message)


class StompUserIdTests(AuthSessionTestCase):
    def test_own_user_id_only(self) -> None:
        c = self.login(host="app", login="alice", passcode="wonderland")
        c.send("SEND", {"destination": "/queue/orders", "user-id": "alice", "receipt": "r"}, b"x")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        [m] = self.broker.vhosts["app"].queues["orders"].messages()
        self.assertEqual(m.properties, {"user_id": "alice"})
        c.send("SEND", {"destination": "/queue/orders", "user-id": "bob"}, b"x")
        error = self.error(c)
        self.assertEqual(error.headers["message"], "user-id refused")
        self.assertEqual(len(self.broker.vhosts["app"].queues["orders"].messages()), 1)


class HttpUserIdTests(AuthSetup):
    @defer.inlineCallbacks
    def test_own_user_id_only(self) -> None:
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/messages",
                                          {"body": "x", "properties": {"user_id": "alice"}},
                                          headers=self.basic("alice"))
        self.assertEqual(code, 201, doc)
        code, _, _, doc = yield self.call("POST", f"{Q}/jobs/messages",
                                          {"body": "x", "properties": {"user_id": "bob"}},
                                          headers=self.basic("alice"))
        self.assertEqual((code, doc["code"]), (403, "access-refused"), doc)
        self.assertEqual([m.properties for m in self.broker.default_vhost.queues["jobs"].messages()],
                         [{"user_id": "alice"}])
