"""STOMP over SockJS (L{qmq.web.sockjs.stomp}): the TCP listener's STOMP
session behind SockJS sessions, over twisted.web's real HTTP parser, on a
L{Clock}."""

from __future__ import annotations

import json
import uuid

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.stomp.frame import StompParser, encode_frame
from qmq.stomp.settings import StompSettings
from qmq.tls import PeerIdentity
from qmq.web.sockjs.settings import SockJSSettings
from qmq.web.sockjs.stomp import stomp_sockjs_resource
from tests.sockjs_http import Exchange


def frame(command: str, body: bytes = b"", **headers: str) -> str:
    return encode_frame(command, list(headers.items()), body, "1.2").decode()


class Client:
    """A SockJS xhr-polling client speaking STOMP."""

    def __init__(self, test: StompOverSockJSTests) -> None:
        self.test = test
        self.url = f"/sockjs/000/{uuid.uuid4()}"
        self.parser = StompParser()
        self.frames: list = []
        self.closed: str | None = None
        self.poll()

    def send(self, *messages: str) -> Exchange:
        r = Exchange(self.test.site, "POST", self.url + "/xhr_send", json.dumps(list(messages)))
        self.test.clock.advance(0)
        return r

    def poll(self) -> Exchange:
        r = Exchange(self.test.site, "POST", self.url + "/xhr")
        self.test.clock.advance(0)
        if r.finished:
            self.take(r.text)
        return r

    def take(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("a"):
                for m in json.loads(line[1:]):
                    self.frames.extend(self.parser.feed(m.encode()))
            elif line.startswith("c"):
                self.closed = line

    def connect(self) -> None:
        self.send(frame("CONNECT", **{"accept-version": "1.2", "host": "/"}))
        self.poll()
        self.test.assertEqual(self.frames.pop(0).command, "CONNECTED")


class StompOverSockJSTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(clock=self.clock)
        self.registry = ConnectionRegistry(ConnectionSettings(max_per_address=3), clock=self.clock)
        self.settings = SockJSSettings(max_buffered_bytes=4096)
        root = Resource()
        root.putChild(b"sockjs", stomp_sockjs_resource(
            self.broker, StompSettings(), self.settings, self.registry, "http", self.clock))
        self.site = Site(root, reactor=self.clock)

    def test_connect_subscribe_send(self) -> None:
        c = Client(self)
        c.connect()
        c.send(frame("SUBSCRIBE", destination="/queue/a", id="s1"))
        c.send(frame("SEND", b"hello", destination="/queue/a"))
        c.poll()
        self.assertEqual([(f.command, f.body) for f in c.frames], [("MESSAGE", b"hello")])
        # Counted as SockJS traffic (/metrics).
        self.assertEqual(self.broker.traffic.totals(), {"sockjs": (1, 1, 0)})

    def test_frames_split_and_joined(self) -> None:
        """A frame split over two messages, and two frames in one message."""
        c = Client(self)
        connect = frame("CONNECT", **{"accept-version": "1.2", "host": "/"})
        c.send(connect[:5], connect[5:])
        c.poll()
        self.assertEqual(c.frames.pop(0).command, "CONNECTED")
        sub = frame("SUBSCRIBE", destination="/queue/b", id="s1")
        send = frame("SEND", "h\u00e9".encode(), destination="/queue/b", receipt="r1")
        c.send(sub + send[:7])
        c.send(send[7:] + "\n")  # and a heart-beat
        c.poll()
        commands = [(f.command, f.body) for f in c.frames]
        self.assertIn(("MESSAGE", "h\u00e9".encode()), commands)
        self.assertIn(("RECEIPT", b""), commands)

    def test_waiting_poll_gets_delivery(self) -> None:
        c = Client(self)
        c.connect()
        c.send(frame("SUBSCRIBE", destination="/queue/c", id="s1"))
        r = c.poll()
        self.assertFalse(r.finished)
        other = Client(self)
        other.connect()
        other.send(frame("SEND", b"x", destination="/queue/c"))
        self.assertTrue(r.finished)
        c.take(r.text)
        self.assertEqual(c.frames[0].body, b"x")

    def test_expired_session_returns_unacked(self) -> None:
        """A client that stops polling is gone after the disconnect delay; its
        unacknowledged message goes back to the queue, to another consumer."""
        c = Client(self)
        c.connect()
        c.send(frame("SUBSCRIBE", destination="/queue/d", id="s1", ack="client"))
        c.send(frame("SEND", b"job", destination="/queue/d"))
        c.poll()
        self.assertEqual(c.frames[0].body, b"job")
        self.assertEqual(len(self.registry), 1)
        self.clock.advance(5.1)
        self.assertEqual(len(self.registry), 0)
        self.assertEqual(len(self.broker.default_vhost.queues["d"]), 1)
        other = Client(self)
        other.connect()
        other.send(frame("SUBSCRIBE", destination="/queue/d", id="s1"))
        other.poll()
        self.assertEqual(other.frames[0].body, b"job")
        self.assertEqual(other.frames[0].headers.get("redelivered"), "true")

    def test_client_not_polling_is_bounded(self) -> None:
        """Deliveries to a client that stops polling pause once its session
        holds max_buffered_bytes; the rest stays in the queue."""
        c = Client(self)
        c.connect()
        c.send(frame("SUBSCRIBE", destination="/queue/e", id="s1", ack="auto"))
        publisher = Client(self)
        publisher.connect()
        body = b"x" * 2000
        publisher.send(*[frame("SEND", body, destination="/queue/e")] * 200)
        self.clock.advance(0)
        session = next(iter(s for s in self._sessions() if s.handler.session.subscriptions))
        # Paused once it held more than the bound: what one STOMP flush
        # carries (128 KiB) at most goes over it.
        self.assertTrue(session.handler.session.paused)
        self.assertLessEqual(session.buffered, self.settings.max_buffered_bytes + 140 * 1024)
        self.assertGreater(len(self.broker.default_vhost.queues["e"]), 100)
        # Polling drains it and deliveries go on.
        for _ in range(100):
            c.poll()
            self.clock.advance(0)
            if not len(self.broker.default_vhost.queues["e"]) and not session.buffered:
                break
        self.assertEqual(sum(1 for f in c.frames if f.command == "MESSAGE"), 200)

    def _sessions(self) -> list:
        resource = self.site.resource.children[b"sockjs"]
        return list(resource.service.sessions.values())

    def test_error_reaches_the_client_then_close(self) -> None:
        c = Client(self)
        c.send(frame("SEND", b"x", destination="/queue/a"))  # not connected
        c.poll()
        self.assertEqual(c.frames[0].command, "ERROR")
        c.poll()
        self.assertEqual(c.closed, 'c[3000,"not connected"]')

    def test_connection_caps(self) -> None:
        for _ in range(3):
            Client(self).connect()
        r = Exchange(self.site, "POST", f"/sockjs/000/{uuid.uuid4()}/xhr")
        self.assertEqual(r.status, 503)
        self.assertIn("max_per_address", json.loads(r.body)["detail"])

    def test_shutdown(self) -> None:
        c = Client(self)
        c.connect()
        d = self.registry.shutdown("broker shutting down", 5.0)
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(len(self.registry), 0)
        self.assertEqual(self._sessions(), [])

    def test_session_bound_to_its_tls_identity(self) -> None:
        """The STOMP session sees the TLS identity of the connection that
        opened the SockJS session; requests with another identity (or none)
        do not reach that session: a sending one gets 404, a receiving one
        a session of its own."""
        url = f"/sockjs/000/{uuid.uuid4()}"
        alice = PeerIdentity("alice", "CN=alice", "CN=ca", fingerprint="a" * 64)
        mallory = PeerIdentity("mallory", "CN=mallory", "CN=ca", fingerprint="b" * 64)
        Exchange(self.site, "POST", url + "/xhr", identity=alice)
        (session,) = self._sessions()
        self.assertIs(session.handler.identity, alice)
        # The real transport of a session honours the session's interface.
        from zope.interface.verify import verifyObject  # noqa: PLC0415

        from qmq.transport import IConnection, ITransport  # noqa: PLC0415

        self.assertTrue(verifyObject(ITransport, session.handler))
        self.assertTrue(verifyObject(IConnection, session.handler))
        connect = json.dumps([frame("CONNECT", **{"accept-version": "1.2", "host": "/"})])
        for other in (mallory, None):
            r = Exchange(self.site, "POST", url + "/xhr_send", connect, identity=other)
            self.assertEqual(r.status, 404)
        r = Exchange(self.site, "POST", url + "/xhr_send", connect, identity=alice)
        self.assertEqual(r.status, 204)
        # A poll with another identity opens a session of its own.
        r = Exchange(self.site, "POST", url + "/xhr", identity=mallory)
        self.assertEqual((r.status, r.text), (200, "o\n"))
        self.assertEqual(len(self._sessions()), 2)

    def _logged(self) -> list:
        from twisted.logger import globalLogPublisher  # noqa: PLC0415

        events: list = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        return events

    def test_session_id_is_not_a_bearer_secret(self) -> None:
        """Issue 22: a client on another address that knows a logged-in
        session's id can neither speak in it (SUBSCRIBE) nor read it: its
        messages get 404, its polls a new, empty session of its own (as for
        any unknown id, so the id cannot be probed); each attempt is logged
        without the id."""
        events = self._logged()
        victim = Client(self)
        victim.connect()
        victim.send(frame("SUBSCRIBE", destination="/queue/secret", id="v"))
        sid = victim.url.rsplit("/", 1)[1]
        attacker = "10.0.0.66"
        sub = json.dumps([frame("SUBSCRIBE", destination="/queue/secret", id="x", ack="client")])
        r = Exchange(self.site, "POST", victim.url + "/xhr_send", sub, peer_host=attacker)
        self.assertEqual(r.status, 404)
        self.assertEqual(json.loads(r.body)["code"], "no-such-session")
        # The answer is the one for an id nobody uses.
        unused = Exchange(self.site, "POST", f"/sockjs/000/{uuid.uuid4()}/xhr_send", sub,
                          peer_host=attacker)
        self.assertEqual((unused.status, unused.body), (r.status, r.body))
        (victim_session,) = self._sessions()
        self.assertEqual(list(victim_session.handler.session.subscriptions), ["v"])
        poll = Exchange(self.site, "POST", victim.url + "/xhr", peer_host=attacker)
        self.assertEqual((poll.status, poll.text), (200, "o\n"))
        # The message goes to the victim, and nowhere else.
        publisher = Client(self)
        publisher.connect()
        publisher.send(frame("SEND", b"for the victim only", destination="/queue/secret"))
        self.clock.advance(0)
        poll = Exchange(self.site, "POST", victim.url + "/xhr", peer_host=attacker)
        self.clock.advance(0)
        # Its own session has nothing for it: the poll waits.
        self.assertNotIn(b"victim only", poll.transport.value())
        self.assertFalse(poll.finished)
        victim.poll()
        messages = [f for f in victim.frames if f.command == "MESSAGE"]
        self.assertEqual([m.body for m in messages], [b"for the victim only"])
        refusals = [e for e in events if "from elsewhere" in e.get("log_format", "")]
        self.assertEqual(len(refusals), 2)  # the second poll found its own session
        self.assertEqual(refusals[0]["peer"].split(":")[0], attacker)
        self.assertNotIn(sid, repr(refusals))

    def test_address_binding_can_be_turned_off(self) -> None:
        """C{sockjs.bind_to_address = false}: a client whose address changes
        (a rotating proxy) keeps its session."""
        self.settings = SockJSSettings(bind_to_address=False)
        root = Resource()
        root.putChild(b"sockjs", stomp_sockjs_resource(
            self.broker, StompSettings(), self.settings, self.registry, "http", self.clock))
        self.site = Site(root, reactor=self.clock)
        url = f"/sockjs/000/{uuid.uuid4()}"
        Exchange(self.site, "POST", url + "/xhr", peer_host="192.0.2.1")
        connect = json.dumps([frame("CONNECT", **{"accept-version": "1.2", "host": "/"})])
        r = Exchange(self.site, "POST", url + "/xhr_send", connect, peer_host="192.0.2.2")
        self.assertEqual(r.status, 204)
        r = Exchange(self.site, "POST", url + "/xhr", peer_host="192.0.2.3")
        self.clock.advance(0)
        self.assertTrue(r.text.startswith('a["CONNECTED'))
        # The TLS identity stays bound.
        alice = PeerIdentity("alice", "CN=alice", "CN=ca", fingerprint="a" * 64)
        r = Exchange(self.site, "POST", url + "/xhr_send", connect, identity=alice)
        self.assertEqual(r.status, 404)


class BinaryBodyTests(SynchronousTestCase):
    """Issue 22: a body that is not UTF-8, published over TCP STOMP (or
    HTTP), then consumed over SockJS. SockJS carries text: sent with U+FFFD
    in place of its bad bytes, the body arrived changed and its
    content-length (bytes) no longer matched, desynchronising stomp.js.
    Every delivery to a SockJS session now refuses it with an ERROR and
    gives it back to its queue."""

    BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00 binary"

    def setUp(self) -> None:
        from qmq.stomp.protocol import StompFactory  # noqa: PLC0415
        from tests.test_stomp_session import Client as TcpClient  # noqa: PLC0415

        self.clock = Clock()
        self.broker = Broker(clock=self.clock)
        self.registry = ConnectionRegistry(ConnectionSettings(), clock=self.clock)
        root = Resource()
        root.putChild(b"sockjs", stomp_sockjs_resource(
            self.broker, StompSettings(), SockJSSettings(), self.registry, "http", self.clock))
        self.site = Site(root, reactor=self.clock)
        self.tcp = TcpClient(StompFactory(self.broker, StompSettings(), clock=self.clock))
        self.tcp.connect()

    def publish(self, destination: str, body: bytes) -> None:
        self.tcp.publish(destination, body)
        self.clock.advance(0)

    def consumer(self, destination: str, **headers: str) -> Client:
        c = Client(self)
        c.connect()
        c.send(frame("SUBSCRIBE", destination=destination, id="s", **headers))
        return c

    def test_text_bodies_pass(self) -> None:
        c = self.consumer("/queue/t")
        self.publish("/queue/t", "héllo ✓".encode())
        c.poll()
        (m,) = c.frames
        self.assertEqual((m.command, m.body), ("MESSAGE", "héllo ✓".encode()))
        self.assertEqual(m.headers["content-length"], str(len("héllo ✓".encode())))

    def _refused(self, c: Client, kept: bool = True) -> None:
        c.poll()
        commands = [f.command for f in c.frames]
        self.assertEqual(commands, ["ERROR"], c.frames)
        error = c.frames[0]
        self.assertEqual(error.headers["message"], "binary body")
        self.assertIn(b"not UTF-8", error.body)
        self.assertIn(b"/ws", error.body)
        self.assertEqual(b"back in its queue" in error.body, kept)
        c.poll()
        self.assertEqual(c.closed, 'c[3000,"binary body"]')

    def test_refused_and_kept_ack_client(self) -> None:
        c = self.consumer("/queue/b", ack="client-individual")
        self.publish("/queue/b", self.BINARY)
        self._refused(c)
        # Back in its queue, redelivered, for a consumer that can take it.
        self.tcp.subscribe("/queue/b")
        self.clock.advance(0)
        (m,) = self.tcp.messages()
        self.assertEqual(m.body, self.BINARY)
        self.assertEqual(m.headers.get("redelivered"), "true")

    def test_refused_and_kept_ack_auto(self) -> None:
        c = self.consumer("/queue/a")
        self.publish("/queue/a", self.BINARY)
        self._refused(c)
        self.tcp.subscribe("/queue/a")
        self.clock.advance(0)
        self.assertEqual(self.tcp.bodies(), [self.BINARY])

    def test_waiting_message_refused_at_subscribe(self) -> None:
        """The same when the message waits before the SUBSCRIBE."""
        self.publish("/queue/w", self.BINARY)
        c = self.consumer("/queue/w")
        self._refused(c)
        self.assertEqual(len(self.broker.default_vhost.queues["w"]), 1)

    def test_topic_subscriber_told(self) -> None:
        c = self.consumer("/topic/news")
        self.publish("/topic/news", self.BINARY)
        self._refused(c, kept=False)
        self.assertIn(b"not delivered to this subscription", c.frames[0].body)
