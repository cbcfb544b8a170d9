# -*- test-case-name: tests.test_stomp_session -*-
"""The STOMP session: STOMP 1.0/1.1/1.2 semantics over the broker core.

One L{StompSession} serves one client whatever carries it (TCP, TLS, unix
sockets; WebSocket and SockJS next). It sees its connection only through
L{qmq.transport.ITransport}: the transport hands it whole frames
(L{StompSession.frames_received}; a byte-stream transport parses with a
L{qmq.stomp.reader.StompReader}), tells it when its write buffer is full
(L{StompSession.pause}/L{StompSession.resume}) and when the connection is
gone (L{StompSession.connection_lost}); the session writes whole frames back
(C{transport.write_frames}) and closes with a reason (C{transport.close}).

Everything the session does to the broker goes through its
L{qmq.stomp.destinations.DestinationChannel} (the core's channel with STOMP's
destination names), opened at CONNECT: destinations, publish,
subscribe, ack. The session itself owns only STOMP: frames, headers,
versions, heart-beats, transactions, receipts and errors.

This module keeps the per-message paths whole (SEND, MESSAGE, ACK/NACK,
SUBSCRIBE, the receipt funnel); the parts that run once per connection or
only for some clients are mixed in from beside it:
L{qmq.stomp.connect.ConnectMixin} (CONNECT, login, heart-beats and
deadlines) and L{qmq.stomp.transactions.TransactionsMixin} (BEGIN, COMMIT,
ABORT). L{qmq.stomp.errors.StompError} is what every handler raises.

Flow of a frame::

    Frame -> stomp_<COMMAND> handler -> Channel call -> core
    core delivery -> Subscription.deliver -> MESSAGE bytes -> out buffer
    end of the reactor turn (WriteBatcher) -> transport.write_frames(all buffered)

B{Receipts} go through one funnel (L{StompSession._reply}): a RECEIPT that
must wait until its message is durable (the core returned a Deferred) waits,
and every later reply waits behind it, so a client always sees receipts in
the order of its frames (RabbitMQ's STOMP adapter keeps pending receipts
the same way).

Any protocol error produces an ERROR frame (with a C{message} header, an
explanatory body and the offending frame's C{receipt-id} when it had one),
then the connection is closed; nothing else the broker serves is affected.
Receipts still waiting for the store are then not sent (their messages are
kept; a client that resends gets a duplicate, never a loss).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq.core import options
from qmq.core.broker import Broker
from qmq.core.consumer import SubscriberBuffer
from qmq.core.errors import BrokerError
from qmq.core.message import check_user_id
from qmq.core.options import OptionError
from qmq.core.ownership import escape_name
from qmq.core.policy import QUEUE_ARGUMENTS, argument_name
from qmq.core.remote import home_of
from qmq.core.vhost import VirtualHost
from qmq.stomp.connect import ConnectMixin
from qmq.stomp.destinations import DestinationChannel, parse_destination
from qmq.stomp.encoding import (
    destination_line,
    encode_message_headers,
    relay_block,
    split_headers,
    with_expiry,
)
from qmq.stomp.errors import StompError
from qmq.stomp.frame import Frame, FrameError, encode_frame, escape_header, excerpt
from qmq.stomp.headers import HeaderError, parse_bool, parse_int
from qmq.stomp.settings import StompSettings
from qmq.stomp.subscription import Subscription, TextSubscription
from qmq.stomp.transactions import TransactionsMixin
from qmq.stream import BatchedOutput
from qmq.transport import ITransport

log = Logger()

ACK_MODES = ("auto", "client", "client-individual")
PREFETCH_HEADERS = ("prefetch-count", "activemq.prefetchSize", "prefetch")
# Headers whose value names a durable subscription on their own (ActiveMQ);
# RabbitMQ's x-queue-name names it when durable:true or persistent:true
# makes it durable (alone it would name a non-durable queue, whose name QMQ
# chooses itself).
DURABLE_NAME_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")
DURABLE_FLAG_HEADERS = ("durable", "persistent")
# Flush a connection's buffer early once it holds this much, so one turn
# never piles up more than about this per connection before back-pressure.
FLUSH_THRESHOLD = 128 * 1024
# A read of many receipted SENDs sends its receipts this many at a time, not
# all at the end of the read: the client can send its next frames while the
# rest of the read is processed (a windowed producer otherwise waits for the
# whole read, and the broker then waits for it: lock-step).
RECEIPT_BATCH = 32
_session_ids = itertools.count(1)
# Frames a client may send after CONNECT before it is answered.
_MAX_HELD_FRAMES = 1000
# The cache of relayed SEND header blocks (see _publish): producers repeat a
# few blocks; these bounds keep a hostile one from pinning megabytes.
_CACHED_BLOCKS = 64
_CACHED_BLOCK_SIZE = 2048
# No raw block (Frame.raw is a bytes object or None, never this).
_NO_RAW = object()
#: SEND headers that set how a message is delivered (see _delivery_options).
ACK_TIMEOUT_HEADER = "ack-timeout"
_TIMING_HEADERS = frozenset(("expires", "ttl", "delay", "deliver-at", ACK_TIMEOUT_HEADER))
_DELIVERY_HEADERS = _TIMING_HEADERS | {"priority"}


def _header_error(e: OptionError) -> HeaderError:
    """The STOMP error for a delivery option the core refused (the option's
    name is its header's)."""
    return HeaderError(f"invalid {e.option} header", f"The {e.describe(e.option + ' header')}.")


#: SUBSCRIBE headers that are queue arguments without their x- prefix; the
#: others (expires, ack-timeout) mean something else on a SEND, so on a
#: SUBSCRIBE only their x- spelling is read.
_SUBSCRIBE_ARGUMENTS = frozenset(
    [*QUEUE_ARGUMENTS, *(name[2:] for name in QUEUE_ARGUMENTS)]
) - {"expires", "ack-timeout"}



class _Counted:
    """A control destination's answer that another node gives: a Deferred
    of the RECEIPT's headers (L{StompSession._send_counted})."""

    __slots__ = ("answer",)

    def __init__(self, answer: Any) -> None:
        self.answer = answer

class StompSession(ConnectMixin, TransactionsMixin, BatchedOutput):
    """One client's STOMP session (see the module docstring).

    @ivar id: the session id, C{NODE.RUN.N} (L{qmq.core.ids}; also the
        prefix of every message-id it sends).
    @ivar version: the negotiated STOMP version.
    @ivar vhost: the virtual host chosen at CONNECT.
    @ivar channel: the session's way into the core (from CONNECT on).
    @ivar subscriptions: subscription id -> L{Subscription}.
    @ivar last_read: clock time of the last byte received (set by the
        transport's reader); heart-beat and idle deadlines count from it.
    @ivar frame_started: clock time at which the frame still being received
        began, or None (set by the reader).
    """

    # Slots for what __init__ sets (see qmq.core.channel.Channel's): one
    # session per connection, with more than 30 attributes. The mixins give
    # it a __dict__ for anything else.
    __slots__ = (
        'broker', 'settings', 'clock', 'transport', 'heartbeats_supported', '_subscription',
        'peer', 'id', 'version', 'version_index', 'vhost', 'channel', 'connected', 'closed',
        'paused', 'login', 'user', '_held', '_expiry', 'client_id', '_released',
        'subscriptions', 'transactions', '_transaction_frames', '_transaction_bytes',
        '_out', '_out_size', '_batcher', '_threshold', 'wrote', '_blocks', '_last_send',
        '_fast_raw', '_last_expiry', '_seconds', '_msgid_prefix', '_waiting', '_group',
        '_group_waiter', '_disconnecting', '_admission', '_blocked', '_blocked_persistent',
        'last_read', 'frame_started', 'unfinished', '_recv_deadline', '_send_loop',
        '_recv_loop', '_watch_loop', '_connect_timer'
    )

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
        # A transport that carries text only (SockJS) gets subscriptions
        # that refuse bodies that are not UTF-8 (see TextSubscription).
        self._subscription = (
            TextSubscription if getattr(transport, "text_only", False) else Subscription
        )
        self.peer = transport.peer
        # NODE.RUN.N: a session id (and so every message-id it sends) never
        # names another session of this or another node, in this run or a
        # later one (qmq.core.ids), so a stale ack can settle nothing.
        self.id = f"{broker.message_ids.prefix}.{next(_session_ids):x}"
        self.version = "1.0"
        self.version_index = 2
        self.vhost: VirtualHost = broker.default_vhost
        self.channel: DestinationChannel | None = None
        self.connected = False
        self.closed = False
        self.paused = False
        self.login: str | None = None
        #: The authenticated user (L{qmq.auth.User}), or None (authentication off).
        self.user: Any = None
        # Frames that arrived while CONNECT's credentials are being checked
        # (reading is paused meanwhile); None when not authenticating.
        self._held: list[Frame] | None = None
        self._expiry: Any = None
        self.client_id: str | None = None
        self._released = False
        self.subscriptions: dict[str, Subscription] = {}
        self.transactions: dict[str, list[tuple[str, Frame]]] = {}
        self._transaction_frames = 0
        self._transaction_bytes = 0
        self.init_output(broker.batcher, FLUSH_THRESHOLD)
        self._blocks: dict[bytes, bytes] = {}
        # The last SEND's header block (if it may be relayed as is), its
        # headers less the frame's own, and what they make (see _publish).
        self._last_send: tuple = (None, None, False, None, None, None, None)
        # The raw block of _last_send when stomp_SEND may publish it inline.
        self._fast_raw: Any = _NO_RAW
        # The last relayed block given an expires line: (block, expiry in
        # epoch ms, block with the line).
        self._last_expiry: tuple = (None, 0, None)
        self._seconds = self.clock.seconds
        self._msgid_prefix = self.id + "-"
        self._waiting: deque[list] | None = None
        self._group: list | None = None
        self._group_waiter: Any = None
        self._disconnecting = False
        self._admission = broker.admission
        self._blocked = False
        self._blocked_persistent = False
        self.last_read = self._seconds()
        self.frame_started: float | None = None
        #: Bytes of the frame still being received (counted in the broker's budget).
        self.unfinished = 0
        self._recv_deadline = 0.0
        self._send_loop: LoopingCall | None = None
        self._recv_loop: LoopingCall | None = None
        self._watch_loop: LoopingCall | None = None
        self._connect_timer = None
        if settings.connect_timeout:
            self._connect_timer = self.clock.callLater(settings.connect_timeout, self._connect_timeout)
        watch = self._watch_interval()
        if watch:
            self._watch_loop = LoopingCall(self._watch)
            self._watch_loop.clock = self.clock
            self._watch_loop.start(watch, now=False)

    # -- transport side -------------------------------------------------------

    def frames_received(self, frames: list[Frame]) -> None:
        """Whole frames from the client (from a L{StompReader} or a
        message-framed transport): act on each, in order."""
        if self.closed or self._disconnecting:
            return
        batcher = self._batcher
        batcher.hold()
        try:
            handlers = _HANDLERS
            for frame in frames:
                if self.closed or self._disconnecting:
                    return
                handler = handlers.get(frame.command) if self.connected else None
                if handler is None:
                    self._handle(frame)
                    continue
                try:
                    handler(self, frame)
                except (StompError, BrokerError) as e:
                    self._failed(frame, e)
                except HeaderError as e:
                    self._failed(frame, StompError(e.message, e.detail))
        except Exception:
            log.failure("internal error in STOMP session {session}", session=self.id)
            self.error("internal error", "The broker failed to process a frame; see its log.")
        finally:
            batcher.release()

    def frame_error(self, e: FrameError) -> None:
        """The client's bytes are not STOMP (or break a limit): ERROR and close."""
        self.error(e.message, e.detail)

    def frame_progress(self, pending: int, new_frame: bool = False) -> None:
        """The reader holds C{pending} bytes of an unfinished frame (0: none).

        C{new_frame}: a frame was completed by this read, so the pending
        bytes belong to a frame that started in it (a busy publisher's reads
        seldom end on a frame boundary: its deadline must not carry over).

        Starts the frame's deadline (L{_watch}) and keeps the broker-wide
        count of unfinished-frame bytes, so many clients each holding a
        large half-sent body cannot together exhaust memory: the one that
        crosses C{limits.max_unfinished_bytes} is refused.
        """
        broker = self.broker
        broker.unfinished_bytes += pending - self.unfinished
        grew = pending > self.unfinished
        self.unfinished = pending
        if not pending:
            self.frame_started = None
            return
        if new_frame or self.frame_started is None:
            self.frame_started = self._seconds()
        limit = broker.max_unfinished_bytes
        if grew and limit and broker.unfinished_bytes > limit:
            self.error(
                "broker busy",
                "Too many bytes of unfinished frames are held across all connections "
                f"(limits.max_unfinished_bytes = {limit}); send smaller frames or retry later.",
            )

    def _failed(self, frame: Frame, e: StompError | BrokerError) -> None:
        """Answer a failed frame with an ERROR (carrying its receipt-id) and close."""
        receipt = getattr(e, "receipt", None) or frame.headers.get("receipt")
        if isinstance(e, StompError):
            self.error(e.message, e.detail, receipt)
        else:
            self.error(e.short or e.message, e.message, receipt)

    def _handle(self, frame: Frame) -> None:
        """The careful path for one frame: checks, dispatch, errors."""
        held = self._held
        if held is not None:
            # CONNECT's credentials are being checked: later frames wait
            # (reading is paused, so at most what one read brought).
            if len(held) >= _MAX_HELD_FRAMES:
                self.error(
                    "too many frames before CONNECTED",
                    f"At most {_MAX_HELD_FRAMES} frames may follow CONNECT before the broker "
                    "answers it.",
                )
            else:
                held.append(frame)
            return
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
                    f"Unknown STOMP command {excerpt(frame.command, 32)}; expected one of "
                    + ", ".join(sorted(_HANDLERS)),
                )
            handler(self, frame)
        except (StompError, BrokerError) as e:
            self._failed(frame, e)
        except HeaderError as e:
            self._failed(frame, StompError(e.message, e.detail))

    def pause(self) -> None:
        """The transport's write buffer is full: stop deliveries."""
        self.paused = True
        if self.channel is not None:
            self.channel.pause()

    def resume(self) -> None:
        """The transport can take data again: deliver what is waiting."""
        self.paused = False
        if self.channel is not None:
            self.channel.resume()

    def connection_lost(self) -> None:
        """The connection is gone: undo what the session held (once)."""
        if self._released:
            return
        self._released = True
        self.closed = True
        self._out.clear()
        if self.unfinished:
            self.broker.unfinished_bytes -= self.unfinished
            if self.unfinished >= 1 << 20:
                self.broker.release_memory()
            self.unfinished = 0
        self._waiting = None
        self._group = self._group_waiter = None
        self._stop_timers()
        self._unblock()
        self.transactions.clear()
        self.subscriptions.clear()
        if self.channel is not None:
            self.channel.close()

    def error(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """Send an ERROR frame and close the connection."""
        if self.closed:
            return
        headers = [
            ("message", message.replace("\n", " ").replace("\r", " ")),
            ("content-type", "text/plain"),
        ]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        if self.connected and self.version != "1.0":
            headers.append(("version", self.version))
        self.write_frame(encode_frame("ERROR", headers, (detail or message).encode(), self.version))
        self.flush()
        self.closed = True
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

    @property
    def reading_blocked(self) -> bool:
        """Whether the session stopped reading its client (the memory alarm,
        or CONNECT's credentials being checked): a transport that paused
        reading for its own reasons leaves it off."""
        return self._blocked or self._held is not None

    # -- publisher flow control (admission: memory and disk alarms, the store) -----

    def _hold_back(self, headers: dict[str, str]) -> None:
        """Admission holds some publishers back: stop reading from this one
        if its SEND is of a kind held (every SEND under the memory alarm, a
        persistent one under the disk alarm or a failing store), until
        admission lets it through again."""
        persistent = headers.get("persistent", "").lower() == "true"
        hold = self._admission.refusal(persistent)
        if hold is None:
            return
        self._blocked = True
        self._blocked_persistent = persistent
        self.transport.pause_reading()
        self._admission.subscribe(self._admission_changed)
        log.info("stomp publisher held back session={session} peer={peer}: {why}",
                 session=self.id, peer=self.peer, why=hold.detail)

    def _admission_changed(self, admission: Any) -> None:
        if admission.admits(self._blocked_persistent):
            self._unblock()

    def _unblock(self) -> None:
        if self._blocked:
            self._blocked = False
            self._admission.unsubscribe(self._admission_changed)
            if not self.closed:
                # Deadlines restart: the silence was the broker's doing.
                self.last_read = self._seconds()
                if self.frame_started is not None:
                    self.frame_started = self.last_read
                self.transport.resume_reading()

    # -- replies and receipts ----------------------------------------------------

    def _require(self, frame: Frame, name: str) -> str:
        value = frame.headers.get(name)
        if value is None:
            raise StompError(
                f"missing header {name!r}",
                f"A {frame.command} frame must carry the {name!r} header.",
            )
        return value

    def _reply(self, data: bytes, waiter: Any = None) -> None:
        """The receipt funnel: write a reply now, or once C{waiter} fires,
        and always after every reply still waiting.

        Replies wait in C{_waiting} as entries C{[ready, replies]}, in
        order. A store may hand the same waiter to every publish of one
        group commit (L{qmq.core.store.MessageStore.publish}): a reply
        waiting on the waiter the last one waited on joins that entry's
        list while it is the last entry, and one callback writes the whole
        list at once (a Deferred callback, or even a list and a write call,
        per receipt cost more than the rest of a durable publish)."""
        waiting = self._waiting
        if waiter is None:
            if not waiting:
                self.write_frame(data)
                return
            last = waiting[-1]
            if last[0]:
                last[1].append(data)  # behind replies that are ready too
            else:
                waiting.append([True, [data]])
            return
        if waiting is None:
            waiting = self._waiting = deque()
        elif waiter is self._group_waiter:
            group = self._group
            entry = group[-1]  # type: ignore[index]
            if waiting[-1] is entry:
                entry[1].append(data)
                return
            # A reply that did not wait came in between: a new entry,
            # still freed by the same waiter.
            entry = [False, [data]]
            waiting.append(entry)
            group.append(entry)  # type: ignore[union-attr]
            return
        entry = [False, [data]]
        waiting.append(entry)
        group = self._group = [entry]
        self._group_waiter = waiter
        waiter.addCallbacks(self._durable, self._not_durable, callbackArgs=(group,))

    def _durable(self, result: Any, group: list) -> Any:
        # Returns its result unchanged: the waiter may be shared.
        if group is self._group:
            self._group = self._group_waiter = None
        for entry in group:
            entry[0] = True
        waiting = self._waiting
        while waiting and waiting[0][0]:
            self.write_frames(waiting.popleft()[1])
        if not waiting:
            self._waiting = None
            if self._disconnecting:
                self._finish_disconnect()
        return result

    def _not_durable(self, failure: Failure) -> Failure:
        self._group = self._group_waiter = None
        if not self.closed:
            log.failure("store failed to keep a message session={session}", failure, session=self.id)
        self.error(
            "message not stored",
            f"The broker could not store a message ({failure.getErrorMessage()}); it is not "
            "accepted: send it again later.",
        )
        # Passed on: the waiter may be shared with other sessions (see
        # qmq.core.store), whose errbacks must see the failure too.
        return failure

    def _receipt(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._send_receipt(receipt)

    def _send_receipt(
        self, receipt: str, extra: list[tuple[str, str]] | None = None, waiter: Any = None
    ) -> None:
        if extra is None:
            if "\\" in receipt or ":" in receipt or "\n" in receipt or "\r" in receipt:
                receipt = escape_header(receipt, self.version)
            data = b"RECEIPT\nreceipt-id:%s\n\n\x00" % receipt.encode()
            # _reply's two common cases, inlined: no reply waiting, and a
            # receipt joining its group commit's list.
            if waiter is None:
                if not self._waiting:
                    out = self._out
                    out.append(data)
                    self._out_size += len(data)
                    n = len(out)
                    if n == 1:
                        self._batcher.want_flush(self)
                    elif n >= RECEIPT_BATCH or self._out_size > FLUSH_THRESHOLD:
                        self.flush()
                    return
            elif waiter is self._group_waiter:
                entry = self._group[-1]  # type: ignore[index]
                waiting = self._waiting
                if waiting and waiting[-1] is entry:
                    entry[1].append(data)
                    return
            self._reply(data, waiter)
        else:
            self._reply(
                encode_frame("RECEIPT", [("receipt-id", receipt), *extra], b"", self.version), waiter
            )

    # -- SEND ----------------------------------------------------------------------------

    def stomp_SEND(self, frame: Frame) -> None:
        h = frame.headers
        if "destination" not in h:
            self._require(frame, "destination")
        if (
            self._admission.closed
            and not self._blocked
            and not h["destination"].startswith("/control/")
        ):
            # This frame was read already and is published; the next are not
            # read until admission lets this publisher through (memory back
            # under the mark, disk space freed, the store writing again). A
            # control query (/control/memory) publishes nothing: a monitor
            # asking about the alarm is not blocked by it.
            self._hold_back(h)
        if frame.raw is self._fast_raw:
            # _publish's commonest case, inlined (a Python call less a
            # message): the header block of the last SEND again (so no
            # receipt, no transaction), with no delivery option and relayed
            # as it is (_publish keeps _fast_raw for such a block only).
            last = self._last_send
            channel = self.channel
            target = channel.send_target(h["destination"])  # type: ignore[union-attr]
            if target[4] is not None:
                message = channel.new_message(target, last[5], frame.body, last[2])  # type: ignore[union-attr]
                properties = last[4]
                if properties is not None:
                    message.properties = properties
                message.cache = last[6]
                channel.publish_target(target, message)  # type: ignore[union-attr]
                return
        receipt = h.get("receipt")
        if "transaction" in h:
            self._hold(h["transaction"], "SEND", frame)
            self._check_send(frame)
            if receipt is not None:
                self._send_receipt(receipt)
            return
        try:
            waiter = self._publish(frame)
        except (StompError, BrokerError) as e:
            e.receipt = receipt  # type: ignore[union-attr]
            raise
        if receipt is not None:
            if waiter.__class__ is list:
                self._send_receipt(receipt, waiter)
            elif waiter.__class__ is _Counted:
                self._send_counted(receipt, waiter.answer)
            else:
                self._send_receipt(receipt, None, waiter)

    def _send_counted(self, receipt: str, answer: Any) -> None:
        """A control destination's RECEIPT whose headers another node
        answers (a count of a queue homed there): in its place among the
        replies, once it came; the home unreachable is an ERROR."""
        if answer.called:
            result: list = []
            answer.addBoth(result.append)
            if isinstance(result[0], Failure):
                self._counted_failed(result[0], receipt)
            else:
                self._send_receipt(receipt, result[0])
            return
        placeholder = bytearray()  # a unique object in the replies, replaced by the frame
        entry: list = []

        def fill(headers: list[tuple[str, str]]) -> None:
            self._replace(entry, placeholder,
                          encode_frame("RECEIPT", [("receipt-id", receipt), *headers], b"", self.version))

        def failed(failure: Failure) -> None:
            self._replace(entry, placeholder, b"")
            self._counted_failed(failure, receipt)

        answer.addCallbacks(fill, failed)
        self._reply(placeholder, answer)  # type: ignore[arg-type]
        entry.append(self._waiting[-1])  # type: ignore[index]

    @staticmethod
    def _replace(entry: list, placeholder: bytearray, data: bytes) -> None:
        frames = entry[0][1]
        for i, frame in enumerate(frames):
            if frame is placeholder:
                frames[i] = data
                return

    def _counted_failed(self, failure: Failure, receipt: str) -> None:
        if failure.check(BrokerError):
            self.error(failure.value.short or failure.value.message, failure.value.message, receipt)
        else:
            log.failure("a count from another node failed session={session}", failure, session=self.id)
            self.error("internal error", "The broker failed to count; see its log.", receipt)

    def _check_send(self, frame: Frame) -> None:
        """Validate a transactional SEND now so errors are not deferred to COMMIT."""
        if not _DELIVERY_HEADERS.isdisjoint(frame.headers):
            self._delivery_options(dict(frame.headers))
        dest = parse_destination(frame.headers["destination"])
        if dest.kind == "control":
            raise StompError("invalid transaction", "Control destinations cannot be transactional.")
        if dest.kind == "exchange":
            self.vhost.exchange(dest.name)

    def _publish(self, frame: Frame) -> Any:
        """Publish a SEND frame through the channel.

        @return: None (done), a Deferred (its receipt waits for it), or for
            a control destination the list of RECEIPT headers answering it.

        The frame's headers become the message model (L{split_headers}:
        properties and application headers; the delivery options read by
        the core's parser, L{qmq.core.options.parse}, into the message's
        fields), and the raw header block the parser kept becomes the
        MESSAGE header block (less what the model does not keep as sent:
        L{relay_block}), so relaying costs no re-encoding.

        A producer repeats its headers: what they make (the persistent
        flag, the parsed delivery options, the split into the model, the
        relayed block) is kept for the last SEND's header set, keyed on the
        exact headers left once the frame's own lines are gone (a dict
        compare), or on the very bytes of its header block (an identity
        compare: the parser hands back the same object for a repeated
        block). The message id, its time and every time made from it
        (C{ttl}, C{delay}) are the message's own, made per message.
        """
        channel = self.channel
        assert channel is not None
        h = frame.headers
        target = channel.send_target(h["destination"])
        if target[4] is None:
            answer = channel.control(target[3])
            return answer if answer.__class__ is list else _Counted(answer)
        raw = frame.raw
        last = self._last_send
        unique = False
        if raw is not None and raw is last[0]:
            # The same header block as the last SEND's, which had no
            # receipt, transaction or temp-queue reply-to: the same model.
            _, _, persistent, timing, properties, headers, block = last
        else:
            block = None
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
            if h == last[1]:
                _, _, persistent, timing, properties, headers, _ = last
            else:
                persistent, timing, properties, headers = self._read_send(h, channel.user)
                if raw is None or unique:
                    self._last_send = (None, h, persistent, timing, properties, headers, None)
                    self._fast_raw = _NO_RAW
        message = channel.new_message(target, headers, frame.body, persistent)
        if properties is not None:
            message.properties = properties
        if timing is not None:
            if timing.__class__ is int:
                message.priority = timing
            else:
                message.priority, message.expires, message.deliver_at, message.ack_timeout = timing.at(
                    message.timestamp
                )
        if raw is None:
            encode_message_headers(message)
        elif unique:
            # A receipt or transaction line makes the block unique to this
            # frame: make it when (if ever) the message is delivered, not
            # now (see qmq.stomp.encoding).
            message.cache = (raw,)
        else:
            if block is None:
                # Producers repeat the same header block; the parser hands
                # back the same bytes object for it, so this lookup is cheap.
                block = self._blocks.get(raw)
                if block is None:
                    block = relay_block(raw, destination_line(target[2], target[3])) or b""
                    # Long blocks are not worth keeping (and would let a
                    # client pin megabytes).
                    if len(raw) <= _CACHED_BLOCK_SIZE:
                        blocks = self._blocks
                        if len(blocks) >= _CACHED_BLOCKS:
                            blocks.clear()
                        blocks[raw] = block
                self._last_send = (raw, h, persistent, timing, properties, headers, block)
                # stomp_SEND publishes the next frame with this very block
                # itself when it is relayed as is and sets no option.
                self._fast_raw = raw if block and timing is None else _NO_RAW
            if not block:  # not relayed as sent: from the model
                encode_message_headers(message)
            elif message.expires:
                # A producer's messages expire at the same millisecond
                # (a fixed expires, or a ttl within one read): one block.
                ms = round(message.expires * 1000)
                last = self._last_expiry
                if last[0] is block and last[1] == ms:
                    message.cache = last[2]
                else:
                    message.cache = with_expiry(block, message)
                    self._last_expiry = (block, ms, message.cache)
            else:
                message.cache = block
        return channel.publish_target(target, message)

    def _read_send(self, h: dict[str, str], user: Any) -> tuple:
        """What a SEND's headers C{h} (its frame lines gone) make of a
        message: C{(persistent, timing, properties, headers)}; C{timing} is
        None (no delivery option), a priority alone (an int) or the
        core's L{qmq.core.options.DeliveryOptions}.

        @raise HeaderError: a header value is malformed or out of range.
        @raise AccessRefused: a C{user-id} that is not the publisher's.
        """
        persistent = False
        timing: Any = None
        properties = headers = None
        if len(h) > 1:
            persistent_header = h.get("persistent")
            if persistent_header is not None:
                persistent = parse_bool(persistent_header, "persistent")
            if not _DELIVERY_HEADERS.isdisjoint(h):
                if "priority" in h and _TIMING_HEADERS.isdisjoint(h):
                    # A priority alone (the common case): an int.
                    timing = options.PRIORITIES.get(h["priority"])
                    if timing is None:
                        try:
                            timing = options.read_priority(h["priority"])
                        except OptionError as e:
                            raise _header_error(e) from None
                else:
                    timing = self._delivery_options(h)
            properties, headers = split_headers(h)
            check_user_id(properties, user)
        return persistent, timing, properties, headers

    def _delivery_options(self, h: dict[str, str]) -> options.DeliveryOptions:
        """Read a SEND's delivery headers through the core's one parser
        (L{qmq.core.options.parse}): C{priority}, C{expires}, C{ttl},
        C{delay}, C{deliver-at}, C{ack-timeout} (their names are the core's
        option names).

        @raise HeaderError: a value is malformed or out of range.
        """
        get = h.get
        try:
            return options.parse(
                get("priority"),
                get("expires"),
                get("ttl"),
                get("delay"),
                get("deliver-at"),
                get(ACK_TIMEOUT_HEADER),
            )
        except OptionError as e:
            raise _header_error(e) from None

    def _reply_to(self, text: str) -> str:
        """Rewrite a /temp-queue/ reply-to so the replier reaches this session."""
        channel = self.channel
        assert channel is not None
        queue = channel.temp_queue(text[12:])
        if text not in self.subscriptions:
            # As RabbitMQ does: replies arrive without an explicit SUBSCRIBE,
            # on a subscription named after the temp-queue destination.
            self._check_subscription_cap()
            sub = self._subscription(self, text, text, "auto", None)
            self.subscriptions[text] = sub
            channel.subscribe(sub, text)
        return "/queue/" + queue.name

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------

    def stomp_SUBSCRIBE(self, frame: Frame) -> None:
        h = frame.headers
        text = self._require(frame, "destination")
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                self._require(frame, "id")
            sub_id = text
        elif len(sub_id) > self.settings.max_subscription_id:
            raise StompError(
                "subscription id too long",
                f"A subscription id has at most {self.settings.max_subscription_id} "
                f"characters (stomp.max_subscription_id); this one has {len(sub_id)}.",
            )
        if sub_id in self.subscriptions:
            raise StompError(
                "duplicate subscription id", f"Subscription id {sub_id!r} is already in use."
            )
        self._check_subscription_cap()
        mode = h.get("ack", "auto")
        if mode not in ACK_MODES:
            raise StompError(
                "invalid ack mode", f"ack must be one of {', '.join(ACK_MODES)}, got {mode!r}."
            )
        prefetch = self._prefetch(h) if mode != "auto" else None
        durable_name = self._durable_name(h, sub_id)
        if durable_name is not None and self.client_id:
            # ActiveMQ keys a durable subscription by client id and name.
            durable_name = f"{escape_name(self.client_id)}:{durable_name}"
        arguments = None
        if not _SUBSCRIBE_ARGUMENTS.isdisjoint(h):
            arguments = {argument_name(k): v for k, v in h.items() if k in _SUBSCRIBE_ARGUMENTS}
        sub = self._subscription(self, sub_id, text, mode, prefetch)
        buffer = self._buffer(h)
        if buffer is not None:
            sub.buffer = buffer
        channel = self.channel
        assert channel is not None
        # Deliveries waiting on a queue go after the RECEIPT: the queue
        # would hand them out as the consumer is added.
        paused, sub.paused = sub.paused, True
        try:
            channel.subscribe(sub, text, durable_name, label=sub_id, arguments=arguments)
        finally:
            sub.paused = paused
        self.subscriptions[sub_id] = sub
        receipt = h.get("receipt")
        if receipt is not None:
            # In a mesh, the node the queue lives on (docs/cluster.rst).
            home = home_of(sub.queue)
            self._send_receipt(receipt, [("home", home)] if home is not None else None)
        channel.deliver_waiting(sub)

    def _check_subscription_cap(self) -> None:
        cap = self.settings.max_subscriptions
        if cap and len(self.subscriptions) >= cap:
            raise StompError(
                "too many subscriptions",
                f"A connection may hold at most {cap} subscriptions (stomp.max_subscriptions).",
            )

    @staticmethod
    def _buffer(h: dict[str, str]) -> SubscriberBuffer | None:
        """The subscriber's buffer (C{buffer-messages}, C{buffer-bytes}), or None."""
        messages = h.get("buffer-messages")
        size = h.get("buffer-bytes")
        if messages is None and size is None:
            return None
        return SubscriberBuffer(
            parse_int(messages, "buffer-messages", 1) if messages is not None else 0,
            parse_int(size, "buffer-bytes", 1) if size is not None else 0,
        )

    def _prefetch(self, h: dict[str, str]) -> int | None:
        for name in PREFETCH_HEADERS:
            value = h.get(name)
            if value is not None:
                return parse_int(value, name) or None
        return self.settings.default_prefetch

    @staticmethod
    def _durable_name(h: dict[str, str], sub_id: str) -> str | None:
        for name in DURABLE_NAME_HEADERS:
            value = h.get(name)
            if value:
                return value
        for name in DURABLE_FLAG_HEADERS:
            value = h.get(name)
            if value is not None and parse_bool(value, name):
                return h.get("x-queue-name") or sub_id
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
        channel = self.channel
        assert channel is not None
        delete = sub.durable and self._durable_name(h, sub_id) is not None  # type: ignore[arg-type]
        channel.unsubscribe(sub, delete_durable=delete)
        self._receipt(frame)

    def subscription_overrun(self, sub: Subscription, reason: str) -> None:
        """C{sub} fell further behind than its buffer allows: cut the
        client off with an ERROR naming why (the QMQ notes' slow subscriber;
        the topic and its other subscribers go on)."""
        log.info(
            "stomp slow consumer cut off session={session} peer={peer} subscription={sub!r}: {reason}",
            session=self.id,
            peer=self.peer,
            sub=sub.id,
            reason=reason,
        )
        self.error(
            "slow consumer",
            f"Subscription {sub.id!r} ({sub.destination}) fell too far behind: {reason}. "
            "The connection is cut off; the messages it did not read are lost to it.",
        )

    def undeliverable(self, sub: Subscription, message: Any, queue: Any) -> None:
        """C{message} cannot cross this session's transport (a body that is
        not UTF-8 over a text-only one): an ERROR tells the client, and the
        message goes back to its queue, its delivery count raised (so a
        queue's delivery limit dead-letters a message that keeps coming
        back). An ack-required subscription has it among its unacked
        deliveries (the channel's close gives it back); C{queue} is the
        queue to give an auto-ack delivery back to (None for a live topic
        subscription: the message is not delivered to it).
        """
        sub.paused = True
        where = (
            "It is back in its queue, for a consumer over a binary-capable transport."
            if (sub.ack_required or queue is not None)
            else "It is not delivered to this subscription."
        )
        self.error(
            "binary body",
            f"A message for subscription {sub.id!r} ({sub.destination}) has a body of "
            f"{len(message.body)} bytes that is not UTF-8 text; SockJS carries text only, so "
            f"it cannot be delivered here. {where} Consume binary bodies over STOMP over "
            "WebSocket (/ws) or TCP.",
        )
        if queue is not None:
            queue.requeue([message])

    def subscription_cancelled(self, sub: Subscription) -> None:
        """The queue or exchange under C{sub} was deleted by someone else."""
        if self.subscriptions.get(sub.id) is sub:
            del self.subscriptions[sub.id]
        if self.channel is not None:
            self.channel.consumer_cancelled(sub)

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
        channel = self.channel
        assert channel is not None
        tag = 0
        if ack_id.startswith(prefix):  # type: ignore[union-attr]
            digits = ack_id[len(prefix) :]  # type: ignore[index]
            if digits.isascii() and digits.isdigit() and len(digits) < 19:
                tag = int(digits)
        try:
            if not tag:
                raise BrokerError("no such tag")
            sub = channel.owner_of(tag)
        except BrokerError:
            raise StompError(
                "unknown message",
                f"{frame.command} of a message that is not waiting for an acknowledgement "
                "on this connection.",
            ) from None
        return sub, tag  # type: ignore[return-value]

    def stomp_ACK(self, frame: Frame) -> None:
        sub, tag = self._ack_target(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._hold(tx, "ACK", frame)
        else:
            self.channel.settle_delivery(sub, tag, True)  # type: ignore[union-attr]
        if "receipt" in frame.headers:
            self._receipt(frame)

    def stomp_NACK(self, frame: Frame) -> None:
        sub, tag = self._ack_target(frame)
        requeue = self._requeue(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._hold(tx, "NACK", frame)
        else:
            self.channel.settle_delivery(sub, tag, False, requeue)  # type: ignore[union-attr]
        self._receipt(frame)

    @staticmethod
    def _requeue(frame: Frame) -> bool:
        value = frame.headers.get("requeue")
        return True if value is None else parse_bool(value, "requeue")

    # -- DISCONNECT --------------------------------------------------------------------

    def stomp_DISCONNECT(self, frame: Frame) -> None:
        self._receipt(frame)
        if self._waiting:
            # Close once the receipts still waiting for the store are out.
            self._disconnecting = True
            return
        self._finish_disconnect()

    def _finish_disconnect(self) -> None:
        self.flush()
        self.closed = True
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
