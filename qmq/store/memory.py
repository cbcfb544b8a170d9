"""The memory store: messages live only in their queues."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qmq.core.message import Message
    from qmq.core.queue import Queue


class MemoryStore:
    """Keeps nothing: a restart loses every message (memory-only queues)."""

    def append(self, queue: Queue, message: Message) -> None:
        return None

    def remove(self, queue: Queue, message: Message) -> None:
        return None

    def close(self) -> None:
        return None
