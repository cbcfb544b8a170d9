"""Tests for L{qmq.core.exchange}: direct, fanout, topic (trie) and headers routing."""

from __future__ import annotations

import time

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.errors import PreconditionFailed
from qmq.core.exchange import (
    DirectExchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from qmq.core.queue import Queue


def names(queues) -> list[str]:
    return sorted(q.name for q in queues)


class DirectExchangeTests(SynchronousTestCase):
    def test_exact_key(self) -> None:
        ex = DirectExchange("d")
        a, b, c = Queue(None, "a"), Queue(None, "b"), Queue(None, "c")
        self.assertTrue(ex.bind(a, "k1", None))
        self.assertTrue(ex.bind(b, "k1", None))
        self.assertTrue(ex.bind(c, "k2", None))
        self.assertFalse(ex.bind(a, "k1", None))
        self.assertEqual(ex.binding_count, 3)
        self.assertEqual(names(ex.route("k1", None)), ["a", "b"])
        self.assertEqual(names(ex.route("k2", None)), ["c"])
        self.assertEqual(names(ex.route("k", None)), [])
        self.assertEqual(names(ex.route("k1.x", None)), [])

    def test_unbind(self) -> None:
        ex = DirectExchange("d")
        a, b = Queue(None, "a"), Queue(None, "b")
        ex.bind(a, "k", None)
        ex.bind(b, "k", None)
        self.assertTrue(ex.unbind(a, "k", None))
        self.assertFalse(ex.unbind(a, "k", None))
        self.assertFalse(ex.unbind(a, "other", None))
        self.assertEqual(names(ex.route("k", None)), ["b"])
        self.assertTrue(ex.unbind(b, "k", None))
        self.assertEqual(names(ex.route("k", None)), [])
        self.assertEqual(ex.binding_count, 0)


class FanoutExchangeTests(SynchronousTestCase):
    def test_every_queue_any_key(self) -> None:
        ex = FanoutExchange("f")
        a, b = Queue(None, "a"), Queue(None, "b")
        ex.bind(a, "", None)
        ex.bind(b, "ignored", None)
        for key in ("", "x", "a.b.c"):
            self.assertEqual(names(ex.route(key, None)), ["a", "b"])

    def test_two_bindings_one_copy(self) -> None:
        """A queue bound twice (two keys) gets one copy, until both are gone."""
        ex = FanoutExchange("f")
        a = Queue(None, "a")
        self.assertTrue(ex.bind(a, "k1", None))
        self.assertTrue(ex.bind(a, "k2", None))
        self.assertFalse(ex.bind(a, "k2", None))
        self.assertEqual(ex.binding_count, 2)
        self.assertEqual(names(ex.route("", None)), ["a"])
        self.assertTrue(ex.unbind(a, "k1", None))
        self.assertEqual(names(ex.route("", None)), ["a"])
        self.assertFalse(ex.unbind(a, "k1", None))
        self.assertTrue(ex.unbind(a, "k2", None))
        self.assertEqual(names(ex.route("", None)), [])


# (pattern, keys it matches, keys it does not match)
TOPIC_CASES = [
    ("a.b.c", ["a.b.c"], ["a.b", "a.b.c.d", "a.b.x", "x.b.c", "a.bc"]),
    ("*", ["a", "abc"], ["a.b", "a.b.c"]),
    ("a.*", ["a.b", "a.xyz"], ["a", "a.b.c", "b.a", "ab"]),
    ("*.b", ["a.b", "x.b"], ["b", "a.b.c", "a.c"]),
    ("*.*", ["a.b"], ["a", "a.b.c"]),
    ("#", ["a", "a.b", "a.b.c.d.e"], []),
    ("a.#", ["a", "a.b", "a.b.c"], ["b", "b.a", "ab", "ab.c"]),
    ("#.c", ["c", "a.c", "a.b.c"], ["a.c.d", "ac", "a.bc"]),
    ("a.#.b", ["a.b", "a.x.b", "a.x.y.z.b"], ["a", "a.x", "b.a.b", "a.b.c", "a.xb"]),
    ("a.*.#", ["a.b", "a.b.c", "a.b.c.d"], ["a", "b.c"]),
    ("#.#", ["a", "a.b.c"], []),
    ("a.#.#.b", ["a.b", "a.x.b", "a.x.y.b"], ["a", "b"]),
    ("#.b.#", ["b", "a.b", "b.c", "a.b.c", "x.y.b.z"], ["a", "a.c", "bb"]),
    # Trailing-star prefix match (ocamlmq): the rest of the key starts with it.
    ("foo*", ["foo", "food", "foo.bar", "foobar.baz"], ["fo", "xfoo", "bar.foo", "f"]),
    ("a.b*", ["a.b", "a.bc", "a.b.c", "a.bx.y"], ["a", "a.c", "x.a.b", "ab", "b"]),
    ("*.b*", ["x.b", "x.bee", "x.b.c"], ["b", "x", "x.a.b"]),
    ("#.x*", ["x", "x1", "a.b.xyz", "a.x.q"], ["a", "a.y", "ax"]),
    ("a.#.c*", ["a.c", "a.b.cd", "a.b.b.c.e"], ["a", "a.b", "x.c"]),
]


class TopicExchangeTests(SynchronousTestCase):
    def test_patterns(self) -> None:
        """Each pattern matches exactly the keys it should (one binding at a time)."""
        for pattern, matching, other in TOPIC_CASES:
            ex = TopicExchange("t")
            q = Queue(None, "q")
            ex.bind(q, pattern, None)
            for key in matching:
                self.assertEqual(
                    names(ex.route(key, None)), ["q"], f"{pattern!r} should match {key!r}"
                )
            for key in other:
                self.assertEqual(
                    names(ex.route(key, None)), [], f"{pattern!r} should not match {key!r}"
                )

    def test_all_patterns_together(self) -> None:
        """With every pattern bound at once, each key reaches exactly its queues."""
        ex = TopicExchange("t")
        queues = {}
        for i, (pattern, _, _) in enumerate(TOPIC_CASES):
            queues[pattern] = q = Queue(None, f"q{i}")
            ex.bind(q, pattern, None)
        keys = {k for _, m, o in TOPIC_CASES for k in m + o}
        for key in sorted(keys):
            expected = sorted(queues[p].name for p, _, _ in TOPIC_CASES if _brute(p, key))
            self.assertEqual(names(ex.route(key, None)), expected, key)

    def test_dedupe(self) -> None:
        """A queue matched through several bindings is routed to once."""
        ex = TopicExchange("t")
        q, other = Queue(None, "q"), Queue(None, "other")
        for pattern in ("a.*", "*.b", "#", "a.#", "a.b", "a*"):
            self.assertTrue(ex.bind(q, pattern, None))
        ex.bind(other, "a.b", None)
        self.assertFalse(ex.bind(q, "a.*", None))
        self.assertFalse(ex.bind(q, "a*", None))
        self.assertEqual(ex.binding_count, 7)
        routed = ex.route("a.b", None)
        self.assertEqual(len(routed), 2)
        self.assertEqual(names(routed), ["other", "q"])

    def test_dedupe_through_publish(self) -> None:
        """Through the vhost, a doubly bound queue holds one copy."""
        broker = Broker(Clock())
        vhost = broker.default_vhost
        q = vhost.declare_queue("q")
        vhost.bind("q", "amq.topic", "a.*")
        vhost.bind("q", "amq.topic", "#.b")
        vhost.bind("q", "amq.topic", "a.b*")
        self.assertEqual(vhost.publish(broker.new_message("amq.topic", "a.b", None, b"x")), 1)
        self.assertEqual(len(q), 1)

    def test_unbind_prunes(self) -> None:
        """Unbinding everything leaves an empty trie."""
        ex = TopicExchange("t")
        q, r = Queue(None, "q"), Queue(None, "r")
        # a.#.#.b is a.#.b and #.# is # (runs of # collapse): one binding each.
        patterns = [p for p, _, _ in TOPIC_CASES if p not in ("#.#", "a.#.#.b")]
        for p in patterns:
            ex.bind(q, p, None)
            ex.bind(r, p, None)
        self.assertFalse(ex._root.empty())
        for p in reversed(patterns):
            self.assertTrue(ex.unbind(q, p, None))
        # r's bindings still route.
        self.assertEqual(names(ex.route("a.x.b", None)), ["r"])
        for p in patterns:
            self.assertTrue(ex.unbind(r, p, None))
            self.assertFalse(ex.unbind(r, p, None))
        self.assertTrue(ex._root.empty())
        self.assertIsNone(ex._root.children)
        self.assertIsNone(ex._root.star)
        self.assertIsNone(ex._root.hash)
        self.assertEqual(ex.binding_count, 0)

    def test_unbind_keeps_siblings(self) -> None:
        """Pruning stops at nodes other bindings still use."""
        ex = TopicExchange("t")
        q = Queue(None, "q")
        ex.bind(q, "a.b.c", None)
        ex.bind(q, "a.b", None)
        ex.bind(q, "a.x*", None)
        self.assertTrue(ex.unbind(q, "a.b.c", None))
        self.assertEqual(names(ex.route("a.b", None)), ["q"])
        self.assertEqual(names(ex.route("a.b.c", None)), [])
        self.assertEqual(names(ex.route("a.xy", None)), ["q"])
        self.assertFalse(ex.unbind(q, "a.b.c.d", None))
        self.assertFalse(ex.unbind(q, "a.y*", None))
        self.assertFalse(ex.unbind(q, "z.#", None))
        self.assertEqual(ex.binding_count, 2)

    def test_cache_invalidation(self) -> None:
        """Routes are cached per key but follow bind and unbind."""
        ex = TopicExchange("t")
        q, r = Queue(None, "q"), Queue(None, "r")
        ex.bind(q, "a.b", None)
        self.assertEqual(names(ex.route("a.b", None)), ["q"])
        self.assertEqual(names(ex.route("a.b", None)), ["q"])  # cached
        ex.bind(r, "a.*", None)
        self.assertEqual(names(ex.route("a.b", None)), ["q", "r"])
        ex.unbind(q, "a.b", None)
        self.assertEqual(names(ex.route("a.b", None)), ["r"])
        ex.bind(q, "a.b*", None)
        self.assertEqual(names(ex.route("a.b", None)), ["q", "r"])
        ex.unbind(q, "a.b*", None)
        ex.unbind(r, "a.*", None)
        self.assertEqual(names(ex.route("a.b", None)), [])

    def test_cache_overflow(self) -> None:
        """Past its size the cache is dropped, and routing stays right."""
        ex = TopicExchange("t")
        ex.cache_size = 10
        q = Queue(None, "q")
        ex.bind(q, "k.*", None)
        for i in range(35):
            self.assertEqual(names(ex.route(f"k.{i}", None)), ["q"])
            self.assertEqual(names(ex.route(f"j.{i}", None)), [])
            self.assertLessEqual(len(ex._cache), 10)

    def test_many_non_matching_bindings(self) -> None:
        """100k bindings that do not match neither change nor slow down routing."""
        ex = TopicExchange("t")
        n = 100_000
        for i in range(n):
            pattern = (f"s{i}.x", f"w{i}.*", f"h{i}.#", f"p{i}.pre*")[i % 4]
            ex.bind(Queue(None, f"n{i}"), pattern, None)
        target = Queue(None, "target")
        ex.bind(target, "orders.*.eu", None)
        ex.bind(target, "#.audit", None)
        self.assertEqual(ex.binding_count, n + 2)
        self.assertEqual(names(ex.route("orders.new.eu", None)), ["target"])
        self.assertEqual(names(ex.route("x.y.audit", None)), ["target"])
        self.assertEqual(names(ex.route("orders.new.us", None)), [])
        # The non-matching ones still match their own keys.
        self.assertEqual(names(ex.route("s4.x", None)), ["n4"])
        self.assertEqual(names(ex.route("w5.anything", None)), ["n5"])
        self.assertEqual(names(ex.route("h6.a.b.c", None)), ["n6"])
        self.assertEqual(names(ex.route("p7.prefix.z", None)), ["n7"])
        self.assertEqual(names(ex.route("h6.x.audit", None)), ["n6", "target"])
        # Uncached routing must not scan the bindings: 2000 distinct keys
        # would take minutes if it did.
        start = time.perf_counter()
        for i in range(2000):
            self.assertEqual(len(ex.route(f"orders.{i}.eu", None)), 1)
        self.assertLess(time.perf_counter() - start, 2.0)


def _brute(pattern: str, key: str) -> bool:
    """A reference matcher over words, for cross-checking the trie."""
    pw = pattern.split(".")
    kw = key.split(".")
    prefix = None
    if len(pw[-1]) > 1 and pw[-1].endswith("*"):
        prefix = pw[-1][:-1]
        pw = pw[:-1]

    def match(i: int, j: int) -> bool:
        if i == len(pw):
            if prefix is None:
                return j == len(kw)
            return j < len(kw) and ".".join(kw[j:]).startswith(prefix)
        w = pw[i]
        if w == "#":
            return any(match(i + 1, k) for k in range(j, len(kw) + 1))
        if j == len(kw):
            return False
        if w == "*" or w == kw[j]:
            return match(i + 1, j + 1)
        return False

    return match(0, 0)


class BruteMatcherTests(SynchronousTestCase):
    def test_reference_agrees_with_table(self) -> None:
        """The reference matcher used above agrees with the hand-written table."""
        for pattern, matching, other in TOPIC_CASES:
            for key in matching:
                self.assertTrue(_brute(pattern, key), (pattern, key))
            for key in other:
                self.assertFalse(_brute(pattern, key), (pattern, key))


class HeadersExchangeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.ex = HeadersExchange("h")
        self.all = Queue(None, "all")
        self.any = Queue(None, "any")
        self.ex.bind(self.all, "", {"format": "pdf", "type": "report"})
        self.ex.bind(self.any, "", {"x-match": "any", "format": "pdf", "type": "log"})

    def test_all_and_any(self) -> None:
        route = self.ex.route
        self.assertEqual(names(route("", {"format": "pdf", "type": "report"})), ["all", "any"])
        self.assertEqual(names(route("", {"format": "pdf", "type": "report", "x": "y"})), ["all", "any"])
        self.assertEqual(names(route("", {"format": "pdf"})), ["any"])
        self.assertEqual(names(route("", {"type": "log"})), ["any"])
        self.assertEqual(names(route("", {"type": "report"})), [])
        self.assertEqual(names(route("", {"format": "zip", "type": "x"})), [])
        self.assertEqual(names(route("", None)), [])

    def test_routing_key_ignored(self) -> None:
        self.assertEqual(names(self.ex.route("whatever", {"type": "log"})), ["any"])

    def test_x_arguments_ignored(self) -> None:
        q = Queue(None, "q")
        self.ex.bind(q, "", {"x-priority": "9", "kind": "a"})
        self.assertEqual(names(self.ex.route("", {"kind": "a"})), ["q"])

    def test_bad_x_match(self) -> None:
        self.assertRaises(
            PreconditionFailed, self.ex.bind, Queue(None, "q"), "", {"x-match": "most"}
        )

    def test_bind_twice_and_unbind(self) -> None:
        self.assertFalse(self.ex.bind(self.all, "", {"type": "report", "format": "pdf"}))
        self.assertEqual(self.ex.binding_count, 2)
        self.assertTrue(self.ex.unbind(self.all, "", {"format": "pdf", "type": "report"}))
        self.assertFalse(self.ex.unbind(self.all, "", {"format": "pdf", "type": "report"}))
        self.assertEqual(names(self.ex.route("", {"format": "pdf", "type": "report"})), ["any"])
        self.assertEqual(self.ex.binding_count, 1)

    def test_through_vhost(self) -> None:
        broker = Broker(Clock())
        vhost = broker.default_vhost
        q = vhost.declare_queue("q")
        vhost.bind("q", "amq.headers", "", {"x-match": "all", "a": "1"})
        self.assertEqual(vhost.publish(broker.new_message("amq.headers", "", {"a": "1"}, b"x")), 1)
        self.assertEqual(vhost.publish(broker.new_message("amq.headers", "", {"a": "2"}, b"y")), 0)
        self.assertEqual([m.body for m in q.messages()], [b"x"])
