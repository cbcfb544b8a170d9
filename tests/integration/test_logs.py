"""The log of a real C{twistd -n qmq}: Twisted's start-up lines kept out, no
line per connection at the default level, C{--log-level debug} showing
them with the peer as C{HOST:PORT}, and C{[log] format = "json"}."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from twisted.trial import unittest

from tests.integration import test_twistd
from tests.integration.test_twistd import START_TIMEOUT, FrameReader, frame, free_port


class TwistdLogTests(unittest.TestCase):
    # The helpers of the twistd tests (importing the class would run its
    # tests here too).
    start = test_twistd.TwistdTests.start
    output = test_twistd.TwistdTests.output
    connect = test_twistd.TwistdTests.connect

    def run_broker(self, *args: str) -> tuple[str, int]:
        """
        Start the broker, open and close one AMQP and one STOMP connection,
        stop it.

        @return: its whole output, and the STOMP client's local port.
        """
        stomp, http, amqp = free_port(), free_port(), free_port()
        process = self.start(
            "--listen", f"stomp:tcp:{stomp}:interface=127.0.0.1",
            "--listen", f"http:tcp:{http}:interface=127.0.0.1",
            "--listen", f"amqp:tcp:{amqp}:interface=127.0.0.1", *args,
        )
        # AMQP: the protocol header, answered with Connection.Start.
        raw = self.connect(process, amqp)
        self.amqp_port = raw.getsockname()[1]
        raw.sendall(b"AMQP\x00\x00\x09\x01")
        self.assertEqual(raw.recv(7)[:1], b"\x01")  # a method frame
        raw.close()
        sock = self.connect(process, stomp)
        client_port = sock.getsockname()[1]
        reader = FrameReader(sock)
        sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "127.0.0.1"}))
        self.assertEqual(reader.read()[0], "CONNECTED")
        sock.sendall(frame("DISCONNECT", {"receipt": "bye"}))
        self.assertEqual(reader.read()[0], "RECEIPT")
        sock.close()
        if "--log-level" in args or "--config" in args:
            # Let the broker see the close (its debug line) before stopping it.
            deadline = time.monotonic() + START_TIMEOUT
            while "connection closed" not in self.output() and time.monotonic() < deadline:
                time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        return self.output(), client_port

    def test_default(self) -> None:
        """
        At the default level: the listeners' own lines, none of Twisted's
        (C{Starting factory}, C{... starting on PORT}, C{Port N Closed}),
        and no line per connection.
        """
        log, _ = self.run_broker()
        self.assertIn("STOMP listening on 127.0.0.1:", log)
        self.assertIn("HTTP listening on 127.0.0.1:", log)
        self.assertIn("QMQ stopped", log)
        for noise in ("Starting factory", "Stopping factory", "starting on", "Port", "connection open",
                      "stomp connect", "connection closed"):
            self.assertNotIn(noise, log)
        self.assertNotIn("Traceback", log)

    def test_debug(self) -> None:
        """
        C{--log-level debug}: each connection's open and close, the peer
        written C{127.0.0.1:PORT}.
        """
        log, client_port = self.run_broker("--log-level", "debug")
        self.assertIn(f"connection open protocol=stomp peer=127.0.0.1:{client_port} session=", log)
        self.assertIn(f"connection closed protocol=stomp peer=127.0.0.1:{client_port} session=", log)
        self.assertIn("stomp connect session=", log)
        self.assertIn(f"connection open protocol=amqp peer=127.0.0.1:{self.amqp_port} session=", log)
        self.assertIn(f"peer=127.0.0.1:{client_port} version=1.2 vhost=/", log)
        self.assertIn("Starting factory", log)

    def test_json(self) -> None:
        """
        C{[log] format = "json"}: every line is a JSON object, the
        listener's line among them with its fields.
        """
        path = Path(self.mktemp()).resolve()
        path.write_text('[log]\nformat = "json"\nlevel = "debug"\n')
        log, client_port = self.run_broker("--config", str(path))
        events = [json.loads(line) for line in log.splitlines() if line.strip()]
        self.assertTrue(events)
        listening = [e for e in events if e.get("log_format") == "{protocol} listening on {address} ({spec})"]
        self.assertEqual([e["protocol"] for e in listening], ["STOMP", "HTTP", "AMQP"])
        opened = [e for e in events if str(e.get("log_format", "")).startswith("connection open protocol=")]
        self.assertEqual(sorted((e["protocol"], e["peer"]) for e in opened),
                         [("amqp", f"127.0.0.1:{self.amqp_port}"), ("stomp", f"127.0.0.1:{client_port}")])
        self.assertEqual(opened[0]["log_level"]["name"], "debug")
