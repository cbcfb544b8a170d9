"""Integration tests: durable topic subscriptions, per-subscriber buffers,
allow_create and delivery guarantees, on a real QMQ STOMP listener on
127.0.0.1 with real C{stomp.py} clients (and one raw socket client that
stops reading).
"""

from __future__ import annotations

from tests.integration.test_stomppy import BrokerTestCase


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
