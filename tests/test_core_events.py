"""Tests for L{qmq.core.events}: interest (the first and the last binding
for an exchange + key) and topology (queues and exchanges declared and
deleted), and that nobody listening costs nothing."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.events import Observer
from qmq.stomp.destinations import DestinationChannel
from tests.test_core_channel import Recorder


class Recording(Observer):
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def interest_added(self, vhost: str, exchange: str, key: str) -> None:
        self.events.append(("+", exchange, key))

    def interest_removed(self, vhost: str, exchange: str, key: str) -> None:
        self.events.append(("-", exchange, key))

    def queue_declared(self, vhost: str, queue: str) -> None:
        self.events.append(("queue+", queue))

    def queue_deleted(self, vhost: str, queue: str) -> None:
        self.events.append(("queue-", queue))

    def exchange_declared(self, vhost: str, exchange: str, type: str) -> None:
        self.events.append(("exchange+", exchange, type))

    def exchange_deleted(self, vhost: str, exchange: str) -> None:
        self.events.append(("exchange-", exchange))


class EventsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.broker = Broker(Clock())
        self.vhost = self.broker.default_vhost
        self.channel = DestinationChannel(self.broker, self.vhost, "alice")
        self.addCleanup(self.channel.close)
        self.seen = Recording()

    def observe(self, replay: bool = True) -> None:
        self.addCleanup(self.vhost.observe(self.seen, replay))

    def test_nobody_listening(self) -> None:
        """Without observers the virtual host keeps no events object (each
        change pays one test); the last observer to leave drops it."""
        self.assertIsNone(self.vhost.events)
        self.channel.subscribe(Recorder(self.channel, ack_required=False), "/topic/a")
        stop = self.vhost.observe(self.seen)
        self.assertIsNotNone(self.vhost.events)
        other = Recording()
        stop_other = self.vhost.observe(other)
        stop()
        self.assertIsNotNone(self.vhost.events)
        stop_other()
        self.assertIsNone(self.vhost.events)
        self.vhost.declare_queue("later", durable=False)
        self.assertEqual(self.seen.events, [("+", "amq.topic", "a")])

    def test_first_and_last_live_consumer(self) -> None:
        """Two live subscribers to one key are one interest: told when the
        first comes and when the last goes."""
        self.observe()
        a = Recorder(self.channel, ack_required=False)
        b = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(a, "/topic/x.y")
        self.channel.subscribe(b, "/topic/x.y")
        self.assertEqual(self.seen.events, [("+", "amq.topic", "x.y")])
        self.channel.unsubscribe(a)
        self.assertEqual(self.seen.events, [("+", "amq.topic", "x.y")])
        self.channel.unsubscribe(b)
        self.assertEqual(self.seen.events, [("+", "amq.topic", "x.y"), ("-", "amq.topic", "x.y")])

    def test_queue_bindings(self) -> None:
        """A queue's binding is interest; deleting the queue removes it, and
        the private queue of an acking subscriber comes and goes."""
        self.observe()
        self.vhost.declare_queue("q", durable=False)
        self.vhost.bind("q", "amq.direct", "k")
        self.vhost.bind("q", "amq.direct", "k")  # the same binding: nothing new
        c = Recorder(self.channel)
        self.channel.subscribe(c, "/topic/t", label="s")
        private = c.queue.name  # type: ignore[union-attr]
        self.vhost.delete_queue("q")
        self.channel.unsubscribe(c)
        self.assertEqual(self.seen.events, [
            ("queue+", "q"),
            ("+", "amq.direct", "k"),
            ("queue+", private),
            ("+", "amq.topic", "t"),
            ("-", "amq.direct", "k"),
            ("queue-", "q"),
            ("-", "amq.topic", "t"),
            ("queue-", private),
        ])

    def test_bindings_changed(self) -> None:
        """Every binding made or gone is told with the count that remains,
        after the first/last event (what a mesh link needs to subtract the
        bindings it made itself); unbinding what is not bound tells
        nothing."""
        counts: list[tuple[str, str, str, int]] = []

        class Counting(Recording):
            def bindings_changed(self, vhost: str, exchange: str, key: str, count: int) -> None:
                self.events.append(("=", exchange, key, count))  # type: ignore[arg-type]
                counts.append((vhost, exchange, key, count))

        seen = Counting()
        self.addCleanup(self.vhost.observe(seen))
        a = Recorder(self.channel, ack_required=False)
        b = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(a, "/topic/k")
        self.channel.subscribe(b, "/topic/k")
        self.channel.unsubscribe(a)
        self.channel.unsubscribe(b)
        self.vhost.unbind_live(b, self.vhost.exchanges["amq.topic"], "k")
        self.assertEqual(seen.events, [
            ("+", "amq.topic", "k"),
            ("=", "amq.topic", "k", 1),
            ("=", "amq.topic", "k", 2),
            ("=", "amq.topic", "k", 1),
            ("-", "amq.topic", "k"),
            ("=", "amq.topic", "k", 0),
        ])
        self.assertEqual(counts[0][0], "/")

    def test_unbind(self) -> None:
        self.vhost.declare_queue("q", durable=False)
        self.vhost.bind("q", "amq.topic", "a.#")
        self.observe()
        self.vhost.unbind("q", "amq.topic", "a.#")
        self.vhost.unbind("q", "amq.topic", "a.#")
        self.assertEqual(self.seen.events, [("+", "amq.topic", "a.#"), ("-", "amq.topic", "a.#")])

    def test_replay(self) -> None:
        """A new observer hears the interest that exists (once per
        exchange + key), unless it asks not to."""
        self.vhost.declare_queue("q", durable=False)
        self.vhost.bind("q", "amq.direct", "k")
        self.channel.subscribe(Recorder(self.channel, ack_required=False), "/exchange/amq.direct/k")
        self.observe()
        self.assertEqual(self.seen.events, [("+", "amq.direct", "k")])
        quiet = Recording()
        self.addCleanup(self.vhost.observe(quiet, replay=False))
        self.assertEqual(quiet.events, [])
        # Counted from what existed: the last of the two goes -> removed once.
        self.vhost.unbind("q", "amq.direct", "k")
        self.assertEqual(quiet.events, [])
        self.channel.close()
        self.assertEqual(quiet.events, [("-", "amq.direct", "k")])

    def test_exchanges(self) -> None:
        """Exchanges declared and deleted; an exchange-to-exchange binding is
        interest in its source; deleting an exchange ends its bindings'."""
        self.observe()
        self.vhost.declare_exchange("e", "fanout", durable=False)
        self.vhost.declare_exchange("e", "fanout", durable=False)  # exists: nothing
        self.channel.bind_exchange("e", "amq.topic", "k.*")
        self.vhost.delete_exchange("e")
        self.vhost.declare_exchange("auto", "direct", durable=False, auto_delete=True)
        self.vhost.declare_queue("q", durable=False)
        self.vhost.bind("q", "auto", "r")
        self.vhost.unbind("q", "auto", "r")
        self.assertEqual(self.seen.events, [
            ("exchange+", "e", "fanout"),
            ("+", "amq.topic", "k.*"),
            ("-", "amq.topic", "k.*"),
            ("exchange-", "e"),
            ("exchange+", "auto", "direct"),
            ("queue+", "q"),
            ("+", "auto", "r"),
            ("-", "auto", "r"),
            ("exchange-", "auto"),
        ])

    def test_observer_failure_logged(self) -> None:
        """An observer that raises is logged; the operation and the other
        observers go on."""

        class Broken(Observer):
            def queue_declared(self, vhost: str, queue: str) -> None:
                raise RuntimeError("boom")

        self.addCleanup(self.vhost.observe(Broken()))
        self.observe()
        queue = self.vhost.declare_queue("q", durable=False)
        self.assertIs(self.vhost.queues["q"], queue)
        self.assertEqual(self.seen.events, [("queue+", "q")])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class BrokerObserveTests(SynchronousTestCase):
    def test_every_vhost(self) -> None:
        """An observer on the broker hears every virtual host, those made
        later too, until it stops."""
        broker = Broker(Clock())
        seen: list[tuple[str, str]] = []

        class Queues(Observer):
            def queue_declared(self, vhost: str, queue: str) -> None:
                seen.append((vhost, queue))

        stop = broker.observe(Queues())
        broker.default_vhost.declare_queue("a", durable=False)
        later = broker.add_vhost("later")
        later.declare_queue("b", durable=False)
        stop()
        later.declare_queue("c", durable=False)
        self.assertEqual(seen, [("/", "a"), ("later", "b")])
        self.assertIsNone(later.events)
        self.assertIsNone(broker.default_vhost.events)
