#!/usr/bin/env python3
"""AMQP 0-9-1 load generator: QMQ's amqp: listener against RabbitMQ's own (not a test).

    # QMQ alone (a broker already listening on 127.0.0.1:5672)
    python bench/amqp_load.py --broker qmq=127.0.0.1:5672
    # both, in one run, scenarios interleaved (the lead starts the peers:
    # ../shared/peers/peers.sh start rabbitmq serves AMQP on 5682, guest/guest)
    python bench/amqp_load.py --broker qmq=127.0.0.1:5672 --broker rabbitmq=127.0.0.1:5682 --reps 3

The load generator must not be the limit: every worker is a separate
process on a raw socket, its frames built once with pamqp and written in
batches, and the frames it reads are only counted (their ids and delivery
tags read with ``struct``), never decoded. Scenarios (each ``--seconds``
long after a warm-up; messages of ``--size`` bytes):

``queue-autoack``
    ``--producers`` publishers to one queue, ``--consumers`` consumers with
    ``no-ack``: messages delivered per second.
``queue-ack``
    the same with ``basic.qos`` prefetch 500 and a ``basic.ack`` per
    delivery (sent once per read).
``fanout-10``
    one publisher to a fanout exchange bound to 10 queues, one consumer
    (``no-ack``) on each: deliveries per second.
``confirm-durable``
    publishers in confirm mode to a durable queue, ``delivery-mode`` 2, at
    most ``--window`` unconfirmed each: confirmed messages per second (one
    consumer drains the queue).
``new-queues``
    a client that declares a queue, binds it to ``amq.topic`` and deletes
    it, ``--window`` operations in flight: queues made (and removed) per
    second.

Publishers are paced by the consumers: each stops writing while the
queue's depth (what it published minus what the consumers counted) is
over ``--backlog``, so the figure is what the broker sustains, not how
fast a backlog grows. Each line of output is JSON: broker, scenario,
repetition, rate, and the broker process's CPU seconds when its PID is
found by its port (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import time
from typing import Any

from pamqp import commands, frame, header
from pamqp.body import ContentBody

HEAD = struct.Struct(">BHI")
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
DELIVER = (60 << 16) | 60
ACK = (60 << 16) | 80
DECLARE_OK = (50 << 16) | 11
DELETE_OK = (50 << 16) | 41


def m(method: Any, channel: int = 1) -> bytes:
    return frame.marshal(method, channel)


class Wire:
    """A raw AMQP connection: the handshake, then bytes in and out, frames counted."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest") -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.sock.sendall(PROTOCOL_HEADER)
        self.until(lambda f: f[1] == (10 << 16) | 10)  # start
        self.sock.sendall(m(commands.Connection.StartOk({"product": "amqp_load"}, "PLAIN",
                                                        f"\0{user}\0{password}"), 0))
        self.until(lambda f: f[1] == (10 << 16) | 30)  # tune
        self.sock.sendall(m(commands.Connection.TuneOk(2047, 131072, 0), 0) + m(commands.Connection.Open("/"), 0)
                          + m(commands.Channel.Open()))
        self.until(lambda f: f[1] == (20 << 16) | 11)  # channel.open-ok

    def frames(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """(type, method index or 0, channel, payload) of each whole frame."""
        self.buffer += data
        out = []
        buf = self.buffer
        pos = 0
        n = len(buf)
        while n - pos >= 7:
            ftype, channel, size = HEAD.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            index = struct.unpack_from(">I", buf, pos + 7)[0] if ftype == 1 else 0
            out.append((ftype, index, channel, buf[pos + 7 : end] if index in (DELIVER, ACK) else b""))
            pos = end + 1
        self.buffer = buf[pos:]
        return out

    def read(self) -> list[tuple[int, int, int, bytes]]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        return self.frames(data)

    def until(self, test: Any) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for f in self.read():
                if f[1] == (10 << 16) | 50 or f[1] == (20 << 16) | 40:
                    raise RuntimeError(f"broker closed: {f}")
                if test(f):
                    return
        raise TimeoutError("no answer")

    def call(self, method: Any, ok_index: int) -> None:
        self.sock.sendall(m(method))
        self.until(lambda f: f[1] == ok_index)


def _method(class_method: bytes, args: bytes) -> bytes:
    payload = class_method + args
    return HEAD.pack(1, 1, len(payload)) + payload + b"\xce"


def queue_ops(name: str) -> bytes:
    """queue.declare, queue.bind to amq.topic and queue.delete of C{name},
    built with struct (pamqp's encoder per operation would be the limit)."""
    q = name.encode()
    sq = bytes((len(q),)) + q
    no_args = b"\x00\x00\x00\x00"
    return (
        _method(b"\x00\x32\x00\x0a", b"\x00\x00" + sq + b"\x00" + no_args)
        + _method(b"\x00\x32\x00\x14", b"\x00\x00" + sq + b"\x09amq.topic" + sq + b"\x00" + no_args)
        + _method(b"\x00\x32\x00\x28", b"\x00\x00" + sq + b"\x00")
    )


def publish_frame(exchange: str, key: str, body: bytes, persistent: bool) -> bytes:
    props = commands.Basic.Properties(delivery_mode=2 if persistent else None)
    return (m(commands.Basic.Publish(exchange=exchange, routing_key=key))
            + m(header.ContentHeader(0, len(body), props)) + m(ContentBody(body)))


# -- workers (each in its own process) ------------------------------------------------


def producer(addr: tuple[str, int], exchange: str, key: str, size: int, counts: Any, index: int,
             consumed: Any, backlog: int, stop: Any, confirm: bool, window: int) -> None:
    wire = Wire(*addr)
    one = publish_frame(exchange, key, b"x" * size, confirm)
    batch = 50
    data = one * batch
    sent = 0
    confirmed = 0
    if confirm:
        wire.call(commands.Confirm.Select(), (85 << 16) | 11)
    wire.sock.setblocking(False)
    while not stop.is_set():
        if confirm:
            if sent - confirmed < window:
                wire.sock.setblocking(True)
                wire.sock.sendall(data)
                wire.sock.setblocking(False)
                sent += batch
            try:
                for _ftype, idx, _ch, payload in wire.read():
                    if idx == ACK:
                        tag, multiple = struct.unpack_from(">QB", payload, 4)
                        confirmed = tag if multiple else max(confirmed, tag)
                counts[index] = confirmed
            except BlockingIOError:
                time.sleep(0.0005)
        else:
            if sent - consumed.value > backlog:
                time.sleep(0.001)
                continue
            wire.sock.setblocking(True)
            wire.sock.sendall(data)
            wire.sock.setblocking(False)
            sent += batch
            counts[index] = sent


def consumer(addr: tuple[str, int], queue: str, ack: bool, counts: Any, index: int, consumed: Any,
             stop: Any) -> None:
    wire = Wire(*addr)
    if ack:
        wire.call(commands.Basic.Qos(prefetch_count=500), (60 << 16) | 11)
    wire.sock.sendall(m(commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=not ack)))
    wire.sock.settimeout(0.2)
    got = 0
    while not stop.is_set():
        try:
            frames = wire.read()
        except TimeoutError:
            continue
        acks = []
        n = 0
        for _ftype, idx, _ch, payload in frames:
            if idx == DELIVER:
                n += 1
                if ack:
                    ctag_len = payload[4]
                    (tag,) = struct.unpack_from(">Q", payload, 5 + ctag_len)
                    acks.append(tag)
        if acks:
            wire.sock.sendall(m(commands.Basic.Ack(acks[-1], multiple=False)) if len(acks) == 1 else
                              b"".join(m(commands.Basic.Ack(t)) for t in acks))
        if n:
            got += n
            counts[index] = got
            with consumed.get_lock():
                consumed.value += n


def queue_maker(addr: tuple[str, int], counts: Any, index: int, stop: Any, window: int) -> None:
    wire = Wire(*addr)
    made = 0
    serial = 0
    pid = os.getpid()
    wire.sock.settimeout(0.2)
    inflight = 0
    while not stop.is_set():
        chunk = []
        while inflight < window:
            name = f"nq.{pid}.{serial}"
            serial += 1
            chunk.append(queue_ops(name))
            inflight += 1
        wire.sock.sendall(b"".join(chunk))
        try:
            for _f, idx, _c, _p in wire.read():
                if idx == DELETE_OK:
                    inflight -= 1
                    made += 1
        except TimeoutError:
            continue
        counts[index] = made


# -- scenarios -----------------------------------------------------------------------------


def broker_cpu(port: int) -> float | None:
    """The CPU seconds of the process listening on C{port}, from /proc."""
    try:
        inode = None
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inode = parts[9]
        if inode is None:
            return None
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        with open(f"/proc/{pid}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                continue
    except OSError:
        return None
    return None


def setup(addr: tuple[str, int], scenario: str, run: str) -> dict:
    """Declare what the scenario uses; return its names."""
    wire = Wire(*addr)
    names: dict[str, Any] = {}
    if scenario == "fanout-10":
        ex = f"bench.fan.{run}"
        wire.call(commands.Exchange.Declare(exchange=ex, exchange_type="fanout", durable=False,
                                            auto_delete=False), (40 << 16) | 11)
        queues = []
        for i in range(10):
            q = f"bench.fan.{run}.{i}"
            wire.call(commands.Queue.Declare(queue=q, durable=False), DECLARE_OK)
            wire.call(commands.Queue.Bind(queue=q, exchange=ex, routing_key=""), (50 << 16) | 21)
            queues.append(q)
        names.update(exchange=ex, key="", queues=queues)
    elif scenario != "new-queues":
        q = f"bench.q.{scenario}.{run}"
        wire.call(commands.Queue.Declare(queue=q, durable=scenario == "confirm-durable"), DECLARE_OK)
        names.update(exchange="", key=q, queues=[q])
    wire.sock.close()
    return names


def teardown(addr: tuple[str, int], names: dict) -> None:
    try:
        wire = Wire(*addr)
        for q in names.get("queues", ()):
            wire.call(commands.Queue.Delete(queue=q), DELETE_OK)
        if names.get("exchange"):
            wire.call(commands.Exchange.Delete(exchange=names["exchange"]), (40 << 16) | 21)
        wire.sock.close()
    except Exception:
        pass


def run_scenario(addr: tuple[str, int], scenario: str, args: argparse.Namespace, run: str) -> dict:
    names = setup(addr, scenario, run)
    stop = mp.Event()
    consumed = mp.Value("q", 0)
    procs = []
    rate_counts = None
    if scenario == "new-queues":
        rate_counts = mp.Array("q", args.producers)
        for i in range(args.producers):
            procs.append(mp.Process(target=queue_maker, args=(addr, rate_counts, i, stop, args.window)))
    else:
        queues = names["queues"]
        consumers = len(queues) if scenario == "fanout-10" else args.consumers
        consumer_counts = mp.Array("q", consumers)
        for i in range(consumers):
            queue = queues[i % len(queues)]
            procs.append(mp.Process(target=consumer, args=(addr, queue, scenario == "queue-ack",
                                                          consumer_counts, i, consumed, stop)))
        producers = 1 if scenario == "fanout-10" else args.producers
        producer_counts = mp.Array("q", producers)
        confirm = scenario == "confirm-durable"
        # Fanout: the consumers count ten deliveries a publish.
        backlog = args.backlog * (10 if scenario == "fanout-10" else 1)
        for i in range(producers):
            procs.append(mp.Process(target=producer, args=(
                addr, names["exchange"], names["key"], args.size, producer_counts, i,
                consumed if scenario != "fanout-10" else _Scaled(consumed, 10), backlog, stop, confirm,
                args.window)))
        rate_counts = producer_counts if confirm else consumer_counts
    for p in procs:
        p.start()
    time.sleep(args.warmup)
    cpu0 = broker_cpu(addr[1])
    n0 = sum(rate_counts)
    t0 = time.monotonic()
    time.sleep(args.seconds)
    n1 = sum(rate_counts)
    t1 = time.monotonic()
    cpu1 = broker_cpu(addr[1])
    stop.set()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.terminate()
    teardown(addr, names)
    rate = (n1 - n0) / (t1 - t0)
    return {"rate": round(rate), "broker_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None
            else None}


class _Scaled:
    """A consumed count divided by C{factor} (fanout: ten deliveries a publish)."""

    def __init__(self, value: Any, factor: int) -> None:
        self._value = value
        self.factor = factor

    @property
    def value(self) -> int:
        return self._value.value // self.factor


SCENARIOS = ("queue-autoack", "queue-ack", "fanout-10", "confirm-durable", "new-queues")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", action="append", required=True, help="NAME=HOST:PORT (repeatable)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=20_000)
    args = ap.parse_args()
    brokers = []
    for spec in args.broker:
        name, _, hostport = spec.partition("=")
        host, _, port = hostport.rpartition(":")
        brokers.append((name, (host, int(port))))
    for rep in range(args.reps):
        for scenario in args.scenarios.split(","):
            for name, addr in brokers:  # interleaved: each scenario on each broker in turn
                result = run_scenario(addr, scenario, args, f"{os.getpid()}.{rep}")
                print(json.dumps({"broker": name, "scenario": scenario, "rep": rep, **result}), flush=True)


if __name__ == "__main__":
    main()
