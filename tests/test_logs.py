"""Tests for L{qmq.logs}: the log's level and format, Twisted's start-up
lines kept out, one format for peers, and how twistd is handed the
observer (L{qmq.tap})."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

from twisted.application.service import Application
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.logger import ILogObserver, LogLevel, formatEvent
from twisted.python import usage
from twisted.test.proto_helpers import StringTransport
from twisted.trial import unittest

from qmq import config, logs, tap
from qmq.logs import (
    LogSettings,
    file_observer,
    filtered,
    is_noise,
    observer_for_twistd,
    peer_address,
)


def event(text: str, level: LogLevel = LogLevel.info, **fields: Any) -> dict[str, Any]:
    return {"log_format": text, "log_level": level, "log_namespace": "qmq.test", "log_time": 0.0, **fields}


def legacy(text: str) -> dict[str, Any]:
    """An event as C{twisted.python.log.msg(text)} makes it."""
    return {
        "message": (text,), "isError": 0, "system": "-", "log_format": "{log_text}",
        "log_text": text, "log_level": LogLevel.info, "log_namespace": "log_legacy",
        "log_system": "-", "log_time": 0.0,
    }


class PeerAddressTests(unittest.TestCase):
    """L{peer_address}: the one way a peer is written in the log."""

    def test_formats(self) -> None:
        self.assertEqual(peer_address(IPv4Address("TCP", "127.0.0.1", 5555)), "127.0.0.1:5555")
        self.assertEqual(peer_address(IPv6Address("TCP", "::1", 5555)), "[::1]:5555")
        self.assertEqual(peer_address(UNIXAddress(b"/run/qmq.sock")), "/run/qmq.sock")
        self.assertEqual(peer_address(UNIXAddress(None)), "unix")
        self.assertEqual(peer_address(None), "?")

    def test_transport(self) -> None:
        transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.7", 40000))
        self.assertEqual(logs.transport_peer(transport), "10.0.0.7:40000")
        self.assertEqual(logs.transport_peer(object()), "?")


class FilterTests(unittest.TestCase):
    """L{filtered}: the level, and Twisted's chatter as debug events."""

    def kept(self, level: str, *events: dict[str, Any]) -> list[str]:
        seen: list[dict[str, Any]] = []
        observer = filtered(seen.append, LogSettings(level=level))
        for e in events:
            observer(e)
        return [formatEvent(e) for e in seen]

    def test_level(self) -> None:
        events = [event("d", LogLevel.debug), event("i"), event("w", LogLevel.warn), event("e", LogLevel.error)]
        self.assertEqual(self.kept("info", *events), ["i", "w", "e"])
        self.assertEqual(self.kept("warn", *events), ["w", "e"])
        self.assertEqual(self.kept("debug", *events), ["d", "i", "w", "e"])

    def test_noise(self) -> None:
        """
        The lines Twisted logs as a listener starts and stops are kept out
        unless the level is debug; lines that merely look alike are kept.
        """
        noise = [
            legacy("StompFactory starting on 61613"),
            legacy("QMQSite (HttpFactory) starting on 15674"),
            legacy("(TCP Port 61613 Closed)"),
            legacy("(UNIX Port /run/qmq.sock Closed)"),
            event("Starting factory {factory!r}", factory=object()),
            event("Stopping factory {factory!r}", factory=object()),
        ]
        for e in noise:
            self.assertTrue(is_noise(e), e)
        self.assertEqual(self.kept("info", *noise), [])
        self.assertEqual(len(self.kept("debug", *noise)), len(noise))
        others = [legacy("a message about starting on time, really"), event("STOMP listening on {a}", a="x")]
        self.assertEqual(len(self.kept("info", *others)), 2)


class FormatTests(unittest.TestCase):
    """L{file_observer}: text or one JSON object a line."""

    def test_json(self) -> None:
        out = io.StringIO()
        observer = file_observer(out, LogSettings(format="json"))
        observer(event("connection open peer={peer}", LogLevel.info, peer="127.0.0.1:5555"))
        observer(event("hidden", LogLevel.debug))
        observer(event("second"))
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 2)
        first = json.loads(lines[0])
        self.assertEqual(first["peer"], "127.0.0.1:5555")
        self.assertEqual(first["log_level"]["name"], "info")
        self.assertEqual(first["log_namespace"], "qmq.test")
        self.assertEqual(formatEvent(first), "connection open peer=127.0.0.1:5555")
        self.assertEqual(json.loads(lines[1])["log_format"], "second")

    def test_text(self) -> None:
        out = io.StringIO()
        observer = file_observer(out, LogSettings())
        observer(event("hello {who}", who="you"))
        self.assertIn("[qmq.test#info] hello you", out.getvalue())


class TwistdObserverTests(unittest.TestCase):
    """L{observer_for_twistd}: the destination twistd would pick."""

    def test_notTwistd(self) -> None:
        self.assertIsNone(observer_for_twistd(None, LogSettings()))

    def test_loggerWins(self) -> None:
        self.assertIsNone(observer_for_twistd({"logger": "my.observer", "nodaemon": True}, LogSettings()))

    def test_stdout(self) -> None:
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        for options in ({"nodaemon": True, "logfile": None}, {"nodaemon": True, "logfile": "-"}):
            observer = observer_for_twistd(options, LogSettings(format="json"))
            observer(event("to stdout"))
        self.assertEqual([json.loads(line)["log_format"] for line in out.getvalue().splitlines()],
                         ["to stdout", "to stdout"])
        # A daemon cannot log to standard output: twistd says so itself.
        self.assertIsNone(observer_for_twistd({"nodaemon": False, "logfile": "-"}, LogSettings()))

    def test_file(self) -> None:
        import signal  # noqa: PLC0415

        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        path = Path(self.mktemp())
        observer = observer_for_twistd({"nodaemon": False, "logfile": str(path)}, LogSettings(level="warn"))
        observer(event("quiet"))
        observer(event("loud", LogLevel.error))
        text = path.read_text()
        self.assertIn("loud", text)
        self.assertNotIn("quiet", text)
        # SIGUSR1 rotates the file, as with twistd's own.
        self.assertTrue(callable(signal.getsignal(signal.SIGUSR1)))


class TapTests(unittest.TestCase):
    """C{--log-level} and the observer handed to twistd."""

    def test_logLevelOption(self) -> None:
        options = tap.Options()
        options.parseOptions(["--log-level", "debug"])
        self.assertEqual(options["settings"].section("log"), LogSettings(level="debug"))
        self.assertEqual(options["settings"].section("log").format, "text")

    def test_logLevelOverridesFile(self) -> None:
        path = Path(self.mktemp())
        path.write_text('[log]\nlevel = "error"\nformat = "json"\n')
        options = tap.Options()
        options.parseOptions(["--config", str(path), "--log-level", "warn"])
        self.assertEqual(options["settings"].section("log"), LogSettings(level="warn", format="json"))

    def test_badLogLevel(self) -> None:
        options = tap.Options()
        e = self.assertRaises(usage.UsageError, options.parseOptions, ["--log-level", "loud"])
        self.assertEqual(str(e), "--log-level: expected one of debug, info, warn, error, critical, got 'loud'")

    def test_badConfig(self) -> None:
        e = self.assertRaises(config.ConfigError, config.load_string, '[log]\nformat = "xml"\n', "q.toml")
        self.assertEqual(str(e), 'q.toml: log.format: expected one of text, json, got "xml"')

    def test_observerOnApplication(self) -> None:
        """
        Under twistd the service joins the application with the observer
        as its L{ILogObserver} component (twistd's documented hook).
        """
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        server = {"nodaemon": True, "logfile": None, "logger": None, "syslog": False}
        options = tap.Options()
        options.parent = server
        options.parseOptions(["--log-level", "warn", "--data-dir", self.mktemp()])
        options["settings"] = config.dataclasses.replace(options["settings"], store="memory", listen=["stomp:tcp:0:interface=127.0.0.1"])
        service = tap.makeService(options)
        application = Application("qmq")
        service.setServiceParent(application)
        observer = application.getComponent(ILogObserver)
        self.assertIsNotNone(observer)
        observer(event("not shown"))
        observer(event("shown", LogLevel.warn))
        self.assertNotIn("not shown", out.getvalue())
        self.assertIn("shown", out.getvalue())

    def test_noObserverOutsideTwistd(self) -> None:
        options = tap.Options()
        options.parseOptions(["--data-dir", self.mktemp()])
        options["settings"] = config.dataclasses.replace(options["settings"], store="memory", listen=["stomp:tcp:0:interface=127.0.0.1"])
        application = Application("qmq")
        tap.makeService(options).setServiceParent(application)
        self.assertIsNone(application.getComponent(ILogObserver))
