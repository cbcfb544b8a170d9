# -*- test-case-name: tests.test_core_definitions -*-
"""Definitions: a broker's users, virtual hosts, permissions, exchanges,
queues and bindings as one JSON document, exported from one broker and
imported into another, as RabbitMQ's definitions are.

The flow:

    export_definitions(broker, user)  ->  document (a dict, JSON-ready)
    parse(document)                   ->  Definitions (checked; else
                                          InvalidDefinitions naming the item)
    import_definitions(broker, definitions, user)
        1. plan: every item is compared with what the broker has: new,
           the same (nothing to do), or a conflict (DefinitionConflict,
           naming the item): a conflict changes nothing;
        2. apply, in order: users, permissions, exchanges, queues,
           bindings.  Topology goes through L{Management}, so the
           importer's permissions are checked where every frontend's are.

Importing the same document twice changes nothing the second time.

What a document leaves out: the broker's own exchanges (C{amq.*}) and
queues (C{amq.*} temporary queues, exclusive queues, durable
subscriptions' C{durable.*} queues, made by subscribing), and bindings to
those.  Virtual hosts come from the configuration: an import names them
and they must exist.  Users carry their password hash (the scrypt hash
the configuration or C{PUT /api/v1/users} gave), never a password; an
import adds the users the broker has not and leaves those it has as they
are (it never changes a password).

Who may export and import (an administrator, C{http_api.admins}) is the
frontend's rule; the permissions on each exchange and queue are the
core's (L{Management}).

Across nodes (workers, a mesh): a queue and its bindings live on its home
node. Each node tells what it holds as a home (L{home_definitions}); the
node that exports adds the others' (C{others}: node -> their answer) to
its own, each queue once, filtered by the exporter's permissions there;
exchanges are every node's alike (declared on all), exported from the node
asked. An import plans with the same answers (a queue that exists on its
home, with other arguments, is a conflict), declares each queue through
L{Management} (a queue homed elsewhere is declared on its home too) and
binds a queue homed elsewhere on its home: those answers come later, as
Deferreds the frontend waits for (C{pending}).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

import qmq
from qmq.core.access import Resource
from qmq.core.errors import BrokerError, PreconditionFailed
from qmq.core.exchange import EXCHANGE_TYPES
from qmq.core.management import Management, check_equivalent
from qmq.core.ownership import DURABLE_SUBSCRIPTION_PREFIX
from qmq.core.policy import QueuePolicy

__all__ = [
    "DefinitionConflict",
    "Definitions",
    "InvalidDefinitions",
    "export_definitions",
    "home_definitions",
    "import_definitions",
    "parse",
]

log = Logger()

#: The sections of a document, in the order an import applies them.
SECTIONS = ("users", "vhosts", "permissions", "exchanges", "queues", "bindings")


class InvalidDefinitions(BrokerError):
    """The document is not definitions: C{item} names where
    (C{queues[2].durable}), the message says what was expected."""

    code = 406

    def __init__(self, item: str, problem: str) -> None:
        super().__init__(f"{item}: {problem}" if item else problem, "bad definitions")
        self.item = item


class DefinitionConflict(PreconditionFailed):
    """An item of the document disagrees with the broker (a queue with
    other arguments, an exchange of another type, other permissions, a
    virtual host the broker does not have).  Nothing was
    changed.

    @ivar item: the item, as C{queues[0]} (its vhost and name follow in
        the message).
    """

    def __init__(self, item: str, problem: str) -> None:
        super().__init__(f"{item}: {problem}", "definitions conflict")
        self.item = item


# -- the document ------------------------------------------------------------------


@dataclass(frozen=True)
class UserDefinition:
    name: str
    password_hash: str | None = None
    certificate_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PermissionDefinition:
    vhost: str
    user: str
    configure: str = ""
    write: str = ""
    read: str = ""


@dataclass(frozen=True)
class ExchangeDefinition:
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueDefinition:
    vhost: str
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BindingDefinition:
    vhost: str
    source: str
    destination: str
    destination_type: str = "queue"
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Definitions:
    """A checked document (L{parse})."""

    users: tuple[UserDefinition, ...] = ()
    vhosts: tuple[str, ...] = ()
    permissions: tuple[PermissionDefinition, ...] = ()
    exchanges: tuple[ExchangeDefinition, ...] = ()
    queues: tuple[QueueDefinition, ...] = ()
    bindings: tuple[BindingDefinition, ...] = ()


def _is_own_queue(queue: Any) -> bool:
    """A queue the broker makes itself, left out of definitions (a
    stand-in of a queue homed on another node too: its home exports it)."""
    return (
        queue.exclusive_owner is not None
        or queue.remote is not None
        or queue.name.startswith("amq.")
        or queue.name.startswith(DURABLE_SUBSCRIPTION_PREFIX)
    )


def _queue_doc(vhost: str, q: Any) -> dict[str, Any]:
    return {
        "vhost": vhost,
        "name": q.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "arguments": dict(q.arguments or {}),
    }


def home_definitions(broker: Any, limit: int | None = None) -> dict[str, Any]:
    """What this node holds as the home of its queues, for another node's
    export or import (see the module docstring): C{queues} (as a document
    has them, every one: the node that asks filters by its caller's
    permissions), C{bindings} (theirs), C{exclusive} (C{[vhost, name]} of
    the sessions' exclusive queues here, which an import may not declare)
    and C{truncated} (a list was cut at C{limit} items).
    """
    if limit is None:
        limit = MAX_ITEMS
    queues: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    exclusive: list[list[str]] = []
    truncated = False
    for vhost in broker.vhosts.values():
        for q in vhost.queues.values():
            if q.remote is not None:
                continue
            if q.exclusive_owner is not None:
                if len(exclusive) < limit:
                    exclusive.append([vhost.name, q.name])
                continue
            if _is_own_queue(q):
                continue
            if len(queues) >= limit or len(bindings) + len(q.bindings or ()) > limit:
                truncated = True
                continue
            queues.append(_queue_doc(vhost.name, q))
            for ex, key, arguments in q.bindings or ():
                bindings.append(_binding_doc(vhost.name, ex.name, q.name, "queue", key, arguments))
    return {"queues": queues, "bindings": bindings, "exclusive": exclusive, "truncated": truncated}


def export_definitions(
    broker: Any, user: Any = None, owner: Any = "", others: Mapping[str, Mapping[str, Any]] | None = None,
    node: str = "",
) -> dict[str, Any]:
    """
    The broker's definitions as a JSON-ready document.

    @param user: the exporting identity (a L{qmq.auth.User}, or None with
        authentication off): exchanges and queues it may not read are
        left out (L{Management}).
    @param owner: its owner name, for durable subscriptions.
    @param others: the other nodes' L{home_definitions} (node -> its
        answer), added to this node's, in node order (this node is
        C{node}): each queue once, from its home, with its bindings.
    """
    auth = getattr(broker, "auth", None)
    users = []
    permissions = []
    if auth is not None:
        for name in sorted(auth.users):
            u = auth.users[name]
            users.append(
                {
                    "name": name,
                    "password_hash": u.password,
                    "certificate_names": list(u.certificate_names),
                }
            )
        for vhost, p in auth.permissions():
            permissions.append(
                {"vhost": vhost, "user": p.user, "configure": p.configure, "write": p.write, "read": p.read}
            )
    exchanges = []
    queues = []
    bindings = []
    queue_bindings: list[dict[str, Any]] = []
    exchange_bindings: list[dict[str, Any]] = []
    vhosts = []
    for vhost in broker.vhosts.values():
        vhosts.append({"name": vhost.name})
        mgmt = Management(vhost, user, owner)
        for ex in vhost.exchanges.values():
            if ex.name.startswith("amq.") or not mgmt.may_read_exchange(ex.name):
                continue
            exchanges.append(
                {
                    "vhost": vhost.name,
                    "name": ex.name,
                    "type": ex.type,
                    "durable": ex.durable,
                    "auto_delete": ex.auto_delete,
                    "internal": ex.internal,
                    "arguments": dict(ex.arguments or {}),
                }
            )
        for q in vhost.queues.values():
            if _is_own_queue(q) or not mgmt.may_read_queue(q.name, see_all=True):
                continue
            queues.append(_queue_doc(vhost.name, q))
            for ex, key, arguments in q.bindings or ():
                bindings.append(_binding_doc(vhost.name, ex.name, q.name, "queue", key, arguments))
                queue_bindings.append(bindings[-1])
        for dest in vhost.exchanges.values():
            if not mgmt.may_read_exchange(dest.name):
                continue
            for src, key, arguments in dest.sources or ():
                bindings.append(_binding_doc(vhost.name, src.name, dest.name, "exchange", key, arguments))
                exchange_bindings.append(bindings[-1])
    if others:
        # Every node's queues and their bindings in node order, then the
        # exchanges' bindings (every node's alike): the same document
        # whichever node is asked.
        queues, queue_bindings = _whole(broker, user, owner, queues, queue_bindings, others, node)
        bindings = queue_bindings + exchange_bindings
    return {
        "qmq_version": qmq.__version__,
        "users": users,
        "vhosts": vhosts,
        "permissions": permissions,
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    }


def _whole(
    broker: Any, user: Any, owner: Any, mine: list[dict[str, Any]], my_bindings: list[dict[str, Any]],
    others: Mapping[str, Mapping[str, Any]], node: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every node's queues and their bindings, in node order (this node's
    are C{mine} and C{my_bindings}; the others' those this identity may
    read)."""
    managers: dict[str, Management] = {}
    by_node: dict[str, list[dict[str, Any]]] = {node: mine}
    bindings_by_node: dict[str, list[dict[str, Any]]] = {node: my_bindings}
    for other, answer in others.items():
        if other == node:
            continue
        shown = by_node[other] = []
        seen = set()
        for q in _items(answer, "queues", ("vhost", "name")):
            vhost = broker.vhosts.get(q["vhost"])
            if vhost is None:
                continue
            mgmt = managers.get(vhost.name)
            if mgmt is None:
                mgmt = managers[vhost.name] = Management(vhost, user, owner)
            if mgmt.may_read_queue(q["name"], see_all=True):
                shown.append(q)
                seen.add((vhost.name, q["name"]))
        bindings_by_node[other] = [b for b in _items(answer, "bindings", ("vhost", "source", "destination"))
                                   if (b["vhost"], b["destination"]) in seen]
    order = sorted(by_node)
    return [q for n in order for q in by_node[n]], [b for n in order for b in bindings_by_node[n]]


def _binding_doc(
    vhost: str, source: str, destination: str, kind: str, key: str, arguments: Mapping[str, Any] | None
) -> dict[str, Any]:
    return {
        "vhost": vhost,
        "source": source,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": dict(arguments or {}),
    }


# -- parsing -----------------------------------------------------------------------------

_Check = Callable[[object, str], Any]


def _string(value: object, item: str) -> str:
    if not isinstance(value, str):
        raise InvalidDefinitions(item, f"expected a string, got {_shown(value)}")
    return value


def _name(value: object, item: str) -> str:
    value = _string(value, item)
    if not value:
        raise InvalidDefinitions(item, "expected a non-empty string")
    return value


#: Most characters of a user name (the HTTP API's users endpoints say the same).
MAX_USER_NAME = 128

_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _user(value: object, item: str) -> str:
    # What the OpenAPI document says (a user exported came from the
    # configuration or PUT /api/v1/users, which ask for more).
    value = _name(value, item)
    if len(value) > MAX_USER_NAME or _CONTROL.search(value):
        raise InvalidDefinitions(item, f"a user name is 1 to {MAX_USER_NAME} characters, no control character")
    return value


def _boolean(value: object, item: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidDefinitions(item, f"expected true or false, got {_shown(value)}")
    return value


def _object(value: object, item: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidDefinitions(item, f"expected an object, got {_shown(value)}")
    return value


def _hash(value: object, item: str) -> str | None:
    if value is None:
        return None
    from qmq.auth.passwords import HashError, parse_hash  # noqa: PLC0415

    value = _string(value, item)
    try:
        parse_hash(value)
    except HashError as e:
        raise InvalidDefinitions(item, str(e)) from None
    return value


def _names(value: object, item: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidDefinitions(item, f"expected an array of strings, got {_shown(value)}")
    return tuple(_name(v, f"{item}[{i}]") for i, v in enumerate(value))


def _one_of(choices: tuple[str, ...]) -> _Check:
    def check(value: object, item: str) -> str:
        if value not in choices:
            raise InvalidDefinitions(item, f"expected one of {', '.join(choices)}, got {_shown(value)}")
        return str(value)

    return check


def _shown(value: object) -> str:
    import json  # noqa: PLC0415

    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Each section's item: key -> (checker, required).
_ITEMS: dict[str, tuple[type, dict[str, tuple[_Check, bool]]]] = {
    "users": (UserDefinition, {
        "name": (_user, True), "password_hash": (_hash, False), "certificate_names": (_names, False),
    }),
    "permissions": (PermissionDefinition, {
        "vhost": (_name, True), "user": (_user, True), "configure": (_string, False),
        "write": (_string, False), "read": (_string, False),
    }),
    "exchanges": (ExchangeDefinition, {
        "vhost": (_name, True), "name": (_name, True), "type": (_one_of(EXCHANGE_TYPES), True),
        "durable": (_boolean, False), "auto_delete": (_boolean, False), "internal": (_boolean, False),
        "arguments": (_object, False),
    }),
    "queues": (QueueDefinition, {
        "vhost": (_name, True), "name": (_name, True), "durable": (_boolean, False),
        "auto_delete": (_boolean, False), "arguments": (_object, False),
    }),
    "bindings": (BindingDefinition, {
        "vhost": (_name, True), "source": (_name, True), "destination": (_name, True),
        "destination_type": (_one_of(("queue", "exchange")), False), "routing_key": (_string, False),
        "arguments": (_object, False),
    }),
}

#: Most items in one document, over every section: an import's work is bounded.
MAX_ITEMS = 100_000

#: Keys of a document that say something of it and import nothing.
INFORMATIONAL = ("qmq_version", "missing", "truncated")


def parse(document: object) -> Definitions:
    """
    Check a document (as L{export_definitions} writes it) and read it.

    Unknown keys are errors, at every level: a misspelt key must not be
    ignored.  C{qmq_version} is informational, and so are C{missing} and
    C{truncated} (what an export from workers or a mesh lacked).

    @raise InvalidDefinitions: naming the item and what was expected.
    """
    doc = _object(document, "")
    unknown = sorted(set(doc) - {*SECTIONS, *INFORMATIONAL})
    if unknown:
        raise InvalidDefinitions(
            unknown[0], f"unknown key (expected one of: {', '.join(SECTIONS)}, {', '.join(INFORMATIONAL)})"
        )
    if not isinstance(doc.get("qmq_version", ""), str):
        raise InvalidDefinitions("qmq_version", "expected a string (the exporting broker's version)")
    missing = doc.get("missing", {})
    if not isinstance(missing, dict) or not all(isinstance(v, str) for v in missing.values()):
        raise InvalidDefinitions("missing", "expected an object (node -> why it did not answer)")
    truncated = doc.get("truncated", [])
    if not isinstance(truncated, list) or not all(isinstance(v, str) for v in truncated):
        raise InvalidDefinitions("truncated", "expected an array of node ids (the nodes whose answer was cut)")
    count = 0
    parsed: dict[str, Any] = {}
    for section in SECTIONS:
        items = doc.get(section, [])
        if not isinstance(items, list):
            raise InvalidDefinitions(section, f"expected an array, got {_shown(items)}")
        count += len(items)
        if count > MAX_ITEMS:
            raise InvalidDefinitions(section, f"more than {MAX_ITEMS} items in one document")
        if section == "vhosts":
            names = []
            for i, v in enumerate(items):
                where = f"vhosts[{i}]"
                v = _object(v, where)
                extra = sorted(set(v) - {"name"})
                if extra:
                    raise InvalidDefinitions(f"{where}.{extra[0]}", "unknown key (expected: name)")
                if "name" not in v:
                    raise InvalidDefinitions(f"{where}.name", "missing")
                names.append(_name(v["name"], f"{where}.name"))
            parsed["vhosts"] = tuple(names)
            continue
        cls, keys = _ITEMS[section]
        out = []
        for i, raw in enumerate(items):
            where = f"{section}[{i}]"
            raw = _object(raw, where)
            extra = sorted(set(raw) - set(keys))
            if extra:
                raise InvalidDefinitions(f"{where}.{extra[0]}", f"unknown key (expected one of: {', '.join(keys)})")
            values = {}
            for key, (check, required) in keys.items():
                if key not in raw:
                    if required:
                        raise InvalidDefinitions(f"{where}.{key}", "missing")
                    continue
                values[key] = check(raw[key], f"{where}.{key}")
            item = cls(**values)
            if section == "permissions":
                _check_patterns(item, where)
            out.append(item)
        parsed[section] = tuple(out)
    return Definitions(**parsed)


def _check_patterns(p: PermissionDefinition, where: str) -> None:
    import re  # noqa: PLC0415

    from qmq.auth.permissions import compile_pattern  # noqa: PLC0415

    for key in ("configure", "write", "read"):
        try:
            compile_pattern(getattr(p, key), p.user)
        except re.error as e:
            raise InvalidDefinitions(f"{where}.{key}", f"not a regular expression: {e}") from None


# -- importing ---------------------------------------------------------------------------


@dataclass
class _Plan:
    """What an import will do: the items to make, by section, and how many
    are there already."""

    todo: dict[str, list[tuple[str, Any]]] = field(default_factory=lambda: {s: [] for s in SECTIONS})
    unchanged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))


class _HomeQueue:
    """A queue as its home told it (L{home_definitions}): what
    L{check_equivalent} compares."""

    def __init__(self, vhost: Any, doc: Mapping[str, Any]) -> None:
        self.name = doc["name"]
        self.durable = bool(doc.get("durable"))
        self.auto_delete = bool(doc.get("auto_delete"))
        self.exclusive_owner = None
        arguments = doc.get("arguments") if isinstance(doc.get("arguments"), dict) else None
        defaults = vhost.queue_defaults
        self.policy = QueuePolicy.from_arguments(arguments, defaults) if arguments else defaults
        self.bindings = ()


def _homes(broker: Any, others: Mapping[str, Mapping[str, Any]]) -> tuple[dict, set, set]:
    """The other nodes' queues ((vhost, name) -> L{_HomeQueue}), their
    queues' bindings ((vhost, source, queue, key, arguments as a sorted
    tuple)) and their exclusive queues ((vhost, name))."""
    queues: dict[tuple[str, str], _HomeQueue] = {}
    bindings: set[tuple[Any, ...]] = set()
    exclusive: set[tuple[str, str]] = set()
    for answer in others.values():
        for q in _items(answer, "queues", ("vhost", "name")):
            vhost = broker.vhosts.get(q["vhost"])
            if vhost is not None:
                queues[(vhost.name, q["name"])] = _HomeQueue(vhost, q)
        for b in _items(answer, "bindings", ("vhost", "source", "destination")):
            arguments = b.get("arguments")
            bindings.add(_binding_key(b["vhost"], b["source"], b["destination"], str(b.get("routing_key", "")),
                                      arguments if isinstance(arguments, dict) else None))
        for pair in answer.get("exclusive") or ():
            if isinstance(pair, list) and len(pair) == 2:
                exclusive.add((str(pair[0]), str(pair[1])))
    return queues, bindings, exclusive


def _items(answer: Any, key: str, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The items of another node's answer that have C{names} as strings
    (what a node of another version sends in other shapes is skipped)."""
    items = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(items, list):
        return []
    return [i for i in items if isinstance(i, dict) and all(isinstance(i.get(n), str) for n in names)]


def _binding_key(vhost: str, source: str, queue: str, key: str, arguments: Mapping[str, Any] | None) -> tuple:
    return (vhost, source, queue, key, repr(sorted((arguments or {}).items())))


def _plan(broker: Any, defs: Definitions, others: Mapping[str, Mapping[str, Any]] | None = None) -> _Plan:
    plan = _Plan()
    auth = getattr(broker, "auth", None)
    home_queues, home_bindings, home_exclusive = _homes(broker, others or {})

    def vhost_of(item: str, name: str) -> Any:
        vhost = broker.vhosts.get(name)
        if vhost is None:
            raise DefinitionConflict(
                item, f"no virtual host {name!r} on this broker (virtual hosts come from its configuration)"
            )
        return vhost

    for i, name in enumerate(defs.vhosts):
        vhost_of(f"vhosts[{i}] {name!r}", name)
        plan.unchanged["vhosts"] += 1
    imported_users = set()
    for i, u in enumerate(defs.users):
        item = f"users[{i}] {u.name!r}"
        if auth is None:
            raise DefinitionConflict(
                item, "authentication is off on this broker (no [users] configured), so it has no users to add"
            )
        imported_users.add(u.name)
        # An import adds users and never changes one: a user the broker
        # has keeps its password and certificate names (each broker's own
        # configured users, an admin above all, stay as configured).
        if u.name in auth.users:
            plan.unchanged["users"] += 1
        else:
            plan.todo["users"].append((item, u))
    for i, p in enumerate(defs.permissions):
        item = f"permissions[{i}] ({p.vhost!r}, {p.user!r})"
        vhost_of(item, p.vhost)
        if auth is None:
            raise DefinitionConflict(item, "authentication is off on this broker, so it keeps no permissions")
        if p.user not in auth.users and p.user not in imported_users:
            raise DefinitionConflict(item, f"no user {p.user!r} on this broker or in the document")
        have = auth.permission(p.vhost, p.user)
        if have is None:
            plan.todo["permissions"].append((item, p))
        elif have == (p.configure, p.write, p.read):
            plan.unchanged["permissions"] += 1
        else:
            raise DefinitionConflict(item, f"the user has other permissions there ({', '.join(have)})")
    new_exchanges = set()
    for i, e in enumerate(defs.exchanges):
        item = f"exchanges[{i}] ({e.vhost!r}, {e.name!r})"
        have = vhost_of(item, e.vhost).exchanges.get(e.name)
        if have is None:
            plan.todo["exchanges"].append((item, e))
            new_exchanges.add((e.vhost, e.name))
        elif (have.type, have.durable, have.auto_delete, have.internal, dict(have.arguments or {})) == (
            e.type, e.durable, e.auto_delete, e.internal, dict(e.arguments)
        ):
            plan.unchanged["exchanges"] += 1
        else:
            raise DefinitionConflict(
                item, f"the exchange exists as type {have.type!r}, durable {have.durable}, "
                f"auto_delete {have.auto_delete}, internal {have.internal}, arguments {dict(have.arguments or {})}"
            )
    new_queues = set()
    for i, q in enumerate(defs.queues):
        item = f"queues[{i}] ({q.vhost!r}, {q.name!r})"
        have = vhost_of(item, q.vhost).queues.get(q.name)
        if have is None or have.remote is not None:
            # Not here, or a stand-in: as its home has it, if it does.
            if (q.vhost, q.name) in home_exclusive:
                raise DefinitionConflict(item, "an exclusive queue of a session has that name")
            have = home_queues.get((q.vhost, q.name))
        if have is None:
            plan.todo["queues"].append((item, q))
            new_queues.add((q.vhost, q.name))
            continue
        if have.exclusive_owner is not None:
            raise DefinitionConflict(item, "an exclusive queue of a session has that name")
        if (have.durable, have.auto_delete) != (q.durable, q.auto_delete):
            raise DefinitionConflict(
                item, f"the queue exists with durable {have.durable}, auto_delete {have.auto_delete}"
            )
        try:
            check_equivalent(have, dict(q.arguments))
        except PreconditionFailed as e:
            raise DefinitionConflict(item, e.message) from None
        plan.unchanged["queues"] += 1
    for i, b in enumerate(defs.bindings):
        item = (
            f"bindings[{i}] ({b.vhost!r}, {b.source!r} -> {b.destination_type} {b.destination!r}, "
            f"key {b.routing_key!r})"
        )
        vhost = vhost_of(item, b.vhost)
        source = vhost.exchanges.get(b.source)
        if source is None and (b.vhost, b.source) not in new_exchanges:
            raise DefinitionConflict(item, f"no exchange {b.source!r} on this broker or in the document")
        if b.destination_type == "queue":
            dest = vhost.queues.get(b.destination)
            if dest is not None and dest.remote is not None:
                dest = None  # a stand-in: the queue and its bindings are its home's
            if dest is None:
                if (b.vhost, b.destination) not in new_queues and (b.vhost, b.destination) not in home_queues:
                    raise DefinitionConflict(item, f"no queue {b.destination!r} on this broker or in the document")
                bound = _binding_key(b.vhost, b.source, b.destination, b.routing_key, b.arguments) in home_bindings
            else:
                bound = source is not None and any(
                    ex is source and key == b.routing_key and (args or {}) == dict(b.arguments)
                    for ex, key, args in dest.bindings or ()
                )
        else:
            dest = vhost.exchanges.get(b.destination)
            if dest is None and (b.vhost, b.destination) not in new_exchanges:
                raise DefinitionConflict(item, f"no exchange {b.destination!r} on this broker or in the document")
            bound = dest is not None and source is not None and any(
                ex is source and key == b.routing_key and (args or {}) == dict(b.arguments)
                for ex, key, args in dest.sources or ()
            )
        if bound:
            plan.unchanged["bindings"] += 1
        else:
            plan.todo["bindings"].append((item, b))
    return plan


def import_definitions(
    broker: Any,
    defs: Definitions,
    user: Any = None,
    owner: Any = "",
    others: Mapping[str, Mapping[str, Any]] | None = None,
    pending: list[Deferred] | None = None,
) -> dict[str, dict[str, int]]:
    """
    Make what C{defs} has and the broker has not.

    @param user: the importing identity (its permissions are checked on
        each exchange, queue and binding by L{Management}).
    @param owner: its owner name.
    @param others: the other nodes' L{home_definitions} (node -> its
        answer): the queues and bindings they hold as homes, planned with.
    @param pending: where the answers of the homes of queues homed on
        other nodes go (their declarations and bindings, done there): each
        a Deferred that fails with the home's refusal, naming the item.
        None: such refusals are logged.
    @return: C{{"created": {section: count}, "unchanged": {section: count}}}.
    @raise DefinitionConflict: an item disagrees with the broker; nothing
        was changed.
    @raise BrokerError: an item was refused while applying (no permission,
        a bad name or argument), its message naming the item; what came
        before it stays (importing again after fixing it is safe).
    """
    plan = _plan(broker, defs, others)
    created = dict.fromkeys(SECTIONS, 0)
    auth = getattr(broker, "auth", None)
    managers: dict[str, Management] = {}

    def management(vhost: str) -> Management:
        mgmt = managers.get(vhost)
        if mgmt is None:
            mgmt = managers[vhost] = Management(broker.vhosts[vhost], user, owner)
        return mgmt

    for section in SECTIONS:
        for item, d in plan.todo[section]:
            try:
                later = _apply(section, d, auth, management)
            except BrokerError as e:
                # The core's own error (its status for the frontend),
                # naming the item.
                e.message = f"{item}: {e.message}"
                e.args = (e.message,)
                raise
            except ValueError as e:  # a certificate name of another user
                raise DefinitionConflict(item, str(e)) from None
            if later is not None:
                later.addErrback(_named, item)
                if pending is not None:
                    pending.append(later)
                else:
                    later.addErrback(_log_refused)
            created[section] += 1
    return {"created": created, "unchanged": plan.unchanged}


def _named(failure: Any, item: str) -> Any:
    """The home's refusal, naming the item (a Deferred's errback)."""
    error = failure.value
    if isinstance(error, BrokerError) and not error.message.startswith(item):
        error.message = f"{item}: {error.message}"
        error.args = (error.message,)
    return failure


def _log_refused(failure: Any) -> None:
    log.warn("definitions: refused on the home node: {error}", error=failure.getErrorMessage())


def _apply(section: str, d: Any, auth: Any, management: Callable[[str], Management]) -> Deferred | None:
    """Make one item; a Deferred when its queue's home is another node (the
    home's answer)."""
    if section == "users":
        auth.set_user(d.name, d.password_hash, d.certificate_names)
    elif section == "permissions":
        auth.set_permission(d.vhost, d.user, d.configure, d.write, d.read)
    elif section == "exchanges":
        management(d.vhost).declare_exchange(
            d.name, d.type, d.durable, d.auto_delete, d.internal, dict(d.arguments) or None
        )
    elif section == "queues":
        waiting: list[Deferred] = []
        management(d.vhost).declare_queue(d.name, d.durable, d.auto_delete, dict(d.arguments) or None,
                                          wait=waiting)
        return waiting[0] if waiting else None
    elif section == "bindings":
        mgmt = management(d.vhost)
        vhost = mgmt.vhost
        arguments = dict(d.arguments) or None
        # The permissions of a binding (Management.bind's): write on the
        # destination, read on the source with the key.
        source = vhost.exchange(d.source)
        if d.destination_type == "queue":
            if vhost.queue_or_stand_in(d.destination).remote is not None:
                # Bound on its home (Management's checks, then carried there).
                return mgmt.bind(d.destination, d.source, d.routing_key, arguments)
            mgmt.authorize("write", Resource.queue(vhost.name, d.destination))
            mgmt.authorize("read", Resource.exchange(vhost.name, source.name, d.routing_key))
            vhost.bind(d.destination, d.source, d.routing_key, arguments)
        else:
            vhost.exchange(d.destination)
            mgmt.authorize("write", Resource.exchange(vhost.name, d.destination))
            mgmt.authorize("read", Resource.exchange(vhost.name, source.name, d.routing_key))
            vhost.bind_exchange(d.destination, d.source, d.routing_key, arguments)
    return None
