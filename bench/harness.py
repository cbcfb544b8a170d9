"""The in-process harness of the cost benches (``declare_cost.py``,
``durable_cost.py``; not a test).

A broker on a ``Clock``, with the memory store or the commit log; producer
sessions on ``StringTransport``s (no sockets), each fed one read a turn of
``per`` SEND frames; the turn ends (``clock.advance(0)``: the store's group
commit). The commit log's writes run outside the measured time (the writer
thread's share, "io"), its fsync a no-op, so a batch's receipts go out on
the next turn, as after a real fsync. :func:`run` measures one variant;
:func:`best_of` takes the best of several rounds, the variants taking
turns; :func:`time_collector` makes the cyclic collector's share ("gc")
count, as ``twistd qmq`` tunes it.
"""

from __future__ import annotations

import gc
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

_gc = [0.0, 0.0]
_ACK = re.compile(rb"\nack:([^\n]*)\n")


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _gc[1] = time.process_time()
    else:
        _gc[0] += time.process_time() - _gc[1]


def time_collector() -> None:
    """Tune the collector as ``twistd qmq`` does and time its passes."""
    from qmq.service import tune_gc

    tune_gc()
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def run(
    fsync: str | None,
    number: int,
    per: int,
    producers: int,
    send: Callable[[int, int], bytes],
    prepare: Callable[[Any], None] | None = None,
    subscribe: Sequence[bytes] = (),
) -> tuple[float, float, float]:
    """Feed ``number`` SENDs (each with a ``receipt``) and wait for every
    RECEIPT.

    :param fsync: the commit log's ``fsync`` (``"always"``, ``"never"``),
        or None for the memory store.
    :param send: the SEND frame of message ``n`` of producer ``p``,
        ``send(n, p)``; it must ask for a receipt.
    :param prepare: called with the broker once it recovered, before the
        producers connect.
    :param subscribe: SUBSCRIBE frames (``ack:client-individual``) of one
        consumer session, which ACKs every MESSAGE each turn; then every
        message must be acked too (``persist-consume``'s path).
    :return: CPU microseconds a message: the reactor thread, the writer,
        the collector.
    """
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
    if fsync is not None:
        from qmq.store.log import CommitLogStore

        directory = tempfile.mkdtemp(prefix="qmq-bench-")
        store = CommitLogStore(
            directory,
            fsync=fsync,
            reactor=clock,
            io=io,
            datasync=lambda fd: None,
            compact_interval=0,
        )
        broker = Broker(clock, store=store)
    else:
        broker = Broker(clock)
    broker.recover()
    if prepare is not None:
        prepare(broker)
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
    consumer = None
    if subscribe:
        address = IPv4Address("TCP", "127.0.0.1", 39999)
        proto = factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        proto.makeConnection(transport)
        proto.dataReceived(frame("CONNECT", {"accept-version": "1.2", "host": "/"}) + b"".join(subscribe))
        clock.advance(0)
        transport.clear()
        consumer = (proto, transport)
    acked = 0

    def ack_all() -> int:
        out = consumer[1].value()
        consumer[1].clear()
        ids = _ACK.findall(out)
        if ids:
            consumer[0].dataReceived(b"".join(b"ACK\nid:" + i + b"\n\n\x00" for i in ids))
        return len(ids)

    def run_jobs() -> float:
        spent = 0.0
        while jobs:
            f, args, d = jobs.pop(0)
            t1 = time.process_time()
            f(*args)
            spent += time.process_time() - t1
            d.callback(None)
            clock.advance(0)
        return spent

    turns = []
    n = 0
    for _ in range(number // (producers * per)):
        reads = []
        for p in range(producers):
            chunk = []
            for _ in range(per):
                chunk.append(send(n, p))
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
        io_time += run_jobs()
        if consumer is not None:
            acked += ack_all()
            clock.advance(0)
            io_time += run_jobs()
        for _, transport in clients:
            receipts += transport.value().count(b"RECEIPT")
            transport.clear()
    for _ in range(1000):
        if consumer is None or acked >= n:
            break
        acked += ack_all()
        clock.advance(0)
        io_time += run_jobs()
    spent = time.process_time() - t0 - io_time
    collector = _gc[0]
    assert receipts == n, (fsync, receipts, n)
    assert consumer is None or acked == n, (fsync, acked, n)
    if directory is not None:
        shutil.rmtree(directory)
    return spent / n * 1e6, io_time / n * 1e6, collector / n * 1e6


def best_of(
    rounds: int, variants: Sequence[str], measure: Callable[[str], tuple[float, float, float]]
) -> dict[str, tuple[float, float, float]]:
    """The best (least reactor time) of ``rounds`` measures of each
    variant, the variants taking turns."""
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(rounds):
        for v in variants:
            got = measure(v)
            if v not in best or got[0] < best[v][0]:
                best[v] = got
    return best
