"""The commit log on a disk that fills and empties (ENOSPC injected; the
real full disk is in tests/integration/test_disk_full.py).

A write that fails refuses what waited for it and every persistent publish
after it, whatever the queue's fsync policy; the store keeps its records,
retries on its clock, cuts the torn tail, writes them, and says so in the
log; admission holds persistent publishers back meanwhile.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.store.failure import StoreFailed
from qmq.store.log import CommitLogStore
from tests.test_store_log import Taker, sync_io


class FullDisk:
    """Stands in for the segment writer's C{write}: while C{full}, half of
    the data goes out and the rest fails with ENOSPC (a torn record)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.write = writer.write
        self.full = False
        self.refused = 0
        writer.write = self

    def __call__(self, data: bytes) -> None:
        if self.full:
            self.refused += 1
            os.write(self.writer.fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.write(data)


class DiskFullTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = self.mktemp()
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.start()

    def start(self, **kw: Any) -> Broker:
        kw.setdefault("compact_interval", 0)
        self.clock = Clock()
        self.store = CommitLogStore(self.dir, reactor=self.clock, io=sync_io, **kw)
        self.broker = Broker(self.clock, store=self.store)
        self.vhost = self.broker.default_vhost
        self.broker.recover()
        self.disk = FullDisk(self.store._writer)
        return self.broker

    def restart(self, **kw: Any) -> Broker:
        self.turn()
        self.successResultOf(self.store.close())
        return self.start(**kw)

    def turn(self) -> None:
        self.broker.batcher.flush_all()
        self.store.flush()
        self.clock.advance(0)

    def publish(self, queue: str, body: bytes) -> tuple[Any, list]:
        """Publish persistently to C{queue}; the answer: the waiter and a
        list that gets "ok" or the failure's type when it fires."""
        q = self.vhost.queues[queue]
        w = self.vhost.publish_to((q,), self.broker.new_message("", queue, None, body, True))
        seen: list = []
        if w is None:
            seen.append("no wait")
        else:
            w.addCallbacks(lambda r: seen.append("ok") or r, lambda f: seen.append(f.type) or f)
        return w, seen

    def logged(self, text: str) -> list[dict]:
        return [e for e in self.events if text in (e.get("log_format") or "")]

    def test_refused_kept_retried_recovered(self) -> None:
        q = self.vhost.declare_queue("q", durable=True)
        _, one = self.publish("q", b"one")
        self.turn()
        self.assertEqual(one, ["ok"])
        self.disk.full = True
        _, two = self.publish("q", b"two")
        self.turn()
        self.assertEqual(two, [StoreFailed])
        hold = self.broker.admission.refusal(True)
        self.assertEqual(hold.name, "store")
        self.assertIn("No space left on device (ENOSPC)", hold.detail)
        self.assertTrue(self.broker.admission.admits(False))
        [failed] = self.logged("failed ({why})")
        self.assertEqual(failed["log_level"].name, "error")
        self.assertEqual(failed["directory"], self.dir)
        self.assertNotIn(self.dir, hold.detail, "clients are not told the data directory")
        # While it cannot write: refused at once, nothing written.
        _, three = self.publish("q", b"three")
        self.turn()
        self.assertEqual(three, [StoreFailed])
        # A consumer drains meanwhile; its ack is kept for the retry.
        taker = Taker()
        q.add_consumer(taker)
        self.assertEqual([m.body for m, _ in taker.got], [b"one", b"two", b"three"])
        taker.ack_all()
        self.turn()
        self.clock.advance(self.store.retry_interval)  # still full: retried, refused
        self.assertGreaterEqual(self.disk.refused, 2)
        self.assertEqual(self.store.recoveries, 0)
        self.assertEqual(len(self.logged("failed ({why})")), 1, "logged once")
        self.disk.full = False
        self.clock.advance(self.store.retry_interval)
        self.assertEqual(self.store.recoveries, 1)
        self.assertIsNone(self.store.failure)
        self.assertFalse(self.broker.admission.closed)
        self.assertEqual(len(self.logged("writing again after")), 1)
        _, four = self.publish("q", b"four")
        self.turn()
        self.assertEqual(four, ["ok"])
        self.flushLoggedErrors(OSError)
        # After a restart: no damage (the torn tail was cut before the
        # retry), the acks kept, the receipted message there.
        self.restart()
        self.assertEqual(self.store.problems, [])
        self.assertEqual([m.body for m in self.vhost.queues["q"].messages()], [b"four"])

    def test_fsync_always_queue_never_confirmed_while_failed(self) -> None:
        """A queue's own fsync "always" under a store-wide "never": once a
        write failed, its publishes are refused, not answered by the
        store-wide policy (which would confirm at once)."""
        self.restart(fsync="never")
        self.vhost.declare_queue("lax", durable=True)
        self.vhost.declare_queue("strict", durable=True, arguments={"x-fsync": "always"})
        w, lax = self.publish("lax", b"a")
        self.assertIsNone(w)  # "never": confirmed at once, as configured
        self.disk.full = True
        self.turn()
        w, strict = self.publish("strict", b"b")
        self.assertIsInstance(w, Deferred)
        self.turn()
        self.assertEqual(strict, [StoreFailed])
        w, lax = self.publish("lax", b"c")
        self.assertIsInstance(w, Deferred, "no confirmation while the store cannot write")
        self.turn()
        self.assertEqual(lax, [StoreFailed])
        self.flushLoggedErrors(OSError)

    def test_close_while_failed(self) -> None:
        """Closing tries once more; if the disk is still full it says what
        was not written, and the store closes all the same."""
        self.vhost.declare_queue("q", durable=True)
        self.disk.full = True
        self.publish("q", b"x")
        self.turn()
        d = self.store.close()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(len(self.logged("closed while it could not write")), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.flushLoggedErrors(OSError)

    def test_close_after_space_returned(self) -> None:
        """Closing while failed writes what was kept if it can."""
        self.vhost.declare_queue("q", durable=True)
        self.disk.full = True
        self.publish("q", b"refused")
        self.turn()
        self.disk.full = False
        self.restart()
        self.assertEqual(self.store.problems, [])
        self.assertEqual(self.store.recoveries, 0)
        # Refused, yet written by the retry at close (it was in the queue).
        self.assertEqual([m.body for m in self.vhost.queues["q"].messages()], [b"refused"])
        self.flushLoggedErrors(OSError)




class RecoveryProgressTests(SynchronousTestCase):
    """Replaying a large log says what it reads, how far it got every
    PROGRESS_EVERY seconds, and when it is done, before listeners bind."""

    def test_progress_lines(self) -> None:
        directory = self.mktemp()
        clock = Clock()
        store = CommitLogStore(directory, reactor=clock, io=sync_io, segment_size=4096,
                               compact_interval=0)
        broker = Broker(clock, store=store)
        broker.recover()
        q = broker.default_vhost.declare_queue("q", durable=True)
        for i in range(200):
            broker.default_vhost.publish_to((q,), broker.new_message("", "q", None, b"x" * 100, True))
            if i % 20 == 19:
                broker.batcher.flush_all()
                store.flush()
        broker.batcher.flush_all()
        self.successResultOf(store.close())

        ticks = iter(range(0, 10_000))  # one second a segment
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        again = CommitLogStore(directory, reactor=Clock(), io=sync_io, segment_size=4096,
                               compact_interval=0, progress_clock=lambda: float(next(ticks)))
        self.addCleanup(again.close)
        recovery = again.recover()
        self.assertEqual(len(recovery.messages[("/", "q")]), 200)
        lines = [e for e in events if (e.get("log_namespace") or "").startswith("qmq.store")]
        texts = [e["log_format"] for e in lines]
        self.assertIn("commit log: recovering", texts[0])
        self.assertIn("listeners bind once it is done", texts[0])
        segments = lines[0]["segments"]
        self.assertGreater(segments, 5)
        steps = [e for e in lines if "recovery at" in e["log_format"]]
        # Every other segment (a line at most every 2 s of the fake clock).
        self.assertEqual(len(steps), (segments - 1) // 2)
        self.assertEqual([e["done"] for e in steps], list(range(2, segments, 2)))
        percents = [e["percent"] for e in steps]
        self.assertEqual(percents, sorted(percents))
        self.assertTrue(0 < percents[0] < percents[-1] < 100)
        self.assertIn("commit log: recovered", texts[-1])
        self.assertEqual(lines[-1]["messages"], 200)
