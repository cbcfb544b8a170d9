# -*- test-case-name: tests.test_auth -*-
"""Slowing down password guessing: failed logins per client address and user.

Failures are counted per (address, user name): every failed login is
answered after a delay (C{failure_delay} seconds, so a guesser on one
connection gets one try a second), and the delay doubles with each failure
of the same user name from the same address within C{window} seconds, up to
C{max_delay}.  A pair with recent failures also waits before its next
attempts are even checked, each attempt taking the next free slot: opening
many connections at once does not buy an attacker parallel guesses.  An
attempt that would wait longer than C{max_wait} is refused at once.

A login that succeeds forgets its pair's failures: a client that mistyped
its password twice is not slowed once it has it right, and a user's typos
do not slow the other users behind the same address (a NAT, a CI machine).

Password spraying (one or two guesses for each of many user names, from one
address) is bounded by the address as a whole: past C{address_threshold}
failures from one address within C{window} seconds, whatever the user
names, every attempt from that address is spaced as a pair's are, the delay
doubling with each failure beyond the threshold.  A success does not clear
the address's count (a sprayer who finds one password is not let loose);
it fades with the window.  But a user name that logged in from the address
within the window is not held back by the address's count (only by its own
failures): the users of a busy NAT, or a test suite that tries many wrong
logins, keep logging in while a sprayer's new names wait.

The tables are bounded (C{max_addresses} entries each; the oldest go first)
and entries older than C{window} count as nothing, so a flood of addresses
costs bounded memory.  Time comes from the injected clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["LoginThrottle"]


class _Failures:
    """
    Failures under one key: C{count}, C{last} (time of the last one) and
    C{slot} (the earliest time the next attempt may be checked).
    """

    __slots__ = ("count", "last", "slot")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.last = now
        self.slot = now


class _Table:
    """Failures by key, forgotten after C{window} seconds, at most C{size} keys."""

    def __init__(self, window: float, size: int) -> None:
        self.window = window
        self.size = size
        self._entries: OrderedDict[Hashable, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, now: float) -> _Failures | None:
        entry = self._entries.get(key)
        if entry is not None and now - entry.last > self.window:
            del self._entries[key]
            return None
        return entry

    def add(self, key: Hashable, now: float) -> _Failures:
        """One more failure under C{key}; @return: its entry."""
        entry = self.get(key, now)
        entries = self._entries
        if entry is None:
            entry = entries[key] = _Failures(now)
            while len(entries) > self.size:
                entries.popitem(last=False)
        else:
            entries.move_to_end(key)
        entry.count += 1
        entry.last = now
        return entry

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)


class LoginThrottle:
    """
    Failed logins by client address and user name (see the module docstring).

    @ivar delay: seconds before the answer to a first failure.
    @ivar max_delay: the longest delay.
    @ivar window: seconds after its last failure that a pair (or an address)
        is forgotten.
    @ivar max_addresses: most pairs, and most addresses, remembered.
    @ivar address_threshold: failures from one address (any user names)
        within the window before the whole address is slowed.
    """

    def __init__(
        self,
        clock: Any,
        delay: float = 1.0,
        max_delay: float = 30.0,
        window: float = 300.0,
        max_addresses: int = 10_000,
        address_threshold: int = 20,
    ) -> None:
        self.clock = clock
        self.delay = delay
        self.max_delay = max_delay
        self.window = window
        self.max_addresses = max_addresses
        self.address_threshold = address_threshold
        #: The longest an attempt may be made to wait before it is refused.
        self.max_wait = 2 * max_delay
        self._pairs = _Table(window, max_addresses)
        self._addresses = _Table(window, max_addresses)
        #: (address, user) pairs that logged in lately.
        self._known = _Table(window, max_addresses)

    def __len__(self) -> int:
        """Pairs (address, user) with failures remembered."""
        return len(self._pairs)

    def _delay_for(self, failures: float) -> float:
        return min(self.delay * 2 ** (failures - 1), self.max_delay) if failures > 0 else 0.0

    def _address_delay(self, entry: _Failures) -> float:
        return self._delay_for(entry.count - self.address_threshold)

    def failures(self, address: str, user: str = "") -> int:
        """Failures remembered for C{user} from C{address} (within the window)."""
        entry = self._pairs.get((address, user), self.clock.seconds())
        return entry.count if entry is not None else 0

    def address_failures(self, address: str) -> int:
        """Failures remembered from C{address}, whatever the user names."""
        entry = self._addresses.get(address, self.clock.seconds())
        return entry.count if entry is not None else 0

    def wait(self, address: str, user: str = "") -> float | None:
        """
        Take the next slot for a login attempt as C{user} from C{address}.

        @return: seconds to wait before checking the credentials (0 without
            recent failures of the pair, nor too many from the address), or
            None: refuse it now (it would wait more than L{max_wait}).
        """
        now = self.clock.seconds()
        pair = self._pairs.get((address, user), now)
        spread = self._addresses.get(address, now)
        if spread is not None and (
            spread.count <= self.address_threshold or self._known.get((address, user), now) is not None
        ):
            spread = None
        if pair is None and spread is None:
            return 0.0
        start = max(now, *(e.slot for e in (pair, spread) if e is not None))
        wait = start - now
        if wait > self.max_wait:
            return None
        if pair is not None:
            pair.slot = start + self._delay_for(pair.count)
        if spread is not None:
            spread.slot = start + self._address_delay(spread)
        return wait

    def failed(self, address: str, user: str = "") -> float:
        """
        Record a failed login as C{user} from C{address}.

        @return: seconds to wait before answering it.
        """
        now = self.clock.seconds()
        pair = self._pairs.add((address, user), now)
        spread = self._addresses.add(address, now)
        delay = max(self._delay_for(pair.count), self._address_delay(spread))
        pair.slot = max(pair.slot, now + self._delay_for(pair.count))
        spread.slot = max(spread.slot, now + self._address_delay(spread))
        return delay

    def succeeded(self, address: str, user: str = "") -> None:
        """A login as C{user} from C{address} succeeded: forget the pair's
        failures (not the address's), and let the pair pass the address's
        count from now on, within the window (see the module docstring)."""
        self._pairs.forget((address, user))
        self._known.add((address, user), self.clock.seconds())
