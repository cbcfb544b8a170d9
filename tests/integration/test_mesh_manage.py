"""The management API for the whole mesh between hosts' nodes (the same
code as between workers, L{qmq.cluster.manage}): two C{twistd -n qmq}
processes linked over mutual TLS (L{tests.integration.test_mesh}).

  - node a lists b's queue once, with its home and b's counts, and no
    node missing; a purge through a empties it on b;
  - an exchange declared through a's HTTP API exists on b.
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
