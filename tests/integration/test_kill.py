"""SIGKILL the real broker (C{twistd -n qmq}, C{store = "log"}) under load.

The broker runs as a user runs it (see L{tests.integration.test_twistd}),
with the commit log and C{fsync = "always"}.  Producers on raw sockets send
C{persistent:true} SENDs to the durable C{/queue/k}, each with a receipt,
a window at a time; the broker is killed with SIGKILL three times while
they do, and started again on the same data directory.  Producers resend, at
the next start, what had no RECEIPT when the broker died (as an
at-least-once client does).  At the end everything in C{/queue/k} is
consumed, and:

  - every body that got a RECEIPT is delivered (a loss fails);
  - a body is delivered at most as many times as it was sent (duplicates
    come only from resending a SEND whose RECEIPT the kill swallowed; they
    are counted);
  - nothing is delivered that was never sent.

Also kept across the kills: a queue made by a SUBSCRIBE (C{/queue/x}, with
the message it held unacknowledged), a message given back by a NACK (still
C{redelivered:true} with its delivery count), and a durable topic
subscription (its queue and its binding: a message published to the topic
after the restart, before the subscriber is back, reaches it).

Every wait has a deadline; the whole test takes about 15 s and at most
L{KillTests.timeout}.  What was measured is logged (C{test.log}) as one
line per kill, C{kill test: ...}.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.python import log
from twisted.trial import unittest

from tests.integration.test_twistd import free_port, start_qmq

START_TIMEOUT = 20.0
#: Producers, and the SENDs each keeps in flight.
PRODUCERS = 4
WINDOW = 20
KILLS = 3
#: Receipts wanted in a phase before the kill may come.
MIN_RECEIPTS = 300
#: Each phase's deadline, in seconds.
PHASE_TIMEOUT = 10.0

Frame = tuple[str, dict[str, str], bytes]


def encode(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [command, *(f"{k}:{v}" for k, v in (headers or {}).items())]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


class Client:
    """
    A STOMP 1.2 client on a blocking socket (no heart-beats).

    @ivar inbox: frames read while waiting for another one, in order.
    """

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = bytearray()
        self.pos = 0
        self.inbox: list[Frame] = []
        self.send(
            "CONNECT",
            {"accept-version": "1.2", "host": "127.0.0.1", "heart-beat": "0,0", **(headers or {})},
        )
        frame = self.read()
        if frame is None or frame[0] != "CONNECTED":
            raise AssertionError(f"CONNECT answered with {frame!r}")

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock.sendall(encode(command, headers, body))

    def read(self) -> Frame | None:
        """
        @return: the next frame, or None once the connection is closed.
        """
        buffer = self.buffer
        while True:
            start = self.pos
            while start < len(buffer) and buffer[start] in b"\r\n":
                start += 1
            end = buffer.find(b"\x00", start)
            if end >= 0:
                raw = bytes(buffer[start:end])
                self.pos = end + 1
                head, _, body = raw.partition(b"\n\n")
                command, *lines = head.decode().split("\n")
                headers: dict[str, str] = {}
                for line in lines:
                    key, _, value = line.partition(":")
                    headers.setdefault(key, value)
                return command, headers, body
            try:
                data = self.sock.recv(262144)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                return None
            del buffer[: self.pos]
            self.pos = 0
            buffer += data

    def wait(self, match: Callable[[Frame], bool], deadline: float, what: str) -> Frame:
        """
        The first frame (from the inbox, then the wire) that C{match}es;
        the others are kept in the inbox.
        """
        for i, frame in enumerate(self.inbox):
            if match(frame):
                return self.inbox.pop(i)
        while time.monotonic() < deadline:
            frame = self.read()
            if frame is None:
                raise AssertionError(f"connection closed while waiting for {what}")
            if frame[0] == "ERROR":
                raise AssertionError(f"ERROR while waiting for {what}: {frame!r}")
            if match(frame):
                return frame
            self.inbox.append(frame)
        raise AssertionError(f"no {what} before the deadline")

    def request(self, command: str, headers: dict[str, str], body: bytes = b"") -> Frame:
        """Send a frame with a receipt and wait for the RECEIPT."""
        receipt = f"{command.lower()}-{id(headers)}-{time.monotonic_ns()}"
        self.send(command, {**headers, "receipt": receipt}, body)
        return self.wait(
            lambda f: f[0] == "RECEIPT" and f[1].get("receipt-id") == receipt,
            time.monotonic() + PHASE_TIMEOUT,
            f"the RECEIPT of {command} {headers}",
        )

    def close(self) -> None:
        self.sock.close()


class Producer(threading.Thread):
    """
    Sends persistent SENDs to C{/queue/k}, WINDOW at a time, each with a
    receipt named as its body, until stopped or the broker goes away.

    State kept across phases (one Producer per phase shares a L{Ledger}).
    """

    def __init__(self, port: int, ledger: Ledger, stop: threading.Event, new: bool) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.ledger = ledger
        self.stop = stop
        self.new = new
        self.error: str | None = None

    def run(self) -> None:
        ledger = self.ledger
        try:
            client = Client(self.port)
        except (OSError, AssertionError) as e:
            self.error = f"connect: {e}"
            return
        try:
            while not self.stop.is_set():
                batch = ledger.resend[:WINDOW]
                del ledger.resend[: len(batch)]
                while self.new and len(batch) < WINDOW:
                    batch.append(ledger.next_body())
                if not batch:
                    return
                data = []
                for body in batch:
                    ledger.sent[body] += 1
                    ledger.outstanding[body] = None
                    data.append(
                        encode(
                            "SEND",
                            {"destination": "/queue/k", "persistent": "true", "receipt": body},
                            body.encode(),
                        )
                    )
                try:
                    client.sock.sendall(b"".join(data))
                except OSError:
                    return
                for _ in batch:
                    try:
                        frame = client.read()
                    except OSError:
                        return
                    if frame is None:
                        return
                    command, headers, _ = frame
                    if command != "RECEIPT":
                        self.error = f"{command} {headers}"
                        return
                    body = headers["receipt-id"]
                    ledger.outstanding.pop(body)
                    ledger.receipted.add(body)
                    ledger.phase_receipts += 1
        finally:
            client.close()


class Ledger:
    """
    What one producer sent and had receipted, across phases.

    @ivar sent: times each body was sent.
    @ivar outstanding: bodies sent and not yet receipted.
    @ivar resend: bodies to send again at the next start.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.seq = 0
        self.sent: Counter[str] = Counter()
        self.receipted: set[str] = set()
        self.outstanding: dict[str, None] = {}
        self.resend: list[str] = []
        self.phase_receipts = 0

    def next_body(self) -> str:
        self.seq += 1
        return f"{self.name}-{self.seq}"


class KillTests(unittest.TestCase):
    """
    SIGKILL C{twistd -n qmq} with the commit log under publish load.
    """

    timeout = 60

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.data_dir = self.workdir / "data"
        self.config = self.workdir / "qmq.toml"
        # Small segments, so the load rolls and deletes segments as it goes.
        self.config.write_text(
            f'data_dir = "{self.data_dir}"\nstore = "log"\n\n'
            '[commit_log]\nfsync = "always"\nsegment_size = 262144\n'
        )
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        """Start the broker on a new port; return the port once it listens."""
        port = free_port()
        self.runs += 1
        process = self.process = start_qmq(
            self,
            ["--config", str(self.config), "--listen", f"stomp:tcp:{port}:interface=127.0.0.1:backlog=1024"],
            self.workdir,
            self.workdir / f"broker-{self.runs}.log",
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                self.fail(f"twistd exited with {process.returncode}:\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                return port
            except OSError:
                if time.monotonic() > deadline:
                    self.fail(f"the broker did not listen on {port}:\n{self.output()}")
                time.sleep(0.05)

    def output(self, run: int | None = None) -> str:
        runs = [run] if run is not None else range(1, self.runs + 1)
        return "".join(
            (self.workdir / f"broker-{r}.log").read_text(errors="replace") for r in runs
        )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.assertEqual(self.process.returncode, -signal.SIGKILL)

    def setup_topology(self, port: int) -> Client:
        """
        Before the first kill: a durable topic subscription (then left), a
        message for it, a queue made by SUBSCRIBE holding a message
        unacknowledged, and a NACKed message delivered again.  Returns the
        connection holding those deliveries (the kill ends it).
        """
        deadline = time.monotonic() + PHASE_TIMEOUT
        subscriber = Client(port, {"client-id": "kt"})
        subscriber.request(
            "SUBSCRIBE", {"destination": "/topic/t", "id": "dur", "durable": "true", "ack": "auto"}
        )
        subscriber.request("DISCONNECT", {})
        subscriber.close()

        client = Client(port)
        client.request("SEND", {"destination": "/topic/t", "persistent": "true"}, b"topic-before")
        client.request("SUBSCRIBE", {"destination": "/queue/x", "id": "x", "ack": "client"})
        client.request("SEND", {"destination": "/queue/x", "persistent": "true"}, b"x-1")
        client.wait(lambda f: f[0] == "MESSAGE" and f[2] == b"x-1", deadline, "x-1")
        client.request("SEND", {"destination": "/queue/r", "persistent": "true"}, b"r-1")
        client.request(
            "SUBSCRIBE", {"destination": "/queue/r", "id": "r", "ack": "client-individual"}
        )
        first = client.wait(lambda f: f[0] == "MESSAGE" and f[2] == b"r-1", deadline, "r-1")
        self.assertNotIn("redelivered", first[1])
        client.request("NACK", {"id": first[1]["ack"]})
        again = client.wait(lambda f: f[0] == "MESSAGE" and f[2] == b"r-1", deadline, "r-1 again")
        self.assertEqual(again[1].get("redelivered"), "true")
        return client

    def check_topology(self, port: int) -> None:
        """After the last restart: all that L{setup_topology} made is back."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        client = Client(port)
        self.addCleanup(client.close)
        # /queue/x still exists, with the message it held unacknowledged.
        count = client.request("SEND", {"destination": "/control/count-msgs/queue/x"})
        self.assertEqual(count[1].get("num-messages"), "1")
        client.request("SUBSCRIBE", {"destination": "/queue/x", "id": "x", "ack": "auto"})
        client.wait(lambda f: f[0] == "MESSAGE" and f[2] == b"x-1", deadline, "x-1")
        # The NACKed message is still marked as given back once.
        client.request("SUBSCRIBE", {"destination": "/queue/r", "id": "r", "ack": "auto"})
        _, headers, _ = client.wait(
            lambda f: f[0] == "MESSAGE" and f[2] == b"r-1", deadline, "r-1"
        )
        self.assertEqual(headers.get("redelivered"), "true", headers)
        self.assertEqual(headers.get("x-delivery-count"), "1", headers)
        # The durable subscription's queue and binding: a message published
        # while its subscriber is away reaches it.
        client.request("SEND", {"destination": "/topic/t", "persistent": "true"}, b"topic-after")
        subscriber = Client(port, {"client-id": "kt"})
        self.addCleanup(subscriber.close)
        subscriber.send(
            "SUBSCRIBE", {"destination": "/topic/t", "id": "dur", "durable": "true", "ack": "auto"}
        )
        bodies = [
            subscriber.wait(lambda f: f[0] == "MESSAGE", deadline, "a durable topic message")[2]
            for _ in range(2)
        ]
        self.assertEqual(bodies, [b"topic-before", b"topic-after"])

    def load(self, port: int, ledgers: list[Ledger], rng: random.Random) -> dict[str, Any]:
        """Run the producers until enough receipts came, then kill the broker."""
        stop = threading.Event()
        for ledger in ledgers:
            ledger.phase_receipts = 0
        producers = [Producer(port, ledger, stop, new=True) for ledger in ledgers]
        for producer in producers:
            producer.start()
        deadline = time.monotonic() + PHASE_TIMEOUT
        while sum(ledger.phase_receipts for ledger in ledgers) < MIN_RECEIPTS:
            if time.monotonic() > deadline or not any(p.is_alive() for p in producers):
                errors = [p.error for p in producers if p.error]
                self.fail(f"the producers got too few receipts: {errors}\n{self.output(self.runs)}")
            time.sleep(0.01)
        time.sleep(rng.uniform(0.05, 0.6))
        receipted = sum(ledger.phase_receipts for ledger in ledgers)
        self.kill()
        for producer in producers:
            producer.join(PHASE_TIMEOUT)
            self.assertFalse(producer.is_alive(), "a producer did not notice the kill")
        in_flight = []
        for ledger in ledgers:
            in_flight += ledger.outstanding
            ledger.resend = list(ledger.outstanding)
            ledger.outstanding.clear()
        return {
            "receipted": sum(ledger.phase_receipts for ledger in ledgers),
            "receipted_at_kill_signal": receipted,
            "in_flight": in_flight,
        }

    def drain(self, port: int, ledgers: list[Ledger]) -> None:
        """Resend what is unreceipted, with no kill, until all is receipted."""
        stop = threading.Event()
        producers = [Producer(port, ledger, stop, new=False) for ledger in ledgers]
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(PHASE_TIMEOUT)
            self.assertFalse(producer.is_alive(), "resending took too long")
            self.assertIsNone(producer.error)
        for ledger in ledgers:
            self.assertEqual(ledger.outstanding, {})

    def consume(self, port: int) -> Counter[str]:
        """Everything in /queue/k, by body."""
        client = Client(port)
        self.addCleanup(client.close)
        count = client.request("SEND", {"destination": "/control/count-msgs/queue/k"})
        expected = int(count[1]["num-messages"])
        client.send("SUBSCRIBE", {"destination": "/queue/k", "id": "k", "ack": "auto"})
        deadline = time.monotonic() + PHASE_TIMEOUT
        delivered: Counter[str] = Counter()
        for _ in range(expected):
            frame = client.wait(lambda f: f[0] == "MESSAGE", deadline, "a /queue/k message")
            delivered[frame[2].decode()] += 1
        count = client.request("SEND", {"destination": "/control/count-msgs/queue/k"})
        self.assertEqual(count[1].get("num-messages"), "0")
        return delivered

    def test_kill_9(self) -> None:
        """
        Three SIGKILLs under publish load lose no receipted message, and
        keep the durable topology and redelivery marks.
        """
        began = time.monotonic()
        seed = random.randrange(1 << 30)
        rng = random.Random(seed)
        ledgers = [Ledger(f"p{i}") for i in range(PRODUCERS)]
        phases = []
        port = self.start()
        holder = self.setup_topology(port)
        for kill in range(KILLS):
            if kill:
                port = self.start()
            phases.append(self.load(port, ledgers, rng))
            if kill == 0:
                holder.close()
        port = self.start()
        self.check_topology(port)
        self.drain(port, ledgers)
        delivered = self.consume(port)

        sent: Counter[str] = Counter()
        receipted: set[str] = set()
        for ledger in ledgers:
            sent.update(ledger.sent)
            receipted |= ledger.receipted
        lost = sorted(receipted - set(delivered))
        phantom = sorted(set(delivered) - set(sent))
        too_many = sorted(b for b, n in delivered.items() if n > sent[b])
        duplicates = sum(n - 1 for n in delivered.values())
        resent = sum(1 for n in sent.values() if n > 1)
        # Per kill: receipts of its phase, SENDs in flight when it came, and
        # how often those (sent again after it) were delivered: twice means
        # the first copy had reached the disk, only its RECEIPT was lost.
        summary = (
            f"kill test (seed {seed}): "
            + "; ".join(
                f"kill {i + 1}: {p['receipted']} receipted, {len(p['in_flight'])} in flight"
                f" (delivered once {sum(delivered[b] == 1 for b in p['in_flight'])},"
                f" twice {sum(delivered[b] == 2 for b in p['in_flight'])})"
                for i, p in enumerate(phases)
            )
            + f"; sent {len(sent)} bodies ({resent} resent), receipted {len(receipted)},"
            f" delivered {sum(delivered.values())} ({len(delivered)} distinct),"
            f" duplicates {duplicates}, lost {len(lost)}; {time.monotonic() - began:.1f} s"
        )
        log.msg(summary)
        (self.workdir / "summary.txt").write_text(summary + "\n")
        if lost:
            self.fail(f"{len(lost)} receipted messages lost, e.g. {lost[:5]} ({summary})")
        if phantom:
            self.fail(f"{len(phantom)} delivered but never sent, e.g. {phantom[:5]}")
        if too_many:
            self.fail(f"{len(too_many)} delivered more often than sent, e.g. {too_many[:5]}")
        self.assertEqual(len(receipted), len(sent), "every body ends receipted")

        # A graceful stop after all that.
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)
        output = self.output()
        self.assertIn("QMQ stopped", self.output(self.runs))
        self.assertNotIn("Traceback", output)
        self.assertIn("from the log store", self.output(2))
