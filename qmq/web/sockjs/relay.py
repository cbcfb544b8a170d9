# -*- test-case-name: tests.test_sockjs_relay -*-
"""SockJS sessions across a host's workers.

A SockJS session over HTTP (C{xhr_streaming}, C{xhr}, C{eventsource},
C{htmlfile}, C{jsonp}) is a series of requests, often over several TCP
connections, and the kernel spreads connections over the workers
(docs/workers.rst). So each session lives on one worker, its I{owner}: the
rendezvous hash of its id over the host's workers (L{Relay.owner}), the
same on every worker without asking. A request of it that another worker
takes is checked there as any request (origin, method, callback, payload)
and relayed to the owner over their link (L{qmq.cluster.manage}'s
requests and notices):

    - a sending request (C{xhr_send}, C{jsonp_send}): its decoded messages
      in a C{sockjs.send} request; the owner's answer says whether the
      session was found (204 or C{ok}; else the protocol's 404);
    - a receiving request: a C{sockjs.attach} request (the transport, its
      callback, the client's address and TLS identity: what the session is
      found by); the owner finds or makes the session and attaches a
      L{LinkReceiver}, which sends each frame back (C{sockjs.frame}), and
      the end of the response (C{sockjs.finish}); the worker that holds the
      request wraps each frame the transport's way and writes it. Its
      flow control goes the other way (C{sockjs.flow}: the response's
      transport is full, or drained), and so does its end (C{sockjs.detach},
      aborted or not), as a local request's would.

A link that goes ends the requests relayed over it on both sides (the
client opens a new one; the session waits for it on its owner, as after
any request). WebSocket sessions are one connection, never relayed.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from qmq.cluster.placement import rendezvous
from qmq.tls import PeerIdentity
from qmq.twisted_internals import request_disconnected
from qmq.web.sockjs.framing import TRANSPORTS, Budget, Wrapping
from qmq.web.sockjs.session import CLOSED

if TYPE_CHECKING:
    from qmq.cluster.link import LinkProtocol
    from qmq.web.sockjs.resource import SockJSService

__all__ = ["LinkReceiver", "Relay", "install", "register"]

log = Logger()

#: The services that may take relayed requests, by broker and name (the
#: listener's, so the same on every worker of the host).
_services: WeakKeyDictionary[Any, dict[str, SockJSService]] = WeakKeyDictionary()

_rids = itertools.count(1)


def register(broker: Any, name: str, service: SockJSService) -> None:
    """C{service} serves sessions named C{name} on C{broker}'s node: it
    relays to, and takes relayed requests from, the host's other workers."""
    _services.setdefault(broker, {})[name] = service
    service.relay = Relay(broker, name, service)


def identity_of(value: Any) -> PeerIdentity | None:
    """A TLS client identity as a relayed request carries it (JSON)."""
    if not isinstance(value, dict):
        return None
    fields = {f.name for f in dataclasses.fields(PeerIdentity)}
    if set(value) != fields:
        return None
    return PeerIdentity(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})


class Relay:
    """One SockJS service's side of the relay on this worker (see the
    module docstring)."""

    def __init__(self, broker: Any, name: str, service: SockJSService) -> None:
        self.broker = broker
        self.name = name
        self.service = service
        #: Requests this worker relays: rid -> L{RelayedRequest}.
        self.relayed: dict[int, RelayedRequest] = {}
        #: Receivers this worker attached for others: (link, rid) -> receiver.
        self.receivers: dict[tuple[Any, int], LinkReceiver] = {}

    @property
    def mesh(self) -> Any:
        mesh = getattr(self.broker, "mesh", None)
        return mesh if mesh is not None and mesh.siblings else None

    def owner(self, session_id: str) -> str | None:
        """The worker session C{session_id} lives on, when it is another;
        None: this one (or no workers)."""
        mesh = self.mesh
        if mesh is None:
            return None
        node = rendezvous("", session_id, sorted(mesh.siblings | {mesh.node}))
        return None if node == mesh.node else node

    # -- the worker that holds the request ------------------------------------------

    def send(self, owner: str, session_id: str, host: str, identity: Any, messages: list[str]) -> Any:
        """A Deferred of whether the owner found the session (and took C{messages})."""
        d = self.mesh.manage.ask(owner, "sockjs.send", {
            "service": self.name, "sid": session_id, "host": host, "identity": _json_identity(identity),
            "messages": messages})
        return d.addCallback(lambda value: isinstance(value, dict) and value.get("found") is True)

    def receive(self, owner: str, request: Any, start: Any, wrapping: Wrapping, transport: str, callback: str,
                limit: int, session_id: str, peer: str, host: str, identity: Any) -> Any:
        """Relay a receiving request to its session's owner: C{start()} sets
        the response's headers once the owner attached it. A Deferred that
        fires (None) once that answer came, or with the refusal."""
        mesh = self.mesh
        rid = next(_rids)
        relayed = self.relayed[rid] = RelayedRequest(self, rid, owner, request, wrapping, callback)
        d = mesh.manage.ask(owner, "sockjs.attach", {
            "service": self.name, "rid": rid, "sid": session_id, "transport": transport, "callback": callback,
            "limit": limit, "peer": peer, "host": host, "identity": _json_identity(identity)})

        def answered(value: Any) -> Any:
            refused = value.get("refused") if isinstance(value, dict) else "no answer"
            if refused:
                self.relayed.pop(rid, None)
                return refused
            relayed.start(start)
            return None

        def failed(failure: Any) -> Any:
            self.relayed.pop(rid, None)
            return failure

        return d.addCallbacks(answered, failed)

    def tell(self, node: str, op: str, args: dict[str, Any]) -> None:
        mesh = self.mesh
        link = mesh.links.get(node) if mesh is not None else None
        if link is not None:
            mesh.manage.tell(op, args, link)

    # -- the owner -------------------------------------------------------------------

    def find(self, args: dict[str, Any]) -> Any:
        sid, host = args.get("sid"), args.get("host")
        if not (isinstance(sid, str) and isinstance(host, str)):
            raise ValueError("a relayed SockJS request names a session and a host")
        session = self.service.sessions.get(self.service.key(sid, host, identity_of(args.get("identity"))))
        return session if session is not None and session.state is not CLOSED else None

    def attach(self, link: LinkProtocol, args: dict[str, Any]) -> dict[str, Any]:
        rid, transport, callback, limit, peer = (args.get(k) for k in ("rid", "transport", "callback", "limit", "peer"))
        wrapping = TRANSPORTS.get(transport) if isinstance(transport, str) else None
        if not (isinstance(rid, int) and wrapping is not None and isinstance(callback, str)
                and isinstance(limit, int) and isinstance(peer, str)):
            raise ValueError("a relayed SockJS receiving request needs rid, transport, callback, limit and peer")
        service = self.service
        session = self.find(args)
        if session is None:
            host = args["host"]
            refusal = service.refusal(host)
            if refusal is not None:
                return {"refused": refusal}
            session = service.new_session(args["sid"], peer, host, identity=identity_of(args.get("identity")))
        receiver = self.receivers[(link, rid)] = LinkReceiver(self, link, rid, wrapping, callback, limit, session)
        session.attach(receiver)
        return {"ok": True}


def _json_identity(identity: Any) -> Any:
    return dataclasses.asdict(identity) if dataclasses.is_dataclass(identity) else None


class LinkReceiver(Budget):
    """The owner's receiver of a request another worker holds: frames go
    there; whether the response is done after one is counted here as the
    request's own L{qmq.web.sockjs.resource.HTTPReceiver} counts it."""

    def __init__(self, relay: Relay, link: Any, rid: int, wrapping: Wrapping, callback: str, limit: int,
                 session: Any) -> None:
        super().__init__(wrapping, callback, limit)
        self.relay = relay
        self.link = link
        self.rid = rid
        self.paused = False
        self.finished = False
        self.session = session

    def send_frame(self, frame: str) -> bool:
        self.relay.tell(self.link.node, "sockjs.frame", {"rid": self.rid, "frame": frame})
        return self.spent(self.wrapping.wrap(frame, self.callback) if self.streaming else b"")

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.relay.tell(self.link.node, "sockjs.finish", {"rid": self.rid})

    def flow(self, paused: bool) -> None:
        if self.paused and not paused:
            self.paused = False
            self.session.receiver_ready()
        else:
            self.paused = paused

    def ended(self, aborted: bool) -> None:
        self.relay.receivers.pop((self.link, self.rid), None)
        self.finished = True
        self.session.detach(self, aborted=aborted)


@implementer(IPushProducer)
class RelayedRequest:
    """A receiving request this worker holds for a session of another:
    frames from there, wrapped and written here (see the module docstring)."""

    def __init__(self, relay: Relay, rid: int, owner: str, request: Any, wrapping: Wrapping, callback: str) -> None:
        self.relay = relay
        self.rid = rid
        self.owner = owner
        self.request = request
        self.wrapping = wrapping
        self.callback = callback
        self.started = False
        self.waiting: list[str] = []
        self.finished = False

    def start(self, start: Any) -> None:
        """The owner attached it: the response's headers, then what came."""
        request = self.request
        if request_disconnected(request):
            self._ended(True)
            return
        self.started = True
        start()
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(lambda result: self._ended(result is not None))
        # What came before the answer: frames, and perhaps the end.
        done, self.finished = self.finished, False
        waiting, self.waiting = self.waiting, []
        for frame in waiting:
            self.frame(frame)
        if done:
            self.finish()

    def frame(self, frame: str) -> None:
        if not self.started:
            self.waiting.append(frame)
        elif not self.finished:
            self.request.write(self.wrapping.wrap(frame, self.callback))

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        if not self.started:
            return  # finished once it starts
        request = self.request
        request.unregisterProducer()
        if not request_disconnected(request):
            request.finish()

    def _ended(self, aborted: bool) -> None:
        self.finished = True
        if self.relay.relayed.pop(self.rid, None) is not None:
            self.relay.tell(self.owner, "sockjs.detach", {"rid": self.rid, "aborted": aborted})

    # IPushProducer: the response's transport is full, or drained.
    def pauseProducing(self) -> None:
        self.relay.tell(self.owner, "sockjs.flow", {"rid": self.rid, "paused": True})

    def resumeProducing(self) -> None:
        self.relay.tell(self.owner, "sockjs.flow", {"rid": self.rid, "paused": False})

    def stopProducing(self) -> None:
        self.pauseProducing()


# -- the requests and notices, on every worker ----------------------------------------


def _relay(broker: Any, args: dict[str, Any]) -> Relay:
    name = args.get("service")
    service = _services.get(broker, {}).get(name) if isinstance(name, str) else None
    if service is None or service.relay is None:
        raise ValueError(f"no SockJS service {str(name)[:60]!r} here")
    return service.relay


def _send(mesh: Any, link: Any, args: dict[str, Any]) -> dict[str, Any]:
    relay = _relay(mesh.broker, args)
    messages = args.get("messages")
    if not (isinstance(messages, list) and all(isinstance(m, str) for m in messages)):
        raise ValueError("a relayed SockJS send carries messages (strings)")
    session = relay.find(args)
    if session is None:
        return {"found": False}
    session.messages_received(messages)
    return {"found": True}


def _attach(mesh: Any, link: Any, args: dict[str, Any]) -> dict[str, Any]:
    return _relay(mesh.broker, args).attach(link, args)


def _relayed(mesh: Any, args: dict[str, Any]) -> RelayedRequest | None:
    rid = args.get("rid")
    for service in (_services.get(mesh.broker) or {}).values():
        relayed = service.relay.relayed.get(rid) if service.relay is not None else None
        if relayed is not None:
            return relayed
    return None


def _receiver(mesh: Any, link: Any, args: dict[str, Any]) -> LinkReceiver | None:
    rid = args.get("rid")
    for service in (_services.get(mesh.broker) or {}).values():
        if service.relay is not None:
            receiver = service.relay.receivers.get((link, rid))
            if receiver is not None:
                return receiver
    return None


def _frame(mesh: Any, link: Any, args: dict[str, Any]) -> None:
    relayed = _relayed(mesh, args)
    frame = args.get("frame")
    if relayed is not None and isinstance(frame, str):
        relayed.frame(frame)


def _finish(mesh: Any, link: Any, args: dict[str, Any]) -> None:
    relayed = _relayed(mesh, args)
    if relayed is not None:
        relayed.finish()


def _flow(mesh: Any, link: Any, args: dict[str, Any]) -> None:
    receiver = _receiver(mesh, link, args)
    if receiver is not None:
        receiver.flow(args.get("paused") is True)


def _detach(mesh: Any, link: Any, args: dict[str, Any]) -> None:
    receiver = _receiver(mesh, link, args)
    if receiver is not None:
        receiver.ended(args.get("aborted") is True)


def _link_down(mesh: Any, link: Any) -> None:
    """What was relayed over C{link} ends on this side."""
    for service in list((_services.get(mesh.broker) or {}).values()):
        relay = service.relay
        if relay is None:
            continue
        for relayed in [r for r in relay.relayed.values() if r.owner == link.node]:
            relay.relayed.pop(relayed.rid, None)
            relayed.finish()
        for key in [k for k in relay.receivers if k[0] is link]:
            relay.receivers[key].ended(True)


def install(mesh: Any) -> None:
    """The relay's requests and notices, taken by this worker's mesh (once)."""
    handlers = mesh.manage.handlers
    if "sockjs.send" in handlers:
        return
    for op, handler in (("sockjs.send", _send), ("sockjs.attach", _attach), ("sockjs.frame", _frame),
                        ("sockjs.finish", _finish), ("sockjs.flow", _flow), ("sockjs.detach", _detach)):
        handlers[op] = _bound(mesh, handler)
    mesh.manage.link_watchers.append(lambda link: _link_down(mesh, link))


def _bound(mesh: Any, handler: Any) -> Any:
    def handle(link: Any, args: dict[str, Any]) -> Any:
        from qmq.core.errors import AccessRefused, PreconditionFailed  # noqa: PLC0415

        if link.node not in mesh.siblings:
            # Sessions are bound to their client's address: only this
            # host's workers, which took its requests, speak for it.
            raise AccessRefused(f"node {link.node!r} is not a worker of this host: it relays no SockJS request")
        try:
            return handler(mesh, link, args)
        except ValueError as e:
            raise PreconditionFailed(str(e)) from None

    return handle

