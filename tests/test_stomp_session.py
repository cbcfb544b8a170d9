"""Tests for the STOMP session (L{qmq.stomp.session}) through its Twisted glue
(L{qmq.stomp.protocol}), with in-memory transports and a L{Clock}.

Every client here is a L{StompProtocol} built by the factory on a
L{StringTransportWithDisconnection}; what the broker writes is read back with
the project's own L{StompParser}. Writes are batched per reactor turn: what a
client's bytes cause is flushed when C{dataReceived} returns, but what timers
or producer signals cause needs C{clock.advance(0)}.
"""

from __future__ import annotations

import itertools

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport, StringTransportWithDisconnection
from twisted.trial.unittest import SynchronousTestCase

from qmq import __version__
from qmq.connections import ConnectionSettings
from qmq.core.broker import Broker
from qmq.stomp.frame import Frame, StompParser, encode_frame
from qmq.stomp.protocol import StompFactory
from qmq.stomp.session import RECEIPT_BATCH
from qmq.stomp.settings import StompSettings

_ports = itertools.count(40000)


class Client:
    """One STOMP client connection, driven by hand."""

    def __init__(self, factory: StompFactory, transport: StringTransport | None = None) -> None:
        self.proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", next(_ports)))
        self.transport = transport if transport is not None else StringTransportWithDisconnection()
        self.transport.protocol = self.proto
        self.proto.makeConnection(self.transport)
        self.parser = StompParser()
        self.version = "1.0"

    @property
    def session(self):
        return self.proto.session

    @property
    def open(self) -> bool:
        """The broker has not closed this connection."""
        t = self.transport
        return t.connected and not t.disconnecting

    def raw(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def send(self, command: str, headers=None, body: bytes = b"") -> None:
        self.raw(encode_frame(command, headers, body, self.version))

    def read(self) -> list[Frame]:
        data = self.transport.value()
        self.transport.clear()
        return self.parser.feed(data)

    def connect(self, version: str | None = "1.2", heart_beat: str | None = "0,0", **headers) -> Frame:
        h = dict(headers)
        if version is not None:
            h["accept-version"] = version
        if heart_beat is not None:
            h["heart-beat"] = heart_beat
        self.send("CONNECT", h)
        frames = self.read()
        assert len(frames) == 1 and frames[0].command == "CONNECTED", frames
        self.version = frames[0].headers.get("version", "1.0")
        return frames[0]

    def subscribe(self, destination: str, sub_id: str = "s", **headers) -> None:
        h = {"destination": destination, "id": sub_id, **headers}
        self.send("SUBSCRIBE", h)

    def publish(self, destination: str, body: bytes, **headers) -> None:
        self.send("SEND", {"destination": destination, **headers}, body)

    def messages(self) -> list[Frame]:
        frames = self.read()
        for f in frames:
            assert f.command == "MESSAGE", f
        return frames

    def bodies(self) -> list[bytes]:
        return [f.body for f in self.messages()]

    def ack(self, message: Frame, command: str = "ACK", **headers) -> None:
        """Acknowledge C{message} the way this client's version says."""
        if self.version == "1.2":
            h = {"id": message.headers["ack"]}
        else:
            h = {
                "message-id": message.headers["message-id"],
                "subscription": message.headers["subscription"],
            }
        h.update(headers)
        self.send(command, h)

    def close(self) -> None:
        self.transport.loseConnection()


class SessionTestCase(SynchronousTestCase):
    settings = StompSettings()

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.factory = StompFactory(self.broker, self.settings, clock=self.clock)

    def client(self, version: str | None = "1.2", transport=None, **headers) -> Client:
        c = Client(self.factory, transport)
        if version != "none":
            c.connect(version, **headers)
        return c

    def assertError(self, client: Client, message_part: str | None = None) -> Frame:
        """The client got one ERROR (after anything else) and was disconnected."""
        frames = client.read()
        self.assertTrue(frames, "nothing was written")
        error = frames[-1]
        self.assertEqual(error.command, "ERROR", frames)
        self.assertEqual([f.command for f in frames].count("ERROR"), 1)
        self.assertIn("message", error.headers)
        self.assertTrue(error.headers["message"])
        self.assertTrue(error.body, "an ERROR frame explains itself in its body")
        if message_part is not None:
            self.assertIn(message_part, error.headers["message"] + error.body.decode())
        self.assertFalse(client.open, "the connection should be closed after an ERROR")
        return error

    def queue_len(self, name: str) -> int:
        return len(self.vhost.queues[name])


class ConnectTests(SessionTestCase):
    def test_connect_10(self) -> None:
        """Without accept-version the session speaks STOMP 1.0."""
        c = Client(self.factory)
        connected = c.connect(version=None, heart_beat=None)
        self.assertNotIn("version", connected.headers)
        self.assertNotIn("heart-beat", connected.headers)
        self.assertEqual(connected.headers["session"], c.session.id)
        self.assertEqual(c.session.version, "1.0")

    def test_version_negotiation(self) -> None:
        """The highest version both sides know is chosen."""
        for offered, chosen in [
            ("1.0", None),
            ("1.1", "1.1"),
            ("1.2", "1.2"),
            ("1.0,1.1", "1.1"),
            ("1.0,1.1,1.2", "1.2"),
            ("1.2,1.0", "1.2"),
            ("1.1, 1.0", "1.1"),
            ("1.0,2.0", None),
            ("1.1,1.3", "1.1"),
        ]:
            c = Client(self.factory)
            connected = c.connect(version=offered)
            self.assertEqual(connected.headers.get("version"), chosen, offered)
            self.assertEqual(c.session.version, chosen or "1.0")

    def test_stomp_command(self) -> None:
        """STOMP is a synonym of CONNECT."""
        c = Client(self.factory)
        c.send("STOMP", {"accept-version": "1.1,1.2", "host": "localhost"})
        frames = c.read()
        self.assertEqual([f.command for f in frames], ["CONNECTED"])
        self.assertEqual(frames[0].headers["version"], "1.2")

    def test_no_common_version(self) -> None:
        """No common version: ERROR naming the supported ones, then close."""
        c = Client(self.factory)
        c.send("CONNECT", {"accept-version": "2.0,3.1"})
        error = self.assertError(c)
        self.assertEqual(error.headers["version"], "1.0,1.1,1.2")
        self.assertIn("2.0", error.body.decode())

    def test_connected_headers(self) -> None:
        settings = StompSettings(heartbeat_send_ms=1234, heartbeat_receive_ms=5678)
        self.factory = StompFactory(self.broker, settings, clock=self.clock)
        c = Client(self.factory)
        connected = c.connect("1.1,1.2", heart_beat="0,0")
        self.assertEqual(connected.headers["version"], "1.2")
        self.assertEqual(connected.headers["heart-beat"], "1234,5678")
        self.assertEqual(connected.headers["server"], f"QMQ/{__version__}")
        self.assertEqual(connected.headers["session"], c.session.id)
        other = Client(self.factory)
        self.assertNotEqual(other.connect().headers["session"], connected.headers["session"])

    def test_second_connect(self) -> None:
        c = self.client()
        c.send("CONNECT", {"accept-version": "1.2"})
        self.assertError(c, "already connected")

    def test_frame_before_connect(self) -> None:
        for command, headers in [
            ("SEND", {"destination": "/queue/a"}),
            ("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}),
            ("DISCONNECT", {}),
        ]:
            c = Client(self.factory)
            c.send(command, headers)
            self.assertError(c, "not connected")
        self.assertNotIn("a", self.vhost.queues)

    def test_frame_before_connect_in_same_read(self) -> None:
        """A frame pipelined before CONNECT is refused even if CONNECT follows."""
        c = Client(self.factory)
        c.raw(
            encode_frame("SEND", {"destination": "/queue/a"}, b"x")
            + encode_frame("CONNECT", {"accept-version": "1.2"})
        )
        self.assertError(c, "not connected")
        self.assertNotIn("a", self.vhost.queues)

    def test_pipelined_after_connect(self) -> None:
        """Frames in the same read as CONNECT are processed in order."""
        c = Client(self.factory)
        c.raw(
            encode_frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0"})
            + encode_frame("SEND", {"destination": "/queue/a", "receipt": "r"}, b"x")
        )
        frames = c.read()
        self.assertEqual([f.command for f in frames], ["CONNECTED", "RECEIPT"])
        self.assertEqual(self.queue_len("a"), 1)

    def test_virtual_host(self) -> None:
        """The host header picks a virtual host; an unknown one maps to the default."""
        prod = self.broker.add_vhost("prod")
        c = self.client(host="prod")
        self.assertIs(c.session.vhost, prod)
        c.publish("/queue/q", b"x")
        self.assertIn("q", prod.queues)
        self.assertNotIn("q", self.vhost.queues)
        d = self.client(host="127.0.0.1")
        self.assertIs(d.session.vhost, self.vhost)

    def test_strict_vhost(self) -> None:
        self.factory = StompFactory(self.broker, StompSettings(strict_vhost=True), clock=self.clock)
        c = Client(self.factory)
        c.send("CONNECT", {"accept-version": "1.2", "host": "nowhere"})
        self.assertError(c, "virtual host")

    def test_connect_timeout(self) -> None:
        """A connection that sends no CONNECT is closed after connect_timeout."""
        self.factory = StompFactory(self.broker, StompSettings(connect_timeout=5), clock=self.clock)
        slow = Client(self.factory)
        quick = Client(self.factory)
        self.clock.advance(4.9)
        self.assertTrue(slow.open)
        quick.connect()
        self.clock.advance(0.2)
        self.assertError(slow, "connect timeout")
        self.assertTrue(quick.open)
        self.clock.advance(100)
        self.assertTrue(quick.open)

    def test_invalid_heart_beat(self) -> None:
        for value in ("abc", "1,2,3", "-1,0", "10"):
            c = Client(self.factory)
            c.send("CONNECT", {"accept-version": "1.2", "heart-beat": value})
            self.assertError(c, "heart-beat")

    def test_login_and_client_id(self) -> None:
        c = self.client(login="alice", passcode="secret", **{"client-id": "app-1"})
        self.assertEqual((c.session.login, c.session.client_id), ("alice", "app-1"))


class ConnectionMemoryTests(SessionTestCase):
    """What a connected session and its channel set lives in slots: with
    more than 30 attributes in an instance dict, CPython 3.11 gives every
    connection a full dict of its own (about 1.5 KiB each)."""

    def test_session_and_channel_dicts_empty(self) -> None:
        c = self.client(heart_beat="10000,10000")
        self.assertEqual(vars(c.session), {})
        self.assertEqual(set(vars(c.session.channel)) - {"session", "_targets", "temp_queues"}, set())


class CountingTransport(StringTransportWithDisconnection):
    """Keeps every write call, to see how output was batched."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)


class BatchingTests(SessionTestCase):
    def test_one_write_per_read(self) -> None:
        """One read of many SENDs becomes one write per receiving connection
        (and one for the sender's receipts, up to RECEIPT_BATCH of them)."""
        a, b, p = (self.client(transport=CountingTransport()) for _ in range(3))
        a.subscribe("/topic/t")
        b.subscribe("/topic/t")
        for c in (a, b, p):
            del c.transport.writes[:]
        n = RECEIPT_BATCH - 1
        p.raw(b"".join(
            encode_frame("SEND", {"destination": "/topic/t", "receipt": str(i)}, b"%d" % i)
            for i in range(n)
        ))
        self.assertEqual([len(c.transport.writes) for c in (a, b, p)], [1, 1, 1])
        self.assertEqual(len(a.messages()), n)
        self.assertEqual(len(p.read()), n)

    def test_receipts_of_a_long_read_go_in_batches(self) -> None:
        """A read of many receipted SENDs sends its receipts RECEIPT_BATCH at
        a time, in order, while the rest of the read is processed: a
        windowed producer can send its next frames meanwhile (one write at
        the end of the read would make it wait for the whole read)."""
        p = self.client(transport=CountingTransport())
        del p.transport.writes[:]
        n = RECEIPT_BATCH * 3 + 5
        p.raw(b"".join(
            encode_frame("SEND", {"destination": f"/queue/q{i % 3}", "receipt": str(i)}, b"x")
            for i in range(n)
        ))
        self.assertEqual(
            [w.count(b"RECEIPT\n") for w in p.transport.writes],
            [RECEIPT_BATCH, RECEIPT_BATCH, RECEIPT_BATCH, 5],
        )
        self.assertEqual([f.headers["receipt-id"] for f in p.read()], [str(i) for i in range(n)])

    def test_timer_writes_wait_for_the_turn(self) -> None:
        """Outside dataReceived, output is flushed on the next reactor turn."""
        c = self.client()
        c.subscribe("/queue/q")
        c.proto.pauseProducing()
        self.client().publish("/queue/q", b"x")
        c.proto.resumeProducing()
        self.assertEqual(c.transport.value(), b"")
        self.clock.advance(0)
        self.assertEqual(c.bodies(), [b"x"])

    def test_large_backlog_flushed_in_pieces(self) -> None:
        """A turn's output is flushed early past a threshold, not held whole."""
        c = self.client(transport=CountingTransport())
        c.subscribe("/queue/q")
        c.proto.pauseProducing()
        p = self.client()
        for _ in range(100):
            p.publish("/queue/q", b"x" * 10_000)
        del c.transport.writes[:]
        c.proto.resumeProducing()
        self.clock.advance(0)
        self.assertGreater(len(c.transport.writes), 1)
        self.assertEqual(len(c.messages()), 100)

    def test_protocol_is_push_producer(self) -> None:
        c = Client(self.factory)
        self.assertIs(c.transport.producer, c.proto)
        self.assertTrue(c.transport.streaming)
        self.assertIn(c.proto, self.factory.connections)
        c.close()
        self.assertNotIn(c.proto, self.factory.connections)

    def test_heart_beat_eols_between_frames(self) -> None:
        """EOLs between frames (client heart-beats) are ignored."""
        c = self.client()
        c.raw(b"\n\n" + encode_frame("SEND", {"destination": "/queue/q", "receipt": "r"}, b"x")
              + b"\r\n\n")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        self.assertTrue(c.open)


class HeartbeatTests(SessionTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.settings = StompSettings(heartbeat_send_ms=1000, heartbeat_receive_ms=2000)
        self.factory = StompFactory(self.broker, self.settings, clock=self.clock)

    def elapse(self, seconds: float, step: float = 0.125) -> None:
        """Advance the clock in small steps, as a running reactor would.

        (One big C{Clock.advance} runs a LoopingCall once, not once per period.)
        """
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.seconds()))

    def beat_times(self, c: Client, until: float, step: float = 0.125) -> list[float]:
        """Advance the clock to C{until}, noting when EOLs were written."""
        times = []
        start = self.clock.seconds()
        while self.clock.seconds() - start < until - 1e-9:
            self.clock.advance(step)
            data = c.transport.value()
            c.transport.clear()
            if data:
                self.assertEqual(data, b"\n" * len(data))
                times.extend([round(self.clock.seconds() - start, 3)] * len(data))
        return times

    def test_server_sends_at_interval(self) -> None:
        """Idle, the server sends an EOL at least every negotiated interval."""
        c = self.client(heart_beat="0,1000")
        times = self.beat_times(c, 10)
        self.assertGreaterEqual(len(times), 9)
        self.assertLessEqual(len(times), 20)
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        self.assertLessEqual(max(gaps), 1.0 + 1e-6)
        self.assertTrue(c.open)

    def test_interval_is_max_of_both(self) -> None:
        """The server sends every max(sx, cy): the client asked for 3000 ms."""
        c = self.client(heart_beat="0,3000")
        times = self.beat_times(c, 12)
        self.assertTrue(times)
        self.assertGreaterEqual(times[0], 1.5)
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        self.assertLessEqual(max(gaps), 3.0 + 1e-6)
        self.assertGreaterEqual(min(gaps), 1.5)
        self.assertLessEqual(len(times), 8)

    def test_no_beats_while_busy(self) -> None:
        """No EOL is sent while frames are being written anyway."""
        c = self.client(heart_beat="0,1000")
        c.subscribe("/queue/q")
        producer = self.client()
        c.read()
        for _ in range(40):
            self.clock.advance(0.25)
            producer.publish("/queue/q", b"tick")
            self.assertEqual(len(c.messages()), 1)
        self.assertNotIn(b"\n\n\n", c.transport.value())

    def test_client_does_not_want_beats(self) -> None:
        """cy=0 disables the server's heart-beats; cx=0 disables the
        heart-beat check, but not the idle timeout."""
        c = self.client(heart_beat="0,0")
        idle = self.settings.idle_timeout
        for _ in range(9):
            self.clock.advance(idle / 10)
        self.assertEqual(c.transport.value(), b"")
        self.assertTrue(c.open)
        self.clock.advance(idle / 2)
        self.assertError(c, "idle timeout")

    def test_half_frame_after_no_beats_is_closed(self) -> None:
        """A client that offers heart-beat:0,0 and then sends half a frame
        is closed by the frame deadline (it was never closed before)."""
        c = self.client(heart_beat="0,0")
        c.raw(b"SEND\ndestination:/queue/q\ncontent-length:100\n\nabc")
        self.clock.advance(self.settings.frame_timeout * 1.5)
        self.assertError(c, "frame timeout")

    def test_busy_publisher_reads_ending_mid_frame(self) -> None:
        """A publisher whose every read ends inside a frame (the usual case
        under load) finishes each frame quickly: the deadline is per frame,
        so it is never closed for it."""
        c = self.client(heart_beat="0,0")
        frame = b"SEND\ndestination:/queue/q\n\nbody\x00"
        step = self.settings.frame_timeout / 4
        c.raw(frame[:10])
        for _ in range(20):
            self.clock.advance(step)
            c.raw(frame[10:] + frame[:10])  # finishes one frame, starts the next
        self.assertTrue(c.open)
        self.assertEqual(self.queue_len("q"), 20)

    def test_idle_timeout_counts_from_the_last_byte(self) -> None:
        """Bytes (even heart-beat EOLs) keep a client with heart-beat:0,0 open."""
        c = self.client(heart_beat="0,0")
        idle = self.settings.idle_timeout
        for _ in range(5):
            self.clock.advance(idle * 0.6)
            c.raw(b"\n")
        self.assertTrue(c.open)

    def test_server_disabled(self) -> None:
        """A broker configured with 0,0 neither sends nor expects beats."""
        self.factory = StompFactory(
            self.broker,
            StompSettings(heartbeat_send_ms=0, heartbeat_receive_ms=0),
            clock=self.clock,
        )
        c = Client(self.factory)
        connected = c.connect(heart_beat="500,500")
        self.assertEqual(connected.headers["heart-beat"], "0,0")
        self.clock.advance(60)
        self.assertEqual(c.transport.value(), b"")
        self.assertTrue(c.open)

    def test_silent_client_closed(self) -> None:
        """A client silent beyond grace x max(sy, cx) gets an ERROR and is closed."""
        # sy=2000, cx=4000: interval 4000 ms, grace 1.5 -> at least 6 s of silence.
        c = self.client(heart_beat="4000,0")
        self.elapse(5.9)
        self.assertTrue(c.open)
        self.assertEqual(c.read(), [])
        self.elapse(3.2)
        self.assertError(c, "heart-beat")

    def test_interval_uses_larger_server_value(self) -> None:
        """sy=2000 wins over cx=500: 0.9 s of silence is fine."""
        c = self.client(heart_beat="500,0")
        self.elapse(2.9)
        self.assertTrue(c.open)
        self.elapse(2)
        self.assertError(c, "heart-beat")

    def test_beating_client_kept(self) -> None:
        """EOLs (or any frame) keep the client alive."""
        c = self.client(heart_beat="2000,0")
        for i in range(60):
            self.elapse(1.9)
            if i % 2:
                c.raw(b"\n")
            else:
                c.publish("/queue/q", b"x")
        self.assertTrue(c.open)
        self.assertEqual(self.queue_len("q"), 30)
        # And silence still kills it afterwards.
        self.elapse(10)
        self.assertFalse(c.open)

    def test_10_ignores_heart_beat(self) -> None:
        """STOMP 1.0 has no heart-beats."""
        c = Client(self.factory)
        connected = c.connect(version=None, heart_beat="100,100")
        self.assertNotIn("heart-beat", connected.headers)
        self.clock.advance(60)
        self.assertEqual(c.transport.value(), b"")
        self.assertTrue(c.open)

    def test_timers_stop_on_close(self) -> None:
        c = self.client(heart_beat="1000,1000")
        c.send("DISCONNECT", {"receipt": "bye"})
        self.assertEqual(c.read()[0].headers["receipt-id"], "bye")
        self.assertEqual(self.clock.getDelayedCalls(), [])


class SendSubscribeTests(SessionTestCase):
    def test_queue_send_then_subscribe(self) -> None:
        p = self.client()
        p.publish("/queue/work", b"one")
        p.publish("/queue/work", b"two")
        self.assertEqual(self.queue_len("work"), 2)
        c = self.client()
        c.subscribe("/queue/work", "sub-1")
        self.assertEqual(c.bodies(), [b"one", b"two"])
        p.publish("/queue/work", b"three")
        self.assertEqual(c.bodies(), [b"three"])

    def test_queue_point_to_point(self) -> None:
        """Each queue message goes to one subscriber, round robin."""
        a, b = self.client(), self.client()
        a.subscribe("/queue/q")
        b.subscribe("/queue/q")
        p = self.client()
        for i in range(6):
            p.publish("/queue/q", b"%d" % i)
        got_a, got_b = a.bodies(), b.bodies()
        self.assertEqual(len(got_a), 3)
        self.assertEqual(sorted(got_a + got_b), [b"%d" % i for i in range(6)])

    def test_message_headers(self) -> None:
        """subscription, message-id, destination, content-length and user headers."""
        c = self.client()
        c.subscribe("/queue/q", "my-sub")
        p = self.client()
        p.publish(
            "/queue/q",
            b"hello",
            **{"receipt": "r-1", "content-type": "text/plain", "x-app": "demo", "priority": "4"},
        )
        self.assertEqual([f.command for f in p.read()], ["RECEIPT"])
        [m] = c.messages()
        h = m.headers
        self.assertEqual(h["subscription"], "my-sub")
        self.assertEqual(h["destination"], "/queue/q")
        self.assertEqual(h["content-length"], "5")
        self.assertEqual((h["content-type"], h["x-app"], h["priority"]), ("text/plain", "demo", "4"))
        self.assertTrue(h["message-id"])
        self.assertNotIn("receipt", h)
        self.assertNotIn("transaction", h)
        self.assertNotIn("ack", h)  # auto mode
        self.assertNotIn("redelivered", h)
        self.assertEqual(m.body, b"hello")

    def test_message_ids_unique(self) -> None:
        c = self.client()
        c.subscribe("/queue/q")
        for i in range(5):
            c.publish("/queue/q", b"%d" % i)
        ids = [m.headers["message-id"] for m in c.messages()]
        self.assertEqual(len(set(ids)), 5)

    def test_binary_body(self) -> None:
        """content-length carries bodies with NULs."""
        c = self.client()
        c.subscribe("/queue/q")
        body = b"a\x00b\x00\xff" * 100
        c.send("SEND", {"destination": "/queue/q", "content-length": str(len(body))}, body)
        [m] = c.messages()
        self.assertEqual(m.body, body)
        self.assertEqual(m.headers["content-length"], str(len(body)))

    def test_header_values_escaped(self) -> None:
        """Header values with colons, EOLs, backslashes survive, per version."""
        value = "a:b\nc\\d"
        sub12, sub11 = self.client("1.2"), self.client("1.1")
        sub12.subscribe("/topic/t", "s12")
        sub11.subscribe("/topic/t", "s11")
        p = self.client("1.2")
        p.publish("/topic/t", b"x", **{"odd": value, "cr": "x\ry", "na:me": "v"})
        [m] = sub12.messages()
        self.assertEqual((m.headers["odd"], m.headers["cr"], m.headers["na:me"]), (value, "x\ry", "v"))
        [m] = sub11.messages()
        self.assertEqual((m.headers["odd"], m.headers["na:me"]), (value, "v"))

    def test_colon_to_10(self) -> None:
        """STOMP 1.0 has no escapes; a colon in a value reads fine there."""
        sub10 = self.client("1.0")
        sub10.subscribe("/topic/t", "s10")
        p = self.client("1.2")
        p.publish("/topic/t", b"y", **{"time": "12:30", "path": "C:\\x"})
        [m] = sub10.messages()
        self.assertEqual((m.headers["time"], m.headers["path"]), ("12:30", "C:\\x"))

    def test_no_header_injection_into_10(self) -> None:
        """A line break in a value cannot forge headers or frames for a 1.0 subscriber."""
        sub10 = self.client("1.0")
        sub10.subscribe("/queue/q", "mine")
        p = self.client("1.2")
        p.publish(
            "/queue/q",
            b"payload",
            **{"a": "x\nsubscription:forged", "b": "y\n\nSEND", "c": "z\r\nack:1"},
        )
        [m] = sub10.messages()
        self.assertEqual(m.headers["subscription"], "mine")
        self.assertEqual(m.body, b"payload")
        self.assertEqual(
            sorted(m.headers),
            sorted(["subscription", "message-id", "destination", "content-length", "a", "b", "c"]),
        )

    def test_header_escaping_across_versions(self) -> None:
        """A 1.0 publisher's backslash reaches a 1.2 subscriber intact."""
        sub = self.client("1.2")
        sub.subscribe("/queue/q")
        p = self.client("1.0")
        p.raw(b"SEND\ndestination:/queue/q\npath:C:\\dir\\file\ntime:12:30\n\nx\x00")
        [m] = sub.messages()
        self.assertEqual(m.headers["path"], "C:\\dir\\file")
        self.assertEqual(m.headers["time"], "12:30")

    def test_ack_header_only_in_12_client_modes(self) -> None:
        for version, mode, has_ack in [
            ("1.2", "auto", False),
            ("1.2", "client", True),
            ("1.2", "client-individual", True),
            ("1.1", "client", False),
            ("1.1", "client-individual", False),
        ]:
            c = self.client(version)
            dest = f"/queue/{version}-{mode}"
            c.subscribe(dest, ack=mode)
            c.publish(dest, b"x")
            [m] = c.messages()
            self.assertEqual("ack" in m.headers, has_ack, (version, mode))
            if has_ack:
                self.assertTrue(m.headers["ack"])

    def test_subscribe_10_without_id(self) -> None:
        """In 1.0 the destination stands in for a missing subscription id."""
        c = self.client("1.0")
        c.send("SUBSCRIBE", {"destination": "/queue/q"})
        c.publish("/queue/q", b"x")
        [m] = c.messages()
        self.assertEqual(m.headers["subscription"], "/queue/q")
        c.send("UNSUBSCRIBE", {"destination": "/queue/q", "receipt": "u"})
        self.assertEqual(c.read()[0].headers["receipt-id"], "u")
        c.publish("/queue/q", b"y")
        self.assertEqual(c.read(), [])

    def test_unsubscribe(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", "s1")
        c.send("UNSUBSCRIBE", {"id": "s1"})
        c.publish("/queue/q", b"x")
        self.assertEqual(c.read(), [])
        self.assertEqual(self.queue_len("q"), 1)
        c.send("UNSUBSCRIBE", {"id": "s1"})
        self.assertError(c, "subscription")

    def test_duplicate_subscription_id(self) -> None:
        c = self.client()
        c.subscribe("/queue/a", "same")
        c.subscribe("/queue/b", "same")
        self.assertError(c, "same")

    def test_invalid_ack_mode(self) -> None:
        c = self.client()
        c.subscribe("/queue/a", ack="sometimes")
        self.assertError(c, "ack")

    def test_topic_fanout(self) -> None:
        """Every topic subscriber gets its copy; nothing is kept for latecomers."""
        a, b = self.client(), self.client()
        a.subscribe("/topic/news")
        b.subscribe("/topic/news")
        p = self.client()
        p.publish("/topic/news", b"1")
        self.assertEqual(a.bodies(), [b"1"])
        self.assertEqual(b.bodies(), [b"1"])
        late = self.client()
        late.subscribe("/topic/news")
        self.assertEqual(late.read(), [])
        p.publish("/topic/other", b"2")
        self.assertEqual((a.read(), b.read(), late.read()), ([], [], []))

    def test_topic_wildcards(self) -> None:
        subs = {}
        for pattern in ("stock.*.nyse", "stock.#", "#.nyse", "stock.ibm.*", "stock.i*"):
            subs[pattern] = self.client()
            subs[pattern].subscribe("/topic/" + pattern)
        p = self.client()
        cases = {
            "stock.ibm.nyse": {"stock.*.nyse", "stock.#", "#.nyse", "stock.ibm.*", "stock.i*"},
            "stock.msft.nyse": {"stock.*.nyse", "stock.#", "#.nyse"},
            "stock": {"stock.#"},
            "bond.nyse": {"#.nyse"},
            "stock.intc": {"stock.#", "stock.i*"},
            "fx": set(),
        }
        for key, expected in cases.items():
            p.publish("/topic/" + key, key.encode())
            got = {pattern for pattern, c in subs.items() if c.bodies() == [key.encode()]}
            self.assertEqual(got, expected, key)

    def test_topic_message_destination(self) -> None:
        c = self.client()
        c.subscribe("/topic/a.*")
        c.publish("/topic/a.b", b"x")
        [m] = c.messages()
        self.assertEqual(m.headers["destination"], "/topic/a.b")

    def test_live_topic_subscription(self) -> None:
        """An ack:auto topic subscription is bound to the exchange itself: no
        queue is made for it, and its binding goes with it."""
        topic = self.vhost.exchange("amq.topic")
        c = self.client()
        c.subscribe("/topic/t", "s1")
        self.assertEqual([n for n in self.vhost.queues if n.startswith("amq.sub.")], [])
        self.assertEqual(topic.binding_count, 1)
        c.publish("/topic/t", b"1")
        self.assertEqual(c.bodies(), [b"1"])
        c.send("UNSUBSCRIBE", {"id": "s1"})
        self.assertEqual(topic.binding_count, 0)
        c.publish("/topic/t", b"2")
        self.assertEqual(c.read(), [])
        d = self.client()
        d.subscribe("/topic/t", "s1")
        d.close()
        self.assertEqual(topic.binding_count, 0)

    def test_live_subscription_auto_delete_exchange(self) -> None:
        """The last live subscription leaving deletes an auto-delete exchange."""
        self.vhost.declare_exchange("events", "topic", auto_delete=True)
        c = self.client()
        c.subscribe("/exchange/events/a.*", "s1")
        c.send("UNSUBSCRIBE", {"id": "s1"})
        self.assertNotIn("events", self.vhost.exchanges)

    def test_topic_subscription_queue_removed(self) -> None:
        """A non-durable topic subscription that acks has a private queue,
        which goes with it."""
        c = self.client()
        c.subscribe("/topic/t", "s1", ack="client")
        names = [n for n in self.vhost.queues if n.startswith("amq.sub.")]
        self.assertEqual(len(names), 1)
        c.send("UNSUBSCRIBE", {"id": "s1"})
        self.assertNotIn(names[0], self.vhost.queues)
        d = self.client()
        d.subscribe("/topic/t", "s1", ack="client")
        d.close()
        self.assertEqual([n for n in self.vhost.queues if n.startswith("amq.sub.")], [])

    def test_exchange_destinations(self) -> None:
        """/exchange/NAME/KEY reaches any exchange with any key."""
        self.vhost.declare_exchange("logs", "fanout")
        a = self.client()
        a.subscribe("/exchange/logs", "all-logs")
        d = self.client()
        d.subscribe("/exchange/amq.direct/red", "red")
        p = self.client()
        p.publish("/exchange/logs/whatever", b"log line")
        p.publish("/exchange/amq.direct/red", b"r")
        p.publish("/exchange/amq.direct/blue", b"b")
        [m] = a.messages()
        self.assertEqual(m.body, b"log line")
        self.assertEqual(m.headers["destination"], "/exchange/logs/whatever")
        self.assertEqual(d.bodies(), [b"r"])

    def test_internal_and_alternate_exchanges(self) -> None:
        """A SEND to an internal exchange is an ERROR (the core's verdict);
        a SEND its alternate catches lands behind it."""
        self.vhost.declare_exchange("hidden", "fanout", internal=True)
        self.vhost.declare_exchange("front", "direct", arguments={"alternate-exchange": "hidden"})
        self.vhost.declare_queue("caught")
        self.vhost.bind("caught", "hidden")
        p = self.client()
        p.publish("/exchange/front/nowhere", b"caught", receipt="r1")
        [receipt] = p.read()
        self.assertEqual(receipt.command, "RECEIPT")
        self.assertEqual(self.queue_len("caught"), 1)
        p.publish("/exchange/hidden/k", b"straight", receipt="r2")
        [error] = p.read()
        self.assertEqual(error.command, "ERROR")
        self.assertTrue(error.headers["message"].startswith("access refused ("), error.headers)
        self.assertIn(b"cannot publish to internal exchange 'hidden'", error.body)
        self.assertEqual(self.queue_len("caught"), 1)

    def test_exchange_to_bound_queue(self) -> None:
        """A fanout exchange bound to durable queues: one copy in each."""
        self.vhost.declare_exchange("fan", "fanout")
        for name in ("q1", "q2"):
            self.vhost.declare_queue(name)
            self.vhost.bind(name, "fan")
        p = self.client()
        p.publish("/exchange/fan/", b"x")
        self.assertEqual((self.queue_len("q1"), self.queue_len("q2")), (1, 1))
        c = self.client()
        c.subscribe("/queue/q2")
        self.assertEqual(c.bodies(), [b"x"])

    def test_headers_exchange(self) -> None:
        self.vhost.declare_queue("pdfs")
        self.vhost.bind("pdfs", "amq.headers", "", {"format": "pdf"})
        p = self.client()
        p.publish("/exchange/amq.headers/", b"doc", format="pdf")
        p.publish("/exchange/amq.headers/", b"img", format="png")
        self.assertEqual([m.body for m in self.vhost.queues["pdfs"].messages()], [b"doc"])

    def test_unknown_exchange_send(self) -> None:
        c = self.client()
        c.publish("/exchange/nope/key", b"x", receipt="r")
        error = self.assertError(c, "nope")
        self.assertEqual(error.headers.get("receipt-id"), "r")

    def test_unknown_exchange_subscribe(self) -> None:
        c = self.client()
        c.subscribe("/exchange/nope/key")
        self.assertError(c, "nope")

    def test_unknown_destination_prefix(self) -> None:
        for command, headers in [
            ("SEND", {"destination": "/foo/bar"}),
            ("SEND", {"destination": "queue/a"}),
            ("SUBSCRIBE", {"destination": "/foo/bar", "id": "1"}),
            ("SEND", {"destination": "/queue/"}),
            ("SUBSCRIBE", {"destination": "/topic/", "id": "1"}),
        ]:
            c = self.client()
            c.send(command, headers)
            self.assertError(c, "destination")

    def test_persistent_header_passed(self) -> None:
        c = self.client()
        c.subscribe("/queue/q")
        c.publish("/queue/q", b"x", persistent="true")
        [m] = c.messages()
        self.assertEqual(m.headers["persistent"], "true")

    def test_repeated_headers_shared(self) -> None:
        """Messages a producer sends with the same headers share one dict of
        application headers and one of properties (receipts apart); others
        keep their own, and every message is delivered with its own
        headers. The destination and the options are not application
        headers (the model keeps them apart)."""
        c = self.client()
        c.publish("/queue/q", b"1", persistent="true", receipt="a", app="y", **{"content-type": "t/p"})
        c.publish("/queue/q", b"2", persistent="true", receipt="b", app="y", **{"content-type": "t/p"})
        c.publish("/queue/q", b"3", persistent="true", app="x")
        c.publish("/queue/q", b"4", persistent="true")
        c.publish("/queue/q", b"5")
        self.assertEqual([f.headers["receipt-id"] for f in c.read()], ["a", "b"])
        m1, m2, m3, m4, m5 = self.vhost.queue("q").messages()
        self.assertEqual((m1.headers, m1.properties), ({"app": "y"}, {"content_type": "t/p"}))
        self.assertIs(m1.headers, m2.headers)
        self.assertIs(m1.properties, m2.properties)
        self.assertEqual((m3.headers, m3.properties), ({"app": "x"}, None))
        self.assertEqual([(m.headers, m.persistent) for m in (m4, m5)], [(None, True), (None, False)])
        c.subscribe("/queue/q")
        self.assertEqual(
            [(m.body, m.headers.get("app"), m.headers.get("persistent")) for m in c.messages()],
            [(b"1", "y", "true"), (b"2", "y", "true"), (b"3", "x", "true"),
             (b"4", None, "true"), (b"5", None, None)],
        )


class ReceiptTests(SessionTestCase):
    def test_receipt_for_every_frame(self) -> None:
        """Every frame with a receipt header is answered, in order."""
        c = self.client()
        c.subscribe("/queue/q", "s", ack="client-individual", receipt="r-sub")
        c.publish("/queue/q", b"1", receipt="r-send1")
        c.publish("/queue/q", b"2", receipt="r-send2")
        frames = c.read()
        self.assertEqual(
            [(f.command, f.headers.get("receipt-id")) for f in frames],
            [
                ("RECEIPT", "r-sub"),
                ("MESSAGE", None),
                ("RECEIPT", "r-send1"),
                ("MESSAGE", None),
                ("RECEIPT", "r-send2"),
            ],
        )
        m1, m2 = frames[1], frames[3]
        c.ack(m1, receipt="r-ack")
        c.ack(m2, "NACK", receipt="r-nack", requeue="false")
        c.send("BEGIN", {"transaction": "t", "receipt": "r-begin"})
        c.send("SEND", {"destination": "/queue/q", "transaction": "t", "receipt": "r-txsend"})
        c.send("COMMIT", {"transaction": "t", "receipt": "r-commit"})
        c.send("BEGIN", {"transaction": "t2", "receipt": "r-begin2"})
        c.send("ABORT", {"transaction": "t2", "receipt": "r-abort"})
        c.send("UNSUBSCRIBE", {"id": "s", "receipt": "r-unsub"})
        c.send("DISCONNECT", {"receipt": "r-disc"})
        frames = [f for f in c.read() if f.command != "MESSAGE"]
        self.assertEqual(
            [(f.command, f.headers["receipt-id"]) for f in frames],
            [
                ("RECEIPT", r)
                for r in (
                    "r-ack", "r-nack", "r-begin", "r-txsend", "r-commit",
                    "r-begin2", "r-abort", "r-unsub", "r-disc",
                )
            ],
        )
        self.assertFalse(c.open)

    def test_subscribe_receipt_before_waiting_messages(self) -> None:
        """A SUBSCRIBE to a queue that already holds messages: its RECEIPT
        comes before the first MESSAGE, for every ack mode."""
        for mode in ("auto", "client", "client-individual"):
            p = self.client()
            p.publish(f"/queue/w-{mode}", b"1")
            p.publish(f"/queue/w-{mode}", b"2")
            c = self.client()
            c.subscribe(f"/queue/w-{mode}", "s", ack=mode, receipt="r")
            frames = c.read()
            self.assertEqual(
                [f.command for f in frames], ["RECEIPT", "MESSAGE", "MESSAGE"], mode
            )

    def test_receipt_id_escaped(self) -> None:
        c = self.client()
        c.publish("/queue/q", b"x", receipt="a:b\\c")
        [r] = c.read()
        self.assertEqual(r.headers["receipt-id"], "a:b\\c")

    def test_error_carries_receipt_id(self) -> None:
        c = self.client()
        c.send("SUBSCRIBE", {"destination": "/nowhere", "id": "1", "receipt": "77"})
        self.assertEqual(self.assertError(c).headers["receipt-id"], "77")

    def test_disconnect(self) -> None:
        """DISCONNECT: the RECEIPT goes out, then the broker closes."""
        c = self.client()
        c.send("DISCONNECT", {"receipt": "bye"})
        frames = c.read()
        self.assertEqual([(f.command, f.headers["receipt-id"]) for f in frames], [("RECEIPT", "bye")])
        self.assertFalse(c.open)
        self.assertNotIn(c.proto, self.factory.connections)

    def test_disconnect_without_receipt(self) -> None:
        c = self.client()
        c.send("DISCONNECT")
        self.assertEqual(c.read(), [])
        self.assertFalse(c.open)


class AckTests(SessionTestCase):
    def publish(self, dest: str, *bodies: bytes) -> None:
        p = self.client()
        for b in bodies:
            p.publish(dest, b)

    def test_auto(self) -> None:
        """Auto: nothing to ack, nothing redelivered."""
        c = self.client()
        c.subscribe("/queue/q")
        self.publish("/queue/q", *[b"%d" % i for i in range(200)])
        self.assertEqual(len(c.messages()), 200)
        c.close()
        self.assertEqual(self.queue_len("q"), 0)

    def test_client_individual(self) -> None:
        """Only the acked message is settled; the others come back."""
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual")
        self.publish("/queue/q", b"1", b"2", b"3")
        m1, m2, m3 = c.messages()
        c.ack(m2)
        self.assertTrue(c.open)
        c.close()
        other = self.client()
        other.subscribe("/queue/q")
        ms = other.messages()
        self.assertEqual([m.body for m in ms], [b"1", b"3"])
        self.assertTrue(all(m.headers["redelivered"] == "true" for m in ms))

    def test_client_cumulative(self) -> None:
        """Client mode: an ACK settles every earlier message of the subscription."""
        c = self.client()
        c.subscribe("/queue/q", ack="client")
        self.publish("/queue/q", b"1", b"2", b"3", b"4")
        ms = c.messages()
        c.ack(ms[2])
        # 1-3 are settled: acking 1 again is an error later; 4 comes back.
        c.close()
        other = self.client()
        other.subscribe("/queue/q")
        self.assertEqual(other.bodies(), [b"4"])

    def test_client_cumulative_11(self) -> None:
        c = self.client("1.1")
        c.subscribe("/queue/q", ack="client")
        self.publish("/queue/q", b"1", b"2", b"3")
        ms = c.messages()
        c.ack(ms[1])
        # An ACK of a message an earlier cumulative ACK already covered is a
        # no-op, not an error (clients ack out of order after a cumulative one).
        c.ack(ms[0])
        self.assertFalse(c.transport.disconnecting)
        c.close()
        other = self.client()
        other.subscribe("/queue/q")
        self.assertEqual(other.bodies(), [b"3"])

    def test_ack_12_by_id(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual", prefetch="1")
        self.publish("/queue/q", b"1", b"2")
        [m] = c.messages()
        c.send("ACK", {"id": m.headers["ack"]})
        self.assertEqual(c.bodies(), [b"2"])

    def test_ack_unknown_id(self) -> None:
        for ack_id in ("nope", "1-999", "x-1", ""):
            c = self.client()
            c.subscribe("/queue/q", ack="client")
            c.send("ACK", {"id": ack_id})
            self.assertError(c, "unknown message")

    def test_ack_twice(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual")
        self.publish("/queue/q", b"1")
        [m] = c.messages()
        c.ack(m)
        c.ack(m)
        self.assertError(c, "unknown message")

    def test_ack_of_auto_message(self) -> None:
        c = self.client()
        c.subscribe("/queue/q")
        self.publish("/queue/q", b"1")
        [m] = c.messages()
        c.send("ACK", {"id": m.headers["message-id"]})
        self.assertError(c, "unknown message")

    def test_ack_of_other_session(self) -> None:
        """A session cannot ack what another session holds."""
        a, b = self.client(), self.client()
        a.subscribe("/queue/q", ack="client-individual")
        self.publish("/queue/q", b"1")
        [m] = a.messages()
        b.send("ACK", {"id": m.headers["ack"]})
        self.assertError(b, "unknown message")
        self.assertTrue(a.open)

    def test_nack_requeue(self) -> None:
        """NACK puts the message back; it is redelivered marked, with a count."""
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual", prefetch="1")
        self.publish("/queue/q", b"1", b"2")
        [m] = c.messages()
        self.assertNotIn("redelivered", m.headers)
        c.ack(m, "NACK")
        [m] = c.messages()
        self.assertEqual(m.body, b"1")
        self.assertEqual((m.headers["redelivered"], m.headers["x-delivery-count"]), ("true", "1"))
        c.ack(m, "NACK")
        [m] = c.messages()
        self.assertEqual((m.body, m.headers["x-delivery-count"]), (b"1", "2"))
        c.ack(m)
        [m] = c.messages()
        self.assertEqual(m.body, b"2")
        self.assertNotIn("redelivered", m.headers)

    def test_nack_no_requeue(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual")
        self.publish("/queue/q", b"1", b"2")
        m1, m2 = c.messages()
        c.ack(m1, "NACK", requeue="false")
        self.assertEqual(c.read(), [])
        c.close()
        other = self.client()
        other.subscribe("/queue/q")
        self.assertEqual(other.bodies(), [b"2"])

    def test_nack_client_mode_cumulative(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client", prefetch="2")
        self.publish("/queue/q", b"1", b"2", b"3")
        m1, m2 = c.messages()
        c.ack(m2, "NACK")
        self.assertEqual(
            [(m.body, m.headers.get("redelivered")) for m in c.messages()],
            [(b"1", "true"), (b"2", "true")],
        )

    def test_nack_11(self) -> None:
        c = self.client("1.1")
        c.subscribe("/queue/q", ack="client-individual")
        self.publish("/queue/q", b"1")
        [m] = c.messages()
        c.ack(m, "NACK")
        [m] = c.messages()
        self.assertEqual((m.body, m.headers["redelivered"]), (b"1", "true"))

    def test_disconnect_returns_unacked_in_order(self) -> None:
        """Unacked messages go to the next subscriber marked, the rest in order."""
        a = self.client()
        a.subscribe("/queue/q", ack="client-individual", prefetch="3")
        self.publish("/queue/q", *[b"%d" % i for i in range(1, 7)])
        m1, m2, m3 = a.messages()
        a.ack(m2)
        self.assertEqual(a.bodies(), [b"4"])
        a.close()
        b = self.client()
        b.subscribe("/queue/q", ack="client-individual", prefetch="10")
        got = [(m.body, m.headers.get("redelivered")) for m in b.messages()]
        self.assertEqual(
            got,
            [(b"1", "true"), (b"3", "true"), (b"4", "true"), (b"5", None), (b"6", None)],
        )

    def test_unacked_to_other_live_subscriber(self) -> None:
        """A leaving subscriber's messages go to a live one as its window opens."""
        a, b = self.client(), self.client()
        a.subscribe("/queue/q", ack="client", prefetch="2")
        b.subscribe("/queue/q", ack="client", prefetch="2")
        self.publish("/queue/q", b"1", b"2", b"3", b"4", b"5")
        got_a = a.messages()
        got_b = b.messages()
        self.assertEqual((len(got_a), len(got_b)), (2, 2))
        a.close()
        self.assertEqual(b.read(), [])  # b has no credit left
        b.ack(got_b[-1])
        ms = b.messages()
        self.assertEqual([m.body for m in ms], [m.body for m in got_a])
        self.assertTrue(all(m.headers["redelivered"] == "true" for m in ms))
        b.ack(ms[-1])
        self.assertEqual(b.bodies(), [b"5"])

    def test_unsubscribe_returns_unacked(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", "s", ack="client")
        self.publish("/queue/q", b"1")
        c.messages()
        c.send("UNSUBSCRIBE", {"id": "s"})
        self.assertEqual(self.queue_len("q"), 1)
        self.assertEqual(self.vhost.queues["q"].messages()[0].delivery_count, 1)


class PrefetchTests(SessionTestCase):
    settings = StompSettings(default_prefetch=3)

    def check_window(self, headers: dict, window: int) -> None:
        c = self.client()
        dest = "/queue/" + "-".join(headers) if headers else "/queue/default"
        c.subscribe(dest, ack="client-individual", **headers)
        p = self.client()
        for i in range(10):
            p.publish(dest, b"%d" % i)
        ms = c.messages()
        self.assertEqual(len(ms), window, headers)
        c.ack(ms[0])
        [m] = c.messages()
        self.assertEqual(m.body, b"%d" % window)

    def test_prefetch_count(self) -> None:
        self.check_window({"prefetch-count": "2"}, 2)

    def test_activemq_prefetch_size(self) -> None:
        self.check_window({"activemq.prefetchSize": "4"}, 4)

    def test_prefetch(self) -> None:
        self.check_window({"prefetch": "1"}, 1)

    def test_default_prefetch(self) -> None:
        self.check_window({}, 3)

    def test_zero_is_unlimited(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client", **{"prefetch-count": "0"})
        p = self.client()
        for _ in range(50):
            p.publish("/queue/q", b"x")
        self.assertEqual(len(c.messages()), 50)

    def test_auto_ignores_prefetch(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", **{"prefetch-count": "1"})
        p = self.client()
        for _ in range(5):
            p.publish("/queue/q", b"x")
        self.assertEqual(len(c.messages()), 5)

    def test_invalid_prefetch(self) -> None:
        for value in ("-1", "many", ""):
            c = self.client()
            c.subscribe("/queue/q", ack="client", **{"prefetch-count": value})
            self.assertError(c, "prefetch-count")

    def test_client_mode_ack_frees_window(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client", **{"prefetch-count": "3"})
        p = self.client()
        for i in range(10):
            p.publish("/queue/q", b"%d" % i)
        ms = c.messages()
        self.assertEqual(len(ms), 3)
        c.ack(ms[1])
        self.assertEqual(c.bodies(), [b"3", b"4"])


class TransactionTests(SessionTestCase):
    def test_send_at_commit(self) -> None:
        sub = self.client()
        sub.subscribe("/queue/q")
        c = self.client()
        c.send("BEGIN", {"transaction": "tx"})
        c.publish("/queue/q", b"1", transaction="tx")
        c.publish("/queue/q", b"2", transaction="tx")
        c.publish("/queue/q", b"outside")
        self.assertEqual(sub.bodies(), [b"outside"])
        c.send("COMMIT", {"transaction": "tx", "receipt": "done"})
        self.assertEqual(c.read()[0].headers["receipt-id"], "done")
        ms = sub.messages()
        self.assertEqual([m.body for m in ms], [b"1", b"2"])
        self.assertNotIn("transaction", ms[0].headers)

    def test_abort(self) -> None:
        sub = self.client()
        sub.subscribe("/queue/q")
        c = self.client()
        c.send("BEGIN", {"transaction": "tx"})
        c.publish("/queue/q", b"1", transaction="tx")
        c.send("ABORT", {"transaction": "tx"})
        self.assertEqual(sub.read(), [])
        # The name can be used again.
        c.send("BEGIN", {"transaction": "tx"})
        c.publish("/queue/q", b"2", transaction="tx")
        c.send("COMMIT", {"transaction": "tx"})
        self.assertEqual(sub.bodies(), [b"2"])

    def test_two_transactions(self) -> None:
        sub = self.client()
        sub.subscribe("/queue/q")
        c = self.client()
        c.send("BEGIN", {"transaction": "a"})
        c.send("BEGIN", {"transaction": "b"})
        c.publish("/queue/q", b"a1", transaction="a")
        c.publish("/queue/q", b"b1", transaction="b")
        c.send("COMMIT", {"transaction": "b"})
        c.send("ABORT", {"transaction": "a"})
        self.assertEqual(sub.bodies(), [b"b1"])

    def test_ack_at_commit(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual", prefetch="1")
        p = self.client()
        p.publish("/queue/q", b"1")
        p.publish("/queue/q", b"2")
        [m] = c.messages()
        c.send("BEGIN", {"transaction": "tx"})
        c.ack(m, transaction="tx")
        self.assertEqual(c.read(), [])  # not settled yet: no credit back
        c.send("COMMIT", {"transaction": "tx"})
        self.assertEqual(c.bodies(), [b"2"])

    def test_ack_aborted(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual")
        p = self.client()
        p.publish("/queue/q", b"1")
        [m] = c.messages()
        c.send("BEGIN", {"transaction": "tx"})
        c.ack(m, transaction="tx")
        c.send("ABORT", {"transaction": "tx"})
        c.close()
        other = self.client()
        other.subscribe("/queue/q")
        [m] = other.messages()
        self.assertEqual((m.body, m.headers["redelivered"]), (b"1", "true"))

    def test_nack_at_commit(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client-individual")
        p = self.client()
        p.publish("/queue/q", b"1")
        [m] = c.messages()
        c.send("BEGIN", {"transaction": "tx"})
        c.ack(m, "NACK", transaction="tx")
        self.assertEqual(c.read(), [])
        c.send("COMMIT", {"transaction": "tx"})
        [m] = c.messages()
        self.assertEqual((m.body, m.headers["redelivered"]), (b"1", "true"))

    def test_unknown_transaction(self) -> None:
        for frames in (
            [("SEND", {"destination": "/queue/q", "transaction": "nope"})],
            [("COMMIT", {"transaction": "nope"})],
            [("ABORT", {"transaction": "nope"})],
            [("BEGIN", {"transaction": "t"}), ("COMMIT", {"transaction": "t"}),
             ("COMMIT", {"transaction": "t"})],
        ):
            c = self.client()
            for command, headers in frames:
                c.send(command, headers)
            self.assertError(c, "transaction")
        self.assertEqual(self.vhost.queues.get("q") and self.queue_len("q") or 0, 0)

    def test_begin_twice(self) -> None:
        c = self.client()
        c.send("BEGIN", {"transaction": "t"})
        c.send("BEGIN", {"transaction": "t"})
        self.assertError(c, "transaction")

    def test_ack_unknown_transaction(self) -> None:
        c = self.client()
        c.subscribe("/queue/q", ack="client")
        c.publish("/queue/q", b"1")
        [m] = c.messages()
        c.ack(m, transaction="nope")
        self.assertError(c, "transaction")

    def test_transactional_send_checked_early(self) -> None:
        """A bad destination in a transaction fails at SEND, not at COMMIT."""
        c = self.client()
        c.send("BEGIN", {"transaction": "t"})
        c.publish("/exchange/nope/k", b"x", transaction="t")
        self.assertError(c, "nope")

    def test_disconnect_aborts(self) -> None:
        sub = self.client()
        sub.subscribe("/queue/q")
        c = self.client()
        c.send("BEGIN", {"transaction": "tx"})
        c.publish("/queue/q", b"1", transaction="tx")
        c.close()
        self.assertEqual(sub.read(), [])
        self.assertEqual(self.queue_len("q"), 0)


class TempQueueTests(SessionTestCase):
    def test_rpc_round_trip(self) -> None:
        """reply-to /temp-queue/ is rewritten so the reply finds the requester."""
        server = self.client()
        server.subscribe("/queue/rpc", "srv")
        requester = self.client()
        requester.publish(
            "/queue/rpc", b"2+2", **{"reply-to": "/temp-queue/answers", "correlation-id": "c1"}
        )
        [request] = server.messages()
        reply_to = request.headers["reply-to"]
        self.assertTrue(reply_to.startswith("/queue/"), reply_to)
        self.assertNotEqual(reply_to, "/queue/answers")
        server.publish(
            reply_to, b"4", receipt="sent", **{"correlation-id": request.headers["correlation-id"]}
        )
        self.assertEqual(
            [(f.command, f.headers.get("receipt-id")) for f in server.read()], [("RECEIPT", "sent")]
        )
        [reply] = requester.messages()
        self.assertEqual(reply.body, b"4")
        self.assertEqual(reply.headers["correlation-id"], "c1")
        self.assertEqual(reply.headers["subscription"], "/temp-queue/answers")

    def test_temp_queues_private(self) -> None:
        """Two sessions' temp queues of the same name are different queues."""
        server = self.client()
        server.subscribe("/queue/rpc")
        a, b = self.client(), self.client()
        a.publish("/queue/rpc", b"from a", **{"reply-to": "/temp-queue/r"})
        b.publish("/queue/rpc", b"from b", **{"reply-to": "/temp-queue/r"})
        ra, rb = server.messages()
        self.assertNotEqual(ra.headers["reply-to"], rb.headers["reply-to"])
        server.publish(rb.headers["reply-to"], b"to b")
        server.publish(ra.headers["reply-to"], b"to a")
        self.assertEqual(a.bodies(), [b"to a"])
        self.assertEqual(b.bodies(), [b"to b"])
        # Nobody else may consume a session's temp queue.
        thief = self.client()
        thief.subscribe(ra.headers["reply-to"])
        self.assertError(thief)

    def test_temp_queue_deleted_on_disconnect(self) -> None:
        server = self.client()
        server.subscribe("/queue/rpc")
        a = self.client()
        a.publish("/queue/rpc", b"q", **{"reply-to": "/temp-queue/r"})
        [request] = server.messages()
        name = request.headers["reply-to"][len("/queue/"):]
        self.assertIn(name, self.vhost.queues)
        a.close()
        self.assertNotIn(name, self.vhost.queues)

    def test_subscribe_temp_queue(self) -> None:
        """A client may also subscribe to its temp queue and send to it."""
        c = self.client()
        c.subscribe("/temp-queue/mine", "t")
        c.publish("/temp-queue/mine", b"self")
        [m] = c.messages()
        self.assertEqual((m.body, m.headers["subscription"]), (b"self", "t"))


class ControlTests(SessionTestCase):
    def receipt(self, c: Client, path: str) -> dict:
        c.publish(path, b"", receipt="ctl")
        [r] = c.read()
        self.assertEqual((r.command, r.headers["receipt-id"]), ("RECEIPT", "ctl"))
        return r.headers

    def test_count_msgs(self) -> None:
        c = self.client()
        for _ in range(3):
            c.publish("/queue/q", b"x")
        self.assertEqual(self.receipt(c, "/control/count-msgs/queue/q")["num-messages"], "3")
        self.assertEqual(self.receipt(c, "/control/count-msgs/queue/none")["num-messages"], "0")
        self.assertNotIn("none", self.vhost.queues)

    def test_count_subscribers_queue(self) -> None:
        a, b = self.client(), self.client()
        a.subscribe("/queue/q")
        b.subscribe("/queue/q")
        self.assertEqual(
            self.receipt(a, "/control/count-subscribers/queue/q")["num-subscribers"], "2"
        )
        b.close()
        self.assertEqual(
            self.receipt(a, "/control/count-subscribers/queue/q")["num-subscribers"], "1"
        )

    def test_count_subscribers_topic(self) -> None:
        a, b, c = self.client(), self.client(), self.client()
        a.subscribe("/topic/news.sport")
        b.subscribe("/topic/news.*")
        c.subscribe("/topic/weather")
        self.assertEqual(
            self.receipt(a, "/control/count-subscribers/topic/news.sport")["num-subscribers"], "2"
        )
        self.assertEqual(
            self.receipt(a, "/control/count-subscribers/topic/fx")["num-subscribers"], "0"
        )

    def test_control_does_not_publish(self) -> None:
        c = self.client()
        c.subscribe("/topic/#")
        self.receipt(c, "/control/count-msgs/queue/q")
        self.assertEqual(c.read(), [])

    def test_unknown_control(self) -> None:
        c = self.client()
        c.publish("/control/reboot", b"", receipt="r")
        self.assertError(c, "control")

    def test_subscribe_control(self) -> None:
        c = self.client()
        c.subscribe("/control/count-msgs/queue/q")
        self.assertError(c, "control")


class DurableTests(SessionTestCase):
    def test_durable_true_keeps_queue(self) -> None:
        """durable:true + id keeps the subscription's queue while the client is away."""
        c = self.client(**{"client-id": "app"})
        c.subscribe("/topic/news", "d1", durable="true", ack="client-individual")
        c.close()
        p = self.client()
        p.publish("/topic/news", b"while away")
        c2 = self.client(**{"client-id": "app"})
        c2.subscribe("/topic/news", "d1", durable="true", ack="client-individual")
        [m] = c2.messages()
        self.assertEqual(m.body, b"while away")
        # Another client id has its own durable subscription.
        other = self.client(**{"client-id": "other"})
        other.subscribe("/topic/news", "d1", durable="true")
        self.assertEqual(other.read(), [])

    def test_activemq_subscription_name(self) -> None:
        c = self.client(login="bob")
        c.subscribe("/topic/t", "s", **{"activemq.subscriptionName": "bob-feed"})
        c.close()
        self.client().publish("/topic/t", b"kept")
        c2 = self.client(login="bob")
        c2.subscribe("/topic/t", "another-id", **{"activemq.subscriptionName": "bob-feed"})
        self.assertEqual(c2.bodies(), [b"kept"])

    def test_non_durable_loses_messages_while_away(self) -> None:
        c = self.client(**{"client-id": "app"})
        c.subscribe("/topic/news", "d1")
        c.close()
        self.client().publish("/topic/news", b"lost")
        c2 = self.client(**{"client-id": "app"})
        c2.subscribe("/topic/news", "d1")
        self.assertEqual(c2.read(), [])

    def test_unsubscribe_durable_removes(self) -> None:
        c = self.client(**{"client-id": "app"})
        c.subscribe("/topic/news", "d1", durable="true")
        c.send("UNSUBSCRIBE", {"id": "d1", "durable": "true"})
        self.client().publish("/topic/news", b"after")
        c.subscribe("/topic/news", "d1", durable="true")
        self.assertEqual(c.read(), [])

    def test_plain_unsubscribe_keeps_durable(self) -> None:
        c = self.client(**{"client-id": "app"})
        c.subscribe("/topic/news", "d1", durable="true")
        c.send("UNSUBSCRIBE", {"id": "d1"})
        self.client().publish("/topic/news", b"kept")
        c.subscribe("/topic/news", "d1", durable="true")
        self.assertEqual(c.bodies(), [b"kept"])


    def test_persistent_true_and_x_queue_name(self) -> None:
        """persistent:true makes a subscription durable like durable:true;
        RabbitMQ's x-queue-name then names it (the id does not)."""
        c = self.client(login="carol")
        c.subscribe("/topic/t", "id-1", persistent="true", **{"x-queue-name": "feed"})
        self.assertIn("durable.carol.feed", self.vhost.queues)
        c.close()
        self.client().publish("/topic/t", b"kept")
        c2 = self.client(login="carol")
        c2.subscribe("/topic/t", "id-2", durable="true", **{"x-queue-name": "feed"})
        self.assertEqual(c2.bodies(), [b"kept"])

    def test_x_queue_name_alone_is_not_durable(self) -> None:
        """x-queue-name without durable:true names no durable subscription
        (RabbitMQ makes a non-durable queue then; QMQ names that one itself)."""
        c = self.client(login="carol")
        c.subscribe("/topic/t", "s", ack="client", **{"x-queue-name": "feed"})
        self.assertFalse([n for n in self.vhost.queues if n.startswith("durable.")])

    def test_owned_by_login_not_client_id(self) -> None:
        """The owner is the user (login); the client id only tells apart one
        user's clients, and another user naming the same client id and
        subscription gets a subscription of its own."""
        a = self.client(login="alice", **{"client-id": "app"})
        a.subscribe("/topic/t", "d", durable="true")
        self.assertIn("durable.alice.app:d", self.vhost.queues)
        m = self.client(login="mallory", **{"client-id": "app"})
        m.subscribe("/topic/t", "d", durable="true")
        self.assertIn("durable.mallory.app:d", self.vhost.queues)

    def test_other_user_cannot_read_by_queue_name(self) -> None:
        """Nobody but its owner reads a durable subscription's queue by
        naming it; the owner may."""
        a = self.client(login="alice")
        a.subscribe("/topic/t", "d", durable="true")
        a.close()
        self.client().publish("/topic/t", b"secret")
        m = self.client(login="mallory")
        m.subscribe("/queue/durable.alice.d", "steal", receipt="r")
        error = self.assertError(m, "access refused (read)")
        self.assertEqual(error.headers["receipt-id"], "r")
        self.assertEqual(self.queue_len("durable.alice.d"), 1)
        owner = self.client(login="alice")
        owner.subscribe("/queue/durable.alice.d", "mine")
        self.assertEqual(owner.bodies(), [b"secret"])

    def test_other_user_cannot_write_or_create(self) -> None:
        """Nor writes to it, nor makes one by naming it (a durable SUBSCRIBE
        makes them)."""
        a = self.client(login="alice")
        a.subscribe("/topic/t", "d", durable="true")
        m = self.client(login="mallory")
        m.publish("/queue/durable.alice.d", b"forged")
        self.assertError(m, "access refused (write)")
        m2 = self.client(login="mallory")
        m2.publish("/queue/durable.mallory.squat", b"x")
        self.assertError(m2, "no such queue")
        self.assertNotIn("durable.mallory.squat", self.vhost.queues)
        self.assertEqual(a.read(), [])

    def test_other_user_cannot_count(self) -> None:
        """Control counts of another user's durable subscription are refused
        too; the owner gets them."""
        a = self.client(login="alice")
        a.subscribe("/topic/t", "d", durable="true")
        a.publish("/control/count-subscribers/queue/durable.alice.d", b"", receipt="c")
        [receipt] = a.read()
        self.assertEqual(receipt.headers["num-subscribers"], "1")
        for path in ("count-msgs/queue/", "count-subscribers/queue/"):
            m = self.client(login="mallory")
            m.publish(f"/control/{path}durable.alice.d", b"", receipt="c")
            self.assertError(m, "access refused (read)")

    def test_anonymous_cannot_read_a_users_subscription(self) -> None:
        """A client without a login is not the owner of a user's subscription."""
        a = self.client(login="alice")
        a.subscribe("/topic/t", "d", durable="true")
        anon = self.client()
        anon.subscribe("/queue/durable.alice.d", "x")
        self.assertError(anon, "access refused")

    def test_tls_identity_owns_without_login(self) -> None:
        """Without a login, a verified TLS client's name is the owner."""
        from qmq.tls import PeerIdentity

        c = self.client(version="none")
        c.proto.identity = PeerIdentity(common_name="node-1", subject="CN=node-1", issuer="CN=ca")
        c.connect()
        c.subscribe("/topic/t", "d", durable="true")
        self.assertIn("durable.node-1.d", self.vhost.queues)
        anon = self.client()
        anon.subscribe("/queue/durable.node-1.d", "x")
        self.assertError(anon, "access refused")

    def test_dots_in_login_do_not_collide(self) -> None:
        """A login with dots cannot pass for another owner: user "alice.d"
        is not the owner of alice's subscription "d" and vice versa."""
        a = self.client(login="alice")
        a.subscribe("/topic/t", "x.y", durable="true")
        self.assertIn("durable.alice.x.y", self.vhost.queues)
        m = self.client(login="alice.x")
        m.subscribe("/topic/t", "y", durable="true")
        self.assertIn("durable.alice%2Ex.y", self.vhost.queues)
        m.subscribe("/queue/durable.alice.x.y", "steal")
        self.assertError(m, "access refused")


class FlowControlTests(SessionTestCase):
    def test_pause_and_resume(self) -> None:
        """While the transport is paused no MESSAGE is written; resume sends the backlog."""
        c = self.client()
        c.subscribe("/queue/q", "s1")
        c.subscribe("/topic/t", "s2")
        p = self.client()
        p.publish("/queue/q", b"before")
        self.assertEqual(c.bodies(), [b"before"])
        c.proto.pauseProducing()
        for i in range(5):
            p.publish("/queue/q", b"q%d" % i)
            p.publish("/topic/t", b"t%d" % i)
        self.clock.advance(0)
        self.assertEqual(c.read(), [])
        self.assertEqual(self.queue_len("q"), 5)
        c.proto.resumeProducing()
        self.clock.advance(0)
        ms = c.messages()
        by_sub = {}
        for m in ms:
            by_sub.setdefault(m.headers["subscription"], []).append(m.body)
        self.assertEqual(by_sub, {"s1": [b"q%d" % i for i in range(5)], "s2": [b"t%d" % i for i in range(5)]})

    def test_paused_session_skipped(self) -> None:
        """Another subscriber of the queue is served while one is paused."""
        slow, fast = self.client(), self.client()
        slow.subscribe("/queue/q")
        fast.subscribe("/queue/q")
        slow.proto.pauseProducing()
        p = self.client()
        for i in range(4):
            p.publish("/queue/q", b"%d" % i)
        self.assertEqual(len(fast.messages()), 4)
        self.assertEqual(slow.read(), [])

    def test_subscribe_while_paused(self) -> None:
        c = self.client()
        c.proto.pauseProducing()
        c.publish("/queue/q", b"x")
        c.subscribe("/queue/q", receipt="r")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.proto.resumeProducing()
        self.clock.advance(0)
        self.assertEqual(c.bodies(), [b"x"])

    def test_receipts_while_paused(self) -> None:
        """Pausing stops deliveries, not the answers to the client's own frames."""
        c = self.client()
        c.proto.pauseProducing()
        c.publish("/queue/q", b"x", receipt="r")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])

    def test_topic_backlog(self) -> None:
        """A stalled topic subscriber holds at most topic_backlog messages."""
        self.factory = StompFactory(self.broker, StompSettings(topic_backlog=3), clock=self.clock)
        c = self.client()
        c.subscribe("/topic/t")
        c.proto.pauseProducing()
        p = self.client()
        for i in range(10):
            p.publish("/topic/t", b"%d" % i)
        c.proto.resumeProducing()
        self.clock.advance(0)
        self.assertEqual(c.bodies(), [b"7", b"8", b"9"])


class ErrorTests(SessionTestCase):
    settings = StompSettings(
        max_body_size=100, max_headers=5, max_header_line=80, max_header_block=300
    )

    def test_malformed_frame(self) -> None:
        c = self.client()
        c.raw(b"SEND\ndestination/queue/a\n\nx\x00")
        self.assertError(c, "header")

    def test_bad_content_length(self) -> None:
        c = self.client()
        c.raw(b"SEND\ndestination:/queue/a\ncontent-length:3\n\nabcd\x00")
        self.assertError(c)
        self.assertNotIn("a", self.vhost.queues)

    def test_bad_escape(self) -> None:
        c = self.client("1.2")
        c.raw(b"SEND\ndestination:/queue/a\nx:a\\qb\n\n\x00")
        self.assertError(c, "escape")

    def test_unknown_command(self) -> None:
        c = self.client()
        c.send("PUBLISH", {"destination": "/queue/a"})
        self.assertError(c, "PUBLISH")

    def test_missing_headers(self) -> None:
        cases = [
            ("1.2", "SEND", {}, "destination"),
            ("1.2", "SUBSCRIBE", {"id": "1"}, "destination"),
            ("1.2", "SUBSCRIBE", {"destination": "/queue/a"}, "id"),
            ("1.1", "SUBSCRIBE", {"destination": "/queue/a"}, "id"),
            ("1.2", "UNSUBSCRIBE", {}, "id"),
            ("1.1", "UNSUBSCRIBE", {"destination": "/queue/a"}, "id"),
            ("1.2", "ACK", {}, "id"),
            ("1.1", "ACK", {"subscription": "1"}, "message-id"),
            ("1.2", "NACK", {}, "id"),
            ("1.0", "ACK", {}, "message-id"),
            ("1.2", "BEGIN", {}, "transaction"),
            ("1.2", "COMMIT", {}, "transaction"),
            ("1.2", "ABORT", {}, "transaction"),
        ]
        for version, command, headers, missing in cases:
            c = self.client(version)
            c.send(command, headers)
            error = self.assertError(c, missing)
            self.assertIn("missing", error.headers["message"], (version, command))

    def test_body_too_large(self) -> None:
        c = self.client()
        c.publish("/queue/a", b"x" * 101)
        self.assertError(c, "max_body_size")
        d = self.client()
        d.raw(b"SEND\ndestination:/queue/a\ncontent-length:1000\n\n")
        self.assertError(d, "max_body_size")
        self.assertNotIn("a", self.vhost.queues)

    def test_body_at_limit(self) -> None:
        c = self.client()
        c.publish("/queue/a", b"x" * 100, receipt="r")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])

    def test_too_many_headers(self) -> None:
        c = self.client()
        c.send("SEND", {"destination": "/queue/a", **{f"h{i}": "v" for i in range(5)}})
        self.assertError(c, "max_headers")

    def test_header_line_too_long(self) -> None:
        c = self.client()
        c.send("SEND", {"destination": "/queue/a", "long": "v" * 100})
        self.assertError(c, "max_header_line")

    def test_header_block_too_large(self) -> None:
        c = self.client()
        c.send("SEND", {"destination": "/queue/a", **{f"h{i}": "v" * 70 for i in range(4)}})
        self.assertError(c, "max_header_block")

    def test_header_block_too_large_in_pieces(self) -> None:
        """The limit holds for a header block that arrives a byte at a time."""
        c = self.client()
        data = b"SEND\n" + b"x" * 400
        for i in range(len(data)):
            if not c.open:
                break
            c.raw(data[i : i + 1])
        self.assertError(c, "max_header")

    def test_error_then_nothing_more(self) -> None:
        """Frames after the bad one in the same read are not processed."""
        c = self.client()
        c.raw(
            encode_frame("SEND", {"destination": "/queue/a"}, b"ok")
            + b"BOGUS\n\n\x00"
            + encode_frame("SEND", {"destination": "/queue/a"}, b"after")
        )
        self.assertError(c, "BOGUS")
        self.assertEqual([m.body for m in self.vhost.queues["a"].messages()], [b"ok"])

    def test_frames_before_malformed_processed(self) -> None:
        c = self.client()
        c.raw(
            encode_frame("SEND", {"destination": "/queue/a", "receipt": "1"}, b"ok")
            + b"SEND\nno colon here\n\n\x00"
        )
        frames = c.read()
        self.assertEqual(frames[0].headers["receipt-id"], "1")
        self.assertEqual(frames[-1].command, "ERROR")
        self.assertEqual(self.queue_len("a"), 1)

    def test_other_clients_unaffected(self) -> None:
        """One client's error closes only that client."""
        good = self.client()
        good.subscribe("/queue/q", receipt="s")
        good.read()
        bad = self.client()
        bad.subscribe("/queue/q")
        bad.raw(b"\x00garbage without end" + b"x" * 400)
        self.assertError(bad)
        p = self.client()
        for i in range(3):
            p.publish("/queue/q", b"%d" % i)
        self.assertEqual(good.bodies(), [b"0", b"1", b"2"])
        good.publish("/queue/q", b"me too", receipt="r")
        frames = good.read()
        self.assertEqual([f.command for f in frames], ["MESSAGE", "RECEIPT"])
        self.assertTrue(good.open)

    def test_receipted_message_not_lost_when_subscriber_misbehaves(self) -> None:
        """A misbehaving subscriber whose TCP close is still pending loses nothing.

        With a real transport, loseConnection returns before connectionLost;
        messages routed to the closed session in between must go elsewhere.
        """
        good = self.client()
        good.subscribe("/queue/q")
        bad = self.client(transport=StringTransport())
        bad.subscribe("/queue/q", ack="client-individual")
        bad.subscribe("/queue/q2", "s2")
        bad.send("FOO")
        self.assertError(bad, "FOO")
        p = self.client()
        for i in range(6):
            p.publish("/queue/q", b"%d" % i, receipt=str(i))
            p.publish("/queue/q2", b"2-%d" % i, receipt=f"2-{i}")
        self.assertEqual(len(p.read()), 12)
        bad.proto.connectionLost(None)  # the transport finally reports it
        self.assertEqual(sorted(good.bodies()), [b"%d" % i for i in range(6)])
        late = self.client()
        late.subscribe("/queue/q2")
        self.assertEqual(late.bodies(), [b"2-%d" % i for i in range(6)])

    def test_unacked_of_misbehaving_client_redelivered(self) -> None:
        bad = self.client()
        bad.subscribe("/queue/q", ack="client")
        p = self.client()
        p.publish("/queue/q", b"1", receipt="r")
        self.assertEqual(bad.bodies(), [b"1"])
        bad.send("NOPE")
        self.assertError(bad)
        good = self.client()
        good.subscribe("/queue/q")
        [m] = good.messages()
        self.assertEqual((m.body, m.headers["redelivered"]), (b"1", "true"))

    def test_error_version_header(self) -> None:
        c = self.client("1.1")
        c.send("NOPE")
        self.assertEqual(self.assertError(c).headers["version"], "1.1")


class ShutdownTests(SessionTestCase):
    def test_shutdown(self) -> None:
        """shutdown() sends every client an ERROR and fires once all are closed."""
        a, b = self.client(), self.client("1.0")
        d = self.factory.shutdown("maintenance")
        for c in (a, b):
            error = self.assertError(c)
            self.assertEqual(error.headers["message"], "maintenance")
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.factory.connections, set())
        self.clock.advance(0)
        self.assertEqual(self.clock.getDelayedCalls(), [])  # the abort timer is gone

    def test_shutdown_waits_for_close(self) -> None:
        """With a close still pending, the Deferred waits; stragglers are aborted."""
        lingering = self.client(transport=StringTransport())
        d = self.factory.shutdown(timeout=5)
        self.assertError(lingering)
        self.assertNoResult(d)
        lingering.proto.connectionLost(None)
        self.assertIsNone(self.successResultOf(d))

    def test_shutdown_aborts_after_timeout(self) -> None:
        """A connection still open at the shutdown timeout is aborted then.

        (Its own close grace, longer here, would abort it later.)
        """
        self.factory.registry.settings = ConnectionSettings(close_grace=60)
        lingering = self.client(transport=StringTransport())
        d = self.factory.shutdown(timeout=5)
        self.clock.advance(4.9)
        self.assertFalse(lingering.transport.disconnected)
        self.clock.advance(0.2)
        self.assertTrue(lingering.transport.disconnected)
        lingering.proto.connectionLost(None)
        self.successResultOf(d)

    def test_shutdown_without_connections(self) -> None:
        self.assertIsNone(self.successResultOf(self.factory.shutdown()))

    def test_shutdown_before_connect(self) -> None:
        c = Client(self.factory)
        d = self.factory.shutdown()
        self.assertError(c)
        self.successResultOf(d)


class RepeatedSendTests(SessionTestCase):
    """A producer that repeats its SEND headers gets, from what the session
    kept of the last ones (the split into the model, the parsed delivery
    options, the relayed block), exactly the message a fresh session makes
    of the same frame; the id and the times are each message's own."""

    VARIANTS = [
        {},
        {"persistent": "true"},
        {"priority": "7"},
        {"ttl": "60000"},
        {"expires": "4000000000000"},
        {"ttl": "60000", "expires": "4000000000000", "priority": "3", "persistent": "true"},
        {"delay": "5000"},
        {"deliver-at": "4000000000000", "ack-timeout": "30"},
        {"content-type": "text/plain", "correlation-id": "c1", "app": "y", "x-n": "1"},
        {"reply-to": "/queue/replies", "persistent": "false"},
        {"reply-to": "/temp-queue/back"},
    ]

    def published(self, client: Client) -> list:
        """Every message C{client}'s session publishes from now on."""
        channel = client.session.channel
        seen: list = []
        publish = channel.publish_target

        def spy(target, message, checked=False):
            seen.append(message)
            return publish(target, message, checked)

        channel.publish_target = spy
        return seen

    @staticmethod
    def model(m) -> tuple:
        """What a message is, less its id and the times made from its
        timestamp (given relative to it)."""

        def rel(t: float) -> float:
            return round(t - m.timestamp, 6) if t else 0.0

        return (m.exchange, m.routing_key, m.headers, m.properties, m.persistent, m.priority,
                rel(m.expires), rel(m.deliver_at), m.ack_timeout, m.body)

    def test_cached_and_fresh_alike(self) -> None:
        """Four SENDs with the same headers (the second found by comparing
        headers, the later ones by the parser's repeated block), with and
        without receipts, make the message one SEND makes on a session that
        never saw them, delivered with the same MESSAGE headers."""
        self.clock.advance(1_700_000_000)
        for receipt in (False, True):
            for headers in self.VARIANTS:
                self.vhost.queues.pop("q", None)
                producer = self.client()
                seen = self.published(producer)
                for i in range(4):
                    h = dict(headers, receipt=f"r{i}") if receipt else headers
                    producer.publish("/queue/q", b"body", **h)
                fresh = self.client()
                fresh_seen = self.published(fresh)
                fresh.publish("/queue/q", b"body", **headers)
                self.assertEqual(len(seen), 4, headers)
                self.assertEqual(len(set(m.id for m in seen + fresh_seen)), 5)
                expected = self.model(fresh_seen[0])
                temp = headers.get("reply-to", "").startswith("/temp-queue/")
                if temp:
                    # Rewritten to the producer's own reply queue.
                    own = {"reply_to": "/queue/" + producer.session.channel.temp_queue("back").name}
                    self.assertNotEqual(expected[3], own)
                    expected = expected[:3] + (own,) + expected[4:]
                for m in seen:
                    self.assertEqual(self.model(m), expected, (receipt, headers))
                if "delay" in headers or "deliver-at" in headers:
                    continue
                consumer = self.client()
                consumer.subscribe("/queue/q")
                got = [
                    {k: v for k, v in f.headers.items() if k not in ("message-id", "subscription")}
                    for f in consumer.messages()
                ]
                self.assertEqual(len(got), 5, headers)
                if temp:
                    got[4]["reply-to"] = got[0]["reply-to"]
                self.assertEqual(got[:4], [got[4]] * 4, (receipt, headers))

    def test_times_are_each_messages_own(self) -> None:
        """A ttl or a delay is counted from each message's publish, however
        many times the same headers came before."""
        self.clock.advance(1_700_000_000)
        producer = self.client()
        seen = self.published(producer)
        for _ in range(4):
            producer.publish("/queue/q", b"x", ttl="60000", delay="5000", priority="2")
            self.clock.advance(1.5)
        self.assertEqual([m.timestamp - seen[0].timestamp for m in seen], [0, 1.5, 3.0, 4.5])
        for m in seen:
            self.assertEqual((m.expires, m.deliver_at, m.priority),
                             (m.timestamp + 60.0, m.timestamp + 5.0, 2))

    def test_bad_value_refused_each_time(self) -> None:
        """A header set that was refused is refused again (nothing of it is
        kept), and a good one after it is read afresh."""
        for _ in range(2):
            c = self.client()
            c.publish("/queue/q", b"x", ttl="60000")
            c.publish("/queue/q", b"x", ttl="-1")
            self.assertError(c, "invalid ttl header")
