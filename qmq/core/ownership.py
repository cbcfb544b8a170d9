# -*- test-case-name: tests.test_core_ownership -*-
"""Who owns a queue, and the one check of who may use one by name.

Durable topic subscriptions keep a queue while their client is away, named::

    durable.OWNER.NAME

OWNER is who the subscription belongs to (the channel's C{owner_name}):

  - a plain string: a configured user's name (how a password, certificate
    or anonymous login owns, and, without authentication, the login the
    client gave), with C{%}, C{.} and C{:} percent-encoded so that the
    owner is always the text between the first two dots (L{escape_name});
  - an L{Owner} of another kind: an identity that is not a configured
    user, such as a token's subject that no C{speak_for} maps
    (L{qmq.auth.User.owner}); its part is C{KIND:NAME}, the name escaped
    as above.  An escaped name never holds a bare C{:}, so such an owner
    can never be confused with a user's, whatever the names: a token's
    C{alice} owns C{durable.token:alice.NAME}, the password user C{alice}
    C{durable.alice.NAME}.

NAME is the subscription's name (for STOMP, C{CLIENT-ID:NAME} when the
client sent a C{client-id}).

L{check_queue_access} is the one place that decides whether a client may
read (consume), write (send to) or delete a queue it names: today it keeps
a durable subscription's queue to its owner; the authorization work
tightens it here (permissions per user and virtual host), and every
frontend gets the tighter rule, since every frontend names queues through a
L{qmq.core.channel.Channel}, which asks this function.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from qmq.core.errors import AccessRefused
from qmq.core.ids import NODE_ID

#: The queues of durable subscriptions are named C{durable.OWNER.NAME}.
DURABLE_SUBSCRIPTION_PREFIX = "durable."

#: The kind of L{Owner} of the channels other nodes act through here.
PEER_KIND = "peer"

#: What a client may do to a queue it names.
OPERATIONS = ("read", "write", "delete")

_ESCAPES = str.maketrans({"%": "%25", ".": "%2E", ":": "%3A"})
_KIND = re.compile(r"[A-Za-z0-9_-]+")


def escape_name(text: str) -> str:
    """C{text} with C{%}, C{.} and C{:} percent-encoded (a name part
    that cannot be confused with its neighbours)."""
    return text.translate(_ESCAPES)


@dataclass(frozen=True)
class Owner:
    """
    An owner that is not a configured user (see the module docstring).

    @ivar name: its name (a token's subject).
    @ivar kind: how it logged in (C{"token"}): letters, digits, C{-}, C{_}.
    """

    name: str
    kind: str

    def __post_init__(self) -> None:
        if not _KIND.fullmatch(self.kind):
            raise ValueError(f"an owner's kind is letters, digits, '-' and '_': {self.kind!r}")


def owner_key(owner: str | Owner) -> str:
    """The OWNER part of a durable queue name for C{owner}: a user's name
    escaped, or C{KIND:NAME} for an L{Owner}."""
    if isinstance(owner, Owner):
        return f"{owner.kind}:{escape_name(owner.name)}"
    return escape_name(owner)


def durable_queue_name(owner: str | Owner, name: str) -> str:
    """The queue of durable subscription C{name} owned by C{owner}."""
    return f"{DURABLE_SUBSCRIPTION_PREFIX}{owner_key(owner)}.{name}"


def durable_queue_owner(queue_name: str) -> str | None:
    """The owner's part (L{owner_key}) of a durable subscription's queue
    name, or None if C{queue_name} is not one."""
    if not queue_name.startswith(DURABLE_SUBSCRIPTION_PREFIX):
        return None
    owner, dot, _ = queue_name[len(DURABLE_SUBSCRIPTION_PREFIX) :].partition(".")
    return owner if dot else None


def peer_owner(node: str) -> Owner:
    """The owner of a channel a node of the mesh acts through on this one
    (L{qmq.cluster.mesh.Mesh.channel_for}): that node checked its client's
    access already, so every durable subscription's queue is open to it
    (L{check_queue_access}); no client's owner is of kind C{peer}."""
    return Owner(node, PEER_KIND)


def is_peer(owner: str | Owner) -> bool:
    """Whether C{owner} is a node of the mesh (L{peer_owner})."""
    return isinstance(owner, Owner) and owner.kind == PEER_KIND


def check_queue_access(owner: str | Owner, queue_name: str, operation: str) -> None:
    """May the client C{owner} do C{operation} (one of L{OPERATIONS}) to
    the queue C{queue_name}, which it named?

    A durable subscription's queue is its owner's alone: nobody else reads,
    writes or deletes it. Every other queue is open to all (until the
    authorization work adds permissions here).

    @raise AccessRefused: it may not; the message names the operation and
        the queue.
    """
    queue_owner = durable_queue_owner(queue_name)
    if queue_owner is not None and queue_owner != owner_key(owner) and not is_peer(owner):
        raise AccessRefused(
            f"Queue {queue_name!r} is another user's durable subscription: "
            f"{operation} refused.",
            f"access refused ({operation})",
        )


#: In a mesh, the names the broker gives the queues a connection owns
#: (AMQP's server-named and direct reply-to queues, STOMP's temporary and
#: private subscription queues) carry the node of the connection, then
#: this mark: C{amq.gen-NODE:RANDOM}, C{amq.tmp.NODE:RANDOM.NAME} (a
#: character no node id and no random token holds, and one AMQP's
#: queue-name domain allows). A reply published to one on any node
#: reaches it there (L{marked_node}).
NODE_MARK = ":"

#: The prefixes of the names L{owned_token} marks.
_MARKED = ("amq.gen-", "amq.tmp.", "amq.rabbitmq.reply-to.", "amq.sub.")


def owned_token(broker: Any, nbytes: int = 12) -> str:
    """A random token for the names of a connection's own queues: in a mesh
    (C{broker.homes} set), C{NODE:RANDOM}; else C{RANDOM}. The random part
    keeps them unguessable (others may publish to them by name)."""
    token = secrets.token_urlsafe(nbytes)
    if broker is None or broker.homes is None:
        return token
    return f"{broker.message_ids.node}{NODE_MARK}{token}"


def marked_node(name: str) -> str | None:
    """The node a connection's queue named with L{owned_token} lives on, or
    None (not such a name)."""
    if not name.startswith(_MARKED):
        return None
    for prefix in _MARKED:
        if name.startswith(prefix):
            node, mark, _ = name[len(prefix):].partition(NODE_MARK)
            return node if mark and NODE_ID.match(node) else None
    return None  # pragma: no cover - startswith(_MARKED) above
