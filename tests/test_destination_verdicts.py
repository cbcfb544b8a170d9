"""One destination string, one verdict, over STOMP and over the HTTP API.

What a destination is, and who may name it, is decided once, in
L{qmq.stomp.destinations} (the grammar and L{DestinationChannel}); the HTTP
API reads none of it itself. Each row is SENT over STOMP (a session on one
broker, with a receipt) and POSTed to C{/api/v1/vhosts/%2F/messages} with
the same C{destination} on the same broker: both accept it, or both refuse
it with the same reason (the STOMP ERROR's body is the problem's
C{detail}). The session's own destinations (C{/temp-queue/},
C{/control/}) are a session's: STOMP has one, HTTP has none, and the HTTP
refusal is the one the grammar module words (L{session_only}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.stomp.destinations import SESSION_KINDS, parse_destination, session_only
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from tests.test_stomp_session import Client
from tests.web_api_helpers import ApiSiteMixin

#: Destinations both frontends must judge alike.
SHARED = (
    "/queue/a",
    "/topic/a.b",
    "/exchange/amq.direct/k",
    "/exchange/amq.direct/",
    "/exchange/amq.topic/a.b.c",
    "/exchange/nope/k",
    "/exchange/a/b/c",
    "/queue/",
    "/topic/",
    "/exchange/",
    "/exchange//k",
    "nowhere",
    "/queues/a",
    "/queue/" + "x" * 256,
    "/topic/" + "k" * 300,
    "/queue/amq.x",
)

#: Destinations of a session.
SESSION = ("/temp-queue/reply", "/control/memory", "/control/count-msgs/queue/a", "/control/nonsense")


class DestinationVerdictTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.start_site()
        self.stomp = StompFactory(self.broker, StompSettings(), clock=Clock())

    def over_stomp(self, destination: str) -> tuple[str, str]:
        client = Client(self.stomp)
        client.connect()
        client.send("SEND", {"destination": destination, "receipt": "r"}, b"x")
        [frame] = client.read()
        if frame.command == "RECEIPT":
            return ("accepted", "")
        self.assertEqual(frame.command, "ERROR")
        return ("refused", frame.body.decode())

    @defer.inlineCallbacks
    def over_http(self, destination: str) -> Any:
        code, _, _, doc = yield self.call(
            "POST", "/api/v1/vhosts/%2F/messages", {"body": "x", "destination": destination}
        )
        if code == 201:
            return ("accepted", "")
        self.assertIn(code, (400, 403, 404, 409), doc)
        return ("refused", doc["detail"])

    @defer.inlineCallbacks
    def test_same_verdict(self) -> None:
        verdicts = {}
        for destination in SHARED:
            stomp = self.over_stomp(destination)
            http = yield self.over_http(destination)
            self.assertEqual(stomp, http, destination)
            verdicts[destination] = stomp[0]
        # The rows are not all of one kind: the test can tell them apart.
        self.assertEqual(
            {d for d, v in verdicts.items() if v == "accepted"},
            {"/queue/a", "/topic/a.b", "/exchange/amq.direct/k", "/exchange/amq.direct/",
             "/exchange/amq.topic/a.b.c"},
        )

    @defer.inlineCallbacks
    def test_session_destinations(self) -> None:
        """STOMP judges them as a session (its own verdict, never the
        session refusal); HTTP refuses each with the grammar module's
        words, as a bad destination."""
        for destination in SESSION:
            self.assertIn(parse_destination(destination).kind, SESSION_KINDS)
            expected = session_only(destination).message
            stomp = self.over_stomp(destination)
            self.assertNotEqual(stomp, ("refused", expected), destination)
            code, _, _, doc = yield self.call(
                "POST", "/api/v1/vhosts/%2F/messages", {"body": "x", "destination": destination}
            )
            self.assertEqual((code, doc["code"], doc["detail"]), (400, "bad-destination", expected))
        self.assertEqual(self.over_stomp("/control/memory")[0], "accepted")

    @defer.inlineCallbacks
    def test_batch_names_the_message(self) -> None:
        """In a batch, the refusal names the message it is about; none of
        the batch is published."""
        code, _, _, doc = yield self.call(
            "POST",
            "/api/v1/vhosts/%2F/messages",
            {"messages": [{"body": "a", "destination": "/queue/a"},
                          {"body": "b", "destination": "/temp-queue/r"}]},
        )
        self.assertEqual(
            (code, doc["detail"]), (400, "message 1: " + session_only("/temp-queue/r").message)
        )
        queue = self.broker.default_vhost.queues.get("a")
        self.assertEqual(len(queue) if queue is not None else 0, 0)
