# -*- test-case-name: tests.test_connections -*-
"""Every open connection of the broker, whatever listener took it.

One L{ConnectionRegistry} is shared by every listener of a broker (STOMP
over TCP and TLS today; the HTTP/WebSocket and peer listeners join it the
same way). It does three things that no single listener can do alone:

  1. B{Caps.} Before a listener's factory builds a protocol for a new
     connection it asks L{ConnectionRegistry.admit} with its own name and the
     client's address. The answer is L{None} (come in) or the reason the
     connection is refused: the listener already holds C{max_per_listener}
     connections, or that address already holds C{max_per_address} over all
     listeners together. A refused connection is told so in its own protocol
     where it can be (STOMP: an C{ERROR} frame with
     C{message:too many connections}) and closed; the refusals are logged at
     most once a second per listener, with a count, so a flood does not turn
     into a flood of log lines.
  2. B{Bookkeeping.} An admitted connection calls L{ConnectionRegistry.add}
     once it is made and L{ConnectionRegistry.remove} once it is lost; the
     counts the caps use come from those two calls only.
  3. B{Shutdown.} When the broker stops, its service stops the listeners and
     then calls L{ConnectionRegistry.shutdown} once: every connection is told
     the broker is going away (L{IConnection.shutdown}) and closes; those
     still open after the timeout are aborted. One place for every kind of
     listener, so a new protocol cannot forget it.

A connection as the registry sees it is an L{qmq.transport.IConnection}:
its client's address (C{peer_host}), C{shutdown(reason)} and C{abort()}.

L{ConnectionSettings} is the C{[connections]} table of the configuration:
the caps, and the two deadlines every stream listener applies to its
connections (the TLS handshake, and the grace a closing connection has to
flush before it is aborted).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import Attribute, Interface, implementer

from qmq.transport import IConnection

__all__ = [
    "ConnectionIds",
    "ConnectionRegistry",
    "ConnectionSettings",
    "IConnectionRegistry",
    "connection_row",
    "connection_rows",
    "session_of",
    "REFUSAL_LOG_INTERVAL",
]

log = Logger()

#: Seconds between two log lines about refused connections on one listener.
REFUSAL_LOG_INTERVAL = 1.0


@dataclass(frozen=True)
class ConnectionSettings:
    """How many connections the broker accepts, and how long it waits on them.

    @ivar max_per_listener: most connections one listener holds at once;
        0 = no limit.
    @ivar max_per_address: most connections one client address holds at once,
        over all listeners; 0 = no limit. Connections without an IP address
        (unix sockets) are not counted against it.
    @ivar handshake_timeout: seconds a TLS client has to finish its handshake;
        one that does not is aborted.
    @ivar close_grace: seconds a connection being closed has to flush what
        was written to it (and, over TLS, to exchange the closing alerts)
        before it is aborted.
    """

    max_per_listener: int = field(default=10_000, metadata={"min": 0})
    max_per_address: int = field(default=1_000, metadata={"min": 0})
    handshake_timeout: float = field(default=10.0, metadata={"above": 0})
    close_grace: float = field(default=2.0, metadata={"above": 0})


class IConnectionRegistry(Interface):
    """The connections of every listener of a broker (see the module docstring)."""

    settings = Attribute("The L{ConnectionSettings}: caps and deadlines.")

    def admit(listener: str, host: str) -> str | None:
        """May C{listener} take one more connection from C{host}?

        @return: L{None}, or the reason it may not.
        """

    def add(conn: IConnection, listener: str) -> None:
        """Count C{conn}, a connection C{listener} has admitted and made."""

    def remove(conn: IConnection) -> None:
        """C{conn} is gone: stop counting it."""

    def shutdown(reason: str, timeout: float) -> defer.Deferred[None]:
        """Close every connection; abort those still open after C{timeout} s."""


class _Refusals:
    """Refused connections of one listener, for rate-limited logging."""

    __slots__ = ("total", "unlogged", "logged_at")

    def __init__(self) -> None:
        self.total = 0
        self.unlogged = 0
        self.logged_at: float | None = None


@implementer(IConnectionRegistry)
class ConnectionIds:
    """The management API's ids of connections: 1, 2, ... in the order
    they are first listed, held weakly (a closed connection's id is not
    given again)."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._conns: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._next = 1

    def id_of(self, conn: Any) -> int:
        cid = self._ids.get(conn)
        if cid is None:
            cid = self._ids[conn] = self._next
            self._conns[cid] = conn
            self._next += 1
        return cid

    def find(self, text: str) -> Any:
        """The connection of id C{text}, or None."""
        return self._conns.get(int(text)) if text.isdigit() and len(text) < 19 else None


def session_of(conn: Any) -> Any:
    """The STOMP session of a registered connection (over TCP, or a
    WebSocket inside an HTTP connection), or None."""
    session = getattr(conn, "session", None)
    if session is None:
        session = getattr(getattr(conn, "wrappedProtocol", None), "session", None)
    return session


def connection_row(conn: Any, ids: ConnectionIds) -> dict[str, str]:
    """What the management API shows of C{conn}."""
    session = session_of(conn)
    return {
        "id": str(ids.id_of(conn)),
        "protocol": getattr(conn, "protocol_name", None) or type(conn).__name__,
        "peer": str(getattr(conn, "peer", "") or getattr(conn, "peer_host", "")),
        "user": str(getattr(session, "login", "") or "") if session is not None else "",
    }


def connection_rows(registry: Any, ids: ConnectionIds, limit: int = 1 << 62) -> list[dict[str, str]]:
    """The first C{limit} connections of C{registry}, as the API shows them."""
    rows = []
    for conn in list(registry.connections()):
        if len(rows) >= limit:
            break
        rows.append(connection_row(conn, ids))
    return rows


class ConnectionRegistry:
    """The open connections of every listener, their caps and their shutdown.

    @ivar settings: the caps and deadlines.
    @ivar clock: what times the shutdown and the refusal log.
    """

    def __init__(self, settings: ConnectionSettings | None = None, clock: Any = None) -> None:
        if clock is None:
            from twisted.internet import reactor as clock  # noqa: PLC0415
        self.settings = settings if settings is not None else ConnectionSettings()
        self.clock = clock
        # listener -> its connections; host -> how many it holds; and, per
        # connection, where it was counted (so remove() needs nothing from it).
        self._listeners: dict[str, set[IConnection]] = {}
        self._hosts: dict[str, int] = {}
        self._where: dict[IConnection, tuple[str, str]] = {}
        self._refusals: dict[str, _Refusals] = {}
        #: listener -> connections it admitted, and of those, closed, since
        #: start (for C{/metrics}: a per-connection count, not per message).
        self.opened: dict[str, int] = {}
        self.closed: dict[str, int] = {}
        # (listener or None for all, Deferred) waiting for connections to go.
        self._waiting: list[tuple[str | None, defer.Deferred[None]]] = []
        #: The management API's ids of these connections (every site's, and
        #: the other nodes' requests: qmq.cluster.manage).
        self.ids = ConnectionIds()

    # -- counts ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._where)

    def connections(self, listener: str | None = None) -> Collection[IConnection]:
        """The open connections of C{listener}, or of every listener.

        @return: a live view; copy it before closing connections in a loop.
        """
        if listener is None:
            return self._where.keys()
        return self._listeners.get(listener, frozenset())

    def count_address(self, host: str) -> int:
        """How many connections C{host} holds over all listeners."""
        return self._hosts.get(host, 0)

    def refused(self, listener: str) -> int:
        """How many connections C{listener} has refused since the start."""
        refusals = self._refusals.get(listener)
        return refusals.total if refusals is not None else 0

    # -- admission ----------------------------------------------------------------

    def admit(self, listener: str, host: str) -> str | None:
        """May C{listener} take one more connection from C{host}?

        A refusal is counted and logged (at most one line a second per
        listener, with the number of refusals it stands for).

        @param listener: the listener's name.
        @param host: the client's address, or C{""} if it has none (a unix
            socket): such connections count only against the listener's cap.
        @return: L{None}, or the reason, for the client and the log.
        """
        settings = self.settings
        cap = settings.max_per_listener
        if cap and len(self._listeners.get(listener, ())) >= cap:
            reason = (
                f"This listener already holds its maximum of {cap} connections "
                "(connections.max_per_listener); retry later."
            )
        else:
            cap = settings.max_per_address
            if not (cap and host and self._hosts.get(host, 0) >= cap):
                return None
            reason = (
                f"Your address already holds its maximum of {cap} connections "
                "(connections.max_per_address); close some, or retry later."
            )
        self._log_refusal(listener, host, reason)
        return reason

    def _log_refusal(self, listener: str, host: str, reason: str) -> None:
        refusals = self._refusals.get(listener)
        if refusals is None:
            refusals = self._refusals[listener] = _Refusals()
        refusals.total += 1
        now = self.clock.seconds()
        if refusals.logged_at is not None and now - refusals.logged_at < REFUSAL_LOG_INTERVAL:
            refusals.unlogged += 1
            return
        log.warn(
            "connection refused listener={listener} peer={peer}: {reason} "
            "({unlogged} more refused since the last such line, {total} in all)",
            listener=listener,
            peer=host or "?",
            reason=reason,
            unlogged=refusals.unlogged,
            total=refusals.total,
        )
        refusals.logged_at = now
        refusals.unlogged = 0

    # -- bookkeeping ------------------------------------------------------------------

    def add(self, conn: IConnection, listener: str) -> None:
        """Count C{conn}, a connection C{listener} has admitted and made.

        @param conn: the connection; its C{peer_host} is read once, here.
        @param listener: the name the listener used in L{admit}.
        """
        if conn in self._where:
            return
        host = conn.peer_host or ""
        self._where[conn] = (listener, host)
        self.opened[listener] = self.opened.get(listener, 0) + 1
        members = self._listeners.get(listener)
        if members is None:
            members = self._listeners[listener] = set()
        members.add(conn)
        if host:
            self._hosts[host] = self._hosts.get(host, 0) + 1

    def remove(self, conn: IConnection) -> None:
        """C{conn} is gone (call it once it is lost; more calls do nothing)."""
        where = self._where.pop(conn, None)
        if where is None:
            return
        listener, host = where
        self.closed[listener] = self.closed.get(listener, 0) + 1
        members = self._listeners[listener]
        members.discard(conn)
        if not members:
            del self._listeners[listener]
        if host:
            left = self._hosts[host] - 1
            if left:
                self._hosts[host] = left
            else:
                del self._hosts[host]
        if self._waiting:
            self._wake()

    def _gone(self, listener: str | None) -> bool:
        return not (self._where if listener is None else self._listeners.get(listener))

    def _wake(self) -> None:
        done = [item for item in self._waiting if self._gone(item[0])]
        for item in done:
            self._waiting.remove(item)
            item[1].callback(None)

    # -- shutdown ----------------------------------------------------------------------

    def shutdown(
        self,
        reason: str = "broker shutting down",
        timeout: float = 5.0,
        listener: str | None = None,
    ) -> defer.Deferred[None]:
        """Tell every connection the broker is going away, and close it.

        Each connection's C{shutdown(reason)} says so in its protocol (STOMP:
        an C{ERROR} frame) and starts closing it; connections still open after
        C{timeout} seconds are aborted.

        @param reason: what the clients are told.
        @param timeout: seconds to wait before aborting the stragglers.
        @param listener: only the connections of this listener (L{None}: all).
        @return: a Deferred that fires once the connections are gone, or at
            the timeout, once the stragglers are aborted.
        """
        if self._gone(listener):
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        item = (listener, d)
        self._waiting.append(item)
        for conn in list(self.connections(listener)):
            try:
                conn.shutdown(reason)
            except Exception:
                log.failure("while shutting down a connection; aborting it")
                _abort(conn)

        def abort_stragglers() -> None:
            for conn in list(self.connections(listener)):
                _abort(conn)
            # A connection that cannot be aborted must not hold the shutdown up.
            if item in self._waiting:
                self._waiting.remove(item)
                d.callback(None)

        timer = self.clock.callLater(timeout, abort_stragglers)

        def done(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(done)


def _abort(conn: IConnection) -> None:
    try:
        conn.abort()
    except Exception:
        log.failure("while aborting a connection")
