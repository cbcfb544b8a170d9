"""Worker processes for real: C{twistd -n qmq --workers 2} on 127.0.0.1,
used by STOMP clients on raw sockets (L{tests.integration.test_mesh.Stomp}).

  - clients land on both workers: a CONNECTED frame's C{session} header
    starts with the node id of the worker that took the connection
    (C{w0.} or C{w1.}), and C{/api/v1/links} names the worker that answered;
  - topic fan-out across workers, exactly once: subscribers on both
    workers, publishers on both, every message reaches every subscriber
    once;
  - SIGKILL of a worker under receipted persistent load: the supervisor
    starts it again, it serves again (clients land on it, its link is up
    again), and every message it gave a RECEIPT for is in its queue,
    recovered from its own commit log;
  - SIGKILL of the supervisor: no worker outlives it (its lifeline);
    SIGTERM: every worker stops, and the supervisor after them.

Interest reaches the other worker a round trip after a SUBSCRIBE: probes
are published until each subscriber sees one (L{MeshTestCase.flowing}).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from twisted.python import log
from twisted.trial import unittest

from tests.integration.test_mesh import FLOW_TIMEOUT, Stomp, counted
from tests.integration.test_twistd import environment, frame, free_port, twistd_command

START_TIMEOUT = 60.0
MESSAGES = 200
#: Producers on the worker that is killed, each one SEND in flight.
PRODUCERS = 4


def worker_of(client: Stomp) -> str:
    return client.session.partition(".")[0]


class SessionStomp(Stomp):
    """L{Stomp}, keeping the CONNECTED frame's C{session} header."""

    def __init__(self, port: int) -> None:
        import socket  # noqa: PLC0415

        from tests.integration.test_twistd import FrameReader  # noqa: PLC0415

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader(self.sock)
        self.sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}))
        command, headers, body = self.read()
        assert command == "CONNECTED", (command, headers, body)
        self.session = headers["session"]
        self.receipts = 0
        self.pending: list[bytes] = []


class WorkersCase(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.dir = Path(self.mktemp()).resolve()
        self.dir.mkdir(parents=True)
        self.stomp_port, self.http_port = free_port(), free_port()
        listen = [
            f"stomp:tcp:{self.stomp_port}:interface=127.0.0.1:backlog=1024",
            f"http:tcp:{self.http_port}:interface=127.0.0.1",
        ]
        (self.dir / "qmq.toml").write_text(
            f'data_dir = "{self.dir / "data"}"\nlisten = {json.dumps(listen)}\n\n'
            "[cluster]\nheartbeat = 1.0\n\n[workers]\nrestart_delay = 0.2\nstop_timeout = 10.0\n"
        )
        self.output = (self.dir / "supervisor.log").open("wb")
        self.addCleanup(self.output.close)
        process = self.process = subprocess.Popen(
            twistd_command() + ["-n", "--pidfile=", "qmq", "--config", str(self.dir / "qmq.toml"), "--workers", "2"],
            cwd=self.dir,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

        def cleanup() -> None:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            for pid in self.worker_pids().values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        self.addCleanup(cleanup)
        self.wait_for("both workers linked", lambda: self.linked({"w0", "w1"}), START_TIMEOUT)

    def log(self) -> str:
        self.output.flush()
        return (self.dir / "supervisor.log").read_text(errors="replace")

    def worker_pids(self) -> dict[str, int]:
        """The pid of each worker's latest run, from the supervisor's log."""
        return {
            f"w{m[1]}": int(m[2])
            for m in re.finditer(r"worker w(\d+) started \(pid (\d+)\)", self.log())
        }

    def links(self) -> dict[str, Any]:
        """One answer of /api/v1/links (from whichever worker takes it)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/api/v1/links", timeout=10) as r:
            return json.load(r)

    def linked(self, workers: set[str]) -> bool:
        """Each of C{workers} answered, with its link to the other up."""
        seen: dict[str, bool] = {}
        for _ in range(40):
            try:
                answer = self.links()
            except OSError:
                return False
            seen[answer["node"]] = any(link["state"] == "up" for link in answer["links"])
            if set(seen) >= workers:
                break
        return set(seen) >= workers and all(seen[w] for w in workers)

    def wait_for(self, what: str, check: Any, timeout: float = FLOW_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the supervisor exited ({self.process.returncode}):\n{self.log()}")
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not in {timeout} s: {what}\n{self.log()[-4000:]}")
            time.sleep(0.05)

    def client(self) -> SessionStomp:
        client = SessionStomp(self.stomp_port)
        self.addCleanup(client.close)
        return client

    def client_on(self, worker: str) -> SessionStomp:
        """A client that landed on C{worker} (connecting until one does)."""
        for _ in range(200):
            client = self.client()
            if worker_of(client) == worker:
                return client
            client.close()
        raise AssertionError(f"no connection landed on {worker} in 200")

    def flowing(self, publisher: Stomp, destination: str, subscribers: list[Stomp]) -> None:
        deadline = time.monotonic() + FLOW_TIMEOUT
        waiting = list(subscribers)
        while waiting:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(waiting)} subscriber(s) saw no probe in {FLOW_TIMEOUT} s")
            publisher.send(destination, b"probe")
            waiting = [s for s in waiting if b"probe" not in s.messages(0.2)]


class WorkersTests(WorkersCase):
    def test_clientsOnBoth(self) -> None:
        """20 connections: some on each worker; /api/v1/links is answered by
        both, each naming itself."""
        clients = [self.client() for _ in range(20)]
        on = {worker_of(c) for c in clients}
        self.assertEqual(on, {"w0", "w1"})
        self.assertTrue(self.linked({"w0", "w1"}))

    def test_metricsForAll(self) -> None:
        """/metrics, whichever worker answers, has both workers' series."""
        answered = set()
        for _ in range(10):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
                text = r.read().decode()
            for worker in ("w0", "w1"):
                self.assertIn(f'qmq_worker_up{{worker="{worker}"}} 1', text)
                self.assertIn(f'process_cpu_seconds_total{{worker="{worker}"}}', text)
            self.assertEqual(text.count("# TYPE process_cpu_seconds_total "), 1)
            answered.add(self.links()["node"])
        self.assertEqual(answered, {"w0", "w1"})

    def test_topicExactlyOnce(self) -> None:
        """Subscribers on both workers, publishers on both: every message
        reaches every subscriber exactly once."""
        subscribers = [self.client_on("w0"), self.client_on("w1")]
        for s in subscribers:
            s.request("SUBSCRIBE", {"destination": "/topic/x", "id": "1"})
        publishers = {w: self.client_on(w) for w in ("w0", "w1")}
        for publisher in publishers.values():
            self.flowing(publisher, "/topic/x", subscribers)
        for worker, publisher in publishers.items():
            for i in range(MESSAGES):
                publisher.send("/topic/x", f"{worker}-{i}".encode())
            publisher.send("/topic/x", f"{worker}-end".encode())
        for s in subscribers:
            got: list[bytes] = []
            deadline = time.monotonic() + FLOW_TIMEOUT
            # The two publishers' messages interleave: read until both
            # markers came (each publisher's stream is ordered).
            for worker in publishers:
                marker = f"{worker}-end".encode()
                if marker not in got:
                    got += s.until(marker, deadline)
            counts = counted(got)
            counts.pop(b"probe", None)
            self.assertEqual(len(counts), 2 * (MESSAGES + 1), worker_of(s))
            self.assertEqual(set(counts.values()), {1}, worker_of(s))

    def test_killWorker(self) -> None:
        """SIGKILL of w1 while a producer on it sends persistent messages
        with receipts: w1 is started again, serves again, and every
        receipted message is in its queue."""
        producers = [self.client_on("w1") for _ in range(PRODUCERS)]
        receipted: list[bytes] = []
        stop = threading.Event()

        def produce(index: int, producer: Stomp) -> None:
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    body = f"{index}-{n}".encode()
                    producer.request("SEND", {"destination": "/queue/k", "persistent": "true"}, body)
                    receipted.append(body)
            except (OSError, ConnectionError, AssertionError):
                return

        threads = [threading.Thread(target=produce, args=p, daemon=True) for p in enumerate(producers)]
        for thread in threads:
            thread.start()
        self.addCleanup(stop.set)
        self.wait_for("300 receipts", lambda: len(receipted) >= 300)
        before = self.worker_pids()["w1"]
        os.kill(before, signal.SIGKILL)
        for thread in threads:
            thread.join(10)
            self.assertFalse(thread.is_alive())
        self.wait_for("w1 started again", lambda: self.worker_pids()["w1"] != before)
        self.wait_for("w1 linked again", lambda: self.linked({"w0", "w1"}), START_TIMEOUT)
        consumer = self.client_on("w1")
        consumer.request("SUBSCRIBE", {"destination": "/queue/k", "id": "1", "ack": "auto"})
        deadline = time.monotonic() + FLOW_TIMEOUT
        got: set[bytes] = set()
        while not set(receipted) <= got and time.monotonic() < deadline:
            got.update(consumer.messages(1.0))
        lost = sorted(set(receipted) - got)
        log.msg(f"workers kill test: {len(receipted)} receipted, {len(got)} consumed after the restart, {len(lost)} lost")
        self.assertEqual(lost, [], f"{len(lost)} of {len(receipted)} receipted messages lost")
        self.assertIn("worker w1 ended by signal 9", self.log())


class LifeTests(WorkersCase):
    def test_supervisorKilled(self) -> None:
        """No worker outlives a supervisor killed with SIGKILL."""
        pids = self.worker_pids()
        self.process.kill()
        self.process.wait(10)

        def gone() -> bool:
            for pid in pids.values():
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    continue
                return False
            return True

        deadline = time.monotonic() + FLOW_TIMEOUT
        while not gone():
            self.assertLess(time.monotonic(), deadline, f"workers {pids} still running")
            time.sleep(0.05)

    def test_sigterm(self) -> None:
        """SIGTERM: every worker stops (its own graceful stop), then the
        supervisor; a client is told the broker is going away."""
        client = self.client()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)
        command, headers, _ = client.read()
        self.assertEqual(command, "ERROR")
        text = self.log()
        for worker in ("w0", "w1"):
            self.assertIn(f"worker {worker} stopped", text)
        self.assertIn("QMQ supervisor: stopped", text)
        self.assertEqual(text.count("QMQ stopped"), 2)


class FatalStartTests(unittest.TestCase):
    timeout = 120

    def test_portZero(self) -> None:
        """A listener the workers cannot share (port 0): the worker says why
        and the supervisor exits with status 1 instead of restarting it."""
        directory = Path(self.mktemp()).resolve()
        directory.mkdir(parents=True)
        result = subprocess.run(
            twistd_command()
            + ["-n", "--pidfile=", "qmq", "--data-dir", str(directory / "data"), "--workers", "2",
               "--listen", "stomp:tcp:0:interface=127.0.0.1"],
            cwd=directory,
            env=environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=100,
        )
        output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
        self.assertEqual(result.returncode, 1, output)
        self.assertIn("port 0 cannot be shared by workers", output)
        self.assertIn("before it was ready", output)
        self.assertNotIn("started again", output)
