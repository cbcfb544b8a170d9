# -*- test-case-name: tests.test_sockjs_protocol -*-
"""sockjs-protocol's test services, so a protocol suite can run against QMQ's code.

Served under C{/sockjs_test} when C{sockjs.test_services} is true (off by
default): C{echo} (sends every message back), C{disabled_websocket_echo}
(the same, WebSocket off), C{cookie_needed_echo} (the same, with a
C{JSESSIONID} cookie) and C{close} (closes every session with
C{c[3000,"Go away!"]} as soon as it opens). Their streaming responses end
after 4096 bytes, as the suite expects. They run on the same
L{qmq.web.sockjs.resource.SockJSResource} as the STOMP endpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.web.resource import Resource
from zope.interface import implementer

from qmq.web.sockjs.resource import SockJSResource, SockJSService
from qmq.web.sockjs.session import ISockJSHandler, SockJSSession
from qmq.web.sockjs.settings import SockJSSettings

__all__ = ["CloseHandler", "EchoHandler", "build_test_services"]

#: The response limit the protocol's test suite expects of its test services.
TEST_RESPONSE_LIMIT = 4096


@implementer(ISockJSHandler)
class EchoHandler:
    """Sends every message back."""

    def __init__(self, session: SockJSSession) -> None:
        self.session = session

    def opened(self, session: SockJSSession) -> None:
        pass

    def messages_received(self, messages: list[str]) -> None:
        self.session.send(messages)

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def closed(self) -> None:
        pass


@implementer(ISockJSHandler)
class CloseHandler(EchoHandler):
    """Closes the session as soon as it opens."""

    def opened(self, session: SockJSSession) -> None:
        session.close(3000, "Go away!")


def build_test_services(settings: SockJSSettings | None = None, clock: Any = None) -> Resource:
    """The four test services as children of one resource."""
    base = dataclasses.replace(
        settings if settings is not None else SockJSSettings(),
        response_limit=TEST_RESPONSE_LIMIT,
    )
    root = Resource()
    for name, handler, changes in (
        (b"echo", EchoHandler, {}),
        (b"disabled_websocket_echo", EchoHandler, {"websocket": False}),
        (b"cookie_needed_echo", EchoHandler, {"cookie_needed": True}),
        (b"close", CloseHandler, {}),
    ):
        service = SockJSService(handler, dataclasses.replace(base, **changes), clock)
        root.putChild(name, SockJSResource(service))
    return root
