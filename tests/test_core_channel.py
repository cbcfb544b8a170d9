"""Tests for L{qmq.core.channel}: the core's one way in for every frontend.

No protocol is involved: a tiny L{Consumer} stands in for a frontend's
subscription (it tags each delivery with L{Channel.track}, as a frontend
does), and a fake store stands in for a disk store that answers a publish
later. Everything runs on a L{Clock}.

"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from qmq.core.broker import Broker
from qmq.core.consumer import Consumer, SubscriberBuffer
from qmq.core.errors import (
    NotFound,
    PreconditionFailed,
    ResourceLimit,
    ResourceLocked,
)
from qmq.core.message import Message
from qmq.core.policy import CUT_CONSUMERS
from qmq.core.queue import Queue
from qmq.core.store import NullStore, Recovery
from qmq.stomp.destinations import DestinationChannel as Channel
from qmq.stomp.destinations import DestinationError

START = 1000.0


class Recorder(Consumer):
    """A frontend's consumer, reduced to what the core sees of one.

    C{deliver} tags the delivery through the channel and records
    C{(tag, message)}; C{cancelled} records and tells the channel, as the
    STOMP session does.
    """

    def __init__(
        self,
        channel: Channel,
        ack_required: bool = True,
        prefetch: int | None = None,
        cumulative: bool = False,
        backlog_limit: int = 0,
    ) -> None:
        super().__init__(ack_required, prefetch, channel, cumulative)
        self.channel = channel
        self.backlog_limit = backlog_limit
        self.got: list[tuple[int, Message]] = []
        self.cancels = 0

    def deliver(self, message: Message, queue: Queue | None) -> None:
        self.got.append((self.channel.track(self, message), message))

    def cancelled(self) -> None:
        self.cancels += 1
        self.channel.consumer_cancelled(self)

    def bodies(self) -> list[bytes]:
        return [m.body for _, m in self.got]

    def tags(self) -> list[int]:
        return [t for t, _ in self.got]


class FakeStore:
    """A store that records every call and answers a publish later.

    It implements the whole interface of L{qmq.core.store.MessageStore};
    C{publish} returns a fresh L{Deferred} that the test fires (or not).
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.waiters: list[Deferred] = []
        self.flushes = 0

    def named(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]

    def recover(self) -> Recovery:
        self.calls.append(("recover", ()))
        return Recovery()

    def publish(self, vhost: Any, message: Message, queues: Any) -> Deferred:
        self.calls.append(("publish", (vhost, message, list(queues))))
        d: Deferred = Deferred()
        self.waiters.append(d)
        return d

    def settle(self, queue: Queue, message: Message, reason: str) -> None:
        self.calls.append(("settle", (queue, message, reason)))

    def requeue(self, queue: Queue, message: Message) -> None:
        self.calls.append(("requeue", (queue, message)))

    def declare_queue(self, vhost: Any, queue: Queue) -> None:
        self.calls.append(("declare_queue", (vhost, queue)))

    def delete_queue(self, vhost: Any, queue: Queue) -> None:
        self.calls.append(("delete_queue", (vhost, queue)))

    def declare_exchange(self, vhost: Any, exchange: Any) -> None:
        self.calls.append(("declare_exchange", (vhost, exchange)))

    def delete_exchange(self, vhost: Any, exchange: Any) -> None:
        self.calls.append(("delete_exchange", (vhost, exchange)))

    def bind(self, vhost: Any, queue: Queue, exchange: Any, key: str, arguments: Any) -> None:
        self.calls.append(("bind", (vhost, queue, exchange, key, arguments)))

    def unbind(self, vhost: Any, queue: Queue, exchange: Any, key: str, arguments: Any) -> None:
        self.calls.append(("unbind", (vhost, queue, exchange, key, arguments)))

    def bind_exchange(self, vhost: Any, destination: Any, source: Any, key: str, arguments: Any) -> None:
        self.calls.append(("bind_exchange", (vhost, destination, source, key, arguments)))

    def unbind_exchange(
        self, vhost: Any, destination: Any, source: Any, key: str, arguments: Any
    ) -> None:
        self.calls.append(("unbind_exchange", (vhost, destination, source, key, arguments)))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.calls.append(("close", ()))


class FakeAlarm:
    """What C{control("memory")} reads of the broker's memory alarm."""

    def __init__(self, active: bool, rss: int, high: int) -> None:
        self.active = active
        self.rss = rss
        self.high = high

    def subscribe(self, callback: Any) -> None:
        pass

    def unsubscribe(self, callback: Any) -> None:
        pass


class CountingQueue(Queue):
    """A queue that counts the acks it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acks = 0

    def ack(self, consumer: Consumer, message: Message) -> None:
        self.acks += 1
        super().ack(consumer, message)


_HOLE = object()


class HoleCountingDict(dict):
    """A consumer's C{unacked} dict that counts the work of iterating it.

    CPython's dict keeps its entries in an insertion-ordered array: popping
    one leaves a hole, and holes are squeezed out only when the dict is
    resized on an insertion. An iterator starts at the first slot and steps
    over every hole before it reaches a live entry (C{dictiter_iternextkey}
    in C{Objects/dictobject.c}), so C{next(iter(d))} on a dict whose first
    k entries were popped costs k steps, whatever the Python code looks
    like. This class keeps the same slot array beside the dict and counts
    those steps in C{slots_visited}; its C{__iter__} serves keys from that
    array (skipping the holes cheaply) so the test itself stays fast.
    Holes are squeezed out at an insertion once they outnumber live entries
    (CPython does it at its next resize, which is no sooner).

    @ivar iterations: how many iterators were started.
    @ivar yielded: how many keys the iterators yielded.
    @ivar slots_visited: how many slots a CPython dict iterator would have
        stepped through (holes and live entries).
    """

    def __init__(self) -> None:
        super().__init__()
        self._slots: list[Any] = []
        self._where: dict[Any, int] = {}
        self._first = 0  # no live entry before this slot
        self._holes = 0
        self.iterations = 0
        self.yielded = 0
        self.slots_visited = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        where = self._where
        if key not in where:
            if self._holes and self._holes >= len(where):
                self._compact()
                where = self._where
            slots = self._slots
            where[key] = len(slots)
            slots.append(key)
        dict.__setitem__(self, key, value)

    def _compact(self) -> None:
        self._slots = [k for k in self._slots[self._first :] if k is not _HOLE]
        self._where = {k: i for i, k in enumerate(self._slots)}
        self._first = 0
        self._holes = 0

    def _forget(self, key: Any) -> None:
        slots = self._slots
        slots[self._where.pop(key)] = _HOLE
        self._holes += 1
        first = self._first
        n = len(slots)
        while first < n and slots[first] is _HOLE:
            first += 1
        self._first = first

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self._where:
            self._forget(key)
        return dict.pop(self, key, *default)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._forget(key)

    def popitem(self) -> tuple[Any, Any]:
        key, value = dict.popitem(self)
        self._forget(key)
        return key, value

    def clear(self) -> None:
        dict.clear(self)
        self._slots = []
        self._where = {}
        self._first = 0
        self._holes = 0

    def __iter__(self) -> Iterator[Any]:
        # A generator: counted once started (the channel starts every one).
        self.iterations += 1
        # Every hole before the first live entry is a step for CPython too.
        slots = self._slots
        i = self._first
        self.slots_visited += i
        while i < len(slots):
            key = slots[i]
            i += 1
            self.slots_visited += 1
            if key is not _HOLE:
                self.yielded += 1
                yield key


def counting_unacked(consumer: Consumer) -> dict:
    """Give C{consumer} an empty C{unacked} mapping that counts its iteration.

    For a plain dict (what the core makes today) that is L{HoleCountingDict};
    should the core switch to another mapping type, a subclass of it that
    counts iterators and yielded keys only.
    """
    base = type(consumer.unacked)
    if base is dict:
        counting: Any = HoleCountingDict()
    else:

        class Counting(base):  # type: ignore[valid-type, misc]
            iterations = 0
            yielded = 0
            slots_visited = 0

            def __iter__(self) -> Iterator[Any]:
                self.iterations += 1
                for key in base.__iter__(self):
                    self.yielded += 1
                    self.slots_visited += 1
                    yield key

        counting = Counting()
    consumer.unacked = counting
    return counting


class ChannelTestCase(SynchronousTestCase):
    """A broker on a L{Clock}, with the memory store unless C{store} is set."""

    store: Any = None

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.broker = Broker(self.clock, self.store)
        self.vhost = self.broker.default_vhost
        self.channel = self.open("alice")

    def open(self, owner: str = "alice") -> Channel:
        channel = Channel(self.broker, self.vhost, owner)
        self.addCleanup(channel.close)
        return channel

    def send(
        self,
        destination: str,
        body: bytes,
        channel: Channel | None = None,
        persistent: bool = False,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Publish C{body} to C{destination} the way a frontend does; return
        what C{publish} returned."""
        channel = channel or self.channel
        target = channel.send_target(destination)
        return channel.publish_target(target, channel.new_message(target, headers, body, persistent))

    def consumer(self, channel: Channel | None = None, **kwargs: Any) -> Recorder:
        return Recorder(channel or self.channel, **kwargs)

    def ready(self, name: str) -> list[tuple[bytes, int]]:
        """Body and delivery count of each message ready in queue C{name}."""
        return [(m.body, m.delivery_count) for m in self.vhost.queues[name].messages()]


class DestinationTests(ChannelTestCase):
    def test_queue_created_on_demand(self) -> None:
        """C{/queue/x} names queue x through the default exchange; the queue
        is made on first use, durable, and the same queue afterwards."""
        self.assertNotIn("x", self.vhost.queues)
        queue, exchange, exchange_name, key, owner = self.channel.send_target("/queue/x")
        self.assertIs(self.vhost.queues["x"], queue)
        self.assertIsNone(exchange)
        self.assertEqual((exchange_name, key), ("", "x"))
        self.assertIs(owner, queue)
        self.assertTrue(queue.durable)
        self.assertIsNone(queue.exclusive_owner)
        # Another channel names the same queue.
        self.assertIs(self.open("bob").send_target("/queue/x")[0], queue)

    def test_amq_queue_not_created(self) -> None:
        """An C{amq.} queue is never made on demand (to send or to subscribe);
        once it exists, it resolves."""
        with self.assertRaises(NotFound):
            self.channel.send_target("/queue/amq.foo")
        with self.assertRaises(NotFound):
            self.channel.subscribe(self.consumer(), "/queue/amq.foo")
        self.assertNotIn("amq.foo", self.vhost.queues)
        queue = self.vhost.declare_queue("amq.foo", durable=False)
        self.assertIs(self.channel.send_target("/queue/amq.foo")[0], queue)

    def test_allow_create_false(self) -> None:
        """A virtual host that does not allow creation refuses a SEND or a
        SUBSCRIBE naming a queue that does not exist (NotFound, short
        "no such queue"); queues that exist, temp queues, private and
        durable subscription queues still work."""
        self.vhost.allow_create = False
        self.vhost.declare_queue("declared")
        for attempt in (
            lambda: self.channel.send_target("/queue/x"),
            lambda: self.channel.subscribe(self.consumer(), "/queue/x"),
        ):
            with self.assertRaises(NotFound) as e:
                attempt()
            self.assertEqual(e.exception.short, "no such queue")
            self.assertIn("allow_create", e.exception.message)
        self.assertNotIn("x", self.vhost.queues)
        self.assertIs(self.channel.send_target("/queue/declared")[0], self.vhost.queues["declared"])
        self.channel.send_target("/temp-queue/r")
        self.channel.subscribe(self.consumer(), "/topic/t", label="s")
        self.channel.subscribe(self.consumer(), "/topic/t", durable_name="d")

    def test_topic(self) -> None:
        """C{/topic/a.b} is exchange amq.topic with routing key a.b."""
        topic = self.vhost.exchange("amq.topic")
        self.assertEqual(
            self.channel.send_target("/topic/a.b"), (None, topic, "amq.topic", "a.b", topic)
        )

    def test_exchange(self) -> None:
        """C{/exchange/NAME/KEY} is exchange NAME with routing key KEY (may be
        empty); an unknown exchange is NotFound."""
        fanout = self.vhost.exchange("amq.fanout")
        self.assertEqual(
            self.channel.send_target("/exchange/amq.fanout/k.1"),
            (None, fanout, "amq.fanout", "k.1", fanout),
        )
        self.assertEqual(self.channel.send_target("/exchange/amq.fanout")[3], "")
        with self.assertRaises(NotFound):
            self.channel.send_target("/exchange/nope/k")
        with self.assertRaises(NotFound):
            self.channel.subscribe(self.consumer(ack_required=False), "/exchange/nope/k")

    def test_temp_queue_private(self) -> None:
        """C{/temp-queue/r} is a queue private to the channel, named with the
        channel's token: the same queue for it every time, another queue for
        another channel."""
        other = self.open("alice")
        mine = self.channel.send_target("/temp-queue/r")[0]
        theirs = other.send_target("/temp-queue/r")[0]
        self.assertIsNot(mine, theirs)
        self.assertIn(self.channel.token, mine.name)
        self.assertIn(other.token, theirs.name)
        self.assertNotIn(other.token, mine.name)
        self.assertNotEqual(self.channel.token, other.token)
        self.assertIs(mine.exclusive_owner, self.channel.connection)
        self.assertFalse(mine.durable)
        self.assertIs(self.vhost.queues[mine.name], mine)
        self.assertIs(self.channel.send_target("/temp-queue/r")[0], mine)
        # The channel consumes from it under the short name...
        reader = self.consumer()
        self.channel.subscribe(reader, "/temp-queue/r")
        self.assertIs(reader.queue, mine)
        # ...anyone given the full name may reply to it, but not consume it
        # (AMQP's 405 resource-locked: it is exclusive to this connection).
        self.send("/queue/" + mine.name, b"reply", channel=other)
        self.assertEqual(reader.bodies(), [b"reply"])
        with self.assertRaises(ResourceLocked):
            other.subscribe(self.consumer(other), "/queue/" + mine.name)

    def test_bad_names(self) -> None:
        """Names that map to nothing raise DestinationError."""
        for text in (
            "",
            "queue/x",
            "/queue/",
            "/topic/",
            "/exchange/",
            "/exchange//k",
            "/temp-queue/",
            "/nowhere/x",
        ):
            with self.assertRaises(DestinationError, msg=text):
                self.channel.send_target(text)
            with self.assertRaises(DestinationError, msg=text):
                self.channel.subscribe(self.consumer(), text)

    def test_control_target(self) -> None:
        """A C{/control/} destination resolves to its path, and cannot be
        subscribed to."""
        self.assertEqual(
            self.channel.send_target("/control/memory"), (None, None, None, "memory", None)
        )
        with self.assertRaises(DestinationError):
            self.channel.subscribe(self.consumer(), "/control/memory")

    def test_send_target_cached(self) -> None:
        """A resolved destination is cached: the same target comes back
        without resolving again."""
        first = self.channel.send_target("/queue/c")
        self.vhost.queues.pop("c")  # resolving again would make a new queue
        self.assertIs(self.channel.send_target("/queue/c"), first)
        topic = self.channel.send_target("/topic/t")
        self.assertIs(self.channel.send_target("/topic/t"), topic)

    def test_send_target_after_queue_deleted(self) -> None:
        """Once its queue is deleted, a cached target is resolved again: a
        C{/queue/} name gets a new queue, and publishes reach it."""
        old = self.channel.send_target("/queue/c")[0]
        self.vhost.delete_queue("c")
        new = self.channel.send_target("/queue/c")[0]
        self.assertIsNot(new, old)
        self.assertIs(self.vhost.queues["c"], new)
        self.send("/queue/c", b"m")
        self.assertEqual(self.ready("c"), [(b"m", 0)])

    def test_reply_to_closed_channel_refused(self) -> None:
        """A cached target naming another channel's temp queue is refused once
        that channel closed, instead of making a stray queue."""
        requester = self.open("bob")
        name = requester.send_target("/temp-queue/r")[0].name
        self.send("/queue/" + name, b"early")
        requester.close()
        self.assertNotIn(name, self.vhost.queues)
        with self.assertRaises(NotFound):
            self.send("/queue/" + name, b"late")
        self.assertNotIn(name, self.vhost.queues)

    def test_exchange_target_after_exchange_deleted(self) -> None:
        """A cached exchange target is dropped once the exchange is deleted."""
        self.vhost.declare_exchange("ev", "topic")
        self.channel.send_target("/exchange/ev/k")
        self.vhost.delete_exchange("ev")
        with self.assertRaises(NotFound):
            self.channel.send_target("/exchange/ev/k")
        again = self.vhost.declare_exchange("ev", "direct")
        self.assertIs(self.channel.send_target("/exchange/ev/k")[1], again)


class PublishTests(ChannelTestCase):
    def test_new_message(self) -> None:
        """C{new_message} stamps increasing ids and the clock's time, and
        names the target's exchange and key."""
        target = self.channel.send_target("/topic/a.b")
        m1 = self.channel.new_message(target, {"h": "v"}, b"one", persistent=True)
        self.clock.advance(2.5)
        m2 = self.open("bob").new_message(target, None, b"two")
        self.assertLess(m1.id, m2.id)
        self.assertEqual((m1.timestamp, m2.timestamp), (START, START + 2.5))
        self.assertEqual(
            (m1.exchange, m1.routing_key, m1.headers, m1.body, m1.persistent, m1.delivery_count),
            ("amq.topic", "a.b", {"h": "v"}, b"one", True, 0),
        )
        self.assertFalse(m2.persistent)
        queue_message = self.channel.new_message(self.channel.send_target("/queue/q"), None, b"")
        self.assertEqual((queue_message.exchange, queue_message.routing_key), ("", "q"))
        self.assertGreater(queue_message.id, m2.id)

    def test_publish_to_queue_without_consumer(self) -> None:
        """A message for a queue without consumers waits in it, in order."""
        self.assertIsNone(self.send("/queue/q", b"1"))
        self.assertIsNone(self.send("/queue/q", b"2"))
        self.assertEqual(self.ready("q"), [(b"1", 0), (b"2", 0)])

    def test_publish_to_queue_with_consumer(self) -> None:
        """A message for a queue with a ready consumer goes straight to it."""
        c = self.consumer()
        self.channel.subscribe(c, "/queue/q")
        self.send("/queue/q", b"1", headers={"k": "v"})
        self.assertEqual(c.bodies(), [b"1"])
        self.assertEqual(c.got[0][1].headers, {"k": "v"})
        self.assertEqual(self.ready("q"), [])

    def test_publish_to_topic(self) -> None:
        """A topic publish reaches every matching bound queue and live
        consumer (the same message), and no other."""
        for name, key in (("q1", "a.*"), ("q2", "a.b"), ("q3", "x")):
            self.vhost.declare_queue(name)
            self.vhost.bind(name, "amq.topic", key)
        live = {key: self.consumer(ack_required=False) for key in ("a.#", "a.b", "z")}
        for key, c in live.items():
            self.channel.subscribe(c, "/topic/" + key)
        self.send("/topic/a.b", b"m")
        message = self.vhost.queues["q1"].messages()[0]
        self.assertEqual(message.body, b"m")
        self.assertIs(self.vhost.queues["q2"].messages()[0], message)
        self.assertEqual(self.ready("q3"), [])
        self.assertIs(live["a.#"].got[0][1], message)
        self.assertIs(live["a.b"].got[0][1], message)
        self.assertEqual(live["z"].got, [])

    def test_publish_atomic(self) -> None:
        """With two queues on a fanout exchange, one full and refusing
        publishes, a publish raises ResourceLimit and neither queue gets it."""
        self.vhost.declare_exchange("fan", "fanout")
        self.vhost.declare_queue("open")
        self.vhost.declare_queue(
            "full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        # "open" is bound first: without the check up front it would get the
        # message before "full" refused it.
        self.vhost.bind("open", "fan")
        self.vhost.bind("full", "fan")
        reader = self.consumer()
        self.channel.subscribe(reader, "/queue/open")
        self.send("/queue/full", b"filler")
        with self.assertRaises(ResourceLimit):
            self.send("/exchange/fan/", b"refused", persistent=True)
        self.assertEqual(reader.got, [])
        self.assertEqual(self.ready("open"), [])
        self.assertEqual(self.ready("full"), [(b"filler", 0)])
        # Once "full" has room, the same publish reaches both.
        self.vhost.queues["full"].get()
        self.send("/exchange/fan/", b"accepted")
        self.assertEqual(reader.bodies(), [b"accepted"])
        self.assertEqual(self.ready("full"), [(b"accepted", 0)])

    def test_publish_null_store_returns_none(self) -> None:
        """With the memory store, even a persistent message on a durable
        queue is done once routed."""
        self.assertIsInstance(self.broker.store, NullStore)
        self.assertTrue(self.channel.send_target("/queue/d")[0].durable)
        self.assertIsNone(self.send("/queue/d", b"p", persistent=True))
        self.assertIsNone(self.send("/topic/nobody", b"p", persistent=True))


class DelayingStoreTests(ChannelTestCase):
    """A store that answers a publish later (as a disk store does)."""

    def setUp(self) -> None:
        self.store = FakeStore()
        super().setUp()
        self.vhost.declare_exchange("fan", "fanout")
        self.d1 = self.vhost.declare_queue("d1")
        self.d2 = self.vhost.declare_queue("d2")
        self.mem = self.vhost.declare_queue("mem", durable=False)
        for name in ("d1", "mem", "d2"):
            self.vhost.bind(name, "fan")
        del self.store.calls[:]

    def test_persistent_to_durable_queues(self) -> None:
        """A persistent message reaching durable queues is given to the store
        once, with every durable queue it reached (not the others); publish
        returns the store's Deferred."""
        result = self.send("/exchange/fan/", b"p", persistent=True)
        self.assertEqual(len(self.store.waiters), 1)
        self.assertIs(result, self.store.waiters[0])
        [(vhost, message, queues)] = self.store.named("publish")
        self.assertIs(vhost, self.vhost)
        self.assertEqual(message.body, b"p")
        self.assertEqual(queues, [self.d1, self.d2])
        # Routed already: the store's answer is only about durability.
        self.assertEqual(self.ready("mem"), [(b"p", 0)])
        self.assertNoResult(result)
        result.callback(None)
        self.successResultOf(result)

    def test_persistent_to_one_durable_queue(self) -> None:
        """A C{/queue/} publish of a persistent message asks the store for that queue."""
        result = self.send("/queue/d1", b"p", persistent=True)
        self.assertIs(result, self.store.waiters[0])
        self.assertEqual(self.store.named("publish")[0][2], [self.d1])

    def test_never_reaches_store(self) -> None:
        """A non-persistent message, or one reaching no durable queue, never
        reaches the store; nor then does a flush."""
        self.assertIsNone(self.send("/exchange/fan/", b"transient"))
        self.assertIsNone(self.send("/queue/mem", b"p", persistent=True))
        self.assertIsNone(self.send("/topic/nobody", b"p", persistent=True))
        self.assertIsNone(
            self.send("/temp-queue/r", b"p", persistent=True),
        )
        self.assertEqual(self.store.named("publish"), [])
        self.clock.advance(0)
        self.assertEqual(self.store.flushes, 0)

    def test_flush_once_per_turn(self) -> None:
        """The store is flushed once at the end of a turn, however many
        publishes reached it in that turn."""
        for body in (b"1", b"2", b"3"):
            self.send("/exchange/fan/", body, persistent=True)
        self.send("/queue/d2", b"4", persistent=True)
        self.assertEqual(len(self.store.named("publish")), 4)
        self.assertEqual(self.store.flushes, 0)
        self.clock.advance(0)
        self.assertEqual(self.store.flushes, 1)
        self.clock.advance(0)
        self.assertEqual(self.store.flushes, 1)
        # Next turn: once again, here ended by the batcher directly.
        self.send("/queue/d1", b"5", persistent=True)
        self.send("/queue/d1", b"6", persistent=True)
        self.broker.batcher.flush_all()
        self.assertEqual(self.store.flushes, 2)
        self.clock.advance(0)
        self.assertEqual(self.store.flushes, 2)

    def test_refused_publish_not_stored(self) -> None:
        """A publish refused by a full queue never reaches the store."""
        self.vhost.declare_queue(
            "full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
        )
        self.vhost.bind("full", "fan")
        with self.assertRaises(ResourceLimit):
            self.send("/exchange/fan/", b"p", persistent=True)
        self.assertEqual(self.store.named("publish"), [])
        self.assertEqual(self.ready("d1"), [])

    def test_queue_topology_reaches_store(self) -> None:
        """Declaring and deleting durable queues reaches the store; the
        channel's own temporary and private queues do not."""
        made = self.channel.send_target("/queue/new")[0]
        self.assertEqual(self.store.named("declare_queue"), [(self.vhost, made)])
        self.channel.send_target("/temp-queue/r")
        self.channel.subscribe(self.consumer(), "/topic/k", label="s1")
        self.assertEqual(len(self.store.named("declare_queue")), 1)
        self.vhost.delete_queue("new")
        self.assertEqual(self.store.named("delete_queue"), [(self.vhost, made)])
        self.channel.close()
        self.assertEqual(len(self.store.named("delete_queue")), 1)

    def test_durable_subscription_queue_reaches_store(self) -> None:
        """A durable subscription's queue is declared to the store, and
        deleted from it with C{delete_durable}."""
        c = self.consumer()
        self.channel.subscribe(c, "/topic/k", durable_name="sub")
        queue = self.vhost.queues["durable.alice.sub"]
        self.assertEqual(self.store.named("declare_queue"), [(self.vhost, queue)])
        self.channel.unsubscribe(c, delete_durable=True)
        self.assertEqual(self.store.named("delete_queue"), [(self.vhost, queue)])

    def test_durable_subscription_binding_reaches_store(self) -> None:
        """A durable subscription binds its durable queue to amq.topic
        (durable) and the store is told, so a disk store brings the binding
        back after a restart."""
        self.channel.subscribe(self.consumer(), "/topic/k", durable_name="sub")
        queue = self.vhost.queues["durable.alice.sub"]
        topic = self.vhost.exchange("amq.topic")
        self.assertEqual(self.store.named("bind"), [(self.vhost, queue, topic, "k", None)])

    def test_settle_reaches_store(self) -> None:
        """Settling a persistent message on a durable queue tells the store:
        an ack or a nack without requeue settles it (C{ack}, C{drop}), a
        nack with requeue gives the store the copy with its count raised."""
        c = self.consumer()
        self.channel.subscribe(c, "/queue/d1")
        for body in (b"acked", b"requeued", b"dropped"):
            self.send("/queue/d1", body, persistent=True)
        (t1, m1), (t2, m2), (t3, m3) = c.got
        self.channel.settle_delivery(c, t1, True)
        self.channel.settle_delivery(c, t2, False, requeue=True)
        self.channel.settle_delivery(c, t3, False, requeue=False)
        again = c.got[3][1]
        self.assertEqual((again.body, again.delivery_count), (b"requeued", 1))
        self.assertEqual(
            [(n, args) for n, args in self.store.calls if n in ("settle", "requeue")],
            [
                ("settle", (self.d1, m1, "ack")),
                ("requeue", (self.d1, again)),
                ("settle", (self.d1, m3, "drop")),
            ],
        )


class ConsumeTests(ChannelTestCase):
    def test_queue_consumer_prefetch(self) -> None:
        """A queue consumer with prefetch 2 gets two messages, then one more
        per ack."""
        c = self.consumer(prefetch=2)
        self.channel.subscribe(c, "/queue/q")
        self.assertIs(c.queue, self.vhost.queues["q"])
        self.assertIn(c, self.channel.consumers)
        for body in (b"1", b"2", b"3", b"4"):
            self.send("/queue/q", body)
        self.assertEqual(c.bodies(), [b"1", b"2"])
        self.assertEqual(self.ready("q"), [(b"3", 0), (b"4", 0)])
        self.assertEqual(list(c.unacked), c.tags())
        self.channel.settle_delivery(self.channel.owner_of(c.tags()[0]), c.tags()[0], True)
        self.assertEqual(c.bodies(), [b"1", b"2", b"3"])
        self.assertEqual(self.ready("q"), [(b"4", 0)])

    def test_subscribe_drains_waiting(self) -> None:
        """Subscribing to a queue delivers what already waits, in order."""
        for body in (b"1", b"2", b"3"):
            self.send("/queue/q", body)
        c = self.consumer(prefetch=2)
        self.channel.subscribe(c, "/queue/q")
        self.assertEqual(c.bodies(), [b"1", b"2"])
        self.assertEqual(c.tags(), [1, 2])

    def test_live_topic_consumer(self) -> None:
        """An auto-ack topic subscription is bound straight to amq.topic: no
        queue is made, deliveries are tagged but nothing waits for an ack."""
        queues = set(self.vhost.queues)
        topic = self.vhost.exchange("amq.topic")
        c = self.consumer(ack_required=False)
        self.channel.subscribe(c, "/topic/k.*")
        self.assertEqual(set(self.vhost.queues), queues)
        self.assertIsNone(c.queue)
        self.assertIs(c.exchange, topic)
        self.assertEqual(c.binding_key, "k.*")
        self.assertIn(c, self.channel.consumers)
        self.assertEqual(topic.route("k.1", None), (c,))
        self.send("/topic/k.1", b"m")
        self.send("/topic/other", b"no")
        self.assertEqual(c.bodies(), [b"m"])
        self.assertEqual(self.channel.owners, {})
        self.channel.unsubscribe(c)
        self.assertIsNone(c.exchange)
        self.assertEqual(topic.route("k.1", None), ())
        self.assertNotIn(c, self.channel.consumers)
        self.send("/topic/k.1", b"gone")
        self.assertEqual(c.bodies(), [b"m"])

    def test_not_live_when_asked(self) -> None:
        """With C{live=False}, even an auto-ack topic subscription gets a
        private queue."""
        c = self.consumer(ack_required=False)
        self.channel.subscribe(c, "/topic/k", live=False, label="s")
        self.assertIsNone(c.exchange)
        self.assertIs(c.queue, self.vhost.queues[f"amq.sub.{self.channel.token}.s"])

    def test_ack_required_topic_consumer(self) -> None:
        """An acking topic subscription gets a private auto-delete queue
        C{amq.sub.TOKEN.LABEL}, bound with its key, deleted at unsubscribe."""
        c = self.consumer(prefetch=1)
        self.channel.subscribe(c, "/topic/k", label="sub-1")
        name = f"amq.sub.{self.channel.token}.sub-1"
        queue = self.vhost.queues[name]
        self.assertIs(c.queue, queue)
        self.assertTrue(c.private)
        self.assertTrue(queue.auto_delete)
        self.assertFalse(queue.durable)
        self.assertIs(queue.exclusive_owner, self.channel.connection)
        self.assertEqual(self.vhost.exchange("amq.topic").route("k", None), (queue,))
        self.send("/topic/k", b"1")
        self.send("/topic/k", b"2")
        self.assertEqual(c.bodies(), [b"1"])
        self.assertEqual(self.ready(name), [(b"2", 0)])
        self.channel.unsubscribe(c)
        self.assertNotIn(name, self.vhost.queues)
        self.assertTrue(queue.deleted)
        self.assertEqual(self.vhost.exchange("amq.topic").route("k", None), ())
        self.assertEqual(self.channel.owners, {})
        self.assertNotIn(c, self.channel.consumers)
        # Another channel cannot take the private queue meanwhile.
        other = self.consumer(prefetch=1)
        self.channel.subscribe(other, "/topic/k", label="sub-2")
        with self.assertRaises(ResourceLocked):
            self.open("alice").subscribe(
                self.consumer(), "/queue/" + other.queue.name  # type: ignore[union-attr]
            )

    def test_durable_subscription(self) -> None:
        """A durable subscription's queue C{durable.OWNER.NAME} outlives
        unsubscribe and the channel, keeps what is published meanwhile, and
        goes with C{delete_durable}."""
        c = self.consumer()
        self.channel.subscribe(c, "/topic/news", durable_name="feed")
        name = "durable.alice.feed"
        queue = self.vhost.queues[name]
        self.assertIs(c.queue, queue)
        self.assertTrue(c.durable)
        self.assertFalse(c.private)
        self.assertTrue(queue.durable)
        self.send("/topic/news", b"1")
        self.assertEqual(c.bodies(), [b"1"])
        self.channel.unsubscribe(c)  # 1 unacked: given back
        self.assertIs(self.vhost.queues[name], queue)
        self.send("/topic/news", b"2")
        # Back on the same channel, then away with the channel.
        c2 = self.consumer()
        self.channel.subscribe(c2, "/topic/news", durable_name="feed")
        self.assertEqual([(m.body, m.delivery_count) for _, m in c2.got], [(b"1", 1), (b"2", 0)])
        self.channel.settle_delivery(c2, c2.tags()[1], True)
        self.channel.settle_delivery(c2, c2.tags()[0], True)
        self.channel.close()
        self.assertIs(self.vhost.queues[name], queue)
        self.send("/topic/news", b"3", channel=self.open("bob"))
        self.send("/topic/news", b"4", channel=self.open("bob"))
        self.assertEqual(self.ready(name), [(b"3", 0), (b"4", 0)])
        # The same owner on a new channel finds it.
        later = self.open("alice")
        c3 = self.consumer(later)
        later.subscribe(c3, "/topic/news", durable_name="feed")
        self.assertEqual(c3.bodies(), [b"3", b"4"])
        later.unsubscribe(c3, delete_durable=True)
        self.assertNotIn(name, self.vhost.queues)
        self.assertTrue(queue.deleted)
        self.assertEqual(self.vhost.exchange("amq.topic").route("news", None), ())

    def test_durable_name_per_owner(self) -> None:
        """Two owners with the same subscription name get two queues."""
        self.channel.subscribe(self.consumer(), "/topic/k", durable_name="s")
        bob = self.open("bob")
        bob.subscribe(self.consumer(bob), "/topic/k", durable_name="s")
        self.assertIn("durable.alice.s", self.vhost.queues)
        self.assertIn("durable.bob.s", self.vhost.queues)

    def test_paused_live_consumer_backlog(self) -> None:
        """A paused live consumer's backlog keeps the newest C{backlog_limit}
        messages, delivered in order on resume."""
        c = self.consumer(ack_required=False, backlog_limit=3)
        self.channel.subscribe(c, "/topic/k")
        c.paused = True
        for i in range(1, 6):
            self.send("/topic/k", b"%d" % i)
        self.assertEqual(c.got, [])
        self.assertEqual([m.body for m in c.backlog], [b"3", b"4", b"5"])  # type: ignore[union-attr]
        c.resume()
        self.assertEqual(c.bodies(), [b"3", b"4", b"5"])
        self.assertIsNone(c.backlog)
        self.send("/topic/k", b"6")
        self.assertEqual(c.bodies(), [b"3", b"4", b"5", b"6"])

    def test_paused_private_queue_bounded(self) -> None:
        """An acking topic subscription's private queue holds at most the
        consumer's C{backlog_limit} messages, the oldest dropped."""
        c = self.consumer(prefetch=1, backlog_limit=2)
        self.channel.subscribe(c, "/topic/k", label="s")
        c.paused = True
        for i in range(1, 6):
            self.send("/topic/k", b"%d" % i)
        self.assertEqual(self.ready(c.queue.name), [(b"4", 0), (b"5", 0)])  # type: ignore[union-attr]
        c.resume()
        self.assertEqual(c.bodies(), [b"4"])

    def test_channel_pause_resume(self) -> None:
        """The channel pauses and resumes all its consumers: queue consumers
        get what waited, live ones their backlog."""
        q = self.consumer()
        live = self.consumer(ack_required=False, backlog_limit=10)
        self.channel.subscribe(q, "/queue/q")
        self.channel.subscribe(live, "/topic/k")
        self.channel.pause()
        self.send("/queue/q", b"q1")
        self.send("/queue/q", b"q2")
        self.send("/topic/k", b"t1")
        self.send("/topic/k", b"t2")
        self.assertEqual((q.got, live.got), ([], []))
        self.channel.resume()
        self.assertEqual(q.bodies(), [b"q1", b"q2"])
        self.assertEqual(live.bodies(), [b"t1", b"t2"])


class SettleTests(ChannelTestCase):
    def test_individual_ack(self) -> None:
        """An ack settles that delivery only, and gives its credit back."""
        c = self.consumer(prefetch=3)
        self.channel.subscribe(c, "/queue/q")
        for body in (b"1", b"2", b"3"):
            self.send("/queue/q", body)
        t1, t2, t3 = c.tags()
        self.assertIs(self.channel.owner_of(t2), c)
        self.channel.settle_delivery(self.channel.owner_of(t2), t2, True)
        self.assertEqual(list(c.unacked), [t1, t3])
        self.assertEqual(c.credit, 1)
        with self.assertRaises(NotFound):
            self.channel.owner_of(t2)
        self.assertIs(self.channel.owner_of(t1), c)
        self.assertIs(self.channel.owner_of(t3), c)

    def test_nack_requeue(self) -> None:
        """A nack with requeue puts the message back at the head of the queue,
        ahead of messages never delivered, marked with delivery count 1."""
        c = self.consumer(prefetch=1)
        self.channel.subscribe(c, "/queue/q")
        self.send("/queue/q", b"1")
        self.send("/queue/q", b"2")
        [(tag, first)] = c.got
        c.paused = True
        self.channel.settle_delivery(c, tag, False, requeue=True)
        self.assertEqual(self.ready("q"), [(b"1", 1), (b"2", 0)])
        self.assertEqual(first.delivery_count, 0)  # a copy is marked, not the original
        self.assertEqual(dict(c.unacked), {})
        c.resume()
        self.assertEqual([(m.body, m.delivery_count) for _, m in c.got], [(b"1", 0), (b"1", 1)])
        self.assertGreater(c.got[1][0], tag)  # a new delivery, a new tag

    def test_nack_without_requeue(self) -> None:
        """A nack without requeue drops the message; the next one follows."""
        c = self.consumer(prefetch=1)
        self.channel.subscribe(c, "/queue/q")
        self.send("/queue/q", b"1")
        self.send("/queue/q", b"2")
        self.channel.settle_delivery(c, c.tags()[0], False, requeue=False)
        self.assertEqual(c.bodies(), [b"1", b"2"])
        self.assertEqual(self.ready("q"), [])
        self.channel.settle_delivery(c, c.tags()[1], True)
        self.assertEqual(c.bodies(), [b"1", b"2"])

    def test_cumulative_ack(self) -> None:
        """On a cumulative consumer one ack settles every earlier delivery;
        C{owner_of} of a settled tag is None, of an unknown tag NotFound."""
        c = self.consumer(cumulative=True)
        self.channel.subscribe(c, "/queue/q")
        for i in range(1, 5):
            self.send("/queue/q", b"%d" % i)
        t1, t2, t3, t4 = c.tags()
        self.channel.settle_delivery(self.channel.owner_of(t3), t3, True)
        self.assertEqual(list(c.unacked), [t4])
        self.assertEqual(set(self.channel.owners), {t4})
        self.assertIsNone(self.channel.owner_of(t1))
        self.assertIsNone(self.channel.owner_of(t3))
        self.assertIs(self.channel.owner_of(t4), c)
        with self.assertRaises(NotFound):
            self.channel.owner_of(t4 + 100)
        with self.assertRaises(NotFound):
            self.channel.owner_of(0)
        # Settling a None owner (already settled) is a no-op.
        self.channel.settle_delivery(self.channel.owner_of(t2), t2, True)
        self.assertEqual(list(c.unacked), [t4])

    def test_cumulative_nack(self) -> None:
        """A cumulative nack with requeue gives every earlier delivery back,
        in publish order."""
        c = self.consumer(prefetch=3, cumulative=True)
        self.channel.subscribe(c, "/queue/q")
        for i in range(1, 5):
            self.send("/queue/q", b"%d" % i)
        c.paused = True
        self.channel.settle_delivery(c, c.tags()[1], False, requeue=True)
        self.assertEqual(self.ready("q"), [(b"1", 1), (b"2", 1), (b"4", 0)])
        self.assertEqual(list(c.unacked), [c.tags()[2]])

    def test_cumulative_ack_per_consumer(self) -> None:
        """A cumulative ack settles its own consumer's deliveries only."""
        a = self.consumer(cumulative=True)
        b = self.consumer(cumulative=True)
        self.channel.subscribe(a, "/queue/a")
        self.channel.subscribe(b, "/queue/b")
        self.send("/queue/a", b"a1")
        self.send("/queue/b", b"b1")
        self.send("/queue/a", b"a2")
        self.channel.settle_delivery(a, a.tags()[1], True)
        self.assertEqual(dict(a.unacked), {})
        self.assertEqual(list(b.unacked), b.tags())
        self.assertIs(self.channel.owner_of(b.tags()[0]), b)

    def test_owner_of_individually_acked_tag(self) -> None:
        """C{owner_of} raises NotFound for a tag that is not waiting, unless a
        cumulative ack on the channel settled past it: the channel keeps one
        mark for all its consumers (documented), so a tag that another,
        individually-acking consumer already acked is then a no-op."""
        individual = self.consumer()
        cumulative = self.consumer(cumulative=True)
        self.channel.subscribe(individual, "/queue/i")
        self.channel.subscribe(cumulative, "/queue/c")
        self.send("/queue/i", b"i")  # tag 1
        self.send("/queue/c", b"c")  # tag 2
        [tag] = individual.tags()
        self.channel.settle_delivery(individual, tag, True)
        with self.assertRaises(NotFound):
            self.channel.owner_of(tag)
        self.channel.settle_delivery(cumulative, cumulative.tags()[0], True)
        # Documented: at or below the channel's cumulative mark, a tag no
        # longer waiting is a no-op (None), whichever consumer it was on.
        self.assertIsNone(self.channel.owner_of(tag))
        with self.assertRaises(NotFound):
            self.channel.owner_of(cumulative.tags()[0] + 1)

    def test_cumulative_ack_work_is_linear(self) -> None:
        """100,000 deliveries on a cumulative consumer, then 100,000 acks one
        by one (tag 1, 2, ...): the total work is O(n), counted.

        C{Channel.settle} finds a cumulative consumer's oldest delivery with
        C{next(iter(unacked))} after popping the ones before it. With a plain
        dict that is quadratic (its iterator walks every hole popped entries
        leave: about 10**10 slot visits here), so a cumulative consumer keeps
        an C{OrderedDict}, whose iterator starts at its first live entry.
        L{counting_unacked} models the dict's holes, so this test fails if a
        plain dict comes back.
        """
        n = 100_000
        queue = self.vhost.queues["work"] = CountingQueue(self.vhost, "work", durable=False)
        c = self.consumer(cumulative=True)
        unacked = counting_unacked(c)
        self.channel.subscribe(c, "/queue/work")
        # What is measured is the acks: the deliveries take the shortest way
        # (one message, handed to the queue, delivered at once).
        message = self.channel.new_message(self.channel.send_target("/queue/work"), None, b"")
        publish = queue.publish
        for _ in range(n):
            publish(message)
        self.assertEqual(len(c.got), n)
        self.assertEqual(len(unacked), n)
        first_tag = c.got[0][0]
        owner_of = self.channel.owner_of
        settle = self.channel.settle_delivery
        for tag in range(first_tag, first_tag + n):
            settle(owner_of(tag), tag, True)
        # Every message settled once, nothing left behind.
        self.assertEqual(queue.acks, n)
        self.assertEqual(len(c.unacked), 0)
        self.assertEqual(self.channel.owners, {})
        self.assertEqual(c.credit, c.prefetch)
        # A constant number of iterators and keys per ack (the old code
        # copied the whole unacked list per ack: n**2 / 2 keys).
        self.assertLessEqual(unacked.iterations, 2 * n + 2)
        self.assertLessEqual(unacked.yielded, 2 * n + 2)
        # And a constant number of slots visited per ack.
        self.assertLessEqual(
            unacked.slots_visited,
            4 * n,
            f"{unacked.slots_visited:,} dict slots visited for {n:,} acks",
        )


class CloseTests(ChannelTestCase):
    def test_close(self) -> None:
        """Closing gives unacked messages back (another channel then gets them
        marked redelivered), deletes temp and private queues, unbinds live
        consumers; closing again changes nothing."""
        c = self.consumer(prefetch=2)
        self.channel.subscribe(c, "/queue/q")
        for body in (b"1", b"2", b"3"):
            self.send("/queue/q", body)
        self.channel.settle_delivery(c, c.tags()[0], True)  # 1 done; 2, 3 unacked
        self.assertEqual(c.bodies(), [b"1", b"2", b"3"])
        temp = self.channel.send_target("/temp-queue/r")[0]
        private = self.consumer()
        self.channel.subscribe(private, "/topic/p", label="s")
        private_queue = private.queue
        live = self.consumer(ack_required=False)
        self.channel.subscribe(live, "/topic/k")
        topic = self.vhost.exchange("amq.topic")
        self.assertEqual(topic.binding_count, 2)

        self.channel.close()
        self.assertTrue(self.channel.closed)
        self.assertEqual(self.ready("q"), [(b"2", 1), (b"3", 1)])
        self.assertIsNone(c.queue)
        self.assertFalse(self.vhost.queues["q"].consumers)
        for queue in (temp, private_queue):
            self.assertTrue(queue.deleted)  # type: ignore[union-attr]
            self.assertNotIn(queue.name, self.vhost.queues)  # type: ignore[union-attr]
        self.assertIsNone(live.exchange)
        self.assertEqual(topic.binding_count, 0)
        self.assertEqual(topic.route("k", None), ())
        self.assertEqual((self.channel.consumers, self.channel.owners), (set(), {}))
        self.assertEqual(self.channel.temp_queues, {})
        self.assertEqual((c.cancels, private.cancels, live.cancels), (0, 0, 0))

        other = self.open("bob")
        taker = self.consumer(other)
        other.subscribe(taker, "/queue/q")
        self.assertEqual([(m.body, m.delivery_count) for _, m in taker.got], [(b"2", 1), (b"3", 1)])

        queues = dict(self.vhost.queues)
        self.channel.close()
        self.assertEqual(self.vhost.queues, queues)
        self.assertEqual(len(taker.got), 2)
        self.assertEqual(list(taker.unacked), taker.tags())

    def test_close_keeps_other_consumers_messages(self) -> None:
        """Closing one channel leaves another channel's deliveries alone."""
        mine = self.consumer(prefetch=1)
        other = self.open("bob")
        theirs = self.consumer(other, prefetch=1)
        self.channel.subscribe(mine, "/queue/q")
        other.subscribe(theirs, "/queue/q")
        self.send("/queue/q", b"1")
        self.send("/queue/q", b"2")
        # Round robin: one each, whichever gets which.
        [(_, held)] = mine.got
        [(their_tag, _)] = theirs.got
        self.channel.close()
        self.assertEqual(self.ready("q"), [(held.body, 1)])
        self.assertIs(other.owner_of(their_tag), theirs)
        self.assertEqual(len(theirs.got), 1)

    def test_delete_exchange_cancels_live_consumer(self) -> None:
        """Deleting an exchange under a live consumer tells the consumer, which
        is detached, and the channel forgets it."""
        self.vhost.declare_exchange("ev", "topic")
        c = self.consumer(ack_required=False)
        self.channel.subscribe(c, "/exchange/ev/a.*")
        self.assertIs(c.exchange, self.vhost.exchanges["ev"])
        self.vhost.delete_exchange("ev")
        self.assertEqual(c.cancels, 1)
        self.assertIsNone(c.exchange)
        self.assertNotIn(c, self.channel.consumers)
        self.channel.close()
        self.assertEqual(c.cancels, 1)

    def test_delete_queue_cancels_queue_consumer(self) -> None:
        """Deleting a queue under a consumer tells it, and the channel forgets
        its unacked deliveries."""
        c = self.consumer()
        self.channel.subscribe(c, "/queue/q")
        self.send("/queue/q", b"1")
        [tag] = c.tags()
        self.vhost.delete_queue("q")
        self.assertEqual(c.cancels, 1)
        self.assertIsNone(c.queue)
        self.assertNotIn(c, self.channel.consumers)
        with self.assertRaises(NotFound):
            self.channel.owner_of(tag)


class ControlTests(ChannelTestCase):
    def test_count_msgs(self) -> None:
        """C{count-msgs/queue/NAME}: ready messages (0 for no such queue)."""
        for body in (b"1", b"2", b"3"):
            self.send("/queue/q", body)
        self.assertEqual(self.channel.control("count-msgs/queue/q"), [("num-messages", "3")])
        self.assertEqual(self.channel.control("count-msgs/queue/none"), [("num-messages", "0")])

    def test_count_subscribers_queue(self) -> None:
        """C{count-subscribers/queue/NAME}: the queue's consumers."""
        self.channel.subscribe(self.consumer(), "/queue/q")
        self.channel.subscribe(self.consumer(), "/queue/q")
        self.assertEqual(
            self.channel.control("count-subscribers/queue/q"), [("num-subscribers", "2")]
        )
        self.assertEqual(
            self.channel.control("count-subscribers/queue/none"), [("num-subscribers", "0")]
        )

    def test_count_subscribers_topic(self) -> None:
        """C{count-subscribers/topic/KEY}: a live consumer counts one, a
        queue bound to the topic counts its consumers."""
        self.assertEqual(
            self.channel.control("count-subscribers/topic/k"), [("num-subscribers", "0")]
        )
        self.channel.subscribe(self.consumer(ack_required=False), "/topic/k")
        self.assertEqual(
            self.channel.control("count-subscribers/topic/k"), [("num-subscribers", "1")]
        )
        self.channel.subscribe(self.consumer(), "/topic/k", label="acking")
        self.channel.subscribe(self.consumer(ack_required=False), "/topic/other")
        self.assertEqual(
            self.channel.control("count-subscribers/topic/k"), [("num-subscribers", "2")]
        )

    def test_memory(self) -> None:
        """C{memory}: off without an alarm, else the alarm's state."""
        self.broker.memory_alarm = None
        self.assertEqual(self.channel.control("memory"), [("memory-alarm", "off")])
        self.broker.memory_alarm = FakeAlarm(True, 123, 456)
        self.assertEqual(
            self.channel.control("memory"),
            [("memory-alarm", "on"), ("memory-rss", "123"), ("memory-high-watermark", "456")],
        )
        self.broker.memory_alarm = FakeAlarm(False, 1, 2)
        self.assertEqual(self.channel.control("memory")[0], ("memory-alarm", "off"))

    def test_unknown(self) -> None:
        """Anything else is a DestinationError."""
        for path in ("", "nope", "count-msgs/topic/k", "memory/x"):
            with self.assertRaises(DestinationError, msg=path):
                self.channel.control(path)


class _Buffered(Recorder):
    """A consumer with a buffer that records why it was cut off, and whose
    frontend detaches it at once (as the STOMP session closes its channel)."""

    def __init__(self, channel: Channel, messages: int = 0, size: int = 0, **kwargs: Any) -> None:
        super().__init__(channel, **kwargs)
        self.buffer = SubscriberBuffer(messages, size)
        self.reasons: list[str] = []

    def overrun(self, reason: str) -> None:
        self.reasons.append(reason)
        self.channel.unsubscribe(self)


class SubscriberBufferTests(ChannelTestCase):
    def test_live_cut_once_others_served(self) -> None:
        """A paused live consumer past its buffer is cut off once; the same
        publish still reaches the consumer bound after it."""
        slow = _Buffered(self.channel, messages=2, ack_required=False)
        self.channel.subscribe(slow, "/topic/t")
        other = self.open("bob")
        fast = self.consumer(other, ack_required=False)
        other.subscribe(fast, "/topic/t")
        slow.paused = True
        for i in range(5):
            self.send("/topic/t", b"%d" % i)
        self.assertEqual(len(slow.reasons), 1)
        self.assertIn("buffer-messages 2", slow.reasons[0])
        self.assertEqual(fast.bodies(), [b"%d" % i for i in range(5)])
        self.assertTrue(slow.buffer.cut)
        self.assertIsNone(slow.backlog)
        slow.resume()
        self.assertTrue(slow.paused, "a cut consumer stays paused")
        self.assertEqual(slow.got, [])

    def test_budget_cuts_buffered(self) -> None:
        """The channel's shared budget cuts a buffered consumer off (an
        unbuffered one drops instead), and the budget is given back."""
        channel = Channel(self.broker, self.vhost, "carol", backlog_budget=3)
        self.addCleanup(channel.close)
        plain = self.consumer(channel, ack_required=False)
        buffered = _Buffered(channel, size=10**6, ack_required=False)
        channel.subscribe(plain, "/topic/a")
        channel.subscribe(buffered, "/topic/b")
        channel.pause()
        for i in range(3):
            self.send("/topic/a", b"%d" % i)
        self.send("/topic/b", b"x")
        self.assertEqual(len(buffered.reasons), 1)
        self.assertIn("its connection holds 3", buffered.reasons[0])
        self.assertEqual(channel.backlog_budget.used, 3)

    def test_private_queue_policy(self) -> None:
        """A buffered consumer that acks gets a private queue bounded by the
        smaller of its buffer and its backlog limit, overflow cut-consumers."""
        c = _Buffered(self.channel, messages=50, size=1000, backlog_limit=20)
        self.channel.subscribe(c, "/topic/t", label="s")
        policy = c.queue.policy
        self.assertEqual(
            (policy.max_length, policy.max_bytes, policy.overflow), (20, 1000, CUT_CONSUMERS)
        )
        c.paused = True
        for _ in range(20):
            self.send("/topic/t", b"y")
        queue = c.queue
        self.send("/topic/t", b"over")
        self.assertEqual(len(c.reasons), 1)
        self.assertIn("at most 20", c.reasons[0])
        self.assertTrue(queue.deleted)

    def test_refused_on_queues(self) -> None:
        for text, durable in (("/queue/q", None), ("/temp-queue/r", None), ("/topic/t", "d")):
            with self.assertRaises(PreconditionFailed) as e:
                self.channel.subscribe(_Buffered(self.channel, messages=1), text, durable)
            self.assertEqual(e.exception.short, "buffer not allowed here")
        self.assertEqual(set(self.vhost.queues), set())
