#!/usr/bin/env python3
"""SIGKILL a real QMQ broker (``store = "log"``, ``fsync = "always"``) under
load, again and again, and count what survived.

    python bench/kill_cycles.py --cycles 20

Each cycle starts ``twistd -n qmq`` on the same data directory, times its
start (from the exec to the first CONNECTED; the first start, on an empty
directory, is the baseline), asks how many messages it brought back
(``/control/count-msgs``), then lets ``--producers`` connections send
``persistent:true`` SENDs with a receipt each (``--window`` in flight per
connection) to one durable queue while a consumer takes them with
``ack:client-individual``, and SIGKILLs the broker at a random moment
(``--min-run`` to ``--max-run`` seconds in). A producer resends, at the next
start, what had no RECEIPT when the broker died (as an at-least-once client
does). After the last cycle the broker starts once more and the queue is
drained.

Figures (a table on stdout, ``--json`` for one JSON line): SENDs, receipts,
distinct bodies receipted; delivered; **lost** (receipted, never delivered:
must be 0, else the exit status is 1); duplicates, split into resent
bodies (unreceipted when the broker died, so sent twice) and redeliveries
(an ACK the kill swallowed); deliveries of bodies never sent (must be 0);
per restart: start time (exec to CONNECTED), recovery time (as the
broker logs it: ``QMQ recovery took``), messages recovered, segment bytes
on disk.

Every wait has a deadline; a cycle that cannot start its broker stops the
run. Only 127.0.0.1 is used; the broker's logs stay in the work directory
(kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUEUE = "/queue/killcycles"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encode(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\0"


class Conn:
    """A STOMP 1.2 connection on asyncio streams (frames with content-length)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, timeout: float) -> Conn:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        c = cls(r, w)
        c.send("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"})
        cmd, h, _ = await asyncio.wait_for(c.read(), timeout)
        if cmd != "CONNECTED":
            raise ConnectionError(f"CONNECT answered by {cmd}: {h.get('message')}")
        return c

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.writer.write(encode(command, headers, body))

    async def read(self) -> tuple[str, dict[str, str], bytes]:
        while True:
            line = await self.reader.readline()
            if not line:
                raise ConnectionError("closed by the broker")
            if line.strip():
                break
        cmd = line.decode().strip()
        h: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if not line:
                raise ConnectionError("closed by the broker")
            line = line.rstrip(b"\r\n")
            if not line:
                break
            k, _, v = line.decode().partition(":")
            h.setdefault(k, v)
        if "content-length" in h:
            body = await self.reader.readexactly(int(h["content-length"]))
            if await self.reader.readexactly(1) != b"\0":
                raise ConnectionError("frame without its NUL")
        else:
            body = (await self.reader.readuntil(b"\0"))[:-1]
        return cmd, h, body

    def close(self) -> None:
        self.writer.close()


class Producer:
    """Sends bodies ``P:SEQ``; remembers which got a RECEIPT."""

    def __init__(self, pid: int, window: int) -> None:
        self.pid = pid
        self.window = window
        self.next_seq = 0
        self.unreceipted: dict[int, bytes] = {}  # sent, no RECEIPT yet
        self.receipted: set[bytes] = set()
        self.sends = 0
        self.resent = 0
        self.resent_bodies: set[bytes] = set()  # sent more than once

    async def run(self, port: int, stop: asyncio.Event, timeout: float) -> None:
        c = await Conn.open(port, timeout)
        # At-least-once: what the last broker did not confirm goes again.
        backlog = list(self.unreceipted.items())
        self.resent += len(backlog)
        self.resent_bodies.update(b for _, b in backlog)
        inflight: dict[str, tuple[int, bytes]] = {}

        def send_one() -> None:
            if backlog:
                seq, body = backlog.pop(0)
            else:
                seq = self.next_seq
                self.next_seq += 1
                body = f"{self.pid}:{seq}".encode()
                self.unreceipted[seq] = body
            rid = f"{seq}"
            inflight[rid] = (seq, body)
            self.sends += 1
            c.send("SEND", {"destination": QUEUE, "persistent": "true", "receipt": rid,
                            "content-length": str(len(body))}, body)

        try:
            while not stop.is_set():
                while len(inflight) < self.window and not stop.is_set():
                    send_one()
                cmd, h, _ = await c.read()
                if cmd != "RECEIPT":
                    raise ConnectionError(f"producer got {cmd}: {h.get('message')}")
                seq, body = inflight.pop(h["receipt-id"])
                self.receipted.add(body)
                self.unreceipted.pop(seq, None)
        finally:
            c.close()


class Consumer:
    """Takes messages with ack:client-individual and ACKs each one."""

    def __init__(self) -> None:
        self.delivered: Counter[bytes] = Counter()
        self.redelivered_flag = 0

    async def run(self, port: int, stop: asyncio.Event, timeout: float, idle: float | None = None) -> None:
        """Consume until ``stop`` (or, with ``idle``, until nothing came for that long)."""
        c = await Conn.open(port, timeout)
        c.send("SUBSCRIBE", {"destination": QUEUE, "id": "0", "ack": "client-individual",
                             "prefetch-count": "200"})
        try:
            while not stop.is_set():
                try:
                    cmd, h, body = await asyncio.wait_for(c.read(), idle or 0.5)
                except TimeoutError:
                    if idle:
                        return
                    continue
                if cmd != "MESSAGE":
                    raise ConnectionError(f"consumer got {cmd}: {h.get('message')}")
                self.delivered[body] += 1
                if h.get("redelivered") == "true":
                    self.redelivered_flag += 1
                c.send("ACK", {"id": h["ack"]})
        finally:
            c.close()


class Broker:
    """``twistd -n qmq`` on one data directory, started and killed again and again."""

    def __init__(self, workdir: Path, segment_size: int, source: Path) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.config = workdir / "qmq.toml"
        self.config.write_text(
            f'data_dir = "{self.data}"\nstore = "log"\n\n'
            f'[commit_log]\nfsync = "always"\nsegment_size = {segment_size}\n\n'
            "[connections]\nmax_per_address = 0\nmax_per_listener = 0\n"
        )
        self.source = source
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.runs = 0

    async def start(self, timeout: float) -> float:
        """Start; return the seconds until a client got CONNECTED."""
        self.port = free_port()
        self.runs += 1
        twistd = Path(sys.executable).parent / "twistd"
        env = dict(os.environ, PYTHONPATH=str(self.source) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = open(self.workdir / f"broker-{self.runs}.log", "wb")  # noqa: SIM115 - owned by the process
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(twistd), "-n", "--pidfile=", "qmq", "--config", str(self.config),
             "--listen", f"stomp:tcp:{self.port}:interface=127.0.0.1:backlog=1024"],
            cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.tail()}")
            try:
                c = await Conn.open(self.port, 2.0)
                c.close()
                return time.monotonic() - t0
            except (OSError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"broker did not answer within {timeout:.0f}s: {self.tail()}") from None
                await asyncio.sleep(0.02)

    def recovery_seconds(self) -> tuple[float, float | None] | None:
        """What the broker's log says its last recovery took: (seconds, CPU
        seconds); None if it recovered nothing."""
        p = self.workdir / f"broker-{self.runs}.log"
        text = p.read_text(errors="replace") if p.exists() else ""
        found = re.findall(r"QMQ recovery took ([0-9.]+) s(?: \(([0-9.]+) s of CPU\))?", text)
        if not found:
            return None
        wall, cpu = found[-1]
        return float(wall), float(cpu) if cpu else None

    def tail(self) -> str:
        p = self.workdir / f"broker-{self.runs}.log"
        return p.read_text(errors="replace")[-800:] if p.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def disk_bytes(self) -> int:
        log = self.data / "log"
        return sum(p.stat().st_size for p in log.glob("*")) if log.is_dir() else 0


async def count_ready(port: int, timeout: float) -> int:
    c = await Conn.open(port, timeout)
    try:
        c.send("SEND", {"destination": "/control/count-msgs" + QUEUE, "receipt": "n"})
        cmd, h, _ = await asyncio.wait_for(c.read(), timeout)
        return int(h.get("num-messages", -1)) if cmd == "RECEIPT" else -1
    finally:
        c.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="qmq-kill-cycles-"))
    broker = Broker(workdir, args.segment_size, args.source)
    producers = [Producer(i, args.window) for i in range(args.producers)]
    consumer = Consumer()
    restarts: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        for cycle in range(args.cycles + 1):
            disk = broker.disk_bytes()
            start_s = await broker.start(args.start_timeout)
            ready = await count_ready(broker.port, args.start_timeout)
            restarts.append({"cycle": cycle, "start_s": round(start_s, 3), "recovered": ready,
                             "recovery_s": broker.recovery_seconds(), "disk_bytes": disk})
            if cycle == args.cycles:
                break
            stop = asyncio.Event()
            tasks = [asyncio.ensure_future(p.run(broker.port, stop, args.start_timeout)) for p in producers]
            if not args.no_consumer:
                tasks.append(asyncio.ensure_future(consumer.run(broker.port, stop, args.start_timeout)))
            run_for = rng.uniform(args.min_run, args.max_run)
            await asyncio.sleep(run_for)
            broker.kill()
            stop.set()
            for r in await asyncio.gather(*tasks, return_exceptions=True):
                # A connection the kill cut is the point; anything else is news.
                if isinstance(r, Exception) and not isinstance(r, ConnectionError | OSError):
                    problems.append(f"cycle {cycle}: {type(r).__name__}: {r}")
            restarts[-1]["ran_s"] = round(run_for, 2)
            restarts[-1]["receipts_so_far"] = sum(len(p.receipted) for p in producers)
            print(json.dumps(restarts[-1]), file=sys.stderr, flush=True)
        # Drain what is left on the last start.
        stop = asyncio.Event()
        drain_deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < drain_deadline:
            await consumer.run(broker.port, stop, args.start_timeout, idle=2.0)
            if await count_ready(broker.port, args.start_timeout) == 0:
                break
        broker.stop()
    finally:
        broker.kill()
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    sent_bodies = {f"{p.pid}:{s}".encode() for p in producers for s in range(p.next_seq)}
    receipted = set().union(*(p.receipted for p in producers))
    delivered = consumer.delivered
    lost = receipted - set(delivered)
    dups = {b: n for b, n in delivered.items() if n > 1}
    # A body sent twice (no RECEIPT before a kill, resent) may arrive twice.
    resent_bodies = set().union(*(p.resent_bodies for p in producers))
    resent_dups = sum(n - 1 for b, n in dups.items() if b in resent_bodies)
    redelivered_dups = sum(n - 1 for n in dups.values()) - resent_dups
    never_sent = [b for b in delivered if b not in sent_bodies]
    starts = [r["start_s"] for r in restarts]
    baseline = starts[0]
    return {
        "cycles": args.cycles,
        "producers": args.producers,
        "window": args.window,
        "sends": sum(p.sends for p in producers),
        "resends": sum(p.resent for p in producers),
        "receipted": len(receipted),
        "delivered_distinct": len(delivered),
        "deliveries": sum(delivered.values()),
        "lost": len(lost),
        "lost_examples": sorted(b.decode() for b in lost)[:10],
        "duplicates_of_resent": resent_dups,
        "duplicates_redelivered": redelivered_dups,
        "redelivered_flagged": consumer.redelivered_flag,
        "never_sent_delivered": len(never_sent),
        "unreceipted_never_delivered": len(sent_bodies - receipted - set(delivered)),
        "start_s_empty": baseline,
        "start_s_restarts": starts[1:],
        # As the broker logs it (the replay and the core's rebuild, no
        # imports): wall-clock and CPU seconds (CPU: what a quiet machine
        # would take, about).
        "recovery_s": [(r["recovery_s"] or (None,))[0] for r in restarts[1:]],
        "recovery_cpu_s": [(r["recovery_s"] or (None, None))[1] for r in restarts[1:]],
        "recovered": [r["recovered"] for r in restarts[1:]],
        "disk_bytes": [r["disk_bytes"] for r in restarts[1:]],
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--window", type=int, default=50, help="SENDs in flight per producer")
    ap.add_argument("--min-run", type=float, default=0.5, help="least seconds of load before a kill")
    ap.add_argument("--max-run", type=float, default=3.0, help="most seconds of load before a kill")
    ap.add_argument("--segment-size", type=int, default=1 << 20, help="small, so segments roll and go")
    ap.add_argument("--no-consumer", action="store_true", help="only producers (the queue grows)")
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--source", type=Path, default=REPO, help="QMQ tree to run (on PYTHONPATH)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, data)")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = ap.parse_args(argv)
    res = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:28} {v}")
    return 1 if res["lost"] or res["never_sent_delivered"] else 0


if __name__ == "__main__":
    sys.exit(main())
