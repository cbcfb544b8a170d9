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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qmq.stomp.frame import FrameError, StompParser

if TYPE_CHECKING:
    from qmq.stomp.session import StompSession


class StompReader:
    """Parses one connection's bytes into frames for its session.

    @ivar parser: the incremental parser (its limits come from the session's
        settings; its escaping follows the session's negotiated version).
    """

    __slots__ = ("session", "parser", "_batcher", "_seconds")

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
                session.frames_received(e.frames)
                session.frame_error(e)
                return
            pending = parser.pending_bytes
            if pending or session.unfinished:
                # A frame is still arriving: its deadline and its share of
                # the broker's budget for unfinished frames.
                session.frame_progress(pending, bool(frames))
            session.frames_received(frames)
        finally:
            batcher.release()
