#!/usr/bin/env python3
"""What making a queue costs the reactor thread, in process (not a test).

    python bench/declare_cost.py [--number 100000] [--rounds 3] [--per 100]

The ``many-queues`` scenario in process: one producer session SENDs one
small message with a ``receipt`` header to each of ``--number`` distinct
``/queue/`` destinations, ``--per`` frames a read (the scenario's receipt
window), so every SEND makes a queue on demand (the virtual host's
``queue_defaults``, the built-in ones here). The STOMP parser, the session, the core, the store
and the receipts, in one process with ``StringTransport`` (no sockets);
the commit log's writes run outside the measured time (the writer thread's
share, "io"), its fsync a no-op. Variants:

``memory``
    ``store = "memory"``;
``log``
    ``store = "log"``, ``fsync = "always"`` (the default configuration:
    every on-demand queue is durable, a declare record each).

Each figure is the best of ``--rounds`` in CPU microseconds per queue,
the variants taking turns, with the cyclic collector's share ("gc") and
the writer's ("io"). Compare two trees by running this file with each on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from typing import Any

VARIANTS = ("memory", "log")

_gc = [0.0, 0.0]


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _gc[1] = time.process_time()
    else:
        _gc[0] += time.process_time() - _gc[1]


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def run(variant: str, number: int, per: int, producers: int = 1) -> tuple[float, float, float]:
    """CPU microseconds a queue: reactor thread, writer, collector."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.defer import Deferred
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from qmq.core.broker import Broker
    from qmq.stomp.protocol import StompFactory

    clock = Clock()
    clock.advance(time.time())
    jobs: list[tuple[Any, tuple, Deferred]] = []

    def io(f: Any, *args: Any) -> Deferred:
        d: Deferred = Deferred()
        jobs.append((f, args, d))
        return d

    directory = None
    if variant.startswith("log"):
        from qmq.store.log import CommitLogStore

        directory = tempfile.mkdtemp(prefix="qmq-declare-cost-")
        store = CommitLogStore(
            directory,
            fsync="always",
            reactor=clock,
            io=io,
            datasync=lambda fd: None,
            compact_interval=0,
        )
        broker = Broker(clock, store=store)
    else:
        broker = Broker(clock)
    broker.recover()
    from qmq.config import QUEUE_DEFAULTS

    # As twistd qmq does for a virtual host: its on-demand queues' defaults.
    broker.add_vhost("/").set_queue_defaults(QUEUE_DEFAULTS)
    factory = StompFactory(broker, clock=clock)
    clients = []
    for p in range(producers):
        address = IPv4Address("TCP", "127.0.0.1", 40000 + p)
        proto = factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        proto.makeConnection(transport)
        proto.dataReceived(frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        clock.advance(0)
        transport.clear()
        clients.append((proto, transport))
    body = b"x" * 10
    turns = []
    n = 0
    for _ in range(number // (producers * per)):
        reads = []
        for _p in range(producers):
            chunk = []
            for _ in range(per):
                h = {"destination": f"/queue/bench.mq.{n}", "receipt": f"r{n}"}
                chunk.append(frame("SEND", h, body))
                n += 1
            reads.append(b"".join(chunk))
        turns.append(reads)
    gc.collect()
    io_time = 0.0
    receipts = 0
    _gc[0] = 0.0
    t0 = time.process_time()
    for reads in turns:
        for (proto, _), data in zip(clients, reads, strict=True):
            proto.dataReceived(data)
        clock.advance(0)
        while jobs:
            f, args, d = jobs.pop(0)
            t1 = time.process_time()
            f(*args)
            io_time += time.process_time() - t1
            d.callback(None)
            clock.advance(0)
        for _, transport in clients:
            receipts += transport.value().count(b"RECEIPT")
            transport.clear()
    spent = time.process_time() - t0 - io_time
    collector = _gc[0]
    assert receipts == n, (variant, receipts, n)
    if directory is not None:
        shutil.rmtree(directory)
    return spent / n * 1e6, io_time / n * 1e6, collector / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per", type=int, default=100, help="frames a read (a turn)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    from qmq.service import tune_gc

    tune_gc()  # as twistd qmq does
    gc.callbacks.append(_gc_timer)
    variants = args.variants.split(",")
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for v in variants:
            got = run(v, args.number, args.per)
            if v not in best or got[0] < best[v][0]:
                best[v] = got
    for v in variants:
        main_us, io_us, gc_us = best[v]
        print(f"{v:7s} {main_us:6.2f} µs a queue (gc {gc_us:.2f}), writer {io_us:.2f}")


if __name__ == "__main__":
    main()
