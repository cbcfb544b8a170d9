#!/usr/bin/env python3
"""Machine instructions a message costs, per tree, under valgrind (not a test).

    python bench/instructions.py --tree ../base --tree . [--variants dc:plain:auto,dur:log]

CPU time on a shared machine moves by tens of percent between runs; the
number of instructions a run executes does not. This runs the in-process
benches (``delivery_cost.py``: ``dc:VARIANT:ACK``; ``durable_cost.py``:
``dur:VARIANT``; ``amqp_cost.py``: ``amqp:ack|autoack|confirm``;
``http_cost.py``: ``http:single|batch``, HTTP API publishes;
``mesh_cost.py``: ``mesh:topic|queue:1|2|3``, nodes, every node's work) under
``valgrind --tool=cachegrind --cache-sim=no`` twice per tree and variant,
with ``--small`` and ``--small + --number`` messages, and prints the
difference divided by ``--number``: the instructions of one message,
set-up and imports cancelled out. The reader's time slicing is turned off
(valgrind's pace would trigger it at random) and the hash seed fixed, so a
figure repeats exactly. Instructions are not time (cache misses, a bigger
heap are not counted): confirm a change in CPU time too (``ab.py``).
Needs valgrind (``apt-get install valgrind``); ~1 minute a figure.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("dc:plain:auto,dc:other-header:auto,dc:ttl-header:auto,dc:priority:auto,"
            "dc:plain:client-individual,dur:plain,dur:persistent,dur:log,dur:consume")


def child(variant: str, n: int) -> None:
    """Run C{n} messages of C{variant} in this process."""
    sys.path.insert(0, str(HERE))
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as qmq.service.tune_gc
    import qmq.stomp.reader as reader

    reader._now = lambda: 0.0  # no time-sliced reads: the same work at any pace
    kind, _, rest = variant.partition(":")
    if kind == "dc":
        import delivery_cost

        name, _, ack = rest.partition(":")
        delivery_cost.run(name, n, 100, False, ack or "auto")
    elif kind == "dur":
        import durable_cost

        durable_cost.measure(rest, n, 50)
    elif kind == "amqp":
        import amqp_cost

        amqp_cost.amqp_run(n, 100, rest in ("ack", "confirm"), rest == "confirm")
    elif kind == "http":
        import http_cost

        # single: n requests of one message; batch: n / 1,000 requests of
        # 1,000 messages. Either way n messages, so the figure is a message's.
        per = http_cost.SCENARIOS[rest]
        bench = http_cost.Bench(8)
        try:
            bench.run(http_cost.publish(per), max(1, n // per))
        finally:
            shutil.rmtree(bench.data_dir, ignore_errors=True)
    elif kind == "mesh":
        import mesh_cost

        what, _, nodes = rest.partition(":")
        scenario = {"1": "local", "2": "2 nodes", "3": "3 nodes"}[nodes or "2"]
        mesh_cost.run(scenario, n, 100, what or "topic")
    else:
        raise SystemExit(f"unknown variant {variant!r}")


def count(tree: str, variant: str, n: int) -> int:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), PYTHONHASHSEED="0")
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", variant, str(n)],
        env=env, capture_output=True, text=True, cwd="/", check=True,
    ).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="a checkout whose qmq to measure")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--number", type=int, default=10_000)
    args = ap.parse_args()
    trees = args.tree
    print(f"{'variant':28s}" + "".join(f"{Path(t).resolve().name:>12s}" for t in trees) + "   instructions a message")
    for variant in args.variants.split(","):
        row = []
        for tree in trees:
            small = count(tree, variant, args.small)
            big = count(tree, variant, args.small + args.number)
            row.append((big - small) / args.number)
        change = f"  {(row[-1] / row[0] - 1) * 100:+.1f}%" if len(row) > 1 and row[0] else ""
        print(f"{variant:28s}" + "".join(f"{v:12.0f}" for v in row) + change, flush=True)


if __name__ == "__main__":
    main()
