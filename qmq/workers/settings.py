# -*- test-case-name: tests.test_workers -*-
"""The C{[workers]} table: how many worker processes run the broker.

C{count} is an integer from 1 to L{MAX_WORKERS}, or C{"auto"}: one worker
per core this process may run on (L{cores}). One worker (the default) is
the broker as it always was: one process, no supervisor
(docs/workers.rst). C{twistd qmq --workers N} overrides the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["MAX_WORKERS", "WorkerSettings", "check_count", "cores", "worker_count"]

#: Most workers one supervisor runs.
MAX_WORKERS = 64


def check_count(value: int | str) -> int | str:
    """@raise ValueError: C{value} is neither C{"auto"} nor 1 to L{MAX_WORKERS}."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ValueError(f'expected an integer from 1 to {MAX_WORKERS} or "auto", got {value!r}')
    return value


def cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(value: int | str) -> int:
    """C{count} as a number: C{"auto"} is L{cores}, at most L{MAX_WORKERS}."""
    return min(cores(), MAX_WORKERS) if value == "auto" else int(value)


@dataclass(frozen=True)
class WorkerSettings:
    """
    @ivar count: worker processes: 1 to L{MAX_WORKERS}, or C{"auto"} (one
        per core); 1 is a single broker process, without a supervisor.
    @ivar restart_delay: seconds before a worker that died is started
        again; doubled at each death in a row, up to C{restart_max_delay}.
    @ivar restart_max_delay: the longest wait before a restart.
    @ivar stop_timeout: seconds the supervisor waits for its workers to
        stop (each closes its clients and its store) before it kills them.
    """

    count: int | str = field(
        default=1,
        metadata={"parse": check_count, "expected": f'an integer from 1 to {MAX_WORKERS} or "auto"'},
    )
    restart_delay: float = field(default=0.5, metadata={"min": 0.01, "max": 60})
    restart_max_delay: float = field(default=30.0, metadata={"min": 0.01, "max": 3600})
    stop_timeout: float = field(default=30.0, metadata={"min": 0.1, "max": 3600})
