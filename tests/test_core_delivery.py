"""Tests for the delivery semantics of L{qmq.core.queue}: queue arguments,
priorities, message expiry, delayed delivery, ack timeouts, redelivery
backoff and dead-lettering.

Every timing rule runs on a L{Clock}: no test sleeps.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.errors import PreconditionFailed
from qmq.core.queue import QUEUE_ARGUMENTS, QueuePolicy, argument_name


class QueueArgumentTests(SynchronousTestCase):
    def test_both_spellings(self) -> None:
        """Every argument is accepted with and without its x- prefix."""
        for name in QUEUE_ARGUMENTS:
            self.assertEqual(argument_name(name), name)
            self.assertEqual(argument_name(name[2:]), name)
        self.assertEqual(argument_name("x-unknown"), "x-unknown")
        a = QueuePolicy.from_arguments(
            {
                "max-priority": "5",
                "message-ttl": 1000,
                "ack-timeout": "30000",
                "dead-letter-exchange": "dlx",
                "dead-letter-routing-key": "dead",
                "redelivery-backoff": "100, 1000,10000",
            }
        )
        b = QueuePolicy.from_arguments(
            {
                "x-max-priority": 5,
                "x-message-ttl": "1000",
                "x-ack-timeout": 30000,
                "x-dead-letter-exchange": "dlx",
                "x-dead-letter-routing-key": "dead",
                "x-redelivery-backoff": [100, 1000, 10000],
            }
        )
        self.assertIs(a, b)
        self.assertEqual(
            (
                a.max_priority,
                a.message_ttl,
                a.ttl,
                a.ack_timeout,
                a.ack_seconds,
                a.dead_letter_exchange,
                a.dead_letter_routing_key,
                a.redelivery_backoff,
            ),
            (5, 1000, 1.0, 30000, 30.0, "dlx", "dead", (100, 1000, 10000)),
        )
        self.assertGreater(QueuePolicy.from_arguments({"x-message-ttl": 0}).ttl, 0.0)
        self.assertIsNone(QueuePolicy.from_arguments({"x-redelivery-backoff": "0"}).redelivery_backoff)

    def test_bad_values(self) -> None:
        bad = [
            ("x-max-priority", 0),
            ("max-priority", "10"),
            ("x-message-ttl", -1),
            ("message-ttl", "soon"),
            ("x-ack-timeout", 0),
            ("x-dead-letter-exchange", 5),
            ("x-dead-letter-routing-key", "k" * 256),
            ("x-redelivery-backoff", ""),
            ("x-redelivery-backoff", "1,x"),
            ("x-redelivery-backoff", ",".join(["1"] * 33)),
            ("x-redelivery-backoff", [-1]),
            ("x-message-ttl", "9" * 30),
        ]
        for name, value in bad:
            e = self.assertRaises(PreconditionFailed, QueuePolicy.from_arguments, {name: value})
            self.assertTrue(e.message.startswith(name + " must be"), e.message)


del Clock
