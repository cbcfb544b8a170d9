"""The delivery semantics across a restart of the commit-log store: what a
restart must keep (queue arguments, priorities, expiry times, delivery
times, per-message ack timeouts, delivery counts) comes back, through the
STOMP session as a client sees it.

Built on L{tests.test_store_log.StoreTestCase}: a real store in a temporary
directory, a broker on a L{Clock}.
"""

from __future__ import annotations

from qmq.stomp.frame import Frame
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from tests.test_stomp_contract import FakeTransport
from tests.test_store_log import StoreTestCase

#: The clock's time at every start (epoch seconds): the broker was started
#: again 100 s after the first run began.
T0 = 1_700_000_000.0


class DeliveryRestartTests(StoreTestCase):
    def start(self, **kw):
        broker = super().start(**kw)
        self.clock.advance(T0 + (100 if getattr(self, "started", False) else 0))
        self.started = True
        return broker

    def session(self):
        transport = FakeTransport()
        session = StompSession(self.broker, StompSettings(), transport, clock=self.clock)
        session.frames_received([Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0"})])
        self.broker.batcher.flush_all()
        transport.frames()
        return session, transport

    def frames(self, s, t, *frames):
        s.frames_received(list(frames))
        self.broker.batcher.flush_all()
        return t.frames()

    def test_restart_keeps_delivery_state(self) -> None:
        s, t = self.session()
        self.frames(
            s,
            t,
            Frame("SUBSCRIBE", {"destination": "/queue/p", "id": "s", "x-max-priority": "9"}),
            Frame("UNSUBSCRIBE", {"id": "s"}),
        )
        now_ms = int(T0 * 1000)

        def send(body: bytes, **headers: str) -> Frame:
            return Frame("SEND", {"destination": "/queue/p", "persistent": "true", **headers}, body)

        got = self.frames(
            s,
            t,
            send(b"low", priority="1"),
            send(b"high", priority="8"),
            send(b"delayed", priority="9", delay="200000"),  # due at T0 + 200 s
            send(b"expires", priority="9", expires=str(now_ms + 150_000)),  # at T0 + 150 s
            send(b"gone", priority="9", ttl="50000"),  # at T0 + 50 s: gone at restart
            send(b"timed", **{"ack-timeout": "2.5"}),
        )
        self.assertEqual(got, [])
        self.turn()
        self.restart()
        q = self.vhost.queue("p")
        self.assertEqual(q.policy.max_priority, 9)
        self.assertEqual(q.delayed_count, 1)
        s, t = self.session()
        got = self.frames(
            s,
            t,
            Frame(
                "SUBSCRIBE",
                {"destination": "/queue/p", "id": "s", "ack": "client-individual", "prefetch-count": "10"},
            ),
        )
        self.assertEqual([f.body for f in got], [b"expires", b"high", b"low", b"timed"])
        # The per-message ack timeout came back: "timed" is taken back 2.5 s on.
        self.clock.advance(2.5)
        self.broker.batcher.flush_all()
        got = t.frames()
        self.assertEqual([(f.body, f.headers.get("redelivered")) for f in got], [(b"timed", "true")])
        self.frames(s, t, Frame("ACK", {"id": got[0].headers["ack"]}))
        # The delayed message is due at T0 + 200 s (now T0 + 102.5).
        self.clock.advance(97.4)
        self.broker.batcher.flush_all()
        self.assertEqual(t.frames(), [])
        self.clock.advance(0.1)
        self.broker.batcher.flush_all()
        self.assertEqual([f.body for f in t.frames()], [b"delayed"])

    def test_expiry_after_restart(self) -> None:
        """A message that expires while the broker is down is never delivered."""
        s, t = self.session()
        self.frames(
            s,
            t,
            Frame("SEND", {"destination": "/queue/e", "persistent": "true", "ttl": "50000"}, b"a"),
            Frame("SEND", {"destination": "/queue/e", "persistent": "true", "ttl": "500000"}, b"b"),
        )
        self.turn()
        self.restart()
        s, t = self.session()
        got = self.frames(s, t, Frame("SUBSCRIBE", {"destination": "/queue/e", "id": "s"}))
        self.assertEqual([f.body for f in got], [b"b"])
