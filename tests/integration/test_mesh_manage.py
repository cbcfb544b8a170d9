"""The management API for the whole mesh between hosts' nodes (the same
code as between workers, L{qmq.cluster.manage}): two C{twistd -n qmq}
processes linked over mutual TLS (L{tests.integration.test_mesh}).

  - node a lists b's queue once, with its home and b's counts, and no
    node missing; a purge through a empties it on b;
  - an exchange declared through a's HTTP API exists on b;
  - definitions imported on a: a queue homed on b, bound to amq.headers
    (x-match all), declared and bound on b; what is published on a with
    matching headers reaches it, what does not match does not; a and b
    export the same document.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tests.integration.test_mesh import MeshTestCase, Node, settled
from tests.integration.test_mesh_queues import homed, send_receipted


def call(node: Node, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{node.http_port}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=15) as r:
        return json.load(r)


class MeshManagementTests(MeshTestCase):
    def test_whole_mesh(self) -> None:
        nodes = self.nodes("a", "b")
        a, b = nodes["a"], nodes["b"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b"], "mm")
        send_receipted(a.client(), f"/queue/{q}", [b"1", b"2", b"3"])
        doc = call(a, "GET", "/api/v1/vhosts/%2F/queues")
        self.assertEqual(doc["missing"], {})
        self.assertEqual([(v["home"], v["messages"]) for v in doc["queues"] if v["name"] == q], [("b", 3)])
        self.assertEqual(call(a, "DELETE", f"/api/v1/vhosts/%2F/queues/{q}/messages"), {"purged": 3})
        self.assertEqual(call(b, "GET", f"/api/v1/vhosts/%2F/queues/{q}")["messages"], 0)
        call(a, "PUT", "/api/v1/vhosts/%2F/exchanges/shared", {"type": "fanout"})
        self.wait_for("the exchange on b", lambda: call(b, "GET", "/api/v1/vhosts/%2F/exchanges")["exchanges"]
                      and any(x["name"] == "shared" for x in call(b, "GET", "/api/v1/vhosts/%2F/exchanges")["exchanges"]))

    def test_definitions_and_headers(self) -> None:
        nodes = self.nodes("a", "b")
        a, b = nodes["a"], nodes["b"]
        self.wait_for("the mesh settled", lambda: settled(nodes))
        q = homed("b", ["a", "b"], "hd")
        doc = {"queues": [{"vhost": "/", "name": q}],
               "bindings": [{"vhost": "/", "source": "amq.headers", "destination": q,
                             "arguments": {"x-match": "all", "kind": "order", "region": "eu"}}]}
        result = call(a, "POST", "/api/v1/definitions", doc)
        self.assertEqual((result["created"]["queues"], result["created"]["bindings"]), (1, 1))
        self.assertEqual(call(b, "GET", f"/api/v1/vhosts/%2F/queues/{q}")["home"], "b")
        publisher = a.client()
        before = a.links()["b"]["messages_out"]

        def send(headers: dict[str, str], body: bytes) -> None:
            publisher.request("SEND", {"destination": "/exchange/amq.headers/x", **headers}, body)

        # b's interest in amq.headers (every message of it) reaches a a
        # round trip after the binding.
        self.wait_for("b's interest on a", lambda: "//amq.headers/" in a.links()["b"]["peer_interest"])
        send({"kind": "order", "region": "us"}, b"no")
        send({"kind": "order"}, b"no")
        send({"kind": "order", "region": "eu", "extra": "1"}, b"yes")
        send({"kind": "order", "region": "eu"}, b"yes")
        # Every one of them crosses (in order) and b's binding chooses: when
        # the last has come, the others have.
        self.wait_for("two messages on b", lambda: call(b, "GET", f"/api/v1/vhosts/%2F/queues/{q}")["messages"] >= 2)
        self.assertEqual(call(b, "GET", f"/api/v1/vhosts/%2F/queues/{q}")["messages"], 2)
        self.assertEqual(a.links()["b"]["messages_out"] - before, 4)
        exported = {n.name: call(n, "GET", "/api/v1/definitions") for n in (a, b)}
        self.assertEqual(exported["a"]["missing"], {})
        self.assertEqual(exported["a"], exported["b"])
        self.assertIn(q, [x["name"] for x in exported["a"]["queues"]])
