# -*- test-case-name: tests.test_cluster_placement -*-
"""Where a queue lives: its home node (docs/cluster.rst, "Queues across nodes").

One rule, in one object, that every node applies alike so that every node
names the same home for the same queue without asking the others:

    1. a queue declared with the argument C{x-home-node} lives on that node;
    2. else on the node that wins a rendezvous hash (highest random weight)
       of (virtual host, queue name, node) over the I{configured}
       membership: this node, every node a C{peers} entry names
       (C{node=}), and every node learned from peers (discovery).

The membership is what is configured, not what is linked now: a node that
is down for a minute keeps its queues (they are unreachable meanwhile, not
moved), so a durable queue never changes home because of a restart. A node
added to the membership takes about 1/n of the queues made without
C{x-home-node} (rendezvous hashing moves nothing else).

L{Placement} is the policy object: C{home(vhost, name, arguments)} gives
the node id, C{members()} the membership it hashes over. The mesh gives the
core a L{Homes} built on it (L{qmq.core.remote}), which says which queues
are remote. Another policy (worker processes homing each queue on one
worker) can reuse the class with its own C{members}, or replace it with
any object that has the same C{home}.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from qmq.core.policy import QUEUE_ARGUMENTS

__all__ = ["HOME_ARGUMENT", "Placement", "rendezvous"]

#: The queue argument that names a queue's home node.
HOME_ARGUMENT = "x-home-node"


def rendezvous(vhost: str, name: str, members: Iterable[str]) -> str:
    """The member with the highest weight for (C{vhost}, C{name}): a
    SHA-1 of the three, NUL-separated (stable across processes, versions
    and machines, unlike Python's C{hash}). Ties (never in practice) go to
    the smaller id.

    @raise ValueError: no members.
    """
    best = ""
    best_weight = b""
    prefix = f"{vhost}\0{name}\0".encode()
    for member in members:
        weight = hashlib.sha1(prefix + member.encode()).digest()
        if weight > best_weight or (weight == best_weight and member < best):
            best, best_weight = member, weight
    if not best:
        raise ValueError("no members to place a queue on")
    return best


def home_argument(arguments: Mapping[str, Any] | None) -> str | None:
    """The node named by C{x-home-node} in C{arguments} (or C{home-node}),
    or None; read by the core's own parser of queue arguments
    (L{qmq.core.policy.QUEUE_ARGUMENTS}), as every frontend reads it.

    @raise PreconditionFailed: the value is not a node id.
    """
    if not arguments:
        return None
    for key in (HOME_ARGUMENT, HOME_ARGUMENT[2:]):
        value = arguments.get(key)
        if value is not None:
            return QUEUE_ARGUMENTS[HOME_ARGUMENT].parse(key, value)  # type: ignore[no-any-return]
    return None


class Placement:
    """The home-node rule (see the module docstring).

    @ivar node: this node's id.
    @ivar members: a callable giving the configured membership (this node
        is always part of it).
    """

    def __init__(self, node: str, members: Callable[[], Iterable[str]]) -> None:
        self.node = node
        self._members = members

    def members(self) -> list[str]:
        """The membership the hash runs over, sorted, this node included."""
        return sorted({self.node, *self._members()})

    def home(self, vhost: str, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """The node id of the home of queue C{name} in C{vhost}.

        @raise PreconditionFailed: a bad C{x-home-node}.
        """
        pinned = home_argument(arguments)
        if pinned is not None:
            return pinned
        return rendezvous(vhost, name, self.members())
