# -*- test-case-name: tests.test_stomp_session -*-
"""A STOMP subscription: the core consumer that writes MESSAGE frames.

L{Subscription} is a L{qmq.core.consumer.Consumer}: the core decides when it
gets a message (credit, pause, backlog) and the channel tags and tracks the
delivery; all this class adds is the wire form. Its C{deliver} is the
broker's hottest path after the parser, so the MESSAGE frame is one
C{bytes %} of a prefix fixed per subscription, the tag, the message's cached
header block (L{qmq.stomp.encoding}) and the body.

L{TextSubscription} is the subscription of a session whose transport carries
text only (C{transport.text_only}: SockJS, whose messages are JavaScript
strings): every delivery to such a session passes its C{deliver}, which
refuses a body that is not UTF-8 (L{StompSession.undeliverable}) instead
of sending it mangled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qmq.core.consumer import Consumer
from qmq.stomp.encoding import block_for_version, encode_message_headers
from qmq.stomp.frame import escape_header

if TYPE_CHECKING:
    from qmq.core.message import Message
    from qmq.core.queue import Queue
    from qmq.stomp.session import StompSession


class Subscription(Consumer):
    """A STOMP subscription: a consumer owned by a session.

    @ivar id: the client's subscription id.
    @ivar destination: the destination it subscribed to.
    @ivar mode: C{auto}, C{client} or C{client-individual}.
    """

    __slots__ = ("session", "id", "destination", "mode", "prefix", "ack_line", "tags")

    def __init__(
        self,
        session: StompSession,
        sub_id: str,
        destination: str,
        mode: str,
        prefetch: int | None,
    ) -> None:
        super().__init__(mode != "auto", prefetch, session, cumulative=mode == "client")
        self.session = session
        self.channel = session.channel
        self.id = sub_id
        self.destination = destination
        self.mode = mode
        self.backlog_limit = session.settings.topic_backlog
        version = session.version
        sid = session.id
        self.prefix = (
            f"MESSAGE\nsubscription:{escape_header(sub_id, version)}\nmessage-id:{sid}-"
        ).encode()
        # STOMP 1.2 acks by the `ack` header; earlier versions by message-id.
        self.ack_line = (f"\nack:{sid}-").encode() if (version == "1.2" and mode != "auto") else b""
        self.paused = session.paused
        # An auto-ack delivery is tracked by taking a tag alone: next() of
        # the channel's tags, a C call (not a Python call of Channel.track;
        # nor a bound __next__ kept in a slot, which CPython 3.11 looks up
        # and calls the slow way).
        self.tags = session.channel.tag_source()

    def deliver(self, message: Message, queue: Queue | None) -> None:
        if self.ack_required:
            tag = self.channel.track(self, message)
        else:
            tag = next(self.tags)
        block = message.cache
        if block is None:
            block = encode_message_headers(message)
        if block.__class__ is tuple:
            block = block_for_version(message, block, self.session.version_index)
        if message.delivery_count:
            block = b"\nredelivered:true\nx-delivery-count:%d%s" % (message.delivery_count, block)
        body = message.body
        if self.ack_required:
            if self.ack_line:
                frame = b"%s%d%s%d%scontent-length:%d\n\n%s\x00" % (
                    self.prefix, tag, self.ack_line, tag, block, len(body), body,
                )
            else:
                frame = b"%s%d%scontent-length:%d\n\n%s\x00" % (
                    self.prefix, tag, block, len(body), body,
                )
        else:
            frame = b"%s%d%scontent-length:%d\n\n%s\x00" % (
                self.prefix, tag, block, len(body), body,
            )
        self.session.write_frame(frame)

    def cancelled(self) -> None:
        self.session.subscription_cancelled(self)

    def overrun(self, reason: str) -> None:
        self.session.subscription_overrun(self, reason)


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def is_text(body: bytes) -> bool:
    """Whether C{body} is UTF-8 text (what a text-only transport can carry)."""
    return body.isascii() or _is_utf8(body)


class TextSubscription(Subscription):
    """A subscription of a session over a text-only transport (SockJS).

    A body that is not UTF-8 cannot cross it: decoded with replacement
    characters it would arrive changed, and its C{content-length} (bytes)
    would no longer match, which desynchronises stomp.js's parser. Such a
    message is not delivered: the session gets it back
    (L{qmq.stomp.session.StompSession.undeliverable}), tells its client with
    an ERROR, and returns it to its queue.
    """

    __slots__ = ()

    def deliver(self, message: Message, queue: Queue | None) -> None:
        body = message.body
        # is_text, inlined: ASCII (the usual STOMP text) costs one C call.
        if body.isascii() or _is_utf8(body):
            Subscription.deliver(self, message, queue)
            return
        if self.ack_required:
            # Tracked like any delivery, so that closing the session's
            # channel gives it back to its queue as it does every unacked one.
            self.channel.track(self, message)
            queue = None
        self.session.undeliverable(self, message, queue)
