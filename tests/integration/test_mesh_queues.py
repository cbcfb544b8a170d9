"""Queues across nodes with real nodes: three C{twistd -n qmq} processes
linked over mutual TLS (the helpers of L{tests.integration.test_mesh}),
used by STOMP clients on raw sockets.

  - a queue homed on b, consumed from a with acks, fed by SENDs on c that
    are receipted once b has them; the SUBSCRIBE's RECEIPT and the HTTP
    API name the home;
  - AMQP (publisher confirms, basic.consume with acks) and HTTP on the
    same queue; with the home down, HTTP 503 and AMQP 404 naming it;
  - a consumer on a holding unacked messages when a is SIGKILLed: b has
    them back, and a consumer on c gets them;
  - the home killed (SIGKILL) and restarted under receipted persistent
    SENDs from another node, and a third node killed too: every receipted
    message is delivered (at least once); SENDs while the home is down
    are refused with an ERROR, never receipted;
  - a link through the delaying proxy: a thousand messages consumed from
    the far node, and a thousand receipted SENDs to it, without one round
    trip each.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from qmq.cluster.placement import rendezvous
from tests.integration.test_mesh import (
    DELAY,
    FLOW_TIMEOUT,
    DelayingProxy,
    MeshTestCase,
    Node,
    Stomp,
    settled,
)
from tests.integration.test_twistd import frame


def homed(node: str, members: list[str], prefix: str = "q") -> str:
    """A queue name whose home is C{node} over C{members}."""
    for i in range(1000):
        name = f"{prefix}{i}"
        if rendezvous("/", name, members) == node:
            return name
    raise AssertionError("no name")


def queue_view(node: Node, name: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{node.http_port}/api/v1/vhosts/%2F/queues/{name}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)  # type: ignore[no-any-return]


def subscribe(client: Stomp, queue: str, ack: str = "client-individual", **extra: str) -> dict[str, str]:
    """SUBSCRIBE with a receipt: the RECEIPT's headers."""
    client.sock.sendall(
        frame("SUBSCRIBE", {"id": "1", "destination": f"/queue/{queue}", "ack": ack, "receipt": "sub", **extra})
    )
    while True:
        command, headers, body = client.read()
        if command == "RECEIPT" and headers.get("receipt-id") == "sub":
            return headers
        assert command == "MESSAGE", (command, headers, body)
        client.pending.append(body)


def send_receipted(client: Stomp, destination: str, bodies: list[bytes], persistent: bool = False) -> float:
    """SEND every body with a receipt, all written at once, then read the
    receipts (in order): the seconds it took."""
    started = time.monotonic()
    headers = {"destination": destination}
    if persistent:
        headers["persistent"] = "true"
    data = b"".join(frame("SEND", {**headers, "receipt": f"s{i}"}, body) for i, body in enumerate(bodies))
    client.sock.sendall(data)
    for i in range(len(bodies)):
        command, h, body = client.read(FLOW_TIMEOUT)
        assert (command, h.get("receipt-id")) == ("RECEIPT", f"s{i}"), (command, h, body)
    return time.monotonic() - started


def take(client: Stomp, count: int, ack: bool = True, deadline: float = FLOW_TIMEOUT) -> list[bytes]:
    """Read C{count} MESSAGEs (acking each with C{ack})."""
    got, client.pending = client.pending, []
    end = time.monotonic() + deadline
    while len(got) < count:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"got {len(got)} of {count} messages")
        try:
            command, headers, body = client.read(left)
        except TimeoutError:
            continue
        assert command == "MESSAGE", (command, headers, body)
        got.append(body)
        if ack:
            client.sock.sendall(frame("ACK", {"id": headers["ack"]}))
    return got


class RemoteQueueTests(MeshTestCase):
    def test_consumed_from_another_node(self) -> None:
        """A queue homed on b: SENDs on c receipted once b has them, a
        consumer on a gets each once and acks; b's queue is empty after."""
        nodes = self.nodes("a", "b", "c")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b", "c"])
        on_a = a.client()
        self.assertEqual(subscribe(on_a, q).get("home"), "b")
        bodies = [b"m%d" % i for i in range(300)]
        send_receipted(c.client(), f"/queue/{q}", bodies)
        got = take(on_a, len(bodies))
        self.assertEqual(got, bodies)  # one sender, one consumer: in order
        self.wait_for("b's queue drained and acked", lambda: queue_view(b, q)["messages"] == 0)
        view = queue_view(b, q)
        self.assertEqual((view["home"], view["consumers"]), ("b", 1))
        self.assertEqual(queue_view(a, q)["home"], "b")
        self.assertEqual(on_a.messages(0.3), [])

    def test_unacked_come_back_when_the_consumer_node_dies(self) -> None:
        """A consumer on a holds unacked messages of b's queue; a is
        SIGKILLed: b has them back, and a consumer on c gets them all."""
        nodes = self.nodes("a", "b", "c")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b", "c"], "u")
        on_a = a.client()
        subscribe(on_a, q)
        bodies = [b"u%d" % i for i in range(50)]
        send_receipted(b.client(), f"/queue/{q}", bodies)
        self.assertEqual(sorted(take(on_a, 50, ack=False)), sorted(bodies))
        self.assertEqual(queue_view(b, q)["messages_unacknowledged"], 50)
        a.kill()
        self.wait_for("b has them back", lambda: queue_view(b, q)["messages_ready"] == 50)
        on_c = c.client()
        subscribe(on_c, q)
        self.assertEqual(sorted(take(on_c, 50)), sorted(bodies))
        self.wait_for("all acked on b", lambda: queue_view(b, q)["messages"] == 0)


class FrontendTests(MeshTestCase):
    def test_amqp_and_http(self) -> None:
        """The same queue over AMQP and HTTP: publishes with confirms on
        a and HTTP 201s on c reach b's queue; an AMQP consumer on c gets
        them; with b down, the HTTP publish is a 503 problem and the AMQP
        one closes the channel with 404, naming the home."""
        import pika  # noqa: PLC0415

        nodes = self.nodes("a", "b", "c")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b", "c"], "amqp")
        params = pika.ConnectionParameters("127.0.0.1", a.amqp_port, connection_attempts=3)
        on_a = pika.BlockingConnection(params)
        self.addCleanup(lambda: on_a.is_open and on_a.close())
        channel = on_a.channel()
        channel.confirm_delivery()
        channel.queue_declare(q)
        for i in range(20):
            channel.basic_publish("", q, b"amqp%d" % i, pika.BasicProperties(delivery_mode=2))
        url = f"http://127.0.0.1:{c.http_port}/api/v1/vhosts/%2F/queues/{q}/messages"
        request = urllib.request.Request(url, data=b'{"body": "http", "persistent": true}', headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            self.assertEqual(r.status, 201)
        self.assertEqual(queue_view(b, q)["messages"], 21)
        on_c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.amqp_port))
        self.addCleanup(lambda: on_c.is_open and on_c.close())
        consumer = on_c.channel()
        consumer.basic_qos(prefetch_count=5)
        got: list[bytes] = []
        for method, _, body in consumer.consume(q, inactivity_timeout=5):
            self.assertIsNotNone(method, f"only {len(got)} messages came")
            got.append(body)
            consumer.basic_ack(method.delivery_tag)
            if len(got) == 21:
                break
        consumer.cancel()
        self.assertEqual(got, [b"amqp%d" % i for i in range(20)] + [b"http"])
        self.wait_for("all acked on b", lambda: queue_view(b, q)["messages"] == 0)

        # HTTP receive (a long poll) and ack on a, of what HTTP sent on c.
        with urllib.request.urlopen(request, timeout=10) as r:
            self.assertEqual(r.status, 201)
        base = f"http://127.0.0.1:{a.http_port}/api/v1/vhosts/%2F/queues/{q}"
        with urllib.request.urlopen(urllib.request.Request(base + "/receive?max=5&wait=5", method="POST"),
                                    timeout=10) as r:
            received = json.load(r)["messages"]
        self.assertEqual([m["body"] for m in received], ["http"])
        ack = urllib.request.Request(
            base + "/ack", data=json.dumps({"handles": [received[0]["handle"]]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(ack, timeout=10) as r:
            self.assertEqual(json.load(r), {"settled": 1, "unknown": []})
        self.wait_for("acked on b", lambda: queue_view(b, q)["messages"] == 0)

        b.kill()
        self.wait_for("c noticed", lambda: "b" not in c.links() and "b" not in a.links())
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=10)
        problem = json.load(e.exception)
        self.assertEqual((e.exception.code, problem["code"]), (503, "home-unavailable"))
        self.assertIn("lives on node 'b'", problem["detail"])
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("", q, b"lost", pika.BasicProperties(delivery_mode=2))
        self.assertEqual(closed.exception.reply_code, 404)
        self.assertIn("lives on node 'b'", closed.exception.reply_text)


class KillHomeTests(MeshTestCase):
    def test_receipted_are_delivered(self) -> None:
        """Persistent SENDs from a to a queue homed on b, each receipted
        before the next; c is SIGKILLed (nothing changes), then b (SENDs
        are refused with an ERROR until it is back), and b restarted: every
        receipted message is delivered, from b's commit log."""
        nodes = self.nodes("a", "b", "c", store="log")
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b", "c"], "k")
        receipted: list[bytes] = []
        refused: list[str] = []
        publisher: Stomp | None = None
        total = 300
        i = 0
        while i < total:
            if i == 60:
                c.kill()
            if i == 120:
                b.kill()
            if i == 160:
                b.start()
                b.wait_listening()
            if publisher is None:
                publisher = Stomp(a.stomp_port)
                self.addCleanup(publisher.close)
            body = b"p%d" % i
            publisher.sock.sendall(
                frame("SEND", {"destination": f"/queue/{q}", "persistent": "true", "receipt": "r"}, body)
            )
            try:
                command, headers, _ = publisher.read(FLOW_TIMEOUT)
            except (ConnectionError, OSError):
                command, headers = "closed", {}
            if command == "RECEIPT":
                receipted.append(body)
            else:
                self.assertIn(command, ("ERROR", "closed"))
                refused.append(headers.get("message", command))
                publisher.close()
                publisher = None
                if 120 <= i < 160:
                    time.sleep(0.02)
            i += 1
        self.assertGreaterEqual(len(receipted), 200)
        self.assertTrue(refused)
        self.assertTrue(any("home node" in r for r in refused), refused)
        self.wait_for("a linked to b again", lambda: "b" in a.links())
        consumer = a.client()
        subscribe(consumer, q, ack="auto")
        got: set[bytes] = set()
        deadline = time.monotonic() + FLOW_TIMEOUT
        while not set(receipted) <= got:
            lost = sorted(set(receipted) - got, key=lambda m: int(m[1:]))
            self.assertLess(time.monotonic(), deadline, f"{len(lost)} lost of {len(receipted)} ({len(got)} got): {lost[:5]}...{lost[-5:]}")
            got.update(consumer.messages(0.5))
        # Nothing but what was sent (a refused SEND may still have arrived:
        # at least once, never invented).
        self.assertLessEqual(got, {b"p%d" % i for i in range(total)})
        from twisted.python import log  # noqa: PLC0415

        log.msg(
            f"mesh kill test: {len(receipted)} receipted, {len(refused)} refused, "
            f"{len(set(receipted) - got)} receipted lost, {len(got)} delivered"
        )


class DistantQueueTests(MeshTestCase):
    def test_delayed_link(self) -> None:
        """Through the delaying proxy: 1,000 messages of a queue homed on a
        consumed from b, and 1,000 receipted SENDs from b to it, in far
        less than a round trip each."""
        a = Node(self, "a", self.ca)
        b = Node(self, "b", self.ca)
        proxy = DelayingProxy(a.peer_port, DELAY)
        self.addCleanup(proxy.close)
        a.configure([b.peer_entry().replace(f"port={b.peer_port}", "port=1")])
        b.configure([f"ssl:host=127.0.0.1:port={proxy.port}:node=a"])
        for node in (a, b):
            node.start()
        for node in (a, b):
            node.wait_listening()
        self.wait_for("b linked to a", lambda: "a" in b.links())
        q = homed("a", ["a", "b"], "far")
        on_b = b.client()
        self.assertEqual(subscribe(on_b, q, ack="client-individual", **{"activemq.prefetchSize": "2000"})["home"], "a")
        bodies = [b"f%d" % i for i in range(1000)]
        started = time.monotonic()
        send_receipted(a.client(), f"/queue/{q}", bodies)
        got = take(on_b, 1000)
        consumed = time.monotonic() - started
        self.assertEqual(got, bodies)
        rtt = self.wait_for("a round trip measured", lambda: b.links().get("a", {}).get("rtt_ms"))
        self.assertGreaterEqual(rtt, 2 * DELAY * 1000)
        sent = send_receipted(b.client(), f"/queue/{q}", [b"g%d" % i for i in range(1000)])
        self.assertEqual(len(take(on_b, 1000)), 1000)
        self.wait_for("all acked on a", lambda: queue_view(a, q)["messages"] == 0)
        # One round trip each would be 200 s.
        self.assertLess(consumed, 50 * 2 * DELAY)
        self.assertLess(sent, 50 * 2 * DELAY)
        from twisted.python import log  # noqa: PLC0415

        log.msg(
            f"mesh queue test: rtt {rtt:.0f} ms; 1,000 consumed across in {consumed:.2f} s, "
            f"1,000 receipted SENDs across in {sent:.2f} s"
        )


