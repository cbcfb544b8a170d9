#!/usr/bin/env python3
"""Run an in-process bench against two trees, interleaved (not a test).

    python bench/ab.py --reps 5 --a . --b ../base -- bench/delivery_cost.py --ack auto

Runs the bench command (a Python file and its arguments) ``--reps`` times
with each tree on ``PYTHONPATH``, the trees taking turns (a, b, a, b, ...)
so that a busy spell of a shared machine hits both, and prints the median
and the spread of every figure. A figure is read from each output line
whose first word is a name and which holds a number after it: the first
number after the name (``plain  3868  +0.0%`` -> ``plain: 3868``;
``log  5.12 µs a message ...`` -> ``log: 5.12``). The bench file itself
is the one given (run from this checkout), only ``qmq`` comes from the tree.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def figures(output: str) -> dict[str, float]:
    """The first number after the name on each line of C{output}."""
    got: dict[str, float] = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) < 2 or _NUMBER.match(words[0]):
            continue
        for w in words[1:]:
            if _NUMBER.match(w):
                got[words[0]] = float(w)
                break
    return got


def run(tree: str, command: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, *command], env=env, check=True, capture_output=True, text=True)
    return figures(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--a", default=".", help="the tree measured first in each turn (default: this one)")
    ap.add_argument("--b", required=True, help="the tree to compare with")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- BENCH.py [ARGS...]")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no bench command")
    results: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    for rep in range(args.reps):
        for side in ("a", "b") if rep % 2 == 0 else ("b", "a"):
            for k, v in run(getattr(args, side), command).items():
                results[side].setdefault(k, []).append(v)
    print(f"a = {args.a}, b = {args.b}, {args.reps} runs each; median [min-max]")
    print(f"{'figure':<16}{'a':>22}{'b':>22}{'a/b':>8}")
    for k, a in results["a"].items():
        b = results["b"].get(k)
        ma = statistics.median(a)
        cell_a = f"{ma:.4g} [{min(a):.4g}-{max(a):.4g}]"
        if not b:
            print(f"{k:<16}{cell_a:>22}")
            continue
        mb = statistics.median(b)
        cell_b = f"{mb:.4g} [{min(b):.4g}-{max(b):.4g}]"
        ratio = f"{ma / mb:.3f}" if mb else ""
        print(f"{k:<16}{cell_a:>22}{cell_b:>22}{ratio:>8}")


if __name__ == "__main__":
    main()
