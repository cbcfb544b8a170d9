# -*- test-case-name: tests.test_workers -*-
"""Which worker is a queue's home: a stable hash of its virtual host and
name over the N workers (docs/workers.rst, "Queues").

The same on every worker and in every run with the same N, whatever is
up: a queue does not move while its home worker restarts (its messages
are in that worker's log), it is unreachable until the worker is back,
as a mesh node's queues are (docs/cluster.rst).

This is the rule the mesh's queue placement is to be given when queues
across nodes land (not yet used: until then a queue lives on the worker
where it is used).
"""

from __future__ import annotations

import zlib

__all__ = ["WorkerPlacement", "home_index"]


def home_index(vhost: str, name: str, count: int) -> int:
    """The index of the home worker of queue C{name} in C{vhost}: CRC-32 of
    C{vhost + NUL + name} (UTF-8) modulo C{count}."""
    if count < 1:
        raise ValueError(f"expected at least one worker, got {count}")
    return zlib.crc32(f"{vhost}\0{name}".encode()) % count


class WorkerPlacement:
    """Queue homes over the workers of one supervisor.

    @ivar nodes: the workers' node ids, by index.
    """

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = list(nodes)

    def home(self, vhost: str, name: str) -> str:
        """The node id of the queue's home worker."""
        return self.nodes[home_index(vhost, name, len(self.nodes))]
