# -*- test-case-name: tests.test_web_metrics -*-
"""C{/metrics}: the broker in Prometheus's text format (prometheus-client).

No prometheus-client object is touched on the message path: a scrape reads
what the broker keeps anyway (queue lengths, consumers and their unacked
deliveries, the connection registry and its per-listener opened and closed
counts, the alarms) and a few plain integer counts (each queue's
C{published} and C{delivered}; each channel's publishes and acks, added up
by protocol in L{qmq.core.traffic}; each virtual host's redelivered,
dead-lettered and unroutable messages, counted where those rare events
happen) through a custom collector, in its own registry (not the
process-global one, so two brokers in one process never mix). Each count
appears once, under one name (L{FAMILIES}). The one timing it adds is the
commit log's fsync latency, a histogram observed on the store's writer
thread around each sync (one sync per group commit, not per message).

Per-queue series are given for the first C{http_api.max_metric_queues}
queues of each virtual host (a broker may hold millions); the per-vhost
totals count every queue.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from qmq import __version__

log = Logger()

#: fsync buckets, seconds (a sync on this kind of disk: 0.1 to 3 ms).
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _protocol(conn: Any) -> str:
    name = getattr(conn, "protocol_name", None)
    if name:
        return str(name)
    cls = type(conn).__name__.lower()
    for known in ("stomp", "http", "sockjs", "websocket", "peer", "amqp"):
        if known in cls:
            return known
    return cls


def issued_ids(broker: Any) -> int | None:
    """How many message ids the broker has issued in this run (its
    publishes), read from its id generator without taking one
    (L{qmq.core.ids.MessageIds.issued}); None for a broker without one."""
    ids = getattr(broker, "message_ids", None)
    issued = getattr(ids, "issued", None)
    return issued if issued.__class__ is int else None


def instrument_fsync(store: Any, histogram: Histogram) -> bool:
    """Time the commit log's syncs into C{histogram}, through the store's
    sync observer (L{qmq.store.log.CommitLogStore.observe_syncs}).

    @return: whether the store was instrumented now (False: a store that
        does not sync, or one timed into C{histogram} already).
    """
    observe_syncs = getattr(store, "observe_syncs", None)
    if observe_syncs is None:
        return False
    return bool(observe_syncs(histogram.observe))


class BrokerCollector:
    """Reads the broker's state at scrape time (see the module docstring).

    Every family is named once (L{FAMILIES} lists them, with their types,
    for the docs and the tests): counters end in C{_total} in the
    exposition, sizes are in bytes and times in seconds."""

    def __init__(self, ctx: Any, api: Any = None, max_queues: int = 1000) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        self.api = api
        self.max_queues = max_queues

    def collect(self) -> Iterator[Any]:
        broker = self.broker
        info = GaugeMetricFamily("qmq_build_info", "The broker's version and Python's (always 1).",
                                 labels=["version", "python"])
        info.add_metric([__version__, platform.python_version()], 1)
        yield info

        registry = getattr(self.ctx, "connections", None)
        conns = GaugeMetricFamily("qmq_connections", "Open connections, by protocol.", labels=["protocol"])
        counts: dict[str, int] = {}
        if registry is not None:
            for conn in list(registry.connections()):
                p = _protocol(conn)
                counts[p] = counts.get(p, 0) + 1
        for p, n in sorted(counts.items()):
            conns.add_metric([p], n)
        yield conns
        opened = getattr(registry, "opened", None)
        closed = getattr(registry, "closed", None)
        if opened is not None and closed is not None:
            o = CounterMetricFamily("qmq_connections_opened", "Connections admitted, by listener (its listen spec).",
                                    labels=["listener"])
            c = CounterMetricFamily("qmq_connections_closed", "Connections closed, by listener.", labels=["listener"])
            for listener in sorted(opened):
                o.add_metric([listener], opened[listener])
                c.add_metric([listener], closed.get(listener, 0))
            yield o
            yield c

        traffic = getattr(broker, "traffic", None)
        if traffic is not None:
            families = [
                CounterMetricFamily(f"qmq_messages_{what}", f"Messages {what}, by client protocol "
                                    "(stomp, websocket, sockjs, http; internal: tools, dead-lettering).",
                                    labels=["protocol"])
                for what in ("published", "delivered", "acked")
            ]
            for protocol, row in traffic.totals().items():
                for family, n in zip(families, row, strict=True):
                    family.add_metric([protocol or "internal"], n)
            yield from families

        redelivered = CounterMetricFamily("qmq_messages_redelivered", "Messages given back to a queue "
                                          "(nacked with requeue, or their consumer went away), by virtual host.",
                                          labels=["vhost"])
        dead = CounterMetricFamily("qmq_messages_dead_lettered", "Messages republished to a dead-letter "
                                   "exchange, by the virtual host of the queue they left.", labels=["vhost"])
        unroutable = CounterMetricFamily("qmq_messages_unroutable_dropped", "Messages published to no queue "
                                         "and dropped, by virtual host.", labels=["vhost"])
        vq = GaugeMetricFamily("qmq_vhost_queues", "Queues, by virtual host.", labels=["vhost"])
        vready = GaugeMetricFamily("qmq_vhost_messages_ready", "Ready messages, by virtual host.", labels=["vhost"])
        vunacked = GaugeMetricFamily("qmq_vhost_messages_unacked", "Delivered, unacknowledged messages.",
                                     labels=["vhost"])
        ready = GaugeMetricFamily("qmq_queue_messages_ready", "Ready messages.", labels=["vhost", "queue"])
        unacked = GaugeMetricFamily("qmq_queue_messages_unacked", "Delivered, unacknowledged messages.",
                                    labels=["vhost", "queue"])
        consumers = GaugeMetricFamily("qmq_queue_consumers", "Consumers.", labels=["vhost", "queue"])
        dropped = CounterMetricFamily("qmq_queue_messages_dropped", "Messages the queue discarded by its limits.",
                                      labels=["vhost", "queue"])
        qpub = CounterMetricFamily("qmq_queue_messages_published", "Messages routed to the queue.",
                                   labels=["vhost", "queue"])
        qdel = CounterMetricFamily("qmq_queue_messages_delivered", "Messages the queue handed out.",
                                   labels=["vhost", "queue"])
        for vname, vhost in list(broker.vhosts.items()):
            total_ready = total_unacked = 0
            for i, q in enumerate(list(vhost.queues.values())):
                r = len(q)
                u = sum(len(c.unacked) for c in q.consumers)
                total_ready += r
                total_unacked += u
                if i < self.max_queues:
                    labels = [vname, q.name]
                    ready.add_metric(labels, r)
                    unacked.add_metric(labels, u)
                    consumers.add_metric(labels, len(q.consumers))
                    dropped.add_metric(labels, q.dropped)
                    qpub.add_metric(labels, q.published)
                    qdel.add_metric(labels, q.delivered)
            vq.add_metric([vname], len(vhost.queues))
            vready.add_metric([vname], total_ready)
            vunacked.add_metric([vname], total_unacked)
            redelivered.add_metric([vname], getattr(vhost, "redelivered", 0))
            dead.add_metric([vname], getattr(vhost, "dead_lettered", 0))
            unroutable.add_metric([vname], getattr(vhost, "unroutable", 0))
        yield from (redelivered, dead, unroutable, vq, vready, vunacked, ready, unacked, consumers, dropped,
                    qpub, qdel)

        alarm = getattr(broker, "memory_alarm", None)
        a = GaugeMetricFamily("qmq_memory_alarm", "1 while the memory alarm is raised (publishers blocked).")
        a.add_metric([], 1 if alarm is not None and alarm.active else 0)
        yield a
        if alarm is not None:
            rss = GaugeMetricFamily("qmq_memory_rss_bytes", "Resident memory at the alarm's last sample.")
            rss.add_metric([], alarm.rss)
            yield rss
            high = GaugeMetricFamily("qmq_memory_high_watermark_bytes", "The memory alarm's high-water mark.")
            high.add_metric([], alarm.high)
            yield high
            raised = CounterMetricFamily("qmq_memory_alarm_raised", "Times the memory alarm was raised.")
            raised.add_metric([], alarm.raised_count)
            yield raised
        disk = getattr(broker, "disk_alarm", None)
        d = GaugeMetricFamily("qmq_disk_alarm", "1 while the disk alarm is raised (persistent publishes held).")
        d.add_metric([], 1 if disk is not None and disk.active else 0)
        yield d
        if disk is not None:
            free = GaugeMetricFamily("qmq_disk_free_bytes", "Free space of the data directory's filesystem at the last sample.")
            free.add_metric([], max(disk.free, 0))
            yield free
            limit = GaugeMetricFamily("qmq_disk_free_limit_bytes", "The disk alarm's limit.")
            limit.add_metric([], max(disk.limit, 0))
            yield limit
            raised = CounterMetricFamily("qmq_disk_alarm_raised", "Times the disk alarm was raised.")
            raised.add_metric([], disk.raised_count)
            yield raised
        failure = getattr(broker.store, "failure", None)
        st = GaugeMetricFamily("qmq_store_failed", "1 while the store cannot write (persistent publishes held).")
        st.add_metric([], 1 if failure else 0)
        yield st
        # Without a mesh the link families are there, with no series.
        mesh = getattr(broker, "mesh", None)
        yield from _link_families(mesh.snapshot() if mesh is not None else [])


def _link_families(links: list[dict[str, Any]]) -> Iterator[Any]:
    """The mesh's links to other nodes (L{qmq.cluster.mesh.Mesh.snapshot}), by peer."""
    up = GaugeMetricFamily("qmq_link_up", "1 for each link up to another node of the mesh.", labels=["peer"])
    rtt = GaugeMetricFamily("qmq_link_rtt_seconds", "A link's last heart-beat round trip.", labels=["peer"])
    messages = CounterMetricFamily("qmq_link_messages", "Messages over a link, by peer and direction (in, out).",
                                   labels=["peer", "direction"])
    sent = CounterMetricFamily("qmq_link_bytes", "Bytes of message frames over a link, by peer and direction.",
                               labels=["peer", "direction"])
    dropped = CounterMetricFamily("qmq_link_messages_dropped", "Messages dropped for a peer that did not read.",
                                  labels=["peer"])
    for link in links:
        if link["state"] != "up":
            continue
        peer = link["node"]
        up.add_metric([peer], 1)
        if link["rtt_ms"] is not None:
            rtt.add_metric([peer], link["rtt_ms"] / 1000)
        for direction in ("in", "out"):
            messages.add_metric([peer, direction], link[f"messages_{direction}"])
            sent.add_metric([peer, direction], link[f"bytes_{direction}"])
        dropped.add_metric([peer], link["dropped"])
    yield from (up, rtt, messages, sent, dropped)


#: Every family of the exposition and its type, as the parser names them
#: (a counter without its C{_total}); those of prometheus-client's process
#: collector (C{process_*}, Linux only) and platform collector
#: (C{python_info}) come too. The docs list each (docs/monitoring.rst).
FAMILIES: dict[str, str] = {
    "qmq_build_info": "gauge",
    "qmq_connections": "gauge",
    "qmq_connections_opened": "counter",
    "qmq_connections_closed": "counter",
    "qmq_messages_published": "counter",
    "qmq_messages_delivered": "counter",
    "qmq_messages_acked": "counter",
    "qmq_messages_redelivered": "counter",
    "qmq_messages_dead_lettered": "counter",
    "qmq_messages_unroutable_dropped": "counter",
    "qmq_vhost_queues": "gauge",
    "qmq_vhost_messages_ready": "gauge",
    "qmq_vhost_messages_unacked": "gauge",
    "qmq_queue_messages_ready": "gauge",
    "qmq_queue_messages_unacked": "gauge",
    "qmq_queue_consumers": "gauge",
    "qmq_queue_messages_dropped": "counter",
    "qmq_queue_messages_published": "counter",
    "qmq_queue_messages_delivered": "counter",
    "qmq_memory_alarm": "gauge",
    "qmq_memory_rss_bytes": "gauge",
    "qmq_memory_high_watermark_bytes": "gauge",
    "qmq_memory_alarm_raised": "counter",
    "qmq_disk_alarm": "gauge",
    "qmq_disk_free_bytes": "gauge",
    "qmq_disk_free_limit_bytes": "gauge",
    "qmq_disk_alarm_raised": "counter",
    "qmq_store_failed": "gauge",
    "qmq_fsync_seconds": "histogram",
    "qmq_link_up": "gauge",
    "qmq_link_rtt_seconds": "gauge",
    "qmq_link_messages": "counter",
    "qmq_link_bytes": "counter",
    "qmq_link_messages_dropped": "counter",
}


class MetricsResource(Resource):
    """C{GET /metrics}. With authentication on, only the API's admins and
    monitors may read it (queue names are in it): the decision is the
    core's (L{qmq.core.access.may_monitor}), asked through the API's
    C{monitor_check}."""

    isLeaf = True

    def __init__(self, ctx: Any, api: Any = None, max_queues: int = 1000) -> None:
        super().__init__()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(ctx, api, max_queues))
        # The process's CPU, memory, open files and start time (Linux's
        # /proc; nothing elsewhere) and the Python build: prometheus-client's own.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.fsync = Histogram(
            "qmq_fsync_seconds", "Commit-log fsync latency (one per group commit).",
            buckets=FSYNC_BUCKETS, registry=self.registry,
        )
        instrument_fsync(getattr(ctx.broker, "store", None), self.fsync)
        self.api = api
        self.ctx = ctx

    def render_GET(self, request: Any) -> Any:
        # A worker of several (qmq.workers.metrics) answers for them all,
        # and for itself alone on its private socket (the supervisor's
        # directory, mode 0700: no authentication there).
        workers = getattr(self.ctx.broker, "worker_metrics", None)
        if workers is not None and workers.is_private(self.ctx.listener):
            return self._answer(request)
        api = self.api
        if api is not None and getattr(self.ctx.broker, "auth", None) is not None:
            d = api.monitor_check(request)
            d.addCallback(lambda _: self._answer(request, workers))
            return api.finish_later(request, d)
        if workers is None:
            return self._answer(request)
        d = self._answer(request, workers)

        def write(body: bytes) -> None:
            request.write(body)
            request.finish()

        def failed(failure: Any) -> None:
            log.failure("/metrics: the workers' metrics could not be gathered", failure)
            request.setResponseCode(500)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            request.write(b"the workers' metrics could not be gathered (the log says why)\n")
            request.finish()

        d.addCallbacks(write, failed)
        return NOT_DONE_YET

    def _answer(self, request: Any, workers: Any = None) -> Any:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        if workers is not None:
            return workers.gather(lambda: generate_latest(self.registry))
        return generate_latest(self.registry)


def metrics_resource(ctx: Any, api: Any = None) -> MetricsResource:
    """The C{/metrics} resource of a site whose context is C{ctx} (C{api}:
    its HTTP API resource, for its counters and its admin check)."""
    settings = getattr(ctx, "settings", None)
    max_queues = settings.section("http_api").max_metric_queues if settings is not None else 1000
    return MetricsResource(ctx, api, max_queues)


__all__ = ["FAMILIES", "BrokerCollector", "MetricsResource", "instrument_fsync", "issued_ids", "metrics_resource"]
