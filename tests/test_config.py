"""Tests for L{qmq.config}: the embedded default, layering, and every error path."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

from twisted.trial import unittest

from qmq import config
from qmq.config import (
    BindingDeclaration,
    ConfigError,
    ExchangeDeclaration,
    QueueDeclaration,
    Settings,
    VirtualHostSettings,
)
from qmq.stomp.settings import StompSettings

DOCS = Path(__file__).resolve().parent.parent / "docs"


class DefaultTests(unittest.TestCase):
    """
    The embedded default configuration.
    """

    def test_defaults(self) -> None:
        """
        Without a file, QMQ listens for STOMP on 127.0.0.1:61613 with a backlog
        of 1024 and keeps its data in ./qmq-data.
        """
        settings = config.load()
        self.assertEqual(settings.listen, ["stomp:tcp:61613:interface=127.0.0.1:backlog=1024"])
        self.assertEqual(settings.data_dir, Path("qmq-data"))
        self.assertEqual(settings.shutdown_timeout, 10.0)
        self.assertEqual(settings.vhosts, (VirtualHostSettings("/"),))
        self.assertEqual(settings.listen_source, config.DEFAULT_CONFIG_NAME)

    def test_defaultMatchesDataclasses(self) -> None:
        """
        The embedded file and the dataclasses' own defaults agree, so the
        documented defaults are the ones in force however settings are made.
        """
        self.assertEqual(config.load(), Settings())
        self.assertEqual(config.load().stomp, StompSettings())

    def test_everyStompFieldMapped(self) -> None:
        """
        Every field of L{StompSettings} has a range in L{config.STOMP_LIMITS},
        a value in the embedded default and a line in the documentation.
        """
        default = tomllib.loads(config.default_toml())
        docs = (DOCS / "configuration.rst").read_text(encoding="utf-8")
        for f in dataclasses.fields(StompSettings):
            self.assertIn(f.name, config.STOMP_LIMITS)
            self.assertIn(f.name, default["stomp"])
            self.assertIn(f"stomp.{f.name}", docs)
        self.assertEqual(
            set(config.STOMP_LIMITS), {f.name for f in dataclasses.fields(StompSettings)}
        )

    def test_everyTopKeyDocumented(self) -> None:
        """
        The documentation names every top-level key and declaration key.
        """
        docs = (DOCS / "configuration.rst").read_text(encoding="utf-8")
        for key in ("listen", "data_dir", "shutdown_timeout"):
            self.assertIn(f"``{key}``", docs)
        for key in ("exchanges", "queues", "bindings", "routing_key", "auto_delete", "arguments"):
            self.assertIn(key, docs)


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
"""
        settings = config.load_string(text, "all.toml")
        self.assertEqual(
            settings,
            Settings(
                listen=["stomp:tcp:61613"],
                data_dir=Path("/var/lib/qmq"),
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
                    ),
                    VirtualHostSettings("staging", queues=(QueueDeclaration("q", durable=False),)),
                ),
            ),
        )
        self.assertEqual(settings.vhosts[0].bindings[0].origin, 'all.toml: vhosts."/".bindings[0]')
        self.assertEqual(settings.vhosts[1].queues[0].origin, "all.toml: vhosts.staging.queues[0]")

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
            "qmq.toml: lisen: unknown key (expected one of: data_dir, listen, shutdown_timeout,"
            ' stomp, vhosts); did you mean "listen"?',
        )
        e = self.assertRaises(ConfigError, config.load_string, "[stomp]\nheartbeat = 1", "f")
        self.assertTrue(str(e).startswith("f: stomp.heartbeat: unknown key (expected one of: "))
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\ndurabel = true',
            'qmq.toml: vhosts."/".queues[0].durabel: unknown key (expected one of: arguments,'
            ' auto_delete, durable, name); did you mean "durable"?',
        )
        self.check(
            '[vhosts."/"]\nqueue = []',
            'qmq.toml: vhosts."/".queue: unknown key (expected one of: bindings, exchanges,'
            ' queues); did you mean "queues"?',
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
        }
        self.assertEqual(set(cases), set(config.STOMP_LIMITS))
        for name, (value, problem) in cases.items():
            self.check(f"[stomp]\n{name} = {value}", f"qmq.toml: stomp.{name}: {problem}")
        self.check(
            "[stomp]\nheartbeat_grace = nan",
            "qmq.toml: stomp.heartbeat_grace: expected a number >= 1.5, got nan",
        )
        self.check("stomp = 1", "qmq.toml: stomp: expected a table, got 1")

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
            '[[vhosts."/".queues]]\nname = "q"\narguments = { "x-y" = [1] }',
            'qmq.toml: vhosts."/".queues[0].arguments.x-y: expected a string, number or'
            " boolean, got an array",
        )
        self.check(
            '[[vhosts."/".queues]]\nname = "q"\nauto_delete = 1',
            'qmq.toml: vhosts."/".queues[0].auto_delete: expected true or false, got 1',
        )

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


class DescribeTests(unittest.TestCase):
    """
    Values are shown in errors the way TOML writes them.
    """

    def test_describe(self) -> None:
        self.assertEqual(config._describe(False), "false")
        self.assertEqual(config._describe('a"b'), '"a\\"b"')
        self.assertEqual(config._describe(1.5), "1.5")
        self.assertEqual(config._describe(os.sep), '"/"')
