"""Exchange-to-exchange bindings on the commit log: a binding between two
durable exchanges is stored (records C{bind-exchange}/C{unbind-exchange}),
comes back after a restart, goes with an unbind or a deleted exchange, and
compaction carries it forward; a reader that does not know the records
skips them whole (docs/storage.rst)."""

from __future__ import annotations

import io
from argparse import Namespace

from qmq.store import segment as segment_module
from qmq.store.record import (
    RECORD_BIND_EXCHANGE,
    RECORD_NAMES,
    RECORD_UNBIND_EXCHANGE,
    TOPOLOGY_RECORDS,
)
from qmq.store.tool import cmd_count, cmd_dump
from tests.test_store_log import StoreTestCase, Taker, records


class ExchangeBindingStoreTests(StoreTestCase):
    def topology(self, durable: bool = True) -> None:
        """C{src} (topic) -> C{dst} (fanout) -> queue C{q}; only the
        exchange-to-exchange binding is in question."""
        self.vhost.declare_exchange("src", "topic")
        self.vhost.declare_exchange("dst", "fanout", durable=durable)
        self.vhost.declare_queue("q")
        self.vhost.bind("q", "dst")

    def routed(self, key: str) -> list[bytes]:
        """Publish a persistent message to C{src} with C{key}; the bodies
        C{q} holds."""
        self.send(key, key.encode(), exchange="src")
        return [body for _, body, _ in self.ready("q")]

    def kinds(self) -> list[int]:
        self.turn()
        return [t for path in self.segments() for t, _, _ in records(path)]

    def test_survives_restart(self) -> None:
        """A binding made before a restart routes after it, with its key."""
        self.topology()
        self.vhost.bind_exchange("dst", "src", "a.*", {"x-note": "kept"})
        self.assertEqual(self.routed("a.b"), [b"a.b"])
        self.restart()
        self.assertEqual(self.routed("a.c"), [b"a.b", b"a.c"])
        self.assertEqual(self.routed("b.c"), [b"a.b", b"a.c"])
        src = self.vhost.exchange("src")
        self.assertEqual(src.e2e, 1)
        self.assertEqual(
            self.vhost.exchange("dst").sources, [(src, "a.*", {"x-note": "kept"})]
        )
        # Recovery writes nothing again: the record is known.
        before = self.kinds().count(RECORD_BIND_EXCHANGE)
        self.restart()
        self.assertEqual(self.kinds().count(RECORD_BIND_EXCHANGE), before)
        self.assertEqual(self.routed("a.d")[-1], b"a.d")

    def test_built_in_source(self) -> None:
        """A built-in exchange is durable: a binding from it is stored."""
        self.topology()
        self.vhost.bind_exchange("dst", "amq.topic", "t.#")
        self.restart()
        self.send("t.x", b"t", exchange="amq.topic")
        self.assertEqual([b for _, b, _ in self.ready("q")], [b"t"])

    def test_unbind_survives_restart(self) -> None:
        """An unbind is stored too: after a restart nothing routes."""
        self.topology()
        self.vhost.bind_exchange("dst", "src", "a.*")
        self.vhost.unbind_exchange("dst", "src", "a.*")
        self.assertEqual(self.kinds().count(RECORD_UNBIND_EXCHANGE), 1)
        self.restart()
        self.assertEqual(self.routed("a.b"), [])
        self.assertEqual(self.vhost.exchange("src").e2e, 0)
        self.assertEqual(self.store._index.exchange_bindings, {})

    def test_deleted_exchange_takes_its_bindings(self) -> None:
        """Deleting either end drops the binding for good: the exchange
        declared again after a restart is not bound."""
        for deleted in ("src", "dst"):
            self.dir = self.mktemp()
            self.start()
            self.topology()
            self.vhost.bind_exchange("dst", "src", "#")
            self.vhost.delete_exchange(deleted)
            self.restart()
            self.vhost.declare_exchange("src", "topic")
            self.vhost.declare_exchange("dst", "fanout")
            self.vhost.bind("q", "dst")
            self.assertEqual(self.routed("a"), [], deleted)
            self.assertEqual(self.store._index.exchange_bindings, {}, deleted)
            self.turn()
            self.successResultOf(self.store.close())

    def test_deleted_exchange_in_the_index(self) -> None:
        """Replay drops a binding whose exchange a delete-exchange record
        removed even with no unbind record before it (what the vhost always
        writes, but the index does not rely on it)."""
        self.topology()
        self.store.bind_exchange(
            self.vhost, self.vhost.exchange("dst"), self.vhost.exchange("src"), "k", None
        )
        self.store.delete_exchange(self.vhost, self.vhost.exchange("dst"))
        self.assertEqual(self.store._index.exchange_bindings, {})

    def test_transient_end_not_stored(self) -> None:
        """A binding to or from a transient exchange is not stored (it
        would name an exchange a restart does not bring back)."""
        self.topology(durable=False)
        self.vhost.bind_exchange("dst", "src", "a.*")
        self.vhost.unbind_exchange("dst", "src", "a.*")
        kinds = self.kinds()
        self.assertNotIn(RECORD_BIND_EXCHANGE, kinds)
        self.assertNotIn(RECORD_UNBIND_EXCHANGE, kinds)

    def test_compaction_carries_it(self) -> None:
        """A binding in an old segment is copied forward; the segment goes."""
        self.restart(segment_size=4096)
        self.topology()
        self.vhost.bind_exchange("dst", "src", "a.*")
        self.turn()
        taker = Taker()
        self.vhost.declare_queue("fast").add_consumer(taker)
        for _ in range(200):
            self.send("fast", b"f" * 300)
            taker.ack_all()
            self.turn()
        first = self.segments()[0]
        self.assertIsNotNone(self.store.compact())
        self.turn()
        self.store.compact()
        self.turn()
        self.assertNotIn(first, self.segments())
        self.restart(segment_size=4096)
        self.assertEqual(self.routed("a.b"), [b"a.b"])
        self.assertEqual(self.store.problems, [])

    def test_tool(self) -> None:
        """C{qmq-store dump} names the records; C{count} counts them."""
        self.topology()
        self.vhost.bind_exchange("dst", "src", "a.*")
        self.turn()
        out = io.StringIO()
        cmd_dump(self.dir, out, Namespace(bodies=False))
        self.assertIn('bind-exchange {"arguments": null, "destination": "dst"', out.getvalue())
        out = io.StringIO()
        cmd_count(self.dir, out, Namespace())
        self.assertIn("1 exchange-to-exchange bindings", out.getvalue())

    def test_unknown_to_an_older_reader(self) -> None:
        """A reader that does not know the record types (an older QMQ)
        skips them whole and reads everything else."""
        self.assertIn(RECORD_BIND_EXCHANGE, TOPOLOGY_RECORDS)
        self.topology()
        self.vhost.bind_exchange("dst", "src", "a.*")
        self.send("q", b"kept")
        older = {
            k: v
            for k, v in RECORD_NAMES.items()
            if k not in (RECORD_BIND_EXCHANGE, RECORD_UNBIND_EXCHANGE)
        }
        self.patch(segment_module, "RECORD_NAMES", older)
        self.restart()
        self.assertEqual([b for _, b, _ in self.ready("q")], [b"kept"])
        self.assertEqual(self.vhost.exchange("src").e2e, 0)
        self.assertEqual(
            [p.detail for p in self.store.problems], ["unknown record type 10, skipped"]
        )
