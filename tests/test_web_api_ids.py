"""The HTTP API's message ids and receipt handles across restarts.

A message's C{id} is its name on the wire, C{NODE.NUMBER}
(L{qmq.core.ids.message_name}): a new message never gets the id of one
from an earlier run, and a message kept by the commit log keeps its id
when it is delivered again after a restart. A receipt handle from an
earlier run settles nothing after it, not even the same message delivered
again. Each restart is a new broker (and store) behind a new site, on the
real reactor, as the service makes them.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, reactor
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.store.log import CommitLogStore
from qmq.store.memory import MemoryStore
from tests.web_api_helpers import ApiSiteMixin

Q = "/api/v1/vhosts/%2F/queues"


class IdsAcrossRestartsTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        self.dir = self.mktemp()
        self.store: Any = None
        self._stopped: Any = None

    def _stop_site(self) -> Any:
        # Each run stops its own site; the cleanups start_site registered
        # stop only the last one, once.
        if self._stopped is self.port:
            return defer.succeed(None)
        self._stopped = self.port
        return ApiSiteMixin._stop_site(self)

    @defer.inlineCallbacks
    def run_broker(self, store: str) -> Any:
        if self.store is not None:
            yield self._stop_site()
            yield defer.maybeDeferred(self.store.close)
        self.store = (
            CommitLogStore(self.dir, reactor=reactor, compact_interval=0)
            if store == "log"
            else MemoryStore()
        )
        broker = Broker(reactor, store=self.store, node="n1")
        broker.recover()
        self.start_site(broker=broker)

    @defer.inlineCallbacks
    def runs(self, store: str) -> Any:
        seen: set[str] = set()
        old_handles: list[str] = []
        kept: dict[str, str] = {}
        self.addCleanup(lambda: defer.maybeDeferred(self.store.close))
        for run in range(3):
            yield self.run_broker(store)
            code, _, _, published = yield self.call(
                "POST", f"{Q}/q/messages", {"body": f"run {run}", "persistent": True}
            )
            self.assertEqual(code, 201, published)
            [new] = published["ids"]
            self.assertTrue(new.startswith("n1."), new)
            self.assertNotIn(new, seen)
            seen.add(new)
            code, _, _, got = yield self.call("POST", f"{Q}/q/receive?max=10")
            messages = got["messages"]
            for m in messages:
                self.assertEqual(m["id"], f"n1.{m['number']}")
                if m["body"] in kept:
                    # Delivered again after the restart: its own id.
                    self.assertEqual(m["id"], kept[m["body"]])
                    self.assertTrue(m["redelivered"])
                kept[m["body"]] = m["id"]
            expected = [f"run {r}" for r in range(run + 1)] if store == "log" else [f"run {run}"]
            self.assertEqual(sorted(m["body"] for m in messages), expected)
            self.assertEqual([m["id"] for m in messages if m["body"] == f"run {run}"], [new])
            # The earlier run's handles name none of these deliveries.
            if old_handles:
                code, _, _, doc = yield self.call("POST", f"{Q}/q/ack", {"handles": old_handles})
                self.assertEqual((code, doc["settled"], doc["unknown"]), (200, 0, old_handles))
            old_handles = [m["handle"] for m in messages]

    def test_memory_store(self) -> None:
        return self.runs("memory")

    def test_log_store(self) -> None:
        return self.runs("log")
