# -*- test-case-name: tests.test_web_api -*-
"""The HTTP API's topology handlers: queues, exchanges and bindings.

L{TopologyMixin} is the part of L{qmq.web.api.resource.ApiResource} that
shows and changes a virtual host's shape, under C{/api/v1/vhosts/{vhost}}:
C{queues}, C{queues/{queue}} (GET, PUT, DELETE; DELETE of its
C{messages} purges), C{exchanges}, C{exchanges/{exchange}} and
C{bindings}. Every change goes through L{qmq.core.management.Management}
(C{ApiResource._management}: the core looks the names up, then checks the
caller's permissions, once for every frontend, so a missing queue or
exchange is a 404 C{unknown-queue} or C{unknown-exchange} before any 403);
a handler only reads its parameters and body and writes the documents. Lists
are paged by C{ApiResource._page}; a queue's document carries its
message counts and rates (L{TopologyMixin._message_stats}, sampled only
when asked for).

It is a mixin because the resource dispatches a route to its handler by
name (C{h_<route name>}, the table that the OpenAPI document is checked
against); the publish and receive handlers, the API's hot paths, stay in
L{qmq.web.api.resource}. The mixin's state (C{_rates}) is set in
C{ApiResource.__init__}.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from qmq.core.exchange import EXCHANGE_TYPES
from qmq.core.management import queue_facts
from qmq.core.queue import Queue
from qmq.core.remote import home_of
from qmq.web.api.params import (
    Response,
    _arg,
    _int_arg,
    _json_object_arg,
    _object_body,
    json_response,
)
from qmq.web.api.problem import bad_request

if TYPE_CHECKING:
    from twisted.web.server import Request

#: Seconds a queue's rates are averaged over at least (L{TopologyMixin._message_stats}).
RATE_INTERVAL = 1.0
_RATE_SAMPLES = 100_000


class TopologyMixin:
    """Queues, exchanges and bindings (see the module docstring)."""

    # Set by ApiResource; declared for type checkers.
    clock: Any
    settings: Any
    _rates: dict[tuple[str, str], tuple[float, int, int, float, float]]

    # -- queues --------------------------------------------------------------------

    def _queue_doc(self, fe_name: str, q: Queue) -> dict:
        return self._facts_doc(fe_name, queue_facts(q), home_of(q))

    def _facts_doc(self, fe_name: str, facts: dict, home: str | None) -> dict:
        """A queue's document from its facts (L{queue_facts}: this node's
        queue, or one another node listed), C{home} naming its node in a mesh."""
        ready, unacked = facts["messages_ready"], facts["messages_unacknowledged"]
        doc = {
            "name": facts["name"],
            "vhost": fe_name,
            "durable": facts["durable"],
            "auto_delete": facts["auto_delete"],
            "exclusive": facts["exclusive"],
            "arguments": facts["arguments"],
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
            "ready_bytes": facts["ready_bytes"],
            "consumers": facts["consumers"],
            "dropped": facts["dropped"],
            "message_stats": self._message_stats(fe_name, facts["name"], facts["published"], facts["delivered"]),
        }
        if home is not None:
            # In a mesh, the node it lives on (docs/cluster.rst).
            doc["home"] = home
        return doc

    def _message_stats(self, vhost: str, name: str, published: int, delivered: int) -> dict:
        """A queue's publish and deliver counts and rates. A rate is the
        change of its count per second since the previous reading at least
        L{RATE_INTERVAL} seconds before (0 at the first); nothing is
        sampled in between, so the queues nobody asks about cost nothing."""
        now = self.clock.seconds()
        key = (vhost, name)
        sample = self._rates.get(key)
        if sample is None or published < sample[1] or delivered < sample[2]:
            if len(self._rates) >= _RATE_SAMPLES:
                self._rates.clear()
            self._rates[key] = (now, published, delivered, 0.0, 0.0)
            publish_rate = deliver_rate = 0.0
        else:
            then, p, d, publish_rate, deliver_rate = sample
            elapsed = now - then
            if elapsed >= RATE_INTERVAL:
                publish_rate = round((published - p) / elapsed, 1)
                deliver_rate = round((delivered - d) / elapsed, 1)
                self._rates[key] = (now, published, delivered, publish_rate, deliver_rate)
        return {"publish": published, "deliver": delivered, "publish_rate": publish_rate,
                "deliver_rate": deliver_rate}

    def _manage(self) -> Any:
        """The mesh's management across nodes when there are other nodes
        to ask (L{qmq.cluster.manage}), else None: this node answers alone."""
        mesh = getattr(self.broker, "mesh", None)
        manage = getattr(mesh, "manage", None)
        return manage if manage is not None and manage.others() else None

    def h_list_queues(self, request: Request, vhost: str) -> Any:
        mgmt = self._management(request, vhost)
        v = mgmt.vhost
        prefix = _arg(request, "prefix")
        manage = self._manage()
        if manage is not None:
            # The whole broker: each queue from its home, in node order.
            def merged(result: tuple[dict, dict]) -> Response:
                answers, missing = result
                by_node = {manage.mesh.node: [queue_facts(q) for q in v.queues.values()
                                              if q.remote is None and q.name.startswith(prefix or "")]}
                truncated = []
                for node, answer in answers.items():
                    by_node[node] = answer.get("queues") or []
                    if answer.get("truncated"):
                        truncated.append(node)
                rows = [(node, f) for node in sorted(by_node) for f in by_node[node]
                        if self._listed(request, mgmt, f["name"])]
                page, meta = self._page(request, rows, len(rows))
                return json_response({"queues": [self._facts_doc(vhost, f, node) for node, f in page], **meta,
                                      **_gaps(missing, truncated)})

            return manage.ask_all("queues", {"vhost": v.name, "prefix": prefix or ""}).addCallback(merged)
        queues: Any = v.queues.values()
        total = len(v.queues)
        if prefix or request.qmq_user is not None:
            queues = [q for q in queues if (not prefix or q.name.startswith(prefix))
                      and self._listed(request, mgmt, q.name)]
            total = len(queues)
        page, meta = self._page(request, queues, total)
        return json_response({"queues": [self._queue_doc(vhost, q) for q in page], **meta})

    def h_get_queue(self, request: Request, vhost: str, queue: str) -> Any:
        q = self._management(request, vhost).queue(queue, see_all=self._is_admin(request))
        if q.remote is not None:
            # Its home's counts (a stand-in holds none).
            return q.vhost.home_facts(q).addCallback(lambda facts: json_response(self._facts_doc(vhost, facts, q.home)))
        return json_response(self._queue_doc(vhost, q))

    def h_put_queue(self, request: Request, vhost: str, queue: str) -> Any:
        mgmt = self._management(request, vhost)
        doc: dict = {}
        if request.content is not None and request.content.getvalue():
            doc = _object_body(request, {"durable": (bool,), "auto_delete": (bool,), "arguments": (dict,)}, ())
        waiting: list = []
        q, made = mgmt.declare_queue(
            queue,
            durable=doc.get("durable", True),
            auto_delete=doc.get("auto_delete", False),
            arguments=doc.get("arguments") or None,
            wait=waiting,
        )
        if waiting:
            # Its home is another node: its verdict, and its document.
            def answered(answer: Any) -> Response:
                if isinstance(answer, dict) and isinstance(answer.get("facts"), dict):
                    return json_response(self._facts_doc(vhost, answer["facts"], q.home),
                                         201 if answer.get("made") else 200)
                return json_response(self._queue_doc(vhost, q), 201 if made else 200)

            return waiting[0].addCallback(answered)
        return json_response(self._queue_doc(vhost, q), 201 if made else 200)

    def h_delete_queue(self, request: Request, vhost: str, queue: str) -> Any:
        # A queue homed on another node is deleted there (a Deferred).
        return _then(self._management(request, vhost).delete_queue(queue),
                     lambda dropped: json_response({"deleted": queue, "messages": dropped}))

    def h_purge_queue(self, request: Request, vhost: str, queue: str) -> Any:
        return _then(self._management(request, vhost).purge_queue(queue),
                     lambda purged: json_response({"purged": purged}))

    # -- exchanges and bindings -----------------------------------------------------------

    def _exchange_doc(self, vhost: str, ex: Any) -> dict:
        return {
            "name": ex.name,
            "vhost": vhost,
            "type": ex.type,
            "durable": ex.durable,
            "auto_delete": ex.auto_delete,
            "internal": ex.internal,
            "arguments": ex.arguments or {},
            "bindings": ex.binding_count,
        }

    def h_list_exchanges(self, request: Request, vhost: str) -> Response:
        mgmt = self._management(request, vhost)
        exchanges: Any = mgmt.vhost.exchanges.values()
        total = len(mgmt.vhost.exchanges)
        if request.qmq_user is not None:
            exchanges = [e for e in exchanges if mgmt.may_read_exchange(e.name)]
            total = len(exchanges)
        page, meta = self._page(request, exchanges, total)
        return json_response({"exchanges": [self._exchange_doc(vhost, e) for e in page], **meta})

    def h_get_exchange(self, request: Request, vhost: str, exchange: str) -> Response:
        ex = self._management(request, vhost).exchange(exchange)
        return json_response(self._exchange_doc(vhost, ex))

    def h_put_exchange(self, request: Request, vhost: str, exchange: str) -> Response:
        mgmt = self._management(request, vhost)
        doc = _object_body(
            request,
            {"type": (str,), "durable": (bool,), "auto_delete": (bool,), "internal": (bool,), "arguments": (dict,)},
            ("type",),
        )
        if doc["type"] not in EXCHANGE_TYPES:
            raise bad_request(f"'type' must be one of {', '.join(EXCHANGE_TYPES)}")
        # internal and alternate-exchange (write on it) are the core's to check.
        ex, made = mgmt.declare_exchange(
            exchange,
            doc["type"],
            doc.get("durable", True),
            doc.get("auto_delete", False),
            doc.get("internal", False),
            doc.get("arguments") or None,
        )
        return json_response(self._exchange_doc(vhost, ex), 201 if made else 200)

    def h_delete_exchange(self, request: Request, vhost: str, exchange: str) -> Response:
        self._management(request, vhost).delete_exchange(exchange)
        return json_response({"deleted": exchange})

    def h_list_bindings(self, request: Request, vhost: str) -> Any:
        mgmt = self._management(request, vhost)
        manage = self._manage()
        if manage is not None:
            # The whole broker: each queue's bindings from its home, in node order.
            def merged(result: tuple[dict, dict]) -> Response:
                answers, missing = result
                by_node = {manage.mesh.node: [[q.name, ex.name, key, args or {}]
                                              for q in mgmt.vhost.queues.values() if q.remote is None and q.bindings
                                              for ex, key, args in q.bindings]}
                truncated = []
                for node, answer in answers.items():
                    by_node[node] = answer.get("bindings") or []
                    if answer.get("truncated"):
                        truncated.append(node)
                rows = ({"queue": b[0], "exchange": b[1], "routing_key": b[2], "arguments": b[3], "home": node}
                        for node in sorted(by_node) for b in by_node[node] if self._listed(request, mgmt, b[0]))
                return self._bindings_page(request, rows, _gaps(missing, truncated))

            return manage.ask_all("bindings", {"vhost": mgmt.vhost.name}).addCallback(merged)
        rows = (
            {"queue": q.name, "exchange": ex.name, "routing_key": key, "arguments": args or {}}
            for q in mgmt.vhost.queues.values()
            if q.bindings and self._listed(request, mgmt, q.name)
            for ex, key, args in q.bindings
        )
        return self._bindings_page(request, rows, {})

    def _bindings_page(self, request: Request, rows: Any, extra: dict) -> Response:
        limit = _int_arg(request, "limit", min(1000, self.settings.max_list), 1, self.settings.max_list)
        offset = _int_arg(request, "offset", 0, 0, 1 << 62)
        page = list(islice(rows, offset, offset + limit + 1))
        more = len(page) > limit
        page = page[:limit]
        return json_response(
            {"bindings": page, "offset": offset, "next_offset": offset + limit if more else None, **extra}
        )

    def _binding_fields(self, doc: dict) -> tuple[str, str, str]:
        return doc["queue"], doc["exchange"], doc.get("routing_key", "")

    def h_add_binding(self, request: Request, vhost: str) -> Response:
        mgmt = self._management(request, vhost)
        doc = _object_body(
            request,
            {"queue": (str,), "exchange": (str,), "routing_key": (str,), "arguments": (dict,)},
            ("queue", "exchange"),
        )
        queue, exchange, key = self._binding_fields(doc)
        arguments = doc.get("arguments") or None
        return _then(mgmt.bind(queue, exchange, key, arguments), lambda _: json_response(
            {"queue": queue, "exchange": exchange, "routing_key": key, "arguments": arguments or {}}, 201))

    def h_delete_binding(self, request: Request, vhost: str) -> Response:
        mgmt = self._management(request, vhost)
        queue = _arg(request, "queue")
        exchange = _arg(request, "exchange")
        if queue is None or exchange is None:
            raise bad_request("name the binding with the query parameters 'queue' and 'exchange' (and 'routing_key', empty if left out)")
        key = _arg(request, "routing_key") or ""
        arguments = _json_object_arg(request, "arguments")
        return _then(mgmt.unbind(queue, exchange, key, arguments), lambda _: json_response(
            {"deleted": {"queue": queue, "exchange": exchange, "routing_key": key, "arguments": arguments or {}}}))


def _then(result: Any, answer: Any) -> Any:
    """C{answer(result)}, or, for a Deferred (an operation carried to another node), once it fires."""
    if isinstance(result, Deferred):
        return result.addCallback(answer)
    return answer(result)


def _gaps(missing: dict[str, str], truncated: list[str]) -> dict:
    """What a whole-broker listing lacks: the nodes that did not answer
    (C{missing}: node -> why) and those whose answer was cut (C{truncated})."""
    gaps: dict[str, Any] = {"missing": dict(sorted(missing.items()))}
    if truncated:
        gaps["truncated"] = sorted(truncated)
    return gaps
