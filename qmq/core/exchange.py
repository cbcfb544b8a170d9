# -*- test-case-name: tests.test_core_exchange -*-
"""Exchange types: direct, fanout, topic, headers, and the default exchange.

An exchange maps a publish (routing key, headers) to the list of queues
bound to it that match. Each type keeps an index suited to its matching
rule, so routing cost does not grow with the number of bindings that do not
match:

  - direct: a dict from routing key to queues.
  - fanout: every bound queue.
  - topic: a trie over the dot-separated words of the binding patterns, with
    C{*} (exactly one word), C{#} (zero or more words) and, as in ocamlmq, a
    final word ending in C{*} (C{foo*}, C{a.b*}) that matches any key whose
    remaining text starts with what precedes the star. Results are cached
    per routing key until the bindings change.
  - headers: C{x-match} C{all} (default) or C{any} over binding arguments.

C{route} returns a sequence of distinct queues (a queue bound twice gets
one copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qmq.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from qmq.core.queue import Queue

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
_EMPTY: tuple = ()


class Exchange:
    """Base of the exchange types.

    @ivar name: its name.
    @ivar type: one of L{EXCHANGE_TYPES}.
    @ivar durable: survives a restart.
    @ivar auto_delete: deleted when its last binding goes.
    @ivar deleted: set once it has been deleted (frontends cache exchanges).
    """

    type = ""

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.binding_count = 0
        self.deleted = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} bindings={self.binding_count}>"

    def bind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        """Add a binding; return False if it already existed."""
        raise NotImplementedError

    def unbind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        """Remove a binding; return False if it did not exist."""
        raise NotImplementedError

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        """The queues a publish with this key and headers goes to."""
        raise NotImplementedError


class DirectExchange(Exchange):
    """Routes to the queues bound with exactly the routing key."""

    type = "direct"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        self._by_key: dict[str, list[Queue]] = {}

    def bind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        queues = self._by_key.setdefault(routing_key, [])
        if queue in queues:
            return False
        queues.append(queue)
        self.binding_count += 1
        return True

    def unbind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        queues = self._by_key.get(routing_key)
        if not queues or queue not in queues:
            return False
        queues.remove(queue)
        if not queues:
            del self._by_key[routing_key]
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        return self._by_key.get(routing_key, _EMPTY)


class FanoutExchange(Exchange):
    """Routes to every bound queue, whatever the key."""

    type = "fanout"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        self._queues: list[Queue] = []
        self._keys: dict[tuple[Queue, str], None] = {}

    def bind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        if (queue, routing_key) in self._keys:
            return False
        self._keys[(queue, routing_key)] = None
        if queue not in self._queues:
            self._queues.append(queue)
        self.binding_count += 1
        return True

    def unbind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        if (queue, routing_key) not in self._keys:
            return False
        del self._keys[(queue, routing_key)]
        if not any(q is queue for q, _ in self._keys):
            self._queues.remove(queue)
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        return self._queues


class _Node:
    """A trie node: one word of a topic pattern."""

    __slots__ = ("children", "star", "hash", "queues", "prefixes")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.queues: list[Queue] | None = None
        self.prefixes: list[tuple[str, Queue]] | None = None

    def empty(self) -> bool:
        return not (self.children or self.star or self.hash or self.queues or self.prefixes)


class TopicExchange(Exchange):
    """Routes by pattern over dot-separated words (see the module doc)."""

    type = "topic"
    cache_size = 10_000

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        self._root = _Node()
        self._cache: dict[str, tuple] = {}

    @staticmethod
    def _split_pattern(routing_key: str) -> tuple[list[str], str | None]:
        """The words of a binding pattern, and the prefix of a final C{foo*} word."""
        words = routing_key.split(".")
        last = words[-1]
        if len(last) > 1 and last.endswith("*"):
            return words[:-1], last[:-1]
        return words, None

    def bind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        words, prefix = self._split_pattern(routing_key)
        node = self._root
        for w in words:
            node = self._child(node, w)
        if prefix is not None:
            entry = (prefix, queue)
            if node.prefixes is None:
                node.prefixes = []
            elif entry in node.prefixes:
                return False
            node.prefixes.append(entry)
        else:
            if node.queues is None:
                node.queues = []
            elif queue in node.queues:
                return False
            node.queues.append(queue)
        self.binding_count += 1
        self._cache = {}
        return True

    @staticmethod
    def _child(node: _Node, word: str) -> _Node:
        if word == "*":
            if node.star is None:
                node.star = _Node()
            return node.star
        if word == "#":
            if node.hash is None:
                node.hash = _Node()
            return node.hash
        if node.children is None:
            node.children = {}
        child = node.children.get(word)
        if child is None:
            child = node.children[word] = _Node()
        return child

    def unbind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        words, prefix = self._split_pattern(routing_key)
        path: list[tuple[_Node, str]] = []
        node: _Node | None = self._root
        for w in words:
            assert node is not None
            path.append((node, w))
            if w == "*":
                node = node.star
            elif w == "#":
                node = node.hash
            else:
                node = node.children.get(w) if node.children else None
            if node is None:
                return False
        assert node is not None
        if prefix is not None:
            entry = (prefix, queue)
            if not node.prefixes or entry not in node.prefixes:
                return False
            node.prefixes.remove(entry)
            if not node.prefixes:
                node.prefixes = None
        else:
            if not node.queues or queue not in node.queues:
                return False
            node.queues.remove(queue)
            if not node.queues:
                node.queues = None
        # Prune empty nodes so the trie's memory follows its bindings.
        while path and node.empty():
            parent, w = path.pop()
            if w == "*":
                parent.star = None
            elif w == "#":
                parent.hash = None
            else:
                assert parent.children is not None
                del parent.children[w]
                if not parent.children:
                    parent.children = None
            node = parent
        self.binding_count -= 1
        self._cache = {}
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        found: dict[Queue, None] = {}
        words = routing_key.split(".")
        self._match(self._root, words, 0, len(words), found)
        result = tuple(found)
        cache = self._cache
        if len(cache) >= self.cache_size:
            cache.clear()
        cache[routing_key] = result
        return result

    def _match(self, node: _Node, words: list[str], i: int, n: int, found: dict) -> None:
        if node.prefixes is not None and i < n:
            rest = ".".join(words[i:])
            for prefix, queue in node.prefixes:
                if rest.startswith(prefix):
                    found[queue] = None
        if node.hash is not None:
            # '#' swallows zero or more words.
            for j in range(i, n + 1):
                self._match(node.hash, words, j, n, found)
        if i == n:
            if node.queues is not None:
                for q in node.queues:
                    found[q] = None
            return
        if node.children is not None:
            child = node.children.get(words[i])
            if child is not None:
                self._match(child, words, i + 1, n, found)
        if node.star is not None:
            self._match(node.star, words, i + 1, n, found)


class HeadersExchange(Exchange):
    """Routes on message headers: C{x-match: all} (default) or C{any}."""

    type = "headers"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        self._bindings: list[tuple[Queue, str, dict, bool]] = []

    @staticmethod
    def _spec(arguments: dict | None) -> tuple[dict, bool]:
        args = dict(arguments or {})
        mode = args.pop("x-match", "all")
        if mode not in ("all", "any"):
            raise PreconditionFailed(f"x-match must be 'all' or 'any', got {mode!r}")
        # Message headers are strings: compare binding values as strings too.
        return {k: str(v) for k, v in args.items() if not k.startswith("x-")}, mode == "any"

    def bind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        match, any_ = self._spec(arguments)
        entry = (queue, routing_key, match, any_)
        if entry in self._bindings:
            return False
        self._bindings.append(entry)
        self.binding_count += 1
        return True

    def unbind(self, queue: Queue, routing_key: str, arguments: dict | None) -> bool:
        match, any_ = self._spec(arguments)
        entry = (queue, routing_key, match, any_)
        if entry not in self._bindings:
            return False
        self._bindings.remove(entry)
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        headers = headers or {}
        found: dict[Queue, None] = {}
        for queue, _key, match, any_ in self._bindings:
            if any_:
                ok = any(headers.get(k, _MISSING) == v for k, v in match.items()) if match else True
            else:
                ok = all(headers.get(k, _MISSING) == v for k, v in match.items())
            if ok:
                found[queue] = None
        return tuple(found)


_MISSING = object()

EXCHANGE_CLASSES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}
