"""Memory per queued message of a long durable backlog, and the disk space
that comes back once it is consumed (the commit log, in process).

    python bench/store_backlog.py --messages 1000000 --size 1024
    python bench/store_backlog.py --messages 1000000 --backlog-memory 0

Publishes N persistent messages (STOMP-like headers) to one durable queue
through a real broker core and commit log (fsync "never", writes done at
once in this thread), measures the process's resident memory before and
after (per message), restarts (recovery time and memory), then consumes and
acknowledges everything and reports the disk use left after compaction.
Run it alone: it measures the whole process.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import tempfile
import time

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock

from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.core.message import OnDisk
from qmq.store.log import CommitLogStore

MiB = 1024 * 1024


def rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class Acker(Consumer):
    def __init__(self) -> None:
        super().__init__(True, 1000)
        self.count = 0
        self.unacked: list = []

    def deliver(self, message, queue) -> None:  # type: ignore[no-untyped-def]
        self.count += 1
        self.unacked.append((message, queue))

    def ack_all(self) -> None:
        unacked, self.unacked = self.unacked, []
        for m, q in unacked:
            q.ack(self, m)


def open_broker(directory: str, backlog: int) -> tuple[Broker, CommitLogStore, Clock]:
    clock = Clock()
    clock.advance(time.time())
    store = CommitLogStore(
        directory,
        fsync="never",
        reactor=clock,
        io=lambda f, *a: maybeDeferred(f, *a),
        compact_interval=0,
        backlog_memory=backlog,
    )
    broker = Broker(clock, store=store)
    broker.default_vhost.declare_queue("q", arguments={"x-max-length": 10**9, "x-max-length-bytes": 2**50})
    broker.recover()
    return broker, store, clock


def turn(broker: Broker, store: CommitLogStore, clock: Clock) -> None:
    broker.batcher.flush_all()
    store.flush()
    clock.advance(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--backlog-memory", type=int, default=16 * MiB)
    parser.add_argument("--segment-size", type=int, default=64 * MiB)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="qmq-backlog-")
    try:
        run(directory, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(directory: str, args: argparse.Namespace) -> None:
    n, size, backlog = args.messages, args.size, args.backlog_memory
    broker, store, clock = open_broker(directory, backlog)
    store.segment_size = args.segment_size
    vhost = broker.default_vhost
    body = os.urandom(size // 2).hex().encode()[:size]
    before = rss()
    t0 = time.perf_counter()
    for i in range(n):
        m = broker.new_message(
            "",
            "q",
            {"destination": "/queue/q", "persistent": "true", "content-length": str(size)},
            bytes(body),  # a body of its own, as a frame parser gives
            persistent=True,
        )
        vhost.publish(m)
        if i % 1000 == 999:
            turn(broker, store, clock)
    turn(broker, store, clock)
    elapsed = time.perf_counter() - t0
    after = rss()
    q = vhost.queue("q")
    on_disk = sum(1 for m in q.messages() if m.body.__class__ is OnDisk)
    print(f"messages {n} x {size} B, backlog_memory {backlog}")
    print(f"published in {elapsed:.1f} s ({n / elapsed:,.0f}/s)")
    print(f"RSS {before / MiB:.0f} -> {after / MiB:.0f} MiB: {(after - before) / n:.0f} B per queued message")
    print(f"bodies on disk: {on_disk}; disk {store.disk_usage() / MiB:.0f} MiB")
    broker.close()
    del broker, store, vhost, q
    gc.collect()

    base = rss()
    t0 = time.perf_counter()
    broker, store, clock = open_broker(directory, backlog)
    elapsed = time.perf_counter() - t0
    q = broker.default_vhost.queue("q")
    print(
        f"recovered {len(q)} in {elapsed:.1f} s; RSS +{(rss() - base) / MiB:.0f} MiB "
        f"({(rss() - base) / max(len(q), 1):.0f} B per message)"
    )
    acker = Acker()
    t0 = time.perf_counter()
    q.add_consumer(acker)
    for _ in range(10 * n):
        done = acker.count
        acker.ack_all()
        turn(broker, store, clock)
        if acker.count == done and not acker.unacked:
            break
    turn(broker, store, clock)
    elapsed = time.perf_counter() - t0
    peak = store.disk_usage()
    for _ in range(20):
        store.compact()
        turn(broker, store, clock)
    print(
        f"consumed {acker.count} in {elapsed:.1f} s ({acker.count / elapsed:,.0f}/s), "
        f"{store.loaded} bodies read back"
    )
    print(f"disk after consuming: {peak / MiB:.1f} MiB -> {store.disk_usage()} bytes after compaction")
    broker.close()


if __name__ == "__main__":
    main()
