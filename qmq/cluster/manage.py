# -*- test-case-name: tests.test_workers_manage -*-
"""Management across nodes: asking the other nodes of a mesh, and
topology shared by every node.

Workers are the nodes of one host's mesh (docs/workers.rst), so this is
the same between workers and between hosts.

Requests and answers (frames L{ASK} and L{ANSWER}, JSON):
    A node asks another over their link: C{{"id": n, "op": OP, "args":
    {...}}}; the other answers C{{"id": n, "ok": VALUE}} or C{{"id": n,
    "error": [code, text]}} (the core's refusal, with its AMQP reply
    code). Id 0 is a notice: no answer. Each request has a deadline
    (L{TIMEOUT}); at most L{MAX_PENDING} wait at once; an answer is at most
    L{MAX_ANSWER} bytes (and a list at most L{MAX_ITEMS} items, the answer
    saying C{"truncated"}); a link that goes fails what waits on it at
    once. A C{queue.get}'s message goes in a L{GOT} frame instead, as
    is, up to the asker's and the home's C{max_frame}, when the asker says
    it takes one. L{Manage.ask_all} asks every other node of the membership and
    names those that did not answer (C{missing}): a listing says which
    nodes it lacks rather than passing a partial list for the whole.

    Operations (L{Manage.handlers}, done on the node asked): C{queues},
    C{queue} (one queue's facts), C{bindings} (of the queues homed there),
    C{connections}, C{definitions} (the queues homed there and their
    bindings as a definitions document has them, for an export or import
    of the whole broker: L{qmq.core.definitions.home_definitions}); C{queue.purge}, C{queue.delete}, C{queue.bind},
    C{queue.unbind}, C{queue.get} and C{queue.settle} (AMQP's C{basic.get}:
    the message waits unacked on the link's channel there), C{queue.scan}
    (a range scan of its log, the page in a L{GOT} frame) of a queue homed
    there; C{http.settle} (receipt handles of the HTTP receivers there,
    for an identity); C{connection.close}. The identity is checked where the request
    arrived (L{qmq.core.management.Management}, the core's authorize); the
    node asked does what it is asked, the core's own rules (a session's
    queue, a missing exchange) still refusing.

Topology:
    Exchanges declared or deleted at run time (AMQP C{exchange.declare},
    the HTTP API, definitions imported) are the core's topology events
    (L{qmq.core.events}): each is told to every linked node (a notice),
    which declares (or deletes) it too, durable if it was, so it survives
    a restart of any node in that node's own store; exchange-to-exchange
    bindings the same. A link that comes up carries every exchange and
    exchange binding of the sender (a sync): what a node missed while it
    was down is made. Deletions of auto-delete exchanges are
    each node's own (they go with each node's last binding). Queue bindings
    live on the queue's home (C{queue.bind} is carried there); the mesh's
    interest brings what is published elsewhere to it.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from qmq.cluster import wire
from qmq.cluster.queues import not_homed_here
from qmq.core.definitions import home_definitions
from qmq.core.errors import (
    AccessRefused,
    BrokerError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from qmq.core.events import Observer
from qmq.core.management import Management, check_equivalent, queue_facts
from qmq.core.message import Message
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX
from qmq.core.remote import Unavailable
from qmq.core.store import ScanPage
from qmq.core.vhost import make_cursor
from qmq.store import record

if TYPE_CHECKING:
    from qmq.cluster.link import LinkProtocol
    from qmq.cluster.mesh import Mesh

__all__ = ["ANSWER", "ASK", "KINDS", "Manage", "decode_message", "decode_messages", "encode_message", "exchange_facts",
           "queue_facts"]

log = Logger()

# Frame types, above those of every other part of the link protocol.
ASK = 41  # JSON: {"id": n, "op": name, "args": {...}}; id 0: a notice, no answer
ANSWER = 42  # JSON: {"id": n, "ok": value} or {"id": n, "error": [code, text]}
# The answer of a queue.get whose asker said it takes one ("frame": its
# max_frame): a 4-byte length, that JSON ({"id": n, "ok": {"tag", "count",
# "remaining"}}), then the message's record as is (no base64, no JSON).
GOT = 43
KINDS = frozenset((ASK, ANSWER, GOT))
_LENGTH = struct.Struct(">I")

#: Seconds a node waits for an answer.
TIMEOUT = 5.0
#: Most requests waiting for answers at once.
MAX_PENDING = 1000
#: Most bytes of one answer (a list is cut to fit, saying so).
MAX_ANSWER = 4 * 1024 * 1024
#: Most items of one list answer.
MAX_ITEMS = 10_000
#: Most bytes of a message a get from another node carries in a JSON answer
#: (its encoded record, base64), to a request that takes no L{GOT} frame.
MAX_GET = MAX_ANSWER * 3 // 4 - 4096
#: Room a L{GOT} frame keeps for its header and JSON head: the record may
#: take the rest of the asker's and the home's C{max_frame}.
GOT_OVERHEAD = 1024

_ERRORS: dict[int, type[BrokerError]] = {
    404: NotFound,
    403: AccessRefused,
    405: ResourceLocked,
    406: PreconditionFailed,
    530: NotAllowed,
}


def exchange_facts(exchange: Any) -> list[Any]:
    """[name, type, durable, auto_delete, internal, arguments] of C{exchange}."""
    return [
        exchange.name,
        exchange.type,
        exchange.durable,
        exchange.auto_delete,
        exchange.internal,
        exchange.arguments or {},
    ]


def _encode(type_: int, value: Any) -> bytes:
    # Arguments may hold what JSON has no type for (AMQP's decimals, bytes): as text.
    return wire.frame(type_, json.dumps(value, separators=(",", ":"), default=str).encode())


class Manage(Observer):
    """This node's side of management across nodes (see the module docstring).

    @ivar handlers: operation name -> C{f(link, args) -> value or Deferred}.
    @ivar registry: the connection registry (L{qmq.connections.ConnectionRegistry}), or None.
    """

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.broker = mesh.broker
        self.clock = mesh.clock
        self.registry: Any = None
        self._pending: dict[int, tuple[Deferred, LinkProtocol, Any]] = {}
        self._next_id = 1
        self._applying = False
        #: Messages got (basic.get) from queues homed elsewhere, to settle
        #: there: message -> (link, vhost, the home's tag).
        self.got: dict[Any, tuple[LinkProtocol, str, int]] = {}
        #: Auto-delete exchanges (vhost, name): their deletions are each node's own.
        self._auto: set[tuple[str, str]] = set()
        self._stop_observing: Callable[[], None] | None = None
        #: Called with each link that goes (after what waited on it failed).
        self.link_watchers: list[Callable[[LinkProtocol], None]] = []
        #: This node's queues exclusive to a connection, told to every
        #: node (L{queue_declared}): vhost -> names.
        self._owned_here: dict[str, set[str]] = {}
        self.handlers: dict[str, Callable[[LinkProtocol, dict[str, Any]], Any]] = {
            "queues": self._queues,
            "queue": self._queue,
            "bindings": self._bindings,
            "connections": self._connections,
            "definitions": self._definitions,
            "queue.purge": self._purge,
            "queue.declare": self._declare_queue,
            "queue.get": self._get,
            "queue.scan": self._scan,
            "http.settle": self._http_settle,
            "queue.owned": self._owned,
            "queue.settle": self._settle,
            "queue.delete": self._delete,
            "queue.bind": self._bind,
            "queue.unbind": self._unbind,
            "connection.close": self._close_connection,
            "exchange.declare": self._exchange_declare,
            "exchange.delete": self._exchange_delete,
            "exchanges": self._exchanges_sync,
            "exchange.bind": self._exchange_bind,
            "exchange.unbind": self._exchange_bind,
        }

    @property
    def waiting(self) -> int:
        """How many requests of this node wait for an answer."""
        return len(self._pending)

    # -- the service ---------------------------------------------------------------

    def start(self) -> None:
        self._stop_observing = self.broker.observe(self, replay=False)

    def stop(self) -> None:
        if self._stop_observing is not None:
            self._stop_observing()
            self._stop_observing = None
        for d, _, timer in list(self._pending.values()):
            self._fail(d, timer, Unavailable(f"node {self.mesh.node!r} is stopping", "node stopping"))
        self._pending.clear()

    # -- asking --------------------------------------------------------------------

    def others(self) -> list[str]:
        """The other nodes a whole-broker answer should hear from: the
        placement's membership (every worker; a mesh's configured and
        learned nodes) and every node linked now."""
        mesh = self.mesh
        nodes = set(mesh.links)
        placement = mesh.queues.placement
        members = getattr(placement, "members", None)  # another policy may have none
        if callable(members):
            nodes.update(members())
        nodes.update(mesh.members())
        nodes.discard(mesh.node)
        return sorted(nodes)

    def ask(self, node: str, op: str, args: dict[str, Any], timeout: float = TIMEOUT) -> Deferred:
        """Ask C{node} to do C{op}: a Deferred of its answer, failing with
        its refusal (a L{BrokerError} with its code), or L{Unavailable} when
        it is not linked, does not answer within C{timeout} seconds, or its
        link goes first."""
        link = self.mesh.links.get(node)
        if link is None or link.state != "up":
            return _failed(Unavailable(f"node {node!r} is down or not linked to node {self.mesh.node!r} now; "
                                       "try again later.", "node unavailable"))
        if not link.manages:
            return _failed(Unavailable(f"node {node!r} does not answer management requests (an older version)",
                                       "node of an older version"))
        if len(self._pending) >= MAX_PENDING:
            return _failed(Unavailable(f"node {self.mesh.node!r} waits for {MAX_PENDING} answers from other "
                                       "nodes already; try again later.", "too many requests"))
        rid = self._next_id
        self._next_id += 1
        d: Deferred = Deferred()
        timer = self.clock.callLater(timeout, self._timed_out, rid, node, timeout)
        self._pending[rid] = (d, link, timer)
        try:
            link.send(_encode(ASK, {"id": rid, "op": op, "args": args}))
        except (TypeError, ValueError) as e:
            del self._pending[rid]
            self._fail(d, timer, PreconditionFailed(f"cannot send this request to node {node!r}: {e}"))
        return d

    def tell(self, op: str, args: dict[str, Any], link: LinkProtocol | None = None) -> None:
        """A notice (no answer) to C{link}, or to every linked node."""
        try:
            data = _encode(ASK, {"id": 0, "op": op, "args": args})
        except (TypeError, ValueError) as e:
            log.warn("mesh: cannot tell the other nodes {op}: {error}", op=op, error=str(e))
            return
        for other in [link] if link is not None else list(self.mesh.links.values()):
            if other.state == "up" and other.manages:
                other.send(data)

    def ask_all(self, op: str, args: dict[str, Any], timeout: float = TIMEOUT) -> Deferred:
        """Ask every other node (L{others}): a Deferred of (answers by
        node, missing: node -> why it did not answer). Never fails."""
        nodes = self.others()
        answers: dict[str, Any] = {}
        missing: dict[str, str] = {}
        if not nodes:
            d: Deferred = Deferred()
            d.callback((answers, missing))
            return d
        waiting = [len(nodes)]
        done: Deferred = Deferred()

        def one(result: Any, node: str, ok: bool) -> None:
            if ok:
                answers[node] = result
            else:
                error = result.value
                missing[node] = error.message if isinstance(error, BrokerError) else str(error)
            waiting[0] -= 1
            if not waiting[0]:
                done.callback((answers, missing))

        for node in nodes:
            self.ask(node, op, args, timeout).addCallbacks(
                one, one, callbackArgs=(node, True), errbackArgs=(node, False)
            )
        return done

    def _timed_out(self, rid: int, node: str, timeout: float) -> None:
        entry = self._pending.pop(rid, None)
        if entry is not None:
            entry[0].errback(Unavailable(f"node {node!r} did not answer within {timeout:g} s", "no answer"))

    @staticmethod
    def _fail(d: Deferred, timer: Any, error: BrokerError) -> None:
        if timer.active():
            timer.cancel()
        d.errback(error)

    # -- links and frames ---------------------------------------------------------

    def link_up(self, link: LinkProtocol) -> None:
        """Tell the new peer every exchange of this node (it declares those it lacks)."""
        items = []
        for vhost in self.broker.vhosts.values():
            for exchange in vhost.exchanges.values():
                if exchange.name and not exchange.name.startswith("amq."):
                    items.append([vhost.name, *exchange_facts(exchange)])
        bindings = []
        for vhost in self.broker.vhosts.values():
            for exchange in vhost.exchanges.values():
                for source, key, arguments in exchange.sources or ():
                    bindings.append([vhost.name, exchange.name, source.name, key, arguments or {}])
        if items or bindings:
            self.tell("exchanges", {"exchanges": items[:MAX_ITEMS], "bindings": bindings[:MAX_ITEMS]}, link)
        for vhost, names in self._owned_here.items():
            listed = sorted(names)
            for at in range(0, len(listed), MAX_ITEMS):
                self.tell("queue.owned", {"vhost": vhost, "queues": listed[at:at + MAX_ITEMS], "on": True}, link)

    def link_down(self, link: LinkProtocol) -> None:
        """What waits for an answer over C{link} fails now; what was got
        over it went back to its queue on the home (the link's channel there
        closed): later settles of it go nowhere."""
        for message, entry in list(self.got.items()):
            if entry[0] is link:
                del self.got[message]
        for rid, (d, other, timer) in list(self._pending.items()):
            if other is link:
                del self._pending[rid]
                self._fail(d, timer, Unavailable(
                    f"the link to node {link.node!r} went down before it answered ({link.reason})",
                    "node link lost"))
        for watcher in list(self.link_watchers):
            watcher(link)

    def frame(self, link: LinkProtocol, type_: int, payload: bytes) -> None:
        """An L{ASK} or L{ANSWER} frame from C{link}'s peer.
        @raise wire.FrameError: it is malformed."""
        if link.state != "up":
            raise wire.FrameError(f"management frame {type_} before the hello")
        record = None
        if type_ == GOT:
            if len(payload) < _LENGTH.size:
                raise wire.FrameError("bad got frame: too short")
            (size,) = _LENGTH.unpack_from(payload, 0)
            end = _LENGTH.size + size
            if end > len(payload):
                raise wire.FrameError("bad got frame: its head is longer than the frame")
            record = bytes(payload[end:])
            payload = bytes(payload[_LENGTH.size:end])
        value = wire.decode_json(payload)
        rid = value.get("id")
        if not isinstance(rid, int):
            raise wire.FrameError("bad management frame: an integer id expected")
        if record is not None:
            if not isinstance(value.get("ok"), dict):
                raise wire.FrameError("bad got frame: its head has no ok object")
            value["ok"]["record"] = record
            self._answered(link, rid, value)
            return
        if type_ == ANSWER:
            self._answered(link, rid, value)
            return
        op, args = value.get("op"), value.get("args")
        if not isinstance(op, str) or not isinstance(args, dict):
            raise wire.FrameError("bad request: op and args expected")
        handler = self.handlers.get(op)
        if handler is None:
            result: Deferred = _failed(NotAllowed(f"node {self.mesh.node!r} knows no operation {op[:50]!r}"))
        else:
            result = maybeDeferred(handler, link, args)
        if rid == 0:
            result.addErrback(self._notice_failed, link, op)
            return
        result.addCallbacks(self._answer, self._refusal, callbackArgs=(link, rid), errbackArgs=(link, rid))

    def _answer(self, value: Any, link: LinkProtocol, rid: int) -> None:
        if link.state != "up":
            return
        if value.__class__ is _Record:
            head = json.dumps({"id": rid, "ok": value.facts}, separators=(",", ":")).encode()
            # Two pieces of one frame (nothing comes between them): the
            # record, up to max_frame, is not copied.
            link.send(wire.header(GOT, _LENGTH.size + len(head) + len(value.record)) + _LENGTH.pack(len(head)) + head)
            link.send(value.record)
            return
        try:
            data = _encode(ANSWER, {"id": rid, "ok": value})
        except (TypeError, ValueError) as e:
            self._refuse(link, rid, 541, f"the answer cannot be encoded: {e}")
            return
        if len(data) > min(MAX_ANSWER, self.mesh.settings.max_frame):
            self._refuse(link, rid, 406, f"the answer of node {self.mesh.node!r} is larger than "
                         f"{min(MAX_ANSWER, self.mesh.settings.max_frame)} bytes; ask for less")
            return
        link.send(data)

    def _refusal(self, failure: Any, link: LinkProtocol, rid: int) -> None:
        error = failure.value
        if isinstance(error, BrokerError):
            self._refuse(link, rid, error.code, error.message)
        else:
            log.failure("mesh: a request of node {node} failed", failure, node=link.node)
            self._refuse(link, rid, 541, f"node {self.mesh.node!r} failed to answer; see its log")

    def _refuse(self, link: LinkProtocol, rid: int, code: int, text: str) -> None:
        if link.state == "up":
            link.send(_encode(ANSWER, {"id": rid, "error": [code, text[:1000]]}))

    @staticmethod
    def _notice_failed(failure: Any, link: LinkProtocol, op: str) -> None:
        error = failure.value
        text = error.message if isinstance(error, BrokerError) else failure.getErrorMessage()
        log.warn("mesh: node {node} told this node {op}, which failed here: {error}", node=link.node, op=op,
                 error=text)

    def _answered(self, link: LinkProtocol, rid: int, value: dict[str, Any]) -> None:
        entry = self._pending.get(rid)
        if entry is None or entry[1] is not link:
            return  # too late: it timed out
        del self._pending[rid]
        d, _, timer = entry
        if timer.active():
            timer.cancel()
        error = value.get("error")
        if error is not None:
            if not (isinstance(error, list) and len(error) == 2 and isinstance(error[0], int)):
                raise wire.FrameError("bad answer: error is [code, text]")
            cls = _ERRORS.get(error[0], BrokerError)
            e = cls(f"node {link.node!r}: {str(error[1])[:1000]}", "refused by another node")
            if cls is BrokerError:
                e.code = error[0]
            d.errback(e)
        else:
            d.callback(value.get("ok"))

    # -- operations done here --------------------------------------------------------

    def _vhost(self, args: dict[str, Any]) -> Any:
        name = args.get("vhost")
        vhost = self.broker.vhosts.get(name) if isinstance(name, str) else None
        if vhost is None:
            raise NotFound(f"no virtual host {name!r} on node {self.mesh.node!r}")
        return vhost

    def _local_queue(self, args: dict[str, Any]) -> Any:
        vhost = self._vhost(args)
        name = args.get("queue")
        if not isinstance(name, str):
            raise PreconditionFailed("a queue name expected")
        queue = vhost.queue(name)
        if queue.remote is not None:
            raise not_homed_here(self.mesh.node, queue)
        return vhost, queue

    def _queues(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        vhost = self._vhost(args)
        prefix = args.get("prefix") or ""
        rows = []
        for queue in vhost.queues.values():
            if queue.remote is None and queue.name.startswith(prefix):
                if len(rows) >= MAX_ITEMS:
                    return {"queues": rows, "truncated": True}
                rows.append(queue_facts(queue))
        return {"queues": rows, "truncated": False}

    # -- basic.get of a queue homed elsewhere -------------------------------------------

    def get(self, queue: Any, ack: bool) -> Deferred:
        """Take the next ready message of C{queue} (a stand-in) on its home:
        a Deferred of (message, remaining) or None (nothing ready). With
        C{ack}, the message waits unacked on the home until L{settled}
        tells the home what became of it (or the link goes: it goes back)."""
        link = self.mesh.links.get(queue.home)
        vhost = queue.vhost.name
        # "frame": this node takes the message as a GOT frame, within its max_frame.
        d = self.ask(queue.home, "queue.get", {"vhost": vhost, "queue": queue.name, "ack": ack,
                                               "frame": self.mesh.settings.max_frame})

        def got(value: Any) -> Any:
            if value is None:
                return None
            if not (isinstance(value, dict) and isinstance(value.get("tag"), int)
                    and (isinstance(value.get("m"), str) or isinstance(value.get("record"), bytes))):
                raise wire.FrameError("bad get answer")
            record = value.get("record")
            message = decode_message(record if record is not None else base64.b64decode(value["m"]))
            message.id = next(self.broker.message_ids)
            message.delivery_count = int(value.get("count") or 0)
            if ack and link is not None:
                self.got[message] = (link, vhost, value["tag"])
            return message, int(value.get("remaining") or 0)

        return d.addCallback(got)

    def settled(self, message: Any, outcome: int) -> bool:
        """C{message}, got from its home, is acked (0), requeued (1) or
        dropped (2): told to the home. False: it was not got from a home."""
        entry = self.got.pop(message, None)
        if entry is None:
            return False
        link, vhost, tag = entry
        if link.state == "up":
            self.tell("queue.settle", {"vhost": vhost, "tag": tag, "outcome": outcome}, link)
        return True

    def _room(self, args: dict[str, Any]) -> int | None:
        """The most record bytes one GOT frame to the asker carries (its
        C{frame} argument and this node's C{max_frame}), or None: the asker
        takes no GOT frame."""
        room = args.get("frame")
        if not isinstance(room, int) or isinstance(room, bool):
            return None
        return min(room, self.mesh.settings.max_frame) - GOT_OVERHEAD

    def _busy(self, link: LinkProtocol, size: int, queue: Any, what: str) -> Unavailable | None:
        """A GOT frame of C{size} bytes, past what a JSON answer holds, does
        not go on top of a full link buffer: the refusal, or None."""
        if size > MAX_ANSWER and link.full:
            return Unavailable(
                f"the link from node {self.mesh.node!r}, home of queue {queue.name!r}, holds "
                f"{self.mesh.settings.link_buffer} bytes it could not send yet (cluster.link_buffer): "
                f"{what}", "home node busy")
        return None

    def _get(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any] | _Record | None:
        vhost, queue = self._local_queue(args)
        channel = self.mesh.channel_for(link, vhost)
        got = channel.get(queue.name, ack=True)
        if got is None:
            return None
        payload = encode_message(vhost.name.encode(), got.message)
        room = self._room(args)
        binary = room is not None
        limit = room if room is not None else MAX_GET
        error: BrokerError | None = None
        if len(payload) > limit:
            error = PreconditionFailed(
                f"the next message of queue {queue.name!r} holds {len(payload)} bytes, more than a get from "
                f"another node carries ({limit}: cluster.max_frame); consume it instead (basic.consume)",
                "message too large")
        else:
            error = self._busy(link, len(payload), queue, "the message stays in the queue; get it again later")
        if error is not None:
            channel.settle_delivery(channel.owners.get(got.tag), got.tag, False, True)  # back in the queue
            raise error
        if not args.get("ack"):
            channel.settle_delivery(channel.owners.get(got.tag), got.tag, True, False)
        facts = {"tag": got.tag, "count": got.message.delivery_count, "remaining": got.remaining}
        if binary:
            return _Record(facts, payload)
        return {"m": base64.b64encode(payload).decode(), **facts}

    # -- range scans of a queue homed elsewhere -----------------------------------------

    def scan(self, queue: Any, start: float, end: float, cursor: str | None, limit: int) -> Deferred:
        """A range scan of C{queue} (a stand-in) on its home, whose log holds
        its messages: a Deferred of the home's L{ScanPage} (C{node} the
        home: the ids are its). The page comes in a L{GOT} frame, its
        messages' records one after another, up to this node's
        C{max_frame}; the home ends a page early (its cursor after the last
        message sent) rather than send more."""
        d = self.ask(queue.home, "queue.scan", {
            "vhost": queue.vhost.name, "queue": queue.name, "start": start, "end": end, "cursor": cursor,
            "limit": limit, "frame": self.mesh.settings.max_frame})

        def page(value: Any) -> ScanPage:
            following = value.get("next") if isinstance(value, dict) else None
            if not (isinstance(value, dict) and isinstance(value.get("record"), bytes)
                    and (following is None or isinstance(following, str))):
                raise wire.FrameError("bad scan answer")
            return ScanPage(decode_messages(value["record"]), following, queue.home)

        return d.addCallback(page)

    def _scan(self, link: LinkProtocol, args: dict[str, Any]) -> Deferred:
        vhost, queue = self._local_queue(args)
        room = self._room(args)
        start, end, cursor, limit = args.get("start"), args.get("end"), args.get("cursor"), args.get("limit")
        if room is None or not (isinstance(start, (int, float)) and isinstance(end, (int, float))
                                and isinstance(limit, int) and (cursor is None or isinstance(cursor, str))):
            raise PreconditionFailed("a scan needs start, end, cursor, limit and frame")
        d = vhost.scan(queue.name, float(start), float(end), cursor, limit)

        def answer(page: ScanPage) -> _Record:
            records: list[bytes] = []
            size = 0
            following = page.next_cursor
            name = vhost.name.encode()
            last = 0
            for message in page.messages:
                data = encode_message(name, message)
                if size + len(data) > room:
                    if not records:
                        raise PreconditionFailed(
                            f"message {message.id} of queue {queue.name!r} holds {len(data)} bytes, more than "
                            f"a scan from another node carries ({room}: cluster.max_frame); scan it on node "
                            f"{self.mesh.node!r}, its home", "message too large")
                    following = make_cursor(last)
                    break
                records.append(data)
                last = message.id
                size += len(data)
            error = self._busy(link, size, queue, "scan again later")
            if error is not None:
                raise error
            return _Record({"next": following, "count": len(records)}, b"".join(records))

        return d.addCallback(answer)

    def _http_settle(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        """Receipt handles of this node's HTTP receivers, settled for a
        client whose next connection landed on another node (the identity
        checked there; a handle counts only for a receiver of that identity:
        L{qmq.web.api.frontend.settle_by_token})."""
        from qmq.web.api.frontend import settle_by_token  # noqa: PLC0415 - the API loads on demand

        vhost, queue, identity, handles = args.get("vhost"), args.get("queue"), args.get("identity"), args.get("handles")
        visibility = args.get("visibility")
        if not (
            isinstance(vhost, str)
            and isinstance(queue, str)
            and (identity is None or (isinstance(identity, list) and len(identity) == 2
                                      and all(isinstance(i, str) for i in identity)))
            and isinstance(handles, list)
            and len(handles) <= MAX_ITEMS
            and (visibility is None or (isinstance(visibility, (int, float)) and visibility > 0))
        ):
            raise PreconditionFailed("an http.settle needs vhost, queue, identity, handles (a list) and visibility")
        unknown = settle_by_token(
            self.broker, vhost, queue, tuple(identity) if identity is not None else None,  # type: ignore[arg-type]
            handles, args.get("ack") is True, args.get("requeue") is not False,
            float(visibility) if visibility is not None else None)
        return {"unknown": unknown}

    def _owned(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        vhost, names, on = args.get("vhost"), args.get("queues"), args.get("on")
        if not (isinstance(vhost, str) and isinstance(names, list) and len(names) <= MAX_ITEMS
                and all(isinstance(n, str) for n in names) and isinstance(on, bool)):
            raise PreconditionFailed("a queue.owned notice needs vhost, queues (names) and on")
        self.mesh.queues.owned_by(link.node, vhost, names, on)

    def _settle(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        tag, outcome = args.get("tag"), args.get("outcome")
        if not (isinstance(tag, int) and outcome in (0, 1, 2)):
            raise wire.FrameError("bad settle of a get: tag and outcome expected")
        channel = link.channels.get(args.get("vhost"))
        if channel is not None and not channel.closed:
            channel.settle_delivery(channel.owners.get(tag), tag, outcome == 0, outcome == 1)

    def _queue(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        return queue_facts(self._local_queue(args)[1])

    def _bindings(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        vhost = self._vhost(args)
        rows = []
        for queue in vhost.queues.values():
            if queue.remote is None and queue.bindings:
                for ex, key, arguments in queue.bindings:
                    if len(rows) >= MAX_ITEMS:
                        return {"bindings": rows, "truncated": True}
                    rows.append([queue.name, ex.name, key, arguments or {}])
        return {"bindings": rows, "truncated": False}

    def _definitions(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        return home_definitions(self.broker, MAX_ITEMS)

    def _connections(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        from qmq.connections import connection_rows  # noqa: PLC0415

        if self.registry is None:
            return {"connections": [], "truncated": False}
        rows = connection_rows(self.registry, self.registry.ids, MAX_ITEMS + 1)
        return {"connections": rows[:MAX_ITEMS], "truncated": len(rows) > MAX_ITEMS}

    def _declare_queue(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        """Declare a queue homed here as another node's client asked:
        whether it was made, and its facts (what the client is answered)."""
        vhost = self._vhost(args)
        name, arguments = args.get("queue"), args.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            raise PreconditionFailed("a queue name and arguments expected")
        if args.get("subscription") is True:
            # A durable subscription's queue, its client on the asking node.
            if not name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
                raise PreconditionFailed(f"{name!r} is not a durable subscription's queue")
            existed = name in vhost.queues
            with self.mesh.queues.here():
                queue = vhost.declare_queue(name, durable=True, on_demand=True, subscription=True,
                                            arguments=arguments or None)
            if queue.remote is not None:
                raise not_homed_here(self.mesh.node, queue)
            if existed and arguments:
                check_equivalent(queue, arguments)
            return {"made": not existed, "facts": queue_facts(queue)}
        with self.mesh.queues.here():
            queue, made = Management(vhost, None, "").declare_queue(name, args.get("durable") is not False,
                                                                    args.get("auto_delete") is True, arguments)
        return {"made": made, "facts": queue_facts(queue)}

    def _purge(self, link: LinkProtocol, args: dict[str, Any]) -> int:
        _, queue = self._local_queue(args)
        return int(queue.purge())

    def _delete(self, link: LinkProtocol, args: dict[str, Any]) -> int:
        vhost, queue = self._local_queue(args)
        if queue.exclusive_owner is not None:
            raise AccessRefused(f"Queue {queue.name!r} belongs to a session.", "access refused (configure)")
        if args.get("if_unused") and queue.consumers:
            raise PreconditionFailed(f"queue {queue.name!r} in vhost {vhost.name!r} in use")
        if args.get("if_empty") and len(queue):
            raise PreconditionFailed(f"queue {queue.name!r} in vhost {vhost.name!r} not empty")
        return int(vhost.delete_queue(queue.name))

    def _binding_args(self, args: dict[str, Any]) -> tuple[Any, Any, str, str, dict | None]:
        vhost, queue = self._local_queue(args)
        exchange, key, arguments = args.get("exchange"), args.get("key", ""), args.get("arguments")
        if not (isinstance(exchange, str) and isinstance(key, str) and (arguments is None or isinstance(arguments, dict))):
            raise PreconditionFailed("a binding is an exchange, a key and arguments")
        return vhost, queue, exchange, key, arguments or None

    def _bind(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        vhost, queue, exchange, key, arguments = self._binding_args(args)
        vhost.bind(queue.name, exchange, key, arguments)

    def _unbind(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        vhost, queue, exchange, key, arguments = self._binding_args(args)
        vhost.unbind(queue.name, exchange, key, arguments)

    def _close_connection(self, link: LinkProtocol, args: dict[str, Any]) -> str:
        cid = args.get("id")
        registry = self.registry
        conn = registry.ids.find(cid) if registry is not None and isinstance(cid, str) else None
        if conn is None or self.registry is None or conn not in self.registry.connections():
            raise NotFound(f"no connection {str(cid)[:40]!r} on node {self.mesh.node!r}")
        conn.shutdown("closed by an administrator (HTTP API)")
        return cid  # type: ignore[no-any-return]

    # -- topology ---------------------------------------------------------------------

    def _exchange_declare(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        item = args.get("exchange")
        vhost = self._vhost(args)
        self._declare(vhost, item)

    def _declare(self, vhost: Any, item: Any) -> None:
        if not (isinstance(item, list) and len(item) == 6 and isinstance(item[0], str) and isinstance(item[1], str)
                and isinstance(item[5], dict)):
            raise wire.FrameError("bad exchange: [name, type, durable, auto_delete, internal, arguments] expected")
        name, type_, durable, auto_delete, internal, arguments = item
        if not name or name.startswith("amq."):
            return
        self._applying = True
        try:
            vhost.declare_exchange(name, type_, bool(durable), bool(auto_delete), internal=bool(internal),
                                   arguments=arguments or None)
            if auto_delete:
                self._auto.add((vhost.name, name))
        except BrokerError as e:
            log.warn("mesh: exchange {name!r} of virtual host {vhost!r}, declared on another node, "
                     "cannot be declared here: {error}", name=name, vhost=vhost.name, error=e.message)
        finally:
            self._applying = False

    def _exchange_delete(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        vhost = self._vhost(args)
        name = args.get("name")
        if not isinstance(name, str) or name not in vhost.exchanges or not name or name.startswith("amq."):
            return
        self._applying = True
        try:
            vhost.delete_exchange(name)
        finally:
            self._applying = False

    def _exchanges_sync(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        items = args.get("exchanges")
        if not isinstance(items, list):
            raise wire.FrameError("bad exchanges: a list expected")
        for item in items[:MAX_ITEMS]:
            if not (isinstance(item, list) and len(item) == 7 and isinstance(item[0], str)):
                raise wire.FrameError("bad exchanges: [vhost, name, type, ...] items expected")
            vhost = self.broker.vhosts.get(item[0])
            if vhost is not None and item[1] not in vhost.exchanges:
                self._declare(vhost, item[1:])
        for binding in (args.get("bindings") or [])[:MAX_ITEMS]:
            if not (isinstance(binding, list) and len(binding) == 5):
                raise wire.FrameError("bad exchanges: bindings are [vhost, destination, source, key, arguments]")
            self._exchange_bind(link, {"vhost": binding[0], "binding": binding[1:], "on": True})

    def _exchange_bind(self, link: LinkProtocol, args: dict[str, Any]) -> None:
        vhost = self._vhost(args)
        item = args.get("binding")
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(v, str) for v in item[:3])
                and (item[3] is None or isinstance(item[3], dict))):
            raise wire.FrameError("bad exchange binding: [destination, source, key, arguments] expected")
        destination, source, key, arguments = item
        if destination not in vhost.exchanges or source not in vhost.exchanges:
            return  # one of them is gone here, or never came: nothing to bind
        self._applying = True
        try:
            if args.get("on"):
                vhost.bind_exchange(destination, source, key, arguments or None)
            else:
                vhost.unbind_exchange(destination, source, key, arguments or None)
        except BrokerError as e:
            log.warn("mesh: an exchange binding made on another node cannot be made here: {error}",
                     error=e.message)
        finally:
            self._applying = False

    # -- the core's topology events -----------------------------------------------------

    def queue_declared(self, vhost: str, queue: str) -> None:
        """A queue exclusive to a connection here (AMQP's exclusive
        queues, STOMP's temporary queues): every node is told, so that a
        reply published to it on any node comes here, whatever the
        placement says of its name (L{qmq.cluster.queues.RemoteQueues.owned})."""
        v = self.broker.vhosts.get(vhost)
        q = v.queues.get(queue) if v is not None else None
        if q is None or q.exclusive_owner is None or q.remote is not None:
            return
        self._owned_here.setdefault(vhost, set()).add(queue)
        self.tell("queue.owned", {"vhost": vhost, "queues": [queue], "on": True})

    def pin(self, vhost: str, queue: str) -> None:
        """Queue C{queue} stays on this node though the placement names
        another (a durable subscription's queue recovered here): every node
        is told, as of a connection's queue, so that its client finds it
        from any node, until it is deleted."""
        self._owned_here.setdefault(vhost, set()).add(queue)
        self.tell("queue.owned", {"vhost": vhost, "queues": [queue], "on": True})

    def queue_deleted(self, vhost: str, queue: str) -> None:
        names = self._owned_here.get(vhost)
        if names is not None and queue in names:
            names.discard(queue)
            if not names:
                del self._owned_here[vhost]
            self.tell("queue.owned", {"vhost": vhost, "queues": [queue], "on": False})

    def exchange_declared(self, vhost: str, exchange: str, type: str) -> None:
        if self._applying or not exchange or exchange.startswith("amq."):
            return
        v = self.broker.vhosts.get(vhost)
        ex = v.exchanges.get(exchange) if v is not None else None
        if ex is not None:
            if ex.auto_delete:
                self._auto.add((vhost, exchange))
            self.tell("exchange.declare", {"vhost": vhost, "exchange": exchange_facts(ex)})

    def exchange_bound(self, vhost: str, destination: str, source: str, key: str, arguments: dict | None) -> None:
        if not self._applying:
            self.tell("exchange.bind", {"vhost": vhost, "binding": [destination, source, key, arguments], "on": True})

    def exchange_unbound(self, vhost: str, destination: str, source: str, key: str, arguments: dict | None) -> None:
        if not self._applying:
            self.tell("exchange.unbind", {"vhost": vhost, "binding": [destination, source, key, arguments],
                                          "on": False})

    def exchange_deleted(self, vhost: str, exchange: str) -> None:
        if self._applying or not exchange or exchange.startswith("amq."):
            return
        if (vhost, exchange) in self._auto:
            self._auto.discard((vhost, exchange))
            return
        self.tell("exchange.delete", {"vhost": vhost, "name": exchange})


class _Record:
    """A get's answer sent as a L{GOT} frame: its facts and the message's
    record."""

    __slots__ = ("facts", "record")

    def __init__(self, facts: dict[str, Any], record: bytes) -> None:
        self.facts = facts
        self.record = record


def _failed(error: BrokerError) -> Deferred:
    d: Deferred = Deferred()
    d.errback(error)
    return d


def encode_message(vhost: bytes, message: Message) -> bytes:
    """C{message} as a publish record of the commit log (with its CRC):
    everything of the core's model, whatever the link's own encoding."""
    head, tail = record.encode_publish(
        message.id, message.timestamp, message.expires, message.priority, message.persistent, vhost,
        message.exchange, message.routing_key, message.headers, message.body, (), message.properties,
        message.deliver_at, message.ack_timeout,
    )
    return head + tail if tail else head


def decode_messages(data: bytes) -> list[Message]:
    """Publish records one after another (a scan's page), as messages.
    @raise wire.FrameError: not whole, undamaged publish records."""
    messages = []
    at, end, head = 0, len(data), record.FRAME_SIZE
    while at < end:
        if end - at < head:
            raise wire.FrameError("bad message: too short")
        following = at + head + record.FRAME.unpack_from(data, at)[0]
        if following > end:
            raise wire.FrameError("bad message: longer than its frame")
        messages.append(decode_message(data[at:following]))
        at = following
    return messages


def decode_message(data: bytes) -> Message:
    """@raise wire.FrameError: not a whole, undamaged publish record."""
    head = record.FRAME_SIZE
    if len(data) < head:
        raise wire.FrameError("bad message: too short")
    length, type_, crc = record.FRAME.unpack_from(data, 0)
    if type_ != record.RECORD_PUBLISH or length != len(data) - head:
        raise wire.FrameError("bad message: not a publish record")
    if record.record_crc(type_, memoryview(data)[head:]) != crc:
        raise wire.FrameError("bad message: checksum")
    try:
        fields = record.decode_publish_fields(data, head, len(data))
    except record.RecordError as e:
        raise wire.FrameError(f"bad message: {e}") from None
    mid, ts, expiry, prio, flags, _, exchange, key, headers, _, body, extra = fields
    message = Message(mid, exchange, key, headers, body, ts, bool(flags & record.FLAG_PERSISTENT), prio, expiry)
    if extra is not None:
        message.properties, message.deliver_at, message.ack_timeout = extra
    return message
