"""Integration tests: a real QMQ STOMP listener on 127.0.0.1 and the real
C{stomp.py} client, over plain TCP, over TLS (C{ssl:}) and over C{qmqtls:}
with a client certificate.

C{stomp.py} is blocking and threaded, so every client scenario runs in a
thread (L{deferToThread}) while the trial reactor serves the broker. Every
wait is bounded; connections and listening ports are closed in cleanups.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import stomp
from stomp.exception import ConnectFailedException
from twisted.internet import reactor
from twisted.internet.endpoints import quoteStringArgument, serverFromString
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.stomp.protocol import StompFactory
from qmq.stomp.settings import StompSettings

try:
    from tests.integration.certs import TestPKI
except ImportError:  # pragma: no cover - the helper ships with the tests
    TestPKI = None  # type: ignore[assignment,misc]

try:
    import qmq.tls  # noqa: F401

    HAVE_QMQTLS = True
except ImportError:  # pragma: no cover
    HAVE_QMQTLS = False

TIMEOUT = 10.0
VERSIONS = ("1.0", "1.1", "1.2")


class Recorder(stomp.ConnectionListener):
    """Collects what a stomp.py connection receives; waits with a deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.connected = None
        self.messages: list = []
        self.receipts: dict[str, dict] = {}
        self.errors: list = []
        self.heartbeats = 0
        self.disconnected = False

    def _note(self, update: Callable[[], None]) -> None:
        with self._cond:
            update()
            self._cond.notify_all()

    def on_connected(self, frame) -> None:
        self._note(lambda: setattr(self, "connected", frame))

    def on_message(self, frame) -> None:
        self._note(lambda: self.messages.append(frame))

    def on_receipt(self, frame) -> None:
        self._note(lambda: self.receipts.__setitem__(frame.headers["receipt-id"], frame.headers))

    def on_error(self, frame) -> None:
        self._note(lambda: self.errors.append(frame))

    def on_heartbeat(self) -> None:
        def bump() -> None:
            self.heartbeats += 1

        self._note(bump)

    def on_disconnected(self) -> None:
        self._note(lambda: setattr(self, "disconnected", True))

    def wait(
        self, predicate: Callable[[], object], what: str, timeout: float = TIMEOUT, poll: float = 0
    ):
        """Wait until C{predicate()} is true and return it; re-check every C{poll} s if given."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate()
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self._cond.wait(min(left, poll) if poll else left)

    def wait_receipt(self, receipt: str) -> dict:
        return self.wait(lambda: self.receipts.get(receipt), f"RECEIPT {receipt}")

    def wait_messages(self, n: int, subscription: str | None = None) -> list:
        def enough():
            got = [
                m for m in self.messages
                if subscription is None or m.headers.get("subscription") == subscription
            ]
            return got if len(got) >= n else None

        return self.wait(enough, f"{n} messages on {subscription}")

    def take(self, subscription: str) -> list:
        """Remove and return the messages received on C{subscription}."""
        with self._cond:
            got = [m for m in self.messages if m.headers.get("subscription") == subscription]
            self.messages = [m for m in self.messages if m not in got]
            return got


class Client:
    """A stomp.py connection of one STOMP version, with its recorder."""

    def __init__(self, version: str, port: int, heartbeats=(0, 0), ssl: dict | None = None) -> None:
        hosts = [("127.0.0.1", port)]
        self.version = version
        if version == "1.0":
            self.conn = stomp.Connection10(hosts, reconnect_attempts_max=1)
        elif version == "1.1":
            self.conn = stomp.Connection11(hosts, heartbeats=heartbeats, reconnect_attempts_max=1)
        else:
            self.conn = stomp.Connection12(hosts, heartbeats=heartbeats, reconnect_attempts_max=1)
        if ssl is not None:
            self.conn.set_ssl(for_hosts=hosts, **ssl)
        self.rec = Recorder()
        self.conn.set_listener("recorder", self.rec)

    def connect(self, **headers):
        """Send CONNECT; return the CONNECTED frame, or None if refused."""
        self.conn.connect(wait=False, headers=headers)
        rec = self.rec
        rec.wait(lambda: rec.connected or rec.errors or rec.disconnected, "CONNECTED")
        return rec.connected

    def ack(self, message) -> None:
        h = message.headers
        if self.version == "1.2":
            self.conn.ack(h["ack"])
        elif self.version == "1.1":
            self.conn.ack(h["message-id"], h["subscription"])
        else:
            self.conn.ack(h["message-id"])

    def nack(self, message, **headers) -> None:
        h = message.headers
        if self.version == "1.2":
            self.conn.nack(h["ack"], **headers)
        else:
            self.conn.nack(h["message-id"], h["subscription"], **headers)

    def count(self, queue: str) -> int:
        """Ask the broker how many messages wait in C{queue} (control destination)."""
        receipt = f"count-{time.monotonic_ns()}"
        self.conn.send(f"/control/count-msgs/queue/{queue}", "", receipt=receipt)
        return int(self.rec.wait_receipt(receipt)["num-messages"])

    def close(self) -> None:
        """Disconnect if connected, bounded in time, then drop the socket."""
        rec = self.rec
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
                rec.wait(lambda: rec.disconnected, "disconnect", timeout=5)
        except Exception:
            pass
        finally:
            try:
                self.conn.transport.disconnect_socket()
            except Exception:
                pass


class CountingFactory(StompFactory):
    """A StompFactory that counts the connections it has lost."""

    lost = 0

    def connection_lost(self, proto) -> None:
        self.lost += 1
        super().connection_lost(proto)


class BrokerTestCase(unittest.TestCase):
    """A broker listening on 127.0.0.1, and stomp.py clients run in threads."""

    timeout = 60
    # A generous grace: stomp.py's heart-beat thread shares the GIL with the
    # reactor and the other clients of the test process.
    settings = StompSettings(heartbeat_send_ms=500, heartbeat_receive_ms=500, heartbeat_grace=3.0)

    def listen(self, description: str):
        self.broker = Broker(reactor)
        self.factory = CountingFactory(self.broker, self.settings)
        d = serverFromString(reactor, description).listen(self.factory)

        def listening(port):
            self.port = port
            self.port_number = port.getHost().port
            # Cleanups run last-in first-out: clients go before the server.
            self.addCleanup(self._stop_server)
            self.addCleanup(self._close_clients)
            return port

        return d.addCallback(listening)

    def setUp(self):
        self.clients: list[Client] = []
        return self.listen("tcp:0:interface=127.0.0.1")

    def _stop_server(self):
        d = self.factory.shutdown(timeout=5)
        d.addCallback(lambda _: self.port.stopListening())
        return d

    def quiet_stomppy(self) -> None:
        """stomp.py logs refused handshakes as warnings; expected here."""
        logger = logging.getLogger("stomp.py")
        level = logger.level
        logger.setLevel(logging.CRITICAL)
        self.addCleanup(logger.setLevel, level)

    def client(self, version: str, **kwargs) -> Client:
        c = Client(version, self.port_number, **kwargs)
        self.clients.append(c)
        return c

    def _close_clients(self):
        return deferToThread(lambda: [c.close() for c in self.clients])

    def in_thread(self, scenario: Callable[[], object]):
        """Run a blocking scenario in a thread (its clients are closed at cleanup)."""
        return deferToThread(scenario)

    # -- scenarios (run in a thread) ------------------------------------------

    def key_flow(self, version: str, ssl: dict | None = None) -> None:
        """Connect, queue and topic, acks, nack, transaction, receipts, disconnect."""
        # The client beats every 500 ms and wants the broker's every 1000 ms.
        heartbeats = (0, 0) if version == "1.0" else (500, 1000)
        c = self.client(version, heartbeats=heartbeats, ssl=ssl)
        connected = c.connect()
        assert not c.rec.errors, c.rec.errors
        if version == "1.0":
            assert "version" not in connected.headers, connected.headers
        else:
            assert connected.headers["version"] == version, connected.headers
            assert connected.headers["heart-beat"] == "500,500", connected.headers
        assert connected.headers["server"].startswith("QMQ/")

        queue = f"it-{version}"
        dest = f"/queue/{queue}"
        mode = "client" if version == "1.0" else "client-individual"
        c.conn.subscribe(dest, id="q", ack=mode, headers={"prefetch-count": "10", "receipt": "sub"})
        c.rec.wait_receipt("sub")
        c.conn.subscribe("/topic/it.*", id="t")
        for i in range(3):
            c.conn.send(dest, f"m{i}", receipt=f"r{i}", headers={"x-n": str(i)})
        for i in range(3):
            c.rec.wait_receipt(f"r{i}")
        ms = c.rec.wait_messages(3, "q")
        assert [m.body for m in ms] == ["m0", "m1", "m2"], ms
        assert [m.headers["x-n"] for m in ms] == ["0", "1", "2"]
        assert all(m.headers["destination"] == dest for m in ms)
        assert ("ack" in ms[0].headers) == (version == "1.2"), ms[0].headers
        c.rec.take("q")

        if version == "1.0":
            # Cumulative: acking the last settles all three.
            c.ack(ms[2])
        else:
            c.ack(ms[0])
            c.ack(ms[2])
            c.nack(ms[1])
            [again] = c.rec.wait_messages(1, "q")
            assert again.body == "m1", again
            assert again.headers["redelivered"] == "true", again.headers
            assert again.headers["x-delivery-count"] == "1", again.headers
            c.rec.take("q")
            c.ack(again)
        assert c.count(queue) == 0

        # Topic with a wildcard.
        c.conn.send("/topic/it.news", "extra!", receipt="topic")
        c.rec.wait_receipt("topic")
        [news] = c.rec.wait_messages(1, "t")
        assert news.body == "extra!" and news.headers["destination"] == "/topic/it.news"
        c.rec.take("t")

        # A transaction: nothing until COMMIT. A marker sent after the
        # transactional SENDs, outside it, arrives first if they were held.
        tx = c.conn.begin()
        c.conn.send(dest, "tx1", transaction=tx)
        c.conn.send(dest, "tx2", transaction=tx)
        c.conn.send(dest, "marker", receipt="marker")
        c.rec.wait_receipt("marker")
        [marker] = c.rec.wait_messages(1, "q")
        assert marker.body == "marker", marker
        c.rec.take("q")
        c.conn.commit(tx, receipt="commit")
        c.rec.wait_receipt("commit")
        committed = c.rec.wait_messages(2, "q")
        assert [m.body for m in committed] == ["tx1", "tx2"], committed
        c.rec.take("q")
        if version == "1.0":
            c.ack(committed[-1])
        else:
            for m in (marker, *committed):
                c.ack(m)
        # An aborted transaction publishes nothing.
        tx = c.conn.begin()
        c.conn.send(dest, "never", transaction=tx)
        c.conn.abort(tx, receipt="abort")
        c.rec.wait_receipt("abort")
        assert c.count(queue) == 0
        assert not c.rec.take("q")

        if version != "1.0":
            # Idle, the broker keeps the link alive with heart-beats both ways.
            seen = c.rec.heartbeats
            c.rec.wait(lambda: c.rec.heartbeats > seen, "a server heart-beat", timeout=5)
            assert c.conn.is_connected()
            assert not c.rec.disconnected

        assert not c.rec.errors, c.rec.errors
        c.conn.disconnect()
        c.rec.wait(lambda: c.rec.disconnected, "disconnected")

    def error_flow(self, version: str) -> None:
        """A bad destination gets an ERROR with a message, then the broker closes."""
        c = self.client(version)
        c.connect()
        c.conn.send("/nowhere/x", "x", receipt="bad")
        [error] = c.rec.wait(lambda: c.rec.errors, "ERROR")
        assert error.headers["message"] == "unknown destination", error.headers
        assert error.headers["receipt-id"] == "bad", error.headers
        assert "/nowhere/x" in error.body, error.body
        c.rec.wait(lambda: c.rec.disconnected, "the broker closing the connection")

    def redelivery_flow(self, version: str) -> None:
        """Unacked messages of a client that goes away reach another client."""
        dest = f"/queue/redeliver-{version}"
        a = self.client(version)
        a.connect()
        a.conn.subscribe(dest, id="a", ack="client")
        for i in range(3):
            a.conn.send(dest, f"m{i}")
        a.rec.wait_messages(3, "a")
        a.close()
        b = self.client(version)
        b.connect()
        b.conn.subscribe(dest, id="b", ack="auto")
        ms = b.rec.wait_messages(3, "b")
        assert [m.body for m in ms] == ["m0", "m1", "m2"], ms
        assert all(m.headers.get("redelivered") == "true" for m in ms), ms

    def rpc_flow(self, version: str) -> None:
        """reply-to /temp-queue/: a request and its reply between two clients."""
        server = self.client(version)
        server.connect()
        server.conn.subscribe("/queue/rpc", id="srv", headers={"receipt": "s"})
        server.rec.wait_receipt("s")
        requester = self.client(version)
        requester.connect()
        requester.conn.send("/queue/rpc", "ping", headers={"reply-to": "/temp-queue/replies"})
        [request] = server.rec.wait_messages(1, "srv")
        server.conn.send(request.headers["reply-to"], "pong", receipt="replied")
        server.rec.wait_receipt("replied")
        [reply] = requester.rec.wait_messages(1)
        assert reply.body == "pong", reply


class StompPyTests(BrokerTestCase):
    def test_key_flow_10(self):
        return self.in_thread(lambda: self.key_flow("1.0"))

    def test_key_flow_11(self):
        return self.in_thread(lambda: self.key_flow("1.1"))

    def test_key_flow_12(self):
        return self.in_thread(lambda: self.key_flow("1.2"))

    def test_error_10(self):
        return self.in_thread(lambda: self.error_flow("1.0"))

    def test_error_11(self):
        return self.in_thread(lambda: self.error_flow("1.1"))

    def test_error_12(self):
        return self.in_thread(lambda: self.error_flow("1.2"))

    def test_redelivery(self):
        def scenario():
            for version in VERSIONS:
                self.redelivery_flow(version)

        return self.in_thread(scenario)

    def test_rpc(self):
        return self.in_thread(lambda: self.rpc_flow("1.2"))

    def test_versions_side_by_side(self):
        """A 1.2 publisher reaches 1.0, 1.1 and 1.2 subscribers, headers intact."""

        def scenario():
            subs = {v: self.client(v) for v in VERSIONS}
            for v, c in subs.items():
                c.connect()
                c.conn.subscribe("/topic/mixed", id=f"s{v}", headers={"receipt": "s"})
                c.rec.wait_receipt("s")
            p = self.client("1.2")
            p.connect()
            p.conn.send("/topic/mixed", "hello", headers={"note": "a:b", "path": "c\\d"})
            for v, c in subs.items():
                [m] = c.rec.wait_messages(1)
                assert m.body == "hello", (v, m)
                assert m.headers["note"] == "a:b", (v, m.headers)
                assert m.headers["path"] == "c\\d", (v, m.headers)

        return self.in_thread(scenario)

    def test_shutdown_tells_clients(self):
        """factory.shutdown(): every stomp.py client gets an ERROR and is closed."""

        def connect_two():
            clients = [self.client("1.2"), self.client("1.1")]
            for c in clients:
                c.connect()
            return clients

        def shut(clients):
            return self.factory.shutdown("going down", timeout=5).addCallback(lambda _: clients)

        def check(clients):
            for c in clients:
                c.rec.wait(lambda c=c: c.rec.disconnected, "disconnect")
                assert len(c.rec.errors) == 1, (c.version, c.rec.errors, c.rec.messages, c.rec.receipts)
                [error] = c.rec.errors
                assert error.headers["message"] == "going down", error.headers

        d = deferToThread(connect_two)
        d.addCallback(shut)
        d.addCallback(lambda clients: deferToThread(check, clients))
        return d


class TLSTests(BrokerTestCase):
    """The key flow over TLS: Twisted's ssl: endpoint, and qmqtls: with a client certificate."""

    def setUp(self):
        if TestPKI is None:
            raise unittest.SkipTest("tests/integration/certs.py is missing")
        self.clients = []
        self.pki = TestPKI(self.mktemp())
        description = (
            "ssl:0:interface=127.0.0.1"
            f":privateKey={quoteStringArgument(str(self.pki.server_key))}"
            f":certKey={quoteStringArgument(str(self.pki.server_cert))}"
        )
        return self.listen(description)

    def test_key_flow_ssl(self):
        ssl = {"ca_certs": str(self.pki.ca_pem)}

        def scenario():
            for version in VERSIONS:
                self.key_flow(version, ssl=ssl)

        return self.in_thread(scenario)

    def test_untrusted_server_refused(self):
        """A client that does not trust the CA never gets CONNECTED."""
        self.quiet_stomppy()
        other = TestPKI(self.mktemp())

        def scenario():
            c = self.client("1.2", ssl={"ca_certs": str(other.ca_pem)})
            try:
                c.connect()
            except ConnectFailedException:
                pass
            assert c.rec.connected is None

        return self.in_thread(scenario)


class QMQTLSTests(BrokerTestCase):
    def setUp(self):
        if TestPKI is None or not HAVE_QMQTLS:
            raise unittest.SkipTest("qmqtls: or the test PKI is missing")
        self.clients = []
        self.pki = TestPKI(self.mktemp())
        return self.listen(self.pki.qmqtls(verify="require"))

    def test_key_flow_client_certificate(self):
        alice = self.pki.client("alice.example.org", common_name="alice")
        ssl = {
            "ca_certs": str(self.pki.ca_pem),
            "cert_file": str(alice.pem),
            "key_file": str(alice.pem),
        }

        def scenario():
            for version in VERSIONS:
                self.key_flow(version, ssl=ssl)

        return self.in_thread(scenario)

    def refused(self, c: Client) -> None:
        """C{c} connects; the broker must drop it before any CONNECTED (in a thread)."""
        before = self.factory.lost
        try:
            c.conn.connect(wait=False)
        except ConnectFailedException:
            return
        # stomp.py does not always report a failed handshake, so watch the
        # broker drop the connection too.
        rec = c.rec
        rec.wait(
            lambda: rec.connected or rec.errors or rec.disconnected or self.factory.lost > before,
            "the connection to be refused",
            poll=0.05,
        )
        assert rec.connected is None, rec.connected

    def test_no_client_certificate_refused(self):
        """Without a client certificate the TLS handshake fails: no STOMP session."""
        self.quiet_stomppy()
        return self.in_thread(
            lambda: self.refused(self.client("1.2", ssl={"ca_certs": str(self.pki.ca_pem)}))
        )

    def test_stranger_certificate_refused(self):
        """A certificate from another CA is refused."""
        self.quiet_stomppy()
        stranger = TestPKI(self.mktemp()).client("mallory.example.org")
        ssl = {
            "ca_certs": str(self.pki.ca_pem),
            "cert_file": str(stranger.pem),
            "key_file": str(stranger.pem),
        }
        return self.in_thread(lambda: self.refused(self.client("1.2", ssl=ssl)))
