# -*- test-case-name: tests.test_core_fairness -*-
"""Deadlines for very many objects, with one timer per tick rather than one each.

A million idle queues with an C{x-expires} policy would each hold a
DelayedCall (about 380 bytes, and a push into the reactor's heap) if they
armed their own timer. An L{ExpiryWheel} groups deadlines into buckets of
C{tick} seconds: one DelayedCall per bucket that holds anything, and per
object one entry in its bucket's dict plus the bucket number, kept by the
object itself (its C{expiry_key} attribute). Moving a deadline (a queue used
again) is two dict operations. A deadline fires up to one tick late, never
early.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

__all__ = ["Expiring", "ExpiryWheel"]

log = Logger()


class Expiring(Protocol):
    """What an L{ExpiryWheel} schedules."""

    #: The bucket the object waits in (the wheel's business), or None.
    expiry_key: int | None

    def expired(self) -> None:
        """The deadline passed (the object is no longer scheduled)."""


class ExpiryWheel:
    """Deadlines grouped by tick (see the module docstring).

    @ivar clock: an C{IReactorTime}.
    @ivar tick: the width of a bucket, in seconds.
    """

    def __init__(self, clock: Any, tick: float = 0.25) -> None:
        self.clock = clock
        self.tick = tick
        self._buckets: dict[int, dict[Any, None]] = {}
        self._calls: dict[int, IDelayedCall] = {}
        self._keys: dict[int, int] = {}

    def __len__(self) -> int:
        """How many objects are scheduled."""
        return sum(len(b) for b in self._buckets.values())

    def schedule(self, item: Expiring, delay: float) -> None:
        """Call C{item.expired()} in C{delay} seconds (at most a tick later),
        replacing any deadline it had."""
        now = self.clock.seconds()
        # (A deadline on a tick's edge stays in that tick despite rounding.)
        key = math.ceil((now + delay) / self.tick - 1e-9)
        old = item.expiry_key
        if old == key:
            return
        if old is not None:
            self._remove(item, old)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
            self._keys[key] = key
            self._calls[key] = self.clock.callLater(max(0.0, key * self.tick - now), self._fire, key)
        else:
            # The bucket's own int: a million queues scheduled in one tick
            # (a recovery) share one, not 32 bytes each.
            key = self._keys[key]
        bucket[item] = None
        item.expiry_key = key

    def cancel(self, item: Expiring) -> None:
        """Forget C{item}'s deadline, if it has one."""
        old = item.expiry_key
        if old is not None:
            self._remove(item, old)
            item.expiry_key = None

    def _remove(self, item: Expiring, key: int) -> None:
        bucket = self._buckets[key]
        del bucket[item]
        if not bucket:
            del self._buckets[key]
            del self._keys[key]
            self._calls.pop(key).cancel()

    def _fire(self, key: int) -> None:
        self._calls.pop(key, None)
        self._keys.pop(key, None)
        bucket = self._buckets.pop(key, None)
        if not bucket:
            return
        for item in list(bucket):
            item.expiry_key = None
            try:
                item.expired()
            except Exception:
                log.failure("while expiring {item!r}", item=item)

    def stop(self) -> None:
        """Cancel every deadline (at shutdown)."""
        for call in self._calls.values():
            call.cancel()
        for bucket in self._buckets.values():
            for item in bucket:
                item.expiry_key = None
        self._calls.clear()
        self._buckets.clear()
        self._keys.clear()
