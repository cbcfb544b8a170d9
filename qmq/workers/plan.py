# -*- test-case-name: tests.test_workers -*-
"""From settings to a supervisor, or to none: what C{twistd qmq} runs.

L{workers_wanted} says how many workers the settings ask for (C{--workers}
over C{[workers] count}); one is the broker as it always was, and
L{check_single} makes sure that a data directory left by several workers
is not silently half-read by one. L{check_workers} refuses, naming the key,
what the workers cannot share yet. L{make_supervisor} builds the
L{Supervisor}, with at least as many workers as the data directory holds
commit logs of (so a smaller count loses no durable message: the
workers with the highest indexes keep running until their logs are
drained by hand; docs/workers.rst).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from qmq.config import ConfigError, Settings
from qmq.workers.settings import check_count, worker_count
from qmq.workers.supervisor import Supervisor, worker_command
from qmq.workers.worker import worker_data_dir

__all__ = [
    "check_single",
    "check_workers",
    "log_file_of",
    "logs_held",
    "make_supervisor",
    "workers_wanted",
]

log = Logger()

#: The commit log's directory in a data directory (L{qmq.service.LOG_DIRECTORY}).
LOG_DIRECTORY = "log"


def workers_wanted(settings: Settings, option: str | None) -> int:
    """How many workers: C{--workers} if given, else C{[workers] count}.

    @raise ConfigError: C{--workers} is not a count.
    """
    if option is None:
        return worker_count(settings.section("workers").count)
    value: int | str = option
    if option != "auto":
        try:
            value = int(option)
        except ValueError:
            value = option
    try:
        return worker_count(check_count(value))
    except ValueError as e:
        raise ConfigError("--workers", "", str(e)) from None


def logs_held(data_dir: Path) -> int:
    """How many workers' commit logs C{data_dir} holds: one more than the
    highest index I whose C{DATA/wI/log} has a file (0 when none)."""
    held = 0
    try:
        names = os.listdir(data_dir)
    except OSError:
        return 0
    for name in names:
        if not (name.startswith("w") and name[1:].isdigit()):
            continue
        index = int(name[1:])
        try:
            if index > 0 and any(os.scandir(worker_data_dir(data_dir, index) / LOG_DIRECTORY)):
                held = max(held, index + 1)
        except OSError:
            continue
    return held


def check_single(settings: Settings) -> None:
    """One broker on a data directory that workers left logs in would not
    read them: refused, naming how many workers to run.

    @raise ConfigError: naming C{workers.count}.
    """
    if settings.store != "log":
        return
    held = logs_held(Path(settings.data_dir))
    if held > 1:
        raise ConfigError(
            "",
            "workers.count",
            f"the data directory {str(settings.data_dir)!r} holds the commit logs of {held} workers: "
            f"run at least {held} workers (--workers {held}) so that none of their messages is "
            "left unread (docs/workers.rst)",
        )


def check_workers(settings: Settings) -> None:
    """What several workers cannot share, refused naming the key.

    Workers join a mesh of hosts (C{[cluster] peers}, C{peer:} listeners)
    as nodes of their own, C{NODE-wI}: that needs C{[cluster] node} (the
    host's id, which its certificate names) and C{[cluster] advertise}
    (how other hosts dial each worker: its port plus the worker's index,
    as each worker listens on each C{peer:} port plus its index).

    @raise ConfigError: a C{unix:} client listener; in a mesh of hosts,
        no C{[cluster] node} or C{advertise}, or a C{peer:} listener
        without a port number.
    """
    cluster = settings.section("cluster")
    in_mesh = bool(cluster.peers) or any(spec.startswith("peer:") for spec in settings.listen)
    if in_mesh:
        for key, value in (("node", cluster.node), ("advertise", cluster.advertise)):
            if not value:
                raise ConfigError(
                    "",
                    f"cluster.{key}",
                    "workers in a mesh of hosts need [cluster] node (the host's id: its workers are "
                    "NODE-w0, NODE-w1, ...) and advertise (how other hosts dial worker I: the port "
                    "plus I) (docs/workers.rst)",
                )
    for index, spec in enumerate(settings.listen):
        protocol, _, endpoint = spec.partition(":")
        key = f"listen[{index}]" if settings.listen_source != "--listen" else ""
        if endpoint.startswith("unix:"):
            raise ConfigError(
                settings.listen_source,
                key,
                f"{spec!r}: a unix: listener cannot be shared by workers; listen on tcp:",
            )
        if protocol == "peer":
            from qmq.cluster.endpoints import shift_port  # noqa: PLC0415

            try:
                shift_port(endpoint, 0, 0)
            except ValueError:
                raise ConfigError(
                    settings.listen_source,
                    key,
                    f"{spec!r}: with workers, a peer: listener needs a port number (worker I "
                    "listens on it plus I)",
                ) from None


def log_file_of(server_options: Any) -> str | None:
    """Where the supervisor logs, if to a file (twistd's C{--logfile}, or
    C{twistd.log} when it runs as a daemon): its workers log next to it.
    None: to standard output, which the workers share."""
    if server_options is None or not hasattr(server_options, "get"):
        return None
    name = server_options.get("logfile")
    if name == "-":
        return None
    if name:
        return str(name)
    return None if server_options.get("nodaemon") else "twistd.log"


def make_supervisor(
    settings: Settings,
    count: int,
    arguments: list[str],
    reactor: Any,
    on_fatal: Any = None,
    log_file: str | None = None,
) -> Supervisor:
    """The supervisor of C{count} workers (more if the data directory
    holds more workers' logs), each run with the C{qmq} C{arguments}
    (and logging to C{log_file} with C{.wI} appended, if given).

    @raise ConfigError: see L{check_workers}.
    """
    check_workers(settings)
    held = logs_held(Path(settings.data_dir)) if settings.store == "log" else 0
    if held > count:
        log.warn(
            "QMQ: the data directory holds the commit logs of {held} workers: running {held} "
            "workers, not {count}, so that none of their messages is left unread",
            held=held,
            count=count,
        )
        count = held
    # A short path: a unix socket's path is at most 107 bytes.
    directory = tempfile.mkdtemp(prefix="qmq-workers-")
    os.chmod(directory, 0o700)
    return Supervisor(
        count,
        settings.section("workers"),
        lambda index: worker_command(index, count, directory, arguments, log_file),
        directory,
        reactor,
        reactor.spawnProcess,
        on_fatal=on_fatal,
    )
