"""L{qmq.stream.BatchedOutput}: what the STOMP and AMQP sessions write in a
reactor turn goes to their transport in one call at its end."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.amqp.session import AmqpSession
from qmq.core.batch import WriteBatcher
from qmq.stomp.session import StompSession
from qmq.stream import BatchedOutput


class _Transport:
    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []

    def write_frames(self, frames: list[bytes]) -> None:
        self.calls.append(list(frames))


class _Session(BatchedOutput):
    def __init__(self, batcher: WriteBatcher, threshold: int = 100) -> None:
        self.closed = False
        self.transport = _Transport()
        self.init_output(batcher, threshold)


class BatchedOutputTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.batcher = WriteBatcher(self.clock)

    def test_one_write_a_turn(self) -> None:
        s = _Session(self.batcher)
        s.write_frame(b"a")
        s.write_frames([b"b", b"c"])
        s.write_frame(b"d")
        self.assertEqual(s.transport.calls, [])
        self.clock.advance(0)
        self.assertEqual(s.transport.calls, [[b"a", b"b", b"c", b"d"]])
        self.assertTrue(s.wrote)

    def test_held_turn_flushes_on_release(self) -> None:
        s = _Session(self.batcher)
        self.batcher.hold()
        s.write_frame(b"a")
        s.write_frame(b"b")
        self.batcher.release()
        self.assertEqual(s.transport.calls, [[b"a", b"b"]])

    def test_threshold_flushes_early(self) -> None:
        s = _Session(self.batcher, threshold=10)
        s.write_frame(b"x" * 6)
        s.write_frame(b"y" * 6)
        self.assertEqual(s.transport.calls, [[b"x" * 6, b"y" * 6]])
        s.write_frames([b"z" * 11])
        self.assertEqual(len(s.transport.calls), 2)
        self.clock.advance(0)
        self.assertEqual(len(s.transport.calls), 2)  # nothing left to write

    def test_closed_writes_nothing(self) -> None:
        s = _Session(self.batcher)
        s.wrote = False
        s.write_frame(b"a")
        s.closed = True
        self.clock.advance(0)
        self.assertEqual(s.transport.calls, [])
        self.assertEqual(s._out, [])

    def test_both_sessions_write_through_it(self) -> None:
        self.assertTrue(issubclass(StompSession, BatchedOutput))
        self.assertTrue(issubclass(AmqpSession, BatchedOutput))
        self.assertIs(AmqpSession.write, BatchedOutput.write_frame)
        self.assertIs(StompSession.write_frame, BatchedOutput.write_frame)
        self.assertIs(StompSession.flush, BatchedOutput.flush)
