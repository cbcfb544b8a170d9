# -*- test-case-name: tests.test_core_access -*-
"""Authorization, decided once: L{authorize}(operation, resource).

Every frontend (STOMP over TCP, WebSocket and SockJS, the HTTP API, later
AMQP and peer links) asks this module, through a
L{qmq.core.channel.Channel} or L{qmq.core.management.Management}, whether
an identity may do something, and gets the same verdict for the same thing
whichever way it was named. The flow:

    frontend     names a thing its own way (C{/queue/orders}, a path
                 C{/api/v1/vhosts/%2F/queues/orders}, an AMQP
                 C{queue.declare})
    core         turns it into a L{Resource}: virtual host, kind (queue or
                 exchange), name and, for an exchange that is published to
                 or bound, the routing key
    L{authorize} asks the identity's permissions about the resource's
                 name (RabbitMQ's configure/write/read patterns) and a
                 token's narrowing about the resource's one canonical text
                 (L{Resource.path}); for a queue, the durable-subscription
                 ownership rule (L{qmq.core.ownership}) too

The canonical text is what makes one verdict: a token's C{destinations}
claim is matched against C{Resource.path}, never against the text a client
happened to send. A queue is C{/queue/NAME} whether STOMP named it
C{/queue/NAME}, a control destination named it, or the HTTP API named it
by its bare name; an exchange with a routing key is C{/topic/KEY} for
C{amq.topic} and C{/exchange/NAME/KEY} for any other; an exchange named
without a key (declared, deleted, described) is C{/exchange/NAME}.

The identity is whatever the frontends hold today: None (authentication
off: every permission granted) or a L{qmq.auth.User} (anything with
C{name} and C{can(operation, vhost, resource, destination)}). The owner of
durable subscriptions is passed apart (the channel's C{owner_name}): it
applies with authentication off too.
"""

from __future__ import annotations

from collections.abc import Collection, Container
from dataclasses import dataclass
from typing import Any

from qmq.core.errors import AccessRefused
from qmq.core.ownership import Owner, check_queue_access, durable_queue_owner

__all__ = ["EXCHANGE", "OPERATIONS", "QUEUE", "Resource", "allowed", "authorize", "authorize_monitoring", "may_monitor"]

#: The operations a permission names (RabbitMQ's).
OPERATIONS = ("configure", "write", "read")

QUEUE = "queue"
EXCHANGE = "exchange"

#: The exchange whose routing keys STOMP names C{/topic/KEY}.
TOPIC_EXCHANGE = "amq.topic"


@dataclass(frozen=True, slots=True)
class Resource:
    """What an operation is done to, structurally.

    @ivar vhost: the virtual host's name.
    @ivar kind: L{QUEUE} or L{EXCHANGE}.
    @ivar name: the queue's or exchange's name.
    @ivar key: for an exchange published to or bound (or subscribed to),
        the routing key or binding pattern; None when the exchange itself
        is meant (declare, delete, describe). Always None for a queue.
    """

    vhost: str
    kind: str
    name: str
    key: str | None = None

    @classmethod
    def queue(cls, vhost: str, name: str) -> Resource:
        """The queue C{name} of C{vhost}."""
        return cls(vhost, QUEUE, name)

    @classmethod
    def exchange(cls, vhost: str, name: str, key: str | None = None) -> Resource:
        """The exchange C{name} of C{vhost}, with the routing key C{key}
        (or None); the default exchange (C{""}) with a key is the queue
        that key names, as the broker routes it."""
        if not name and key is not None:
            return cls(vhost, QUEUE, key)
        return cls(vhost, EXCHANGE, name, key)

    @property
    def path(self) -> str:
        """The one text a token's narrowing is matched against (see the
        module docstring)."""
        if self.kind == QUEUE:
            return "/queue/" + self.name
        if self.key is None:
            return "/exchange/" + self.name
        if self.name == TOPIC_EXCHANGE:
            return "/topic/" + self.key
        return f"/exchange/{self.name}/{self.key}"

    def describe(self) -> str:
        """The resource in a sentence: C{queue 'orders'}, C{exchange
        'amq.topic', routing key 'a.b'}."""
        text = f"{self.kind} {self.name!r}"
        if self.key is not None:
            text += f", routing key {self.key!r}"
        return text


def allowed(user: Any, operation: str, resource: Resource) -> bool:
    """Whether C{user} has the permission C{operation} on C{resource}
    (its patterns on the name, a token's narrowing on L{Resource.path}).

    Durable-subscription ownership is not asked here (L{authorize} does):
    this is the test a listing filters with.

    @param user: a L{qmq.auth.User}, or None (authentication off: yes).
    """
    return user is None or bool(user.can(operation, resource.vhost, resource.name, resource.path))


def authorize(
    user: Any,
    operation: str,
    resource: Resource,
    owner: str | Owner | None = None,
    named: str | None = None,
) -> None:
    """Refuse, unless C{user} may do C{operation} on C{resource}.

    @param user: a L{qmq.auth.User}, or None (no permission checks).
    @param operation: one of L{OPERATIONS}.
    @param owner: who the client is for durable subscriptions (a
        channel's C{owner_name}: a user's name or an L{Owner}); given, a
        queue that is another owner's durable subscription is refused
        whatever the permissions (None: not asked here, the caller asks
        L{check_queue_access} itself).
    @param named: how the client named it (a STOMP destination), for the
        message only: the verdict never depends on it.
    @raise AccessRefused: short C{access refused (OPERATION)}; the message
        names the user, the operation and the resource.
    """
    if owner is not None and resource.kind == QUEUE and durable_queue_owner(resource.name) is not None:
        check_queue_access(owner, resource.name, operation)
    if user is None or user.can(operation, resource.vhost, resource.name, resource.path):
        return
    text = named if named is not None else resource.path
    why = ""
    if text != resource.path and getattr(user, "destinations", None) is not None:
        why = f"; a token's destinations are matched against {resource.path!r}"
    raise AccessRefused(
        f"User {user.name!r} has no {operation} permission for {text!r} ({resource.describe()}) "
        f"in virtual host {resource.vhost!r}{why}.",
        f"access refused ({operation})",
    )


def may_monitor(user: Any, admins: Collection[str], monitors: Collection[str]) -> bool:
    """Whether C{user} may read the broker's monitoring answers (the
    C{/metrics} exposition, the details of the health checks): an admin
    (C{[http_api] admins}) or a monitoring identity (C{[http_api]
    monitors}, as RabbitMQ's C{monitoring} tag), both by the identity's
    account (L{qmq.auth.User.is_admin}): a token's subject is one only if
    its C{speak_for} maps it to a named account. The right needs no
    permission in any virtual host: a monitoring user may have none.

    @param user: a L{qmq.auth.User}, or None (authentication off: yes).
    """
    return user is None or user.is_admin(admins) or user.is_admin(monitors)


def authorize_monitoring(user: Any, admins: Collection[str], monitors: Collection[str]) -> None:
    """Refuse, unless L{may_monitor}.

    @raise AccessRefused: naming the user and the settings that grant it.
    """
    if not may_monitor(user, admins, monitors):
        raise AccessRefused(
            f"User {user.name!r} may not read the metrics: only the users named in "
            "http_api.admins or http_api.monitors may.",
            "access refused (monitoring)",
        )


def resource_named(
    vhost: str,
    operation: str,
    name: str,
    text: str,
    exchanges: Container[str] = (),
    queues: Container[str] = (),
) -> Resource:
    """The resource a channel's check names: C{name}, which the client
    reached through the destination C{text} (a bridge for the channel's
    call sites, which pass the name and the text they resolved).

    The channel asks about an exchange only to write to it (a SEND) or
    read from it (a SUBSCRIBE, a topic's subscriber count), naming it by a
    C{/topic/KEY} or C{/exchange/NAME/KEY} destination; everything else it
    asks about is a queue (a C{configure} with a topic destination is the
    durable subscription's queue it makes). A check that names the
    resource by its bare name (C{text} is not a destination) is about an
    exchange if C{name} is one of C{exchanges} and none of C{queues}, and
    then about the exchange itself (no key: C{/exchange/NAME}).
    """
    if operation != "configure":
        if text.startswith("/topic/") and name == TOPIC_EXCHANGE:
            return Resource(vhost, EXCHANGE, name, text[7:])
        if text.startswith("/exchange/"):
            exchange, _, key = text[10:].partition("/")
            if exchange == name:
                return Resource(vhost, EXCHANGE, name, key)
        if text.startswith("/control/count-subscribers/topic/") and name == TOPIC_EXCHANGE:
            return Resource(vhost, EXCHANGE, name, text[33:])
        if not text.startswith("/") and name in exchanges and name not in queues:
            return Resource(vhost, EXCHANGE, name)
    return Resource(vhost, QUEUE, name)
