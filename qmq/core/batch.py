# -*- test-case-name: tests.test_core -*-
"""End-of-turn write batching shared by every frontend.

Frontends buffer outgoing frames per connection and ask the batcher to flush
them. While a connection's incoming data is being processed
(L{WriteBatcher.hold}/L{WriteBatcher.release} around it), flushes wait until
the whole read buffer is handled, so one read of many SENDs becomes one
write per receiving connection. Outside of that (timers), a flush runs on
the next reactor turn through C{callLater(0)}.
"""

from __future__ import annotations

from typing import Any, Protocol


class Flushable(Protocol):
    def flush(self) -> None: ...


class WriteBatcher:
    """Collects connections with buffered output and flushes them together."""

    __slots__ = ("_clock", "_pending", "_depth", "_call")

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._pending: list[Flushable] = []
        self._depth = 0
        self._call: Any = None

    def want_flush(self, target: Flushable) -> None:
        """C{target} has output; flush it at the end of this turn."""
        self._pending.append(target)
        if not self._depth and self._call is None:
            self._call = self._clock.callLater(0, self._run)

    def hold(self) -> None:
        """Start processing input: delay flushes until L{release}."""
        self._depth += 1

    def release(self) -> None:
        """Done processing input: flush everything if this was the outermost hold."""
        self._depth -= 1
        if not self._depth and self._pending:
            self.flush_all()

    def _run(self) -> None:
        self._call = None
        self.flush_all()

    def flush_all(self) -> None:
        """Flush every pending target now."""
        call = self._call
        if call is not None:
            self._call = None
            call.cancel()
        while self._pending:
            pending = self._pending
            self._pending = []
            for target in pending:
                target.flush()
