"""The benchmark scenarios (parent side): start workers, measure, report.

Each scenario returns one JSON-friendly dict. Common keys:

``scenario``, ``broker``, ``rate`` and ``unit`` (the headline figure),
``count`` (units done), ``seconds`` (measured phase), ``gen_cpu_s`` (sum of
the load generator's worker CPU during the measured phase), ``broker_cpu_s``
(utime+stime of the broker process tree over the same phase),
``broker_cpu_us_per_unit``, ``broker_rss_kib`` (after the phase), and
``error`` (a reason string) when the broker failed the scenario; then the
other figures are absent. Scenario-specific keys are documented per function.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from loadgen import (
    Limits,
    Target,
    consume,
    hold_idle,
    hold_wildcards,
    ping_pong,
    produce,
    produce_many,
)
from procstat import (
    CLK_TCK,
    all_process_ticks,
    children_tree,
    cpu_seconds,
    pid_by_port,
    rss_kib,
    system_busy_seconds,
    top_consumers,
)
from stompwire import StompError
from workers import KeepAwake, ScenarioError, ScenarioSkipped, Supervisor, new_shared

#: Default unit counts; chosen so that each run takes a few seconds on the peers.
DEFAULT_COUNTS: dict[str, int] = {
    "queue-auto": 100_000,
    "queue-ack": 50_000,
    "receipt": 20_000,
    "fanout": 20_000,  # messages published; deliveries = count x subscribers
    "latency": 5_000,
    "idle": 2_000,
    "many-queues": 50_000,
    "tls": 100_000,
    "wildcard": 100_000,
    "big": 200,
    "stalled": 10_000_000,  # bounded by --max-seconds in practice
    "persist-receipt": 20_000,
    "persist-receipt-10": 20_000,  # in all, over the 10 producers
    "receipt-10": 20_000,
    "persist-consume": 20_000,
}
#: Producers of the persist-receipt-10 and receipt-10 scenarios.
PRODUCERS_10 = 10


@dataclass
class Options:
    """Knobs of the scenarios (the CLI maps its flags onto these)."""

    count: int | None = None
    body_size: int = 100
    window: int = 100
    prefetch: int = 500
    subscribers: int = 10
    consumer_procs: int = 2
    warmup: int = 500
    idle_conns: int | None = None
    heart_beat: str = "0,30000"
    idle_hold: float = 3.0
    idle_load: bool = False
    wildcard_subs: int = 100_000
    wildcard_per_conn: int = 10_000
    big_size: int = 1 << 20
    stalled_seconds: float = 5.0
    #: Run nice-19 spinners on every core during the scenario (see KeepAwake).
    keep_awake: bool = False
    #: Producer stays at most this many messages ahead of the slowest consumer (0: unbounded).
    max_lead: int = 50_000
    limits: Limits = field(default_factory=Limits)
    runid: str = field(default_factory=lambda: f"{int(time.time()) % 1_000_000}x{os.getpid()}")


class Probe:
    """CPU and RSS of the broker process tree (no-op when the PID is unknown)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.busy: list[float] = []
        self.snaps: list[dict[int, tuple[int, str]]] = []
        self.mine: set[int] = set()
        #: PIDs whose CPU is neither broker, generator nor "other" (spinners).
        self.ignore: list[int] = []

    def cpu(self) -> float | None:
        """Return the broker's CPU seconds so far (and note the machine's busy time)."""
        self.busy.append(system_busy_seconds())
        self.snaps.append(all_process_ticks())
        self.mine.update(children_tree(os.getpid()))  # this harness and its live workers
        return cpu_seconds(self.pid) if self.pid else None

    def ignored_cpu(self) -> float:
        """CPU seconds of the ignored PIDs during the last phase."""
        if len(self.snaps) < 2 or not self.ignore:
            return 0.0
        a, b = self.snaps[-2], self.snaps[-1]
        ticks = sum(b.get(p, (0, ""))[0] - a.get(p, (0, ""))[0] for p in self.ignore)
        return ticks / CLK_TCK

    def others(self) -> list[tuple[str, float]]:
        """Processes other than the broker and this harness that used CPU in the last phase."""
        if len(self.snaps) < 2:
            return []
        mine = set(self.mine)
        if self.pid:
            mine.update(children_tree(self.pid))
        return top_consumers(self.snaps[-2], self.snaps[-1], mine)

    def rss(self) -> int | None:
        """Return the broker's RSS in KiB."""
        return rss_kib(self.pid) if self.pid else None


#: Scenarios whose default count scales with the profile's ``count_scale``.
SCALED = {"queue-auto", "queue-ack", "receipt", "fanout", "latency", "tls", "wildcard", "big",
          "persist-receipt", "persist-receipt-10", "receipt-10", "persist-consume"}


def _count(name: str, o: Options, t: Target) -> int:
    n = o.count or DEFAULT_COUNTS[name]
    if not o.count and name in SCALED:
        n = int(n * t.profile.count_scale)
    if name == "idle" and o.idle_conns:
        n = o.idle_conns
    if name == "many-queues" and not o.count and t.profile.many_queues_cap:
        n = min(n, t.profile.many_queues_cap)
    return n


def _finish(
    res: dict[str, Any],
    units: float,
    seconds: float,
    cpu0: float | None,
    cpu1: float | None,
    gen_cpu: float,
    probe: Probe,
) -> dict[str, Any]:
    """Fill in the common figures."""
    res["count"] = units
    res["seconds"] = round(seconds, 4)
    res["rate"] = round(units / seconds, 1) if seconds > 0 else None
    res["gen_cpu_s"] = round(gen_cpu, 3)
    if cpu0 is not None and cpu1 is not None:
        res["broker_cpu_s"] = round(cpu1 - cpu0, 3)
        res["broker_cpu_us_per_unit"] = round((cpu1 - cpu0) / units * 1e6, 2) if units else None
    res["broker_rss_kib"] = probe.rss()
    if len(probe.busy) >= 2 and cpu0 is not None and cpu1 is not None:
        # CPU used by anything else on the machine during the phase (noise gauge).
        other = probe.busy[-1] - probe.busy[-2] - (cpu1 - cpu0) - gen_cpu - probe.ignored_cpu()
        res["other_cpu_s"] = round(max(0.0, other), 2)
        if other > 0.2 * max(seconds, 0.1):
            res["other_top"] = probe.others()
    return res


def _flow(
    t: Target,
    o: Options,
    consumers: list[tuple[str, Callable[..., Any], tuple]],
    producers: list[tuple[str, Callable[..., Any], tuple]],
    probe: Probe,
    max_lead: int = 0,
) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]], float | None, float | None]:
    """Run consumers then producers through ready/go/done; return the raw results.

    With ``max_lead`` > 0 and consumers, the producers get the consumers'
    progress (a shared array) and stay at most that many messages ahead.
    """
    lim = o.limits
    if max_lead > 0 and consumers:
        shared = new_shared(len(consumers))
        consumers = [(n, fn, (*a, shared, i)) for i, (n, fn, a) in enumerate(consumers)]
        producers = [(n, fn, (*a, shared, max_lead)) for n, fn, a in producers]
    with Supervisor() as sup:
        cons = [sup.start(n, fn, *a) for n, fn, a in consumers]
        sup.gather("ready", lim.setup * 2 + 5, cons)
        prods = [sup.start(n, fn, *a) for n, fn, a in producers]
        sup.gather("ready", lim.setup * 2 + 5, prods)
        cpu0 = probe.cpu()
        t0 = time.monotonic()
        sup.send(("go", t0))
        done = sup.gather("done", lim.max_seconds + lim.stall + lim.setup + 10)
        cpu1 = probe.cpu()
    return t0, done[: len(cons)], done[len(cons) :], cpu0, cpu1


def _split(items: list[str], parts: int) -> list[list[str]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


# ---------------------------------------------------------------- scenarios
def queue_flow(
    t: Target, o: Options, probe: Probe, name: str, ack: str = "auto", body_size: int | None = None
) -> dict[str, Any]:
    """Queue 1->1: one producer, one consumer; rate measured at the consumer.

    ``ack`` "auto" (queue-auto, tls, big) or the profile's ack mode with
    prefetch (queue-ack: one ACK frame per message).
    """
    n = _count(name, o, t)
    size = body_size or o.body_size
    dest = f"/queue/bench.{o.runid}.{name}"
    prefetch = o.prefetch if ack != "auto" else None
    t0, cons, prods, cpu0, cpu1 = _flow(
        t,
        o,
        [("consumer", consume, (t, [dest], n, ack, prefetch, 0, o.limits))],
        [("producer", produce, (t, dest, n, size, None, o.limits, False))],
        probe,
        o.max_lead,
    )
    c = cons[0]
    got = sum(c["received"])
    res: dict[str, Any] = {"unit": "msgs/s", "body_size": size, "ack": ack}
    if ack != "auto":
        res["prefetch"] = prefetch if t.profile.prefetch_headers else None
    if t.profile.max_unreceipted:
        res["producer_receipt_batches"] = prods[0].get("per_batch")
    res["truncated"] = c["truncated"]
    res["max_lead"] = o.max_lead
    res["lead_waits"] = prods[0].get("lead_waits")
    res = _finish(res, got, c["t_last"] - t0, cpu0, cpu1, c["cpu"] + prods[0]["cpu"], probe)
    res["mb_per_s"] = round(res["rate"] * size / 1e6, 2) if res["rate"] else None
    return res


def receipt(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """SEND with a receipt on every frame, ``window`` outstanding; receipts/s."""
    n = _count("receipt", o, t)
    dest = f"/queue/bench.{o.runid}.receipt"
    t0, _, prods, cpu0, cpu1 = _flow(
        t, o, [], [("producer", produce, (t, dest, n, o.body_size, o.window, o.limits))], probe
    )
    p = prods[0]
    res = {"unit": "receipts/s", "window": p["window"], "truncated": p["truncated"]}
    return _finish(res, p["receipts"], p["t_last"] - t0, cpu0, cpu1, p["cpu"], probe)


def fanout(t: Target, o: Options, probe: Probe, stalled: int = 0) -> dict[str, Any]:
    """Topic 1->N (N = ``subscribers``); deliveries/s summed over subscribers.

    With ``stalled`` > 0 (the ``stalled`` scenario), that many extra
    subscribers never read, the run lasts ``stalled_seconds`` and the rate is
    that of the readers.
    """
    name = "stalled" if stalled else "fanout"
    if o.subscribers <= stalled:
        raise ScenarioError("need more subscribers than stalled ones")
    n = _count(name, o, t)
    dest = f"/topic/bench.{o.runid}.{name}"
    # The stalled subscribers are among the ``subscribers``: N - stalled read.
    subs = [dest] * (o.subscribers - stalled)
    lim = replace(o.limits, max_seconds=o.stalled_seconds) if stalled else o.limits
    groups = _split(subs, o.consumer_procs)
    consumers = [
        (f"consumer{i}", consume, (t, g, n, "auto", None, stalled if i == 0 else 0, lim))
        for i, g in enumerate(groups)
    ]
    t0, cons, prods, cpu0, cpu1 = _flow(
        t,
        replace(o, limits=lim),
        consumers,
        [("producer", produce, (t, dest, n, o.body_size, None, lim, bool(stalled)))],
        probe,
        0 if stalled else o.max_lead,
    )
    got = sum(sum(c["received"]) for c in cons)
    t_last = max(c["t_last"] for c in cons)
    last_delivery = t_last - t0
    if stalled:
        # Rate over the whole window, whenever the readers stopped receiving.
        t_last = t0 + lim.max_seconds
    res: dict[str, Any] = {
        "unit": "deliveries/s",
        "subscribers": o.subscribers,
        "readers": len(subs),
        "published": prods[0]["sent"],
        "truncated": any(c["truncated"] for c in cons),
        "max_lead": 0 if stalled else o.max_lead,
        "lead_waits": prods[0].get("lead_waits"),
    }
    if stalled:
        res["stalled_subscribers"] = stalled
        res["producer_longest_block_s"] = prods[0].get("longest_block_s")
        res["producer_blocked_at_end"] = prods[0].get("blocked", False)
        res["last_delivery_s"] = round(last_delivery, 3)
        res["publish_rate"] = round(prods[0]["sent"] / lim.max_seconds, 1)
    gen = sum(c["cpu"] for c in cons) + prods[0]["cpu"]
    res = _finish(res, got, t_last - t0, cpu0, cpu1, gen, probe)
    res["msgs_per_s"] = round(res["rate"] / len(subs), 1) if res["rate"] else None
    return res


def latency(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """Ping-pong SEND -> MESSAGE through a queue, one message in flight; p50/p99 µs."""
    n = _count("latency", o, t)
    dest = f"/queue/bench.{o.runid}.latency"
    t0, _, prods, cpu0, cpu1 = _flow(
        t, o, [], [("pingpong", ping_pong, (t, dest, n, o.warmup, o.body_size, o.limits))], probe
    )
    s = prods[0]["samples_ns"]
    if not s:
        raise ScenarioError("no round trip measured")

    def pct(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] / 1000, 1)

    res = {
        "unit": "round trips/s",
        "warmup": o.warmup,
        "p50_us": pct(0.50),
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
        "max_us": round(s[-1] / 1000, 1),
        "truncated": prods[0]["truncated"],
    }
    # Rate and CPU cover warm-up and measured trips alike.
    return _finish(res, len(s) + o.warmup, prods[0]["t_last"] - t0, cpu0, cpu1, prods[0]["cpu"], probe)


def idle(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """Open N idle connections with heart-beats; time to open, RSS per connection.

    Keys: ``connections``, ``open_seconds``, ``rate`` (connections/s),
    ``rss_before_kib``, ``rss_after_kib``, ``rss_per_conn_kib``,
    ``broker_cpu_idle_pct`` (broker CPU while holding them for
    ``idle_hold`` s), ``dropped`` (connections the broker closed), and
    ``load`` (a queue-auto result measured while they were open, with
    ``--idle-load``).
    """
    n = _count("idle", o, t)
    lim = o.limits
    rss0 = probe.rss()
    res: dict[str, Any] = {"unit": "conns/s", "connections": n, "heart_beat": o.heart_beat}
    with Supervisor() as sup:
        cpu0 = probe.cpu()
        sup.start("idle", hold_idle, t, n, t.profile.connect_concurrency, o.heart_beat, lim)
        info = sup.gather("ready", lim.max_seconds + n / 50.0 + lim.setup + 10)[0]
        cpu1 = probe.cpu()
        time.sleep(min(o.idle_hold, 60.0))
        cpu2 = probe.cpu()
        rss1 = probe.rss()
        if o.idle_load:
            res["load"] = run_one("queue-auto", t, replace(o, runid=o.runid + "i"), probe.pid)
        sup.send(("close", None))
        dropped = sup.gather("done", lim.setup)[0]["dropped"]
    res.update(
        {
            "open_seconds": round(info["seconds"], 3),
            "heart_beat_broker": info["heart_beat_broker"],
            "client_beat_interval_s": info["client_beat_interval_s"],
            "rss_before_kib": rss0,
            "rss_after_kib": rss1,
            "dropped": dropped,
        }
    )
    if rss0 is not None and rss1 is not None:
        res["rss_per_conn_kib"] = round((rss1 - rss0) / n, 2)
    if cpu1 is not None and cpu2 is not None:
        res["broker_cpu_idle_pct"] = round((cpu2 - cpu1) / o.idle_hold * 100, 2)
    probe.busy = probe.busy[:2]  # the open phase, for other_cpu_s
    probe.snaps = probe.snaps[:2]
    res = _finish(res, info["opened"], info["seconds"], cpu0, cpu1, info["cpu"], probe)
    res["broker_rss_kib"] = rss1
    if dropped:
        res["error"] = f"broker dropped {dropped} of {n} idle connections"
    return res


def many_queues(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """N distinct queues each receiving one message (SEND with receipt window).

    Keys: ``rate`` (queues/s), ``rss_before_kib``, ``rss_per_queue_kib``.
    """
    n = _count("many-queues", o, t)
    dest = f"/queue/bench.{o.runid}.mq.{{i}}"
    rss0 = probe.rss()
    t0, _, prods, cpu0, cpu1 = _flow(
        t, o, [], [("producer", produce, (t, dest, n, o.body_size, o.window, o.limits))], probe
    )
    p = prods[0]
    res: dict[str, Any] = {"unit": "queues/s", "window": p["window"], "truncated": p["truncated"]}
    res = _finish(res, p["receipts"], p["t_last"] - t0, cpu0, cpu1, p["cpu"], probe)
    res["rss_before_kib"] = rss0
    if rss0 is not None and res["broker_rss_kib"] is not None and p["receipts"]:
        res["rss_per_queue_kib"] = round((res["broker_rss_kib"] - rss0) / p["receipts"], 3)
    return res


def wildcard(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """Topic publish rate (1->1) with no other subscriptions, then with
    ``wildcard_subs`` non-matching wildcard subscriptions held open.

    Keys: ``rate_none``, ``rate`` (with the subscriptions), ``ratio``,
    ``subscribe_seconds``, ``rss_per_sub_kib``.
    """
    pattern = t.profile.wildcard_pattern
    if pattern is None:
        raise ScenarioSkipped(f"{t.profile.name} has no topic wildcards")
    nsubs = min(o.wildcard_subs, t.profile.wildcard_cap or o.wildcard_subs)
    one = replace(o, subscribers=1, consumer_procs=1, count=_count("wildcard", o, t))
    base = fanout(t, replace(one, runid=o.runid + "a"), probe)
    lim = o.limits
    rss0 = probe.rss()
    with Supervisor() as sup:
        sup.start("wildcards", hold_wildcards, t, nsubs, pattern, o.wildcard_per_conn, lim)
        info = sup.gather("ready", lim.max_seconds + nsubs / 500.0 + lim.setup + 10)[0]
        rss1 = probe.rss()
        loaded = fanout(t, replace(one, runid=o.runid + "b"), probe)
        sup.send(("close", None))
        sup.gather("done", lim.setup)
    loaded.update(
        {
            "rate_none": base["rate"],
            "gen_cpu_s_none": base["gen_cpu_s"],
            "broker_cpu_us_per_unit_none": base.get("broker_cpu_us_per_unit"),
            "ratio": round(loaded["rate"] / base["rate"], 3) if base["rate"] else None,
            "wildcard_subs": nsubs,
            "wildcard_pattern": pattern,
            "subscribe_seconds": round(info["seconds"], 2),
        }
    )
    if rss0 is not None and rss1 is not None:
        loaded["rss_per_sub_kib"] = round((rss1 - rss0) / nsubs, 3)
    return loaded


# ---------------------------------------------------------------- durable messages
def _persist_extra(t: Target) -> bytes:
    """The profile's persistent-message SEND headers as header lines."""
    return b"".join(b"\n" + k.encode() + b":" + v.encode() for k, v in t.profile.persistent_headers)


def _data_dir(t: Target) -> str | None:
    d = t.profile.data_dir
    if not d:
        return None
    return d.replace("$QMQ_BENCH_RUN", os.environ.get("QMQ_BENCH_RUN", "/tmp/qmqbench"))


def disk_kib(path: str | None, max_files: int = 100_000) -> int | None:
    """KiB allocated to the files under ``path`` (blocks, so preallocated
    sparse journals count what is written); None if it is not there."""
    if not path or not os.path.isdir(path):
        return None
    total = 0
    seen = 0
    for root, _, files in os.walk(path):
        for f in files:
            seen += 1
            if seen > max_files:
                return total // 1024
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                continue
    return total // 1024


def rabbitmq_queue(t: Target, queue: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """Ask RabbitMQ's management API about ``queue`` (durable, messages_persistent)."""
    api = t.profile.http_api
    if not api:
        return None
    vhost = urllib.parse.quote(t.profile.vhost, safe="")
    req = urllib.request.Request(f"{api}/api/queues/{vhost}/{urllib.parse.quote(queue, safe='')}")
    auth = base64.b64encode(f"{t.profile.login}:{t.profile.passcode}".encode()).decode()
    req.add_header("Authorization", "Basic " + auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            q = json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError) as e:
        return {"error": str(e)[:200]}
    return {k: q.get(k) for k in ("durable", "auto_delete", "messages", "messages_persistent",
                                  "messages_ram")}


def _durability(t: Target, queues: list[str], disk0: int | None, stored_bytes: int) -> dict[str, Any]:
    """Evidence that the messages are kept on disk: the data directory's
    growth, and RabbitMQ's own account of the queue."""
    out: dict[str, Any] = {}
    disk1 = disk_kib(_data_dir(t))
    if disk0 is not None and disk1 is not None:
        out["disk_growth_kib"] = disk1 - disk0
        out["body_kib"] = stored_bytes // 1024
    if t.profile.http_api and queues:
        out["rabbitmq_queue"] = rabbitmq_queue(t, queues[0])
    return out


def persist_receipt(t: Target, o: Options, probe: Probe, producers: int, persistent: bool = True) -> dict[str, Any]:
    """SEND with a receipt on every frame to durable queues, ``window``
    receipts in flight per producer; receipts/s over all producers.

    ``persistent``: the frames carry the profile's persistent headers
    (``persistent:true``; RabbitMQ also ``durable:true``), so a receipt
    means "on disk" (QMQ ``fsync = "always"``, RabbitMQ publisher confirms,
    ActiveMQ's KahaDB journal sync). Without it this is the same load on
    memory queues. With several producers each has its own queue and its
    own connection; they run in ``consumer_procs`` processes.

    Keys: ``producers``, ``window`` (per producer), ``persistent``,
    ``disk_growth_kib`` and ``body_kib`` (the broker's data directory grew
    by this much for this many KiB of bodies), ``rabbitmq_queue``.
    """
    name = ("persist-receipt" if persistent else "receipt") + ("-10" if producers > 1 else "")
    if persistent and not t.profile.durable:
        raise ScenarioSkipped(f"{t.profile.name} keeps no messages on disk")
    n = _count(name, o, t)
    extra = _persist_extra(t) if persistent else b""
    if producers == 1:
        dests = [f"/queue/bench.{o.runid}.{name}"]
        workers = [("producer", produce, (t, dests[0], n, o.body_size, o.window, o.limits,
                                          False, None, 0, extra))]
    else:
        dests = [f"/queue/bench.{o.runid}.{name}.{k}" for k in range(producers)]
        workers = [
            (f"producers{i}", produce_many, (t, g, max(1, n // producers), o.body_size, o.window, o.limits, extra))
            for i, g in enumerate(_split(dests, o.consumer_procs))
        ]
    disk0 = disk_kib(_data_dir(t)) if persistent else None
    t0, _, prods, cpu0, cpu1 = _flow(t, o, [], workers, probe)
    receipts = sum(p["receipts"] for p in prods)
    res: dict[str, Any] = {
        "unit": "receipts/s",
        "producers": producers,
        "window": prods[0]["window"],
        "persistent": persistent,
        "truncated": any(p["truncated"] for p in prods),
    }
    res = _finish(res, receipts, max(p["t_last"] for p in prods) - t0, cpu0, cpu1,
                  sum(p["cpu"] for p in prods), probe)
    if persistent:
        res.update(_durability(t, [d.split("/", 2)[2] for d in dests], disk0, receipts * o.body_size))
    return res


def persist_consume(t: Target, o: Options, probe: Probe) -> dict[str, Any]:
    """Consume with acks (the profile's ack mode, ``prefetch``) from a
    durable queue filled beforehand with persistent messages.

    The fill (10 producers with receipts, as persist-receipt-10, unmeasured)
    must end before the consumer subscribes (at the latest after
    max(``max_seconds``, 120 s): then what was receipted is consumed); then
    msgs/s at the consumer, each message acked. Keys: ``fill_seconds``, ``fill_rate``, ``prefetch``,
    ``ack``, ``rabbitmq_queue`` (as seen after the fill), ``disk_growth_kib``.
    """
    if not t.profile.durable:
        raise ScenarioSkipped(f"{t.profile.name} keeps no messages on disk")
    n = _count("persist-consume", o, t)
    dest = f"/queue/bench.{o.runid}.persist-consume"
    extra = _persist_extra(t)
    per = max(1, n // PRODUCERS_10)
    n = per * PRODUCERS_10
    fill_lim = replace(o.limits, max_seconds=max(o.limits.max_seconds, 120.0))
    fillers = [
        (f"filler{i}", produce_many, (t, g, per, o.body_size, o.window, fill_lim, extra))
        for i, g in enumerate(_split([dest] * PRODUCERS_10, o.consumer_procs))
    ]
    disk0 = disk_kib(_data_dir(t))
    f0, _, fills, _, _ = _flow(t, replace(o, limits=fill_lim), [], fillers, probe)
    filled = sum(p["receipts"] for p in fills)
    fill_s = max(p["t_last"] for p in fills) - f0
    if filled < n // 10:
        raise ScenarioError(f"fill: only {filled} of {n} receipted in {fill_s:.0f}s")
    # A slow broker's fill stops at its deadline: consume what it took.
    n = filled
    evidence = _durability(t, [dest.split("/", 2)[2]], disk0, filled * o.body_size)
    ack = t.profile.ack_mode
    t0, cons, _, cpu0, cpu1 = _flow(
        t, o, [("consumer", consume, (t, [dest], n, ack, o.prefetch, 0, o.limits, None, 0, True))], [], probe
    )
    c = cons[0]
    res: dict[str, Any] = {
        "unit": "msgs/s",
        "ack": ack,
        "prefetch": o.prefetch if t.profile.prefetch_headers else None,
        "fill_seconds": round(fill_s, 2),
        "fill_rate": round(filled / fill_s, 1) if fill_s > 0 else None,
        "truncated": c["truncated"],
        **evidence,
    }
    return _finish(res, sum(c["received"]), c["t_last"] - t0, cpu0, cpu1, c["cpu"], probe)


SCENARIOS: dict[str, Callable[[Target, Options, Probe], dict[str, Any]]] = {
    "queue-auto": lambda t, o, p: queue_flow(t, o, p, "queue-auto"),
    "queue-ack": lambda t, o, p: queue_flow(t, o, p, "queue-ack", ack=t.profile.ack_mode),
    "receipt": receipt,
    "fanout": fanout,
    "latency": latency,
    "idle": idle,
    "many-queues": many_queues,
    "tls": lambda t, o, p: queue_flow(t, o, p, "tls"),
    # follow-up scenarios
    "wildcard": wildcard,
    "big": lambda t, o, p: queue_flow(t, o, p, "big", body_size=o.big_size),
    "stalled": lambda t, o, p: fanout(t, o, p, stalled=1),
    # durable messages (QMQ with store = "log")
    "persist-receipt": lambda t, o, p: persist_receipt(t, o, p, 1),
    "persist-receipt-10": lambda t, o, p: persist_receipt(t, o, p, PRODUCERS_10),
    "receipt-10": lambda t, o, p: persist_receipt(t, o, p, PRODUCERS_10, persistent=False),
    "persist-consume": persist_consume,
}
CORE = ["queue-auto", "queue-ack", "receipt", "fanout", "latency", "tls", "idle", "many-queues"]
FOLLOW_UP = ["wildcard", "big", "stalled"]
#: The durable-message scenarios (QMQ runs them with store = "log").
PERSIST = ["persist-receipt", "persist-receipt-10", "receipt-10", "persist-consume"]


def run_one(name: str, t: Target, o: Options, pid: int | None = None) -> dict[str, Any]:
    """Run scenario ``name``; never raises for a broker failure (``error`` key instead)."""
    if pid is None:
        pid = pid_by_port(t.port)
    probe = Probe(pid)
    base: dict[str, Any] = {
        "scenario": name,
        "broker": t.profile.name,
        "host": t.host,
        "port": t.port,
        "tls": t.tls,
        "stomp": t.profile.version,
        "broker_pid": pid,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if name == "queue-ack" and t.profile.ack_note:
        base["note"] = t.profile.ack_note
    elif name in PERSIST:
        base["note"] = "SEND headers: " + ", ".join(f"{k}:{v}" for k, v in t.profile.persistent_headers)
    elif t.profile.notes:
        base["note"] = "; ".join(t.profile.notes)
    started = time.monotonic()
    try:
        if name == "tls" and not t.tls:
            if t.profile.tls_port is None:
                raise ScenarioSkipped(f"{t.profile.name}: no TLS listener in this setup (--tls-port)")
            t = replace(t, tls=True, port=t.profile.tls_port)
            base.update(tls=True, port=t.port)
        if name not in SCENARIOS:
            raise ScenarioError(f"unknown scenario {name!r}")
        if o.keep_awake:
            with KeepAwake() as spinners:
                probe.ignore = spinners.pids
                base["keep_awake"] = spinners.n
                base.update(SCENARIOS[name](t, o, probe))
        else:
            base.update(SCENARIOS[name](t, o, probe))
    except ScenarioSkipped as e:
        base["skipped"] = str(e)
    except (ScenarioError, StompError, OSError) as e:
        base["error"] = str(e)[:500]
    base["wall_s"] = round(time.monotonic() - started, 2)
    return base
