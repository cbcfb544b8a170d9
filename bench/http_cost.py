#!/usr/bin/env python3
"""What an HTTP API request costs the broker, in process (not a test).

    PYTHONPATH=TREE python bench/http_cost.py [--number 20000] [--rounds 5] [single batch ...]
    PYTHONPATH=TREE python bench/http_cost.py --profile single

The broker is built as ``twistd qmq`` builds it (``make_service`` with an
``http:`` listener and the default store, in a temporary directory (the
messages are not persistent: nothing is written), on the real reactor,
which is not run),
and ``--conns`` kept-alive connections from its HTTP listener's factory run
on ``StringTransport``s: each request is one read of the request's bytes,
answered before the next (``bench/http_api.py``'s requests, one in flight
per connection). No sockets and no kernel: the figure is the site's, the
API's and the core's CPU, what ``http_api.py`` measures on a real broker
minus the socket work, which is the same in every tree. Scenarios:
``single`` (one message a POST), ``batch`` (1,000 messages a POST, JSON).
Each figure is the best of ``--rounds``, in CPU microseconds per request
(and per message for ``batch``). ``--profile`` prints a cProfile of one
round instead. ``bench/instructions.py`` counts its instructions
(``http:single``, ``http:batch``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from typing import Any

BODY = "x" * 100
QUEUE = "bench-http"


def request(method: str, path: str, body: bytes) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def publish(per_request: int) -> bytes:
    path = f"/api/v1/vhosts/%2F/queues/{QUEUE}/messages"
    if per_request == 1:
        return request("POST", path, json.dumps({"body": BODY}).encode())
    return request("POST", path, json.dumps({"messages": [{"body": BODY}] * per_request}).encode())


class Bench:
    """A broker with an C{http:} listener and C{conns} connections to it."""

    def __init__(self, conns: int, store: str = "log") -> None:
        from twisted.internet import reactor
        from twisted.internet.address import IPv4Address
        from twisted.internet.testing import StringTransport

        from qmq import config
        from qmq.service import make_service

        self.data_dir = tempfile.mkdtemp(prefix="qmq-http-cost-")
        settings = config.load_string(
            f'listen = ["http:tcp:8090:interface=127.0.0.1"]\nstore = "{store}"\ndata_dir = "{self.data_dir}"\n'
        )
        self.service = make_service(settings, reactor)
        factory = next(lst.factory for lst in self.service if getattr(lst, "protocol", None) == "http")
        self.conns = []
        for i in range(conns):
            addr = IPv4Address("TCP", "127.0.0.1", 40000 + i)
            protocol = factory.buildProtocol(addr)
            transport = StringTransport(peerAddress=addr, hostAddress=IPv4Address("TCP", "127.0.0.1", 8090))
            protocol.makeConnection(transport)
            self.conns.append((protocol, transport))
        self.call(request("PUT", f"/api/v1/vhosts/%2F/queues/{QUEUE}", json.dumps(
            {"arguments": {"x-max-length": 100_000_000, "x-max-length-bytes": 1 << 40}}).encode()))

    def call(self, data: bytes, conn: int = 0) -> bytes:
        protocol, transport = self.conns[conn]
        protocol.dataReceived(data)
        out = transport.value()
        transport.clear()
        return out

    def purge(self) -> None:
        self.call(request("DELETE", f"/api/v1/vhosts/%2F/queues/{QUEUE}/messages", b""))

    def run(self, data: bytes, number: int) -> float:
        """CPU seconds for C{number} requests, taking turns on the connections."""
        conns = self.conns
        n = len(conns)
        start = time.process_time()
        for i in range(number):
            protocol, transport = conns[i % n]
            protocol.dataReceived(data)
            out = transport.value()
            if out[9:10] != b"2":
                raise SystemExit(f"not answered 2xx: {out[:300]!r}")
            transport.clear()
        return time.process_time() - start


SCENARIOS = {"single": 1, "batch": 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="single, batch (default: both)")
    ap.add_argument("--number", type=int, default=20000, help="requests of `single` a round (batch: /100)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--store", default="log", help="the broker's store (log, the default, or memory)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for scenario in args.scenarios:
        if scenario not in SCENARIOS:
            ap.error(f"unknown scenario {scenario!r} (expected one of: {', '.join(SCENARIOS)})")
    args.scenarios = args.scenarios or list(SCENARIOS)
    from qmq.service import tune_gc

    tune_gc()
    bench = Bench(args.conns, args.store)
    for scenario in args.scenarios:
        per = SCENARIOS[scenario]
        data = publish(per)
        number = args.number if per == 1 else max(1, args.number // 100)
        bench.run(data, max(1, number // 10))  # warm up
        bench.purge()
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            bench.run(data, number)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(40)
            bench.purge()
            continue
        best = float("inf")
        for _ in range(args.rounds):
            best = min(best, bench.run(data, number))
            bench.purge()
        us = best / number * 1e6
        line: dict[str, Any] = {"scenario": scenario, "us_per_request": round(us, 1)}
        if per > 1:
            line["us_per_message"] = round(us / per, 2)
        print(json.dumps(line))
    shutil.rmtree(bench.data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
