#!/usr/bin/env python3
"""One broker process against two workers (docs/workers.rst), in one run.

For each worker count (default 1 then 2) the script starts
C{twistd -n qmq [--workers N]} (memory store, its own ports and data
directory), runs three short scenarios with raw STOMP clients in
separate processes, and prints one JSON line per scenario:

  queue    C{--pairs} producer/consumer pairs, each on its own queue,
           C{ack:auto}; the producer sends C{--messages} in batches of
           L{BATCH} with a RECEIPT on the last (two batches in flight);
  acks     the same with C{ack:client}, C{prefetch-count:500}, an ACK of
           the last message every 100;
  fanout   C{--subscribers} on one topic, spread over the workers, and one
           publisher per worker sharing C{--fanout-messages}; the rate is
           deliveries per second summed over subscribers.

Each queue lives on its home worker (the mesh's placement over the
workers). The queue scenarios run twice: C{clients: home}, producer and
consumer placed on the queue's home worker (connecting again until the
CONNECTED frame's C{session} names it): the best case, nothing crosses a
link; C{clients: any}, the average of where the kernel puts them without
its luck: pair I's producer is on the home when bit 0 of I is clear, on
another worker when set, its consumer likewise by bit 1 (with 4 pairs:
one each of home/home, away/home, home/away, away/away, so half of the
SENDs and half of the deliveries cross a link, as on average with 2
workers). Topics cross workers through the links.

Reported: rate (messages or deliveries per second, counted at the
consumers, from the first SEND to the last message), broker CPU seconds
(the supervisor and every worker: the process tree) and per message (µs),
and the load generator's CPU seconds (its processes' own): on a 2-core
machine the load generator takes a share of the cores the broker wants.

With C{--peers rabbitmq activemq} the peers (started by
C{../shared/peers/peers.sh}, or already running) then run the queue, acks
and fan-out scenarios with the same clients, as one worker does.

Run: C{PYTHONPATH=. python bench/workers_bench.py [--workers 1 2]
[--pairs 4] [--messages 100000] [--subscribers 10] [--fanout-messages 40000]
[--peers rabbitmq activemq]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import cpu_seconds  # noqa: E402

from qmq.cluster.placement import rendezvous  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Messages per SEND batch (the last one asks for a RECEIPT).
BATCH = 500
#: SEND batches a producer has in flight (each waits for its RECEIPT).
IN_FLIGHT = int(os.environ.get("BENCH_IN_FLIGHT", "2"))
BODY = b"x" * 100
ACK_HEADER = re.compile(rb"\nack:([^\n]*)\n")


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "\n".join([command] + [f"{k}:{v}" for k, v in headers.items()])
    return head.encode() + b"\n\n" + body + b"\x00"


class Conn:
    """A blocking STOMP connection that remembers its worker."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connect = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}
        if os.environ.get("BENCH_LOGIN"):  # a peer's (RabbitMQ's guest)
            connect["login"] = connect["passcode"] = os.environ["BENCH_LOGIN"]
        self.sock.sendall(frame("CONNECT", connect))
        data = b""
        while b"\x00" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before CONNECTED")
            data += chunk
        head = data.split(b"\x00", 1)[0].decode()
        if not head.startswith("CONNECTED"):
            raise ConnectionError(f"refused: {head[:300]!r}")
        sessions = [line[8:] for line in head.split("\n") if line.startswith("session:")]
        self.worker = sessions[0].split(".", 1)[0] if sessions else None


def connect_on(port: int, worker: str | None) -> Conn:
    for _ in range(500):
        conn = Conn(port)
        if worker is None or conn.worker == worker:
            return conn
        conn.sock.close()
    raise RuntimeError(f"no connection landed on {worker}")


def pair(port: int, worker: str | None, queue: str, messages: int, ack: bool) -> dict[str, float]:
    """One producer and one consumer of C{queue}: C{worker} is where both
    go, or C{"PRODUCER,CONSUMER"}."""
    on_producer, _, on_consumer = (worker or "").partition(",")
    consumer = connect_on(port, (on_consumer or on_producer) or None)
    producer = connect_on(port, on_producer or None)
    headers = {"destination": queue, "id": "1", "ack": "client" if ack else "auto"}
    if ack:
        headers["prefetch-count"] = headers["activemq.prefetchSize"] = "500"
    consumer.sock.sendall(frame("SUBSCRIBE", {**headers, "receipt": "s"}))
    consumer.sock.recv(65536)  # the RECEIPT
    batch = [frame("SEND", {"destination": queue}, BODY) for _ in range(BATCH - 1)]
    sel = selectors.DefaultSelector()
    sel.register(consumer.sock, selectors.EVENT_READ, "c")
    sel.register(producer.sock, selectors.EVENT_READ, "p")
    sent = received = batches = receipts = 0
    acked = 0
    tail = b""
    started = time.perf_counter()
    last = started
    while received < messages:
        while sent < messages and batches - receipts < IN_FLIGHT:
            batches += 1
            producer.sock.sendall(
                b"".join(batch) + frame("SEND", {"destination": queue, "receipt": str(batches)}, BODY)
            )
            sent += BATCH
        for key, _ in sel.select(30):
            data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            if not data:
                raise ConnectionError(f"{key.data} closed")
            if key.data == "p":
                if b"ERROR" in data:
                    raise ConnectionError(f"the producer got {data[:500]!r}")
                receipts += data.count(b"RECEIPT")
                continue
            received += data.count(b"\x00")
            last = time.perf_counter()
            if ack:
                tail = (tail + data)[-4096:]
                if received - acked >= 100 or received >= messages:
                    ids = ACK_HEADER.findall(tail)
                    if ids:
                        consumer.sock.sendall(frame("ACK", {"id": ids[-1].decode()}))
                        acked = received
    return {"received": received, "seconds": last - started}


def subscriber(port: int, worker: str | None, topic: str, expected: int, ready: str) -> dict[str, float]:
    conn = connect_on(port, worker)
    conn.sock.sendall(frame("SUBSCRIBE", {"destination": topic, "id": "1", "receipt": "s"}))
    conn.sock.recv(65536)
    Path(ready).touch()
    conn.sock.settimeout(3.0)
    received = 0
    first = last = None
    try:
        while received < expected:
            data = conn.sock.recv(1 << 20)
            if not data:
                break
            now = time.perf_counter()
            first = first or now
            last = now
            received += data.count(b"\x00")
    except TimeoutError:
        pass
    return {"received": received, "seconds": (last or 0) - (first or 0)}


def publisher(port: int, worker: str | None, topic: str, messages: int) -> dict[str, float]:
    conn = connect_on(port, worker)
    batch = b"".join(frame("SEND", {"destination": topic}, BODY) for _ in range(BATCH - 1))
    sent = n = 0
    while sent < messages:
        n += 1
        conn.sock.sendall(batch + frame("SEND", {"destination": topic, "receipt": str(n)}, BODY))
        data = b""
        while b"RECEIPT" not in data:
            data += conn.sock.recv(65536)
        sent += BATCH
    return {"sent": sent}


def role_main(argv: list[str]) -> None:
    """A load-generator process: run one role, print its result, and its CPU."""
    role, port, worker, *rest = argv
    w = None if worker == "-" else worker
    if role == "pair":
        result = pair(int(port), w, rest[0], int(rest[1]), rest[2] == "ack")
    elif role == "sub":
        result = subscriber(int(port), w, rest[0], int(rest[1]), rest[2])
    else:
        result = publisher(int(port), w, rest[0], int(rest[1]))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu"] = ru.ru_utime + ru.ru_stime
    print(json.dumps(result), flush=True)


def spawn(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", *map(str, args)], stdout=subprocess.PIPE, text=True
    )


def collect(processes: list[subprocess.Popen[str]]) -> list[dict[str, float]]:
    out = []
    for p in processes:
        stdout, _ = p.communicate(timeout=300)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, workers: int, directory: Path) -> None:
        self.workers = workers
        self.stomp, self.http = free_port(), free_port()
        conf = directory / f"qmq-{workers}.toml"
        conf.write_text(
            f'data_dir = "{directory / f"data-{workers}"}"\nstore = "memory"\n'
            f'listen = ["stomp:tcp:{self.stomp}:interface=127.0.0.1:backlog=1024", '
            f'"http:tcp:{self.http}:interface=127.0.0.1"]\n'
        )
        argv = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n", "--pidfile=",
                "qmq", "--config", str(conf)]
        if workers > 1:
            argv += ["--workers", str(workers)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.log = (directory / f"broker-{workers}.log").open("wb")
        self.process = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=directory)
        deadline = time.monotonic() + 60
        names: set[str] = set()
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not start")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/api/v1/links", timeout=5) as r:
                    answer = json.load(r)
                if workers == 1 or any(link["state"] == "up" for link in answer["links"]):
                    names.add(answer["node"])
                if len(names) >= workers:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        self.nodes = sorted(names) if workers > 1 else [None]

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid, tree=True)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.log.close()


class PeerBroker:
    """A peer (RabbitMQ's STOMP, ActiveMQ) started by C{peers.sh}, run with
    the same clients as one QMQ worker (C{clients: any})."""

    PORTS = {"rabbitmq": 61633, "activemq": 61623}

    def __init__(self, name: str) -> None:
        from compare import Peer

        self.workers = name
        self.stomp = self.PORTS[name]
        self.nodes: list[str | None] = [None]
        self.peer = Peer(name, self.stomp, ROOT.parent / "shared", wipe=False, adopt=True)
        self.peer.start()
        if name == "rabbitmq":
            os.environ["BENCH_LOGIN"] = "guest"

    def cpu(self) -> float:
        return cpu_seconds(self.peer.pid, tree=True)

    def stop(self) -> None:
        os.environ.pop("BENCH_LOGIN", None)
        self.peer.stop()


def measure(broker: Broker | PeerBroker, scenario: str, make: object) -> dict[str, object]:
    cpu0 = broker.cpu()
    processes, count_key = make()  # type: ignore[operator]
    results = collect(processes)
    broker_cpu = broker.cpu() - cpu0
    counted = sum(r.get("received", 0) for r in results)
    seconds = max(r["seconds"] for r in results if "seconds" in r)
    gen_cpu = sum(r["cpu"] for r in results)
    return {
        "scenario": scenario,
        "workers": broker.workers,
        count_key: counted,
        "rate": round(counted / seconds) if seconds else None,
        "seconds": round(seconds, 3),
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_msg": round(broker_cpu / counted * 1e6, 2) if counted else None,
        "loadgen_cpu_s": round(gen_cpu, 3),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--role":
        role_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--subscribers", type=int, default=10)
    ap.add_argument("--fanout-messages", type=int, default=40_000)
    ap.add_argument("--peers", nargs="*", default=[], choices=sorted(PeerBroker.PORTS),
                    help="peers run after QMQ with the same clients (peers.sh starts them; ../shared/peers)")
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="qmq-workers-bench-"))
    try:
        for workers in [*args.workers, *args.peers]:
            broker = Broker(workers, directory) if isinstance(workers, int) else PeerBroker(workers)
            try:
                run = f"{workers}-{int(time.time())}"
                nodes = broker.nodes
                for scenario, ack, placed in (
                    ("queue", False, "home"), ("acks", True, "home"), ("queue", False, "any"), ("acks", True, "any")
                ):
                    if placed == "home" and isinstance(workers, str):
                        continue  # a peer has no homes
                    def pairs(
                        scenario: str = scenario, ack: bool = ack, placed: str = placed, broker: Any = broker,
                        nodes: list = nodes, run: str = run,
                    ) -> tuple[list[subprocess.Popen[str]], str]:
                        procs = []
                        for i in range(args.pairs):
                            name = f"b-{run}-{scenario}-{placed}-{i}"
                            where = "-"
                            if nodes != [None]:
                                home = nodes.index(rendezvous("/", name, nodes))
                                if placed == "home":
                                    where = nodes[home]
                                else:  # every combination in turn: see the module docstring
                                    away = nodes[(home + 1) % len(nodes)]
                                    where = f"{(nodes[home], away)[i & 1]},{(nodes[home], away)[(i >> 1) & 1]}"
                            procs.append(spawn("pair", broker.stomp, where, f"/queue/{name}", args.messages,
                                               "ack" if ack else "auto"))
                        return procs, "messages"

                    print(json.dumps({**measure(broker, scenario, pairs), "clients": placed}), flush=True)

                def fanout(
                    broker: Any = broker, nodes: list = nodes, run: str = run
                ) -> tuple[list[subprocess.Popen[str]], str]:
                    topic = f"/topic/b-{run}-fanout"
                    per = args.fanout_messages // len(nodes)
                    ready = [directory / f"ready-{run}-{i}" for i in range(args.subscribers)]
                    subs = [
                        spawn("sub", broker.stomp, nodes[i % len(nodes)] or "-", topic, per * len(nodes), ready[i])
                        for i in range(args.subscribers)
                    ]
                    deadline = time.monotonic() + 60
                    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    time.sleep(1.0)  # interest reaches the other workers a round trip later
                    pubs = [spawn("pub", broker.stomp, node or "-", topic, per) for node in nodes]
                    return subs + pubs, "deliveries"

                print(json.dumps(measure(broker, "fanout", fanout)), flush=True)
            finally:
                broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
