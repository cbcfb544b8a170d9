"""Message ids that never repeat (L{qmq.core.ids}), across restarts of the
memory store and of the commit log, and the node id (L{qmq.cluster.settings}).

Each restart here is a new broker on a L{Clock} (and a new store on the same
directory); a new process is emulated by restarting the STOMP session-id
counter, which is per process.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from qmq import config
from qmq.cluster.settings import NODE_FILE, ClusterSettings, check_node, node_id
from qmq.config import ConfigError
from qmq.core.broker import Broker
from qmq.core.ids import TIME_SHIFT, MessageIds, base36, time_floor
from qmq.service import make_service
from qmq.stomp import session as stomp_session
from qmq.stomp.destinations import DestinationChannel as Channel
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings
from qmq.store.log import CommitLogStore
from qmq.store.memory import MemoryStore
from qmq.web.metrics import issued_ids
from tests.test_stomp_session import Client
from tests.test_store_log import sync_io

#: A wall-clock time to start from (2026-11-26).
T0 = 1_795_000_000.0


class MessageIdsTests(SynchronousTestCase):
    def test_counts(self) -> None:
        """C{next} gives increasing ids from C{first}; C{issued}, C{last}
        and C{next_id} read the generator without taking an id."""
        ids = MessageIds(10, "n1")
        self.assertEqual((ids.issued, ids.last, ids.next_id), (0, None, 10))
        self.assertEqual([next(ids), next(ids), ids.__next__()], [10, 11, 12])
        self.assertEqual((ids.issued, ids.last, ids.next_id), (3, 12, 13))
        self.assertEqual(next(ids), 13)
        self.assertEqual(ids.prefix, "n1.a")

    def test_floor(self) -> None:
        """A run starts above the store's next id and the clock's floor."""
        self.assertEqual(time_floor(T0), int(T0 * 1000) << TIME_SHIFT)
        self.assertEqual(MessageIds.starting(0.0).first, 1)
        self.assertEqual(MessageIds.starting(T0).first, time_floor(T0) + 1)
        self.assertEqual(MessageIds.starting(T0, time_floor(T0) + 99).first, time_floor(T0) + 99)
        # Exact in JavaScript (below 2**53) until 2109.
        self.assertLess(time_floor(4_390_000_000), 2**53)
        self.assertEqual(base36(0), "0")
        self.assertEqual(base36(36 * 36 + 35), "10z")

    def test_metrics_read(self) -> None:
        """C{/metrics} reads the issued count through the public seam."""
        broker = Broker(Clock())
        self.assertEqual(issued_ids(broker), 0)
        next(broker.message_ids)
        self.assertEqual(issued_ids(broker), 1)
        self.assertEqual(issued_ids(broker), 1)
        self.assertIsNone(issued_ids(object()))


class NodeIdTests(SynchronousTestCase):
    def test_kept_in_data_dir(self) -> None:
        """Without C{[cluster] node}, the id made on the first start is kept
        in C{DATA_DIR/node-id} and read back by every later start."""
        data = Path(self.mktemp())
        first = node_id(ClusterSettings(), data)
        self.assertRegex(first, r"\Aqmq-[0-9a-f]{8}\Z")
        self.assertEqual((data / NODE_FILE).read_text().strip(), first)
        self.assertEqual(node_id(ClusterSettings(), data), first)
        self.assertNotEqual(node_id(ClusterSettings(), Path(self.mktemp())), first)
        self.assertEqual(node_id(ClusterSettings(node="east-1"), data), "east-1")

    def test_bad_file(self) -> None:
        data = Path(self.mktemp())
        data.mkdir()
        (data / NODE_FILE).write_text("no good\n")
        settings = config.load_string(f"data_dir = {json.dumps(str(data))}\nstore = \"memory\"\n")
        e = self.assertRaises(ConfigError, make_service, settings, MemoryReactorClock())
        self.assertIn("does not hold a node id", str(e))
        self.assertIn("data_dir", str(e))

    def test_setting(self) -> None:
        self.assertEqual(config.load_string('[cluster]\nnode = "a_b-9"\n').section("cluster").node, "a_b-9")
        e = self.assertRaises(ConfigError, config.load_string, '[cluster]\nnode = "a.b"\n')
        self.assertIn("cluster.node", str(e))
        self.assertRaises(ValueError, check_node, "x" * 33)


class RestartTests(SynchronousTestCase):
    """Ids, STOMP message-ids and HTTP receipt-handle tokens of one run are
    never those of another run."""

    def setUp(self) -> None:
        self.dir = self.mktemp()
        self.now = T0
        self.store = None
        # Each broker is a new process: the STOMP session counter starts over.
        self.patch(stomp_session, "_session_ids", itertools.count(1))

    def start(self, store: str) -> Broker:
        if self.store is not None:
            self.broker.batcher.flush_all()
            self.store.flush()
            self.successResultOf(maybeDeferred(self.store.close))
        self.clock = Clock()
        self.clock.advance(self.now)
        if store == "log":
            self.store = CommitLogStore(self.dir, reactor=self.clock, io=sync_io, compact_interval=0)
        else:
            self.store = MemoryStore()
        self.broker = Broker(self.clock, store=self.store, node="n1")
        self.broker.recover()
        self.patch(stomp_session, "_session_ids", itertools.count(1))
        self.factory = StompFactory(self.broker, StompSettings(), clock=self.clock)
        return self.broker

    def run_once(self, count: int) -> tuple[list[int], list[str]]:
        """Publish C{count} messages (half persistent) to a durable queue and
        receive them over STOMP, unacked; return their ids and message-ids."""
        channel = Channel(self.broker, self.broker.default_vhost)
        target = channel.send_target("/queue/q")
        ids = []
        for i in range(count):
            message = channel.new_message(target, None, b"%d" % i, persistent=i % 2 == 0)
            channel.publish_target(target, message)
            ids.append(message.id)
        client = Client(self.factory)
        client.connect()
        client.subscribe("/queue/q", ack="client-individual", prefetch=str(count * 4))
        self.clock.advance(0)
        wire = [f.headers["message-id"] for f in client.messages()]
        self.client = client
        return ids, wire

    def check_restarts(self, store: str, step: float) -> None:
        seen_ids: set[int] = set()
        seen_wire: set[str] = set()
        for _ in range(4):
            self.start(store)
            ids, wire = self.run_once(300)
            self.assertEqual(ids, sorted(ids))
            self.assertFalse(seen_ids & set(ids))
            self.assertFalse(seen_wire & set(wire))
            self.assertTrue(all(w.startswith(self.broker.message_ids.prefix + ".") for w in wire))
            seen_ids.update(ids)
            seen_wire.update(wire)
            self.now += step

    def test_memory_store(self) -> None:
        """The memory store keeps nothing: the clock's floor alone keeps ids
        apart: two milliseconds later is enough for 300 ids."""
        self.check_restarts("memory", 0.002)

    def test_log_store(self) -> None:
        """The commit log's recovered ids and the floor keep ids apart."""
        self.check_restarts("log", 0.002)

    def test_log_store_clock_back(self) -> None:
        """A clock set back below the last run: the log's ids still keep the
        persistent messages' ids from repeating (not those of messages it
        never kept: docs/storage.rst states it)."""
        self.start("log")
        ids, _ = self.run_once(10)
        self.now -= 3600
        self.start("log")
        again, _ = self.run_once(10)
        self.assertGreater(min(again), max(ids[::2]))

    def test_stale_ack(self) -> None:
        """An ACK naming a message-id of the previous run is refused as
        unknown: it settles nothing, not even the message that now has the
        same session number and tag."""
        self.start("log")
        _, old = self.run_once(1)
        self.start("log")
        ids, wire = self.run_once(1)
        # The recovered message and the new one: both unacked.
        self.assertEqual(len(wire), 2)
        self.assertEqual(old[0].rpartition(".")[2], wire[0].rpartition(".")[2])
        self.assertNotEqual(old[0], wire[0])
        self.client.send("ACK", {"id": old[0]})
        error = self.client.read()[-1]
        self.assertEqual(error.command, "ERROR")
        self.assertEqual(error.headers["message"], "unknown message")
        self.assertEqual(len(self.broker.default_vhost.queues["q"]), 2)


class ServiceRestartTests(SynchronousTestCase):
    def test_node_and_ids_across_service_restarts(self) -> None:
        """The service keeps one node id per data directory, and each start
        issues ids above the last start's."""
        data = Path(self.mktemp())
        text = f'data_dir = {json.dumps(str(data))}\nstore = "memory"\n'
        last = 0
        nodes = set()
        for i in range(3):
            reactor = MemoryReactorClock()
            reactor.advance(T0 + i * 0.002)
            broker = make_service(config.load_string(text), reactor).broker
            nodes.add(broker.node)
            self.assertGreater(broker.message_ids.first, last)
            for _ in range(100):
                last = next(broker.message_ids)
            self.assertTrue(broker.message_ids.prefix.startswith(broker.node + "."))
        self.assertEqual(nodes, {(data / NODE_FILE).read_text().strip()})
        named = make_service(config.load_string(text + '[cluster]\nnode = "east"\n'), MemoryReactorClock())
        self.assertEqual(named.broker.node, "east")
