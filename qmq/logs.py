# -*- test-case-name: tests.test_logs -*-
"""The broker's log: its level, its format and how peers are named in it.

The flow under C{twistd qmq}:

    1. The C{[log]} table (L{LogSettings}: C{level}, C{format}) is read
       with the rest of the configuration; C{--log-level} overrides
       C{level} (L{qmq.tap}).
    2. L{qmq.tap.makeService} asks L{observer_for_twistd} for an observer
       built from those settings and from twistd's own options
       (C{--nodaemon}, C{--logfile}, C{--syslog}): the same destination
       twistd would pick (standard output with C{-n}, else
       C{twistd.log} or the C{--logfile}), written as text or, with
       C{format = "json"}, as one JSON object a line
       (L{twisted.logger.jsonFileLogObserver}; read back with
       L{twisted.logger.eventsFromJSONLogFile}).
    3. That observer is handed to twistd as the application's
       L{ILogObserver} component, the documented way to choose twistd's
       log observer; C{--logger} on twistd's command line still wins.
    4. Every event passes L{filtered}: L{NoisePredicate} treats Twisted's
       start and stop chatter (C{Starting factory ...}, C{... starting on
       PORT}, C{(TCP Port N Closed)}) as debug events, as QMQ already logs
       each listener's address itself; then a
       L{LogLevelFilterPredicate} drops what is below C{level}.

Connections opened and closed are logged at debug level: on a broker with
many short connections one info line each would bury everything else.

L{peer_address} is the one way a peer is written in the log:
C{HOST:PORT}, C{[IPV6]:PORT}, a unix socket's path, or C{?}.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LegacyLogObserverWrapper,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    jsonFileLogObserver,
    textFileLogObserver,
)
from twisted.python import logfile
from zope.interface import implementer

__all__ = [
    "FORMATS",
    "LEVELS",
    "LogSettings",
    "NoisePredicate",
    "filtered",
    "file_observer",
    "observer_for_twistd",
    "peer_address",
    "transport_peer",
]

#: The levels C{[log] level} may name, lowest first (twisted.logger's).
LEVELS = ("debug", "info", "warn", "error", "critical")

#: The formats C{[log] format} may name.
FORMATS = ("text", "json")


@dataclass(frozen=True)
class LogSettings:
    """
    The C{[log]} table.

    @ivar level: the lowest level written (L{LEVELS}).
    @ivar format: C{text} (twistd's lines) or C{json} (one JSON object a
        line).
    """

    level: str = field(default="info", metadata={"choices": LEVELS})
    format: str = field(default="text", metadata={"choices": FORMATS})


def peer_address(address: Any) -> str:
    """
    How a peer (or a listening port) is written in the log.

    @param address: an L{IAddress} (C{IPv4Address}, C{IPv6Address},
        C{UNIXAddress}), or L{None}.
    @return: C{HOST:PORT}, C{[IPV6]:PORT}, the unix socket's path (C{unix}
        for an unnamed one), or C{?}.
    """
    if address is None:
        return "?"
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is not None and port is not None:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if hasattr(address, "name"):
        name = address.name
        if not name:
            return "unix"
        return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    return "?"


def transport_peer(transport: Any) -> str:
    """
    L{peer_address} of a transport's peer; C{?} if it cannot say.
    """
    try:
        return peer_address(transport.getPeer())
    except Exception:
        return "?"


# Twisted's own lines at a listener's start and stop: QMQ logs each
# listener's address itself ("STOMP listening on ...").
_NOISE_FORMATS = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}"})
_NOISE_LEGACY = re.compile(r"^(?:\S.* starting on \S+|\((?:TCP|UNIX|UDP|SSL)? ?Port \S+ Closed\))$")


@implementer(ILogFilterPredicate)
class NoisePredicate:
    """
    Twisted's start and stop chatter is a debug event: dropped unless the
    level is C{debug}.

    @ivar level: the configured level.
    """

    def __init__(self, level: LogLevel) -> None:
        self.level = level

    def __call__(self, event: Mapping[str, Any]) -> PredicateResult:
        if self.level <= LogLevel.debug or not is_noise(event):
            return PredicateResult.maybe
        return PredicateResult.no


def is_noise(event: Mapping[str, Any]) -> bool:
    """Whether C{event} is one of Twisted's start and stop lines."""
    if event.get("log_format") in _NOISE_FORMATS:
        return True
    if event.get("log_namespace") == "log_legacy":
        message = event.get("message")
        if isinstance(message, tuple) and len(message) == 1 and isinstance(message[0], str):
            return _NOISE_LEGACY.match(message[0]) is not None
    return False


def filtered(observer: ILogObserver, settings: LogSettings) -> ILogObserver:
    """
    C{observer} behind the noise filter and C{settings.level}.
    """
    level = LogLevel.levelWithName(settings.level)
    return FilteringLogObserver(
        observer, [NoisePredicate(level), LogLevelFilterPredicate(defaultLogLevel=level)]
    )


def file_observer(out: IO[Any], settings: LogSettings) -> ILogObserver:
    """
    An observer writing to C{out} in C{settings.format}, filtered.

    JSON is one object a line (no RFC 7464 record separator), so that
    C{jq}, journald and container log collectors read it line by line.
    """
    if settings.format == "json":
        inner = jsonFileLogObserver(out, recordSeparator="")
    else:
        inner = textFileLogObserver(out)
    return filtered(inner, settings)


def observer_for_twistd(server_options: Any, settings: LogSettings) -> ILogObserver | None:
    """
    The observer for twistd to log to, at the destination it would pick
    itself, or L{None} to leave twistd's own.

    @param server_options: twistd's parsed options (C{nodaemon},
        C{logfile}, C{syslog}, C{prefix}, C{logger}), or L{None} when not
        run by twistd.
    @param settings: the C{[log]} settings.
    @return: L{None} if not under twistd, if C{--logger} names an observer
        (twistd uses it), or for C{-l -} without C{-n} (twistd refuses that
        itself).
    """
    if server_options is None or not hasattr(server_options, "get"):
        return None
    if server_options.get("logger"):
        return None
    if server_options.get("syslog"):
        from twisted.python import syslog  # noqa: PLC0415

        legacy = syslog.SyslogObserver(server_options.get("prefix") or "twisted").emit
        return filtered(LegacyLogObserverWrapper(legacy), settings)
    name = server_options.get("logfile")
    nodaemon = bool(server_options.get("nodaemon"))
    if name == "-":
        if not nodaemon:
            return None
        return file_observer(sys.stdout, settings)
    if nodaemon and not name:
        return file_observer(sys.stdout, settings)
    out = logfile.LogFile.fromFullPath(name or "twistd.log")
    # As twistd does for its own log file: SIGUSR1 rotates it, unless the
    # signal already has a handler.
    if not signal.getsignal(signal.SIGUSR1):

        def rotate(signum: int, frame: Any) -> None:
            from twisted.internet import reactor  # noqa: PLC0415

            reactor.callFromThread(out.rotate)

        signal.signal(signal.SIGUSR1, rotate)
    return file_observer(out, settings)
