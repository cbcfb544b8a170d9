#!/usr/bin/env python3
"""Run benchmark scenarios against one STOMP broker and print JSON lines.

Examples::

    python bench/run.py queue-auto --profile rabbitmq
    python bench/run.py queue-ack fanout --host 127.0.0.1 --port 61623 --profile activemq
    python bench/run.py all --profile coilmq
    python bench/run.py tls --port 61613 --tls-port 61614 --profile qmq

``--profile`` picks the broker's quirks (and its default port and login);
``--port``, ``--login``, ``--passcode``, ``--vhost`` override them.
The broker PID (for its CPU and RSS) is found by port unless ``--pid`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import Limits, Target  # noqa: E402
from profiles import PROFILES, get_profile  # noqa: E402
from scenarios import CORE, FOLLOW_UP, PERSIST, SCENARIOS, Options, run_one  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser (shared with compare.py)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "scenarios",
        nargs="+",
        help=f"scenario names, 'all' (core: {', '.join(CORE)}), 'follow-up' ({', '.join(FOLLOW_UP)}) "
        f"or 'persist' ({', '.join(PERSIST)})",
    )
    add_common(ap)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, help="STOMP port (default: the profile's)")
    ap.add_argument("--tls", action="store_true", help="wrap every connection in TLS (no verification)")
    ap.add_argument("--tls-port", type=int, help="TLS port used by the 'tls' scenario")
    ap.add_argument("--ws", metavar="PATH",
                    help="STOMP over a WebSocket at PATH (e.g. /ws; --port is then the HTTP port)")
    ap.add_argument("--login")
    ap.add_argument("--passcode")
    ap.add_argument("--vhost", help="CONNECT host header (default '/')")
    ap.add_argument("--profile", default="generic", help=f"broker quirks: {', '.join(PROFILES)}")
    ap.add_argument("--pid", type=int, help="broker PID (default: found by port)")
    return ap


def add_common(ap: argparse.ArgumentParser) -> None:
    """Add the scenario knobs shared by run.py and compare.py."""
    g = ap.add_argument_group("scenario knobs")
    g.add_argument("--count", type=int, help="units per scenario (default: per scenario)")
    g.add_argument(
        "--send-header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="add a header to every streamed SEND (e.g. priority:5, ttl:60000); repeatable",
    )
    g.add_argument(
        "--subscribe-header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="add a header to every SUBSCRIBE (e.g. x-max-priority:9); repeatable",
    )
    g.add_argument("--body-size", type=int, default=100)
    g.add_argument("--ws-batch", type=int, default=1,
                   help="over WebSocket: STOMP frames per message the clients send (1: as browsers)")
    g.add_argument("--window", type=int, default=100, help="outstanding receipts (receipt, many-queues)")
    g.add_argument("--prefetch", type=int, default=500, help="prefetch for queue-ack")
    g.add_argument("--subscribers", type=int, default=10, help="fan-out subscribers")
    g.add_argument("--consumer-procs", type=int, default=2, help="processes for fan-out subscribers")
    g.add_argument("--warmup", type=int, default=500, help="latency warm-up round trips")
    g.add_argument("--idle-conns", type=int, help="idle connections (default 2000; e.g. 10000)")
    g.add_argument("--heart-beat", default="0,30000", help="CONNECT heart-beat for idle (cx,cy ms)")
    g.add_argument("--idle-hold", type=float, default=3.0, help="seconds to hold idle conns before RSS")
    g.add_argument("--idle-load", action="store_true", help="run queue-auto while idle conns are open")
    g.add_argument("--many-queues", type=int, help="queues for many-queues (default 50000; e.g. 1000000)")
    g.add_argument("--wildcard-subs", type=int, default=100_000)
    g.add_argument("--big-size", type=int, default=1 << 20, help="body size of the 'big' scenario")
    g.add_argument("--stalled-seconds", type=float, default=5.0)
    g.add_argument("--max-lead", type=int, default=50_000,
                   help="producer stays <= this many messages ahead of the slowest consumer (0: unbounded)")
    g.add_argument("--keep-awake", action=argparse.BooleanOptionalAction, default=False,
                   help="SCHED_IDLE spinners on every core during a scenario, so that idle vCPUs "
                   "do not slow wake-ups (default: off; helps lock-step exchanges, hurts some "
                   "multi-threaded brokers)")
    g.add_argument("--max-seconds", type=float, default=30.0, help="cap on a measured phase")
    g.add_argument("--setup-timeout", type=float, default=20.0)
    g.add_argument("--stall-timeout", type=float, default=10.0)


def options_from(args: argparse.Namespace, scenario: str) -> Options:
    """Map parsed flags to :class:`Options` for ``scenario``."""
    count = args.count
    if scenario == "many-queues" and args.many_queues:
        count = args.many_queues
    return Options(
        count=count,
        body_size=args.body_size,
        window=args.window,
        prefetch=args.prefetch,
        subscribers=args.subscribers,
        consumer_procs=args.consumer_procs,
        warmup=args.warmup,
        idle_conns=args.idle_conns,
        heart_beat=args.heart_beat,
        idle_hold=args.idle_hold,
        idle_load=args.idle_load,
        wildcard_subs=args.wildcard_subs,
        big_size=args.big_size,
        stalled_seconds=args.stalled_seconds,
        max_lead=args.max_lead,
        keep_awake=args.keep_awake,
        limits=Limits(args.max_seconds, args.setup_timeout, args.stall_timeout),
    )


def expand(names: list[str]) -> list[str]:
    """Expand 'all', 'follow-up' and 'persist' into scenario names."""
    out: list[str] = []
    for n in names:
        out.extend(CORE if n == "all" else FOLLOW_UP if n == "follow-up" else PERSIST if n == "persist" else [n])
    return out


def set_extra_headers(args: argparse.Namespace) -> None:
    """Put --send-header / --subscribe-header into the frames the workers make."""
    from stompwire import EXTRA_HEADERS  # noqa: PLC0415

    for command, items in (("SEND", args.send_header), ("SUBSCRIBE", args.subscribe_header)):
        for item in items:
            name, colon, value = item.partition(":")
            if not colon or not name:
                raise SystemExit(f"--{command.lower()}-header wants NAME:VALUE, got {item!r}")
            EXTRA_HEADERS[command][name] = value


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the scenarios, print one JSON line each."""
    args = build_parser().parse_args(argv)
    prof = get_profile(args.profile).with_overrides(
        port=args.port, login=args.login, passcode=args.passcode, vhost=args.vhost, tls_port=args.tls_port
    )
    target = Target(args.host, prof.port, prof, args.tls, ws_path=args.ws, ws_batch=args.ws_batch)
    set_extra_headers(args)
    rc = 0
    for name in expand(args.scenarios):
        if name not in SCENARIOS:
            print(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
            return 2
        res = run_one(name, target, options_from(args, name), args.pid)
        print(json.dumps(res), flush=True)
        rc |= "error" in res
    return rc


if __name__ == "__main__":
    sys.exit(main())
