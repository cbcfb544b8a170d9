"""A persistent message a STOMP ``ack:auto`` subscriber got is not
delivered again after the real broker (C{twistd -n qmq}, C{store = "log"})
restarts; one nobody got is (it was found coming back, every one of them).
Every wait has a deadline."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from twisted.trial import unittest

from tests.integration import test_kill
from tests.integration.test_kill import Client

DEADLINE = 10.0


class AutoAckRestartTests(unittest.TestCase):
    timeout = 60

    # The broker's start and output, as the kill test runs them.
    start = test_kill.KillTests.start
    output = test_kill.KillTests.output

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.config = self.workdir / "qmq.toml"
        self.config.write_text(f'data_dir = "{self.workdir / "data"}"\nstore = "log"\n')
        self.runs = 0
        self.process = None

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)

    def test_not_again(self) -> None:
        client = Client(self.start())
        client.request("SEND", {"destination": "/queue/got", "persistent": "true"}, b"got")
        client.request("SEND", {"destination": "/queue/kept", "persistent": "true"}, b"kept")
        client.request("SUBSCRIBE", {"destination": "/queue/got", "id": "s", "ack": "auto"})
        deadline = time.monotonic() + DEADLINE
        self.assertEqual(client.wait(lambda f: f[0] == "MESSAGE", deadline, "got")[2], b"got")
        client.close()
        self.stop()

        client = Client(self.start())
        # A marker behind anything the queue still holds.
        client.request("SEND", {"destination": "/queue/got"}, b"marker")
        client.request("SUBSCRIBE", {"destination": "/queue/got", "id": "s", "ack": "auto"})
        client.request("SUBSCRIBE", {"destination": "/queue/kept", "id": "k", "ack": "auto"})
        deadline = time.monotonic() + DEADLINE
        got = sorted(client.wait(lambda f: f[0] == "MESSAGE", deadline, "a message")[2] for _ in range(2))
        self.assertEqual(got, [b"kept", b"marker"])
        client.close()
        self.stop()
        self.assertNotIn("Traceback", self.output())
