"""Tests for C{twistd qmq}: L{qmq.tap}, L{qmq.service} and the plugin.

Most run on a L{MemoryReactorClock}; one starts the real broker service on
127.0.0.1, port 0, talks STOMP to it and stops it, to see the graceful
shutdown end to end.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

from twisted.application.service import IServiceMaker
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock, RaisingMemoryReactor
from twisted.logger import globalLogPublisher
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial import unittest
from zope.interface import implementer

import qmq
from qmq import config, tap
from qmq.config import ConfigError, Settings
from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.service import BrokerService, Listener, StartupError, make_service
from qmq.transport import IConnection
from tests.integration.certs import TestPKI


class PluginTests(unittest.TestCase):
    """
    The C{qmq} twistd plugin.
    """

    def test_found(self) -> None:
        """
        twistd finds a service maker called C{qmq} whose options are
        L{tap.Options}.
        """
        makers = {m.tapname: m for m in getPlugins(IServiceMaker)}
        self.assertIn("qmq", makers)
        self.assertIs(makers["qmq"].options, tap.Options)
        self.assertIn("STOMP", makers["qmq"].description)


class OptionsTests(unittest.TestCase):
    """
    L{tap.Options}: the command line of C{twistd qmq}.
    """

    def parse(self, *argv: str) -> tap.Options:
        options = tap.Options()
        options.parseOptions(list(argv))
        return options

    def captureStderr(self) -> io.StringIO:
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        return stderr

    def test_defaults(self) -> None:
        """
        Without options, the embedded default configuration.
        """
        self.assertEqual(self.parse()["settings"], config.load())

    def test_config(self) -> None:
        """
        C{--config FILE} is layered over the default.
        """
        path = Path(self.mktemp())
        path.write_text('data_dir = "there"\nlisten = ["stomp:tcp:1"]\n')
        settings = self.parse("--config", str(path))["settings"]
        self.assertEqual(settings.data_dir, Path("there"))
        self.assertEqual(settings.listen, ["stomp:tcp:1"])
        self.assertEqual(self.parse("-c", str(path))["settings"], settings)

    def test_listenReplaces(self) -> None:
        """
        C{--listen} is repeatable and replaces the configuration's listeners.
        """
        settings = self.parse(
            "--listen", "stomp:tcp:1", "--listen", "stomp:ssl:2:privateKey=k.pem"
        )["settings"]
        self.assertEqual(settings.listen, ["stomp:tcp:1", "stomp:ssl:2:privateKey=k.pem"])
        self.assertEqual(settings.listen_source, "--listen")

    def test_dataDir(self) -> None:
        """
        C{--data-dir} replaces C{data_dir}.
        """
        self.assertEqual(self.parse("--data-dir", "/tmp/q")["settings"].data_dir, Path("/tmp/q"))

    def test_badConfigExits(self) -> None:
        """
        A bad configuration file ends the process with the message alone.
        """
        path = Path(self.mktemp())
        path.write_text('[stomp]\nheartbeat_grace = "x"\n')
        stderr = self.captureStderr()
        e = self.assertRaises(SystemExit, self.parse, "--config", str(path))
        self.assertEqual(e.code, 1)
        self.assertEqual(
            stderr.getvalue(),
            f'twistd qmq: {path}: stomp.heartbeat_grace: expected a number >= 1.5, got "x"\n',
        )

    def test_badOption(self) -> None:
        """
        A malformed C{--listen} is a usage error naming the option.
        """
        e = self.assertRaises(usage.UsageError, self.parse, "--listen", "61613")
        self.assertEqual(
            str(e), '--listen: expected PROTOCOL:ENDPOINT (e.g. "stomp:tcp:61613"), got "61613"'
        )

    def test_version(self) -> None:
        """
        C{twistd qmq --version} prints QMQ's version, then Twisted's.
        """
        from twisted import copyright

        stdout = io.StringIO()
        self.patch(sys, "stdout", stdout)
        e = self.assertRaises(SystemExit, self.parse, "--version")
        self.assertEqual(e.code, 0)
        self.assertEqual(
            stdout.getvalue(),
            f"QMQ version: {qmq.__version__}\nTwisted version: {copyright.version}\n",
        )

    def test_printDefaultConfig(self) -> None:
        """
        C{--print-default-config} prints the embedded default.
        """
        stdout = io.StringIO()
        self.patch(sys, "stdout", stdout)
        e = self.assertRaises(SystemExit, self.parse, "--print-default-config")
        self.assertEqual(e.code, 0)
        self.assertEqual(stdout.getvalue(), config.default_toml())

    def test_helpDocumentsEveryOption(self) -> None:
        """
        C{twistd qmq --help} documents every option, with examples.
        """
        text = str(tap.Options())
        for option in ("--config", "--listen", "--data-dir", "--print-default-config"):
            self.assertIn(option, text)
        self.assertIn("stomp:ssl:61614:privateKey=key.pem:certKey=cert.pem", text)
        self.assertIn("qmqtls", text)

    def test_makeServiceConfigError(self) -> None:
        """
        An error found while building the service ends the process with the
        message alone.
        """
        options = self.parse("--listen", "mqtt:tcp:1883")
        stderr = self.captureStderr()
        e = self.assertRaises(SystemExit, tap.makeService, options)
        self.assertEqual(e.code, 1)
        self.assertEqual(
            stderr.getvalue(),
            "twistd qmq: --listen: unknown protocol 'mqtt' in 'mqtt:tcp:1883'"
            " (expected one of: amqp, http, peer, stomp)\n",
        )

    def test_makeService(self) -> None:
        """
        L{tap.makeService} wraps the L{BrokerService}; a start-up error ends
        the process with its message.
        """
        conf = Path(self.mktemp())
        conf.write_text('store = "memory"\n')  # no store to close after
        options = self.parse(
            "--config", str(conf),
            "--data-dir", self.mktemp(),
            "--listen", "stomp:tcp:0:interface=127.0.0.1",
        )  # fmt: skip
        top = tap.makeService(options)
        [broker] = list(top)
        self.assertIsInstance(broker, BrokerService)
        self.patch(
            BrokerService, "_prepare", lambda self: (_ for _ in ()).throw(StartupError("boom"))
        )
        stderr = self.captureStderr()
        e = self.assertRaises(SystemExit, top.privilegedStartService)
        self.assertEqual((e.code, stderr.getvalue()), (1, "twistd qmq: boom\n"))
        self.assertRaises(SystemExit, top.startService)


class HelpExamplesTests(unittest.TestCase):
    """
    Every example of C{twistd qmq --help} parses and builds a broker that
    its start-up checks accept (the one on every interface with the users
    file it names).
    """

    def test_examplesStart(self) -> None:
        import os  # noqa: PLC0415
        import shlex  # noqa: PLC0415

        from qmq.auth.passwords import hash_password  # noqa: PLC0415

        directory = Path(self.mktemp()).resolve()
        pki = TestPKI(directory)
        pki.server_key.rename(directory / "key.pem")
        pki.server_cert.rename(directory / "cert.pem")
        (directory / "qmq.toml").write_text('store = "memory"\n')
        password = hash_password("s3cret", 4)
        (directory / "users.toml").write_text(f'store = "memory"\n[users.admin]\npassword = "{password}"\n')
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(directory)
        text = tap.Options.examples.split("Examples:", 1)[1].replace("\\\n", " ")
        commands = [line.split() for line in text.splitlines() if line.strip().startswith("twistd")]
        self.assertGreaterEqual(len(commands), 5)
        for argv in commands:
            self.assertEqual(argv[:3], ["twistd", "-n", "qmq"], argv)
            options = tap.Options()
            options.parseOptions(shlex.split(" ".join(argv[3:])))
            settings = config.dataclasses.replace(
                options["settings"], data_dir=directory / "data", store="memory"
            )
            service = make_service(settings, MemoryReactorClock())
            self.assertTrue(service.listeners, argv)


class FakeFactory(Factory):
    """
    A protocol factory for listeners that never get a connection.
    """

    protocol = Protocol

    def __init__(self, events: list[str], name: str) -> None:
        self.events = events
        self.name = name


@implementer(IConnection)
class FakeConnection:
    """
    A connection in the registry that records its shutdown and goes away.
    """

    def __init__(self, registry: ConnectionRegistry, events: list[str], name: str) -> None:
        self.registry = registry
        self.events = events
        self.name = name
        self.peer_host = "127.0.0.1"

    def shutdown(self, reason: str) -> None:
        self.events.append(f"shutdown {self.name} ({reason})")
        self.registry.remove(self)

    def abort(self) -> None:
        self.events.append(f"abort {self.name}")
        self.registry.remove(self)


class FakePort:
    def __init__(self, events: list[str], name: str) -> None:
        self.events = events
        self.name = name

    def stopListening(self) -> defer.Deferred[None]:
        self.events.append(f"stop listening {self.name}")
        # Closing a port takes a reactor turn; shutdown must wait for it.
        d: defer.Deferred[None] = defer.Deferred()
        reactor.callLater(0, self.events.append, f"closed {self.name}")
        reactor.callLater(0, d.callback, None)
        return d

    def getHost(self) -> str:
        return self.name


class FakeEndpoint:
    def __init__(self, events: list[str], name: str) -> None:
        self.port = FakePort(events, name)

    def listen(self, factory: Factory) -> defer.Deferred[FakePort]:
        return defer.succeed(self.port)


class ServiceTests(unittest.TestCase):
    """
    L{make_service} and L{BrokerService}.
    """

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.logged: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)

    def settings(self, text: str = "", **changes: Any) -> Settings:
        settings = config.load_string(text, "qmq.toml")
        changes.setdefault("data_dir", Path(self.mktemp()))
        if not re.search(r"^store\s*=", text, re.M):
            # These tests run on a fake reactor (no threads): the memory
            # store, unless a test names one (the default is the log).
            changes.setdefault("store", "memory")
        # These tests are about listeners, some on every interface: the rule
        # that refuses those without authentication has its own tests
        # (tests.test_auth_service).
        changes.setdefault(
            "auth", config.dataclasses.replace(settings.auth, allow_unauthenticated_remote=True)
        )
        return config.dataclasses.replace(settings, **changes)

    def messages(self) -> list[str]:
        from twisted.logger import formatEvent

        return [formatEvent(e) for e in self.logged if e.get("log_namespace") == "qmq.service"]

    def test_listeners(self) -> None:
        """
        Each listen spec becomes a listener; starting binds them with their
        endpoint's parameters, creates the data directory and logs one line
        per listener.
        """
        settings = self.settings(
            listen=["stomp:tcp:61613:interface=127.0.0.1:backlog=1024", "stomp:tcp:61616"]
        )
        svc = make_service(settings, self.reactor)
        self.assertEqual([listener.spec for listener in svc.listeners], settings.listen)
        self.assertEqual(self.reactor.tcpServers, [])
        svc.startService()
        self.assertTrue(settings.data_dir.is_dir())
        self.assertEqual(
            [(port, backlog, interface) for port, _, backlog, interface in self.reactor.tcpServers],
            [(61613, 1024, "127.0.0.1"), (61616, 50, "")],
        )
        from qmq.stomp.protocol import StompFactory

        factory = self.reactor.tcpServers[0][1]
        self.assertIsInstance(factory, StompFactory)
        self.assertIs(factory.broker, svc.broker)
        self.assertIs(factory.settings, settings.stomp)
        self.assertEqual(
            self.messages()[1:],
            [
                "STOMP listening on 0.0.0.0:61613"
                " (stomp:tcp:61613:interface=127.0.0.1:backlog=1024)",
                "STOMP listening on 0.0.0.0:61616 (stomp:tcp:61616)",
            ],
        )
        self.assertTrue(self.messages()[0].startswith("QMQ starting: data directory "))

    def test_sharedRegistry(self) -> None:
        """
        Every listener's factory registers its connections in the service's
        one registry, under the listener's spec (the same spec twice gets two
        names), with the C{[connections]} settings.
        """
        settings = self.settings(listen=["stomp:tcp:0", "stomp:tcp:1", "stomp:tcp:0"])
        svc = make_service(settings, self.reactor)
        factories = [listener.factory for listener in svc.listeners]
        for factory in factories:
            self.assertIs(factory.registry, svc.connections)
        self.assertEqual(
            [factory.listener for factory in factories],
            ["stomp:tcp:0", "stomp:tcp:1", "stomp:tcp:0 #2"],
        )
        self.assertEqual(svc.connections.settings, ConnectionSettings())
        self.assertIs(svc.connections.clock, self.reactor)

    def test_defaultListener(self) -> None:
        """
        The embedded default listens on 127.0.0.1:61613 (STOMP),
        127.0.0.1:15674 (HTTP) and 127.0.0.1:5672 (AMQP) with a backlog of
        1024.
        """
        svc = make_service(self.settings(), self.reactor)
        svc.privilegedStartService()
        svc.startService()
        self.assertEqual(
            [(port, backlog, interface) for (port, _, backlog, interface) in self.reactor.tcpServers],
            [(61613, 1024, "127.0.0.1"), (15674, 1024, "127.0.0.1"), (5672, 1024, "127.0.0.1")],
        )
        self.assertEqual([listener.protocol for listener in svc.listeners], ["stomp", "http", "amqp"])

    def test_qmqtls(self) -> None:
        """
        A C{qmqtls:} endpoint (the plugin) is usable in a listen spec.
        """
        pki = TestPKI(self.mktemp())
        svc = make_service(self.settings(listen=["stomp:" + pki.qmqtls(port=61614)]), self.reactor)
        svc.startService()
        [(port, _, _, backlog, interface)] = self.reactor.sslServers
        self.assertEqual((port, backlog, interface), (61614, 1024, "127.0.0.1"))

    def test_unknownProtocol(self) -> None:
        """
        A listen spec naming an unknown protocol is a L{ConfigError} naming the
        file and the key.
        """
        settings = self.settings('listen = ["stomp:tcp:1", "mqtt:tcp:1883"]')
        e = self.assertRaises(ConfigError, make_service, settings, self.reactor)
        self.assertEqual(
            str(e),
            "qmq.toml: listen[1]: unknown protocol 'mqtt' in 'mqtt:tcp:1883'"
            " (expected one of: amqp, http, peer, stomp)",
        )

    def test_badEndpoint(self) -> None:
        """
        An endpoint string Twisted cannot parse is a L{ConfigError}.
        """
        for spec, problem in [
            ("stomp:tcp:http", "cannot use endpoint 'tcp:http': invalid literal for int()"),
            ("stomp:nope:1", "cannot use endpoint 'nope:1': Unknown endpoint type: 'nope'"),
            (
                "stomp:qmqtls:1:privateKey=missing.pem",
                "cannot use endpoint 'qmqtls:1:privateKey=missing.pem':"
                " qmqtls: privateKey: cannot read 'missing.pem'",
            ),
        ]:
            e = self.assertRaises(
                ConfigError, make_service, self.settings(f'listen = ["{spec}"]'), self.reactor
            )
            self.assertTrue(str(e).startswith(f"qmq.toml: listen[0]: {problem}"), str(e))

    def test_declarations(self) -> None:
        """
        Declared virtual hosts, exchanges, queues and bindings exist once the
        service is built.
        """
        settings = self.settings(
            """
[[vhosts."/".exchanges]]
name = "events"
type = "fanout"

[[vhosts."/".queues]]
name = "audit"

[[vhosts."/".bindings]]
queue = "audit"
exchange = "events"

[[vhosts.staging.queues]]
name = "jobs"
durable = false
"""
        )
        svc = make_service(settings, self.reactor)
        vhost = svc.broker.default_vhost
        self.assertIn("events", vhost.exchanges)
        self.assertIn("audit", vhost.queues)
        self.assertIn("jobs", svc.broker.vhosts["staging"].queues)
        self.assertNotIn("jobs", vhost.queues)

    def test_refusedDeclaration(self) -> None:
        """
        A declaration the core refuses is a L{ConfigError} naming where it was
        declared.
        """
        settings = self.settings(
            '[[vhosts."/".bindings]]\nqueue = "nowhere"\nexchange = "amq.topic"\n'
        )
        e = self.assertRaises(ConfigError, make_service, settings, self.reactor)
        self.assertTrue(str(e).startswith('qmq.toml: vhosts."/".bindings[0]: '), str(e))
        self.assertIn("nowhere", str(e))
        settings = self.settings('[[vhosts."/".exchanges]]\nname = "amq.topic"\ntype = "direct"\n')
        e = self.assertRaises(ConfigError, make_service, settings, self.reactor)
        self.assertTrue(str(e).startswith('qmq.toml: vhosts."/".exchanges[0]: '), str(e))

    def test_cannotListen(self) -> None:
        """
        A port that cannot be bound is a L{StartupError} naming the spec.
        """
        failing = RaisingMemoryReactor(listenException=CannotListenError("", 61613, "in use"))
        svc = make_service(self.settings(), failing)
        e = self.assertRaises(StartupError, svc.startService)
        self.assertEqual(
            str(e),
            "cannot listen on stomp:tcp:61613:interface=127.0.0.1:backlog=1024:"
            " Couldn't listen on any:61613: in use.",
        )

    def test_cannotMakeDataDir(self) -> None:
        """
        A data directory that cannot be created is a L{StartupError}.
        """
        blocker = Path(self.mktemp())
        blocker.write_text("a file")
        svc = make_service(self.settings(data_dir=blocker / "data"), self.reactor)
        e = self.assertRaises(StartupError, svc.startService)
        self.assertEqual(
            str(e), f"cannot create the data directory '{blocker / 'data'}': Not a directory"
        )

    @defer.inlineCallbacks
    def test_shutdownOrder(self):
        """
        Stopping stops every listener and waits for the ports to close, and
        only then shuts down the connections of every listener, once, through
        the shared registry.
        """
        events: list[str] = []
        svc = BrokerService(
            Broker(self.reactor), self.settings("shutdown_timeout = 3"), self.reactor
        )
        for name in ("a", "b"):
            svc.add_listener(
                Listener("stomp", name, FakeEndpoint(events, name), FakeFactory(events, name))
            )
            svc.connections.add(FakeConnection(svc.connections, events, f"conn-{name}"), name)
        svc.startService()
        self.assertEqual([listener.port.name for listener in svc.listeners], ["a", "b"])
        yield svc.stopService()
        self.assertEqual(
            events,
            [
                "stop listening b",
                "stop listening a",
                "closed b",
                "closed a",
                "shutdown conn-a (broker shutting down)",
                "shutdown conn-b (broker shutting down)",
            ],
        )
        self.assertEqual(
            self.messages()[-2:], ["QMQ stopping: no longer accepting connections", "QMQ stopped"]
        )
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    @defer.inlineCallbacks
    def test_shutdownTimeout(self):
        """
        Connections still open C{shutdown_timeout} seconds after they were
        told are aborted, and the service stops.
        """
        events: list[str] = []
        svc = BrokerService(
            Broker(self.reactor), self.settings("shutdown_timeout = 3"), self.reactor
        )
        svc.add_listener(Listener("stomp", "a", FakeEndpoint(events, "a"), FakeFactory(events, "a")))
        stuck = FakeConnection(svc.connections, events, "stuck")
        stuck.shutdown = events.append  # type: ignore[method-assign]  # and stays
        svc.connections.add(stuck, "a")
        svc.startService()
        d = svc.stopService()
        yield FakePort(events, "wait").stopListening()  # the ports close
        self.assertNoResult(d)
        self.reactor.advance(2.9)
        self.assertNoResult(d)
        self.reactor.advance(0.1)
        yield d
        self.assertIn("broker shutting down", events)
        self.assertEqual(events[-1], "abort stuck")

    @defer.inlineCallbacks
    def test_shutdownFailureLogged(self):
        """
        A connection whose shutdown fails is aborted and does not stop the
        others; the failure is logged.
        """
        events: list[str] = []
        svc = BrokerService(Broker(self.reactor), self.settings(), self.reactor)
        svc.add_listener(Listener("stomp", "x", FakeEndpoint(events, "x"), FakeFactory(events, "x")))
        broken = FakeConnection(svc.connections, events, "broken")
        broken.shutdown = lambda reason: 1 / 0  # type: ignore[method-assign,assignment]
        svc.connections.add(broken, "x")
        svc.connections.add(FakeConnection(svc.connections, events, "y"), "x")
        svc.startService()
        yield svc.stopService()
        self.assertIn("abort broken", events)
        self.assertIn("shutdown y (broker shutting down)", events)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(len(svc.connections), 0)

    def test_lateListenFailure(self) -> None:
        """
        An endpoint that fails after start-up has its failure logged.
        """
        pending: defer.Deferred[Any] = defer.Deferred()
        endpoint = FakeEndpoint([], "p")
        endpoint.listen = lambda factory: pending  # type: ignore[method-assign]
        listener = Listener("stomp", "p", endpoint, FakeFactory([], "p"))
        listener.startService()
        pending.errback(CannotListenError("", 1, "late"))
        self.assertEqual(len(self.flushLoggedErrors(CannotListenError)), 1)
        self.assertIsNone(listener.port)

    def test_sameSpecTwice(self) -> None:
        """
        The same listen spec twice makes two listeners (the second then fails
        to bind, with a clean error).
        """
        svc = make_service(self.settings(listen=["stomp:tcp:1", "stomp:tcp:1"]), self.reactor)
        self.assertEqual(len(svc.listeners), 2)

    def test_stopBeforeListening(self) -> None:
        """
        A listener whose endpoint has not answered yet cancels it on stop.
        """
        pending: defer.Deferred[Any] = defer.Deferred()
        endpoint = FakeEndpoint([], "p")
        endpoint.listen = lambda factory: pending  # type: ignore[method-assign]
        listener = Listener("stomp", "p", endpoint, FakeFactory([], "p"))
        listener.startService()
        self.successResultOf(listener.stopService())
        # Cancelled, and the cancellation is not logged as a failure.
        self.assertTrue(pending.called)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertIsNone(listener.port)


class Client(Protocol):
    """
    A raw STOMP client: collects every byte it gets.
    """

    def __init__(self) -> None:
        self.data = b""
        self.closed: defer.Deferred[None] = defer.Deferred()
        self.waiting: list[tuple[bytes, defer.Deferred[bytes]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for item in list(self.waiting):
            if item[0] in self.data:
                self.waiting.remove(item)
                item[1].callback(self.data)

    def when(self, marker: bytes) -> defer.Deferred[bytes]:
        d: defer.Deferred[bytes] = defer.Deferred()
        if marker in self.data:
            d.callback(self.data)
        else:
            self.waiting.append((marker, d))
        return d

    def connectionLost(self, reason: Failure) -> None:
        self.closed.callback(None)


class RunningBrokerTests(unittest.TestCase):
    """
    The broker service on the real reactor, on 127.0.0.1.
    """

    @defer.inlineCallbacks
    def test_gracefulShutdown(self):
        """
        A client connected when the broker stops gets an ERROR frame and is
        disconnected; the port is closed before that.
        """
        settings = config.with_overrides(
            config.load(),
            listen=["stomp:tcp:0:interface=127.0.0.1"],
            data_dir=self.mktemp(),
        )
        svc = make_service(settings, reactor)
        svc.startService()
        self.addCleanup(lambda: svc.running and svc.stopService())
        port = svc.listeners[0].port.getHost().port
        client = Client()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(
            Factory.forProtocol(lambda: client)
        )
        client.transport.write(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
        data = yield client.when(b"\x00")
        self.assertTrue(data.startswith(b"CONNECTED\n"), data)
        yield svc.stopService()
        yield client.closed
        self.assertIn(b"ERROR\n", client.data)
        self.assertIn(b"broker shutting down", client.data)
        self.assertIsNone(svc.listeners[0].port)
