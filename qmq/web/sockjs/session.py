# -*- test-case-name: tests.test_sockjs_session -*-
"""SockJS sessions: what outlives the HTTP requests that carry them.

A browser's SockJS session over HTTP is a series of requests: a I{receiving}
request (a poll, or a stream) that the server answers with frames, and
I{sending} requests (C{xhr_send}, C{jsonp_send}) that carry the browser's
messages. L{SockJSSession} holds what lives between them:

  - the messages the application sent while no receiving request was there
    to take them (the I{outbox}; bounded, see below);
  - the one receiving request attached now (a L{Receiver}), if any; a
    second one is answered C{c[2010,"Another connection still open"]};
  - two timers on the injected clock: a heart-beat (C{h}) every
    C{heartbeat_delay} seconds while a receiver waits (skipped when
    something else was sent since the last one), and the session's
    expiry, C{disconnect_delay} seconds after the last receiver left;
  - its state: C{NEW} (no frame sent yet), C{OPEN}, C{CLOSING} (the close
    frame is served to every receiver until the session expires),
    C{CLOSED}.

The application side is an L{ISockJSHandler} (the STOMP session's
transport in L{qmq.web.sockjs.stomp}, or a test service): it is told when
the session opens, what messages arrive, when the outbox is full and when
it has drained, and once when the session ends (closed by the
application, expired, or cut by a network error). It sends with
L{SockJSSession.send} and ends the session with L{SockJSSession.close}.

B{Bounds.} The outbox holds at most C{max_buffered_bytes}: past that the
handler is told to pause (the STOMP session stops its deliveries, as it does
when a TCP socket's buffer fills) and to resume once a receiver took it all;
a paused session whose outbox still grows past twice the bound (plus
L{SLACK}: a client that never polls but keeps asking for receipts) is
closed. Messages that arrive
while the application stopped reading (L{SockJSSession.pause_reading}) wait
in an inbox with the same bound.

A WebSocket session (C{websocket=True}) has one receiver for its whole life:
it ends when that receiver goes, without waiting for a new one.
"""

from __future__ import annotations

import os
from typing import Any

from zope.interface import Attribute, Interface

from qmq.web.sockjs.framing import HEARTBEAT, OPEN, close_frame, messages_frame

__all__ = [
    "CLOSED",
    "CLOSING",
    "ISockJSHandler",
    "NEW",
    "OPEN_STATE",
    "Receiver",
    "SockJSSession",
]

NEW, OPEN_STATE, CLOSING, CLOSED = "new", "open", "closing", "closed"

#: The close frames the protocol defines.
ANOTHER_CONNECTION = close_frame(2010, "Another connection still open")
INTERRUPTED = (1002, "Connection interrupted")
#: What an application may still send after it was told to pause, past
#: twice the outbox's bound, before the session is closed: a STOMP session
#: writes up to 128 KiB in one go before it learns that it must pause.
SLACK = 256 * 1024
#: A session whose client stopped taking what it was sent.
OVERFLOW = (3001, "Too much data waiting for the client")


class ISockJSHandler(Interface):
    """The application end of a SockJS session."""

    def opened(session: SockJSSession) -> None:
        """The session is open (its C{o} frame is on its way)."""

    def messages_received(messages: list[str]) -> None:
        """Messages from the client, in order."""

    def pause() -> None:
        """The outbox is full: send nothing more until L{resume}."""

    def resume() -> None:
        """The outbox has drained."""

    def closed() -> None:
        """The session has ended (called once)."""


class Receiver(Interface):
    """A connection that takes frames to the client (an HTTP response or a WebSocket)."""

    streaming = Attribute("True if it takes more than one frame.")
    paused = Attribute("True while its own write buffer is full.")

    def send_frame(frame: str) -> bool:
        """Send one frame; return True if the receiver is done after it
        (a poll, or a stream past its byte limit)."""

    def finish() -> None:
        """End the response (or close the WebSocket)."""


class SockJSSession:
    """One SockJS session (see the module docstring).

    @ivar id: the session id the client chose ("" for a WebSocket session).
    @ivar state: C{"new"}, C{"open"}, C{"closing"} or C{"closed"}.
    @ivar peer: the client's address, for logs.
    @ivar peer_host: the client's host, for the connection caps.
    @ivar buffered: bytes (characters) of messages waiting in the outbox.
    @ivar identity: the verified TLS client identity of the connection that
        opened the session (L{qmq.tls.PeerIdentity}), or None; every later
        request of the session must come with the same.
    @ivar key: what the service finds the session by: its id, and what it
        is bound to (L{qmq.web.sockjs.resource.SockJSService.key}).
    """

    __slots__ = (
        "id", "handler", "clock", "state", "peer", "peer_host", "receiver", "websocket",
        "heartbeat_delay", "disconnect_delay", "max_buffered", "outbox", "buffered",
        "close_frame", "reading_paused", "inbox", "inbox_bytes", "_forget", "_expiry",
        "_heartbeat", "_full", "_wrote", "identity", "key", "__weakref__",
    )

    def __init__(
        self,
        session_id: str,
        handler: Any,
        clock: Any,
        *,
        heartbeat_delay: float = 25.0,
        disconnect_delay: float = 5.0,
        max_buffered: int = 1024 * 1024,
        peer: str = "?",
        peer_host: str = "",
        websocket: bool = False,
        forget: Any = None,
        identity: Any = None,
    ) -> None:
        """
        @param handler: the application end (an L{ISockJSHandler}).
        @param clock: an C{IReactorTime} for the timers.
        @param forget: called with the session once it is over (the
            service drops it from its table).
        """
        self.id = session_id
        self.handler = handler
        self.clock = clock
        self.state = NEW
        self.peer = peer
        self.peer_host = peer_host
        self.identity = identity
        self.key: Any = session_id
        self.receiver: Any = None
        self.websocket = websocket
        self.heartbeat_delay = heartbeat_delay
        self.disconnect_delay = disconnect_delay
        self.max_buffered = max_buffered
        self.outbox: list[str] = []
        self.buffered = 0
        self.close_frame: str | None = None
        self.reading_paused = False
        self.inbox: list[list[str]] = []
        self.inbox_bytes = 0
        self._forget = forget
        self._expiry: Any = None
        self._heartbeat: Any = None
        self._full = False
        self._wrote = False
        if not websocket:
            # A session nobody polls within the delay of its creation ends.
            self._expiry = clock.callLater(disconnect_delay, self._expire)

    # -- receivers ------------------------------------------------------------

    def attach(self, receiver: Any) -> None:
        """A receiving request arrived: serve it what waits, or keep it waiting."""
        if self.state is CLOSED:
            receiver.send_frame(self.close_frame or close_frame(*INTERRUPTED))
            receiver.finish()
            return
        if self.receiver is not None:
            receiver.send_frame(ANOTHER_CONNECTION)
            receiver.finish()
            return
        self.receiver = receiver
        self._cancel_expiry()
        if self.state is NEW:
            self.state = OPEN_STATE
            self._write(OPEN)
            self.handler.opened(self)
            if self.receiver is receiver:
                self.flush()
            if self.receiver is receiver:
                self._start_heartbeat()
            return
        if self.state is CLOSING:
            # What was sent before the close goes first (a STOMP ERROR
            # explains the close); a poll takes it now and the close next time.
            if self.outbox:
                self._write_outbox()
            if self.receiver is receiver:
                self._write(self.close_frame)  # type: ignore[arg-type]
            if self.receiver is receiver:
                self._finish_receiver()
            return
        self.flush()
        if self.receiver is receiver:
            self._start_heartbeat()

    def detach(self, receiver: Any, aborted: bool = False) -> None:
        """A receiving request ended (C{aborted}: by a network error)."""
        if self.receiver is not receiver:
            return
        self.receiver = None
        self._stop_heartbeat()
        if aborted and self.state is OPEN_STATE:
            # The client is in an unknown state: some frames may be lost.
            self.close(*INTERRUPTED)
        if self.websocket:
            self._end()
        elif self.state is not CLOSED:
            self._expiry = self.clock.callLater(self.disconnect_delay, self._expire)

    def receiver_ready(self) -> None:
        """The attached receiver's write buffer drained: send what waits."""
        self.flush()

    def _write(self, frame: str) -> None:
        """One frame to the receiver; a receiver done after it is detached."""
        receiver = self.receiver
        if receiver.send_frame(frame):
            self.receiver = None
            self._stop_heartbeat()
            receiver.finish()
            if not self.websocket and self.state is not CLOSED:
                self._cancel_expiry()
                self._expiry = self.clock.callLater(self.disconnect_delay, self._expire)
        else:
            # The heart-beat timer is not moved on every write (that costs
            # a timer update per delivery): it looks at this flag instead.
            self._wrote = True

    def _write_outbox(self) -> None:
        outbox = self.outbox
        self.outbox = []
        self.buffered = 0
        self._write(messages_frame(outbox))
        if self._full and self.state is OPEN_STATE:
            self._full = False
            self.handler.resume()

    def flush(self) -> None:
        """Send the outbox to the receiver, if one takes it now."""
        receiver = self.receiver
        if self.outbox and receiver is not None and not receiver.paused:
            self._write_outbox()

    # -- the application's side ------------------------------------------------------

    def send(self, messages: list[str]) -> None:
        """Queue C{messages} for the client; they go at once if a receiver waits."""
        if self.state is not OPEN_STATE:
            return
        receiver = self.receiver
        if receiver is not None and not self.outbox and not receiver.paused:
            # The usual case of a live client: straight to its connection.
            self._write(messages_frame(messages))
            return
        self.outbox.extend(messages)
        size = self.buffered
        for m in messages:
            size += len(m)
        self.buffered = size
        receiver = self.receiver
        if receiver is not None and not receiver.paused:
            self._write_outbox()
            return
        if size > self.max_buffered:
            if not self._full:
                self._full = True
                self.handler.pause()
            elif size > 2 * self.max_buffered + SLACK:
                # Paused, and still growing: not deliveries (they stopped)
                # but replies the client keeps asking for without polling.
                self.close(*OVERFLOW)

    def close(self, code: int = 3000, reason: str = "Go away!") -> None:
        """End the session: the close frame is served until it expires."""
        if self.state is CLOSING or self.state is CLOSED:
            return
        self.state = CLOSING
        self.close_frame = close_frame(code, reason)
        self.inbox = []
        self.inbox_bytes = 0
        receiver = self.receiver
        if receiver is not None:
            if self.outbox and not receiver.paused:
                self._write_outbox()
            if self.receiver is not None:
                self._write(self.close_frame)
            if self.receiver is not None:
                self._finish_receiver()
        self.handler.closed()

    def _finish_receiver(self) -> None:
        """A stream (or WebSocket) ends with the close frame."""
        receiver = self.receiver
        self.receiver = None
        self._stop_heartbeat()
        receiver.finish()
        if self.websocket:
            self._end()
        elif self._expiry is None:
            self._expiry = self.clock.callLater(self.disconnect_delay, self._expire)

    # -- messages from the client ---------------------------------------------------

    def messages_received(self, messages: list[str]) -> None:
        """Messages from a sending request (or the WebSocket), in order."""
        if self.state is not OPEN_STATE or not messages:
            return
        if self.reading_paused:
            self.inbox.append(messages)
            self.inbox_bytes += sum(len(m) for m in messages)
            if self.inbox_bytes > self.max_buffered:
                self.close(*OVERFLOW)
            return
        self.handler.messages_received(messages)

    def pause_reading(self) -> None:
        """Hold what the client sends until L{resume_reading} (bounded)."""
        self.reading_paused = True
        pause = getattr(self.receiver, "pause_reading", None)
        if pause is not None:
            pause()

    def resume_reading(self) -> None:
        """Hand over what was held, and take the client's messages again."""
        self.reading_paused = False
        resume = getattr(self.receiver, "resume_reading", None)
        if resume is not None:
            resume()
        while self.inbox and not self.reading_paused and self.state is OPEN_STATE:
            messages = self.inbox.pop(0)
            self.inbox_bytes -= sum(len(m) for m in messages)
            self.handler.messages_received(messages)

    # -- timers -------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None and self.heartbeat_delay:
            self._wrote = False
            self._heartbeat = self.clock.callLater(self.heartbeat_delay, self._beat)

    def _stop_heartbeat(self) -> None:
        timer, self._heartbeat = self._heartbeat, None
        if timer is not None and timer.active():
            timer.cancel()

    def _beat(self) -> None:
        """C{h} to a receiver that got nothing since the last tick (so a
        stream is never silent for more than twice C{heartbeat_delay})."""
        self._heartbeat = None
        if self.receiver is not None:
            if not self._wrote:
                self._write(HEARTBEAT)
            if self.receiver is not None:
                self._start_heartbeat()

    def _cancel_expiry(self) -> None:
        timer, self._expiry = self._expiry, None
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self) -> None:
        """No receiver for C{disconnect_delay} seconds: the session ends."""
        self._expiry = None
        if self.receiver is not None:
            return
        was_live = self.state is not CLOSING
        self.state = CLOSING
        if was_live:
            self.close_frame = close_frame(*INTERRUPTED)
            self.handler.closed()
        self._end()

    def _end(self) -> None:
        self.state = CLOSED
        self._cancel_expiry()
        self._stop_heartbeat()
        self.outbox = []
        self.buffered = 0
        self.inbox = []
        forget, self._forget = self._forget, None
        if forget is not None:
            forget(self)

    def end(self) -> None:
        """Forget the session now (the service is shutting down)."""
        if self.state is not CLOSED:
            receiver, self.receiver = self.receiver, None
            if receiver is not None:
                receiver.finish()
            if self.state is not CLOSING:
                self.state = CLOSING
                self.handler.closed()
            self._end()


def entropy() -> int:
    """A random number in [0, 2**32) for C{/info} (browsers' randomness is weak)."""
    return int.from_bytes(os.urandom(4), "big")
