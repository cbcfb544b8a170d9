#!/usr/bin/env python3
"""What a message costs over AMQP 0-9-1 against STOMP, in process (not a test).

    PYTHONPATH=. python bench/amqp_cost.py [--number 100000] [--rounds 5] [--batch 100]

A producer connection publishes ``--number`` messages of 100 bytes,
``--batch`` a read, to a queue that one consumer connection reads and acks
a read at a time, all in one process over ``proto_helpers.StringTransport``
(no sockets): the codec, the session and the core, CPU time only.
Scenarios: ``amqp-ack`` (basic.consume with prefetch ``2 * batch``, a
basic.ack per delivery), ``amqp-autoack`` (``no-ack``), ``amqp-confirm``
(the publisher in confirm mode), and ``stomp-ack`` / ``stomp-auto`` (the
same over STOMP, ``ack:client-individual`` and ``ack:auto``) as the
yardstick. Each figure is the best of ``--rounds`` in CPU microseconds per
message (publish in, deliver out, ack in).
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import time
from typing import Any

_ACK = re.compile(rb"\nack:([^\n]*)\n")
_DELIVER = b"\x00\x3c\x00\x3c"


def amqp_run(number: int, batch: int, ack: bool, confirm: bool) -> float:
    from pamqp import commands, frame, header
    from pamqp.body import ContentBody
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from qmq.amqp.codec import PROTOCOL_HEADER
    from qmq.amqp.protocol import AmqpFactory
    from qmq.core.broker import Broker

    clock = Clock()
    clock.advance(time.time())
    broker = Broker(clock)
    broker.default_vhost.declare_queue("cost", durable=False)
    factory = AmqpFactory(broker, clock=clock)

    def connect(port: int) -> tuple[Any, StringTransport]:
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        proto.makeConnection(transport)
        proto.dataReceived(
            PROTOCOL_HEADER
            + frame.marshal(commands.Connection.StartOk({}, "PLAIN", "\0guest\0guest"), 0)
            + frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
            + frame.marshal(commands.Connection.Open("/"), 0)
            + frame.marshal(commands.Channel.Open(), 1)
        )
        clock.advance(0)
        transport.clear()
        return proto, transport

    consumer, ctransport = connect(40001)
    producer, ptransport = connect(40002)
    if confirm:
        producer.dataReceived(frame.marshal(commands.Confirm.Select(), 1))
    consumer.dataReceived(
        frame.marshal(commands.Basic.Qos(0, batch * 2), 1)
        + frame.marshal(commands.Basic.Consume(queue="cost", consumer_tag="c", no_ack=not ack), 1)
    )
    clock.advance(0)
    ctransport.clear()
    ptransport.clear()
    body = b"x" * 100
    one = (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="cost"), 1)
        + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(content_type="text/plain")), 1)
        + frame.marshal(ContentBody(body), 1)
    )
    read = one * batch
    # A deliver's method payload: ids, ctag "c" (short string), tag (u64), ...
    tag_at = len(_DELIVER) + 2
    got = 0
    t0 = time.process_time()
    for _ in range(number // batch):
        producer.dataReceived(read)
        clock.advance(0)
        out = ctransport.value()
        ctransport.clear()
        ptransport.clear()
        acks = []
        pos = out.find(_DELIVER)
        while pos >= 0:
            got += 1
            if ack:
                (tag,) = struct.unpack_from(">Q", out, pos + tag_at)
                acks.append(b"\x01\x00\x01\x00\x00\x00\x0d\x00\x3c\x00\x50" + struct.pack(">QB", tag, 0) + b"\xce")
            pos = out.find(_DELIVER, pos + 1)
        if acks:
            consumer.dataReceived(b"".join(acks))
            clock.advance(0)
    t = time.process_time() - t0
    assert got == number, (got, number)
    broker.stop_timers()
    return t


def stomp_run(number: int, batch: int, ack: bool) -> float:
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from qmq.core.broker import Broker
    from qmq.stomp.protocol import StompFactory

    clock = Clock()
    clock.advance(time.time())
    broker = Broker(clock)
    factory = StompFactory(broker, clock=clock)

    def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        return ("\n".join([command] + [f"{k}:{v}" for k, v in headers.items()]) + "\n\n").encode() + body + b"\x00"

    def connect(port: int) -> tuple[Any, StringTransport]:
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        proto.makeConnection(transport)
        proto.dataReceived(frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        clock.advance(0)
        transport.clear()
        return proto, transport

    consumer, ctransport = connect(40001)
    producer, ptransport = connect(40002)
    consumer.dataReceived(frame("SUBSCRIBE", {"destination": "/queue/cost", "id": "s",
                                              "ack": "client-individual" if ack else "auto",
                                              "prefetch-count": str(batch * 2)}))
    clock.advance(0)
    read = frame("SEND", {"destination": "/queue/cost", "content-type": "text/plain"}, b"x" * 100) * batch
    got = 0
    t0 = time.process_time()
    for _ in range(number // batch):
        producer.dataReceived(read)
        clock.advance(0)
        out = ctransport.value()
        ctransport.clear()
        ptransport.clear()
        if ack:
            ids = _ACK.findall(out)
            got += len(ids)
            consumer.dataReceived(b"".join(b"ACK\nid:" + i + b"\n\n\x00" for i in ids))
            clock.advance(0)
        else:
            got += out.count(b"MESSAGE\n")
    t = time.process_time() - t0
    assert got == number, (got, number)
    broker.stop_timers()
    return t


def new_queues_run(number: int, batch: int) -> float:
    """CPU seconds for C{number} queue.declare + queue.bind + queue.delete."""
    import amqp_load
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from qmq.amqp.protocol import AmqpFactory
    from qmq.core.broker import Broker

    clock = Clock()
    clock.advance(time.time())
    broker = Broker(clock)
    factory = AmqpFactory(broker, clock=clock)
    from pamqp import commands, frame

    from qmq.amqp.codec import PROTOCOL_HEADER

    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40003))
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(
        PROTOCOL_HEADER
        + frame.marshal(commands.Connection.StartOk({}, "PLAIN", "\0guest\0guest"), 0)
        + frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
        + frame.marshal(commands.Connection.Open("/"), 0)
        + frame.marshal(commands.Channel.Open(), 1)
    )
    reads = [b"".join(amqp_load.queue_ops(f"nq.{i}.{j}") for j in range(batch)) for i in range(number // batch)]
    transport.clear()
    t0 = time.process_time()
    for data in reads:
        proto.dataReceived(data)
        clock.advance(0)
        transport.clear()
    t = time.process_time() - t0
    assert not broker.default_vhost.queues, "queues left"
    broker.stop_timers()
    return t


SCENARIOS = {
    "amqp-ack": lambda n, b: amqp_run(n, b, True, False),
    "amqp-autoack": lambda n, b: amqp_run(n, b, False, False),
    "amqp-confirm": lambda n, b: amqp_run(n, b, True, True),
    "stomp-ack": lambda n, b: stomp_run(n, b, True),
    "stomp-auto": lambda n, b: stomp_run(n, b, False),
    "amqp-new-queue": new_queues_run,
}


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # amqp_load's frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    from qmq.service import tune_gc

    tune_gc()
    names = args.scenarios.split(",")
    best = {name: float("inf") for name in names}
    for _ in range(args.rounds):
        for name in names:
            best[name] = min(best[name], SCENARIOS[name](args.number, args.batch))
    for name in names:
        print(f"{name:14} {best[name] / args.number * 1e6:7.2f} us/message")


if __name__ == "__main__":
    main()
