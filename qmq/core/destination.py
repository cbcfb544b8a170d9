# -*- test-case-name: tests.test_core_channel -*-
"""Destination names and how they map onto the core: one grammar for every protocol.

STOMP names destinations this way, and every other frontend (HTTP, WebSocket,
peer links) uses the same names, so a message published over one protocol is
consumed over another under the same name:

=====================  ==================================================
destination            core
=====================  ==================================================
``/queue/NAME``        queue NAME through the default exchange
``/topic/KEY``         exchange ``amq.topic``, routing key KEY
``/exchange/NAME/KEY`` exchange NAME, routing key KEY (may be empty)
``/temp-queue/NAME``   the session's private reply queue NAME
``/control/...``       counts answered in the RECEIPT (ocamlmq)
=====================  ==================================================
"""

from __future__ import annotations

from typing import NamedTuple

from qmq.core.errors import BrokerError

PREFIXES = ("/queue/", "/topic/", "/exchange/", "/temp-queue/", "/control/")


class DestinationError(BrokerError):
    """A destination QMQ cannot map; the message names the rule broken."""

    code = 404

    def __init__(self, message: str, short: str = "unknown destination") -> None:
        super().__init__(message, short)


class Destination(NamedTuple):
    """A parsed destination.

    @ivar kind: C{queue}, C{topic}, C{exchange}, C{temp-queue} or C{control}.
    @ivar name: queue name, exchange name, temp-queue name or control path.
    @ivar key: the routing key (topics and exchanges), else C{""}.
    """

    kind: str
    name: str
    key: str


def parse_destination(text: str) -> Destination:
    """Parse a destination name. @raise DestinationError: it maps to nothing."""
    if text.startswith("/queue/"):
        name = text[7:]
        if not name:
            raise DestinationError("a /queue/ destination needs a queue name")
        return Destination("queue", name, name)
    if text.startswith("/topic/"):
        key = text[7:]
        if not key:
            raise DestinationError("a /topic/ destination needs a topic name")
        return Destination("topic", "amq.topic", key)
    if text.startswith("/exchange/"):
        name, _, key = text[10:].partition("/")
        if not name:
            raise DestinationError("an /exchange/ destination needs an exchange name")
        return Destination("exchange", name, key)
    if text.startswith("/temp-queue/"):
        name = text[12:]
        if not name:
            raise DestinationError("a /temp-queue/ destination needs a name")
        return Destination("temp-queue", name, "")
    if text.startswith("/control/"):
        return Destination("control", text[9:], "")
    raise DestinationError(
        f"unknown destination {text!r}: a destination starts with one of {', '.join(PREFIXES)}"
    )


def destination_of(exchange: str, routing_key: str) -> str:
    """The destination naming a publish to C{exchange} with C{routing_key}."""
    if not exchange:
        return "/queue/" + routing_key
    if exchange == "amq.topic":
        return "/topic/" + routing_key
    return f"/exchange/{exchange}/{routing_key}"
