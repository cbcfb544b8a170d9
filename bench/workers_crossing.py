#!/usr/bin/env python3
"""What a SEND crossing a worker link costs each worker, on real processes.

    PYTHONPATH=. python bench/workers_crossing.py [--batches 400] [--batch 500]

Starts C{twistd -n qmq --workers 2} (memory store) and, for each placement,
one raw STOMP producer keeping one batch of C{--batch} SENDs (100-byte
bodies, a RECEIPT on the last) in flight to a queue with no consumer:

  - C{home}: the producer on the queue's home worker (nothing crosses);
  - C{away}: on the other worker (each SEND forwarded to the home, each
    confirm back).

Prints, per placement, each worker's user and system CPU per message
(from C{/proc/PID/stat}, so the kernel's share is apart), the broker's
total per message and the median time of a batch to its RECEIPT. See
docs/workers.rst ("Speed").
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workers_bench as wb  # noqa: E402
from procstat import children_tree, user_system_seconds  # noqa: E402


def worker_index(pid: int) -> int | None:
    """The index I of a worker process (its C{--worker I:N:DIR}), or None."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--worker") + 1].split(b":")[0]) if b"--worker" in argv else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="qmq-crossing-"))
    broker = wb.Broker(2, directory)
    try:
        nodes = broker.nodes  # sorted: node I is worker I's
        workers = sorted((p for p in children_tree(broker.process.pid) if worker_index(p) is not None), key=worker_index)
        for placed in ("home", "away"):
            name = f"crossing-{placed}-{int(time.time())}"
            home = nodes.index(wb.rendezvous("/", name, nodes))
            conn = wb.connect_on(broker.stomp, nodes[home] if placed == "home" else nodes[1 - home])
            frames = b"".join(
                wb.frame("SEND", {"destination": f"/queue/{name}"}, wb.BODY) for _ in range(args.batch - 1)
            )
            before = [user_system_seconds(p) for p in workers]
            cpu0 = broker.cpu()
            waits = []
            for n in range(args.batches):
                started = time.perf_counter()
                conn.sock.sendall(frames + wb.frame("SEND", {"destination": f"/queue/{name}", "receipt": str(n)}, wb.BODY))
                data = b""
                while b"RECEIPT" not in data:
                    data += conn.sock.recv(65536)
                waits.append(time.perf_counter() - started)
            messages = args.batches * args.batch
            after = [user_system_seconds(p) for p in workers]
            per = 1e6 / messages
            print(json.dumps({
                "placed": placed,
                "messages": messages,
                "producer_on": conn.worker,
                "home": nodes[home],
                "workers_us_per_msg": {
                    node: {"user": round((a[0] - b[0]) * per, 2), "system": round((a[1] - b[1]) * per, 2)}
                    for node, a, b in zip(nodes, after, before, strict=True)
                },
                "broker_us_per_msg": round((broker.cpu() - cpu0) * per, 2),
                "batch_to_receipt_ms": round(statistics.median(waits) * 1000, 2),
            }), flush=True)
            conn.sock.close()
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
