"""Tests for SockJS sessions across a host's workers (L{qmq.web.sockjs.relay}):
two workers (real cores and meshes, linked over fake transports, one
L{Clock}), each with the same SockJS service (an echo) on a site of its own.
Every request of a session goes to whichever worker the test says (the
kernel's choice, with workers); the session lives on its owner."""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from qmq.cluster.placement import rendezvous
from qmq.web.sockjs.relay import install, register
from qmq.web.sockjs.resource import SockJSResource, SockJSService
from qmq.web.sockjs.services import EchoHandler
from qmq.web.sockjs.settings import SockJSSettings
from tests.sockjs_http import Exchange
from tests.test_cluster_mesh import Net

WORKERS = ("w0", "w1")


def owned_by(node: str, prefix: str = "s") -> str:
    return next(f"{prefix}{i}" for i in range(1000) if rendezvous("", f"{prefix}{i}", list(WORKERS)) == node)


class RelayTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.net = net = Net(*WORKERS)
        net.full_mesh()
        self.services: dict[str, SockJSService] = {}
        self.sites: dict[str, Site] = {}
        for node in WORKERS:
            broker = net[node].broker
            broker.mesh = net[node].mesh
            net[node].mesh.siblings = frozenset(WORKERS) - {node}
            install(net[node].mesh)
            service = self.services[node] = SockJSService(
                EchoHandler, SockJSSettings(response_limit=4096), net.clock)
            register(broker, "stomp:tcp:1/sockjs", service)
            root = Resource()
            root.putChild(b"echo", SockJSResource(service))
            self.sites[node] = Site(root, reactor=net.clock)

    def request(self, node: str, method: str, path: str, body: str = "") -> Exchange:
        exchange = Exchange(self.sites[node], method, "/echo/000/" + path, body)
        self.net.settle()
        self.net.clock.advance(0)
        return exchange

    def test_session_on_its_owner(self) -> None:
        """Opened, fed and polled through the worker that does not own it:
        the session lives on its owner only, and the echo comes back."""
        sid = owned_by("w1")
        opened = self.request("w0", "POST", f"{sid}/xhr")
        self.assertEqual((opened.status, opened.text), (200, "o\n"))
        self.assertEqual(opened.header("access-control-allow-origin"), "*")
        self.assertEqual(len(self.services["w1"].sessions), 1)
        self.assertEqual(self.services["w0"].sessions, {})
        sent = self.request("w0", "POST", f"{sid}/xhr_send", '["hello"]')
        self.assertEqual(sent.status, 204)
        polled = self.request("w0", "POST", f"{sid}/xhr")
        self.assertEqual(polled.text, 'a["hello"]\n')
        # The owner takes the same session's requests directly.
        sent = self.request("w1", "POST", f"{sid}/xhr_send", '["again"]')
        polled = self.request("w0", "POST", f"{sid}/xhr")
        self.assertEqual((sent.status, polled.text), (204, 'a["again"]\n'))
        self.assertEqual(self.services["w1"].relay.receivers, {})
        self.assertEqual(self.services["w0"].relay.relayed, {})

    def test_streaming(self) -> None:
        """An xhr_streaming response relayed: its prelude and frames as
        they come, ended at the response limit (4096 bytes), then a new one."""
        sid = owned_by("w1", "t")
        stream = self.request("w0", "POST", f"{sid}/xhr_streaming")
        self.assertEqual(stream.status, 200)
        self.assertTrue(stream.read().endswith("o\n"))
        self.request("w1", "POST", f"{sid}/xhr_send", json.dumps(["x" * 1000] * 5))
        self.assertTrue(stream.finished)
        self.assertEqual(stream.read().count('"' + "x" * 1000 + '"'), 5)

    def test_flow_control(self) -> None:
        """The relayed response's transport fills: the owner's session holds
        what comes (its outbox), and sends it once the transport drained."""
        sid = owned_by("w1", "f")
        stream = self.request("w0", "POST", f"{sid}/xhr_streaming")
        stream.read()
        (relayed,) = self.services["w0"].relay.relayed.values()
        relayed.pauseProducing()
        self.net.settle()
        self.request("w1", "POST", f"{sid}/xhr_send", '["held"]')
        self.assertEqual(stream.read(), "")
        session = next(iter(self.services["w1"].sessions.values()))
        self.assertEqual(session.outbox, ["held"])
        relayed.resumeProducing()
        self.net.settle()
        self.assertEqual(stream.read(), 'a["held"]\n')

    def test_unknown_session(self) -> None:
        """A send to a session its owner does not have: the protocol's 404."""
        sent = self.request("w0", "POST", f"{owned_by('w1', 'u')}/xhr_send", '["x"]')
        self.assertEqual(sent.status, 404)

    def test_client_goes_away(self) -> None:
        """A relayed poll whose client goes: the owner's session is told (an
        interrupted receiver), as for a poll of its own."""
        sid = owned_by("w1", "g")
        self.request("w0", "POST", f"{sid}/xhr")
        waiting = self.request("w0", "POST", f"{sid}/xhr")
        self.assertFalse(waiting.finished)
        session = next(iter(self.services["w1"].sessions.values()))
        self.assertIsNotNone(session.receiver)
        waiting.abort()
        self.net.settle()
        self.assertEqual(self.services["w1"].relay.receivers, {})
        self.assertEqual(session.state, "closing")  # interrupted: 1002 to the next poll

    def test_owner_gone(self) -> None:
        """The owner's link goes: a relayed request ends here, and a new one
        is 503 (the client tries again later)."""
        sid = owned_by("w1", "d")
        self.request("w0", "POST", f"{sid}/xhr")
        waiting = self.request("w0", "POST", f"{sid}/xhr")
        self.net["w0"].link_to(self.net["w1"]).close("cut")
        self.net.settle()
        self.assertTrue(waiting.finished)
        again = self.request("w0", "POST", f"{sid}/xhr")
        self.assertEqual(again.status, 503)
        self.assertIn("does not answer", again.text)

    def test_refused_by_the_owner(self) -> None:
        """The owner's connection caps refuse a new session: 503, as there."""
        self.services["w1"].admit = lambda host: "too many from there"
        opened = self.request("w0", "POST", f"{owned_by('w1', 'r')}/xhr")
        self.assertEqual(opened.status, 503)
        self.assertIn("too many from there", opened.text)

    def test_only_the_hosts_workers(self) -> None:
        """A node of the mesh that is not a worker of this host (another
        host's) cannot attach to, or send into, a session here."""
        from qmq.core.errors import AccessRefused  # noqa: PLC0415

        sid = owned_by("w1", "h")
        self.request("w0", "POST", f"{sid}/xhr")
        self.net["w1"].mesh.siblings = frozenset()
        d = self.net["w0"].mesh.manage.ask("w1", "sockjs.send", {
            "service": "stomp:tcp:1/sockjs", "sid": sid, "host": "127.0.0.1", "identity": None, "messages": ["x"]})
        self.net.settle()
        self.assertIn("not a worker of this host", self.failureResultOf(d, AccessRefused).value.message)
