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
