#!/usr/bin/env python3
"""Many durable queues with one message each, in process: write, then recover.

    python bench/durable_recovery.py --queues 100000
    python bench/durable_recovery.py --queues 20000 --profile 30
    python bench/durable_recovery.py --queues 20000 --tracemalloc 25

The quick harness behind ``bench/many_durable.py`` (which goes through
STOMP and ``twistd``): a real broker core and commit log, no sockets, writes
done at once in this thread (``fsync = "never"``). The write phase declares
``--queues`` durable queues the way a STOMP ``SEND`` to ``/queue/NAME``
does (on demand, under the default configuration's ``queue_defaults``) and
publishes one ``persistent`` message with STOMP's headers to each. The
recovery phase runs in a fresh interpreter (so its memory is its own): it
opens a broker on the directory and calls ``Broker.recover()`` as the
service does, then reports CPU seconds (store replay and the core's rebuild
apart), and RSS per recovered queue (RSS after recovery minus RSS before,
over the number of queues). ``--profile N`` prints the N costliest
functions of the recovery (cProfile); ``--tracemalloc N`` the N biggest
allocation sites left after it, per queue. Memory per queue and CPU per
queue are close to constant in the number of queues: 20,000 to 100,000
predict a million.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock

HERE = Path(__file__).resolve().parent


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def open_broker(directory: str, segment_size: int) -> Any:
    from qmq.config import QUEUE_DEFAULTS  # noqa: PLC0415
    from qmq.core.broker import Broker  # noqa: PLC0415
    from qmq.store.log import CommitLogStore  # noqa: PLC0415

    clock = Clock()
    clock.advance(time.time())
    store = CommitLogStore(
        directory,
        fsync="never",
        reactor=clock,
        io=lambda f, *a: maybeDeferred(f, *a),
        compact_interval=0,
        segment_size=segment_size,
    )
    broker = Broker(clock, store=store)
    broker.default_vhost.set_queue_defaults(QUEUE_DEFAULTS)
    return broker, store, clock


def write(directory: str, queues: int, body_size: int, segment_size: int) -> dict[str, Any]:
    broker, store, clock = open_broker(directory, segment_size)
    broker.recover()
    vhost = broker.default_vhost
    body = b"x" * body_size
    t0 = time.process_time()
    for i in range(queues):
        name = f"md.0.{i}"
        vhost.declare_queue(name, on_demand=True)
        m = broker.new_message(
            "", name, {"destination": "/queue/" + name, "persistent": "true"}, bytes(body), True
        )
        vhost.publish(m)
        if i % 1000 == 999:
            broker.batcher.flush_all()
            store.flush()
            clock.advance(0)
    broker.batcher.flush_all()
    store.flush()
    clock.advance(0)
    cpu = time.process_time() - t0
    broker.close()
    clock.advance(1)
    disk = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    return {"write_cpu_s": round(cpu, 2), "write_rate": round(queues / cpu), "disk_bytes": disk,
            "disk_bytes_per_queue": round(disk / queues, 1)}


def recover(directory: str, segment_size: int, profile: int, trace: int) -> dict[str, Any]:
    # Import everything first: the figure is recovery's memory, not the modules'.
    import qmq.service  # noqa: F401, PLC0415
    import qmq.store.replay  # noqa: F401, PLC0415

    gc.collect()
    if trace:
        import tracemalloc  # noqa: PLC0415

        tracemalloc.start()
    broker, store, clock = open_broker(directory, segment_size)
    gc.collect()
    base = rss()
    prof = None
    if profile:
        import cProfile  # noqa: PLC0415

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.process_time()
    w0 = time.monotonic()
    store._open()  # the replay (the store's first use)
    t1 = time.process_time()
    broker.recover()
    t2 = time.process_time()
    w2 = time.monotonic()
    if prof is not None:
        prof.disable()
    gc.freeze()
    after = rss()
    vhost = broker.default_vhost
    n = sum(1 for q in vhost.queues.values() if len(q) == 1)
    res = {
        "recovered_queues": n,
        "replay_cpu_s": round(t1 - t0, 2),
        "rebuild_cpu_s": round(t2 - t1, 2),
        "recovery_cpu_s": round(t2 - t0, 2),
        "recovery_wall_s": round(w2 - w0, 2),
        "cpu_us_per_queue": round((t2 - t0) * 1e6 / max(n, 1), 1),
        "rss_bytes_per_queue": round((after - base) / max(n, 1), 1),
    }
    if trace:
        import tracemalloc  # noqa: PLC0415

        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stats = snap.statistics("lineno")
        total = sum(s.size for s in stats)
        res["traced_bytes_per_queue"] = round(total / max(n, 1), 1)
        print(f"tracemalloc: {total / max(n, 1):.0f} bytes per queue; biggest sites:", file=sys.stderr)
        for s in stats[:trace]:
            f = s.traceback[0]
            print(f"  {s.size / max(n, 1):7.1f} B/queue  {s.count / max(n, 1):5.2f} blocks/queue  "
                  f"{f.filename.split('/qmq/')[-1]}:{f.lineno}", file=sys.stderr)
    if prof is not None:
        import pstats  # noqa: PLC0415

        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
    # Recovered queues work: one takes its message.
    q = vhost.queues.get("md.0.0")
    res["sample_ok"] = q is not None and q.get() is not None
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--body-size", type=int, default=16)
    ap.add_argument("--segment-size", type=int, default=64 << 20)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="N")
    ap.add_argument("--dir", help="an existing directory written before: recover only")
    ap.add_argument("--recover-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.recover_only:
        res = recover(args.dir, args.segment_size, args.profile, args.tracemalloc)
        print(json.dumps(res))
        return 0
    res: dict[str, Any] = {"queues": args.queues, "body_bytes": args.body_size}
    directory = args.dir or tempfile.mkdtemp(prefix="qmq-durable-recovery-")
    try:
        if not args.dir:
            res.update(write(directory, args.queues, args.body_size, args.segment_size))
        cmd = [sys.executable, __file__, "--recover-only", "--dir", directory,
               "--segment-size", str(args.segment_size), "--profile", str(args.profile),
               "--tracemalloc", str(args.tracemalloc)]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        res.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    return 0 if res.get("sample_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
