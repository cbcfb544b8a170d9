# -*- test-case-name: tests.test_auth -*-
"""Slowing down password guessing: failed logins per client address.

Every failed login is answered after a delay (C{failure_delay} seconds, so a
guesser on one connection gets one try a second), and the delay doubles with
each failure from the same address within C{window} seconds, up to
C{max_delay}.  An address with recent failures also waits before its next
attempts are even checked, each attempt taking the next free slot: opening
many connections at once does not buy an attacker parallel guesses.  An
attempt that would wait longer than C{max_wait} is refused at once.

The table of addresses is bounded (C{max_addresses}; the oldest entry goes
first) and entries older than C{window} count as nothing, so a flood of
addresses costs bounded memory.  Time comes from the injected clock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["LoginThrottle"]


class LoginThrottle:
    """
    Failed logins by client address (see the module docstring).

    @ivar delay: seconds before the answer to a first failure.
    @ivar max_delay: the longest delay.
    @ivar window: seconds after its last failure that an address is forgotten.
    @ivar max_addresses: most addresses remembered.
    """

    def __init__(
        self,
        clock: Any,
        delay: float = 1.0,
        max_delay: float = 30.0,
        window: float = 300.0,
        max_addresses: int = 10_000,
    ) -> None:
        self.clock = clock
        self.delay = delay
        self.max_delay = max_delay
        self.window = window
        self.max_addresses = max_addresses
        #: The longest an attempt may be made to wait before it is refused.
        self.max_wait = 2 * max_delay
        # address -> [failures, time of the last failure, next free slot]
        self._entries: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, address: str, now: float) -> list[float] | None:
        entry = self._entries.get(address)
        if entry is not None and now - entry[1] > self.window:
            del self._entries[address]
            return None
        return entry

    def _delay_for(self, failures: float) -> float:
        return min(self.delay * 2 ** (failures - 1), self.max_delay) if failures else 0.0

    def failures(self, address: str) -> int:
        """Failures remembered for C{address} (within the window)."""
        entry = self._entry(address, self.clock.seconds())
        return int(entry[0]) if entry is not None else 0

    def wait(self, address: str) -> float | None:
        """
        Take the next slot for a login attempt from C{address}.

        @return: seconds to wait before checking the credentials (0 for an
            address without recent failures), or None: refuse it now (it
            would wait more than L{max_wait}).
        """
        now = self.clock.seconds()
        entry = self._entry(address, now)
        if entry is None:
            return 0.0
        start = max(now, entry[2])
        wait = start - now
        if wait > self.max_wait:
            return None
        entry[2] = start + self._delay_for(entry[0])
        return wait

    def failed(self, address: str) -> float:
        """
        Record a failed login from C{address}.

        @return: seconds to wait before answering it.
        """
        now = self.clock.seconds()
        entries = self._entries
        entry = self._entry(address, now)
        if entry is None:
            entry = entries[address] = [0, now, now]
            while len(entries) > self.max_addresses:
                entries.popitem(last=False)
        else:
            entries.move_to_end(address)
        entry[0] += 1
        entry[1] = now
        delay = self._delay_for(entry[0])
        entry[2] = max(entry[2], now + delay)
        return delay
