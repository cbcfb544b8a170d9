"""The container image's command, run here without a container engine (none
runs on the machines that test QMQ): the Dockerfile's ENTRYPOINT and CMD
(read from it) in a subprocess, with the configuration the image ships and
an administrator from the environment, as C{docker run} would start it.
Only the listeners (loopback, free ports) and the data directory are given
on the command line, as a user may after the image name.  The image's
HEALTHCHECK command answers; the administrator logs in over STOMP, a client
without credentials is refused; SIGTERM stops it cleanly; no pid file is
left in the data directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from twisted.trial import unittest

from tests.integration import test_twistd
from tests.integration.test_twistd import FrameReader, environment, frame, free_port
from tests.test_container import ROOT, SHIPPED, instructions

HASH = "$scrypt$ln=4,r=8,p=1$es4K7/ufPxWjDGskXjwwzw==$OcHVQH7ZWln7acwNeC0Yg6YGpM/R7XobP8R3f3SMr1E="


def image_command() -> tuple[list[str], list[str]]:
    """The Dockerfile's ENTRYPOINT + CMD, "python" being this interpreter;
    and its HEALTHCHECK command."""
    steps = dict(instructions((ROOT / "Dockerfile").read_text(encoding="utf-8")))
    command = json.loads(steps["ENTRYPOINT"]) + json.loads(steps["CMD"])
    health = json.loads(steps["HEALTHCHECK"].split(" CMD ", 1)[1])
    python = {"python": sys.executable}
    return [python.get(a, a) for a in command], [python.get(a, a) for a in health]


class ContainerCommandTests(unittest.TestCase):
    # twistd's own tests' helpers (not the tests: imported, they would run twice).
    output = test_twistd.TwistdTests.output
    connect = test_twistd.TwistdTests.connect

    def start_image(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir()
        self.stdout = (self.workdir / "stdout").open("wb")
        self.stderr = (self.workdir / "stderr").open("wb")
        command, self.health = image_command()
        environ = environment()
        # twistd is found on PATH, as in the image.
        environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environ["PATH"]])
        environ.update({"QMQ_CONFIG": str(SHIPPED), "TMPDIR": str(self.workdir), **env})
        process = subprocess.Popen(command + list(args), cwd=self.workdir, env=environ,
                                   stdin=subprocess.DEVNULL, stdout=self.stdout,
                                   stderr=self.stderr)

        def cleanup() -> None:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            self.stdout.close()
            self.stderr.close()

        self.addCleanup(cleanup)
        return process

    def test_image_command(self) -> None:
        """The image's command with an administrator: it serves, answers
        its health check, refuses anonymous clients, stops on SIGTERM."""
        stomp, http = free_port(), free_port()
        data = str(Path(self.mktemp()).resolve())
        process = self.start_image(
            "--data-dir", data,
            "--listen", f"stomp:tcp:{stomp}:interface=127.0.0.1",
            "--listen", f"http:tcp:{http}:interface=127.0.0.1",
            QMQ_ADMIN_PASSWORD_HASH=HASH)
        sock = self.connect(process, stomp)
        reader = FrameReader(sock)
        sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/",
                                       "login": "admin", "passcode": "s3cret"}))
        self.assertEqual(reader.read()[0], "CONNECTED")
        self.connect(process, http)
        health = [a.replace(":15674/", f":{http}/") for a in self.health]
        done = subprocess.run(health, capture_output=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)

        anonymous = self.connect(process, stomp)
        anonymous.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        self.assertEqual(FrameReader(anonymous).read()[0], "ERROR")

        process.send_signal(signal.SIGTERM)
        process.wait(30)
        self.assertIn(process.returncode, (0, -signal.SIGTERM), self.output())
        log = self.output()
        self.assertIn("QMQ stopped", log)
        self.assertNotIn("Traceback", log)
        self.assertFalse(list(self.workdir.rglob("*.pid")))
        self.assertTrue((Path(data) / "log").is_dir())

    def test_no_users(self) -> None:
        """Without an administrator or users the image does not listen on
        every interface: twistd says why and exits."""
        process = self.start_image("--data-dir", self.mktemp())
        process.wait(60)
        self.assertNotEqual(process.returncode, 0)
        self.assertIn("not only on loopback", self.output())

