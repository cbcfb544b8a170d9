"""Tests for L{qmq.core.ownership}: durable subscription queue names and the
one access check."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.core.errors import AccessRefused
from qmq.core.ownership import (
    check_queue_access,
    durable_queue_name,
    durable_queue_owner,
    escape_name,
)


class OwnershipTests(SynchronousTestCase):
    def test_name_and_owner_round_trip(self) -> None:
        """The owner is the text between the first two dots, whatever the
        owner's name holds."""
        for owner in ("alice", "", "a.b", "a%2Eb", "x:y", "%"):
            name = durable_queue_name(owner, "sub.with.dots")
            self.assertEqual(durable_queue_owner(name), escape_name(owner))
        self.assertNotEqual(durable_queue_name("a.b", "c"), durable_queue_name("a", "b.c"))
        self.assertNotEqual(escape_name("a%2Eb"), escape_name("a.b"))

    def test_not_a_durable_queue(self) -> None:
        self.assertIsNone(durable_queue_owner("orders"))
        self.assertIsNone(durable_queue_owner("durable.nodot"))

    def test_check(self) -> None:
        """Only the owner reads, writes or deletes; other queues are open."""
        name = durable_queue_name("alice", "feed")
        for operation in ("read", "write", "delete"):
            check_queue_access("alice", name, operation)
            with self.assertRaises(AccessRefused) as e:
                check_queue_access("bob", name, operation)
            self.assertIn(operation, e.exception.short)
            check_queue_access("bob", "orders", operation)
        with self.assertRaises(AccessRefused):
            check_queue_access("", name, "read")
        with self.assertRaises(AccessRefused):
            check_queue_access("alice", durable_queue_name("", "feed"), "read")
