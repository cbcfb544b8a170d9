"""Errors raised by the broker core.

Frontends translate them into their wire protocol's error (a STOMP ERROR
frame, an HTTP 4xx with a JSON body, an AMQP channel close); the names follow
AMQP 0-9-1's reply codes so that mapping stays obvious.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the core raises on a client's request.

    @ivar message: a human-readable reason (a sentence).
    @ivar short: a few words naming the error, for a protocol's short
        error field (a STOMP ERROR's C{message} header), or C{""} to use
        C{message} there too.
    @ivar code: the AMQP 0-9-1 reply code closest to this error.
    """

    code = 541

    def __init__(self, message: str, short: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.short = short


class NotFound(BrokerError):
    """The named exchange, queue or virtual host does not exist."""

    code = 404


class NoSuchQueue(NotFound):
    """The named queue does not exist (L{qmq.core.vhost.VirtualHost.queue}):
    a frontend may name what is missing (the HTTP API's C{unknown-queue})."""


class NoSuchExchange(NotFound):
    """The named exchange does not exist (its HTTP code is C{unknown-exchange})."""


class PreconditionFailed(BrokerError):
    """A redeclaration disagrees with what exists, or an argument is invalid."""

    code = 406


class AccessRefused(BrokerError):
    """The object belongs to another session (an exclusive queue)."""

    code = 403


class ResourceLocked(BrokerError):
    """An exclusive consumer or exclusive queue prevents the operation."""

    code = 405


class ResourceLimit(BrokerError):
    """A bounded queue is full and its overflow policy rejects the publish."""

    code = 506


class NotAllowed(BrokerError):
    """The request breaks the protocol's rules (a consumer tag in use, a
    delivery settled twice): AMQP's C{not-allowed}."""

    code = 530
