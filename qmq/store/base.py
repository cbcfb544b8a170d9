"""The interface between durable queues and a message store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from qmq.core.message import Message
    from qmq.core.queue import Queue


class MessageStore(Protocol):
    """What a store offers the core.

    C{append} returns None when the message is already as durable as it will
    be, or a Deferred that fires once it is on disk (a receipt waits for it).
    """

    def append(self, queue: Queue, message: Message) -> Any: ...

    def remove(self, queue: Queue, message: Message) -> None: ...

    def close(self) -> Any: ...
