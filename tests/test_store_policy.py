"""Tests for the commit log's per-queue and per-virtual-host fsync policies,
the flags of queue declarations, and reading a log of format 1."""

from __future__ import annotations

import os
import struct
import zlib

from twisted.internet.defer import Deferred

from qmq.core.broker import Broker
from qmq.core.errors import PreconditionFailed
from qmq.store.log import CommitLogStore
from qmq.store.record import (
    DECLARE_BINARY,
    RECORD_DECLARE_QUEUE,
    RECORD_SETTLE,
    VERSION,
    decode_declare_queue,
    decode_topology,
    encode_declare_queue,
    encode_publish,
    encode_settle,
    encode_topology,
    frame,
)
from qmq.store.segment import encode_header, list_segments, read_segment, segment_name
from tests.test_store_log import StoreTestCase, records, sync_io


class FsyncPolicyTests(StoreTestCase):
    fsync = "always"

    def publish(self, *queues: str):
        qs = tuple(self.vhost.queue(q) for q in queues)
        m = self.broker.new_message("", queues[0], None, b"x", persistent=True)
        return self.vhost.publish_to(qs, m)

    def synced(self, f) -> tuple:
        """What C{f} returns, and whether the batch it made was synced."""
        self.turn()
        before = len(self.syncs)
        result = f()
        self.turn()
        return result, len(self.syncs) > before

    def test_queue_policy(self) -> None:
        """x-fsync on a queue overrides the store's policy for its publishes:
        "never" confirms at once and syncs nothing; "always" waits for the
        sync."""
        self.vhost.declare_queue("loose", arguments={"x-fsync": "never"})
        self.vhost.declare_queue("strict")
        result, synced = self.synced(lambda: self.publish("loose"))
        self.assertEqual((result, synced), (None, False))
        result, synced = self.synced(lambda: self.publish("strict"))
        self.assertIsInstance(result, Deferred)
        self.assertTrue(synced)
        self.successResultOf(result)

    def test_strictest(self) -> None:
        """A message routed to several queues waits for the strictest."""
        self.vhost.declare_queue("never", arguments={"x-fsync": "never"})
        self.vhost.declare_queue("interval", arguments={"x-fsync": "interval"})
        self.vhost.declare_queue("always", arguments={"x-fsync": "always"})
        result, synced = self.synced(lambda: self.publish("never", "interval"))
        self.assertEqual((result, synced), (None, False))
        # ... but the interval's sync comes.
        before = len(self.syncs)
        self.clock.advance(1)
        self.assertEqual(len(self.syncs), before + 1)
        result, synced = self.synced(lambda: self.publish("never", "always", "interval"))
        self.assertTrue(synced)
        self.successResultOf(result)

    def test_vhost_policy(self) -> None:
        """A virtual host's fsync is the default of its queues; a queue's
        own x-fsync wins."""
        other = self.broker.add_vhost("relaxed")
        other.fsync = "never"
        other.declare_queue("q")
        other.declare_queue("strict", arguments={"x-fsync": "always"})
        self.turn()
        m = self.broker.new_message("", "q", None, b"x", persistent=True)
        self.assertIsNone(other.publish_to((other.queue("q"),), m))
        m = self.broker.new_message("", "strict", None, b"x", persistent=True)
        self.assertIsInstance(other.publish_to((other.queue("strict"),), m), Deferred)

    def test_bad_policy(self) -> None:
        e = self.assertRaises(
            PreconditionFailed, self.vhost.declare_queue, "q", arguments={"x-fsync": "often"}
        )
        self.assertIn("x-fsync must be one of always, interval, never", str(e))

    def test_kept_and_recovered(self) -> None:
        """Messages of a "never" queue are written and come back after a
        clean restart."""
        self.vhost.declare_queue("loose", arguments={"x-fsync": "never"})
        self.publish("loose")
        self.restart()
        self.assertEqual(len(self.ready("loose")), 1)
        self.assertEqual(self.vhost.queue("loose").policy.fsync, "never")


class NeverStoreTests(StoreTestCase):
    fsync = "never"

    def test_queue_always_on_a_never_store(self) -> None:
        """A queue asking for "always" gets its sync and its wait even when
        the store's policy is "never"."""
        self.vhost.declare_queue("strict", arguments={"x-fsync": "always"})
        self.turn()
        before = len(self.syncs)
        m = self.broker.new_message("", "strict", None, b"x", persistent=True)
        d = self.vhost.publish_to((self.vhost.queue("strict"),), m)
        self.assertIsInstance(d, Deferred)
        self.turn()
        self.assertEqual(len(self.syncs), before + 1)
        self.successResultOf(d)


class FlagTests(StoreTestCase):
    def test_auto_delete(self) -> None:
        """A durable auto-delete queue comes back auto-delete."""
        self.vhost.declare_queue("ad", auto_delete=True)
        self.send("ad", b"x")
        self.restart()
        q = self.vhost.queue("ad")
        self.assertTrue(q.auto_delete)
        self.assertEqual(len(q), 1)

    def test_exclusive(self) -> None:
        """A durable exclusive queue belonged to a connection a restart
        ended: it does not come back, nor do its messages."""
        self.vhost.declare_queue("ex", exclusive_owner=object())
        self.send("ex", b"x")
        self.restart()
        self.assertNotIn("ex", self.vhost.queues)
        self.restart()
        self.assertNotIn("ex", self.vhost.queues)
        self.assertEqual(self.store._index.live_messages(), 0)

    def test_subscription_by_flag_not_name(self) -> None:
        """A durable subscription's queue comes back as one (never expiring)
        by its flag; a queue merely named durable.* does not."""
        self.vhost.set_queue_defaults({"x-expires": 60000})
        self.vhost.declare_queue("sub", on_demand=True, subscription=True)
        self.vhost.declare_queue("durable.fake", on_demand=True)
        self.turn()
        self.successResultOf(self.store.close())
        self.store = CommitLogStore(self.dir, reactor=self.clock, io=sync_io, compact_interval=0)
        self.broker = Broker(self.clock, store=self.store)
        self.vhost = self.broker.default_vhost
        self.vhost.set_queue_defaults({"x-expires": 60000})
        self.broker.recover()
        self.assertTrue(self.vhost.queue("sub").subscription)
        self.assertIsNone(self.vhost.queue("sub").policy.expires)
        self.assertFalse(self.vhost.queue("durable.fake").subscription)
        self.assertEqual(self.vhost.queue("durable.fake").policy.expires, 60000)

    def test_record_fields(self) -> None:
        """The declare-queue record carries its flags and since (binary
        since format 3; decode_topology gives the fields by name, as the
        JSON of format 2 named them)."""
        self.vhost.declare_queue("ad", auto_delete=True)
        self.turn()
        (path,) = [p for _, p in list_segments(self.dir)]
        data = read_segment(path)
        (fields,) = [
            decode_topology(data, s, e, t) for t, s, e in records(path) if t == RECORD_DECLARE_QUEUE
        ]
        self.assertEqual(
            fields,
            {
                "vhost": "/",
                "queue": "ad",
                "arguments": None,
                "since": 1,
                "auto_delete": True,
                "exclusive": False,
                "subscription": False,
            },
        )


def v1_segment(number: int, body: bytes, version: int = 1) -> bytes:
    """A segment of format 1 (or C{version}): its header, then C{body} (records)."""
    header = bytearray(encode_header(number, 1))
    struct.pack_into("<H", header, 8, version)
    struct.pack_into("<I", header, 28, zlib.crc32(bytes(header[:28])))
    return bytes(header) + body


class FormatOneTests(StoreTestCase):
    def test_reads_format_one(self) -> None:
        """A log of format 1 (declarations without flags, settles without a
        time) is read: a queue named durable.* is taken for a durable
        subscription, as format 1 left no other way to tell; new records go
        to a new segment of the current format."""
        self.successResultOf(self.store.close())
        for _, path in list_segments(self.dir):
            os.unlink(path)
        recs = [
            encode_topology(RECORD_DECLARE_QUEUE, {"vhost": "/", "queue": q, "arguments": None})
            for q in ("durable.me.s", "plain")
        ]
        for mid, q in ((1, "durable.me.s"), (2, "plain"), (3, "plain")):
            head, tail = encode_publish(
                mid, 5.0, 0.0, 0, True, b"/", "", q, None, b"m%d" % mid, [q.encode()]
            )
            recs.append(head + tail)
        recs.append(encode_settle(b"/", b"plain", 2, "ack"))
        with open(os.path.join(self.dir, segment_name(7)), "wb") as f:
            f.write(v1_segment(7, b"".join(recs)))
        self.vhost.set_queue_defaults({"x-expires": 1000})
        self.start()
        self.assertEqual(self.store.problems, [])
        sub = self.vhost.queue("durable.me.s")
        self.assertTrue(sub.subscription)
        self.assertEqual([m.body for m in sub.messages()], [b"m1"])
        self.assertEqual([m.body for m in self.vhost.queue("plain").messages()], [b"m3"])
        # Scans see the old records too (format 1 had no "since").
        page = self.successResultOf(self.vhost.scan("plain", 0, 10))
        self.assertEqual([m.id for m in page.messages], [2, 3])
        self.send("plain", b"new")
        self.turn()
        numbers = [n for n, _ in list_segments(self.dir)]
        self.assertEqual(numbers, [7, 8])
        self.assertEqual(
            struct.unpack_from("<H", read_segment(list_segments(self.dir)[1][1]), 8)[0], VERSION
        )
        self.restart()
        self.assertEqual([m.body for m in self.vhost.queue("plain").messages()], [b"m3", b"new"])

    def test_reads_format_two(self) -> None:
        """A log of format 2 (JSON declarations with flags and since) is
        read as it was: queues with their arguments and flags, messages
        back; new records go to a new segment of format 3, and both are
        read at the next start."""
        self.successResultOf(self.store.close())
        for _, path in list_segments(self.dir):
            os.unlink(path)
        recs = [
            encode_topology(
                RECORD_DECLARE_QUEUE,
                {
                    "vhost": "/",
                    "queue": q,
                    "arguments": args,
                    "since": 1,
                    "auto_delete": ad,
                    "exclusive": False,
                    "subscription": False,
                },
            )
            for q, args, ad in (("a", {"x-max-length": 5}, False), ("b", None, True))
        ]
        for mid, q in ((1, "a"), (2, "b")):
            head, tail = encode_publish(
                mid, 5.0, 0.0, 0, True, b"/", "", q, {"destination": "/queue/" + q}, b"m", [q.encode()]
            )
            recs.append(head + tail)
        with open(os.path.join(self.dir, segment_name(3)), "wb") as f:
            f.write(v1_segment(3, b"".join(recs), version=2))
        self.start()
        self.assertEqual(self.store.problems, [])
        self.assertEqual(self.vhost.queue("a").policy.max_length, 5)
        self.assertTrue(self.vhost.queue("b").auto_delete)
        self.assertEqual([len(self.vhost.queue(q)) for q in "ab"], [1, 1])
        self.vhost.declare_queue("c", arguments={"x-max-length": 7})
        self.send("c", b"new")
        self.turn()
        self.assertEqual([n for n, _ in list_segments(self.dir)], [3, 4])
        data = read_segment(list_segments(self.dir)[1][1])
        self.assertEqual(struct.unpack_from("<H", data, 8)[0], VERSION)
        (start,) = [s for t, s, _ in records(list_segments(self.dir)[1][1]) if t == RECORD_DECLARE_QUEUE]
        self.assertEqual(data[start], DECLARE_BINARY)
        self.restart()
        self.assertEqual(self.store.problems, [])
        self.assertEqual(self.vhost.queue("a").policy.max_length, 5)
        self.assertEqual(self.vhost.queue("c").policy.max_length, 7)
        self.assertEqual([len(self.vhost.queue(q)) for q in "abc"], [1, 1, 1])

    def test_binary_declaration(self) -> None:
        """A format 3 declaration round-trips: names (not ASCII too),
        arguments or none, flags or none (a copy of a format 1 one)."""
        for vhost, queue, args, since, flags in (
            ("/", "q", None, 1, 0),
            ("vé", "ü" * 300, {"x-max-length": 3, "x-overflow": "drop-head"}, 2**40, 5),
            ("/", "old", {}, 0, None),
        ):
            rec = encode_declare_queue(vhost, queue, args, since, flags)
            self.assertEqual(rec[4], RECORD_DECLARE_QUEUE)
            self.assertEqual(
                decode_declare_queue(rec, 9, len(rec)), (vhost, queue, args, flags, since)
            )
            fields = decode_topology(rec, 9, len(rec), RECORD_DECLARE_QUEUE)
            self.assertEqual((fields["queue"], fields["since"]), (queue, since))
            self.assertEqual("auto_delete" in fields, flags is not None)

    def test_settle_with_time(self) -> None:
        """A settle record with a time decodes; the frame is the documented one."""
        from qmq.store.record import decode_settle

        rec = encode_settle(b"/", b"q", 9, "ack", 1234.5)
        self.assertEqual(rec[4], RECORD_SETTLE)
        self.assertEqual(decode_settle(rec, 9, len(rec)), ("/", "q", 9, "ack", 1234.5))
        plain = encode_settle(b"/", b"q", 9, "drop")
        self.assertEqual(decode_settle(plain, 9, len(plain)), ("/", "q", 9, "drop", 0.0))
        self.assertEqual(len(rec), len(plain) + 8)
        self.assertEqual(frame(RECORD_SETTLE, plain[9:]), plain)
