"""The management API for the whole broker, for real: C{twistd -n qmq
--workers 2} on 127.0.0.1 (L{tests.integration.test_workers.WorkersCase}).

  - the HTTP API queried on each worker (one kept-alive connection stays
    on one worker; C{/api/v1/links} names it) gives the same merged list of
    queues, each once with its C{home}, and every worker's connections;
    C{qmq-ctl list queues} shows the C{home} column;
  - a purge through w0 of a queue homed on w1;
  - an exchange declared over AMQP (pika) on one worker, a queue bound to
    it: publishes made on both workers (STOMP clients chosen per worker)
    reach the queue; after w1 is killed and restarted, again;
  - a worker stopped (SIGSTOP) is named C{missing} in the listing of the
    other, within the deadline;
  - basic.get (pika) on w0 of a 5 MiB message in a queue homed on w1:
    the message whole, acked there;
  - definitions: exported from w0 and from w1, the same document, with
    the queues homed on each; imported on w0, a queue homed on w1 is
    declared and bound there (a publish on either worker reaches it).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import time
from typing import Any
from urllib.parse import quote

from twisted.python import log

from qmq import ctl
from qmq.cluster.placement import rendezvous
from tests.integration.test_mesh import FLOW_TIMEOUT
from tests.integration.test_workers import START_TIMEOUT, WorkersCase


def homed(worker: str, prefix: str) -> str:
    """A queue name whose home is C{worker} among w0 and w1."""
    return next(f"{prefix}{i}" for i in range(1000) if rendezvous("/", f"{prefix}{i}", ["w0", "w1"]) == worker)


class ManagementTests(WorkersCase):
    def api_on(self, worker: str) -> http.client.HTTPConnection:
        """A kept-alive HTTP connection that landed on C{worker}."""
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=15)
            if self.call(conn, "GET", "/api/v1/links")[1]["node"] == worker:
                self.addCleanup(conn.close)
                return conn
            conn.close()
        raise AssertionError(f"no HTTP connection landed on {worker} in 200")

    @staticmethod
    def call(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if body is None:
            conn.request(method, path)
        else:
            conn.request(method, path, json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")

    def fill(self) -> dict[str, str]:
        """A queue homed on each worker, with 3, 5 messages."""
        queues = {"w0": homed("w0", "m"), "w1": homed("w1", "m")}
        producer = self.client()
        for count, queue in zip((3, 5), queues.values(), strict=True):
            for i in range(count):
                producer.request("SEND", {"destination": f"/queue/{queue}", "persistent": "true"}, b"%d" % i)
        return queues

    def test_sameListOnEachWorker(self) -> None:
        """Each worker answers the whole broker's queues (each once, from
        its home, with the home's counts) and connections (both workers');
        qmq-ctl shows the home."""
        queues = self.fill()
        stomp = {w: self.client_on(w) for w in ("w0", "w1")}
        listings = {}
        for worker in ("w0", "w1"):
            conn = self.api_on(worker)
            status, doc = self.call(conn, "GET", "/api/v1/vhosts/%2F/queues")
            self.assertEqual((status, doc["missing"]), (200, {}), doc)
            listings[worker] = [(q["name"], q["home"], q["messages"]) for q in doc["queues"]]
            status, doc = self.call(conn, "GET", "/api/v1/connections")
            self.assertEqual(doc["missing"], {})
            nodes = {c["node"] for c in doc["connections"]}
            self.assertEqual(nodes, {"w0", "w1"})
            self.assertTrue(all(c["id"].endswith("@" + c["node"]) for c in doc["connections"]))
        self.assertEqual(listings["w0"], listings["w1"])
        conn = self.api_on("w0")
        started = time.monotonic()
        for _ in range(50):
            self.call(conn, "GET", "/api/v1/vhosts/%2F/queues")
        log.msg(f"workers management: a whole-broker queue listing (2 workers, {len(listings['w0'])} queues) "
                f"took {(time.monotonic() - started) / 50 * 1000:.2f} ms on average over 50")
        mine = [row for row in listings["w0"] if row[0] in queues.values()]
        self.assertEqual(mine, [(queues["w0"], "w0", 3), (queues["w1"], "w1", 5)])
        self.assertIn(("bound", "w1", 0), listings["w0"])  # configured, homed on w1 only
        out, err = io.StringIO(), io.StringIO()
        status = ctl.main(["--url", f"http://127.0.0.1:{self.http_port}", "list", "queues"], out, err)
        self.assertEqual((status, err.getvalue()), (0, ""))
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0].split()[-1], "home")
        self.assertIn([queues["w1"], "5", "0", "0", "yes", "no", "w1"], [line.split() for line in lines])
        self.assertTrue(stomp)

    def test_purgeThroughTheOtherWorker(self) -> None:
        queues = self.fill()
        conn = self.api_on("w0")
        name = quote(queues["w1"], safe="")
        status, doc = self.call(conn, "DELETE", f"/api/v1/vhosts/%2F/queues/{name}/messages")
        self.assertEqual((status, doc), (200, {"purged": 5}))
        status, doc = self.call(conn, "GET", f"/api/v1/vhosts/%2F/queues/{name}")
        self.assertEqual((status, doc["home"], doc["messages"]), (200, "w1", 0))
        status, doc = self.call(self.api_on("w1"), "DELETE", f"/api/v1/vhosts/%2F/queues/{quote(queues['w0'])}")
        self.assertEqual((status, doc), (200, {"deleted": queues["w0"], "messages": 3}))

    def test_scanThroughEitherWorker(self) -> None:
        """A range scan of a durable queue homed on w1 pages the same
        messages, with the same names (w1's ids), from either worker: w1's
        log is read on w1, its pages carried to w0."""
        queues = self.fill()
        name = quote(queues["w1"], safe="")
        scanned = {}
        for worker in ("w0", "w1"):
            conn = self.api_on(worker)
            got, cursor = [], None
            for _ in range(10):
                query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
                status, page = self.call(conn, "GET", f"/api/v1/vhosts/%2F/queues/{name}/scan{query}")
                self.assertEqual(status, 200, page)
                got += [(m["id"], m["body"]) for m in page["messages"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            scanned[worker] = got
        self.assertEqual([body for _, body in scanned["w1"]], ["0", "1", "2", "3", "4"])
        self.assertTrue(all(mid.startswith("w1.") for mid, _ in scanned["w1"]), scanned["w1"])
        self.assertEqual(scanned["w0"], scanned["w1"])
        status, doc = self.call(self.api_on("w0"), "GET", f"/api/v1/vhosts/%2F/queues/{name}")
        self.assertEqual(doc["messages"], 5)  # a scan consumes nothing

    def test_controlCountsFromEitherWorker(self) -> None:
        """STOMP's /control/ counts of a queue homed on the other worker are
        its home's, and their RECEIPT keeps its place among the replies."""
        from tests.integration.test_twistd import frame  # noqa: PLC0415

        queues = self.fill()
        for worker, (home, count) in (("w0", ("w1", 5)), ("w1", ("w0", 3))):
            client = self.client_on(worker)
            client.sock.sendall(
                frame("SEND", {"destination": f"/control/count-msgs/queue/{queues[home]}", "receipt": "count"})
                + frame("SEND", {"destination": "/queue/after", "receipt": "after"}, b"x"))
            replies = [client.read(10.0) for _ in range(2)]
            self.assertEqual([(c, h.get("receipt-id"), h.get("num-messages")) for c, h, _ in replies],
                             [("RECEIPT", "count", str(count)), ("RECEIPT", "after", None)], worker)

    def test_handlesSettledOnEitherWorker(self) -> None:
        """An HTTP client whose connections land on either worker: what it
        receives through one it acks, extends or nacks through the other,
        for queues homed on each; nothing is redelivered after an ack."""
        queues = self.fill()
        conns = {w: self.api_on(w) for w in ("w0", "w1")}
        for home, queue in queues.items():
            name = quote(queue, safe="")
            base = f"/api/v1/vhosts/%2F/queues/{name}"
            for receiver, settler in (("w0", "w1"), ("w1", "w0")):
                status, doc = self.call(conns[receiver], "POST", f"{base}/receive?max=1&wait=5&visibility=30")
                self.assertEqual((status, len(doc["messages"])), (200, 1), doc)
                handle = doc["messages"][0]["handle"]
                self.assertTrue(handle.startswith(receiver + "."), handle)
                body = {"handles": [handle]}
                status, doc = self.call(conns[settler], "POST", f"{base}/extend", {**body, "visibility": 60})
                self.assertEqual((status, doc), (200, {"settled": 1, "unknown": []}), (home, receiver))
                status, doc = self.call(conns[settler], "POST", f"{base}/ack", body)
                self.assertEqual((status, doc), (200, {"settled": 1, "unknown": []}), (home, receiver))
                status, doc = self.call(conns[settler], "POST", f"{base}/ack", body)
                self.assertEqual(doc, {"settled": 0, "unknown": [handle]})
            status, doc = self.call(conns["w0"], "GET", base)
            self.assertEqual((doc["messages"], doc["messages_unacknowledged"]),
                             ({"w0": 1, "w1": 3}[home], 0), doc)

    def test_exchangeDeclaredOnOneWorker(self) -> None:
        """An exchange and a binding made over AMQP on whichever worker the
        connection landed on: publishes on both workers route to the queue;
        after w1's SIGKILL and restart, still."""
        import pika  # noqa: PLC0415

        params = pika.ConnectionParameters("127.0.0.1", self.amqp_port, connection_attempts=3)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.exchange_declare("runtime", "topic", durable=True)
        queue = homed("w1", "rt")
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "runtime", "k.#")
        conn.close()
        publishers = {w: self.client_on(w) for w in ("w0", "w1")}

        def publish_and_count(tag: str) -> None:
            for worker, publisher in publishers.items():
                for i in range(10):
                    publisher.request("SEND", {"destination": "/exchange/runtime/k.x", "persistent": "true"},
                                      f"{tag}-{worker}-{i}".encode())
            consumer = self.client()
            consumer.request("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "auto"})
            got: list[bytes] = []
            deadline = time.monotonic() + FLOW_TIMEOUT
            while len(got) < 20 and time.monotonic() < deadline:
                got += consumer.messages(1.0)
            consumer.close()
            self.assertEqual(sorted(got), sorted(f"{tag}-{w}-{i}".encode() for w in publishers for i in range(10)))

        publish_and_count("first")
        for publisher in publishers.values():
            publisher.close()
        before = self.worker_pids()["w1"]
        os.kill(before, signal.SIGKILL)
        self.wait_for("w1 started again", lambda: self.worker_pids()["w1"] != before)
        self.wait_for("w1 linked again", lambda: self.linked({"w0", "w1"}), START_TIMEOUT)
        publishers = {w: self.client_on(w) for w in ("w0", "w1")}
        publish_and_count("second")

    def test_stoppedWorkerNamedMissing(self) -> None:
        """A worker that does not answer (SIGSTOP) is named in the other's
        listing, within the deadline, with its queues left out."""
        queues = self.fill()
        conn = self.api_on("w0")
        pid = self.worker_pids()["w1"]
        os.kill(pid, signal.SIGSTOP)
        self.addCleanup(os.kill, pid, signal.SIGCONT)
        started = time.monotonic()
        status, doc = self.call(conn, "GET", "/api/v1/vhosts/%2F/queues")
        took = time.monotonic() - started
        log.msg(f"workers management: the listing with w1 stopped answered in {took:.2f} s")
        self.assertLess(took, 7.0)
        self.assertEqual(status, 200)
        self.assertEqual(list(doc["missing"]), ["w1"], doc["missing"])
        names = [q["name"] for q in doc["queues"]]
        self.assertIn(queues["w0"], names)
        self.assertNotIn(queues["w1"], names)

    def test_definitionsOfTheWholeBroker(self) -> None:
        """GET /api/v1/definitions on w0 and on w1: the same document, with
        the queues homed on each (and their bindings); POST on w0 of a
        queue homed on w1, bound: declared and bound on w1."""
        import pika  # noqa: PLC0415

        queues = self.fill()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp_port, connection_attempts=3))
        ch = conn.channel()
        for worker, queue in queues.items():
            ch.queue_bind(queue, "amq.topic", f"{worker}.k")
        conn.close()
        docs = {}
        for worker in ("w0", "w1"):
            status, doc = self.call(self.api_on(worker), "GET", "/api/v1/definitions")
            self.assertEqual((status, doc["missing"]), (200, {}), doc)
            docs[worker] = doc
        self.assertEqual(docs["w0"], docs["w1"])
        names = [q["name"] for q in docs["w0"]["queues"]]
        self.assertEqual(len(names), len(set(names)), names)
        for worker, queue in queues.items():
            self.assertIn(queue, names)
            self.assertIn((queue, f"{worker}.k"), [(b["destination"], b["routing_key"]) for b in docs["w0"]["bindings"]])
        self.assertIn("bound", names)  # configured, homed on w1 only

        imported = homed("w1", "imported")
        doc = {"queues": [{"vhost": "/", "name": imported}],
               "bindings": [{"vhost": "/", "source": "amq.topic", "destination": imported, "routing_key": "imp.#"}]}
        conn0 = self.api_on("w0")
        status, result = self.call(conn0, "POST", "/api/v1/definitions", doc)
        self.assertEqual((status, result["created"]["queues"], result["created"]["bindings"]), (200, 1, 1), result)
        status, result = self.call(conn0, "POST", "/api/v1/definitions", doc)
        self.assertEqual((status, result["unchanged"]["queues"], result["unchanged"]["bindings"]), (200, 1, 1), result)
        status, listing = self.call(self.api_on("w1"), "GET", "/api/v1/vhosts/%2F/bindings")
        self.assertIn((imported, "imp.#", "w1"),
                      [(b["queue"], b["routing_key"], b["home"]) for b in listing["bindings"]])
        # Published on w1 (its home), then on w0 until the binding's
        # interest reached w0 (a round trip after the bind).
        self.client_on("w1").request("SEND", {"destination": "/topic/imp.x"}, b"w1")
        on_w0, conn1 = self.client_on("w0"), self.api_on("w1")

        def arrived() -> bool:
            on_w0.request("SEND", {"destination": "/topic/imp.x"}, b"w0")
            return self.call(conn1, "GET", f"/api/v1/vhosts/%2F/queues/{imported}")[1]["messages"] >= 2

        self.wait_for("a publish on w0 in the imported queue", arrived)

    def test_largeGetFromTheOtherWorker(self) -> None:
        """basic.get on w0 of a 5 MiB message of a queue homed on w1 (past
        what a JSON answer between workers carries): whole, and acked on w1."""
        queue = homed("w1", "big")
        ch = self.amqp_on("w0").channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        big = os.urandom(5 * 1024 * 1024)
        ch.basic_publish("", queue, big)
        started = time.monotonic()
        method, _props, body = ch.basic_get(queue)
        log.msg(f"workers management: basic.get of a 5 MiB message homed on the other worker took "
                f"{(time.monotonic() - started) * 1000:.1f} ms")
        self.assertIsNotNone(method)
        self.assertEqual((len(body), body == big), (len(big), True))
        ch.basic_ack(method.delivery_tag)
        conn1 = self.api_on("w1")
        path = f"/api/v1/vhosts/%2F/queues/{queue}"
        self.wait_for("acked on w1", lambda: self.call(conn1, "GET", path)[1]["messages"] == 0)
        self.assertEqual(self.call(conn1, "GET", path)[1]["home"], "w1")
