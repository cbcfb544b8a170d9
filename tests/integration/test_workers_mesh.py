"""Workers in a mesh of hosts: two "hosts" (two supervisors, C{twistd qmq
--workers 2} each, on loopback), linked over mutually authenticated TLS.
Every worker is a node (C{ha-w0} ... C{hb-w1}) that links to every other:
to its host's siblings over unix sockets, to the other host's workers over
TLS (each worker listens on the C{peer:} port plus its index, and
advertises it; one host's certificate names the host, and serves its
workers). Topics fan out to the four workers exactly once; a queue homed
on a worker of the other host is reached from any worker."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import trustme
from twisted.trial import unittest

from tests.integration.test_mesh import FLOW_TIMEOUT, counted
from tests.integration.test_twistd import frame, free_port, start_qmq
from tests.integration.test_workers import (
    START_TIMEOUT,
    SessionStomp,
    probe_until_flowing,
    until_ends,
    worker_of,
)

NODES = ("ha-w0", "ha-w1", "hb-w0", "hb-w1")


def free_pair() -> int:
    """A port P with P and P + 1 free (worker 1 listens on P + 1)."""
    for _ in range(100):
        port = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two free ports in a row")


class Host:
    """One host: a supervisor and its two workers, with the host's certificate."""

    def __init__(self, test: WorkersMeshTests, name: str, ca: trustme.CA) -> None:
        self.test = test
        self.name = name
        self.dir = test.workdir / name
        self.dir.mkdir()
        self.stomp_port, self.http_port = free_port(), free_port()
        self.peer_port = free_pair()
        leaf = ca.issue_cert(name, "127.0.0.1")  # the host's name: its workers present it
        leaf.cert_chain_pems[0].write_to_path(str(self.dir / "cert.pem"))
        leaf.private_key_pem.write_to_path(str(self.dir / "key.pem"))

    def configure(self, peers: list[str]) -> None:
        listen = [
            f"stomp:tcp:{self.stomp_port}:interface=127.0.0.1:backlog=1024",
            f"http:tcp:{self.http_port}:interface=127.0.0.1",
            f"peer:ssl:{self.peer_port}:interface=127.0.0.1",
        ]
        (self.dir / "qmq.toml").write_text(
            f'data_dir = "{self.dir / "data"}"\nstore = "memory"\nlisten = {json.dumps(listen)}\n\n'
            f'[cluster]\nnode = "{self.name}"\npeers = {json.dumps(peers)}\n'
            f'advertise = "ssl:host=127.0.0.1:port={self.peer_port}"\n'
            f'ca = "{self.test.ca_pem}"\ncertificate = "{self.dir / "cert.pem"}"\n'
            f'private_key = "{self.dir / "key.pem"}"\nheartbeat = 1.0\n\n'
            "[workers]\nrestart_delay = 0.2\nstop_timeout = 10.0\n"
        )

    def start(self) -> None:
        self.process = start_qmq(self.test, ["--config", str(self.dir / "qmq.toml"), "--workers", "2"], self.dir,
                                 self.dir / "supervisor.log")

    def log(self) -> str:
        return (self.dir / "supervisor.log").read_text(errors="replace")

    def links(self) -> dict[str, Any]:
        """One answer of /api/v1/links (from whichever worker takes it)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/api/v1/links", timeout=10) as r:
            return json.load(r)

    def client_on(self, node: str) -> SessionStomp:
        for _ in range(200):
            client = SessionStomp(self.stomp_port)
            if worker_of(client) == node:
                self.test.addCleanup(client.close)
                return client
            client.close()
        raise AssertionError(f"no connection landed on {node} in 200")


class WorkersMeshTests(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir(parents=True)
        ca = trustme.CA()
        self.ca_pem = self.workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_pem))
        self.hosts = {name: Host(self, name, ca) for name in ("ha", "hb")}
        entries = [f"ssl:host=127.0.0.1:port={h.peer_port}" for h in self.hosts.values()]
        for host in self.hosts.values():
            host.configure(entries)  # a shared list: each host dials itself too, and stops
            host.start()
        self.wait_for("every worker linked to the three others", self.full_mesh, START_TIMEOUT)

    def full_mesh(self) -> bool:
        seen: dict[str, set[str]] = {}
        for host in self.hosts.values():
            if host.process.poll() is not None:
                raise AssertionError(f"{host.name} exited:\n{host.log()}")
            for _ in range(10):
                try:
                    answer = host.links()
                except OSError:
                    return False
                seen[answer["node"]] = {link["node"] for link in answer["links"] if link["state"] == "up"}
        return set(seen) == set(NODES) and all(seen[n] == set(NODES) - {n} for n in NODES)

    def wait_for(self, what: str, check: Any, timeout: float = FLOW_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(h.log()[-3000:] for h in self.hosts.values())
                raise AssertionError(f"not in {timeout} s: {what}\n{logs}")
            time.sleep(0.1)

    def client_on(self, node: str) -> SessionStomp:
        return self.hosts[node.partition("-")[0]].client_on(node)

    def test_fanOutAndQueues(self) -> None:
        """A topic published on each worker reaches a subscriber on each of
        the four workers once; a queue whose home is hb-w1 takes SENDs
        from every worker and is consumed from ha-w0, every message once."""
        subscribers = {n: self.client_on(n) for n in NODES}
        for client in subscribers.values():
            client.request("SUBSCRIBE", {"destination": "/topic/hosts", "id": "t", "ack": "auto"})
        publishers = {n: self.client_on(n) for n in NODES}
        # Interest takes a round trip to every node: probes until each sees one from each.
        probe_until_flowing(lambda p, body: publishers[p].send("/topic/hosts", body), NODES, subscribers)
        for p, publisher in publishers.items():
            for i in range(20):
                publisher.send("/topic/hosts", f"{p}-{i}".encode())
            publisher.send("/topic/hosts", f"end-{p}".encode())
        for s, client in subscribers.items():
            self.assertEqual(counted(until_ends(client, NODES)),
                             {f"{p}-{i}".encode(): 1 for p in NODES for i in range(20)}, s)

        from qmq.cluster.placement import rendezvous  # noqa: PLC0415

        queue = next(f"q{i}" for i in range(1000) if rendezvous("/", f"q{i}", list(NODES)) == "hb-w1")
        for p, publisher in publishers.items():
            for i in range(10):
                publisher.request("SEND", {"destination": f"/queue/{queue}"}, f"{p}-{i}".encode())
        consumer = self.client_on("ha-w0")
        consumer.sock.sendall(frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "q",
                                                  "ack": "client-individual", "receipt": "sub"}))
        got = []
        home = None
        deadline = time.monotonic() + FLOW_TIMEOUT
        while len(got) < 40 and time.monotonic() < deadline:
            try:
                command, headers, body = consumer.read(1.0)
            except TimeoutError:
                continue
            if command == "RECEIPT":
                home = headers.get("home")
                continue
            self.assertEqual(command, "MESSAGE", (headers, body))
            got.append(body)
            consumer.sock.sendall(frame("ACK", {"id": headers["ack"]}))
        self.assertEqual(home, "hb-w1")
        self.assertEqual(counted(got), {f"{p}-{i}".encode(): 1 for p in NODES for i in range(10)})
