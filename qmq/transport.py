# -*- test-case-name: tests.test_transport -*-
"""What a session needs of its connection, whatever carries it.

A frontend session (the STOMP session today; later SockJS, WebSocket and
peer links carry the same session) never touches a Twisted transport. It
talks to an L{ITransport}:

  - C{write_frames(frames)}: whole frames, in order. A byte-stream transport
    (TCP, TLS, unix) joins them into one write; a message-framed one
    (WebSocket, SockJS) keeps their boundaries.
  - C{close(reason)}: close for real. What was written is flushed first;
    a peer that does not let the connection close within a short grace is
    aborted, so a socket never outlives its session (over TLS too).
  - C{pause_reading()} / C{resume_reading()}: stop and restart reading from
    the peer (publisher back-pressure: the memory alarm, budgets).
  - C{heartbeats}: whether the transport carries STOMP heart-beats (an EOL
    between frames); a transport that cannot negotiates C{0,0}.
  - C{peer}: the peer's address for logs; C{identity}: the verified TLS
    client identity (L{qmq.tls.PeerIdentity}) or None.
  - C{text_only} (optional; false when absent): the transport carries text
    only (SockJS), so MESSAGE bodies must be UTF-8
    (L{qmq.stomp.subscription.TextSubscription}).

The transport, in turn, calls the session: the frames (or bytes) it
received, C{pause()}/C{resume()} when its write buffer fills and drains, and
C{connection_lost()} once.

Every listener kind registers its connections in one L{IConnectionRegistry},
which enforces connection caps (per listener and per client address) and
closes every connection at a graceful shutdown.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class ITransport(Interface):
    """A session's connection to its client (see the module docstring)."""

    peer = Attribute("The peer's address for logs, e.g. C{'127.0.0.1:40512'}.")
    identity = Attribute(
        "The verified TLS client identity (L{qmq.tls.PeerIdentity}), or None."
    )
    heartbeats = Attribute("True if the transport carries STOMP heart-beats.")

    def write_frames(frames: list[bytes]) -> None:
        """Send whole frames in order; the list becomes the transport's."""

    def close(reason: str) -> None:
        """Flush, then close the connection; abort it after a short grace."""

    def pause_reading() -> None:
        """Stop reading from the peer until L{resume_reading}."""

    def resume_reading() -> None:
        """Read from the peer again."""


class IConnection(Interface):
    """A connection as a registry sees it."""

    peer_host = Attribute("The client's address (host only), for per-address caps.")

    def shutdown(reason: str) -> None:
        """Tell the client the broker is going away (if the protocol can), then close."""

    def abort() -> None:
        """Drop the connection now."""
