"""Worker processes for real: C{twistd -n qmq --workers 2} on 127.0.0.1,
used by STOMP clients on raw sockets (L{tests.integration.test_mesh.Stomp}).

  - clients land on both workers: a CONNECTED frame's C{session} header
    starts with the node id of the worker that took the connection
    (C{w0.} or C{w1.}), and C{/api/v1/links} names the worker that answered;
  - topic fan-out across workers, exactly once: subscribers on both
    workers, publishers on both, every message reaches every subscriber
    once;
  - a queue whose home is the other worker (the stable hash of its
    virtual host and name), produced and consumed with acks from w0;
  - an auto-ack consumer of that queue on w0 that stops reading and
    leaves mid-stream: each message either reached it or is in the queue
    again, once;
  - an exchange and a binding declared in the configuration: publishes on
    both workers reach the bound queue once each;
  - AMQP (pika): publishes with confirms on several connections, consumed
    with acks on another;
  - a headers exchange: queues homed on each worker, bound with x-match
    all and any (over AMQP, from w0), get what is published on either
    worker (STOMP and AMQP publishers chosen per worker) that matches,
    once, and nothing else;
  - SIGKILL of a queue's home worker under receipted persistent load from
    both workers: the supervisor starts it again, it serves again (clients
    land on it, its link is up again), and every message given a RECEIPT
    is in the queue, recovered from the worker's own commit log;
  - a restart with 3 workers keeps the messages sent with 2; one worker on
    that data directory is refused;
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
from collections.abc import Callable, Iterable
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


def probe_until_flowing(publish: Callable[[str, bytes], None], publishers: Iterable[str],
                        subscribers: dict[Any, Stomp]) -> None:
    """Interest takes a round trip to reach a node: C{publish(name, body)}
    sends a probe from each of C{publishers} until every subscriber saw one
    from each."""
    deadline = time.monotonic() + FLOW_TIMEOUT
    waiting = {(p, s) for p in publishers for s in subscribers}
    while waiting:
        assert time.monotonic() < deadline, f"no probe reached {sorted(waiting)}"
        for p in {p for p, _ in waiting}:
            publish(p, f"probe-{p}".encode())
        for s, client in subscribers.items():
            for body in client.messages(0.2):
                waiting.discard((body.decode().removeprefix("probe-"), s))


def until_ends(client: Stomp, publishers: Iterable[str]) -> list[bytes]:
    """What C{client} gets up to the marker C{end-NAME} of each of
    C{publishers}, probes and markers left out."""
    got: list[bytes] = []
    deadline = time.monotonic() + FLOW_TIMEOUT
    for p in publishers:
        if f"end-{p}".encode() not in got:
            got += client.until(f"end-{p}".encode(), deadline)
    return [b for b in got if not b.startswith((b"probe-", b"end-"))]


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
    #: More tables for the configuration (TOML, after the others).
    extra = ""

    def setUp(self) -> None:
        self.dir = Path(self.mktemp()).resolve()
        self.dir.mkdir(parents=True)
        self.stomp_port, self.http_port, self.amqp_port = free_port(), free_port(), free_port()
        listen = [
            f"stomp:tcp:{self.stomp_port}:interface=127.0.0.1:backlog=1024",
            f"http:tcp:{self.http_port}:interface=127.0.0.1",
            f"amqp:tcp:{self.amqp_port}:interface=127.0.0.1",
        ]
        (self.dir / "qmq.toml").write_text(
            f'data_dir = "{self.dir / "data"}"\nlisten = {json.dumps(listen)}\n\n'
            "[cluster]\nheartbeat = 1.0\n\n[workers]\nrestart_delay = 0.2\nstop_timeout = 10.0\n\n"
            '[[vhosts."/".exchanges]]\nname = "ex"\ntype = "topic"\n\n'
            '[[vhosts."/".queues]]\nname = "bound"\n\n'
            '[[vhosts."/".bindings]]\nqueue = "bound"\nexchange = "ex"\nrouting_key = "k.#"\n'
            + self.extra
        )
        self.output = (self.dir / "supervisor.log").open("wb")
        self.addCleanup(self.output.close)
        self.launch(2)

    def launch(self, workers: int) -> None:
        """Start C{twistd -n qmq --workers N}; wait until every worker answers,
        linked to another."""
        process = self.process = subprocess.Popen(
            twistd_command()
            + ["-n", "--pidfile=", "qmq", "--config", str(self.dir / "qmq.toml"), "--workers", str(workers)],
            cwd=self.dir,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

        def cleanup() -> None:
            # The workers stop by themselves when the supervisor is gone
            # (their lifeline): their pids are not killed here, they may
            # have been reused.
            if process.poll() is None:
                process.kill()
                process.wait(10)

        self.addCleanup(cleanup)
        names = {f"w{i}" for i in range(workers)}
        self.wait_for(f"{workers} workers linked", lambda: self.linked(names), START_TIMEOUT)

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
        """Each of C{workers} answered, with its links to the others up."""
        seen: dict[str, bool] = {}
        for _ in range(20 * len(workers)):
            try:
                answer = self.links()
            except OSError:
                return False
            up = sum(link["state"] == "up" for link in answer["links"])
            seen[answer["node"]] = up >= len(workers) - 1
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

    def amqp_on(self, worker: str) -> Any:
        """A pika connection that landed on C{worker} (connecting until one
        does): the one new AMQP connection in the whole broker's listing
        names its node."""
        import pika  # noqa: PLC0415

        params = pika.ConnectionParameters("127.0.0.1", self.amqp_port, connection_attempts=3)

        def amqp_ids() -> dict[str, str]:
            url = f"http://127.0.0.1:{self.http_port}/api/v1/connections?limit=1000"
            with urllib.request.urlopen(url, timeout=10) as r:
                doc = json.load(r)
            assert doc["missing"] == {}, doc["missing"]
            return {c["id"]: c["node"] for c in doc["connections"] if c["protocol"] == "amqp"}

        for _ in range(50):
            before = amqp_ids()
            conn = pika.BlockingConnection(params)
            new = {cid: node for cid, node in amqp_ids().items() if cid not in before}
            if list(new.values()) == [worker]:
                self.addCleanup(lambda c=conn: c.is_open and c.close())
                return conn
            conn.close()
        raise AssertionError(f"no AMQP connection landed on {worker} in 50")

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

    def test_queueHomedElsewhere(self) -> None:
        """A queue whose home is w1 (the stable hash of "/" and "h0"),
        produced and consumed with acks on w0: every message once, acked on
        its home (nothing left there); what a consumer held unacked when it
        left comes back, redelivered, to a consumer on the home."""
        producer = self.client_on("w0")
        consumer = self.client_on("w0")
        consumer.receipts += 1
        consumer.sock.sendall(
            frame(
                "SUBSCRIBE",
                {"destination": "/queue/h0", "id": "1", "ack": "client-individual", "prefetch-count": "20",
                 "receipt": "sub"},
            )
        )
        command, headers, _ = consumer.read()
        self.assertEqual((command, headers.get("receipt-id"), headers.get("home")), ("RECEIPT", "sub", "w1"))
        for i in range(MESSAGES):
            producer.request("SEND", {"destination": "/queue/h0", "persistent": "true"}, f"m{i}".encode())
        got = []
        deadline = time.monotonic() + FLOW_TIMEOUT
        while len(got) < MESSAGES - 10 and time.monotonic() < deadline:
            command, headers, body = consumer.read()
            self.assertEqual(command, "MESSAGE")
            got.append(body)
            consumer.sock.sendall(frame("ACK", {"id": headers["ack"]}))
        held = []
        while len(got) + len(held) < MESSAGES and time.monotonic() < deadline:
            command, headers, body = consumer.read()
            held.append(body)  # not acked
        self.assertEqual(sorted(got + held), sorted(f"m{i}".encode() for i in range(MESSAGES)))
        consumer.close()
        home = self.client_on("w1")
        home.sock.sendall(frame("SUBSCRIBE", {"destination": "/queue/h0", "id": "1", "ack": "auto"}))
        again = []
        while len(again) < len(held) and time.monotonic() < deadline:
            command, headers, body = home.read()
            self.assertEqual(headers.get("redelivered"), "true", body)
            again.append(body)
        self.assertEqual(sorted(again), sorted(held))
        self.assertEqual(home.messages(1.0), [])  # the acked ones are gone

    def test_autoAckConsumerLeavesMidStream(self) -> None:
        """An auto-ack consumer on w0 of /queue/h0 (homed on w1) stops
        reading while 3,000 messages of 4 KiB stream to it (its socket
        fills; the rest waits on w0, in flight on the link, or on the home),
        then unsubscribes: every message is either among those it had been
        sent or in the queue again for a consumer on the home, each once."""
        producer = self.client_on("w1")
        total = 3000
        for i in range(total):
            producer.send("/queue/h0", b"%05d" % i + b"x" * 4096)
        producer.request("SEND", {"destination": "/queue/h0"}, b"end" + b"x" * 4096)
        consumer = self.client_on("w0")
        consumer.sock.sendall(frame("SUBSCRIBE", {"destination": "/queue/h0", "id": "1", "ack": "auto"}))
        time.sleep(1.0)  # not read: the socket's buffers fill, w0 holds the rest
        consumer.request("UNSUBSCRIBE", {"id": "1"})  # what came first is kept
        first = consumer.messages(0.5)  # with those read while waiting for the receipt
        self.assertLess(len(first), total + 1, "the consumer was never paused: nothing to test")
        home = self.client_on("w1")
        home.request("SUBSCRIBE", {"destination": "/queue/h0", "id": "1", "ack": "auto"})
        rest: list[bytes] = []
        deadline = time.monotonic() + FLOW_TIMEOUT
        while len(first) + len(rest) < total + 1 and time.monotonic() < deadline:
            rest += home.messages(1.0)
        names = sorted(body[:5] for body in first + rest)
        self.assertEqual(names, sorted([b"%05d" % i for i in range(total)] + [b"endxx"]))

    def test_configuredBinding(self) -> None:
        """An exchange and a queue bound to it, declared in the
        configuration: publishes on both workers reach the queue (on its
        home) once each, consumed from either worker."""
        publishers = {w: self.client_on(w) for w in ("w0", "w1")}
        for worker, publisher in publishers.items():
            for i in range(50):
                publisher.request("SEND", {"destination": "/exchange/ex/k.x"}, f"{worker}-{i}".encode())
        # "bound" lives on w1: consumed from w0, through the link.
        consumer = self.client_on("w0")
        consumer.request("SUBSCRIBE", {"destination": "/queue/bound", "id": "1", "ack": "auto"})
        got: list[bytes] = []
        deadline = time.monotonic() + FLOW_TIMEOUT
        while len(got) < 100 and time.monotonic() < deadline:
            got += consumer.messages(1.0)
        self.assertEqual(sorted(got), sorted(f"{w}-{i}".encode() for w in publishers for i in range(50)))

    def test_amqp(self) -> None:
        """AMQP 0-9-1 (pika) on shared listeners, a durable queue homed on
        w1: two connections on w1 declare it and publish with confirms; a
        consumer on w0, where no client named it before, finds it (a
        passive declare answers w1's count) and consumes with acks; then
        connections on w0 publish (forwarded to w1) and a consumer on w1
        takes the rest: every message once."""
        import pika  # noqa: PLC0415

        from tests.integration.test_workers_manage import homed  # noqa: PLC0415

        queue = homed("w1", "amqp-q")

        def publish(worker: str, n: int) -> None:
            ch = self.amqp_on(worker).channel()
            ch.confirm_delivery()
            ch.queue_declare(queue, durable=True)
            for i in range(25):
                ch.basic_publish("", queue, f"{n}-{i}".encode(), pika.BasicProperties(delivery_mode=2))
            ch.connection.close()

        def consume(worker: str, count: int) -> list[bytes]:
            ch = self.amqp_on(worker).channel()
            self.assertEqual(ch.queue_declare(queue, passive=True).method.message_count, count)
            ch.basic_qos(prefetch_count=10)
            got = []
            for method, _props, body in ch.consume(queue, inactivity_timeout=FLOW_TIMEOUT):
                if method is None:
                    break
                got.append(body)
                ch.basic_ack(method.delivery_tag)
                if len(got) == count:
                    break
            ch.cancel()
            ch.connection.close()
            return got

        for n in (0, 1):
            publish("w1", n)
        got = consume("w0", 50)
        for n in (2, 3):
            publish("w0", n)
        got += consume("w1", 50)
        self.assertEqual(sorted(got), sorted(f"{n}-{i}".encode() for n in range(4) for i in range(25)))

    def test_headersExchange(self) -> None:
        """Queues homed on each worker, bound to amq.headers (x-match all
        and any) over AMQP from w0: what is published on either worker
        (STOMP: text headers; AMQP: typed ones) reaches each queue whose
        binding matches, once, and no other."""
        import pika  # noqa: PLC0415

        from tests.integration.test_workers_manage import homed  # noqa: PLC0415

        bindings = {
            "all": {"x-match": "all", "a": "1", "b": "x"},
            "any": {"x-match": "any", "a": 2, "c": "y"},
        }
        queues = {(w, kind): homed(w, f"h{kind}") for w in ("w0", "w1") for kind in bindings}
        ch = self.amqp_on("w0").channel()
        for (_, kind), queue in queues.items():
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, "amq.headers", arguments=bindings[kind])
        consumers = {}
        for key, queue in queues.items():
            consumer = consumers[key] = self.client()
            consumer.request("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "auto"})
        publishers = {w: self.client_on(w) for w in ("w0", "w1")}
        every = {"a": "1", "b": "x", "c": "y"}  # matches every binding

        def send(worker: str, headers: dict[str, str], body: bytes) -> None:
            publishers[worker].sock.sendall(
                frame("SEND", {"destination": "/exchange/amq.headers/r", **headers}, body))

        # Interest reaches the other worker a round trip after the binding.
        probe_until_flowing(lambda worker, body: send(worker, every, body), publishers, consumers)
        cases = [
            ({"a": "1", "b": "x"}, "all"),
            ({"a": "2"}, "any"),
            ({"a": "1", "c": "y"}, "any"),  # b missing: not all
            ({"a": "1"}, None),
            ({"b": "x", "c": "z"}, None),
        ]
        typed = [({"a": 1, "b": "x"}, "all"), ({"a": 2}, "any"), ({"a": 3}, None)]
        expected: dict[str, list[bytes]] = {kind: [] for kind in bindings}
        for worker in publishers:
            # AMQP first, confirmed: it is on the link before the markers below.
            amqp = self.amqp_on(worker).channel()
            amqp.confirm_delivery()
            for i, (headers, kind) in enumerate(typed):
                body = f"amqp-{worker}-{i}".encode()
                amqp.basic_publish("amq.headers", "r", body, pika.BasicProperties(headers=headers))
                if kind:
                    expected[kind].append(body)
            for i, (headers, kind) in enumerate(cases):
                body = f"stomp-{worker}-{i}".encode()
                send(worker, headers, body)
                if kind:
                    expected[kind].append(body)
            send(worker, every, f"end-{worker}".encode())
        for (home, kind), consumer in consumers.items():
            self.assertEqual(sorted(until_ends(consumer, publishers)), sorted(expected[kind]), (home, kind))

    def test_killWorker(self) -> None:
        """SIGKILL of w1, the home of /queue/h0, while producers on both
        workers send persistent messages to it with receipts: w1 is started
        again, serves again, and every receipted message is in its queue
        (recovered from w1's own log), consumed from w0 through the link."""
        # Half on w1 (its queue, local), half on w0 (forwarded to w1 with a
        # confirm from its store before each RECEIPT).
        producers = [self.client_on(("w0", "w1")[i % 2]) for i in range(PRODUCERS)]
        receipted: list[bytes] = []
        stop = threading.Event()

        def produce(index: int, producer: Stomp) -> None:
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    body = f"{index}-{n}".encode()
                    producer.request("SEND", {"destination": "/queue/h0", "persistent": "true"}, body)
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
        consumer = self.client_on("w0")  # through the link to the queue's home
        consumer.request("SUBSCRIBE", {"destination": "/queue/h0", "id": "1", "ack": "auto"})
        deadline = time.monotonic() + FLOW_TIMEOUT
        got: set[bytes] = set()
        while not set(receipted) <= got and time.monotonic() < deadline:
            got.update(consumer.messages(1.0))
        lost = sorted(set(receipted) - got)
        log.msg(f"workers kill test: {len(receipted)} receipted, {len(got)} consumed after the restart, {len(lost)} lost")
        self.assertEqual(lost, [], f"{len(lost)} of {len(receipted)} receipted messages lost")
        self.assertIn("worker w1 ended by signal 9", self.log())


class CountChangeTests(WorkersCase):
    def test_moreWorkersKeepMessages(self) -> None:
        """Persistent messages sent with 2 workers are all there after a
        restart with 3, those of a queue whose home moved too (sent on to
        the new home); one worker on that data directory is refused,
        naming how many to run."""
        producer = self.client()
        # keep3's home is w1 with 2 workers and with 3, keep0's w0 with
        # both; keep1's moves from w0 to w2 (w0 sends its messages on).
        for queue in ("keep3", "keep0", "keep1"):
            for i in range(50):
                producer.request("SEND", {"destination": f"/queue/{queue}", "persistent": "true"}, f"{queue}-{i}".encode())
        producer.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)
        single = subprocess.run(
            twistd_command() + ["-n", "--pidfile=", "qmq", "--config", str(self.dir / "qmq.toml")],
            cwd=self.dir, env=environment(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )  # fmt: skip
        self.assertEqual(single.returncode, 1)
        self.assertIn(b"workers.count: the data directory", single.stderr)
        self.assertIn(b"holds the commit logs of 2 workers", single.stderr)
        self.launch(3)
        # keep1 from w1: through the link to w2, where w0 moved them.
        for queue, worker in (("keep3", None), ("keep0", None), ("keep1", "w1")):
            consumer = self.client_on(worker) if worker else self.client()
            consumer.request("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "auto"})
            got: list[bytes] = []
            deadline = time.monotonic() + FLOW_TIMEOUT
            while len(got) < 50 and time.monotonic() < deadline:
                got += consumer.messages(1.0)
            self.assertEqual(sorted(got), sorted(f"{queue}-{i}".encode() for i in range(50)), queue)
            consumer.close()
        self.assertIn("queue 'keep1' of virtual host '/' has its home on 'w2' now", self.log())


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
