"""Tests for L{qmq.cluster.mesh} and L{qmq.cluster.link}: nodes (each a
real core) linked over fake transports, driven by one
L{twisted.internet.task.Clock}: interest flows, messages reach each
interested node exactly once and nowhere else, links keep one per pair,
heart-beats, buffers, reconnects."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from qmq.cluster import wire
from qmq.cluster.endpoints import parse_peer
from qmq.cluster.link import HELLO_TIMEOUT, LinkProtocol
from qmq.cluster.mesh import Mesh
from qmq.cluster.settings import ClusterSettings
from qmq.core.broker import Broker
from qmq.stomp.destinations import DestinationChannel
from tests.test_core_channel import Recorder


class Node:
    """A broker with its mesh (not dialing: the test links nodes) and an
    application channel."""

    def __init__(self, name: str, clock: Clock, **settings: Any) -> None:
        self.name = name
        self.broker = Broker(clock, node=name)
        settings.setdefault("allow_plaintext", True)
        self.mesh = Mesh(self.broker, ClusterSettings(**settings), clock)
        self.mesh.startService()
        self.channel = DestinationChannel(self.broker, self.broker.default_vhost, "app")

    def subscribe(self, destination: str) -> Recorder:
        recorder = Recorder(self.channel, ack_required=False)
        self.channel.subscribe(recorder, destination)
        return recorder

    def publish(self, key: str, body: bytes, exchange: str = "amq.topic") -> Any:
        message = self.channel.make_message(exchange, key, {"h": "v"}, body)
        message.properties = {"correlation_id": "c"}
        self.channel.publish(exchange, key, message)
        return message

    def link_to(self, other: Node) -> LinkProtocol:
        return self.mesh.links[other.name]


class Net:
    """Nodes and the fake connections between them."""

    def __init__(self, *names: str, **settings: Any) -> None:
        self.clock = Clock()
        self.nodes = {n: Node(n, self.clock, **settings) for n in names}
        self.pumps: list[iosim.IOPump] = []

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def connect(self, dialer: str, listener: str, peer: str | None = None) -> tuple[LinkProtocol, LinkProtocol]:
        """C{dialer} dials C{listener}; return (its link, the listener's)."""
        out = LinkProtocol(self[dialer].mesh, True, parse_peer(peer) if peer else None)
        inbound = LinkProtocol(self[listener].mesh, False)
        pump = iosim.connect(
            inbound,
            iosim.FakeTransport(inbound, isServer=True),
            out,
            iosim.FakeTransport(out, isServer=False),
            greet=False,
            clock=self.clock,
        )
        self.pumps.append(pump)
        self.settle()
        return out, inbound

    def full_mesh(self) -> None:
        names = sorted(self.nodes)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self.connect(a, b)

    def settle(self) -> None:
        """Move every byte until nothing moves (bounded)."""
        for _ in range(200):
            moved = False
            for pump in self.pumps:
                moved = pump.pump() or moved
            if not moved:
                return
        raise AssertionError("the network did not settle")


def bodies(recorder: Recorder) -> list[bytes]:
    return [m.body for _, m in recorder.got]


class InterestTests(SynchronousTestCase):
    def test_fanout_exactly_once(self) -> None:
        """Subscribers on b and c, a publisher on a: each gets each message
        once, with its id, headers and properties; b does not pass what it
        got from a on to c."""
        net = Net("a", "b", "c")
        net.full_mesh()
        on_b = net["b"].subscribe("/topic/x")
        on_c = net["c"].subscribe("/topic/x")
        net.settle()
        sent = [net["a"].publish("x", b"m%d" % i) for i in range(10)]
        net.settle()
        self.assertEqual(bodies(on_b), [m.body for m in sent])
        self.assertEqual(bodies(on_c), [m.body for m in sent])
        got = on_c.got[3][1]
        self.assertEqual((got.headers, got.properties, got.timestamp), ({"h": "v"}, {"correlation_id": "c"}, sent[3].timestamp))
        # Each node stamps what it receives with ids of its own, increasing.
        ids = [m.id for _, m in on_c.got]
        self.assertEqual(ids, sorted(ids))
        self.assertGreaterEqual(ids[0], net["c"].broker.message_ids.first)
        self.assertEqual(net["c"].broker.message_ids.last, ids[-1])
        a = net["a"]
        self.assertEqual(a.link_to(net["b"]).messages_out, 10)
        self.assertEqual(a.link_to(net["c"]).messages_out, 10)
        self.assertEqual(net["b"].link_to(net["c"]).messages_out, 0)
        self.assertEqual(net["c"].link_to(net["b"]).messages_out, 0)

    def test_no_traffic_without_interest(self) -> None:
        """Nothing goes to a node without subscribers; interest goes with
        the last subscriber."""
        net = Net("a", "b", "c")
        net.full_mesh()
        first = net["b"].subscribe("/topic/x")
        second = net["b"].subscribe("/topic/x")
        net.settle()
        net["a"].publish("x", b"1")
        net.settle()
        to_b, to_c = net["a"].link_to(net["b"]), net["a"].link_to(net["c"])
        self.assertEqual((to_b.messages_out, to_c.messages_out), (1, 0))
        net["b"].channel.unsubscribe(first)
        net.settle()
        self.assertEqual(list(to_b.remote), [("/", "amq.topic", "x")])
        net["b"].channel.unsubscribe(second)
        net.settle()
        self.assertEqual(to_b.remote, {})
        net["a"].publish("x", b"2")
        net.settle()
        self.assertEqual((to_b.messages_out, to_c.messages_out), (1, 0))
        self.assertEqual(bodies(second), [b"1"])

    def test_overlapping_patterns_one_copy(self) -> None:
        """A peer whose keys match a message several ways gets it once;
        its own subscribers each get their copy."""
        net = Net("a", "b")
        net.full_mesh()
        subs = [net["b"].subscribe(d) for d in ("/topic/x.*", "/topic/x.#", "/topic/#")]
        net.settle()
        net["a"].publish("x.y", b"once")
        net.settle()
        self.assertEqual(net["a"].link_to(net["b"]).messages_out, 1)
        self.assertEqual([bodies(s) for s in subs], [[b"once"]] * 3)

    def test_link_bindings_are_not_local_interest(self) -> None:
        """What a node binds for a peer is not its own interest: it is not
        told to the other peers, and the node's own interest in the same
        key comes and goes by its own subscribers."""
        net = Net("a", "b", "c")
        net.full_mesh()
        net["b"].subscribe("/topic/k")
        net.settle()
        self.assertEqual(net["a"].mesh.local, set())
        self.assertEqual(net["c"].link_to(net["a"]).remote, {})
        own = net["a"].subscribe("/topic/k")
        net.settle()
        key = ("/", "amq.topic", "k")
        self.assertEqual(net["a"].mesh.local, {key})
        self.assertIn(key, net["c"].link_to(net["a"]).remote)
        net["a"].channel.unsubscribe(own)
        net.settle()
        self.assertEqual(net["a"].mesh.local, set())
        self.assertEqual(net["c"].link_to(net["a"]).remote, {})
        self.assertIn(key, net["a"].link_to(net["b"]).remote)

    def test_queue_binding_and_fanout(self) -> None:
        """A queue's binding is interest too, on any propagated exchange
        type (a fanout here)."""
        net = Net("a", "b")
        net.full_mesh()
        vhost = net["b"].broker.default_vhost
        # (Its home is b: a queue is bound on its home node.)
        vhost.declare_queue("q", durable=False, arguments={"x-home-node": "b"})
        vhost.bind("q", "amq.fanout", "")
        net.settle()
        net["a"].publish("any", b"f", exchange="amq.fanout")
        net.settle()
        self.assertEqual(len(vhost.queues["q"]), 1)

    def test_headers_exchange_across_links(self) -> None:
        """A queue bound to a headers exchange on its home gets what is
        published to it on any node, once, as its x-match and arguments
        choose; a node without such bindings gets nothing, and the
        interest goes with the last binding."""
        net = Net("a", "b", "c")
        net.full_mesh()
        vhost = net["b"].broker.default_vhost
        for name in ("all", "any"):
            vhost.declare_queue(name, durable=False, arguments={"x-home-node": "b"})
        vhost.bind("all", "amq.headers", "", {"x-match": "all", "h": "v", "n": 1})
        vhost.bind("any", "amq.headers", "k", {"x-match": "any", "h": "z", "n": 2})
        net.settle()
        self.assertEqual(net["b"].mesh.local, {("/", "amq.headers", "")})
        channel = net["a"].channel
        cases = [
            ({"h": "v", "n": 1}, b"all"),
            ({"h": "v", "n": "1"}, b"all, as text"),
            ({"n": 2}, b"any"),
            ({"h": "v", "n": 2}, b"any, not all"),
            ({"h": "v"}, b"neither"),
            (None, b"no headers"),
        ]
        for headers, body in cases:
            message = channel.make_message("amq.headers", "r", headers, body)
            channel.publish("amq.headers", "r", message)
        net.settle()

        def held(name: str) -> list[bytes]:
            return [m.body for m in vhost.queues[name].messages()]

        self.assertEqual(held("all"), [b"all", b"all, as text"])
        self.assertEqual(held("any"), [b"any", b"any, not all"])
        a = net["a"]
        self.assertEqual(a.link_to(net["b"]).messages_out, len(cases))
        self.assertEqual(a.link_to(net["c"]).messages_out, 0)
        self.assertEqual(net["b"].link_to(net["c"]).messages_out, 0)
        # The last binding's going takes the interest (one of two first).
        vhost.unbind("any", "amq.headers", "k", {"x-match": "any", "h": "z", "n": 2})
        net.settle()
        self.assertIn(("/", "amq.headers", ""), a.link_to(net["b"]).remote)
        vhost.unbind("all", "amq.headers", "", {"x-match": "all", "h": "v", "n": 1})
        net.settle()
        self.assertEqual((net["b"].mesh.local, net["b"].mesh.headers), (set(), {}))
        self.assertEqual(a.link_to(net["b"]).remote, {})
        self.assertEqual(a.mesh.own, {})
        channel.publish("amq.headers", "r", channel.make_message("amq.headers", "r", {"h": "v", "n": 1}, b"late"))
        net.settle()
        self.assertEqual(a.link_to(net["b"]).messages_out, len(cases))

    def test_headers_bindings_on_both_sides(self) -> None:
        """Two nodes with bindings of the same headers exchange: each
        binds the other's interest, which is not its own (its own comes and
        goes with its own bindings), and a message reaches each queue once
        whichever node it is published on."""
        net = Net("a", "b")
        net.full_mesh()
        queues = {}
        for name in ("a", "b"):
            vhost = net[name].broker.default_vhost
            vhost.declare_exchange("hx", "headers")
        net.settle()
        for name in ("a", "b"):
            vhost = net[name].broker.default_vhost
            vhost.declare_queue("q" + name, durable=False, arguments={"x-home-node": name})
            vhost.bind("q" + name, "hx", "", {"to": name})
            queues[name] = vhost.queues["q" + name]
        net.settle()
        key = ("/", "hx", "")
        for name in ("a", "b"):
            self.assertEqual(net[name].mesh.local, {key})
            self.assertEqual(net[name].mesh.own, {key: 1})
        for origin in ("a", "b"):
            channel = net[origin].channel
            for to in ("a", "b"):
                body = f"{origin}->{to}".encode()
                channel.publish("hx", "", channel.make_message("hx", "", {"to": to}, body))
        net.settle()
        # (Each in the order it reached the queue: its own node's first.)
        self.assertEqual([m.body for m in queues["a"].messages()], [b"a->a", b"b->a"])
        self.assertEqual([m.body for m in queues["b"].messages()], [b"b->b", b"a->b"])
        net["a"].broker.default_vhost.unbind("qa", "hx", "", {"to": "a"})
        net.settle()
        self.assertEqual(net["a"].mesh.local, set())
        self.assertEqual(net["b"].link_to(net["a"]).remote, {})
        self.assertEqual(net["a"].mesh.own, {key: 1})

    def test_exchange_declared_later(self) -> None:
        """Interest in an exchange this node does not have waits until it
        is declared (here: told by its peer, qmq.cluster.manage)."""
        net = Net("a", "b")
        net.full_mesh()
        # a does not take the topology b tells it (qmq.cluster.manage): declared here later.
        net["a"].mesh.manage.handlers["exchange.declare"] = lambda link, args: None
        net["b"].broker.default_vhost.declare_exchange("ev", "topic")
        on_b = net["b"].subscribe("/exchange/ev/k")
        net.settle()
        link = net["a"].link_to(net["b"])
        self.assertEqual(link.remote, {("/", "ev", "k"): None})
        net["a"].broker.default_vhost.declare_exchange("ev", "topic")
        net.clock.advance(0)
        net["a"].publish("k", b"late", exchange="ev")
        net.settle()
        self.assertEqual(bodies(on_b), [b"late"])

    def test_resync_on_reconnect(self) -> None:
        """A link that drops takes the peer's bindings with it; the next
        link brings them back (a sync frame) and messages flow again."""
        net = Net("a", "b")
        out, _ = net.connect("a", "b")
        on_b = net["b"].subscribe("/topic/x")
        net.settle()
        self.assertEqual(net["a"].mesh.own, {("/", "amq.topic", "x"): 1})
        out.transport.loseConnection()  # type: ignore[union-attr]
        net.settle()
        self.assertEqual(net["a"].mesh.links, {})
        self.assertEqual(net["a"].mesh.own, {})
        self.assertEqual(net["a"].broker.default_vhost.exchanges["amq.topic"].binding_count, 0)
        net.connect("a", "b")
        net["a"].publish("x", b"again")
        net.settle()
        self.assertEqual(bodies(on_b), [b"again"])


class LinkTests(SynchronousTestCase):
    def test_tie_break(self) -> None:
        """Two links between a and b (both dialed): the one a dialed (the
        smaller name) is kept, at both ends; the other is closed saying so."""
        net = Net("a", "b")
        b_dialed, _ = net.connect("b", "a")
        a_dialed, b_end = net.connect("a", "b")
        net.settle()
        self.assertIs(net["a"].mesh.links["b"], a_dialed)
        self.assertIs(net["b"].mesh.links["a"], b_end)
        self.assertEqual(b_dialed.state, "closed")
        self.assertIn("duplicate link", b_dialed.reason)
        on_b = net["b"].subscribe("/topic/t")
        net.settle()
        net["a"].publish("t", b"one")
        net.settle()
        self.assertEqual(bodies(on_b), [b"one"])
        # The closed link bound nothing: one binding for b's one interest.
        self.assertEqual(net["a"].mesh.own, {("/", "amq.topic", "t"): 1})
        self.assertEqual(net["a"].mesh.all_links, {a_dialed})

    def test_closing_link_takes_nothing(self) -> None:
        """A link being closed is let go at once: its peer's bindings go
        before its transport does, and nothing more is queued on it."""
        net = Net("a", "b")
        out, _ = net.connect("a", "b")
        net["b"].subscribe("/topic/t")
        net.settle()
        self.assertEqual(net["a"].mesh.own, {("/", "amq.topic", "t"): 1})
        out.close("test")
        self.assertEqual(net["a"].mesh.own, {})
        self.assertEqual(net["a"].mesh.links, {})
        net["a"].publish("t", b"late")
        self.assertEqual(out.messages_out, 0)
        net.settle()

    def test_self(self) -> None:
        """A peer entry that reaches this node itself is closed."""
        net = Net("a", "b")
        out, inbound = net.connect("a", "a")
        self.assertEqual(out.state, "closed")
        self.assertIn("itself", out.reason + inbound.reason)
        self.assertEqual(net["a"].mesh.links, {})

    def test_named_peer_mismatch(self) -> None:
        """A peer dialed with node=c that says it is b is refused."""
        net = Net("a", "b")
        out, inbound = net.connect("a", "b", peer="tcp:host=127.0.0.1:port=1:node=c")
        self.assertEqual(out.state, "closed")
        self.assertIn("names node 'c'", out.reason)
        self.assertEqual(net["a"].mesh.links, {})
        self.assertEqual(net["b"].mesh.links, {})

    def test_unlisted_refused(self) -> None:
        """When every peer entry names its node, an inbound node not among
        them is refused."""
        net = Net("a", "b")
        net.nodes["c"] = Node("c", net.clock, peers=("tcp:host=127.0.0.1:port=1:node=a",))
        self.assertEqual(net["c"].mesh.listed, {"a"})
        out, inbound = net.connect("b", "c")
        self.assertEqual(inbound.state, "closed")
        self.assertIn("not one of cluster.peers", inbound.reason)

    def test_refused_dialer_waits(self) -> None:
        """A dialer the peer refused waits 2, then 4 seconds... before it
        dials again (Twisted's backoff starts again with each connection
        made), and a link up resets it."""

        class Dialer:
            running = True
            starts = 0

            def stopService(self) -> None:
                self.running = False

            def startService(self) -> None:
                self.running = True
                self.starts += 1

        net = Net("a")
        net.nodes["c"] = Node("c", net.clock, peers=("tcp:host=127.0.0.1:port=1:node=x",))
        dialer = Dialer()
        for wait in (2.0, 4.0):
            out = LinkProtocol(net["a"].mesh, True, None, dialer)
            inbound = LinkProtocol(net["c"].mesh, False)
            net.pumps.append(iosim.connect(inbound, iosim.FakeTransport(inbound, True), out,
                                           iosim.FakeTransport(out, False), greet=False, clock=net.clock))
            net.settle()
            self.assertIn("refused", out.reason)
            self.assertFalse(dialer.running)
            net.clock.advance(wait - 0.5)
            self.assertFalse(dialer.running)
            net.clock.advance(0.5)
            self.assertTrue(dialer.running)
        self.assertEqual(net["a"].mesh._refusals, {dialer: 2})

    def test_bad_version_and_garbage(self) -> None:
        net = Net("a")
        link = LinkProtocol(net["a"].mesh, False)
        transport = iosim.FakeTransport(link, isServer=True)
        link.makeConnection(transport)
        link.dataReceived(wire.encode_json(wire.HELLO, {"node": "z", "version": 99}))
        self.assertEqual(link.state, "closed")
        self.assertIn("version 99", link.reason)
        link = LinkProtocol(net["a"].mesh, False)
        link.makeConnection(iosim.FakeTransport(link, isServer=True))
        link.dataReceived(wire.encode_json(wire.HELLO, {"node": "z", "version": 2}))
        self.assertIn("link protocol version 2 (this node speaks 4)", link.reason)
        link = LinkProtocol(net["a"].mesh, False)
        link.makeConnection(iosim.FakeTransport(link, isServer=True))
        link.dataReceived(wire.frame(wire.MESSAGE, b"x"))
        self.assertIn("a message before the hello", link.reason)
        link = LinkProtocol(net["a"].mesh, False)
        link.makeConnection(iosim.FakeTransport(link, isServer=True))
        link.dataReceived(b"\xff\xff\xff\xff\x01")
        self.assertIn("protocol error", link.reason)

    def test_hello_deadline(self) -> None:
        net = Net("a")
        link = LinkProtocol(net["a"].mesh, False)
        link.makeConnection(iosim.FakeTransport(link, isServer=True))
        net.clock.advance(HELLO_TIMEOUT - 5)
        self.assertEqual(link.state, "hello")
        net.clock.pump([5] * 3)
        self.assertEqual(link.state, "closed")
        self.assertIn("no hello", link.reason)

    def test_heartbeats(self) -> None:
        """Pings measure the round trip; a peer silent for three
        heart-beats is closed."""
        net = Net("a", "b", heartbeat=1.0)
        out, inbound = net.connect("a", "b")
        for _ in range(5):
            net.clock.advance(1.0)
            net.settle()
        self.assertEqual(out.state, "up")
        self.assertEqual(out.rtt, 0.0)
        net.clock.pump([1.0] * 4)  # nothing pumped: silence
        self.assertEqual(out.state, "closed")
        self.assertIn("heart-beats", out.reason)

    def test_buffer_bound(self) -> None:
        """While the peer does not read, messages wait up to link_buffer
        bytes; past that they are dropped for that peer and counted."""
        net = Net("a", "b", link_buffer=65536)
        out, _ = net.connect("a", "b")
        net["b"].subscribe("/topic/x")
        net.settle()
        out.pauseProducing()
        for _ in range(100):
            net["a"].publish("x", b"x" * 1000)
        net.clock.advance(0)
        self.assertGreater(out.dropped, 0)
        self.assertLessEqual(out.snapshot()["buffered_bytes"], 65536)
        self.assertEqual(out.messages_out + out.dropped, 100)
        out.resumeProducing()
        net.settle()
        self.assertEqual(net["b"].link_to(net["a"]).messages_in, out.messages_out)

    def test_registered_and_shut_down(self) -> None:
        """An accepted link is counted in the connection registry (its
        caps, the broker's shutdown): the shutdown closes it, saying why."""
        from qmq.cluster.mesh import LinkFactory  # noqa: PLC0415
        from qmq.connections import ConnectionRegistry, ConnectionSettings  # noqa: PLC0415

        net = Net("a")
        registry = ConnectionRegistry(ConnectionSettings(), net.clock)
        link = LinkFactory(net["a"].mesh, registry, "peer:tcp:0").buildProtocol(None)
        assert link is not None
        link.makeConnection(iosim.FakeTransport(link, isServer=True))
        self.assertEqual(list(registry.connections("peer:tcp:0")), [link])
        registry.shutdown("broker shutting down", 1.0)
        self.assertEqual(link.reason, "broker shutting down")
        self.assertIn(b"broker shutting down", link.transport.getOutBuffer())  # type: ignore[union-attr]
        link.connectionLost(None)
        self.assertEqual(list(registry.connections()), [])

    def test_metrics(self) -> None:
        """/metrics shows each link up, by peer."""
        from types import SimpleNamespace  # noqa: PLC0415

        from qmq.web.metrics import BrokerCollector  # noqa: PLC0415

        net = Net("a", "b")
        net.full_mesh()
        net["b"].subscribe("/topic/x")
        net.settle()
        net["a"].broker.mesh = net["a"].mesh  # as mesh_of sets it
        net["a"].publish("x", b"abc")
        net.settle()
        families = {f.name: f for f in BrokerCollector(SimpleNamespace(broker=net["a"].broker)).collect()}
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families["qmq_link_messages"].samples}
        self.assertEqual(samples[("qmq_link_messages_total", (("direction", "out"), ("peer", "b")))], 1)
        self.assertEqual(samples[("qmq_link_messages_total", (("direction", "in"), ("peer", "b")))], 0)
        self.assertEqual([s.value for s in families["qmq_link_up"].samples], [1])

    def test_snapshot(self) -> None:
        net = Net("a", "b")
        net.full_mesh()
        net["b"].subscribe("/topic/x")
        net.settle()
        net["a"].publish("x", b"abc")
        net.settle()
        (link,) = net["a"].mesh.snapshot()
        self.assertEqual(link["node"], "b")
        self.assertEqual(link["state"], "up")
        self.assertEqual(link["messages_out"], 1)
        self.assertGreater(link["bytes_out"], 3)
        self.assertEqual(link["peer_interest"], ["//amq.topic/x"])


class DiscoveryTests(SynchronousTestCase):
    def test_one_peer_is_enough(self) -> None:
        """b and c each know only a: a tells each of the other (their
        advertised endpoints), each dials the other, and the mesh is
        full."""
        net = Net("a")
        for i, name in enumerate("bc"):
            net.nodes[name] = Node(name, net.clock, advertise=f"tcp:host=127.0.0.1:port={7001 + i}")
        dialed: dict[str, list[Any]] = {"b": [], "c": []}
        for name in "bc":
            net[name].mesh.dial = dialed[name].append  # type: ignore[method-assign]
        net.connect("b", "a")
        net.connect("c", "a")
        self.assertEqual([(p.node, p.port) for p in dialed["c"]], [("b", 7001)])
        self.assertEqual([(p.node, p.port) for p in dialed["b"]], [("c", 7002)])
        self.assertEqual(net["a"].mesh.known, {"b": "tcp:host=127.0.0.1:port=7001", "c": "tcp:host=127.0.0.1:port=7002"})
        # What the dialers would do: b dials c; a message from b to c goes direct.
        net.connect("b", "c")
        on_c = net["c"].subscribe("/topic/d")
        net.settle()
        net["b"].publish("d", b"direct")
        net.settle()
        self.assertEqual(bodies(on_c), [b"direct"])
        self.assertEqual(net["b"].link_to(net["c"]).messages_out, 1)
        self.assertEqual(net["a"].link_to(net["c"]).messages_in, 0)

    def test_learned_checked(self) -> None:
        """What a peer tells is checked: no tcp: endpoint without
        allow_plaintext, nothing that is not an endpoint, not this node."""
        net = Net("a", "b")
        out, _ = net.connect("a", "b")
        dialed: list[Any] = []
        net["a"].mesh.dial = dialed.append  # type: ignore[method-assign]
        net["a"].mesh.settings = ClusterSettings(allow_plaintext=False)
        net["a"].mesh.learned(out, [["x", "tcp:host=h:port=1"], ["y", "unix:/x"], ["a", "ssl:host=h:port=1"]])
        self.assertEqual((dialed, net["a"].mesh.known), ([], {}))

    def test_announced(self) -> None:
        """Links up and down are announced on /topic/system.peers."""
        import json  # noqa: PLC0415

        net = Net("a", "b")
        watcher = net["a"].subscribe("/topic/system.peers")
        out, _ = net.connect("a", "b")
        out.close("test")
        net.settle()
        got = [json.loads(m.body) for _, m in watcher.got]
        self.assertEqual(
            [(e["node"], e["peer"], e["event"], e["links"]) for e in got],
            [("a", "b", "up", ["b"]), ("a", "b", "down", [])],
        )



class BatchTests(SynchronousTestCase):
    def test_a_turn_in_one_frame_per_virtual_host(self) -> None:
        """A turn's fan-out messages for a link share one message frame
        while their virtual host is the same; another virtual host starts
        another; each arrives in its own virtual host, in order."""
        net = Net("a", "b")
        for node in ("a", "b"):
            net[node].broker.add_vhost("v2")
        out, inbound = net.connect("a", "b")
        on_b = net["b"].subscribe("/topic/x")
        other = DestinationChannel(net["b"].broker, net["b"].broker.vhosts["v2"], "app2")
        on_v2 = Recorder(other, ack_required=False)
        other.subscribe(on_v2, "/topic/x")
        net.settle()
        seen: list[int] = []
        handle = inbound._frame

        def recording(type_: int, buffer: bytes, start: int, end: int) -> None:
            seen.append(type_)
            handle(type_, buffer, start, end)

        inbound._frame = recording  # type: ignore[method-assign]
        sender = DestinationChannel(net["a"].broker, net["a"].broker.vhosts["v2"], "app")
        for i in range(5):
            net["a"].publish("x", b"d%d" % i)
        for i in range(3):
            sender.publish("amq.topic", "x", sender.make_message("amq.topic", "x", None, b"v%d" % i))
        net["a"].publish("x", b"d5")
        net.settle()
        self.assertEqual(seen, [wire.MESSAGE] * 3)
        self.assertEqual(bodies(on_b), [b"d%d" % i for i in range(6)])
        self.assertEqual(bodies(on_v2), [b"v0", b"v1", b"v2"])
        self.assertEqual(inbound.messages_in, 9)
        self.assertEqual(out.messages_out, 9)
