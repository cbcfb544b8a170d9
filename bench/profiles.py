"""Per-broker profiles: the few quirks that change how the load is driven.

A profile is plain data; the scenarios read it instead of testing broker
names. ``generic`` is the profile for an unknown STOMP 1.2 broker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Profile:
    """How to talk to one kind of broker."""

    name: str
    port: int = 61613
    login: str | None = None
    passcode: str | None = None
    vhost: str = "/"
    #: STOMP version sent in ``accept-version``.
    version: str = "1.2"
    #: SUBSCRIBE header(s) that carry the prefetch window; the value is filled in.
    prefetch_headers: tuple[str, ...] = ("prefetch-count",)
    #: Ack mode used by the queue-ack scenario.
    ack_mode: str = "client-individual"
    #: Note explaining a deviation of this broker in the queue-ack scenario.
    ack_note: str = ""
    #: Largest number of frames written before a RECEIPT must come back
    #: (None: stream freely, with TCP flow control only).
    max_unreceipted: int | None = None
    #: Bytes a batch of unreceipted frames may span (coilmq reads 4096 at a time).
    max_batch_bytes: int | None = None
    #: Concurrent connection attempts when opening many connections.
    connect_concurrency: int = 200
    #: Multiplier of the default counts of the throughput scenarios (a fast
    #: broker needs more messages for a phase of a few seconds).
    count_scale: float = 1.0
    #: Cap on the many-queues count for brokers that create queues slowly.
    many_queues_cap: int | None = None
    #: Cap on the wildcard scenario's subscriptions (slow subscribe paths).
    wildcard_cap: int | None = None
    #: Topic wildcard subscription that matches nothing published by the
    #: scenarios, ``{i}`` is a number; None if the broker has no wildcards.
    wildcard_pattern: str | None = "/topic/nomatch.{i}.*"
    #: TLS port, if the broker has a TLS listener in its benchmark setup.
    tls_port: int | None = None
    #: Extra notes copied into every result.
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Whether the broker can keep messages on disk (the persist-* scenarios).
    durable: bool = True
    #: SEND headers of the persist-* scenarios: a persistent message to a
    #: durable queue.
    persistent_headers: tuple[tuple[str, str], ...] = (("persistent", "true"),)
    #: Where the broker keeps its data (``$QMQ_BENCH_RUN`` expanded; the
    #: persist-* scenarios report its growth as evidence that messages
    #: reached the disk). None: not reported.
    data_dir: str | None = None
    #: RabbitMQ's management HTTP API (login and passcode as above), asked
    #: whether the persist-* queues are durable and hold persistent messages.
    http_api: str | None = None

    def as_dict(self) -> dict[str, object]:
        """Return the profile as a JSON-friendly dict."""
        return asdict(self)

    def with_overrides(self, **kw: object) -> Profile:
        """Return a copy with the non-None keyword values replaced."""
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


PROFILES: dict[str, Profile] = {
    "generic": Profile(name="generic"),
    "qmq": Profile(
        name="qmq",
        port=61613,
        # QMQ accepts all three spellings; send them all so any build is covered.
        prefetch_headers=("prefetch-count", "activemq.prefetchSize", "prefetch"),
        count_scale=4.0,
        wildcard_pattern="/topic/nomatch.{i}.*",
        tls_port=61614,
    ),
    "rabbitmq": Profile(
        name="rabbitmq",
        port=61633,
        login="guest",
        passcode="guest",
        prefetch_headers=("prefetch-count",),
        # RabbitMQ creates a durable queue per /queue/ destination: ~350/s.
        many_queues_cap=10_000,
        # Each STOMP topic subscription is a queue plus a binding: as slow as above.
        wildcard_cap=10_000,
        # /topic/ destinations route on the amq.topic exchange: '.' words, '*' and '#'.
        wildcard_pattern="/topic/nomatch.{i}.*",
        notes=("/queue/ destinations declare durable queues; bodies are non-persistent",),
        # /queue/ declares a durable queue anyway; say so, as a client keeping
        # messages would (the persist-* scenarios also check it over HTTP).
        persistent_headers=(("persistent", "true"), ("durable", "true"), ("auto-delete", "false")),
        data_dir="$QMQ_BENCH_RUN/rabbitmq/mnesia",
        http_api="http://127.0.0.1:15682",
    ),
    "activemq": Profile(
        name="activemq",
        port=61623,
        prefetch_headers=("activemq.prefetchSize",),
        wildcard_pattern="/topic/nomatch.{i}.*",
        notes=("messages non-persistent (no persistent:true header)",),
        # KahaDB journal (enableJournalDiskSyncs: true by default).
        data_dir="$QMQ_BENCH_RUN/activemq/data",
    ),
    "coilmq": Profile(
        name="coilmq",
        port=61643,
        version="1.1",
        prefetch_headers=(),
        ack_mode="client",
        ack_note="coilmq supports only ack:client with one unacked message per subscriber",
        max_unreceipted=20,
        max_batch_bytes=3500,
        connect_concurrency=4,
        wildcard_pattern=None,
        notes=("STOMP 1.1, memory store, <= 20 unreceipted frames in flight",),
        durable=False,
    ),
}


def get_profile(name: str) -> Profile:
    """Return the named profile (``generic`` settings for unknown names)."""
    if name in PROFILES:
        return PROFILES[name]
    return replace(PROFILES["generic"], name=name)
