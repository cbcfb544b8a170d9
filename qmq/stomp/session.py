# -*- test-case-name: tests.test_stomp_session -*-
"""The STOMP session: STOMP 1.0/1.1/1.2 semantics over the broker core.

One L{StompSession} serves one client whatever carries its bytes (TCP, TLS,
later WebSocket and HTTP long polling): the transport hands it bytes with
L{StompSession.data_received}, tells it when its write buffer is full
(L{StompSession.pause}/L{StompSession.resume}) and when the connection is
gone (L{StompSession.connection_lost}); the session writes bytes back through
the C{write} and C{close} callables it was given.

Flow of a frame::

    bytes -> StompParser.feed -> Frame -> stomp_<COMMAND> handler -> core call
    core delivery -> Subscription.deliver -> MESSAGE bytes -> out buffer
    end of the reactor turn (WriteBatcher) -> one write of all buffered frames

Any protocol error produces an ERROR frame (with a C{message} header, an
explanatory body and the offending frame's C{receipt-id} when it had one),
then the connection is closed; nothing else the broker serves is affected.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from qmq import __version__
from qmq.core.broker import Broker
from qmq.core.consumer import Consumer
from qmq.core.errors import BrokerError
from qmq.core.exchange import Exchange
from qmq.core.message import Message
from qmq.core.queue import Queue
from qmq.core.vhost import VirtualHost
from qmq.stomp.destination import DestinationError, destination_of, parse_destination
from qmq.stomp.frame import Frame, FrameError, encode_frame, escape_header
from qmq.stomp.settings import StompSettings
from qmq.transport import ITransport

log = Logger()

VERSIONS = ("1.2", "1.1", "1.0")
ACK_MODES = ("auto", "client", "client-individual")
PREFETCH_HEADERS = ("prefetch-count", "activemq.prefetchSize", "prefetch")
DURABLE_NAME_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")
# Headers of a SEND that describe the frame, not the message.
_STRIPPED_LINES = (b"\nreceipt:", b"\ntransaction:", b"\ncontent-length:")
# Flush a connection's buffer early once it holds this much, so one turn
# never piles up more than about this per connection before back-pressure.
FLUSH_THRESHOLD = 128 * 1024
_VERSION_INDEX = {"1.2": 0, "1.1": 1, "1.0": 2}
_NONE_UNACKED: Mapping[int, Message] = MappingProxyType({})
_session_ids = itertools.count(1)


class StompError(Exception):
    """A client error: answered with an ERROR frame, then the connection closes."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message


def _escaped(text: str, version: str) -> str:
    if version == "1.0":
        # STOMP 1.0 has no escapes: a line break would end the header (or the
        # header block) early and let a publisher forge headers or frames.
        return text.replace("\r", " ").replace("\n", " ")
    return escape_header(text, version)


def encode_message_headers(message: Message, destination: str | None = None) -> bytes | tuple:
    """Encode the headers every MESSAGE frame of C{message} shares.

    The block is one C{"\\nname:value"} per header, then a final C{"\\n"}:
    the session writes it right after the message-id. It is the 1.2-escaped
    block as bytes when every STOMP version reads it the same (the common
    case), else a tuple of the 1.2, 1.1 and 1.0 forms (L{_VERSION_INDEX}).
    The result is cached on the message.
    """
    headers = message.headers
    if destination is None:
        # The destination a STOMP publisher named, else the one its
        # exchange and routing key name.
        destination = (headers or {}).get("destination") or destination_of(
            message.exchange, message.routing_key
        )
    items = [("destination", destination)]
    if headers:
        items.extend(kv for kv in headers.items() if kv[0] != "destination")
    raw = "".join([f"\n{k}:{v}" for k, v in items])
    n = len(items)
    if raw.count(":") == n and raw.count("\n") == n and "\\" not in raw and "\r" not in raw:
        block: bytes | tuple = (raw + "\n").encode()
    else:
        block = tuple(
            ("".join([f"\n{_escaped(k, v_)}:{_escaped(v, v_)}" for k, v in items]) + "\n").encode()
            for v_ in VERSIONS
        )
    message.cache = block
    return block


def relay_block(raw: bytes, message: Message, destination: str | None) -> bytes | tuple:
    """The MESSAGE header block made from a SEND's raw header lines.

    The lines that describe the SEND frame (receipt, transaction,
    content-length) are removed; the rest is relayed as received.
    """
    if raw.count(b":") != raw.count(b"\n") - 1:
        # A colon inside a value (sent unescaped by a STOMP 1.0 client):
        # encode properly for 1.1/1.2 receivers.
        return encode_message_headers(message, destination)
    block = raw
    for line in _STRIPPED_LINES:
        if line in block:
            block = _strip_header(block, line)
    return block


def _block_for_version(message: Message, cached: tuple, version_index: int) -> bytes:
    """The header block of C{message} for a receiver, from a tuple cache.

    A 3-tuple holds the block per STOMP version (L{_VERSION_INDEX}); a
    1-tuple holds a SEND's raw header lines not yet stripped of its frame
    lines, done here on first delivery and cached.
    """
    if len(cached) == 1:
        block = relay_block(cached[0], message, None)
        message.cache = block
        if block.__class__ is not tuple:
            return block  # type: ignore[return-value]
        cached = block  # type: ignore[assignment]
    return cached[version_index]  # type: ignore[no-any-return]


def _strip_header(block: bytes, key: bytes) -> bytes:
    """Remove every C{key} line (C{b"\\nname:"}) from a raw header block."""
    i = block.find(key)
    while i >= 0:
        block = block[:i] + block[block.find(b"\n", i + 1) :]
        i = block.find(key, i)
    return block


class Subscription(Consumer):
    """A STOMP subscription: a consumer on one queue, owned by a session.

    @ivar id: the client's subscription id.
    @ivar destination: the destination it subscribed to.
    @ivar mode: C{auto}, C{client} or C{client-individual}.
    @ivar unacked: delivery tag -> message, in delivery order.
    @ivar private: the queue was made for this subscription and goes with it.
    """

    __slots__ = (
        "session",
        "id",
        "destination",
        "mode",
        "unacked",
        "private",
        "durable",
        "prefix",
        "ack_line",
        "exchange",
        "backlog",
    )

    def __init__(
        self,
        session: StompSession,
        sub_id: str,
        destination: str,
        mode: str,
        prefetch: int | None,
        private: bool,
    ) -> None:
        super().__init__(mode != "auto", prefetch, session)
        self.session = session
        self.id = sub_id
        self.destination = destination
        self.mode = mode
        # Only subscriptions that ack hold unacked messages; the others share
        # one empty mapping (a million topic subscriptions, 64 bytes each).
        self.unacked: dict[int, Message] = {} if mode != "auto" else _NONE_UNACKED  # type: ignore[assignment]
        self.private = private
        self.durable = False
        self.exchange: Exchange | None = None
        self.backlog: deque[Message] | None = None
        version = session.version
        sid = session.id
        self.prefix = (
            f"MESSAGE\nsubscription:{escape_header(sub_id, version)}\nmessage-id:{sid}-"
        ).encode()
        # STOMP 1.2 acks by the `ack` header; earlier versions by message-id.
        self.ack_line = (f"\nack:{sid}-").encode() if (version == "1.2" and mode != "auto") else b""
        self.paused = session.paused

    def deliver(self, message: Message, queue: Queue) -> None:
        session = self.session
        tag = session.next_tag
        session.next_tag = tag + 1
        block = message.cache
        if block is None:
            block = encode_message_headers(message)
        if block.__class__ is tuple:
            block = _block_for_version(message, block, session.version_index)
        if message.delivery_count:
            block = b"\nredelivered:true\nx-delivery-count:%d%s" % (message.delivery_count, block)
        body = message.body
        if self.ack_required:
            self.unacked[tag] = message
            session.ack_owner[tag] = self
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
        session.write_frame(frame)

    def cancelled(self) -> None:
        self.session.subscription_cancelled(self)

    # A live subscription: bound straight to an exchange, with no queue.

    def publish(self, message: Message) -> None:
        """A message routed to this subscription by the exchange it is bound to.

        Delivered at once, unless the client's transport is paused: then it
        waits in a backlog made on demand and bounded by C{topic_backlog}
        (the oldest messages go first), drained by L{drain_backlog}.
        """
        backlog = self.backlog
        if backlog is None:
            if not self.paused:
                self.deliver(message, None)  # type: ignore[arg-type]
                return
            backlog = self.backlog = deque(maxlen=self.session.settings.topic_backlog or None)
        backlog.append(message)

    def drain_backlog(self) -> None:
        """Deliver what waited while the transport was paused."""
        backlog = self.backlog
        while backlog and not self.paused:
            self.deliver(backlog.popleft(), None)  # type: ignore[arg-type]
        if not backlog:
            self.backlog = None


class StompSession:
    """One client's STOMP session (see the module docstring).

    @ivar id: the session id (also the prefix of every message-id it sends).
    @ivar version: the negotiated STOMP version.
    @ivar vhost: the virtual host chosen at CONNECT.
    @ivar subscriptions: subscription id -> L{Subscription}.
    @ivar ack_owner: delivery tag -> the subscription it was delivered on.
    """

    def __init__(
        self,
        broker: Broker,
        settings: StompSettings,
        transport: ITransport,
        clock: Any = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock if clock is not None else broker.clock
        self.transport = transport
        self.heartbeats_supported = transport.heartbeats
        self.peer = transport.peer
        self.id = f"{next(_session_ids):x}"
        self.version = "1.0"
        self.version_index = 2
        self.vhost: VirtualHost = broker.default_vhost
        self.connected = False
        self.closed = False
        self.paused = False
        self.login: str | None = None
        self.client_id: str | None = None
        self.next_tag = 1
        self._cumulative_upto = 0
        self._released = False
        # Names of the session's own queues carry a random token: they can be
        # published to by name (RPC replies), so they must not be guessable.
        self._token = secrets.token_urlsafe(12)
        self.subscriptions: dict[str, Subscription] = {}
        self.ack_owner: dict[int, Subscription] = {}
        self.transactions: dict[str, list[tuple[str, Frame]]] = {}
        self.temp_queues: dict[str, Queue] = {}
        self._batcher = broker.batcher
        self._out: list[bytes] = []
        self._out_size = 0
        self._send_cache: dict[str, tuple] = {}
        self._message_ids = broker.message_ids
        self._blocks: dict[bytes, bytes] = {}
        self._seconds = self.clock.seconds
        self._msgid_prefix = self.id + "-"
        self._wrote_flag = True
        #: Clock time of the last byte received (set by the transport's reader).
        self.last_read = self._seconds()
        self._recv_deadline = 0.0
        self._send_loop: LoopingCall | None = None
        self._recv_loop: LoopingCall | None = None
        self._connect_timer = None
        if settings.connect_timeout:
            self._connect_timer = self.clock.callLater(settings.connect_timeout, self._connect_timeout)

    # -- transport side -------------------------------------------------------

    def frames_received(self, frames: list[Frame]) -> None:
        """Whole frames from the client (from a L{StompReader} or a
        message-framed transport): act on each, in order."""
        if self.closed:
            return
        batcher = self._batcher
        batcher.hold()
        try:
            handlers = _HANDLERS
            for frame in frames:
                if self.closed:
                    return
                handler = handlers.get(frame.command) if self.connected else None
                if handler is None:
                    self._handle(frame)
                    continue
                try:
                    handler(self, frame)
                except (StompError, BrokerError) as e:
                    self._failed(frame, e)
        except Exception:
            log.failure("internal error in STOMP session {session}", session=self.id)
            self.error("internal error", "The broker failed to process a frame; see its log.")
        finally:
            batcher.release()

    def frame_error(self, e: FrameError) -> None:
        """The client's bytes are not STOMP (or break a limit): ERROR and close."""
        self.error(e.message, e.detail)

    def _failed(self, frame: Frame, e: StompError | BrokerError) -> None:
        """Answer a failed frame with an ERROR (carrying its receipt-id) and close."""
        receipt = getattr(e, "receipt", None) or frame.headers.get("receipt")
        detail = e.detail if isinstance(e, StompError) else e.message
        self.error(e.message, detail, receipt)

    def _handle(self, frame: Frame) -> None:
        """The careful path for one frame: checks, dispatch, errors."""
        try:
            if not self.connected and frame.command not in ("CONNECT", "STOMP"):
                raise StompError(
                    "not connected",
                    f"The first frame must be CONNECT or STOMP, not {frame.command}.",
                )
            handler = _HANDLERS.get(frame.command)
            if handler is None:
                raise StompError(
                    "unknown command",
                    f"Unknown STOMP command {frame.command!r}; expected one of "
                    + ", ".join(sorted(_HANDLERS)),
                )
            handler(self, frame)
        except (StompError, BrokerError) as e:
            self._failed(frame, e)

    def write_frame(self, data: bytes) -> None:
        """Buffer outgoing bytes; they go out at the end of this reactor turn."""
        out = self._out
        out.append(data)
        self._out_size += len(data)
        if len(out) == 1:
            self._batcher.want_flush(self)
        elif self._out_size > FLUSH_THRESHOLD:
            self.flush()

    def flush(self) -> None:
        """Hand everything buffered to the transport in one call."""
        out = self._out
        if not out:
            return
        self._out = []
        self._out_size = 0
        self._wrote_flag = True
        if not self.closed:
            self.transport.write_frames(out)

    def pause(self) -> None:
        """The transport's write buffer is full: stop deliveries."""
        self.paused = True
        for sub in self.subscriptions.values():
            sub.paused = True

    def resume(self) -> None:
        """The transport can take data again: deliver what is waiting."""
        self.paused = False
        for sub in list(self.subscriptions.values()):
            sub.paused = False
            if sub.queue is not None:
                sub.queue.drain()
            elif sub.backlog:
                sub.drain_backlog()

    def connection_lost(self) -> None:
        """The connection is gone: undo what the session held (once)."""
        if self._released:
            return
        self._released = True
        self.closed = True
        self._out.clear()
        self._stop_timers()
        self.transactions.clear()
        for sub in list(self.subscriptions.values()):
            self._drop_subscription(sub)
        self.subscriptions.clear()
        self.ack_owner.clear()
        vhost = self.vhost
        for queue in self.temp_queues.values():
            vhost.delete_queue(queue.name)
        self.temp_queues.clear()

    def error(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """Send an ERROR frame and close the connection."""
        if self.closed:
            return
        headers = [("message", message.replace("\n", " ")), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        if self.connected and self.version != "1.0":
            headers.append(("version", self.version))
        self.write_frame(encode_frame("ERROR", headers, (detail or message).encode(), self.version))
        self.flush()
        self.closed = True
        self._stop_timers()
        # Give back subscriptions and unacked messages now: until the
        # transport reports the connection lost, deliveries would be dropped.
        self.connection_lost()
        log.info(
            "stomp error session={session} peer={peer} message={message!r}",
            session=self.id,
            peer=self.peer,
            message=message,
        )
        self.transport.close(message)

    def shutdown(self, reason: str = "broker shutting down") -> None:
        """Tell the client the broker is going away, then close."""
        self.error(reason, "The broker is shutting down; reconnect later.")

    # -- heart-beats -------------------------------------------------------------

    def _start_heartbeats(self, send_ms: int, recv_ms: int) -> None:
        if send_ms:
            # Ticking at half the interval keeps every gap under the interval.
            self._send_loop = LoopingCall(self._send_tick)
            self._send_loop.clock = self.clock
            self._send_loop.start(send_ms / 2000.0, now=False)
        if recv_ms:
            # Checked every half interval: a client is closed between
            # grace x interval and (grace + 0.5) x interval after its last byte.
            self._recv_deadline = recv_ms * self.settings.heartbeat_grace / 1000.0
            self._recv_loop = LoopingCall(self._recv_tick)
            self._recv_loop.clock = self.clock
            self._recv_loop.start(recv_ms / 2000.0, now=False)

    def _send_tick(self) -> None:
        if not self._wrote_flag and not self._out:
            self.write_frame(b"\n")
        self._wrote_flag = False

    def _recv_tick(self) -> None:
        if self._seconds() - self.last_read >= self._recv_deadline:
            self.error(
                "heart-beat timeout",
                "No data or heart-beat from the client within the agreed interval.",
            )

    def _stop_timers(self) -> None:
        for loop in (self._send_loop, self._recv_loop):
            if loop is not None and loop.running:
                loop.stop()
        self._send_loop = self._recv_loop = None
        timer = self._connect_timer
        if timer is not None:
            self._connect_timer = None
            if timer.active():
                timer.cancel()

    def _connect_timeout(self) -> None:
        self._connect_timer = None
        if not self.connected:
            self.error("connect timeout", "No CONNECT frame within the allowed time.")

    # -- helpers --------------------------------------------------------------------

    def _require(self, frame: Frame, name: str) -> str:
        value = frame.headers.get(name)
        if value is None:
            raise StompError(
                f"missing header {name!r}",
                f"A {frame.command} frame must carry the {name!r} header.",
            )
        return value

    def _receipt(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._send_receipt(receipt)

    def _send_receipt(self, receipt: str, extra: list[tuple[str, str]] | None = None) -> None:
        if extra is None:
            if "\\" in receipt or ":" in receipt or "\n" in receipt or "\r" in receipt:
                receipt = escape_header(receipt, self.version)
            self.write_frame(b"RECEIPT\nreceipt-id:%s\n\n\x00" % receipt.encode())
        else:
            self.write_frame(
                encode_frame("RECEIPT", [("receipt-id", receipt), *extra], b"", self.version)
            )

    def _parse_destination(self, text: str):
        try:
            return parse_destination(text)
        except DestinationError as e:
            raise StompError("unknown destination", str(e)) from None

    def _named_queue(self, name: str) -> Queue:
        """The queue a /queue/NAME destination names, created on first use.

        Names starting with C{amq.} are the broker's own (private topic
        queues, temp queues): they are never created on demand, so a reply to
        a requester that has gone away is refused instead of leaving a stray
        queue behind.
        """
        if name.startswith("amq."):
            queue = self.vhost.queues.get(name)
            if queue is None:
                raise StompError(
                    "no such queue",
                    f"Queue {name!r} does not exist; names starting with 'amq.' are reserved "
                    "for the broker and are not created on demand (its owner may have gone).",
                )
            return queue
        return self.vhost.declare_queue(name)

    def _temp_queue(self, name: str) -> Queue:
        queue = self.temp_queues.get(name)
        if queue is None or queue.deleted:
            queue = self.vhost.declare_queue(
                f"amq.tmp.{self._token}.{name}",
                durable=False,
                auto_delete=False,
                exclusive_owner=self,
            )
            self.temp_queues[name] = queue
        return queue

    # -- CONNECT ----------------------------------------------------------------------

    def stomp_CONNECT(self, frame: Frame) -> None:
        if self.connected:
            raise StompError("already connected", "CONNECT may be sent only once.")
        h = frame.headers
        accept = h.get("accept-version")
        if accept is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accept.split(",")}
            version = next((v for v in VERSIONS if v in offered), None)
            if version is None:
                self.write_frame(
                    encode_frame(
                        "ERROR",
                        [
                            ("version", ",".join(reversed(VERSIONS))),
                            ("message", "unsupported protocol version"),
                            ("content-type", "text/plain"),
                        ],
                        f"Supported protocol versions are {', '.join(reversed(VERSIONS))}; "
                        f"the client accepts {accept}.".encode(),
                        "1.0",
                    )
                )
                self.flush()
                self.closed = True
                self._stop_timers()
                self.transport.close("unsupported protocol version")
                return
        host = h.get("host")
        vhost = self.broker.vhost(host) if host else None
        if vhost is None:
            if host and self.settings.strict_vhost:
                raise StompError("unknown virtual host", f"There is no virtual host {host!r}.")
            vhost = self.broker.default_vhost
        cx = cy = 0
        beat = h.get("heart-beat")
        if beat is not None and version != "1.0":
            try:
                cx_s, cy_s = beat.split(",")
                cx, cy = int(cx_s), int(cy_s)
                if cx < 0 or cy < 0:
                    raise ValueError
            except ValueError:
                raise StompError(
                    "invalid heart-beat header",
                    f"heart-beat must be two non-negative integers 'cx,cy', got {beat!r}.",
                ) from None
        settings = self.settings
        sx = settings.heartbeat_send_ms if self.heartbeats_supported else 0
        sy = settings.heartbeat_receive_ms if self.heartbeats_supported else 0
        send_ms = max(sx, cy) if (sx and cy) else 0
        recv_ms = max(sy, cx) if (sy and cx) else 0
        self.version = version
        self.version_index = _VERSION_INDEX[version]
        self.vhost = vhost
        self.login = h.get("login")
        self.client_id = h.get("client-id")
        self.connected = True
        if self._connect_timer is not None and self._connect_timer.active():
            self._connect_timer.cancel()
        self._connect_timer = None
        headers = [("session", self.id), ("server", f"QMQ/{__version__}")]
        if version != "1.0":
            headers[:0] = [("version", version)]
            headers.append(("heart-beat", f"{sx},{sy}"))
        self.write_frame(encode_frame("CONNECTED", headers, b"", version))
        self._start_heartbeats(send_ms, recv_ms)
        log.info(
            "stomp connect session={session} peer={peer} version={version} vhost={vhost} "
            "login={login} heart-beat={send}/{recv}",
            session=self.id,
            peer=self.peer,
            version=version,
            vhost=vhost.name,
            login=self.login,
            send=send_ms,
            recv=recv_ms,
        )

    # -- SEND ----------------------------------------------------------------------------

    def stomp_SEND(self, frame: Frame) -> None:
        h = frame.headers
        if "destination" not in h:
            self._require(frame, "destination")
        receipt = h.get("receipt")
        if "transaction" in h:
            self._transaction(h["transaction"]).append(("SEND", frame))
            self._check_send(frame)
        else:
            try:
                control = self._publish(frame)
            except (StompError, BrokerError) as e:
                e.receipt = receipt  # type: ignore[union-attr]
                raise
            if control is not None:
                if receipt is not None:
                    self._send_receipt(receipt, control)
                return
        if receipt is not None:
            self._send_receipt(receipt)

    def _check_send(self, frame: Frame) -> None:
        """Validate a transactional SEND now so errors are not deferred to COMMIT."""
        dest = self._parse_destination(frame.headers["destination"])
        if dest.kind == "control":
            raise StompError("invalid transaction", "Control destinations cannot be transactional.")
        if dest.kind == "exchange":
            self.vhost.exchange(dest.name)

    def _send_target(self, text: str) -> tuple:
        """Resolve a SEND destination.

        @return: (queue or None, exchange or None, exchange name, routing key,
            the queue or exchange whose C{deleted} flag invalidates the
            session's cached resolution; None for a control destination).
        """
        dest = self._parse_destination(text)
        vhost = self.vhost
        kind = dest.kind
        if kind == "queue":
            # Publishing to an existing queue is allowed even if it is
            # exclusive to another session (a /temp-queue/ reply-to).
            queue = vhost.queues.get(dest.name)
            if queue is None:
                queue = self._named_queue(dest.name)
            return (queue, None, "", dest.name, queue)
        if kind == "temp-queue":
            queue = self._temp_queue(dest.name)
            return (queue, None, "", queue.name, queue)
        if kind == "control":
            return (None, None, None, dest.name, None)
        exchange = vhost.exchange(dest.name)
        return (None, exchange, exchange.name, dest.key, exchange)

    def _publish(self, frame: Frame) -> list[tuple[str, str]] | None:
        """Publish a SEND frame; return the RECEIPT headers if it was a control destination.

        The frame's headers become the message's headers (less the ones that
        describe the frame), and the raw header block the parser kept becomes
        the MESSAGE header block as is, so relaying costs no re-encoding.
        """
        h = frame.headers
        text = h["destination"]
        target = self._send_cache.get(text)
        if target is None or target[4].deleted:
            target = self._send_target(text)
            if target[4] is None:
                return self._control(target[3])
            if len(self._send_cache) > 1000:
                self._send_cache.clear()
            self._send_cache[text] = target
        queue, exchange, exchange_name, key, _ = target
        raw = frame.raw
        persistent = False
        unique = False
        if len(h) > 1:
            if "receipt" in h:
                del h["receipt"]
                unique = True
            if "transaction" in h:
                del h["transaction"]
                unique = True
            if "content-length" in h:
                del h["content-length"]
            if "reply-to" in h:
                reply_to = h["reply-to"]
                if reply_to.startswith("/temp-queue/"):
                    h["reply-to"] = self._reply_to(reply_to)
                    raw = None
            persistent = h.get("persistent") == "true"
        message = Message(
            next(self._message_ids),
            exchange_name,
            key,
            h if len(h) > 1 else None,  # None rather than a dict of the destination alone
            frame.body,
            self._seconds(),
            persistent,
        )
        if raw is None:
            encode_message_headers(message, text)
        else:
            # Producers repeat the same header block; the parser hands back
            # the same bytes object for it, so this lookup is cheap.
            if unique:
                # A receipt or transaction line makes the block unique to
                # this frame: strip it when (if ever) the message is
                # delivered, not now (see _block_for_version).
                message.cache = (raw,)
            else:
                block = self._blocks.get(raw)
                if block is None:
                    block = self._relay_block(raw, message, text)
                message.cache = block
        if queue is not None:
            queue.publish(message)
        else:
            for q in exchange.route(key, h):
                q.publish(message)
        return None

    def _relay_block(self, raw: bytes, message: Message, destination: str) -> bytes | tuple:
        """The MESSAGE header block for a SEND's raw header lines, cached
        per raw block (a producer repeats its header block)."""
        block = relay_block(raw, message, destination)
        if block.__class__ is tuple:
            return block  # re-encoded: depends on the message, not cached
        blocks = self._blocks
        if len(blocks) >= 256:
            blocks.clear()
        blocks[raw] = block
        return block

    def _reply_to(self, text: str) -> str:
        """Rewrite a /temp-queue/ reply-to so the replier reaches this session."""
        name = text[12:]
        if not name:
            raise StompError("unknown destination", "A /temp-queue/ destination needs a name.")
        queue = self._temp_queue(name)
        if text not in self.subscriptions:
            # As RabbitMQ does: replies arrive without an explicit SUBSCRIBE,
            # on a subscription named after the temp-queue destination.
            sub = Subscription(self, text, text, "auto", None, private=False)
            self.subscriptions[text] = sub
            queue.add_consumer(sub)
        return "/queue/" + queue.name

    def _control(self, path: str) -> list[tuple[str, str]]:
        """Answer an ocamlmq control destination (counts go into the RECEIPT)."""
        vhost = self.vhost
        if path.startswith("count-msgs/queue/"):
            queue = vhost.queues.get(path[17:])
            return [("num-messages", str(len(queue) if queue is not None else 0))]
        if path.startswith("count-subscribers/queue/"):
            queue = vhost.queues.get(path[24:])
            return [("num-subscribers", str(len(queue.consumers) if queue is not None else 0))]
        if path.startswith("count-subscribers/topic/"):
            targets = vhost.exchange("amq.topic").route(path[24:], None)
            # Queues count their consumers; a live subscription counts one.
            count = sum(len(t.consumers) if isinstance(t, Queue) else 1 for t in targets)
            return [("num-subscribers", str(count))]
        raise StompError(
            "unknown control destination",
            f"Unknown control destination '/control/{path}'; QMQ answers "
            "/control/count-msgs/queue/NAME, /control/count-subscribers/queue/NAME and "
            "/control/count-subscribers/topic/NAME.",
        )

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------

    def stomp_SUBSCRIBE(self, frame: Frame) -> None:
        h = frame.headers
        text = self._require(frame, "destination")
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                self._require(frame, "id")
            sub_id = text
        if sub_id in self.subscriptions:
            raise StompError(
                "duplicate subscription id", f"Subscription id {sub_id!r} is already in use."
            )
        mode = h.get("ack", "auto")
        if mode not in ACK_MODES:
            raise StompError(
                "invalid ack mode", f"ack must be one of {', '.join(ACK_MODES)}, got {mode!r}."
            )
        prefetch = self._prefetch(h) if mode != "auto" else None
        if mode == "auto" and self._durable_name(h, sub_id) is None:
            dest = self._parse_destination(text)
            if dest.kind in ("topic", "exchange"):
                self._live_subscription(frame, text, sub_id, dest.name, dest.key)
                return
        queue, private, durable = self._subscription_queue(frame, text, sub_id)
        if queue.exclusive_owner is not None and queue.exclusive_owner is not self:
            raise StompError("access refused", f"Queue {queue.name!r} belongs to another session.")
        sub = Subscription(self, sub_id, text, mode, prefetch, private)
        sub.durable = durable
        self.subscriptions[sub_id] = sub
        self._receipt(frame)
        queue.add_consumer(sub)

    def _live_subscription(
        self, frame: Frame, text: str, sub_id: str, exchange_name: str, key: str
    ) -> None:
        """An C{ack:auto}, non-durable topic or exchange subscription.

        Nothing is ever acknowledged or redelivered on it and nothing of it
        outlives the subscription, so instead of a private queue bound to the
        exchange it is bound to the exchange itself, as a live consumer (see
        L{Subscription.publish}): a few hundred bytes per subscription, so a
        million of them fit.
        """
        exchange = self.vhost.exchange(exchange_name)
        sub = Subscription(self, sub_id, text, "auto", None, private=False)
        self.subscriptions[sub_id] = sub
        self._receipt(frame)
        exchange.bind(sub, key, None)  # type: ignore[arg-type]
        sub.exchange = exchange

    def _prefetch(self, h: dict[str, str]) -> int | None:
        for name in PREFETCH_HEADERS:
            value = h.get(name)
            if value is not None:
                try:
                    n = int(value)
                    if n < 0:
                        raise ValueError
                except ValueError:
                    raise StompError(
                        f"invalid {name} header",
                        f"{name} must be a non-negative integer, got {value!r}.",
                    ) from None
                return n or None
        return self.settings.default_prefetch

    def _subscription_queue(
        self, frame: Frame, text: str, sub_id: str
    ) -> tuple[Queue, bool, bool]:
        """The queue a SUBSCRIBE consumes from, whether it is private to the
        subscription, and whether it is a durable topic subscription's."""
        dest = self._parse_destination(text)
        vhost = self.vhost
        kind = dest.kind
        if kind == "queue":
            return self._named_queue(dest.name), False, False
        if kind == "temp-queue":
            return self._temp_queue(dest.name), False, False
        if kind == "control":
            raise StompError(
                "cannot subscribe to a control destination",
                "Control destinations answer a SEND with a receipt; they cannot be subscribed to.",
            )
        exchange = vhost.exchange(dest.name)
        h = frame.headers
        durable_name = self._durable_name(h, sub_id)
        if durable_name is not None:
            owner = self.client_id or self.login or ""
            name = f"durable.{owner}.{durable_name}"
            queue = vhost.declare_queue(name, durable=True)
            vhost.bind(name, exchange.name, dest.key)
            return queue, False, True
        name = f"amq.sub.{self._token}.{sub_id}"
        queue = vhost.declare_queue(name, durable=False, auto_delete=True, exclusive_owner=self)
        backlog = self.settings.topic_backlog
        if backlog:
            # Bounded like x-max-length + drop-head, without an arguments
            # dict per subscription.
            queue.max_length = backlog
            queue.overflow = "drop-head"
        vhost.bind(name, exchange.name, dest.key)
        return queue, True, False

    @staticmethod
    def _durable_name(h: dict[str, str], sub_id: str) -> str | None:
        for name in DURABLE_NAME_HEADERS:
            value = h.get(name)
            if value:
                return value
        if h.get("durable") == "true" or h.get("persistent") == "true":
            return sub_id
        return None

    def stomp_UNSUBSCRIBE(self, frame: Frame) -> None:
        h = frame.headers
        sub_id = h.get("id")
        if sub_id is None:
            if self.version == "1.0" and "destination" in h:
                sub_id = h["destination"]
            else:
                self._require(frame, "id")
        sub = self.subscriptions.pop(sub_id, None)  # type: ignore[arg-type]
        if sub is None:
            raise StompError("unknown subscription", f"There is no subscription {sub_id!r}.")
        queue = sub.queue
        self._drop_subscription(sub)
        if (
            queue is not None
            and sub.durable
            and self._durable_name(h, sub_id) is not None  # type: ignore[arg-type]
        ):
            self.vhost.delete_queue(queue.name)
        self._receipt(frame)

    def _drop_subscription(self, sub: Subscription) -> None:
        exchange = sub.exchange
        if exchange is not None:
            sub.exchange = None
            sub.backlog = None
            exchange.unbind(sub, parse_destination(sub.destination).key, None)  # type: ignore[arg-type]
            self.vhost.maybe_auto_delete_exchange(exchange)
            return
        unacked = self._forget_unacked(sub)
        queue = sub.queue
        if queue is not None:
            queue.remove_consumer(sub, unacked)
            if sub.private and not queue.deleted:
                self.vhost.delete_queue(queue.name)

    def subscription_cancelled(self, sub: Subscription) -> None:
        """The queue under C{sub} was deleted by someone else."""
        if self.subscriptions.get(sub.id) is sub:
            del self.subscriptions[sub.id]
        self._forget_unacked(sub)

    def _forget_unacked(self, sub: Subscription) -> list[Message]:
        """Stop tracking C{sub}'s unacknowledged deliveries; return their messages."""
        for tag in sub.unacked:
            self.ack_owner.pop(tag, None)
        unacked = list(sub.unacked.values())
        if unacked:
            sub.unacked.clear()
        return unacked

    # -- ACK / NACK ------------------------------------------------------------------

    def _ack_target(self, frame: Frame) -> tuple[Subscription | None, int]:
        h = frame.headers
        name = "id" if self.version == "1.2" else "message-id"
        ack_id = h.get(name)
        if ack_id is None:
            ack_id = h.get("message-id") if name == "id" else h.get("id")
            if ack_id is None:
                self._require(frame, name)
        prefix = self._msgid_prefix
        sub = None
        tag = 0
        if ack_id.startswith(prefix):  # type: ignore[union-attr]
            try:
                tag = int(ack_id[len(prefix) :])  # type: ignore[index]
            except ValueError:
                tag = 0
            sub = self.ack_owner.get(tag)
            if sub is None and 0 < tag <= self._cumulative_upto:
                return None, tag  # already covered by a cumulative (ack:client) ACK
        if sub is None:
            raise StompError(
                "unknown message",
                f"{frame.command} of {ack_id!r}: no such message is waiting for an "
                "acknowledgement on this connection.",
            )
        return sub, tag

    def stomp_ACK(self, frame: Frame) -> None:
        sub, tag = self._ack_target(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._transaction(tx).append(("ACK", frame))
        else:
            self._settle(sub, tag, True, True)
        if "receipt" in frame.headers:
            self._receipt(frame)

    def stomp_NACK(self, frame: Frame) -> None:
        sub, tag = self._ack_target(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._transaction(tx).append(("NACK", frame))
        else:
            self._settle(sub, tag, False, frame.headers.get("requeue", "true") != "false")
        self._receipt(frame)

    def _settle(self, sub: Subscription | None, tag: int, ack: bool, requeue: bool) -> None:
        if sub is None:
            return
        unacked = sub.unacked
        ack_owner = self.ack_owner
        if sub.mode == "client":
            # Cumulative: everything delivered on the subscription up to tag.
            if tag > self._cumulative_upto:
                self._cumulative_upto = tag
            done = []
            for t in list(unacked):
                if t > tag:
                    break
                done.append(unacked.pop(t))
                ack_owner.pop(t, None)
        else:
            message = unacked.pop(tag, None)
            ack_owner.pop(tag, None)
            if message is None:
                return
            done = [message]
        queue = sub.queue
        if queue is None or not done:
            return
        if ack:
            if len(done) == 1:
                queue.ack(sub, done[0])
            else:
                for m in done:
                    queue.ack(sub, m)
        else:
            queue.reject(sub, done, requeue)

    # -- transactions ----------------------------------------------------------------

    def _transaction(self, name: str) -> list[tuple[str, Frame]]:
        ops = self.transactions.get(name)
        if ops is None:
            raise StompError("unknown transaction", f"Transaction {name!r} was not begun.")
        return ops

    def stomp_BEGIN(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        if name in self.transactions:
            raise StompError("transaction already begun", f"Transaction {name!r} is already open.")
        self.transactions[name] = []
        self._receipt(frame)

    def stomp_COMMIT(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        ops = self._transaction(name)
        del self.transactions[name]
        for kind, op in ops:
            if kind == "SEND":
                self._publish(op)
            else:
                try:
                    sub, tag = self._ack_target(op)
                except StompError:
                    continue  # already settled (e.g. its subscription ended)
                if kind == "ACK":
                    self._settle(sub, tag, True, True)
                else:
                    self._settle(sub, tag, False, op.headers.get("requeue", "true") != "false")
        self._receipt(frame)

    def stomp_ABORT(self, frame: Frame) -> None:
        name = self._require(frame, "transaction")
        self._transaction(name)
        del self.transactions[name]
        self._receipt(frame)

    # -- DISCONNECT --------------------------------------------------------------------

    def stomp_DISCONNECT(self, frame: Frame) -> None:
        self._receipt(frame)
        self.flush()
        self.closed = True
        self._stop_timers()
        self.connection_lost()
        self.transport.close("client disconnected")


_HANDLERS: dict[str, Callable[[StompSession, Frame], None]] = {
    "CONNECT": StompSession.stomp_CONNECT,
    "STOMP": StompSession.stomp_CONNECT,
    "SEND": StompSession.stomp_SEND,
    "SUBSCRIBE": StompSession.stomp_SUBSCRIBE,
    "UNSUBSCRIBE": StompSession.stomp_UNSUBSCRIBE,
    "ACK": StompSession.stomp_ACK,
    "NACK": StompSession.stomp_NACK,
    "BEGIN": StompSession.stomp_BEGIN,
    "COMMIT": StompSession.stomp_COMMIT,
    "ABORT": StompSession.stomp_ABORT,
    "DISCONNECT": StompSession.stomp_DISCONNECT,
}
