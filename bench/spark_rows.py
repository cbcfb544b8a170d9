"""Rows per second through the qmq Spark data source, Spark local[2].

Starts a broker (``twistd -n qmq``, store = "log", an http: listener on
127.0.0.1) in a temporary data directory, fills queues with persistent
messages over the HTTP batch publish, then times, each after a warm-up run:

  - reading them over HTTP (range scans, Avro), into Spark's ``noop`` sink
    (every column materialized, nothing written);
  - reading the same messages from the segment files (``path``);
  - writing them back (``df.write.format("qmq")``) to another queue, each
    batch confirmed durable (fsync "always");
  - the segment decoder alone in this process (one core, no Spark), the
    ceiling of a segment read per core.

Usage: python bench/spark_rows.py [--messages 200000] [--body 100] [--queues 2]
(needs the spark extra).  Prints one line per figure and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def start_broker(data: str, port: int) -> subprocess.Popen:
    conf = os.path.join(data, "qmq.toml")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f'listen = ["http:tcp:{port}:interface=127.0.0.1"]\n'
                f'data_dir = "{data}/data"\nstore = "log"\n')
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "twistd"), "-n", "--pidfile=", "qmq",
         "--config", conf],
        cwd=data, env=env, stdout=open(os.path.join(data, "broker.log"), "wb"),
        stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/vhosts", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the broker did not start; see " + os.path.join(data, "broker.log"))


def fill(url: str, queues: list[str], messages: int, body: int) -> float:
    from qmq.spark.client import Client  # noqa: PLC0415

    c = Client(url)
    for q in queues:
        c.declare_queue("/", q, {"x-retention": 86400})
    payload = b"x" * body
    t = time.perf_counter()
    sent = 0
    batch = 5000
    while sent < messages:
        n = min(batch, messages - sent)
        c.publish("/", [{"body": payload, "headers": {"producer": f"p{(sent + i) % 7}"},
                         "destination": "/queue/" + queues[(sent + i) % len(queues)],
                         "routing_key": None, "priority": 0, "ttl": None, "delay": None,
                         "persistent": True} for i in range(n)])
        sent += n
    return messages / (time.perf_counter() - t)


def timed(label: str, rows: int, f, repeat: int = 2) -> float:
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    rate = rows / best
    print(f"{label}: {rows} rows in {best:.2f} s = {rate:,.0f} rows/s", flush=True)
    return rate


def decoder_alone(data: str, queues: list[str]) -> tuple[int, float]:
    from qmq.spark import segments  # noqa: PLC0415

    match = segments.queue_matcher(queues, None)
    files = segments.segment_files(data)
    t = time.perf_counter()
    n = 0
    for _, f in files:
        for b in segments.read_messages(f, "/", match):
            n += b.num_rows
    return n, n / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--queues", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    tmp = tempfile.mkdtemp(prefix="qmq-spark-bench-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    broker = start_broker(tmp, port)
    results: dict[str, float] = {}
    try:
        queues = [f"bench{i}" for i in range(args.queues)]
        results["publish_for_fill"] = fill(url, queues, args.messages, args.body)
        print(f"filled {args.messages} messages of {args.body} B at "
              f"{results['publish_for_fill']:,.0f}/s", flush=True)
        n, rate = decoder_alone(os.path.join(tmp, "data"), queues)
        assert n == args.messages, n
        results["segments_decoder_one_core"] = rate
        print(f"segment decoder alone (one core, no Spark): {rate:,.0f} rows/s", flush=True)

        from qmq.spark import session  # noqa: PLC0415

        spark = session(args.master, "qmq-bench", **{"spark.ui.enabled": "false",
                                                      "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        names = ",".join(queues)
        over_http = (spark.read.format("qmq").option("url", url).option("destinations", names)
                     .option("partitionsPerDestination", "2").load())
        from_segments = (spark.read.format("qmq").option("path", os.path.join(tmp, "data"))
                         .option("destinations", names).load())
        assert from_segments.count() == args.messages
        results["read_segments"] = timed(
            "read from segment files", args.messages,
            lambda: from_segments.write.format("noop").mode("overwrite").save())
        results["read_http"] = timed(
            "read over HTTP (range scans)", args.messages,
            lambda: over_http.write.format("noop").mode("overwrite").save(), repeat=1)
        back = from_segments.select("body", "headers").repartition(2).cache()
        back.count()
        target = "bench-back"
        from qmq.spark.client import Client  # noqa: PLC0415

        Client(url).declare_queue("/", target)
        results["write_http"] = timed(
            "written back over HTTP (batches confirmed durable)", args.messages,
            lambda: back.write.format("qmq").option("url", url).option("destination", target)
            .option("batchSize", "2000").mode("append").save(), repeat=1)
        spark.stop()
    finally:
        broker.terminate()
        broker.wait(30)
    print(json.dumps({k: round(v) for k, v in results.items()}))


if __name__ == "__main__":
    main()
