# -*- test-case-name: tests.test_core_ids -*-
"""The C{[cluster]} table: what names this node.

A node id is part of every wire name the broker makes for a delivery (a
STOMP C{message-id}, an HTTP receipt handle; L{qmq.core.ids}), so that two
nodes never name different messages alike. The mesh of nodes will add its
own keys here.

C{node} names the node explicitly (letters, digits, C{_} and C{-}, at most
32). Left empty, the node id is the one kept in the file C{node-id} of the
data directory, made with a random id (C{qmq-} and 8 hex digits) on the
first start: stable across restarts of one broker, different for another
broker with its own data directory. Brokers that share a data directory
(memory stores started from one working directory) must be given a C{node}
each.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from qmq.core.ids import NODE_ID

__all__ = ["NODE_FILE", "ClusterSettings", "check_node", "node_id"]

#: The file in the data directory that keeps a node id made on first start.
NODE_FILE = "node-id"


def check_node(value: str) -> str:
    """@raise ValueError: C{value} is neither empty nor a node id."""
    if value and not NODE_ID.match(value):
        raise ValueError(f"expected a node id (1 to 32 letters, digits, '_' or '-'), got {value!r}")
    return value


@dataclass(frozen=True)
class ClusterSettings:
    """
    @ivar node: this node's id; empty: the one kept in the data directory.
    """

    node: str = field(
        default="",
        metadata={"parse": check_node, "expected": "a node id (1 to 32 letters, digits, '_' or '-') or \"\""},
    )


def node_id(settings: ClusterSettings, data_dir: Path) -> str:
    """This node's id: the configured one, else the one kept in
    C{data_dir}'s L{NODE_FILE} (made there, with the directory, if it is
    not there yet).

    @raise OSError: the file cannot be read or made.
    @raise ValueError: the file does not hold a node id.
    """
    if settings.node:
        return settings.node
    path = Path(data_dir) / NODE_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = ""
    else:
        if not NODE_ID.match(text):
            raise ValueError(f"{str(path)!r} does not hold a node id (1 to 32 letters, digits, '_' or '-')")
        return text
    node = f"qmq-{secrets.token_hex(4)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Exclusive create: two brokers starting at once keep the first's id.
    try:
        with path.open("x", encoding="ascii") as f:
            f.write(node + "\n")
    except FileExistsError:
        return node_id(settings, data_dir)
    return node
