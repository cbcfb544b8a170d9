# -*- test-case-name: tests.test_cluster_link -*-
"""One link between two nodes: the connection, its hello, heart-beats and
buffers. What flows over it is the mesh's business (L{qmq.cluster.mesh}).

The flow of a link's life:

    1. connected (dialed by L{qmq.cluster.mesh.Mesh}'s dialers, or accepted
       by a C{peer:} listener); over TLS the handshake already checked that
       the peer's certificate is signed by C{[cluster] ca}. Each side sends
       a B{hello}: its node id and the protocol's version
       (L{qmq.cluster.wire}).
    2. On the peer's hello, L{LinkProtocol} checks who it is: a node id,
       not this node, the version; over TLS the verified certificate must
       name that node (its CN or a subject alternative name), or, for a
       worker of a host (C{NODE-wI}), its host C{NODE}; a peer dialed
       with C{node=} must be that node; and the mesh may refuse it
       (L{qmq.cluster.mesh.Mesh.link_up}: a node not in C{peers}, or a
       second link to a node already linked: the tie-break). A refusal is
       logged with its reason and the peer is told (a B{close} frame).
    3. While it is up, each side sends a B{ping} every C{heartbeat} seconds
       (the other answers B{pong}: the round-trip time); a link that hears
       nothing for three heart-beats is closed, and so is one whose hello
       does not come within L{HELLO_TIMEOUT}.
    4. Output goes out once per reactor turn (the broker's write batcher),
       in one write; the turn's messages of one kind and virtual host
       share a batch frame (L{send_message}, L{qmq.cluster.wire}), its
       confirms and settles one frame each. While the transport's buffer is full (Twisted pauses
       the link as its producer), messages wait in the link's own buffer up
       to C{link_buffer} bytes; past that a message for this peer is
       dropped, counted (L{LinkProtocol.dropped}) and logged at most once a
       minute. Input is one frame at a time at most C{max_frame} bytes.
    5. L{close} says why in a close frame, then closes, and aborts a peer
       that does not let go within L{CLOSE_GRACE}; the mesh hears
       L{qmq.cluster.mesh.Mesh.link_down} once it is gone.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IPushProducer, ISSLTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from zope.interface import implementer

from qmq.cluster import manage, wire
from qmq.cluster.endpoints import certified_name
from qmq.core.ids import NODE_ID
from qmq.logs import peer_address
from qmq.tls import peer_identity
from qmq.transport import IConnection

if TYPE_CHECKING:
    from qmq.cluster.endpoints import Peer
    from qmq.cluster.mesh import Mesh

__all__ = ["CLOSE_GRACE", "HELLO_TIMEOUT", "LinkProtocol"]

log = Logger()

#: Seconds a new connection has to say hello.
HELLO_TIMEOUT = 10.0
#: Seconds a closed link's peer has to let go before it is aborted.
CLOSE_GRACE = 2.0
#: Heart-beats a link may miss before it is closed.
MISSED_BEATS = 3
#: Seconds between two log lines about messages dropped for one peer.
DROP_LOG_INTERVAL = 60.0


@implementer(IPushProducer, IConnection)
class LinkProtocol(Protocol):
    """A link (see the module docstring).

    @ivar node: the peer's node id, once its hello came.
    @ivar outbound: this node dialed it.
    @ivar state: C{"hello"} (waiting for the peer's), C{"up"}, C{"closed"}.
    @ivar messages_out, bytes_out, messages_in, bytes_in: what went each
        way (bytes of whole frames).
    @ivar dropped: messages dropped for this peer (its buffer was full).
    @ivar refused: messages from the peer the core refused (an exchange
        gone, a full queue).
    @ivar rtt: the last round-trip time measured, seconds, or None.
    @ivar protocol_name: what the connection registry's counts call it.
    @ivar remote: what the peer wants: (vhost, exchange, key) -> the
        consumer bound for it here, or None while it cannot be bound (no
        such exchange yet).
    """

    # Slots: past 30 attributes CPython 3.11 gives an instance a dict of its
    # own, and every attribute read on the hot path (a forward, a delivery,
    # a confirm) the slow way. Twisted's own (transport, connected) stay in
    # the instance dict the base class expects.
    __slots__ = (
        "_abort",
        "_batch_at",
        "_batch_cap",
        "_batch_seq",
        "_batch_size",
        "_batch_type",
        "_batch_vhost",
        "_beat",
        "_confirms",
        "_dropped_logged",
        "_failures",
        "_flush_wanted",
        "_heard",
        "_last_range",
        "_last_run",
        "_limit",
        "_out",
        "_out_bytes",
        "_paused",
        "_reader",
        "_settles",
        "address",
        "bytes_in",
        "bytes_out",
        "channels",
        "clock",
        "connected_at",
        "deadlines",
        "decoder",
        "dialer",
        "down",
        "dropped",
        "group",
        "group_waiter",
        "held_back",
        "homed",
        "last_sent",
        "last_waiter",
        "listener",
        "manages",
        "mesh",
        "messages_in",
        "messages_out",
        "next_seq",
        "node",
        "outbound",
        "peer",
        "peer_host",
        "pending",
        "queue_targets",
        "reason",
        "refused",
        "registry",
        "remote",
        "rtt",
        "state",
        "targets",
        "up_at",
    )

    protocol_name = "peer"

    def __init__(
        self,
        mesh: Mesh,
        outbound: bool,
        peer: Peer | None = None,
        dialer: Any = None,
        registry: Any = None,
        listener: str = "",
    ) -> None:
        """
        @param outbound: this node dialed it (C{peer} and C{dialer} say how).
        @param registry: the connection registry an accepted link is
            counted in (caps, the broker's shutdown), with its listener's name.
        """
        self.mesh = mesh
        self.registry = registry
        self.listener = listener
        self.clock = mesh.clock
        self.outbound = outbound
        self.peer = peer
        self.dialer = dialer
        self.node = ""
        self.state = "hello"
        self.reason = ""
        self.address = ""
        self.peer_host = ""
        self.messages_out = self.bytes_out = self.messages_in = self.bytes_in = 0
        self.dropped = self.refused = 0
        self.rtt: float | None = None
        self.connected_at = 0.0
        self.up_at: float | None = None
        self.remote: dict[tuple[str, str, str], Any] = {}
        self.channels: dict[str, Any] = {}
        #: (vhost, exchange, key) -> (channel, resolved target) of what it received.
        self.targets: dict[tuple[str, str, str], Any] = {}
        self.last_sent: Any = None
        #: The store's waiter the last message received was published with.
        self.last_waiter: Any = None
        #: Queues across nodes (L{qmq.cluster.queues}), this node's side:
        #: forwarded publishes waiting for the peer's confirm, by sequence.
        self.pending: dict[int, Any] = {}
        self.next_seq = 1
        #: The peer's consumers of queues homed here, by the peer's id.
        self.homed: dict[int, Any] = {}
        #: Those of them paused while the link's buffer is full.
        self.held_back: set[Any] = set()
        #: (vhost, queue) -> (channel, target) of what the peer forwards here.
        self.queue_targets: dict[tuple[str, str], Any] = {}
        #: The store's waiter the last forwards here wait on, and their
        #: sequence numbers (confirmed together when it fires).
        self.group_waiter: Any = None
        self.group: list[int] | None = None
        #: Deadlines of the forwards waiting for confirms: C{(first
        #: sequence number, deadline)}, one entry a second at most.
        self.deadlines: deque[tuple[int, float]] = deque()
        # Confirms ([first, count] ranges), failures and settles ([id,
        # first tag, count, outcome] runs) to send, one frame each per turn.
        self._confirms: list[list[int]] = []
        self._last_range: list[int] | None = None
        self._failures: list[tuple[int, int, str]] = []
        self._settles: list[list[int]] = []
        self._last_run: list[int] | None = None
        # The batch frame being filled (its type, 0 for none), its virtual
        # host, where its header goes in _out, its payload's size so far.
        self._batch_type = 0
        self._batch_vhost = b""
        self._batch_at = 0
        self._batch_size = 0
        self._batch_seq = 0
        self._batch_cap = min(wire.BATCH_BYTES, mesh.settings.max_frame - 64)
        self._limit = mesh.settings.link_buffer
        #: Set once the mesh let it go (L{qmq.cluster.mesh.Mesh.link_down}).
        self.down = False
        #: The peer takes management frames (its hello said so: L{qmq.cluster.manage}).
        self.manages = False
        self._reader = wire.FrameReader(mesh.settings.max_frame)
        self.decoder = wire.Decoder()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._paused = False
        self._flush_wanted = False
        self._heard = 0.0
        self._beat: Any = None
        self._abort: Any = None
        self._dropped_logged: float | None = None

    # -- connection -----------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()  # type: ignore[union-attr]
        self.peer_host = getattr(peer, "host", "") or ""
        self.address = peer_address(peer)
        self.connected_at = self._heard = self.clock.seconds()
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        if self.registry is not None:
            self.registry.add(self, self.listener)
        # "manage": it takes management frames (qmq.cluster.manage).
        self.send(wire.encode_json(wire.HELLO, {"node": self.mesh.node, "version": wire.VERSION, "manage": 1}))
        self._beat = self.clock.callLater(self.mesh.settings.heartbeat, self._tick)

    def _tick(self) -> None:
        self._beat = None
        if self.state == "closed":
            return
        now = self.clock.seconds()
        if self.state == "hello":
            if now - self.connected_at >= HELLO_TIMEOUT:
                self.close(f"no hello within {HELLO_TIMEOUT:g} s")
                return
        else:
            silent = now - self._heard
            if silent >= MISSED_BEATS * self.mesh.settings.heartbeat:
                self.close(f"nothing heard from the peer for {silent:.1f} s (heart-beats)")
                return
            self.send(wire.encode_clock(wire.PING, now))
            if self.pending:
                self.mesh.queues.expire(self, now)
        self._beat = self.clock.callLater(self.mesh.settings.heartbeat, self._tick)

    def dataReceived(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self._heard = self.clock.seconds()
        batcher = self.mesh.broker.batcher
        batcher.hold()
        try:
            buffer, frames = self._reader.feed(data)
            for type_, start, end in frames:
                self._frame(type_, buffer, start, end)
                if self.state == "closed":
                    return
        except wire.FrameError as e:
            self.close(f"protocol error: {e}")
        except Exception:
            # A bug here must not leave a link half-handled: say so, and
            # start again (the dialer reconnects, interest is re-sent).
            log.failure("link {link}: a frame could not be handled", link=self.describe())
            self.close("internal error")
        finally:
            batcher.release()

    def _frame(self, type_: int, buffer: bytes, start: int, end: int) -> None:
        if type_ in _BATCHES:
            if self.state != "up":
                raise wire.FrameError("a message before the hello")
            vhost, seq, items = self.decoder.batch(type_, buffer, start, end)
            self.messages_in += len(items)
            self.bytes_in += end - start + wire.HEADER_SIZE
            if type_ == wire.MESSAGE:
                self.mesh.received(self, vhost, items)
            elif type_ == wire.FORWARD:
                self.mesh.queues.forwarded(self, seq, vhost, items)
            else:
                self.mesh.queues.delivered(self, items)
            return
        if type_ == wire.CONFIRM or type_ == wire.SETTLE:
            if self.state != "up":
                raise wire.FrameError(f"{wire.NAMES[type_]} before the hello")
            if type_ == wire.CONFIRM:
                self.mesh.queues.confirmed(self, *wire.decode_confirm(buffer, start, end))
            else:
                self.mesh.queues.settled(self, wire.decode_settle(buffer, start, end))
            return
        payload = buffer[start:end]
        if type_ in _QUEUE_FRAMES:
            if self.state != "up":
                raise wire.FrameError(f"{wire.NAMES[type_]} before the hello")
            self.mesh.queues.control(self, type_, wire.decode_json(payload))
            return
        if type_ == wire.PING:
            self.send(wire.encode_clock(wire.PONG, wire.decode_clock(payload)))
        elif type_ == wire.PONG:
            self.rtt = max(0.0, self.clock.seconds() - wire.decode_clock(payload))
        elif type_ == wire.HELLO:
            self._hello(wire.decode_json(payload))
        elif type_ == wire.INTEREST:
            if self.state != "up":
                raise wire.FrameError("interest before the hello")
            value = wire.decode_json(payload)
            key = _interest_key(value.get("i"))
            self.mesh.remote_interest(self, key, bool(value.get("on")))
        elif type_ == wire.SYNC:
            if self.state != "up":
                raise wire.FrameError("interest before the hello")
            value = wire.decode_json(payload)
            items = value.get("interest")
            if not isinstance(items, list):
                raise wire.FrameError("bad sync: no interest list")
            self.mesh.remote_sync(self, {_interest_key(i) for i in items})
        elif type_ == wire.PEERS:
            if self.state != "up":
                raise wire.FrameError("peers before the hello")
            items = wire.decode_json(payload).get("peers")
            if not isinstance(items, list) or not all(
                isinstance(i, list) and len(i) == 2 and all(isinstance(v, str) for v in i) for i in items
            ):
                raise wire.FrameError("bad peers: expected [[node, endpoint], ...]")
            self.mesh.learned(self, items)
        elif type_ == wire.CLOSE:
            value = wire.decode_json(payload)
            reason = str(value.get("reason", ""))[:500]
            self.reason = f"the peer closed: {reason}"
            if value.get("duplicate") or value.get("self"):
                self.mesh.dialer_standby(self, forever=bool(value.get("self")))
            elif value.get("refused"):
                self.mesh.dialer_refused(self)
            log.info("link {link} closed by the peer: {reason}", link=self.describe(), reason=reason)
            self.close(None)
        elif type_ in MANAGE_FRAMES:
            self.mesh.manage.frame(self, type_, payload)
        else:
            raise wire.FrameError(f"unknown frame type {type_}")

    def _hello(self, hello: dict[str, Any]) -> None:
        if self.state != "hello":
            raise wire.FrameError("a second hello")
        node = hello.get("node")
        version = hello.get("version")
        if version != wire.VERSION:
            self.refuse(f"link protocol version {version!r} (this node speaks {wire.VERSION})")
            return
        if not isinstance(node, str) or not NODE_ID.match(node):
            self.refuse(f"{node!r} is not a node id")
            return
        self.node = node
        self.manages = hello.get("manage") == 1
        if node == self.mesh.node:
            if self.outbound:
                log.info(
                    "mesh: {peer} is this node itself: not dialed again",
                    peer=self.peer.text if self.peer is not None else self.address,
                )
            self.mesh.dialer_standby(self, forever=True)
            self.close("this is a link to this node itself", extra={"self": True})
            return
        if self.peer is not None and self.peer.node and node != self.peer.node:
            self.refuse(f"it says it is node {node!r}, and {self.peer.text!r} names node {self.peer.node!r}")
            return
        if ISSLTransport.providedBy(self.transport):
            identity = peer_identity(self.transport)
            if identity is None:
                self.refuse(f"node {node!r} presented no certificate")
                return
            if node not in identity.names and certified_name(node) not in identity.names:
                names = ", ".join(identity.names) or "nothing"
                self.refuse(f"it says it is node {node!r}, and its certificate names {names}")
                return
        problem = self.mesh.link_up(self)
        if problem:
            self.refuse(problem)

    # -- output ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue a control frame (sent at the end of the reactor turn)."""
        if self.state == "closed":
            return
        if self._batch_type:
            self._close_batch()
        if self._confirms or self._failures or self._settles:
            # Settles first: a cancel after them must not overtake them
            # (the home would give back what they ack).
            self._controls()
        self._out.append(data)
        self._out_bytes += len(data)
        self._want_flush()

    def confirm(self, seq: int, count: int = 1) -> None:
        """The forwarded publishes C{seq} to C{seq + count - 1} are taken
        (sent with the turn's others, consecutive ones as one range)."""
        last = self._last_range
        if last is not None and last[0] + last[1] == seq:
            last[1] += count
            return
        last = self._last_range = [seq, count]
        self._confirms.append(last)
        self._want_flush()

    def fail(self, seq: int, code: int, text: str) -> None:
        """The forwarded publish C{seq} is refused (sent with the turn's others)."""
        self._failures.append((seq, code, text))
        self._want_flush()

    def settle(self, sub: int, tag: int, outcome: int, limit: int = 1) -> None:
        """Delivery C{tag} of consumer C{sub} is settled (0 ack, 1 requeue,
        2 drop): sent with the turn's others, in one frame, consecutive
        tags of one consumer with one outcome as one run of at most
        C{limit} (the window the consumer was opened with: the home
        refuses a longer run)."""
        last = self._last_run
        if last is not None and last[1] + last[2] == tag and last[0] == sub and last[3] == outcome and last[2] < limit:
            last[2] += 1
            return
        last = self._last_run = [sub, tag, 1, outcome]
        self._settles.append(last)
        self._want_flush()

    def credit(self, sub: int, limit: int) -> None:
        """Consumer C{sub} (without acks) took one more delivery: its home
        may send one more (sent with the turn's settles, a run of at most
        C{limit}, the consumer's window)."""
        last = self._last_run
        if last is not None and last[0] == sub and last[3] == wire.CREDIT and last[2] < limit:
            last[2] += 1
            return
        last = self._last_run = [sub, 0, 1, wire.CREDIT]
        self._settles.append(last)
        self._want_flush()

    @property
    def full(self) -> bool:
        """Whether the link's buffer holds C{link_buffer} bytes or more."""
        return self._out_bytes >= self._limit

    def send_message(
        self, type_: int, vhost: bytes, chunks: list[bytes], size: int, force: bool = False, seq: int = 0
    ) -> bool:
        """Add a message to the turn's batch frame of C{type_} for
        C{vhost} (a new batch when the last one is of another kind or full:
        L{wire.BATCH_BYTES}); C{chunks} are its item (L{wire.encode_item},
        L{wire.encode_delivery}), C{size} bytes in all; C{seq} is a
        forward's sequence number (the next after the batch's last). It is
        dropped when the link's buffer is full (unless C{force}: a delivery
        to a consumer of a queue, bounded by its window and paused when the
        buffer is full, L{qmq.cluster.queues}).

        @return: whether it was queued."""
        if self.state == "closed":
            return False
        out_bytes = self._out_bytes + size
        if out_bytes > self._limit and not force and self._out:
            self._drop()
            return False
        batch = self._batch_size + size
        if (
            self._batch_type != type_
            or batch > self._batch_cap
            or seq != self._batch_seq
            or self._batch_vhost != vhost
        ):
            prefix = self._open_batch(type_, vhost, seq)
            batch = len(prefix) + size
            out_bytes += len(prefix) + wire.HEADER_SIZE
        self._batch_size = batch
        if seq:
            self._batch_seq = seq + 1
        self._out += chunks
        self._out_bytes = out_bytes
        self.messages_out += 1
        self.bytes_out += size
        return True

    def _open_batch(self, type_: int, vhost: bytes, seq: int) -> bytes:
        """Close the batch being filled, if any, and open one: its prefix."""
        if self._batch_type:
            self._close_batch()
        out = self._out
        prefix = wire.batch_prefix(type_, vhost, seq)
        if type_ == wire.FORWARD:
            self.mesh.queues.batch_opened(self, seq)
        self._batch_type = type_
        self._batch_vhost = vhost
        self._batch_seq = seq
        self._batch_at = len(out)
        out.append(b"")  # the header, once the batch is whole
        out.append(prefix)
        self._want_flush()
        return prefix

    def _drop(self) -> None:
        """A message for the peer is dropped: its buffer is full."""
        self.dropped += 1
        now = self.clock.seconds()
        if self._dropped_logged is None or now - self._dropped_logged >= DROP_LOG_INTERVAL:
            self._dropped_logged = now
            log.warn(
                "link {link}: the peer does not read; messages for it are dropped "
                "({dropped} so far, {buffered} bytes waiting)",
                link=self.describe(),
                dropped=self.dropped,
                buffered=self._out_bytes,
            )

    def _want_flush(self) -> None:
        if not self._flush_wanted and not self._paused and self.state != "closed":
            self._flush_wanted = True
            self.mesh.broker.batcher.want_flush(self)

    def _close_batch(self) -> None:
        """The batch being filled is whole: its header goes in."""
        self._out[self._batch_at] = wire.header(self._batch_type, self._batch_size)
        self._batch_type = 0
        self._batch_size = 0

    def _controls(self) -> None:
        """The turn's confirms and settles, one frame of each."""
        if self._confirms or self._failures:
            data = wire.encode_confirm(self._confirms, self._failures)
            self._confirms, self._failures, self._last_range = [], [], None
            self._out.append(data)
            self._out_bytes += len(data)
        if self._settles:
            data = wire.encode_settle(self._settles)
            self._settles, self._last_run = [], None
            self._out.append(data)
            self._out_bytes += len(data)

    def flush(self) -> None:
        """Write what waits, in one write (the write batcher calls it)."""
        self._flush_wanted = False
        if self._paused or self.transport is None:
            return
        if self._batch_type:
            self._close_batch()
        if self._confirms or self._failures or self._settles:
            self._controls()
        if not self._out:
            return
        out, self._out = self._out, []
        self._out_bytes = 0
        self.transport.writeSequence(out)
        if self.held_back and not self._paused:
            self.mesh.queues.unblock(self)

    # IPushProducer: the transport's write buffer is full, or drained.
    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._out or self._confirms or self._failures or self._settles:
            self._want_flush()

    def stopProducing(self) -> None:
        self._paused = True

    # -- the end --------------------------------------------------------------

    def refuse(self, reason: str) -> None:
        """Refuse the peer: logged with the reason, told, closed."""
        log.warn(
            "link {link} refused: {reason}",
            link=self.describe(),
            reason=reason,
        )
        self.close(f"refused: {reason}", extra={"refused": True})

    def close(self, reason: str | None, extra: dict[str, Any] | None = None) -> None:
        """Close for real (see the module docstring); C{reason} goes to the
        peer in a close frame (None: the peer closed, nothing to say)."""
        if self.state == "closed":
            return
        if reason is not None:
            self.reason = reason
            if self._batch_type:
                self._close_batch()
            self._out.append(wire.encode_json(wire.CLOSE, {"reason": reason, **(extra or {})}))
            self._paused = False
            self.flush()
        self.state = "closed"
        if self._beat is not None and self._beat.active():
            self._beat.cancel()
        self._beat = None
        self.mesh.link_down(self)
        transport = self.transport
        if transport is None:
            return
        transport.unregisterProducer()  # type: ignore[attr-defined]
        transport.loseConnection()
        self._abort = self.clock.callLater(CLOSE_GRACE, self.abort)

    def shutdown(self, reason: str) -> None:
        """IConnection: the broker is going away."""
        self.close(reason)

    def abort(self) -> None:
        """IConnection: drop it now."""
        self._abort = None
        transport = self.transport
        if transport is not None:
            transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any = None) -> None:
        if self.registry is not None:
            self.registry.remove(self)
        was = self.state
        self.state = "closed"
        if self._beat is not None and self._beat.active():
            self._beat.cancel()
        if self._abort is not None and self._abort.active():
            self._abort.cancel()
        self._beat = self._abort = None
        self._out = []
        self._out_bytes = 0
        self._batch_type = 0
        if not self.reason:
            self.reason = reason.getErrorMessage() if reason is not None else "connection lost"
        if was == "hello" and not self.node:
            # A TLS handshake refused (a certificate from another CA, a
            # name that is not the host dialed) ends here: say why.
            log.warn(
                "link {link} lost before its hello: {reason}",
                link=self.describe(),
                reason=self.reason,
            )
        self.mesh.link_down(self)

    def describe(self) -> str:
        direction = "to" if self.outbound else "from"
        who = self.node or (self.peer.text if self.peer is not None else "?")
        return f"{direction} {who} ({self.address})"

    def snapshot(self) -> dict[str, Any]:
        """The link as the management API shows it."""
        now = self.clock.seconds()
        return {
            "node": self.node,
            "direction": "out" if self.outbound else "in",
            "address": self.address,
            "state": self.state,
            "up_seconds": round(now - self.up_at, 3) if self.up_at is not None else None,
            "rtt_ms": round(self.rtt * 1000, 3) if self.rtt is not None else None,
            "messages_out": self.messages_out,
            "bytes_out": self.bytes_out,
            "messages_in": self.messages_in,
            "bytes_in": self.bytes_in,
            "dropped": self.dropped,
            "refused": self.refused,
            "buffered_bytes": self._out_bytes,
            "peer_interest": sorted("/".join(k) for k in self.remote),
            "unconfirmed": len(self.pending),
            "peer_consumers": len(self.homed),
        }


#: Management across nodes (L{qmq.cluster.manage}).
MANAGE_FRAMES = manage.KINDS

#: The JSON control frames of queues across nodes (L{qmq.cluster.queues}).
_QUEUE_FRAMES = frozenset((wire.CONSUME, wire.CANCEL, wire.CANCELLED, wire.DECLARE))
#: The frames that carry messages.
_BATCHES = frozenset((wire.MESSAGE, wire.FORWARD, wire.DELIVER))


def _interest_key(value: Any) -> tuple[str, str, str]:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, str) for v in value)
    ):
        raise wire.FrameError("bad interest: expected [vhost, exchange, key]")
    return (value[0], value[1], value[2])
