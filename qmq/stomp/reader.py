# -*- test-case-name: tests.test_stomp_session -*-
"""Bytes to STOMP frames for a session, on the transport's side.

A byte-stream transport (TCP, TLS, unix sockets, and WebSocket or SockJS
messages that carry STOMP text) owns one L{StompReader}: it feeds the bytes
it reads, the reader parses them with L{qmq.stomp.frame.StompParser} and
hands the session whole frames (L{qmq.stomp.session.StompSession.frames_received}).
A transport that already has whole frames calls the session directly.

The reader also keeps the broker's write batching honest: the session's
output for one read is flushed once, when the read is done
(L{qmq.core.batch.WriteBatcher.hold}/C{release} around it).

And it keeps one read from holding the reactor: a read of 64 KiB may carry
a thousand SUBSCRIBEs, or SENDs that each fan out to thousands of
subscriptions, and acting on all of them at once would stall every other
client for tens of milliseconds. Once a read of a connection has taken more
than L{TURN_BUDGET} seconds, its next reads are handed over in slices: past
the budget, the rest waits for the next reactor turn and the connection is
not read meanwhile (its frames keep their order; other clients get their
turn in between). Light connections are not sliced, so they keep their
write batching.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from qmq.stomp.frame import Frame, FrameError, StompParser

if TYPE_CHECKING:
    from qmq.stomp.session import StompSession


#: Seconds of work one read (or one continuation) may do before the rest of
#: its frames waits for the next reactor turn.
TURN_BUDGET = 0.010
#: Most frames handed to the session between two looks at the clock; the
#: first slice of a read is smaller, and heavy frames (a SEND fanning out
#: to thousands) shrink the slices down to one frame.
SLICE = 64
FIRST_SLICE = 4

# The clock of the turn budget (real time, whatever the session's clock;
# tests replace it).
_now = time.perf_counter


class StompReader:
    """Parses one connection's bytes into frames for its session.

    @ivar parser: the incremental parser (its limits come from the session's
        settings; its escaping follows the session's negotiated version).
    """

    __slots__ = ("session", "parser", "_batcher", "_seconds", "_pending", "_later", "heavy")

    def __init__(self, session: StompSession) -> None:
        self.session = session
        settings = session.settings
        self.parser = StompParser(
            max_body_size=settings.max_body_size,
            max_headers=settings.max_headers,
            max_header_line=settings.max_header_line,
            max_header_block=settings.max_header_block,
        )
        self._batcher = session.broker.batcher
        self._seconds = session.clock.seconds
        # Frames read but not yet acted on (past a turn's budget), in order.
        self._pending: list[Frame] | None = None
        self._later: Any = None
        # Set once a read of this connection took longer than the turn's
        # budget: its reads are then sliced (a light connection's are not,
        # which would cost it write batching), until one is light again.
        self.heavy = False

    def data_received(self, data: bytes) -> None:
        """Bytes from the client: parse them and hand the session every whole frame."""
        session = self.session
        if session.closed:
            return
        # Heart-beats and idle deadlines count from the last byte received.
        session.last_read = self._seconds()
        parser = self.parser
        if parser.version is not session.version:
            # Only after CONNECT: setting it drops the parser's reuse cache.
            parser.version = session.version
        batcher = self._batcher
        batcher.hold()
        try:
            try:
                frames = parser.feed(data)
            except FrameError as e:
                # Whatever waits goes first, all of it: the error ends the
                # connection.
                self._drop_pending_into(e.frames)
                session.frames_received(e.frames)
                session.frame_error(e)
                return
            pending = parser.pending_bytes
            if pending or session.unfinished:
                # A frame is still arriving: its deadline and its share of
                # the broker's budget for unfinished frames.
                session.frame_progress(pending, bool(frames))
            if self._pending is not None:
                # Read while earlier frames wait (the session resumed
                # reading): these go after them.
                self._pending.extend(frames)
            elif len(frames) <= FIRST_SLICE:
                session.frames_received(frames)
            elif self.heavy:
                self._act(frames)
            else:
                start = _now()
                session.frames_received(frames)
                if _now() - start > TURN_BUDGET:
                    self.heavy = True
        finally:
            batcher.release()

    def _act(self, frames: list[Frame]) -> None:
        """Hand C{frames} to the session a slice at a time, within the turn's
        budget; keep the rest for the next turn."""
        session = self.session
        start = _now()
        n = len(frames)
        i = 0
        step = FIRST_SLICE
        while i < n:
            session.frames_received(frames[i : i + step])
            i += step
            if i >= n:
                if _now() - start < TURN_BUDGET / 4:
                    self.heavy = False
                return
            spent = _now() - start
            if spent <= TURN_BUDGET:
                # Next slice: about a quarter of the budget at the pace so far.
                pace = spent / i
                step = SLICE if pace * SLICE < TURN_BUDGET / 4 else max(1, int(TURN_BUDGET / 4 / pace))
            else:
                if session.closed:
                    return
                self._pending = frames[i:]
                session.transport.pause_reading()
                self._later = session.clock.callLater(0, self._go_on)
                return

    def _go_on(self) -> None:
        """Next turn: act on what waits; read again once nothing does."""
        self._later = None
        frames = self._pending
        self._pending = None
        session = self.session
        if session.closed or not frames:
            return
        batcher = self._batcher
        batcher.hold()
        try:
            self._act(frames)
        finally:
            batcher.release()
        if self._pending is None and not session.closed and not session.reading_blocked:
            session.transport.resume_reading()

    def _drop_pending_into(self, frames: list[Frame]) -> None:
        """Put the frames still waiting in front of C{frames}."""
        if self._pending is not None:
            frames[:0] = self._pending
            self._forget_pending()

    def discard(self) -> None:
        """The connection is closing: drop the unfinished frame and what
        waits, rather than hold them through the close."""
        self.parser.discard()
        self._forget_pending()

    def connection_lost(self) -> None:
        """The connection is gone: what waits is dropped."""
        self._forget_pending()

    def _forget_pending(self) -> None:
        """No frame waits any more, nor the next turn's call to act on them."""
        self._pending = None
        if self._later is not None and self._later.active():
            self._later.cancel()
        self._later = None
