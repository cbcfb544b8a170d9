"""The worker of the live task queue example (qmq/web/examples/tasks.html).

It takes jobs from /queue/tasks one at a time (client-individual acks,
prefetch 1), does each, acknowledges it, and sends the result to the job's
reply-to (the page's own /temp-queue/, which QMQ rewrote to a
/queue/amq.tmp... name) with the job's correlation-id.

The job is acknowledged before the reply is sent: a page that went away
took its temporary queue with it, and the broker answers a SEND to a queue
that no longer exists with an ERROR (and closes the connection). Acking
first means such a job is not handed out again and again; the worker just
reconnects. A worker that dies before the ACK loses nothing: the broker
gives the job to the next worker.

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
    def __init__(self, conn: stomp.Connection12, name: str, delay: float) -> None:
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
        self.conn.ack(headers["ack"])
        self.done += 1
        reply_to = headers.get("reply-to")
        if reply_to:
            extra = {"content-type": "application/json"}
            if "correlation-id" in headers:
                extra["correlation-id"] = headers["correlation-id"]
            self.conn.send(reply_to, json.dumps(reply), headers=extra)
        print(f"{self.name}: job {headers.get('correlation-id', '?')} -> {reply}", flush=True)

    def on_error(self, frame) -> None:
        print(f"{self.name}: broker error: {frame.headers.get('message')}", file=sys.stderr,
              flush=True)

    def on_disconnected(self) -> None:
        self.lost.set()


def serve(args: argparse.Namespace, stop: threading.Event) -> None:
    """One connection's life: subscribe, work until it drops or we stop."""
    conn = stomp.Connection12([(args.host, args.port)], heartbeats=(10000, 10000))
    worker = Worker(conn, args.name, args.delay)
    conn.set_listener("worker", worker)
    conn.connect(wait=True)
    conn.subscribe(args.queue, id="tasks", ack="client-individual",
                   headers={"prefetch-count": "1"})
    print(f"{args.name}: waiting for jobs on {args.queue}", flush=True)
    while not stop.is_set() and not worker.lost.is_set():
        stop.wait(0.5)
    if conn.is_connected():
        conn.disconnect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=61613)
    parser.add_argument("--queue", default="/queue/tasks")
    parser.add_argument("--name", default=f"worker-{os.getpid()}")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds per job (for show)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    backoff = 1.0
    while not stop.is_set():
        try:
            serve(args, stop)
            backoff = 1.0
        except stomp.exception.StompException as e:
            print(f"{args.name}: cannot connect ({e}); retrying in {backoff:g} s", file=sys.stderr,
                  flush=True)
            backoff = min(backoff * 2, 30.0)
        stop.wait(backoff if not stop.is_set() else 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
