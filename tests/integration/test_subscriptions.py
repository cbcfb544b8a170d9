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
