"""One identity, one operation, one verdict, over every frontend.

A real broker (``make_service``) on 127.0.0.1 with a STOMP listener and an
``http:`` listener (WebSocket at ``/stomp``, SockJS at ``/sockjs``, the
HTTP API at ``/api``); real clients: stomp.py over TCP (in threads),
autobahn over WebSocket and over SockJS's WebSocket transport, treq for
HTTP. Each row of L{TABLE} names an identity, an operation on a resource
and the verdict; each frontend that can say the operation does it on a
fresh connection and must get that verdict (a RECEIPT or a 2xx: allowed;
an ERROR ``access refused (...)`` or a 403: refused).

How each frontend says an operation (STOMP's grammar has no purge, delete
or bind of a named queue: those rows are HTTP's alone):

    declare       SUBSCRIBE /queue/NAME (queue arguments as headers) | PUT queue
    publish       SEND /queue/NAME, /topic/KEY, /exchange/NAME/KEY | POST .../messages
    receive       SUBSCRIBE /queue/NAME             | POST .../receive
    follow        SUBSCRIBE /topic/KEY              | GET .../topics/KEY/poll
    purge, delete, bind                             | DELETE .../messages, DELETE, POST bindings
    xdeclare (an exchange, with arguments)          | PUT exchange

An internal exchange (``hidden``) refuses every publish, whoever asks (carol
may do anything else); ``front`` hands what it routes nowhere to ``hidden``
(its ``alternate-exchange``), and declaring an exchange with an alternate
needs write on the alternate.

AMQP 0-9-1 (pika, in threads) says every operation: queue.declare,
exchange.declare, basic.publish (with confirms), basic.consume, a queue of its own bound to
amq.topic (follow), queue.purge, queue.bind, queue.delete; a refusal is a
channel.close 403.

Identities: ``bob`` (a password; his own ``bob.*`` queues and
``amq.topic``), ``carol`` (a password; every permission, but not other
owners' durable subscriptions) and ``web`` (a token of the virtual host,
every permission narrowed by its ``destinations`` to ``/queue/web.*`` and
``/topic/chat.*``). Every wait has a deadline.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pika
import pika.exceptions
import treq
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.threads import deferToThread
from twisted.trial import unittest
from twisted.web.client import HTTPConnectionPool

from qmq import config
from qmq.core.ownership import durable_queue_name
from qmq.service import make_service
from qmq.stomp.frame import StompParser, encode_frame
from tests import auth_toml
from tests.integration.test_sockjs import WebSocketClient
from tests.integration.test_stomppy_auth import AuthClient
from tests.integration.test_websocket import TIMEOUT, StompClient

SECRET = "the verdict tests' token secret, 32+ bytes"
FEED = durable_queue_name("alice", "feed")

ALLOWED, REFUSED = "allowed", "refused"


def dead_letters_to(target: str) -> dict[str, str]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target, "x-message-ttl": "1"}


#: (identity, operation, resource, arguments, verdict). C{{n}} in a name is
#: replaced per frontend and row, so a declare always makes a new queue.
TABLE: list[tuple[str, str, str, dict[str, str] | None, str]] = [
    ("bob", "declare", "bob.d{n}", None, ALLOWED),
    ("bob", "declare", "web.d{n}", None, REFUSED),
    ("web", "declare", "web.d{n}", None, ALLOWED),
    ("web", "declare", "bob.d{n}", None, REFUSED),
    ("bob", "declare", "bob.dl{n}", dead_letters_to("bob.box"), ALLOWED),
    ("bob", "declare", "bob.dl{n}", dead_letters_to("alice.inbox"), REFUSED),
    ("web", "declare", "web.dl{n}", dead_letters_to("alice.inbox"), REFUSED),
    ("carol", "declare", "carol.dl{n}", dead_letters_to("alice.inbox"), ALLOWED),
    ("carol", "declare", "carol.dl{n}", dead_letters_to(FEED), REFUSED),
    ("bob", "publish", "/queue/bob.box", None, ALLOWED),
    ("bob", "publish", "/queue/alice.inbox", None, REFUSED),
    ("web", "publish", "/queue/web.box", None, ALLOWED),
    ("web", "publish", "/queue/bob.box", None, REFUSED),
    ("carol", "publish", "/queue/alice.inbox", None, ALLOWED),
    ("carol", "publish", f"/queue/{FEED}", None, REFUSED),
    ("bob", "publish", "/topic/chat.a", None, ALLOWED),
    ("web", "publish", "/topic/chat.a", None, ALLOWED),
    ("web", "publish", "/topic/news", None, REFUSED),
    ("bob", "receive", "bob.box", None, ALLOWED),
    ("bob", "receive", "web.box", None, REFUSED),
    ("web", "receive", "web.box", None, ALLOWED),
    ("web", "receive", "bob.box", None, REFUSED),
    ("carol", "receive", FEED, None, REFUSED),
    ("bob", "follow", "chat.a", None, ALLOWED),
    ("web", "follow", "chat.a", None, ALLOWED),
    ("web", "follow", "news", None, REFUSED),
    ("bob", "purge", "bob.box", None, ALLOWED),
    ("bob", "purge", "web.box", None, REFUSED),
    ("web", "purge", "web.box", None, ALLOWED),
    ("carol", "purge", FEED, None, REFUSED),
    ("bob", "bind", "bob.box", None, ALLOWED),
    ("web", "bind", "web.box", None, ALLOWED),
    ("web", "bind", "bob.box", None, REFUSED),
    ("carol", "bind", FEED, None, REFUSED),
    ("bob", "delete", "bob.gone{n}", None, ALLOWED),
    ("bob", "delete", "web.box", None, REFUSED),
    ("web", "delete", "web.gone{n}", None, ALLOWED),
    ("carol", "delete", FEED, None, REFUSED),
    ("carol", "publish", "/exchange/hidden/k", None, REFUSED),
    ("bob", "publish", "/exchange/hidden/k", None, REFUSED),
    ("carol", "publish", "/exchange/front/nowhere", None, ALLOWED),
    ("bob", "xdeclare", "bob.x{n}", {"alternate-exchange": "bob.ae"}, ALLOWED),
    ("bob", "xdeclare", "bob.x{n}", {"alternate-exchange": "front"}, REFUSED),
    ("carol", "xdeclare", "carol.x{n}", {"alternate-exchange": "front"}, ALLOWED),
]

STOMP_OPERATIONS = ("declare", "publish", "receive", "follow")


def settings_for(directory: Path) -> config.Settings:
    key = directory / "token.key"
    key.write_text(SECRET + "\n")
    listen = [
        "stomp:tcp:0:interface=127.0.0.1",
        "http:tcp:0:interface=127.0.0.1",
        "amqp:tcp:0:interface=127.0.0.1",
    ]
    return config.load_string(
        "\n".join(
            [
                f"listen = {json.dumps(listen)}\ndata_dir = {json.dumps(str(directory / 'data'))}\n",
                "[auth]\nfailure_delay = 0.05\n",
                auth_toml.users(bob="builder", carol="carol"),
                auth_toml.permissions(
                    "app",
                    "bob",
                    configure=r"^bob\.",
                    write=r"^(bob\.|amq\.topic$)",
                    read=r"^(bob\.|amq\.topic$)",
                ),
                auth_toml.everything("app", "carol"),
                auth_toml.tokens("app", str(key), configure=".*", write=".*", read=".*"),
                auth_toml.queues("app", "alice.inbox", "bob.box", "web.box"),
            ]
        ),
        "qmq.toml",
    )


class VerdictTests(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        self.service = make_service(settings_for(directory), reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)
        stomp_listener, http_listener, amqp_listener = self.service.listeners
        self.amqp_port = amqp_listener.port.getHost().port
        self.stomp_port = stomp_listener.port.getHost().port
        self.http_port = http_listener.port.getHost().port
        self.vhost = self.service.broker.vhosts["app"]
        self.vhost.declare_queue(FEED, subscription=True)
        self.vhost.declare_exchange("hidden", "fanout", internal=True)
        self.vhost.declare_exchange("front", "direct", arguments={"alternate-exchange": "hidden"})
        self.vhost.declare_queue("caught")
        self.vhost.bind("caught", "hidden")
        self.token = jwt.encode(
            {
                "sub": "web",
                "exp": int(time.time()) + 600,
                "destinations": {
                    "configure": r"^/queue/web\.",
                    "write": r"^/(queue/web\.|topic/chat\.)",
                    "read": r"^/(queue/web\.|topic/chat\.)",
                },
            },
            SECRET,
            algorithm="HS256",
        )
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.sockets: list[Any] = []
        self.addCleanup(self._abort)
        self.names = itertools.count()

    def _abort(self) -> None:
        for proto in self.sockets:
            if proto.transport is not None and proto.transport.connected:
                proto.transport.abortConnection()

    def credentials(self, who: str) -> dict[str, str]:
        if who == "web":
            return {"passcode": self.token}
        return {"login": who, "passcode": {"bob": "builder", "carol": "carol"}[who]}

    # -- STOMP: the frame each operation is -----------------------------------------------

    @staticmethod
    def frame(operation: str, resource: str, arguments: dict[str, str] | None) -> tuple[str, dict[str, str]]:
        if operation == "publish":
            return "SEND", {"destination": resource, "receipt": "r"}
        destination = "/topic/" + resource if operation == "follow" else "/queue/" + resource
        return "SUBSCRIBE", {"destination": destination, "id": "s", "receipt": "r", **(arguments or {})}

    @staticmethod
    def stomp_verdict(frames: list, where: str) -> str:
        for f in frames:
            if f.command == "RECEIPT":
                return ALLOWED
            if f.command == "ERROR":
                message = f.headers.get("message", "")
                assert message.startswith("access refused ("), (where, message, f.body)
                return REFUSED
        raise AssertionError(f"{where}: neither RECEIPT nor ERROR in {frames}")

    def over_tcp(self, who: str, command: str, headers: dict[str, str]) -> defer.Deferred:
        def run() -> str:
            c = AuthClient("1.2", self.stomp_port)
            try:
                assert c.login(**self.credentials(who)) is not None, c.rec.errors
                c.conn.send_frame(command, headers)
                rec = c.rec
                rec.wait(lambda: rec.receipts or rec.errors, "RECEIPT or ERROR")
                if rec.receipts:
                    return ALLOWED
                message = rec.errors[0].headers.get("message", "")
                assert message.startswith("access refused ("), ("stomp.py", message, rec.errors[0].body)
                return REFUSED
            finally:
                if c.conn.is_connected():
                    # After an ERROR the broker closes the connection; stomp.py
                    # may still say connected while its socket is going.
                    try:
                        c.conn.disconnect()
                    except OSError:
                        pass

        return deferToThread(run)

    @defer.inlineCallbacks
    def over_websocket(self, who: str, command: str, headers: dict[str, str]) -> Any:
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{self.http_port}/stomp", protocols=["v12.stomp"])
        factory.protocol = StompClient
        factory.opened = defer.Deferred()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.http_port).connect(factory)
        client = yield factory.opened.addTimeout(TIMEOUT, reactor)
        self.sockets.append(client)
        connect = {"accept-version": "1.2", "host": "app", "heart-beat": "0,0", **self.credentials(who)}
        client.stomp(encode_frame("CONNECT", list(connect.items()), b"", "1.2"))
        [answer] = yield client.wait_frames(1)
        self.assertEqual(answer.command, "CONNECTED", answer.headers)
        client.frames.clear()
        client.stomp(encode_frame(command, list(headers.items()), b"", "1.2"))
        [reply] = yield client.wait_frames(1)
        client.sendClose(1000)
        return self.stomp_verdict([reply], "WebSocket")

    @defer.inlineCallbacks
    def over_sockjs(self, who: str, command: str, headers: dict[str, str]) -> Any:
        ws = WebSocketClient(f"ws://127.0.0.1:{self.http_port}/sockjs/000/{uuid.uuid4()}/websocket")
        yield defer.Deferred.fromCoroutine(ws.connect(self.http_port))
        self.sockets.append(ws.proto)
        opened = yield defer.Deferred.fromCoroutine(ws.recv())
        self.assertEqual(opened, "o")
        parser = StompParser()

        def send(command: str, headers: dict[str, str]) -> None:
            ws.send(json.dumps([encode_frame(command, list(headers.items()), b"", "1.2").decode()]))

        @defer.inlineCallbacks
        def next_frame() -> Any:
            got: list = []
            for _ in range(20):
                if got:
                    break
                text = yield defer.Deferred.fromCoroutine(ws.recv())
                if isinstance(text, str) and text.startswith("a"):
                    for m in json.loads(text[1:]):
                        got.extend(parser.feed(m.encode()))
            self.assertTrue(got, "no STOMP frame over SockJS")
            return got

        send("CONNECT", {"accept-version": "1.2", "host": "app", "heart-beat": "0,0", **self.credentials(who)})
        [answer] = yield next_frame()
        self.assertEqual(answer.command, "CONNECTED", answer.headers)
        send(command, headers)
        frames = yield next_frame()
        ws.close()
        return self.stomp_verdict(frames, "SockJS")

    # -- HTTP -------------------------------------------------------------------------------

    def http_headers(self, who: str) -> dict[str, str]:
        if who == "web":
            return {"Authorization": f"Bearer {self.token}"}
        creds = self.credentials(who)
        basic = base64.b64encode(f"{creds['login']}:{creds['passcode']}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}

    @defer.inlineCallbacks
    def over_http(self, who: str, operation: str, resource: str, arguments: dict[str, str] | None) -> Any:
        base = f"http://127.0.0.1:{self.http_port}/api/v1/vhosts/app"
        body: Any = None
        if operation == "declare":
            method, path = "PUT", f"/queues/{resource}"
            if arguments:
                body = {"arguments": {k: int(v) if v.isdigit() else v for k, v in arguments.items()}}
        elif operation == "publish":
            kind, _, name = resource[1:].partition("/")
            body = {"body": "x"}
            if kind == "exchange":
                name, _, body["routing_key"] = name.partition("/")
            method, path = "POST", f"/{kind}s/{name}/messages"
        elif operation == "xdeclare":
            method, path, body = "PUT", f"/exchanges/{resource}", {"type": "direct", "arguments": arguments}
        elif operation == "receive":
            method, path = "POST", f"/queues/{resource}/receive"
        elif operation == "follow":
            method, path = "GET", f"/topics/{resource}/poll"
        elif operation == "purge":
            method, path = "DELETE", f"/queues/{resource}/messages"
        elif operation == "delete":
            method, path = "DELETE", f"/queues/{resource}"
        else:
            method, path = "POST", "/bindings"
            body = {"queue": resource, "exchange": "amq.topic", "routing_key": "chat.b"}
        headers = self.http_headers(who)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        response = yield treq.request(method, base + path, data=data, headers=headers, pool=self.pool,
                                      timeout=TIMEOUT)
        content = yield response.content()
        if 200 <= response.code < 300:
            return ALLOWED
        self.assertEqual(response.code, 403, (method, path, content))
        return REFUSED

    def over_amqp(self, who: str, operation: str, resource: str, arguments: dict[str, str] | None) -> Any:
        creds = self.credentials(who)
        login = creds.get("login", "")
        passcode = creds["passcode"]
        arguments = {k: int(v) if v.isdigit() else v for k, v in (arguments or {}).items()} or None
        follow_queue = f"{who}.f{next(self.names)}"

        def run() -> str:
            params = pika.ConnectionParameters("127.0.0.1", self.amqp_port, virtual_host="app",
                                               credentials=pika.PlainCredentials(login, passcode),
                                               socket_timeout=TIMEOUT, blocked_connection_timeout=TIMEOUT)
            conn = pika.BlockingConnection(params)
            try:
                ch = conn.channel()
                if operation == "declare":
                    ch.queue_declare(resource, arguments=arguments)
                elif operation == "publish":
                    kind, _, name = resource[1:].partition("/")
                    ch.confirm_delivery()
                    if kind == "exchange":
                        exchange, _, key = name.partition("/")
                        ch.basic_publish(exchange, key, b"x")
                    else:
                        ch.basic_publish("" if kind == "queue" else "amq.topic", name, b"x")
                elif operation == "xdeclare":
                    ch.exchange_declare(resource, "direct", arguments=arguments)
                elif operation == "receive":
                    ch.basic_consume(resource, lambda *a: None)
                elif operation == "follow":
                    ch.queue_declare(follow_queue, exclusive=True)
                    ch.queue_bind(follow_queue, "amq.topic", resource)
                elif operation == "purge":
                    ch.queue_purge(resource)
                elif operation == "delete":
                    ch.queue_delete(resource)
                else:
                    ch.queue_bind(resource, "amq.topic", "chat.b")
                return ALLOWED
            except pika.exceptions.ChannelClosedByBroker as e:
                if e.reply_code != 403:
                    return f"{e.reply_code} {e.reply_text}"
                return REFUSED
            finally:
                if conn.is_open:
                    conn.close()

        return deferToThread(run)

    # -- the table --------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_one_verdict_per_row(self) -> Any:
        wrong = []
        for who, operation, resource, arguments, verdict in TABLE:
            got = {}
            for frontend in ("stomp.py", "WebSocket", "SockJS", "HTTP", "AMQP"):
                name = resource.format(n=next(self.names))
                if operation == "delete" and "{n}" in resource:
                    self.vhost.declare_queue(name)
                if frontend == "HTTP":
                    got[frontend] = yield self.over_http(who, operation, name, arguments)
                    continue
                if frontend == "AMQP":
                    got[frontend] = yield self.over_amqp(who, operation, name, arguments)
                    continue
                if operation not in STOMP_OPERATIONS:
                    continue
                command, headers = self.frame(operation, name, arguments)
                probe = {"stomp.py": self.over_tcp, "WebSocket": self.over_websocket,
                         "SockJS": self.over_sockjs}[frontend]
                got[frontend] = yield probe(who, command, headers)
            if set(got.values()) != {verdict}:
                wrong.append((who, operation, resource, arguments and sorted(arguments.items()), verdict, got))
        self.assertEqual(wrong, [])
        # Nothing reached another owner's durable subscription.
        self.assertEqual(len(self.vhost.queues[FEED]), 0)
        # Only what front routed nowhere reached the internal exchange.
        self.assertEqual({m.exchange for m in self.vhost.queues["caught"].messages()}, {"front"})
