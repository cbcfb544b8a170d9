"""The API's codecs: JSON parsing rules, and Avro interoperability between
the two Python libraries (each decodes what the other wrote, with the
schemas served at /api/v1/schemas)."""

from __future__ import annotations

import io
import json

import avro.datafile
import avro.io
import avro.schema
import fastavro
from twisted.trial import unittest

from qmq.core.message import Message
from qmq.core.options import MAX_SPAN_MS
from qmq.web.api import codec
from qmq.web.api.problem import Problem

RECORD = {
    "body": bytes(range(256)),
    "headers": {"a": "1", "ü": "ö"},
    "destination": "/queue/x",
    "routing_key": None,
    "priority": 7,
    "ttl": 60000,
    "delay": None,
    "persistent": True,
    "properties": {"content_type": "application/octet-stream"},
    "expires": None,
    "deliver_at": None,
    "ack_timeout": None,
}


def avro_schema(name: str):
    return avro.schema.parse(codec.schema_text(name))


class AvroInteropTests(unittest.SynchronousTestCase):
    def test_avro_writes_qmq_reads_datum(self) -> None:
        out = io.BytesIO()
        avro.io.DatumWriter(avro_schema("PublishMessage")).write(RECORD, avro.io.BinaryEncoder(out))
        [m], batch = codec.parse_avro(out.getvalue(), 10)
        self.assertFalse(batch)
        self.assertEqual((m.body, m.headers, m.destination, m.priority, m.ttl, m.persistent),
                         (RECORD["body"], RECORD["headers"], "/queue/x", 7, 60000, True))

    def test_avro_writes_qmq_reads_container(self) -> None:
        out = io.BytesIO()
        writer = avro.datafile.DataFileWriter(out, avro.io.DatumWriter(), avro_schema("PublishMessage"))
        for i in range(5):
            writer.append({**RECORD, "body": b"%d" % i})
        writer.flush()
        messages, batch = codec.parse_avro(out.getvalue(), 10)
        self.assertTrue(batch)
        self.assertEqual([codec.outgoing(m).body for m in messages], [b"0", b"1", b"2", b"3", b"4"])

    def test_qmq_writes_avro_reads(self) -> None:
        m = Message(42, "amq.topic", "a.b", {"h": "v"}, b"\x00\xff", 1700000000.25, True, 3, 1700000060.0)
        m.delivery_count = 2
        data = codec.avro_container([codec.avro_delivery(m, "tok.7", None, "node-1")])
        reader = avro.datafile.DataFileReader(io.BytesIO(data), avro.io.DatumReader())
        [rec] = list(reader)
        self.assertEqual(rec["handle"], "tok.7")
        self.assertEqual((rec["id"], rec["number"], rec["body"], rec["destination"], rec["headers"]),
                         ("node-1.42", 42, b"\x00\xff", "/topic/a.b", {"h": "v"}))
        self.assertEqual((rec["redelivered"], rec["delivery_count"], rec["priority"]), (True, 2, 3))
        # timestamp-millis: avro gives datetimes; fastavro reads the same file alike.
        self.assertEqual(int(rec["timestamp"].timestamp() * 1000), 1700000000250)
        [again] = list(fastavro.reader(io.BytesIO(data)))
        self.assertEqual(again["body"], b"\x00\xff")

    def test_fastavro_datum_avro_reads(self) -> None:
        data = codec.avro_datum("PublishMessage", RECORD)
        rec = avro.io.DatumReader(avro_schema("PublishMessage")).read(avro.io.BinaryDecoder(io.BytesIO(data)))
        self.assertEqual(rec, RECORD)

    def test_schemas_are_valid_for_both(self) -> None:
        for name in codec.SCHEMA_NAMES:
            avro_schema(name)
            fastavro.parse_schema(json.loads(codec.schema_text(name)))


class JsonTests(unittest.SynchronousTestCase):
    def test_single_and_batch(self) -> None:
        [m], batch = codec.parse_json(b'{"body": "x", "headers": {"k": "v"}, "ttl": 5}', 10)
        self.assertEqual((m.body, m.headers, m.ttl, batch), (b"x", {"k": "v"}, 5, False))
        ms, batch = codec.parse_json(b'{"messages": [{"body": "a"}, {"body": "Yg==", "encoding": "base64"}]}', 10)
        self.assertEqual(([codec.outgoing(m).body for m in ms], batch), ([b"a", b"b"], True))

    def test_body_only(self) -> None:
        """A message that is only a text body is its bytes, alone as in a
        batch (no object on the publish path); C{outgoing} makes it whole."""
        self.assertEqual(codec.parse_json(b'{"body": "x"}', 10), ([b"x"], False))
        self.assertEqual(codec.parse_json(b'{"messages": [{"body": "x"}]}', 10), ([b"x"], True))
        m = codec.outgoing(b"x")
        self.assertEqual((m.body, m.headers, m.destination, m.priority, m.persistent), (b"x", None, None, 0, False))
        for doc in (b'{"body": 5}', b'{"body": "\\ud800"}', b'{"bodies": "x"}', b'["x"]'):
            self.assertEqual(self.assertRaises(Problem, codec.parse_json, doc, 10).status, 400, doc)
        # A batch of body-only messages is one comprehension; any other
        # message in it sends the batch through the loop, message by message.
        self.assertEqual(codec.parse_json(b'{"messages": [{"body": "a"}, {"body": "b"}]}', 10), ([b"a", b"b"], True))
        ms, _ = codec.parse_json(b'{"messages": [{"body": "a"}, {"body": "b", "ttl": 5}]}', 10)
        self.assertEqual((ms[0], codec.outgoing(ms[1]).ttl), (b"a", 5))
        for item in (b'"x"', b"[1]", b"5", b"null", b"{}", b'{"ttl": 5}', b'{"body": 5}', b'{"body": ["a"]}',
                     b'{"body": {"encode": 1}}', b'{"body": "x", "bogus": 1}'):
            doc = b'{"messages": [{"body": "a"}, ' + item + b"]}"
            e = self.assertRaises(Problem, codec.parse_json, doc, 10)
            self.assertEqual(e.status, 400, item)
            self.assertIn("message 1", e.detail, item)

    def test_published_json(self) -> None:
        """The answer to a publish is what orjson writes of it, the names
        those of message_name, whatever the node id holds."""
        import orjson  # noqa: PLC0415

        from qmq.core.ids import message_name  # noqa: PLC0415

        for node in ("qmq-33361e6e", 'a"b\\c', "ü\u2028", ""):
            for ids, stored in (([], 0), ([7], 1), ([3677701320861697, 3677701320861698, 9], 2)):
                doc = {"published": len(ids), "ids": [message_name(node, i) for i in ids], "stored": stored}
                self.assertEqual(codec.published_json(node, ids, stored), orjson.dumps(doc))

    def test_delivery_times(self) -> None:
        """expires and deliver_at are seconds, as deliveries write times;
        ack_timeout seconds; the core's parser checks them."""
        [m], _ = codec.parse_json(b'{"body": "x", "expires": 1700000000.5, "deliver_at": 1600000000, '
                                  b'"ack_timeout": 2.5}', 10)
        self.assertEqual(m.timing, (1_700_000_000_500, 1_600_000_000_000, 2.5))
        for field, value in (("expires", -1), ("expires", True), ("deliver_at", "5"), ("ack_timeout", 0),
                             ("ack_timeout", 1e20), ("expires", 1e300)):
            e = self.assertRaises(Problem, codec.parse_json, json.dumps({"body": "x", field: value}).encode(), 10)
            self.assertIn(f"'{field}' must be", e.detail)

    def test_errors_name_the_message(self) -> None:
        e = self.assertRaises(Problem, codec.parse_json, b'{"messages": [{"body": "a"}, {"body": 2}]}', 10)
        self.assertIn("message 1", e.detail)
        e = self.assertRaises(Problem, codec.parse_json, b'{"body": "x", "delay": 1099511627777}', 10)
        self.assertIn("'delay' must be a whole number from 0 to 1099511627776", e.detail)
        for field, value in (("priority", 10), ("priority", True), ("ttl", -1), ("ttl", 1.5), ("delay", "5")):
            doc = json.dumps({"messages": [{"body": "a"}, {"body": "b", field: value}]}).encode()
            e = self.assertRaises(Problem, codec.parse_json, doc, 10)
            self.assertIn(f"message 1: '{field}' must be", e.detail)
        e = self.assertRaises(Problem, codec.parse_json, b'{"body": "\\ud800"}', 10)
        self.assertEqual(e.status, 400)
        e = self.assertRaises(Problem, codec.parse_json, b'{"messages": [{"body": "a"}, {"body": "b"}]}', 1)
        self.assertEqual((e.status, e.code), (413, "batch-too-large"))

    def test_accept(self) -> None:
        self.assertTrue(codec.wants_avro("avro/binary"))
        self.assertTrue(codec.wants_avro(b"application/json;q=0.5, avro/binary"))
        self.assertFalse(codec.wants_avro("*/*"))
        self.assertFalse(codec.wants_avro("avro/binary;q=0.1, application/json"))
        self.assertFalse(codec.wants_avro(None))


class AvroResolutionTests(unittest.SynchronousTestCase):
    def test_other_writer_schema_resolved(self) -> None:
        """A container written with another compatible schema (fewer
        fields, another order) is resolved against QMQ's; our own schema is
        read without resolution (the fast path), with the same result."""
        doc = json.loads(codec.schema_text("PublishMessage"))
        doc["fields"] = [f for f in doc["fields"] if f["name"] in ("headers", "body", "priority")]
        out = io.BytesIO()
        fastavro.writer(out, fastavro.parse_schema(doc), [{"headers": {"h": "1"}, "body": b"b", "priority": 2}])
        [m], _ = codec.parse_avro(out.getvalue(), 10)
        self.assertEqual((m.body, m.headers, m.priority, m.ttl, m.persistent), (b"b", {"h": "1"}, 2, None, False))
        out = io.BytesIO()
        fastavro.writer(out, codec.schema("PublishMessage"), [RECORD])
        [m], _ = codec.parse_avro(out.getvalue(), 10)
        self.assertEqual((m.body, m.priority, m.ttl), (RECORD["body"], 7, 60000))


class FastContainerTests(unittest.SynchronousTestCase):
    """QMQ's own reader of containers written with its schema agrees with
    fastavro's record by record, and turns any damage into a 400."""

    RECORDS = [
        {**RECORD, "body": b"plain", "headers": {}, "destination": None, "routing_key": None, "priority": 0,
         "ttl": None, "delay": None, "persistent": False, "properties": {}},
        {**RECORD, "body": b"kept", "headers": {}, "destination": None, "routing_key": None, "priority": 0,
         "ttl": None, "delay": None, "persistent": True, "properties": {}},
        {**RECORD, "body": b"\x00" * 300, "delay": 5},
        RECORD,
        {**RECORD, "body": b"", "headers": {"h\u00e9": "v" * 200}, "routing_key": "rk", "ttl": -1 + 2 ** 40},
        # Typed headers: every branch of the union.
        {**RECORD, "body": b"t", "headers": {"n": None, "t": True, "f": False, "i": -(2**62), "d": 1.5,
                                             "s": "\u00fc", "b": b"\x00\xff"}, "properties": {}},
        {**RECORD, "body": b"p", "headers": {}, "properties": {"type": "order", "reply_to": "/queue/r"}},
        {**RECORD, "body": b"o", "headers": {}, "properties": {}, "expires": 1_700_000_000_000,
         "deliver_at": 1_600_000_000_000, "ack_timeout": 2.5},
    ]

    def container(self, codec_name: str = "null", sync_interval: int = 16000) -> bytes:
        out = io.BytesIO()
        fastavro.writer(out, codec.schema("PublishMessage"), self.RECORDS * 3, codec=codec_name,
                        sync_interval=sync_interval)
        return out.getvalue()

    def slow(self, data: bytes) -> list:
        return [codec._avro_message(r, i) for i, r in enumerate(fastavro.reader(io.BytesIO(data)))]

    def test_agrees_with_fastavro(self) -> None:
        for codec_name in ("null", "deflate"):
            for interval in (16000, 50):  # one block, many blocks
                data = self.container(codec_name, interval)
                fast = codec._read_container(data, 1000)
                self.assertIsNotNone(fast)
                self.assertEqual([codec.outgoing(m) for m in fast], self.slow(data), (codec_name, interval))
        messages, batch = codec.parse_avro(self.container(), 1000)
        self.assertEqual((len(messages), batch), (3 * len(self.RECORDS), True))
        self.assertIs(messages[0].__class__, bytes)  # a body-only message costs no object

    def test_limits_checked(self) -> None:
        e = self.assertRaises(Problem, codec.parse_avro, self.container(), 3 * len(self.RECORDS) - 1)
        self.assertEqual((e.status, e.code), (413, "batch-too-large"))
        # The delivery options' bounds are the core's, for every frontend.
        out = io.BytesIO()
        bad = [*self.RECORDS[:2], {**RECORD, "delay": MAX_SPAN_MS + 1}]
        fastavro.writer(out, codec.schema("PublishMessage"), bad)
        e = self.assertRaises(Problem, codec.parse_avro, out.getvalue(), 1000)
        self.assertEqual(e.status, 400)
        self.assertIn(f"message 2: 'delay' must be a whole number from 0 to {MAX_SPAN_MS}", e.detail)

    def test_damage_is_a_400(self) -> None:
        import random  # noqa: PLC0415

        data = self.container(sync_interval=200)
        rng = random.Random(7)
        cases = [data[:n] for n in range(len(data))]
        for _ in range(400):
            damaged = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(4, len(damaged))] = rng.randrange(256)
            cases.append(bytes(damaged))
        for case in cases:
            try:
                codec.parse_avro(case, 1000)
            except Problem as e:
                self.assertIn(e.status, (400, 413), e.detail)

    def test_deflate_bomb_refused(self) -> None:
        self.patch(codec, "MAX_INFLATED", 1000)
        e = self.assertRaises(Problem, codec.parse_avro, self.container("deflate"), 1000)
        self.assertIn("inflates to more than 1000", e.detail)

    def test_uniform_blocks(self) -> None:
        """A block of body-only records of one length is cut without
        decoding; any record that differs (a flag, a length) sends the
        block through the record-by-record path, with the same result."""
        plain = {"body": b"0123456789" * 10, "headers": {}, "destination": None, "routing_key": None,
                 "priority": 0, "ttl": None, "delay": None, "persistent": False}
        for odd in (None, {"persistent": True}, {"body": b"short"}, {"priority": 1}, {"headers": {"a": "b"}}):
            records = [dict(plain, body=b"%099d" % i) for i in range(50)]
            if odd is not None:
                records[37].update(odd)
            out = io.BytesIO()
            fastavro.writer(out, codec.schema("PublishMessage"), records)
            data = out.getvalue()
            fast = codec._read_container(data, 1000)
            self.assertEqual([codec.outgoing(m) for m in fast], self.slow(data), odd)
            plain_count = 50 if odd is None or "body" in odd else 49
            self.assertEqual(sum(m.__class__ is bytes for m in fast), plain_count, odd)


class DeliveryTests(unittest.SynchronousTestCase):
    def test_batch_as_one_by_one(self) -> None:
        """json_deliveries gives what json_delivery gives, message by message."""
        messages = [
            Message(1, "", "q", None, b"text", 1700000000.5),
            Message(2, "amq.topic", "a.b", {"h": "v"}, b"\xff\xfe", 1700000001.0, True, 4, 1700000100.0),
            Message(3, "ex", "k", None, b"\xff", 1700000002.0),
            Message(4, "", "q", {"destination": "/queue/q"}, b"", 1700000003.0),
        ]
        messages[2].delivery_count = 3
        got = list(enumerate(messages, 10))
        for force in (False, True):
            batch = codec.json_deliveries(got, "tok", force, "n1")
            self.assertEqual(batch, [codec.json_delivery(m, f"tok.{t}", None, force, "n1") for t, m in got])
            self.assertEqual([(d["id"], d["number"]) for d in batch],
                             [("n1.1", 1), ("n1.2", 2), ("n1.3", 3), ("n1.4", 4)])

    def test_avro_deliveries_as_fastavro_writes_them(self) -> None:
        """QMQ's own Delivery writer: the same records as fastavro's writer
        of avro_delivery dicts (read back by fastavro and by avro)."""
        messages = [
            Message(1, "", "q", None, b"text", 1700000000.5),
            Message(2, "amq.topic", "a.b", {"h": "v", "\u00e9": "\u00fc"}, b"\xff\xfe", 1700000001.25, True, 4,
                    1700000100.0),
            Message(2**40, "ex", "k", {"x": "y", "i": 7, "d": -0.25, "t": True, "n": None, "b": b"\x00"},
                    b"x" * 300, 1700000002.0),
            Message(4, "", "q", None, b"", 1700000003.0),
            Message(5, "", "q", None, b"p", 1700000004.0),
        ]
        messages[2].delivery_count = 70
        messages[2].properties = {"content_type": "a/b"}
        messages[4].properties = {"correlation_id": "c", "type": "t"}
        entries = [(messages[0], "tok.1", None), (messages[1], None, 9), (messages[2], "tok.3", 2**33),
                   (messages[3], None, None), (messages[4], None, None)]
        ours = codec.avro_deliveries(entries, "n")
        theirs = codec.avro_container([codec.avro_delivery(m, h, s, "n") for m, h, s in entries])
        self.assertEqual(list(fastavro.reader(io.BytesIO(ours))), list(fastavro.reader(io.BytesIO(theirs))))
        reader = avro.datafile.DataFileReader(io.BytesIO(ours), avro.io.DatumReader())
        self.assertEqual([(r["id"], r["number"]) for r in reader],
                         [("n.1", 1), ("n.2", 2), (f"n.{2**40}", 2**40), ("n.4", 4), ("n.5", 5)])
        got = list(fastavro.reader(io.BytesIO(ours)))
        self.assertEqual([(r["headers"], r["properties"]) for r in got],
                         [(m.headers or {}, m.properties or {}) for m in messages])
        self.assertEqual(list(fastavro.reader(io.BytesIO(codec.avro_deliveries([], "n")))), [])
