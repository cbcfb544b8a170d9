"""Tests for L{qmq.web.guard}: the gate every request to an C{http:}
listener passes (Host, Origin, what a form can send), alone and in front
of the real site (the API, a WebSocket upgrade, SockJS) on string
transports and a L{MemoryReactorClock}.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from twisted.trial import unittest
from twisted.web.http_headers import Headers

from qmq import config
from qmq.web.guard import Guard, HostRule, host_name, origin_allowed
from qmq.web.site import HttpFactory
from tests.test_web_site import Client, make_context, split

Q = "/api/v1/vhosts/%2F/queues"


def headers(**values: str) -> Headers:
    h = Headers()
    for name, value in values.items():
        h.addRawHeader(name.replace("_", "-").encode(), value.encode())
    return h


def verdict(guard: Guard, method: str = "GET", path: str = "/api/v1/vhosts", body: int = 0,
            secure: bool = False, version: bytes = b"HTTP/1.1", **hdrs: str) -> int:
    """The status the gate answers (200: let through)."""
    refusal = guard.check(method.encode(), path.encode(), headers(**hdrs), body, secure, version)
    return 200 if refusal is None else refusal.status


class HostTests(unittest.TestCase):
    """The Host allow-list (DNS rebinding)."""

    def setUp(self) -> None:
        self.guard = Guard(HostRule.for_listener(()))

    def test_host_name(self) -> None:
        self.assertEqual(host_name("LocalHost:8080"), "localhost")
        self.assertEqual(host_name("localhost."), "localhost")
        self.assertEqual(host_name("[::1]:15674"), "[::1]")
        self.assertEqual(host_name("127.0.0.1"), "127.0.0.1")
        for bad in ("", "a b", "x:y", "[::1", "[nope]:80", "a:80:90", "*.example.com", "x:123456",
                    "http://x"):
            self.assertIsNone(host_name(bad), bad)

    def test_default_names(self) -> None:
        """Loopback names, any IP address, the machine's name: a rebound
        name is none of them."""
        for host in ("localhost", "localhost:8080", "app.localhost:80", "127.0.0.1:15674", "[::1]:15674",
                     "10.1.2.3", socket.gethostname()):
            self.assertEqual(verdict(self.guard, host=host), 200, host)
        for host in ("evil.example", "evil.example:15674", "localhost.evil.example", "127.0.0.1.nip.io"):
            self.assertEqual(verdict(self.guard, host=host), 421, host)

    def test_missing_or_bad(self) -> None:
        self.assertEqual(verdict(self.guard), 400)
        self.assertEqual(verdict(self.guard, version=b"HTTP/1.0"), 200)
        self.assertEqual(verdict(self.guard, host="a b"), 400)
        h = headers(host="localhost")
        h.addRawHeader(b"host", b"evil.example")
        self.assertIsNotNone(self.guard.check(b"GET", b"/", h, 0))

    def test_configured(self) -> None:
        guard = Guard(HostRule.for_listener(("broker.example.com", "*.apps.example")))
        self.assertEqual(verdict(guard, host="Broker.Example.Com:443"), 200)
        self.assertEqual(verdict(guard, host="a.apps.example"), 200)
        self.assertEqual(verdict(guard, host="apps.example"), 421)
        self.assertEqual(verdict(guard, host="evil.example"), 421)
        self.assertEqual(verdict(Guard(HostRule.for_listener(("*",))), host="evil.example"), 200)

    def test_verdicts_cached_and_bounded(self) -> None:
        """Verdicts are remembered per Host and Origin value, in caches of at
        most C{CACHE_SIZE} entries whatever a client sends."""
        for i in range(Guard.CACHE_SIZE * 3):
            self.assertEqual(verdict(self.guard, host=f"n{i}.example", origin="http://x"), 421)
            self.assertEqual(verdict(self.guard, host=f"127.0.0.1:{i}", origin=f"http://o{i}.example"), 403)
        self.assertLessEqual(len(self.guard._host_verdicts), Guard.CACHE_SIZE)
        self.assertLessEqual(len(self.guard._origin_verdicts), Guard.CACHE_SIZE)
        self.guard.origins = ("http://o1.example",)
        self.assertEqual(verdict(self.guard, host="127.0.0.1:1", origin="http://o1.example"), 200)

    def test_listener_interface_name(self) -> None:
        guard = Guard(HostRule.for_listener((), "http:tcp:8080:interface=broker.lan:backlog=1024"))
        self.assertEqual(verdict(guard, host="broker.lan:8080"), 200)
        self.assertEqual(verdict(self.guard, host="broker.lan:8080"), 421)

    def test_config(self) -> None:
        """C{[web] allowed_hosts} is checked at load, its error naming the key and file."""
        settings = config.load_string('[web]\nallowed_hosts = "broker.example.com, *.example.org"\n')
        self.assertEqual(settings.section("web").hosts, ("broker.example.com", "*.example.org"))
        path = Path(self.mktemp())
        for bad in ("https://broker.example.com", "broker.example.com:8080", "a/b"):
            path.write_text(f'[web]\nallowed_hosts = "{bad}"\n')
            with self.assertRaises(config.ConfigError) as e:
                config.load(str(path))
            self.assertIn("web.allowed_hosts", str(e.exception))
            self.assertIn(str(path), str(e.exception))


class OriginTests(unittest.TestCase):
    def setUp(self) -> None:
        self.guard = Guard(HostRule.for_listener(()), ("https://app.example",))

    def test_rule(self) -> None:
        self.assertTrue(origin_allowed(None, "localhost", False, ()))
        self.assertTrue(origin_allowed("http://localhost:8080", "localhost:8080", False, ()))
        self.assertFalse(origin_allowed("http://localhost:8080", "localhost:8080", True, ()))
        self.assertFalse(origin_allowed("null", "localhost", False, ()))
        self.assertTrue(origin_allowed("null", "localhost", False, ("*",)))

    def test_every_method(self) -> None:
        for method in ("GET", "POST", "OPTIONS", "DELETE"):
            self.assertEqual(verdict(self.guard, method, host="localhost:8080", origin="http://evil.example"), 403)
            self.assertEqual(verdict(self.guard, method, host="localhost:8080", origin="null"), 403)
            self.assertEqual(verdict(self.guard, method, host="localhost:8080", origin="http://localhost:8080"), 200)
            self.assertEqual(verdict(self.guard, method, host="localhost:8080", origin="https://app.example"), 200)
            self.assertEqual(verdict(self.guard, method, host="localhost:8080"), 200)

    def test_sockjs_test_services_exempt(self) -> None:
        """The protocol's test services (its suite sends foreign origins) are
        exempt; the STOMP SockJS endpoint is not."""
        self.assertEqual(verdict(self.guard, "GET", "/sockjs_test/echo/info", host="localhost",
                                 origin="null"), 200)
        self.assertEqual(verdict(self.guard, "GET", "/sockjs/info", host="localhost", origin="null"), 403)


class BodyTests(unittest.TestCase):
    """What a cross-site form (or a no-cors fetch) can send is refused."""

    def setUp(self) -> None:
        self.guard = Guard(HostRule.for_listener(()))

    def check(self, method: str, path: str, body: int = 0, **hdrs: str) -> int:
        return verdict(self.guard, method, path, body, host="localhost", **hdrs)

    def test_forms_refused(self) -> None:
        for kind in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain",
                     "text/plain;charset=UTF-8", "application/octet-stream"):
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                self.assertEqual(self.check(method, f"{Q}/q/receive", 10, content_type=kind), 415, kind)
                self.assertEqual(self.check(method, f"{Q}/q/receive", 0, content_type=kind), 415, kind)
        self.assertEqual(self.check("POST", f"{Q}/q/receive", 10), 415)  # a body, no type (a Blob)

    def test_json_avro_or_nothing(self) -> None:
        self.assertEqual(self.check("POST", f"{Q}/q/receive"), 200)
        self.assertEqual(self.check("DELETE", f"{Q}/q"), 200)
        for kind in ("application/json", "application/json; charset=utf-8", "application/problem+json",
                     "avro/binary", "application/avro"):
            self.assertEqual(self.check("POST", f"{Q}/q/messages", 10, content_type=kind), 200, kind)

    def test_safe_methods_any_body(self) -> None:
        self.assertEqual(self.check("GET", f"{Q}/q", 10, content_type="text/plain"), 200)

    def test_sockjs_form_transports(self) -> None:
        """SockJS's sending and receiving POSTs are form-like by protocol;
        other SockJS paths follow the rule."""
        for transport in ("xhr", "xhr_streaming", "xhr_send", "jsonp_send"):
            for mount in ("/sockjs", "/sockjs_test/echo"):
                path = f"{mount}/000/abc/{transport}"
                self.assertEqual(self.check("POST", path, 5, content_type="text/plain"), 200, path)
        self.assertEqual(self.check("POST", "/sockjs/000/abc/jsonp_send", 5,
                                    content_type="application/x-www-form-urlencoded"), 200)
        self.assertEqual(self.check("POST", "/sockjs/info", 5, content_type="text/plain"), 415)
        self.assertEqual(self.check("POST", f"{Q}/xhr_send", 5, content_type="text/plain"), 415)
        # ... and their origin is checked all the same.
        self.assertEqual(self.check("POST", "/sockjs/000/abc/xhr_send", 5, content_type="text/plain",
                                    origin="http://evil.example"), 403)


class SiteTests(unittest.TestCase):
    """The gate in front of the real site: the probe's cross-site receive,
    and one verdict for the API, a WebSocket upgrade and SockJS."""

    def setUp(self) -> None:
        self.ctx = make_context()
        self.factory = HttpFactory(self.ctx)
        self.client = Client(self.factory)

    def send(self, method: str, path: str, body: bytes = b"", host: str = "localhost:15674",
             **hdrs: str) -> tuple[int, dict[str, str], bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
        for name, value in hdrs.items():
            head += f"{name.replace('_', '-')}: {value}\r\n"
        if body or method in ("POST", "PUT"):
            head += f"Content-Length: {len(body)}\r\n"
        self.client.send(head.encode() + b"\r\n" + body)
        return split(self.client.response())

    def publish(self, n: int) -> None:
        body = json.dumps({"messages": [{"body": str(i)} for i in range(n)]}).encode()
        status, _, doc = self.send("POST", f"{Q}/q/messages", body, content_type="application/json")
        self.assertEqual(status, 201, doc)

    def test_cross_site_form_cannot_hide_messages(self) -> None:
        """The probe: a form posting C{max=10000&visibility=43200} to
        C{receive} (with its Origin, without it as an old browser, as text/plain,
        or as a no-cors fetch of a Blob) hides nothing."""
        self.publish(3)
        form = b"max=10000&visibility=43200"
        query = "?max=10000&visibility=43200"
        attempts = [
            (form, {"content_type": "application/x-www-form-urlencoded", "origin": "http://evil.example"}),
            (form, {"content_type": "application/x-www-form-urlencoded"}),
            (b"", {"content_type": "application/x-www-form-urlencoded"}),
            (b"a=b", {"content_type": "text/plain"}),
            (b"--x--", {"content_type": "multipart/form-data; boundary=x"}),
            (b"{}", {}),
            (b"", {"origin": "http://evil.example"}),
            (b"", {"origin": "null"}),
        ]
        for body, hdrs in attempts:
            status, headers, text = self.send("POST", f"{Q}/q/receive{query}", body, **hdrs)
            self.assertIn(status, (403, 415), (body, hdrs))
            self.assertEqual(headers["content-type"], "application/problem+json")
            self.assertEqual(json.loads(text)["status"], status)
        status, _, text = self.send("POST", f"{Q}/q/receive?max=10", content_type="application/json",
                                    origin="http://localhost:15674")
        self.assertEqual(status, 200)
        self.assertEqual([m["body"] for m in json.loads(text)["messages"]], ["0", "1", "2"])

    def test_rebound_host_refused_everywhere(self) -> None:
        """A page on a rebound name (its Origin matching its Host) gets 421
        from the API, the WebSocket endpoint and SockJS, before anything."""
        rebound = {"host": "rebound.example:15674", "origin": "http://rebound.example:15674"}
        upgrade = {"upgrade": "websocket", "connection": "Upgrade", "sec_websocket_version": "13",
                   "sec_websocket_key": "dGhlIHNhbXBsZSBub25jZQ=="}
        for method, path, extra in (
            ("GET", "/api/v1/vhosts", {}),
            ("POST", f"{Q}/q/receive", {}),
            ("GET", "/ws", upgrade),
            ("GET", "/sockjs/websocket", upgrade),
            ("GET", "/sockjs/info", {}),
            ("POST", "/sockjs/000/abcd/xhr", {}),
        ):
            status, _, text = self.send(method, path, **rebound, **extra)
            self.assertEqual((status, json.loads(text)["code"]), (421, "host-not-allowed"), path)
        self.assertEqual(len(self.ctx.connections.connections("http:test/sockjs")), 0)

    def test_one_verdict_for_every_frontend(self) -> None:
        """The same Host and Origin get the same answer from the API, a
        WebSocket upgrade and SockJS: let through (the frontend answers
        with its own status) or refused by the gate."""
        upgrade = {"upgrade": "websocket", "connection": "Upgrade", "sec_websocket_version": "13",
                   "sec_websocket_key": "dGhlIHNhbXBsZSBub25jZQ=="}
        cases = [
            ({"host": "localhost:15674"}, None),
            ({"host": "localhost:15674", "origin": "http://localhost:15674"}, None),
            ({"host": "127.0.0.1:15674", "origin": "http://127.0.0.1:15674"}, None),
            ({"host": "localhost:15674", "origin": "http://evil.example"}, 403),
            ({"host": "localhost:15674", "origin": "null"}, 403),
            ({"host": "localhost:15674", "origin": "https://localhost:15674"}, 403),
            ({"host": "evil.example:15674", "origin": "http://evil.example:15674"}, 421),
            ({"host": "evil.example:15674"}, 421),
        ]
        for n, (hdrs, refused) in enumerate(cases):
            verdicts = []
            for method, path, extra in (
                ("GET", "/api/v1/vhosts", {}),
                ("GET", "/ws", upgrade),
                ("GET", "/sockjs/info", {}),
                ("POST", f"/sockjs/000/s{n}/xhr", {}),
            ):
                self.client = Client(self.factory)
                data = self.client.transport
                status = self.send(method, path, **hdrs, **extra)[0] if "upgrade" not in extra else None
                if status is None:
                    head = f"{method} {path} HTTP/1.1\r\n" + "".join(
                        f"{k.replace('_', '-')}: {v}\r\n" for k, v in {**hdrs, **extra}.items())
                    self.client.send(head.encode() + b"\r\n")
                    status = int(data.value().split()[1])
                verdicts.append(status if status in (403, 421) else None)
            self.assertEqual(verdicts, [refused] * 4, hdrs)


class DefaultConfigTests(unittest.TestCase):
    def test_defaults(self) -> None:
        web = config.load_string("").section("web")
        self.assertEqual((web.allowed_hosts, web.head_timeout), ("", 10.0))

    def test_site_guard_trusts_cors_origins(self) -> None:
        ctx = make_context('[web]\nallowed_origins = "https://a.example"\n'
                           '[http_api]\ncors_origins = "https://b.example"\n')
        factory: Any = HttpFactory(ctx)
        self.assertEqual(factory.site.guard.origins, ("https://a.example", "https://b.example"))
        self.assertIs(ctx.guard, factory.site.guard)
