"""HTTP API benchmark: QMQ's /api/v1/ against RabbitMQ's management API.

Scenarios (each for --seconds, with --procs load processes of --conns
keep-alive connections each, one request in flight per connection):

  single     one message per request (QMQ: POST .../queues/Q/messages;
             RabbitMQ: POST /api/exchanges/%2F/amq.default/publish)
  batch      1,000 messages per request, JSON (QMQ only: RabbitMQ's HTTP
             API publishes one message per request)
  batch-avro 1,000 messages per request, an Avro container file (QMQ)
  consume    a queue filled beforehand; long-poll receive of --batch
             messages, then one ack request for all their handles (QMQ);
             RabbitMQ: POST /api/queues/%2F/Q/get with count and
             ackmode ack_requeue_false
  consume-avro  the same, the messages received in Avro (QMQ)

Usage:
    python bench/http_api.py --target qmq --port 8080 single batch batch-avro consume
    python bench/http_api.py --target rabbitmq --port 15682 --fill-stomp 61633 single consume

QMQ must run with an http: listener (twistd -n qmq --listen
http:tcp:8080:interface=127.0.0.1); RabbitMQ with its management plugin
(../shared/peers/peers.sh start rabbitmq: 127.0.0.1:15682, guest/guest).
Prints one JSON line per scenario: messages/s and requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import multiprocessing
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procstat import cpu_seconds, pid_by_port  # noqa: E402

BODY = "x" * 100
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def request(method: str, path: str, body: bytes, kind: str = "application/json", extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    length = int(m.group(1)) if m else 0
    body = await reader.readexactly(length) if length else b""
    return status, body


def qmq_publish_one(queue: str) -> bytes:
    return request("POST", f"/api/v1/vhosts/%2F/queues/{queue}/messages", json.dumps({"body": BODY}).encode())


def qmq_publish_batch(queue: str, n: int, avro: bool) -> bytes:
    if avro:
        import fastavro  # noqa: PLC0415

        from qmq.web.api.codec import schema  # noqa: PLC0415

        out = io.BytesIO()
        rec = {"body": BODY.encode(), "headers": {}, "destination": None, "routing_key": None, "priority": 0,
               "ttl": None, "delay": None, "persistent": False}
        fastavro.writer(out, schema("PublishMessage"), [rec] * n)
        return request("POST", f"/api/v1/vhosts/%2F/queues/{queue}/messages", out.getvalue(), "avro/binary")
    doc = {"messages": [{"body": BODY}] * n}
    return request("POST", f"/api/v1/vhosts/%2F/queues/{queue}/messages", json.dumps(doc).encode())


def rmq_publish_one(queue: str) -> bytes:
    doc = {"properties": {}, "routing_key": queue, "payload": BODY, "payload_encoding": "string"}
    return request("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(doc).encode(),
                   extra=f"Authorization: {AUTH}\r\n")


async def _call(port: int, conn: list, data: bytes) -> tuple[int, bytes]:
    """Send one request on the kept-alive connection conn ([reader, writer]),
    opening a new one when the server has closed it (RabbitMQ's web server,
    Cowboy, closes a connection after 1,000 requests)."""
    for _ in range(2):
        if not conn:
            conn[:] = await asyncio.open_connection("127.0.0.1", port)
        try:
            conn[1].write(data)
            return await read_response(conn[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            conn[1].close()
            conn.clear()
    raise ConnectionError("the server closed two connections in a row")


async def _publisher(port: int, data: bytes, per_request: int, until: float, counts: list) -> None:
    conn: list = []
    done = bad = 0
    while time.monotonic() < until:
        status, _ = await _call(port, conn, data)
        if 200 <= status < 300:
            done += per_request
        else:
            bad += 1
    if conn:
        conn[1].close()
    counts.append((done, bad))


def _publish_proc(port: int, data: bytes, per_request: int, conns: int, seconds: float, q) -> None:
    async def main() -> None:
        counts: list = []
        until = time.monotonic() + seconds
        await asyncio.gather(*[_publisher(port, data, per_request, until, counts) for _ in range(conns)])
        q.put((sum(c[0] for c in counts), sum(c[1] for c in counts)))

    asyncio.run(main())


async def _qmq_consumer(port: int, queue: str, batch: int, until: float, counts: list, avro: bool = False) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = reqs = 0
    recv = request("POST", f"/api/v1/vhosts/%2F/queues/{queue}/receive?max={batch}&wait=1", b"",
                   extra="Accept: avro/binary\r\n" if avro else "")
    while time.monotonic() < until:
        writer.write(recv)
        status, body = await read_response(reader)
        reqs += 1
        if status != 200:
            handles = []
        elif avro:
            import fastavro  # noqa: PLC0415

            handles = [r["handle"] for r in fastavro.reader(io.BytesIO(body))]
        else:
            handles = [m["handle"] for m in json.loads(body)["messages"]]
        if not handles:
            break
        writer.write(request("POST", f"/api/v1/vhosts/%2F/queues/{queue}/ack",
                             json.dumps({"handles": handles}).encode()))
        status, _ = await read_response(reader)
        reqs += 1
        if status == 200:
            got += len(handles)
    writer.close()
    counts.append((got, reqs))


async def _rmq_consumer(port: int, queue: str, batch: int, until: float, counts: list) -> None:
    conn: list = []
    got = reqs = 0
    doc = json.dumps({"count": batch, "ackmode": "ack_requeue_false", "encoding": "auto"}).encode()
    get = request("POST", f"/api/queues/%2F/{queue}/get", doc, extra=f"Authorization: {AUTH}\r\n")
    while time.monotonic() < until:
        status, body = await _call(port, conn, get)
        reqs += 1
        n = len(json.loads(body)) if status == 200 else 0
        if not n:
            break
        got += n
    if conn:
        conn[1].close()
    counts.append((got, reqs))


def _consume_proc(target: str, port: int, queue: str, batch: int, conns: int, seconds: float, q) -> None:
    async def main() -> None:
        counts: list = []
        until = time.monotonic() + seconds
        if target == "qmq-avro":
            consumers = [_qmq_consumer(port, queue, batch, until, counts, True) for _ in range(conns)]
        else:
            consumer = _qmq_consumer if target == "qmq" else _rmq_consumer
            consumers = [consumer(port, queue, batch, until, counts) for _ in range(conns)]
        await asyncio.gather(*consumers)
        q.put((sum(c[0] for c in counts), sum(c[1] for c in counts)))

    asyncio.run(main())


def run_procs(target, args, procs: int) -> tuple[list, float]:
    q: multiprocessing.Queue = multiprocessing.Queue()
    ps = [multiprocessing.Process(target=target, args=(*args, q)) for _ in range(procs)]
    start = time.monotonic()
    for p in ps:
        p.start()
    results = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return results, time.monotonic() - start


def delete_queue(target: str, port: int, queue: str) -> None:
    """Drop a scenario's queue once measured: millions of messages left in
    it would weigh on the next scenario (the garbage collector scans them)."""
    async def main() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if target == "qmq":
            writer.write(request("DELETE", f"/api/v1/vhosts/%2F/queues/{queue}", b""))
        else:
            writer.write(request("DELETE", f"/api/queues/%2F/{queue}", b"", extra=f"Authorization: {AUTH}\r\n"))
        await read_response(reader)
        writer.close()

    asyncio.run(main())


def setup_queue(target: str, port: int, queue: str) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if target == "qmq":
            writer.write(request("DELETE", f"/api/v1/vhosts/%2F/queues/{queue}", b""))
            await read_response(reader)
            writer.write(request("PUT", f"/api/v1/vhosts/%2F/queues/{queue}",
                                 json.dumps({"arguments": {"x-max-length": 100_000_000,
                                                              "x-max-length-bytes": 1 << 40}}).encode()))
        else:
            writer.write(request("DELETE", f"/api/queues/%2F/{queue}", b"", extra=f"Authorization: {AUTH}\r\n"))
            await read_response(reader)
            writer.write(request("PUT", f"/api/queues/%2F/{queue}", json.dumps({"durable": False}).encode(),
                                 extra=f"Authorization: {AUTH}\r\n"))
        status, body = await read_response(reader)
        assert status < 300, body
        writer.close()

    asyncio.run(main())


def fill_stomp(port: int, queue: str, n: int) -> float:
    """Put n messages in RabbitMQ's queue over its STOMP port (its HTTP API
    publishes one message a request: a fill of 100,000 took minutes)."""
    import socket  # noqa: PLC0415

    start = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
    assert s.recv(4096).startswith(b"CONNECTED")
    frame = b"SEND\ndestination:/amq/queue/%s\ncontent-length:%d\n\n%s\x00" % (
        queue.encode(), len(BODY), BODY.encode())
    for _ in range(n // 1000):
        s.sendall(frame * 1000)
    s.sendall(frame.replace(b"SEND\n", b"SEND\nreceipt:done\n"))
    data = b""
    while b"RECEIPT" not in data:
        data += s.recv(4096)
    s.close()
    return time.monotonic() - start


def fill(target: str, port: int, queue: str, n: int, procs: int) -> float:
    """Put n messages in the queue (QMQ: batches; RabbitMQ: one per request)."""
    if target == "qmq":
        data = qmq_publish_batch(queue, 1000, False)
        per = n // 1000 // procs
        args = (port, data, 1000, 1, 3600.0)
    else:
        data = rmq_publish_one(queue)
        per = n // procs
        args = (port, data, 1, 1, 3600.0)

    async def main(count: int) -> None:
        conn: list = []
        for _ in range(count):
            await _call(port, conn, data)
        if conn:
            conn[1].close()

    start = time.monotonic()
    ps = [multiprocessing.Process(target=lambda: asyncio.run(main(per))) for _ in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    del args
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", choices=["single", "batch", "batch-avro", "consume", "consume-avro"])
    ap.add_argument("--target", choices=["qmq", "rabbitmq"], default="qmq")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--fill", type=int, default=400_000)
    ap.add_argument("--fill-stomp", type=int, metavar="PORT",
                    help="RabbitMQ: fill the consume queue over its STOMP port (e.g. 61633), not its HTTP API")
    args = ap.parse_args()
    server = pid_by_port(args.port)
    for scenario in args.scenarios:
        queue = f"bench-{scenario}"
        setup_queue(args.target, args.port, queue)
        cpu0 = cpu_seconds(server) if server else 0.0
        if scenario in ("consume", "consume-avro"):
            if scenario == "consume-avro" and args.target != "qmq":
                print(json.dumps({"target": args.target, "scenario": scenario, "skipped": "JSON only"}))
                continue
            if args.target == "rabbitmq" and args.fill_stomp:
                filled = fill_stomp(args.fill_stomp, queue, args.fill)
            else:
                filled = fill(args.target, args.port, queue, args.fill, args.procs)
            target = "qmq-avro" if scenario == "consume-avro" else args.target
            results, elapsed = run_procs(
                _consume_proc, (target, args.port, queue, args.batch, args.conns, args.seconds), args.procs
            )
            msgs = sum(r[0] for r in results)
            reqs = sum(r[1] for r in results)
            extra = {"fill_seconds": round(filled, 2), "batch": args.batch}
            cpu0 = None
        else:
            if scenario == "single":
                data = qmq_publish_one(queue) if args.target == "qmq" else rmq_publish_one(queue)
                per = 1
            elif args.target == "qmq":
                data, per = qmq_publish_batch(queue, 1000, scenario == "batch-avro"), 1000
            else:
                print(json.dumps({"target": args.target, "scenario": scenario, "skipped": "one message per request"}))
                continue
            results, elapsed = run_procs(
                _publish_proc, (args.port, data, per, args.conns, args.seconds), args.procs
            )
            msgs = sum(r[0] for r in results)
            reqs = msgs // per
            extra = {"errors": sum(r[1] for r in results)}
        if server and cpu0 is not None:
            cpu = cpu_seconds(server) - cpu0
            extra["server_cpu_s"] = round(cpu, 2)
            extra["server_us_per_msg"] = round(cpu / max(msgs, 1) * 1e6, 1)
            extra["server_us_per_req"] = round(cpu / max(reqs, 1) * 1e6, 1)
        delete_queue(args.target, args.port, queue)
        print(json.dumps({
            "target": args.target, "scenario": scenario, "seconds": round(elapsed, 2),
            "messages": msgs, "msgs_per_s": round(msgs / elapsed), "reqs_per_s": round(reqs / elapsed),
            "procs": args.procs, "conns": args.conns, **extra,
        }), flush=True)


if __name__ == "__main__":
    main()
