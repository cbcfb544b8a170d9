# -*- test-case-name: tests.test_core_exchange -*-
"""Exchange types: direct, fanout, topic and headers.

An exchange maps a publish (routing key, headers) to the targets bound to
it that match. A target is a queue or a live consumer (an auto-ack
subscriber bound straight to the exchange, see L{qmq.core.channel}); an
exchange only hashes a target and tells targets apart by identity, and
never calls it. Each type keeps an index suited to its matching rule, so
that routing cost does not grow with the bindings that do not match, and
so that binding and unbinding cost O(1) whatever the number of bindings
(insertion-ordered dicts throughout: a list's C{in} or C{remove} would make
unbinding 40,000 targets take half a minute):

  - direct: routing key -> targets.
  - fanout: target -> how many bindings it has (one per routing key).
  - topic: a trie over the dot-separated words of the binding patterns, with
    C{*} (exactly one word), C{#} (zero or more words) and, as in ocamlmq, a
    final word ending in C{*} (C{foo*}, C{a.b*}) that matches any key whose
    remaining text starts with what precedes the star. Consecutive C{#}
    words mean no more than one, so they are collapsed (C{a.#.#.b} names
    the same binding as C{a.#.b}).
  - headers: C{x-match} C{all} (default) or C{any} over binding arguments,
    keyed by the binding's whole specification.

Routing a publish is the hot path. C{route} returns a sequence of distinct
targets (a target bound twice gets one copy) that the caller must treat as
read-only: direct and fanout exchanges keep it as a tuple built on the first
route after a change (building it costs no more than delivering to it), and
the topic exchange caches its answer per routing key until the bindings
change.

The topic matcher walks the key one word at a time carrying the set of trie
nodes still alive (a simulation of the pattern automaton: a C{#} node stays
alive and absorbs any number of words). That set never holds a node twice,
so a route costs at most (trie nodes) x (key words) steps, whatever the
patterns: a pattern of 600 C{#} words cannot cost 5e9 calls, nor a deep one
overflow the stack. Topic exchanges also cap the words of a pattern or a
key (L{TopicExchange.max_words}, configured as C{limits.max_topic_words})
and their length in characters (L{TopicExchange.max_key_length},
C{limits.max_routing_key_length}); breaking either raises
L{PreconditionFailed}.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from qmq.core.errors import PreconditionFailed
from qmq.core.names import check_exchange

if TYPE_CHECKING:
    from qmq.core.message import Message

__all__ = [
    "ALTERNATE_EXCHANGE",
    "EXCHANGE_CLASSES",
    "EXCHANGE_TYPES",
    "Binding",
    "DirectExchange",
    "Exchange",
    "FanoutExchange",
    "HeadersExchange",
    "Target",
    "TopicExchange",
    "alternate_of",
]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
_EMPTY: tuple = ()

#: The exchange argument naming where a message the exchange routes to
#: nothing goes instead (RabbitMQ's spelling; see L{alternate_of}).
ALTERNATE_EXCHANGE = "alternate-exchange"


def alternate_of(arguments: Mapping[str, Any] | None) -> str | None:
    """The alternate exchange exchange C{arguments} name, or None.

    Every frontend's exchange arguments (AMQP's C{exchange.declare}, the
    HTTP API's PUT, a definitions document) are read here. Other arguments
    are kept with the exchange and mean nothing to it, as in RabbitMQ.

    @raise PreconditionFailed: the value is not a non-empty string (the
        default exchange cannot be an alternate).
    @raise InvalidName: it breaks a rule of L{qmq.core.names}.
    """
    if not arguments:
        return None
    value = arguments.get(ALTERNATE_EXCHANGE)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PreconditionFailed(
            f"invalid value {value!r} for exchange argument {ALTERNATE_EXCHANGE!r}: expected the "
            "name of an exchange (not the default exchange)",
            "invalid exchange argument",
        )
    check_exchange(value)
    return value


class Target(Hashable, Protocol):
    """What a binding points at: a L{qmq.core.queue.Queue} or a live consumer.

    Exchanges hash targets and compare them by identity only; the virtual
    host delivers to them.
    """

    def publish(self, message: Message) -> Any:
        """Take C{message}."""


#: One binding as L{Exchange.bindings} lists it: the target, the routing key
#: and the arguments as they were given to L{Exchange.bind}.
Binding = tuple[Target, str, dict | None]


class Exchange:
    """Base of the exchange types.

    @ivar name: its name.
    @ivar type: one of L{EXCHANGE_TYPES}.
    @ivar durable: survives a restart.
    @ivar auto_delete: deleted when its last binding goes.
    @ivar binding_count: how many bindings it has.
    @ivar deleted: set once it has been deleted (frontends cache exchanges).
    @ivar e2e: how many of its bindings point at exchanges (0 keeps the
        expansion of L{qmq.core.vhost.VirtualHost.expand} off the publish
        path).
    @ivar sources: the bindings that point at it from other exchanges, as
        C{(source, routing_key, arguments)} (None while there are none).
    @ivar internal: clients may not publish to it; only bindings from other
        exchanges (and alternates) route into it.
    @ivar arguments: the arguments it was declared with (None: none).
    @ivar alternate: the name of its alternate exchange (C{alternate-exchange}),
        where a publish it routes to nothing goes instead, or None.
    """

    type = ""
    # Set by VirtualHost.declare_exchange on the exchanges that have them:
    # the class defaults keep every constructor as it was.
    internal = False
    arguments: dict | None = None
    alternate: str | None = None

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.binding_count = 0
        self.deleted = False
        self.e2e = 0
        self.sources: list[tuple[Exchange, str, dict | None]] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} bindings={self.binding_count}>"

    def bind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        """Add a binding.

        @param target: a queue or a live consumer.
        @param routing_key: the binding key (a pattern for a topic exchange).
        @param arguments: binding arguments (the headers to match for a
            headers exchange; kept but unused by the other types).
        @return: False if the binding existed already (then nothing changes,
            and the arguments first given stay).
        @raise PreconditionFailed: the key or the arguments are invalid.
        """
        raise NotImplementedError

    def unbind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        """Remove a binding.

        @param target: as given to L{bind}.
        @param routing_key: as given to L{bind}.
        @param arguments: as given to L{bind} (only a headers exchange
            tells bindings apart by their arguments).
        @return: False if there was no such binding.
        """
        raise NotImplementedError

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        """The targets a publish with this key and headers goes to.

        @param routing_key: the publish's routing key.
        @param headers: the message's headers (strings), or None.
        @return: distinct targets, in a sequence the caller must not change
            (the exchange may return it again).
        @raise PreconditionFailed: the key breaks a limit (topic exchanges).
        """
        raise NotImplementedError

    def bindings(self) -> list[Binding]:
        """Every binding, as C{(target, routing_key, arguments)}.

        @return: a new list, so the caller may unbind while walking it.
        """
        raise NotImplementedError


class DirectExchange(Exchange):
    """Routes to the targets bound with exactly the routing key.

    @ivar cache_size: most routing keys without a binding whose (empty)
        route is kept.
    """

    type = "direct"
    cache_size = 10_000

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        # routing key -> target -> binding arguments.
        self._by_key: dict[str, dict[Target, dict | None]] = {}
        # routing key -> its targets as a tuple, for route() to hand out
        # (empty for a key routed but not bound); a key is dropped on change
        # and rebuilt by its next route.
        self._routes: dict[str, tuple] = {}

    def bind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        targets = self._by_key.get(routing_key)
        if targets is None:
            targets = self._by_key[routing_key] = {}
        elif target in targets:
            return False
        targets[target] = arguments
        self._routes.pop(routing_key, None)
        self.binding_count += 1
        return True

    def unbind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        targets = self._by_key.get(routing_key)
        if targets is None or target not in targets:
            return False
        del targets[target]
        if not targets:
            del self._by_key[routing_key]
        self._routes.pop(routing_key, None)
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        targets = self._routes.get(routing_key)
        if targets is None:
            targets = self._refresh(routing_key)
        return targets

    def _refresh(self, routing_key: str) -> tuple:
        """Build and keep the route of C{routing_key}, bound or not."""
        routes = self._routes
        if len(routes) >= len(self._by_key) + self.cache_size:
            # Unbound keys (publishers choose them) have filled it: start
            # again; bound keys are rebuilt as they are next routed.
            routes.clear()
        bound = self._by_key.get(routing_key)
        targets = routes[routing_key] = tuple(bound) if bound else _EMPTY
        return targets

    def bindings(self) -> list[Binding]:
        return [
            (target, key, arguments)
            for key, targets in self._by_key.items()
            for target, arguments in targets.items()
        ]


class FanoutExchange(Exchange):
    """Routes to every bound target, whatever the key."""

    type = "fanout"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        # (target, routing key) -> binding arguments.
        self._keys: dict[tuple[Target, str], dict | None] = {}
        # target -> how many routing keys bind it: it leaves the route with
        # its last binding.
        self._counts: dict[Target, int] = {}
        # The distinct targets as a tuple, built by route(); a change empties
        # it (a falsy marker costs route() less than a None test).
        self._route: tuple = _EMPTY

    def bind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        entry = (target, routing_key)
        if entry in self._keys:
            return False
        self._keys[entry] = arguments
        counts = self._counts
        count = counts.get(target, 0)
        counts[target] = count + 1
        if not count:
            self._route = _EMPTY
        self.binding_count += 1
        return True

    def unbind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        entry = (target, routing_key)
        if entry not in self._keys:
            return False
        del self._keys[entry]
        counts = self._counts
        count = counts[target] - 1
        if count:
            counts[target] = count
        else:
            del counts[target]
            self._route = _EMPTY
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        return self._route or self._refresh()

    def _refresh(self) -> tuple:
        """Build and keep the route (every bound target)."""
        targets = self._route = tuple(self._counts)
        return targets

    def bindings(self) -> list[Binding]:
        return [(target, key, arguments) for (target, key), arguments in self._keys.items()]


class _Node:
    """A trie node: one word of a topic pattern.

    @ivar children: literal word -> node.
    @ivar star: the node for a C{*} word.
    @ivar hash: the node for a C{#} word.
    @ivar targets: the targets of the patterns that end here: target ->
        (routing key, arguments) as bound.
    @ivar prefixes: the targets of the patterns whose final C{foo*} word
        follows here: C{foo} -> target -> (routing key, arguments).
    """

    __slots__ = ("children", "star", "hash", "targets", "prefixes")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.targets: dict[Target, tuple[str, dict | None]] | None = None
        self.prefixes: dict[str, dict[Target, tuple[str, dict | None]]] | None = None

    def empty(self) -> bool:
        return not (self.children or self.star or self.hash or self.targets or self.prefixes)


class TopicExchange(Exchange):
    """Routes by pattern over dot-separated words (see the module doc).

    @cvar DEFAULT_MAX_WORDS: the default of L{max_words}. Matching costs at
        most (pattern words) x (key words) steps per pattern, so this keeps
        an adversary's pattern cheap; 32 dot-separated words is far more
        than any real topic hierarchy uses.
    @cvar DEFAULT_MAX_KEY_LENGTH: the default of L{max_key_length}: 255, a
        routing key's limit in AMQP 0-9-1 (a short string).
    @ivar max_words: most words in a binding pattern or a routing key
        (configured as C{limits.max_topic_words}); an instance may override
        the class's value at any time before it routes.
    @ivar max_key_length: most characters in a binding pattern or a routing
        key (configured as C{limits.max_routing_key_length}).
    @ivar cache_size: most routing keys whose route is cached.
    @ivar steps: trie nodes the matcher has expanded, over all uncached
        routes: a measure of routing work, for tests and diagnostics.
    """

    type = "topic"
    DEFAULT_MAX_WORDS = 32
    DEFAULT_MAX_KEY_LENGTH = 255
    max_words = DEFAULT_MAX_WORDS
    max_key_length = DEFAULT_MAX_KEY_LENGTH
    cache_size = 10_000

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        self._root = _Node()
        self._cache: dict[str, tuple] = {}
        self.steps = 0

    def _check(self, what: str, text: str, words: int) -> None:
        """Refuse a pattern or key past L{max_words} or L{max_key_length}.

        @param what: C{"topic pattern"} or C{"routing key"}, for the message.
        @param text: the pattern or key.
        @param words: how many words it has.
        @raise PreconditionFailed: it breaks a limit; the message names the
            limit and its configuration key.
        """
        if words > self.max_words:
            raise PreconditionFailed(
                f"{what} has {words} words; the limit is {self.max_words} "
                "(limits.max_topic_words)"
            )
        if len(text) > self.max_key_length:
            raise PreconditionFailed(
                f"{what} has {len(text)} characters; the limit is {self.max_key_length} "
                "(limits.max_routing_key_length)"
            )

    @staticmethod
    def _split_pattern(routing_key: str) -> tuple[list[str], str | None]:
        """The words of a binding pattern, and the prefix of a final C{foo*} word.

        Runs of C{#} are collapsed to one, for bind and unbind alike, so that
        C{a.#.#.b} and C{a.#.b} name the same trie node.
        """
        words = routing_key.split(".")
        last = words[-1]
        prefix = None
        if len(last) > 1 and last.endswith("*"):
            prefix = last[:-1]
            del words[-1]
        if "#.#" in routing_key:
            collapsed: list[str] = []
            for w in words:
                if w != "#" or not collapsed or collapsed[-1] != "#":
                    collapsed.append(w)
            words = collapsed
        return words, prefix

    def bind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        # str.count: a pattern of a million words is refused without
        # splitting it first.
        self._check("topic pattern", routing_key, routing_key.count(".") + 1)
        words, prefix = self._split_pattern(routing_key)
        node = self._root
        for w in words:
            node = self._child(node, w)
        if prefix is not None:
            if node.prefixes is None:
                node.prefixes = {}
            targets = node.prefixes.get(prefix)
            if targets is None:
                targets = node.prefixes[prefix] = {}
        else:
            targets = node.targets
            if targets is None:
                targets = node.targets = {}
        if target in targets:
            return False
        targets[target] = (routing_key, arguments)
        self.binding_count += 1
        if self._cache:
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

    def unbind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        # No limit checked: a binding made before a limit was lowered can
        # still go, and an over-long pattern merely fails to be found.
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
            prefixes = node.prefixes
            targets = prefixes.get(prefix) if prefixes else None
            if targets is None or target not in targets:
                return False
            del targets[target]
            if not targets:
                assert prefixes is not None
                del prefixes[prefix]
                if not prefixes:
                    node.prefixes = None
        else:
            targets = node.targets
            if not targets or target not in targets:
                return False
            del targets[target]
            if not targets:
                node.targets = None
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
        if self._cache:
            self._cache = {}
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        # Limits are checked on a miss only, to keep hits as cheap as they
        # were: a cached key passed them when it was cached, and the limits
        # are set when the exchange is made and not lowered while it routes
        # (a key cached before a limit was lowered would pass until the
        # cache is next dropped).
        words = routing_key.split(".")
        if len(words) > self.max_words or len(routing_key) > self.max_key_length:
            self._check("routing key", routing_key, len(words))
        result = self._match(routing_key, words)
        cache = self._cache
        if len(cache) >= self.cache_size:
            cache.clear()
        cache[routing_key] = result
        return result

    def _match(self, key: str, words: list[str]) -> tuple:
        """The distinct targets of the patterns that match C{key}.

        Iterative, one word at a time, carrying the trie nodes reached by
        the words consumed so far: C{alive}, the nodes reached by a literal
        word or a C{*}, and C{hashes}, the C{#} nodes reached (with zero
        words as soon as their parent is), which stay alive to the end since
        they absorb any number of words. A node has one parent, so distinct
        parents reach distinct nodes: C{alive} never holds a node twice
        without being a set, and C{hashes} is a dict because a C{#} node's
        parent may be reached at several positions. Each step thus expands
        at most every node of the trie once. The final C{foo*} words are
        tried against the rest of the key at each position.

        @param key: the routing key.
        @param words: C{key.split(".")}.
        """
        found: dict[Target, Any] = {}
        root = self._root
        alive = [root]
        hashes: dict[_Node, None] = {}
        if root.hash is not None:
            hashes[root.hash] = None
        steps = 0
        start = 0  # where the current word starts in key
        for word in words:
            if hashes:
                alive.extend(hashes)
            elif not alive:
                break
            steps += len(alive)
            after = []
            for node in alive:
                prefixes = node.prefixes
                if prefixes is not None:
                    for prefix, targets in prefixes.items():
                        # The rest of the key, without slicing it.
                        if key.startswith(prefix, start):
                            found.update(targets)
                children = node.children
                if children is not None:
                    child = children.get(word)
                    if child is not None:
                        after.append(child)
                        # Never a '#' under a '#' (collapsed): one level.
                        hash_ = child.hash
                        if hash_ is not None:
                            hashes[hash_] = None
                star = node.star
                if star is not None:
                    after.append(star)
                    hash_ = star.hash
                    if hash_ is not None:
                        hashes[hash_] = None
            alive = after
            start += len(word) + 1
        else:
            alive.extend(hashes)
            steps += len(alive)
            for node in alive:
                targets = node.targets
                if targets is not None:
                    found.update(targets)
        self.steps += steps
        return tuple(found)

    def bindings(self) -> list[Binding]:
        result: list[Binding] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.targets is not None:
                result.extend((t, key, args) for t, (key, args) in node.targets.items())
            if node.prefixes is not None:
                for targets in node.prefixes.values():
                    result.extend((t, key, args) for t, (key, args) in targets.items())
            if node.children is not None:
                stack.extend(node.children.values())
            if node.star is not None:
                stack.append(node.star)
            if node.hash is not None:
                stack.append(node.hash)
        return result


def _header_value(name: str, value: object) -> str:
    """A binding argument's value as the message header it matches.

    Message headers are strings, so a binding value matches the header
    whose text is: the string itself, C{true}/C{false} for a boolean, the
    decimal digits of an integer. Any other type (a float, whose text is
    ambiguous, a date, a list) is refused rather than guessed.

    @raise PreconditionFailed: C{value} is of another type.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # before int: a bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise PreconditionFailed(
        f"headers binding argument {name!r} must be a string, an integer or a boolean, "
        f"not {type(value).__name__} (write it as a string)"
    )


def _typed_text(value: object) -> str | None:
    """A typed message header's text as a binding compares it (see
    L{_header_value}): C{true}/C{false}, an integer's digits; None for any
    other type (no binding value matches it)."""
    if value.__class__ is bool:
        return "true" if value else "false"
    if value.__class__ is int:
        return str(value)
    return None


class HeadersExchange(Exchange):
    """Routes on message headers: C{x-match: all} (default) or C{any}.

    Arguments whose name starts with C{x-} are not matched. See
    L{_header_value} for how a binding value compares with a header.
    """

    type = "headers"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False) -> None:
        super().__init__(name, durable, auto_delete)
        # (target, routing key, frozenset of (header, value), any) ->
        # (target, ((header, value), ...), any, routing key, arguments).
        self._bindings: dict[tuple, tuple] = {}

    @staticmethod
    def _spec(arguments: dict | None) -> tuple[tuple[tuple[str, str], ...], bool]:
        """The headers to match and whether any one is enough.

        @raise PreconditionFailed: a bad C{x-match} or argument value.
        """
        if not arguments:
            return (), False
        mode = arguments.get("x-match", "all")
        if mode not in ("all", "any"):
            raise PreconditionFailed(f"x-match must be 'all' or 'any', got {mode!r}")
        match = tuple(
            (k, _header_value(k, v)) for k, v in arguments.items() if not k.startswith("x-")
        )
        return match, mode == "any"

    def bind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        match, any_ = self._spec(arguments)
        key = (target, routing_key, frozenset(match), any_)
        if key in self._bindings:
            return False
        self._bindings[key] = (target, match, any_, routing_key, arguments)
        self.binding_count += 1
        return True

    def unbind(self, target: Target, routing_key: str, arguments: dict | None) -> bool:
        match, any_ = self._spec(arguments)
        if self._bindings.pop((target, routing_key, frozenset(match), any_), None) is None:
            return False
        self.binding_count -= 1
        return True

    def route(self, routing_key: str, headers: dict | None) -> tuple | list:
        if headers is None:
            headers = {}
        get = headers.get
        found: dict[Target, None] = {}
        for target, match, any_, _key, _arguments in self._bindings.values():
            if target in found:
                continue
            # The values in match are strings: a missing header (None) never
            # equals one; a typed header matches by its text.
            if any_:
                ok = not match
                for k, v in match:
                    h = get(k)
                    if h == v or (h is not None and h.__class__ is not str and _typed_text(h) == v):
                        ok = True
                        break
            else:
                ok = True
                for k, v in match:
                    h = get(k)
                    if h != v and (h is None or h.__class__ is str or _typed_text(h) != v):
                        ok = False
                        break
            if ok:
                found[target] = None
        return tuple(found)

    def bindings(self) -> list[Binding]:
        return [
            (target, key, arguments)
            for target, _match, _any, key, arguments in self._bindings.values()
        ]


EXCHANGE_CLASSES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}
