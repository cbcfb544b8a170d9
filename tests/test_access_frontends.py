"""The two breaks of issue 21 as a client of each frontend meets them.

  - Dead letters written where the declarer may not write: a queue of
    one's own declared with C{x-dead-letter-exchange: ""},
    C{x-dead-letter-routing-key: <someone else's queue>} and a short TTL
    made the broker republish one's messages into that queue (or into
    another user's durable subscription). Declaring it now needs write on
    the target, over STOMP (SUBSCRIBE headers) and HTTP (PUT) alike.
  - Two verdicts for one token: the HTTP API matched a token's
    C{destinations} narrowing against a bare queue name, the core against
    C{/queue/NAME}. Now both ask L{qmq.core.access}, against one text.

STOMP sessions run in memory on a L{Clock} (L{tests.test_auth_session});
the HTTP API is the real site on 127.0.0.1 with treq
(L{tests.test_web_api}). The cross-frontend table over real clients is
L{tests.integration.test_verdicts}.
"""

from __future__ import annotations

import jwt
from twisted.internet import defer

from qmq.core.ownership import durable_queue_name
from tests.test_auth_session import AuthSessionTestCase
from tests.test_web_api import AuthSetup, Q

B = "/api/v1/vhosts/%2F/bindings"


def dead_letters_to(target: str) -> dict[str, str]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target, "x-message-ttl": "1"}


class StompDeadLetterTests(AuthSessionTestCase):
    """alice may configure and write C{alice.*} in C{app}; bob may do
    anything in C{other}."""

    def setUp(self) -> None:
        super().setUp()
        self.app = self.broker.vhosts["app"]
        self.app.declare_queue("secret")
        self.other = self.broker.vhosts["other"]
        self.feed = durable_queue_name("alice", "feed")
        self.other.declare_queue(self.feed, subscription=True)

    def subscribe(self, c, destination: str, target: str) -> list:
        c.send("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "r", **dead_letters_to(target)})
        c.send("SEND", {"destination": destination}, b"leak")
        self.clock.advance(1)
        return c.read()

    def test_dead_letters_into_a_queue_one_may_not_write(self):
        c = self.login(host="app", login="alice", passcode="wonderland")
        [error] = self.subscribe(c, "/queue/alice.trap", "secret")
        self.assertEqual(error.headers["message"], "access refused (write)")
        self.assertIn(b"x-dead-letter-exchange", error.body)
        self.assertIn(b"/queue/secret", error.body)
        self.assertNotIn("alice.trap", self.app.queues)
        self.assertEqual(len(self.app.queues["secret"]), 0)

    def test_dead_letters_into_another_owners_durable_subscription(self):
        """Even with every permission (bob in C{other})."""
        c = self.login(host="other", login="bob", passcode="builder")
        [error] = self.subscribe(c, "/queue/bob.trap", self.feed)
        self.assertEqual(error.headers["message"], "access refused (write)")
        self.assertEqual(len(self.other.queues[self.feed]), 0)
        c = self.login(host="other", login="bob", passcode="builder")
        c.send("SUBSCRIBE", {"destination": "/topic/t", "id": "d", "durable": "true", "receipt": "r",
                             **dead_letters_to(self.feed)})
        self.assertEqual([f.command for f in c.read()], ["ERROR"])
        self.assertNotIn(durable_queue_name("bob", "d"), self.other.queues)

    def test_dead_letters_where_one_may_write(self):
        self.app.declare_queue("alice.dead")
        c = self.login(host="app", login="alice", passcode="wonderland")
        frames = self.subscribe(c, "/queue/alice.work", "alice.dead")
        self.assertEqual([f.command for f in frames], ["RECEIPT", "MESSAGE"])
        c.send("UNSUBSCRIBE", {"id": "1"})
        c.send("SEND", {"destination": "/queue/alice.work"}, b"late")
        self.clock.advance(1)
        self.assertEqual([m.body for m in self.app.queues["alice.dead"].messages()], [b"late"])


class HttpAccessTests(AuthSetup):
    """Over the HTTP API (bob and tokens of L{AuthSetup})."""

    @defer.inlineCallbacks
    def test_dead_letters_refused_at_declare(self):
        auth = self.broker.auth
        auth.set_permission("/", "bob", r"^bob\.", r"^bob\.", r"^bob\.")
        bob = self.basic("bob")
        code, _, _, doc = yield self.call("PUT", f"{Q}/bob.trap", {"arguments": dead_letters_to("jobs")}, headers=bob)
        self.assertEqual((code, doc["code"]), (403, "access-refused"), doc)
        self.assertIn("x-dead-letter-exchange", doc["detail"])
        self.assertNotIn("bob.trap", self.broker.default_vhost.queues)
        code, _, _, doc = yield self.call("PUT", f"{Q}/bob.ok", {"arguments": dead_letters_to("bob.dead")}, headers=bob)
        self.assertEqual(code, 201, doc)
        code, _, _, doc = yield self.call("PUT", f"{Q}/bob.x", {"arguments": {"x-dead-letter-exchange": ""}},
                                          headers=bob)
        self.assertEqual((code, doc["code"]), (409, "precondition-failed"), doc)
        # Every permission does not make another owner's durable subscription a target.
        auth.set_permission("/", "bob", ".*", ".*", ".*")
        vhost = self.broker.default_vhost
        feed = durable_queue_name("alice", "news")
        vhost.declare_queue(feed, subscription=True)
        code, _, _, doc = yield self.call("PUT", f"{Q}/bob.trap", {"arguments": dead_letters_to(feed)}, headers=bob)
        self.assertEqual((code, doc["code"]), (403, "access-refused"), doc)
        self.assertNotIn("bob.trap", vhost.queues)
        self.assertEqual(len(vhost.queues[feed]), 0)

    @defer.inlineCallbacks
    def test_one_verdict_for_a_token(self):
        """A token narrowed by C{destinations} gets the same verdict for
        publishing to queue C{jobs} (through the core's channel) and for
        binding it (a management operation): both match C{/queue/jobs}."""
        for pattern, verdict in ((r"^/queue/jobs$", True), (r"^jobs$", False)):
            token = jwt.encode({"sub": f"web-{verdict}", "exp": self.now + 600,
                                "destinations": {"write": pattern, "read": r"^/topic/"}},
                               self.SECRET, algorithm="HS256")
            bearer = {"Authorization": f"Bearer {token}"}
            publish, _, _, doc = yield self.call("POST", f"{Q}/jobs/messages", {"body": "x"}, headers=bearer)
            bind, _, _, doc = yield self.call("POST", B, {"queue": "jobs", "exchange": "amq.topic",
                                                          "routing_key": "k"}, headers=bearer)
            self.assertEqual((publish, bind), (201, 201) if verdict else (403, 403), pattern)

    @defer.inlineCallbacks
    def test_not_found_before_refused(self):
        """A management request naming what does not exist is a 404 naming
        it (unknown-queue, unknown-exchange) whatever the caller's
        permissions; one naming what exists but the caller may not touch is
        a 403 (the core's order: look up, then authorize)."""
        bob = self.basic("bob")
        X = "/api/v1/vhosts/%2F/exchanges"
        cases = [
            ("GET", f"{Q}/nope", None, 404, "unknown-queue"),
            ("GET", f"{Q}/jobs", None, 403, "access-refused"),
            ("DELETE", f"{Q}/nope", None, 404, "unknown-queue"),
            ("DELETE", f"{Q}/public", None, 403, "access-refused"),
            ("DELETE", f"{Q}/nope/messages", None, 404, "unknown-queue"),
            ("DELETE", f"{Q}/jobs/messages", None, 403, "access-refused"),
            ("GET", f"{Q}/nope/scan", None, 404, "unknown-queue"),
            ("GET", f"{Q}/jobs/scan", None, 403, "access-refused"),
            ("GET", f"{X}/nope", None, 404, "unknown-exchange"),
            ("GET", f"{X}/amq.direct", None, 403, "access-refused"),
            ("DELETE", f"{X}/nope", None, 404, "unknown-exchange"),
            ("DELETE", f"{X}/amq.direct", None, 403, "access-refused"),
            ("POST", B, {"queue": "nope", "exchange": "amq.direct"}, 404, "unknown-queue"),
            ("POST", B, {"queue": "public", "exchange": "nope"}, 404, "unknown-exchange"),
            ("POST", B, {"queue": "public", "exchange": "amq.direct"}, 403, "access-refused"),
            ("DELETE", f"{B}?queue=nope&exchange=amq.direct", None, 404, "unknown-queue"),
            ("DELETE", f"{B}?queue=public&exchange=nope", None, 404, "unknown-exchange"),
            ("DELETE", f"{B}?queue=public&exchange=amq.direct", None, 403, "access-refused"),
        ]
        got = []
        for method, path, body, _, _ in cases:
            code, _, _, doc = yield self.call(method, path, body, headers=bob)
            got.append((method, path, body, code, doc.get("code")))
        self.maxDiff = None
        self.assertEqual(got, cases)

    @defer.inlineCallbacks
    def test_allow_create_over_http(self):
        """C{allow_create = false}: a PUT of a new queue is refused as a
        STOMP SEND or SUBSCRIBE is (it made one on d8fe3b8)."""
        self.broker.default_vhost.allow_create = False
        code, _, _, doc = yield self.call("PUT", f"{Q}/fresh", headers=self.basic("alice"))
        self.assertEqual((code, doc["code"]), (404, "not-found"), doc)
        self.assertIn("allow_create", doc["detail"])
        self.assertNotIn("fresh", self.broker.default_vhost.queues)
        code, _, _, _ = yield self.call("PUT", f"{Q}/jobs", headers=self.basic("alice"))
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_inequivalent_arguments_over_http(self):
        """A PUT of a queue that exists with other arguments is a 409, as
        a STOMP SUBSCRIBE's is an ERROR (d8fe3b8 answered 200 and ignored
        them)."""
        alice = self.basic("alice")
        code, _, _, _ = yield self.call("PUT", f"{Q}/capped", {"arguments": {"x-max-length": 5}}, headers=alice)
        self.assertEqual(code, 201)
        code, _, _, doc = yield self.call("PUT", f"{Q}/capped", {"arguments": {"x-max-length": 6}}, headers=alice)
        self.assertEqual((code, doc["code"]), (409, "precondition-failed"), doc)
        code, _, _, doc = yield self.call("PUT", f"{Q}/capped", {"arguments": {"x-max-length": 5}}, headers=alice)
        self.assertEqual((code, doc["arguments"]), (200, {"x-max-length": 5}))
