"""The web console (C{/console}) in a real headless Chromium against a real
broker with authentication on: an admin and a user who is not one.

The broker runs in this process (on trial's reactor) with an C{http:} and a
STOMP listener; stomp.py fills a queue over STOMP (in a thread, as a client
on the network would); C{tests/browser/run.mjs console} then logs in as the
admin, sees the queue's depth, browses it by range scan, purges it and sees
it empty, sees the users; logs in as the other user, who sees no users nor
connections; and checks at phone width (390x844) that no tab overflows
horizontally. It takes screenshots (desktop and phone) into a temporary
directory (C{QMQ_SCREENSHOTS}, when set, keeps them: the ones in
docs/images/ were made so).

C{console-manage} (L{ConsoleManageTests}): a user who is no admin logs in
with a token (a JWT signed with the virtual host's key) at phone width and
reads the overview's totals over 1,100 queues (more than one page of the
listing: the console walks every page); the admin makes an exchange, a
queue with arguments (max length, overflow, TTL, dead-letter exchange and
key) and a binding through the console's forms, pages through the queues
and finds the new one by its prefix; the broker has them as declared; every
tab with its forms open fits at phone width.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import stomp
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq import config
from qmq.auth import hash_password
from qmq.service import make_service
from tests.integration.test_browser import missing, run_scenario

ADMIN = ("admin", "Adm1n-console")
ALICE = ("alice", "al1ce-console")
QUEUE = "orders"
DEPTH = 7
#: Queues of one message each made for the totals: more than one page of
#: the console's listing (500) and of its walk's pages (1,000 a page is the
#: walk's; 1,100 needs two).
BULK = 1100
#: The token key of the virtual host "/" (HS256: at least 32 bytes).
TOKEN_KEY = b"console-token-key-0123456789abcdef"


class ConsoleBroker(unittest.TestCase):
    """A broker with authentication on (an admin, a user, a token key) and
    an C{http:} and a STOMP listener, for the console's scenarios."""

    skip = missing()

    def setUp(self) -> Any:
        data = Path(self.mktemp())
        data.mkdir(parents=True)
        key = data.parent / "token.key"
        key.write_bytes(TOKEN_KEY)
        settings = config.load_string(
            'listen = ["http:tcp:0:interface=127.0.0.1", "stomp:tcp:0:interface=127.0.0.1"]\n'
            f"data_dir = {json.dumps(str(data))}\n"
            "[http_api]\nadmins = \"admin\"\n"
            f"[users.admin]\npassword = \"{hash_password(ADMIN[1], 4)}\"\n"
            f"[users.alice]\npassword = \"{hash_password(ALICE[1], 4)}\"\n"
            '[vhosts."/".permissions.admin]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
            '[vhosts."/".permissions.alice]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
            f'[vhosts."/".tokens]\nalgorithm = "HS256"\nkey_file = {json.dumps(str(key))}\nread = ".*"\n'
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.service.stopService)
        web, stomp_listener = self.service.listeners
        self.base = f"http://127.0.0.1:{web.port.getHost().port}/"
        self.stomp_port = stomp_listener.port.getHost().port

    def fill(self) -> None:
        """Publish DEPTH persistent messages to QUEUE over STOMP, each
        confirmed by a receipt (runs in a thread)."""
        conn = stomp.Connection([("127.0.0.1", self.stomp_port)], heartbeats=(0, 0))
        listener = stomp.listener.WaitingListener("filled")
        conn.set_listener("wait", listener)
        conn.connect(*ADMIN, wait=True)
        try:
            for i in range(DEPTH):
                headers = {"persistent": "true"}
                if i == DEPTH - 1:
                    headers["receipt"] = "filled"
                conn.send(f"/queue/{QUEUE}", f"order {i}", headers=headers)
            listener.wait_on_receipt()
        finally:
            conn.disconnect()



class ConsoleTests(ConsoleBroker):
    """The console, clicked through by an admin and by a user."""

    @defer.inlineCallbacks
    def test_console(self) -> Any:
        """Admin: the queue filled over STOMP shows its depth, browses, purges
        to empty; users listed. Alice: no users, no connections. Phone
        width: nothing overflows."""
        yield deferToThread(self.fill)
        shots = str(Path(os.environ.get("QMQ_SCREENSHOTS") or self.mktemp()).resolve())
        Path(shots).mkdir(parents=True, exist_ok=True)
        result = yield run_scenario(self, "console", self.base, "--screenshots", shots, "--admin", ":".join(ADMIN),
                                    "--user", ":".join(ALICE), "--queue", QUEUE)
        self.assertEqual(result["depth"], [str(DEPTH), "0"])
        self.assertEqual(result["browsed"], [f"order {i}" for i in range(DEPTH)])
        self.assertTrue(result["admin_sees_users"])
        self.assertEqual(result["user_tabs"], ["Overview", "Queues", "Exchanges"])
        self.assertEqual(result["overflow"], {})
        for name in ("console-desktop.png", "console-phone.png"):
            self.assertTrue((Path(shots) / name).stat().st_size > 0, name)
        # The queue is empty in the broker itself, not only on the page.
        queue = self.service.broker.vhosts["/"].queues[QUEUE]
        self.assertEqual(len(queue), 0)


class ConsoleManageTests(ConsoleBroker):
    """The console's forms (a queue with arguments, an exchange, a binding),
    its token login, and totals over more queues than one listing page."""

    def bulk(self) -> None:
        """BULK queues of one persistent message each, over STOMP (in a thread)."""
        conn = stomp.Connection([("127.0.0.1", self.stomp_port)], heartbeats=(0, 0))
        listener = stomp.listener.WaitingListener("bulk")
        conn.set_listener("wait", listener)
        conn.connect(*ADMIN, wait=True)
        try:
            for i in range(BULK):
                headers = {"receipt": "bulk"} if i == BULK - 1 else {}
                conn.send(f"/queue/bulk-{i:04d}", "x", headers=headers)
            listener.wait_on_receipt()
        finally:
            conn.disconnect()

    @defer.inlineCallbacks
    def test_console_manage(self) -> Any:
        import jwt  # noqa: PLC0415

        yield deferToThread(self.bulk)
        token = jwt.encode({"sub": "viewer", "exp": int(time.time()) + 600}, TOKEN_KEY, algorithm="HS256")
        shots = str(Path(os.environ.get("QMQ_SCREENSHOTS") or self.mktemp()).resolve())
        Path(shots).mkdir(parents=True, exist_ok=True)
        result = yield run_scenario(self, "console-manage", self.base, "--screenshots", shots,
                                    "--admin", ":".join(ADMIN), "--token", token)
        # The token's subject, no admin tab; the totals of every queue.
        self.assertEqual(result["token_user"], "viewer")
        self.assertEqual(result["token_tabs"], ["Overview", "Queues", "Exchanges"])
        self.assertEqual(result["cards"], {"queues": f"{BULK:,}", "ready": f"{BULK:,}"})
        self.assertEqual(result["card_note"], 0)
        self.assertEqual(result["overflow"], {})
        self.assertEqual(result["bound"][:3], ["console-ex", "console-made", "orders.#"])
        self.assertEqual(result["paged"], f"501–1,000 of {BULK + 1:,} queues")
        # What the forms made is in the broker.
        vhost = self.service.broker.vhosts["/"]
        self.assertEqual(vhost.exchanges["console-ex"].type, "topic")
        queue = vhost.queues["console-made"]
        self.assertTrue(queue.durable)
        self.assertEqual(queue.arguments, {"x-max-length": 10, "x-overflow": "reject-publish",
                                           "x-message-ttl": 60000, "x-dead-letter-exchange": "console-ex",
                                           "x-dead-letter-routing-key": "dead"})
        bindings = [(target.name, key) for target, key, _ in vhost.exchanges["console-ex"].bindings()]
        self.assertIn(("console-made", "orders.#"), bindings)
        for name in ("console-token-phone.png", "console-forms-desktop.png", "console-forms-phone.png"):
            self.assertTrue((Path(shots) / name).stat().st_size > 0, name)
