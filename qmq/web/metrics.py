# -*- test-case-name: tests.test_web_metrics -*-
"""C{/metrics}: the broker in Prometheus's text format (prometheus-client).

No prometheus-client object is touched on the message path: a scrape reads
what the broker keeps anyway (queue lengths, consumers and their unacked
deliveries, the connection registry, the memory alarm, the message id
generator's C{issued} count) and a few plain integer counts (each queue's C{published} and
C{delivered}; each channel's publishes and acks, added up by protocol in
L{qmq.core.traffic}) through a custom collector, in its own registry (not
the process-global one, so two brokers in one process never mix). The HTTP
API's own counters are kept per request (a batch adds its size once). The
one timing it adds is the commit log's fsync latency, a histogram observed
on the store's writer thread around each sync (one sync per group commit,
not per message).

Per-queue series are given for the first C{http_api.max_metric_queues}
queues of each virtual host (a broker may hold millions); the per-vhost
totals count every queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from twisted.web.resource import Resource

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
    """Reads the broker's state at scrape time (see the module docstring)."""

    def __init__(self, ctx: Any, api: Any = None, max_queues: int = 1000) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        self.api = api
        self.max_queues = max_queues

    def collect(self) -> Iterator[Any]:
        broker = self.broker
        conns = GaugeMetricFamily("qmq_connections", "Open connections, by protocol.", labels=["protocol"])
        registry = getattr(self.ctx, "connections", None)
        counts: dict[str, int] = {}
        if registry is not None:
            for conn in list(registry.connections()):
                p = _protocol(conn)
                counts[p] = counts.get(p, 0) + 1
        for p, n in sorted(counts.items()):
            conns.add_metric([p], n)
        yield conns

        ids = issued_ids(broker)
        if ids is not None:
            c = CounterMetricFamily("qmq_messages_published", "Messages published, every protocol together.")
            c.add_metric([], ids)
            yield c

        traffic = getattr(broker, "traffic", None)
        if traffic is not None:
            families = [
                CounterMetricFamily(f"qmq_protocol_messages_{what}", f"Messages {what}, by client protocol "
                                    "(stomp, websocket, sockjs, http).", labels=["protocol"])
                for what in ("published", "delivered", "acked")
            ]
            for protocol, counts in traffic.totals().items():
                for family, n in zip(families, counts, strict=True):
                    family.add_metric([protocol or "internal"], n)
            yield from families

        api = self.api
        if api is not None:
            for name, attr, what in (
                ("qmq_http_messages_published", "published", "Messages published over the HTTP API."),
                ("qmq_http_messages_delivered", "delivered", "Messages received over the HTTP API."),
                ("qmq_http_messages_acked", "acked", "Messages acknowledged over the HTTP API."),
            ):
                c = CounterMetricFamily(name, what)
                c.add_metric([], getattr(api, attr))
                yield c

        vq = GaugeMetricFamily("qmq_vhost_queues", "Queues, by virtual host.", labels=["vhost"])
        vready = GaugeMetricFamily("qmq_vhost_messages_ready", "Ready messages, by virtual host.", labels=["vhost"])
        vunacked = GaugeMetricFamily("qmq_vhost_messages_unacked", "Delivered, unacknowledged messages.",
                                     labels=["vhost"])
        ready = GaugeMetricFamily("qmq_queue_messages_ready", "Ready messages.", labels=["vhost", "queue"])
        unacked = GaugeMetricFamily("qmq_queue_messages_unacked", "Delivered, unacknowledged messages.",
                                    labels=["vhost", "queue"])
        consumers = GaugeMetricFamily("qmq_queue_consumers", "Consumers.", labels=["vhost", "queue"])
        dropped = CounterMetricFamily("qmq_queue_dropped", "Messages the queue discarded by its limits.",
                                      labels=["vhost", "queue"])
        qpub = CounterMetricFamily("qmq_queue_published", "Messages routed to the queue.", labels=["vhost", "queue"])
        qdel = CounterMetricFamily("qmq_queue_delivered", "Messages the queue handed out.", labels=["vhost", "queue"])
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
        yield from (vq, vready, vunacked, ready, unacked, consumers, dropped, qpub, qdel)

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
        failure = getattr(broker.store, "failure", None)
        st = GaugeMetricFamily("qmq_store_failed", "1 while the store cannot write (persistent publishes held).")
        st.add_metric([], 1 if failure else 0)
        yield st


class MetricsResource(Resource):
    """C{GET /metrics}. With authentication on, only the API's admins may
    read it (queue names are in it): the check is the API's own."""

    isLeaf = True

    def __init__(self, ctx: Any, api: Any = None, max_queues: int = 1000) -> None:
        super().__init__()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(ctx, api, max_queues))
        self.fsync = Histogram(
            "qmq_fsync_seconds", "Commit-log fsync latency (one per group commit).",
            buckets=FSYNC_BUCKETS, registry=self.registry,
        )
        instrument_fsync(getattr(ctx.broker, "store", None), self.fsync)
        self.api = api
        self.ctx = ctx

    def render_GET(self, request: Any) -> Any:
        api = self.api
        if api is not None and getattr(self.ctx.broker, "auth", None) is not None:
            d = api.admin_check(request)
            d.addCallback(lambda _: self._answer(request))
            return api.finish_later(request, d)
        return self._answer(request)

    def _answer(self, request: Any) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self.registry)


def metrics_resource(ctx: Any, api: Any = None) -> MetricsResource:
    """The C{/metrics} resource of a site whose context is C{ctx} (C{api}:
    its HTTP API resource, for its counters and its admin check)."""
    settings = getattr(ctx, "settings", None)
    max_queues = settings.section("http_api").max_metric_queues if settings is not None else 1000
    return MetricsResource(ctx, api, max_queues)


__all__ = ["BrokerCollector", "MetricsResource", "instrument_fsync", "issued_ids", "metrics_resource"]
