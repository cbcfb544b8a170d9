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
``PYTHONPATH``. The harness (producers, store, turns) is ``harness.py``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import best_of, frame, run, time_collector  # noqa: E402

VARIANTS = ("memory", "log")


def _defaults(broker: Any) -> None:
    from qmq.config import QUEUE_DEFAULTS

    # As twistd qmq does for a virtual host: its on-demand queues' defaults.
    broker.add_vhost("/").set_queue_defaults(QUEUE_DEFAULTS)


def measure(variant: str, number: int, per: int, producers: int = 1) -> tuple[float, float, float]:
    """CPU microseconds a queue: reactor thread, writer, collector."""
    body = b"x" * 10

    def send(n: int, p: int) -> bytes:
        return frame("SEND", {"destination": f"/queue/bench.mq.{n}", "receipt": f"r{n}"}, body)

    return run("always" if variant == "log" else None, number, per, producers, send, _defaults)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per", type=int, default=100, help="frames a read (a turn)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    time_collector()
    variants = args.variants.split(",")
    best = best_of(args.rounds, variants, lambda v: measure(v, args.number, args.per))
    for v in variants:
        main_us, io_us, gc_us = best[v]
        print(f"{v:7s} {main_us:6.2f} µs a queue (gc {gc_us:.2f}), writer {io_us:.2f}")


if __name__ == "__main__":
    main()
