"""The sockjs-protocol suite's checks against QMQ's SockJS resource and test services.

The classes follow the current suite (sockjs-protocol's main branch,
C{sockjs-protocol.py}, the one sockjs-node passes; written anew here, not
copied): BaseUrlGreeting, IframePage, InfoTest, SessionURLs, Protocol,
WebsocketHttpErrors, XhrPolling, XhrStreaming, EventSource, HtmlFile,
JsonPolling, JsessionidCookie, JSONEncoding, HandlingClose, Http10/Http11:
the same requests and expectations, through twisted.web's real HTTP parser,
with the sessions' timers on a L{Clock}. The checks that need a real
WebSocket (Websocket, RawWebsocket) are in tests.integration.test_sockjs;
the suite's C{Websocket.test_haproxy} (a hixie-76 handshake, a protocol no
browser has spoken since 2011) has no counterpart: autobahn does not speak
it.
"""

from __future__ import annotations

import json
import re
import uuid

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from qmq.web.sockjs.services import build_test_services
from tests.sockjs_http import Exchange

NO_CACHE = "no-store, no-cache, no-transform, must-revalidate, max-age=0"

# The suite's escapable_by_client (what sockjs-client escapes) and
# escapable_by_server.
_CLIENT_ESCAPES = re.compile(
    "[\\\\\"\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0604\u070f\u17b4\u17b5\u2000-\u20ff\ufeff"
    "\ufff0-\uffff\u0300-\u0333\u033d-\u0346\u034a-\u034c\u0350-\u0352\u0357-\u0358"
    "\u035c-\u0362\u0374\u037e\u0387\u0591-\u05af\u05c4\u0610-\u0617\u0653-\u0654"
    "\u0657-\u065b\u065d-\u065e\u06df-\u06e2\u06eb-\u06ec\u0730\u0732-\u0733"
    "\u0735-\u0736\u073a\u073d\u073f-\u0741\u0743\u0745\u0747\u07eb-\u07f1\u0951"
    "\u0958-\u095f\u09dc-\u09dd\u09df\u0a33\u0a36\u0a59-\u0a5b\u0a5e\u0b5c-\u0b5d"
    "\u0e38-\u0e39\u0f43\u0f4d\u0f52\u0f57\u0f5c\u0f69\u0f72-\u0f76\u0f78\u0f80-\u0f83"
    "\u0f93\u0f9d\u0fa2\u0fa7\u0fac\u0fb9\u1939-\u193a\u1a17\u1b6b\u1cda-\u1cdb"
    "\u1dc0-\u1dcf\u1dfc\u1dfe\u1f71\u1f73\u1f75\u1f77\u1f79\u1f7b\u1f7d\u1fbb\u1fbe"
    "\u1fc9\u1fcb\u1fd3\u1fdb\u1fe3\u1feb\u1fee-\u1fef\u1ff9\u1ffb\u1ffd\u2000-\u2001"
    "\u20d0-\u20d1\u20d4-\u20d7\u20e7-\u20e9\u2126\u212a-\u212b\u2329-\u232a\u2adc"
    "\u302b-\u302c\uaab2-\uaab3\uf900-\ufa0d\ufa10\ufa12\ufa15-\ufa1e\ufa20\ufa22"
    "\ufa25-\ufa26\ufa2a-\ufa2d\ufa30-\ufa6d\ufa70-\ufad9\ufb1d\ufb1f\ufb2a-\ufb36"
    "\ufb38-\ufb3c\ufb3e\ufb40-\ufb41\ufb43-\ufb44\ufb46-\ufb4e]"
)
_SERVER_ESCAPES = re.compile("[\x00-\x1f\u200c-\u200f\u2028-\u202f\u2060-\u206f\ufff0-\uffff]")
CLIENT_KILLER = '"' + "".join(
    f"\\u{i:04x}" for i in range(65536) if _CLIENT_ESCAPES.match(chr(i))
) + '"'
SERVER_KILLER = '"' + "".join(
    f"\\u{i:04x}" for i in range(255, 65536) if _SERVER_ESCAPES.match(chr(i))
) + '"'


class Test(SynchronousTestCase):
    """The suite's helpers, over an in-memory Site."""

    def setUp(self) -> None:
        self.clock = Clock()
        root = Resource()
        root.putChild(b"t", build_test_services(clock=self.clock))
        self.site = Site(root, reactor=self.clock)

    def url(self, service: str = "echo") -> str:
        return f"/t/{service}"

    def session(self, service: str = "echo") -> str:
        return f"/t/{service}/000/{uuid.uuid4()}"

    def GET(self, path: str, **headers: str) -> Exchange:
        return Exchange(self.site, "GET", path, headers=headers)

    def POST(self, path: str, body: str | bytes = b"", **headers: str) -> Exchange:
        return Exchange(self.site, "POST", path, body, headers=headers)

    def OPTIONS(self, path: str, **headers: str) -> Exchange:
        return Exchange(self.site, "OPTIONS", path, headers=headers)

    def verify404(self, r: Exchange) -> None:
        self.assertEqual(r.status, 404)

    def verify405(self, r: Exchange) -> None:
        self.assertEqual(r.status, 405)
        self.assertIsNone(r.header("content-type"))
        self.assertTrue(r.header("allow"))
        self.assertEqual(r.body, b"")

    def verify_content_type(self, r: Exchange, content_type: str) -> None:
        self.assertEqual(r.header("content-type").replace(" ", ""), content_type)

    def verify_options(self, path: str, allowed: str) -> None:
        for origin in (None, "test", "null"):
            headers = {"Access-Control-Request-Method": allowed}
            if origin:
                headers["Origin"] = origin
            r = self.OPTIONS(path, **headers)
            self.assertEqual(r.status, 204)
            self.assertIn("public", r.header("cache-control"))
            self.assertRegex(r.header("cache-control"), "max-age=[1-9][0-9]{6}")
            self.assertTrue(r.header("expires"))
            self.assertGreater(int(r.header("access-control-max-age")), 1000000)
            self.assertEqual(r.header("access-control-allow-methods"), allowed)
            self.assertEqual(r.body, b"")
            self.verify_cors(r, origin)

    def verify_no_cookie(self, r: Exchange) -> None:
        self.assertIsNone(r.header("set-cookie"))

    def verify_cors(self, r: Exchange, origin: str | None = None) -> None:
        """The page's origin echoed with credentials (C{null} too: browsers
        refuse C{*} with credentials); C{*} without them when no origin."""
        if origin:
            self.assertEqual(r.header("access-control-allow-origin"), origin)
            self.assertEqual(r.header("access-control-allow-credentials"), "true")
        else:
            self.assertEqual(r.header("access-control-allow-origin"), "*")
            self.assertIsNone(r.header("access-control-allow-credentials"))

    def verify_not_cached(self, r: Exchange) -> None:
        self.assertEqual(r.header("cache-control"), NO_CACHE)
        self.assertIsNone(r.header("expires"))
        self.assertIsNone(r.header("last-modified"))


class BaseUrlGreeting(Test):
    def test_greeting(self) -> None:
        for url in (self.url(), self.url() + "/"):
            r = self.GET(url)
            self.assertEqual(r.status, 200)
            self.verify_content_type(r, "text/plain;charset=UTF-8")
            self.assertEqual(r.text, "Welcome to SockJS!\n")
            self.verify_no_cookie(r)

    def test_notFound(self) -> None:
        for suffix in ("/a", "/a.html", "//", "///", "/a/a", "/a/a/", "/a/"):
            self.verify404(self.GET(self.url() + suffix))


class IframePage(Test):
    iframe_body = re.compile(
        r"""^<!DOCTYPE html>
<html>
<head>
  <meta http-equiv="X-UA-Compatible" content="IE=edge" />
  <meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
  <script src="(?P<sockjs_url>[^"]*)"></script>
  <script>
    document.domain = document.domain;
    SockJS.bootstrap_iframe\(\);
  </script>
</head>
<body>
  <h2>Don't panic!</h2>
  <p>This is a SockJS hidden iframe. It's used for cross domain magic.</p>
</body>
</html>$"""
    )

    def verify(self, path: str) -> None:
        r = self.GET(path)
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "text/html;charset=UTF-8")
        self.assertIn("public", r.header("cache-control"))
        self.assertRegex(r.header("cache-control"), "max-age=[1-9][0-9]{6}")
        self.assertTrue(r.header("expires"))
        self.assertTrue(r.header("etag"))
        self.assertIsNone(r.header("last-modified"))
        match = self.iframe_body.match(r.text.strip())
        self.assertTrue(match)
        url = match.group("sockjs_url")
        self.assertTrue(url.startswith("/") or url.startswith("http"))
        self.verify_no_cookie(r)

    def test_simpleUrl(self) -> None:
        self.verify(self.url() + "/iframe.html")

    def test_versionedUrl(self) -> None:
        for suffix in ("/iframe-a.html", "/iframe-.html", "/iframe-0.1.2.html",
                       "/iframe-0.1.2abc-dirty.2144.html"):
            self.verify(self.url() + suffix)

    def test_queriedUrl(self) -> None:
        for suffix in ("/iframe-a.html?t=1234", "/iframe-0.1.2.html?t=123414",
                       "/iframe-0.1.2abc-dirty.2144.html?t=qweqweq123"):
            self.verify(self.url() + suffix)

    def test_invalidUrl(self) -> None:
        for suffix in ("/iframe.htm", "/iframe", "/IFRAME.HTML", "/IFRAME", "/iframe.HTML",
                       "/iframe.xml", "/iframe-/.html"):
            self.verify404(self.GET(self.url() + suffix))

    def test_cacheability(self) -> None:
        r1 = self.GET(self.url() + "/iframe.html")
        r2 = self.GET(self.url() + "/iframe.html")
        self.assertEqual(r1.header("etag"), r2.header("etag"))
        self.assertTrue(r1.header("etag"))
        r = self.GET(self.url() + "/iframe.html", **{"If-None-Match": r1.header("etag")})
        self.assertEqual(r.status, 304)
        self.assertIsNone(r.header("content-type"))
        self.assertEqual(r.body, b"")


class InfoTest(Test):
    def test_basic(self) -> None:
        r = self.GET(self.url() + "/info", Origin="test")
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "application/json;charset=UTF-8")
        self.verify_no_cookie(r)
        self.verify_not_cached(r)
        self.verify_cors(r, "test")
        self.verify_cors(self.GET(self.url() + "/info"))
        data = json.loads(r.body)
        self.assertIs(data["websocket"], True)
        self.assertIn(data["cookie_needed"], (True, False))
        self.assertEqual(data["origins"], ["*:*"])
        self.assertIsInstance(data["entropy"], int)
        self.assertTrue(0 <= data["entropy"] < 2**32)

    def test_entropy(self) -> None:
        e1 = json.loads(self.GET(self.url() + "/info").body)["entropy"]
        e2 = json.loads(self.GET(self.url() + "/info").body)["entropy"]
        self.assertNotEqual(e1, e2)

    def test_options(self) -> None:
        self.verify_options(self.url() + "/info", "OPTIONS, GET")

    def test_options_null_origin(self) -> None:
        """A page from C{file:} (or a sandbox) sends C{Origin: null}: the
        answer is C{null} with credentials (C{*} with credentials is a pair
        browsers reject)."""
        r = self.OPTIONS(self.url() + "/info", Origin="null",
                         **{"Access-Control-Request-Method": "POST"})
        self.assertEqual(r.status, 204)
        self.assertEqual(r.body, b"")
        self.assertEqual(r.header("access-control-allow-origin"), "null")
        self.assertEqual(r.header("access-control-allow-credentials"), "true")

    def test_disabled_websocket(self) -> None:
        r = self.GET(self.url("disabled_websocket_echo") + "/info")
        self.assertEqual(r.status, 200)
        self.assertIs(json.loads(r.body)["websocket"], False)


class SessionURLs(Test):
    def verify(self, part: str) -> None:
        r = self.POST(self.url() + part + "/xhr")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.text, "o\n")

    def test_anyValue(self) -> None:
        self.verify("/a/a")
        for part in ("/_/_", "/1/1", "/abcdefgh_i-j%20/abcdefg_i-j%20"):
            self.verify(part)

    def test_invalidPaths(self) -> None:
        for suffix in ("//", "/a./a", "/a/a.", "/./.", "/", "///"):
            self.verify404(self.GET(self.url() + suffix + "/xhr"))
            self.verify404(self.POST(self.url() + suffix + "/xhr"))

    def test_ignoringServerId(self) -> None:
        sid = str(uuid.uuid4())
        r = self.POST(self.url() + f"/000/{sid}/xhr")
        self.assertEqual(r.text, "o\n")
        r = self.POST(self.url() + f"/000/{sid}/xhr_send", '["a"]')
        self.assertEqual(r.status, 204)
        self.assertEqual(r.body, b"")
        r = self.POST(self.url() + f"/999/{sid}/xhr")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.text, 'a["a"]\n')


class Protocol(Test):
    def test_simpleSession(self) -> None:
        url = self.session()
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, "o\n"))
        r = self.POST(url + "/xhr_send", '["a"]')
        self.assertEqual((r.status, r.body), (204, b""))
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, 'a["a"]\n'))
        self.verify404(self.POST(self.url() + "/000/bad_session/xhr_send", '["a"]'))
        r1 = self.POST(url + "/xhr")
        r2 = self.POST(url + "/xhr")
        self.assertEqual(r2.text, 'c[2010,"Another connection still open"]\n')
        self.assertEqual(r2.status, 200)
        r1.close()

    def test_timeout_and_heartbeat(self) -> None:
        """A session without a receiving connection for 5 s is gone; a
        waiting poll gets C{h} after 25 s."""
        url = self.session()
        self.POST(url + "/xhr")
        r = self.POST(url + "/xhr")
        self.clock.advance(24.9)
        self.assertFalse(r.finished)
        self.clock.advance(0.2)
        self.assertEqual(r.text, "h\n")
        self.clock.advance(5.1)
        self.verify404(self.POST(url + "/xhr_send", '["a"]'))
        r = self.POST(url + "/xhr")
        self.assertEqual(r.text, "o\n")  # a new session

    def test_closeSession(self) -> None:
        url = self.session("close")
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, "o\n"))
        for _ in range(2):
            r = self.POST(url + "/xhr")
            self.assertEqual((r.status, r.text), (200, 'c[3000,"Go away!"]\n'))


class WebsocketHttpErrors(Test):
    def test_httpMethod(self) -> None:
        r = self.GET(self.url() + "/0/0/websocket")
        self.assertEqual(r.status, 400)
        self.assertIn('Can "Upgrade" only to "WebSocket".', r.text)

    def test_invalidConnectionHeader(self) -> None:
        r = self.GET(self.url() + "/0/0/websocket", Upgrade="WebSocket", Connection="close")
        self.assertEqual(r.status, 400)
        self.assertIn('"Connection" must be "Upgrade".', r.text)

    def test_invalidMethod(self) -> None:
        for h in ({"Upgrade": "WebSocket", "Connection": "Upgrade"}, {}):
            self.verify405(self.POST(self.url() + "/0/0/websocket", **h))

    def test_disabled(self) -> None:
        self.verify404(self.GET(self.url("disabled_websocket_echo") + "/0/0/websocket",
                                Upgrade="WebSocket", Connection="Upgrade"))


class XhrPolling(Test):
    def test_options(self) -> None:
        for suffix in ("/xhr", "/xhr_send"):
            self.verify_options(self.url() + "/abc/abc" + suffix, "OPTIONS, POST")

    def test_transport(self) -> None:
        url = self.session()
        r = self.POST(url + "/xhr", Origin="test")
        self.assertEqual((r.status, r.text), (200, "o\n"))
        self.verify_content_type(r, "application/javascript;charset=UTF-8")
        self.verify_cors(r, "test")
        self.verify_not_cached(r)
        r = self.POST(url + "/xhr_send", '["x"]', Origin="test")
        self.assertEqual((r.status, r.body), (204, b""))
        self.assertEqual(r.header("content-type"), "text/plain; charset=UTF-8")
        self.verify_cors(r, "test")
        self.verify_not_cached(r)
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, 'a["x"]\n'))

    def test_invalid_session(self) -> None:
        self.verify404(self.POST(self.session() + "/xhr_send", '["x"]'))

    def test_invalid_json(self) -> None:
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        r = self.POST(url + "/xhr_send", '["x')
        self.assertEqual(r.status, 500)
        self.assertIn("Broken JSON encoding.", r.text)
        r = self.POST(url + "/xhr_send", "")
        self.assertEqual(r.status, 500)
        self.assertIn("Payload expected.", r.text)
        r = self.POST(url + "/xhr_send", '["a"]')
        self.assertEqual((r.status, r.body), (204, b""))
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, 'a["a"]\n'))

    def test_content_types(self) -> None:
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        ctypes = ["text/plain", "T", "application/json", "application/xml", "",
                  "application/json; charset=utf-8", "text/xml; charset=utf-8", "text/xml"]
        for ct in ctypes:
            r = self.POST(url + "/xhr_send", '["a"]', **{"Content-Type": ct})
            self.assertEqual((r.status, r.body), (204, b""))
        r = self.POST(url + "/xhr")
        self.assertEqual(r.text, "a[" + ",".join(['"a"'] * len(ctypes)) + "]\n")

    def test_request_headers_cors(self) -> None:
        preflight = {"Origin": "test", "Access-Control-Request-Method": "POST"}
        r = self.OPTIONS(self.session() + "/xhr",
                         **preflight, **{"Access-Control-Request-Headers": "a, b, c"})
        self.assertEqual(r.status, 204)
        self.verify_cors(r, "test")
        self.assertEqual(r.header("access-control-allow-headers"), "a, b, c")
        r = self.OPTIONS(self.session() + "/xhr",
                         **preflight, **{"Access-Control-Request-Headers": ""})
        self.verify_cors(r, "test")
        self.assertIsNone(r.header("access-control-allow-headers"))
        r = self.OPTIONS(self.session() + "/xhr", **preflight)
        self.verify_cors(r, "test")
        self.assertIsNone(r.header("access-control-allow-headers"))
        # And on the request itself.
        r = self.POST(self.session() + "/xhr", **{"Access-Control-Request-Headers": "a, b, c"})
        self.assertEqual(r.status, 200)
        self.verify_cors(r)
        self.assertEqual(r.header("access-control-allow-headers"), "a, b, c")

    def test_sending_empty_frame(self) -> None:
        """A send with no messages (a client's own heart-beat) is fine."""
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        self.assertEqual(self.POST(url + "/xhr_send", "[]").status, 204)
        self.assertEqual(self.POST(url + "/xhr_send", '["a"]').status, 204)
        r = self.POST(url + "/xhr")
        self.assertEqual((r.status, r.text), (200, 'a["a"]\n'))

    def test_payload_too_large(self) -> None:
        url = self.session()
        self.POST(url + "/xhr")
        r = self.POST(url + "/xhr_send", '["' + "x" * (17 * 1024 * 1024) + '"]')
        self.assertEqual(r.status, 413)
        self.assertIn("max_payload_bytes", json.loads(r.body)["detail"])


class XhrStreaming(Test):
    def test_options(self) -> None:
        self.verify_options(self.url() + "/abc/abc/xhr_streaming", "OPTIONS, POST")

    def test_transport(self) -> None:
        url = self.session()
        r = self.POST(url + "/xhr_streaming", Origin="test")
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "application/javascript;charset=UTF-8")
        self.verify_cors(r, "test")
        self.verify_not_cached(r)
        self.assertEqual(r.read(), "h" * 2048 + "\n" + "o\n")
        r1 = self.POST(url + "/xhr_send", '["x"]')
        self.assertEqual((r1.status, r1.body), (204, b""))
        self.assertEqual(r.read(), 'a["x"]\n')
        self.assertFalse(r.finished)

    def test_response_limit(self) -> None:
        url = self.session()
        r = self.POST(url + "/xhr_streaming")
        self.assertEqual(r.read(), "h" * 2048 + "\no\n")
        msg = '"' + "x" * 128 + '"'
        for _ in range(31):
            self.assertFalse(r.finished)
            r1 = self.POST(url + "/xhr_send", "[" + msg + "]")
            self.assertEqual(r1.status, 204)
            self.assertEqual(r.read(), "a[" + msg + "]\n")
        self.assertTrue(r.finished)

    def test_slow_reader_gets_nothing_more(self) -> None:
        """A stream whose client stops reading (the socket's buffer is full)
        gets no more writes; messages wait in the session until it drains."""
        url = self.session()
        r = self.POST(url + "/xhr_streaming")
        r.read()
        r.transport.producer.pauseProducing()  # what the transport does when its buffer fills
        self.POST(url + "/xhr_send", '["x"]')
        self.assertEqual(r.read(), "")
        r.transport.producer.resumeProducing()
        self.assertEqual(r.read(), 'a["x"]\n')


class EventSource(Test):
    def test_transport(self) -> None:
        url = self.session()
        r = self.GET(url + "/eventsource")
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "text/event-stream")
        self.verify_not_cached(r)
        self.assertEqual(r.read(), "\r\ndata: o\r\n\r\n")
        r1 = self.POST(url + "/xhr_send", '["x"]')
        self.assertEqual((r1.status, r1.body), (204, b""))
        self.assertEqual(r.read(), 'data: a["x"]\r\n\r\n')
        r1 = self.POST(url + "/xhr_send", r'["  \u0000\n\r "]')
        self.assertEqual((r1.status, r1.body), (204, b""))
        self.assertEqual(r.read(), 'data: a["  \\u0000\\n\\r "]\r\n\r\n')

    def test_response_limit(self) -> None:
        url = self.session()
        r = self.GET(url + "/eventsource")
        self.assertEqual(r.read(), "\r\ndata: o\r\n\r\n")
        msg = '"' + "x" * 4096 + '"'
        self.assertEqual(self.POST(url + "/xhr_send", "[" + msg + "]").status, 204)
        self.assertEqual(r.read(), "data: a[" + msg + "]\r\n\r\n")
        self.assertTrue(r.finished)


class HtmlFile(Test):
    head = """<!doctype html>
<html><head>
  <meta http-equiv="X-UA-Compatible" content="IE=edge" />
  <meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
</head><body><h2>Don't panic!</h2>
  <script>
    document.domain = document.domain;
    var c = parent.%s;
    c.start();
    function p(d) {c.message(d);};
    window.onload = function() {c.stop();};
  </script>"""

    def test_transport(self) -> None:
        url = self.session()
        r = self.GET(url + "/htmlfile?c=%63allback")
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "text/html;charset=UTF-8")
        self.verify_not_cached(r)
        d = r.read()
        prelude, _, first = d.partition("\r\n\r\n")
        self.assertEqual(prelude.strip(), self.head % "callback")
        self.assertGreater(len(prelude), 1024)
        self.assertEqual(first, '<script>\np("o");\n</script>\r\n')
        r1 = self.POST(url + "/xhr_send", '["x"]')
        self.assertEqual((r1.status, r1.body), (204, b""))
        self.assertEqual(r.read(), '<script>\np("a[\\"x\\"]");\n</script>\r\n')

    def test_no_callback(self) -> None:
        r = self.GET(self.url() + "/a/a/htmlfile")
        self.assertEqual(r.status, 500)
        self.assertIn('"callback" parameter required', r.text)

    def test_bad_callback(self) -> None:
        r = self.GET(self.url() + "/a/a/htmlfile?c=alert(1)")
        self.assertEqual(r.status, 500)
        self.assertIn('invalid "callback" parameter', r.text)

    def test_response_limit(self) -> None:
        url = self.session()
        r = self.GET(url + "/htmlfile?c=callback")
        self.assertTrue(r.read().endswith('<script>\np("o");\n</script>\r\n'))
        msg = "x" * 4096
        self.assertEqual(self.POST(url + "/xhr_send", '["' + msg + '"]').status, 204)
        self.assertEqual(r.read(), '<script>\np("a[\\"' + msg + '\\"]");\n</script>\r\n')
        self.assertTrue(r.finished)


class JsonPolling(Test):
    FORM = {"Content-Type": "application/x-www-form-urlencoded"}

    def test_transport(self) -> None:
        url = self.session()
        r = self.GET(url + "/jsonp?c=%63allback")
        self.assertEqual(r.status, 200)
        self.verify_content_type(r, "application/javascript;charset=UTF-8")
        self.verify_not_cached(r)
        self.assertEqual(r.text, '/**/callback("o");\r\n')
        r = self.POST(url + "/jsonp_send", "d=%5B%22x%22%5D", **self.FORM)
        self.assertEqual((r.status, r.text), (200, "ok"))
        self.verify_content_type(r, "text/plain;charset=UTF-8")
        self.verify_not_cached(r)
        r = self.GET(url + "/jsonp?c=%63allback")
        self.assertEqual((r.status, r.text), (200, '/**/callback("a[\\"x\\"]");\r\n'))

    def test_no_callback(self) -> None:
        r = self.GET(self.url() + "/a/a/jsonp")
        self.assertEqual(r.status, 500)
        self.assertIn('"callback" parameter required', r.text)

    def test_invalid_callback(self) -> None:
        for callback in ("%20", "*", "abc(", "abc%28"):
            r = self.GET(self.url() + "/a/a/jsonp?c=" + callback)
            self.assertEqual(r.status, 500)
            self.assertIn('invalid "callback" parameter', r.text)

    def test_sending_empty_frame(self) -> None:
        url = self.session()
        self.assertEqual(self.GET(url + "/jsonp?c=x").text, '/**/x("o");\r\n')
        self.assertEqual(self.POST(url + "/jsonp_send", "d=%5B%5D", **self.FORM).text, "ok")
        self.assertEqual(self.POST(url + "/jsonp_send", "d=%5B%22x%22%5D", **self.FORM).text, "ok")
        r = self.GET(url + "/jsonp?c=x")
        self.assertEqual((r.status, r.text), (200, '/**/x("a[\\"x\\"]");\r\n'))

    def test_invalid_json(self) -> None:
        url = self.session()
        self.assertEqual(self.GET(url + "/jsonp?c=x").text, '/**/x("o");\r\n')
        r = self.POST(url + "/jsonp_send", "d=%5B%22x", **self.FORM)
        self.assertEqual(r.status, 500)
        self.assertIn("Broken JSON encoding.", r.text)
        for data in ("", "d=", "p=p"):
            r = self.POST(url + "/jsonp_send", data, **self.FORM)
            self.assertEqual(r.status, 500)
            self.assertIn("Payload expected.", r.text)
        self.assertEqual(self.POST(url + "/jsonp_send", "d=%5B%22b%22%5D", **self.FORM).text, "ok")
        r = self.GET(url + "/jsonp?c=x")
        self.assertEqual((r.status, r.text), (200, '/**/x("a[\\"b\\"]");\r\n'))

    def test_content_types(self) -> None:
        url = self.session()
        self.assertEqual(self.GET(url + "/jsonp?c=x").text, '/**/x("o");\r\n')
        self.assertEqual(self.POST(url + "/jsonp_send", "d=%5B%22abc%22%5D", **self.FORM).text,
                         "ok")
        self.assertEqual(self.POST(url + "/jsonp_send", '["%61bc"]',
                                   **{"Content-Type": "text/plain"}).text, "ok")
        r = self.GET(url + "/jsonp?c=x")
        self.assertEqual((r.status, r.text), (200, '/**/x("a[\\"abc\\",\\"%61bc\\"]");\r\n'))

    def test_close(self) -> None:
        url = self.session("close")
        self.assertEqual(self.GET(url + "/jsonp?c=x").text, '/**/x("o");\r\n')
        for _ in range(2):
            self.assertEqual(self.GET(url + "/jsonp?c=x").text,
                             '/**/x("c[3000,\\"Go away!\\"]");\r\n')


class JsessionidCookie(Test):
    def verify_cookie(self, r: Exchange, value: str = "dummy") -> None:
        parts = r.header("set-cookie").split(";")
        self.assertEqual(parts[0].strip(), f"JSESSIONID={value}")
        self.assertEqual(parts[1].strip().lower(), "path=/")

    def test_basic(self) -> None:
        r = self.GET(self.url("cookie_needed_echo") + "/info")
        self.assertEqual(r.status, 200)
        self.verify_no_cookie(r)
        self.assertIs(json.loads(r.body)["cookie_needed"], True)

    def test_xhr(self) -> None:
        r = self.POST(self.session("cookie_needed_echo") + "/xhr")
        self.assertEqual((r.status, r.text), (200, "o\n"))
        self.verify_cookie(r)
        r = self.POST(self.session("cookie_needed_echo") + "/xhr", Cookie="JSESSIONID=abcdef")
        self.assertEqual((r.status, r.text), (200, "o\n"))
        self.verify_cookie(r, "abcdef")

    def test_hostile_cookie_not_echoed(self) -> None:
        r = self.POST(self.session("cookie_needed_echo") + "/xhr", Cookie="JSESSIONID=a,b\x7f")
        self.verify_cookie(r)

    def test_streaming_transports(self) -> None:
        self.verify_cookie(self.POST(self.session("cookie_needed_echo") + "/xhr_streaming"))
        self.verify_cookie(self.GET(self.session("cookie_needed_echo") + "/eventsource"))
        self.verify_cookie(self.GET(self.session("cookie_needed_echo") + "/htmlfile?c=%63allback"))

    def test_jsonp(self) -> None:
        url = self.session("cookie_needed_echo")
        r = self.GET(url + "/jsonp?c=%63allback")
        self.assertEqual(r.status, 200)
        self.verify_cookie(r)
        self.assertEqual(r.text, '/**/callback("o");\r\n')
        r = self.POST(url + "/jsonp_send", "d=%5B%22x%22%5D",
                      **{"Content-Type": "application/x-www-form-urlencoded"})
        self.assertEqual((r.status, r.text), (200, "ok"))
        self.verify_cookie(r)

    def test_no_cookie_by_default(self) -> None:
        self.verify_no_cookie(self.POST(self.session() + "/xhr"))


class JSONEncoding(Test):
    def test_xhr_server_encodes(self) -> None:
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        payload = json.dumps([json.loads(SERVER_KILLER)], ensure_ascii=False)
        self.assertEqual(self.POST(url + "/xhr_send", payload.encode()).status, 204)
        r = self.POST(url + "/xhr")
        self.assertEqual(r.text.strip()[2:-1], SERVER_KILLER)

    def test_xhr_server_decodes(self) -> None:
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        self.assertEqual(self.POST(url + "/xhr_send", "[" + CLIENT_KILLER + "]").status, 204)
        r = self.POST(url + "/xhr")
        self.assertEqual(json.loads(r.text.strip()[2:-1]), json.loads(CLIENT_KILLER))


class HandlingClose(Test):
    def test_close_frame(self) -> None:
        url = self.session("close")
        r1 = self.POST(url + "/xhr_streaming")
        self.assertEqual(r1.read(), "h" * 2048 + '\no\nc[3000,"Go away!"]\n')
        r2 = self.POST(url + "/xhr_streaming")
        self.assertEqual(r2.read(), "h" * 2048 + '\nc[3000,"Go away!"]\n')
        self.assertTrue(r1.finished)
        self.assertTrue(r2.finished)

    def test_close_request(self) -> None:
        url = self.session()
        r1 = self.POST(url + "/xhr_streaming")
        self.assertEqual(r1.read(), "h" * 2048 + "\no\n")
        r2 = self.POST(url + "/xhr_streaming")
        self.assertEqual(r2.read(), "h" * 2048 + '\nc[2010,"Another connection still open"]\n')
        self.assertTrue(r2.finished)
        self.assertFalse(r1.finished)

    def test_abort_xhr_streaming(self) -> None:
        url = self.session()
        r1 = self.POST(url + "/xhr_streaming")
        r1.read()
        r2 = self.POST(url + "/xhr_streaming")
        self.assertTrue(r2.read().endswith('c[2010,"Another connection still open"]\n'))
        r1.abort()
        r3 = self.POST(url + "/xhr_streaming")
        self.assertIn(r3.read()[2049:], ("o\n", 'c[1002,"Connection interrupted"]\n'))

    def test_abort_xhr_polling(self) -> None:
        url = self.session()
        self.assertEqual(self.POST(url + "/xhr").text, "o\n")
        r1 = self.POST(url + "/xhr")
        r2 = self.POST(url + "/xhr")
        self.assertEqual(r2.text, 'c[2010,"Another connection still open"]\n')
        r1.abort()
        r3 = self.POST(url + "/xhr")
        self.assertIn(r3.text, ("o\n", 'c[1002,"Connection interrupted"]\n'))


class Http10(Test):
    def test_synchronous(self) -> None:
        r = Exchange(self.site, "GET", self.url(), headers={"Connection": "Keep-Alive"},
                     http="1.0")
        self.assertEqual(r.status, 200)
        self.assertIsNone(r.header("transfer-encoding"))
        self.assertEqual(int(r.header("content-length")), 19)
        self.assertEqual(r.text, "Welcome to SockJS!\n")

    def test_streaming(self) -> None:
        url = self.session("close")
        r = Exchange(self.site, "POST", url + "/xhr_streaming",
                     headers={"Connection": "Keep-Alive"}, http="1.0")
        self.assertEqual(r.status, 200)
        self.assertIsNone(r.header("transfer-encoding"))
        self.assertIsNone(r.header("content-length"))
        self.assertEqual(r.text, "h" * 2048 + '\no\nc[3000,"Go away!"]\n')
        self.assertTrue(r.transport.disconnecting)


class Http11(Test):
    def test_synchronous(self) -> None:
        r = Exchange(self.site, "GET", self.url(), headers={"Connection": "Keep-Alive"})
        self.assertEqual(int(r.header("content-length")), 19)
        self.assertIsNone(r.header("transfer-encoding"))
        self.assertFalse(r.transport.disconnecting)

    def test_streaming(self) -> None:
        r = self.POST(self.session("close") + "/xhr_streaming", Connection="Keep-Alive")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.header("transfer-encoding").lower(), "chunked")
        self.assertIsNone(r.header("content-length"))
        self.assertEqual(r.text, "h" * 2048 + '\no\nc[3000,"Go away!"]\n')
        self.assertTrue(r.finished)
