"""The topic limits as a STOMP client meets them.

A topic pattern or routing key past C{limits.max_topic_words} (32 words by
default) or C{limits.max_routing_key_length} (255 characters) is refused
with an ERROR whose message names the setting, and the pattern bomb (a
SUBSCRIBE to 600 C{#} words) is refused before it reaches the matcher. The
core's side is in L{tests.test_core_exchange} (the limits, the matcher's
work) and L{tests.test_core} (the broker applying configured limits).

Tests marked C{BUG} fail against the code as it is; each says what is wrong.
"""

from __future__ import annotations

from qmq.core.broker import Broker
from qmq.core.limits import LimitSettings
from qmq.stomp.protocol import StompFactory
from tests.test_stomp_session import SessionTestCase

WORDS_32 = ".".join(["a"] * 32)
WORDS_33 = ".".join(["a"] * 33)


class StompTopicLimitTests(SessionTestCase):
    def topic(self):
        return self.vhost.exchange("amq.topic")

    def test_subscribe_too_many_words(self) -> None:
        c = self.client()
        c.subscribe("/topic/" + WORDS_33)
        error = self.assertError(c, "limits.max_topic_words")
        self.assertIn("33 words", error.headers["message"])
        self.assertEqual(self.topic().bindings(), [])

    def test_subscribe_pattern_bomb(self) -> None:
        """600 C{#} words: refused on the word count, never routed."""
        c = self.client()
        c.subscribe("/topic/" + ".".join(["#"] * 600))
        self.assertError(c, "limits.max_topic_words")
        self.assertEqual(self.topic().bindings(), [])
        self.assertEqual(self.topic().steps, 0)

    def test_at_the_limits(self) -> None:
        """32 words and 255 characters are allowed, subscribed and sent."""
        sub = self.client()
        sub.subscribe("/topic/" + WORDS_32, "words")
        sub.subscribe("/topic/" + "k" * 255, "length")
        pub = self.client()
        pub.publish("/topic/" + WORDS_32, b"32 words")
        pub.publish("/topic/" + "k" * 255, b"255 characters", receipt="r")
        self.assertEqual([f.command for f in pub.read()], ["RECEIPT"])
        self.assertEqual(sorted(sub.bodies()), [b"255 characters", b"32 words"])

    def test_send_key_too_long(self) -> None:
        """A SEND whose key is too long is refused (ERROR naming the
        setting, with the receipt id) and reaches no subscriber."""
        sub = self.client()
        sub.subscribe("/topic/#")
        pub = self.client()
        pub.publish("/topic/" + "k" * 256, b"x", receipt="r1")
        error = self.assertError(pub, "limits.max_routing_key_length")
        self.assertEqual(error.headers.get("receipt-id"), "r1")
        self.assertEqual(sub.read(), [])

    def test_send_key_too_many_words(self) -> None:
        sub = self.client()
        sub.subscribe("/topic/#")
        pub = self.client()
        pub.publish("/exchange/amq.topic/" + WORDS_33, b"x")
        self.assertError(pub, "limits.max_topic_words")
        self.assertEqual(sub.read(), [])

    def test_refused_subscription_leaves_no_queue(self) -> None:
        """A topic subscription that needs a queue (C{ack:client},
        C{ack:client-individual}, or a durable one) and whose bind is
        refused (a pattern past the limits) leaves no queue behind: it
        would stay unbound and never consumed, never auto-deleted (a leak
        per connection; a durable one would reach the store)."""
        before = set(self.vhost.queues)
        for mode in ("client", "client-individual"):
            c = self.client()
            c.subscribe("/topic/" + WORDS_33, ack=mode)
            self.assertError(c, "limits.max_topic_words")
        c = self.client(**{"client-id": "cid"})
        c.subscribe("/topic/" + WORDS_33, durable="true")
        self.assertError(c, "limits.max_topic_words")
        self.assertEqual(set(self.vhost.queues) - before, set())
        self.assertEqual(self.topic().bindings(), [])


class ConfiguredStompTopicLimitTests(SessionTestCase):
    """Limits from the configuration reach a STOMP client's ERROR."""

    def setUp(self) -> None:
        super().setUp()
        self.broker = Broker(
            self.clock, limits=LimitSettings(max_topic_words=3, max_routing_key_length=12)
        )
        self.vhost = self.broker.default_vhost
        self.factory = StompFactory(self.broker, self.settings, clock=self.clock)

    def test_configured_words(self) -> None:
        c = self.client()
        c.subscribe("/topic/a.b.c", "ok")
        c.subscribe("/topic/a.b.c.d", "too long")
        error = self.assertError(c, "limits.max_topic_words")
        self.assertIn("the limit is 3", error.headers["message"])

    def test_configured_length(self) -> None:
        c = self.client()
        c.publish("/topic/" + "k" * 12, b"fits", receipt="r")
        self.assertEqual([f.command for f in c.read()], ["RECEIPT"])
        c.publish("/topic/" + "k" * 13, b"too long")
        error = self.assertError(c, "limits.max_routing_key_length")
        self.assertIn("the limit is 12", error.headers["message"])
