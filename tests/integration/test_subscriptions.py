"""Integration tests: durable topic subscriptions, per-subscriber buffers,
allow_create and delivery guarantees, on a real QMQ STOMP listener on
127.0.0.1 with real C{stomp.py} clients (and one raw socket client that
stops reading).
"""

from __future__ import annotations

import socket
import time

from tests.integration.test_stomppy import TIMEOUT, BrokerTestCase


class RawClient:
    """A STOMP client on a bare socket, so a test decides when it reads
    (stomp.py always reads). Its receive buffer is small, so the broker
    meets back-pressure soon once it stops reading."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(("127.0.0.1", port))
        self.data = b""

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        lines = "".join(f"{k}:{v}\n" for k, v in headers.items())
        self.sock.sendall(f"{command}\n{lines}\n".encode() + body + b"\x00")

    def read_until(self, marker: bytes) -> None:
        deadline = time.monotonic() + TIMEOUT
        while marker not in self.data:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {marker!r}")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed before {marker!r}")
            self.data += chunk

    def read_to_end(self) -> bytes:
        """Everything until the broker closes (bounded in time); a reset
        after the broker's close grace counts as the end too."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                return self.data
            if not chunk:
                return self.data
            self.data += chunk
        raise AssertionError("the broker did not close the connection")

    def close(self) -> None:
        self.sock.close()


class DurableSubscriptionTests(BrokerTestCase):
    def test_spellings_and_owner(self):
        """Each spelling keeps a subscription while its client is away; its
        owner gets the messages back, another user can neither read nor
        delete it."""

        def scenario():
            spellings = [
                {"durable": "true"},
                {"persistent": "true"},
                {"activemq.subscriptionName": "s-amq"},
                {"durable": "true", "x-queue-name": "s-rabbit"},
            ]
            for n, headers in enumerate(spellings):
                a = self.client("1.2")
                a.connect(login="alice")
                a.conn.subscribe(f"/topic/d{n}", id=f"s{n}", headers={**headers, "receipt": "s"})
                a.rec.wait_receipt("s")
                a.close()
                p = self.client("1.2")
                p.connect()
                p.conn.send(f"/topic/d{n}", f"m{n}", receipt="sent")
                p.rec.wait_receipt("sent")
                # Another user naming the subscription's queue is refused.
                m = self.client("1.2")
                m.connect(login="mallory")
                name = headers.get("x-queue-name") or headers.get("activemq.subscriptionName") or f"s{n}"
                m.conn.subscribe(f"/queue/durable.alice.{name}", id="steal", headers={"receipt": "x"})
                [error] = m.rec.wait(lambda m=m: m.rec.errors, "ERROR")
                assert error.headers["message"] == "access refused (read)", error.headers
                assert not m.rec.messages
                # Mallory's durable UNSUBSCRIBE of the same name touches her own.
                m2 = self.client("1.2")
                m2.connect(login="mallory")
                m2.conn.subscribe(f"/topic/d{n}", id=f"s{n}", headers={**headers, "receipt": "s"})
                m2.rec.wait_receipt("s")
                m2.conn.unsubscribe(f"s{n}", headers={**headers, "receipt": "u"})
                m2.rec.wait_receipt("u")
                # Alice comes back and finds her message.
                b = self.client("1.2")
                b.connect(login="alice")
                b.conn.subscribe(f"/topic/d{n}", id=f"s{n}", headers=headers)
                [got] = b.rec.wait_messages(1, f"s{n}")
                assert got.body == f"m{n}", got
                assert not b.rec.errors, b.rec.errors

        return self.in_thread(scenario)


SHOP = """
[vhosts.shop]
allow_create = false
exchanges = [{ name = "orders", type = "fanout" }]
queues = [
    { name = "billing" },
    { name = "shipping", arguments = { x-max-length = 100, x-overflow = "reject-publish" } },
]
bindings = [
    { queue = "billing", exchange = "orders" },
    { queue = "shipping", exchange = "orders" },
]
"""


def shop_client(test):
    """A stomp.py client of virtual host "shop" (stomp.py sends its own
    host header: set through its transport's vhost)."""
    c = test.client("1.2")
    c.conn.transport.vhost = "shop"
    c.connect()
    return c


class DeclaredTopologyTests(BrokerTestCase):
    """A virtual host declared in TOML: a fanout exchange copying to two
    declared queues, and no queue creation by clients."""

    def setUp(self):
        d = super().setUp()

        def declare(port):
            from qmq.config import load_string
            from qmq.service import _declare

            _declare(self.broker, load_string(SHOP, "shop.toml"))
            return port

        return d.addCallback(declare)

    def test_fanout_and_allow_create(self):
        def scenario():
            c = shop_client(self)
            c.conn.send("/exchange/orders", "order 1", receipt="o1")
            c.rec.wait_receipt("o1")
            assert c.count("billing") == 1 and c.count("shipping") == 1
            c.conn.subscribe("/queue/billing", id="b")
            c.conn.subscribe("/queue/shipping", id="s")
            [b] = c.rec.wait_messages(1, "b")
            [s] = c.rec.wait_messages(1, "s")
            assert b.body == s.body == "order 1", (b, s)
            # A queue nobody declared cannot be made by naming it.
            c.conn.send("/queue/typo", "lost?", receipt="typo")
            [error] = c.rec.wait(lambda: c.rec.errors, "ERROR")
            assert error.headers["message"] == "no such queue", error.headers
            assert error.headers["receipt-id"] == "typo", error.headers
            assert "allow_create = false" in error.body, error.body
            d = shop_client(self)
            d.conn.subscribe("/queue/typo2", id="t")
            [error] = d.rec.wait(lambda: d.rec.errors, "ERROR")
            assert error.headers["message"] == "no such queue", error.headers
            # Topic subscriptions still work (their queues are the broker's own).
            t = shop_client(self)
            t.conn.subscribe("/topic/news", id="n", ack="client", headers={"receipt": "n"})
            t.rec.wait_receipt("n")
            t.conn.send("/topic/news", "hello", receipt="h")
            [n] = t.rec.wait_messages(1, "n")
            assert n.body == "hello"
            assert not t.rec.errors

        d = self.in_thread(scenario)

        def check(_):
            shop = self.broker.vhost("shop")
            self.assertNotIn("typo", shop.queues)
            self.assertNotIn("typo2", shop.queues)

        return d.addCallback(check)


class SubscriberBufferTests(BrokerTestCase):
    timeout = 180

    def setUp(self):
        d = super().setUp()

        def patient(port):
            # The stalled client reads what it was sent only once the flood
            # is over: give it that long before the broker aborts it.
            from qmq.connections import ConnectionRegistry, ConnectionSettings

            self.factory.registry.settings = ConnectionSettings(close_grace=30.0)
            assert isinstance(self.factory.registry, ConnectionRegistry)
            return port

        return d.addCallback(patient)

    def test_stalled_reader_cut_fast_reader_gets_everything(self):
        """A raw socket subscriber with buffer-bytes stops reading; the
        publisher floods the topic. The stalled one is cut off with ERROR
        "slow consumer"; a stomp.py subscriber on the same topic receives
        every message, in order, and the publisher every receipt."""
        # 12 MB: far more than the stalled client's socket buffers take in
        # before the broker has to hold messages for it.
        count, body = 1500, b"x" * 8192
        figures = {}

        def flood(topic, fast, pub):
            """Publish C{count} messages to C{topic}; the seconds until
            C{fast} has them all, and what it got."""
            started = time.monotonic()
            for i in range(count):
                headers = {"n": str(i)}
                if i == count - 1:
                    headers["receipt"] = topic
                pub.conn.send(topic, body, headers=headers)
            # Generous deadlines: the machine may be busy.
            pub.rec.wait(lambda: pub.rec.receipts.get(topic), f"RECEIPT {topic}", timeout=60)
            got = fast.rec.wait(
                lambda: len(fast.rec.messages) >= count and fast.rec.messages,
                f"{count} messages",
                timeout=60,
            )
            seconds = time.monotonic() - started
            with fast.rec._cond:
                fast.rec.messages = []
            return seconds, got

        def scenario():
            fast = self.client("1.2")
            fast.connect()
            pub = self.client("1.2")
            pub.connect()
            # The same flood with no stalled subscriber, for comparison.
            fast.conn.subscribe("/topic/alone", id="alone", headers={"receipt": "a"})
            fast.rec.wait_receipt("a")
            figures["fast subscriber alone, s"], _ = flood("/topic/alone", fast, pub)
            slow = RawClient(self.port_number)
            self.addCleanup(slow.close)
            slow.send("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"})
            slow.read_until(b"CONNECTED")
            slow.send(
                "SUBSCRIBE",
                {"destination": "/topic/flood", "id": "slow", "buffer-bytes": "200000", "receipt": "r"},
            )
            slow.read_until(b"receipt-id:r")
            # From here on the slow client reads nothing.
            fast.conn.subscribe("/topic/flood", id="fast", headers={"receipt": "f"})
            fast.rec.wait_receipt("f")
            figures["fast subscriber beside a stalled one, s"], got = flood("/topic/flood", fast, pub)
            assert [int(m.headers["n"]) for m in got] == list(range(count))
            assert not pub.rec.errors and not fast.rec.errors, (pub.rec.errors, fast.rec.errors)
            # Only the fast subscriber is left on the topic.
            receipt = "subs"
            fast.conn.send("/control/count-subscribers/topic/flood", "", receipt=receipt)
            assert fast.rec.wait_receipt(receipt)["num-subscribers"] == "1"
            data = slow.read_to_end()
            assert b"\nmessage:slow consumer\n" in data, data[-500:]
            error = data[data.rindex(b"ERROR\n") :]
            assert b"buffer-bytes 200000" in error, error
            # It got a part of the flood, then the ERROR, then nothing.
            figures["slow subscriber got"] = data.count(b"MESSAGE\n")
            assert figures["slow subscriber got"] < count

        d = self.in_thread(scenario)
        d.addCallback(lambda _: print(f"\n  figures: {figures}"))
        return d


GUARANTEES = """
[[vhosts."/".queues]]
name = "payments"
arguments = { x-delivery-guarantee = "effectively-once", x-dedup-window = 60000 }

[[vhosts."/".queues]]
name = "ticks"
arguments = { delivery-guarantee = "at-most-once" }
"""


class GuaranteeTests(BrokerTestCase):
    """Queues declared in TOML with a delivery guarantee, used by stomp.py."""

    def setUp(self):
        d = super().setUp()

        def declare(port):
            from qmq.config import load_string
            from qmq.service import _declare

            _declare(self.broker, load_string(GUARANTEES, "guarantees.toml"))
            return port

        return d.addCallback(declare)

    def test_effectively_once(self):
        """Three SENDs with one dedup-id: three RECEIPTs, one message."""

        def scenario():
            p = self.client("1.2")
            p.connect()
            for i in range(3):
                p.conn.send("/queue/payments", f"pay 1 (try {i})", receipt=f"r{i}",
                            headers={"dedup-id": "payment-1", "persistent": "true"})
            p.conn.send("/queue/payments", "pay 2", receipt="r3", headers={"dedup-id": "payment-2"})
            for i in range(4):
                p.rec.wait_receipt(f"r{i}")
            assert not p.rec.errors, p.rec.errors
            assert p.count("payments") == 2
            c = self.client("1.2")
            c.connect()
            c.conn.subscribe("/queue/payments", id="c")
            got = c.rec.wait_messages(2, "c")
            assert [m.body for m in got] == ["pay 1 (try 0)", "pay 2"], got

        return self.in_thread(scenario)

    def test_at_most_once(self):
        """A NACKed message and one left unacked by a client that goes away
        are not delivered again."""

        def scenario():
            a = self.client("1.2")
            a.connect()
            a.conn.subscribe("/queue/ticks", id="a", ack="client-individual",
                             headers={"receipt": "s"})
            a.rec.wait_receipt("s")
            a.conn.send("/queue/ticks", "t1", receipt="t1")
            a.conn.send("/queue/ticks", "t2", receipt="t2")
            first, second = a.rec.wait_messages(2, "a")
            a.nack(first, receipt="n")
            a.rec.wait_receipt("n")
            a.close()
            b = self.client("1.2")
            b.connect()
            b.conn.subscribe("/queue/ticks", id="b", headers={"receipt": "s"})
            b.rec.wait_receipt("s")
            assert b.count("ticks") == 0
            b.conn.send("/queue/ticks", "t3", receipt="t3")
            [m] = b.rec.wait_messages(1, "b")
            assert m.body == "t3" and "redelivered" not in m.headers, m

        return self.in_thread(scenario)
