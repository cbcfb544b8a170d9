"""Tests for L{qmq.core.definitions}: export a broker's definitions, import
them into a fresh one (the same topology, users and permissions), import
twice (nothing changes), conflicts (nothing changes, the item named), bad
documents, and the importer's permissions checked by the core.

Real L{Broker}s on a L{Clock}, a real L{Authenticator}; no sockets.
"""

from __future__ import annotations

import json

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.auth import Authenticator, AuthSettings, PermissionSettings, UserSettings
from qmq.auth.passwords import hash_password
from qmq.auth.permissions import Permission, User
from qmq.core.broker import Broker
from qmq.core.definitions import (
    DefinitionConflict,
    InvalidDefinitions,
    export_definitions,
    import_definitions,
    parse,
)
from qmq.core.errors import AccessRefused
from qmq.core.management import Management
from qmq.core.ownership import durable_queue_name

HASH = hash_password("s3cret", 4)


def topology(broker: Broker) -> dict:
    """What definitions carry, read from the broker itself."""
    doc = export_definitions(broker)
    doc.pop("qmq_version")
    return {k: sorted(json.dumps(i, sort_keys=True) for i in v) for k, v in doc.items()}


class DefinitionsTestCase(SynchronousTestCase):
    def broker(self, users: bool = True) -> Broker:
        clock = Clock()
        broker = Broker(clock)
        self.addCleanup(broker.stop_timers)
        broker.add_vhost("shop")
        if users:
            broker.auth = Authenticator(
                AuthSettings(), clock, users=[UserSettings("admin", HASH)],
                permissions={"/": [PermissionSettings("admin", ".*", ".*", ".*")],
                             "shop": [PermissionSettings("admin", ".*", ".*", ".*")]},
            )
        return broker

    def populate(self, broker: Broker) -> None:
        broker.auth.set_user("alice", HASH, ("alice.example.org",))
        broker.auth.set_user("carol", None, ("carol.example.org",))
        broker.auth.set_permission("shop", "alice", "^alice\\.", ".*", ".*")
        root = Management(broker.default_vhost)
        shop = Management(broker.vhosts["shop"])
        shop.declare_exchange("orders", "topic")
        shop.declare_exchange("audit", "fanout", durable=False)
        shop.declare_exchange("by-header", "headers")
        shop.declare_queue("orders.eu", arguments={"x-max-length": 10, "x-message-ttl": 60000})
        shop.declare_queue("all-audit", durable=False, auto_delete=True)
        shop.declare_queue("urgent")
        shop.bind("orders.eu", "orders", "eu.#")
        shop.vhost.bind("urgent", "by-header", "", {"x-match": "all", "priority": "high"})
        shop.vhost.bind_exchange("audit", "orders", "#")
        shop.bind("all-audit", "audit", "")
        root.declare_queue("jobs")
        # The broker's own queues are left out.
        root.vhost.declare_queue(durable_queue_name("alice", "feed"), subscription=True)
        root.vhost.declare_queue("amq.gen-1", durable=False, exclusive_owner=object())


class RoundTripTests(DefinitionsTestCase):
    def test_export(self) -> None:
        source = self.broker()
        self.populate(source)
        doc = export_definitions(source)
        self.assertEqual(json.loads(json.dumps(doc)), doc)
        self.assertEqual([u["name"] for u in doc["users"]], ["admin", "alice", "carol"])
        self.assertEqual(doc["users"][1], {"name": "alice", "password_hash": HASH,
                                           "certificate_names": ["alice.example.org"]})
        self.assertEqual(doc["users"][2]["password_hash"], None)
        self.assertIn({"vhost": "shop", "user": "alice", "configure": "^alice\\.", "write": ".*", "read": ".*"},
                      doc["permissions"])
        self.assertEqual(sorted(v["name"] for v in doc["vhosts"]), ["/", "shop"])
        self.assertEqual(sorted((e["vhost"], e["name"]) for e in doc["exchanges"]),
                         [("shop", "audit"), ("shop", "by-header"), ("shop", "orders")])
        self.assertEqual(sorted((q["vhost"], q["name"]) for q in doc["queues"]),
                         [("/", "jobs"), ("shop", "all-audit"), ("shop", "orders.eu"), ("shop", "urgent")])
        eu = next(q for q in doc["queues"] if q["name"] == "orders.eu")
        self.assertEqual(eu, {"vhost": "shop", "name": "orders.eu", "durable": True, "auto_delete": False,
                              "arguments": {"x-max-length": 10, "x-message-ttl": 60000}})
        self.assertIn({"vhost": "shop", "source": "orders", "destination": "audit", "destination_type": "exchange",
                       "routing_key": "#", "arguments": {}}, doc["bindings"])
        self.assertIn({"vhost": "shop", "source": "by-header", "destination": "urgent", "destination_type": "queue",
                       "routing_key": "", "arguments": {"x-match": "all", "priority": "high"}}, doc["bindings"])
        self.assertEqual(len(doc["bindings"]), 4)

    def test_roundTrip(self) -> None:
        """
        Exported from one broker, imported into a fresh one: the same
        definitions; importing again changes nothing.
        """
        source = self.broker()
        self.populate(source)
        doc = json.loads(json.dumps(export_definitions(source)))
        target = self.broker()
        result = import_definitions(target, parse(doc))
        self.assertEqual(result["created"], {"users": 2, "vhosts": 0, "permissions": 1, "exchanges": 3,
                                             "queues": 4, "bindings": 4})
        self.assertEqual(result["unchanged"]["users"], 1)
        self.assertEqual(topology(target), topology(source))
        again = import_definitions(target, parse(doc))
        self.assertEqual(again["created"], dict.fromkeys(again["created"], 0))
        self.assertEqual(topology(target), topology(source))
        # The imported topology routes: a message to orders eu.x reaches
        # orders.eu, and all-audit through the exchange-to-exchange binding.
        shop = target.vhosts["shop"]
        routed = shop.route("orders", "eu.paris")
        self.assertEqual(sorted(q.name for q in routed), ["all-audit", "orders.eu"])
        # The imported user logs in with the exported hash.
        self.assertEqual(target.auth.users["alice"].password, HASH)

    def test_internalAndAlternate(self) -> None:
        """
        An exchange's internal flag and arguments are exported and imported;
        one that exists with another flag or alternate is a conflict; the
        importer needs write on an alternate (the core's check).
        """
        source = self.broker()
        shop = Management(source.vhosts["shop"])
        shop.declare_exchange("unrouted", "fanout", internal=True)
        shop.declare_exchange("orders", "direct", arguments={"alternate-exchange": "unrouted"})
        doc = json.loads(json.dumps(export_definitions(source)))
        self.assertIn({"vhost": "shop", "name": "unrouted", "type": "fanout", "durable": True, "auto_delete": False,
                       "internal": True, "arguments": {}}, doc["exchanges"])
        self.assertIn({"vhost": "shop", "name": "orders", "type": "direct", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {"alternate-exchange": "unrouted"}}, doc["exchanges"])
        target = self.broker()
        import_definitions(target, parse(doc))
        self.assertEqual(topology(target), topology(source))
        self.assertTrue(target.vhosts["shop"].exchanges["unrouted"].internal)
        self.assertEqual(target.vhosts["shop"].exchanges["orders"].alternate, "unrouted")
        self.assertEqual(import_definitions(target, parse(doc))["created"]["exchanges"], 0)
        other = self.broker()
        Management(other.vhosts["shop"]).declare_exchange("unrouted", "fanout")
        e = self.assertRaises(DefinitionConflict, import_definitions, other, parse(doc))
        self.assertIn("internal False", e.message)
        bob = User("bob", permissions={"shop": Permission.of(".*", r"^bob\.", ".*")})
        e = self.assertRaises(AccessRefused, import_definitions, self.broker(), parse(
            {"exchanges": [{"vhost": "shop", "name": "bob.x", "type": "direct",
                            "arguments": {"alternate-exchange": "unrouted"}}]}), bob, "bob")
        self.assertIn("alternate-exchange would make the broker write to", e.message)

    def test_noUsersWithoutAuthentication(self) -> None:
        source = self.broker(users=False)
        Management(source.default_vhost).declare_queue("q")
        doc = export_definitions(source)
        self.assertEqual((doc["users"], doc["permissions"]), ([], []))
        target = self.broker(users=False)
        import_definitions(target, parse(doc))
        self.assertIn("q", target.default_vhost.queues)


class ConflictTests(DefinitionsTestCase):
    def assertConflict(self, target: Broker, doc: dict, item: str, text: str) -> None:
        before = topology(target)
        e = self.assertRaises(DefinitionConflict, import_definitions, target, parse(doc))
        self.assertEqual(e.item.split(" ")[0], item)
        self.assertIn(text, e.message)
        self.assertEqual(topology(target), before, "a conflict changes nothing")

    def test_conflicts(self) -> None:
        target = self.broker()
        Management(target.default_vhost).declare_queue("jobs", arguments={"x-max-length": 5})
        Management(target.default_vhost).declare_exchange("events", "fanout")
        new_queue = {"vhost": "/", "name": "fresh"}
        # The core's rule for a queue declared again (check_equivalent):
        # arguments left out agree, others must match.
        self.assertConflict(target, {"queues": [new_queue, {"vhost": "/", "name": "jobs",
                                                            "arguments": {"x-max-length": 7}}]},
                            "queues[1]", "other arguments")
        self.assertConflict(target, {"queues": [new_queue, {"vhost": "/", "name": "jobs", "durable": False,
                                                            "arguments": {"x-max-length": 5}}]},
                            "queues[1]", "durable True")
        self.assertConflict(target, {"queues": [new_queue], "exchanges": [{"vhost": "/", "name": "events",
                                                                          "type": "topic"}]},
                            "exchanges[0]", "type 'fanout'")
        self.assertConflict(target, {"queues": [new_queue], "vhosts": [{"name": "nowhere"}]},
                            "vhosts[0]", "no virtual host 'nowhere'")
        self.assertConflict(target, {"queues": [{"vhost": "nowhere", "name": "q"}]},
                            "queues[0]", "no virtual host")
        self.assertConflict(target, {"permissions": [{"vhost": "/", "user": "admin", "read": ".*"}]},
                            "permissions[0]", "other permissions")
        self.assertConflict(target, {"permissions": [{"vhost": "/", "user": "zed"}]},
                            "permissions[0]", "no user 'zed'")
        self.assertConflict(target, {"bindings": [{"vhost": "/", "source": "events", "destination": "nope"}]},
                            "bindings[0]", "no queue 'nope'")
        self.assertNotIn("fresh", target.default_vhost.queues)

    def test_existingUserKept(self) -> None:
        """
        An import never changes a user the broker has (its own admin above
        all): it counts as unchanged.
        """
        target = self.broker()
        other = hash_password("other", 4)
        result = import_definitions(target, parse({"users": [{"name": "admin", "password_hash": other},
                                                             {"name": "eve", "password_hash": other}]}))
        self.assertEqual((result["created"]["users"], result["unchanged"]["users"]), (1, 1))
        self.assertEqual(target.auth.users["admin"].password, HASH)
        self.assertEqual(target.auth.users["eve"].password, other)

    def test_usersWithoutAuthentication(self) -> None:
        target = self.broker(users=False)
        e = self.assertRaises(DefinitionConflict, import_definitions, target,
                              parse({"users": [{"name": "alice", "password_hash": HASH}]}))
        self.assertIn("authentication is off", e.message)

    def test_permissionsChecked(self) -> None:
        """
        The importer's permissions are the core's to check: bob may not
        configure queues outside bob.*; the refusal names the item.
        """
        target = self.broker()
        bob = User("bob", permissions={"/": Permission.of(r"^bob\.", ".*", ".*")})
        doc = parse({"queues": [{"vhost": "/", "name": "bob.q"}, {"vhost": "/", "name": "other"}]})
        e = self.assertRaises(AccessRefused, import_definitions, target, doc, bob, "bob")
        self.assertTrue(e.message.startswith("queues[1] ('/', 'other'): "), e.message)
        self.assertIn("bob.q", target.default_vhost.queues)
        self.assertNotIn("other", target.default_vhost.queues)


class ParseTests(SynchronousTestCase):
    def assertInvalid(self, doc: object, item: str, text: str) -> None:
        e = self.assertRaises(InvalidDefinitions, parse, doc)
        self.assertEqual(e.item, item)
        self.assertIn(text, e.message)

    def test_invalid(self) -> None:
        self.assertInvalid([], "", "expected an object")
        self.assertInvalid({"queue": []}, "queue", "unknown key")
        # As the OpenAPI document says: a string (schemathesis found {} accepted).
        self.assertInvalid({"qmq_version": {}}, "qmq_version", "expected a string")
        self.assertInvalid({"queues": {}}, "queues", "expected an array")
        self.assertInvalid({"queues": [{"vhost": "/"}]}, "queues[0].name", "missing")
        self.assertInvalid({"queues": [{"vhost": "/", "name": "q", "durabel": True}]}, "queues[0].durabel",
                           "unknown key")
        self.assertInvalid({"queues": [{"vhost": "/", "name": "q", "durable": "yes"}]}, "queues[0].durable",
                           'expected true or false, got "yes"')
        self.assertInvalid({"exchanges": [{"vhost": "/", "name": "e", "type": "x"}]}, "exchanges[0].type",
                           "expected one of direct, fanout, topic, headers")
        self.assertInvalid({"users": [{"name": "u", "password_hash": "plain"}]}, "users[0].password_hash", "")
        self.assertInvalid({"permissions": [{"vhost": "/", "user": "u", "read": "("}]}, "permissions[0].read",
                           "not a regular expression")
        self.assertInvalid({"users": [{"name": "a\x01"}]}, "users[0].name", "no control character")
        self.assertInvalid({"permissions": [{"vhost": "/", "user": "u" * 129}]}, "permissions[0].user",
                           "1 to 128 characters")
        self.assertInvalid({"bindings": [{"vhost": "/", "source": "e", "destination": "q",
                                          "destination_type": "topic"}]},
                           "bindings[0].destination_type", "expected one of queue, exchange")

    def test_version(self) -> None:
        self.assertInvalid({"qmq_version": {}}, "qmq_version", "expected a string")

    def test_whole_broker_informational(self) -> None:
        """What an export from workers or a mesh lacked (C{missing},
        C{truncated}) is informational: such a document parses."""
        defs = parse({"missing": {"w1": "node 'w1' did not answer within 5 s"}, "truncated": ["w2"],
                      "queues": [{"vhost": "/", "name": "q"}]})
        self.assertEqual([q.name for q in defs.queues], ["q"])
        self.assertInvalid({"missing": []}, "missing", "expected an object")
        self.assertInvalid({"truncated": {}}, "truncated", "expected an array")
        self.assertInvalid({"truncated": [{}]}, "truncated", "array of node ids")
        self.assertInvalid({"missing": {"w1": 5}}, "missing", "expected an object")

    def test_defaults(self) -> None:
        defs = parse({"qmq_version": "0.1", "queues": [{"vhost": "/", "name": "q"}]})
        self.assertEqual(defs.queues[0].durable, True)
        self.assertEqual(defs.users, ())
