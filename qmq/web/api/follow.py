# -*- test-case-name: tests.test_web_api -*-
"""Following a topic over HTTP: Server-Sent Events and cursor long polls.

A follower is a live consumer (L{qmq.core.consumer.Consumer} bound straight
to C{amq.topic} through the API's channel, as a STOMP auto-ack topic
subscription is): it sees what is published while it exists, nothing from
before. Two forms:

  - L{SseFollower}: one long response (C{text/event-stream}); each message
    is an event C{id: <message id>} / C{event: message} / C{data: <JSON>}.
    The response is the transport's producer: while the client does not
    read, the follower is paused and messages wait in its bounded backlog
    (oldest dropped past C{follow_backlog}). A comment line is written
    every C{sse_keepalive} seconds so proxies keep the stream open.
  - L{CursorFollower}: made by a poll without a cursor and kept between
    polls (up to C{follow_idle_timeout} seconds without one). It numbers
    what it receives (C{seq}) and keeps up to C{follow_backlog} messages;
    a poll with cursor C{ID.SEQ} forgets what the client has seen (up to
    SEQ) and gets what follows, waiting up to C{wait} seconds for it. A
    poll repeated with the same cursor (a lost answer) gets the same
    messages again.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import TYPE_CHECKING, Any

import orjson
from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from qmq.core.consumer import Consumer
from qmq.web.api.codec import json_delivery

if TYPE_CHECKING:
    from qmq.core.message import Message
    from qmq.core.queue import Queue
    from qmq.web.api.frontend import VHostFrontend


class SseFollower(Consumer):
    """A topic followed by a Server-Sent Events response."""

    __slots__ = ("request", "keepalive", "clock", "open", "node")

    def __init__(self, request: Any, backlog: int, clock: Any, node: str) -> None:
        super().__init__(False, None)
        self.backlog_limit = backlog
        self.request = request
        self.clock = clock
        self.node = node
        self.keepalive: Any = None
        self.open = True

    def deliver(self, message: Message, queue: Queue | None) -> None:
        d = json_delivery(message, None, None, False, self.node)
        self.request.write(b"id: %s\nevent: message\ndata: %s\n\n" % (d["id"].encode(), orjson.dumps(d)))

    def cancelled(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.open:
            return
        self.open = False
        if self.keepalive is not None and self.keepalive.active():
            self.keepalive.cancel()
        self.keepalive = None
        try:
            self.request.unregisterProducer()
            self.request.finish()
        except Exception:  # noqa: S110 - the client may be gone already
            pass


@implementer(IPushProducer)
class _SseProducer:
    """Pauses the follower while the client's connection is full."""

    def __init__(self, follower: SseFollower) -> None:
        self.follower = follower

    def pauseProducing(self) -> None:
        self.follower.paused = True

    def resumeProducing(self) -> None:
        if self.follower.open:
            self.follower.resume()

    def stopProducing(self) -> None:
        self.follower.paused = True


class CursorFollower(Consumer):
    """A topic followed by polls with a cursor (see the module docstring)."""

    __slots__ = (
        "fid", "fe", "topic", "seq", "kept", "dropped", "waiter", "want", "answer_call", "timer", "idle",
        "clock", "limit",
    )

    def __init__(self, fe: VHostFrontend, topic: str, limit: int) -> None:
        super().__init__(False, None)
        self.fid = secrets.token_urlsafe(9)
        self.fe = fe
        self.topic = topic
        self.clock = fe.clock
        self.limit = limit
        self.seq = 0
        self.kept: deque[tuple[int, Message]] = deque()
        self.dropped = 0
        self.waiter: defer.Deferred | None = None
        self.want = 0
        self.answer_call: Any = None
        self.timer: Any = None
        self.idle: Any = None

    def deliver(self, message: Message, queue: Queue | None) -> None:
        self.seq += 1
        kept = self.kept
        if len(kept) >= self.limit:
            kept.popleft()
            self.dropped += 1
        kept.append((self.seq, message))
        if self.waiter is not None and self.answer_call is None:
            self.answer_call = self.clock.callLater(0, self._answer)

    def take(self, after: int, want: int) -> list[tuple[int, Message]]:
        """Forget what is at or before C{after}; return up to C{want} after it."""
        kept = self.kept
        while kept and kept[0][0] <= after:
            kept.popleft()
        return [kept[i] for i in range(min(want, len(kept)))]

    def wait(self, want: int, timeout: float) -> defer.Deferred:
        """Fires with what comes within C{timeout} seconds (maybe nothing)."""
        self._answer()  # a poll waiting already is answered (empty) first
        self.want = want
        d = self.waiter = defer.Deferred()
        self.timer = self.clock.callLater(timeout, self._answer)
        return d

    def _answer(self) -> None:
        for call in (self.answer_call, self.timer):
            if call is not None and call.active():
                call.cancel()
        self.answer_call = self.timer = None
        d, self.waiter = self.waiter, None
        if d is not None:
            d.callback([self.kept[i] for i in range(min(self.want, len(self.kept)))])

    def cancelled(self) -> None:
        self._answer()


__all__ = ["CursorFollower", "SseFollower", "_SseProducer"]
