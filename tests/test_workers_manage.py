"""Tests for management across nodes (L{qmq.cluster.manage}): the whole
broker answered by any node (queues, bindings, connections listed from
every node, the nodes that did not answer named), operations carried to the
node that owns the thing, exchanges declared on one node made on all.
Nodes (each a real core) linked over fake transports, as workers are
(docs/workers.rst), driven by one L{twisted.internet.task.Clock}."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from qmq.auth.permissions import Permission, User
from qmq.cluster import manage
from qmq.connections import ConnectionRegistry
from qmq.core.errors import AccessRefused, BrokerError, NotFound, PreconditionFailed
from qmq.core.management import Management
from qmq.core.message import Message
from qmq.core.remote import RemoteQueue, Unavailable
from qmq.core.store import ScanPage
from qmq.core.vhost import make_cursor
from qmq.web.api import ApiResource
from tests.test_cluster_mesh import Net
from tests.test_cluster_queues import homed, send
from tests.web_api_helpers import Ctx, validate


def management(net: Net, node: str, user: Any = None) -> Management:
    return Management(net[node].broker.default_vhost, user, "app")


def settled(net: Net, result: Any) -> Any:
    """The result of an operation, once the network moved."""
    net.settle()
    if isinstance(result, Deferred):
        return result
    raise AssertionError(f"{result!r} is no Deferred: the operation was not carried")


def _request(path: str, method: bytes = b"GET") -> DummyRequest:
    path, _, query = path.partition("?")
    request = DummyRequest([unquote(p).encode() for p in path.split("/")])
    request.method = method
    request.channel = None
    request.startedWriting = False
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        request.addArg(key.encode(), value.encode())
    return request


class TopologyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()

    def vhost(self, node: str) -> Any:
        return self.net[node].broker.default_vhost

    def test_exchange_declared_on_every_node(self) -> None:
        """An exchange declared on a exists on b and c, with its type,
        flags and arguments; a publish to it on c reaches a queue bound
        to it on a; deleted on b, it goes everywhere."""
        net = self.net
        self.vhost("a").declare_exchange("orders", "topic", durable=True, arguments={"x-note": "n"})
        net.settle()
        for node in "bc":
            ex = self.vhost(node).exchanges["orders"]
            self.assertEqual((ex.type, ex.durable, ex.auto_delete, ex.arguments), ("topic", True, False, {"x-note": "n"}))
        q = homed(net, "a")
        self.vhost("a").declare_queue(q, durable=False)
        self.vhost("a").bind(q, "orders", "eu.#")
        net.settle()
        net["c"].publish("eu.fr", b"one", exchange="orders")
        net["c"].publish("us.ca", b"not", exchange="orders")
        net.settle()
        self.assertEqual(len(self.vhost("a").queues[q]), 1)
        self.vhost("b").delete_exchange("orders")
        net.settle()
        for node in "abc":
            self.assertNotIn("orders", self.vhost(node).exchanges)

    def test_exchange_to_exchange_binding_on_every_node(self) -> None:
        """An exchange bound to another on a is bound on b and c: a publish
        on b reaches a queue on c bound to the destination, once; unbound
        on a, nowhere."""
        net = self.net
        a = self.vhost("a")
        a.declare_exchange("src", "topic")
        a.declare_exchange("dst", "fanout")
        net.settle()
        a.bind_exchange("dst", "src", "k.#")
        q = homed(net, "c")
        self.vhost("c").declare_queue(q, durable=False)
        self.vhost("c").bind(q, "dst", "")
        net.settle()
        for node in "bc":
            self.assertEqual([(s.name, key) for s, key, _ in self.vhost(node).exchanges["dst"].sources], [("src", "k.#")])
        net["b"].publish("k.x", b"one", exchange="src")
        net.settle()
        self.assertEqual(len(self.vhost("c").queues[q]), 1)
        a.unbind_exchange("dst", "src", "k.#")
        net.settle()
        self.assertEqual(self.vhost("b").exchanges["dst"].sources, [])
        net["b"].publish("k.x", b"two", exchange="src")
        net.settle()
        self.assertEqual(len(self.vhost("c").queues[q]), 1)

    def test_exchange_declared_while_unlinked(self) -> None:
        """A node that comes up (a link up) is told every exchange of its
        peer: those it lacks are made; an exchange of another type stays as
        it is (logged)."""
        net = Net("a", "b")
        self.vhost_a = net["a"].broker.default_vhost
        net["a"].broker.default_vhost.declare_exchange("late", "fanout", durable=False)
        net["a"].broker.default_vhost.declare_exchange("clash", "fanout")
        net["b"].broker.default_vhost.declare_exchange("clash", "direct")
        net["a"].broker.default_vhost.bind_exchange("late", "amq.topic", "x.#")
        net.full_mesh()
        b = net["b"].broker.default_vhost
        self.assertEqual([(s.name, k) for s, k, _ in b.exchanges["late"].sources], [("amq.topic", "x.#")])
        self.assertEqual((b.exchanges["late"].type, b.exchanges["late"].durable), ("fanout", False))
        self.assertEqual(b.exchanges["clash"].type, "direct")
        self.assertEqual(net["a"].broker.default_vhost.exchanges["clash"].type, "fanout")
        self.assertTrue(self.flushLoggedErrors() == [])

    def test_auto_delete_deletion_is_each_nodes(self) -> None:
        """An auto-delete exchange goes with a node's last binding on that
        node only."""
        net = self.net
        self.vhost("a").declare_exchange("tmp", "direct", auto_delete=True)
        net.settle()
        self.assertIn("tmp", self.vhost("c").exchanges)
        self.vhost("a").delete_exchange("tmp")
        net.settle()
        self.assertNotIn("tmp", self.vhost("a").exchanges)
        self.assertIn("tmp", self.vhost("c").exchanges)


class QueueOperationTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = Net("a", "b")
        self.net.full_mesh()
        self.q = homed(self.net, "b")
        for body in (b"1", b"2", b"3"):
            send(self.net, "a", self.q, body)
        self.net.settle()
        self.home = self.net["b"].broker.default_vhost.queues[self.q]
        self.assertEqual(len(self.home), 3)

    def test_purge_carried_to_the_home(self) -> None:
        net = self.net
        d = settled(net, management(net, "a").purge_queue(self.q))
        self.assertEqual(self.successResultOf(d), 3)
        self.assertEqual(len(self.home), 0)

    def test_delete_carried_to_the_home(self) -> None:
        """Deleted on its home; the stand-in goes too; if-empty refused
        with the home's verdict."""
        net = self.net
        a = net["a"].broker.default_vhost
        self.assertIsInstance(a.queues[self.q], RemoteQueue)
        d = settled(net, management(net, "a").delete_queue(self.q, if_empty=True))
        self.assertIsInstance(self.failureResultOf(d, PreconditionFailed).value, PreconditionFailed)
        self.assertIn(self.q, net["b"].broker.default_vhost.queues)
        d = settled(net, management(net, "a").delete_queue(self.q))
        self.assertEqual(self.successResultOf(d), 3)
        self.assertNotIn(self.q, net["b"].broker.default_vhost.queues)
        self.assertNotIn(self.q, a.queues)

    def test_bind_carried_to_the_home(self) -> None:
        """A binding of a queue homed on b, made on a, is b's; a publish on
        a to the exchange reaches the queue; unbound the same way."""
        net = self.net
        a = net["a"].broker.default_vhost
        a.declare_exchange("ev", "direct")
        net.settle()
        d = settled(net, management(net, "a").bind(self.q, "ev", "k"))
        self.successResultOf(d)
        self.assertEqual([(ex.name, key) for ex, key, _ in self.home.bindings], [("ev", "k")])
        net["a"].publish("k", b"routed", exchange="ev")
        net.settle()
        self.assertEqual(len(self.home), 4)
        d = settled(net, management(net, "a").unbind(self.q, "ev", "k"))
        self.successResultOf(d)
        self.assertEqual(self.home.bindings, [])
        # The core's checks hold where the request arrives: no such exchange here.
        with self.assertRaises(NotFound):
            management(net, "a").bind(self.q, "nope", "k")

    def test_authorized_where_it_arrives(self) -> None:
        """An identity without the permission is refused on the node it
        called, and nothing reaches the home."""
        net = self.net
        bob = User("bob", permissions={"/": Permission.of(r"^bob\.", r"^bob\.", r"^bob\.")})
        sent = net["a"].link_to(net["b"]).bytes_out
        with self.assertRaises(AccessRefused):
            management(net, "a", bob).purge_queue(self.q)
        with self.assertRaises(AccessRefused):
            management(net, "a", bob).delete_queue(self.q)
        net.settle()
        self.assertEqual(net["a"].link_to(net["b"]).bytes_out, sent)
        self.assertEqual(len(self.home), 3)

    def test_home_down(self) -> None:
        """The home not linked: refused at once (Unavailable: HTTP 503)."""
        net = self.net
        net["a"].link_to(net["b"]).transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        d = management(net, "a").purge_queue(self.q)
        self.assertIsInstance(self.failureResultOf(d, Unavailable).value, Unavailable)

    def test_no_answer_in_time(self) -> None:
        """A home that does not answer within the deadline: Unavailable,
        naming it; its late answer is dropped."""
        net = self.net
        late: Deferred = Deferred()
        net["b"].mesh.manage.handlers["queue.purge"] = lambda link, args: late
        d = management(net, "a").purge_queue(self.q)
        net.settle()
        self.assertNoResult(d)
        net.clock.advance(manage.TIMEOUT)
        error = self.failureResultOf(d, Unavailable).value
        self.assertIn("'b' did not answer within 5 s", error.message)
        late.callback(1)
        net.settle()
        self.assertEqual(net["a"].mesh.manage.waiting, 0)

    def test_bad_frames(self) -> None:
        """A malformed request closes the link, as any bad frame does."""
        net = self.net
        link = net["a"].link_to(net["b"])
        link.send(manage.wire.frame(manage.ASK, b'{"id": "x"}'))
        net.settle()
        self.assertNotIn("a", net["b"].mesh.links)
        self.flushLoggedErrors()

    def test_bad_got_frames(self) -> None:
        """A got frame too short, with a head longer than itself, or
        without its facts closes the link."""
        for payload in (b"\0\0", b"\0\0\0\x09{}", b'\0\0\0\x08{"id":1}rest'):
            net = Net("a", "b")
            net.full_mesh()
            net["a"].link_to(net["b"]).send(manage.wire.frame(manage.GOT, payload))
            net.settle()
            self.assertNotIn("a", net["b"].mesh.links, payload)
        self.flushLoggedErrors()


class WholeBrokerCase(SynchronousTestCase):
    """Three nodes, a queue homed on each with a message, and the HTTP API
    of each."""

    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()
        self.registries = {}
        for node in "abc":
            registry = self.registries[node] = ConnectionRegistry(clock=self.net.clock)
            self.net[node].mesh.manage.registry = registry
            self.net[node].broker.mesh = self.net[node].mesh  # as mesh_of makes it
        self.queues = {node: homed(self.net, node, f"q{node}") for node in "abc"}
        for q in self.queues.values():
            send(self.net, "a", q, b"x")
        self.net.settle()

    def get(self, node: str, path: str, method: bytes = b"GET", body: Any = None) -> tuple[int, Any]:
        ctx = Ctx(broker=self.net[node].broker, clock=self.net.clock, connections=self.registries[node])
        api = ApiResource(ctx)
        request = _request(path, method)
        if body is not None:
            request.content = io.BytesIO(json.dumps(body).encode())
            request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
        result = api.render(request)
        if result is NOT_DONE_YET:
            self.net.settle()
            self.assertEqual(request.finished, 1, "no answer")
            body = b"".join(request.written)
        else:
            body = result
        status = request.responseCode or 200
        kind = request.responseHeaders.getRawHeaders(b"content-type", [b"application/json"])[0].decode()
        # Every document as the OpenAPI document describes it.
        validate(request.method.decode(), "http://broker/api/" + path.partition("?")[0], status, kind, body)
        return status, json.loads(body)

    def _without_c(self, request_kind: str, path: str) -> Any:
        """GET C{path} on a while node c does not answer its C{request_kind}
        requests: the answer, which names c missing, with why."""
        net = self.net
        net["c"].mesh.manage.handlers[request_kind] = lambda link, args: Deferred()
        ctx = Ctx(broker=net["a"].broker, clock=net.clock, connections=self.registries["a"])
        request = _request(path)
        self.assertIs(ApiResource(ctx).render(request), NOT_DONE_YET)
        net.settle()
        net.clock.advance(manage.TIMEOUT)
        doc = json.loads(b"".join(request.written))
        self.assertEqual(list(doc["missing"]), ["c"])
        self.assertIn("did not answer", doc["missing"]["c"])
        return doc


class ListingTests(WholeBrokerCase):
    """The HTTP API on any node answers for all."""

    def test_queues_from_every_node(self) -> None:
        """Each queue once, from its home, named; the same list on every node."""
        lists = {}
        for node in "abc":
            status, doc = self.get(node, "v1/vhosts/%2F/queues")
            self.assertEqual(status, 200)
            self.assertEqual(doc["missing"], {})
            lists[node] = [(q["name"], q["home"], q["messages"]) for q in doc["queues"]]
        self.assertEqual(lists["a"], sorted(((q, n, 1) for n, q in self.queues.items()), key=lambda t: t[1]))
        self.assertEqual(lists["a"], lists["b"])
        self.assertEqual(lists["b"], lists["c"])
        status, doc = self.get("b", "v1/vhosts/%2F/queues?limit=1&offset=1")
        self.assertEqual((doc["total"], doc["offset"], doc["next_offset"]), (3, 1, 2))
        self.assertEqual([q["home"] for q in doc["queues"]], ["b"])

    def test_missing_node_named(self) -> None:
        """A node that does not answer in time is named, with why; its
        queues are not in the list."""
        doc = self._without_c("queues", "v1/vhosts/%2F/queues")
        self.assertEqual(sorted(q["home"] for q in doc["queues"]), ["a", "b"])

    def test_unlinked_member_named(self) -> None:
        net = self.net
        net["a"].link_to(net["c"]).transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        status, doc = self.get("a", "v1/vhosts/%2F/queues")
        self.assertEqual(list(doc["missing"]), ["c"])

    def test_get_queue_from_its_home(self) -> None:
        """A queue's document on a node that is not its home is the home's."""
        q = self.queues["c"]
        status, doc = self.get("a", "v1/vhosts/%2F/queues/" + q)
        self.assertEqual((status, doc["home"], doc["messages"]), (200, "c", 1))

    def test_purge_through_another_node(self) -> None:
        status, doc = self.get("a", "v1/vhosts/%2F/queues/" + self.queues["c"] + "/messages", b"DELETE")
        self.assertEqual((status, doc), (200, {"purged": 1}))
        self.assertEqual(len(self.net["c"].broker.default_vhost.queues[self.queues["c"]]), 0)

    def test_bindings_from_every_node(self) -> None:
        net = self.net
        for node, q in self.queues.items():
            net[node].broker.default_vhost.bind(q, "amq.topic", f"k.{node}")
        net.settle()
        status, doc = self.get("b", "v1/vhosts/%2F/bindings")
        self.assertEqual(doc["missing"], {})
        self.assertEqual([(b["queue"], b["routing_key"], b["home"]) for b in doc["bindings"]],
                         [(self.queues[n], f"k.{n}", n) for n in "abc"])

    def test_connections_from_every_node_and_closed_there(self) -> None:
        """Every node's connections, named by node (ids ID@NODE); a close
        through a of c's connection closes it on c."""
        closed = []

        class Conn:
            protocol_name = "stomp"
            peer = "127.0.0.1:5"
            peer_host = "127.0.0.1"

            def shutdown(self, reason: str) -> None:
                closed.append(reason)

        conns = {node: Conn() for node in "abc"}
        for node, conn in conns.items():
            self.registries[node].add(conn, "stomp:tcp:0")
        status, doc = self.get("a", "v1/connections")
        self.assertEqual([(c["id"], c["node"]) for c in doc["connections"]], [("1@a", "a"), ("1@b", "b"), ("1@c", "c")])
        status, doc = self.get("a", "v1/connections/1@c", b"DELETE")
        self.assertEqual((status, doc), (200, {"closed": "1@c"}))
        self.assertEqual(closed, ["closed by an administrator (HTTP API)"])
        status, doc = self.get("a", "v1/connections/7@c", b"DELETE")
        self.assertEqual(status, 404)
        self.assertEqual(doc["code"], "unknown-connection")


class DefinitionsTests(WholeBrokerCase):
    """C{/api/v1/definitions} on any node: the whole broker's, exported
    and imported."""

    def bind_on_homes(self) -> None:
        net = self.net
        for node, q in self.queues.items():
            net[node].broker.default_vhost.bind(q, "amq.topic", f"k.{node}")
        net["c"].broker.default_vhost.bind(self.queues["c"], "amq.headers", "", {"x-match": "any", "h": "v"})
        management(net, "b").declare_exchange("made-on-b", "fanout")
        net.settle()

    def test_export_from_every_node(self) -> None:
        """Every node exports the same document: each queue once (from its
        home), every binding, every exchange once."""
        self.bind_on_homes()
        docs = {}
        for node in "abc":
            status, doc = self.get(node, "v1/definitions")
            self.assertEqual((status, doc["missing"]), (200, {}))
            docs[node] = doc
        self.assertEqual(docs["a"], docs["b"])
        self.assertEqual(docs["b"], docs["c"])
        doc = docs["a"]
        self.assertEqual([q["name"] for q in doc["queues"]], [self.queues[n] for n in "abc"])
        self.assertEqual(
            sorted((b["destination"], b["source"], b["routing_key"], b["arguments"]) for b in doc["bindings"]),
            sorted([(q, "amq.topic", f"k.{n}", {}) for n, q in self.queues.items()]
                   + [(self.queues["c"], "amq.headers", "", {"x-match": "any", "h": "v"})]),
        )
        self.assertEqual([x["name"] for x in doc["exchanges"]], ["made-on-b"])
        # What was exported imports (here: nothing new).
        status, result = self.get("b", "v1/definitions", b"POST", doc)
        self.assertEqual(status, 200, result)
        self.assertEqual(result["created"], dict.fromkeys(result["created"], 0))
        self.assertEqual((result["unchanged"]["queues"], result["unchanged"]["bindings"]), (3, 4))

    def test_export_names_missing(self) -> None:
        """A node that does not answer in time is named, its queues are not
        in the document, which still imports."""
        net = self.net
        doc = self._without_c("definitions", "v1/definitions")
        self.assertEqual([q["name"] for q in doc["queues"]], [self.queues["a"], self.queues["b"]])
        net["c"].mesh.manage.handlers["definitions"] = manage.Manage(net["c"].mesh).handlers["definitions"]
        status, result = self.get("b", "v1/definitions", b"POST", doc)
        self.assertEqual(status, 200, result)

    def document(self) -> dict[str, Any]:
        """New queues homed on b and c, bound to a new exchange and to
        amq.headers."""
        names = {node: homed(self.net, node, f"imported-{node}-") for node in "bc"}
        return {
            "exchanges": [{"vhost": "/", "name": "imported-x", "type": "direct"}],
            "queues": [{"vhost": "/", "name": names["b"], "durable": False},
                       {"vhost": "/", "name": names["c"], "arguments": {"x-max-length": 5}}],
            "bindings": [
                {"vhost": "/", "source": "imported-x", "destination": names["b"], "routing_key": "k"},
                {"vhost": "/", "source": "amq.headers", "destination": names["c"],
                 "arguments": {"x-match": "all", "h": "v"}},
            ],
        }

    def test_import_on_any_node_declares_on_the_home(self) -> None:
        """A document imported on a: each queue declared on its home (as
        the document has it), bound there; importing again changes
        nothing."""
        doc = self.document()
        status, result = self.get("a", "v1/definitions", b"POST", doc)
        self.assertEqual(status, 200, result)
        self.assertEqual({k: result["created"][k] for k in ("exchanges", "queues", "bindings")},
                         {"exchanges": 1, "queues": 2, "bindings": 2})
        for item, node in zip(doc["queues"], "bc", strict=True):
            queue = self.net[node].broker.default_vhost.queues[item["name"]]
            self.assertIsNone(queue.remote)
            self.assertEqual(queue.durable, item.get("durable", True))
        home_c = self.net["c"].broker.default_vhost.queues[doc["queues"][1]["name"]]
        self.assertEqual((home_c.policy.max_length, [(ex.name, args) for ex, _, args in home_c.bindings]),
                         (5, [("amq.headers", {"x-match": "all", "h": "v"})]))
        home_b = self.net["b"].broker.default_vhost.queues[doc["queues"][0]["name"]]
        self.assertEqual([(ex.name, key) for ex, key, _ in home_b.bindings], [("imported-x", "k")])
        status, result = self.get("a", "v1/definitions", b"POST", doc)
        self.assertEqual(status, 200, result)
        self.assertEqual(result["created"], dict.fromkeys(result["created"], 0))
        self.assertEqual({k: result["unchanged"][k] for k in ("exchanges", "queues", "bindings")},
                         {"exchanges": 1, "queues": 2, "bindings": 2})

    def test_import_conflict_on_the_home(self) -> None:
        """A queue its home has with other arguments is a conflict found
        before anything changes, wherever the import arrives."""
        doc = self.document()
        name = doc["queues"][1]["name"]
        self.net["c"].broker.default_vhost.declare_queue(name, arguments={"x-max-length": 9})
        status, problem = self.get("a", "v1/definitions", b"POST", doc)
        self.assertEqual((status, problem["code"]), (409, "definitions-conflict"))
        self.assertIn(name, problem["item"])
        self.assertNotIn("imported-x", self.net["a"].broker.default_vhost.exchanges)
        self.assertNotIn(doc["queues"][0]["name"], self.net["b"].broker.default_vhost.queues)

    def test_import_needs_every_node(self) -> None:
        """An import is planned with every node's queues: one that does not
        answer makes it a 503 naming it, with nothing changed."""
        net = self.net
        net["c"].link_to(net["a"]).transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        status, problem = self.get("a", "v1/definitions", b"POST", self.document())
        self.assertEqual((status, problem["code"], list(problem["missing"])), (503, "node-unavailable", ["c"]))
        self.assertNotIn("imported-x", net["a"].broker.default_vhost.exchanges)

    def test_refused_on_the_home(self) -> None:
        """The home's refusal of a binding is the answer, naming the item."""
        def refuse(link: Any, args: dict[str, Any]) -> None:
            raise AccessRefused("not here", "access refused")

        self.net["c"].mesh.manage.handlers["queue.bind"] = refuse
        status, problem = self.get("a", "v1/definitions", b"POST", self.document())
        self.assertEqual((status, problem["code"]), (403, "access-refused"))
        self.assertIn("bindings[1]", problem["detail"])
        self.assertIn("not here", problem["detail"])


class NotFoundTests(SynchronousTestCase):
    def test_unknown_operation_refused(self) -> None:
        net = Net("a", "b")
        net.full_mesh()
        d = net["a"].mesh.manage.ask("b", "no.such", {})
        net.settle()
        self.assertIn("knows no operation", self.failureResultOf(d, BrokerError).value.message)
        d = net["a"].mesh.manage.ask("b", "queue.purge", {"vhost": "/", "queue": "nope"})
        net.settle()
        self.failureResultOf(d, NotFound)


class AmqpTests(SynchronousTestCase):
    """AMQP's queue.purge, queue.bind, queue.delete of a queue homed on
    another node: carried there; the reply comes with the home's verdict,
    and what the client sent meanwhile waits, so replies keep their order."""

    def setUp(self) -> None:
        from qmq.amqp.protocol import AmqpFactory  # noqa: PLC0415
        from qmq.amqp.settings import AmqpSettings  # noqa: PLC0415
        from tests.test_amqp_session import Client  # noqa: PLC0415

        self.net = Net("a", "b")
        self.net.full_mesh()
        self.q = homed(self.net, "b")
        for body in (b"1", b"2"):
            send(self.net, "a", self.q, body)
        self.net.settle()
        registry = ConnectionRegistry(clock=self.net.clock)
        factory = AmqpFactory(self.net["a"].broker, AmqpSettings(), clock=self.net.clock, registry=registry)
        self.client = Client(factory)
        self.client.handshake()
        self.client.channel()
        self.home = self.net["b"].broker.default_vhost.queues[self.q]

    def test_purge_then_pipelined(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Queue.Purge(queue=self.q), 1)
        c.send(commands.Queue.Declare(queue=self.q, passive=True), 1)
        self.assertEqual(c.methods(), [])  # waiting for b
        self.net.settle()
        replies = c.methods()
        self.assertEqual([type(m) for m in replies], [commands.Queue.PurgeOk, commands.Queue.DeclareOk])
        self.assertEqual(replies[0].message_count, 2)
        self.assertEqual(len(self.home), 0)

    def test_bind_then_delete_refused(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Queue.Bind(queue=self.q, exchange="amq.direct", routing_key="k"), 1)
        self.net.settle()
        self.assertIsInstance(c.expect(commands.Queue.BindOk), commands.Queue.BindOk)
        self.assertEqual([(ex.name, key) for ex, key, _ in self.home.bindings], [("amq.direct", "k")])
        c.send(commands.Queue.Delete(queue=self.q, if_empty=True), 1)
        self.net.settle()
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("not empty", close.reply_text)
        self.assertIn(self.q, self.net["b"].broker.default_vhost.queues)

    def test_get_with_ack_then_ack(self) -> None:
        """basic.get of a queue homed on b: the message comes from b, held
        unacked there; the client's ack settles it there; a reject
        requeues it there."""
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        self.get()
        frames = c.read()
        ok = frames[0][1]
        self.assertIsInstance(ok, commands.Basic.GetOk)
        self.assertEqual((ok.message_count, ok.redelivered), (1, False))
        self.assertEqual(frames[-1][1].value, b"1")
        self.assertEqual((len(self.home), sum(len(cn.unacked) for cn in self.home_channel_consumers())), (1, 1))
        c.send(commands.Basic.Reject(ok.delivery_tag, requeue=True), 1)
        self.net.settle()
        self.assertEqual(len(self.home), 2)
        self.get()
        ok = c.read()[0][1]
        self.assertTrue(ok.redelivered)
        c.send(commands.Basic.Ack(ok.delivery_tag), 1)
        self.net.settle()
        self.assertEqual(len(self.home), 1)
        self.assertEqual(sum(len(cn.unacked) for cn in self.home_channel_consumers()), 0)
        self.assertEqual(self.net["a"].mesh.manage.got, {})

    def test_get_no_ack_and_empty(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        for _ in range(2):
            self.get(no_ack=True)
            self.assertIsInstance(c.read()[0][1], commands.Basic.GetOk)
        self.get(no_ack=True)
        self.assertIsInstance(c.expect(commands.Basic.GetEmpty), commands.Basic.GetEmpty)
        self.assertEqual(len(self.home), 0)

    def test_get_large(self) -> None:
        """A message of 5 MiB, past what a JSON answer carries, comes from
        its home whole (a GOT frame) and is acked there; one larger than a
        link frame is refused (406: consume it) and stays in the queue."""
        from pamqp import commands  # noqa: PLC0415

        big = bytes(range(256)) * (5 * 4096)
        self.assertGreater(len(big), manage.MAX_GET)
        self.home.purge()
        send(self.net, "b", self.q, big, persistent=True)
        c = self.client
        self.get()
        frames = c.read()
        ok = frames[0][1]
        self.assertIsInstance(ok, commands.Basic.GetOk)
        self.assertEqual(frames[1][1].body_size, len(big))
        self.assertEqual(b"".join(f[1].value for f in frames[2:]), big)
        c.send(commands.Basic.Ack(ok.delivery_tag), 1)
        self.net.settle()
        self.assertEqual((len(self.home), sum(len(cn.unacked) for cn in self.home_channel_consumers())), (0, 0))
        # Larger than the link's frame (cluster.max_frame of the asker, here).
        self.net["a"].mesh.settings = replace(self.net["a"].mesh.settings, max_frame=len(big) // 2)
        send(self.net, "b", self.q, big)
        self.get()
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("consume it instead", close.reply_text)
        self.assertEqual(len(self.home), 1)

    def test_get_large_without_got_frames(self) -> None:
        """Asked without "frame" (a request that takes no GOT frame),
        the home answers in JSON, and refuses what does not fit there."""
        link = self.net["b"].link_to(self.net["a"])
        home = self.net["b"].mesh.manage
        args = {"vhost": "/", "queue": self.q, "ack": False}
        answer = home.handlers["queue.get"](link, dict(args))
        self.assertEqual(base64.b64decode(answer["m"])[-1:], b"1")
        self.home.purge()
        send(self.net, "b", self.q, b"x" * (manage.MAX_GET + 1))
        with self.assertRaises(PreconditionFailed):
            home.handlers["queue.get"](link, dict(args))
        self.assertEqual(len(self.home), 1)

    def test_get_then_link_lost(self) -> None:
        """A got message whose link goes is given back on its home; the
        client's later ack goes nowhere."""
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        self.get()
        ok = c.read()[0][1]
        self.net["a"].link_to(self.net["b"]).transport.loseConnection()  # type: ignore[union-attr]
        self.net.settle()
        self.assertEqual(len(self.home), 2)
        c.send(commands.Basic.Ack(ok.delivery_tag), 1)
        self.net.settle()
        self.assertEqual(len(self.home), 2)

    def get(self, no_ack: bool = False) -> None:
        """A basic.get of the queue homed on b, sent by the client on a,
        and every frame it makes moved."""
        from pamqp import commands  # noqa: PLC0415

        self.client.send(commands.Basic.Get(queue=self.q, no_ack=no_ack), 1)
        self.net.settle()

    def home_channel_consumers(self) -> list[Any]:
        """The getters of b's channels for the link from a."""
        link = self.net["b"].link_to(self.net["a"])
        return [g for ch in link.channels.values() for g in ch.getters]

    def test_delete_with_a_consumer_cancels_after_delete_ok(self) -> None:
        """A consumer of the stand-in on the deleting channel hears its
        basic.cancel after the delete-ok (as RabbitMQ orders them)."""
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Basic.Consume(queue=self.q, consumer_tag="t"), 1)
        self.net.settle()
        c.read()  # consume-ok and the two messages
        c.send(commands.Queue.Delete(queue=self.q), 1)
        self.net.settle()
        methods = [m for m in c.methods() if isinstance(m, commands.Queue.DeleteOk | commands.Basic.Cancel)]
        self.assertEqual([type(m) for m in methods], [commands.Queue.DeleteOk, commands.Basic.Cancel])
        self.assertNotIn(self.q, self.net["b"].broker.default_vhost.queues)


class OlderNodeTests(SynchronousTestCase):
    def test_no_management_frames_to_an_older_node(self) -> None:
        """A peer whose hello does not say "manage" gets no management
        frame (it would close the link on one): named missing instead."""
        net = Net("a", "b")
        net.full_mesh()
        link = net["a"].link_to(net["b"])
        link.manages = False
        sent = link.bytes_out
        net["a"].broker.default_vhost.declare_exchange("x1", "topic")
        d = net["a"].mesh.manage.ask_all("queues", {"vhost": "/"})
        net.settle()
        answers, missing = self.successResultOf(d)
        self.assertEqual((answers, list(missing)), ({}, ["b"]))
        self.assertIn("older version", missing["b"])
        self.assertEqual(link.bytes_out, sent)
        self.assertNotIn("x1", net["b"].broker.default_vhost.exchanges)
        self.assertIn("b", net["a"].mesh.links)


class NeverNamedHereTests(SynchronousTestCase):
    """A queue homed on b that a never named (no stand-in there yet): an
    operation by its name on a reaches it all the same."""

    def setUp(self) -> None:
        self.net = Net("a", "b")
        self.net.full_mesh()
        self.q = homed(self.net, "b")
        self.net["b"].broker.default_vhost.declare_queue(self.q, durable=False)
        send(self.net, "b", self.q, b"x")
        self.net.settle()
        self.assertNotIn(self.q, self.net["a"].broker.default_vhost.queues)

    def test_purge(self) -> None:
        d = settled(self.net, management(self.net, "a").purge_queue(self.q))
        self.assertEqual(self.successResultOf(d), 1)

    def test_get(self) -> None:
        d = self.net["a"].channel.get(self.q, ack=False)
        self.net.settle()
        self.assertEqual(self.successResultOf(d).message.body, b"x")

    def test_missing_everywhere(self) -> None:
        """A name homed on b that b does not have either: b's 404."""
        other = homed(self.net, "b", "none")
        d = settled(self.net, management(self.net, "a").purge_queue(other))
        self.assertIn("no queue", self.failureResultOf(d, NotFound).value.message)

    def test_declared_here_made_on_the_home(self) -> None:
        """A queue declared on a (AMQP queue.declare, HTTP PUT) whose home
        is b is made on b as declared, so that a bind from a, next on the
        same link, finds it."""
        net = self.net
        other = homed(net, "b", "decl")
        mgmt = management(net, "a")
        queue, made = mgmt.declare_queue(other, durable=True, arguments={"x-max-length": 5})
        self.assertTrue(made)
        d = mgmt.bind(other, "amq.topic", "k")
        net.settle()
        self.successResultOf(d)
        home = net["b"].broker.default_vhost.queues[other]
        self.assertEqual((home.durable, home.remote, [(e.name, k) for e, k, _ in home.bindings]),
                         (True, None, [("amq.topic", "k")]))

    def test_names_not_found_leave_nothing(self) -> None:
        """A purge, get or GET of a name its home does not have leaves no
        stand-in behind (names asked for cost nothing here)."""
        other = homed(self.net, "b", "none")
        vhost = self.net["a"].broker.default_vhost
        d = settled(self.net, management(self.net, "a").purge_queue(other))
        self.failureResultOf(d, NotFound)
        self.assertNotIn(other, vhost.queues)
        d = self.net["a"].channel.get(other)
        self.net.settle()
        self.failureResultOf(d, NotFound)
        self.assertNotIn(other, vhost.queues)


class NamedOnlyOnItsHomeTests(SynchronousTestCase):
    """A queue declared on b, its home, and never named on a: what a client
    of a names as a queue that exists (AMQP basic.consume and passive
    queue.declare, the HTTP API's receive) is asked of b first, so it is
    found, with b's counts, and a name b does not have is 404 as for a
    queue of a's own, leaving nothing behind on either node (a consume
    makes no queue)."""

    def setUp(self) -> None:
        from qmq.amqp.protocol import AmqpFactory  # noqa: PLC0415
        from qmq.amqp.settings import AmqpSettings  # noqa: PLC0415
        from tests.test_amqp_session import Client  # noqa: PLC0415

        self.net = net = Net("a", "b")
        net.full_mesh()
        self.q = homed(net, "b", "only")
        self.missing = homed(net, "b", "none")
        net["b"].broker.default_vhost.declare_queue(self.q, durable=False, arguments={"x-max-length": 10})
        for body in (b"1", b"2"):
            send(net, "b", self.q, body)
        net.settle()
        self.a = net["a"].broker.default_vhost
        self.b = net["b"].broker.default_vhost
        self.assertNotIn(self.q, self.a.queues)
        self.registry = ConnectionRegistry(clock=net.clock)
        factory = AmqpFactory(net["a"].broker, AmqpSettings(), clock=net.clock, registry=self.registry)
        self.client = Client(factory)
        self.client.handshake()
        self.client.channel()

    def assertLeftNothing(self, name: str) -> None:
        self.assertNotIn(name, self.a.queues)
        self.assertNotIn(name, self.b.queues)

    def test_consume(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Basic.Consume(queue=self.q, consumer_tag="t"), 1)
        c.send(commands.Basic.Qos(prefetch_count=5), 1)
        self.assertEqual(c.methods(), [])  # b is asked first; the qos waits
        self.net.settle()
        frames = c.read()
        methods = [f for _, f in frames if isinstance(f, (commands.Basic.ConsumeOk, commands.Basic.Deliver,
                                                          commands.Basic.QosOk))]
        self.assertEqual([type(m) for m in methods],
                         [commands.Basic.ConsumeOk, commands.Basic.QosOk, commands.Basic.Deliver,
                          commands.Basic.Deliver])
        c.send(commands.Basic.Ack(methods[3].delivery_tag, multiple=True), 1)
        self.net.settle()
        self.assertEqual(len(self.b.queues[self.q]), 0)
        self.assertEqual(sum(len(cn.unacked) for cn in self.b.queues[self.q].consumers), 0)

    def test_consume_missing(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Basic.Consume(queue=self.missing), 1)
        self.net.settle()
        close = c.close_error()
        self.assertEqual((close.reply_code, close.class_id, close.method_id), (404, 60, 20))
        self.assertIn(f"no queue {self.missing!r}", close.reply_text)
        self.assertLeftNothing(self.missing)

    def test_consume_deleted_on_its_home(self) -> None:
        """a's stand-in stays when b's queue is deleted by a client of b;
        a consume on a is then 404, as b says, not a new queue on b."""
        from pamqp import commands  # noqa: PLC0415

        send(self.net, "a", self.q, b"3")  # a names it: a stand-in
        self.net.settle()
        self.assertIsInstance(self.a.queues[self.q], RemoteQueue)
        self.b.delete_queue(self.q)
        c = self.client
        c.send(commands.Basic.Consume(queue=self.q), 1)
        self.net.settle()
        self.assertEqual(c.close_error().reply_code, 404)
        self.assertLeftNothing(self.q)

    def test_passive_declare(self) -> None:
        """The declare-ok carries b's counts; equivalent arguments pass,
        others are 406, as for a queue of a's."""
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Queue.Declare(queue=self.q, passive=True), 1)
        c.send(commands.Queue.Declare(queue=self.q, passive=True, arguments={"x-max-length": 10}), 1)
        self.net.settle()
        replies = c.methods()
        self.assertEqual([(r.queue, r.message_count, r.consumer_count) for r in replies], [(self.q, 2, 0)] * 2)
        c.send(commands.Queue.Declare(queue=self.q, passive=True, arguments={"x-max-length": 3}), 1)
        self.net.settle()
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("other arguments", close.reply_text)

    def test_declare(self) -> None:
        """A declare (not passive) of b's queue from a waits for b's
        verdict: the declare-ok carries b's counts; other arguments than
        b's are 406 as for a queue of a's, and what follows waits its turn."""
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Queue.Declare(queue=self.q, durable=False, arguments={"x-max-length": 10}), 1)
        c.send(commands.Basic.Qos(prefetch_count=3), 1)
        self.assertEqual(c.methods(), [])
        self.net.settle()
        ok, qos = c.methods()
        self.assertEqual((type(ok), ok.queue, ok.message_count, ok.consumer_count, type(qos)),
                         (commands.Queue.DeclareOk, self.q, 2, 0, commands.Basic.QosOk))
        c.send(commands.Queue.Declare(queue=self.q, durable=False, arguments={"x-max-length": 3}), 1)
        self.net.settle()
        close = c.close_error()
        self.assertEqual((close.reply_code, close.class_id, close.method_id), (406, 50, 10))
        self.assertIn("other arguments", close.reply_text)

    def test_http_put_same_verdict(self) -> None:
        """HTTP PUT of b's queue through a: b's document (200: it was
        there; 201 for one made there now); other arguments: the same
        problem as through b."""
        def put(node: str, name: str, body: dict) -> tuple[int, Any]:
            ctx = Ctx(broker=self.net[node].broker, clock=self.net.clock)
            request = _request(f"v1/vhosts/%2F/queues/{name}", b"PUT")
            request.content = io.BytesIO(json.dumps(body).encode())
            request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
            result = ApiResource(ctx).render(request)
            if result is NOT_DONE_YET:
                self.net.settle()
                result = b"".join(request.written)
            return request.responseCode or 200, json.loads(result)

        status, doc = put("a", self.q, {"durable": False, "arguments": {"x-max-length": 10}})
        self.assertEqual((status, doc["home"], doc["messages"], doc["arguments"]),
                         (200, "b", 2, {"x-max-length": 10}))
        fresh = homed(self.net, "b", "fresh")
        status, doc = put("a", fresh, {})
        self.assertEqual((status, doc["home"], doc["messages"]), (201, "b", 0))
        self.assertIn(fresh, self.b.queues)
        verdicts = [put(node, self.q, {"durable": False, "arguments": {"x-max-length": 3}}) for node in ("a", "b")]
        self.assertEqual(verdicts[0][0], verdicts[1][0])
        self.assertEqual(verdicts[0][1]["code"], verdicts[1][1]["code"])
        self.assertGreaterEqual(verdicts[0][0], 400)

    def test_passive_declare_missing(self) -> None:
        from pamqp import commands  # noqa: PLC0415

        c = self.client
        c.send(commands.Queue.Declare(queue=self.missing, passive=True), 1)
        self.net.settle()
        close = c.close_error()
        self.assertEqual((close.reply_code, close.class_id, close.method_id), (404, 50, 10))
        self.assertLeftNothing(self.missing)

    def test_home_down(self) -> None:
        """b not linked: 404 at once, naming b (RabbitMQ's answer for a
        queue whose node is down)."""
        from pamqp import commands  # noqa: PLC0415

        net = self.net
        net["a"].link_to(net["b"]).transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        c = self.client
        c.send(commands.Basic.Consume(queue=self.q), 1)
        close = c.close_error()
        self.assertEqual(close.reply_code, 404)
        self.assertIn("'b'", close.reply_text)

    def receive(self, node: str, queue: str) -> tuple[int, Any]:
        ctx = Ctx(broker=self.net[node].broker, clock=self.net.clock)
        request = _request(f"v1/vhosts/%2F/queues/{queue}/receive?max=5", b"POST")
        result = ApiResource(ctx).render(request)
        if result is NOT_DONE_YET:
            self.net.settle()
            self.net.clock.advance(0)  # the receiver's flush
            self.assertEqual(request.finished, 1, "no answer")
            result = b"".join(request.written)
        status = request.responseCode or 200
        validate("POST", f"http://broker/api/v1/vhosts/%2F/queues/{queue}/receive", status,
                 "application/problem+json" if status >= 400 else "application/json", result)
        return status, json.loads(result)

    def test_http_receive(self) -> None:
        """The HTTP API on a receives from the queue on b; a name b does
        not have is the same 404 problem as a name a does not have."""
        status, doc = self.receive("a", self.q)
        self.assertEqual((status, [m["body"] for m in doc["messages"]]), (200, ["1", "2"]))
        verdicts = []
        for node in ("a", "b"):
            status, doc = self.receive(node, self.missing)
            verdicts.append((status, doc["code"], doc["detail"]))
        self.assertEqual(verdicts[0], verdicts[1])
        self.assertEqual(verdicts[0][:2], (404, "unknown-queue"))
        self.assertLeftNothing(self.missing)


class ScanTests(SynchronousTestCase):
    """A range scan of a queue homed on b, asked on a: b's log holds its
    messages, so b scans and sends the page (its records, in a GOT frame),
    cut to fit a frame with its cursor after the last message sent; the
    messages keep b's ids and the page names b. (b's store here is the
    memory store: its scan is replaced to answer pages; the real log is in
    tests.integration.test_workers_manage.)"""

    def setUp(self) -> None:
        self.net = net = Net("a", "b", max_frame=64 * 1024)
        net.full_mesh()
        self.q = homed(net, "b", "scanned")
        self.b = net["b"].broker.default_vhost
        self.b.declare_queue(self.q)
        self.asked: list[tuple] = []
        self.pages: list[Any] = []

        def scan(name: str, start: float, end: float, cursor: str | None, limit: int) -> Deferred:
            self.asked.append((name, start, end, cursor, limit))
            return succeed(self.pages.pop(0))

        self.b.scan = scan  # type: ignore[method-assign]

    def message(self, mid: int, size: int = 10) -> Message:
        m = Message(mid, "", self.q, {"k": "v"}, bytes([mid % 256]) * size, 1000.0 + mid, True, 3)
        m.properties = {"correlation_id": f"c{mid}"}
        return m

    def scan(self, cursor: str | None = None, limit: int = 100) -> Any:
        return settled(self.net, management(self.net, "a").scan(self.q, 10.0, 2000.0, cursor, limit))

    def test_page_from_the_home(self) -> None:
        sent = [self.message(i) for i in (7, 8, 9)]
        self.pages.append(ScanPage(sent, "i9"))
        page = self.successResultOf(self.scan("i6", 3))
        self.assertEqual(self.asked, [(self.q, 10.0, 2000.0, "i6", 3)])
        self.assertEqual((page.node, page.next_cursor), ("b", "i9"))
        self.assertEqual(
            [(m.id, m.body, m.headers, m.timestamp, m.priority, m.persistent, m.properties) for m in page.messages],
            [(m.id, m.body, m.headers, m.timestamp, m.priority, m.persistent, m.properties) for m in sent])

    def test_last_page(self) -> None:
        self.pages.append(ScanPage([], None))
        page = self.successResultOf(self.scan())
        self.assertEqual((page.messages, page.next_cursor), ([], None))

    def test_page_cut_to_a_frame(self) -> None:
        """Three messages of 30 KiB in a 64 KiB frame: two come, and the
        cursor goes on after the second (not after the page b read)."""
        self.pages.append(ScanPage([self.message(i, 30 * 1024) for i in (1, 2, 3)], "i3"))
        page = self.successResultOf(self.scan())
        self.assertEqual(([m.id for m in page.messages], page.next_cursor), ([1, 2], make_cursor(2)))

    def test_message_larger_than_a_frame(self) -> None:
        self.pages.append(ScanPage([self.message(1, 70 * 1024)], None))
        failure = self.failureResultOf(self.scan(), PreconditionFailed)
        self.assertIn("more than a scan from another node carries", failure.value.message)
        self.assertIn("node 'b'", failure.value.message)

    def test_refused_on_the_home(self) -> None:
        """b's own refusal (here: its memory store keeps no log) comes back,
        and over HTTP it is the same 400 as on b."""
        del self.b.scan
        failure = self.failureResultOf(self.scan(), PreconditionFailed)
        self.assertIn("cannot be scanned", failure.value.message)
        verdicts = []
        for node in ("a", "b"):
            ctx = Ctx(broker=self.net[node].broker, clock=self.net.clock)
            request = _request(f"v1/vhosts/%2F/queues/{self.q}/scan")
            result = ApiResource(ctx).render(request)
            if result is NOT_DONE_YET:
                self.net.settle()
                result = b"".join(request.written)
            doc = json.loads(result)
            verdicts.append((request.responseCode, doc["code"]))
        self.assertEqual(verdicts, [(400, "cannot-scan")] * 2)

    def test_missing(self) -> None:
        """A name b does not have: 404, and a keeps no stand-in."""
        other = homed(self.net, "b", "none")
        d = settled(self.net, management(self.net, "a").scan(other, 0.0, 1.0, None, 10))
        self.failureResultOf(d, NotFound)
        self.assertNotIn(other, self.net["a"].broker.default_vhost.queues)

    def test_bad_answer(self) -> None:
        """Records that are not whole publish records close nothing here
        but fail the scan."""
        from qmq.cluster import wire  # noqa: PLC0415

        for data in (b"\x00\x00", manage.encode_message(b"/", self.message(1))[:-1]):
            self.assertRaises(wire.FrameError, manage.decode_messages, data)


class HandlesTests(WholeBrokerCase):
    """An HTTP client's next connection may land on another node (worker):
    a receipt handle is settled wherever it arrives, by the node whose
    receiver made it (its token starts with that node's id), for the same
    identity; and on one node, whichever listener's API made it."""

    def receive(self, node: str, queue: str, visibility: float = 30.0) -> str:
        status, doc = self.get(node, f"v1/vhosts/%2F/queues/{queue}/receive?max=1&wait=1&visibility={visibility}",
                               b"POST")
        self.net.clock.advance(0)
        self.assertEqual((status, len(doc["messages"])), (200, 1), doc)
        return doc["messages"][0]["handle"]

    def settle(self, node: str, queue: str, verb: str, handles: list[str], **more: Any) -> Any:
        status, doc = self.get(node, f"v1/vhosts/%2F/queues/{queue}/{verb}", b"POST", {"handles": handles, **more})
        self.assertEqual(status, 200, doc)
        return doc

    def home(self, node: str) -> Any:
        return self.net[node].broker.default_vhost.queues[self.queues[node]]

    def unacked(self, node: str) -> int:
        return sum(len(c.unacked) for c in self.home(node).consumers)

    def test_ack_on_another_node(self) -> None:
        """Received on b, acked on a: done on b, never redelivered."""
        handle = self.receive("b", self.queues["b"])
        self.assertTrue(handle.startswith("b."), handle)
        self.assertEqual(self.unacked("b"), 1)
        doc = self.settle("a", self.queues["b"], "ack", [handle])
        self.assertEqual(doc, {"settled": 1, "unknown": []})
        self.net.clock.advance(60)
        self.assertEqual((len(self.home("b")), self.unacked("b")), (0, 0))
        # Again: it is gone.
        self.assertEqual(self.settle("c", self.queues["b"], "ack", [handle]), {"settled": 0, "unknown": [handle]})

    def test_receiver_on_a_third_node(self) -> None:
        """Received on a from c's queue (a's receiver, through the link),
        acked on b: b asks a, whose receiver acks it to c."""
        handle = self.receive("a", self.queues["c"])
        self.assertTrue(handle.startswith("a."), handle)
        self.assertEqual(self.settle("b", self.queues["c"], "ack", [handle]), {"settled": 1, "unknown": []})
        self.net.settle()
        self.assertEqual((len(self.home("c")), self.unacked("c")), (0, 0))

    def test_nack_on_another_node(self) -> None:
        handle = self.receive("b", self.queues["b"])
        self.assertEqual(self.settle("c", self.queues["b"], "nack", [handle])["settled"], 1)
        self.assertEqual((len(self.home("b")), self.unacked("b")), (1, 0))

    def test_extend_on_another_node(self) -> None:
        """Extended on c: the deadline moves on b; then acked on a."""
        handle = self.receive("b", self.queues["b"], visibility=10)
        self.assertEqual(self.settle("c", self.queues["b"], "extend", [handle], visibility=100)["settled"], 1)
        for _ in range(50):  # the links' heartbeats go on
            self.net.clock.advance(1)
            self.net.settle()
        self.assertEqual((len(self.home("b")), self.unacked("b")), (0, 1))
        self.assertEqual(self.settle("a", self.queues["b"], "ack", [handle])["settled"], 1)
        self.assertEqual(self.unacked("b"), 0)

    def test_another_listener_on_the_same_node(self) -> None:
        """Each call here is another ApiResource (another listener): a
        handle of one is settled by another on the same node."""
        handle = self.receive("a", self.queues["a"])
        self.assertEqual(self.settle("a", self.queues["a"], "ack", [handle]), {"settled": 1, "unknown": []})
        self.assertEqual((len(self.home("a")), self.unacked("a")), (0, 0))

    def test_unknown(self) -> None:
        """Handles of no receiver, of a receiver of another queue, or of a
        node not linked stay unknown; the others are settled."""
        handle = self.receive("b", self.queues["b"])
        other = self.receive("c", self.queues["c"])
        net = self.net
        net["a"].link_to(net["c"]).transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        bogus = ["b.zz.nothing.7", "nope.x.y.1"]
        doc = self.settle("a", self.queues["b"], "ack", [handle, other, *bogus])
        self.assertEqual(doc, {"settled": 1, "unknown": [other, *bogus]})
        self.assertEqual(self.unacked("c"), 1)
        # c's handle named with the wrong queue, asked of b: unknown there.
        self.assertEqual(self.settle("b", self.queues["a"], "ack", [other])["unknown"], [other])

    def test_other_identity(self) -> None:
        """A handle counts only for its receiver's identity."""
        from qmq.web.api.frontend import settle_by_token  # noqa: PLC0415

        handle = self.receive("b", self.queues["b"])
        broker = self.net["b"].broker
        self.assertEqual(settle_by_token(broker, "/", self.queues["b"], ("password", "mallory"), [handle],
                                         True, False), [handle])
        self.assertEqual(settle_by_token(broker, "/", self.queues["b"], None, [handle], True, False), [])
        self.assertEqual(self.unacked("b"), 0)

    def test_bad_request(self) -> None:
        """A malformed http.settle is refused, naming what it needs."""
        d = self.net["a"].mesh.manage.ask("b", "http.settle", {"vhost": "/", "queue": "q", "handles": "x"})
        self.net.settle()
        self.assertIn("http.settle needs", self.failureResultOf(d, PreconditionFailed).value.message)
