"""Load-generator worker processes and the parent-side supervisor.

Every producer or group of consumers runs in its own forked process with its
own event loop (uvloop), so that the load generator can use more than one
core. The parent talks to workers over pipes with small tuples:

* worker -> parent: ``("ready", info)``, ``("done", result)``, ``("error", reason)``
* parent -> worker: ``("go", t0)``, ``("close", None)``, ``("stop", None)``

``t0`` is a ``time.monotonic()`` value; CLOCK_MONOTONIC is system-wide on
Linux, so workers and parent share one clock.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

from procstat import raise_nofile
from stompwire import StompError, install_uvloop

_CTX = multiprocessing.get_context("fork")


def new_shared(n: int) -> Any:
    """Return a shared array of ``n`` signed 64-bit counters (inherited by forked workers)."""
    return _CTX.RawArray("q", n)


class ScenarioError(Exception):
    """A scenario could not complete; the message is the reason."""


class ScenarioSkipped(Exception):
    """The scenario does not apply to this broker setup (no TLS listener, no wildcards)."""


class Control:
    """Worker-side end of the control pipe, readable from the event loop."""

    def __init__(self, pipe: multiprocessing.connection.Connection) -> None:
        self.pipe = pipe
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        asyncio.get_running_loop().add_reader(pipe.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            while self.pipe.poll():
                self.queue.put_nowait(self.pipe.recv())
        except (EOFError, OSError):
            self.queue.put_nowait(("stop", None))
            asyncio.get_running_loop().remove_reader(self.pipe.fileno())

    def send(self, kind: str, payload: Any = None) -> None:
        """Send a message to the parent."""
        self.pipe.send((kind, payload))

    async def wait(self, kind: str, timeout: float) -> Any:
        """Wait for a message of ``kind`` (a ``stop`` ends the wait early)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StompError(f"no '{kind}' from the parent within {timeout:.0f}s")
            try:
                k, payload = await asyncio.wait_for(self.queue.get(), left)
            except TimeoutError:
                continue
            if k == kind:
                return payload
            if k == "stop":
                raise StompError("stopped by the parent")


class SyncControl:
    """Worker-side end of the control pipe for blocking workers."""

    def __init__(self, pipe: multiprocessing.connection.Connection) -> None:
        self.pipe = pipe

    def send(self, kind: str, payload: Any = None) -> None:
        """Send a message to the parent."""
        self.pipe.send((kind, payload))

    def wait(self, kind: str, timeout: float) -> Any:
        """Block until a message of ``kind`` arrives."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pipe.poll(left):
                raise StompError(f"no '{kind}' from the parent within {timeout:.0f}s")
            k, payload = self.pipe.recv()
            if k == kind:
                return payload
            if k == "stop":
                raise StompError("stopped by the parent")


def _entry(fn: Callable[..., Any], pipe: multiprocessing.connection.Connection, args: tuple) -> None:
    """Run ``fn`` in the child; report exceptions as ``("error", reason)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C
    raise_nofile()
    try:
        if inspect.iscoroutinefunction(fn):
            install_uvloop()

            async def main() -> None:
                await fn(Control(pipe), *args)

            asyncio.run(main())
        else:
            fn(SyncControl(pipe), *args)
    except StompError as e:
        _safe_send(pipe, ("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, not swallowed
        _safe_send(pipe, ("error", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)}"))
    finally:
        pipe.close()
        os._exit(0)  # skip atexit handlers inherited from the parent


def _safe_send(pipe: multiprocessing.connection.Connection, msg: tuple) -> None:
    try:
        pipe.send(msg)
    except OSError:
        pass


class Supervisor:
    """Parent side: start workers, gather their messages, clean them up."""

    def __init__(self) -> None:
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.names: list[str] = []

    def start(self, name: str, fn: Callable[..., Any], *args: Any) -> int:
        """Fork a worker running ``fn(control, *args)``; return its index."""
        parent_end, child_end = _CTX.Pipe()
        proc = _CTX.Process(target=_entry, args=(fn, child_end, args), name=name, daemon=True)
        proc.start()
        child_end.close()
        self.procs.append(proc)
        self.pipes.append(parent_end)
        self.names.append(name)
        return len(self.procs) - 1

    def gather(self, kind: str, timeout: float, which: list[int] | None = None) -> list[Any]:
        """Wait for a ``kind`` message from each selected worker (in index order)."""
        idx = list(range(len(self.pipes))) if which is None else which
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(idx):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [self.names[i] for i in idx if i not in got]
                raise ScenarioError(f"timeout after {timeout:.0f}s waiting for '{kind}' from {missing}")
            waiting = [self.pipes[i] for i in idx if i not in got]
            for ready in multiprocessing.connection.wait(waiting, min(left, 1.0)):
                i = self.pipes.index(ready)  # type: ignore[arg-type]
                try:
                    k, payload = self.pipes[i].recv()
                except (EOFError, OSError) as e:
                    raise ScenarioError(f"worker {self.names[i]} died ({e or 'EOF'})") from e
                if k == "error":
                    raise ScenarioError(f"{self.names[i]}: {payload}")
                if k == kind:
                    got[i] = payload
        return [got[i] for i in idx]

    def send(self, msg: tuple, which: list[int] | None = None) -> None:
        """Send ``msg`` to the selected workers (all by default)."""
        for i in range(len(self.pipes)) if which is None else which:
            try:
                self.pipes[i].send(msg)
            except OSError:
                pass

    def close(self, grace: float = 5.0) -> None:
        """Ask workers to stop, then terminate the ones still alive."""
        self.send(("stop", None))
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(1.0)
        for pipe in self.pipes:
            pipe.close()
        self.procs.clear()
        self.pipes.clear()
        self.names.clear()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _spin(parent: int, max_seconds: float) -> None:
    """Burn idle CPU at the lowest priority until told to stop (or orphaned).

    SCHED_IDLE, not just nice 19: a waking normal task preempts a SCHED_IDLE
    one at once, whereas a nice-19 task may keep the core for a scheduler
    slice (milliseconds), which stalls brokers that hand work between threads.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(200_000):
            pass


class KeepAwake:
    """Keep every core busy with SCHED_IDLE spinners while a scenario runs.

    A virtual machine whose vCPUs go idle wakes up slowly (tens of µs per
    wake-up), which dominates lock-step protocols (ping-pong, one unacked
    message). Spinners in the SCHED_IDLE class keep the vCPUs running and
    give way at once to any other runnable task. It changes the conditions:
    compare runs with and without it separately.
    """

    def __init__(self, n: int | None = None, max_seconds: float = 3600.0) -> None:
        self.n = n or os.cpu_count() or 1
        self.max_seconds = max_seconds
        self.procs: list[multiprocessing.process.BaseProcess] = []

    @property
    def pids(self) -> list[int]:
        """PIDs of the spinners."""
        return [p.pid for p in self.procs if p.pid is not None]

    def __enter__(self) -> KeepAwake:
        for _ in range(self.n):
            p = _CTX.Process(target=_spin, args=(os.getpid(), self.max_seconds), daemon=True)
            p.start()
            self.procs.append(p)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(2.0)
        self.procs.clear()
