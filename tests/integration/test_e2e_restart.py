"""An exchange-to-exchange binding made by a client survives a restart of
the real broker (C{twistd -n qmq}, C{store = "log"}).

Run 1: pika declares C{src} (topic), C{dst} (fanout) and the queue C{q},
binds C{q} to C{dst} and C{dst} to C{src} with C{a.*} (AMQP's
C{exchange.bind}); the broker is stopped (SIGTERM). Runs 2 and 3: a STOMP
client SENDs to C{/exchange/src/KEY} and reads C{/queue/q}: a matching key
arrives, another does not. Run 3 follows a second restart; before it, pika
unbinds in run 2, so in run 4 nothing arrives. Every wait has a deadline.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pika
from twisted.trial import unittest

from tests.integration.test_kill import Client
from tests.integration.test_twistd import free_port, start_qmq

DEADLINE = 10.0


class ExchangeBindingRestartTests(unittest.TestCase):
    timeout = 90

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.config = self.workdir / "qmq.toml"
        self.config.write_text(f'data_dir = "{self.workdir / "data"}"\nstore = "log"\n')
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> tuple[int, int]:
        """Start the broker; its STOMP and AMQP ports once both listen."""
        stomp, amqp = free_port(), free_port()
        self.runs += 1
        process = self.process = start_qmq(
            self,
            ["--config", str(self.config), "--listen", f"stomp:tcp:{stomp}:interface=127.0.0.1",
             "--listen", f"amqp:tcp:{amqp}:interface=127.0.0.1"],
            self.workdir,
            self.workdir / f"broker-{self.runs}.log",
        )
        deadline = time.monotonic() + 30
        for port in (stomp, amqp):
            while True:
                if process.poll() is not None:
                    self.fail(f"twistd exited with {process.returncode}:\n{self.output()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        self.fail(f"the broker did not listen on {port}:\n{self.output()}")
                    time.sleep(0.05)
        return stomp, amqp

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)

    def output(self) -> str:
        return "".join(
            (self.workdir / f"broker-{r}.log").read_text(errors="replace")
            for r in range(1, self.runs + 1)
        )

    def amqp(self, port: int) -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", port, blocked_connection_timeout=DEADLINE, socket_timeout=DEADLINE
            )
        )

    def routed(self, port: int, run: int, bound: bool = True) -> None:
        """SENDs to C{src} with a matching key reach C{q} (if C{bound});
        one with another key never does. The client acks what it reads, so
        a later run reads only its own."""
        client = Client(port)
        try:
            for key in ("b.x", "a.x", "b.y", "a.y"):
                client.request(
                    "SEND",
                    {"destination": f"/exchange/src/{key}", "persistent": "true"},
                    f"{run}:{key}".encode(),
                )
            # A marker straight to the queue: what arrives before it is
            # everything the exchanges routed.
            client.request("SEND", {"destination": "/queue/q"}, f"{run}:end".encode())
            client.request(
                "SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual"}
            )
            deadline = time.monotonic() + DEADLINE
            got = []
            while not got or got[-1] != f"{run}:end".encode():
                _, headers, body = client.wait(lambda f: f[0] == "MESSAGE", deadline, "a message")
                got.append(body)
                client.request("ACK", {"id": headers["ack"]})
            routed = [f"{run}:a.x".encode(), f"{run}:a.y".encode()] if bound else []
            self.assertEqual(got, [*routed, f"{run}:end".encode()])
        finally:
            client.close()

    def test_binding_survives_restarts(self) -> None:
        stomp, amqp = self.start()
        conn = self.amqp(amqp)
        ch = conn.channel()
        ch.exchange_declare("src", "topic", durable=True)
        ch.exchange_declare("dst", "fanout", durable=True)
        ch.queue_declare("q", durable=True)
        ch.queue_bind("q", "dst")
        ch.exchange_bind("dst", "src", "a.*")
        conn.close()
        self.routed(stomp, 1)
        self.stop()

        stomp, amqp = self.start()
        self.routed(stomp, 2)
        self.stop()

        stomp, amqp = self.start()
        self.routed(stomp, 3)
        conn = self.amqp(amqp)
        conn.channel().exchange_unbind("dst", "src", "a.*")
        conn.close()
        self.stop()

        stomp, _ = self.start()
        self.routed(stomp, 4, bound=False)
        self.stop()
        self.assertIn("QMQ stopped", self.output())
        self.assertNotIn("Traceback", self.output())
