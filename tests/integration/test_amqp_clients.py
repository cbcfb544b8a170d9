"""Real AMQP 0-9-1 clients against a real broker on loopback.

The broker is the service as ``twistd qmq`` builds it (``make_service``,
the commit log in a temporary directory, so confirms wait for the disk),
listening with ``amqp:`` on 127.0.0.1; the clients are unchanged pika
(BlockingConnection, run in a thread, and its Twisted adapter, in the
reactor), kombu, a Celery worker with the ``rpc://`` result backend, and
aio-pika (an asyncio loop in a thread). With users configured, PLAIN and
EXTERNAL (a client certificate over ``amqp:qmqtls:``) log in as the same
users, with the same permissions, as STOMP and HTTP clients do.
Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, protocol, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq import config
from qmq.auth import hash_password
from qmq.service import make_service
from tests.integration.certs import TestPKI

TIMEOUT = 30.0


class AmqpBrokerCase(unittest.TestCase):
    """A broker from a configuration (its listeners on port 0), stopped at cleanup."""

    timeout = 120
    extra = ""
    listen = '["amqp:tcp:0:interface=127.0.0.1"]'

    def start(self, extra: str = "", listen: str | None = None) -> None:
        data = Path(self.mktemp())
        settings = config.load_string(
            f"listen = {listen or self.listen}\n"
            f"data_dir = {json.dumps(str(data))}\n"
            + (extra or self.extra)
            + "\n[connections]\nclose_grace = 1.0\n",
            "qmq.toml",
        )
        self.service = make_service(settings, reactor)
        self.service.startService()
        self.addCleanup(self.stop)
        self.ports = [listener.port.getHost().port for listener in self.service.listeners]
        self.port = self.ports[0]
        self.broker = self.service.broker

    def setUp(self) -> None:
        self.start()

    @defer.inlineCallbacks
    def stop(self) -> Any:
        yield self.service.stopService()
        for vhost in self.service.broker.vhosts.values():
            if vhost.expiry is not None:
                vhost.expiry.stop()

    def params(self, **kw: Any) -> pika.ConnectionParameters:
        kw.setdefault("port", self.port)
        kw.setdefault("blocked_connection_timeout", TIMEOUT)
        kw.setdefault("socket_timeout", TIMEOUT)
        return pika.ConnectionParameters("127.0.0.1", **kw)


class PikaBlockingTests(AmqpBrokerCase):
    @defer.inlineCallbacks
    def test_declare_publish_consume_get(self) -> Any:
        def scenario() -> dict:
            conn = pika.BlockingConnection(self.params())
            ch = conn.channel()
            ch.exchange_declare("orders", "topic", durable=True)
            ch.queue_declare("eu-orders", durable=True)
            ch.queue_bind("eu-orders", "orders", "eu.#")
            props = pika.BasicProperties(content_type="application/json", correlation_id="c-9",
                                         headers={"n": 1, "ok": True}, delivery_mode=2, priority=7)
            for i in range(10):
                ch.basic_publish("orders", f"eu.fr.{i}", b'{"n": %d}' % i, props)
            ch.basic_publish("orders", "us.ny", b"elsewhere")
            method, got_props, body = ch.basic_get("eu-orders")
            result = {"get": (body, method.routing_key, got_props.correlation_id, got_props.headers,
                              got_props.priority, got_props.delivery_mode, method.message_count)}
            ch.basic_nack(method.delivery_tag, requeue=True)
            ch.basic_qos(prefetch_count=3)
            seen = []
            for method, _props, body in ch.consume("eu-orders", inactivity_timeout=TIMEOUT):
                if method is None:
                    break
                seen.append((body, method.redelivered))
                if len(seen) == 1:
                    ch.basic_reject(method.delivery_tag, requeue=False)
                else:
                    ch.basic_ack(method.delivery_tag)
                if len(seen) == 10:
                    break
            ch.cancel()
            result["seen"] = seen
            result["left"] = ch.queue_declare("eu-orders", passive=True).method.message_count
            conn.close()
            return result

        result = yield deferToThread(scenario)
        self.assertEqual(result["get"], (b'{"n": 0}', "eu.fr.0", "c-9", {"n": 1, "ok": True}, 7, 2, 9))
        self.assertEqual(result["seen"][0], (b'{"n": 0}', True))
        self.assertEqual([b for b, _ in result["seen"][1:]], [b'{"n": %d}' % i for i in range(1, 10)])
        self.assertEqual(result["left"], 0)

    @defer.inlineCallbacks
    def test_confirms_and_mandatory(self) -> Any:
        """Confirms on a durable queue come after the commit log has the
        messages; an unroutable mandatory message comes back."""

        def scenario() -> tuple:
            conn = pika.BlockingConnection(self.params())
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("durable-q", durable=True)
            for i in range(50):
                ch.basic_publish("", "durable-q", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
            try:
                ch.basic_publish("amq.direct", "nobody", b"lost", mandatory=True)
                returned = None
            except pika.exceptions.UnroutableError as e:
                returned = [m.body for m in e.messages]
            count = ch.queue_declare("durable-q", passive=True).method.message_count
            conn.close()
            return returned, count

        returned, count = yield deferToThread(scenario)
        self.assertEqual(returned, [b"lost"])
        self.assertEqual(count, 50)
        self.assertEqual(self.broker.default_vhost.queues["durable-q"].durable, True)

    @defer.inlineCallbacks
    def test_internal_and_alternate_exchanges(self) -> Any:
        """pika declares an internal exchange behind a public one with an
        alternate: what the public one cannot route lands in the alternate's
        queue (a mandatory publish with confirms is not returned); a publish
        straight to the internal exchange is refused 403 as RabbitMQ says."""

        def scenario() -> tuple:
            conn = pika.BlockingConnection(self.params())
            ch = conn.channel()
            ch.confirm_delivery()
            ch.exchange_declare("unrouted", "fanout", internal=True)
            ch.exchange_declare("orders", "direct", arguments={"alternate-exchange": "unrouted"})
            ch.queue_declare("orders.new")
            ch.queue_bind("orders.new", "orders", "new")
            ch.queue_declare("orders.unrouted")
            ch.queue_bind("orders.unrouted", "unrouted")
            ch.basic_publish("orders", "new", b"routed", mandatory=True)
            ch.basic_publish("orders", "typo", b"caught", mandatory=True)
            counts = [ch.queue_declare(q, passive=True).method.message_count
                      for q in ("orders.new", "orders.unrouted")]
            try:
                ch.basic_publish("unrouted", "", b"straight")
                refused = None
            except pika.exceptions.ChannelClosedByBroker as e:
                refused = (e.reply_code, e.reply_text)
            ch = conn.channel()
            try:
                ch.exchange_declare("unrouted", "fanout")
                redeclared = None
            except pika.exceptions.ChannelClosedByBroker as e:
                redeclared = e.reply_code
            conn.close()
            return counts, refused, redeclared

        counts, refused, redeclared = yield deferToThread(scenario)
        self.assertEqual(counts, [1, 1])
        self.assertEqual(refused, (403, "ACCESS_REFUSED - cannot publish to internal exchange 'unrouted' in vhost '/'"))
        self.assertEqual(redeclared, 406)

    @defer.inlineCallbacks
    def test_errors_with_codes(self) -> Any:
        """Channel and connection exceptions reach pika with their codes and texts."""

        def scenario() -> dict:
            out = {}
            owner = pika.BlockingConnection(self.params())
            owner.channel().queue_declare("private", exclusive=True)
            conn = pika.BlockingConnection(self.params())
            for name, call in (
                ("404", lambda ch: ch.queue_declare("missing", passive=True)),
                ("403", lambda ch: ch.queue_declare("amq.mine")),
                ("405", lambda ch: ch.basic_get("private")),
                ("406", lambda ch: (ch.queue_declare("q406"), ch.basic_ack(42), ch.queue_declare("q406"))),
                ("406 args", lambda ch: (ch.queue_declare("qa", arguments={"x-max-length": 1}),
                                         ch.queue_declare("qa", arguments={"x-max-length": 2}))),
            ):
                ch = conn.channel()
                try:
                    call(ch)
                    out[name] = None
                except pika.exceptions.ChannelClosedByBroker as e:
                    out[name] = (e.reply_code, e.reply_text)
            ch = conn.channel()
            ch.queue_declare("q530")
            ch.basic_consume("q530", lambda *a: None, consumer_tag="same")
            try:
                ch.basic_consume("q530", lambda *a: None, consumer_tag="same")
                out["530"] = None
            except pika.exceptions.DuplicateConsumerTag:
                out["530"] = "pika refused it first"
            owner.close()
            try:
                conn.close()
            except Exception:
                pass
            return out

        out = yield deferToThread(scenario)
        self.assertEqual(out["404"][0], 404)
        self.assertIn("missing", out["404"][1])
        self.assertEqual(out["403"][0], 403)
        self.assertEqual(out["405"][0], 405)
        self.assertEqual(out["406"], (406, "PRECONDITION_FAILED - unknown delivery tag 42"))
        self.assertEqual(out["406 args"][0], 406)

    @defer.inlineCallbacks
    def test_direct_reply_to(self) -> Any:
        """RPC over RabbitMQ's direct reply-to, as pika's docs do it."""

        def scenario() -> tuple:
            requester = pika.BlockingConnection(self.params())
            ch = requester.channel()
            ch.queue_declare("rpc")
            replies = []
            ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((p.correlation_id, b)),
                             auto_ack=True)
            ch.basic_publish("", "rpc", b"ping",
                             pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="7"))
            responder = pika.BlockingConnection(self.params())
            rch = responder.channel()
            method, props, body = None, None, None
            deadline = time.monotonic() + TIMEOUT
            while method is None and time.monotonic() < deadline:
                method, props, body = rch.basic_get("rpc", auto_ack=True)
            rch.basic_publish("", props.reply_to, body.replace(b"i", b"o"),
                              pika.BasicProperties(correlation_id=props.correlation_id))
            while not replies and time.monotonic() < deadline:
                requester.process_data_events(time_limit=0.2)
            responder.close()
            requester.close()
            return replies, props.reply_to

        replies, reply_to = yield deferToThread(scenario)
        self.assertEqual(replies, [("7", b"pong")])
        self.assertTrue(reply_to.startswith("amq.rabbitmq.reply-to."))

    @defer.inlineCallbacks
    def test_heartbeats(self) -> Any:
        """pika negotiates heart-beats and the connection lives through several."""

        def scenario() -> int:
            conn = pika.BlockingConnection(self.params(heartbeat=1))
            ch = conn.channel()
            conn.sleep(3.5)
            ch.queue_declare("hb")
            beat = conn._impl.params.heartbeat
            conn.close()
            return beat

        beat = yield deferToThread(scenario)
        self.assertEqual(beat, 1)


class PikaTwistedTests(AmqpBrokerCase):
    @defer.inlineCallbacks
    def test_twisted_adapter(self) -> Any:
        """pika's Twisted adapter, in the broker's own reactor."""
        cc = protocol.ClientCreator(reactor, TwistedProtocolConnection, self.params())
        proto = yield cc.connectTCP("127.0.0.1", self.port)
        self.addCleanup(lambda: proto.close() if proto.is_open else None)
        yield proto.ready
        ch = yield proto.channel()
        yield ch.queue_declare(queue="tw", durable=False)
        yield ch.basic_qos(prefetch_count=10)
        queue, tag = yield ch.basic_consume(queue="tw", auto_ack=False)
        for i in range(5):
            ch.basic_publish("", "tw", b"t%d" % i)
        got = []
        for _ in range(5):
            _ch, method, _props, body = yield queue.get().addTimeout(TIMEOUT, reactor)
            got.append(body)
            yield ch.basic_ack(method.delivery_tag)
        self.assertEqual(got, [b"t%d" % i for i in range(5)])
        yield ch.basic_cancel(tag)
        yield proto.close()


class KombuCeleryTests(AmqpBrokerCase):
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @defer.inlineCallbacks
    def test_kombu(self) -> Any:
        from kombu import Connection

        def scenario() -> list:
            with Connection(self.url(), connect_timeout=TIMEOUT) as conn:
                queue = conn.SimpleQueue("kombu-q")
                for i in range(3):
                    queue.put({"i": i})
                got = []
                for _ in range(3):
                    message = queue.get(block=True, timeout=TIMEOUT)
                    got.append(message.payload)
                    message.ack()
                queue.close()
                return got

        got = yield deferToThread(scenario)
        self.assertEqual(got, [{"i": 0}, {"i": 1}, {"i": 2}])

    @defer.inlineCallbacks
    def test_celery_worker(self) -> Any:
        """A Celery worker runs tasks from QMQ; results come back through
        QMQ with the rpc:// backend."""
        from celery import Celery
        from celery.contrib.testing.worker import start_worker

        app = Celery("qmq_test", broker=self.url(), backend="rpc://")
        app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                        task_default_queue="celery-qmq", broker_heartbeat=0)

        @app.task(name="qmq_test.add")
        def add(x: int, y: int) -> int:
            return x + y

        def scenario() -> list:
            with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING",
                              shutdown_timeout=TIMEOUT):
                results = [add.delay(i, i) for i in range(3)]
                return [r.get(timeout=TIMEOUT) for r in results]

        got = yield deferToThread(scenario)
        self.assertEqual(got, [0, 2, 4])


class AioPikaTests(AmqpBrokerCase):
    @defer.inlineCallbacks
    def test_aio_pika(self) -> Any:
        import aio_pika

        async def main() -> list:
            conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{self.port}/", timeout=TIMEOUT)
            async with conn:
                ch = await conn.channel(publisher_confirms=True)
                await ch.set_qos(prefetch_count=5)
                exchange = await ch.declare_exchange("aio", aio_pika.ExchangeType.FANOUT)
                queue = await ch.declare_queue("", exclusive=True)
                await queue.bind(exchange)
                for i in range(5):
                    await exchange.publish(aio_pika.Message(b"a%d" % i, headers={"i": i}), routing_key="")
                got = []
                async with queue.iterator() as it:
                    async for message in it:
                        async with message.process():
                            got.append((message.body, message.headers["i"]))
                        if len(got) == 5:
                            break
                return got

        got = yield deferToThread(lambda: asyncio.run(asyncio.wait_for(main(), TIMEOUT * 2)))
        self.assertEqual(got, [(b"a%d" % i, i) for i in range(5)])


COST = 4


class AuthTests(AmqpBrokerCase):
    """The users, virtual hosts and permissions every frontend shares."""

    def setUp(self) -> None:
        self.pki = TestPKI(self.mktemp())
        self.alice_cert = self.pki.client("alice.example.org")
        self.start(
            f"""
[auth]
failure_delay = 0.05
failure_max_delay = 0.2

[users.alice]
password = "{hash_password('wonderland', COST)}"
certificate_names = ["alice.example.org"]

[vhosts.app.permissions.alice]
configure = "^alice\\\\."
write = "^(alice\\\\..*|amq\\\\.topic)$"
read = "^alice\\\\..*$"
""",
            listen=json.dumps(["amqp:tcp:0:interface=127.0.0.1", "amqp:" + self.pki.qmqtls()]),
        )

    @defer.inlineCallbacks
    def test_plain(self) -> Any:
        def scenario() -> dict:
            out = {}
            creds = pika.PlainCredentials("alice", "wonderland")
            conn = pika.BlockingConnection(self.params(virtual_host="app", credentials=creds))
            ch = conn.channel()
            ch.queue_declare("alice.inbox")
            ch.basic_publish("", "alice.inbox", b"hi")
            out["get"] = ch.basic_get("alice.inbox", auto_ack=True)[2]
            try:
                ch.queue_declare("bob.inbox")
            except pika.exceptions.ChannelClosedByBroker as e:
                out["refused"] = (e.reply_code, e.reply_text)
            conn.close()
            try:
                pika.BlockingConnection(self.params(virtual_host="app",
                                                    credentials=pika.PlainCredentials("alice", "wrong")))
            except pika.exceptions.AMQPConnectionError as e:
                out["bad password"] = repr(e)
            try:
                pika.BlockingConnection(self.params(virtual_host="other", credentials=creds))
            except pika.exceptions.AMQPConnectionError as e:
                out["other vhost"] = repr(e)
            return out

        out = yield deferToThread(scenario)
        self.assertEqual(out["get"], b"hi")
        self.assertEqual(out["refused"][0], 403)
        self.assertIn("bob.inbox", out["refused"][1])
        self.assertIn("403", out["bad password"])
        self.assertIn("403", out["other vhost"])

    @defer.inlineCallbacks
    def test_external_over_tls(self) -> Any:
        """A client certificate logs in through SASL EXTERNAL as the user
        whose certificate_names hold its name."""

        def scenario() -> bytes:
            context = ssl.create_default_context(cafile=str(self.pki.ca_pem))
            context.load_cert_chain(str(self.alice_cert.pem))
            params = self.params(port=self.ports[1], virtual_host="app",
                                 ssl_options=pika.SSLOptions(context, "localhost"),
                                 credentials=pika.credentials.ExternalCredentials())
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.queue_declare("alice.tls")
            ch.basic_publish("", "alice.tls", b"over tls")
            body = ch.basic_get("alice.tls", auto_ack=True)[2]
            conn.close()
            return body

        body = yield deferToThread(scenario)
        self.assertEqual(body, b"over tls")
