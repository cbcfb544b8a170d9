"""Clients that come back, or answer, through another worker: request and
reply (a requester's reply queue is its connection's, on its worker; a
responder on another worker replies to it by name, and the reply reaches it
there), and durable subscriptions (their queue is placed as any queue: a
subscriber that reconnects through another worker finds what was kept).
Real C{twistd qmq --workers 2}, pika, Celery and STOMP clients."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.integration.test_mesh import FLOW_TIMEOUT
from tests.integration.test_twistd import frame
from tests.integration.test_workers import WorkersCase


class RpcTests(WorkersCase):
    def serve_once(self, worker: str, queue: str) -> None:
        """An AMQP responder on C{worker}: one request of C{queue}, answered
        to its reply-to with the body and C{-pong}."""
        import pika  # noqa: PLC0415

        srv = self.amqp_on(worker).channel()
        srv.queue_declare(queue, durable=False)
        for method, props, body in srv.consume(queue, inactivity_timeout=FLOW_TIMEOUT):
            self.assertIsNotNone(method, "no request came")
            srv.basic_publish("", props.reply_to, body + b"-pong",
                              pika.BasicProperties(correlation_id=props.correlation_id))
            srv.basic_ack(method.delivery_tag)
            break
        srv.cancel()

    def amqp_rpc(self, declare_reply_queue: Callable[[Any], str]) -> bytes | None:
        """Requester on w0, responder on w1; the reply (or None)."""
        import pika  # noqa: PLC0415

        req = self.amqp_on("w0").channel()
        req.queue_declare("rpc-requests", durable=False)
        reply_to = declare_reply_queue(req)
        req.basic_publish("", "rpc-requests", b"ping", pika.BasicProperties(reply_to=reply_to, correlation_id="1"))
        self.serve_once("w1", "rpc-requests")
        for method, _props, body in req.consume(reply_to, auto_ack=True, inactivity_timeout=FLOW_TIMEOUT):
            return body if method is not None else None
        return None

    def test_serverNamedReplyQueue(self) -> None:
        """The pika tutorial's RPC: an exclusive server-named reply queue
        (its name marks w0, where it lives)."""
        names: list[str] = []

        def declare(ch: Any) -> str:
            names.append(ch.queue_declare("", exclusive=True).method.queue)
            return names[-1]

        self.assertEqual(self.amqp_rpc(declare), b"ping-pong")
        self.assertTrue(names[0].startswith("amq.gen-w0:"), names)

    def test_clientNamedExclusiveReplyQueue(self) -> None:
        """An exclusive reply queue the client names (as Celery's rpc://
        result backend does): w0 tells w1 it is its connection's, whatever
        the placement says of the name."""
        from tests.integration.test_workers_manage import homed  # noqa: PLC0415

        name = homed("w1", "replies-")  # placed on w1 by its name, yet w0's
        self.assertEqual(self.amqp_rpc(lambda ch: ch.queue_declare(name, exclusive=True).method.queue),
                         b"ping-pong")

    def test_directReplyTo(self) -> None:
        """RabbitMQ's direct reply-to pseudo-queue, requester on w0."""
        import pika  # noqa: PLC0415

        req = self.amqp_on("w0").channel()
        req.queue_declare("rpc-direct", durable=False)
        got: list[bytes] = []
        req.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: got.append(body), auto_ack=True)
        req.basic_publish("", "rpc-direct", b"ping",
                          pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="1"))
        self.serve_once("w1", "rpc-direct")
        deadline = time.monotonic() + FLOW_TIMEOUT
        while not got and time.monotonic() < deadline:
            req.connection.process_data_events(time_limit=0.2)
        self.assertEqual(got, [b"ping-pong"])

    def test_stompTemporaryQueue(self) -> None:
        """STOMP's reply-to:/temp-queue/ on w0, a STOMP responder on w1;
        once the requester is gone, a reply to it is an ERROR, and makes no
        queue."""
        responder = self.client_on("w1")
        responder.request("SUBSCRIBE", {"destination": "/queue/rpc-stomp", "id": "s", "ack": "auto"})
        requester = self.client_on("w0")
        requester.sock.sendall(frame("SEND", {"destination": "/queue/rpc-stomp", "reply-to": "/temp-queue/answers",
                                              "correlation-id": "7"}, b"ping"))
        command, headers, body = responder.read(FLOW_TIMEOUT)
        self.assertEqual((command, body), ("MESSAGE", b"ping"))
        reply_to = headers["reply-to"].replace("\\c", ":")  # STOMP 1.2's escape of ':'
        self.assertTrue(reply_to.startswith("/queue/amq.tmp.w0:"), reply_to)
        responder.request("SEND", {"destination": reply_to, "correlation-id": "7"}, b"pong")
        command, headers, body = requester.read(FLOW_TIMEOUT)
        self.assertEqual((command, headers["subscription"], headers["correlation-id"], body),
                         ("MESSAGE", "/temp-queue/answers", "7", b"pong"))
        requester.close()
        deadline = time.monotonic() + FLOW_TIMEOUT
        while True:
            responder.sock.sendall(frame("SEND", {"destination": reply_to, "receipt": "late"}, b"too late"))
            command, headers, body = responder.read(FLOW_TIMEOUT)
            if command == "ERROR":
                break
            self.assertEqual(command, "RECEIPT")  # w0 has not closed the requester's session yet
            self.assertLess(time.monotonic(), deadline, "the reply queue outlived its connection")
            responder = self.client_on("w1")
            time.sleep(0.05)
        self.assertIn("does not exist", headers.get("message", "") + body.decode())


class CeleryTests(WorkersCase):
    def test_celeryRpcBackend(self) -> None:
        """A Celery worker and its clients over many connections, landing on
        either worker: tasks run, and their results come back through the
        rpc:// backend (a reply queue of the client's connection)."""
        from celery import Celery  # noqa: PLC0415
        from celery.contrib.testing.worker import start_worker  # noqa: PLC0415

        url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"
        app = Celery("qmq_workers", broker=url, backend="rpc://")
        app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                        task_default_queue="celery-workers", broker_heartbeat=0, broker_pool_limit=None)

        @app.task(name="qmq_workers.add")
        def add(x: int, y: int) -> int:
            return x + y

        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30):
            got = []
            for i in range(6):
                # A new client each time: its connections land where they may.
                client = Celery("qmq_workers", broker=url, backend="rpc://")
                client.conf.update(broker_connection_retry_on_startup=False, task_default_queue="celery-workers",
                                   broker_heartbeat=0)
                got.append(client.send_task("qmq_workers.add", (i, i)).get(timeout=FLOW_TIMEOUT))
                client.close()
        self.assertEqual(got, [0, 2, 4, 6, 8, 10])


class DurableSubscriptionTests(WorkersCase):
    def test_backThroughTheOtherWorker(self) -> None:
        """A STOMP durable subscriber on one worker goes away; persistent
        messages published meanwhile (receipted) on both workers are kept;
        it comes back through the other worker and gets every one, once;
        then an UNSUBSCRIBE with durable:true deletes its queue for good."""
        sub = {"destination": "/topic/news.#", "id": "news", "ack": "client-individual", "durable": "true"}
        for first, back in (("w0", "w1"), ("w1", "w0")):
            client = self.client_on(first)
            client.request("SUBSCRIBE", sub)
            client.request("UNSUBSCRIBE", {"id": "news"})  # away: the queue stays
            client.close()
            sent = []
            for worker in ("w0", "w1"):
                publisher = self.client_on(worker)
                for i in range(10):
                    body = f"{first}-{worker}-{i}".encode()
                    publisher.request("SEND", {"destination": "/topic/news.x", "persistent": "true"}, body)
                    sent.append(body)
                publisher.close()
            client = self.client_on(back)
            client.sock.sendall(frame("SUBSCRIBE", sub))
            got: list[bytes] = []
            deadline = time.monotonic() + FLOW_TIMEOUT
            while len(got) < len(sent) and time.monotonic() < deadline:
                try:
                    command, headers, body = client.read(1.0)
                except TimeoutError:
                    continue
                self.assertEqual(command, "MESSAGE", (headers, body))
                got.append(body)
                client.sock.sendall(frame("ACK", {"id": headers["ack"]}))
            self.assertEqual(sorted(got), sorted(sent), (first, back))
            client.request("UNSUBSCRIBE", {"id": "news"})
            client.close()
        client = self.client_on("w0")
        client.request("SUBSCRIBE", sub)
        client.request("UNSUBSCRIBE", {"id": "news", "durable": "true"})  # gone for good
        publisher = self.client_on("w1")
        publisher.request("SEND", {"destination": "/topic/news.x", "persistent": "true"}, b"to nobody")
        client = self.client_on("w1")
        client.request("SUBSCRIBE", sub)
        self.assertEqual(client.messages(0.5), [])


class SockJSTests(WorkersCase):
    def test_xhrTransportsAcrossWorkers(self) -> None:
        """STOMP over SockJS's xhr transports, each HTTP request on a new
        connection (so on either worker, as a browser's may be): every
        session works, its requests relayed to the worker that owns it
        (docs/workers.rst). A subscriber through SockJS gets what a STOMP
        client sends."""
        import http.client  # noqa: PLC0415
        import uuid  # noqa: PLC0415

        def call(path: str, body: str = "") -> tuple[int, str, str]:
            conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=FLOW_TIMEOUT)
            try:
                conn.request("POST", path, body.encode(), {"Content-Type": "text/plain"})
                response = conn.getresponse()
                return response.status, response.read().decode(), response.getheader("Connection") or ""
            finally:
                conn.close()

        def poll_until(base: str, wanted: str) -> str:
            got = ""
            deadline = time.monotonic() + FLOW_TIMEOUT
            while wanted not in got:
                self.assertLess(time.monotonic(), deadline, f"no {wanted!r} in {got!r}")
                status, body, _ = call(base + "/xhr")
                self.assertEqual(status, 200, body)
                got += body
            return got

        publisher = self.client()
        for n in range(4):
            base = f"/sockjs/000/{uuid.uuid4().hex}"
            status, body, _ = call(base + "/xhr")
            self.assertEqual((status, body), (200, "o\n"))
            connect = "CONNECT\naccept-version:1.2\nhost:/\n\n\x00"
            subscribe = f"SUBSCRIBE\ndestination:/topic/sockjs-{n}\nid:0\nreceipt:r\n\n\x00"
            for message in (connect, subscribe):
                status, body, _ = call(base + "/xhr_send", json.dumps([message]))
                self.assertEqual(status, 204, body)
            poll_until(base, "RECEIPT")
            publisher.request("SEND", {"destination": f"/topic/sockjs-{n}"}, f"hello-{n}".encode())
            self.assertIn(f"hello-{n}", poll_until(base, f"hello-{n}"))
