"""The worker of the live task queue example (qmq/web/examples/tasks.html).

It takes jobs from /queue/tasks one at a time (client-individual acks,
prefetch 1), does them, and sends each result to the job's reply-to (the
page's own /temp-queue/, which QMQ rewrote to a /queue/amq.tmp... name),
with the job's correlation-id, then acknowledges the job. A job that cannot
be done gets an error reply; nothing is lost if the worker dies before the
ACK (the broker gives the job to the next worker).

    pip install stomp.py
    python examples/worker.py --host 127.0.0.1 --port 61613
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time

import stomp

KINDS = {
    "wordcount": lambda text: len(text.split()),
    "reverse": lambda text: text[::-1],
    "sha256": lambda text: hashlib.sha256(text.encode()).hexdigest(),
    "upper": lambda text: text.upper(),
}


def work(body: str) -> dict:
    """Do one job: a JSON object {"kind": ..., "input": ...}."""
    try:
        job = json.loads(body)
        kind = KINDS[job["kind"]]
        return {"ok": True, "result": kind(str(job["input"]))}
    except (ValueError, KeyError, TypeError) as e:
        return {"ok": False, "error": f"bad job: {e}"}


class Worker(stomp.ConnectionListener):
    def __init__(self, conn: stomp.Connection, name: str, delay: float) -> None:
        self.conn = conn
        self.name = name
        self.delay = delay
        self.done = 0
        self.lost = threading.Event()

    def on_message(self, frame) -> None:
        headers = frame.headers
        reply = work(frame.body)
        reply["worker"] = self.name
        if self.delay:
            time.sleep(self.delay)  # so a person can watch the queue work
        reply_to = headers.get("reply-to")
        if reply_to:
            extra = {"content-type": "application/json"}
            if "correlation-id" in headers:
                extra["correlation-id"] = headers["correlation-id"]
            self.conn.send(reply_to, json.dumps(reply), headers=extra)
        self.conn.ack(headers["ack"], headers["subscription"])
        self.done += 1
        print(f"{self.name}: job {headers.get('correlation-id', '?')} -> {reply}", flush=True)

    def on_error(self, frame) -> None:
        print(f"{self.name}: broker error: {frame.headers.get('message')}", file=sys.stderr)

    def on_disconnected(self) -> None:
        self.lost.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=61613)
    parser.add_argument("--queue", default="/queue/tasks")
    parser.add_argument("--name", default=f"worker-{os.getpid()}")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds per job (for show)")
    args = parser.parse_args(argv)
    conn = stomp.Connection([(args.host, args.port)], heartbeats=(10000, 10000))
    worker = Worker(conn, args.name, args.delay)
    conn.set_listener("worker", worker)
    conn.connect(wait=True)
    conn.subscribe(args.queue, id="tasks", ack="client-individual", headers={"prefetch-count": "1"})
    print(f"{args.name}: waiting for jobs on {args.queue}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and not worker.lost.is_set():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    if conn.is_connected():
        conn.disconnect()
    return 0 if not worker.lost.is_set() or stop.is_set() else 1


if __name__ == "__main__":
    sys.exit(main())
