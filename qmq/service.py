# -*- test-case-name: tests.test_service,tests.test_tap -*-
"""The broker as a Twisted service: settings in, a running broker out.

L{make_service} turns L{Settings} into a L{BrokerService} (a
L{MultiService}):

    1. It builds the message store that C{settings.store} names, from
       L{STORES} (C{"memory"}, or C{"log"}: the commit log in
       C{DATA_DIR/log}, made here if missing, with the C{[commit_log]}
       settings), and the L{Broker} on the given reactor with that store and
       the C{[limits]} settings (topic limits, the budget for unfinished
       frames).
    2. It applies the configuration's declarations: virtual hosts (each with
       its C{queue_defaults}, the policy of queues clients create by naming
       them), then in each its exchanges, queues and bindings, in the order
       written; durable ones reach the store as they are declared.  A
       declaration the core refuses (a L{BrokerError}) becomes a
       L{ConfigError} that names the file and key it came from.
    3. Only then does it call L{Broker.recover}: what the store kept comes
       back into the declared topology (the configuration's declarations
       win; see L{Broker.recover}).  A store that cannot be read (a file it
       cannot open, a newer format) is a L{ConfigError} naming C{store}.
       When recovery brought anything back, one log line counts it and
       L{freeze_gc} takes every object alive then out of the cyclic
       collector's sight: a million recovered messages would otherwise be
       walked again at every full collection.
    4. It builds the broker-wide L{MemoryAlarm} from
       C{limits.memory_high_watermark} and gives it to the broker (when the
       mark is not 0), where every session's publisher flow control and the
       C{/control/memory} destination find it.
    5. It builds the L{qmq.auth.Authenticator} from the users, the virtual
       hosts' permissions and token keys (L{build_authenticator}) and gives
       it to the broker (C{broker.auth}) when any is configured; without
       them every client is anonymous.
    6. For each C{PROTOCOL:ENDPOINT} listen spec it builds that protocol's
       factory from L{PROTOCOLS} and an endpoint with Twisted's
       C{serverFromString}, and adds a L{Listener} child service.  Every
       mistake (unknown protocol, bad endpoint string, missing TLS file) is
       found here, before anything listens; so is a listener on a
       non-loopback interface that clients would reach without
       authentication (authentication off, or C{auth.anonymous}), which is
       refused unless C{auth.allow_unauthenticated_remote} is true.

Starting the service creates the data directory and binds the listeners (in
C{privilegedStartService}, so C{twistd --uid} can bind low ports first), one
log line per listener with its address, and then starts the memory alarm's
sampling (the alarm logs its marks, and every time it is raised or cleared).

Every listener's factory shares the service's one
L{qmq.connections.ConnectionRegistry}: it caps the connections per listener
and per client address (the C{[connections]} settings) and knows every open
connection, whatever protocol it speaks.

Stopping it (twistd does so on SIGTERM and SIGINT) is graceful and ordered:

    1. the listeners stop: no new connections are accepted;
    2. only then is the registry's C{shutdown()} called, once, which tells
       every client of every listener that the broker is going away (STOMP:
       an ERROR frame) and closes it; it is awaited, up to
       C{shutdown_timeout} seconds, after which the stragglers are aborted;
    3. the memory alarm stops sampling (stopping a raised alarm clears it,
       which would let blocked publishers go on: so not before their
       connections are closed);
    4. the broker closes its store (L{Broker.close}), which a disk store
       uses to write and sync what is pending; it is awaited, and a failure
       is logged as one line, not a traceback.

L{MultiService} alone would stop its children in reverse order without
waiting for one before the next, so L{BrokerService.stopService} sequences
the steps itself.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq.cluster.settings import node_id
from qmq.config import ConfigError, Settings
from qmq.connections import ConnectionRegistry
from qmq.core import alarm as _alarm
from qmq.core.alarm import DiskAlarm, MemoryAlarm, parse_memory_mark, total_memory
from qmq.core.broker import Broker
from qmq.core.errors import BrokerError
from qmq.core.limits import LimitSettings
from qmq.core.store import MessageStore
from qmq.logs import peer_address
from qmq.store.memory import MemoryStore
from qmq.store.segment import UnsupportedVersion
from qmq.twisted_internals import endpoint_interface

__all__ = [
    "PROTOCOLS",
    "STORES",
    "BrokerService",
    "Listener",
    "StartupError",
    "build_authenticator",
    "build_memory_alarm",
    "build_store",
    "freeze_gc",
    "make_service",
]

log = Logger()

#: A protocol's factory builder: (broker, settings, clock, registry,
#: listener name) -> factory.  The factory asks the registry to admit each
#: new connection under the listener's name, adds the connections it makes
#: and removes them once lost (see L{qmq.connections}).
FactoryBuilder = Callable[[Broker, Settings, Any, ConnectionRegistry, str], Factory]


def _stomp_factory(
    broker: Broker, settings: Settings, clock: Any, registry: ConnectionRegistry, listener: str
) -> Factory:
    from qmq.stomp.protocol import StompFactory  # noqa: PLC0415

    return StompFactory(broker, settings.stomp, clock=clock, registry=registry, listener=listener)


def _http_factory(
    broker: Broker, settings: Settings, clock: Any, registry: ConnectionRegistry, listener: str
) -> Factory:
    from qmq.web.site import HttpFactory, WebContext  # noqa: PLC0415

    return HttpFactory(WebContext(broker, clock, settings, registry, listener))


def _peer_factory(
    broker: Broker, settings: Settings, clock: Any, registry: ConnectionRegistry, listener: str
) -> Factory:
    from qmq.cluster.mesh import LinkFactory, mesh_of  # noqa: PLC0415

    return LinkFactory(mesh_of(broker, settings, clock), registry, listener)


def _amqp_factory(
    broker: Broker, settings: Settings, clock: Any, registry: ConnectionRegistry, listener: str
) -> Factory:
    from qmq.amqp.protocol import AmqpFactory  # noqa: PLC0415

    return AmqpFactory(broker, settings.section("amqp"), clock=clock, registry=registry, listener=listener)


#: The wire protocols a listen spec may name, by the C{PROTOCOL} part.
#: C{http} is the web site (STOMP over WebSocket, the browser client, and
#: whatever else L{qmq.web.site.MOUNTS} holds); C{peer} takes links from
#: the other nodes of a mesh (L{qmq.cluster}); C{amqp} is AMQP 0-9-1
#: (L{qmq.amqp}).
PROTOCOLS: dict[str, FactoryBuilder] = {
    "stomp": _stomp_factory,
    "http": _http_factory,
    "peer": _peer_factory,
    "amqp": _amqp_factory,
}


def _peer_endpoint(reactor: Any, description: str, settings: Settings) -> IStreamServerEndpoint:
    from qmq.cluster.endpoints import server_endpoint  # noqa: PLC0415

    return server_endpoint(reactor, description, settings.section("cluster"))


#: Protocols whose listeners build their endpoint themselves from what
#: follows C{PROTOCOL:} (and the settings), instead of C{serverFromString}:
#: C{peer:ssl:PORT} takes its certificates from C{[cluster]}.
ENDPOINTS: dict[str, Callable[[Any, str, Settings], IStreamServerEndpoint]] = {
    "peer": _peer_endpoint,
}

#: A message store's builder: (settings, reactor) -> the store the broker
#: is given.  It runs in L{make_service}, before the service starts (so
#: before the service creates C{data_dir}): a store that keeps files makes
#: its own directory under C{settings.data_dir}.  L{Broker.recover} is
#: called right after the configuration's declarations, still in
#: L{make_service}.
StoreBuilder = Callable[[Settings, Any], MessageStore]

#: The commit log's directory, in C{data_dir}.
LOG_DIRECTORY = "log"


def _memory_store(settings: Settings, reactor: Any) -> MessageStore:
    return MemoryStore()


def _log_store(settings: Settings, reactor: Any) -> MessageStore:
    from qmq.store.log import CommitLogStore  # noqa: PLC0415

    directory = Path(settings.data_dir) / LOG_DIRECTORY
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            "",
            "data_dir",
            f"cannot create the commit-log directory {str(directory)!r}: {e.strerror or e}",
        ) from None
    options = settings.commit_log
    return CommitLogStore(
        str(directory),
        fsync=options.fsync,
        interval_ms=options.fsync_interval_ms,
        segment_size=options.segment_size,
        compact_ratio=options.compact_ratio,
        backlog_memory=options.backlog_memory,
        reactor=reactor,
    )


#: The message stores that C{settings.store} may name.  A store is one line
#: here (and its name in L{qmq.config.STORES}, which checks the key).
STORES: dict[str, StoreBuilder] = {
    "memory": _memory_store,
    "log": _log_store,
}


def build_store(settings: Settings, reactor: Any = None) -> MessageStore:
    """
    Build the message store that C{settings.store} names.

    @param settings: the settings.
    @param reactor: the reactor the store's timers and threads report to;
        the global one if L{None}.
    @return: a new store (not yet recovered).
    @raise ConfigError: no store has that name (settings made by hand; a
        loaded configuration is checked against L{qmq.config.STORES}), or
        the store's directory cannot be made (naming C{data_dir}).
    """
    builder = STORES.get(settings.store)
    if builder is None:
        known = ", ".join(sorted(STORES))
        raise ConfigError(
            "", "store", f"unknown message store {settings.store!r} (expected one of: {known})"
        )
    if reactor is None:
        from twisted.internet import reactor  # noqa: PLC0415
    return builder(settings, reactor)


def build_memory_alarm(
    limits: LimitSettings,
    clock: Any,
    read_rss: Callable[[], int] | None = None,
    total: int | None = None,
) -> MemoryAlarm:
    """
    Build the broker-wide memory alarm from the C{[limits]} settings.

    The mark (C{limits.memory_high_watermark}) is turned into bytes with
    L{parse_memory_mark} against L{total_memory} (RAM, or the cgroup limit
    when smaller); the low-water mark is the alarm's default, 90% of it.  A
    mark of 0 makes a disabled alarm (L{MemoryAlarm.enabled} is false).

    @param limits: the broker-wide limits.
    @param clock: the reactor the alarm samples on.
    @param read_rss: returns the process's RSS in bytes; the real one
        (L{qmq.core.alarm.current_rss}) if None.
    @param total: the memory a fraction refers to, in bytes; L{total_memory}
        if None.
    @return: the alarm, not started.
    @raise ConfigError: the mark cannot be used (naming
        C{limits.memory_high_watermark}).
    """
    if total is None:
        try:
            total = total_memory()
        except OSError:
            total = 0  # a fraction is then refused, with the alarm's reason
    try:
        high = parse_memory_mark(limits.memory_high_watermark, total)
    except ValueError as e:
        raise ConfigError("", "limits.memory_high_watermark", str(e)) from None
    return MemoryAlarm(
        clock, high, read_rss=read_rss if read_rss is not None else _alarm.current_rss
    )


def build_disk_alarm(
    limits: LimitSettings, store: Any, clock: Any, statvfs: Callable[[str], Any] | None = None
) -> DiskAlarm | None:
    """
    Build the disk free-space alarm for a store that keeps files (one with
    a C{directory}: the commit log), from C{limits.disk_free_limit}; None
    for a store that keeps nothing on disk or a limit of 0.

    @param statvfs: how the filesystem is sampled; C{os.statvfs} if None.
    @return: the alarm, not started, or None.
    """
    directory = getattr(store, "directory", None)
    if directory is None:
        return None
    kwargs = {"statvfs": statvfs} if statvfs is not None else {}
    alarm = DiskAlarm(clock, str(directory), limits.disk_free_limit, **kwargs)
    return alarm if alarm.enabled else None


def build_authenticator(settings: Settings, clock: Any) -> Any:
    """
    Build the broker's authenticator from the users, the virtual hosts'
    permissions and token keys, and the C{[auth]} section.

    @return: a L{qmq.auth.Authenticator}, or None when no user and no token
        key is configured (authentication off: every client anonymous).
    """
    from qmq.auth import Authenticator  # noqa: PLC0415

    auth = Authenticator(
        settings.auth,
        clock,
        users=settings.users,
        permissions={v.name: v.permissions for v in settings.vhosts},
        tokens={v.name: v.tokens for v in settings.vhosts if v.tokens is not None},
    )
    return auth if auth.enabled else None


def is_loopback(interface: str | None) -> bool:
    """Whether a listener on C{interface} (None: a unix socket) is reachable
    from this machine only."""
    if interface is None:
        return True
    if interface == "localhost":
        return True
    try:
        return ipaddress.ip_address(interface.split("%")[0]).is_loopback
    except ValueError:
        return False


#: The protocols whose every client is authenticated when authentication is
#: on (C{broker.auth}): STOMP at CONNECT; C{http}: STOMP over WebSocket and
#: SockJS at CONNECT, the HTTP API on every request (Basic or bearer);
#: C{amqp} at connection.open (PLAIN, AMQPLAIN, EXTERNAL).  A
#: listener of another protocol counts as unauthenticated.
AUTHENTICATING_PROTOCOLS = frozenset({"stomp", "http", "amqp"})


def _check_exposure(
    settings: Settings,
    auth: Any,
    protocol: str,
    endpoint: Any,
    spec: str,
    source: str,
    key: str,
) -> None:
    """Refuse a listener that anyone on the network reaches without
    authentication, unless C{auth.allow_unauthenticated_remote}."""
    if settings.auth.allow_unauthenticated_remote:
        return
    if spec.startswith("peer:ssl:"):
        return  # mutual TLS: the peer's certificate is its authentication
    if auth is not None and not settings.auth.anonymous and protocol in AUTHENTICATING_PROTOCOLS:
        return
    interface = endpoint_interface(endpoint)
    if is_loopback(interface):
        return
    where = f"interface {interface}" if interface else "every interface"
    if auth is None:
        why = "authentication is off (no [users] and no [vhosts.NAME.tokens])"
    elif settings.auth.anonymous:
        why = "auth.anonymous = true lets clients in without credentials"
    else:
        why = f"{protocol} listeners do not authenticate every client yet"
    raise ConfigError(
        source,
        key,
        f"{spec!r} listens on {where}, not only on loopback, and {why}: configure users "
        "(docs/security.rst), listen on 127.0.0.1, or set "
        "auth.allow_unauthenticated_remote = true to accept unauthenticated clients "
        "from the network",
    )


class StartupError(Exception):
    """
    The broker cannot start: a port cannot be bound, the data directory
    cannot be made.  The message says which and why.
    """


class Listener(Service):
    """
    One listening endpoint serving one protocol's factory.

    @ivar protocol: the protocol's name (C{"stomp"}).
    @ivar spec: the listen spec it was made from.
    @ivar endpoint: the endpoint it listens on.
    @ivar factory: the protocol factory.
    @ivar port: the listening port while listening, else L{None}.
    """

    def __init__(
        self, protocol: str, spec: str, endpoint: IStreamServerEndpoint, factory: Factory
    ) -> None:
        self.protocol = protocol
        self.spec = spec
        self.endpoint = endpoint
        self.factory = factory
        self.port: IListeningPort | None = None
        self._listening: defer.Deferred[IListeningPort] | None = None

    def privilegedStartService(self) -> None:
        """
        Start listening (before twistd drops privileges).

        @raise StartupError: if the endpoint fails at once (address in use,
            permission denied).
        """
        failures: list[Failure] = []
        starting = [True]

        def failed(failure: Failure) -> None:
            if starting[0]:
                failures.append(failure)
            else:
                self._failed(failure)

        self._listening = self.endpoint.listen(self.factory)
        self._listening.addCallbacks(self._listened, failed)
        starting[0] = False
        if failures:
            self._listening = None
            raise StartupError(f"cannot listen on {self.spec}: {failures[0].getErrorMessage()}")

    def _listened(self, port: IListeningPort) -> IListeningPort:
        self.port = port
        log.info(
            "{protocol} listening on {address} ({spec})",
            protocol=self.protocol.upper(),
            address=peer_address(port.getHost()),
            spec=self.spec,
        )
        return port

    def _failed(self, failure: Failure) -> None:
        if failure.check(defer.CancelledError):
            return
        log.failure("cannot listen on {spec}", failure, spec=self.spec)

    def startService(self) -> None:
        if self._listening is None:
            self.privilegedStartService()
        super().startService()

    def stopService(self) -> defer.Deferred[None]:
        """
        Stop accepting connections; established ones stay.

        @return: a Deferred that fires once the port is closed.
        """
        super().stopService()
        listening, self._listening = self._listening, None
        port, self.port = self.port, None
        if port is not None:
            return defer.maybeDeferred(port.stopListening)
        if listening is not None:
            listening.cancel()
        return defer.succeed(None)


class BrokerService(MultiService):
    """
    The broker with its listeners, as one service.

    @ivar broker: the broker.
    @ivar settings: the settings it was built from.
    @ivar listeners: the L{Listener}s, in the order of C{settings.listen}.
    @ivar clock: the reactor it runs on.
    @ivar connections: the registry every listener's connections are in.
    @ivar memory_alarm: the memory alarm started and stopped with the
        service (possibly disabled), or None.
    @ivar disk_alarm: the disk free-space alarm started and stopped with
        the service, or None.
    """

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        clock: Any,
        connections: ConnectionRegistry | None = None,
        memory_alarm: MemoryAlarm | None = None,
        disk_alarm: DiskAlarm | None = None,
    ) -> None:
        super().__init__()
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.connections = (
            connections
            if connections is not None
            else ConnectionRegistry(settings.connections, clock)
        )
        self.memory_alarm = memory_alarm
        self.disk_alarm = disk_alarm
        self.listeners: list[Listener] = []
        self._prepared = False

    def add_listener(self, listener: Listener) -> None:
        """
        Add a listener; it starts and stops with the broker.
        """
        self.listeners.append(listener)
        listener.setServiceParent(self)

    def privilegedStartService(self) -> None:
        """
        Create the data directory and bind the listeners.

        @raise StartupError: if either fails.
        """
        self._prepare()
        super().privilegedStartService()

    def startService(self) -> None:
        """
        Start (and prepare, if twistd has not called
        L{privilegedStartService}).

        @raise StartupError: if the data directory cannot be made or a
            listener cannot bind.
        """
        self._prepare()
        super().startService()
        if self.memory_alarm is not None:
            self.memory_alarm.start()
        if self.disk_alarm is not None:
            self.disk_alarm.start()

    def _prepare(self) -> None:
        if self._prepared:
            return
        self._prepared = True
        tune_gc()
        data_dir = Path(self.settings.data_dir)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StartupError(
                f"cannot create the data directory {str(data_dir)!r}: {e.strerror or e}"
            ) from None
        log.info(
            "QMQ starting: data directory {data_dir}, {count} listener(s), {store} store",
            data_dir=str(data_dir.resolve()),
            count=len(self.listeners),
            store=self.settings.store,
        )

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """
        Stop gracefully: stop accepting, then close every client with an
        ERROR frame, then stop the memory alarm, then close the store.

        @return: a Deferred that fires once all is closed (the connections
            at most C{shutdown_timeout} seconds after the listeners are
            closed; then the store).
        """
        log.info("QMQ stopping: no longer accepting connections")
        self._prepared = False
        yield super().stopService()
        try:
            yield self.connections.shutdown(
                "broker shutting down", timeout=self.settings.shutdown_timeout
            )
        except Exception:
            log.failure("while closing connections")
        if self.memory_alarm is not None:
            self.memory_alarm.stop()
        if self.disk_alarm is not None:
            self.disk_alarm.stop()
        try:
            yield defer.maybeDeferred(self.broker.close)
        except Exception as e:
            # A store's failure to close is news for the operator, not a
            # traceback: say what failed.
            log.error(
                "QMQ could not close the {store} store: {error}",
                store=self.settings.store,
                error=str(e) or type(e).__name__,
            )
        log.info("QMQ stopped")


def _node(settings: Settings) -> str:
    """
    This node's id (L{qmq.cluster.settings.node_id}): C{[cluster] node}, or
    the one kept in the data directory (made there on the first start).

    A data directory that cannot be made is reported when the service
    starts (L{BrokerService}): until then a random id stands in.

    @raise ConfigError: the data directory's C{node-id} file is not one.
    """
    try:
        return node_id(settings.section("cluster"), Path(settings.data_dir))
    except ValueError as e:
        raise ConfigError("", "data_dir", str(e)) from None
    except OSError as e:
        log.warn(
            "QMQ cannot keep a node id in {data_dir}: {error}",
            data_dir=str(settings.data_dir),
            error=e.strerror or str(e),
        )
        return f"qmq-{secrets.token_hex(4)}"


def _declare(broker: Broker, settings: Settings) -> None:
    """Apply the configuration's declarations to the broker, in order."""
    for vhost_settings in settings.vhosts:
        vhost = broker.add_vhost(vhost_settings.name)
        vhost.allow_create = vhost_settings.allow_create
        vhost.fsync = vhost_settings.fsync
        try:
            vhost.set_queue_defaults(vhost_settings.queue_defaults)
        except BrokerError as e:
            raise ConfigError(
                "", f"vhosts.{json.dumps(vhost_settings.name)}.queue_defaults", e.message
            ) from None
        origin = ""
        try:
            for ex in vhost_settings.exchanges:
                origin = ex.origin
                vhost.declare_exchange(
                    ex.name, ex.type, durable=ex.durable, auto_delete=ex.auto_delete
                )
            for q in vhost_settings.queues:
                origin = q.origin
                vhost.declare_queue(
                    q.name,
                    durable=q.durable,
                    auto_delete=q.auto_delete,
                    arguments=dict(q.arguments) or None,
                )
            for b in vhost_settings.bindings:
                origin = b.origin
                vhost.bind(b.queue, b.exchange, b.routing_key, dict(b.arguments) or None)
        except BrokerError as e:
            raise ConfigError(origin, "", e.message) from None


GC_GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """
    Make the cyclic garbage collector run less often.

    A broker holds many long-lived objects (a queue, a subscription, a
    message are each a few) and makes few reference cycles; with Python's
    default threshold (700 allocations) the collector keeps re-walking them,
    which cost a quarter of the throughput with 200,000 queues held (see
    docs/benchmarks.rst).  Reference counting frees nearly everything anyway.
    """
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, gen0), gen1, gen2)


def freeze_gc() -> None:
    """
    Move every object alive now out of the cyclic collector's sight
    (C{gc.freeze()}).

    Called once, after a recovery that brought something back: recovered
    queues and messages live until consumed, hold no cycles to break, and a
    million of them made each full collection walk a million objects for
    nothing.  Frozen objects are still freed by reference counting when
    their last reference goes; only a cycle among them would be kept.
    """
    gc.freeze()


def _recover(broker: Broker, settings: Settings) -> bool:
    """
    Call L{Broker.recover} and say whether the store brought anything back
    (a message, a queue, an exchange or a virtual host the configuration
    had not made), logging what it did.
    """

    def counts() -> tuple[int, int, int]:
        vhosts = broker.vhosts.values()
        return (
            len(broker.vhosts),
            sum(len(v.queues) for v in vhosts),
            sum(len(v.exchanges) for v in vhosts),
        )

    before = counts()
    started, cpu = time.monotonic(), time.process_time()
    try:
        broker.recover()
    except BrokerError as e:
        raise ConfigError(
            "",
            "store",
            f"what the {settings.store!r} store kept contradicts the configuration: {e.message}",
        ) from None
    after = counts()
    messages = sum(len(q) for v in broker.vhosts.values() for q in v.queues.values())
    if after == before and not messages:
        return False
    log.info(
        "QMQ recovered {messages} message(s), and {queues} queue(s) and {exchanges}"
        " exchange(s) besides the configuration's, from the {store} store",
        messages=messages,
        queues=after[1] - before[1],
        exchanges=after[2] - before[2],
        store=settings.store,
    )
    log.info(
        "QMQ recovery took {seconds:.3f} s ({cpu:.3f} s of CPU); {listeners} listener(s) "
        "bind next",
        seconds=time.monotonic() - started,
        cpu=time.process_time() - cpu,
        listeners=len(settings.listen),
    )
    return True


def make_service(settings: Settings, reactor: Any = None, listen_reactor: Any = None) -> BrokerService:
    """
    Build the broker and its listeners from settings.

    Nothing listens until the service is started.

    @param settings: the settings (from L{qmq.config.load}).
    @param reactor: the reactor to run on; the global one if L{None}.
    @param listen_reactor: the reactor the listeners' endpoints are built
        on (a worker's L{qmq.workers.sharing.ReusePortReactor}); C{reactor}
        if L{None}.
    @return: the service; start it (or give it to twistd) to run the broker.
    @raise ConfigError: for a declaration the core refuses, an unknown
        protocol or an endpoint string that cannot be used (the message names
        the file, or C{--listen}, and the key), an unknown store, a stored
        topology that contradicts the declarations, a store that cannot be
        made or read, or a memory mark that cannot be used on this machine.
    """
    if reactor is None:
        from twisted.internet import reactor  # noqa: PLC0415
    source = settings.listen_source
    on = listen_reactor if listen_reactor is not None else reactor
    endpoints = []
    # Listeners first: a mistake there is found before the store is opened
    # (opening the commit log reads every segment).
    for index, spec in enumerate(settings.listen):
        key = f"listen[{index}]" if source != "--listen" else ""
        protocol, _, description = spec.partition(":")
        if protocol not in PROTOCOLS:
            known = ", ".join(sorted(PROTOCOLS))
            raise ConfigError(
                source, key, f"unknown protocol {protocol!r} in {spec!r} (expected one of: {known})"
            )
        try:
            build = ENDPOINTS.get(protocol)
            endpoints.append(
                build(on, description, settings)
                if build is not None
                else serverFromString(on, description)
            )
        except Exception as e:
            raise ConfigError(source, key, f"cannot use endpoint {description!r}: {e}") from None
    store = build_store(settings, reactor)
    broker = Broker(clock=reactor, store=store, limits=settings.limits, node=_node(settings))
    try:
        # A durable declaration may be the store's first use, which reads
        # what it kept: its errors can come from either step.
        _declare(broker, settings)
        recovered = _recover(broker, settings)
    except (OSError, UnsupportedVersion) as e:
        raise ConfigError("", "store", f"the {settings.store!r} store cannot start: {e}") from None
    if recovered:
        freeze_gc()
    alarm = build_memory_alarm(settings.limits, reactor)
    broker.memory_alarm = alarm if alarm.enabled else None
    broker.auth = build_authenticator(settings, reactor)
    disk_alarm = build_disk_alarm(settings.limits, broker.store, reactor)
    broker.disk_alarm = disk_alarm
    service = BrokerService(broker, settings, reactor, memory_alarm=alarm, disk_alarm=disk_alarm)
    broker.listeners = service.listeners
    names: set[str] = set()
    exposure: list[tuple[str, Any, str, str]] = []
    for index, (spec, endpoint) in enumerate(zip(settings.listen, endpoints, strict=True)):
        key = f"listen[{index}]" if source != "--listen" else ""
        protocol = spec.partition(":")[0]
        builder = PROTOCOLS[protocol]
        exposure.append((protocol, endpoint, spec, key))
        # The spec names the listener in the registry's caps and logs; the
        # same spec twice (port 0) still makes two listeners with two caps.
        name = spec if spec not in names else f"{spec} #{index}"
        names.add(name)
        factory = builder(broker, settings, reactor, service.connections, name)
        service.add_listener(Listener(protocol, spec, endpoint, factory))
    for protocol, endpoint, spec, key in exposure:
        _check_exposure(settings, broker.auth, protocol, endpoint, spec, source, key)
    from qmq.cluster.service import attach_mesh  # noqa: PLC0415

    attach_mesh(service, broker, settings, reactor)
    return service
