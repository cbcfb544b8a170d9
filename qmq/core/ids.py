# -*- test-case-name: tests.test_core_ids -*-
"""Message ids that never repeat: across restarts, and across nodes.

A message id is an integer: the store orders messages by it (range scans,
segment marks, its index) and queues break ties with it, so ids increase
within a process. L{MessageIds} hands them out at C speed (it is an
C{itertools.count}: the publish path calls C{next} on it) and starts above
two floors:

  - every id the store recovered (the commit log's highest id, plus a jump
    past records it could not read);
  - a time floor, L{time_floor}: the clock's milliseconds since the epoch
    times 2**L{TIME_SHIFT}. A later run starts above any id an earlier run
    could have issued, even when the store kept nothing (the memory store,
    or messages that were never persistent), as long as a run issues fewer
    than 2**TIME_SHIFT ids per millisecond on average (2 million a second,
    far above what one process publishes) and the clock does not go back.
    Ids stay below 2**53 until the year 2109, so a JavaScript client reads
    them exactly.

An integer id is unique within one node. What reaches a client names the
node too:

  - a message: L{message_name}, C{NODE.ID} (the HTTP API's C{id}). The
    integer never repeats on its node, so neither does the name; and it is
    the message's own, so a message given back after a restart keeps its
    name (a client tells a redelivery by it).
  - a delivery: L{MessageIds.prefix} is C{NODE.RUN}, the node id and this
    run's first id in base 36, and every name the broker makes for a
    delivery starts with it (a STOMP session id and so every C{message-id}
    it sends; an HTTP receiver's token and so every receipt handle). A
    name from another node, or from an earlier run of this one, never
    matches a delivery of this run: an ack of it is refused as unknown,
    and never settles another message.

The node id comes from the service (C{[cluster] node}, or the one kept in
the data directory; see L{qmq.cluster.settings}); a broker built without
one (tests, tools) is node L{DEFAULT_NODE}.
"""

from __future__ import annotations

import itertools
import re

#: Bits of an id below the time floor's milliseconds.
TIME_SHIFT = 11

#: The node id of a broker built without one.
DEFAULT_NODE = "local"

#: What a node id is: letters, digits, C{_} and C{-}, 1 to 32 of them (it
#: is repeated in every STOMP message-id).
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,32}\Z")

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def time_floor(seconds: float) -> int:
    """The lowest id a run starting at C{seconds} (since the epoch) may use."""
    return max(0, int(seconds * 1000)) << TIME_SHIFT


def base36(n: int) -> str:
    """C{n} (>= 0) in base 36, lower case."""
    if n == 0:
        return "0"
    digits = []
    while n:
        n, d = divmod(n, 36)
        digits.append(_DIGITS[d])
    return "".join(reversed(digits))


def message_name(node: str, message_id: int) -> str:
    """The name of message C{message_id} of node C{node} on the wire:
    C{NODE.ID}, the id in decimal (never repeats, see the module
    docstring)."""
    return f"{node}.{message_id}"


class MessageIds(itertools.count):  # type: ignore[misc]
    """The broker's message id generator: C{next(ids)} is a fresh id.

    @ivar node: the node id.
    @ivar first: the first id of this run.
    @ivar prefix: C{NODE.RUN}: names this run of this node on the wire.
    """

    __slots__ = ("node", "first", "prefix")

    node: str
    first: int
    prefix: str

    def __new__(cls, first: int = 1, node: str = DEFAULT_NODE) -> MessageIds:
        """
        @param first: the first id to hand out (at least 1).
        @param node: the node id (L{NODE_ID}).
        """
        first = max(1, first)
        self = super().__new__(cls, first)
        self.node = node
        self.first = first
        self.prefix = f"{node}.{base36(first)}"
        return self

    @classmethod
    def starting(cls, seconds: float, recovered: int = 1, node: str = DEFAULT_NODE) -> MessageIds:
        """The ids of a run starting at C{seconds}, above C{recovered} (the
        store's next id) and the time floor."""
        return cls(max(recovered, time_floor(seconds) + 1), node)

    @property
    def next_id(self) -> int:
        """The id the next message will get (none is taken)."""
        # itertools.count keeps its value private; its repr ("Name(N)") is
        # the one read of it that does not take an id. Read here only.
        text = itertools.count.__repr__(self)
        return int(text[text.index("(") + 1 : -1])

    @property
    def issued(self) -> int:
        """How many ids this run has handed out."""
        return self.next_id - self.first

    @property
    def last(self) -> int | None:
        """The last id handed out in this run, or None."""
        n = self.next_id
        return n - 1 if n > self.first else None

    def name(self, message_id: int) -> str:
        """L{message_name} of C{message_id} on this node."""
        return f"{self.node}.{message_id}"

    def __repr__(self) -> str:
        return f"<MessageIds node={self.node!r} first={self.first} next={self.next_id}>"


__all__ = [
    "DEFAULT_NODE",
    "NODE_ID",
    "TIME_SHIFT",
    "MessageIds",
    "base36",
    "message_name",
    "time_floor",
]
