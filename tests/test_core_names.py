"""The rules of a valid name (L{qmq.core.names}), where the core applies
them (virtual host declarations and bindings, the channel's send targets,
subscriptions and publishes), and recovery of a name they refuse today."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.core.names import (
    InvalidName,
    check_destination,
    check_exchange,
    check_headers,
    check_queue,
    check_routing_key,
    problem,
)
from qmq.core.store import NullStore, RecoveredQueue, Recovery
from qmq.stomp.destinations import DestinationChannel as Channel


class RuleTests(SynchronousTestCase):
    def test_control_characters(self) -> None:
        """Every C0 control character and DEL is refused, naming it."""
        for code in [*range(0x20), 0x7F]:
            text = f"a{chr(code)}b"
            self.assertEqual(
                problem("queue name", text), f"queue name contains a control character (U+{code:04X})"
            )
        self.assertIsNone(problem("queue name", "a b.c-d_é/€"))

    def test_length_in_bytes(self) -> None:
        """At most 255 bytes of UTF-8 (not characters)."""
        self.assertIsNone(problem("queue name", "q" * 255))
        self.assertEqual(problem("queue name", "q" * 256), "queue name is 256 bytes long; the limit is 255")
        self.assertIsNone(problem("routing key", "é" * 127))
        self.assertEqual(
            problem("routing key", "é" * 128), "routing key is 256 bytes long in UTF-8; the limit is 255"
        )

    def test_surrogate(self) -> None:
        self.assertEqual(
            problem("queue name", "a\ud800"), "queue name is not valid Unicode (a lone surrogate, U+D800)"
        )

    def test_exchange_slash(self) -> None:
        e = self.assertRaises(InvalidName, check_exchange, "a/b")
        self.assertTrue(e.message.startswith("exchange name contains '/'"), e.message)
        self.assertEqual(check_queue("a/b"), "a/b")
        self.assertEqual(check_routing_key("a/b"), "a/b")

    def test_destination(self) -> None:
        self.assertEqual(check_destination("/queue/" + "x" * 300), "/queue/" + "x" * 300)
        e = self.assertRaises(InvalidName, check_destination, "/control/a\x00")
        self.assertEqual(e.message, "destination contains a control character (U+0000)")
        self.assertEqual((e.code, e.short), (406, "invalid name"))

    def test_headers(self) -> None:
        """Header names follow the name rules; values may hold TAB, CR and
        LF (STOMP escapes them) but no other control character."""
        check_headers({"a": "x\ty\r\nz", "é": "€"})
        e = self.assertRaises(InvalidName, check_headers, {"a\x00b": "v"})
        self.assertEqual(e.message, "header name contains a control character (U+0000): 'a\\x00b'")
        e = self.assertRaises(InvalidName, check_headers, {"k": "v\x00"})
        self.assertEqual(e.message, "header 'k' has a value with a control character (U+0000)")
        e = self.assertRaises(InvalidName, check_headers, {"k": "v\ud800"})
        self.assertEqual(e.message, "header 'k' has a value with a lone surrogate (U+D800)")
        self.assertRaises(InvalidName, check_headers, {"k" * 256: "v"})


class _Taker(Consumer):
    def __init__(self) -> None:
        super().__init__(False, None)
        self.got: list = []

    def deliver(self, message, queue) -> None:
        self.got.append(message)


class CoreTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.broker = Broker(Clock())
        self.vhost = self.broker.default_vhost
        self.channel = Channel(self.broker, self.vhost)

    def test_declarations(self) -> None:
        """Declaring a queue or exchange, or binding, checks the names."""
        e = self.assertRaises(InvalidName, self.vhost.declare_queue, "a\x00b")
        self.assertEqual(e.message, "queue name contains a control character (U+0000)")
        self.assertRaises(InvalidName, self.vhost.declare_queue, "a\r\nb")
        self.assertRaises(InvalidName, self.vhost.declare_exchange, "x/y", "topic")
        self.assertRaises(InvalidName, self.vhost.declare_exchange, "x\x7f", "topic")
        self.vhost.declare_queue("q")
        e = self.assertRaises(InvalidName, self.vhost.bind, "q", "amq.topic", "a.\x00")
        self.assertEqual(e.message, "binding key contains a control character (U+0000)")
        self.assertEqual(set(self.vhost.queues), {"q"})

    def test_send_targets(self) -> None:
        """A send destination's queue name, exchange name and key are checked
        when it is resolved; nothing is made for a refused one."""
        cases = {
            "/queue/a\x00b": "queue name contains a control character (U+0000)",
            "/topic/a\x00b": "routing key contains a control character (U+0000)",
            "/exchange/amq.topic/a\nb": "routing key contains a control character (U+000A)",
            "/exchange/ex\x01/k": "exchange name contains a control character (U+0001)",
            "/temp-queue/a\rb": "queue name contains a control character (U+000D)",
            "/control/count-msgs/queue/a\x00": "destination contains a control character (U+0000)",
            "/exchange/amq.direct/" + "k" * 256: "routing key is 256 bytes long; the limit is 255",
        }
        for text, message in cases.items():
            e = self.assertRaises(InvalidName, self.channel.send_target, text)
            self.assertEqual(e.message, message, text)
        self.assertEqual(len(self.vhost.queues), 0)
        # A topic exchange's keys are bounded by its own limit, which names
        # the setting (limits.max_routing_key_length) when it refuses.
        self.channel.send_target("/topic/" + "k" * 256)

    def test_subscriptions(self) -> None:
        """A subscription's queue name and binding key are checked, for a
        live consumer bound straight to an exchange too."""
        e = self.assertRaises(InvalidName, self.channel.subscribe, _Taker(), "/topic/a\x00")
        self.assertEqual(e.message, "binding key contains a control character (U+0000)")
        self.assertRaises(InvalidName, self.channel.subscribe, _Taker(), "/queue/a\x00")
        taker = _Taker()
        taker.ack_required = True
        self.assertRaises(InvalidName, self.channel.subscribe, taker, "/topic/a\x1f", label="s")
        self.assertEqual(len(self.vhost.queues), 0)
        self.assertEqual(self.vhost.exchanges["amq.topic"].binding_count, 0)

    def test_publish_headers(self) -> None:
        """A publish's header names are checked (once per headers dict)."""
        target = self.channel.send_target("/queue/q")
        bad = self.channel.new_message(target, {"a\x00": "1"}, b"x")
        e = self.assertRaises(InvalidName, self.channel.publish_target, target, bad)
        self.assertEqual(e.message, "header name contains a control character (U+0000): 'a\\x00'")
        headers = {"a": "1"}
        for _ in range(2):
            self.channel.publish_target(target, self.channel.new_message(target, headers, b"x"))
        self.assertEqual(len(self.vhost.queues["q"]), 2)

    def test_existing_names_reachable(self) -> None:
        """A queue made before the rules (recovered) is returned by a
        declaration of its name, and can be published to and deleted."""
        self.vhost.declare_queue("old\x00name", validate=False)
        self.assertIn("old\x00name", self.vhost.queues)
        self.vhost.declare_queue("old\x00name")
        self.channel.publish_target(*self._target("/queue/old\x00name"))
        self.assertEqual(len(self.vhost.queues["old\x00name"]), 1)
        self.vhost.delete_queue("old\x00name")

    def _target(self, text: str) -> tuple:
        target = self.channel.send_target(text)
        return target, self.channel.new_message(target, None, b"x")


class _KeptStore(NullStore):
    def __init__(self, recovery: Recovery) -> None:
        self.recovery = recovery

    def recover(self) -> Recovery:
        return self.recovery


class RecoveryTests(SynchronousTestCase):
    def test_invalid_names_kept(self) -> None:
        """A durable queue, exchange and binding kept with names an older
        version accepted come back, reachable, with a warning each; the
        broker starts."""
        events: list = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        recovery = Recovery(
            next_message_id=5,
            exchanges=[("/", "ex/1", "topic", False)],
            queues=[RecoveredQueue("/", "q\x00", None)],
            bindings=[("/", "q\x00", "ex/1", "k\n", None)],
        )
        broker = Broker(Clock(), store=_KeptStore(recovery))
        broker.recover()
        vhost = broker.default_vhost
        self.assertIn("q\x00", vhost.queues)
        self.assertIn("ex/1", vhost.exchanges)
        self.assertEqual(list(vhost.route("ex/1", "k\n")), [vhost.queues["q\x00"]])
        warnings = [e for e in events if "breaks a naming rule" in e.get("log_format", "")]
        self.assertEqual(
            sorted(e["kind"] for e in warnings), ["binding key", "exchange name", "queue name"]
        )
        self.assertEqual(next(broker.message_ids), 5)

    def test_dead_letter_arguments(self) -> None:
        """Dead-letter targets follow the rules when declared; a kept queue
        whose target breaks them comes back without it, messages and all."""
        broker = Broker(Clock())
        e = self.assertRaises(
            InvalidName,
            broker.default_vhost.declare_queue,
            "q",
            arguments={"x-dead-letter-routing-key": "k\x00"},
        )
        self.assertEqual(e.message, "x-dead-letter-routing-key: routing key contains a control character (U+0000)")
        self.assertRaises(
            InvalidName, broker.default_vhost.declare_queue, "q", arguments={"x-dead-letter-exchange": "a/b"}
        )
        recovery = Recovery(
            queues=[RecoveredQueue("/", "q", {"x-dead-letter-routing-key": "k\n", "x-max-length": 5})]
        )
        broker = Broker(Clock(), store=_KeptStore(recovery))
        broker.recover()
        policy = broker.default_vhost.queues["q"].policy
        self.assertEqual((policy.dead_letter_routing_key, policy.max_length), (None, 5))


class ConfigurationTests(SynchronousTestCase):
    def test_declarations_refused(self) -> None:
        """A declaration or virtual host the rules refuse is a configuration
        error naming where it is and the rule."""
        from twisted.internet.testing import MemoryReactorClock

        from qmq import config
        from qmq.config import ConfigError
        from qmq.service import make_service

        data = f'data_dir = "{self.mktemp()}"\nstore = "memory"\n'
        cases = [
            ('[[vhosts."/".queues]]\nname = "a\\u0000b"\n', "queue name contains a control character (U+0000)"),
            ('[[vhosts."/".exchanges]]\nname = "a/b"\ntype = "topic"\n', "exchange name contains '/'"),
            ('[vhosts."v\\n"]\n', 'vhosts."v\\n": virtual host name contains a control character (U+000A)'),
        ]
        for text, rule in cases:
            try:
                make_service(config.load_string(data + text), MemoryReactorClock())
            except ConfigError as e:
                self.assertIn(rule, str(e))
            else:
                self.fail(f"accepted: {text!r}")


class TypedHeaderValueTests(SynchronousTestCase):
    """Typed application headers (numbers, booleans, None, bytes) pass the
    value check; the strings among them are still checked."""

    def test_typed_values(self) -> None:
        check_headers({"n": 1, "f": 1.5, "b": True, "none": None, "raw": b"\x00", "s": "ok"})

    def test_string_among_typed(self) -> None:
        e = self.assertRaises(InvalidName, check_headers, {"n": 1, "s": "a\x00b"})
        self.assertIn("U+0000", e.message)
