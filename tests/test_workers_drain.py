"""Tests for L{qmq.workers.drain}: a queue whose home moved to another
worker, holding messages here, sent on to its home; two real cores linked
over fake transports on one L{Clock} (L{tests.test_cluster_mesh.Net})."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from qmq.core.remote import RemoteQueue
from qmq.workers.drain import INTERVAL, Drain
from tests.test_cluster_mesh import Net
from tests.test_cluster_queues import homed, send


class DrainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = Net("w0", "w1")
        self.net.full_mesh()
        self.q = homed(self.net, "w1")
        w0 = self.net["w0"]
        # A queue recovered on w0 whose home is w1 now (as after a change
        # of the number of workers): local, with messages.
        self.vhost = w0.broker.default_vhost
        with w0.mesh.queues.here():
            self.vhost.declare_queue(self.q)
        self.vhost.declare_exchange("t", "topic")
        self.vhost.bind(self.q, "t", "k.#")
        for i in range(5):
            send(self.net, "w0", self.q, f"m{i}".encode(), persistent=True)
        channel = w0.channel
        channel.publish("t", "k.x", channel.make_message("t", "k.x", None, b"via-topic"))
        self.assertNotIsInstance(self.vhost.queues[self.q], RemoteQueue)
        self.assertEqual(len(self.vhost.queues[self.q]), 6)
        self.drain = Drain(w0.broker, w0.mesh, self.net.clock)
        self.addCleanup(self.drain.stop_all)

    def home(self) -> list[bytes]:
        queue = self.net["w1"].broker.default_vhost.queues.get(self.q)
        return sorted(m.body for m in queue.messages()) if queue is not None else []

    def test_moved(self) -> None:
        """Every message goes to the home (acked here once confirmed there),
        one routed here through a topic too; then the local queue becomes
        the stand-in."""
        self.drain.start()
        self.net.clock.advance(INTERVAL)
        self.assertIn(("/", self.q), self.drain.draining)
        self.net.settle()
        self.assertEqual(self.home(), [b"m0", b"m1", b"m2", b"m3", b"m4", b"via-topic"])
        self.assertEqual(len(self.vhost.queues[self.q]), 0)
        self.net.clock.advance(INTERVAL)
        self.assertEqual(self.drain.draining, {})
        self.assertIsInstance(self.vhost.queues[self.q], RemoteQueue)
        # A SEND on w0 now goes to the home.
        send(self.net, "w0", self.q, b"after", persistent=True)
        self.net.settle()
        self.assertIn(b"after", self.home())

    def test_linkDown(self) -> None:
        """The link going before the confirms: nothing is lost here (every
        message back in the local queue), the drain of the queue stops,
        and starts again at a later check once the link is back."""
        self.drain.check()
        for pump in self.net.pumps:
            pump.server.transport.loseConnection()
        self.net.settle()
        self.assertEqual(self.drain.draining, {})
        self.assertEqual(len(self.vhost.queues[self.q]), 6)
        self.drain.check()
        self.assertEqual(self.drain.draining, {})  # the home is not linked
        self.net.connect("w0", "w1")
        self.net.settle()
        self.drain.check()
        self.net.settle()
        # At least once: what reached the home before the link went may be
        # there twice, nothing is missing.
        self.assertEqual(set(self.home()), {b"m0", b"m1", b"m2", b"m3", b"m4", b"via-topic"})
        self.assertEqual(len(self.vhost.queues[self.q]), 0)

    def test_localQueuesStay(self) -> None:
        """A queue homed here, or empty, or a connection's own, is left alone."""
        self.vhost.declare_queue("amq.gen-x")
        self.drain.check()
        self.assertEqual(list(self.drain.draining), [("/", self.q)])
