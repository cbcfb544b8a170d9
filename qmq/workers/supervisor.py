# -*- test-case-name: tests.test_workers -*-
"""The supervisor: N worker processes, started, restarted and stopped.

C{twistd -n qmq --workers N} (or C{[workers] count = N}, N > 1) runs this
service instead of a broker. It holds no listener, no store and no client:

    1. L{Supervisor.startService} starts worker 0 to N-1 with Twisted's
       C{spawnProcess}: each a fresh C{twistd -n --pidfile= qmq ...
       --worker I:N:DIR} (L{worker_command}), sharing the supervisor's
       standard output and error, with two pipes (L{qmq.workers.worker}:
       the worker says C{ready} on one, and stops when the other ends).
       A fresh process rather than C{fork()}: a forked child would inherit
       the supervisor's reactor, its threads and its descriptors; a new
       interpreter starts clean, runs exactly the code a single broker
       runs, and is what the supervisor starts again after a death.
    2. A worker that ends while the supervisor runs is started again after
       C{restart_delay} seconds, doubled at each death in a row up to
       C{restart_max_delay}; a worker that stayed up L{STABLE_AFTER}
       seconds starts the count again. Its clients reconnect (to any
       worker: the ports are shared), its durable queues come back from its
       own commit log, and the other workers' links to it reconnect.
       A worker that ends before any worker of its index was ever ready
       (a port in use, a configuration the worker refuses) is fatal: the
       supervisor stops the others and exits with status 1
       (C{on_fatal}), rather than trying a broken configuration forever.
    3. L{Supervisor.stopService} (twistd calls it on SIGTERM and SIGINT):
       no more restarts; SIGTERM to every worker at once (each stops in its
       own order: listeners, then clients with an ERROR frame, then its
       store); the supervisor waits up to C{stop_timeout} seconds, then
       SIGKILLs those left and waits for them; then it removes its
       directory of link sockets.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.error import ProcessDone, ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger

from qmq.workers.worker import LIFELINE_FD, READY_FD

__all__ = ["STABLE_AFTER", "Supervisor", "WorkerProcess", "worker_command"]

log = Logger()

#: Seconds a worker must stay up for its next death to wait
#: C{restart_delay} again (not a doubled delay).
STABLE_AFTER = 10.0
#: Seconds to wait for workers killed after C{stop_timeout}.
KILL_WAIT = 5.0
#: Most bytes of a worker's C{ready} line kept.
MAX_STATUS = 256


def worker_command(index: int, count: int, directory: str, arguments: list[str]) -> list[str]:
    """The command line of worker C{index}: this interpreter's twistd, in
    the foreground, without a pid file, with the supervisor's C{qmq}
    arguments (C{--workers} left out) and C{--worker}."""
    return [
        sys.executable,
        "-c",
        "from twisted.scripts.twistd import run; run()",
        "-n",
        "--pidfile=",
        "qmq",
        *arguments,
        "--worker",
        f"{index}:{count}:{directory}",
    ]


class WorkerProcess(ProcessProtocol):
    """One run of one worker, as the supervisor sees it.

    @ivar index: the worker's index.
    @ivar started: when it was spawned (the supervisor's clock).
    @ivar ready: it said ready.
    @ivar ended: it ended (C{processEnded}).
    """

    def __init__(self, supervisor: Supervisor, index: int, started: float) -> None:
        self.supervisor = supervisor
        self.index = index
        self.started = started
        self.ready = False
        self.ended = False
        self.pid: int | None = None
        self._status = b""
        self.done: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.pid = getattr(self.transport, "pid", None)

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD != READY_FD or self.ready:
            return
        self._status = (self._status + data)[-MAX_STATUS:]
        if b"\n" in self._status:
            line = self._status.split(b"\n", 1)[0]
            if line.startswith(b"ready"):
                self.ready = True
                self.supervisor.worker_ready(self)

    def signal(self, name: str) -> None:
        if self.ended or self.transport is None:
            return
        try:
            self.transport.signalProcess(name)
        except ProcessExitedAlready:
            pass

    def processEnded(self, reason: Any) -> None:
        self.ended = True
        self.supervisor.worker_ended(self, reason)
        self.done.callback(None)


def _describe(reason: Any) -> str:
    value = getattr(reason, "value", None)
    if isinstance(value, ProcessDone):
        return "exited with status 0"
    signal = getattr(value, "signal", None)
    if signal:
        return f"ended by signal {signal}"
    code = getattr(value, "exitCode", None)
    return f"exited with status {code}" if code is not None else str(value)


class Supervisor(Service):
    """The workers' supervisor (see the module docstring).

    @ivar workers: index -> its current run (or the last one, ended).
    @ivar restarts: how many times each worker was started again.
    """

    def __init__(
        self,
        count: int,
        settings: Any,
        command: Callable[[int], list[str]],
        directory: str,
        clock: Any,
        spawn: Callable[..., Any],
        environment: dict[str, str] | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """
        @param settings: the C{[workers]} settings.
        @param command: worker index -> its command line.
        @param directory: the private directory of link sockets (made by
            the caller, removed here when the supervisor stops).
        @param spawn: C{reactor.spawnProcess}, or a fake.
        @param on_fatal: called with the reason when a worker cannot start.
        """
        self.count = count
        self.settings = settings
        self.command = command
        self.directory = directory
        self.clock = clock
        self.spawn = spawn
        self.environment = environment if environment is not None else dict(os.environ)
        self.on_fatal = on_fatal
        self.workers: dict[int, WorkerProcess] = {}
        self.restarts: dict[int, int] = dict.fromkeys(range(count), 0)
        self._delays: dict[int, float] = {}
        self._pending: dict[int, Any] = {}
        self._ever_ready: set[int] = set()
        self._stopping = False

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        log.info("QMQ supervisor: starting {count} workers", count=self.count)
        for index in range(self.count):
            self.start_worker(index)

    def start_worker(self, index: int) -> None:
        self._pending.pop(index, None)
        if self._stopping:
            return
        argv = self.command(index)
        process = self.workers[index] = WorkerProcess(self, index, self.clock.seconds())
        self.spawn(
            process,
            argv[0],
            argv,
            env=self.environment,
            childFDs={0: 0, 1: 1, 2: 2, LIFELINE_FD: "w", READY_FD: "r"},
        )
        log.info("QMQ supervisor: worker w{index} started (pid {pid})", index=index, pid=process.pid)

    def worker_ready(self, process: WorkerProcess) -> None:
        self._ever_ready.add(process.index)

    def worker_ended(self, process: WorkerProcess, reason: Any) -> None:
        index = process.index
        if self.workers.get(index) is not process:
            return
        what = _describe(reason)
        if self._stopping:
            log.info("QMQ supervisor: worker w{index} stopped ({what})", index=index, what=what)
            return
        if index not in self._ever_ready:
            message = f"worker w{index} {what} before it was ready (its log says why)"
            log.critical("QMQ supervisor: {message}; stopping", message=message)
            # Once: the others, stopped next, end before they were ready too.
            self._stopping = True
            if self.on_fatal is not None:
                self.on_fatal(message)
            return
        lived = self.clock.seconds() - process.started
        delay = self._delays.get(index)
        if delay is None or lived >= STABLE_AFTER:
            delay = self.settings.restart_delay
        else:
            delay = min(delay * 2, self.settings.restart_max_delay)
        self._delays[index] = delay
        self.restarts[index] += 1
        log.warn(
            "QMQ supervisor: worker w{index} {what} after {lived:.1f} s; started again in {delay:g} s",
            index=index,
            what=what,
            lived=lived,
            delay=delay,
        )
        self._pending[index] = self.clock.callLater(delay, self.start_worker, index)

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        super().stopService()
        self._stopping = True
        for call in self._pending.values():
            if call.active():
                call.cancel()
        self._pending.clear()
        alive = [p for p in self.workers.values() if not p.ended]
        log.info("QMQ supervisor: stopping {count} worker(s)", count=len(alive))
        for process in alive:
            process.signal("TERM")
        yield self._wait(alive, self.settings.stop_timeout)
        left = [p for p in alive if not p.ended]
        if left:
            log.warn(
                "QMQ supervisor: {count} worker(s) still running after {timeout:g} s: killed",
                count=len(left),
                timeout=self.settings.stop_timeout,
            )
            for process in left:
                process.signal("KILL")
            yield self._wait(left, KILL_WAIT)
        shutil.rmtree(self.directory, ignore_errors=True)
        log.info("QMQ supervisor: stopped")

    def _wait(self, processes: list[WorkerProcess], timeout: float) -> defer.Deferred[None]:
        """Fires when every one of C{processes} ended, or after C{timeout}."""
        remaining = [p for p in processes if not p.ended]
        result: defer.Deferred[None] = defer.Deferred()
        if not remaining:
            result.callback(None)
            return result
        left = [len(remaining)]

        def finish() -> None:
            if not result.called:
                result.callback(None)

        timer = self.clock.callLater(timeout, finish)

        def one(value: Any) -> Any:
            left[0] -= 1
            if left[0] == 0:
                if timer.active():
                    timer.cancel()
                finish()
            return value

        for process in remaining:
            process.done.addCallback(one)
        return result
