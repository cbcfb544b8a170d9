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
    ``fsync = "never"``: receipts at once, no group-commit waiter;
``consume``
    ``log`` with a consumer session subscribed to the ten queues
    (``ack:client-individual``) that ACKs every MESSAGE each turn: the
    publish, the delivery and the ack's settle record
    (``persist-consume``'s path).

Each figure is the best of ``--rounds`` in CPU microseconds per message,
the variants taking turns, with the cyclic collector's share ("gc") and the
writer's ("io"). Compare two trees by running this file with each on
``PYTHONPATH``. The harness (producers, store, turns) is ``harness.py``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import best_of, frame, run, time_collector  # noqa: E402

VARIANTS = ("plain", "persistent", "log", "log-never", "consume")
FSYNC = {"plain": None, "persistent": None, "log": "always", "log-never": "never", "consume": "always"}


def measure(variant: str, number: int, per: int, producers: int = 10) -> tuple[float, float, float]:
    """CPU microseconds a message: reactor thread, writer, collector."""
    body = b"x" * 100

    def send(n: int, p: int) -> bytes:
        h = {"destination": f"/queue/cost.{p}", "receipt": f"r{n}"}
        if variant != "plain":
            h["persistent"] = "true"
        return frame("SEND", h, body)

    subscribe = ()
    if variant == "consume":
        subscribe = tuple(
            frame("SUBSCRIBE", {"destination": f"/queue/cost.{p}", "id": f"s{p}", "ack": "client-individual"})
            for p in range(producers)
        )
    return run(FSYNC[variant], number, per, producers, send, subscribe=subscribe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per", type=int, default=50, help="frames a read (10 reads a turn)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    time_collector()
    variants = args.variants.split(",")
    best = best_of(args.rounds, variants, lambda v: measure(v, args.number, args.per))
    base = best.get("plain")
    for v in variants:
        main_us, io_us, gc_us = best[v]
        ratio = f"  {main_us / base[0]:.2f}x plain" if base else ""
        print(f"{v:11s} {main_us:6.2f} µs a message (gc {gc_us:.2f}), writer {io_us:.2f}{ratio}")


if __name__ == "__main__":
    main()
