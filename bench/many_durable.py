#!/usr/bin/env python3
"""A million durable queues through the broker: publish, restart, recover.

    python bench/many_durable.py --queues 1000000

Starts ``twistd -n qmq`` with ``store = "log"`` (``fsync = "always"``) on an
empty data directory, and ``--producers`` connections (the load generator's
windowed producer, a process each) each SEND one small ``persistent:true``
message with a receipt to each of their share of ``/queue/md.<producer>.<i>``
queues (``--window`` receipts in flight per connection): every SEND declares a durable queue and stores one message.
Then the broker is killed (SIGKILL: every message was receipted, so on
disk) and started again on the same directory.

Figures (``--json``: one JSON line): publish rate (queues/s), segment
bytes on disk (and per queue), the start time on the empty directory
(interpreter, imports, listeners) and after the restart, and the recovery
as the broker logs it (``QMQ recovery took``: the store's replay and the
core's rebuild, wall-clock and CPU seconds: on a busy machine the CPU time
is the better guide to a quiet one); RSS of the empty broker, after publishing,
and after recovery, and RSS per idle durable queue holding one message
((after recovery - empty) / queues); a sample of queues asked for their
count (``/control/count-msgs``) after the restart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kill_cycles import REPO, Broker, Conn  # noqa: E402
from loadgen import Limits, Target, produce  # noqa: E402
from procstat import rss_kib  # noqa: E402
from profiles import get_profile  # noqa: E402
from workers import Supervisor  # noqa: E402


def produce_all(port: int, queues: int, producers: int, window: int, body_size: int,
                limits: Limits) -> tuple[int, float]:
    """The load generator's windowed producer (one process each, counting
    RECEIPTs by their NULs): SEND one persistent message to each queue.
    Return (receipts, seconds)."""
    t = Target("127.0.0.1", port, get_profile("qmq"))
    per = queues // producers
    with Supervisor() as sup:
        for k in range(producers):
            sup.start(f"producer{k}", produce, t, f"/queue/md.{k}.{{i}}", per, body_size, window,
                      limits, False, None, 0, b"\npersistent:true")
        sup.gather("ready", limits.setup * 2 + 5)
        t0 = time.monotonic()
        sup.send(("go", t0))
        done = sup.gather("done", limits.max_seconds + limits.stall + limits.setup + 10)
    return sum(d["receipts"] for d in done), max(d["t_last"] for d in done) - t0


async def counts(port: int, names: list[str], timeout: float) -> list[int]:
    c = await Conn.open(port, timeout)
    out = []
    try:
        for name in names:
            c.send("SEND", {"destination": "/control/count-msgs/queue/" + name, "receipt": "c"})
            cmd, h, _ = await asyncio.wait_for(c.read(), timeout)
            out.append(int(h.get("num-messages", -1)) if cmd == "RECEIPT" else -1)
    finally:
        c.close()
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="qmq-many-durable-"))
    broker = Broker(workdir, args.segment_size, args.source)
    res: dict[str, Any] = {"queues": args.queues, "producers": args.producers, "window": args.window,
                           "body_bytes": args.body_size}
    try:
        res["start_s_empty"] = round(await broker.start(args.start_timeout), 3)
        await asyncio.sleep(1.0)
        assert broker.proc is not None
        res["rss_empty_kib"] = rss_kib(broker.proc.pid)
        per = args.queues // args.producers
        limits = Limits(args.max_seconds, 20.0, args.stall_timeout)
        total, seconds = await asyncio.to_thread(
            produce_all, broker.port, args.queues, args.producers, args.window, args.body_size, limits
        )
        res["published"] = total
        res["publish_s"] = round(seconds, 2)
        res["publish_rate"] = round(total / seconds, 1)
        res["rss_published_kib"] = rss_kib(broker.proc.pid)
        broker.kill()
        disk = broker.disk_bytes()
        res["disk_bytes"] = disk
        res["disk_bytes_per_queue"] = round(disk / total, 1)
        res["start_s_recovered"] = round(await broker.start(args.start_timeout), 3)
        res["recovery_s"], res["recovery_cpu_s"] = broker.recovery_seconds() or (None, None)
        await asyncio.sleep(1.0)
        res["rss_recovered_kib"] = rss_kib(broker.proc.pid)
        if res["rss_recovered_kib"] and res["rss_empty_kib"]:
            res["rss_bytes_per_queue"] = round(
                (res["rss_recovered_kib"] - res["rss_empty_kib"]) * 1024 / total, 1
            )
        sample = [f"md.{k}.{i}" for k in range(args.producers) for i in (0, per // 2, per - 1)]
        res["sample_counts"] = await counts(broker.port, sample, args.stall_timeout)
        t1 = time.monotonic()
        broker.stop()
        res["stop_s"] = round(time.monotonic() - t1, 2)
    finally:
        broker.kill()
        if args.keep:
            res["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1_000_000)
    ap.add_argument("--producers", type=int, default=2, help="producer processes")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--body-size", type=int, default=16)
    ap.add_argument("--segment-size", type=int, default=64 << 20)
    ap.add_argument("--start-timeout", type=float, default=900.0,
                    help="for each start, recovery included (a busy machine is slow)")
    ap.add_argument("--stall-timeout", type=float, default=60.0)
    ap.add_argument("--max-seconds", type=float, default=900.0, help="cap on publishing")
    ap.add_argument("--source", type=Path, default=REPO, help="QMQ tree to run (on PYTHONPATH)")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (to profile replay)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    want = args.queues // args.producers * args.producers
    ok = all(c == 1 for c in res.get("sample_counts", [])) and res.get("published") == want
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
