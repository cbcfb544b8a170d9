# -*- test-case-name: tests.test_workers -*-
"""Listeners shared by every worker: each worker binds the same TCP port
with C{SO_REUSEPORT}, and the kernel spreads new connections over them.

L{ReusePortReactor} stands in for the reactor when a worker builds its
listeners' endpoints (C{serverFromString(ReusePortReactor(reactor), ...)},
through L{qmq.service.make_service}'s C{listen_reactor}): a C{tcp:}
endpoint calls C{listenTCP}, an C{ssl:} or C{qmqtls:} one C{listenSSL}, and
both become a TCP port whose socket has C{SO_REUSEPORT} set before it is
bound (Twisted's L{makeBinding}); TLS is Twisted's own
L{TLSMemoryBIOFactory} over it, as the reactor's own C{listenSSL} does.
Everything else goes to the real reactor.

Why not the other way (one process accepts and hands each connection to a
worker with C{adoptStreamConnection}): docs/workers.rst has the
measurement. In short, C{SO_REUSEPORT} costs nothing per connection (no
extra process on the path, no descriptor passing), keeps working while the
supervisor is busy or restarting a worker, and spreads connections by a
hash of their addresses: 100 connections over 2 workers landed between
44/56 and 50/50, where one shared socket gave up to 69/31 in a burst
(C{bench/workers_spread.py}).

A port cannot be shared when it is not known before binding: port 0 is
refused (each worker would get a port of its own), and so is a C{unix:}
listener for clients (a path is bound once).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp
from twisted.protocols.tls import TLSMemoryBIOFactory

__all__ = ["ReusePortReactor", "SharingError"]


class SharingError(ValueError):
    """A listener that the workers cannot share."""


class ReusePortReactor:
    """The reactor, but every TCP (and TLS) port it listens on has
    C{SO_REUSEPORT} (see the module docstring)."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if not port:
            raise SharingError("port 0 cannot be shared by workers: give a port number")
        binding = tcp.makeBinding(interface, port, reuseAddress=True, reusePort=True)
        listening = tcp.Port(binding, factory, backlog, interface, self._reactor)  # type: ignore[arg-type]
        listening.startListening()
        return listening

    def listenSSL(
        self, port: int, factory: Any, contextFactory: Any, backlog: int = 50, interface: str = ""
    ) -> Any:
        return self.listenTCP(port, TLSMemoryBIOFactory(contextFactory, False, factory), backlog, interface)

    def listenUNIX(self, address: str, factory: Any, backlog: int = 50, mode: int = 0o666, wantPID: bool = False) -> Any:
        raise SharingError(
            f"a unix: listener ({address}) cannot be shared by workers: listen on tcp: "
            "or run one worker"
        )
