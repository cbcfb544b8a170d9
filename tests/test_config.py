"""Tests for L{qmq.config}: the embedded default, layering, and every error path."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from twisted.trial import unittest

from qmq import config, settings_schema
from qmq.amqp.settings import AmqpSettings
from qmq.auth.settings import AuthSettings
from qmq.cluster.settings import ClusterSettings
from qmq.config import (
    BindingDeclaration,
    ConfigError,
    ExchangeDeclaration,
    QueueDeclaration,
    Settings,
    VirtualHostSettings,
)
from qmq.connections import ConnectionSettings
from qmq.core.limits import LimitSettings
from qmq.core.policy import QUEUE_ARGUMENTS
from qmq.logs import LogSettings
from qmq.stomp.settings import StompSettings
from qmq.store.settings import CommitLogSettings
from qmq.web.api.settings import ApiSettings
from qmq.web.settings import WebSettings
from qmq.web.sockjs.settings import SockJSSettings
from qmq.workers.settings import WorkerSettings

DOCS = Path(__file__).resolve().parent.parent / "docs"


def doc_rows(text: str) -> dict[str, tuple[str, str]]:
    """
    The rows of the list tables of a reStructuredText page: the key of the
    first column (without its backquotes) to the type and default columns.
    """
    rows = {}
    pattern = re.compile(
        r"^ *\* - ``(?P<key>[^`]+)``\n *- (?P<type>.*)\n *-(?: (?P<default>.*))?$", re.M
    )
    for match in pattern.finditer(text):
        rows[match["key"]] = (match["type"], match["default"] or "")
    return rows


def toml_value(text: str) -> object:
    """A TOML value as the documentation writes it, in double backquotes."""
    return tomllib.loads(f"v = {text.strip('`')}")["v"]


class DefaultTests(unittest.TestCase):
    """
    The embedded default configuration.
    """

    def test_defaults(self) -> None:
        """
        Without a file, QMQ listens for STOMP on 127.0.0.1:61613, for HTTP
        on 127.0.0.1:15674 and for AMQP on 127.0.0.1:5672 with a backlog of
        1024 and keeps its data in ./qmq-data.
        """
        settings = config.load()
        self.assertEqual(
            settings.listen,
            [
                "stomp:tcp:61613:interface=127.0.0.1:backlog=1024",
                "http:tcp:15674:interface=127.0.0.1:backlog=1024",
                "amqp:tcp:5672:interface=127.0.0.1:backlog=1024",
            ],
        )
        self.assertEqual(settings.data_dir, Path("qmq-data"))
        self.assertEqual(settings.shutdown_timeout, 10.0)
        self.assertEqual(settings.vhosts, (VirtualHostSettings("/"),))
        self.assertEqual(settings.store, "log")
        self.assertEqual(settings.listen_source, config.DEFAULT_CONFIG_NAME)

    def test_queueDefaults(self) -> None:
        """
        Queues created on demand in C{"/"} are bounded: a million messages or
        256 MiB, refusing publishes when full, deleted after an hour unused
        and empty, a message dropped after 100 deliveries.
        """
        self.assertEqual(
            config.load().vhosts[0].queue_defaults,
            {
                "x-max-length": 1_000_000,
                "x-max-length-bytes": 256 * 1024 * 1024,
                "x-overflow": "reject-publish",
                "x-expires": 3_600_000,
                "x-delivery-limit": 100,
            },
        )
        default = tomllib.loads(config.default_toml())
        self.assertEqual(default["vhosts"]["/"]["queue_defaults"], dict(config.QUEUE_DEFAULTS))
        self.assertEqual(VirtualHostSettings("x").queue_defaults, dict(config.QUEUE_DEFAULTS))

    def test_defaultMatchesDataclasses(self) -> None:
        """
        The embedded file and the dataclasses' own defaults agree, so the
        documented defaults are the ones in force however settings are made.
        """
        self.assertEqual(config.load(), Settings())
        self.assertEqual(config.load().stomp, StompSettings())
        self.assertEqual(config.load().connections, ConnectionSettings())
        self.assertEqual(config.load().limits, LimitSettings())
        for name, cls in config.SECTIONS.items():
            self.assertEqual(config.load().section(name), cls())

    def test_sections(self) -> None:
        """
        The sections of today are registered (the first four are typed attributes
        of L{Settings}); L{Settings.section} finds them by name.
        """
        self.assertEqual(
            config.SECTIONS,
            {
                "stomp": StompSettings,
                "connections": ConnectionSettings,
                "limits": LimitSettings,
                "commit_log": CommitLogSettings,
                "web": WebSettings,
                "sockjs": SockJSSettings,
                "http_api": ApiSettings,
                "auth": AuthSettings,
                "cluster": ClusterSettings,
                "log": LogSettings,
                "amqp": AmqpSettings,
                "workers": WorkerSettings,
            },
        )
        settings = config.load_string("[limits]\nmax_topic_words = 5\n")
        self.assertIs(settings.section("stomp"), settings.stomp)
        self.assertIs(settings.section("connections"), settings.connections)
        self.assertIs(settings.section("limits"), settings.limits)
        self.assertIs(settings.section("commit_log"), settings.commit_log)
        self.assertEqual(settings.limits.max_topic_words, 5)
        self.assertEqual(
            settings.other_sections,
            {
                "web": WebSettings(),
                "sockjs": SockJSSettings(),
                "http_api": ApiSettings(),
                "cluster": ClusterSettings(),
                "log": LogSettings(),
                "amqp": AmqpSettings(),
                "workers": WorkerSettings(),
            },
        )
        self.assertIs(settings.section("web"), settings.other_sections["web"])
        self.assertRaises(KeyError, settings.section, "no-such-section")

    def test_everySectionFieldMapped(self) -> None:
        """
        Every field of every section has a range derived from its dataclass,
        a value in the embedded default equal to the dataclass's own, and a
        row in the documentation that states the same range and default.
        """
        default = tomllib.loads(config.default_toml())
        rows = doc_rows((DOCS / "configuration.rst").read_text(encoding="utf-8"))
        for name, cls in config.SECTIONS.items():
            schema = settings_schema._section_schema(cls)
            fields = {f.name: f for f in dataclasses.fields(cls)}
            defaults = cls()
            self.assertEqual(set(schema), set(fields), name)
            self.assertEqual(set(default[name]), set(fields), f"[{name}] in default.toml")
            for key, f in fields.items():
                dotted = f"{name}.{key}"
                self.assertTrue(schema[key].expected, dotted)
                value = getattr(defaults, key)
                self.assertEqual(schema[key](default[name][key], dotted), value, dotted)
                self.assertIn(dotted, rows, f"{dotted} has no row in configuration.rst")
                type_column, default_column = rows[dotted]
                documented_value = toml_value(default_column)
                if isinstance(value, tuple):  # an array (tuple[str, ...] fields)
                    documented_value = tuple(documented_value)  # type: ignore[arg-type]
                self.assertEqual(documented_value, value, f"{dotted} documented")
                if "expected" not in f.metadata:
                    documented = re.sub(r"^an? ", "", schema[key].expected)
                    documented = documented.replace("true or false", "boolean")
                    self.assertIn(documented, type_column, f"{dotted}: range documented")

    def test_everyTopKeyDocumented(self) -> None:
        """
        The documentation names every top-level key, declaration key and
        queue default, with the default in force.
        """
        docs = (DOCS / "configuration.rst").read_text(encoding="utf-8")
        rows = doc_rows(docs)
        for key in ("listen", "data_dir", "store", "shutdown_timeout", *config.SECTIONS):
            self.assertIn(f"``{key}``", docs, key)
        for key in ("exchanges", "queues", "bindings", "routing_key", "auto_delete", "arguments"):
            self.assertIn(key, docs)
        self.assertEqual(toml_value(rows["store"][1]), "log")
        for key, value in config.QUEUE_DEFAULTS.items():
            self.assertIn(key, rows)
            self.assertEqual(toml_value(rows[key][1]), value, key)


class LayeringTests(unittest.TestCase):
    """
    A user's file is layered over the embedded default.
    """

    def test_tablesMerge(self) -> None:
        """
        A key set in a table replaces that key only; the rest of the table keeps
        its defaults.
        """
        settings = config.load_string("[stomp]\nheartbeat_grace = 2\n")
        self.assertEqual(settings.stomp.heartbeat_grace, 2.0)
        self.assertIsInstance(settings.stomp.heartbeat_grace, float)
        self.assertEqual(settings.stomp.max_body_size, StompSettings().max_body_size)
        self.assertEqual(settings.listen, Settings().listen)

    def test_arraysReplace(self) -> None:
        """
        An array (C{listen}) is replaced whole, and its source is recorded.
        """
        settings = config.load_string('listen = ["stomp:tcp:0", "stomp:unix:/tmp/q"]', "my.toml")
        self.assertEqual(settings.listen, ["stomp:tcp:0", "stomp:unix:/tmp/q"])
        self.assertEqual(settings.listen_source, "my.toml")

    def test_everything(self) -> None:
        """
        Every key of the file format becomes typed settings.
        """
        text = """
listen = ["stomp:tcp:61613"]
data_dir = "/var/lib/qmq"
store = "log"
shutdown_timeout = 3

[stomp]
max_body_size = 1024
max_headers = 10
max_header_line = 100
max_header_block = 1000
heartbeat_send_ms = 0
heartbeat_receive_ms = 5000
heartbeat_grace = 3.0
default_prefetch = 7
strict_vhost = true
connect_timeout = 2
topic_backlog = 0
idle_timeout = 0
frame_timeout = 5
max_subscriptions = 1
max_subscription_id = 9
max_transactions = 2
max_transaction_frames = 3
max_transaction_bytes = 4

[connections]
max_per_listener = 5
max_per_address = 6
handshake_timeout = 7
close_grace = 0.5

[limits]
memory_high_watermark = "512MiB"
max_topic_words = 8
max_routing_key_length = 9
max_unfinished_bytes = 0

[commit_log]
fsync = "never"
fsync_interval_ms = 7
segment_size = 8192
compact_ratio = 0.5

[vhosts."/".queue_defaults]
x-overflow = "drop-head"
x-max-length = 0

[[vhosts."/".exchanges]]
name = "events"
type = "fanout"
durable = false

[[vhosts."/".queues]]
name = "orders"
auto_delete = true
arguments = { "x-max-length" = 1000 }

[[vhosts."/".bindings]]
queue = "orders"
exchange = "events"
routing_key = "a.b"
arguments = { "x-match" = "all", level = 3 }

[vhosts.staging]
queues = [{ name = "q", durable = false }]
queue_defaults = { x-expires = 1, x-delivery-limit = 1 }
"""
        settings = config.load_string(text, "all.toml")
        self.assertEqual(
            settings,
            Settings(
                listen=["stomp:tcp:61613"],
                data_dir=Path("/var/lib/qmq"),
                store="log",
                shutdown_timeout=3.0,
                stomp=StompSettings(
                    max_body_size=1024,
                    max_headers=10,
                    max_header_line=100,
                    max_header_block=1000,
                    heartbeat_send_ms=0,
                    heartbeat_receive_ms=5000,
                    heartbeat_grace=3.0,
                    default_prefetch=7,
                    strict_vhost=True,
                    connect_timeout=2.0,
                    topic_backlog=0,
                    idle_timeout=0.0,
                    frame_timeout=5.0,
                    max_subscriptions=1,
                    max_subscription_id=9,
                    max_transactions=2,
                    max_transaction_frames=3,
                    max_transaction_bytes=4,
                ),
                connections=ConnectionSettings(
                    max_per_listener=5,
                    max_per_address=6,
                    handshake_timeout=7.0,
                    close_grace=0.5,
                ),
                limits=LimitSettings(
                    memory_high_watermark="512MiB",
                    max_topic_words=8,
                    max_routing_key_length=9,
                    max_unfinished_bytes=0,
                ),
                commit_log=CommitLogSettings(
                    fsync="never", fsync_interval_ms=7, segment_size=8192, compact_ratio=0.5
                ),
                vhosts=(
                    VirtualHostSettings(
                        "/",
                        exchanges=(ExchangeDeclaration("events", "fanout", durable=False),),
                        queues=(
                            QueueDeclaration(
                                "orders", auto_delete=True, arguments={"x-max-length": 1000}
                            ),
                        ),
                        bindings=(
                            BindingDeclaration(
                                "orders", "events", "a.b", {"x-match": "all", "level": 3}
                            ),
                        ),
                        queue_defaults={
                            **config.QUEUE_DEFAULTS,
                            "x-overflow": "drop-head",
                            "x-max-length": 0,
                        },
                    ),
                    VirtualHostSettings(
                        "staging",
                        queues=(QueueDeclaration("q", durable=False),),
                        queue_defaults={
                            **config.QUEUE_DEFAULTS,
                            "x-expires": 1,
                            "x-delivery-limit": 1,
                        },
                    ),
                ),
            ),
        )
        self.assertEqual(settings.vhosts[0].bindings[0].origin, 'all.toml: vhosts."/".bindings[0]')
        self.assertEqual(settings.vhosts[1].queues[0].origin, "all.toml: vhosts.staging.queues[0]")

    def test_queueDefaultsPerVirtualHost(self) -> None:
        """
        A virtual host declared without a C{queue_defaults} table gets the
        built-in defaults, not what the file sets for C{"/"}; a table that
        sets some keys replaces those keys only.
        """
        settings = config.load_string(
            '[vhosts."/".queue_defaults]\nx-max-length = 5\n[vhosts.shop]\n'
            '[vhosts.eu.queue_defaults]\nx-overflow = "drop-head"\n'
        )
        queue_defaults = {vhost.name: vhost.queue_defaults for vhost in settings.vhosts}
        self.assertEqual(queue_defaults["/"], {**config.QUEUE_DEFAULTS, "x-max-length": 5})
        self.assertEqual(queue_defaults["shop"], dict(config.QUEUE_DEFAULTS))
        self.assertEqual(queue_defaults["eu"], {**config.QUEUE_DEFAULTS, "x-overflow": "drop-head"})
        # Each virtual host has its own copy.
        self.assertIsNot(queue_defaults["shop"], queue_defaults["eu"])

    def test_loadFile(self) -> None:
        """
        L{config.load} reads a file and names errors after the path as given.
        """
        path = Path(self.mktemp())
        path.write_text('data_dir = "elsewhere"\n', encoding="utf-8")
        self.assertEqual(config.load(path).data_dir, Path("elsewhere"))
        path.write_text("[stomp]\nheartbeat_grace = 1\n", encoding="utf-8")
        e = self.assertRaises(ConfigError, config.load, str(path))
        self.assertEqual(str(e), f"{path}: stomp.heartbeat_grace: expected a number >= 1.5, got 1")
        self.assertEqual((e.source, e.key), (str(path), "stomp.heartbeat_grace"))

    def test_overrides(self) -> None:
        """
        C{--listen} replaces the listeners, C{--data-dir} the data directory.
        """
        settings = config.with_overrides(
            config.load(), listen=["stomp:tcp:1", "stomp:tcp:2"], data_dir="d"
        )
        self.assertEqual(settings.listen, ["stomp:tcp:1", "stomp:tcp:2"])
        self.assertEqual(settings.listen_source, "--listen")
        self.assertEqual(settings.data_dir, Path("d"))
        self.assertEqual(config.with_overrides(config.load(), listen=[]), config.load())

    def test_overrideErrors(self) -> None:
        """
        A malformed override names the option.
        """
        e = self.assertRaises(ConfigError, config.with_overrides, config.load(), listen=["tcp"])
        self.assertEqual(
            str(e), '--listen: expected PROTOCOL:ENDPOINT (e.g. "stomp:tcp:61613"), got "tcp"'
        )
        e = self.assertRaises(ConfigError, config.with_overrides, config.load(), data_dir="")
        self.assertEqual(
            str(e), '--data-dir: expected a directory name (a non-empty string), got ""'
        )


class ErrorTests(unittest.TestCase):
    """
    Every error names the file, the key and what was expected.
    """

    def check(self, text: str, message: str) -> None:
        e = self.assertRaises(ConfigError, config.load_string, text, "qmq.toml")
        self.assertEqual(str(e), message)

    def test_example(self) -> None:
        """
        The example in the documentation.
        """
        self.check(
            '[stomp]\nheartbeat_grace = "x"',
            'qmq.toml: stomp.heartbeat_grace: expected a number >= 1.5, got "x"',
        )
        self.check(
            'stomp.heartbeat_grace = "x"',
            'qmq.toml: stomp.heartbeat_grace: expected a number >= 1.5, got "x"',
        )

    def test_missingFile(self) -> None:
        """
        A file that cannot be read.
        """
        e = self.assertRaises(ConfigError, config.load, "does-not-exist.toml")
        self.assertEqual(
            str(e), "does-not-exist.toml: cannot read the file: No such file or directory"
        )

    def test_notUTF8(self) -> None:
        """
        A file that is not UTF-8.
        """
        path = Path(self.mktemp())
        path.write_bytes(b"data_dir = '\xff'\n")
        e = self.assertRaises(ConfigError, config.load, path)
        self.assertEqual(str(e), f"{path}: not UTF-8 text (byte 12)")

    def test_syntax(self) -> None:
        """
        A TOML syntax error names the line.
        """
        self.check(
            'data_dir = "a"\nlisten = [1,\n\n  oops]\n',
            "qmq.toml: line 4, column 3: invalid TOML: Invalid value",
        )
        self.check("x = ", "qmq.toml: at end of file: invalid TOML: Invalid value")

    def test_unknownKeys(self) -> None:
        """
        Unknown keys are errors, at every level, with a hint for a typo.
        """
        self.check(
            'lisen = ["stomp:tcp:1"]',
            "qmq.toml: lisen: unknown key (expected one of: amqp, auth, cluster, commit_log, connections, data_dir,"
            " http_api, limits, listen, log, shutdown_timeout, sockjs, stomp, store, users, vhosts, web, workers);"
            " did you"
            ' mean "listen"?',
        )
        self.check(
            "[limits]\nmax_topic_word = 1",
            "qmq.toml: limits.max_topic_word: unknown key (expected one of: disk_free_limit, max_routing_key_length,"
            " max_topic_words, max_unfinished_bytes, memory_high_watermark);"
            ' did you mean "max_topic_words"?',
        )
        e = self.assertRaises(ConfigError, config.load_string, "[stomp]\nheartbeat = 1", "f")
        self.assertTrue(str(e).startswith("f: stomp.heartbeat: unknown key (expected one of: "))
        # Removed keys say so, and what replaced them.
        for key in ("max_delay", "max_delayed"):
            e = self.assertRaises(ConfigError, config.load_string, f"[http_api]\n{key} = 1", "f")
            self.assertIn(f"f: http_api.{key}: unknown key", str(e))
            self.assertIn("; removed: ", str(e))
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\ndurabel = true',
            'qmq.toml: vhosts."/".queues[0].durabel: unknown key (expected one of: arguments,'
            ' auto_delete, durable, name); did you mean "durable"?',
        )
        self.check(
            '[vhosts."/"]\nqueue = []',
            'qmq.toml: vhosts."/".queue: unknown key (expected one of: allow_create, bindings,'
            ' exchanges, fsync, permissions, queue_defaults, queues, tokens); did you mean "queues"?',
        )
        self.check(
            '[vhosts."/".queue_defaults]\nx-max-len = 1',
            'qmq.toml: vhosts."/".queue_defaults.x-max-len: unknown key (expected one of: '
            + ", ".join(sorted(QUEUE_ARGUMENTS))
            + '); did you mean "x-max-length"?',
        )

    def test_stompRanges(self) -> None:
        """
        Each STOMP setting checks its type and range.
        """
        cases = {
            "max_body_size": ("0", "expected an integer >= 1, got 0"),
            "max_headers": ("1.5", "expected an integer >= 1, got 1.5"),
            "max_header_line": ('"8k"', 'expected an integer >= 1, got "8k"'),
            "max_header_block": ("true", "expected an integer >= 1, got true"),
            "heartbeat_send_ms": ("-1", "expected an integer >= 0, got -1"),
            "heartbeat_receive_ms": ("[]", "expected an integer >= 0, got an array"),
            "heartbeat_grace": ("1.4", "expected a number >= 1.5, got 1.4"),
            "default_prefetch": ("0", "expected an integer >= 1, got 0"),
            "strict_vhost": ('"yes"', 'expected true or false, got "yes"'),
            "connect_timeout": ("0", "expected a number > 0, got 0"),
            "topic_backlog": ("-1", "expected an integer >= 0, got -1"),
            "idle_timeout": ("-0.5", "expected a number >= 0, got -0.5"),
            "frame_timeout": ('"2m"', 'expected a number >= 0, got "2m"'),
            "max_subscriptions": ("-1", "expected an integer >= 0, got -1"),
            "max_subscription_id": ("0", "expected an integer >= 1, got 0"),
            "max_transactions": ("1.0", "expected an integer >= 0, got 1.0"),
            "max_transaction_frames": ("-1", "expected an integer >= 0, got -1"),
            "max_transaction_bytes": ("{}", "expected an integer >= 0, got a table"),
        }
        self.assertEqual(set(cases), {f.name for f in dataclasses.fields(StompSettings)})
        for name, (value, problem) in cases.items():
            self.check(f"[stomp]\n{name} = {value}", f"qmq.toml: stomp.{name}: {problem}")
        self.check(
            "[stomp]\nheartbeat_grace = nan",
            "qmq.toml: stomp.heartbeat_grace: expected a number >= 1.5, got nan",
        )
        self.check("stomp = 1", "qmq.toml: stomp: expected a table, got 1")

    def test_connectionRanges(self) -> None:
        """
        Each C{[connections]} setting checks its type and range.
        """
        cases = {
            "max_per_listener": ("-1", "expected an integer >= 0, got -1"),
            "max_per_address": ('"many"', 'expected an integer >= 0, got "many"'),
            "handshake_timeout": ("0", "expected a number > 0, got 0"),
            "close_grace": ("-1", "expected a number > 0, got -1"),
        }
        self.assertEqual(set(cases), {f.name for f in dataclasses.fields(ConnectionSettings)})
        for name, (value, problem) in cases.items():
            self.check(
                f"[connections]\n{name} = {value}", f"qmq.toml: connections.{name}: {problem}"
            )

    def test_limitRanges(self) -> None:
        """
        Each C{[limits]} setting checks its type and range.
        """
        mark = 'expected a fraction of memory (0 < f <= 1), a size such as "512MiB", or 0, got true'
        cases = {
            "memory_high_watermark": ("true", mark),
            "disk_free_limit": (
                '"lots"',
                "disk free limit 'lots': expected a size (bytes as an integer, or a string like "
                "'50MB', '1GiB'), a fraction of the filesystem's size (0 < f < 1, like 0.05, or a "
                "string like '5%'), or 0 / 'off' to disable",
            ),
            "max_topic_words": ("0", "expected an integer >= 1, got 0"),
            "max_routing_key_length": ("0", "expected an integer >= 1, got 0"),
            "max_unfinished_bytes": ("-1", "expected an integer >= 0, got -1"),
        }
        self.assertEqual(set(cases), {f.name for f in dataclasses.fields(LimitSettings)})
        for name, (value, problem) in cases.items():
            self.check(f"[limits]\n{name} = {value}", f"qmq.toml: limits.{name}: {problem}")

    def test_memoryHighWatermark(self) -> None:
        """
        The memory high-water mark is kept as written: a fraction of memory,
        a size, or 0 (off).  Whatever the memory alarm cannot parse is an
        error with the alarm's own explanation.
        """
        from qmq.core.alarm import parse_memory_mark, total_memory

        for text, value in (
            ("0.5", 0.5),
            ("0", 0),
            ("2147483648", 2147483648),
            ('"512MiB"', "512MiB"),
            ('"40%"', "40%"),
        ):
            settings = config.load_string(f"[limits]\nmemory_high_watermark = {text}")
            self.assertEqual(settings.limits.memory_high_watermark, value)
            self.assertIs(type(settings.limits.memory_high_watermark), type(value))
        for text, value in (("1.5", 1.5), ("1", 1), ('"lots"', "lots"), ('"-1GB"', "-1GB")):
            try:
                parse_memory_mark(value, total_memory())
            except ValueError as e:
                problem = str(e)
            else:
                self.fail(f"the memory alarm accepts {value!r}")
            self.check(
                f"[limits]\nmemory_high_watermark = {text}",
                f"qmq.toml: limits.memory_high_watermark: {problem}",
            )

    def test_store(self) -> None:
        """
        C{store} names a message store: C{"memory"} or C{"log"}.  A
        C{[store]} table is refused with a pointer to C{[commit_log]}, and
        TOML itself refuses C{store = "log"} with a C{[store]} table.
        """
        self.assertEqual(config.load_string('store = "memory"').store, "memory")
        self.assertEqual(config.load_string('store = "log"').store, "log")
        self.check('store = "disk"', 'qmq.toml: store: expected one of memory, log, got "disk"')
        self.check("store = 1", "qmq.toml: store: expected one of memory, log, got 1")
        self.check(
            '[store]\nfsync = "always"\n',
            "qmq.toml: store: expected one of memory, log, got a table (the commit log's"
            " settings are the [commit_log] table)",
        )
        e = self.assertRaises(
            ConfigError, config.load_string, 'store = "log"\n[store]\nfsync = "always"\n', "q"
        )
        self.assertIn("invalid TOML", str(e))

    def test_commitLog(self) -> None:
        """
        The C{[commit_log]} table: the fsync policy, its interval, the
        segment size and the compaction ratio, merged over the defaults.
        """
        self.assertEqual(
            config.load().commit_log,
            CommitLogSettings("always", 100, 64 * 1024 * 1024, 0.25),
        )
        settings = config.load_string(
            'store = "log"\n[commit_log]\nfsync = "interval"\nfsync_interval_ms = 5\n'
            "segment_size = 4096\ncompact_ratio = 1\n"
        )
        self.assertEqual(settings.commit_log, CommitLogSettings("interval", 5, 4096, 1.0))
        self.assertIs(type(settings.commit_log.compact_ratio), float)
        settings = config.load_string("[commit_log]\ncompact_ratio = 0\n")
        self.assertEqual(settings.commit_log, CommitLogSettings(compact_ratio=0.0))

    def test_commitLogRanges(self) -> None:
        """
        Each C{[commit_log]} setting checks its type and range; the fsync
        policies are the store's own.
        """
        from qmq.store.log import FSYNC_POLICIES
        from qmq.store.settings import FSYNC_POLICIES as SETTINGS_POLICIES

        self.assertEqual(SETTINGS_POLICIES, FSYNC_POLICIES)
        policies = '"always", "interval" or "never"'
        cases = {
            "fsync": ('"sometimes"', f'expected {policies}, got "sometimes"'),
            "fsync_interval_ms": ("0", "expected an integer >= 1, got 0"),
            "segment_size": ("4095", "expected an integer >= 4096, got 4095"),
            "compact_ratio": ("1.5", "expected a number from 0 to 1, got 1.5"),
            "backlog_memory": ("-1", "expected an integer >= 0, got -1"),
        }
        self.assertEqual(set(cases), {f.name for f in dataclasses.fields(CommitLogSettings)})
        for name, (value, problem) in cases.items():
            self.check(
                f"[commit_log]\n{name} = {value}", f"qmq.toml: commit_log.{name}: {problem}"
            )
        for text, problem in (
            ("fsync = true", f"expected {policies}, got true"),
            ("fsync_interval_ms = 1.5", "expected an integer >= 1, got 1.5"),
            ('segment_size = "64MiB"', 'expected an integer >= 4096, got "64MiB"'),
            ("compact_ratio = -0.1", "expected a number from 0 to 1, got -0.1"),
        ):
            name = text.partition(" ")[0]
            self.check(
                f"[commit_log]\n{text}", f"qmq.toml: commit_log.{name}: {problem}"
            )

    def test_queueDefaults(self) -> None:
        """
        C{queue_defaults} takes the core's queue argument names, each checked.
        """
        cases = {
            "x-max-length": ("-1", "expected an integer >= 0, got -1"),
            "x-max-length-bytes": ('"1GB"', 'expected an integer >= 0, got "1GB"'),
            "x-overflow": (
                '"drop-tail"',
                'expected one of drop-head, reject-publish, got "drop-tail"',
            ),
            "x-expires": ("0", "expected an integer >= 1, got 0"),
            "x-delivery-limit": ("-2", "expected an integer >= -1, got -2"),
            "x-max-priority": ("256", "expected an integer from 1 to 255 (above 9 counts as 9), got 256"),
            "message-ttl": ("-1", "expected an integer >= 0, got -1"),
            "x-dead-letter-exchange": ("1", "expected an exchange name, got 1"),
            "x-redelivery-backoff": ("[-1]", "expected a list of delays in milliseconds, got an array"),
        }
        self.assertLessEqual(set(config.QUEUE_DEFAULTS), set(cases))
        for name, (value, problem) in cases.items():
            self.check(
                f"[vhosts.shop.queue_defaults]\n{name} = {value}",
                f"qmq.toml: vhosts.shop.queue_defaults.{name}: {problem}",
            )
        self.check(
            '[vhosts."/"]\nqueue_defaults = 1',
            'qmq.toml: vhosts."/".queue_defaults: expected a table, got 1',
        )

    def test_topLevel(self) -> None:
        """
        C{listen}, C{data_dir} and C{shutdown_timeout}.
        """
        expected = "expected a non-empty array of PROTOCOL:ENDPOINT strings"
        self.check('listen = "stomp:tcp:1"', f'qmq.toml: listen: {expected}, got "stomp:tcp:1"')
        self.check("listen = []", f"qmq.toml: listen: {expected}, got an array")
        for spec in ('"tcp"', '":tcp:1"', '"stomp:"', "3"):
            e = self.assertRaises(
                ConfigError, config.load_string, f'listen = ["stomp:tcp:1", {spec}]', "qmq.toml"
            )
            self.assertIn("qmq.toml: listen[1]: expected PROTOCOL:ENDPOINT", str(e))
        self.check(
            "data_dir = 1",
            "qmq.toml: data_dir: expected a directory name (a non-empty string), got 1",
        )
        self.check(
            "shutdown_timeout = -1", "qmq.toml: shutdown_timeout: expected a number > 0, got -1"
        )
        self.check(
            "shutdown_timeout = 2024-01-01",
            "qmq.toml: shutdown_timeout: expected a number > 0, got a date",
        )

    def test_vhosts(self) -> None:
        """
        Virtual hosts and their declarations.
        """
        self.check(
            "vhosts = []",
            'qmq.toml: vhosts: expected a table of virtual hosts (e.g. [vhosts."/"]), got an array',
        )
        self.check('vhosts."/" = 1', 'qmq.toml: vhosts."/": expected a table, got 1')
        self.check('[vhosts.""]', 'qmq.toml: vhosts."": a virtual host needs a non-empty name')
        self.check(
            '[vhosts."/"]\nexchanges = {}',
            'qmq.toml: vhosts."/".exchanges: expected an array of tables, got a table',
        )
        self.check(
            '[vhosts."/"]\nexchanges = [1]',
            'qmq.toml: vhosts."/".exchanges[0]: expected a table, got 1',
        )

    def test_exchanges(self) -> None:
        """
        An exchange needs a name and one of the four types.
        """
        self.check(
            '[[vhosts."/".exchanges]]\ntype = "topic"',
            'qmq.toml: vhosts."/".exchanges[0]: missing key "name" (expected a non-empty string)',
        )
        self.check(
            '[[vhosts."/".exchanges]]\nname = "e"',
            'qmq.toml: vhosts."/".exchanges[0]: missing key "type"'
            " (expected one of direct, fanout, topic, headers)",
        )
        self.check(
            '[[vhosts."/".exchanges]]\nname = "e"\ntype = "Topic"',
            'qmq.toml: vhosts."/".exchanges[0].type: expected one of direct, fanout, topic,'
            ' headers, got "Topic"',
        )
        self.check(
            '[[vhosts."/".exchanges]]\nname = ""\ntype = "topic"',
            'qmq.toml: vhosts."/".exchanges[0].name: expected a non-empty string, got ""',
        )
        self.check(
            '[[vhosts."/".exchanges]]\nname = "e"\ntype = "topic"\ndurable = "no"',
            'qmq.toml: vhosts."/".exchanges[0].durable: expected true or false, got "no"',
        )
        self.check(
            '[[vhosts."/".exchanges]]\nname = "e"\ntype = "topic"\n'
            '[[vhosts."/".exchanges]]\nname = "e"\ntype = "direct"',
            'qmq.toml: vhosts."/".exchanges[1].name: "e" is declared twice',
        )

    def test_queues(self) -> None:
        """
        A queue needs a name; its arguments are scalars.
        """
        self.check(
            '[[vhosts."/".queues]]\ndurable = true',
            'qmq.toml: vhosts."/".queues[0]: missing key "name" (expected a non-empty string)',
        )
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\narguments = 1',
            'qmq.toml: vhosts."/".queues[0].arguments: expected a table of arguments, got 1',
        )
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\narguments = { "x-max-length" = [1] }',
            'qmq.toml: vhosts."/".queues[0].arguments.x-max-length: expected an integer >= 0,'
            " got an array",
        )
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\nauto_delete = 1',
            'qmq.toml: vhosts."/".queues[0].auto_delete: expected true or false, got 1',
        )

    def test_queueArguments(self) -> None:
        """
        A declared queue's arguments are the core's, checked by the core when
        the file is loaded: an unknown one or a bad value names the file and
        the argument.
        """
        e = self.assertRaises(
            ConfigError,
            config.load_string,
            '[[vhosts."/".queues]]\nname = "q"\narguments = { x-max-lenght = 5 }',
            "qmq.toml",
        )
        self.assertTrue(
            str(e).startswith(
                'qmq.toml: vhosts."/".queues[0].arguments.x-max-lenght: unknown key (expected'
                " one of: x-ack-timeout, "
            ),
            str(e),
        )
        self.assertIn('did you mean "x-max-length"?', str(e))
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\narguments = { x-max-length = -1 }',
            'qmq.toml: vhosts."/".queues[0].arguments.x-max-length: expected an integer >= 0,'
            " got -1",
        )
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\narguments = { x-overflow = "drop-tail" }',
            'qmq.toml: vhosts."/".queues[0].arguments.x-overflow: expected one of drop-head,'
            ' reject-publish, got "drop-tail"',
        )
        settings = config.load_string(
            '[[vhosts."/".queues]]\nname = "q"\n'
            'arguments = { max-length = 5, x-redelivery-backoff = [10, 20] }'
        )
        self.assertEqual(
            settings.vhosts[0].queues[0].arguments,
            {"x-max-length": 5, "x-redelivery-backoff": [10, 20]},
        )

    def test_allowCreate(self) -> None:
        """
        allow_create is a boolean per virtual host, true unless set.
        """
        self.check(
            '[vhosts."/"]\nallow_create = "no"',
            'qmq.toml: vhosts."/".allow_create: expected true or false, got "no"',
        )
        settings = config.load_string('[vhosts."/"]\nallow_create = false\n[vhosts.b]\n')
        self.assertEqual([v.allow_create for v in settings.vhosts], [False, True])

    def test_bindings(self) -> None:
        """
        A binding needs a queue and an exchange.
        """
        self.check(
            '[[vhosts."/".bindings]]\nexchange = "e"',
            'qmq.toml: vhosts."/".bindings[0]: missing key "queue" (expected a non-empty string)',
        )
        self.check(
            '[[vhosts."/".bindings]]\nqueue = "q"',
            'qmq.toml: vhosts."/".bindings[0]: missing key "exchange" (expected a string)',
        )
        self.check(
            '[[vhosts."/".bindings]]\nqueue = "q"\nexchange = "e"\nrouting_key = 1',
            'qmq.toml: vhosts."/".bindings[0].routing_key: expected a string, got 1',
        )
        self.check(
            '[[vhosts."/".bindings]]\nqueue = "q"\nexchange = "e"\narguments = { a = {} }',
            'qmq.toml: vhosts."/".bindings[0].arguments.a: expected a string, number or boolean,'
            " got a table",
        )

    def test_defaultErrorsNameTheDefault(self) -> None:
        """
        Were the embedded default broken, its errors would name it.
        """
        self.patch(config, "default_toml", lambda: "data_dir = 3")
        e = self.assertRaises(ConfigError, config.load)
        self.assertEqual(
            str(e),
            "qmq/default.toml: data_dir: expected a directory name (a non-empty string), got 3",
        )


def _even(value: int) -> int:
    if value % 2:
        raise ValueError(f"{value} is odd: the widget count must be even")
    return value // 2


@dataclass(frozen=True)
class WidgetSettings:
    """A section as a new frontend would add it."""

    count: int = field(default=4, metadata={"parse": _even})
    ratio: float | str = field(default=0.5, metadata={"min": 0})
    mode: str = field(default="fast", metadata={"choices": ("fast", "safe")})
    name: str = "w"
    enabled: bool = True
    retries: int = 3
    delay: float = 1.0
    share: float = field(default=0.5, metadata={"min": 0, "max": 1})
    level: int = field(default=1, metadata={"above": 0, "max": 9})
    cap: int = field(default=5, metadata={"max": 10})


class SectionTests(unittest.TestCase):
    """
    A section's schema is derived from its dataclass: a new frontend adds
    its dataclass to L{config.SECTIONS} and nothing else.
    """

    def setUp(self) -> None:
        self.patch(config, "SECTIONS", {**config.SECTIONS, "widget": WidgetSettings})

    def check(self, text: str, message: str) -> None:
        e = self.assertRaises(ConfigError, config.load_string, text, "qmq.toml")
        self.assertEqual(str(e), message)

    def test_registered(self) -> None:
        """
        A registered section is read from its table, merged over the
        dataclass's defaults, and found with L{Settings.section}.
        """
        settings = config.load_string(
            '[widget]\ncount = 6\nratio = "auto"\nmode = "safe"\nenabled = false\ndelay = 2\n'
        )
        self.assertEqual(
            settings.section("widget"),
            WidgetSettings(count=3, ratio="auto", mode="safe", enabled=False, delay=2.0),
        )
        self.assertEqual(settings.other_sections["widget"], settings.section("widget"))
        self.assertEqual(config.load().section("widget"), WidgetSettings())
        self.assertEqual(config.load(), Settings())
        self.assertEqual(Settings().section("widget"), WidgetSettings())

    def test_errors(self) -> None:
        """
        Types from the annotations, ranges from the metadata, a type-only
        field that is a number must not be negative, and a C{parse}
        callable's L{ValueError} is the problem.
        """
        cases = {
            "count": ("3", "3 is odd: the widget count must be even"),
            "ratio": ("-1", "expected a number >= 0 or a string, got -1"),
            "mode": ('"slow"', 'expected one of fast, safe, got "slow"'),
            "name": ("1", "expected a string, got 1"),
            "enabled": ("1", "expected true or false, got 1"),
            "retries": ("-1", "expected an integer >= 0, got -1"),
            "delay": ("0", "expected a number > 0, got 0"),
            "share": ("1.01", "expected a number from 0 to 1, got 1.01"),
            "level": ("10", "expected an integer > 0 and <= 9, got 10"),
            "cap": ("11", "expected an integer from 0 to 10, got 11"),
        }
        for name, (value, problem) in cases.items():
            self.check(f"[widget]\n{name} = {value}", f"qmq.toml: widget.{name}: {problem}")
        self.check(
            "[widget]\nratios = 1",
            "qmq.toml: widget.ratios: unknown key (expected one of: cap, count, delay, enabled,"
            ' level, mode, name, ratio, retries, share); did you mean "ratio"?',
        )

    def test_unmappable(self) -> None:
        """
        A field this module cannot check is a programming error, raised the
        first time the section is used.
        """

        @dataclass(frozen=True)
        class Listy:
            items: list = field(default_factory=list)

        @dataclass(frozen=True)
        class Misspelt:
            count: int = field(default=1, metadata={"minimum": 1})

        @dataclass(frozen=True)
        class NoDefault:
            count: int

        for cls, message in (
            (Listy, "cannot map"),
            (Misspelt, "unknown metadata ['minimum']"),
            (NoDefault, "needs a default"),
        ):
            self.patch(config, "SECTIONS", {**config.SECTIONS, "bad": cls})
            e = self.assertRaises(TypeError, config.load)
            self.assertIn(message, str(e))

    def test_hidesTopLevelKey(self) -> None:
        """
        A section cannot take the name of a top-level key.
        """
        self.patch(config, "SECTIONS", {**config.SECTIONS, "listen": WidgetSettings})
        self.assertRaises(TypeError, config.load)


class DescribeTests(unittest.TestCase):
    """
    Values are shown in errors the way TOML writes them.
    """

    def test_describe(self) -> None:
        self.assertEqual(settings_schema._describe(False), "false")
        self.assertEqual(settings_schema._describe('a"b'), '"a\\"b"')
        self.assertEqual(settings_schema._describe(1.5), "1.5")
        self.assertEqual(settings_schema._describe(os.sep), '"/"')
