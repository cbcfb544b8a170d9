"""STOMP over WebSocket logs in and is authorized like STOMP over TCP: a
real broker with users, autobahn's WebSocket client on real sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.trial import unittest

from qmq import config
from qmq.auth import hash_password
from qmq.service import make_service
from tests.integration.test_websocket import TIMEOUT, StompClient


class WebSocketAuthTests(unittest.TestCase):
    def setUp(self) -> None:
        settings = config.load_string(
            'listen = ["http:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(Path(self.mktemp())))}\n"
            "[auth]\nfailure_delay = 0.05\n"
            f'[users.alice]\npassword = "{hash_password("wonderland", 4)}"\n'
            '[vhosts.app.permissions.alice]\nconfigure = "^alice"\nwrite = "^alice"\nread = "^alice"\n'
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)
        self.port = self.service.listeners[0].port.getHost().port
        self.clients: list[StompClient] = []
        self.addCleanup(self.abort)

    def abort(self) -> None:
        for client in self.clients:
            if client.transport is not None and client.transport.connected:
                client.transport.abortConnection()

    @defer.inlineCallbacks
    def connect(self, headers: str) -> Any:
        factory = WebSocketClientFactory(
            f"ws://127.0.0.1:{self.port}/stomp", protocols=["v12.stomp"]
        )
        factory.protocol = StompClient
        factory.opened = defer.Deferred()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.port).connect(factory)
        client = yield factory.opened.addTimeout(TIMEOUT, reactor)
        self.clients.append(client)
        client.stomp(f"CONNECT\naccept-version:1.2\n{headers}heart-beat:0,0\n\n\x00".encode())
        [answer] = yield client.wait_frames(1)
        client.frames.clear()
        return client, answer

    @defer.inlineCallbacks
    def test_login_and_permissions(self) -> Any:
        client, answer = yield self.connect("host:app\nlogin:alice\npasscode:wonderland\n")
        self.assertEqual(answer.command, "CONNECTED")
        client.stomp(b"SEND\ndestination:/queue/alice.ws\nreceipt:r\n\nx\x00")
        [receipt] = yield client.wait_frames(1)
        self.assertEqual(receipt.command, "RECEIPT")
        client.frames.clear()
        client.stomp(b"SEND\ndestination:/queue/other\n\nx\x00")
        [error] = yield client.wait_frames(1)
        self.assertEqual(error.headers["message"], "access refused (write)")
        yield client.closed.addTimeout(TIMEOUT, reactor)

    @defer.inlineCallbacks
    def test_wrong_password(self) -> Any:
        client, answer = yield self.connect("host:app\nlogin:alice\npasscode:nope\n")
        self.assertEqual(answer.command, "ERROR")
        self.assertEqual(answer.headers["message"], "access refused")
        yield client.closed.addTimeout(TIMEOUT, reactor)

    @defer.inlineCallbacks
    def test_unknown_vhost(self) -> Any:
        client, answer = yield self.connect("host:127.0.0.1\nlogin:alice\npasscode:wonderland\n")
        self.assertEqual(answer.headers["message"], "access refused")


class WebSocketIdentityTests(unittest.TestCase):
    """Over WebSocket as over TCP: a token whose subject is C{alice} (with
    every permission) is not the password user alice (issue 21)."""

    SECRET = "a secret of at least 32 bytes, for tests"
    abort = WebSocketAuthTests.abort
    connect = WebSocketAuthTests.connect

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir(parents=True)
        key = directory / "token.key"
        key.write_text(self.SECRET)
        settings = config.load_string(
            'listen = ["http:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(directory / 'data'))}\n"
            "[auth]\nfailure_delay = 0.05\n"
            '[http_api]\nadmins = "alice"\n'
            f'[users.alice]\npassword = "{hash_password("wonderland", 4)}"\n'
            '[vhosts.app.permissions.alice]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
            f'[vhosts.app.tokens]\nalgorithm = "HS256"\nkey_file = {json.dumps(str(key))}\n'
            'configure = ".*"\nwrite = ".*"\nread = ".*"\n'
            '[vhosts."/".permissions.alice]\nread = ".*"\n'
            f'[vhosts."/".tokens]\nalgorithm = "HS256"\nkey_file = {json.dumps(str(key))}\nread = ".*"\n'
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)
        self.port = self.service.listeners[0].port.getHost().port
        self.clients = []
        self.addCleanup(self.abort)

    def token(self, sub: str) -> str:
        import time  # noqa: PLC0415

        import jwt  # noqa: PLC0415

        return jwt.encode({"sub": sub, "exp": time.time() + 600}, self.SECRET, algorithm="HS256")

    @defer.inlineCallbacks
    def frame(self, client: Any, data: bytes) -> Any:
        client.frames.clear()
        client.stomp(data)
        [answer] = yield client.wait_frames(1)
        return answer

    @defer.inlineCallbacks
    def test_token_subject_cannot_attach_to_the_users_durable_subscription(self) -> Any:
        alice, answer = yield self.connect("host:app\nlogin:alice\npasscode:wonderland\n")
        self.assertEqual(answer.command, "CONNECTED")
        sub = b"SUBSCRIBE\ndestination:/topic/feed\nid:feed\ndurable:true\nreceipt:s\n\n\x00"
        answer = yield self.frame(alice, sub)
        self.assertEqual(answer.command, "RECEIPT")
        alice.transport.abortConnection()
        yield alice.closed.addTimeout(TIMEOUT, reactor)
        publisher, _ = yield self.connect("host:app\nlogin:alice\npasscode:wonderland\n")
        answer = yield self.frame(publisher, b"SEND\ndestination:/topic/feed\nreceipt:p\n\nhers\x00")
        self.assertEqual(answer.command, "RECEIPT")
        tok, answer = yield self.connect(f"host:app\npasscode:{self.token('alice')}\n")
        self.assertEqual(answer.command, "CONNECTED")
        # Its durable subscription of the same name is its own: no message.
        answer = yield self.frame(tok, sub.replace(b"receipt:s", b"receipt:t"))
        self.assertEqual((answer.command, answer.headers.get("receipt-id")), ("RECEIPT", "t"))
        answer = yield self.frame(tok, b"SUBSCRIBE\ndestination:/queue/durable.alice.feed\nid:x\n\n\x00")
        self.assertEqual((answer.command, answer.headers["message"]), ("ERROR", "access refused (read)"))
        # alice's message waited for her.
        again, _ = yield self.connect("host:app\nlogin:alice\npasscode:wonderland\n")
        answer = yield self.frame(again, sub.replace(b"receipt:s\n", b""))
        self.assertEqual((answer.command, answer.body), ("MESSAGE", b"hers"))

    @defer.inlineCallbacks
    def test_token_subject_is_not_the_admin_over_http(self) -> Any:
        """The same listener's HTTP API: alice (http_api.admins) lists the
        users; a token whose subject is alice may not."""
        import base64  # noqa: PLC0415

        import treq  # noqa: PLC0415

        url = f"http://127.0.0.1:{self.port}/api/v1/users"
        basic = "Basic " + base64.b64encode(b"alice:wonderland").decode()
        for authorization, expected in ((basic, 200), (f"Bearer {self.token('alice')}", 403)):
            response = yield treq.get(url, headers={"Authorization": authorization}, persistent=False)
            yield treq.content(response)
            self.assertEqual(response.code, expected, authorization[:6])
