#!/usr/bin/env python3
"""What a delivery option costs a queue, in process (not a test).

    python bench/delivery_cost.py [--number 100000] [--rounds 5] [--batch 100]

A producer connection SENDs ``--number`` messages, ``--batch`` frames a
read, to a queue that one consumer connection reads with
``ack:client-individual`` and ACKs a read at a time: the STOMP parser, the
session, the core and the encoder, all in one process with
``proto_helpers.StringTransport`` (no sockets, no kernel: the share of the
options in this CPU time is an upper bound of their share in a real run,
where the socket work is the same for every variant). Variants: a plain
queue; ``x-max-priority:9`` with ``priority:5`` on every SEND (random
priorities with ``--random-priority``); ``x-message-ttl``; a ``ttl``
header on every SEND; ``expires``; and a header of no meaning to the broker, as long as the ttl
header (``other-header``: what parsing and relaying one more header costs,
apart from what an option does). Each figure is the best of
``--rounds`` in CPU nanoseconds per message, the variants taking turns, and
the change against the plain queue.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from typing import Any

VARIANTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # name: (SUBSCRIBE headers, SEND headers)
    "plain": ({}, {}),
    # The same header bytes as a ttl header, with no meaning: what parsing
    # and relaying a header costs, apart from what the option does.
    "other-header": ({}, {"x-app": "600000"}),
    "priority": ({"x-max-priority": "9"}, {"priority": "5"}),
    "queue-ttl": ({"x-message-ttl": "600000"}, {}),
    "ttl-header": ({}, {"ttl": "600000"}),
    "expires-header": ({}, {"expires": str(int(time.time() * 1000) + 3_600_000)}),
}

_ACK = re.compile(rb"\nack:([^\n]*)\n")


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def run(variant: str, number: int, batch: int, random_priority: bool, ack: str = "client-individual") -> float:
    """CPU seconds for C{number} messages through one queue."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from qmq.core.broker import Broker
    from qmq.stomp.protocol import StompFactory

    clock = Clock()
    clock.advance(time.time())
    broker = Broker(clock)
    factory = StompFactory(broker, clock=clock)

    def connect(port: int) -> tuple[Any, StringTransport]:
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        proto.makeConnection(transport)
        proto.dataReceived(frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        clock.advance(0)
        transport.clear()
        return proto, transport

    sub_headers, send_headers = VARIANTS[variant]
    consumer, ctransport = connect(40001)
    producer, ptransport = connect(40002)
    consumer.dataReceived(
        frame(
            "SUBSCRIBE",
            {
                "destination": "/queue/cost",
                "id": "s",
                "ack": ack,
                "prefetch-count": str(batch * 2),
                **sub_headers,
            },
        )
    )
    clock.advance(0)
    body = b"x" * 100
    rng = random.Random(1)
    reads = []
    for _ in range(number // batch):
        chunk = []
        for _ in range(batch):
            h = {"destination": "/queue/cost", **send_headers}
            if random_priority and "priority" in h:
                h["priority"] = str(rng.randrange(10))
            chunk.append(frame("SEND", h, body))
        reads.append(b"".join(chunk))
    got = 0
    t0 = time.process_time()
    for data in reads:
        producer.dataReceived(data)
        clock.advance(0)
        out = ctransport.value()
        ctransport.clear()
        ptransport.clear()
        if ack == "auto":
            got += out.count(b"MESSAGE\n")
            continue
        ids = _ACK.findall(out)
        got += len(ids)
        if ids:
            consumer.dataReceived(b"".join(b"ACK\nid:" + i + b"\n\n\x00" for i in ids))
            clock.advance(0)
    while got < number and ack != "auto":
        clock.advance(0)
        out = ctransport.value()
        ctransport.clear()
        ids = _ACK.findall(out)
        if not ids:
            break
        got += len(ids)
        consumer.dataReceived(b"".join(b"ACK\nid:" + i + b"\n\n\x00" for i in ids))
    t = time.process_time() - t0
    assert got == number, (variant, got, number)
    stop = getattr(broker, "stop_timers", None)  # older trees have none
    if stop is not None:
        stop()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--random-priority", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--ack", default="client-individual", choices=["client-individual", "auto"],
                    help="the consumer's ack mode (auto: no ACK frames, as queue-auto)")
    args = ap.parse_args()
    from qmq.service import tune_gc

    tune_gc()  # as the broker does
    names = args.variants.split(",")
    best = {n: float("inf") for n in names}
    for n in names:  # a first pass, not counted: the heap grows on it
        run(n, args.number // 10, args.batch, args.random_priority, args.ack)
    for _ in range(args.rounds):
        for n in names:
            best[n] = min(best[n], run(n, args.number, args.batch, args.random_priority, args.ack))
    plain = best.get("plain")
    print(f"{'variant':16s} {'ns/msg':>8s}  change")
    for n in names:
        ns = best[n] / args.number * 1e9
        change = f"{(best[n] / plain - 1) * 100:+.1f}%" if plain else ""
        print(f"{n:16s} {ns:8.0f}  {change}")


if __name__ == "__main__":
    main()
