# -*- test-case-name: tests.test_workers_metrics -*-
"""C{/metrics} for the whole broker, from whichever worker is asked.

The C{http:} listeners are shared, so a scrape lands on any worker. Each
worker also serves its own site on a private unix socket,
C{DIR/wI.http}, in the supervisor's directory (mode 0700: only the
broker's own user reaches it, so no authentication is asked there). The
worker that takes a scrape on a shared listener:

    1. checks the scraper's right to read metrics, as a single broker does;
    2. asks every other worker's private socket for its own metrics
       (L{WorkerMetrics.gather}, at most L{FETCH_TIMEOUT} seconds each, all
       at once);
    3. answers with every worker's series, each sample labelled
       C{worker="wI"} (L{merge}: one C{# HELP} and C{# TYPE} per family),
       and C{qmq_worker_up{worker="wI"}} 1 or 0: a worker that did not
       answer (dead, restarting) is missing from the rest, not guessed.

The supervisor is not on the path: it holds no broker state, and a scrape
is answered while it restarts a worker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import UNIXClientEndpoint
from twisted.logger import Logger
from twisted.web.client import Agent, readBody
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory
from zope.interface import implementer

__all__ = ["FETCH_TIMEOUT", "WorkerMetrics", "label", "merge"]

log = Logger()

#: Seconds a worker has to answer another's request for its metrics.
FETCH_TIMEOUT = 2.0
#: Most bytes of metrics read from one worker.
MAX_METRICS = 16 * 1024 * 1024

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?(?P<rest> .*)$")


def label(line: str, worker: str) -> str:
    """A sample line with C{worker="..."} as its first label."""
    match = _SAMPLE.match(line)
    if match is None:
        return line
    labels = match["labels"]
    inner = labels[1:-1] if labels else ""
    joined = f'worker="{worker}"' + (f",{inner}" if inner else "")
    return f"{match['name']}{{{joined}}}{match['rest']}"


def merge(texts: dict[str, str]) -> str:
    """Prometheus text from several workers as one: each family's C{# HELP}
    and C{# TYPE} once (the first worker's), then every worker's samples
    of it, labelled with the worker (families in first-seen order)."""
    owner: dict[str, str] = {}
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family not in owner:
                    owner[family] = worker
                    heads[family] = []
                    samples[family] = []
                if owner[family] == worker:
                    heads[family].append(line)
            elif line and not line.startswith("#"):
                if family not in owner:
                    owner[family] = worker
                    heads[family] = []
                    samples[family] = []
                samples[family].append(label(line, worker))
    out: list[str] = []
    for family in owner:
        out += heads[family]
        out += samples[family]
    return "\n".join(out) + "\n"


@implementer(IAgentEndpointFactory)
class _UnixEndpoints:
    """The Agent's endpoint for a URI: the worker's private socket, named
    by the host (C{http://w1.localhost/metrics} -> C{DIR/w1.http}; a name
    under C{localhost}, which the site's Host check accepts)."""

    def __init__(self, reactor: Any, paths: dict[str, str]) -> None:
        self.reactor = reactor
        self.paths = paths

    def endpointForURI(self, uri: Any) -> Any:
        node = uri.host.decode().removesuffix(".localhost")
        return UNIXClientEndpoint(self.reactor, self.paths[node], timeout=FETCH_TIMEOUT)


class WorkerMetrics:
    """What a worker's C{/metrics} asks of the others (module docstring).

    @ivar node: this worker's node id.
    @ivar private: the listener name of this worker's private site.
    @ivar paths: every other worker's node id -> its private socket.
    """

    def __init__(self, reactor: Any, node: str, private: str, paths: dict[str, str]) -> None:
        self.reactor = reactor
        self.node = node
        self.private = private
        self.paths = paths
        self.agent = Agent.usingEndpointFactory(reactor, _UnixEndpoints(reactor, paths))

    def is_private(self, listener: str) -> bool:
        """Whether a request came on this worker's private site."""
        return listener == self.private

    def fetch(self, node: str) -> defer.Deferred[str | None]:
        """One worker's own metrics, or None (no answer in time)."""
        d = self.agent.request(b"GET", f"http://{node}.localhost/metrics".encode(), None)
        d.addCallback(self._body)
        timer = self.reactor.callLater(FETCH_TIMEOUT, d.cancel)

        def done(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        d.addBoth(done)
        d.addErrback(lambda f: None)
        return d

    def _body(self, response: Any) -> Any:
        if response.code != 200 or response.length is UNKNOWN_LENGTH or response.length > MAX_METRICS:
            response.deliverBody(_Discard())
            return None
        return readBody(response).addCallback(lambda b: b.decode("utf-8", "replace"))

    @defer.inlineCallbacks
    def gather(self, local: Callable[[], bytes]) -> Any:
        """Every worker's metrics, merged (see the module docstring)."""
        nodes = sorted(self.paths)
        answers = yield defer.gatherResults([self.fetch(n) for n in nodes])
        texts = {self.node: local().decode()}
        up = {self.node: 1}
        for node, text in zip(nodes, answers, strict=True):
            up[node] = 0 if text is None else 1
            if text is not None:
                texts[node] = text
        merged = merge(dict(sorted(texts.items())))
        lines = ["# HELP qmq_worker_up 1 for each worker that answered this scrape.", "# TYPE qmq_worker_up gauge"]
        lines += [f'qmq_worker_up{{worker="{n}"}} {v}' for n, v in sorted(up.items())]
        return ("\n".join(lines) + "\n" + merged).encode()


class _Discard:
    def makeConnection(self, transport: Any) -> None:
        transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Any) -> None:
        pass
