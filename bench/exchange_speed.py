"""Micro-benchmark of exchange routing (not a test).

Times C{route()} of the exchange types on the broker's hot path, for this
checkout's L{qmq.core.exchange} and, side by side, for the same module at
another commit (loaded from C{git show}, so nothing is checked out):

    python bench/exchange_speed.py [--base 38e6969] [--number 200000]

Each figure is the best of 20 runs (old and new taking turns), in nanoseconds
per call, the call of a lambda included.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere

TOPIC_PATTERNS = [
    "orders.*.eu",
    "orders.new.#",
    "#.audit",
    "stock.*.*",
    "logs.#",
    "a.b.c",
    "users.*.login",
    "metrics.cpu*",
    "*.error",
    "x.#.y",
]


class Target:
    """A bind target: only its identity matters to an exchange."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def load(base: str | None) -> ModuleType:
    """This checkout's exchange module, or the one at commit C{base}."""
    if base is None:
        import qmq.core.exchange as module

        return module
    text = subprocess.run(
        ["git", "show", f"{base}:qmq/core/exchange.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"exchange_{base}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"exchange_{base}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(mod: ModuleType) -> dict[str, object]:
    """Zero-argument callables, each one route() call."""
    direct = mod.DirectExchange("d")
    for i in range(10):
        direct.bind(Target(f"d{i}"), f"key{i}", None)
    direct.bind(Target("d3b"), "key3", None)

    fanout = mod.FanoutExchange("f")
    for i in range(10):
        fanout.bind(Target(f"f{i}"), "", None)

    topic = mod.TopicExchange("t")
    for i, pattern in enumerate(TOPIC_PATTERNS):
        topic.bind(Target(f"t{i}"), pattern, None)
    topic.route("orders.new.eu", None)

    uncached = mod.TopicExchange("u")
    for i, pattern in enumerate(TOPIC_PATTERNS):
        uncached.bind(Target(f"u{i}"), pattern, None)
    cache = uncached._cache

    headers = mod.HeadersExchange("h")
    for i in range(10):
        headers.bind(Target(f"h{i}"), "", {"kind": f"k{i}", "format": "pdf"})
    message_headers = {"kind": "k3", "format": "pdf", "other": "x"}

    def uncached_route() -> object:
        cache.clear()
        return uncached.route("orders.new.eu", None)

    return {
        "direct, bound key (2 targets)": lambda: direct.route("key3", None),
        "direct, unbound key": lambda: direct.route("nokey", None),
        "fanout, 10 targets": lambda: fanout.route("", None),
        "topic, cached key": lambda: topic.route("orders.new.eu", None),
        "topic, uncached 3 words, 10 patterns": uncached_route,
        "headers, 10 bindings": lambda: headers.route("", message_headers),
    }


def best(fns: list, number: int, rounds: int) -> list[float]:
    """The best time of each of C{fns}, in ns per call, run in turns so
    that a busy moment of the machine does not favour one of them."""
    times = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times[i] = min(times[i], timeit.timeit(fn, number=number))
    return [t / number * 1e9 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="38e6969", help="commit to compare with")
    parser.add_argument("--number", type=int, default=50_000, help="calls per run")
    parser.add_argument("--rounds", type=int, default=20, help="runs of each, taking turns")
    args = parser.parse_args()
    old, new = cases(load(args.base)), cases(load(None))
    print(f"{'ns per route()':40} {args.base:>10} {'this':>10}")
    for name in new:
        number = args.number // 10 if "uncached" in name else args.number
        before, after = best([old[name], new[name]], number, args.rounds)
        print(f"{name:40} {before:10.0f} {after:10.0f}")


if __name__ == "__main__":
    main()
