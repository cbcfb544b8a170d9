# -*- test-case-name: tests.test_core_store -*-
"""The store interface: what the core asks of wherever messages are kept.

The core owns this interface; the service chooses an implementation from the
configuration and gives it to the L{qmq.core.broker.Broker}. Nothing outside
the core calls a store: a frontend publishes through the core and gets back
either nothing (the message is as safe as it will be) or a Deferred that
fires once the store has made it durable; the frontend holds its receipt
until then (see L{qmq.core.channel.Channel.publish}).

When the core calls the store:

  - B{publish}: once per publish of a C{persistent} message that reaches at
    least one durable queue, with every durable queue it reached, so a
    message routed to many queues is one record. Non-persistent messages
    and non-durable queues never reach the store.
  - B{settle}: a persistent message left a durable queue for good (acked,
    dropped by an overflow or delivery limit, purged, expired, deleted with
    its queue). C{reason} says which.
  - B{requeue}: a persistent message went back to a durable queue with a
    higher delivery count, so a restart still marks it redelivered.
  - B{declare_queue}, B{delete_queue}, B{declare_exchange},
    B{delete_exchange}, B{bind}, B{unbind}, B{bind_exchange},
    B{unbind_exchange}: durable topology changed.
  - B{recover}: once, before any listener starts: what the store kept.
  - B{load}: a queue reached messages whose bodies the store left on disk
    (a long backlog, see L{qmq.core.queue.Queue.offload}): read them back.
  - B{scan}: a range scan (L{qmq.core.vhost.VirtualHost.scan}): a durable
    queue's kept messages between two times, read without consuming them.
  - B{flush}: at the end of every reactor turn that called B{publish}, so a
    disk store writes (and syncs) a whole turn's records at once. Other
    records (settle, topology) wait for the next flush or for L{close}; a
    disk store that must sync them sooner does it on its own schedule.
  - B{watch}: once, by the broker: the store reports when it cannot write
    and when it writes again, and admission holds persistent publishes
    back meanwhile (L{qmq.core.admission}).
  - B{close}: at shutdown, after the listeners closed.

The memory store (L{NullStore}) keeps nothing and answers every call at once;
it is what a broker gets when nobody chose a store.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from qmq.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from qmq.core.exchange import Exchange
    from qmq.core.message import Message
    from qmq.core.queue import Queue
    from qmq.core.vhost import VirtualHost

#: Why a message left a queue for good (L{MessageStore.settle}).
SETTLE_REASONS = ("ack", "drop", "expire", "purge", "delete", "dead-letter")


class RecoveredQueue(NamedTuple):
    """A durable queue a store kept, with the flags of its declaration."""

    vhost: str
    name: str
    arguments: dict | None
    auto_delete: bool = False
    #: It belonged to a connection (which a restart ended): it is deleted.
    exclusive: bool = False
    #: The queue of a durable topic subscription.
    subscription: bool = False


@dataclass
class ScanPage:
    """One page of a range scan (L{qmq.core.vhost.VirtualHost.scan}).

    @ivar messages: the messages, by increasing id (publish order); each
        with its id, timestamp, headers, body, priority, expiry, exchange
        and routing key (delivery count 0: a scan does not deliver).
    @ivar next_cursor: give it to the next call to go on exactly after the
        last message of this page; None once the range is done. A page may
        hold fewer messages than asked, or none, and still have a cursor.
    @ivar node: the node whose ids the messages bear (the queue's home,
        when it scanned for another node); None for this one.
    """

    messages: list[Message]
    next_cursor: str | None
    node: str | None = None


@dataclass
class Recovery:
    """What a store hands back at start.

    @ivar next_message_id: the first message id the broker may use (ids
        continue across restarts, never repeat).
    @ivar exchanges: C{(vhost, name, type, auto_delete)} of durable exchanges
        declared at runtime, with a fifth item, their options (None, or a
        dict with C{internal} and C{arguments}), when they have any.
    @ivar queues: L{RecoveredQueue}s (or plain C{(vhost, name, arguments)}
        tuples) of durable queues.
    @ivar bindings: C{(vhost, queue, exchange, routing key, arguments)}.
    @ivar exchange_bindings: C{(vhost, destination, source, routing key,
        arguments)} of bindings between durable exchanges.
    @ivar messages: C{(vhost, queue)} -> messages to put back, in queue order.
    """

    next_message_id: int = 1
    exchanges: list[tuple] = field(default_factory=list)
    queues: list[tuple] = field(default_factory=list)
    bindings: list[tuple[str, str, str, str, dict | None]] = field(default_factory=list)
    exchange_bindings: list[tuple[str, str, str, str, dict | None]] = field(default_factory=list)
    messages: dict[tuple[str, str], list[Message]] = field(default_factory=dict)


class MessageStore(Protocol):
    """What the core asks of a store (see the module docstring)."""

    def recover(self) -> Recovery:
        """What the store kept from the last run."""

    def publish(self, vhost: VirtualHost, message: Message, queues: Sequence[Queue]) -> Any:
        """Keep C{message} for C{queues} (durable queues it was routed to).

        @return: None when the message is already as durable as this store
            makes it, else a Deferred that fires when it is. The store may
            return the same Deferred for several publishes (all those of
            one group commit, from any caller): a caller's callbacks and
            errbacks must return their argument, so that the next caller's
            see the same result, and the store consumes a failure after the
            last of them.
        """

    def settle(self, queue: Queue, message: Message, reason: str) -> None:
        """C{message} left C{queue} for good, for C{reason} (L{SETTLE_REASONS})."""

    def requeue(self, queue: Queue, message: Message) -> None:
        """C{message} is back in C{queue} with its C{delivery_count} raised."""

    def declare_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        """A durable queue was declared."""

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        """A durable queue was deleted (its messages with it)."""

    def declare_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        """A durable exchange was declared at runtime."""

    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        """A durable exchange was deleted."""

    def bind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        """A durable queue was bound to a durable exchange."""

    def unbind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        """That binding was removed."""

    def bind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        """Durable exchange C{destination} was bound to durable exchange
        C{source} (what C{source} routes with C{key} goes on through it)."""

    def unbind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        """That exchange-to-exchange binding was removed."""

    def scan(
        self,
        vhost: VirtualHost,
        queue: Queue,
        start: float,
        end: float,
        after: int,
        limit: int,
    ) -> Any:
        """Read C{queue}'s kept messages published in [C{start}, C{end}) with
        ids above C{after}, without consuming them.

        @return: a Deferred of C{(messages, next)}: at most C{limit}
            messages by increasing id, and the id to go on after, or None
            when there is nothing more.
        @raise PreconditionFailed: this store keeps no log to scan.
        """

    def load(self, queue: Queue, messages: list[Message]) -> list[Message]:
        """Read back the bodies and headers of C{messages}, whose bodies
        are L{qmq.core.message.OnDisk} placeholders this store gave
        C{queue} (L{qmq.core.queue.Queue.offload}); set them in place.

        @return: those it could not read (damage), left as they were.
        """

    def flush(self) -> None:
        """End of a reactor turn that called the store: write what is pending."""

    def watch(self, callback: Callable[[bool, str], object]) -> None:
        """Call C{callback(False, detail)} when the store cannot write (a
        full disk, an I/O error) and C{callback(True, "")} once it writes
        again (L{qmq.core.admission.Admission.watch_store}). A store that
        cannot fail never calls it. Optional: the broker does without it.
        """

    def close(self) -> Any:
        """Shut down; may return a Deferred."""


class NullStore:
    """A store that keeps nothing: a restart loses every message.

    Every call returns at once, so a publish is "done" as soon as it is
    routed. This is the memory store; C{qmq.store.memory.MemoryStore} is its
    public name for configuration.
    """

    def recover(self) -> Recovery:
        return Recovery()

    def publish(self, vhost: VirtualHost, message: Message, queues: Sequence[Queue]) -> None:
        return None

    def settle(self, queue: Queue, message: Message, reason: str) -> None:
        return None

    def requeue(self, queue: Queue, message: Message) -> None:
        return None

    def declare_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        return None

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        return None

    def declare_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        return None

    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        return None

    def bind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        return None

    def unbind(
        self, vhost: VirtualHost, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        return None

    def bind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        return None

    def unbind_exchange(
        self,
        vhost: VirtualHost,
        destination: Exchange,
        source: Exchange,
        key: str,
        arguments: dict | None,
    ) -> None:
        return None

    def scan(
        self,
        vhost: VirtualHost,
        queue: Queue,
        start: float,
        end: float,
        after: int,
        limit: int,
    ) -> Any:
        raise PreconditionFailed(
            f"queue {queue.name!r} cannot be scanned: the memory store keeps no log "
            '(range scans need store = "log" and a durable queue)'
        )

    def load(self, queue: Queue, messages: list[Message]) -> list[Message]:
        return messages  # it never offloads: nothing to read

    def watch(self, callback: Callable[[bool, str], object]) -> None:
        return None  # memory cannot fill a disk

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector off for the block (and on again
    after, if it was): recovery makes millions of objects that all live
    on, which the collector would otherwise walk again and again for
    nothing (a third of the time of recovering a million queues)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
