# -*- test-case-name: tests.test_core_ids -*-
"""The C{[cluster]} table: what names this node, and its links to peers.

A node id is part of every wire name the broker makes for a delivery (a
STOMP C{message-id}, an HTTP receipt handle; L{qmq.core.ids}), so that two
nodes never name different messages alike.

The mesh (L{qmq.cluster.mesh}) adds the peers this node dials (Twisted
client endpoint strings, L{qmq.cluster.endpoints.parse_peer}), the CA that
signs every node's certificate, this node's certificate and key, and
C{allow_plaintext} (C{tcp:} peers and C{peer:tcp:} listeners, for tests).
Each file is read when the configuration is loaded, so a missing or wrong
file is an error naming the key and the configuration file; what needs two
keys together (an C{ssl:} peer needs C{ca}, C{certificate} and
C{private_key}) is checked when the service is built
(L{qmq.cluster.endpoints.check_settings}).

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
from typing import Any

from qmq.core.ids import NODE_ID

__all__ = ["NODE_FILE", "ClusterSettings", "check_node", "node_id"]

#: The file in the data directory that keeps a node id made on first start.
NODE_FILE = "node-id"


def check_node(value: str) -> str:
    """@raise ValueError: C{value} is neither empty nor a node id."""
    if value and not NODE_ID.match(value):
        raise ValueError(f"expected a node id (1 to 32 letters, digits, '_' or '-'), got {value!r}")
    return value


def _check_peers(value: list[object]) -> tuple[str, ...]:
    # Imported here: the endpoint module pulls Twisted's endpoints and TLS.
    from qmq.cluster.endpoints import parse_peer  # noqa: PLC0415

    peers = []
    for index, entry in enumerate(value):
        if not isinstance(entry, str):
            raise ValueError(f"[{index}]: expected an endpoint string, got {entry!r}")
        try:
            parse_peer(entry)
        except ValueError as e:
            raise ValueError(f"[{index}]: {e}") from None
        peers.append(entry)
    return tuple(peers)


def _check_advertise(value: str) -> str:
    if not value:
        return value
    from qmq.cluster.endpoints import parse_peer  # noqa: PLC0415

    parse_peer(value)
    return value


def _pem(kind: str) -> Any:
    def check(value: str) -> str:
        if not value:
            return value
        from qmq.cluster.endpoints import read_pem  # noqa: PLC0415

        read_pem(kind, value)
        return value

    return check


@dataclass(frozen=True)
class ClusterSettings:
    """
    @ivar node: this node's id; empty: the one kept in the data directory.
    @ivar peers: the nodes this node dials: Twisted client endpoint strings
        (C{ssl:host=H:port=P}, or C{tcp:...} with C{allow_plaintext}), each
        optionally with C{node=NAME}, the node expected there.
    @ivar ca: the PEM file of the CA that signs every node's certificate.
    @ivar certificate: this node's certificate (PEM, chain after it).
    @ivar private_key: this node's private key (PEM, unencrypted).
    @ivar allow_plaintext: allow C{tcp:} peers and C{peer:tcp:} listeners
        (no TLS, no authentication of the peer: tests only).
    @ivar advertise: how other nodes dial this one (a client endpoint
        string, as in C{peers}), told to every peer: a node that knows one
        peer of a mesh learns the others and joins them; empty: not told.
    @ivar heartbeat: seconds between heart-beats on a link; a link that
        hears nothing for three of them is closed.
    @ivar max_frame: most bytes one link frame may hold (a message with
        its headers).
    @ivar link_buffer: most bytes waiting for a link whose peer does not
        read; more is dropped for that peer, and counted.
    @ivar remote_window: most deliveries a consumer of a queue homed on
        another node holds unacked (its prefetch, when smaller): sized for
        a 50-200 ms round trip at 10,000 messages a second.
    """

    node: str = field(
        default="",
        metadata={"parse": check_node, "expected": "a node id (1 to 32 letters, digits, '_' or '-') or \"\""},
    )
    peers: tuple[str, ...] = field(
        default=(),
        metadata={
            "parse": _check_peers,
            "expected": "an array of client endpoint strings (\"ssl:host=H:port=P\")",
        },
    )
    ca: str = field(default="", metadata={"parse": _pem("certificates")})
    certificate: str = field(default="", metadata={"parse": _pem("certificates")})
    private_key: str = field(default="", metadata={"parse": _pem("private key")})
    allow_plaintext: bool = False
    advertise: str = field(
        default="",
        metadata={
            "parse": _check_advertise,
            "expected": "a client endpoint string (\"ssl:host=H:port=P\") or \"\"",
        },
    )
    heartbeat: float = field(default=5.0, metadata={"min": 0.1, "max": 3600})
    max_frame: int = field(default=16 * 1024 * 1024, metadata={"min": 1024})
    link_buffer: int = field(default=64 * 1024 * 1024, metadata={"min": 65536})
    remote_window: int = field(default=2000, metadata={"min": 1, "max": 1_000_000})


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
