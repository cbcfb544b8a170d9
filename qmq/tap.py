# -*- test-case-name: tests.test_tap -*-
"""C{twistd qmq}: command-line options and the service maker.

Shaped like Twisted's own C{twisted.words.tap}: L{Options} parses the
command line, L{makeService} builds the service.  The flow:

    1. L{Options.postOptions} loads the configuration, the embedded default
       with C{--config FILE} layered over it, then applies C{--listen}
       (which replaces the configuration's listeners) and C{--data-dir}.  An
       error in the file ends the process with the message alone (file, key,
       what was expected) and status 1; a malformed option is a
       L{usage.UsageError}, which twistd shows after the usage text.
    2. L{makeService} builds the broker with L{qmq.service.make_service}.
       Errors found there (an unknown protocol, a bad endpoint string, a
       declaration the core refuses) and at start-up (a port in use) end the
       process with the message alone and status 1: twistd would print a
       traceback for any other exception at that point.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, NoReturn

from twisted.application.service import IService, MultiService
from twisted.logger import ILogObserver
from twisted.python import usage
from twisted.python.components import Componentized

import qmq
from qmq import config
from qmq.config import ConfigError
from qmq.logs import LEVELS, observer_for_twistd
from qmq.service import StartupError, make_service
from qmq.workers.plan import check_single, make_supervisor, workers_wanted
from qmq.workers.sharing import ReusePortReactor
from qmq.workers.worker import WorkerRole, attach_worker, parse_role, worker_settings

__all__ = ["Options", "makeService"]


class Options(usage.Options):
    """
    Options of C{twistd qmq}.
    """

    synopsis = (
        "[--config FILE] [--listen PROTOCOL:ENDPOINT ...] [--data-dir DIR] [--log-level LEVEL]"
    )
    longdesc = (
        "Run QMQ, the Quick Message Queue. Without options it uses its embedded "
        "default configuration: STOMP on 127.0.0.1:61613 and HTTP on "
        "127.0.0.1:15674 (STOMP over WebSocket at /ws and SockJS at /sockjs, the "
        "HTTP API at /api/v1, the console at /console, metrics at /metrics) and "
        "AMQP 0-9-1 on 127.0.0.1:5672, loopback only; data in ./qmq-data. A listener on another interface "
        "refuses to start until users are configured (--config, docs/security.rst). "
        "SIGTERM or SIGINT stops it gracefully: listeners close first, then every "
        "client gets an ERROR frame."
    )

    examples = """
Examples:
  twistd -n qmq
  twistd -n qmq --config qmq.toml
  twistd -n qmq --config users.toml \\
                --listen stomp:tcp:61613:interface=0.0.0.0:backlog=1024
  twistd -n qmq --listen stomp:tcp:61613:interface=127.0.0.1 \\
                --listen http:tcp:15674:interface=127.0.0.1
  twistd -n qmq --listen stomp:tcp:61613:interface=127.0.0.1 \\
                --listen stomp:ssl:61614:privateKey=key.pem:certKey=cert.pem:interface=127.0.0.1
  twistd -n qmq --config users.toml --listen \\
      stomp:qmqtls:61615:privateKey=key.pem:certKey=cert.pem:caCerts=ca.pem:verify=require

The third and the last listen on every interface: users.toml configures users
(docs/security.rst); without them QMQ refuses to start.
"""

    optParameters = [
        [
            "config",
            "c",
            None,
            "A TOML configuration file, layered over the embedded default "
            "(see --print-default-config).",
        ],
        [
            "data-dir",
            None,
            None,
            "Directory for persistent data (overrides data_dir; default ./qmq-data).",
        ],
        [
            "workers",
            "w",
            None,
            "Worker processes: N (1 to 64) or auto, one per core (overrides "
            "[workers] count; default 1: one process, no supervisor). See docs/workers.rst.",
        ],
        [
            "worker",
            None,
            None,
            "Internal: INDEX:COUNT:DIR, given by the supervisor to each worker it starts.",
        ],
        [
            "log-level",
            None,
            None,
            "The lowest level logged: debug, info, warn, error or critical "
            "(overrides [log] level; default info).",
        ],
    ]

    compData = usage.Completions(
        optActions={
            "config": usage.CompleteFiles("*.toml"),
            "data-dir": usage.CompleteDirs(),
            "log-level": usage.CompleteList(list(LEVELS)),
        },
        multiUse=["listen"],
    )

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []

    def opt_listen(self, spec: str) -> None:
        """
        Listen for PROTOCOL (stomp; http: WebSocket, SockJS, the HTTP API,
        the console, metrics; amqp: AMQP 0-9-1) on a Twisted endpoint: PROTOCOL:ENDPOINT, e.g.
        stomp:tcp:61613:interface=127.0.0.1:backlog=1024 or
        http:tcp:15674:interface=127.0.0.1. Repeat it for more listeners; when
        given, it replaces the configuration's listen list (all the default
        listeners). ENDPOINT is tcp:, ssl:, unix: or qmqtls: (TLS that can
        require client certificates).
        """
        self["listen"].append(spec)

    opt_listen.__doc__ = " ".join((opt_listen.__doc__ or "").split())

    def opt_version(self) -> None:
        """
        Print QMQ's version and Twisted's, and exit.
        """
        from twisted import copyright  # noqa: PLC0415

        sys.stdout.write(f"QMQ version: {qmq.__version__}\nTwisted version: {copyright.version}\n")
        sys.exit(0)

    def opt_print_default_config(self) -> None:
        """
        Print the embedded default configuration (TOML) and exit.
        """
        sys.stdout.write(config.default_toml())
        sys.exit(0)

    def getUsage(self, width: int | None = None) -> str:
        """
        The usage text, with examples.
        """
        return super().getUsage(width) + self.examples

    def postOptions(self) -> None:
        """
        Load the configuration and apply the overrides.

        An error in the configuration file ends the process with its message
        (naming the file and the key) and status 1, without the usage text
        that would bury it.

        @raise usage.UsageError: if C{--listen} or C{--data-dir} is malformed.
        @raise SystemExit: if the configuration file is unusable.
        """
        try:
            settings = config.load(self["config"])
        except ConfigError as e:
            _exit(str(e))
        try:
            settings = config.with_overrides(
                settings, listen=self["listen"], data_dir=self["data-dir"]
            )
        except ConfigError as e:
            raise usage.UsageError(str(e)) from None
        level = self["log-level"]
        if level is not None:
            if level not in LEVELS:
                raise usage.UsageError(f"--log-level: expected one of {', '.join(LEVELS)}, got {level!r}")
            log = dataclasses.replace(settings.section("log"), level=level)
            settings = dataclasses.replace(settings, other_sections={**settings.other_sections, "log": log})
        self["settings"] = settings
        self["role"] = None
        self["count"] = 1
        if self["worker"] is not None:
            try:
                self["role"] = parse_role(self["worker"])
            except ValueError as e:
                raise usage.UsageError(f"--worker: {e}") from None
            return
        try:
            self["count"] = workers_wanted(settings, self["workers"])
        except ConfigError as e:
            raise usage.UsageError(str(e)) from None
        if self["count"] == 1:
            try:
                check_single(settings)
            except ConfigError as e:
                _exit(str(e))

    def worker_arguments(self) -> list[str]:
        """The C{qmq} arguments every worker is given (all but C{--workers})."""
        arguments = []
        if self["config"] is not None:
            arguments += ["--config", self["config"]]
        for spec in self["listen"]:
            arguments += ["--listen", spec]
        if self["data-dir"] is not None:
            arguments += ["--data-dir", self["data-dir"]]
        if self["log-level"] is not None:
            arguments += ["--log-level", self["log-level"]]
        return arguments


class _ExitOnStartupError(MultiService):
    """
    Turn a L{StartupError} into a clean exit with its message: at start-up
    twistd would print a traceback.

    @ivar log_observer: the observer twistd is to log to (L{qmq.logs}), set
        on the application as its L{ILogObserver} component when this
        service joins it; L{None}: twistd's own.
    """

    log_observer: ILogObserver | None = None

    def setServiceParent(self, parent: Any) -> None:
        # twistd hands the application (a Componentized) to the service
        # that makeService returned; its ILogObserver component is how
        # twistd is told which observer to log to.
        if (
            self.log_observer is not None
            and isinstance(parent, Componentized)
            and parent.getComponent(ILogObserver) is None
        ):
            parent.setComponent(ILogObserver, self.log_observer)
        super().setServiceParent(parent)

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except StartupError as e:
            _exit(str(e))

    def startService(self) -> None:
        try:
            super().startService()
        except StartupError as e:
            _exit(str(e))


def _exit(message: str) -> NoReturn:
    sys.stderr.write(f"twistd qmq: {message}\n")
    sys.stderr.flush()
    raise SystemExit(1)


def makeService(options: Options | dict[str, Any]) -> IService:
    """
    Build the broker service from parsed options.

    @param options: parsed L{Options}.
    @return: the service for twistd to run.
    """
    settings = options["settings"]
    role = options.get("role")
    count = options.get("count", 1)
    try:
        if role is not None:
            broker = _worker_service(settings, role)
        elif count > 1:
            broker = _supervisor(options, settings, count)
        else:
            broker = make_service(settings)
    except ConfigError as e:
        _exit(str(e))
    top = _ExitOnStartupError()
    top.log_observer = observer_for_twistd(
        getattr(options, "parent", None), options["settings"].section("log")
    )
    broker.setServiceParent(top)
    return top


def _worker_service(settings: Any, role: WorkerRole) -> IService:
    """A worker of a supervisor (L{qmq.workers.worker})."""
    from twisted.internet import reactor  # noqa: PLC0415

    # Its own process group: a Ctrl-C in the terminal reaches the
    # supervisor alone, which stops the workers (each once, in order).
    os.setpgrp()
    settings = worker_settings(settings, role)
    service = make_service(settings, reactor, listen_reactor=ReusePortReactor(reactor))
    attach_worker(service, role, reactor)
    return service


def _supervisor(options: Any, settings: Any, count: int) -> IService:
    """The supervisor of C{count} workers (L{qmq.workers.supervisor}): a
    worker that cannot start ends the supervisor with status 1."""
    from twisted.internet import reactor  # noqa: PLC0415

    def fatal(message: str) -> None:
        sys.stderr.write(f"twistd qmq: {message}\n")
        reactor.addSystemEventTrigger("after", "shutdown", _exit_now, 1)
        reactor.stop()

    arguments = options.worker_arguments() if isinstance(options, Options) else []
    return make_supervisor(settings, count, arguments, reactor, on_fatal=fatal)


def _exit_now(status: int) -> None:
    # After the reactor stopped the workers: twistd itself would exit 0.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
