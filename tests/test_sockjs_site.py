"""The SockJS mounts of the HTTP listener's site (L{qmq.web.site.MOUNTS})."""

from __future__ import annotations

import json
import uuid

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.web.site import HttpFactory
from tests.sockjs_http import Exchange
from tests.test_web_site import make_context


class SockJSMountTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()

    def factory(self, toml: str = "") -> HttpFactory:
        self.ctx = make_context(toml, clock=self.clock)
        return HttpFactory(self.ctx)

    def test_mounted(self) -> None:
        site = self.factory()
        self.assertIn("/sockjs", json.loads(Exchange(site, "GET", "/").body)["paths"])
        r = Exchange(site, "GET", "/sockjs/info")
        self.assertEqual(r.status, 200)
        self.assertIs(json.loads(r.body)["websocket"], True)

    def test_settings_applied(self) -> None:
        site = self.factory("[sockjs]\nwebsocket = false\ncookie_needed = true\n")
        info = json.loads(Exchange(site, "GET", "/sockjs/info").body)
        self.assertEqual((info["websocket"], info["cookie_needed"]), (False, True))

    def test_test_services_off_by_default(self) -> None:
        site = self.factory()
        self.assertEqual(Exchange(site, "GET", "/sockjs_test/echo/info").status, 404)
        site = self.factory("[sockjs]\ntest_services = true\n")
        self.assertEqual(Exchange(site, "GET", "/sockjs_test/echo/info").status, 200)
        r = Exchange(site, "POST", f"/sockjs_test/close/000/{uuid.uuid4()}/xhr")
        self.assertEqual(r.text, "o\n")

    def test_other_origins_refused_by_default(self) -> None:
        """As for STOMP over WebSocket, C{web.allowed_origins} decides which
        pages of other origins may use the endpoint (none by default)."""
        site = self.factory()
        r = Exchange(site, "GET", "/sockjs/info", headers={"Origin": "http://evil.example"})
        self.assertEqual(r.status, 403)
        self.assertEqual(json.loads(r.body)["code"], "origin-not-allowed")
        r = Exchange(site, "GET", "/sockjs/info", headers={"Origin": "http://127.0.0.1"})
        self.assertEqual(r.status, 200)
        site = self.factory('[web]\nallowed_origins = "http://app.example"\n')
        r = Exchange(site, "POST", f"/sockjs/000/{uuid.uuid4()}/xhr",
                     headers={"Origin": "http://app.example"})
        self.assertEqual((r.status, r.text), (200, "o\n"))
        self.assertEqual(r.header("access-control-allow-origin"), "http://app.example")

    def test_sessions_counted(self) -> None:
        site = self.factory()
        Exchange(site, "POST", f"/sockjs/000/{uuid.uuid4()}/xhr")
        self.assertEqual(len(self.ctx.connections.connections("http:test/sockjs")), 1)
        self.clock.advance(5.1)
        self.assertEqual(len(self.ctx.connections.connections("http:test/sockjs")), 0)

    def test_listener_stop_ends_sessions(self) -> None:
        """When the listener stops, its SockJS sessions end (a STOMP one
        with an ERROR to a waiting stream), and no timer is left."""
        site = self.factory("[sockjs]\ntest_services = true\n")
        r = Exchange(site, "POST", f"/sockjs/000/{uuid.uuid4()}/xhr_streaming")
        Exchange(site, "POST", f"/sockjs_test/close/000/{uuid.uuid4()}/xhr")  # closing, 5 s left
        site.doStart()
        site.doStop()
        self.clock.advance(0)
        self.assertTrue(r.text.endswith('c[3000,"broker shutting down"]\n'))
        names = [c.func.__qualname__ for c in self.clock.getDelayedCalls()]
        # What is left is the HTTP connections' own idle timeouts.
        self.assertEqual([n for n in names if "Timeout" not in n], [])
