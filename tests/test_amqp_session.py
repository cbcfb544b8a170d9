"""The AMQP 0-9-1 frontend (L{qmq.amqp.session}, L{qmq.amqp.protocol}),
driven frame by frame over in-memory transports with a L{Clock}.

The client side is pamqp's encoder and decoder, so what is tested is the
wire: the handshake, the negotiation and its bounds, the errors with their
reply codes, publishing and consuming through the core, confirms,
transactions, flow control and the deadlines.
"""

from __future__ import annotations

import itertools
from typing import Any

from pamqp import commands, frame, header, heartbeat
from pamqp.body import ContentBody
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.trial.unittest import SynchronousTestCase

from qmq.amqp.codec import PROTOCOL_HEADER
from qmq.amqp.protocol import AmqpFactory
from qmq.amqp.settings import AmqpSettings
from qmq.connections import ConnectionRegistry, ConnectionSettings
from qmq.core.broker import Broker
from qmq.core.channel import Channel

_ports = itertools.count(41000)


class Client:
    """One AMQP client connection, frames built and read with pamqp."""

    def __init__(self, factory: AmqpFactory) -> None:
        self.proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", next(_ports)))
        self.transport = StringTransportWithDisconnection()
        self.transport.protocol = self.proto
        self.proto.makeConnection(self.transport)
        self.buffer = b""

    @property
    def session(self) -> Any:
        return self.proto.session

    @property
    def open(self) -> bool:
        t = self.transport
        return t.connected and not t.disconnecting

    def raw(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def send(self, method: Any, channel: int = 0) -> None:
        self.raw(frame.marshal(method, channel))

    def read(self) -> list[tuple[int, Any]]:
        self.buffer += self.transport.value()
        self.transport.clear()
        out = []
        while self.buffer:
            if self.buffer.startswith(b"AMQP"):
                out.append((0, self.buffer[:8]))
                self.buffer = self.buffer[8:]
                continue
            try:
                used, channel, value = frame.unmarshal(self.buffer)
            except Exception:
                break
            self.buffer = self.buffer[used:]
            out.append((channel, value))
        return out

    def methods(self) -> list[Any]:
        return [v for _, v in self.read()]

    def expect(self, cls: type) -> Any:
        frames = self.methods()
        assert len(frames) == 1 and isinstance(frames[0], cls), frames
        return frames[0]

    def handshake(self, heartbeat: int = 0, frame_max: int = 131072, channel_max: int = 2047,
                  vhost: str = "/", mechanism: str = "PLAIN", response: str = "\0guest\0guest") -> Any:
        self.raw(PROTOCOL_HEADER)
        start = self.expect(commands.Connection.Start)
        self.send(commands.Connection.StartOk({"capabilities": {"connection.blocked": True,
                                                                "consumer_cancel_notify": True}},
                                              mechanism, response))
        tune = self.expect(commands.Connection.Tune)
        self.send(commands.Connection.TuneOk(channel_max, frame_max, heartbeat))
        self.send(commands.Connection.Open(vhost))
        self.opened = self.methods()
        return start, tune

    def channel(self, number: int = 1) -> None:
        self.send(commands.Channel.Open(), number)
        assert isinstance(self.expect(commands.Channel.OpenOk), commands.Channel.OpenOk)

    def publish(self, exchange: str, key: str, body: bytes, channel: int = 1, mandatory: bool = False,
                **properties: Any) -> None:
        props = commands.Basic.Properties(**properties)
        self.raw(
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory), channel)
            + frame.marshal(header.ContentHeader(0, len(body), props), channel)
            + (frame.marshal(ContentBody(body), channel) if body else b"")
        )

    def close_error(self, cls: type = commands.Channel.Close) -> Any:
        frames = self.methods()
        assert frames and isinstance(frames[-1], cls), frames
        return frames[-1]


class AmqpTestCase(SynchronousTestCase):
    settings = AmqpSettings()

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.vhost = self.broker.default_vhost
        self.registry = ConnectionRegistry(ConnectionSettings(), clock=self.clock)
        self.factory = AmqpFactory(self.broker, self.settings, clock=self.clock, registry=self.registry)

    def client(self, **kw: Any) -> Client:
        c = Client(self.factory)
        c.handshake(**kw)
        assert isinstance(c.opened[-1], commands.Connection.OpenOk), c.opened
        return c


class HandshakeTests(AmqpTestCase):
    def test_wrong_header(self) -> None:
        """A client that does not speak AMQP 0-9-1 gets the header the broker
        speaks, and the socket closes (AMQP 0-9-1 4.2.2)."""
        c = Client(self.factory)
        c.raw(b"GET / HTTP/1.1\r\n\r\n")
        self.assertEqual(c.transport.value(), PROTOCOL_HEADER)
        self.assertFalse(c.open)

    def test_old_version_header(self) -> None:
        """AMQP 0-8's header is refused the same way."""
        c = Client(self.factory)
        c.raw(b"AMQP\x01\x01\x08\x00")
        self.assertEqual(c.transport.value(), PROTOCOL_HEADER)
        self.assertFalse(c.open)

    def test_header_in_pieces(self) -> None:
        c = Client(self.factory)
        c.raw(b"AMQ")
        self.assertEqual(c.transport.value(), b"")
        c.raw(b"P\x00\x00\x09\x01")
        c.expect(commands.Connection.Start)

    def test_start_tune_open(self) -> None:
        """connection.start carries RabbitMQ's capabilities table; tune
        offers the listener's bounds; the client's tune-ok decides; open-ok."""
        c = Client(self.factory)
        start, tune = c.handshake(heartbeat=30, frame_max=8192, channel_max=10)
        capabilities = start.server_properties["capabilities"]
        for name in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                     "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
                     "per_consumer_qos", "direct_reply_to"):
            self.assertIs(capabilities[name], True, name)
        self.assertEqual(start.server_properties["product"], "QMQ")
        self.assertEqual(start.mechanisms.split(), ["PLAIN", "AMQPLAIN"])
        self.assertEqual((tune.channel_max, tune.frame_max, tune.heartbeat), (2047, 131072, 60))
        self.assertIsInstance(c.opened[0], commands.Connection.OpenOk)
        s = c.session
        self.assertEqual((s.frame_max, s.channel_max, s.heartbeat), (8192, 10, 30))
        self.assertEqual(s.owner, "guest")

    def test_amqplain(self) -> None:
        """AMQPLAIN's response is a field table without its length."""
        from pamqp import encode

        response = encode.field_table({"LOGIN": "bob", "PASSWORD": "pw"})[4:]
        c = self.client(mechanism="AMQPLAIN", response=response.decode())
        self.assertEqual(c.session.login, "bob")

    def test_unknown_mechanism(self) -> None:
        c = Client(self.factory)
        c.raw(PROTOCOL_HEADER)
        c.read()
        c.send(commands.Connection.StartOk({}, "CRAM-MD5", "x"))
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 403)
        self.assertIn("CRAM-MD5", close.reply_text)

    def test_unknown_vhost(self) -> None:
        """Authentication off: a virtual host that does not exist is 530."""
        c = Client(self.factory)
        c.handshake(vhost="nowhere")
        close = c.opened[-1]
        self.assertIsInstance(close, commands.Connection.Close)
        self.assertEqual(close.reply_code, 530)
        self.assertIn("nowhere", close.reply_text)

    def test_frame_max_below_minimum(self) -> None:
        c = Client(self.factory)
        c.handshake(frame_max=1024)
        self.assertEqual(c.opened[0].reply_code, 530)

    def test_client_close(self) -> None:
        """connection.close from the client: close-ok, then the socket closes."""
        c = self.client()
        c.send(commands.Connection.Close(200, "bye", 0, 0))
        self.assertIsInstance(c.methods()[-1], commands.Connection.CloseOk)
        self.assertFalse(c.open)

    def test_server_close(self) -> None:
        """A shutdown is connection.close 320; the socket closes at close-ok."""
        c = self.client()
        c.channel()
        self.registry.shutdown("broker shutting down", 5.0)
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 320)
        self.assertTrue(c.open)
        # Anything but close-ok is ignored now.
        c.send(commands.Queue.Declare(queue="q"), 1)
        self.assertEqual(c.methods(), [])
        c.send(commands.Connection.CloseOk())
        self.assertFalse(c.open)

    def test_close_without_close_ok(self) -> None:
        """A client that does not answer connection.close is closed after
        the listener's close grace."""
        self.registry = ConnectionRegistry(ConnectionSettings(close_grace=7.0), clock=self.clock)
        self.factory = AmqpFactory(self.broker, self.settings, clock=self.clock, registry=self.registry)
        c = self.client()
        c.session.shutdown()
        self.clock.advance(6.9)
        self.assertTrue(c.open)
        self.clock.advance(0.2)
        self.assertFalse(c.open)

    def test_handshake_deadline(self) -> None:
        """A client that stalls in the handshake is closed after connect_timeout."""
        c = Client(self.factory)
        c.raw(PROTOCOL_HEADER)
        c.read()
        self.clock.advance(self.settings.connect_timeout + 0.1)
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 320)
        silent = Client(self.factory)
        self.clock.advance(self.settings.connect_timeout + 0.1)
        self.assertFalse(silent.open)

    def test_big_frame_before_handshake(self) -> None:
        """Before tune-ok, frames are bounded too (the header of a huge frame
        is enough to refuse it)."""
        c = Client(self.factory)
        c.raw(PROTOCOL_HEADER)
        c.read()
        c.raw(b"\x01\x00\x00\x7f\xff\xff\xff")
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 501)

    def test_channel_method_before_open(self) -> None:
        c = Client(self.factory)
        c.raw(PROTOCOL_HEADER)
        c.read()
        c.send(commands.Channel.Open(), 1)
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 503)


class LimitTests(AmqpTestCase):
    settings = AmqpSettings(max_message_size=1000, frame_timeout=8.0)

    def test_frame_max(self) -> None:
        """A frame over the negotiated frame_max closes the connection: 501."""
        c = self.client(frame_max=4096)
        c.channel()
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1))
        c.raw(frame.marshal(header.ContentHeader(0, 900, commands.Basic.Properties()), 1))
        c.raw(b"\x03\x00\x01" + (5000).to_bytes(4, "big"))
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 501)
        self.assertIn("frame_max 4096", close.reply_text)

    def test_bad_frame_end(self) -> None:
        c = self.client()
        c.raw(frame.marshal(commands.Channel.Open(), 1)[:-1] + b"\x00")
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 501)

    def test_channel_max(self) -> None:
        c = self.client(channel_max=2)
        c.channel(2)
        c.send(commands.Channel.Open(), 3)
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 530)
        self.assertIn("channel_max 2", close.reply_text)

    def test_message_too_large(self) -> None:
        """A content header announcing more than max_message_size: 406 on
        the channel; the body frames that follow are dropped."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.publish("", "q", b"x" * 1001)
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("1001", close.reply_text)
        self.assertEqual(len(self.vhost.queues["q"]), 0)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()  # the number is free again

    def test_unfinished_body_deadline(self) -> None:
        """A message whose body stops coming closes the connection after frame_timeout."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1))
        c.raw(frame.marshal(header.ContentHeader(0, 100, commands.Basic.Properties()), 1))
        c.raw(frame.marshal(ContentBody(b"x" * 10), 1))
        self.assertEqual(self.broker.unfinished_bytes, 10)
        self.clock.advance(self.settings.frame_timeout * 1.3)
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 501)
        self.assertEqual(self.broker.unfinished_bytes, 0)

    def test_unfinished_frame_deadline(self) -> None:
        c = self.client()
        c.raw(frame.marshal(commands.Channel.Open(), 1)[:5])
        self.clock.advance(self.settings.frame_timeout * 1.3)
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 501)

    def test_unfinished_budget(self) -> None:
        """Unfinished frames and bodies count in the broker's budget: the
        connection that crosses it gets 506."""
        self.broker.max_unfinished_bytes = 50
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1))
        c.raw(frame.marshal(header.ContentHeader(0, 100, commands.Basic.Properties()), 1))
        c.raw(frame.marshal(ContentBody(b"x" * 60), 1))
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 506)
        self.assertEqual(self.broker.unfinished_bytes, 0)

    def test_method_during_content(self) -> None:
        c = self.client()
        c.channel()
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1))
        c.send(commands.Basic.Qos(0, 1), 1)
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 505)

    def test_body_without_header(self) -> None:
        c = self.client()
        c.channel()
        c.raw(frame.marshal(ContentBody(b"x"), 1))
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 505)

    def test_malformed_method(self) -> None:
        c = self.client()
        c.channel()
        c.raw(b"\x01\x00\x01\x00\x00\x00\x05\x00\x32\x00\x0a\x09\xce")  # queue.declare, cut
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 502)

    def test_unknown_method(self) -> None:
        c = self.client()
        c.channel()
        c.raw(b"\x01\x00\x01\x00\x00\x00\x04\x00\x63\x00\x01\xce")
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 503)

    def test_frame_on_closed_channel(self) -> None:
        c = self.client()
        c.send(commands.Queue.Declare(queue="q"), 5)
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 504)


class HeartbeatTests(AmqpTestCase):
    def test_heartbeats(self) -> None:
        """With heart-beats on, the broker sends one when it has been quiet,
        and closes a client silent for two intervals."""
        c = self.client(heartbeat=10)
        self.clock.advance(5)
        self.assertTrue(any(isinstance(v, heartbeat.Heartbeat) for _, v in c.read()))
        for _ in range(3):
            self.clock.advance(5)
            c.raw(heartbeat.Heartbeat.marshal())
        self.assertTrue(c.open)
        self.clock.advance(25)
        self.assertFalse(c.open)

    def test_heartbeats_off(self) -> None:
        c = self.client(heartbeat=0)
        self.clock.advance(1000)
        self.assertTrue(c.open)
        self.assertEqual(c.read(), [])


class ChannelTests(AmqpTestCase):
    def test_not_found(self) -> None:
        """A passive declare of a missing queue: channel.close 404 naming it;
        the channel drops frames until close-ok, then may be opened again."""
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="missing", passive=True), 1)
        close = c.close_error()
        self.assertEqual(close.reply_code, 404)
        self.assertIn("missing", close.reply_text)
        self.assertEqual(close.class_id, 50)
        c.send(commands.Queue.Declare(queue="other"), 1)
        self.assertEqual(c.methods(), [])
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Queue.Declare(queue="other"), 1)
        self.assertEqual(c.expect(commands.Queue.DeclareOk).queue, "other")

    def test_exclusive_locked(self) -> None:
        """Another connection's exclusive queue: 405 RESOURCE_LOCKED; the
        queue goes when its connection closes."""
        a = self.client()
        a.channel()
        a.send(commands.Queue.Declare(queue="mine", exclusive=True), 1)
        a.expect(commands.Queue.DeclareOk)
        b = self.client()
        b.channel()
        b.send(commands.Basic.Consume(queue="mine"), 1)
        self.assertEqual(b.close_error().reply_code, 405)
        a.send(commands.Connection.Close(200, "", 0, 0))
        self.assertNotIn("mine", self.vhost.queues)

    def test_server_named(self) -> None:
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="", exclusive=True), 1)
        ok = c.expect(commands.Queue.DeclareOk)
        self.assertTrue(ok.queue.startswith("amq.gen-"))
        # The empty name means the last queue declared on the channel.
        c.send(commands.Queue.Bind(queue="", exchange="amq.topic", routing_key="a.#"), 1)
        c.expect(commands.Queue.BindOk)

    def test_reserved_names(self) -> None:
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="amq.mine"), 1)
        self.assertEqual(c.close_error().reply_code, 403)

    def test_inequivalent(self) -> None:
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="q", arguments={"x-max-length": 5}), 1)
        c.expect(commands.Queue.DeclareOk)
        c.send(commands.Queue.Declare(queue="q", arguments={"x-max-length": 6}), 1)
        self.assertEqual(c.close_error().reply_code, 406)

    def test_exchanges(self) -> None:
        c = self.client()
        c.channel()
        c.send(commands.Exchange.Declare(exchange="e1", exchange_type="fanout"), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Exchange.Declare(exchange="e2", exchange_type="direct"), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Exchange.Bind(destination="e2", source="e1", routing_key=""), 1)
        c.expect(commands.Exchange.BindOk)
        c.send(commands.Queue.Declare(queue="q"), 1)
        c.expect(commands.Queue.DeclareOk)
        c.send(commands.Queue.Bind(queue="q", exchange="e2", routing_key="k"), 1)
        c.expect(commands.Queue.BindOk)
        c.publish("e1", "k", b"through two")
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        c.send(commands.Exchange.Delete(exchange="e2", if_unused=True), 1)
        self.assertEqual(c.close_error().reply_code, 406)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Exchange.Declare(exchange="e1", exchange_type="topic"), 1)
        self.assertEqual(c.close_error().reply_code, 406)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Exchange.Declare(exchange="e9", passive=True), 1)
        self.assertEqual(c.close_error().reply_code, 404)

    def test_internal_exchange(self) -> None:
        """exchange.declare internal=true: a publish to it closes the channel
        403 with RabbitMQ's text; an exchange bound to it routes into it; a
        redeclare with another internal flag is 406."""
        c = self.client()
        c.channel()
        c.send(commands.Exchange.Declare(exchange="in", exchange_type="fanout", internal=True), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Exchange.Declare(exchange="front", exchange_type="direct"), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Exchange.Bind(destination="in", source="front", routing_key="k"), 1)
        c.expect(commands.Exchange.BindOk)
        c.send(commands.Queue.Declare(queue="q"), 1)
        c.expect(commands.Queue.DeclareOk)
        c.send(commands.Queue.Bind(queue="q", exchange="in"), 1)
        c.expect(commands.Queue.BindOk)
        c.publish("front", "k", b"through")
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        c.publish("in", "k", b"straight")
        close = c.close_error()
        self.assertEqual(
            (close.reply_code, close.reply_text),
            (403, "ACCESS_REFUSED - cannot publish to internal exchange 'in' in vhost '/'"),
        )
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Exchange.Declare(exchange="in", exchange_type="fanout"), 1)
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("inequivalent arg 'internal'", close.reply_text)

    def test_delete_purge(self) -> None:
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="q"), 1)
        c.read()
        c.publish("", "q", b"a")
        c.publish("", "q", b"b")
        c.send(commands.Queue.Delete(queue="q", if_empty=True), 1)
        self.assertEqual(c.close_error().reply_code, 406)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Queue.Purge(queue="q"), 1)
        self.assertEqual(c.expect(commands.Queue.PurgeOk).message_count, 2)
        c.send(commands.Queue.Delete(queue="q"), 1)
        c.expect(commands.Queue.DeleteOk)
        self.assertNotIn("q", self.vhost.queues)


class MessageTests(AmqpTestCase):
    def deliveries(self, c: Client) -> list[tuple[Any, Any, bytes]]:
        """(method, properties, body) of each delivery or get-ok read."""
        out = []
        current = None
        for _, v in c.read():
            if isinstance(v, (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)):
                current = [v, None, b""]
                out.append(current)
            elif isinstance(v, header.ContentHeader):
                current[1] = v.properties  # type: ignore[index]
            elif isinstance(v, ContentBody):
                current[2] += v.value  # type: ignore[index]
        return [tuple(x) for x in out]  # type: ignore[misc]

    def test_properties_round_trip(self) -> None:
        """Every basic property and typed headers map to the model and back."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.publish("", "q", b"body", content_type="text/plain", content_encoding="gzip",
                  headers={"s": "x", "i": 7, "f": 1.5, "b": True, "n": None, "bin": bytearray(b"\x00\xff"),
                           "nested": {"k": [1, "two"]}},
                  delivery_mode=2, priority=4, correlation_id="c-1", reply_to="replies",
                  expiration="60000", message_id="m-1", message_type="t", user_id="guest", app_id="app")
        m = self.vhost.queues["q"].get()
        self.assertEqual(m.properties, {"content_type": "text/plain", "content_encoding": "gzip",
                                        "correlation_id": "c-1", "reply_to": "replies", "message_id": "m-1",
                                        "type": "t", "user_id": "guest", "app_id": "app"})
        self.assertEqual(m.headers, {"s": "x", "i": 7, "f": 1.5, "b": True, "n": None, "bin": b"\x00\xff",
                                     "nested": {"k": [1, "two"]}})
        self.assertTrue(m.persistent)
        self.assertEqual(m.priority, 4)
        self.assertEqual(m.expires, m.timestamp + 60)
        # Typed headers from another frontend keep their values: a float
        # goes out as a double, a big integer as a long long.
        m.headers = {**m.headers, "d": 0.1, "big": 1 << 40}
        self.vhost.queues["q"].requeue([m])
        c.send(commands.Basic.Get(queue="q", no_ack=True), 1)
        [(method, props, body)] = self.deliveries(c)
        self.assertIsInstance(method, commands.Basic.GetOk)
        self.assertEqual(body, b"body")
        self.assertEqual((props.content_type, props.content_encoding, props.correlation_id, props.reply_to,
                          props.message_id, props.message_type, props.user_id, props.app_id),
                         ("text/plain", "gzip", "c-1", "replies", "m-1", "t", "guest", "app"))
        self.assertEqual((props.delivery_mode, props.priority, props.expiration), (2, 4, "60000"))
        self.assertEqual(props.headers["bin"], bytearray(b"\x00\xff"))
        self.assertEqual(props.headers["nested"], {"k": [1, "two"]})
        self.assertEqual((props.headers["d"], props.headers["big"], props.headers["f"]), (0.1, 1 << 40, 1.5))
        self.assertEqual((props.headers["b"], props.headers["n"], props.headers["i"]), (True, None, 7))
        self.assertEqual(int(props.timestamp.timestamp()), int(m.timestamp))

    def test_consume_ack_nack(self) -> None:
        """basic.consume with a prefetch: deliveries after consume-ok, within
        the window; ack (multiple), nack with requeue, reject."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        for i in range(5):
            c.publish("", "q", b"m%d" % i)
        c.send(commands.Basic.Qos(0, 2), 1)
        c.expect(commands.Basic.QosOk)
        c.send(commands.Basic.Consume(queue="q", consumer_tag="tag1"), 1)
        frames = c.read()
        self.assertIsInstance(frames[0][1], commands.Basic.ConsumeOk)
        c.buffer = b""
        c.transport.write(b"".join(frame.marshal(v, n) for n, v in frames[1:]))
        got = self.deliveries(c)
        self.assertEqual([b for _, _, b in got], [b"m0", b"m1"])
        self.assertEqual(got[0][0].consumer_tag, "tag1")
        c.send(commands.Basic.Ack(got[1][0].delivery_tag, multiple=True), 1)
        got = self.deliveries(c)
        self.assertEqual([b for _, _, b in got], [b"m2", b"m3"])
        c.send(commands.Basic.Nack(got[0][0].delivery_tag, requeue=True), 1)
        again = self.deliveries(c)
        self.assertEqual([(b, m.redelivered) for m, _, b in again], [(b"m2", True)])
        c.send(commands.Basic.Reject(got[1][0].delivery_tag, requeue=False), 1)
        self.assertEqual([b for _, _, b in self.deliveries(c)], [b"m4"])
        c.send(commands.Basic.Ack(999), 1)
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("unknown delivery tag 999", close.reply_text)
        # Closing the channel gave its unacked deliveries back.
        self.assertEqual(len(self.vhost.queues["q"]), 2)

    def test_cancel_keeps_unacked(self) -> None:
        """After basic.cancel the consumer's unacked deliveries are still the
        channel's, as in RabbitMQ: they ack and nack by tag (kombu's suite
        acks after cancelling), and the rest go back when the channel closes."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        for i in range(3):
            c.publish("", "q", b"m%d" % i)
        c.send(commands.Basic.Consume(queue="q", consumer_tag="t"), 1)
        got = [m.delivery_tag for m, _, _ in self.deliveries(c)]
        self.assertEqual(len(got), 3)
        c.send(commands.Basic.Cancel("t"), 1)
        c.expect(commands.Basic.CancelOk)
        c.send(commands.Basic.Ack(got[0]), 1)
        c.send(commands.Basic.Nack(got[1], requeue=True), 1)
        self.assertEqual(c.read(), [])
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        c.send(commands.Channel.Close(200, "bye", 0, 0), 1)
        c.expect(commands.Channel.CloseOk)
        self.assertEqual(sorted(m.body for m in self.vhost.queues["q"].messages()), [b"m1", b"m2"])

    def test_get_empty(self) -> None:
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Basic.Get(queue="q"), 1)
        c.expect(commands.Basic.GetEmpty)

    def test_alternate_exchange(self) -> None:
        """alternate-exchange: an unroutable mandatory publish goes there and
        is not returned; with nothing bound there it is returned."""
        c = self.client()
        c.channel()
        c.send(commands.Exchange.Declare(exchange="ae", exchange_type="fanout"), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Exchange.Declare(exchange="main", exchange_type="direct",
                                         arguments={"alternate-exchange": "ae"}), 1)
        c.expect(commands.Exchange.DeclareOk)
        c.send(commands.Queue.Declare(queue="caught"), 1)
        c.expect(commands.Queue.DeclareOk)
        c.send(commands.Queue.Bind(queue="caught", exchange="ae"), 1)
        c.expect(commands.Queue.BindOk)
        c.publish("main", "nowhere", b"caught", mandatory=True)
        self.assertEqual(self.deliveries(c), [])
        self.assertEqual(len(self.vhost.queues["caught"]), 1)
        c.send(commands.Queue.Unbind(queue="caught", exchange="ae"), 1)
        c.expect(commands.Queue.UnbindOk)
        c.publish("main", "nowhere", b"lost", mandatory=True)
        [(method, _, body)] = self.deliveries(c)
        self.assertEqual((method.reply_code, body), (312, b"lost"))
        c.send(commands.Exchange.Declare(exchange="bad", exchange_type="direct",
                                         arguments={"alternate-exchange": 5}), 1)
        self.assertEqual(c.close_error().reply_code, 406)

    def test_mandatory_return(self) -> None:
        c = self.client()
        c.channel()
        c.publish("amq.direct", "nowhere", b"lost", mandatory=True, content_type="a/b")
        [(method, props, body)] = self.deliveries(c)
        self.assertIsInstance(method, commands.Basic.Return)
        self.assertEqual((method.reply_code, method.exchange, method.routing_key), (312, "amq.direct", "nowhere"))
        self.assertEqual((props.content_type, body), ("a/b", b"lost"))
        c.publish("amq.direct", "nowhere", b"dropped")
        self.assertEqual(c.read(), [])

    def test_large_body_split(self) -> None:
        """A body larger than frame_max arrives in several frames and is
        delivered in several."""
        self.vhost.declare_queue("q")
        c = self.client(frame_max=4096)
        c.channel()
        body = bytes(range(256)) * 50
        pieces = [body[i : i + 4000] for i in range(0, len(body), 4000)]
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
              + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
              + b"".join(frame.marshal(ContentBody(p), 1) for p in pieces))
        self.assertEqual(self.vhost.queues["q"].get().body, body)
        c.publish("", "q", b"")
        c.send(commands.Basic.Get(queue="q"), 1)
        [(_, _, got)] = self.deliveries(c)
        self.assertEqual(got, b"")

    def test_confirms(self) -> None:
        """confirm.select: every publish is acked (routed or not), one
        multiple ack for a read's worth."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Confirm.Select(), 1)
        c.expect(commands.Confirm.SelectOk)
        for _ in range(3):
            c.publish("", "q", b"x")
        acks = c.methods()
        self.assertEqual([(a.delivery_tag, a.multiple) for a in acks], [(1, False), (2, False), (3, False)])
        c.raw(b"".join(
            frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
            + frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties()), 1)
            + frame.marshal(ContentBody(b"y"), 1)
            for _ in range(3)
        ))
        acks = c.methods()
        self.assertEqual([(a.delivery_tag, a.multiple) for a in acks], [(6, True)])

    def test_confirms_wait_for_the_store(self) -> None:
        """A publish the store makes durable later is acked only then."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Confirm.Select(), 1)
        c.read()
        waiter: Deferred = Deferred()
        channel = c.session.channels[1]
        original = channel.core.publish_target

        def publish_target(*args: Any, **kw: Any) -> Any:
            original(*args, **kw)
            return waiter

        channel.core.publish_target = publish_target
        c.publish("", "q", b"x", delivery_mode=2)
        self.clock.advance(0)
        self.assertEqual(c.read(), [])
        waiter.callback(None)
        self.clock.advance(0)
        self.assertEqual([a.delivery_tag for a in c.methods()], [1])

    def test_transactions(self) -> None:
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Tx.Select(), 1)
        c.expect(commands.Tx.SelectOk)
        c.publish("", "q", b"a")
        self.assertEqual(len(self.vhost.queues["q"]), 0)
        c.send(commands.Tx.Rollback(), 1)
        c.expect(commands.Tx.RollbackOk)
        c.publish("", "q", b"b")
        c.send(commands.Tx.Commit(), 1)
        c.expect(commands.Tx.CommitOk)
        self.assertEqual(self.vhost.queues["q"].get().body, b"b")
        c.send(commands.Confirm.Select(), 1)
        self.assertEqual(c.close_error().reply_code, 406)

    def test_flow(self) -> None:
        """channel.flow(false) stops deliveries on the channel until flow(true)."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Basic.Consume(queue="q", no_ack=True), 1)
        c.read()
        c.send(commands.Channel.Flow(False), 1)
        self.assertFalse(c.expect(commands.Channel.FlowOk).active)
        c.publish("", "q", b"held")
        self.assertEqual(c.read(), [])
        c.send(commands.Channel.Flow(True), 1)
        self.assertEqual([b for _, _, b in self.deliveries(c)], [b"held"])

    def test_cancel_notification(self) -> None:
        """A consumer whose queue is deleted hears basic.cancel."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Basic.Consume(queue="q", consumer_tag="t"), 1)
        c.read()
        self.vhost.delete_queue("q")
        self.clock.advance(0)
        cancel = c.expect(commands.Basic.Cancel)
        self.assertEqual(cancel.consumer_tag, "t")

    def test_cancel_notification_after_delete_ok(self) -> None:
        """A queue.delete of the client's own consumed queue: delete-ok
        first, then basic.cancel, as RabbitMQ orders them (py-amqp raises on
        a cancel it did not expect while waiting for the delete-ok; kombu's
        suite found it)."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.channel(2)
        c.send(commands.Basic.Consume(queue="q", consumer_tag="t"), 1)
        c.send(commands.Basic.Consume(queue="q", consumer_tag="u"), 2)
        c.read()
        c.send(commands.Queue.Delete(queue="q"), 1)
        self.clock.advance(0)
        self.assertEqual(
            [(n, type(m).__name__, getattr(m, "consumer_tag", None)) for n, m in c.read()],
            [(1, "DeleteOk", None), (1, "Cancel", "t"), (2, "Cancel", "u")],
        )

    def test_blocked(self) -> None:
        """A publish under a memory alarm: the message is taken, reading
        stops, connection.blocked goes out; unblocked when it clears."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        self.broker.admission.hold("memory", "memory alarm")
        c.publish("", "q", b"x")
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        blocked = c.expect(commands.Connection.Blocked)
        self.assertIn("memory", blocked.reason)
        self.assertEqual(c.transport.producerState, "paused")
        self.broker.admission.release("memory")
        self.clock.advance(0)
        c.expect(commands.Connection.Unblocked)
        self.assertEqual(c.transport.producerState, "producing")

    def test_user_id_checked(self) -> None:
        """A user_id property that is not the publisher's user is refused
        (authentication off: any goes)."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.publish("", "q", b"x", user_id="someone")
        self.assertEqual(len(self.vhost.queues["q"]), 1)


class TransportTests(AmqpTestCase):
    def test_slow_reader(self) -> None:
        """A client whose socket buffer is full (the transport pauses its
        producer) gets no deliveries until it drains; nothing is lost."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.send(commands.Basic.Consume(queue="q", no_ack=True), 1)
        c.read()
        c.proto.pauseProducing()
        p = self.client()
        p.channel()
        for i in range(3):
            p.publish("", "q", b"m%d" % i)
        self.clock.advance(0)
        self.assertEqual(c.read(), [])
        self.assertEqual(len(self.vhost.queues["q"]), 3)
        c.proto.resumeProducing()
        self.clock.advance(0)
        bodies = [v.value for _, v in c.read() if isinstance(v, ContentBody)]
        self.assertEqual(bodies, [b"m0", b"m1", b"m2"])

    def test_over_the_caps(self) -> None:
        """A connection over the registry's caps: after its protocol
        header, connection.close 530 and the socket closes; not counted."""
        registry = ConnectionRegistry(ConnectionSettings(max_per_address=1), clock=self.clock)
        factory = AmqpFactory(self.broker, self.settings, clock=self.clock, registry=registry)
        first = Client(factory)
        second = Client(factory)
        second.raw(PROTOCOL_HEADER)
        close = second.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 530)
        self.assertIn("too many connections", close.reply_text)
        self.assertFalse(second.open)
        self.assertTrue(first.open)
        self.assertEqual(len(registry.connections(factory.listener)), 1)

    def test_lost_connection_gives_back(self) -> None:
        """A socket lost mid-message: its unacked deliveries go back, its
        exclusive queues go, its unfinished bytes leave the budget."""
        self.vhost.declare_queue("q")
        self.vhost.queues["q"].publish(Channel(self.broker, self.vhost).make_message("", "q", None, b"x"))
        c = self.client()
        c.channel()
        c.send(commands.Queue.Declare(queue="mine", exclusive=True), 1)
        c.send(commands.Basic.Consume(queue="q"), 1)
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
              + frame.marshal(header.ContentHeader(0, 100, commands.Basic.Properties()), 1)
              + frame.marshal(ContentBody(b"x" * 10), 1))
        self.assertEqual(len(self.vhost.queues["q"]), 0)
        c.transport.loseConnection()
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        self.assertNotIn("mine", self.vhost.queues)
        self.assertEqual(self.broker.unfinished_bytes, 0)

    def test_publish_after_connection_error(self) -> None:
        """Frames read after a connection exception, in the same read, are
        not acted on (not even the publish fast path), and the connection's
        unfinished bytes leave the broker's budget."""
        self.vhost.declare_queue("q")
        c = self.client()
        c.channel()
        c.publish("", "q", b"first")  # the channel learns its properties
        self.vhost.queues["q"].purge()
        one = (frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
               + frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties()), 1)
               + frame.marshal(ContentBody(b"x"), 1))
        c.send(commands.Basic.Consume(queue="q", consumer_tag="t"), 1)
        c.read()
        # A consumer tag in use is a connection exception (530), answered
        # without ending the read: what follows it must be dropped.
        c.raw(frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="t"), 1) + one + one[:10])
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 530)
        self.assertEqual(len(self.vhost.queues["q"]), 0)
        self.assertEqual(self.broker.unfinished_bytes, 0)

    def test_long_routing_key(self) -> None:
        """A routing key longer than a short string (STOMP counts a key's
        characters, AMQP its bytes) is delivered cut, not refused."""
        self.vhost.declare_queue("q")
        self.vhost.bind("q", "amq.topic", "#")
        c = self.client()
        c.channel()
        c.send(commands.Basic.Consume(queue="q", no_ack=True), 1)
        c.read()
        channel = Channel(self.broker, self.vhost)
        self.addCleanup(channel.close)
        key = "\u00e9" * 200
        channel.publish("amq.topic", key, channel.make_message("amq.topic", key, None, b"x"))
        self.clock.advance(0)
        [deliver] = [v for _, v in c.read() if isinstance(v, commands.Basic.Deliver)]
        self.assertEqual(deliver.routing_key, "\u00e9" * 127)

    def test_deeply_nested_table(self) -> None:
        """A field table nested deeper than the decoder can follow is a
        syntax error (502), in a method's arguments and in a content
        header's headers, not an internal error."""
        nested = b"F\x00\x00\x00\x00"
        for _ in range(3000):
            nested = b"F" + len(b"\x01k" + nested).to_bytes(4, "big") + b"\x01k" + nested
        table = len(b"\x01k" + nested).to_bytes(4, "big") + b"\x01k" + nested
        c = self.client()
        c.channel()
        # queue.declare: ticket, queue "q", bits, arguments.
        payload = b"\x00\x32\x00\x0a" + b"\x00\x00" + b"\x01q" + b"\x00" + table
        c.raw(b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce")
        close = c.close_error(commands.Connection.Close)
        self.assertEqual(close.reply_code, 502)
        c = self.client()
        c.channel()
        c.raw(frame.marshal(commands.Basic.Publish(routing_key="q"), 1))
        props = b"\x20\x00" + table  # the headers flag, then the table
        payload = b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + props
        c.raw(b"\x02\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce")
        self.assertEqual(c.close_error(commands.Connection.Close).reply_code, 502)

    def test_interleaved_channels(self) -> None:
        """Content frames of two channels may interleave (AMQP 0-9-1 4.2.6):
        each channel assembles its own message."""
        self.vhost.declare_queue("q")
        c = self.client(frame_max=4096)
        c.channel(1)
        c.channel(2)

        def parts(channel: int, body: bytes) -> list[bytes]:
            return [frame.marshal(commands.Basic.Publish(routing_key="q"), channel),
                    frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(app_id=str(channel))),
                                  channel),
                    frame.marshal(ContentBody(body[:3000]), channel),
                    frame.marshal(ContentBody(body[3000:]), channel)]

        one, two = parts(1, b"1" * 5000), parts(2, b"2" * 6000)
        c.raw(b"".join(a + b for a, b in zip(one, two, strict=True)))
        got = sorted((m.properties["app_id"], m.body) for m in self.vhost.queues["q"].messages())
        self.assertEqual(got, [("1", b"1" * 5000), ("2", b"2" * 6000)])

    def test_permissions_changed(self) -> None:
        """A user's permissions changed while connected (the HTTP API's
        refresh: Channel.set_user) apply to the next publish, even to a
        target the channel had resolved."""

        class User:
            name = owner = account = "u"
            destinations = None
            expires = None

            def __init__(self, writable: bool) -> None:
                self.writable = writable

            def can(self, operation: str, vhost: str, name: str, path: str) -> bool:
                return self.writable or operation != "write"

        self.vhost.declare_queue("q")
        c = self.client()
        c.session.user = User(True)
        c.channel()
        c.publish("", "q", b"allowed")
        self.assertEqual(len(self.vhost.queues["q"]), 1)
        c.session.channels[1].core.set_user(User(False))
        c.publish("", "q", b"refused")
        self.assertEqual(c.close_error().reply_code, 403)
        self.assertEqual(len(self.vhost.queues["q"]), 1)


class DirectReplyTests(AmqpTestCase):
    def test_rpc(self) -> None:
        """RabbitMQ's direct reply-to: the requester consumes the
        pseudo-queue with no-ack, its request's reply-to names its reply
        queue, the responder publishes there by that name."""
        self.vhost.declare_queue("rpc")
        requester = self.client()
        requester.channel()
        requester.send(commands.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=True), 1)
        tag = requester.expect(commands.Basic.ConsumeOk).consumer_tag
        requester.publish("", "rpc", b"ping", reply_to="amq.rabbitmq.reply-to", correlation_id="1")
        request = self.vhost.queues["rpc"].get()
        reply_to = request.properties["reply_to"]
        self.assertTrue(reply_to.startswith("amq.rabbitmq.reply-to."), reply_to)
        responder = self.client()
        responder.channel()
        responder.publish("", reply_to, b"pong", correlation_id="1")
        self.clock.advance(0)
        frames = [v for _, v in requester.read()]
        [deliver] = [v for v in frames if isinstance(v, commands.Basic.Deliver)]
        self.assertEqual((deliver.consumer_tag, deliver.routing_key), (tag, reply_to))
        self.assertIn(ContentBody(b"pong").value, [v.value for v in frames if isinstance(v, ContentBody)])
        # The reply queue is the requester's connection's: it goes with it.
        requester.send(commands.Connection.Close(200, "", 0, 0))
        self.assertNotIn(reply_to, self.vhost.queues)

    def test_refusals(self) -> None:
        c = self.client()
        c.channel()
        c.publish("", "anywhere", b"x", reply_to="amq.rabbitmq.reply-to")
        close = c.close_error()
        self.assertEqual(close.reply_code, 406)
        self.assertIn("fast reply consumer does not exist", close.reply_text)
        c.send(commands.Channel.CloseOk(), 1)
        c.channel()
        c.send(commands.Basic.Consume(queue="amq.rabbitmq.reply-to"), 1)
        self.assertEqual(c.close_error().reply_code, 406)
