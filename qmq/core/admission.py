# -*- test-case-name: tests.test_core_admission -*-
"""Admission: the broker-wide answer to "may publishers publish now?".

One decision, made here, that every frontend asks (RabbitMQ's resource
alarms, which block the publishers of every protocol alike):

  - the B{memory} alarm (L{qmq.core.alarm.MemoryAlarm}) holds back every
    publisher: above the high-water mark nothing new comes in;
  - the B{disk} alarm (L{qmq.core.alarm.DiskAlarm}) holds back persistent
    publishes: below the free-space limit the store would fill the disk;
  - the B{store} holds back persistent publishes while it cannot write
    (a full disk, an I/O error), until it has written again.

Each source L{hold}s under its name with a detail for the operator and
the client, and L{release}s when it is over. Consumers are never held:
they are what frees memory and disk.

How frontends use it:

  - the hot path reads one attribute, L{Admission.closed}: C{False} (no
    hold at all) admits everything at the cost of an attribute read;
  - when it is C{True}, L{Admission.refusal} says whether a publish of the
    given kind is held, and by what (a L{Hold});
  - a frontend that paused a publisher (STOMP over TCP, WebSocket and
    SockJS stop reading it) L{subscribe}s and is called with the admission
    on every change, to resume once L{Admission.admits} says so;
  - a frontend that answers each publish (the HTTP API) refuses a held one
    at once (503 with C{Retry-After}), before reading its body when every
    publish is held.

Input still being received (a STOMP frame, an HTTP request body) counts in
one broker-wide budget, C{limits.max_unfinished_bytes} (L{take_input},
L{release_input}): many clients each sending a large body slowly cannot
together exhaust memory.

The core never imports the reactor; this module has no timer at all: the
alarms and the store sample and call in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from twisted.logger import Logger

__all__ = ["RETRY_AFTER", "Admission", "Hold", "release_input", "take_input"]

log = Logger()

#: Seconds a refused publisher is told to wait before it tries again
#: (an HTTP C{Retry-After}); alarms are sampled well within it.
RETRY_AFTER = 5


class Hold(NamedTuple):
    """Why publishers are held back.

    @ivar name: the source: C{"memory"}, C{"disk"} or C{"store"}.
    @ivar detail: what an operator and a client read.
    @ivar persistent_only: only persistent publishes are held (the disk
        and the store); else every publish (memory).
    """

    name: str
    detail: str
    persistent_only: bool


class Admission:
    """Holds from the alarms and the store, and the listeners of changes.

    @ivar closed: C{True} while any hold is in place (read on every
        publish; a plain attribute, updated before listeners are called).
    @ivar held: C{True} while every publish is held (a hold that is not
        only for persistent publishes).
    """

    __slots__ = ("closed", "held", "_holds", "_listeners", "_watched")

    def __init__(self) -> None:
        self.closed = False
        self.held = False
        self._holds: dict[str, Hold] = {}
        self._listeners: dict[Callable[[Admission], object], None] = {}
        # Source name -> (alarm, its callback), to stop watching it.
        self._watched: dict[str, tuple[Any, Callable[[bool], None]]] = {}

    # -- sources ----------------------------------------------------------------

    def hold(self, name: str, detail: str, persistent_only: bool = False) -> None:
        """Hold back publishers because of C{name} until L{release}.

        Holding again under the same name replaces the detail (listeners
        are called only when what is held changes).
        """
        old = self._holds.get(name)
        hold = Hold(name, detail, persistent_only)
        self._holds[name] = hold
        if old is None or old.persistent_only != persistent_only:
            self._changed()

    def release(self, name: str) -> None:
        """C{name} no longer holds publishers back; idempotent."""
        if self._holds.pop(name, None) is not None:
            self._changed()

    def watch_alarm(self, alarm: Any, name: str, persistent_only: bool = False) -> None:
        """Hold under C{name} while C{alarm} is active: it is subscribed to
        (its C{subscribe(callback(active))}), and its state now is taken.
        The alarm watched under that name before is let go (and its hold);
        C{alarm} None only lets go.

        @param alarm: a L{qmq.core.alarm.MemoryAlarm} or
            L{qmq.core.alarm.DiskAlarm} (anything with C{active},
            C{describe()}, C{subscribe} and C{unsubscribe}), or None.
        """
        old = self._watched.pop(name, None)
        if old is not None:
            old[0].unsubscribe(old[1])
        self.release(name)
        if alarm is None:
            return

        def changed(active: bool) -> None:
            if active:
                self.hold(name, _describe(alarm, name), persistent_only)
            else:
                self.release(name)

        self._watched[name] = (alarm, changed)
        alarm.subscribe(changed)
        changed(bool(alarm.active))

    def watch_store(self, store: Any) -> None:
        """Hold persistent publishes while C{store} cannot write: it calls
        back C{(healthy, detail)} (L{qmq.core.store.MessageStore.watch})."""

        def changed(healthy: bool, detail: str) -> None:
            if healthy:
                self.release("store")
            else:
                self.hold("store", detail, persistent_only=True)

        watch = getattr(store, "watch", None)
        if watch is not None:  # optional in the store interface
            watch(changed)

    # -- frontends --------------------------------------------------------------

    def admits(self, persistent: bool) -> bool:
        """Whether a publish (persistent or not) may go ahead now."""
        return not self.closed or self.refusal(persistent) is None

    def refusal(self, persistent: bool) -> Hold | None:
        """The hold a publish of this kind meets now (the first), or None."""
        if not self.closed:
            return None
        for hold in self._holds.values():
            if persistent or not hold.persistent_only:
                return hold
        return None

    @property
    def holds(self) -> list[Hold]:
        """Every hold in place, in the order they were taken."""
        return list(self._holds.values())

    @property
    def listeners(self) -> int:
        """How many listeners are subscribed (held-back publishers)."""
        return len(self._listeners)

    def subscribe(self, listener: Callable[[Admission], object]) -> None:
        """Call C{listener(admission)} after every change, until
        L{unsubscribe}; subscribing twice is the same as once."""
        self._listeners[listener] = None

    def unsubscribe(self, listener: Callable[[Admission], object]) -> None:
        """Stop calling C{listener}; safe from inside a call."""
        self._listeners.pop(listener, None)

    def _changed(self) -> None:
        holds = self._holds
        self.closed = bool(holds)
        self.held = any(not h.persistent_only for h in holds.values())
        listeners = self._listeners
        for listener in list(listeners):
            if listener not in listeners:
                continue
            try:
                listener(self)
            except Exception:
                log.failure("admission listener {listener!r} failed", listener=listener)


def take_input(broker: Any, size: int) -> bool:
    """Count C{size} more bytes of input still being received (a request
    body, a frame) in the broker-wide budget (C{limits.max_unfinished_bytes},
    L{qmq.core.broker.Broker.unfinished_bytes}) that STOMP's frames count
    in too.

    @return: False when the budget is now exceeded: the caller refuses the
        input (and gives its bytes back with L{release_input}).
    """
    broker.unfinished_bytes += size
    limit = broker.max_unfinished_bytes
    return not (limit and size > 0 and broker.unfinished_bytes > limit)


def release_input(broker: Any, size: int) -> None:
    """Give back C{size} bytes counted with L{take_input} (the input is
    complete, refused, or its connection gone)."""
    if size:
        broker.unfinished_bytes -= size


def _describe(alarm: Any, name: str) -> str:
    describe = getattr(alarm, "describe", None)
    if describe is not None:
        try:
            return str(describe())
        except Exception:  # a test double, or figures not sampled yet
            pass
    return f"the {name} alarm is raised"
