"""Tests for SockJS sessions (L{qmq.web.sockjs.session}) on a L{Clock}."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.web.sockjs.session import CLOSED, CLOSING, SLACK, SockJSSession


class Receiver:
    """A receiving request, by hand."""

    def __init__(self, streaming: bool = False, limit: int = 1 << 30) -> None:
        self.streaming = streaming
        self.limit = limit
        self.paused = False
        self.frames: list[str] = []
        self.finished = False
        self.sent = 0

    def send_frame(self, frame: str) -> bool:
        assert not self.finished
        self.frames.append(frame)
        if not self.streaming:
            return True
        self.sent += len(frame) + 1
        return self.sent >= self.limit

    def finish(self) -> None:
        self.finished = True


class Handler:
    def __init__(self) -> None:
        self.events: list[object] = []
        self.session: SockJSSession | None = None

    def opened(self, session: SockJSSession) -> None:
        self.events.append("opened")

    def messages_received(self, messages: list[str]) -> None:
        self.events.append(messages)

    def pause(self) -> None:
        self.events.append("pause")

    def resume(self) -> None:
        self.events.append("resume")

    def closed(self) -> None:
        self.events.append("closed")


class SessionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.handler = Handler()
        self.forgotten: list[SockJSSession] = []
        self.session = SockJSSession(
            "s1", self.handler, self.clock, heartbeat_delay=25, disconnect_delay=5,
            max_buffered=100, forget=self.forgotten.append,
        )

    def poll(self) -> Receiver:
        r = Receiver()
        self.session.attach(r)
        return r

    def test_open_then_messages(self) -> None:
        r = self.poll()
        self.assertEqual((r.frames, r.finished), (["o"], True))
        self.assertEqual(self.handler.events, ["opened"])
        self.session.send(["a", "b"])
        self.session.send(["c"])
        r = self.poll()
        self.assertEqual((r.frames, r.finished), (['a["a","b","c"]'], True))

    def test_waiting_poll_gets_message_at_once(self) -> None:
        self.poll()
        r = self.poll()
        self.assertEqual(r.frames, [])
        self.session.send(["x"])
        self.assertEqual((r.frames, r.finished), (['a["x"]'], True))

    def test_second_receiver_refused(self) -> None:
        self.poll()
        r1 = self.poll()
        r2 = self.poll()
        self.assertEqual(r2.frames, ['c[2010,"Another connection still open"]'])
        self.assertTrue(r2.finished)
        self.assertFalse(r1.finished)
        self.assertEqual(self.session.receiver, r1)

    def test_heartbeat(self) -> None:
        self.poll()
        r = self.poll()
        self.clock.advance(24.9)
        self.assertEqual(r.frames, [])
        self.clock.advance(0.2)
        self.assertEqual((r.frames, r.finished), (["h"], True))

    def test_heartbeats_on_a_stream(self) -> None:
        """A stream gets C{h} at each tick that finds nothing else sent since
        the last one."""
        r = Receiver(streaming=True)
        self.session.attach(r)
        self.clock.advance(10)
        self.session.send(["x"])
        self.clock.advance(15)  # a tick after a write: no heart-beat
        self.assertEqual(r.frames, ["o", 'a["x"]'])
        self.clock.advance(25)
        self.assertEqual(r.frames, ["o", 'a["x"]', "h"])
        self.clock.advance(25)
        self.assertEqual(r.frames, ["o", 'a["x"]', "h", "h"])

    def test_expires_without_receiver(self) -> None:
        self.poll()
        self.clock.advance(4.9)
        self.assertEqual(self.handler.events, ["opened"])
        self.clock.advance(0.2)
        self.assertEqual(self.handler.events, ["opened", "closed"])
        self.assertIs(self.session.state, CLOSED)
        self.assertEqual(self.forgotten, [self.session])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_waiting_receiver_keeps_it_alive(self) -> None:
        self.poll()
        for _ in range(3):
            r = self.poll()
            self.clock.advance(25)  # heart-beat ends the poll
            self.assertEqual(r.frames, ["h"])
            self.clock.advance(4)
        self.assertEqual(self.handler.events, ["opened"])

    def test_interrupted_receiver_closes(self) -> None:
        self.poll()
        r = self.poll()
        self.session.detach(r, aborted=True)
        self.assertEqual(self.handler.events, ["opened", "closed"])
        r2 = self.poll()
        self.assertEqual(r2.frames, ['c[1002,"Connection interrupted"]'])
        self.clock.advance(5)
        self.assertEqual(self.forgotten, [self.session])

    def test_close_served_until_expiry(self) -> None:
        self.poll()
        self.session.close(3000, "Go away!")
        self.assertIs(self.session.state, CLOSING)
        for _ in range(2):
            r = self.poll()
            self.assertEqual(r.frames, ['c[3000,"Go away!"]'])
        self.clock.advance(5)
        self.assertIs(self.session.state, CLOSED)
        self.assertEqual(self.handler.events, ["opened", "closed"])

    def test_messages_before_close_go_first(self) -> None:
        self.poll()
        self.session.send(["ERROR"])
        self.session.close(3000, "bye")
        r = self.poll()
        self.assertEqual(r.frames, ['a["ERROR"]'])
        r = self.poll()
        self.assertEqual(r.frames, ['c[3000,"bye"]'])

    def test_close_ends_a_stream(self) -> None:
        r = Receiver(streaming=True)
        self.session.attach(r)
        self.session.send(["x"])
        self.session.close(3000, "bye")
        self.assertEqual(r.frames, ["o", 'a["x"]', 'c[3000,"bye"]'])
        self.assertTrue(r.finished)

    def test_stream_past_limit_ends(self) -> None:
        r = Receiver(streaming=True, limit=10)
        self.session.attach(r)
        self.session.send(["12345678"])
        self.assertTrue(r.finished)
        self.assertIsNone(self.session.receiver)
        self.assertEqual(self.handler.events, ["opened"])  # the session lives on

    def test_full_outbox_pauses_then_resumes(self) -> None:
        self.poll()
        self.session.send(["x" * 60])
        self.assertEqual(self.handler.events, ["opened"])
        self.session.send(["x" * 60])
        self.assertEqual(self.handler.events, ["opened", "pause"])
        self.session.send(["y"])
        self.assertEqual(self.handler.events, ["opened", "pause"])
        r = self.poll()
        self.assertEqual(len(r.frames), 1)
        self.assertEqual(self.handler.events, ["opened", "pause", "resume"])
        self.assertEqual(self.session.buffered, 0)

    def test_overflow_closes(self) -> None:
        """Once paused, a session that keeps growing is closed."""
        self.poll()
        self.session.send(["x" * 150])
        self.assertEqual(self.handler.events, ["opened", "pause"])
        self.session.send(["x" * (SLACK + 100)])
        self.assertEqual(self.handler.events, ["opened", "pause", "closed"])
        self.assertIs(self.session.state, CLOSING)

    def test_paused_receiver_holds_messages(self) -> None:
        r = Receiver(streaming=True)
        self.session.attach(r)
        r.paused = True
        self.session.send(["x"])
        self.assertEqual(r.frames, ["o"])
        r.paused = False
        self.session.receiver_ready()
        self.assertEqual(r.frames, ["o", 'a["x"]'])

    def test_reading_paused_holds_client_messages(self) -> None:
        self.poll()
        self.session.pause_reading()
        self.session.messages_received(["a"])
        self.session.messages_received(["b"])
        self.assertEqual(self.handler.events, ["opened"])
        self.session.resume_reading()
        self.assertEqual(self.handler.events, ["opened", ["a"], ["b"]])

    def test_reading_paused_is_bounded(self) -> None:
        self.poll()
        self.session.pause_reading()
        self.session.messages_received(["x" * 101])
        self.assertEqual(self.handler.events, ["opened", "closed"])

    def test_never_polled_again_expires(self) -> None:
        self.poll()
        self.clock.advance(5)
        self.assertIs(self.session.state, CLOSED)

    def test_websocket_session_ends_with_its_receiver(self) -> None:
        session = SockJSSession("", self.handler, self.clock, websocket=True)
        r = Receiver(streaming=True)
        session.attach(r)
        self.assertEqual(r.frames, ["o"])
        session.detach(r, aborted=True)
        self.assertIs(session.state, CLOSED)
        self.assertEqual(self.handler.events, ["opened", "closed"])
        self.assertEqual([c for c in self.clock.getDelayedCalls() if c.func.__self__ is session], [])
