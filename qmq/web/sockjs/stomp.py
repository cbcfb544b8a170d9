# -*- test-case-name: tests.test_sockjs_stomp -*-
"""STOMP over SockJS: a SockJS session as a transport of the STOMP session.

The same L{qmq.stomp.session.StompSession} that serves TCP clients serves a
SockJS client; L{StompOverSockJS} is its L{qmq.transport.ITransport} and the
SockJS session's handler (L{qmq.web.sockjs.session.ISockJSHandler}):

  - client messages are STOMP text: each is encoded to UTF-8 and fed to a
    L{qmq.stomp.reader.StompReader}, so a frame may come split over several
    messages or several frames in one (stomp.js sends one per message, and
    heart-beats as a lone newline);
  - the session's frames go out one SockJS message each (a turn's frames
    in one C{a[...]} frame), as the text stomp.js expects. SockJS carries
    text only (C{text_only}): the STOMP session's subscriptions refuse a
    message whose body is not UTF-8 with an ERROR and give it back to its
    queue (L{qmq.stomp.subscription.TextSubscription}), since sent with
    U+FFFD in place of its bad bytes it would arrive changed, and its
    C{content-length} would desynchronise stomp.js;
  - back-pressure: a full outbox (the client stopped polling or reading)
    pauses the session's deliveries, as a full socket buffer does over TCP;
    the memory alarm's C{pause_reading} holds the client's messages
    (bounded) until it clears;
  - an ended SockJS session (expired, interrupted, closed) ends the STOMP
    session: its subscriptions go, its unacknowledged messages go back to
    their queues.

Each session counts as one connection of its listener in the broker's
L{qmq.connections.ConnectionRegistry} (caps per listener and per address,
the graceful shutdown).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.web.resource import Resource
from zope.interface import implementer

from qmq.connections import ConnectionRegistry
from qmq.core.broker import Broker
from qmq.stomp.reader import StompReader
from qmq.stomp.session import StompSession
from qmq.stomp.settings import StompSettings
from qmq.transport import IConnection, ITransport
from qmq.web.site import WebContext
from qmq.web.sockjs.relay import register
from qmq.web.sockjs.resource import SockJSResource, SockJSService
from qmq.web.sockjs.services import build_test_services
from qmq.web.sockjs.session import ISockJSHandler, SockJSSession
from qmq.web.sockjs.settings import SockJSSettings
from qmq.web.websocket import origin_allowed

__all__ = ["StompOverSockJS", "sockjs_mount", "sockjs_test_mount", "stomp_sockjs_resource"]

log = Logger()


@implementer(ITransport, IConnection, ISockJSHandler)
class StompOverSockJS:
    """One SockJS session carrying one STOMP session (see the module docstring)."""

    heartbeats = True
    #: SockJS messages are text: MESSAGE bodies must be UTF-8.
    text_only = True
    #: The protocol its messages are counted under (L{qmq.core.traffic}),
    #: and its name in C{/metrics} and the connection listing.
    traffic_name = protocol_name = "sockjs"

    def __init__(
        self,
        sockjs: SockJSSession,
        broker: Broker,
        settings: StompSettings,
        registry: ConnectionRegistry,
        listener: str,
    ) -> None:
        self.sockjs = sockjs
        self.broker = broker
        self.settings = settings
        self.registry = registry
        self.listener = listener
        self.peer = sockjs.peer
        self.peer_host = sockjs.peer_host
        #: The TLS client identity of the connection that opened the session.
        self.identity = sockjs.identity
        self.session: StompSession | None = None
        self.reader: StompReader | None = None
        self._closed = False

    # ISockJSHandler
    def opened(self, sockjs: SockJSSession) -> None:
        self.session = StompSession(self.broker, self.settings, self, clock=sockjs.clock)
        self.reader = StompReader(self.session)
        self.registry.add(self, self.listener)
        log.debug("connection open protocol=stomp+sockjs peer={peer} session={session}",
                 peer=self.peer, session=self.session.id)

    def messages_received(self, messages: list[str]) -> None:
        reader = self.reader
        if reader is None:
            return
        if len(messages) == 1:
            reader.data_received(messages[0].encode("utf-8", "surrogatepass"))
        else:
            reader.data_received("".join(messages).encode("utf-8", "surrogatepass"))

    def pause(self) -> None:
        if self.session is not None:
            self.session.pause()

    def resume(self) -> None:
        if self.session is not None:
            self.session.resume()

    def closed(self) -> None:
        if self._closed:
            return
        self._closed = True
        session = self.session
        if session is None:
            return
        self.reader.connection_lost()  # type: ignore[union-attr]
        session.connection_lost()
        self.registry.remove(self)
        log.debug("connection closed protocol=stomp+sockjs peer={peer} session={session}",
                 peer=self.peer, session=session.id)

    # ITransport
    def write_frames(self, frames: list[bytes]) -> None:
        self.sockjs.send([f.decode("utf-8", "replace") for f in frames])

    def close(self, reason: str) -> None:
        if self.reader is not None:
            self.reader.discard()
        self.sockjs.close(3000, reason)

    def pause_reading(self) -> None:
        self.sockjs.pause_reading()

    def resume_reading(self) -> None:
        self.sockjs.resume_reading()

    # IConnection
    def shutdown(self, reason: str) -> None:
        if self.session is not None:
            self.session.shutdown(reason)
        self.close(reason)
        # No receiver may come back for the close frame: end it now, so
        # the registry's shutdown does not wait for the expiry.
        self.sockjs.end()

    def abort(self) -> None:
        self.sockjs.end()


def stomp_sockjs_resource(
    broker: Broker,
    stomp_settings: StompSettings,
    settings: SockJSSettings,
    registry: ConnectionRegistry,
    listener: str,
    clock: Any = None,
    origin_allowed: Callable[[Any], bool] | None = None,
) -> SockJSResource:
    """The C{/sockjs} resource: STOMP sessions over SockJS, counted in C{registry}
    under C{listener}; pages that C{origin_allowed(request)} refuses get 403."""

    def handler(sockjs: SockJSSession) -> StompOverSockJS:
        return StompOverSockJS(sockjs, broker, stomp_settings, registry, listener)

    def admit(host: str) -> str | None:
        return registry.admit(listener, host)

    service = SockJSService(handler, settings, clock if clock is not None else broker.clock,
                            admit=admit, origin_allowed=origin_allowed)
    # With workers, a session's requests that another worker takes are relayed to it.
    register(broker, listener, service)
    return SockJSResource(service)


def _origin_check(ctx: WebContext) -> Callable[[Any], bool]:
    """The site's rule for pages of other origins (C{web.allowed_origins}),
    the one STOMP over WebSocket follows."""
    patterns = ctx.guard.origins if ctx.guard is not None else ctx.web.origins

    def check(request: Any) -> bool:
        origin = request.getHeader(b"origin")
        host = request.getHeader(b"host")
        return origin_allowed(
            origin.decode("latin-1") if origin is not None else None,
            host.decode("latin-1") if host is not None else None,
            request.isSecure(),
            patterns,
        )

    return check


def sockjs_mount(ctx: WebContext) -> SockJSResource:
    """What the site mounts at C{/sockjs}."""
    resource = stomp_sockjs_resource(
        ctx.broker,
        ctx.settings.section("stomp"),
        ctx.settings.section("sockjs"),
        ctx.connections,
        ctx.listener + "/sockjs",
        ctx.clock,
        _origin_check(ctx),
    )
    ctx.on_stop.append(resource.service.close_all)
    return resource


def sockjs_test_mount(ctx: WebContext) -> Resource | None:
    """What the site mounts at C{/sockjs_test}: the protocol's test services,
    when C{sockjs.test_services} is on."""
    settings = ctx.settings.section("sockjs")
    if not settings.test_services:
        return None
    root = build_test_services(settings, ctx.clock)
    for child in root.children.values():
        ctx.on_stop.append(child.service.close_all)
    return root
