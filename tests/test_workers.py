"""Tests for L{qmq.workers}: the supervisor's logic on a L{Clock} with a
fake C{spawnProcess}, a worker's settings and links on a memory reactor,
the listeners shared with C{SO_REUSEPORT}, and C{twistd qmq} choosing
between one broker and a supervisor (N = 1 is today's broker, pinned).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from twisted.internet import reactor as global_reactor
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import CertificateOptions
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.trial import unittest

from qmq import config, tap
from qmq.cluster.mesh import Mesh
from qmq.config import ConfigError
from qmq.service import BrokerService, make_service
from qmq.workers import plan
from qmq.workers.settings import MAX_WORKERS, WorkerSettings, check_count, cores, worker_count
from qmq.workers.sharing import ReusePortReactor, SharingError
from qmq.workers.supervisor import STABLE_AFTER, Supervisor, WorkerProcess, worker_command
from qmq.workers.worker import (
    LIFELINE_FD,
    READY_FD,
    WorkerAgent,
    WorkerRole,
    _Lifeline,
    attach_worker,
    link_path,
    parse_role,
    worker_settings,
)

#: The homes of queues q0 to q5 of "/" over w0, w1, w2 (pinned).
HOMES = ["w1", "w1", "w0", "w0", "w1", "w2"]


class FakeTransport:
    """What a spawned process's transport does, recorded."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[str] = []
        self.exited = False

    def signalProcess(self, name: str) -> None:
        if self.exited:
            raise ProcessExitedAlready()
        self.signals.append(name)


class FakeSpawner:
    """C{reactor.spawnProcess}, recorded: each call connects a fake transport."""

    def __init__(self) -> None:
        self.calls: list[tuple[WorkerProcess, str, list[str], dict[str, Any]]] = []
        self.pid = 100

    def __call__(self, process: WorkerProcess, executable: str, argv: list[str], **kwargs: Any) -> FakeTransport:
        self.pid += 1
        transport = FakeTransport(self.pid)
        process.makeConnection(transport)
        self.calls.append((process, executable, argv, kwargs))
        return transport

    def last(self, index: int) -> WorkerProcess:
        return [c[0] for c in self.calls if c[0].index == index][-1]


def end(process: WorkerProcess, code: int | None = 1, signal: int | None = None) -> None:
    process.transport.exited = True  # type: ignore[union-attr]
    if code == 0 and signal is None:
        process.processEnded(Failure(ProcessDone(0)))
    else:
        process.processEnded(Failure(ProcessTerminated(code, signal)))


class SupervisorTests(unittest.TestCase):
    """L{Supervisor}: start, restart with backoff, fatal start, ordered stop."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.fatal: list[str] = []
        self.directory = self.mktemp()
        os.mkdir(self.directory)
        self.settings = WorkerSettings(count=2, restart_delay=0.5, restart_max_delay=4.0, stop_timeout=10.0)
        self.supervisor = Supervisor(
            2,
            self.settings,
            lambda i: worker_command(i, 2, self.directory, ["--config", "q.toml"]),
            self.directory,
            self.clock,
            self.spawn,
            environment={"X": "1"},
            on_fatal=self.fatal.append,
        )

    def ready(self, index: int) -> WorkerProcess:
        process = self.spawn.last(index)
        process.childDataReceived(READY_FD, b"rea")
        self.assertFalse(process.ready)
        process.childDataReceived(READY_FD, b"dy 123\n")
        self.assertTrue(process.ready)
        return process

    def test_starts(self) -> None:
        """N workers, each this interpreter's twistd with the qmq arguments,
        C{--worker I:N:DIR}, no pid file, the supervisor's stdout and
        stderr, and the two pipes."""
        self.supervisor.startService()
        self.assertEqual(len(self.spawn.calls), 2)
        for index, (process, executable, argv, kwargs) in enumerate(self.spawn.calls):
            self.assertEqual(process.index, index)
            self.assertEqual(executable, argv[0])
            self.assertEqual(argv[3:6], ["-n", "--pidfile=", "qmq"])
            self.assertEqual(argv[-4:], ["--config", "q.toml", "--worker", f"{index}:2:{self.directory}"])
            self.assertEqual(kwargs["env"], {"X": "1"})
            self.assertEqual(kwargs["childFDs"], {0: 0, 1: 1, 2: 2, LIFELINE_FD: "w", READY_FD: "r"})
            self.assertEqual(process.pid, 101 + index)

    def test_restartBackoff(self) -> None:
        """A worker that dies is started again after restart_delay, doubled
        at each death in a row up to restart_max_delay, and back to
        restart_delay once it stayed up STABLE_AFTER seconds."""
        self.supervisor.startService()
        self.ready(0)
        self.ready(1)
        delays = []
        for _ in range(5):
            end(self.spawn.last(1), None, 9)
            self.assertEqual(len(self.spawn.calls), 2 + len(delays))
            pending = self.clock.getDelayedCalls()
            self.assertEqual(len(pending), 1)
            delays.append(pending[0].getTime() - self.clock.seconds())
            self.clock.advance(delays[-1])
            self.assertEqual(self.spawn.last(1).index, 1)
        self.assertEqual(delays, [0.5, 1.0, 2.0, 4.0, 4.0])
        self.assertEqual(self.supervisor.restarts, {0: 0, 1: 5})
        self.clock.advance(STABLE_AFTER)
        end(self.spawn.last(1), 1)
        [call] = self.clock.getDelayedCalls()
        self.assertEqual(call.getTime() - self.clock.seconds(), 0.5)
        # A restarted worker need not say ready to be restarted again:
        # its index was ready once, so the configuration works.
        self.clock.advance(0.5)
        end(self.spawn.last(1), 0)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(self.fatal, [])

    def test_fatalBeforeReady(self) -> None:
        """A worker that ends before any run of its index was ready is a
        configuration that does not work: on_fatal, and no restart."""
        self.supervisor.startService()
        self.ready(0)
        end(self.spawn.last(1), 1)
        self.assertEqual(self.fatal, ["worker w1 exited with status 1 before it was ready (its log says why)"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(self.spawn.calls), 2)
        end(self.spawn.last(0), 1)  # the other, ending too: no second on_fatal
        self.assertEqual(len(self.fatal), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stopInOrder(self) -> None:
        """SIGTERM to every worker; the stop fires once all ended; no
        restart; the directory is removed."""
        self.supervisor.startService()
        self.ready(0)
        self.ready(1)
        d = self.supervisor.stopService()
        self.assertEqual([p.transport.signals for p in (self.spawn.last(0), self.spawn.last(1))], [["TERM"], ["TERM"]])  # type: ignore[union-attr]
        self.assertNoResult(d)
        end(self.spawn.last(0), None, 15)
        self.assertNoResult(d)
        end(self.spawn.last(1), None, 15)
        self.successResultOf(d)
        self.assertEqual(len(self.spawn.calls), 2)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(os.path.exists(self.directory))

    def test_stopKillsStragglers(self) -> None:
        """A worker still running after stop_timeout is SIGKILLed."""
        self.supervisor.startService()
        self.ready(0)
        self.ready(1)
        d = self.supervisor.stopService()
        end(self.spawn.last(0), None, 15)
        self.clock.advance(self.settings.stop_timeout)
        self.assertEqual(self.spawn.last(1).transport.signals, ["TERM", "KILL"])  # type: ignore[union-attr]
        self.assertNoResult(d)
        end(self.spawn.last(1), None, 9)
        self.successResultOf(d)

    def test_stopCancelsRestart(self) -> None:
        """A restart waiting when the supervisor stops does not happen."""
        self.supervisor.startService()
        self.ready(0)
        self.ready(1)
        end(self.spawn.last(1), None, 9)
        d = self.supervisor.stopService()
        end(self.spawn.last(0), None, 15)
        self.successResultOf(d)
        self.clock.advance(60)
        self.assertEqual(len(self.spawn.calls), 2)

    def test_readyLineBounded(self) -> None:
        """What a worker writes on its ready pipe is kept to MAX_STATUS bytes."""
        self.supervisor.startService()
        process = self.spawn.last(0)
        process.childDataReceived(READY_FD, b"x" * 100_000)
        self.assertLessEqual(len(process._status), 256)
        process.childDataReceived(1, b"ready\n")  # not its ready pipe
        self.assertFalse(process.ready)


class SettingsTests(unittest.TestCase):
    """C{[workers]}, C{--workers} and a worker's own settings."""

    def test_count(self) -> None:
        self.assertEqual(check_count("auto"), "auto")
        self.assertEqual(worker_count("auto"), min(cores(), MAX_WORKERS))
        self.assertEqual(worker_count(3), 3)
        for bad in (0, MAX_WORKERS + 1, "two", True, 1.5):
            self.assertRaises(ValueError, check_count, bad)

    def test_configKey(self) -> None:
        settings = config.load_string('[workers]\ncount = "auto"\n')
        self.assertEqual(settings.section("workers").count, "auto")
        settings = config.load_string("[workers]\ncount = 2\n")
        self.assertEqual(plan.workers_wanted(settings, None), 2)
        self.assertEqual(plan.workers_wanted(settings, "3"), 3)
        e = self.assertRaises(ConfigError, config.load_string, "[workers]\ncount = 0\n", "q.toml")
        self.assertEqual(str(e), 'q.toml: workers.count: expected an integer from 1 to 64 or "auto", got 0')
        e = self.assertRaises(ConfigError, plan.workers_wanted, settings, "many")
        self.assertEqual(str(e), "--workers: expected an integer from 1 to 64 or \"auto\", got 'many'")

    def test_role(self) -> None:
        self.assertEqual(parse_role("1:2:/tmp/x"), WorkerRole(1, 2, "/tmp/x"))
        for bad in ("2:2:/x", "a:2:/x", "0:2:", "-1:2:/x"):
            self.assertRaises(ValueError, parse_role, bad)

    def test_workerSettings(self) -> None:
        """Worker 0 keeps the data directory, worker I has DATA/wI; node
        ids wI, or NODE-wI."""
        settings = config.load_string('data_dir = "/d"\n')
        w0 = worker_settings(settings, WorkerRole(0, 2, "/r"))
        w1 = worker_settings(settings, WorkerRole(1, 2, "/r"))
        self.assertEqual((w0.data_dir, w1.data_dir), (Path("/d"), Path("/d/w1")))
        self.assertEqual((w0.section("cluster").node, w1.section("cluster").node), ("w0", "w1"))
        named = config.load_string('[cluster]\nnode = "host-a"\n')
        self.assertEqual(worker_settings(named, WorkerRole(1, 2, "/r")).section("cluster").node, "host-a-w1")
        long = config.load_string(f'[cluster]\nnode = "{"n" * 31}"\n')
        e = self.assertRaises(ConfigError, worker_settings, long, WorkerRole(1, 2, "/r"))
        self.assertIn("cluster.node", str(e))

    def test_memoryMark(self) -> None:
        """The memory high-water mark is the broker's: each of N workers
        gets 1/N of it, in bytes; off stays off."""
        gib = 1 << 30
        settings = config.load_string("[limits]\nmemory_high_watermark = 0.4\n")
        w = worker_settings(settings, WorkerRole(1, 2, "/r"), total=10 * gib)
        self.assertEqual(w.limits.memory_high_watermark, 2 * gib)
        settings = config.load_string('[limits]\nmemory_high_watermark = "3GiB"\n')
        self.assertEqual(worker_settings(settings, WorkerRole(0, 3, "/r"), total=10 * gib).limits.memory_high_watermark, gib)
        settings = config.load_string('[limits]\nmemory_high_watermark = "off"\n')
        self.assertEqual(worker_settings(settings, WorkerRole(0, 3, "/r"), total=10 * gib).limits.memory_high_watermark, "off")

    def test_refusals(self) -> None:
        """What workers cannot share is refused, naming the key: in a mesh of
        hosts they need the host's node id and how other hosts dial them."""
        mesh = '[cluster]\nallow_plaintext = true\n'
        cases = [
            (mesh + 'peers = ["tcp:host=h:port=1"]\n', "cluster.node: workers in a mesh of hosts need"),
            (mesh + 'node = "a"\npeers = ["tcp:host=h:port=1"]\n', "cluster.advertise: workers in a mesh"),
            ('listen = ["peer:tcp:61700"]\n' + mesh, "cluster.node: workers in a mesh"),
            ('listen = ["peer:tcp:interface=::1"]\n' + mesh + 'node = "a"\nadvertise = "tcp:h:1"\n',
             "q.toml: listen[0]: 'peer:tcp:interface=::1': with workers, a peer: listener needs a port"),
            ('listen = ["stomp:unix:/tmp/s"]\n', "q.toml: listen[0]: 'stomp:unix:/tmp/s': a unix: listener"),
        ]
        for text, expected in cases:
            settings = config.load_string(text, "q.toml")
            e = self.assertRaises(ConfigError, plan.check_workers, settings)
            self.assertIn(expected, str(e))
        plan.check_workers(config.load_string(
            'listen = ["peer:tcp:61700"]\n' + mesh + 'node = "a"\nadvertise = "tcp:host=h:port=61700"\n'))

    def test_meshPorts(self) -> None:
        """In a mesh of hosts worker I listens for links on each peer: port
        plus I, and advertises its own port; worker 0 is as configured."""
        settings = config.load_string(
            'listen = ["stomp:tcp:61613", "peer:ssl:7000:interface=127.0.0.1", "peer:tcp:port=7100"]\n'
            '[cluster]\nnode = "a"\nadvertise = "ssl:host=a.example:port=7000"\nallow_plaintext = true\n')
        w0 = worker_settings(settings, WorkerRole(0, 3, "/r"), total=1 << 30)
        w2 = worker_settings(settings, WorkerRole(2, 3, "/r"), total=1 << 30)
        self.assertEqual(w0.listen, settings.listen)
        self.assertEqual(w2.listen, ["stomp:tcp:61613", "peer:ssl:7002:interface=127.0.0.1", "peer:tcp:port=7102"])
        self.assertEqual((w0.section("cluster").node, w0.section("cluster").advertise), ("a-w0", "ssl:host=a.example:port=7000"))
        self.assertEqual((w2.section("cluster").node, w2.section("cluster").advertise), ("a-w2", "ssl:host=a.example:port=7002"))

    def test_logsHeld(self) -> None:
        """A data directory with workers' logs: one broker is refused, and a
        supervisor runs at least as many workers as there are logs."""
        data = Path(self.mktemp())
        (data / "w1").mkdir(parents=True)  # no log: holds nothing
        self.assertEqual(plan.logs_held(data), 0)
        (data / "w2" / "log").mkdir(parents=True)
        (data / "w2" / "log" / "00000001.seg").write_bytes(b"x")
        self.assertEqual(plan.logs_held(data), 3)
        settings = config.load_string(f'data_dir = "{data}"\n')
        e = self.assertRaises(ConfigError, plan.check_single, settings)
        self.assertIn("workers.count: the data directory", str(e))
        self.assertIn("--workers 3", str(e))
        plan.check_single(config.load_string(f'data_dir = "{data}"\nstore = "memory"\n'))
        fake = MemoryReactorClock()
        fake.spawnProcess = FakeSpawner()  # type: ignore[attr-defined]
        supervisor = plan.make_supervisor(settings, 2, [], fake)
        self.addCleanup(os.rmdir, supervisor.directory)
        self.assertEqual(supervisor.count, 3)
        self.assertEqual(os.stat(supervisor.directory).st_mode & 0o777, 0o700)


class SharingTests(unittest.TestCase):
    """L{ReusePortReactor}: every worker binds the same port."""

    def test_samePortTwice(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        shared = ReusePortReactor(global_reactor)
        ports = [shared.listenTCP(port, Factory.forProtocol(Protocol), 50, "127.0.0.1") for _ in range(2)]
        for p in ports:
            self.addCleanup(p.stopListening)
            self.assertEqual(p.getHost().port, port)
            self.assertEqual(p.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT), 1)

    def test_tls(self) -> None:
        """listenSSL is Twisted's TLS over a shared TCP port."""
        calls = []
        shared = ReusePortReactor(global_reactor)
        shared.listenTCP = lambda port, factory, backlog, interface: calls.append((port, factory, backlog, interface))  # type: ignore[method-assign]
        inner = Factory.forProtocol(Protocol)
        shared.listenSSL(5, inner, CertificateOptions(), 7, "127.0.0.1")
        [(port, factory, backlog, interface)] = calls
        self.assertIsInstance(factory, TLSMemoryBIOFactory)
        self.assertIs(factory.wrappedFactory, inner)
        self.assertEqual((port, backlog, interface), (5, 7, "127.0.0.1"))

    def test_refused(self) -> None:
        shared = ReusePortReactor(global_reactor)
        e = self.assertRaises(SharingError, shared.listenTCP, 0, Factory())
        self.assertIn("port 0 cannot be shared", str(e))
        self.assertRaises(SharingError, shared.listenUNIX, "/tmp/x", Factory())
        self.assertEqual(shared.callLater, global_reactor.callLater)


class WorkerTests(unittest.TestCase):
    """L{attach_worker}: a broker made a node of the workers' mesh."""

    def build(self, role: WorkerRole) -> tuple[BrokerService, MemoryReactorClock, WorkerAgent]:
        reactor = MemoryReactorClock()
        settings = config.load_string(
            f'store = "memory"\ndata_dir = "{self.mktemp()}"\nlisten = ["stomp:tcp:61613:interface=127.0.0.1"]\n'
        )
        settings = worker_settings(settings, role)
        service = make_service(settings, reactor)
        agent = attach_worker(service, role, reactor, lifeline=False)
        return service, reactor, agent

    def test_links(self) -> None:
        """Worker 1 of 3 listens on DIR/w1.sock and dials w2 only (each pair
        has one dialer: the lower index)."""
        service, reactor, agent = self.build(WorkerRole(1, 3, "/r"))
        self.assertEqual(
            [lst.spec for lst in service.listeners][-2:], ["peer:unix:/r/w1.sock", "http:unix:/r/w1.http"]
        )
        metrics = service.broker.worker_metrics
        self.assertEqual(metrics.paths, {"w0": "/r/w0.http", "w2": "/r/w2.http"})
        self.assertTrue(metrics.is_private("http:unix:/r/w1.http"))
        self.assertFalse(metrics.is_private("http:tcp:15674"))
        mesh = service.broker.mesh
        self.assertIsInstance(mesh, Mesh)
        self.assertIs(mesh.parent, service)
        self.assertEqual(mesh.node, "w1")
        self.assertEqual([p.node for p in agent.peers], ["w2"])
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual([c[0] for c in reactor.unixClients], ["/r/w2.sock"])
        self.assertEqual([u[0] for u in reactor.unixServers], ["/r/w1.sock", "/r/w1.http"])
        self.assertEqual(link_path("/r", 2), "/r/w2.sock")

    def test_placement(self) -> None:
        """A queue's home is one of all N workers, by a stable hash of its
        virtual host and name: the same on every worker, linked or not;
        x-home-node still wins."""
        homes = []
        for index in range(3):
            service, reactor, agent = self.build(WorkerRole(index, 3, "/r"))
            placement = service.broker.mesh.queues.placement
            self.assertEqual(placement.members(), ["w0", "w1", "w2"])
            homes.append([placement.home("/", f"q{i}") for i in range(30)])
            self.assertEqual(placement.home("/", "q0", {"x-home-node": "w2"}), "w2")
        self.assertEqual(homes[0], homes[1])
        self.assertEqual(homes[0], homes[2])
        self.assertEqual(set(homes[0]), {"w0", "w1", "w2"})
        # Pinned: a change would move queues (and leave their messages in
        # another worker's log).
        self.assertEqual(homes[0][:6], HOMES)

    def test_lastDialsNone(self) -> None:
        service, reactor, agent = self.build(WorkerRole(2, 3, "/r"))
        self.assertEqual(agent.peers, [])

    def test_lifeline(self) -> None:
        """The end of the supervisor's pipe stops the worker."""
        read, write = os.pipe()
        self.addCleanup(os.close, read)
        gone = []
        lifeline = _Lifeline(read, lambda: gone.append(True))
        os.set_blocking(read, False)
        self.assertIsNone(lifeline.doRead())  # nothing yet
        os.write(write, b"x")
        self.assertIsNone(lifeline.doRead())
        os.close(write)
        reason = lifeline.doRead()
        self.assertEqual(reason, "the supervisor is gone")
        lifeline.connectionLost(reason)
        self.assertEqual(gone, [True])


class TapTests(unittest.TestCase):
    """C{twistd qmq}: one broker, a supervisor, or a worker."""

    def parse(self, *argv: str) -> tap.Options:
        options = tap.Options()
        options.parseOptions(list(argv))
        return options

    def test_oneIsTodaysBroker(self) -> None:
        """N = 1 (the default, or --workers 1): the broker service itself,
        no supervisor, the data directory as given, no worker node id."""
        data = self.mktemp()
        conf = Path(self.mktemp())
        conf.write_text('store = "memory"\n')
        for argv in ([], ["--workers", "1"]):
            options = self.parse(
                "--config", str(conf), "--data-dir", data, "--listen", "stomp:tcp:0:interface=127.0.0.1", *argv
            )
            self.assertEqual(options["count"], 1)
            top = tap.makeService(options)
            [broker] = list(top)
            self.assertIsInstance(broker, BrokerService)
            self.assertEqual(broker.settings.data_dir, Path(data))
            self.assertEqual(broker.settings.section("cluster").node, "")
            self.assertNotIn("w0", broker.broker.node)
            self.assertIsNone(getattr(broker.broker, "mesh", None))

    def test_supervisor(self) -> None:
        """--workers 2: a supervisor whose workers get the qmq arguments."""
        data = self.mktemp()
        options = self.parse("--workers", "2", "--data-dir", data, "--listen", "stomp:tcp:61999:interface=127.0.0.1")
        top = tap.makeService(options)
        [supervisor] = list(top)
        self.assertIsInstance(supervisor, Supervisor)
        self.addCleanup(os.rmdir, supervisor.directory)
        argv = supervisor.command(1)
        self.assertEqual(
            argv[6:],
            ["--listen", "stomp:tcp:61999:interface=127.0.0.1", "--data-dir", data, "--worker", f"1:2:{supervisor.directory}"],
        )

    def test_logFile(self) -> None:
        """Workers log to the supervisor's standard output, or next to its
        log file (twistd --logfile, or twistd.log as a daemon)."""
        self.assertIsNone(plan.log_file_of(None))
        self.assertIsNone(plan.log_file_of({"nodaemon": True, "logfile": None}))
        self.assertIsNone(plan.log_file_of({"nodaemon": True, "logfile": "-"}))
        self.assertEqual(plan.log_file_of({"nodaemon": True, "logfile": "/var/log/qmq.log"}), "/var/log/qmq.log")
        self.assertEqual(plan.log_file_of({"nodaemon": False, "logfile": None}), "twistd.log")
        argv = worker_command(1, 2, "/r", ["--config", "q.toml"], "/var/log/qmq.log")
        self.assertEqual(argv[3:7], ["-n", "--pidfile=", "--logfile=/var/log/qmq.log.w1", "qmq"])

    def test_badWorkers(self) -> None:
        from twisted.python import usage  # noqa: PLC0415

        e = self.assertRaises(usage.UsageError, self.parse, "--workers", "0")
        self.assertIn("--workers: expected an integer from 1 to 64", str(e))
        e = self.assertRaises(usage.UsageError, self.parse, "--worker", "3:2:/x")
        self.assertIn("--worker: expected INDEX:COUNT:DIR", str(e))
