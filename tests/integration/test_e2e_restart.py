"""An exchange-to-exchange binding kept by the commit log routes in the real
broker (C{twistd -n qmq}, C{store = "log"}), and still does after the
broker stopped and started again.

No frontend on this tree binds exchanges to exchanges (AMQP's
C{exchange.bind} will), so the topology is written into the broker's log
directory by the core in-process, as a client's C{exchange.bind} would
make it, before the first start: source C{src} (topic) -> C{dst} (fanout)
-> durable queue C{q}. Each run a STOMP client SENDs to
C{/exchange/src/KEY} and reads C{/queue/q}: a matching key arrives, another
does not. Every wait has a deadline.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock
from twisted.trial import unittest

from qmq.core.broker import Broker
from qmq.store.log import CommitLogStore
from tests.integration import test_kill
from tests.integration.test_kill import Client

DEADLINE = 10.0


class ExchangeBindingRestartTests(unittest.TestCase):
    timeout = 60

    # The broker's start, stop and output, as the kill test runs it.
    start = test_kill.KillTests.start
    output = test_kill.KillTests.output

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.data_dir = self.workdir / "data"
        self.config = self.workdir / "qmq.toml"
        self.config.write_text(f'data_dir = "{self.data_dir}"\nstore = "log"\n')
        self.runs = 0
        self.process = None

    def write_topology(self) -> None:
        """What a client's declares and binds leave in the log."""
        log = self.data_dir / "log"
        log.mkdir(parents=True)
        clock = Clock()
        store = CommitLogStore(str(log), reactor=clock, io=maybeDeferred, fsync="always")
        broker = Broker(clock, store=store)
        broker.recover()
        vhost = broker.default_vhost
        vhost.declare_exchange("src", "topic")
        vhost.declare_exchange("dst", "fanout")
        vhost.declare_queue("q")
        vhost.bind("q", "dst")
        vhost.bind_exchange("dst", "src", "a.*")
        store.flush()
        clock.advance(0)
        self.successResultOf(store.close())

    def routed(self, port: int, run: int) -> None:
        """A SEND to C{src} with a matching key reaches C{q}; one with
        another key does not (the next message read is the matching one
        sent after it)."""
        client = Client(port)
        try:
            for key in ("b.x", "a.x", "b.y", "a.y"):
                client.request(
                    "SEND",
                    {"destination": f"/exchange/src/{key}", "persistent": "true"},
                    f"{run}:{key}".encode(),
                )
            client.request(
                "SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual"}
            )
            deadline = time.monotonic() + DEADLINE
            got = []
            for _ in range(2):
                _, headers, body = client.wait(lambda f: f[0] == "MESSAGE", deadline, "a message")
                got.append(body)
                client.request("ACK", {"id": headers["ack"]})
            self.assertEqual(got, [f"{run}:a.x".encode(), f"{run}:a.y".encode()])
        finally:
            client.close()

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)

    def test_binding_survives_restarts(self) -> None:
        self.write_topology()
        self.routed(self.start(), 1)
        self.stop()
        self.routed(self.start(), 2)
        self.stop()
        self.assertIn("QMQ stopped", self.output(2))
        self.assertNotIn("Traceback", self.output())
