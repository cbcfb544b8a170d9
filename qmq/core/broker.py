# -*- test-case-name: tests.test_core -*-
"""The broker: virtual hosts, message ids, time, and end-of-turn write batching.

The core never imports the reactor itself: it gets a clock (an
C{IReactorTime}) from whoever builds it, so tests drive it with
C{twisted.internet.task.Clock}.
"""

from __future__ import annotations

import itertools
from typing import Any

from qmq.core.batch import WriteBatcher
from qmq.core.message import Message
from qmq.core.vhost import VirtualHost
from qmq.store.memory import MemoryStore

DEFAULT_VHOST = "/"


class Broker:
    """One broker: the root of the core's object graph.

    @ivar clock: the C{IReactorTime} all timing comes from.
    @ivar vhosts: virtual hosts by name.
    @ivar default_vhost: the virtual host named C{"/"}.
    @ivar batcher: flushes frontends' buffered writes once per reactor turn.
    @ivar store: where durable messages are kept.
    @ivar message_ids: the source of message ids (an C{itertools.count}).
    """

    def __init__(self, clock: Any = None, store: Any = None) -> None:
        if clock is None:
            from twisted.internet import reactor as clock  # noqa: PLC0415
        self.clock = clock
        self.store = store if store is not None else MemoryStore()
        self.vhosts: dict[str, VirtualHost] = {}
        self.default_vhost = self.add_vhost(DEFAULT_VHOST)
        self.batcher = WriteBatcher(clock)
        self.message_ids = itertools.count(1)

    def add_vhost(self, name: str) -> VirtualHost:
        """Create the virtual host C{name}, or return it if it exists."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(self, name)
        return vhost

    def vhost(self, name: str | None) -> VirtualHost | None:
        """The virtual host called C{name}, or None."""
        return self.vhosts.get(name) if name is not None else self.default_vhost

    def new_message(
        self,
        exchange: str,
        routing_key: str,
        headers: dict[str, str] | None,
        body: bytes,
        persistent: bool = False,
    ) -> Message:
        """Build a message stamped with a fresh id and the clock's time."""
        return Message(
            next(self.message_ids), exchange, routing_key, headers, body, self.clock.seconds(), persistent
        )
