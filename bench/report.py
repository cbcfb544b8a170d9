#!/usr/bin/env python3
"""Render benchmark JSON lines as a text table (median of reps) and a PNG chart.

    python bench/report.py bench/results/results.jsonl [--png chart.png]

Each row is one figure of one scenario; each column one broker, holding the
median over the repetitions that succeeded (``*`` marks a cell where some
repetitions failed, ``ERR`` one where all failed). The last column, ``QMQ×``,
says how many times better QMQ is than the best peer on that row (> 1: QMQ
is better), whichever way "better" points for the row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: (row label, scenario, result key, higher is better)
ROWS: list[tuple[str, str, str, bool]] = [
    ("queue-auto msgs/s", "queue-auto", "rate", True),
    ("queue-auto broker µs/msg", "queue-auto", "broker_cpu_us_per_unit", False),
    ("queue-ack msgs/s", "queue-ack", "rate", True),
    ("queue-ack broker µs/msg", "queue-ack", "broker_cpu_us_per_unit", False),
    ("receipt receipts/s", "receipt", "rate", True),
    ("receipt broker µs/receipt", "receipt", "broker_cpu_us_per_unit", False),
    ("fanout deliveries/s", "fanout", "rate", True),
    ("fanout broker µs/delivery", "fanout", "broker_cpu_us_per_unit", False),
    ("latency p50 µs", "latency", "p50_us", False),
    ("latency p99 µs", "latency", "p99_us", False),
    ("tls msgs/s", "tls", "rate", True),
    ("tls broker µs/msg", "tls", "broker_cpu_us_per_unit", False),
    ("idle conns/s (open)", "idle", "rate", True),
    ("idle RSS KiB/conn", "idle", "rss_per_conn_kib", False),
    ("idle broker CPU %", "idle", "broker_cpu_idle_pct", False),
    ("many-queues queues/s", "many-queues", "rate", True),
    ("many-queues RSS KiB/queue", "many-queues", "rss_per_queue_kib", False),
    ("wildcard msgs/s, none", "wildcard", "rate_none", True),
    ("wildcard msgs/s, 100k subs", "wildcard", "rate", True),
    ("big (1 MiB) MB/s", "big", "mb_per_s", True),
    ("stalled: 9 others deliveries/s", "stalled", "rate", True),
    ("persist-receipt receipts/s", "persist-receipt", "rate", True),
    ("persist-receipt broker µs/receipt", "persist-receipt", "broker_cpu_us_per_unit", False),
    ("persist-receipt-10 receipts/s", "persist-receipt-10", "rate", True),
    ("persist-receipt-10 broker µs/receipt", "persist-receipt-10", "broker_cpu_us_per_unit", False),
    ("receipt-10 (memory) receipts/s", "receipt-10", "rate", True),
    ("persist-consume msgs/s", "persist-consume", "rate", True),
    ("persist-consume broker µs/msg", "persist-consume", "broker_cpu_us_per_unit", False),
]
#: The targets of the durable-message scenarios: (what, row, the subject's
#: own row it is compared with or None for the best peer, factor).
TARGETS: list[tuple[str, str, str | None, float]] = [
    ("persistent receipts, 1 producer >= 2x best peer", "persist-receipt receipts/s", None, 2.0),
    ("persistent receipts, 10 producers >= 2x best peer", "persist-receipt-10 receipts/s", None, 2.0),
    ("persistent receipts, 10 producers >= 0.5x QMQ's memory rate", "persist-receipt-10 receipts/s",
     "receipt-10 (memory) receipts/s", 0.5),
    ("persistent consume with acks >= 2x best peer", "persist-consume msgs/s", None, 2.0),
]
SUBJECT = "qmq"


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Read JSON lines from the given files (blank and bad lines skipped)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        for line in p.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def summarize(results: list[dict[str, Any]]) -> tuple[list[str], dict[tuple[str, str], dict[str, Any]]]:
    """Return the brokers (in first-seen order) and per (row, broker) cells."""
    brokers: list[str] = []
    for r in results:
        if r.get("broker") not in brokers:
            brokers.append(r["broker"])
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for label, scen, key, _ in ROWS:
        for b in brokers:
            runs = [r for r in results if r.get("scenario") == scen and r.get("broker") == b]
            if not runs:
                continue
            vals = [r[key] for r in runs if "error" not in r and isinstance(r.get(key), int | float)]
            errs = [r["error"] for r in runs if "error" in r]
            skips = [r["skipped"] for r in runs if "skipped" in r]
            cells[(label, b)] = {
                "median": statistics.median(vals) if vals else None,
                "n": len(vals),
                "errors": errs,
                "skipped": skips,
            }
    return brokers, cells


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def ratio(cells: dict[tuple[str, str], dict[str, Any]], label: str, higher: bool, brokers: list[str]) -> float | None:
    """How many times better the subject is than the best peer on ``label``."""
    q = cells.get((label, SUBJECT), {}).get("median")
    peers = [cells[(label, b)]["median"] for b in brokers if b != SUBJECT and (label, b) in cells]
    peers = [p for p in peers if p]
    if not q or not peers:
        return None
    return q / max(peers) if higher else min(peers) / q


def render_table(results: list[dict[str, Any]]) -> str:
    """Return the text table (plus error footnotes)."""
    brokers, cells = summarize(results)
    head = ["figure (median of reps)", *brokers, "QMQ×"]
    rows: list[list[str]] = []
    notes: list[tuple[str, str, str]] = []
    for label, _, _, higher in ROWS:
        if not any((label, b) in cells for b in brokers):
            continue
        row = [label + ("" if higher else " ↓")]
        for b in brokers:
            c = cells.get((label, b))
            if c is None:
                row.append("")
            elif c["median"] is None and c["skipped"] and not c["errors"]:
                row.append("n/a")
                notes.append((b, label, "n/a: " + c["skipped"][0]))
            elif c["median"] is None and not c["errors"]:
                row.append("-")
            elif c["median"] is None:
                row.append("ERR")
                notes.append((b, label, c["errors"][0]))
            else:
                row.append(_fmt(c["median"]) + ("*" if c["errors"] else ""))
                if c["errors"]:
                    notes.append((b, label, "some reps: " + c["errors"][0]))
        r = ratio(cells, label, higher, brokers)
        row.append(f"{r:.2f}" if r else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cols: list[str]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cols))

    out = [line(head), line(["-" * w for w in widths]), *[line(r) for r in rows]]
    out.append("")
    out.append("↓ lower is better. QMQ× > 1: QMQ better than the best peer. * some reps failed; "
               "ERR all failed; n/a does not apply.")
    grouped: dict[tuple[str, str], list[str]] = {}
    for b, label, reason in notes:
        grouped.setdefault((b, reason[:300]), []).append(label)
    for (b, reason), labels in grouped.items():
        out.append(f"  {b} [{'; '.join(labels)}]: {reason}")
    targets = render_targets(brokers, cells)
    if targets:
        out += ["", *targets]
    return "\n".join(out) + "\n"


def render_targets(brokers: list[str], cells: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """One line per target of L{TARGETS} whose rows were measured: met or not."""
    out = []
    for what, label, own, factor in TARGETS:
        q = cells.get((label, SUBJECT), {}).get("median")
        if not q:
            continue
        if own is None:
            peers = [cells[(label, b)]["median"] for b in brokers if b != SUBJECT and (label, b) in cells]
            base = max([p for p in peers if p], default=None)
        else:
            base = cells.get((own, SUBJECT), {}).get("median")
        if not base:
            continue
        got = q / base
        out.append(f"target {what}: {got:.2f}x {'MET' if got >= factor else 'MISSED'}")
    return out


def render_rst(results: list[dict[str, Any]], blank: set[str] | None = None, order: list[str] | None = None) -> str:
    """Return the medians as a reST simple table (columns in ``blank`` say "pending")."""
    brokers, cells = summarize(results)
    if order:
        brokers = [b for b in order if b in brokers or b in (blank or set())]
    blank = blank or set()
    head = ["figure (median of reps)", *brokers]
    rows: list[list[str]] = []
    for label, _, _, higher in ROWS:
        if not any((label, b) in cells for b in brokers):
            continue
        row = [label + ("" if higher else " (lower is better)")]
        for b in brokers:
            c = cells.get((label, b))
            if b in blank:
                row.append("*pending*")
            elif c is None:
                row.append("")
            elif c["median"] is None:
                row.append("n/a" if c["skipped"] and not c["errors"] else "error")
            else:
                row.append(_fmt(c["median"]))
        rows.append(row)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("=" * w for w in widths)

    def line(cols: list[str]) -> str:
        return "  ".join(c.ljust(widths[i]) for i, c in enumerate(cols)).rstrip()

    return "\n".join([rule, line(head), rule, *[line(r) for r in rows], rule]) + "\n"


def render_chart(results: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Write a PNG with one small bar chart per table row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    brokers, cells = summarize(results)
    rows = [r for r in ROWS if any(cells.get((r[0], b), {}).get("median") for b in brokers)]
    if not rows:
        return
    ncol = 4
    nrow = (len(rows) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 2.8 * nrow), squeeze=False)
    colors = {"qmq": "#d62728", "rabbitmq": "#ff7f0e", "activemq": "#1f77b4", "coilmq": "#2ca02c"}
    for ax, (label, _, _, higher) in zip(axes.flat, rows, strict=False):
        raw = [cells.get((label, b), {}).get("median") for b in brokers]
        vals = [v or 0 for v in raw]
        ax.bar(brokers, vals, color=[colors.get(b, "#7f7f7f") for b in brokers])
        ax.set_title(label + ("" if higher else " (lower is better)"), fontsize=9)
        ax.tick_params(labelsize=8)
        for i, v in enumerate(raw):
            ax.text(i, v or 0, "n/a" if v is None else _fmt(v), ha="center", va="bottom", fontsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+", type=Path)
    ap.add_argument("--png", type=Path, help="also write this chart")
    ap.add_argument("--rst", action="store_true", help="print a reST table instead")
    ap.add_argument("--pending", default="", help="with --rst: comma list of brokers shown as pending")
    ap.add_argument("--order", default="", help="with --rst: comma list, column order")
    args = ap.parse_args(argv)
    results = load(args.jsonl)
    if args.rst:
        pending = {b for b in args.pending.split(",") if b}
        order = [b for b in args.order.split(",") if b] or None
        sys.stdout.write(render_rst(results, pending, order))
    else:
        sys.stdout.write(render_table(results))
    if args.png:
        render_chart(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
