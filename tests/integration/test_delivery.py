"""Integration tests of the delivery headers: a real QMQ STOMP listener on
127.0.0.1 and the real C{stomp.py} client.

Each STOMP header of the delivery semantics (priorities, expiry, delayed
delivery, ack timeouts, dead letters, queue arguments on SUBSCRIBE) is used
as a user would, and each bad value gets an ERROR. Times are short (a few
hundred milliseconds) and every wait is a condition with a deadline; the
timing rules themselves are tested on a Clock in L{tests.test_core_delivery}.
"""

from __future__ import annotations

import time

from tests.integration.test_stomppy import BrokerTestCase, Client


class DeliveryHeaderTests(BrokerTestCase):
    def _stop_server(self):
        # The service closes the broker (which stops its timers) after the
        # listeners; here the test is the service.
        return super()._stop_server().addCallback(lambda _: self.broker.stop_timers())

    def connected(self) -> Client:
        c = self.client("1.2")
        c.connect()
        assert not c.rec.errors, c.rec.errors
        return c

    def subscribe(self, c: Client, dest: str, sub_id: str, ack: str = "auto", **headers) -> None:
        c.conn.subscribe(dest, id=sub_id, ack=ack, headers={"receipt": f"sub-{sub_id}", **headers})
        c.rec.wait_receipt(f"sub-{sub_id}")

    def send(self, c: Client, dest: str, body: str, **headers) -> None:
        receipt = f"send-{time.monotonic_ns()}"
        c.conn.send(dest, body, headers={"receipt": receipt, **headers})
        c.rec.wait_receipt(receipt)

    def wait_count(self, c: Client, queue: str, n: int) -> None:
        """Ask the broker until C{queue} holds C{n} messages (bounded)."""
        deadline = time.monotonic() + 10
        while c.count(queue) != n:
            assert time.monotonic() < deadline, f"{queue} never held {n} messages"

    def test_priority(self):
        def scenario():
            c = self.connected()
            # The SUBSCRIBE that creates the queue gives its arguments.
            self.subscribe(c, "/queue/prio", "s", **{"x-max-priority": "9"})
            c.conn.unsubscribe("s")
            for body, p in [("a", "0"), ("b", "5"), ("c", "9"), ("d", "5"), ("e", "1")]:
                self.send(c, "/queue/prio", body, priority=p)
            self.subscribe(c, "/queue/prio", "t")
            got = c.rec.wait_messages(5, "t")
            assert [m.body for m in got] == ["c", "b", "d", "e", "a"], [m.body for m in got]
            assert got[0].headers["priority"] == "9", got[0].headers

        return self.in_thread(scenario)

    def test_ttl_and_expires(self):
        def scenario():
            c = self.connected()
            self.send(c, "/queue/ttl", "short", ttl="200")
            self.send(c, "/queue/ttl", "past", expires=str(int(time.time() * 1000) - 1000))
            self.send(c, "/queue/ttl", "kept", expires=str(int(time.time() * 1000) + 60_000))
            self.send(c, "/queue/ttl", "plain")
            self.wait_count(c, "ttl", 2)
            self.subscribe(c, "/queue/ttl", "s")
            got = c.rec.wait_messages(2, "s")
            assert [m.body for m in got] == ["kept", "plain"], [m.body for m in got]

        return self.in_thread(scenario)

    def test_queue_ttl_dead_letters(self):
        def scenario():
            c = self.connected()
            self.subscribe(c, "/queue/dead", "d")
            self.subscribe(
                c,
                "/queue/ttlq",
                "s",
                **{"message-ttl": "100", "dead-letter-exchange": "", "dead-letter-routing-key": "dead"},
            )
            c.conn.unsubscribe("s")
            self.send(c, "/queue/ttlq", "late", note="x")
            [m] = c.rec.wait_messages(1, "d")
            h = m.headers
            assert m.body == "late", m
            assert h["x-death-reason"] == "expired", h
            assert h["x-death-queue"] == "ttlq", h
            assert h["x-first-death-queue"] == "ttlq", h
            assert h["note"] == "x", h
            assert h["destination"] == "/queue/dead", h

        return self.in_thread(scenario)

    def test_delay_and_deliver_at(self):
        def scenario():
            c = self.connected()
            self.subscribe(c, "/queue/later", "s")
            start = time.monotonic()
            self.send(c, "/queue/later", "in 300 ms", delay="300")
            self.send(c, "/queue/later", "at", **{"deliver-at": str(int(time.time() * 1000) + 150)})
            self.send(c, "/queue/later", "now")
            got = c.rec.wait_messages(1, "s")
            assert got[0].body == "now", [m.body for m in got]
            got = c.rec.wait_messages(3, "s")
            assert [m.body for m in got] == ["now", "at", "in 300 ms"], [m.body for m in got]
            assert time.monotonic() - start >= 0.3

        return self.in_thread(scenario)

    def test_ack_timeout_redelivers_to_another(self):
        def scenario():
            a = self.connected()
            b = self.connected()
            self.subscribe(a, "/queue/slow", "a", ack="client-individual")
            self.send(a, "/queue/slow", "work", **{"ack-timeout": "0.2"})
            [m] = a.rec.wait_messages(1, "a")
            assert "redelivered" not in m.headers, m.headers
            self.subscribe(b, "/queue/slow", "b", ack="client-individual")
            [m2] = b.rec.wait_messages(1, "b")
            assert m2.body == "work"
            assert m2.headers["redelivered"] == "true", m2.headers
            assert m2.headers["x-delivery-count"] == "1", m2.headers
            # The first consumer's late ACK is ignored, not an error.
            a.ack(m)
            b.ack(m2)
            assert a.count("slow") == 0
            assert not a.rec.errors and not b.rec.errors, (a.rec.errors, b.rec.errors)

        return self.in_thread(scenario)

    def test_nack_and_delivery_limit_dead_letter(self):
        def scenario():
            c = self.connected()
            self.subscribe(c, "/queue/dlq", "d")
            args = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dlq",
                "x-delivery-limit": "1",
            }
            self.subscribe(c, "/queue/work", "w", ack="client-individual", **args)
            self.send(c, "/queue/work", "rejected")
            [m] = c.rec.wait_messages(1, "w")
            c.nack(m, requeue="false")
            [dead] = c.rec.wait_messages(1, "d")
            assert dead.headers["x-death-reason"] == "rejected", dead.headers
            c.rec.take("w")
            self.send(c, "/queue/work", "poison")
            for n in (1, 2):
                m = c.rec.wait_messages(n, "w")[-1]
                c.nack(m)
            got = c.rec.wait_messages(2, "d")
            assert got[1].body == "poison", got
            assert got[1].headers["x-death-reason"] == "delivery_limit", got[1].headers

        return self.in_thread(scenario)

    def test_backoff(self):
        def scenario():
            c = self.connected()
            self.subscribe(c, "/queue/retry", "r", ack="client-individual", **{"x-redelivery-backoff": "300"})
            self.send(c, "/queue/retry", "m")
            [m] = c.rec.wait_messages(1, "r")
            start = time.monotonic()
            c.nack(m)
            got = c.rec.wait_messages(2, "r")
            assert time.monotonic() - start >= 0.3
            assert got[1].headers["redelivered"] == "true"

        return self.in_thread(scenario)

    def check_error(self, action, message: str) -> None:
        c = self.connected()
        action(c)
        [error] = c.rec.wait(lambda: c.rec.errors, "ERROR")
        assert error.headers["message"] == message, error.headers

    def test_bad_send_headers(self):
        def scenario():
            self.quiet_stomppy()
            cases = [
                ({"priority": "10"}, "invalid priority header"),
                ({"priority": "-1"}, "invalid priority header"),
                ({"ttl": "soon"}, "invalid ttl header"),
                ({"expires": "1.5"}, "invalid expires header"),
                ({"delay": "-5"}, "invalid delay header"),
                ({"deliver-at": "tomorrow"}, "invalid deliver-at header"),
                ({"ack-timeout": "0"}, "invalid ack-timeout header"),
                ({"ack-timeout": "1e3"}, "invalid ack-timeout header"),
            ]
            for headers, message in cases:
                self.check_error(lambda c, h=headers: c.conn.send("/queue/bad", "x", headers=h), message)

        return self.in_thread(scenario)

    def test_bad_subscribe_arguments(self):
        def scenario():
            self.quiet_stomppy()
            self.check_error(
                lambda c: c.conn.subscribe("/queue/b1", id="s", headers={"x-max-priority": "256"}),
                "x-max-priority must be an integer from 1 to 255, got '256'",
            )
            c = self.connected()
            self.subscribe(c, "/queue/b2", "s", **{"x-message-ttl": "1000"})
            self.check_error(
                lambda c: c.conn.subscribe("/queue/b2", id="t", headers={"x-message-ttl": "2000"}),
                "inequivalent queue arguments",
            )
            # The same arguments again are fine.
            self.subscribe(c, "/queue/b2", "u", **{"message-ttl": "1000"})

        return self.in_thread(scenario)
