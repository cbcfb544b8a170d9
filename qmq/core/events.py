# -*- test-case-name: tests.test_core_events -*-
"""Events out of the core: interest and topology, for whoever listens.

A link between nodes (the mesh) forwards a message to a peer only if the
peer has someone who wants it, so it must learn what the local clients
want as it changes; a console or a metrics feed wants to see queues and
exchanges come and go. Both subscribe here instead of polling the core.

Two kinds of events, per virtual host:

  - B{interest}: the first binding for an exchange + key appears
    (L{Observer.interest_added}), or the last one goes
    (L{Observer.interest_removed}). A binding is a queue's, a live
    consumer's (an auto-ack topic subscriber bound straight to the
    exchange) or another exchange's; two subscribers to C{/topic/a.b} are
    one interest, told once when the first comes and once when the last
    goes: what a mesh link propagates to its peers (NATS's subject
    interest, ActiveMQ's conduit subscriptions).
  - B{topology}: a queue or an exchange is declared or deleted; an
    exchange is bound to another, or unbound.

An observer that itself makes bindings (a mesh link binds on behalf of a
peer) cannot tell its own from the others' by the first/last events alone:
L{Observer.bindings_changed} tells it every change of the count, after the
first/last event, so it can subtract its own.

Observers subscribe with C{VirtualHost.observe} (one virtual host) or
C{Broker.observe} (every virtual host, those made later too).

The flow: L{qmq.core.vhost.VirtualHost} calls its L{Events} (attribute
C{events}) at each change; L{Events} keeps the count of bindings per
(exchange, key) and calls every L{Observer}. While nobody listens the
virtual host's C{events} is None, and each change pays one test of it: no
counting, no calls. The first observer makes the L{Events}, which counts
the bindings that exist then (and tells that observer about them, with
C{replay}); the last one to leave drops it.

Observers are called synchronously, from inside the operation that made
the change (a SUBSCRIBE, a queue deletion): they must not raise, and they
should not call back into the core from there; one that raises is logged
and the operation goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

if TYPE_CHECKING:
    from qmq.core.exchange import Exchange
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost

__all__ = ["Events", "Observer"]

log = Logger()


class Observer:
    """What a listener to the core's events implements: override the
    methods it cares about (the others do nothing).

    C{vhost} is the virtual host's name in every call.
    """

    def interest_added(self, vhost: str, exchange: str, key: str) -> None:
        """The first binding for C{exchange} + C{key} appeared."""

    def interest_removed(self, vhost: str, exchange: str, key: str) -> None:
        """The last binding for C{exchange} + C{key} went."""

    def bindings_changed(self, vhost: str, exchange: str, key: str, count: int) -> None:
        """A binding for C{exchange} + C{key} was made or went: C{count}
        remain (told after L{interest_added} or L{interest_removed})."""

    def queue_declared(self, vhost: str, queue: str) -> None:
        """Queue C{queue} was made."""

    def queue_deleted(self, vhost: str, queue: str) -> None:
        """Queue C{queue} was deleted."""

    def exchange_declared(self, vhost: str, exchange: str, type: str) -> None:
        """Exchange C{exchange} of type C{type} was made."""

    def exchange_deleted(self, vhost: str, exchange: str) -> None:
        """Exchange C{exchange} was deleted."""

    def exchange_bound(
        self, vhost: str, destination: str, source: str, key: str, arguments: dict | None
    ) -> None:
        """Exchange C{destination} was bound to exchange C{source} with
        C{key} (and C{arguments}, for a headers exchange)."""

    def exchange_unbound(
        self, vhost: str, destination: str, source: str, key: str, arguments: dict | None
    ) -> None:
        """That binding went."""


class Events:
    """The observers of one virtual host, and its bindings counted by
    (exchange, key) while there are any (see the module docstring).

    @ivar observers: the listening L{Observer}s, in the order they came.
    @ivar interest: (exchange name, key) -> how many bindings it has.
    """

    def __init__(self, vhost: VirtualHost) -> None:
        self.vhost = vhost
        self.name = vhost.name
        self.observers: list[Observer] = []
        self.interest: dict[tuple[str, str], int] = {}
        for exchange in vhost.exchanges.values():
            for _, key, _ in exchange.bindings():
                k = (exchange.name, key)
                self.interest[k] = self.interest.get(k, 0) + 1

    def _emit(self, method: str, *args: Any) -> None:
        for observer in list(self.observers):
            try:
                getattr(observer, method)(self.name, *args)
            except Exception:
                log.failure("an observer of the core's events failed ({method})", method=method)

    # -- interest -----------------------------------------------------------

    def bound(self, exchange: Exchange, key: str) -> None:
        """A binding for C{exchange} + C{key} was made."""
        k = (exchange.name, key)
        n = self.interest.get(k, 0)
        self.interest[k] = n + 1
        if not n:
            self._emit("interest_added", exchange.name, key)
        self._emit("bindings_changed", exchange.name, key, n + 1)

    def unbound(self, exchange: Exchange, key: str) -> None:
        """A binding for C{exchange} + C{key} went."""
        k = (exchange.name, key)
        n = self.interest.get(k, 0)
        if n > 1:
            self.interest[k] = n - 1
        elif n == 1:
            del self.interest[k]
            self._emit("interest_removed", exchange.name, key)
        else:
            return
        self._emit("bindings_changed", exchange.name, key, n - 1)

    # -- topology -----------------------------------------------------------

    def queue_declared(self, queue: Queue) -> None:
        self._emit("queue_declared", queue.name)

    def queue_deleted(self, queue: Queue) -> None:
        self._emit("queue_deleted", queue.name)

    def exchange_declared(self, exchange: Exchange) -> None:
        self._emit("exchange_declared", exchange.name, exchange.type)

    def exchange_deleted(self, exchange: Exchange) -> None:
        self._emit("exchange_deleted", exchange.name)

    def exchange_bound(self, destination: Exchange, source: Exchange, key: str, arguments: dict | None) -> None:
        self._emit("exchange_bound", destination.name, source.name, key, arguments)  # type: ignore[arg-type]

    def exchange_unbound(self, destination: Exchange, source: Exchange, key: str, arguments: dict | None) -> None:
        self._emit("exchange_unbound", destination.name, source.name, key, arguments)  # type: ignore[arg-type]


def observe(vhost: VirtualHost, observer: Observer, replay: bool = True) -> Callable[[], None]:
    """Make C{observer} listen to C{vhost}'s events.

    @param replay: tell it first about the interest that exists now
        (L{Observer.interest_added} once per exchange + key), so that it
        starts from the whole picture.
    @return: a call that stops it listening (the last one to stop makes
        the events free again).
    """
    events = vhost.events
    if events is None:
        events = vhost.events = Events(vhost)
    events.observers.append(observer)
    if replay:
        for exchange, key in list(events.interest):
            observer.interest_added(vhost.name, exchange, key)

    def stop() -> None:
        if observer in events.observers:
            events.observers.remove(observer)
        if not events.observers and vhost.events is events:
            vhost.events = None

    return stop
