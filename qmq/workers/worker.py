# -*- test-case-name: tests.test_workers -*-
"""One worker: a broker that is one node of its host's mesh of workers.

The supervisor (L{qmq.workers.supervisor}) starts each worker as
C{twistd -n qmq ... --worker INDEX:COUNT:DIR}. What makes a worker differ
from a broker on its own, in the order L{qmq.tap} applies it:

    1. L{worker_settings}: its own data directory (worker 0 keeps the data
       directory itself, worker I>0 has C{DATA/wI}: one commit log each,
       recovered by its own worker) and its own node id
       (L{worker_node}: C{wI}, or C{NODE-wI} when C{[cluster] node} names
       the host).
    2. Its listeners are built with L{qmq.workers.sharing.ReusePortReactor}:
       every worker binds the same ports, and the kernel spreads the
       connections.
    3. L{attach_worker} makes it a mesh node (L{qmq.cluster.mesh}, the
       same links as between hosts, plaintext over unix sockets in the
       supervisor's private directory C{DIR}, mode 0700): it listens on
       C{DIR/wI.sock} and dials every worker with a higher index, so each
       pair has one dialer and the mesh's tie-break never has to choose.
       Topics and exchanges fan out across workers exactly once, as across
       hosts (docs/cluster.rst); each queue's home is one of the N workers
       (the mesh's rendezvous placement over C{w0} to C{wN-1}, whatever is
       linked now), reached from the others through the links; messages
       of a queue whose home moved (another N) are sent on to it
       (L{qmq.workers.drain}).
    4. L{WorkerAgent} talks to the supervisor over two pipes: it writes
       C{ready} on file descriptor L{READY_FD} once its listeners are bound,
       and stops the worker when L{LIFELINE_FD} reaches its end (the
       supervisor is gone, even by SIGKILL: no worker outlives it holding
       the ports).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import Logger
from zope.interface import implementer

from qmq.config import ConfigError, Settings
from qmq.core.alarm import MIN_MARK, parse_memory_mark, total_memory

__all__ = [
    "LIFELINE_FD",
    "READY_FD",
    "WorkerAgent",
    "WorkerRole",
    "attach_worker",
    "link_path",
    "parse_role",
    "site_socket",
    "worker_data_dir",
    "worker_node",
    "worker_settings",
]

log = Logger()

#: The pipe the supervisor holds open while it lives (the worker reads).
LIFELINE_FD = 3
#: The pipe the worker says C{ready} on (the supervisor reads).
READY_FD = 4


@dataclass(frozen=True)
class WorkerRole:
    """Which worker this process is.

    @ivar index: 0 to C{count - 1}.
    @ivar count: how many workers the supervisor runs.
    @ivar directory: the supervisor's private directory of link sockets.
    """

    index: int
    count: int
    directory: str


def parse_role(text: str) -> WorkerRole:
    """C{INDEX:COUNT:DIR}, as the supervisor writes it.

    @raise ValueError: it is not that.
    """
    index, _, rest = text.partition(":")
    count, _, directory = rest.partition(":")
    try:
        role = WorkerRole(int(index), int(count), directory)
    except ValueError:
        raise ValueError(f"expected INDEX:COUNT:DIR, got {text!r}") from None
    if not 0 <= role.index < role.count or not directory:
        raise ValueError(f"expected INDEX:COUNT:DIR with 0 <= INDEX < COUNT, got {text!r}")
    return role


def worker_node(base: str, index: int) -> str:
    """The node id of worker C{index}: C{wI}, or C{BASE-wI}."""
    return f"{base}-w{index}" if base else f"w{index}"


def worker_data_dir(data_dir: Path, index: int) -> Path:
    """Worker 0 keeps the data directory (so one broker and worker 0 of
    many share their commit log); worker I>0 has C{DATA/wI}."""
    return Path(data_dir) if index == 0 else Path(data_dir) / f"w{index}"


def link_path(directory: str, index: int) -> str:
    """Where worker C{index} takes links from the others."""
    return os.path.join(directory, f"w{index}.sock")


def site_socket(directory: str, index: int) -> str:
    """Where worker C{index} serves its own site (its metrics) to the others."""
    return os.path.join(directory, f"w{index}.http")


def worker_settings(settings: Settings, role: WorkerRole, total: int | None = None) -> Settings:
    """The settings of worker C{role.index}: its data directory, its node
    id, its C{peer:} ports and C{advertise} (each plus the index: other
    hosts link to every worker), and its share of the memory high-water
    mark (the mark is the whole broker's: each of N workers holds back its
    publishers at 1/N of it).

    @param total: the memory a fractional mark refers to (L{total_memory}
        if None).
    @raise ConfigError: C{[cluster] node} is too long to name the workers.
    """
    cluster = settings.section("cluster")
    node = worker_node(cluster.node, role.index)
    if len(node) > 32:
        raise ConfigError(
            "", "cluster.node", f"{cluster.node!r} is too long to name workers ({node!r}: at most 32)"
        )
    advertise = cluster.advertise
    listen = list(settings.listen)
    if role.index:
        # Links from other hosts: worker I listens on each peer: port plus
        # I (a port each: another host links to every worker), and says so.
        from qmq.cluster.endpoints import shift_port  # noqa: PLC0415

        if advertise:
            try:
                advertise = shift_port(advertise, role.index, 1)
            except ValueError as e:
                raise ConfigError("", "cluster.advertise", str(e)) from None
        for i, spec in enumerate(listen):
            if spec.startswith("peer:"):
                try:
                    listen[i] = "peer:" + shift_port(spec[len("peer:"):], role.index, 0)
                except ValueError as e:
                    raise ConfigError(settings.listen_source, f"listen[{i}]", str(e)) from None
    others = {**settings.other_sections, "cluster": dataclasses.replace(cluster, node=node, advertise=advertise)}
    limits = settings.limits
    try:
        mark = parse_memory_mark(limits.memory_high_watermark, total_memory() if total is None else total)
    except (ValueError, OSError):
        mark = 0  # the worker's own alarm reports a mark it cannot use
    if mark:
        limits = dataclasses.replace(limits, memory_high_watermark=max(MIN_MARK, mark // role.count))
    return dataclasses.replace(
        settings,
        data_dir=worker_data_dir(settings.data_dir, role.index),
        listen=type(settings.listen)(listen),
        other_sections=others,
        limits=limits,
    )


def attach_worker(service: Any, role: WorkerRole, reactor: Any, lifeline: bool = True) -> WorkerAgent:
    """Make the broker of C{service} worker C{role} (see the module docstring).

    @param lifeline: watch the supervisor's pipes (False in tests).
    """
    # Imported here: a single broker never loads the mesh for this.
    from qmq.cluster.endpoints import Peer  # noqa: PLC0415
    from qmq.cluster.mesh import LinkFactory, mesh_of  # noqa: PLC0415
    from qmq.cluster.placement import Placement  # noqa: PLC0415
    from qmq.service import PROTOCOLS, Listener  # noqa: PLC0415
    from qmq.workers.drain import Drain  # noqa: PLC0415
    from qmq.workers.metrics import WorkerMetrics  # noqa: PLC0415

    broker = service.broker
    base = service.settings.section("cluster").node.rpartition("-w")[0]
    nodes = [worker_node(base, j) for j in range(role.count)]
    mesh = mesh_of(broker, service.settings, reactor)
    if mesh.parent is None:
        mesh.setServiceParent(service)
    # The other workers list and close this one's connections (qmq.cluster.manage).
    mesh.manage.registry = service.connections
    # SockJS sessions over HTTP live on one worker each; the others relay
    # their requests there (qmq.web.sockjs.relay).
    from qmq.web.sockjs.relay import install  # noqa: PLC0415

    install(mesh)
    # Links from the other workers.
    path = link_path(role.directory, role.index)
    spec = f"peer:unix:{path}"
    endpoint = UNIXServerEndpoint(reactor, path, mode=0o600, wantPID=True)
    service.add_listener(Listener("peer", spec, endpoint, LinkFactory(mesh, service.connections, spec)))
    # Its own site on a private socket: the others ask it for its metrics
    # there (qmq.workers.metrics).
    site_path = site_socket(role.directory, role.index)
    site_spec = f"http:unix:{site_path}"
    site = PROTOCOLS["http"](broker, service.settings, reactor, service.connections, site_spec)
    endpoint = UNIXServerEndpoint(reactor, site_path, mode=0o600, wantPID=True)
    service.add_listener(Listener("http", site_spec, endpoint, site))
    broker.worker_metrics = WorkerMetrics(
        reactor,
        nodes[role.index],
        site_spec,
        {nodes[j]: site_socket(role.directory, j) for j in range(role.count) if j != role.index},
    )
    # It dials the workers after it: one dialer per pair.
    peers = [
        Peer(
            text=f"unix:path={link_path(role.directory, j)}:node={nodes[j]}",
            kind="unix",
            host="",
            port=0,
            node=nodes[j],
            endpoint=f"unix:path={link_path(role.directory, j)}:timeout=5",
        )
        for j in range(role.index + 1, role.count)
    ]
    # Queues: each one's home is one worker, by a stable hash of its
    # virtual host and name over all N workers (not the ones linked now: a
    # queue does not move while its worker restarts).
    # In a mesh of hosts, over every node of every host (the mesh's
    # membership: their workers are its nodes).
    mesh.queues.placement = Placement(mesh.node, lambda: set(nodes) | mesh.members())
    mesh.siblings = frozenset(nodes) - {mesh.node}
    agent = WorkerAgent(role, mesh, peers, reactor, lifeline)
    agent.drain = Drain(broker, mesh, reactor)
    agent.setServiceParent(service)
    return agent


@implementer(IReadDescriptor)
class _Lifeline:
    """The read end of the supervisor's lifeline pipe: its end stops the worker."""

    def __init__(self, fd: int, gone: Any) -> None:
        self.fd = fd
        self.gone = gone

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> Any:
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return None
        except OSError as e:
            return e
        if not data:
            return "the supervisor is gone"
        return None

    def connectionLost(self, reason: Any) -> None:
        self.gone()

    def logPrefix(self) -> str:
        return "lifeline"


class WorkerAgent(Service):
    """The worker's side of the supervisor (see the module docstring):
    dials the other workers, says ready, and watches the lifeline."""

    def __init__(self, role: WorkerRole, mesh: Any, peers: list[Any], reactor: Any, lifeline: bool) -> None:
        self.role = role
        self.mesh = mesh
        self.peers = peers
        self.reactor = reactor
        self.lifeline = lifeline
        #: Moves messages of queues whose home moved (L{qmq.workers.drain}).
        self.drain: Any = None
        self._reader: _Lifeline | None = None

    def startService(self) -> None:
        super().startService()
        for peer in self.peers:
            self.mesh.dial(peer)
        if self.drain is not None:
            self.drain.start()
        log.info(
            "QMQ worker {node} ({index} of {count}) ready",
            node=self.mesh.node,
            index=self.role.index + 1,
            count=self.role.count,
        )
        if not self.lifeline:
            return
        try:
            os.write(READY_FD, f"ready {os.getpid()}\n".encode())
        except OSError as e:
            log.warn("QMQ worker cannot tell the supervisor it is ready: {error}", error=e.strerror or e)
        try:
            os.set_blocking(LIFELINE_FD, False)
        except OSError as e:
            # Started by hand, not by a supervisor: nothing to watch.
            log.warn("QMQ worker has no lifeline from a supervisor: {error}", error=e.strerror or e)
            return
        self._reader = _Lifeline(LIFELINE_FD, self._supervisor_gone)
        self.reactor.addReader(self._reader)

    def _supervisor_gone(self) -> None:
        self._reader = None
        if self.running:
            log.warn("QMQ worker {node}: the supervisor is gone; stopping", node=self.mesh.node)
            self.reactor.stop()

    def stopService(self) -> None:
        super().stopService()
        if self.drain is not None:
            self.drain.stop_all()
        if self._reader is not None:
            self.reactor.removeReader(self._reader)
            self._reader = None
