"""The broker as a user runs it: C{twistd -n qmq} in a subprocess.

These tests start the real command from the README (the C{twistd} script
next to the running interpreter, or the same entry point through
C{python -c} where there is none) in a scratch directory, with the working
tree first on C{PYTHONPATH} so the plugin and the code under test are this
checkout's.  They talk STOMP over a raw socket: no client library between the
test and the wire.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from twisted.trial import unittest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def twistd_command() -> list[str]:
    """
    The C{twistd} command of the interpreter running the tests.
    """
    script = Path(sys.executable).parent / "twistd"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_qmq(
    test: unittest.TestCase, arguments: list[str], cwd: Path, log: Path
) -> subprocess.Popen[bytes]:
    """C{twistd -n --pidfile= qmq ARGUMENTS} in C{cwd}, its output (both
    streams) written to C{log}; killed at C{test}'s cleanup if it still runs."""
    output = log.open("wb")
    test.addCleanup(output.close)
    process = subprocess.Popen(
        twistd_command() + ["-n", "--pidfile=", "qmq", *arguments],
        cwd=cwd,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
    )

    def cleanup() -> None:
        if process.poll() is None:
            process.kill()
            process.wait(10)

    test.addCleanup(cleanup)
    return process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


class FrameReader:
    """
    Read STOMP frames from a blocking socket, skipping heart-beats.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.closed = False

    def read(self) -> tuple[str, dict[str, str], bytes] | None:
        """
        @return: the next frame as (command, headers, body), or L{None} once
            the broker has closed the connection.
        """
        while True:
            self.buffer = self.buffer.lstrip(b"\r\n")
            end = self.buffer.find(b"\x00")
            if end >= 0:
                raw, self.buffer = self.buffer[:end], self.buffer[end + 1 :]
                head, _, body = raw.partition(b"\n\n")
                command, *lines = head.decode().split("\n")
                headers = dict(line.split(":", 1) for line in lines if line)
                return command, headers, body
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self.buffer += data


class TwistdTests(unittest.TestCase):
    """
    C{twistd -n qmq} started, used and stopped like in the README.
    """

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.stdout = (self.workdir / "stdout").open("wb")
        self.stderr = (self.workdir / "stderr").open("wb")
        process = subprocess.Popen(
            twistd_command() + ["-n", "qmq", *args],
            cwd=self.workdir,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=self.stdout,
            stderr=self.stderr,
        )

        def cleanup() -> None:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            self.stdout.close()
            self.stderr.close()

        self.addCleanup(cleanup)
        return process

    def output(self) -> str:
        self.stdout.flush()
        self.stderr.flush()
        return (self.workdir / "stdout").read_text() + (self.workdir / "stderr").read_text()

    def connect(self, process: subprocess.Popen[bytes], port: int) -> socket.socket:
        """
        Connect to the broker once it listens.
        """
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                self.fail(f"twistd exited with {process.returncode}:\n{self.output()}")
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                if time.monotonic() > deadline:
                    self.fail(f"the broker did not listen on {port}:\n{self.output()}")
                time.sleep(0.1)
                continue
            self.addCleanup(sock.close)
            return sock

    def test_readmeCommand(self) -> None:
        """
        The broker started with C{--listen} serves STOMP: CONNECT, SUBSCRIBE,
        SEND and the MESSAGE comes back; on SIGTERM the connected client gets
        an ERROR frame and is disconnected, and the process exits cleanly.
        """
        port = free_port()
        process = self.start("--listen", f"stomp:tcp:{port}:interface=127.0.0.1")
        sock = self.connect(process, port)
        reader = FrameReader(sock)

        sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "127.0.0.1"}))
        command, headers, _ = reader.read()
        self.assertEqual(command, "CONNECTED")
        self.assertEqual(headers["version"], "1.2")

        sock.sendall(frame("SUBSCRIBE", {"id": "0", "destination": "/queue/t", "receipt": "sub"}))
        command, headers, _ = reader.read()
        self.assertEqual((command, headers.get("receipt-id")), ("RECEIPT", "sub"))

        sock.sendall(
            frame(
                "SEND",
                {"destination": "/queue/t", "content-type": "text/plain"},
                b"hello, qmq",
            )
        )
        command, headers, body = reader.read()
        self.assertEqual(command, "MESSAGE")
        self.assertEqual(headers["destination"], "/queue/t")
        self.assertEqual(headers["subscription"], "0")
        self.assertEqual(body, b"hello, qmq")

        process.send_signal(signal.SIGTERM)
        command, headers, _ = reader.read()
        self.assertEqual(command, "ERROR")
        self.assertIn("shutting down", headers["message"])
        self.assertIsNone(reader.read())
        self.assertTrue(reader.closed)

        process.wait(30)
        # twistd re-raises the signal it was stopped with (a shell sees 143).
        self.assertIn(process.returncode, (0, -signal.SIGTERM), self.output())
        log = self.output()
        self.assertIn(f"STOMP listening on 127.0.0.1:{port}", log)
        self.assertIn("QMQ stopped", log)
        self.assertNotIn("Traceback", log)
        self.assertTrue((self.workdir / "qmq-data").is_dir())

    def test_badConfig(self) -> None:
        """
        A bad configuration file: twistd exits non-zero with a message naming
        the file and the key, and no traceback.
        """
        workdir = Path(self.mktemp()).resolve()
        workdir.mkdir()
        bad = workdir / "qmq.toml"
        bad.write_text('[stomp]\nheartbeat_grace = "x"\n')
        process = self.start("--config", str(bad))
        process.wait(START_TIMEOUT)
        output = self.output()
        self.assertEqual(process.returncode, 1, output)
        self.assertIn(f'{bad}: stomp.heartbeat_grace: expected a number >= 1.5, got "x"', output)
        self.assertNotIn("Traceback", output)

    def test_portInUse(self) -> None:
        """
        A port that is taken: twistd exits with status 1 and says which.
        """
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            process = self.start("--listen", f"stomp:tcp:{port}:interface=127.0.0.1")
            process.wait(START_TIMEOUT)
        output = self.output()
        self.assertEqual(process.returncode, 1, output)
        self.assertIn(f"cannot listen on stomp:tcp:{port}:interface=127.0.0.1", output)
        self.assertNotIn("Traceback", output)

    def test_pluginListed(self) -> None:
        """
        C{twistd --help} lists C{qmq}; C{twistd qmq --help} documents its
        options.
        """
        listing = subprocess.run(
            twistd_command() + ["--help"],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=True,
        ).stdout
        self.assertIn("qmq", listing)
        usage = subprocess.run(
            twistd_command() + ["qmq", "--help"],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=True,
        ).stdout
        for option in ("--config", "--listen", "--data-dir"):
            self.assertIn(option, usage)
