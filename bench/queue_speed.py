"""Micro-benchmark of a queue's publish and delivery paths (not a test).

Times publishing N messages into one queue and delivering them to one
consumer, through the core only (no sockets), for this checkout and, side
by side, for the core at another commit (extracted with C{git archive}, run
in a subprocess, so nothing is checked out)::

    python bench/queue_speed.py [--base main] [--number 100000] [--rounds 3] [--turns 5]

Scenarios: C{direct} (a consumer is ready: the fast path), C{backlog}
(published with no consumer, then drained), each on a plain FIFO queue, on
a queue with C{x-max-priority} (random priorities 0-9) and on one with
C{x-message-ttl}. At a base commit that predates an argument the queue
ignores it, so the figures compare "with the feature" against "before it
existed". Each figure is the best of all rounds of all turns (the trees
take turns), in nanoseconds of CPU time per message (CPU time, not wall
clock: on a busy machine it is the steadier of the two).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = {
    "fifo": {},
    "priority": {"x-max-priority": 9},
    "ttl": {"x-message-ttl": 3_600_000},
}


def measure(number: int, rounds: int) -> dict[str, float]:
    from twisted.internet.task import Clock

    from qmq.core.broker import Broker
    from qmq.core.consumer import Consumer

    class Sink(Consumer):
        __slots__ = ("n",)

        def __init__(self) -> None:
            super().__init__(False, None)
            self.n = 0

        def deliver(self, message, queue) -> None:
            self.n += 1

    rng = random.Random(1)
    priorities = [rng.randrange(10) for _ in range(number)]
    results: dict[str, float] = {}
    # A first pass, not counted: the process grows its heap on it, which
    # would otherwise be charged to whichever scenario ran first.
    for name, arguments in [*SCENARIOS.items(), *SCENARIOS.items()]:
        for mode in ("direct", "backlog"):
            best = float("inf")
            for _ in range(rounds):
                clock = Clock()
                clock.advance(time.time())
                broker = Broker(clock)
                vhost = broker.default_vhost
                q = vhost.declare_queue("q", durable=False, arguments=dict(arguments))
                type(q).drain_batch = 1 << 30  # one drain, not one per reactor turn
                sink = Sink()
                messages = []
                for i in range(number):
                    m = broker.new_message("", "q", None, b"x" * 100)
                    m.priority = priorities[i]
                    messages.append(m)
                publish = q.publish
                t0 = time.process_time()
                if mode == "direct":
                    q.add_consumer(sink)
                    for m in messages:
                        publish(m)
                else:
                    for m in messages:
                        publish(m)
                    q.add_consumer(sink)
                t = time.process_time() - t0
                assert sink.n == number, (name, mode, sink.n)
                best = min(best, t)
            results[f"{name}-{mode}"] = best / number * 1e9  # the second pass wins
    return results


def run_in(path: str, number: int, rounds: int) -> dict[str, float]:
    """Measure in a subprocess importing C{qmq} from C{path}."""
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, __file__, "--measure", "--number", str(number), "--rounds", str(rounds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=path,
    ).stdout
    return json.loads(out)


def compare(base: str | None, number: int, rounds: int, turns: int) -> tuple[dict, dict]:
    """Best figures of this tree and of C{base}, measured in turns (old,
    new, old, ...) so that a busy spell of the machine hits both."""
    new: dict[str, float] = {}
    old: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if base:
            archive = subprocess.run(
                ["git", "archive", base, "qmq"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            tarfile.open(fileobj=BytesIO(archive)).extractall(tmp, filter="data")
        for _ in range(turns):
            if base:
                for k, v in run_in(tmp, number, rounds).items():
                    old[k] = min(v, old.get(k, v))
            for k, v in run_in(str(ROOT), number, rounds).items():
                new[k] = min(v, new.get(k, v))
    return old, new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=None, help="commit to compare with")
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=5, help="subprocesses per tree, alternating")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.number, args.rounds)))
        return
    old, new = compare(args.base, args.number, args.rounds, args.turns)
    print(f"{'scenario':<20}{'base ns':>10}{'this ns':>10}{'change':>9}")
    for key, value in new.items():
        if key in old:
            print(f"{key:<20}{old[key]:>10.0f}{value:>10.0f}{(value / old[key] - 1) * 100:>8.1f}%")
        else:
            print(f"{key:<20}{'':>10}{value:>10.0f}")


if __name__ == "__main__":
    main()
