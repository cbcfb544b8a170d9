#!/usr/bin/env python3
"""Run a third-party AMQP client's own test suite against QMQ (not a test).

    PYTHONPATH=. python bench/amqp_suite.py KOMBU_SOURCE [--rabbitmq PORT]

kombu's integration tests for its py-amqp transport
(``t/integration/test_py_amqp.py``: basic functionality, exchange types,
failover, message properties, priorities, TTL, the event loop) take the
broker from ``RABBITMQ_HOST`` and ``RABBITMQ_5672_TCP``. This script starts
QMQ (``twistd -n qmq`` from this tree, AMQP only, on a free loopback port,
its data in a temporary directory), runs pytest on that file against it and,
with ``--rabbitmq PORT``, against the RabbitMQ on that loopback port too, and
prints each score. It fetches nothing: get the suite first with

    pip download --no-binary :all: --no-deps kombu==5.7.0 -d /tmp && tar xzf /tmp/kombu-5.7.0.tar.gz -C /tmp

and pass ``/tmp/kombu-5.7.0``. (pika's sdist ships no tests; aio-pika's
cannot be built offline: kombu's suite is the one that runs here.) The
suite's tests declare fixed names, so a RabbitMQ used for it should be a
throwaway one (``peers.sh start rabbitmq``, guest/guest).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "t/integration/test_py_amqp.py"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"QMQ did not listen on 127.0.0.1:{port} in time")


def run_suite(source: Path, port: int, timeout: float) -> tuple[str, float, str]:
    """pytest on the suite against 127.0.0.1:PORT: (summary line, seconds, output)."""
    env = {**os.environ, "RABBITMQ_HOST": "127.0.0.1", "RABBITMQ_5672_TCP": str(port)}
    # The source tree's own kombu first; its pytest options (coverage...) off.
    env["PYTHONPATH"] = str(source)
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", SUITE, "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore"],
        cwd=source, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    seconds = time.monotonic() - started
    text = out.stdout + out.stderr
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", text, re.M)
    return (found[-1] if found else f"no summary (exit {out.returncode})"), seconds, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="an unpacked kombu source distribution")
    parser.add_argument("--rabbitmq", type=int, default=0, help="also run against RabbitMQ on this loopback port")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for each run")
    parser.add_argument("--verbose", action="store_true", help="print pytest's output")
    args = parser.parse_args()
    if not (args.source / SUITE).is_file():
        raise SystemExit(f"{args.source / SUITE} not found: unpack kombu's sdist (see --help)")
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        log = open(Path(data) / "qmq.log", "w")  # noqa: SIM115 (closed below)
        qmq = subprocess.Popen(
            [str(Path(sys.executable).parent / "twistd"), "-n", "--pidfile=", "qmq",
             "--listen", f"amqp:tcp:{port}:interface=127.0.0.1", "--data-dir", str(Path(data) / "data")],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_listening(port, time.monotonic() + 30)
            runs = [("QMQ", port)] + ([("RabbitMQ", args.rabbitmq)] if args.rabbitmq else [])
            for name, p in runs:
                summary, seconds, text = run_suite(args.source, p, args.timeout)
                if args.verbose:
                    print(text)
                print(f"{name:9} 127.0.0.1:{p}  {summary}  ({seconds:.1f} s)")
        finally:
            qmq.send_signal(signal.SIGTERM)
            try:
                qmq.wait(30)
            except subprocess.TimeoutExpired:
                qmq.kill()
                qmq.wait()
            log.close()


if __name__ == "__main__":
    main()
