# -*- test-case-name: tests.test_amqp_session -*-
"""An AMQP 0-9-1 connection over the core, sans I/O.

L{AmqpSession} is one client connection: it reads bytes, writes bytes
through an L{qmq.transport.ITransport}-like transport (C{write_frames},
C{close}, C{pause_reading}, C{resume_reading}, C{peer}, C{peer_host},
C{identity}) and does everything else through the core:

    bytes -> L{AmqpSession.data_received}: the protocol header, then frames
             (type, channel, size; a frame over the negotiated frame_max,
             or not ended by 0xCE, closes the connection: 501)
      channel 0   connection.start-ok (PLAIN, AMQPLAIN, EXTERNAL), tune-ok,
                  open (login through C{broker.auth}, the virtual host),
                  close / close-ok, heart-beats
      channel N   L{AmqpChannel}: one core L{qmq.core.channel.Channel} on
                  the session's one core L{Connection} (exclusive queues are
                  the connection's); topology through
                  L{qmq.core.management.Management}; basic.publish's
                  content assembled from its header and body frames and
                  published with C{Channel.publish}; deliveries written by
                  L{AmqpConsumer.deliver}
    errors: a core L{BrokerError} closes the channel with its reply code
            (404, 403, 405, 406) or, for the codes AMQP makes connection
            exceptions (530, 506, 5xx), the connection; a frame the
            protocol does not allow closes the connection with 501, 502,
            503, 504, 505 or 540, the text naming the problem.

Output is buffered and written once per reactor turn (the broker's
L{qmq.core.batch.WriteBatcher}), as STOMP's is. Publishers are held back
by the core's admission (memory and disk alarms): reading stops and
C{connection.blocked} goes to clients that announced the capability.
Deadlines: the handshake (C{connect_timeout}), a frame or a message's
content in progress (C{frame_timeout}; its bytes count in the broker's
budget for unfinished input, C{limits.max_unfinished_bytes}), heart-beats
(a client silent for two intervals is disconnected).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands, decode
from pamqp import exceptions as pamqp_exceptions
from pamqp import frame as pamqp_frame
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq import __version__
from qmq.amqp.codec import (
    CONTENT,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEAD,
    HEARTBEAT,
    PROTOCOL_HEADER,
    Decoded,
    PropertiesEncoder,
    content_frames,
    decode_properties,
    deliver_frames,
    fit_short,
    from_table,
    short,
)
from qmq.amqp.settings import AmqpSettings
from qmq.core.access import Resource
from qmq.core.channel import Channel, Connection
from qmq.core.consumer import Consumer
from qmq.core.errors import (
    AccessRefused,
    BrokerError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLimit,
    ResourceLocked,
)
from qmq.core.management import Management, authorize_arguments
from qmq.core.message import Message, check_user_id
from qmq.core.ownership import owned_token
from qmq.core.remote import Unavailable
from qmq.stream import BatchedOutput

__all__ = ["AmqpChannel", "AmqpConsumer", "AmqpSession", "ConnectionError_", "REPLY_CODES"]

log = Logger(namespace="qmq.amqp.session")

# Reply codes (AMQP 0-9-1).
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
CONNECTION_FORCED = 320
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

#: Reply code -> its name, as RabbitMQ prefixes the reply text.
REPLY_CODES = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}
#: The reply codes AMQP makes channel exceptions; every other closes the connection.
CHANNEL_CODES = frozenset((CONTENT_TOO_LARGE, NO_ROUTE, ACCESS_REFUSED, NOT_FOUND, RESOURCE_LOCKED,
                           PRECONDITION_FAILED))

#: RabbitMQ's server capabilities: clients turn features on from this table.
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "consumer_priorities": False,
    "direct_reply_to": True,
}

#: RabbitMQ's direct reply-to pseudo-queue (an RPC client's replies).
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"

#: Output buffered past this many bytes is written at once.
FLUSH_THRESHOLD = 256 * 1024
#: Frames before connection.open-ok are bounded by this size (the spec's
#: minimum frame_max), whatever the listener offers.
HANDSHAKE_FRAME_MAX = 4096 * 16

_session_ids = itertools.count(1)

_PUBLISH = commands.Basic.Publish.index
_PUBLISH_IDS = struct.pack(">I", _PUBLISH)
_ACK = commands.Basic.Ack.index
_ACK_IDS = struct.pack(">I", _ACK)
_ACK_ARGS = struct.Struct(">QB")
_TAG = struct.Struct(">QB")
#: A content header frame's header and the start of its payload.
_CONTENT_HEAD = struct.Struct(">BHIHHQ")
_U16 = struct.Struct(">H")


def _count(value: Any) -> int:
    """A count another node reported, as a declare-ok's unsigned 32 bits."""
    return min(value, 0xFFFFFFFF) if isinstance(value, int) and value > 0 else 0


class ConnectionError_(Exception):
    """A connection exception: close the connection with C{code} and C{text}."""

    def __init__(self, code: int, text: str, method: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.method = method


def _reply_text(code: int, text: str) -> str:
    """RabbitMQ's form: C{NOT_FOUND - no queue 'x' in vhost '/'}, cut to a short string."""
    full = f"{REPLY_CODES.get(code, 'ERROR')} - {text}"
    data = full.encode()
    if len(data) > 255:
        full = data[:252].decode("utf-8", "ignore") + "..."
    return full


def _class_method(index: int) -> tuple[int, int]:
    return index >> 16, index & 0xFFFF


class AmqpConsumer(Consumer):
    """A C{basic.consume}: the core consumer that writes C{basic.deliver}.

    @ivar tag: the consumer tag.
    @ivar amqp: the L{AmqpChannel} it was made on.
    """

    __slots__ = ("amqp", "tag", "prefix", "number", "_route", "_head", "_tail")

    def __init__(self, amqp: AmqpChannel, no_ack: bool) -> None:
        super().__init__(not no_ack, None, amqp.session)
        self.amqp = amqp
        self.number = amqp.number
        self.tag = ""
        self.prefix = b""
        # The last (exchange, routing key) delivered and the method frame's
        # bytes around the delivery tag for it.
        self._route: tuple = (None, None)
        self._head = b""
        self._tail = b""

    def set_tag(self, tag: str) -> None:
        self.tag = tag
        self.prefix = b"\x00\x3c\x00\x3c" + short(tag)

    def deliver(self, message: Message, queue: Any) -> None:
        tag = self.channel.track(self, message)  # type: ignore[union-attr]
        session = self.amqp.session
        body = message.body
        size = len(body)
        route = self._route
        if (
            route[0] is not message.exchange
            or route[1] is not message.routing_key
            or not 0 < size <= session.frame_max - 8
        ):
            if not 0 < size <= session.frame_max - 8:
                session.write(
                    deliver_frames(self.number, self.prefix, tag, message, session.encoder.encode(message),
                                   session.frame_max, session.shorts)
                )
                return
            self._route = (message.exchange, message.routing_key)
            tail = short(message.exchange) + short(message.routing_key)
            self._head = HEAD.pack(FRAME_METHOD, self.number, len(self.prefix) + 9 + len(tail)) + self.prefix
            self._tail = tail + b"\xce"
        properties = session.encoder.encode(message)
        session.write(
            b"%s%s%s%s%s\xce%s%s\xce" % (
                self._head, _TAG.pack(tag, 1 if message.delivery_count else 0), self._tail,
                _CONTENT_HEAD.pack(FRAME_HEADER, self.number, 12 + len(properties), 60, 0, size),
                properties, HEAD.pack(FRAME_BODY, self.number, size), body,
            )
        )

    def cancelled(self) -> None:
        self.amqp.consumer_cancelled(self)


class _CoreChannel(Channel):
    """The core channel of an AMQP channel: when the user's permissions
    change (L{Channel.set_user}, an administrator's change through the
    HTTP API), what the AMQP channel resolved under the old ones goes too."""

    amqp: AmqpChannel | None = None

    def forget_targets(self) -> None:
        amqp = self.amqp
        if amqp is not None:
            amqp.forget_resolved(self.user)


class AmqpChannel:
    """One AMQP channel of a session: its core channel and its state.

    @ivar number: the channel number.
    @ivar core: the core L{Channel}.
    @ivar closing: a channel.close was sent; only close-ok is awaited.
    """

    def __init__(self, session: AmqpSession, number: int) -> None:
        self.session = session
        self.number = number
        self.core = _CoreChannel(
            session.broker, session.vhost, session.owner, user=session.user, protocol="amqp",
            connection=session.connection,
        )
        self.core.amqp = self
        self.management = Management(session.vhost, session.user, session.owner)
        self.closing = False
        self.flow = True
        self.last_queue = ""
        # The publish being assembled: (exchange, key, mandatory), its
        # decoded properties, its size, its body parts and bytes so far.
        self.publishing: tuple[str, str, bool] | None = None
        self.decoded: Decoded | None = None
        self.body_size = 0
        self.parts: list[bytes] = []
        self.received = 0
        self.content_started = 0.0
        # The last content header's property bytes and their decoding.
        self.last_raw: bytes | None = None
        self.last_decoded: Decoded | None = None
        # Publisher confirms: the next sequence number (0: not in confirm mode).
        self.confirm = False
        self.next_seq = 1
        self._acks: list[int] = []
        self._nacks: list[int] = []
        self._unconfirmed: dict[int, None] = {}
        self._group: list[int] | None = None
        self._group_waiter: Any = None
        # Transactions: the held operations, or None outside tx mode.
        self.tx: list[tuple] | None = None
        self.tx_bytes = 0
        self.consumers: dict[str, AmqpConsumer] = {}
        # RabbitMQ's direct reply-to: this channel's reply queue once it
        # consumes the pseudo-queue, and the last properties rewritten for it.
        self.reply_queue: str | None = None
        self._reply_props: tuple = (None, None)
        # (exchange, routing key) -> the core's resolved publish target.
        self._targets: dict[tuple[str, str], Any] = {}
        # basic.publish payloads -> their (exchange, routing key, mandatory).
        self._publish_args: dict[bytes, tuple[str, str, bool]] = {}

    def forget_resolved(self, user: Any) -> None:
        """The user's permissions changed (now C{user}): the publish
        targets resolved under the old ones go, and topology is asked
        about the new ones."""
        self._targets.clear()
        self.management.user = user
        self.session.user = user

    # -- output ----------------------------------------------------------------------

    def send(self, method: Any) -> None:
        self.session.write(pamqp_frame.marshal(method, self.number))

    def send_content(self, method: Any, message: Message) -> None:
        session = self.session
        session.write(
            pamqp_frame.marshal(method, self.number)
            + content_frames(self.number, session.encoder.encode(message), message.body, session.frame_max)
        )

    # -- the frames ---------------------------------------------------------------------

    def method(self, index: int, payload: bytes) -> None:
        """A method frame for this channel (its payload after the ids)."""
        if self.publishing is not None:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"expected content header for basic.publish on channel {self.number}, "
                f"got method {_class_method(index)}", index,
            )
        if self.closing:
            if index == commands.Channel.CloseOk.index:
                self.session.channel_gone(self)
            elif index == commands.Channel.Close.index:
                self.send(commands.Channel.CloseOk())
            return  # everything else is dropped until close-ok (AMQP 0-9-1 2.3.5.2)
        if index == _PUBLISH:
            self.basic_publish(payload)
            return
        if index == _ACK:
            if len(payload) != 9:
                raise ConnectionError_(SYNTAX_ERROR, "malformed basic.ack", index)
            tag, bits = _ACK_ARGS.unpack(payload)
            self.settle(tag, bool(bits & 1), True, False)
            return
        handler = _HANDLERS.get(index)
        if handler is None:
            raise ConnectionError_(
                NOT_IMPLEMENTED if index in commands.INDEX_MAPPING else COMMAND_INVALID,
                f"method {_class_method(index)} is not accepted on a channel", index,
            )
        args = _decode_method(index, payload)
        try:
            handler(self, args)
        except BrokerError as e:
            self.session.core_error(self, e, index)

    def content_header(self, payload: bytes) -> None:
        if self.closing:
            return
        if self.publishing is None:
            raise ConnectionError_(UNEXPECTED_FRAME, f"content header on channel {self.number} "
                                   "without a basic.publish")
        if len(payload) < 14:
            raise ConnectionError_(FRAME_ERROR, "content header too short")
        class_id, _weight, size = CONTENT.unpack_from(payload, 0)
        if class_id != 60:
            raise ConnectionError_(FRAME_ERROR, f"content header of class {class_id}, expected 60")
        raw = payload[12:]
        decoded = self.last_decoded if raw == self.last_raw else None
        if decoded is None:
            try:
                decoded = decode_properties(raw)
            except (ValueError, RecursionError, pamqp_exceptions.UnmarshalingException) as e:
                raise ConnectionError_(SYNTAX_ERROR, f"malformed content header: {str(e)[:100]}") from None
            try:
                check_user_id(decoded.properties, self.core.user)
            except AccessRefused as e:
                self.publishing = None
                self.session.core_error(self, e, _PUBLISH)
                return
            self.last_raw = raw
            self.last_decoded = decoded
        limit = self.session.settings.max_message_size
        if size > limit:
            self.publishing = None
            self.session.channel_error(
                self, PRECONDITION_FAILED,
                f"message size {size} is larger than the maximum message size {limit}", _PUBLISH,
            )
            return
        self.decoded = decoded
        self.body_size = size
        if size == 0:
            self.publish_content(b"")
            return
        self.session.content_started(self)

    def content_body(self, payload: bytes) -> None:
        if self.closing:
            return
        if self.publishing is None or self.decoded is None:
            raise ConnectionError_(UNEXPECTED_FRAME, f"content body on channel {self.number} "
                                   "without a content header")
        received = self.received + len(payload)
        if received > self.body_size:
            raise ConnectionError_(FRAME_ERROR, f"content body of {received} bytes or more, "
                                   f"its header said {self.body_size}")
        if received == self.body_size:
            parts = self.parts
            if parts:
                parts.append(payload)
                body = b"".join(parts)
                self.parts = []
            else:
                body = payload
            self.received = 0
            self.session.content_done(self)
            self.publish_content(body)
            return
        self.parts.append(payload)
        self.received = received

    def reset_content(self) -> None:
        self.publishing = None
        self.decoded = None
        self.parts = []
        self.received = 0

    # -- publishing ------------------------------------------------------------------

    def basic_publish(self, payload: bytes) -> None:
        """basic.publish's arguments (its payload after the method ids):
        a producer repeats them, so their decoding is looked up (and the
        strings shared, which the delivery side's caches compare by
        identity)."""
        publishing = self._publish_args.get(payload)
        if publishing is None:
            publishing = self._decode_publish(payload)
        self.publishing = publishing
        session = self.session
        if session.admission.closed and not session.blocked:
            session.hold_back()

    def _decode_publish(self, payload: bytes) -> tuple[str, str, bool]:
        # ticket (short), exchange, routing key (short strings), bits.
        try:
            n = payload[2]
            exchange = payload[3 : 3 + n].decode()
            pos = 3 + n
            m = payload[pos]
            key = payload[pos + 1 : pos + 1 + m].decode()
            bits = payload[pos + 1 + m]
        except (IndexError, UnicodeDecodeError):
            raise ConnectionError_(SYNTAX_ERROR, "malformed basic.publish", _PUBLISH) from None
        if bits & 2:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true is not supported", _PUBLISH)
        publishing = (exchange, key, bool(bits & 1))
        cache = self._publish_args
        if len(cache) >= 1000:
            cache.clear()
        cache[bytes(payload)] = publishing
        return publishing

    def publish_content(self, body: bytes) -> None:
        """The content of the basic.publish being assembled is complete: publish it."""
        exchange, key, mandatory = self.publishing  # type: ignore[misc]
        decoded = self.decoded
        self.publishing = None
        self.decoded = None
        core = self.core
        message = core.make_message(exchange, key, decoded.headers, body, decoded.persistent)  # type: ignore[union-attr]
        message.properties = decoded.properties  # type: ignore[union-attr]
        if decoded.direct_reply:  # type: ignore[union-attr]
            try:
                message.properties = self._direct_reply(decoded)  # type: ignore[arg-type]
            except BrokerError as e:
                self.session.core_error(self, e, _PUBLISH)
                return
        if decoded.priority:  # type: ignore[union-attr]
            message.priority = decoded.priority  # type: ignore[union-attr]
        try:
            if decoded.ttl is not None:  # type: ignore[union-attr]
                message.expires = decoded.expires(message.timestamp)  # type: ignore[union-attr]
            if self.tx is not None:
                self._hold(("publish", exchange, key, mandatory, message), len(body))
                return
            self._route(exchange, key, mandatory, message)
        except BrokerError as e:
            self.session.core_error(self, e, _PUBLISH)

    def _direct_reply(self, decoded: Decoded) -> dict | None:
        """The properties of a publish whose C{reply-to} is RabbitMQ's
        direct reply-to pseudo-queue: named after this channel's reply
        queue (remembered per decoding: a requester's messages share it).
        @raise PreconditionFailed: the channel has no reply consumer."""
        properties = decoded.properties
        if self.reply_queue is None or self.reply_queue not in self.core.vhost.queues:
            raise PreconditionFailed(
                f"fast reply consumer does not exist: consume from {DIRECT_REPLY_TO!r} with no-ack "
                "on this channel before publishing with that reply-to")
        last = self._reply_props
        if last[0] is not properties:
            last = self._reply_props = (properties, {**properties, "reply_to": self.reply_queue})  # type: ignore[dict-item]
        return last[1]

    def _consume_direct_reply(self, args: Any) -> str:
        """basic.consume of the direct reply-to pseudo-queue: this channel's
        reply queue, exclusive to the connection and made now (the
        configure permission on its name, as STOMP's temporary queues)."""
        if not args.no_ack:
            raise PreconditionFailed("reply consumer cannot acknowledge: consume "
                                     f"{DIRECT_REPLY_TO!r} with no-ack")
        if self.reply_queue is not None and self.reply_queue in self.core.vhost.queues:
            raise PreconditionFailed(f"this channel already consumes {DIRECT_REPLY_TO!r}")
        name = f"{DIRECT_REPLY_TO}.{self.core.token}"
        self.core.declare_queue(name, durable=False, exclusive=True, auto_delete=True)
        self.reply_queue = name
        return name

    def _route(self, exchange: str, key: str, mandatory: bool, message: Message) -> Any:
        """Publish C{message}; return the durability waiter (or None)."""
        seq = 0
        if self.confirm:
            seq = self.next_seq
            self.next_seq = seq + 1
        try:
            if mandatory:
                published = self.core.publish(exchange, key, message, True)
                routed = published.routed
                waiter = published.durable
            else:
                routed = 1
                waiter = self._publish_resolved(exchange, key, message)
        except ResourceLimit:
            # RabbitMQ's reject-publish: the publisher hears it through a
            # nack when it asked for confirms.
            if seq:
                self._nacks.append(seq)
                self.session.want_confirms(self)
            return None
        if not routed:
            self.send_content(
                commands.Basic.Return(NO_ROUTE, "NO_ROUTE", exchange, fit_short(key)), message
            )
        if seq:
            if waiter is None:
                self._acks.append(seq)
                self.session.want_confirms(self)
            else:
                self._unconfirmed[seq] = None
                if waiter is self._group_waiter:
                    self._group.append(seq)  # type: ignore[union-attr]
                else:
                    group = self._group = [seq]
                    self._group_waiter = waiter
                    waiter.addCallbacks(self._durable, self._not_durable, callbackArgs=(group,),
                                        errbackArgs=(group,))
        return waiter

    def _publish_resolved(self, exchange: str, key: str, message: Message) -> Any:
        """Publish through a target resolved once per (exchange, key) and
        kept until its queue or exchange is deleted (the core's hot path,
        as STOMP's send_target); the core checked the permission when it
        resolved it."""
        targets = self._targets
        target = targets.get((exchange, key))
        if target is None or target[4].deleted:
            if not exchange and key not in self.core.vhost.queues:
                # The default exchange to no queue: dropped (unroutable).
                return self.core.publish(exchange, key, message).durable
            target = self.core.target(exchange, key)
            if len(targets) >= 1000:
                targets.clear()
            targets[(exchange, key)] = target
        return self.core.publish_target(target, message)

    def _durable(self, result: Any, group: list[int]) -> Any:
        # Returns its result unchanged: the waiter may be shared.
        if group is self._group:
            self._group = self._group_waiter = None
        unconfirmed = self._unconfirmed
        for seq in group:
            unconfirmed.pop(seq, None)
        self._acks.extend(group)
        self.session.want_confirms(self)
        return result

    def _not_durable(self, failure: Failure, group: list[int]) -> Failure:
        if group is self._group:
            self._group = self._group_waiter = None
        unconfirmed = self._unconfirmed
        for seq in group:
            unconfirmed.pop(seq, None)
        self._nacks.extend(group)
        self.session.want_confirms(self)
        log.failure("store failed to keep a message session={session}", failure, session=self.session.id)
        return failure

    def confirms(self) -> None:
        """Send the acks and nacks due: one C{multiple} ack when every
        earlier publish is confirmed, else one per message."""
        acks, nacks = self._acks, self._nacks
        if not (acks or nacks) or self.closing:
            acks.clear()
            nacks.clear()
            return
        self._acks = []
        self._nacks = []
        write = self.session.write
        number = self.number
        if acks:
            top = max(acks)
            floor = next(iter(self._unconfirmed), None) if self._unconfirmed else None
            if (floor is None or floor > top) and not nacks and len(acks) > 1:
                write(pamqp_frame.marshal(commands.Basic.Ack(top, True), number))
            else:
                for seq in sorted(acks):
                    write(pamqp_frame.marshal(commands.Basic.Ack(seq, False), number))
        for seq in nacks:
            write(pamqp_frame.marshal(commands.Basic.Nack(seq, False, False), number))

    # -- transactions ----------------------------------------------------------------

    def _hold(self, op: tuple, size: int) -> None:
        settings = self.session.settings
        tx = self.tx
        assert tx is not None
        if settings.max_transaction_messages and len(tx) >= settings.max_transaction_messages:
            raise PreconditionFailed(
                f"a transaction holds at most {settings.max_transaction_messages} publishes and "
                "acks (amqp.max_transaction_messages); commit sooner", "transaction too large")
        if settings.max_transaction_bytes and self.tx_bytes + size > settings.max_transaction_bytes:
            raise PreconditionFailed(
                f"a transaction holds at most {settings.max_transaction_bytes} body bytes "
                "(amqp.max_transaction_bytes); commit sooner", "transaction too large")
        tx.append(op)
        self.tx_bytes += size

    def tx_select(self, args: Any) -> None:
        if self.confirm:
            raise PreconditionFailed("a channel in confirm mode cannot use transactions")
        if self.tx is None:
            self.tx = []
        self.send(commands.Tx.SelectOk())

    def tx_commit(self, args: Any) -> None:
        if self.tx is None:
            raise PreconditionFailed("channel is not transactional (no tx.select)")
        ops, self.tx = self.tx, []
        self.tx_bytes = 0
        waiters = []
        for op in ops:
            if op[0] == "publish":
                waiter = self._route(op[1], op[2], op[3], op[4])
                if waiter is not None:
                    waiters.append(waiter)
            else:
                self.settle(op[1], op[2], op[3], op[4], held=True)
            if self.closing:
                return
        if not waiters:
            self.send(commands.Tx.CommitOk())
            return
        # Commit-ok once what was published is as durable as it will be.
        DeferredList(waiters, consumeErrors=True).addCallback(self._committed)

    def _committed(self, results: list) -> None:
        if self.closing or self.session.closed:
            return
        if all(ok for ok, _ in results):
            self.send(commands.Tx.CommitOk())
        else:
            self.session.channel_error(self, INTERNAL_ERROR, "the store failed to keep a message",
                                       commands.Tx.Commit.index)

    def tx_rollback(self, args: Any) -> None:
        if self.tx is None:
            raise PreconditionFailed("channel is not transactional (no tx.select)")
        self.tx = []
        self.tx_bytes = 0
        self.send(commands.Tx.RollbackOk())

    def confirm_select(self, args: Any) -> None:
        if self.tx is not None:
            raise PreconditionFailed("a transactional channel cannot be put in confirm mode")
        self.confirm = True
        if not args.nowait:
            self.send(commands.Confirm.SelectOk())

    # -- channel ----------------------------------------------------------------------

    def channel_open(self, args: Any) -> None:
        raise ConnectionError_(CHANNEL_ERROR, f"channel {self.number} is already open",
                               commands.Channel.Open.index)

    def channel_close(self, args: Any) -> None:
        self.send(commands.Channel.CloseOk())
        self.session.channel_gone(self)

    def channel_close_ok(self, args: Any) -> None:
        pass  # not closing: nothing to do

    def channel_flow(self, args: Any) -> None:
        self.flow = bool(args.active)
        if self.flow:
            if not self.session.paused:
                self.core.resume()
        else:
            self.core.pause()
        self.send(commands.Channel.FlowOk(self.flow))

    def channel_flow_ok(self, args: Any) -> None:
        pass

    # -- exchanges -------------------------------------------------------------------

    def exchange_declare(self, args: Any) -> None:
        name = args.exchange
        if args.passive:
            if name:
                self.core.vhost.exchange(name)
        else:
            # The core's: internal, alternate-exchange (write on it), equivalence.
            self.management.declare_exchange(name, args.exchange_type, bool(args.durable), bool(args.auto_delete),
                                             bool(args.internal), from_table(args.arguments))
        if not args.nowait:
            self.send(commands.Exchange.DeclareOk())

    def exchange_delete(self, args: Any) -> None:
        name = args.exchange
        vhost = self.core.vhost
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            # RabbitMQ: deleting an exchange that is not there succeeds.
            self.management.authorize("configure", Resource(vhost.name, "exchange", name))
        else:
            if args.if_unused and (exchange.bindings() or getattr(exchange, "e2e", None)):
                raise PreconditionFailed(f"exchange {name!r} in use")
            self.management.delete_exchange(name)
        if not args.nowait:
            self.send(commands.Exchange.DeleteOk())

    def exchange_bind(self, args: Any) -> None:
        self.core.bind_exchange(args.destination, args.source, args.routing_key, from_table(args.arguments))
        if not args.nowait:
            self.send(commands.Exchange.BindOk())

    def exchange_unbind(self, args: Any) -> None:
        self.core.unbind_exchange(args.destination, args.source, args.routing_key, from_table(args.arguments))
        if not args.nowait:
            self.send(commands.Exchange.UnbindOk())

    # -- queues --------------------------------------------------------------------------

    def _queue_name(self, name: str) -> str:
        if name:
            return name
        if not self.last_queue:
            raise ConnectionError_(NOT_ALLOWED, "no previously declared queue")
        return self.last_queue

    def queue_declare(self, args: Any) -> None:
        name = args.queue
        core = self.core
        vhost = core.vhost
        arguments = from_table(args.arguments)
        if args.passive:
            queue = core.declare_queue(self._queue_name(name), passive=True, arguments=arguments)
            if isinstance(queue, Deferred):
                # Its home is another node: asked there, answered with its counts.
                self._answer(queue, lambda found: self._declared_remote(*found, args), commands.Queue.Declare.index)
                return
        elif not name or args.exclusive:
            if not name:
                name = f"amq.gen-{owned_token(core.broker, 16)}"
            existing = vhost.queues.get(name)
            if existing is None:
                mgmt = self.management
                mgmt.authorize("configure", Resource.queue(vhost.name, name))
                authorize_arguments(core.user, core.owner_name, vhost.name, arguments, vhost.queue_defaults)
            elif existing.exclusive_owner is None and args.exclusive:
                raise ResourceLocked(f"cannot obtain exclusive access to locked queue {name!r} "
                                     f"in vhost {vhost.name!r}")
            queue = core.declare_queue(name, bool(args.durable), bool(args.exclusive), bool(args.auto_delete),
                                       arguments)
        else:
            existing = vhost.queues.get(name)
            if existing is not None:
                owner = existing.exclusive_owner
                if owner is not None and owner is not core.connection:
                    raise ResourceLocked(f"cannot obtain exclusive access to locked queue {name!r} "
                                         f"in vhost {vhost.name!r}: it is exclusive to another connection")
                if owner is not None:
                    queue = core.declare_queue(name, arguments=arguments)
                    self._declared(queue, args)
                    return
            waiting: list[Deferred] = []
            queue, _made = self.management.declare_queue(name, bool(args.durable), bool(args.auto_delete), arguments,
                                                         wait=waiting)
            if waiting:
                # Its home is another node: answered with the home's verdict and counts.
                self._answer(waiting[0], lambda answer: self._declared_on_home(queue, args, answer),
                             commands.Queue.Declare.index)
                return
        self._declared(queue, args)

    def _declared_on_home(self, queue: Any, args: Any, answer: Any) -> None:
        facts = answer.get("facts") if isinstance(answer, dict) else None
        if isinstance(facts, dict):
            self._declared_remote(queue, facts, args)
        else:
            self._declared(queue, args)  # a peer of an older version: the stand-in's counts

    def _declared(self, queue: Any, args: Any) -> None:
        self.last_queue = queue.name
        if not args.nowait:
            self.send(commands.Queue.DeclareOk(queue.name, len(queue), len(queue.consumers)))

    def _declared_remote(self, queue: Any, facts: dict[str, Any], args: Any) -> None:
        """A declare of a queue homed on another node: the counts are the home's."""
        self.last_queue = queue.name
        if not args.nowait:
            self.send(commands.Queue.DeclareOk(queue.name, _count(facts.get("messages_ready")),
                                               _count(facts.get("consumers"))))

    def _check_lock(self, name: str) -> Any:
        queue = self.core.vhost.queue_or_stand_in(name)
        owner = queue.exclusive_owner
        if owner is not None and owner is not self.core.connection:
            raise ResourceLocked(f"queue {name!r} is exclusive to another connection")
        return queue

    def _answer(self, result: Any, reply: Any, index: int) -> None:
        """Send C{reply(result)} now, or, when the core answers later (an
        operation carried to the queue's home node, L{qmq.core.remote}),
        once it does: what the client sends meanwhile waits, unread
        (L{AmqpSession.wait_for})."""
        if isinstance(result, Deferred):
            self.session.wait_for(self, result, reply, index)
        elif reply is not None:
            reply(result)

    def queue_bind(self, args: Any) -> None:
        name = self._queue_name(args.queue)
        self._check_lock(name)
        result = self.management.bind(name, args.exchange, args.routing_key, from_table(args.arguments))
        self._answer(result, None if args.nowait else lambda _: self.send(commands.Queue.BindOk()),
                     commands.Queue.Bind.index)

    def queue_unbind(self, args: Any) -> None:
        name = self._queue_name(args.queue)
        self._check_lock(name)
        result = self.management.unbind(name, args.exchange, args.routing_key, from_table(args.arguments))
        self._answer(result, lambda _: self.send(commands.Queue.UnbindOk()), commands.Queue.Unbind.index)

    def queue_purge(self, args: Any) -> None:
        name = self._queue_name(args.queue)
        self._check_lock(name)
        count = self.management.purge_queue(name)
        self._answer(count, None if args.nowait else lambda n: self.send(commands.Queue.PurgeOk(n)),
                     commands.Queue.Purge.index)

    def queue_delete(self, args: Any) -> None:
        """queue.delete: its consumers' basic.cancel notifications follow the
        delete-ok, as RabbitMQ sends them (py-amqp, kombu's transport,
        raises on a cancel of a consumer it did not expect while it waits
        for the delete-ok)."""
        session = self.session
        session.held_cancels = held = []
        later = None
        try:
            later = self._queue_delete(args)
        finally:
            if later is None:
                self._send_cancels(held)
        if later is not None:
            # Deleted on the queue's home node: the cancels follow its answer.
            later.addBoth(lambda result: (self._send_cancels(held), result)[1])

    def _send_cancels(self, held: list) -> None:
        session = self.session
        if session.held_cancels is held:
            session.held_cancels = None
        for channel, tag in held:
            if not channel.closing:
                channel.send(commands.Basic.Cancel(tag, True))
        held.clear()

    def _queue_delete(self, args: Any) -> Deferred | None:
        """@return: the Deferred of the queue's home node's answer, if it has one."""
        name = self._queue_name(args.queue)
        vhost = self.core.vhost
        queue = vhost.queues.get(name)
        if queue is None:
            queue = vhost.stand_in(name)  # homed on another node, not named here yet
        if queue is None:
            # RabbitMQ: deleting a queue that is not there succeeds.
            self.management.authorize("configure", Resource.queue(vhost.name, name))
            count = 0
        else:
            queue = self._check_lock(name)
            if args.if_unused and queue.consumers:
                raise PreconditionFailed(f"queue {name!r} in vhost {vhost.name!r} in use")
            if args.if_empty and len(queue):
                raise PreconditionFailed(f"queue {name!r} in vhost {vhost.name!r} not empty")
            if queue.exclusive_owner is not None:
                # Its own connection's queue: the core's configure verdict,
                # then the delete (Management refuses a session's queue).
                self.management.authorize("configure", Resource.queue(vhost.name, name))
                count = vhost.delete_queue(name)
            else:
                count = self.management.delete_queue(name, bool(args.if_unused), bool(args.if_empty))
                if isinstance(count, Deferred):
                    # Not on its home either: deleted, as RabbitMQ says.
                    count.addErrback(_none_there)
        self._answer(count, None if args.nowait else lambda n: self.send(commands.Queue.DeleteOk(n)),
                     commands.Queue.Delete.index)
        return count if isinstance(count, Deferred) else None

    # -- consuming ---------------------------------------------------------------------

    def basic_qos(self, args: Any) -> None:
        self.core.qos(args.prefetch_count, args.prefetch_size, bool(args.global_))
        self.send(commands.Basic.QosOk())

    def basic_consume(self, args: Any) -> None:
        limit = self.session.settings.max_consumers
        if limit and len(self.consumers) >= limit:
            raise PreconditionFailed(f"a channel holds at most {limit} consumers (amqp.max_consumers)",
                                     "too many consumers")
        tag = args.consumer_tag
        if tag and tag in self.consumers:
            raise NotAllowed(f"attempt to reuse consumer tag {tag!r}")
        consumer = AmqpConsumer(self, bool(args.no_ack))
        consumer.paused = True  # nothing before consume-ok
        if args.queue == DIRECT_REPLY_TO:
            queue = self._consume_direct_reply(args)
        else:
            queue = self._queue_name(args.queue)
            found = self.core.find_queue(queue)
            if isinstance(found, Deferred):
                # Its home is another node, which says whether it has it
                # first (a consume does not make a queue): then as here.
                found.addCallback(lambda _: self._consume(args, consumer, queue, tag))
                self._answer(found, None, commands.Basic.Consume.index)
                return
        self._consume(args, consumer, queue, tag)

    def _consume(self, args: Any, consumer: AmqpConsumer, queue: str, tag: str) -> None:
        tag = self.core.consume(consumer, queue, tag=tag or "", exclusive=bool(args.exclusive))
        consumer.set_tag(tag)
        self.consumers[tag] = consumer
        if not args.nowait:
            self.send(commands.Basic.ConsumeOk(tag))
        # Deliveries go after consume-ok: they were held until now.
        window = self.core.window
        if not (self.session.paused or not self.flow or (window is not None and window.full())):
            consumer.paused = False
            self.core.deliver_waiting(consumer)

    def basic_cancel(self, args: Any) -> None:
        tag = args.consumer_tag
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            # Its unacked deliveries stay the channel's (RabbitMQ's rule).
            self.core.cancel(tag, keep_unacked=True)
        # An unknown tag is not an error (AMQP 0-9-1: the cancel is idempotent).
        if not args.nowait:
            self.send(commands.Basic.CancelOk(tag))

    def consumer_cancelled(self, consumer: AmqpConsumer) -> None:
        """Its queue was deleted: tell a client that understands it."""
        if self.consumers.pop(consumer.tag, None) is None or self.closing:
            return
        if self.session.client_capabilities.get("consumer_cancel_notify"):
            held = self.session.held_cancels
            if held is not None:
                held.append((self, consumer.tag))
            else:
                self.send(commands.Basic.Cancel(consumer.tag, True))

    def basic_get(self, args: Any) -> None:
        got = self.core.get(self._queue_name(args.queue), not args.no_ack)
        if isinstance(got, Deferred):
            # A queue homed on another node: taken there.
            self._answer(got, self._got, commands.Basic.Get.index)
            return
        self._got(got)

    def _got(self, got: Any) -> None:
        if got is None:
            self.send(commands.Basic.GetEmpty())
            return
        message = got.message
        self.send_content(
            commands.Basic.GetOk(got.tag, bool(message.delivery_count), message.exchange,
                                 fit_short(message.routing_key), got.remaining),
            message,
        )

    def settle(self, tag: int, multiple: bool, ack: bool, requeue: bool, held: bool = False) -> None:
        """basic.ack, nack or reject of C{tag} (held in a transaction, else the core's settle)."""
        if self.tx is not None and not held:
            try:
                self._check_tag(tag, multiple)
                self._hold(("settle", tag, multiple, ack, requeue), 0)
            except BrokerError as e:
                self.session.core_error(self, e, _ACK)
            return
        core = self.core
        if ack and not multiple:
            # One delivery acked (the common case): the core's O(1) settle.
            consumer = core.owners.get(tag)
            if consumer is not None:
                core.settle_delivery(consumer, tag, True)
                return
        try:
            core.settle(tag, multiple, ack, requeue)
        except BrokerError as e:
            # RabbitMQ's wording for a tag not waiting here.
            self.session.core_error(self, e, _ACK if ack else commands.Basic.Nack.index)

    def _check_tag(self, tag: int, multiple: bool) -> None:
        if tag and tag not in self.core.owners and not multiple:
            raise PreconditionFailed(f"unknown delivery tag {tag}", "unknown delivery tag")

    def basic_nack(self, args: Any) -> None:
        self.settle(args.delivery_tag, bool(args.multiple), False, bool(args.requeue))

    def basic_reject(self, args: Any) -> None:
        self.settle(args.delivery_tag, False, False, bool(args.requeue))

    def basic_ack(self, args: Any) -> None:  # a client without the fast path's layout
        self.settle(args.delivery_tag, bool(args.multiple), True, False)

    def basic_recover(self, args: Any) -> None:
        if not args.requeue:
            raise ConnectionError_(NOT_IMPLEMENTED, "basic.recover with requeue=false is not supported",
                                   commands.Basic.Recover.index)
        if self.core.owners:
            self.core.settle(0, True, False, True)
        self.send(commands.Basic.RecoverOk())

    # -- the end ----------------------------------------------------------------------

    def close_core(self) -> None:
        """Give back what the channel held (unacked messages, consumers)."""
        self.reset_content()
        self.consumers.clear()
        self._acks.clear()
        self._nacks.clear()
        self.tx = None
        self.core.close()


def _decode_method(index: int, payload: bytes) -> Any:
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        # Not a method of AMQP 0-9-1 (on channel 0, where nothing filtered it).
        raise ConnectionError_(COMMAND_INVALID, f"unknown method {_class_method(index)}", index)
    method = cls()
    try:
        method.unmarshal(payload)
    except (struct.error, ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
        # A field table nested past the interpreter's depth is malformed too.
        raise ConnectionError_(SYNTAX_ERROR, f"malformed {method.name}: {str(e)[:100]}", index) from None
    return method


_HANDLERS: dict[int, Callable[[AmqpChannel, Any], None]] = {
    commands.Channel.Open.index: AmqpChannel.channel_open,
    commands.Channel.Close.index: AmqpChannel.channel_close,
    commands.Channel.CloseOk.index: AmqpChannel.channel_close_ok,
    commands.Channel.Flow.index: AmqpChannel.channel_flow,
    commands.Channel.FlowOk.index: AmqpChannel.channel_flow_ok,
    commands.Exchange.Declare.index: AmqpChannel.exchange_declare,
    commands.Exchange.Delete.index: AmqpChannel.exchange_delete,
    commands.Exchange.Bind.index: AmqpChannel.exchange_bind,
    commands.Exchange.Unbind.index: AmqpChannel.exchange_unbind,
    commands.Queue.Declare.index: AmqpChannel.queue_declare,
    commands.Queue.Bind.index: AmqpChannel.queue_bind,
    commands.Queue.Unbind.index: AmqpChannel.queue_unbind,
    commands.Queue.Purge.index: AmqpChannel.queue_purge,
    commands.Queue.Delete.index: AmqpChannel.queue_delete,
    commands.Basic.Qos.index: AmqpChannel.basic_qos,
    commands.Basic.Consume.index: AmqpChannel.basic_consume,
    commands.Basic.Cancel.index: AmqpChannel.basic_cancel,
    commands.Basic.Get.index: AmqpChannel.basic_get,
    commands.Basic.Ack.index: AmqpChannel.basic_ack,
    commands.Basic.Nack.index: AmqpChannel.basic_nack,
    commands.Basic.Reject.index: AmqpChannel.basic_reject,
    commands.Basic.Recover.index: AmqpChannel.basic_recover,
    commands.Tx.Select.index: AmqpChannel.tx_select,
    commands.Tx.Commit.index: AmqpChannel.tx_commit,
    commands.Tx.Rollback.index: AmqpChannel.tx_rollback,
    commands.Confirm.Select.index: AmqpChannel.confirm_select,
}

# Connection states.
_HEADER, _START_OK, _TUNE_OK, _OPEN, _LOGIN, _OPEN_DONE, _CLOSING, _CLOSED = range(8)


class AmqpSession(BatchedOutput):
    """One AMQP connection (see the module docstring).

    @ivar frame_max: the negotiated frame size (the listener's until tune-ok).
    @ivar channel_max: the negotiated channel count.
    @ivar heartbeat: the negotiated heart-beat interval (seconds, 0: none).
    @ivar client_capabilities: the capabilities table of the client's
        C{client_properties}.
    """

    def __init__(self, broker: Any, settings: AmqpSettings, transport: Any, clock: Any = None) -> None:
        self.broker = broker
        self.settings = settings
        self.transport = transport
        self.clock = clock if clock is not None else broker.clock
        self._seconds = self.clock.seconds
        self.id = f"{broker.message_ids.prefix}.amqp{next(_session_ids):x}"
        self.peer = getattr(transport, "peer", "?")
        self.state = _HEADER
        self.closed = False
        self.paused = False
        self.blocked = False
        self._blocked_sent = False
        self.frame_max = settings.frame_max
        self._read_max = min(settings.frame_max, HANDSHAKE_FRAME_MAX)
        self.channel_max = settings.channel_max
        self.heartbeat = 0
        self.client_capabilities: dict[str, Any] = {}
        #: The basic.cancel notifications a queue.delete of this connection
        #: caused, held until its delete-ok is sent (None: not deleting).
        self.held_cancels: list[tuple[AmqpChannel, str]] | None = None
        self.channels: dict[int, AmqpChannel] = {}
        self.connection = Connection()
        self.vhost: Any = None
        self.user: Any = None
        self.owner: Any = ""
        self.login: str | None = None
        self._password: str | None = None
        self._mechanism = ""
        self.admission = broker.admission
        self.encoder = PropertiesEncoder()
        self.shorts: dict[str, bytes] = {}
        self._buffer = bytearray()
        self.init_output(broker.batcher, FLUSH_THRESHOLD)
        self._confirming: set[AmqpChannel] = set()
        self.last_read = self._seconds()
        self._last_write = self.last_read
        self._unfinished = 0
        self._contents: dict[AmqpChannel, None] = {}
        self._buffer_since: float | None = None
        self._held: list[tuple[int, int, bytes]] | None = None
        self._held_why = "before connection.open-ok"
        self._timers: list[Any] = []
        self._heartbeat_loop: LoopingCall | None = None
        self._watch_loop: LoopingCall | None = None
        self._expiry: Any = None
        self._close_timer: Any = None
        self._released = False
        self._connect_timer = self.clock.callLater(settings.connect_timeout, self._connect_timeout)
        if settings.frame_timeout:
            self._watch_loop = LoopingCall(self._watch)
            self._watch_loop.clock = self.clock
            self._watch_loop.start(settings.frame_timeout / 4, now=False)

    # -- output ----------------------------------------------------------------------

    #: Buffer one outgoing frame (L{BatchedOutput.write_frame}).
    write = BatchedOutput.write_frame

    def flush(self) -> None:
        """Send the confirms due this turn, then everything buffered
        (L{BatchedOutput.flush})."""
        if self._confirming:
            channels, self._confirming = self._confirming, set()
            for channel in channels:
                channel.confirms()
        if self._out and not self.closed:
            self._last_write = self._seconds()
        BatchedOutput.flush(self)

    def want_confirms(self, channel: AmqpChannel) -> None:
        """C{channel} has confirms to send: at the end of the turn."""
        confirming = self._confirming
        if not confirming:
            if not self._out:
                self._batcher.want_flush(self)
            confirming.add(channel)
        elif channel not in confirming:
            confirming.add(channel)

    def send0(self, method: Any) -> None:
        self.write(pamqp_frame.marshal(method, 0))

    # -- input -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_read = self._seconds()
        batcher = self._batcher
        batcher.hold()
        try:
            self._read(data)
        except ConnectionError_ as e:
            self.connection_error(e.code, e.text, e.method)
        except Exception:
            log.failure("internal error in AMQP session {session}", session=self.id)
            self.connection_error(INTERNAL_ERROR, "the broker failed to process a frame; see its log")
        finally:
            batcher.release()

    def _read(self, data: bytes) -> None:
        buffer = self._buffer
        if buffer:
            buffer += data
            data = bytes(buffer)
            buffer.clear()
        if self.state == _HEADER:
            if len(data) < 8:
                if PROTOCOL_HEADER.startswith(data):
                    self._buffer += data
                    return
                self._bad_header()
                return
            if data[:8] != PROTOCOL_HEADER:
                self._bad_header()
                return
            data = data[8:]
            self._started()
        n = len(data)
        pos = 0
        unpack = HEAD.unpack_from
        channels = self.channels
        while n - pos >= 7:
            ftype, number, size = unpack(data, pos)
            if size + 8 > self._read_max:
                raise ConnectionError_(
                    FRAME_ERROR, f"frame of {size + 8} bytes is larger than frame_max {self._read_max}")
            end = pos + 7 + size
            if end >= n:
                break
            if data[end] != 0xCE:
                raise ConnectionError_(FRAME_ERROR, "frame does not end with 0xCE")
            payload = data[pos + 7 : end]
            pos = end + 1
            if ftype == FRAME_METHOD and size == 13 and payload[:4] == _ACK_IDS and self.state == _OPEN_DONE:
                # basic.ack, the other per-message frame: settled here.
                channel = channels.get(number)
                if channel is not None and channel.publishing is None and not channel.closing:
                    tag, bits = _ACK_ARGS.unpack_from(payload, 4)
                    channel.settle(tag, bool(bits & 1), True, False)
                    if self.closed:
                        return
                    continue
            if ftype == FRAME_METHOD and payload[:4] == _PUBLISH_IDS and self._held is None:
                # The common publish: its content header (with the
                # channel's last property bytes) and one body frame in
                # this read: published here, without the frame by frame
                # dispatch (the careful path below does the rest).
                channel = channels.get(number) if self.state == _OPEN_DONE else None
                if (
                    channel is not None
                    and channel.publishing is None
                    and not channel.closing
                    and channel.last_raw is not None
                    and n - pos >= 7
                ):
                    t2, c2, s2 = unpack(data, pos)
                    he = pos + 7 + s2
                    if t2 == FRAME_HEADER and c2 == number and s2 >= 14 and he + 8 < n and data[he] == 0xCE:
                        class_id, _w, size = CONTENT.unpack_from(data, pos + 7)
                        bp = he + 1
                        t3, c3, s3 = unpack(data, bp)
                        be = bp + 7 + s3
                        if (
                            class_id == 60
                            and t3 == FRAME_BODY
                            and c3 == number
                            and s3 == size
                            and 0 < size <= self.settings.max_message_size
                            and size + 8 <= self._read_max
                            and s2 + 8 <= self._read_max
                            and be < n
                            and data[be] == 0xCE
                            and data[pos + 19 : he] == channel.last_raw
                        ):
                            pos = be + 1
                            channel.basic_publish(payload[4:])
                            channel.decoded = channel.last_decoded
                            channel.publish_content(data[bp + 7 : be])
                            if self.closed:
                                return
                            continue
            if self._held is not None:
                # Logging in: what follows connection.open waits, unread
                # (reading is paused), bounded by what one read brought.
                if len(self._held) >= 1000:
                    raise ConnectionError_(NOT_ALLOWED, f"too many frames {self._held_why}")
                self._held.append((ftype, number, payload))
                continue
            self._frame(ftype, number, payload, channels)
            if self.closed:
                return
        if pos < n:
            rest = data[pos:]
            self._buffer += rest
            if self._buffer_since is None:
                self._buffer_since = self._seconds()
        else:
            self._buffer_since = None
        self._account()

    def _frame(self, ftype: int, number: int, payload: bytes, channels: dict[int, AmqpChannel]) -> None:
        if ftype == FRAME_METHOD:
            if len(payload) < 4:
                raise ConnectionError_(FRAME_ERROR, "method frame too short")
            index = (payload[0] << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]
            if number == 0:
                self._connection_method(index, payload[4:])
                return
            if self.state == _CLOSING:
                return
            if self.state != _OPEN_DONE:
                raise ConnectionError_(COMMAND_INVALID, "channel method before connection.open-ok", index)
            channel = channels.get(number)
            if channel is None:
                if index == commands.Channel.Open.index:
                    self._open_channel(number)
                    return
                if index == commands.Channel.CloseOk.index:
                    return
                raise ConnectionError_(CHANNEL_ERROR, f"expected channel.open on channel {number}", index)
            channel.method(index, payload[4:])
        elif ftype == FRAME_BODY:
            if self.state == _CLOSING:
                return
            channel = channels.get(number)
            if channel is None:
                raise ConnectionError_(CHANNEL_ERROR, f"content body on channel {number}, which is not open")
            channel.content_body(payload)
        elif ftype == FRAME_HEADER:
            if self.state == _CLOSING:
                return
            channel = channels.get(number)
            if channel is None:
                raise ConnectionError_(CHANNEL_ERROR, f"content header on channel {number}, which is not open")
            channel.content_header(payload)
        elif ftype == FRAME_HEARTBEAT:
            if number != 0:
                raise ConnectionError_(COMMAND_INVALID, "heart-beat frame on a channel other than 0")
        else:
            raise ConnectionError_(FRAME_ERROR, f"unknown frame type {ftype}")

    def _bad_header(self) -> None:
        """Not AMQP 0-9-1: the header we speak, then close (AMQP 0-9-1 4.2.2)."""
        self.transport.write_frames([PROTOCOL_HEADER])
        self._finish("bad protocol header")

    # -- accounting of unfinished input ---------------------------------------------------

    def content_started(self, channel: AmqpChannel) -> None:
        channel.content_started = self._seconds()
        self._contents[channel] = None

    def content_done(self, channel: AmqpChannel) -> None:
        self._contents.pop(channel, None)

    def _account(self) -> None:
        """Count the bytes of unfinished frames and contents in the broker's
        budget for unfinished input (as STOMP's reader does); the connection
        that crosses it is closed."""
        if self._released:
            return  # what it held was given back with the rest
        pending = len(self._buffer)
        for channel in self._contents:
            pending += channel.received
        broker = self.broker
        grew = pending > self._unfinished
        broker.unfinished_bytes += pending - self._unfinished
        self._unfinished = pending
        limit = broker.max_unfinished_bytes
        if grew and limit and broker.unfinished_bytes > limit:
            raise ConnectionError_(
                RESOURCE_ERROR,
                "too many bytes of unfinished frames are held across all connections "
                f"(limits.max_unfinished_bytes = {limit}); send smaller messages or retry later",
            )

    def _watch(self) -> None:
        """The frame deadline: a frame, or a message's content, unfinished
        for longer than C{frame_timeout} closes the connection."""
        if self.closed:
            return
        limit = self.settings.frame_timeout
        now = self._seconds()
        late = self._buffer_since is not None and now - self._buffer_since > limit
        if not late:
            late = any(now - c.content_started > limit for c in self._contents)
        if late:
            self.connection_error(
                FRAME_ERROR, f"a frame or a message's content took longer than {limit:g} s "
                "(amqp.frame_timeout)")

    # -- the handshake -----------------------------------------------------------------

    def _started(self) -> None:
        self.state = _START_OK
        identity = getattr(self.transport, "identity", None)
        mechanisms = "PLAIN AMQPLAIN" + (" EXTERNAL" if identity is not None else "")
        self.send0(
            commands.Connection.Start(
                0, 9,
                {
                    "product": "QMQ",
                    "version": __version__,
                    "platform": "Python/Twisted",
                    "information": "https://github.com/qmq (AMQP 0-9-1 frontend)",
                    "capabilities": dict(CAPABILITIES),
                },
                mechanisms,
                "en_US",
            )
        )

    def _connection_method(self, index: int, payload: bytes) -> None:
        state = self.state
        if state == _CLOSING:
            if index == commands.Connection.CloseOk.index:
                self._finish("close-ok")
            elif index == commands.Connection.Close.index:
                self.send0(commands.Connection.CloseOk())
                self.flush()
                self._finish("close")
            return
        args = _decode_method(index, payload)
        if index == commands.Connection.StartOk.index and state == _START_OK:
            self._start_ok(args)
        elif index == commands.Connection.TuneOk.index and state == _TUNE_OK:
            self._tune_ok(args)
        elif index == commands.Connection.Open.index and state == _OPEN:
            self._open(args)
        elif index == commands.Connection.Close.index:
            self.send0(commands.Connection.CloseOk())
            self.flush()
            self._finish("client closed")
        elif index in (commands.Connection.Blocked.index, commands.Connection.Unblocked.index):
            pass  # a client's own alarms: nothing for the broker to do
        else:
            raise ConnectionError_(
                COMMAND_INVALID if index in commands.INDEX_MAPPING else NOT_IMPLEMENTED,
                f"{getattr(args, 'name', index)} is not expected now", index)

    def _start_ok(self, args: Any) -> None:
        properties = args.client_properties or {}
        caps = properties.get("capabilities")
        if isinstance(caps, dict):
            self.client_capabilities = caps
        mechanism = args.mechanism
        response = args.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        if mechanism == "PLAIN":
            parts = bytes(response).split(b"\0")
            if len(parts) != 3:
                raise ConnectionError_(ACCESS_REFUSED, "malformed PLAIN response")
            self.login = parts[1].decode("utf-8", "replace")
            self._password = parts[2].decode("utf-8", "replace")
        elif mechanism == "AMQPLAIN":
            try:
                _, table = decode.field_table(struct.pack(">I", len(response)) + bytes(response))
            except ValueError:
                raise ConnectionError_(ACCESS_REFUSED, "malformed AMQPLAIN response") from None
            self.login = str(table.get("LOGIN", ""))
            self._password = str(table.get("PASSWORD", ""))
        elif mechanism == "EXTERNAL" and getattr(self.transport, "identity", None) is not None:
            self.login = None
            self._password = None
        else:
            raise ConnectionError_(
                ACCESS_REFUSED, f"unsupported authentication mechanism {mechanism!r} "
                "(offered: PLAIN, AMQPLAIN, and EXTERNAL with a client certificate)")
        self._mechanism = mechanism
        self.state = _TUNE_OK
        settings = self.settings
        self.send0(commands.Connection.Tune(settings.channel_max, settings.frame_max, settings.heartbeat))

    def _tune_ok(self, args: Any) -> None:
        settings = self.settings
        frame_max = args.frame_max or settings.frame_max
        if frame_max < 4096:
            raise ConnectionError_(NOT_ALLOWED, f"frame_max {frame_max} is below the minimum, 4096")
        self.frame_max = min(frame_max, settings.frame_max)
        self._read_max = self.frame_max
        self.channel_max = min(args.channel_max or settings.channel_max, settings.channel_max)
        self.heartbeat = args.heartbeat
        self.state = _OPEN
        if self.heartbeat:
            self._heartbeat_loop = LoopingCall(self._beat)
            self._heartbeat_loop.clock = self.clock
            self._heartbeat_loop.start(self.heartbeat / 2, now=False)

    def _open(self, args: Any) -> None:
        name = args.virtual_host or "/"
        auth = self.broker.auth
        if auth is None:
            vhost = self.broker.vhosts.get(name)
            if vhost is None:
                raise ConnectionError_(NOT_ALLOWED, f"vhost {name!r} not found", commands.Connection.Open.index)
            self._opened(vhost, None)
            return
        identity = getattr(self.transport, "identity", None)
        credentials = auth.credentials(name, self.login, self._password, identity)
        self._password = None
        self.state = _LOGIN
        self._held = []
        self.transport.pause_reading()
        d = auth.authenticate(name, credentials, getattr(self.transport, "peer_host", "") or "")
        d.addCallbacks(self._authenticated, self._not_authenticated, callbackArgs=(name,))

    def _authenticated(self, user: Any, name: str) -> None:
        if self.closed:
            return
        held, self._held = self._held, None
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            self.transport.resume_reading()
            self.connection_error(NOT_ALLOWED, f"vhost {name!r} not found", commands.Connection.Open.index)
            return
        self._opened(vhost, user)
        if user.expires is not None:
            self._expiry = self.clock.callLater(max(0.0, user.expires - self._seconds()), self._expired)
        batcher = self._batcher
        batcher.hold()
        try:
            for ftype, number, payload in held or ():
                if self.closed or self.state == _CLOSING:
                    break
                self._frame(ftype, number, payload, self.channels)
        except ConnectionError_ as e:
            self.connection_error(e.code, e.text, e.method)
        finally:
            batcher.release()
        if not self.closed and not self.blocked:
            self.transport.resume_reading()

    def _not_authenticated(self, failure: Failure) -> None:
        self._held = None
        if self.closed:
            return
        self.transport.resume_reading()
        from qmq.auth import login_refusal  # noqa: PLC0415

        refusal = login_refusal(failure, self.id)
        if refusal is not None:
            self.connection_error(ACCESS_REFUSED, refusal.message, commands.Connection.Open.index)
        else:
            self.connection_error(INTERNAL_ERROR, "the broker failed to check the credentials; see its log")

    def _expired(self) -> None:
        self._expiry = None
        self.connection_error(CONNECTION_FORCED, "the token this connection logged in with has expired")

    def _opened(self, vhost: Any, user: Any) -> None:
        self.vhost = vhost
        self.user = user
        if user is not None:
            self.owner = user.owner
        elif self.login:
            self.owner = self.login
        else:
            identity = getattr(self.transport, "identity", None)
            if identity is not None:
                self.owner = identity.common_name or identity.subject or identity.fingerprint
        self.state = _OPEN_DONE
        timer, self._connect_timer = self._connect_timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self.send0(commands.Connection.OpenOk())
        # A line per connection: debug, as STOMP's CONNECT line is.
        log.debug("amqp open session={session} peer={peer} vhost={vhost} user={user} mechanism={mech} "
                 "frame_max={fm} channel_max={cm} heartbeat={hb}", session=self.id, peer=self.peer,
                 vhost=vhost.name, user=user.name if user is not None else self.login, mech=self._mechanism,
                 fm=self.frame_max, cm=self.channel_max, hb=self.heartbeat)

    def _connect_timeout(self) -> None:
        self._connect_timer = None
        if self.closed or self.state == _OPEN_DONE:
            return
        log.info("amqp handshake timeout session={session} peer={peer}", session=self.id, peer=self.peer)
        if self.state in (_HEADER, _CLOSING):
            self._finish("handshake timeout")
        else:
            self.connection_error(CONNECTION_FORCED, "the handshake took longer than "
                                  f"{self.settings.connect_timeout:g} s (amqp.connect_timeout)")

    # -- channels ---------------------------------------------------------------------------

    def _open_channel(self, number: int) -> None:
        if number > self.channel_max:
            raise ConnectionError_(
                NOT_ALLOWED, f"channel {number} is over the negotiated channel_max {self.channel_max}",
                commands.Channel.Open.index)
        channel = self.channels[number] = AmqpChannel(self, number)
        if self.paused:
            channel.core.pause()
        channel.send(commands.Channel.OpenOk())

    def wait_for(self, channel: AmqpChannel, d: Deferred, reply: Any, index: int) -> None:
        """C{channel}'s method waits for the core's answer C{d} (an
        operation carried to another node): until it comes, what the client
        sends waits unread, as while it logs in, so that replies keep the
        order of the requests; then C{reply(result)} is sent (None: no
        reply), or the refusal closes the channel, and what waited is read."""
        self._held = []
        self._held_why = "while the broker waits for another node"
        self.transport.pause_reading()

        def done(result: Any) -> None:
            if self.closed:
                return
            if reply is not None and not channel.closing:
                reply(result)

        def failed(failure: Failure) -> None:
            if self.closed:
                return
            if failure.check(BrokerError):
                self.core_error(channel, failure.value, index)
            else:
                log.failure("amqp: an operation of session {session} failed", failure, session=self.id)
                self.connection_error(INTERNAL_ERROR, "internal error", index)

        d.addCallbacks(done, failed)
        d.addBoth(lambda _: self._read_held())

    def _read_held(self) -> None:
        """Read what waited (L{wait_for}); a frame that waits again keeps the rest waiting."""
        held, self._held = self._held, None
        if self.closed:
            return
        batcher = self._batcher
        batcher.hold()
        try:
            for i, (ftype, number, payload) in enumerate(held or ()):
                if self.closed or self.state == _CLOSING:
                    break
                self._frame(ftype, number, payload, self.channels)
                if self._held is not None:
                    self._held[:0] = held[i + 1 :]  # type: ignore[index]
                    return
        except ConnectionError_ as e:
            self.connection_error(e.code, e.text, e.method)
        finally:
            batcher.release()
        if not self.closed and not self.blocked:
            self.transport.resume_reading()

    def channel_gone(self, channel: AmqpChannel) -> None:
        """The channel is closed both ways: forget it, give back what it held."""
        if self.channels.get(channel.number) is channel:
            del self.channels[channel.number]
        self._contents.pop(channel, None)
        self._confirming.discard(channel)
        channel.close_core()

    def core_error(self, channel: AmqpChannel, e: BrokerError, index: int = 0) -> None:
        """A core refusal: a channel exception, or a connection one for the
        codes AMQP makes so."""
        code = e.code
        if isinstance(e, NotFound):
            code = NOT_FOUND
        if code in CHANNEL_CODES:
            self.channel_error(channel, code, e.message, index)
        else:
            self.connection_error(code if code in REPLY_CODES else INTERNAL_ERROR, e.message, index)

    def channel_error(self, channel: AmqpChannel, code: int, text: str, index: int = 0) -> None:
        """Close C{channel} with C{code}: what it held goes back now; its
        number stays taken until the client's close-ok."""
        if channel.closing or self.closed:
            return
        class_id, method_id = _class_method(index)
        channel.send(commands.Channel.Close(code, _reply_text(code, text), class_id, method_id))
        channel.closing = True
        self._contents.pop(channel, None)
        self._confirming.discard(channel)
        channel.close_core()
        log.debug("amqp channel error session={session} channel={channel} code={code} text={text}",
                  session=self.id, channel=channel.number, code=code, text=text)

    def connection_error(self, code: int, text: str, index: int = 0) -> None:
        """Close the connection with C{code}: connection.close, then the
        socket once the client's close-ok comes (or the close grace ends)."""
        if self.closed or self.state == _CLOSING:
            return
        if self.state == _HEADER:
            self._finish(text)
            return
        class_id, method_id = _class_method(index)
        self.send0(commands.Connection.Close(code, _reply_text(code, text), class_id, method_id))
        self.flush()
        self.state = _CLOSING
        self._held = None
        self._release()
        log.info("amqp connection error session={session} peer={peer} code={code} text={text!r}",
                 session=self.id, peer=self.peer, code=code, text=text)
        grace = getattr(self.transport, "close_grace", 2.0)
        self._close_timer = self.clock.callLater(grace, self._finish, "no close-ok")
        # Keep reading (for close-ok) even if reading was paused.
        self.transport.resume_reading()

    def shutdown(self, reason: str = "broker shutting down") -> None:
        """Tell the client the broker is going away (320 CONNECTION_FORCED)."""
        self.connection_error(CONNECTION_FORCED, reason)

    def _finish(self, reason: str) -> None:
        """Close the socket."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self._release()
        self.transport.close(reason)

    # -- timers -----------------------------------------------------------------------------

    def _beat(self) -> None:
        if self.closed:
            return
        now = self._seconds()
        if now - self.last_read > 2 * self.heartbeat:
            log.info("amqp heart-beat timeout session={session} peer={peer}", session=self.id, peer=self.peer)
            # The client is gone: a close it cannot read is pointless.
            self._finish("missed heart-beats")
            return
        if now - self._last_write >= self.heartbeat / 2:
            self.write(HEARTBEAT)

    # -- back-pressure ------------------------------------------------------------------------

    def pause(self) -> None:
        """The transport's write buffer is full: no channel gets more."""
        self.paused = True
        for channel in self.channels.values():
            channel.core.pause()

    def resume(self) -> None:
        self.paused = False
        for channel in list(self.channels.values()):
            if channel.flow and not channel.closing:
                channel.core.resume()

    def hold_back(self) -> None:
        """Admission holds publishers back (a memory or disk alarm): stop
        reading from this one, and tell it (connection.blocked)."""
        hold = self.admission.refusal(True)
        if hold is None:
            return
        self.blocked = True
        self.transport.pause_reading()
        self.admission.subscribe(self._admission_changed)
        if self.client_capabilities.get("connection.blocked"):
            self._blocked_sent = True
            self.send0(commands.Connection.Blocked(hold.detail[:255]))
        log.info("amqp publisher held back session={session} peer={peer}: {why}",
                 session=self.id, peer=self.peer, why=hold.detail)

    def _admission_changed(self, admission: Any) -> None:
        if admission.admits(True):
            self._unblock()

    def _unblock(self) -> None:
        if not self.blocked:
            return
        self.blocked = False
        self.admission.unsubscribe(self._admission_changed)
        if self.closed:
            return
        if self._blocked_sent:
            self._blocked_sent = False
            self.send0(commands.Connection.Unblocked())
        self.last_read = self._seconds()
        if self._buffer_since is not None:
            self._buffer_since = self.last_read
        for channel in self._contents:
            channel.content_started = self.last_read
        self.transport.resume_reading()

    @property
    def reading_blocked(self) -> bool:
        return self.blocked or self._held is not None

    # -- the end --------------------------------------------------------------------------

    def _release(self) -> None:
        """Give back everything the connection held (once)."""
        if self._released:
            return
        self._released = True
        for timer in (self._connect_timer, self._expiry):
            if timer is not None and timer.active():
                timer.cancel()
        self._connect_timer = self._expiry = None
        for loop in (self._heartbeat_loop, self._watch_loop):
            if loop is not None and loop.running:
                loop.stop()
        self._heartbeat_loop = self._watch_loop = None
        if self._unfinished:
            self.broker.unfinished_bytes -= self._unfinished
            self._unfinished = 0
        self._buffer = bytearray()
        self._contents.clear()
        self._unblock()
        channels, self.channels = self.channels, {}
        for channel in channels.values():
            channel.close_core()
        self.connection.close()

    def connection_lost(self) -> None:
        """The socket is gone."""
        self.closed = True
        self._out.clear()
        timer, self._close_timer = self._close_timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._release()


def _none_there(failure: Failure) -> int:
    """A queue's home node found no such queue: 0 deleted (RabbitMQ's
    queue.delete of a missing queue succeeds); other failures pass on."""
    if failure.check(NotFound) and not failure.check(Unavailable):
        return 0
    return failure  # type: ignore[return-value]
