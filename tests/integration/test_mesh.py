"""A mesh of real nodes: three C{twistd -n qmq} processes on 127.0.0.1,
linked over mutual TLS with certificates made here by C{trustme}, used by
STOMP clients on raw sockets and watched through C{/api/v1/links}.

  - fan-out: subscribers to C{/topic/x} on b and c, a publisher on a: each
    gets each message exactly once; when c's subscriber leaves, nothing
    more goes to c (a's link counters);
  - refusals: a node whose certificate another CA signed, and a node the
    peers list does not name, are refused, each with a logged reason;
  - failure: SIGKILL of a node; the others go on; the node restarted is
    linked again (reconnect with backoff) and gets messages again;
  - discovery: b and c know only a, and find each other through it;
  - distance: a link through a TCP proxy that delays every chunk by
    L{DELAY} seconds each way (this kernel has no netem): the round trip
    shows in the link's counters, and messages flow exactly once, not one
    round trip each (nothing waits for an ack across a link).

Interest reaches a peer a round trip after a SUBSCRIBE: the tests publish
probes until a subscriber sees one (bounded by a deadline) before they
count. A marker published last ends each count: one link is one ordered
stream, so what was sent before it has arrived when it does.
"""

from __future__ import annotations

import heapq
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import trustme
from twisted.trial import unittest

from tests.integration.test_twistd import FrameReader, frame, free_port, start_qmq

START_TIMEOUT = 30.0
#: How long interest or a reconnect may take to show.
FLOW_TIMEOUT = 20.0
MESSAGES = 200
#: The delaying proxy's delay, each way (seconds).
DELAY = 0.1


class DelayingProxy:
    """A TCP proxy on 127.0.0.1 that forwards each chunk C{delay} seconds
    after it came, in order, both ways (one upstream per connection)."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
            except OSError:
                client.close()  # not listening yet: the dialer tries again
                continue
            server.settimeout(None)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        due: list[tuple[float, int, bytes]] = []
        ready = threading.Condition()
        serial = [0]

        def send() -> None:
            while True:
                with ready:
                    while not due:
                        ready.wait()
                    at, _, data = due[0]
                    wait = at - time.monotonic()
                    if wait > 0:
                        ready.wait(wait)
                        continue
                    heapq.heappop(due)
                if not data:
                    sink.close()
                    return
                try:
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=send, daemon=True).start()
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            with ready:
                serial[0] += 1
                heapq.heappush(due, (time.monotonic() + self.delay, serial[0], data))
                ready.notify()
            if not data:
                return

    def close(self) -> None:
        self.closed.set()
        for sock in self.sockets:
            sock.close()


class Stomp:
    """A STOMP 1.2 client on a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader(self.sock)
        self.sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}))
        command, headers, body = self.read()
        assert command == "CONNECTED", (command, headers, body)
        self.receipts = 0
        #: MESSAGE bodies read while waiting for a receipt.
        self.pending: list[bytes] = []

    def read(self, timeout: float = 10.0) -> tuple[str, dict[str, str], bytes]:
        self.sock.settimeout(timeout)
        got = self.reader.read()
        if got is None:
            raise ConnectionError("the broker closed the connection")
        return got

    def request(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        """Send a frame with a receipt; wait for it (MESSAGEs meanwhile are kept)."""
        self.receipts += 1
        receipt = f"r{self.receipts}"
        self.sock.sendall(frame(command, {**headers, "receipt": receipt}, body))
        while True:
            got, headers_, body_ = self.read()
            if got == "RECEIPT" and headers_.get("receipt-id") == receipt:
                return
            assert got == "MESSAGE", (got, headers_, body_)
            self.pending.append(body_)

    def send(self, destination: str, body: bytes) -> None:
        self.sock.sendall(frame("SEND", {"destination": destination}, body))

    def messages(self, timeout: float) -> list[bytes]:
        """What arrives within C{timeout} seconds of the last (at least one
        read), after what a receipt wait kept."""
        got, self.pending = self.pending, []
        try:
            while True:
                command, headers, body = self.read(timeout)
                assert command == "MESSAGE", (command, headers, body)
                got.append(body)
                if timeout > 0.05:
                    timeout = 0.05
        except TimeoutError:
            return got

    def until(self, marker: bytes, deadline: float) -> list[bytes]:
        """Every message up to and with C{marker}."""
        got, self.pending = self.pending, []
        while marker not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} in time; got {len(got)} messages")
            try:
                command, headers, body = self.read(left)
            except TimeoutError:
                continue
            assert command == "MESSAGE", (command, headers, body)
            got.append(body)
        return got

    def close(self) -> None:
        self.sock.close()


class Node:
    """One node: its ports, certificate, configuration and process."""

    def __init__(self, test: MeshTestCase, name: str, ca: trustme.CA) -> None:
        self.test = test
        self.name = name
        self.dir = test.workdir / name
        self.dir.mkdir()
        self.stomp_port, self.peer_port, self.http_port = free_port(), free_port(), free_port()
        self.amqp_port = free_port()
        leaf = ca.issue_cert(name, "127.0.0.1")
        leaf.cert_chain_pems[0].write_to_path(str(self.dir / "cert.pem"))
        leaf.private_key_pem.write_to_path(str(self.dir / "key.pem"))
        self.peers: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def peer_entry(self) -> str:
        return f"ssl:host=127.0.0.1:port={self.peer_port}:node={self.name}"

    def configure(self, peers: list[str], advertise: bool = False, store: str = "memory") -> None:
        listen = [
            f"stomp:tcp:{self.stomp_port}:interface=127.0.0.1",
            f"peer:ssl:{self.peer_port}:interface=127.0.0.1",
            f"http:tcp:{self.http_port}:interface=127.0.0.1",
            f"amqp:tcp:{self.amqp_port}:interface=127.0.0.1",
        ]
        (self.dir / "qmq.toml").write_text(
            f'data_dir = "{self.dir / "data"}"\nstore = "{store}"\nlisten = {json.dumps(listen)}\n\n'
            f'[cluster]\nnode = "{self.name}"\npeers = {json.dumps(peers)}\n'
            f'ca = "{self.test.ca_pem}"\ncertificate = "{self.dir / "cert.pem"}"\n'
            f'private_key = "{self.dir / "key.pem"}"\nheartbeat = 1.0\n'
            + (f'advertise = "ssl:host=127.0.0.1:port={self.peer_port}"\n' if advertise else "")
        )

    def start(self) -> None:
        self.runs += 1
        self.process = start_qmq(self.test, ["--config", str(self.dir / "qmq.toml")], self.dir,
                                 self.dir / f"run-{self.runs}.log")

    def wait_listening(self) -> None:
        """Until its STOMP and HTTP listeners take connections."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                for port in (self.stomp_port, self.http_port):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.name} did not listen:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("run-*.log")))

    def client(self) -> Stomp:
        client = Stomp(self.stomp_port)
        self.test.addCleanup(client.close)
        return client

    def links(self) -> dict[str, dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/api/v1/links", timeout=10) as r:
            answer = json.load(r)
        assert answer["node"] == self.name
        return {link["node"]: link for link in answer["links"] if link["state"] == "up"}

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


class MeshTestCase(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir(parents=True)
        self.ca = trustme.CA()
        self.ca_pem = self.workdir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))

    def nodes(self, *names: str, store: str = "memory") -> dict[str, Node]:
        """Nodes that all list all (themselves too, as a shared list does)."""
        nodes = {n: Node(self, n, self.ca) for n in names}
        entries = [node.peer_entry() for node in nodes.values()]
        for node in nodes.values():
            node.configure(entries, store=store)
            node.start()
        for node in nodes.values():
            node.wait_listening()
        return nodes

    def flowing(self, publisher: Stomp, destination: str, subscribers: list[Stomp]) -> None:
        """Publish probes until every subscriber has seen one."""
        deadline = time.monotonic() + FLOW_TIMEOUT
        waiting = list(subscribers)
        while waiting:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(waiting)} subscriber(s) saw no probe in {FLOW_TIMEOUT} s")
            publisher.send(destination, b"probe")
            waiting = [s for s in waiting if b"probe" not in s.messages(0.2)]

    def wait_for(self, what: str, check: Any) -> Any:
        deadline = time.monotonic() + FLOW_TIMEOUT
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not in {FLOW_TIMEOUT} s: {what}")
            time.sleep(0.05)


def settled(nodes: dict[str, Node]) -> bool:
    """Every pair linked by the link the tie-break keeps (dialed by the
    smaller node), so no link is replaced later (counters start again)."""
    for name, node in nodes.items():
        links = node.links()
        if set(links) != set(nodes) - {name}:
            return False
        if any(link["direction"] != ("out" if name < peer else "in") for peer, link in links.items()):
            return False
    return True


def counted(bodies: list[bytes]) -> dict[bytes, int]:
    counts: dict[bytes, int] = {}
    for body in bodies:
        if body != b"probe":
            counts[body] = counts.get(body, 0) + 1
    return counts


class FanOutTests(MeshTestCase):
    def test_exactly_once_and_withdrawn(self) -> None:
        nodes = self.nodes("a", "b", "c")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        on_b, on_c = b.client(), c.client()
        on_b.request("SUBSCRIBE", {"id": "1", "destination": "/topic/x", "ack": "auto"})
        on_c.request("SUBSCRIBE", {"id": "1", "destination": "/topic/x", "ack": "auto"})
        publisher = a.client()
        self.flowing(publisher, "/topic/x", [on_b, on_c])
        expected = {b"m%d" % i: 1 for i in range(MESSAGES)}
        for i in range(MESSAGES):
            publisher.send("/topic/x", b"m%d" % i)
        publisher.request("SEND", {"destination": "/topic/x"}, b"end")
        deadline = time.monotonic() + FLOW_TIMEOUT
        self.assertEqual(counted(on_b.until(b"end", deadline)), {**expected, b"end": 1})
        self.assertEqual(counted(on_c.until(b"end", deadline)), {**expected, b"end": 1})
        links = a.links()
        self.assertGreaterEqual(links["b"]["messages_out"], MESSAGES + 2)
        # b and c pass nothing of a's on to each other.
        self.assertEqual(b.links()["c"]["messages_out"], 0)
        self.assertEqual(c.links()["b"]["messages_out"], 0)

        # c's subscriber leaves: a is told, and sends c nothing more.
        on_c.request("UNSUBSCRIBE", {"id": "1"})
        self.wait_for("c's interest withdrawn", lambda: a.links()["c"]["peer_interest"] == [])
        before = a.links()
        for i in range(50):
            publisher.send("/topic/x", b"n%d" % i)
        publisher.request("SEND", {"destination": "/topic/x"}, b"end2")
        got = counted(on_b.until(b"end2", time.monotonic() + FLOW_TIMEOUT))
        self.assertEqual(len(got), 50 + 1)
        after = a.links()
        self.assertEqual(after["c"]["messages_out"], before["c"]["messages_out"])
        self.assertEqual(after["b"]["messages_out"], before["b"]["messages_out"] + 51)
        self.assertEqual(on_c.messages(0.2), [])
        for node in nodes.values():
            self.assertIn("is this node itself: not dialed again", node.log())


class RefusalTests(MeshTestCase):
    def test_other_ca_and_unlisted_node(self) -> None:
        a = Node(self, "a", self.ca)
        stranger = Node(self, "s", trustme.CA())  # another CA
        unlisted = Node(self, "u", self.ca)  # the right CA, but a lists only b
        a.configure(["ssl:host=127.0.0.1:port=1:node=b"])
        a.start()
        a.wait_listening()
        for node in (stranger, unlisted):
            node.configure([a.peer_entry()])
            node.start()
        for node in (stranger, unlisted):
            node.wait_listening()
        self.wait_for("the unlisted node refused", lambda: "'u' is not one of cluster.peers" in a.log())
        self.wait_for("the other CA's node refused", lambda: "lost before its hello" in a.log())
        self.assertEqual(a.links(), {})
        self.assertEqual(stranger.links(), {})
        self.assertIn("refused: node 'u' is not one of cluster.peers", unlisted.log())
        # The stranger's side says why too: a's certificate is not its CA's.
        self.wait_for("the stranger logged it", lambda: "lost before its hello" in stranger.log())


class KillTests(MeshTestCase):
    def test_sigkill_and_restart(self) -> None:
        nodes = self.nodes("a", "b", "c")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        on_a, on_b, on_c = a.client(), b.client(), c.client()
        for client in (on_a, on_b, on_c):
            client.request("SUBSCRIBE", {"id": "1", "destination": "/topic/k", "ack": "auto"})
        publisher = a.client()
        self.flowing(publisher, "/topic/k", [on_b, on_c])
        b.kill()
        # The rest keep flowing: c still gets a's messages, a its own.
        for i in range(20):
            publisher.send("/topic/k", b"during%d" % i)
        publisher.request("SEND", {"destination": "/topic/k"}, b"mark")
        deadline = time.monotonic() + FLOW_TIMEOUT
        self.assertEqual(len(counted(on_c.until(b"mark", deadline))), 21)
        self.assertEqual(len(counted(on_a.until(b"mark", deadline))), 21)
        self.wait_for("a noticed b is gone", lambda: "b" not in a.links())
        b.start()
        b.wait_listening()
        on_b = b.client()
        on_b.request("SUBSCRIBE", {"id": "1", "destination": "/topic/k", "ack": "auto"})
        self.flowing(publisher, "/topic/k", [on_b])
        publisher.request("SEND", {"destination": "/topic/k"}, b"after")
        self.assertEqual(counted(on_b.until(b"after", time.monotonic() + FLOW_TIMEOUT))[b"after"], 1)
        self.wait_for("b linked to a and c again", lambda: set(b.links()) == {"a", "c"})


class DistanceTests(MeshTestCase):
    def test_delayed_link(self) -> None:
        a = Node(self, "a", self.ca)
        b = Node(self, "b", self.ca)
        proxy = DelayingProxy(a.peer_port, DELAY)
        self.addCleanup(proxy.close)
        # Only b dials, through the proxy: every byte between them is late.
        a.configure([])
        b.configure([f"ssl:host=127.0.0.1:port={proxy.port}:node=a"])
        for node in (a, b):
            node.start()
        for node in (a, b):
            node.wait_listening()
        on_a = a.client()
        on_a.request("SUBSCRIBE", {"id": "1", "destination": "/topic/far", "ack": "auto"})
        publisher = b.client()
        self.flowing(publisher, "/topic/far", [on_a])
        started = time.monotonic()
        for i in range(1000):
            publisher.send("/topic/far", b"f%d" % i)
        publisher.request("SEND", {"destination": "/topic/far"}, b"last")
        got = counted(on_a.until(b"last", time.monotonic() + FLOW_TIMEOUT))
        took = time.monotonic() - started
        self.assertEqual(got, {**{b"f%d" % i: 1 for i in range(1000)}, b"last": 1})
        rtt = self.wait_for("a round trip measured", lambda: b.links().get("a", {}).get("rtt_ms"))
        self.assertGreaterEqual(rtt, 2 * DELAY * 1000)
        self.assertEqual(a.links()["b"]["direction"], "in")
        # Far less than one round trip per message (1,000 would be 200 s).
        self.assertLess(took, 100 * 2 * DELAY)
        from twisted.python import log  # noqa: PLC0415

        log.msg(f"mesh test: 1,001 messages over a link with a {rtt:.0f} ms round trip in {took:.2f} s")


class DiscoveryTests(MeshTestCase):
    def test_one_peer_is_enough(self) -> None:
        nodes = {n: Node(self, n, self.ca) for n in "abc"}
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        a.configure([], advertise=True)
        for node in (b, c):
            node.configure([a.peer_entry()], advertise=True)
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.wait_listening()
        self.wait_for("b and c linked through what a told", lambda: "c" in b.links() and "b" in c.links())
        on_c = c.client()
        on_c.request("SUBSCRIBE", {"id": "1", "destination": "/topic/d", "ack": "auto"})
        publisher = b.client()
        self.flowing(publisher, "/topic/d", [on_c])
        publisher.request("SEND", {"destination": "/topic/d"}, b"direct")
        self.assertEqual(counted(on_c.until(b"direct", time.monotonic() + FLOW_TIMEOUT)), {b"direct": 1})
        self.assertGreater(b.links()["c"]["messages_out"], 0)
        self.assertEqual(a.links()["b"]["messages_in"], 0)
        watcher = a.client()
        watcher.request("SUBSCRIBE", {"id": "w", "destination": "/topic/system.peers", "ack": "auto"})
        self.wait_for("a's interest in system.peers at b", lambda: "//amq.topic/system.peers"
                      in b.links()["a"]["peer_interest"])
        # c going is announced on /topic/system.peers by a, and by b (its
        # announcement reaches a's subscriber over b's link to a).
        c.kill()
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + FLOW_TIMEOUT

        def announced() -> set[str]:
            return {e["node"] for e in got if e["peer"] == "c" and e["event"] == "down"}

        while announced() != {"a", "b"}:
            self.assertLess(time.monotonic(), deadline, f"c's going not announced by a and b: {got}")
            got += [json.loads(body) for body in watcher.messages(0.5)]

