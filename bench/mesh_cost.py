#!/usr/bin/env python3
"""What a delivery across a mesh link costs, in process (not a test).

    PYTHONPATH=. python bench/mesh_cost.py [--number 50000] [--rounds 3] [--batch 100]

A STOMP producer connection on node a SENDs ``--number`` messages (100-byte
bodies, ``--batch`` frames a read) to ``/topic/t``; auto-ack STOMP
subscribers read them:

  - ``local``: one subscriber on a;
  - ``2 nodes``: one subscriber on b, linked to a;
  - ``3 nodes``: one subscriber on b and one on c (a full mesh).

With ``--kind queue``, to ``/queue/q`` (queues across nodes, with the
home's confirm of each forwarded publish):

  - ``local``: the queue and its auto-ack subscriber on a;
  - ``2 nodes``: the queue homed on b, its subscriber on b (one crossing);
  - ``3 nodes``: the queue homed on b, its subscriber on c (two crossings:
    forwarded to b, delivered to c).

Every node is a real broker with its mesh, in one process, on one
``Clock``; links are Twisted's in-memory transports (``twisted.test.iosim``),
so the figure is the CPU of every broker together, parser to encoder, with
no kernel: the cost of a cross-node delivery against a local one. Each
figure is the best of ``--rounds`` in CPU nanoseconds per delivered message.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def run(scenario: str, number: int, batch: int, kind: str = "topic") -> float:
    """CPU seconds for C{number} messages published on a."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport
    from twisted.test import iosim

    from qmq.cluster.link import LinkProtocol
    from qmq.cluster.mesh import Mesh
    from qmq.cluster.settings import ClusterSettings
    from qmq.core.broker import Broker
    from qmq.stomp.protocol import StompFactory

    clock = Clock()
    clock.advance(time.time())
    names = {"local": ["a"], "2 nodes": ["a", "b"], "3 nodes": ["a", "b", "c"]}[scenario]
    brokers = {n: Broker(clock, node=n) for n in names}
    meshes = {}
    for n in names:
        meshes[n] = Mesh(brokers[n], ClusterSettings(allow_plaintext=True), clock)
        meshes[n].startService()
    pumps = []
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            out, inbound = LinkProtocol(meshes[x], True), LinkProtocol(meshes[y], False)
            pumps.append(
                iosim.connect(
                    inbound, iosim.FakeTransport(inbound, True), out, iosim.FakeTransport(out, False),
                    greet=False, clock=clock,
                )
            )

    def settle() -> None:
        moved = True
        while moved:
            moved = False
            for pump in pumps:
                moved = pump.pump() or moved

    settle()

    def connect(node: str, port: int) -> tuple[Any, StringTransport]:
        factory = StompFactory(brokers[node], clock=clock)
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        proto.makeConnection(transport)
        proto.dataReceived(frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        clock.advance(0)
        transport.clear()
        return proto, transport

    if kind == "queue":
        from qmq.cluster.placement import rendezvous

        home = names[1] if len(names) > 1 else "a"
        name = next(f"q{i}" for i in range(1000) if rendezvous("/", f"q{i}", names) == home)
        destination = "/queue/" + name
        subscribers = [connect(names[-1], 41000)]
    else:
        destination = "/topic/t"
        subscribers = [connect(n, 41000 + i) for i, n in enumerate(names[1:] or names)]
    for proto, _ in subscribers:
        proto.dataReceived(frame("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "auto"}))
    clock.advance(0)
    settle()
    producer, ptransport = connect("a", 40000)
    body = b"x" * 100
    read = b"".join(frame("SEND", {"destination": destination}, body) for _ in range(batch))
    got = 0
    t0 = time.process_time()
    for _ in range(number // batch):
        producer.dataReceived(read)
        clock.advance(0)
        settle()
        for _, transport in subscribers:
            got += transport.value().count(b"MESSAGE\n")
            transport.clear()
        ptransport.clear()
    t = time.process_time() - t0
    expected = number // batch * batch * len(subscribers)
    assert got == expected, (scenario, got, expected)
    for broker in brokers.values():
        broker.stop_timers()
    return t / len(subscribers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--kind", choices=("topic", "queue"), default="topic")
    args = ap.parse_args()
    from qmq.service import tune_gc

    tune_gc()
    scenarios = ["local", "2 nodes", "3 nodes"]
    best = {s: float("inf") for s in scenarios}
    for s in scenarios:
        run(s, args.number // 10, args.batch, args.kind)
    for _ in range(args.rounds):
        for s in scenarios:
            best[s] = min(best[s], run(s, args.number, args.batch, args.kind))
    local = best["local"]
    print(f"{args.kind}: {'scenario':10s} {'ns/delivery':>12s}  vs local")
    for s in scenarios:
        ns = best[s] / args.number * 1e9
        print(f"{args.kind}: {s:10s} {ns:12.0f}  x{best[s] / local:.2f}")


if __name__ == "__main__":
    main()
