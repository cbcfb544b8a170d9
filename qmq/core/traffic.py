# -*- test-case-name: tests.test_web_metrics -*-
"""Messages published, delivered and acknowledged, per protocol.

Counted where it costs nothing extra on the message path: every client
reaches the core through a L{qmq.core.channel.Channel}, which counts its
publishes (C{published}) and acknowledgements (C{acked}) as plain integers
and numbers its deliveries anyway (C{next_tag - 1}). L{Traffic} (the
broker's C{traffic}) knows the live channels and, for the closed ones, their
totals by protocol; L{Traffic.totals} adds them up when asked (a
C{/metrics} scrape), not per message.

Protocols are named by the frontend that makes the channel: C{stomp} (TCP),
C{websocket} (STOMP over WebSocket), C{sockjs} (STOMP over SockJS),
C{http} (the HTTP API); C{""} for channels of no frontend (tests, tools).
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["Traffic"]


class Traffic:
    """The live channels and the closed channels' totals (see the module docstring)."""

    def __init__(self) -> None:
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        #: protocol -> [published, delivered, acked] of closed channels.
        self.closed: dict[str, list[int]] = {}

    def opened(self, channel: Any) -> None:
        """Count C{channel} from now on (it is made)."""
        self.live.add(channel)

    def close(self, channel: Any) -> None:
        """C{channel} closed: its counts go to its protocol's totals."""
        if channel in self.live:
            self.live.discard(channel)
            row = self.closed.setdefault(channel.protocol, [0, 0, 0])
            row[0] += channel.published
            row[1] += channel.next_tag - 1
            row[2] += channel.acked

    def totals(self) -> dict[str, tuple[int, int, int]]:
        """protocol -> (published, delivered, acked) so far, live and closed channels together."""
        rows = {p: list(r) for p, r in self.closed.items()}
        for channel in list(self.live):
            row = rows.setdefault(channel.protocol, [0, 0, 0])
            row[0] += channel.published
            row[1] += channel.next_tag - 1
            row[2] += channel.acked
        return {p: (r[0], r[1], r[2]) for p, r in sorted(rows.items())}
