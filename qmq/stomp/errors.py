# -*- test-case-name: tests.test_stomp_session -*-
"""The STOMP client error every part of a session raises.

A C{stomp_<COMMAND>} handler (L{qmq.stomp.session}, L{qmq.stomp.connect},
L{qmq.stomp.transactions}) raises L{StompError} for a frame it refuses;
L{qmq.stomp.session.StompSession._handle} catches it and answers with an
ERROR frame (carrying the frame's receipt-id), then closes the connection.
"""

from __future__ import annotations


class StompError(Exception):
    """A client error: answered with an ERROR frame, then the connection closes."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
