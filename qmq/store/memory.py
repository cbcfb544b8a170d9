"""The memory store: messages live only in their queues.

A restart loses every message. This is the store the broker uses unless the
configuration names another (C{store = "memory"}); it is the core's
L{qmq.core.store.NullStore} under the name configuration uses.
"""

from __future__ import annotations

from qmq.core.store import NullStore


class MemoryStore(NullStore):
    """Keeps nothing: every publish is done once routed (memory-only queues)."""
