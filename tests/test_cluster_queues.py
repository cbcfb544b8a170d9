"""Tests for queues across nodes (L{qmq.core.remote}, L{qmq.cluster.queues},
L{qmq.cluster.placement}): nodes, each a real core, linked over fake
transports and driven by one L{twisted.internet.task.Clock}."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from qmq.cluster import wire
from qmq.cluster.placement import Placement, rendezvous
from qmq.core.broker import Broker
from qmq.core.channel import Channel
from qmq.core.errors import AccessRefused, PreconditionFailed, ResourceLocked
from qmq.core.management import Management
from qmq.core.ownership import durable_queue_name, marked_node, owned_token
from qmq.core.remote import RemoteQueue, Unavailable, home_of
from qmq.stomp.destinations import DestinationChannel
from tests.test_cluster_mesh import Net
from tests.test_core_channel import Recorder


def homed(net: Net, node: str, prefix: str = "q") -> str:
    """A queue name whose home is C{node} in C{net}'s membership."""
    members = sorted(net.nodes)
    for i in range(1000):
        name = f"{prefix}{i}"
        if rendezvous("/", name, members) == node:
            return name
    raise AssertionError("no name found")


def channel(net: Net, node: str) -> Channel:
    return net[node].channel


def send(net: Net, node: str, queue: str, body: bytes, persistent: bool = False) -> Any:
    """A STOMP-like SEND to /queue/QUEUE on C{node}: the durability answer."""
    ch = channel(net, node)
    target = ch.send_target("/queue/" + queue)
    return ch.publish_target(target, ch.new_message(target, {"h": "v"}, body, persistent))


def consume(net: Net, node: str, queue: str, ack: bool = True, prefetch: int | None = None) -> Recorder:
    ch = channel(net, node)
    recorder = Recorder(ch, ack_required=ack, prefetch=prefetch)
    ch.subscribe(recorder, "/queue/" + queue)
    return recorder


class PlacementTests(SynchronousTestCase):
    def test_rendezvous_is_stable_and_spreads(self) -> None:
        """The same name goes to the same node whatever the order of the
        members; names spread over them; a node added takes about 1/n and
        moves nothing between the others."""
        three = ["a", "b", "c"]
        homes = {f"q{i}": rendezvous("/", f"q{i}", three) for i in range(3000)}
        self.assertEqual(homes, {n: rendezvous("/", n, list(reversed(three))) for n in homes})
        counts = {m: list(homes.values()).count(m) for m in three}
        self.assertTrue(all(800 < c < 1200 for c in counts.values()), counts)
        four = {n: rendezvous("/", n, [*three, "d"]) for n in homes}
        moved = [n for n in homes if four[n] != homes[n]]
        self.assertTrue(all(four[n] == "d" for n in moved))
        self.assertTrue(600 < len(moved) < 900, len(moved))
        # The virtual host is part of the key.
        self.assertNotEqual(
            [rendezvous("/", f"q{i}", three) for i in range(50)],
            [rendezvous("other", f"q{i}", three) for i in range(50)],
        )

    def test_home_argument(self) -> None:
        placement = Placement("a", lambda: ["b", "c"])
        self.assertEqual(placement.members(), ["a", "b", "c"])
        self.assertEqual(placement.home("/", "q", {"x-home-node": "z"}), "z")
        self.assertEqual(placement.home("/", "q", {"home-node": "c"}), "c")
        self.assertEqual(placement.home("/", "q"), rendezvous("/", "q", ["a", "b", "c"]))
        with self.assertRaises(PreconditionFailed) as e:
            placement.home("/", "q", {"x-home-node": "no such/node"})
        self.assertIn("x-home-node must be a node id", e.exception.message)

    def test_another_policy(self) -> None:
        """Any object with home(vhost, name) places queues (the workers pass
        a Placement over their fixed list); x-home-node still wins over it."""
        from twisted.internet.task import Clock  # noqa: PLC0415

        from qmq.cluster.mesh import Mesh  # noqa: PLC0415
        from qmq.cluster.settings import ClusterSettings  # noqa: PLC0415
        from qmq.core.broker import Broker  # noqa: PLC0415

        class ByLength:
            def home(self, vhost: str, name: str) -> str:
                return ["w0", "w1", "w2"][len(name) % 3]

        policy = ByLength()
        mesh = Mesh(Broker(Clock(), node="w0"), ClusterSettings(allow_plaintext=True), Clock(), placement=policy)
        for name in ("q", "qq", "qqq", "qqqq"):
            expected = policy.home("/", name)
            self.assertEqual(mesh.queues.home("/", name, None), None if expected == "w0" else expected)
        self.assertEqual(mesh.queues.home("/", "qq", {"x-home-node": "w9"}), "w9")

    def test_membership_is_configured_not_linked(self) -> None:
        """Named peers count while they are down; so do nodes seen once."""
        net = Net("a", "b", peers=["tcp:host=127.0.0.1:port=1:node=z"])
        mesh = net["a"].mesh
        self.assertEqual(mesh.queues.placement.members(), ["a", "z"])
        net.connect("a", "b")
        self.assertEqual(mesh.queues.placement.members(), ["a", "b", "z"])
        for pump in net.pumps:
            pump.server.transport.loseConnection()
        net.settle()
        self.assertNotIn("b", mesh.links)
        self.assertEqual(mesh.queues.placement.members(), ["a", "b", "z"])


class ForwardTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()
        self.q = homed(self.net, "b")

    def test_send_forwarded_confirmed(self) -> None:
        """A SEND on a reaches the queue on b; its answer fires only once
        b confirmed; a's queue is a stand-in naming its home."""
        net, q = self.net, self.q
        answer = send(net, "a", q, b"one")
        self.assertIsInstance(answer, Deferred)
        self.assertFalse(answer.called)
        net.settle()
        self.assertTrue(answer.called)
        self.successResultOf(answer)
        here = net["a"].broker.default_vhost.queues[q]
        self.assertIsInstance(here, RemoteQueue)
        self.assertEqual((home_of(here), len(here)), ("b", 0))
        home = net["b"].broker.default_vhost.queues[q]
        self.assertNotIsInstance(home, RemoteQueue)
        self.assertEqual(home_of(home), "b")
        self.assertEqual([m.body for m in home.messages()], [b"one"])
        self.assertEqual(home.messages()[0].headers, {"h": "v"})
        # c knows nothing of it until one of its clients names it.
        self.assertNotIn(q, net["c"].broker.default_vhost.queues)

    def test_amqp_style_publish_to_default_exchange(self) -> None:
        """Channel.publish to the default exchange with the queue's name
        (AMQP, HTTP) is forwarded too, the stand-in made on the way."""
        net, q = self.net, self.q
        ch = channel(net, "c")
        message = ch.make_message("", q, None, b"p")
        published = ch.publish("", q, message)
        self.assertEqual(published.routed, 1)
        net.settle()
        self.successResultOf(published.durable)
        self.assertEqual(len(net["b"].broker.default_vhost.queues[q]), 1)

    def test_home_down_refused(self) -> None:
        """No link to the home: the publish is refused at once, clearly."""
        net = self.net
        q = homed(net, "b", "r")
        for pump in list(net.pumps):
            if {pump.client.mesh.node, pump.server.mesh.node} == {"a", "b"}:
                pump.client.transport.loseConnection()
        net.settle()
        self.assertNotIn("b", net["a"].mesh.links)
        with self.assertRaises(Unavailable) as e:
            send(net, "a", q, b"x")
        self.assertIn("lives on node 'b', which is down or not linked", e.exception.message)
        self.assertEqual(e.exception.code, 404)
        with self.assertRaises(Unavailable):
            consume(net, "a", q)
        self.assertEqual(channel(net, "a").consumers, set())

    def test_link_lost_before_confirm(self) -> None:
        """The link goes with a forward unconfirmed: the answer fails, the
        publisher hears it may not be there."""
        net, q = self.net, self.q
        answer = send(net, "a", q, b"x")
        net["a"].link_to(net["b"]).close("test")
        f = self.failureResultOf(answer, Unavailable)
        self.assertIn("went down before it confirmed", f.getErrorMessage())

    def test_refused_on_home(self) -> None:
        """A refusal on the home (a full queue rejecting publishes) comes
        back as a failed answer with its code."""
        net, q = self.net, self.q
        net["b"].broker.default_vhost.declare_queue(
            q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        self.successResultOf(self._sent(send(net, "a", q, b"1")))
        answer = send(net, "a", q, b"2")
        net.settle()
        f = self.failureResultOf(answer)
        self.assertEqual(f.value.code, 506)
        self.assertIn("node 'b' refused it", f.getErrorMessage())
        self.assertEqual(net["b"].link_to(net["a"]).refused, 1)

    def _sent(self, d: Deferred) -> Deferred:
        self.net.settle()
        return d

    def test_refusals_inside_a_batch(self) -> None:
        """One forward frame whose publishes the home takes, refuses, then
        takes again (a queue of 3 rejecting publishes, a consumer taking
        none): each answer is its own, in order."""
        net, q = self.net, self.q
        net["b"].broker.default_vhost.declare_queue(
            q, arguments={"x-max-length": 3, "x-overflow": "reject-publish"}
        )
        other = homed(net, "b", prefix="other")
        answers = [send(net, "a", q, b"%d" % i) for i in range(5)] + [send(net, "a", other, b"x")]
        net.settle()
        for d in answers[:3] + answers[5:]:
            self.assertIsNone(self.successResultOf(d))
        for d in answers[3:5]:
            self.assertEqual(self.failureResultOf(d).value.code, 506)
        self.assertEqual(net["a"].link_to(net["b"]).snapshot()["unconfirmed"], 0)

    def test_arguments_reach_the_home(self) -> None:
        """A queue declared with arguments on a node that is not its home
        (AMQP's queue.declare): the home makes it with them, now or when
        the link comes up; one it has with other arguments is kept, and
        the disagreement logged."""
        net = self.net
        q = homed(net, "b", "args")
        channel(net, "a").declare_queue(q, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
        net.settle()
        home = net["b"].broker.default_vhost.queues[q]
        self.assertEqual(home.policy.max_length, 3)
        for i in range(3):
            send(net, "a", q, b"%d" % i)
        answer = send(net, "a", q, b"full")
        net.settle()
        self.assertEqual(self.failureResultOf(answer).value.code, 506)
        # Other arguments on c: b keeps its own (and logs it).
        from twisted.logger import globalLogPublisher  # noqa: PLC0415

        logged: list[str] = []
        observer = lambda event: logged.append(str(event.get("log_format", "")))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        channel(net, "c").declare_queue(q, arguments={"x-max-length": 5})
        net.settle()
        self.assertEqual(home.policy.max_length, 3)
        self.assertTrue(any("declared queue {queue!r} here" in line for line in logged), logged)
        # Declared while b is not linked: told when the link is up.
        later = homed(net, "b", "later")
        net["a"].link_to(net["b"]).close("test")
        net.settle()
        channel(net, "a").declare_queue(later, arguments={"x-max-priority": 5})
        self.assertNotIn(later, net["b"].broker.default_vhost.queues)
        net.connect("a", "b")
        self.assertEqual(net["b"].broker.default_vhost.queues[later].policy.max_priority, 5)

    def test_stand_in_lookup(self) -> None:
        """VirtualHost.stand_in: a stand-in for a name homed elsewhere, made
        once; None for a name homed here, a local queue, or no valid name
        (a default-exchange publish to it stays unroutable)."""
        net = self.net
        vhost = net["a"].broker.default_vhost
        away, here = homed(net, "b", "s"), homed(net, "a", "s")
        made = vhost.stand_in(away)
        self.assertIsInstance(made, RemoteQueue)
        self.assertIs(vhost.stand_in(away), made)
        self.assertIsNone(vhost.stand_in(here))
        self.assertNotIn(here, vhost.queues)
        vhost.declare_queue(here)
        self.assertIsNone(vhost.stand_in(here))
        self.assertIsNone(vhost.stand_in(""))
        self.assertIsNone(vhost.stand_in("x" * 1000))
        ch = channel(net, "a")
        self.assertEqual(ch.publish("", "", ch.make_message("", "", None, b"x")).routed, 0)
        # Definitions are the home's to export.
        from qmq.core.definitions import export_definitions  # noqa: PLC0415

        names = [q["name"] for q in export_definitions(net["a"].broker)["queues"]]
        self.assertEqual((away in names, here in names), (False, True))

    def test_bind_and_get_refused(self) -> None:
        net, q = self.net, self.q
        send(net, "a", q, b"x")
        vhost = net["a"].broker.default_vhost
        with self.assertRaises(PreconditionFailed) as e:
            vhost.bind(q, "amq.topic", "k")
        self.assertIn("lives on node 'b'", e.exception.message)
        # A get is carried to the home (tests.test_workers_manage).
        self.assertIsInstance(channel(net, "a").get(q), Deferred)

    def test_home_named_by_argument_or_defaults(self) -> None:
        """x-home-node (a SUBSCRIBE header's argument, as STOMP passes it)
        wins over the hash; so does the virtual host's queue_defaults."""
        net = self.net
        q = homed(net, "b", "pin")
        ch = channel(net, "a")
        ch.subscribe(Recorder(ch), "/queue/" + q, arguments={"x-home-node": "c"})
        self.assertEqual(net["a"].broker.default_vhost.queues[q].home, "c")
        net.settle()
        self.assertIn(q, net["c"].broker.default_vhost.queues)
        self.assertNotIn(q, net["b"].broker.default_vhost.queues)
        vhost = net["a"].broker.default_vhost
        vhost.set_queue_defaults({"x-home-node": "c"})
        other = homed(net, "b", "dflt")
        send(net, "a", other, b"x")
        self.assertEqual(vhost.queues[other].home, "c")
        with self.assertRaises(PreconditionFailed):
            ch.subscribe(Recorder(ch), "/queue/bad", arguments={"x-home-node": "a/b"})

    def test_private_queues_stay_local(self) -> None:
        """amq. queues, exclusive ones: on their client's node."""
        net = self.net
        vhost = net["a"].broker.default_vhost
        for name in ("amq.gen-1", "amq.tmp.x.y"):
            self.assertIsNone(net["a"].mesh.queues.home("/", name, None))
        q = homed(net, "b", "e")
        ch = channel(net, "a")
        queue = ch.declare_queue(q, exclusive=True)
        self.assertNotIsInstance(queue, RemoteQueue)
        self.assertIs(vhost.queues[q], queue)


class ConnectionQueuesTests(SynchronousTestCase):
    """A connection's own queues (reply queues) live on its node; a reply
    published on any node reaches them there: the broker's names for them
    mark the node (amq.gen-NODE:...), and a queue exclusive to a connection
    is told to every node, whatever the placement says of its name."""

    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()
        self.b_conn = Channel(self.net["b"].broker, self.net["b"].broker.default_vhost, "requester")

    def vhost(self, node: str) -> Any:
        return self.net[node].broker.default_vhost

    def reply(self, node: str, queue: str, body: bytes) -> Any:
        """A responder on C{node} publishes to the default exchange."""
        ch = channel(self.net, node)
        answer = ch.publish("", queue, ch.make_message("", queue, None, body)).durable
        self.net.settle()
        return answer

    def test_names_mark_their_node(self) -> None:
        token = owned_token(self.net["b"].broker)
        self.assertTrue(token.startswith("b:"), token)
        self.assertEqual(marked_node(f"amq.gen-{token}"), "b")
        self.assertEqual(marked_node(f"amq.tmp.{token}.answers"), "b")
        self.assertEqual(marked_node(f"amq.rabbitmq.reply-to.{token}"), "b")
        for name in ("amq.gen-1", "amq.gen-:x", "amq.gen-a/b:x", "q1", "durable.x.y", "amq.other-b:x"):
            self.assertIsNone(marked_node(name), name)
        self.assertEqual(self.net["a"].mesh.queues.home("/", f"amq.gen-{token}", None), "b")
        self.assertIsNone(self.net["b"].mesh.queues.home("/", f"amq.gen-{token}", None))
        self.assertFalse(owned_token(Broker(self.net.clock)).count(":"))  # no mesh, no mark

    def test_reply_to_a_server_named_queue(self) -> None:
        name = f"amq.gen-{owned_token(self.net['b'].broker)}"
        queue = self.b_conn.declare_queue(name, exclusive=True)
        self.successResultOf(self.reply("a", name, b"pong"))
        self.assertEqual([m.body for m in queue.messages()], [b"pong"])
        self.assertIsInstance(self.vhost("a").queues[name], RemoteQueue)

    def test_reply_to_a_client_named_exclusive_queue(self) -> None:
        """Named so that c is its home by placement, declared exclusive on
        b: a learns it is b's; a reply from a reaches b, c makes nothing.
        When its connection closes, a forgets it, and its stand-in goes."""
        name = homed(self.net, "c", "replies")
        queue = self.b_conn.declare_queue(name, exclusive=True)
        self.net.settle()
        self.assertEqual(self.net["a"].mesh.queues.owned, {("/", name): "b"})
        self.successResultOf(self.reply("a", name, b"pong"))
        self.assertEqual([m.body for m in queue.messages()], [b"pong"])
        self.assertNotIn(name, self.vhost("c").queues)
        self.b_conn.close()
        self.net.settle()
        self.assertEqual(self.net["a"].mesh.queues.owned, {})
        self.assertNotIn(name, self.vhost("a").queues)

    def test_stand_in_made_before_the_news_goes(self) -> None:
        """a published to the name before b's connection declared it (a
        stand-in to c, by placement): when b tells, that stand-in goes, and
        the next reply reaches b."""
        name = homed(self.net, "c", "early")
        self.successResultOf(self.reply("a", name, b"early"))
        self.assertEqual(self.vhost("a").queues[name].home, "c")
        queue = self.b_conn.declare_queue(name + "", exclusive=True)
        self.net.settle()
        self.assertNotIn(name, self.vhost("a").queues)
        self.successResultOf(self.reply("a", name, b"pong"))
        self.assertEqual([m.body for m in queue.messages()], [b"pong"])

    def test_told_again_when_linked_again(self) -> None:
        name = homed(self.net, "c", "relinked")
        self.b_conn.declare_queue(name, exclusive=True)
        self.net.settle()
        self.net["a"].link_to(self.net["b"]).close("cut")
        self.net.settle()
        self.assertEqual(self.net["a"].mesh.queues.owned, {})
        self.net.connect("a", "b")
        self.assertEqual(self.net["a"].mesh.queues.owned, {("/", name): "b"})

    def test_gone_is_not_made_again(self) -> None:
        """A reply that reaches b after the queue went with its connection
        (a had not heard yet) is refused there, naming why; b makes no
        queue of a name placed elsewhere."""
        name = homed(self.net, "c", "gone")
        self.net["a"].mesh.queues.owned[("/", name)] = "b"  # b's notice not heard yet
        failure = self.failureResultOf(self.reply("a", name, b"late"))
        self.assertIn("not its home by placement", failure.getErrorMessage())
        self.assertNotIn(name, self.vhost("b").queues)
        self.assertNotIn(name, self.vhost("c").queues)

    def test_one_exclusive_queue_of_a_name(self) -> None:
        """b's connection holds a name exclusively: a's connections cannot
        declare it, exclusive or not (RabbitMQ's 405), though they may
        publish to it."""
        name = homed(self.net, "c", "mine")
        self.b_conn.declare_queue(name, exclusive=True)
        self.net.settle()
        a = channel(self.net, "a")
        for declare in (lambda: a.declare_queue(name, exclusive=True),
                        lambda: Management(self.vhost("a")).declare_queue(name)):
            with self.assertRaises(ResourceLocked) as e:
                declare()
            self.assertIn("connection on node 'b'", e.exception.message)
        self.successResultOf(self.reply("a", name, b"still"))

    def test_exclusive_elsewhere_is_locked(self) -> None:
        """A consume or passive declare on a of b's connection's queue:
        405, before anything is attached."""
        name = homed(self.net, "c", "locked")
        self.b_conn.declare_queue(name, exclusive=True)
        self.net.settle()
        found = channel(self.net, "a").find_queue(name)
        self.net.settle()
        self.assertEqual(self.failureResultOf(found, ResourceLocked).value.code, 405)


class DurableSubscriptionTests(SynchronousTestCase):
    """A durable subscription's queue is placed as any queue (its client may
    come back through any node): declared and bound on its home, consumed
    from any node; what is kept while its client is away waits there."""

    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()
        # A subscription whose queue, durable.app.NAME, is homed on b.
        self.sub = next(f"s{i}" for i in range(1000)
                        if rendezvous("/", durable_queue_name("app", f"s{i}"), ["a", "b", "c"]) == "b")
        self.name = durable_queue_name("app", self.sub)

    def subscribe(self, node: str) -> Recorder:
        ch = channel(self.net, node)
        recorder = Recorder(ch)
        ch.consume(recorder, exchange="amq.topic", pattern="t.#", durable_name=self.sub)
        self.net.settle()
        return recorder

    def publish(self, node: str, *bodies: bytes) -> None:
        for body in bodies:
            self.net[node].publish("t.x", body)
        self.net.settle()

    def home(self) -> Any:
        return self.net["b"].broker.default_vhost.queues.get(self.name)

    def test_declared_and_bound_on_its_home(self) -> None:
        on_a = self.subscribe("a")
        home = self.home()
        self.assertIsNotNone(home)
        self.assertEqual((home.remote, home.subscription, home.durable), (None, True, True))
        self.assertEqual([(e.name, k) for e, k, _ in home.bindings], [("amq.topic", "t.#")])
        self.assertIsInstance(self.net["a"].broker.default_vhost.queues[self.name], RemoteQueue)
        self.publish("c", b"1", b"2")
        self.assertEqual(on_a.bodies(), [b"1", b"2"])

    def test_back_through_another_node(self) -> None:
        """Away (a plain unsubscribe on a), messages are kept on b; the
        client comes back through c and gets them, then what follows."""
        on_a = self.subscribe("a")
        channel(self.net, "a").unsubscribe(on_a)
        self.net.settle()
        self.publish("a", b"kept-1", b"kept-2")
        self.assertEqual(len(self.home()), 2)
        on_c = self.subscribe("c")
        self.publish("b", b"after")
        self.assertEqual(on_c.bodies(), [b"kept-1", b"kept-2", b"after"])
        self.assertEqual(on_a.bodies(), [])

    def test_durable_unsubscribe_deletes_it_on_its_home(self) -> None:
        on_c = self.subscribe("c")
        channel(self.net, "c").unsubscribe(on_c, delete_durable=True)
        self.net.settle()
        self.assertIsNone(self.home())
        self.assertNotIn(self.name, self.net["c"].broker.default_vhost.queues)
        self.publish("a", b"nobody")
        self.assertIsNone(self.home())

    def test_another_owner_refused_where_it_asks(self) -> None:
        self.subscribe("a")
        stranger = DestinationChannel(self.net["c"].broker, self.net["c"].broker.default_vhost, "mallory")
        with self.assertRaises(AccessRefused):
            stranger.subscribe(Recorder(stranger), "/queue/" + self.name)
        with self.assertRaises(AccessRefused):
            stranger.send_target("/queue/" + self.name)

    def test_made_before_it_was_placed_stays_and_is_found(self) -> None:
        """A subscription's queue that a keeps (recovered from its log, made
        before subscriptions were placed) is pinned there: told to every
        node, so the client coming back through c finds it on a."""
        vhost = self.net["a"].broker.default_vhost
        with self.net["a"].mesh.queues.here():
            old = vhost.declare_queue(self.name, durable=True, on_demand=True, subscription=True)
        vhost.bind(self.name, "amq.topic", "t.#")
        self.net["a"].mesh.queues.place_existing()
        self.net.settle()
        self.assertEqual(self.net["c"].mesh.queues.owned, {("/", self.name): "a"})
        on_c = self.subscribe("c")
        self.publish("b", b"x")
        self.assertEqual(on_c.bodies(), [b"x"])
        self.assertIsNone(self.home())
        self.assertEqual(len(old.consumers), 1)


class ControlCountTests(SynchronousTestCase):
    """STOMP's /control/ counts of a queue homed on another node: its
    home's, asked there (0 for a queue nobody has, as for one here)."""

    def test_counts_from_the_home(self) -> None:
        net = Net("a", "b")
        net.full_mesh()
        q = homed(net, "b", "counted")
        for body in (b"1", b"2"):
            send(net, "b", q, body)
        consume(net, "b", q, prefetch=1)
        net.settle()
        ch = channel(net, "a")
        answers = [ch.control(f"count-msgs/queue/{q}"), ch.control(f"count-subscribers/queue/{q}"),
                   ch.control(f"count-msgs/queue/{homed(net, 'b', 'nobody')}")]
        net.settle()
        self.assertEqual([self.successResultOf(d) for d in answers],
                         [[("num-messages", "1")], [("num-subscribers", "1")], [("num-messages", "0")]])
        net["a"].link_to(net["b"]).close("cut")
        net.settle()
        self.failureResultOf(ch.control(f"count-msgs/queue/{q}"), Unavailable)


class ConsumeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = Net("a", "b", "c")
        self.net.full_mesh()
        self.q = homed(self.net, "b")

    def home_queue(self) -> Any:
        return self.net["b"].broker.default_vhost.queues[self.q]

    def test_remote_consumer_with_acks(self) -> None:
        """A consumer on a of a queue homed on b, messages sent on c: each
        delivered once, unacked on b until a's client acks."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        for i in range(5):
            send(net, "c", q, b"m%d" % i)
        net.settle()
        self.assertEqual(on_a.bodies(), [b"m%d" % i for i in range(5)])
        home = self.home_queue()
        (remote,) = home.consumers
        self.assertEqual(len(remote.unacked), 5)
        ch = channel(net, "a")
        ch.settle(on_a.got[2][0], multiple=True)
        net.settle()
        self.assertEqual(len(remote.unacked), 2)
        # A nack with requeue: back on b, delivered again (redelivered).
        ch.settle(on_a.got[3][0], ack=False, requeue=True)
        net.settle()
        self.assertEqual(on_a.bodies()[-1], b"m3")
        self.assertEqual(on_a.got[-1][1].delivery_count, 1)
        ch.settle(0, multiple=True)
        net.settle()
        self.assertEqual((len(remote.unacked), len(home)), (0, 0))
        self.assertEqual(net["b"].link_to(net["a"]).snapshot()["peer_consumers"], 1)
        answer = send(net, "c", q, b"later")
        self.assertEqual(net["c"].link_to(net["b"]).snapshot()["unconfirmed"], 1)
        net.settle()
        self.successResultOf(answer)
        self.assertEqual(net["c"].link_to(net["b"]).snapshot()["unconfirmed"], 0)

    def test_window_is_the_prefetch(self) -> None:
        """A consumer with prefetch 2: the home hands out 2 at a time; acks
        open the window again."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q, prefetch=2)
        for i in range(10):
            send(net, "b", q, b"m%d" % i)
        net.settle()
        self.assertEqual(len(on_a.got), 2)
        self.assertEqual(len(self.home_queue()), 8)
        ch = channel(net, "a")
        ch.settle(on_a.got[1][0], multiple=True)
        net.settle()
        self.assertEqual(len(on_a.got), 4)

    def test_auto_ack_takes_credit_in_batches(self) -> None:
        """An auto-ack consumer: the home tracks nothing (its consumer there
        does not ack, each delivery leaves the queue as it goes); what the
        client got gives the home its credit back, all of a turn's in one
        credit run."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q, ack=False)
        net.settle()
        queues = net["b"].mesh.queues
        frames: list[list[tuple[int, int, int, int]]] = []
        settled = queues.settled

        def counting(link: Any, runs: Any) -> None:
            frames.append(list(runs))
            settled(link, runs)

        queues.settled = counting  # type: ignore[method-assign]
        for _i in range(100):
            send(net, "b", q, b"x")
        net.settle()
        self.assertEqual(len(on_a.got), 100)
        (remote,) = self.home_queue().consumers
        self.assertFalse(remote.ack_required)
        self.assertEqual(len(remote.unacked), 0)
        self.assertEqual(len(self.home_queue()), 0)
        self.assertEqual(len(frames), 1)
        ((sub, first, count, outcome),) = frames[0]
        self.assertEqual((first, count, outcome), (0, 100, wire.CREDIT))
        self.assertEqual(remote.credit, remote.prefetch)

    def test_auto_ack_window_is_credit(self) -> None:
        """Without acks the window still bounds what is out: a paused client
        holds at most the window on its node, the rest waits on the home,
        and all comes once it resumes."""
        net = Net("a", "b", remote_window=5)
        net.full_mesh()
        q = homed(net, "b")
        on_a = consume(net, "a", q, ack=False)
        net.settle()
        ch = channel(net, "a")
        ch.pause()
        for i in range(20):
            send(net, "b", q, b"m%d" % i)
        net.settle()
        home = net["b"].broker.default_vhost.queues[q]
        stand_in = net["a"].broker.default_vhost.queues[q]
        self.assertEqual((len(home), sum(map(len, stand_in.held.values())), on_a.got), (15, 5, []))
        ch.resume()
        for _ in range(10):
            net.settle()
        self.assertEqual(on_a.bodies(), [b"m%d" % i for i in range(20)])
        self.assertEqual(len(home), 0)

    def test_auto_ack_consumer_leaves_gives_back(self) -> None:
        """An auto-ack consumer goes while deliveries wait for it on its
        node (its client paused) and while more are on their way from the
        home: none is lost, all are in the queue on the home again."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q, ack=False)
        net.settle()
        ch = channel(net, "a")
        ch.pause()
        for i in range(3):
            send(net, "b", q, b"held%d" % i)
        net.settle()
        ch.unsubscribe(on_a)  # its cancel waits for the end of the turn
        queues = net["a"].mesh.queues
        self.assertEqual(queues.unanswered_cancels, 1)
        for i in range(2):
            send(net, "b", q, b"flying%d" % i)
        net.settle()
        self.assertEqual(queues.unanswered_cancels, 0)  # the home answered: nothing more comes
        home = self.home_queue()
        self.assertEqual(on_a.got, [])
        self.assertEqual(home.consumers, ())
        self.assertEqual(
            sorted(m.body for m in home.messages()), sorted([b"held0", b"held1", b"held2", b"flying0", b"flying1"])
        )

    def test_unanswered_cancel_forgotten_with_its_link(self) -> None:
        """An auto-ack consumer's cancel the home never answers (the link
        went first) is not remembered past the link."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q, ack=False)
        net.settle()
        channel(net, "a").unsubscribe(on_a)
        queues = net["a"].mesh.queues
        self.assertEqual(queues.unanswered_cancels, 1)
        net["a"].link_to(net["b"]).close("cut")
        self.assertEqual(queues.unanswered_cancels, 0)

    def test_bad_credit_closes_the_link(self) -> None:
        """Credit past what an auto-ack consumer spent, or for a consumer that
        acks, is a protocol error naming the frame."""
        for ack, expected in ((False, "more than it spent"), (True, "which acks")):
            net = Net("a", "b")
            net.full_mesh()
            q = homed(net, "b")
            consume(net, "a", q, ack=ack)
            net.settle()
            out = net["a"].link_to(net["b"])
            (sub,) = net["b"].link_to(net["a"]).homed
            out.send(wire.encode_settle([[sub, 0, 1, wire.CREDIT]]))
            net.settle()
            inbound = [p.server for p in net.pumps if p.server.mesh is net["b"].mesh][0]
            self.assertEqual(inbound.state, "closed")
            self.assertIn("protocol error: bad settle: credit", inbound.reason)
            self.assertIn(expected, inbound.reason)

    def test_link_cut_gives_back_and_consumes_again(self) -> None:
        """The link to the home goes with unacked messages: the home has
        them back at once; when a link is up again the consumer consumes
        again and gets them (redelivered); acks of the old deliveries go
        nowhere."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        for i in range(3):
            send(net, "b", q, b"m%d" % i)
        net.settle()
        self.assertEqual(len(on_a.got), 3)
        home = self.home_queue()
        net["a"].link_to(net["b"]).close("cut")
        net.settle()
        self.assertEqual(len(home), 3)
        self.assertEqual(home.consumers, ())
        old = on_a.got[0][0]
        channel(net, "a").settle(old)  # goes nowhere
        net.connect("a", "b")
        self.assertEqual(on_a.bodies(), [b"m0", b"m1", b"m2"] * 2)
        self.assertTrue(all(m.delivery_count == 1 for _, m in on_a.got[3:]))
        channel(net, "a").settle(0, multiple=True)
        net.settle()
        self.assertEqual((len(home), len(home.consumers[0].unacked)), (0, 0))

    def test_ack_then_cancel_in_one_turn(self) -> None:
        """An ack and the consumer's cancel in the same turn: the ack is
        not overtaken (the home would give the message back)."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        send(net, "b", q, b"m")
        net.settle()
        ch = channel(net, "a")
        ch.settle(on_a.got[0][0])
        ch.unsubscribe(on_a)
        net.settle()
        self.assertEqual((len(self.home_queue()), self.home_queue().consumers), (0, ()))

    def test_consumer_leaves_gives_back(self) -> None:
        """Unsubscribing (or the client's channel closing) gives back on the
        home what it held."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        send(net, "b", q, b"m")
        net.settle()
        channel(net, "a").close()
        net.settle()
        home = self.home_queue()
        self.assertEqual((len(home), home.consumers), (1, ()))
        self.assertEqual(len(on_a.got), 1)

    def test_queue_deleted_on_home(self) -> None:
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        net.settle()
        net["b"].broker.default_vhost.delete_queue(q)
        net.settle()
        self.assertEqual(on_a.cancels, 1)
        self.assertEqual(net["a"].broker.default_vhost.queues[q].consumers, ())

    def test_exclusive_consumer_across_nodes(self) -> None:
        """An exclusive consumer (AMQP's) is exclusive on the home: a
        consumer on another node is refused there, and cancelled here."""
        net, q = self.net, self.q
        ch = channel(net, "a")
        first = Recorder(ch)
        ch.consume(first, ch.declare_queue(q).name, exclusive=True)
        net.settle()
        second = consume(net, "c", q)
        net.settle()
        self.assertEqual((first.cancels, second.cancels), (0, 1))
        self.assertEqual(len(self.home_queue().consumers), 1)

    def test_paused_consumer_holds(self) -> None:
        """A paused consumer's deliveries wait on the stand-in until it resumes."""
        net, q = self.net, self.q
        on_a = consume(net, "a", q)
        ch = channel(net, "a")
        ch.pause()
        send(net, "b", q, b"m")
        net.settle()
        self.assertEqual(on_a.got, [])
        ch.resume()
        self.assertEqual(on_a.bodies(), [b"m"])


class PlaceExistingTests(SynchronousTestCase):
    def test_configured_queues_become_stand_ins(self) -> None:
        """Queues declared before the mesh starts (the configuration, on
        every node): those homed elsewhere become stand-ins, bindings gone;
        one holding messages stays, with a warning; those homed here stay."""
        from twisted.internet.task import Clock  # noqa: PLC0415

        from qmq.cluster.mesh import Mesh  # noqa: PLC0415
        from qmq.cluster.settings import ClusterSettings  # noqa: PLC0415
        from qmq.core.broker import Broker  # noqa: PLC0415

        clock = Clock()
        broker = Broker(clock, node="a")
        vhost = broker.default_vhost
        members = ["a", "b"]
        away, full = [f"q{i}" for i in range(1000) if rendezvous("/", f"q{i}", members) == "b"][:2]
        here = next(f"h{i}" for i in range(1000) if rendezvous("/", f"h{i}", members) == "a")
        for name in (away, full, here):
            vhost.declare_queue(name)
        vhost.bind(away, "amq.topic", "k")
        vhost.publish(broker.new_message("", full, None, b"kept"))
        mesh = Mesh(broker, ClusterSettings(allow_plaintext=True, peers=("tcp:host=127.0.0.1:port=1:node=b",)), clock)
        mesh.startService()
        self.addCleanup(mesh.stopService)
        self.assertIsInstance(vhost.queues[away], RemoteQueue)
        self.assertEqual(vhost.queues[away].home, "b")
        self.assertEqual(list(vhost.exchanges["amq.topic"].route("k", None)), [])
        self.assertNotIsInstance(vhost.queues[full], RemoteQueue)
        self.assertEqual(len(vhost.queues[full]), 1)
        self.assertNotIsInstance(vhost.queues[here], RemoteQueue)
        self.flushLoggedErrors()


class ConfirmDeadlineTests(SynchronousTestCase):
    def test_unconfirmed_fails_after_the_deadline(self) -> None:
        """A home that never confirms (its store stuck): the publish fails
        after CONFIRM_TIMEOUT, at a heart-beat; the link stays up."""
        from qmq.cluster.queues import CONFIRM_TIMEOUT  # noqa: PLC0415

        net = Net("a", "b", heartbeat=5.0)
        net.full_mesh()
        q = homed(net, "b")
        net["b"].mesh.queues.forwarded = lambda *args: None  # type: ignore[method-assign]
        answer = send(net, "a", q, b"x")
        for _ in range(int(CONFIRM_TIMEOUT / 5) + 2):
            net.clock.advance(5)
            net.settle()
        f = self.failureResultOf(answer, Unavailable)
        self.assertIn("did not confirm the message within 60 s", f.getErrorMessage())
        self.assertIn("b", net["a"].mesh.links)


class BackpressureTests(SynchronousTestCase):
    def test_full_link_pauses_the_remote_consumer(self) -> None:
        """The home's link to the consumer's node is not read: deliveries
        stop once its buffer is full (the rest wait in the queue, none is
        dropped), and go on when it drains."""
        net = Net("a", "b", link_buffer=65536)
        net.full_mesh()
        q = homed(net, "b")
        on_a = consume(net, "a", q, ack=False)
        net.settle()
        to_a = net["b"].link_to(net["a"])
        to_a.pauseProducing()
        for _ in range(200):
            send(net, "b", q, b"x" * 1000)
        net.clock.advance(0)
        home = net["b"].broker.default_vhost.queues[q]
        self.assertEqual(to_a.dropped, 0)
        self.assertGreater(len(home), 100)
        self.assertLess(to_a.snapshot()["buffered_bytes"], 65536 + 2000)
        to_a.resumeProducing()
        for _ in range(50):
            net.settle()
            net.clock.advance(0)
        self.assertEqual(len(on_a.got), 200)
        self.assertEqual(len(home), 0)


class StoredConfirmTests(SynchronousTestCase):
    """The home's store answers persistent publishes with one waiter per
    group commit (as the commit log does): forwards confirm when it fires,
    fail when it fails, and pass its result on to whoever else waits."""

    def setUp(self) -> None:
        from tests.test_core_channel import FakeStore  # noqa: PLC0415

        class GroupStore(FakeStore):
            group: Deferred | None = None

            def publish(self, vhost: Any, message: Any, queues: Any) -> Deferred:
                self.calls.append(("publish", (vhost, message, list(queues))))
                if self.group is None:
                    self.group = Deferred()
                return self.group

        self.net = Net("a", "b")
        self.net.full_mesh()
        self.store = GroupStore()
        broker = self.net["b"].broker
        broker.store = self.store  # type: ignore[assignment]
        self.q = homed(self.net, "b")
        broker.default_vhost.declare_queue(self.q)

    def sent(self) -> tuple[Deferred, Deferred, Deferred]:
        answers = [send(self.net, "a", self.q, b"%d" % i, persistent=True) for i in range(2)]
        self.net.settle()
        waiter = self.store.group
        assert waiter is not None
        self.store.group = None
        return answers[0], answers[1], waiter

    def test_confirmed_when_stored(self) -> None:
        first, second, waiter = self.sent()
        self.assertFalse(first.called or second.called)
        others: list[Any] = []
        waiter.addCallback(others.append)
        waiter.callback("stored")
        self.net.settle()
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertEqual(others, ["stored"])

    def test_failed_when_not_stored(self) -> None:
        first, second, waiter = self.sent()
        others: list[Any] = []
        waiter.addErrback(others.append)
        waiter.errback(OSError("disk gone"))
        self.net.settle()
        for answer in (first, second):
            f = self.failureResultOf(answer)
            self.assertIn("not stored: disk gone", f.getErrorMessage())
        self.assertEqual(len(others), 1)
        self.assertIsInstance(others[0].value, OSError)

    def test_fan_out_passes_a_store_failure_on(self) -> None:
        """A message from a link shares the store's waiter with local
        publishers: its failure still reaches them (logged once)."""
        net = self.net
        vhost = net["b"].broker.default_vhost
        vhost.declare_queue("sub", arguments={"x-home-node": "b"})
        vhost.bind("sub", "amq.topic", "k")
        net.settle()
        ch = channel(net, "a")
        for _ in range(2):
            message = ch.make_message("amq.topic", "k", None, b"x", persistent=True)
            ch.publish("amq.topic", "k", message)
        net.settle()
        waiter = self.store.group
        assert waiter is not None
        others: list[Any] = []
        waiter.addErrback(others.append)
        waiter.errback(OSError("disk gone"))
        self.assertEqual(len(others), 1)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)


class BadFrameTests(SynchronousTestCase):
    def test_bad_queue_frames_close_the_link(self) -> None:
        """A malformed frame of queues across nodes closes the link with a
        protocol error naming it (the dialer reconnects)."""
        cases = [
            (wire.frame(wire.SETTLE, b"x"), "bad settle"),
            (wire.frame(wire.SETTLE, wire.RUN.pack(1, 1, 1, 7)), "bad settle"),
            (wire.frame(wire.SETTLE, wire.RUN.pack(1, 1, 0, 0)), "bad settle"),
            (wire.frame(wire.CONFIRM, b"\x00\x00"), "bad confirm"),
            (wire.frame(wire.CONFIRM, b"\xff\xff\xff\xff" + b"\x00" * 16), "bad confirm"),
            (wire.frame(wire.CONFIRM, wire.encode_confirm([], [(1, 404, "x")])[wire.HEADER_SIZE : -1]), "bad confirm"),
            (wire.frame(wire.CONFIRM, wire.encode_confirm([], [])[wire.HEADER_SIZE :] + b"+"), "bad confirm"),
            (wire.encode_confirm([[1, 1 << 31]] * 2, []), "bad confirm: more than"),
            (wire.encode_json(wire.CONSUME, {"id": 1, "vhost": "/", "queue": "q", "window": 0}), "bad consume"),
            (wire.encode_json(wire.CONSUME, {"id": 1, "vhost": "/", "queue": "q", "window": 10**6 + 1}), "bad consume"),
            (wire.encode_settle([[1, 1, 60_000, 0], [2, 1, 60_000, 0]]), "more than the consumers' windows"),
            (wire.encode_json(wire.CANCEL, {"id": "1"}), "an integer id"),
            (wire.encode_json(wire.DECLARE, {"vhost": "/", "queue": "q"}), "bad declare"),
            (wire.frame(wire.FORWARD, b"\x00\x01"), "bad forward"),
            (wire.frame(wire.DELIVER, b"\x00"), "bad deliver"),
            (wire.frame(wire.FORWARD, wire.batch_prefix(wire.FORWARD, b"/", 1) + b"junk"), "bad forward"),
            (wire.frame(wire.DELIVER, wire.batch_prefix(wire.DELIVER, b"/")), "bad deliver"),
            (wire.frame(wire.MESSAGE, wire.batch_prefix(wire.MESSAGE, b"/") + b"\x00" * 40), "bad message"),
        ]
        for data, expected in cases:
            net = Net("a", "b")
            out, _ = net.connect("a", "b")
            out.dataReceived(data)
            self.assertEqual(out.state, "closed", expected)
            self.assertIn(expected, out.reason)
            self.assertIn("protocol error", out.reason)


class BatchTests(SynchronousTestCase):
    """Version 3 of the link protocol: a turn's messages in batch frames,
    ranged confirms, settle runs."""

    def setUp(self) -> None:
        self.net = Net("a", "b")
        self.net.full_mesh()
        self.q = homed(self.net, "b")

    def frames(self, link: Any) -> list[tuple[int, int]]:
        """Record (type, payload size) of every frame C{link} reads."""
        seen: list[tuple[int, int]] = []
        handle = link._frame

        def recording(type_: int, buffer: bytes, start: int, end: int) -> None:
            seen.append((type_, end - start))
            handle(type_, buffer, start, end)

        link._frame = recording
        return seen

    def test_one_turn_one_frame(self) -> None:
        """A turn's forwards to the home go in one forward frame, and are
        confirmed by one range in one confirm frame."""
        net, q = self.net, self.q
        at_home = self.frames(net["b"].link_to(net["a"]))
        back = self.frames(net["a"].link_to(net["b"]))
        answers = [send(net, "a", q, b"m%d" % i) for i in range(50)]
        net.settle()
        self.assertEqual([t for t, _ in at_home], [wire.FORWARD])
        self.assertEqual([t for t, _ in back], [wire.CONFIRM])
        self.assertEqual(back[0][1], 4 + 12 + 4)  # one range, no refusal
        for answer in answers:
            self.successResultOf(answer)
        home = net["b"].broker.default_vhost.queues[q]
        self.assertEqual([m.body for m in home.messages()], [b"m%d" % i for i in range(50)])
        self.assertEqual(net["a"].link_to(net["b"]).pending, {})

    def test_batches_bounded(self) -> None:
        """Batch frames close at BATCH_BYTES (a larger message goes alone),
        and sequence numbers carry on across them: every forward is
        confirmed, a refusal in the middle is that publish's alone."""
        net, q = self.net, self.q
        net["b"].broker.default_vhost.declare_queue(q, arguments={"x-max-length": 7, "x-overflow": "reject-publish"})
        at_home = self.frames(net["b"].link_to(net["a"]))
        body = b"x" * (wire.BATCH_BYTES // 3)
        answers = [send(net, "a", q, body) for _ in range(6)]
        answers.append(send(net, "a", q, b"y" * (wire.BATCH_BYTES * 2)))
        answers += [send(net, "a", q, b"z") for _ in range(2)]
        net.settle()
        sizes = [n for t, n in at_home if t == wire.FORWARD]
        self.assertEqual(len(sizes), 5)  # 2 + 2 + 2 of a third, the big one, the two small ones
        self.assertTrue(all(n <= wire.BATCH_BYTES for n in sizes[:3] + sizes[4:]))
        self.assertGreater(sizes[3], wire.BATCH_BYTES)
        self.assertLess(sizes[4], 200)
        for answer in answers[:7]:
            self.successResultOf(answer)
        self.assertEqual(self.failureResultOf(answers[7]).value.code, 506)
        self.assertEqual(self.failureResultOf(answers[8]).value.code, 506)

    def test_unobserved_confirm_not_fired_observed_fired(self) -> None:
        """A confirm nobody waits on is dropped; one waited on fires."""
        net, q = self.net, self.q
        send(net, "a", q, b"dropped")
        waited = send(net, "a", q, b"waited")
        results: list[Any] = []
        send(net, "a", q, b"callback only").addCallback(results.append)
        net.settle()
        self.successResultOf(waited)
        self.assertEqual(results, [None])

    def test_settle_run_past_the_window(self) -> None:
        """A settle run longer than its consumer's window is a protocol
        error naming the frame; a run for a consumer gone is ignored."""
        net, q = self.net, self.q
        consume(net, "a", q, prefetch=5)
        net.settle()
        out = net["a"].link_to(net["b"])
        (sub,) = net["b"].link_to(net["a"]).homed
        out.send(wire.encode_settle([[sub + 1, 1, 50, 0]]))
        net.settle()
        self.assertEqual(out.state, "up")
        out.send(wire.encode_settle([[sub, 1, 6, 0]]))
        net.settle()
        inbound = [p.server for p in net.pumps if p.server.mesh is net["b"].mesh][0]
        self.assertEqual(inbound.state, "closed")
        self.assertIn("protocol error: bad settle: a run of 6 tags", inbound.reason)
