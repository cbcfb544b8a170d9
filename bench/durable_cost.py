#!/usr/bin/env python3
"""What a durable publish costs the reactor thread, in process (not a test).

    python bench/durable_cost.py [--number 200000] [--rounds 3] [--per 50]

Ten producer sessions SEND ``--number`` 100-byte messages with a
``receipt`` header, each to its own ``/queue/``, ``--per`` frames a read;
every producer reads once a turn, then the turn ends (the store's group
commit: ten times ``--per`` publishes a batch). The STOMP parser, the
session, the core, the store and the receipts, in one process with
``StringTransport`` (no sockets). The commit log's writes run outside the
measured time (the writer thread's share, "io"); the fsync is a no-op, so a
batch's receipts go out on the next turn, as after a real fsync. Variants:

``plain``
    the memory store, SENDs without ``persistent`` (``receipt-10``);
``persistent``
    the memory store, SENDs with ``persistent:true`` (what the header
    alone costs);
``log``
    ``store = "log"``, ``fsync = "always"`` (``persist-receipt-10``);
``log-never``
    ``fsync = "never"``: receipts at once, no group-commit waiter.

Each figure is the best of ``--rounds`` in CPU microseconds per message,
the variants taking turns, with the cyclic collector's share ("gc") and the
writer's ("io"). Compare two trees by running this file with each on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from typing import Any

VARIANTS = ("plain", "persistent", "log", "log-never")

_gc = [0.0, 0.0]


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _gc[1] = time.process_time()
    else:
        _gc[0] += time.process_time() - _gc[1]


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def run(variant: str, number: int, per: int, producers: int = 10) -> tuple[float, float, float]:
    """CPU microseconds a message: reactor thread, writer, collector."""
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

        directory = tempfile.mkdtemp(prefix="qmq-durable-cost-")
        store = CommitLogStore(
            directory,
            fsync="always" if variant == "log" else "never",
            reactor=clock,
            io=io,
            datasync=lambda fd: None,
            compact_interval=0,
        )
        broker = Broker(clock, store=store)
    else:
        broker = Broker(clock)
    broker.recover()
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
    body = b"x" * 100
    turns = []
    n = 0
    for _ in range(number // (producers * per)):
        reads = []
        for p in range(producers):
            chunk = []
            for _ in range(per):
                h = {"destination": f"/queue/cost.{p}", "receipt": f"r{n}"}
                if variant != "plain":
                    h["persistent"] = "true"
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
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per", type=int, default=50, help="frames a read (10 reads a turn)")
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
    base = best.get("plain")
    for v in variants:
        main_us, io_us, gc_us = best[v]
        ratio = f"  {main_us / base[0]:.2f}x plain" if base else ""
        print(f"{v:11s} {main_us:6.2f} µs a message (gc {gc_us:.2f}), writer {io_us:.2f}{ratio}")


if __name__ == "__main__":
    main()
