"""Tests for what L{qmq.service.make_service} wires into the running broker:
the message store (the memory store, the commit log and its C{[commit_log]}
settings), recovery, the memory alarm, the C{[limits]} settings and the
on-demand queue defaults, and the shutdown order around them.

Listeners, endpoints and the connection registry are tested in
L{tests.test_tap}.  Everything runs on a L{MemoryReactorClock}; the memory
alarm reads a fake RSS.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import struct
import zlib
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.defer import maybeDeferred
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from qmq import config, service
from qmq.config import ConfigError, Settings
from qmq.core import alarm as alarm_module
from qmq.core.alarm import MemoryAlarm, MiB
from qmq.core.broker import Broker
from qmq.core.errors import PreconditionFailed, ResourceLimit
from qmq.core.limits import LimitSettings
from qmq.core.store import NullStore, Recovery
from qmq.service import STORES, build_memory_alarm, build_store, make_service
from qmq.stomp.destinations import DestinationChannel as Channel
from qmq.stomp.frame import StompParser, encode_frame
from qmq.store import log as log_module
from qmq.store.log import CommitLogStore
from qmq.store.memory import MemoryStore
from qmq.store.segment import encode_header, segment_name

_ports = itertools.count(41000)


class RecordingStore(NullStore):
    """A store that records what the core asks of it, in order."""

    def __init__(self, events: list[str], recovery: Recovery | None = None) -> None:
        self.events = events
        self.recovery = recovery or Recovery()
        self.closing: defer.Deferred[None] | None = None
        self.close_error: Exception | None = None

    def recover(self) -> Recovery:
        self.events.append("recover")
        return self.recovery

    def declare_queue(self, vhost, queue) -> None:
        self.events.append(f"declare queue {queue.name}")

    def declare_exchange(self, vhost, exchange) -> None:
        self.events.append(f"declare exchange {exchange.name}")

    def bind(self, vhost, queue, exchange, key, arguments) -> None:
        self.events.append(f"bind {queue.name} {exchange.name}")

    def close(self) -> Any:
        self.events.append("store close")
        if self.close_error is not None:
            raise self.close_error
        if self.closing is not None:
            return self.closing
        return None


class FakeRSS:
    """The RSS the memory alarm reads."""

    def __init__(self, value: int = 100 * MiB) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


class ServiceTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.logged: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)
        self.rss = FakeRSS()
        self.patch(alarm_module, "current_rss", self.rss)
        self.patch(alarm_module, "trim_heap", lambda: None)
        # gc.freeze() in the test process would keep every test's objects
        # out of the collector's reach: count the calls instead.
        self.frozen: list[bool] = []
        self.patch(service, "freeze_gc", lambda: self.frozen.append(True))

    def settings(self, text: str = "", **changes: Any) -> Settings:
        settings = config.load_string(text, "qmq.toml")
        changes.setdefault("data_dir", Path(self.mktemp()))
        if not re.search(r"^store\s*=", text, re.M):
            # These tests run on a fake reactor (no threads): the memory
            # store, unless a test names one (the default is the log).
            changes.setdefault("store", "memory")
        return dataclasses.replace(settings, **changes)

    def messages(self, namespace: str | None = None) -> list[str]:
        return [
            formatEvent(e)
            for e in self.logged
            if namespace is None or e.get("log_namespace") == namespace
        ]

    def use_store(self, store: RecordingStore, name: str = "recording") -> None:
        self.patch(service, "STORES", {**STORES, name: lambda settings, reactor: store})


class StoreTests(ServiceTestCase):
    """C{settings.store} chooses the store; recovery follows the declarations."""

    def test_registry_matches_config(self) -> None:
        """Every store the configuration accepts has a builder, and no more."""
        self.assertEqual(sorted(STORES), sorted(config.STORES))

    def test_default_is_the_log(self) -> None:
        """The default store is the commit log (durable queues survive)."""
        self.assertEqual(config.load().store, "log")
        store = build_store(self.settings(store="log"), self.reactor)
        self.assertIsInstance(store, CommitLogStore)

    def test_memory(self) -> None:
        """C{store = "memory"} is the memory store."""
        settings = self.settings('store = "memory"\n')
        self.assertEqual(settings.store, "memory")
        self.assertIsInstance(build_store(settings), MemoryStore)
        svc = make_service(settings, self.reactor)
        self.assertIsInstance(svc.broker.store, MemoryStore)

    def test_chosen_by_name(self) -> None:
        """A store in L{STORES} is built with the settings and given to the broker."""
        events: list[str] = []
        store = RecordingStore(events)
        built: list[Settings] = []

        def builder(settings: Settings, reactor: Any) -> RecordingStore:
            built.append(settings)
            self.assertIs(reactor, self.reactor)
            return store

        self.patch(service, "STORES", {**STORES, "recording": builder})
        settings = self.settings(store="recording")
        svc = make_service(settings, self.reactor)
        self.assertIs(svc.broker.store, store)
        self.assertEqual(built, [settings])

    def test_unknown(self) -> None:
        """Settings naming no known store (made by hand) are a L{ConfigError}."""
        e = self.assertRaises(
            ConfigError, make_service, self.settings(store="nope"), self.reactor
        )
        self.assertEqual(
            str(e), "store: unknown message store 'nope' (expected one of: log, memory)"
        )

    def test_declarations_then_recover(self) -> None:
        """
        The configuration's durable declarations reach the store, in order,
        and only then is the store asked what it kept.
        """
        events: list[str] = []
        self.use_store(RecordingStore(events))
        settings = self.settings(
            """
store = "memory"
[[vhosts."/".exchanges]]
name = "events"
type = "fanout"
[[vhosts."/".queues]]
name = "audit"
[[vhosts."/".queues]]
name = "scratch"
durable = false
[[vhosts."/".bindings]]
queue = "audit"
exchange = "events"
""",
            store="recording",
        )
        make_service(settings, self.reactor)
        self.assertEqual(
            events,
            ["declare exchange events", "declare queue audit", "bind audit events", "recover"],
        )

    def test_internal_and_alternate_declared(self) -> None:
        """A configured exchange's internal flag and alternate reach the core."""
        settings = self.settings(
            """
store = "memory"
[[vhosts."/".exchanges]]
name = "caught"
type = "fanout"
internal = true
[[vhosts."/".exchanges]]
name = "front"
type = "direct"
arguments = {"alternate-exchange" = "caught"}
"""
        )
        service = make_service(settings, self.reactor)
        exchanges = service.broker.default_vhost.exchanges
        self.assertTrue(exchanges["caught"].internal)
        self.assertEqual(exchanges["front"].alternate, "caught")

    def test_recovered_into_declared(self) -> None:
        """
        What the store kept comes back: into a declared queue (which keeps
        its declared arguments), and as queues nobody declared, which get
        the virtual host's on-demand defaults.
        """
        events: list[str] = []
        broker = Broker(self.reactor)
        kept = broker.new_message("", "audit", None, b"kept", persistent=True)
        self.use_store(
            RecordingStore(
                events,
                Recovery(
                    next_message_id=500,
                    queues=[("/", "audit", None), ("/", "made-by-client", None)],
                    messages={("/", "audit"): [kept]},
                ),
            )
        )
        settings = self.settings(
            '[[vhosts."/".queues]]\nname = "audit"\narguments = { x-max-length = 7 }\n',
            store="recording",
        )
        svc = make_service(settings, self.reactor)
        vhost = svc.broker.default_vhost
        self.assertEqual([m.body for m in vhost.queues["audit"].messages()], [b"kept"])
        self.assertEqual(vhost.queues["audit"].policy.max_length, 7)
        self.assertEqual(vhost.queues["made-by-client"].policy.max_length, 1_000_000)
        self.assertEqual(svc.broker.new_message("", "x", None, b"").id, 500)
        self.assertEqual(self.frozen, [True])
        self.assertIn(
            "QMQ recovered 1 message(s), and 1 queue(s) and 0 exchange(s) besides the"
            " configuration's, from the recording store",
            self.messages("qmq.service"),
        )

    def test_nothing_recovered(self) -> None:
        """
        A recovery that brings nothing back logs nothing and freezes
        nothing, even when the store gives the next message id.
        """
        self.use_store(RecordingStore([], Recovery(next_message_id=9)))
        make_service(
            self.settings('[[vhosts."/".queues]]\nname = "audit"\n', store="recording"),
            self.reactor,
        )
        make_service(self.settings(), self.reactor)
        self.assertEqual(self.frozen, [])
        self.assertEqual(
            [m for m in self.messages("qmq.service") if "recovered" in m], []
        )

    def test_recovery_conflict(self) -> None:
        """A kept exchange whose type the configuration changed is a L{ConfigError}."""
        self.use_store(
            RecordingStore([], Recovery(exchanges=[("/", "events", "topic", False)]))
        )
        settings = self.settings(
            '[[vhosts."/".exchanges]]\nname = "events"\ntype = "fanout"\n', store="recording"
        )
        e = self.assertRaises(ConfigError, make_service, settings, self.reactor)
        self.assertTrue(
            str(e).startswith(
                "store: what the 'recording' store kept contradicts the configuration: "
            ),
            str(e),
        )
        self.assertIn("events", str(e))


def sync_io(f: Any, *args: Any) -> defer.Deferred[Any]:
    """The commit log's C{io}: run the writer's job at once, in the test."""
    return maybeDeferred(f, *args)


def newer_segment() -> bytes:
    """A segment header of a format version newer than this QMQ's (99),
    intact (its CRC right)."""
    header = bytearray(encode_header(0, 1))
    struct.pack_into("<H", header, 8, 99)
    struct.pack_into("<I", header, 28, zlib.crc32(bytes(header[:28])))
    return bytes(header)


class CommitLogTests(ServiceTestCase):
    """
    C{store = "log"}: the commit log in C{DATA_DIR/log}, set up by the
    C{[commit_log]} table; what it kept comes back at the next start.
    """

    def setUp(self) -> None:
        super().setUp()
        # The store's writes run in the test (no writer thread, no timers on
        # the global reactor); everything else is as the service builds it.
        real = log_module.CommitLogStore

        def make(*args: Any, **kwargs: Any) -> CommitLogStore:
            kwargs["io"] = sync_io
            kwargs["compact_interval"] = 0
            return real(*args, **kwargs)

        self.patch(log_module, "CommitLogStore", make)

    def test_built(self) -> None:
        """
        The store is built from C{[commit_log]} in C{DATA_DIR/log}, which
        is made at once, parents included (the service makes C{data_dir}
        only when it starts, after the store has been read).
        """
        data_dir = Path(self.mktemp()) / "a" / "b"
        settings = self.settings(
            'store = "log"\n[commit_log]\nfsync = "interval"\nfsync_interval_ms = 5\n'
            "segment_size = 8192\ncompact_ratio = 0.5\n",
            data_dir=data_dir,
        )
        store = build_store(settings, self.reactor)
        self.assertIsInstance(store, CommitLogStore)
        self.assertTrue((data_dir / "log").is_dir())
        self.assertEqual(
            (store.directory, store.fsync, store.interval, store.segment_size, store.compact_ratio),
            (str(data_dir / "log"), "interval", 0.005, 8192, 0.5),
        )
        defaults = build_store(self.settings('store = "log"'), self.reactor)
        self.assertEqual(
            (defaults.fsync, defaults.interval, defaults.segment_size, defaults.compact_ratio),
            ("always", 0.1, 64 * MiB, 0.25),
        )

    def test_restart(self) -> None:
        """
        A durable queue made at runtime and its persistent message come back
        at the next start, with ids going on above it; a non-durable queue
        does not.  Only the start that recovered something freezes the
        collector and says so.
        """
        settings = self.settings('store = "log"\n')
        svc = make_service(settings, self.reactor)
        self.assertEqual(self.frozen, [])
        vhost = svc.broker.default_vhost
        queue = vhost.declare_queue("kept")
        vhost.declare_queue("scratch", durable=False)
        message = svc.broker.new_message("", "kept", {"h": "1"}, b"body", persistent=True)
        published = vhost.publish_to((queue,), message)
        svc.broker.store.flush()
        self.successResultOf(published)
        self.successResultOf(svc.broker.close())
        self.assertEqual(self.frozen, [])

        again = make_service(settings, self.reactor)
        self.addCleanup(again.broker.close)
        vhost = again.broker.default_vhost
        self.assertEqual([m.body for m in vhost.queues["kept"].messages()], [b"body"])
        self.assertEqual(vhost.queues["kept"].messages()[0].headers, {"h": "1"})
        self.assertNotIn("scratch", vhost.queues)
        self.assertGreater(again.broker.new_message("", "x", None, b"").id, message.id)
        self.assertEqual(self.frozen, [True])
        self.assertIn(
            "QMQ recovered 1 message(s), and 1 queue(s) and 0 exchange(s) besides the"
            " configuration's, from the log store",
            self.messages("qmq.service"),
        )
        self.assertTrue(
            [m for m in self.messages("qmq.service") if m.startswith("QMQ recovery took ")]
        )

    def test_newer_format(self) -> None:
        """
        A log the store cannot read (a segment of a newer format) stops the
        start with a L{ConfigError} naming the store and the file, whether
        the first durable declaration or the recovery reads it first.
        """
        for text in ('store = "log"', 'store = "log"\n[[vhosts."/".queues]]\nname = "q"\n'):
            data_dir = Path(self.mktemp())
            (data_dir / "log").mkdir(parents=True)
            (data_dir / "log" / segment_name(0)).write_bytes(newer_segment())
            e = self.assertRaises(
                ConfigError, make_service, self.settings(text, data_dir=data_dir), self.reactor
            )
            self.assertTrue(str(e).startswith("store: the 'log' store cannot start: "), str(e))
            self.assertIn(segment_name(0), str(e))
            self.assertIn("format version 99", str(e))

    def test_directory_cannot_be_made(self) -> None:
        """
        A C{data_dir} that cannot hold the log directory (it is a file) is a
        L{ConfigError} naming C{data_dir} and the directory.
        """
        data_dir = Path(self.mktemp())
        data_dir.write_text("not a directory")
        e = self.assertRaises(
            ConfigError,
            make_service,
            self.settings('store = "log"', data_dir=data_dir),
            self.reactor,
        )
        self.assertTrue(
            str(e).startswith(
                f"data_dir: cannot create the commit-log directory {str(data_dir / 'log')!r}: "
            ),
            str(e),
        )


class ShutdownTests(ServiceTestCase):
    """The store closes last: after the connections, after the alarm."""

    def started(self, store: RecordingStore, text: str = "") -> service.BrokerService:
        self.use_store(store)
        svc = make_service(self.settings(text, listen=[], store="recording"), self.reactor)
        svc.startService()
        return svc

    def test_order(self) -> None:
        """
        Connections are shut down first (a raised alarm still holds their
        publishers meanwhile), then the alarm stops, then the store closes.
        """
        events: list[str] = []
        store = RecordingStore(events)
        svc = self.started(store, '[limits]\nmemory_high_watermark = "256MiB"\n')
        alarm = svc.memory_alarm
        assert alarm is not None
        self.rss.value = 300 * MiB
        self.reactor.advance(alarm.interval)
        self.assertTrue(alarm.active)
        original = svc.connections.shutdown

        def state() -> str:
            sampling = bool(self.reactor.getDelayedCalls())
            return f"alarm {'on' if alarm.active else 'off'}, {'sampling' if sampling else 'stopped'}"

        def shutdown(reason: str, timeout: float) -> Any:
            events.append(f"connections shutdown ({state()})")
            return original(reason, timeout=timeout)

        def close() -> None:
            events.append(f"store close ({state()})")

        self.patch(svc.connections, "shutdown", shutdown)
        self.patch(store, "close", close)
        events.clear()
        self.successResultOf(svc.stopService())
        self.assertEqual(
            events,
            [
                "connections shutdown (alarm on, sampling)",
                "store close (alarm off, stopped)",
            ],
        )
        self.assertEqual(self.messages("qmq.service")[-1], "QMQ stopped")
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_waits_for_close(self) -> None:
        """A store whose close returns a Deferred is waited for."""
        store = RecordingStore([])
        store.closing = defer.Deferred()
        svc = self.started(store)
        d = svc.stopService()
        self.assertNoResult(d)
        self.assertNotIn("QMQ stopped", self.messages("qmq.service"))
        store.closing.callback(None)
        self.successResultOf(d)
        self.assertEqual(self.messages("qmq.service")[-1], "QMQ stopped")

    def test_close_failure_logged(self) -> None:
        """
        A store that fails to close is logged as one error line, without a
        traceback, and the service still stops.
        """
        store = RecordingStore([])
        store.closing = defer.Deferred()
        svc = self.started(store)
        d = svc.stopService()
        store.closing.errback(OSError(28, "No space left on device"))
        self.successResultOf(d)
        [event] = [e for e in self.logged if "could not close" in formatEvent(e)]
        self.assertEqual(
            formatEvent(event),
            "QMQ could not close the recording store: [Errno 28] No space left on device",
        )
        self.assertNotIn("log_failure", event)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(self.messages("qmq.service")[-1], "QMQ stopped")

    def test_close_raises(self) -> None:
        """A close that raises at once is logged the same way."""
        store = RecordingStore([])
        store.close_error = RuntimeError("boom")
        svc = self.started(store)
        self.successResultOf(svc.stopService())
        self.assertIn("QMQ could not close the recording store: boom", self.messages())


class StompClient:
    """A STOMP client on one of the service's listeners' factory."""

    def __init__(self, svc: service.BrokerService) -> None:
        factory = svc.listeners[0].factory
        self.proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", next(_ports)))
        self.transport = StringTransportWithDisconnection()
        self.transport.protocol = self.proto
        self.proto.makeConnection(self.transport)
        self.parser = StompParser()
        self.send("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0"})
        [connected] = self.read()
        assert connected.command == "CONNECTED", connected

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.proto.dataReceived(encode_frame(command, headers, body, "1.2"))

    def read(self) -> list:
        data = self.transport.value()
        self.transport.clear()
        return self.parser.feed(data)

    @property
    def reading(self) -> bool:
        return self.transport.producerState == "producing"


class MemoryAlarmTests(ServiceTestCase):
    """C{limits.memory_high_watermark} becomes the broker's memory alarm."""

    def service(self, mark: str = '"256MiB"') -> service.BrokerService:
        settings = self.settings(f"[limits]\nmemory_high_watermark = {mark}\n")
        return make_service(settings, self.reactor)

    def test_built(self) -> None:
        """The mark becomes the alarm's high-water mark, the broker's alarm."""
        svc = self.service()
        alarm = svc.memory_alarm
        self.assertIsInstance(alarm, MemoryAlarm)
        self.assertIs(svc.broker.memory_alarm, alarm)
        self.assertEqual((alarm.high, alarm.low), (256 * MiB, int(256 * MiB * 0.9)))

    def test_fraction(self) -> None:
        """A fraction is of the memory given (by default, the machine's)."""
        alarm = build_memory_alarm(
            LimitSettings(memory_high_watermark=0.5), self.reactor, total=1024 * MiB
        )
        self.assertEqual(alarm.high, 512 * MiB)

    def test_bad_mark(self) -> None:
        """A mark this machine cannot use is a L{ConfigError} naming the key."""
        e = self.assertRaises(
            ConfigError,
            build_memory_alarm,
            LimitSettings(memory_high_watermark="1KiB"),
            self.reactor,
        )
        self.assertTrue(str(e).startswith("limits.memory_high_watermark: memory mark"), str(e))

    def test_off(self) -> None:
        """
        A mark of 0: the service's alarm is disabled, the broker has none,
        and starting it logs that it is off.
        """
        svc = self.service("0")
        self.assertFalse(svc.memory_alarm.enabled)
        self.assertIsNone(svc.broker.memory_alarm)
        svc.startService()
        self.assertIn(
            "Memory alarm disabled: no memory high-water mark",
            self.messages("qmq.core.alarm"),
        )
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        channel = Channel(svc.broker, svc.broker.default_vhost)
        self.assertEqual(channel.control("memory"), [("memory-alarm", "off")])
        self.successResultOf(svc.stopService())

    def test_started_and_stopped(self) -> None:
        """
        The alarm samples from start (on the service's reactor) to stop, and
        logs when it is raised and cleared; C{/control/memory} reports it.
        """
        svc = self.service()
        alarm = svc.memory_alarm
        self.assertEqual(alarm.rss, 0)
        svc.startService()
        self.assertEqual(alarm.rss, 100 * MiB)
        channel = Channel(svc.broker, svc.broker.default_vhost)
        self.rss.value = 300 * MiB
        self.reactor.advance(alarm.interval)
        self.assertTrue(alarm.active)
        self.assertEqual(
            channel.control("memory"),
            [
                ("memory-alarm", "on"),
                ("memory-rss", str(300 * MiB)),
                ("memory-high-watermark", str(256 * MiB)),
            ],
        )
        logged = self.messages("qmq.core.alarm")
        self.assertTrue(logged[-1].startswith("Memory alarm raised: RSS 300 MiB"), logged)
        self.rss.value = 200 * MiB
        self.reactor.advance(alarm.interval)
        self.assertFalse(alarm.active)
        self.assertTrue(self.messages("qmq.core.alarm")[-1].startswith("Memory alarm cleared"))
        self.successResultOf(svc.stopService())
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.rss.value = 300 * MiB
        self.reactor.advance(10)
        self.assertFalse(alarm.active)

    def test_publishers_blocked(self) -> None:
        """
        Over STOMP, through the service's own listener factory: above the
        mark a publisher is no longer read while a consumer keeps draining;
        below the low mark the publisher is read again.
        """
        svc = self.service()
        svc.startService()
        publisher, consumer = StompClient(svc), StompClient(svc)
        consumer.send("SUBSCRIBE", {"destination": "/queue/q", "id": "s"})
        self.rss.value = 300 * MiB
        self.reactor.advance(svc.memory_alarm.interval)
        publisher.send("SEND", {"destination": "/queue/q"}, b"one")
        self.assertFalse(publisher.reading)
        self.assertTrue(consumer.reading)
        self.reactor.advance(0)
        self.assertEqual([f.body for f in consumer.read()], [b"one"])
        publisher.send("SEND", {"destination": "/control/memory", "receipt": "r"})
        self.reactor.advance(0)
        [receipt] = publisher.read()
        self.assertEqual(receipt.headers["memory-alarm"], "on")
        self.rss.value = 100 * MiB
        self.reactor.advance(svc.memory_alarm.interval)
        self.assertTrue(publisher.reading)
        self.successResultOf(svc.stopService())


class LimitsTests(ServiceTestCase):
    """The C{[limits]} table reaches the core."""

    def test_topic_limits(self) -> None:
        """
        C{amq.topic} and a declared topic exchange, in every virtual host,
        refuse a pattern with more words than C{limits.max_topic_words}.
        """
        svc = make_service(
            self.settings(
                """
[limits]
max_topic_words = 4
max_routing_key_length = 20
[[vhosts."/".exchanges]]
name = "events"
type = "topic"
[[vhosts.shop.queues]]
name = "q"
"""
            ),
            self.reactor,
        )
        broker = svc.broker
        broker.default_vhost.declare_queue("q")
        for vhost, exchange in [
            (broker.default_vhost, "amq.topic"),
            (broker.default_vhost, "events"),
            (broker.vhosts["shop"], "amq.topic"),
        ]:
            vhost.bind("q", exchange, "a.b.c.d")
            e = self.assertRaises(PreconditionFailed, vhost.bind, "q", exchange, "a.b.c.d.e")
            self.assertIn("limits.max_topic_words", e.message)
            e = self.assertRaises(PreconditionFailed, vhost.bind, "q", exchange, "x" * 21)
            self.assertIn("limits.max_routing_key_length", e.message)

    def test_max_unfinished_bytes(self) -> None:
        svc = make_service(self.settings("[limits]\nmax_unfinished_bytes = 4096\n"), self.reactor)
        self.assertEqual(svc.broker.max_unfinished_bytes, 4096)
        self.assertIs(svc.broker.limits, svc.settings.limits)


class QueueDefaultsTests(ServiceTestCase):
    """Each virtual host's C{queue_defaults} apply to queues made on demand."""

    def test_embedded_defaults(self) -> None:
        """
        With the embedded default configuration, a queue a client names
        gets every default; a declared queue keeps its own arguments.
        """
        svc = make_service(
            self.settings(
                '[[vhosts."/".queues]]\nname = "declared"\n'
                'arguments = { x-max-length = 3 }\n'
            ),
            self.reactor,
        )
        vhost = svc.broker.default_vhost
        channel = Channel(svc.broker, vhost)
        policy = channel.named_queue("made").policy
        self.assertEqual(
            (
                policy.max_length,
                policy.max_bytes,
                policy.overflow,
                policy.expires,
                policy.delivery_limit,
            ),
            (1_000_000, 256 * MiB, "reject-publish", 3_600_000, 100),
        )
        declared = vhost.queues["declared"].policy
        self.assertEqual(
            (declared.max_length, declared.overflow, declared.expires),
            (3, "drop-head", None),
        )

    def test_reject_publish(self) -> None:
        """
        With C{x-overflow = "reject-publish"}, a publish past the vhost's
        C{x-max-length} is refused (a STOMP client gets an ERROR for it).
        """
        svc = make_service(
            self.settings('[vhosts."/".queue_defaults]\nx-max-length = 2\n'), self.reactor
        )
        channel = Channel(svc.broker, svc.broker.default_vhost)
        target = channel.send_target("/queue/q")
        for body in (b"1", b"2"):
            channel.publish_target(target, channel.new_message(target, None, body))
        e = self.assertRaises(
            ResourceLimit, channel.publish_target, target, channel.new_message(target, None, b"3")
        )
        self.assertIn("'q' is full (2 messages)", e.message)
        self.assertEqual(len(svc.broker.default_vhost.queues["q"]), 2)

    def test_per_vhost(self) -> None:
        """Each virtual host has its own defaults."""
        svc = make_service(
            self.settings(
                '[vhosts.shop.queue_defaults]\nx-max-length = 5\nx-overflow = "drop-head"\n'
            ),
            self.reactor,
        )
        shop = Channel(svc.broker, svc.broker.vhosts["shop"]).named_queue("q").policy
        root = Channel(svc.broker, svc.broker.default_vhost).named_queue("q").policy
        self.assertEqual((shop.max_length, shop.overflow), (5, "drop-head"))
        self.assertEqual((root.max_length, root.overflow), (1_000_000, "reject-publish"))

    def test_durable_subscription_queue(self) -> None:
        """A durable topic subscription's queue is made on demand too."""
        svc = make_service(
            self.settings('[vhosts."/".queue_defaults]\nx-max-length = 9\n'), self.reactor
        )
        svc.startService()
        client = StompClient(svc)
        client.send(
            "SUBSCRIBE",
            {"destination": "/topic/a.b", "id": "d", "durable": "true"},
        )
        [queue] = [q for name, q in svc.broker.default_vhost.queues.items() if "durable" in name]
        self.assertEqual(queue.policy.max_length, 9)
        self.successResultOf(svc.stopService())
