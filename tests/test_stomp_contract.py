"""The STOMP session against the frontend contract, with no Twisted transport.

A L{FakeTransport} implements L{qmq.transport.ITransport} by recording
whole frames and closes, so the session is tested exactly as a WebSocket or
SockJS transport will drive it: whole frames in (C{frames_received}), whole
frames out (C{write_frames}). A L{DelayingStore} keeps every persistent
publish waiting until the test releases it, proving that receipts wait for
durability and keep their order.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from qmq.core.broker import Broker
from qmq.core.store import NullStore
from qmq.stomp import reader as reader_module
from qmq.stomp.frame import Frame, StompParser
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from qmq.transport import ITransport


@implementer(ITransport)
class FakeTransport:
    """Records what the session writes and how it closes."""

    peer = "fake:1"
    identity = None

    def __init__(self, heartbeats: bool = True) -> None:
        self.heartbeats = heartbeats
        self.batches: list[list[bytes]] = []
        self.closed: str | None = None
        self.reading = True

    def write_frames(self, frames: list[bytes]) -> None:
        self.batches.append(frames)

    def close(self, reason: str) -> None:
        self.closed = reason

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def frames(self) -> list[Frame]:
        """Every frame written so far, parsed (and forgotten)."""
        parser = StompParser()
        parser.version = "1.2"
        out = [f for batch in self.batches for data in batch for f in parser.feed(data)]
        self.batches = []
        return out


class DelayingStore(NullStore):
    """A store whose every publish waits until the test says it is durable."""

    def __init__(self) -> None:
        self.waiting: list[Deferred] = []
        self.published: list[tuple[int, list[str]]] = []
        self.flushes = 0

    def publish(self, vhost, message, queues: Sequence) -> Deferred:
        d: Deferred = Deferred()
        self.waiting.append(d)
        self.published.append((message.id, [q.name for q in queues]))
        return d

    def flush(self) -> None:
        self.flushes += 1

    def release(self, n: int | None = None) -> None:
        """Make the first C{n} (default all) waiting publishes durable, in order."""
        n = len(self.waiting) if n is None else n
        done, self.waiting = self.waiting[:n], self.waiting[n:]
        for d in done:
            d.callback(None)


class SharingStore(DelayingStore):
    """A store that hands every publish until the next L{cut} the same
    Deferred, as a group commit may (see L{qmq.core.store})."""

    def publish(self, vhost, message, queues: Sequence) -> Deferred:
        self.published.append((message.id, [q.name for q in queues]))
        if not self.waiting:
            self.waiting.append(Deferred())
        return self.waiting[-1]

    def cut(self) -> None:
        """The next publish gets a new Deferred."""
        self.waiting.append(Deferred())


def frame(command: str, body: bytes = b"", **headers: str) -> Frame:
    return Frame(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)


class ContractTestCase(SynchronousTestCase):
    settings = StompSettings()

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = DelayingStore()
        self.broker = Broker(self.clock, store=self.store)
        self.vhost = self.broker.default_vhost

    def session(self, heartbeats: bool = True, **connect: str) -> tuple[StompSession, FakeTransport]:
        transport = FakeTransport(heartbeats)
        session = StompSession(self.broker, self.settings, transport, clock=self.clock)
        headers = {"accept-version": "1.2", "heart-beat": "0,0", **connect}
        session.frames_received([Frame("CONNECT", headers)])
        self.broker.batcher.flush_all()
        [connected] = transport.frames()
        self.assertEqual(connected.command, "CONNECTED")
        return session, transport

    def send(self, session: StompSession, *frames: Frame) -> None:
        session.frames_received(list(frames))
        self.broker.batcher.flush_all()


class TransportContractTests(ContractTestCase):
    def test_fake_transport_is_an_itransport(self) -> None:
        self.assertTrue(verifyObject(ITransport, FakeTransport()))

    def test_whole_frames_out_one_call_per_turn(self) -> None:
        """The session hands its transport whole frames, one call per turn."""
        s, t = self.session()
        self.send(s, *(frame("SEND", b"%d" % i, destination="/queue/q", receipt=str(i))
                       for i in range(3)))
        self.assertEqual(len(t.batches), 1)
        self.assertEqual([bytes(b).count(b"\0") for b in t.batches[0]], [1, 1, 1])
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["0", "1", "2"])

    def test_heartbeats_offered_only_when_the_transport_carries_them(self) -> None:
        s, t = self.session(heartbeats=True)
        self.assertEqual(s.heartbeats_supported, True)
        transport = FakeTransport(heartbeats=False)
        s2 = StompSession(self.broker, self.settings, transport, clock=self.clock)
        s2.frames_received([Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "1000,1000"})])
        self.broker.batcher.flush_all()
        [connected] = transport.frames()
        self.assertEqual(connected.headers["heart-beat"], "0,0")
        # No heart-beat is sent and none is awaited: only the idle timeout applies.
        self.clock.advance(60)
        self.assertEqual(transport.batches, [])
        self.assertIsNone(transport.closed)

    def test_heartbeats_over_a_transport_that_carries_them(self) -> None:
        transport = FakeTransport(heartbeats=True)
        s = StompSession(self.broker, self.settings, transport, clock=self.clock)
        s.frames_received([Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,10000"})])
        self.broker.batcher.flush_all()
        transport.frames()
        for _ in range(4):
            self.clock.advance(5)
        self.assertIn([b"\n"], transport.batches)

    def test_error_closes_with_the_reason(self) -> None:
        s, t = self.session()
        self.send(s, frame("NOPE"))
        [error] = t.frames()
        self.assertEqual(error.command, "ERROR")
        self.assertEqual(t.closed, "unknown command")

    def test_disconnect_closes(self) -> None:
        s, t = self.session()
        self.send(s, frame("DISCONNECT", receipt="bye"))
        self.assertEqual([f.command for f in t.frames()], ["RECEIPT"])
        self.assertEqual(t.closed, "client disconnected")

    def test_reader_splits_bytes_into_frames(self) -> None:
        """A byte-stream transport feeds the session through a StompReader."""
        transport = FakeTransport()
        s = StompSession(self.broker, self.settings, transport, clock=self.clock)
        reader = StompReader(s)
        data = b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/queue/q\nreceipt:r\n\nx\x00"
        for i in range(len(data)):
            reader.data_received(data[i : i + 1])
        self.assertEqual([f.command for f in transport.frames()], ["CONNECTED", "RECEIPT"])


class DurableReceiptTests(ContractTestCase):
    """Receipts that depend on durability wait, in order, behind one funnel."""

    def setUp(self) -> None:
        super().setUp()
        self.vhost.declare_queue("d", durable=True)
        self.vhost.declare_queue("m", durable=False)

    def test_receipt_waits_for_the_store(self) -> None:
        s, t = self.session()
        self.send(s, frame("SEND", b"x", destination="/queue/d", persistent="true", receipt="1"))
        self.assertEqual(t.frames(), [])
        self.assertEqual(self.store.published, [(1, ["d"])])
        self.store.release()
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["1"])

    def test_later_receipts_keep_their_order(self) -> None:
        """A receipt that needs no store still waits behind an earlier one that does."""
        s, t = self.session()
        self.send(
            s,
            frame("SEND", b"1", destination="/queue/d", persistent="true", receipt="a"),
            frame("SEND", b"2", destination="/queue/m", receipt="b"),
            frame("SEND", b"3", destination="/queue/d", persistent="true", receipt="c"),
            frame("BEGIN", transaction="t", receipt="d"),
        )
        self.assertEqual(t.frames(), [])
        self.store.release(1)
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["a", "b"])
        self.store.release()
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["c", "d"])

    def test_store_asked_once_per_publish_and_flushed_once_per_turn(self) -> None:
        self.vhost.declare_exchange("fan", "fanout")
        self.vhost.declare_queue("d2", durable=True)
        self.vhost.bind("d", "fan")
        self.vhost.bind("d2", "fan")
        self.vhost.bind("m", "fan")
        s, t = self.session()
        self.send(s, *(frame("SEND", b"x", destination="/exchange/fan/k", persistent="true")
                       for _ in range(5)))
        self.assertEqual(len(self.store.published), 5)
        self.assertEqual(self.store.published[0][1], ["d", "d2"])
        self.assertEqual(self.store.flushes, 1)

    def test_non_persistent_never_reaches_the_store(self) -> None:
        s, t = self.session()
        self.send(s, frame("SEND", b"x", destination="/queue/d", receipt="1"),
                  frame("SEND", b"x", destination="/queue/m", persistent="TRUE", receipt="2"))
        self.assertEqual(self.store.published, [])
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["1", "2"])

    def test_disconnect_waits_for_pending_receipts(self) -> None:
        s, t = self.session()
        self.send(s, frame("SEND", b"x", destination="/queue/d", persistent="true", receipt="1"),
                  frame("DISCONNECT", receipt="bye"))
        self.assertIsNone(t.closed)
        self.store.release()
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["1", "bye"])
        self.assertEqual(t.closed, "client disconnected")

    def test_commit_receipt_waits_for_its_sends(self) -> None:
        s, t = self.session()
        self.send(
            s,
            frame("BEGIN", transaction="t"),
            frame("SEND", b"x", destination="/queue/d", persistent="true", transaction="t"),
            frame("COMMIT", transaction="t", receipt="c"),
        )
        self.assertEqual(t.frames(), [])
        self.store.release()
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["c"])

    def test_store_failure_is_an_error(self) -> None:
        s, t = self.session()
        self.send(s, frame("SEND", b"x", destination="/queue/d", persistent="true", receipt="1"))
        self.store.waiting.pop().errback(OSError("disk full"))
        self.flushLoggedErrors(OSError)
        [error] = t.frames()
        self.assertEqual(error.headers["message"], "message not stored")
        self.assertEqual(t.closed, "message not stored")


class SharedWaiterTests(ContractTestCase):
    """A store may return one Deferred for many publishes, from many sessions."""

    def setUp(self) -> None:
        super().setUp()
        self.store = SharingStore()
        self.broker = Broker(self.clock, store=self.store)

    def sends(self, s: StompSession, *receipts: str) -> None:
        self.send(s, *(frame("SEND", b"x", destination="/queue/d", persistent="true", receipt=r)
                       for r in receipts))

    def test_receipts_in_order(self) -> None:
        s1, t1 = self.session()
        s2, t2 = self.session()
        self.sends(s1, "a1", "a2")
        self.sends(s2, "b1")
        first = self.store.waiting[-1]
        self.store.cut()
        self.sends(s1, "a3")
        self.send(s1, frame("BEGIN", transaction="t", receipt="a4"))
        first.callback(None)
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t1.frames()], ["a1", "a2"])
        self.assertEqual([f.headers["receipt-id"] for f in t2.frames()], ["b1"])
        self.store.waiting[-1].callback(None)
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t1.frames()], ["a3", "a4"])

    def test_replies_between_receipts_of_one_group(self) -> None:
        """Replies that need no store, between and after receipts sharing
        one waiter, come out in order once it fires, in one batch."""
        s, t = self.session()
        self.sends(s, "a1", "a2")
        self.send(s, frame("SEND", b"x", destination="/queue/d", receipt="b1"),
                  frame("BEGIN", transaction="t", receipt="b2"))
        self.sends(s, "a3")
        self.send(s, frame("SEND", b"x", destination="/queue/d", receipt="b3"))
        self.sends(s, "a4")
        self.broker.batcher.flush_all()
        self.assertEqual(t.frames(), [])
        self.store.cut()
        self.sends(s, "c1")
        self.send(s, frame("ABORT", transaction="t", receipt="c2"))
        self.store.waiting[0].callback(None)
        self.broker.batcher.flush_all()
        self.assertEqual(len(t.batches), 1)
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()],
                         ["a1", "a2", "b1", "b2", "a3", "b3", "a4"])
        self.store.waiting[1].callback(None)
        self.broker.batcher.flush_all()
        self.assertEqual([f.headers["receipt-id"] for f in t.frames()], ["c1", "c2"])

    def test_failure_reaches_every_session(self) -> None:
        """Each session's errback passes the failure on, so a shared waiter
        that fails fails every session waiting on it (none gets a RECEIPT)."""
        s1, t1 = self.session()
        s2, t2 = self.session()
        self.sends(s1, "a1", "a2")
        self.sends(s2, "b1")
        d = self.store.waiting.pop()
        d.addErrback(lambda f: None)  # the store's own, last
        d.errback(OSError("disk full"))
        self.flushLoggedErrors(OSError)
        self.broker.batcher.flush_all()
        for t in (t1, t2):
            [error] = t.frames()
            self.assertEqual(error.headers["message"], "message not stored")


class MemoryAlarmTests(ContractTestCase):
    """A publisher is not read while the memory alarm is on; consumers drain."""

    def setUp(self) -> None:
        super().setUp()
        alarm = self.alarm = FakeAlarm()
        self.broker.memory_alarm = alarm

    def test_publisher_blocked_and_resumed(self) -> None:
        s, t = self.session()
        consumer, ct = self.session()
        self.send(consumer, frame("SUBSCRIBE", destination="/queue/q", id="s"))
        self.alarm.set(True)
        self.send(s, frame("SEND", b"x", destination="/queue/q"))
        self.assertFalse(t.reading)
        # The frame that was read is published and delivered all the same.
        self.assertEqual([f.body for f in ct.frames()], [b"x"])
        # Its silence while blocked is the broker's doing: no timeout.
        self.clock.advance(self.settings.idle_timeout * 2)
        self.assertIsNone(t.closed)
        self.alarm.set(False)
        self.assertTrue(t.reading)
        # Only admission listens to the alarm, and nobody to admission.
        self.assertEqual(len(self.alarm.callbacks), 1)
        self.assertEqual(self.broker.admission.listeners, 0)

    def test_consumer_not_blocked(self) -> None:
        s, t = self.session()
        self.alarm.set(True)
        self.send(s, frame("SUBSCRIBE", destination="/queue/q", id="s"))
        self.assertTrue(t.reading)

    def test_control_query_not_blocked(self) -> None:
        """A monitor asking /control/memory during the alarm is answered and
        still read: a control query publishes nothing."""
        s, t = self.session()
        self.alarm.set(True)
        self.send(s, frame("SEND", destination="/control/memory", receipt="m"))
        self.assertTrue(t.reading)
        [receipt] = t.frames()
        self.assertEqual(receipt.command, "RECEIPT")
        self.assertEqual(receipt.headers["memory-alarm"], "on")


class FakeAlarm:
    """What the session and /control/memory see of a L{MemoryAlarm}."""

    rss = 900
    high = 1000

    def __init__(self) -> None:
        self.active = False
        self.callbacks: list = []

    def subscribe(self, callback) -> None:
        self.callbacks.append(callback)

    def unsubscribe(self, callback) -> None:
        self.callbacks.remove(callback)

    def set(self, active: bool) -> None:
        self.active = active
        for callback in list(self.callbacks):
            callback(active)


class LimitTests(ContractTestCase):
    settings = StompSettings(max_subscriptions=2, max_transactions=2, max_transaction_frames=3)

    def test_subscription_cap(self) -> None:
        s, t = self.session()
        self.send(s, *(frame("SUBSCRIBE", destination=f"/queue/q{i}", id=str(i)) for i in range(3)))
        error = t.frames()[-1]
        self.assertEqual(error.headers["message"], "too many subscriptions")

    def test_transaction_cap(self) -> None:
        s, t = self.session()
        self.send(s, *(frame("BEGIN", transaction=str(i)) for i in range(3)))
        self.assertEqual(t.frames()[-1].headers["message"], "too many transactions")

    def test_transaction_frames_cap(self) -> None:
        s, t = self.session()
        self.send(s, frame("BEGIN", transaction="t"),
                  *(frame("SEND", b"x", destination="/queue/q", transaction="t") for _ in range(4)))
        self.assertEqual(t.frames()[-1].headers["message"], "transaction too large")

    def test_subscription_id_length(self) -> None:
        """An id longer than stomp.max_subscription_id is refused; one at
        the limit is taken."""
        s, t = self.session()
        limit = self.settings.max_subscription_id
        self.send(s, frame("SUBSCRIBE", destination="/queue/q", id="i" * limit, receipt="ok"))
        self.assertEqual(t.frames()[-1].command, "RECEIPT")
        self.send(s, frame("SUBSCRIBE", destination="/queue/q", id="j" * (limit + 1)))
        error = t.frames()[-1]
        self.assertEqual(error.headers["message"], "subscription id too long")
        self.assertIn("stomp.max_subscription_id", error.body.decode())

    def test_relayed_header_blocks_cache_bounded(self) -> None:
        """The cache of relayed SEND header blocks keeps neither long blocks
        nor more than a few dozen short ones, whatever a client sends."""
        s, t = self.session()
        reader = StompReader(s)
        for i in range(200):
            reader.data_received(b"SEND\ndestination:/topic/nobody\nx:%d\n\nb\x00" % i)
        self.assertLessEqual(len(s._blocks), 64)
        s._blocks.clear()
        for i in range(10):
            reader.data_received(
                b"SEND\ndestination:/topic/nobody\nx:%d%s\n\nb\x00" % (i, b"h" * 4000)
            )
        self.assertEqual(s._blocks, {})
        self.assertIsNone(t.closed)

    def test_unfinished_frames_budget(self) -> None:
        """Clients holding half-sent frames share one broker-wide budget."""
        self.broker.max_unfinished_bytes = 1000
        readers = []
        for _ in range(3):
            transport = FakeTransport()
            session = StompSession(self.broker, self.settings, transport, clock=self.clock)
            reader = StompReader(session)
            reader.data_received(b"CONNECT\naccept-version:1.2\n\n\x00")
            reader.data_received(b"SEND\ndestination:/queue/q\ncontent-length:5000\n\n" + b"x" * 400)
            readers.append((session, transport))
        self.assertEqual([t.closed for _, t in readers], [None, None, "broker busy"])
        self.assertEqual(self.broker.unfinished_bytes, sum(s.unfinished for s, _ in readers[:2]))
        readers[0][0].connection_lost()
        readers[1][0].connection_lost()
        self.assertEqual(self.broker.unfinished_bytes, 0)


class ReaderTurnBudgetTests(ContractTestCase):
    """A read whose frames take longer than the turn's budget is acted on
    over several reactor turns, in order, without reading meanwhile."""

    def setUp(self) -> None:
        super().setUp()
        self.ticks = 0.0

        def now() -> float:
            self.ticks += 0.001  # each look at the clock: 1 ms of work
            return self.ticks

        self.patch(reader_module, "_now", now)
        self.patch(reader_module, "TURN_BUDGET", 0.005)

    def turn(self) -> None:
        """One reactor turn: what is due now, not what that schedules."""
        due = list(self.clock.calls)
        self.clock.calls.clear()
        for call in due:
            call.called = True
            call.func(*call.args, **call.kw)
        self.broker.batcher.flush_all()

    def sends(self, first: int, n: int) -> bytes:
        return b"".join(
            b"SEND\ndestination:/queue/q\nreceipt:%d\n\nx\x00" % i for i in range(first, first + n)
        )

    def receipts(self, t: FakeTransport) -> list[str]:
        return [f.headers["receipt-id"] for f in t.frames() if f.command == "RECEIPT"]

    def test_heavy_read_marks_the_connection(self) -> None:
        """A read that took longer than the budget makes the connection's
        next reads sliced; a light sliced read makes it light again."""
        s, t = self.session()
        reader = StompReader(s)
        self.patch(reader_module, "TURN_BUDGET", 0.0005)
        reader.data_received(self.sends(0, 10))
        self.assertTrue(reader.heavy)
        self.patch(reader_module, "TURN_BUDGET", 1.0)
        reader.data_received(self.sends(10, 10))
        self.assertFalse(reader.heavy)

    def test_rest_waits_for_the_next_turn(self) -> None:
        s, t = self.session()
        reader = StompReader(s)
        reader.heavy = True  # an earlier read took long
        reader.data_received(self.sends(0, 200))
        self.broker.batcher.flush_all()
        first = self.receipts(t)
        self.assertEqual(first, [str(i) for i in range(len(first))])
        self.assertLess(len(first), 200)
        self.assertFalse(t.reading)
        # Bytes read meanwhile (the transport may deliver some) go after.
        reader.data_received(self.sends(200, 5))
        got = first
        for _ in range(20):
            if t.reading:
                break
            self.turn()
            got += self.receipts(t)
        self.assertEqual(got, [str(i) for i in range(205)])
        self.assertTrue(t.reading)
        self.assertEqual(len(self.vhost.queues["q"]), 205)

    def test_small_reads_untouched(self) -> None:
        """A read of at most one slice never looks at the clock."""
        s, t = self.session()
        StompReader(s).data_received(self.sends(0, reader_module.FIRST_SLICE))
        self.assertEqual(self.ticks, 0.0)
        self.assertTrue(t.reading)

    def test_alarm_keeps_reading_off(self) -> None:
        """A session blocked by the memory alarm while frames wait stays
        unread after they are done."""
        alarm = FakeAlarm()
        self.broker.memory_alarm = alarm
        s, t = self.session()
        reader = StompReader(s)
        reader.heavy = True
        reader.data_received(self.sends(0, 200))
        alarm.set(True)
        for _ in range(20):
            self.turn()
        self.assertEqual(len(self.vhost.queues["q"]), 200)
        self.assertTrue(s.reading_blocked)
        self.assertFalse(t.reading)
        alarm.set(False)
        self.assertTrue(t.reading)

    def test_connection_lost_drops_what_waits(self) -> None:
        s, t = self.session()
        reader = StompReader(s)
        reader.heavy = True
        reader.data_received(self.sends(0, 200))
        self.assertEqual(len(self.clock.getDelayedCalls()) > 0, True)
        reader.connection_lost()
        s.connection_lost()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class ReleaseMemoryTests(ContractTestCase):
    def test_big_unfinished_frame_gone_trims_once(self) -> None:
        """Connections dropped while holding megabytes of unfinished frames
        ask for one heap trim, shortly after; small ones never do."""
        trims = []
        self.broker.trim = lambda: trims.append(1)
        for size in (2 << 20, 3 << 20, 100):
            s, t = self.session()
            reader = StompReader(s)
            reader.data_received(
                b"SEND\ndestination:/queue/q\ncontent-length:%d\n\n" % (size + 10) + b"x" * size
            )
            s.connection_lost()
        self.assertEqual(trims, [])
        self.clock.advance(1)
        self.assertEqual(trims, [1])
        s, t = self.session()
        StompReader(s).data_received(b"SEND\ndestination:/queue/q\ncontent-length:900\n\nxx")
        s.connection_lost()
        self.clock.advance(1)
        self.assertEqual(trims, [1])

    def test_closing_reader_drops_the_unfinished_frame(self) -> None:
        """A reader told the connection is closing holds no partial frame
        through the close grace."""
        s, t = self.session()
        reader = StompReader(s)
        reader.data_received(b"SEND\ndestination:/queue/q\ncontent-length:9000\n\n" + b"x" * 5000)
        self.assertGreater(reader.parser.pending_bytes, 5000)
        reader.discard()
        self.assertEqual(reader.parser.pending_bytes, 0)
        self.assertEqual(reader.parser.feed(b"SEND\ndestination:/queue/q\n\nok\x00")[0].body, b"ok")
