# -*- test-case-name: tests.test_cluster_mesh -*-
"""The mesh: this node's links to its peers, and what flows over them.

A full mesh of nodes (every node linked to every other, one link per pair,
L{qmq.cluster.link}), in which a peer is "just another client": a link is a
frontend of the core, with a L{qmq.core.channel.Channel} per virtual host,
as a STOMP session has.

Interest, out (what this node's clients want):
    The mesh observes the core's events (L{qmq.core.events}). A binding
    key of an exchange (a queue's binding, a live subscriber's, an
    exchange's) is this node's I{local interest} while it has bindings
    other than the ones the mesh made for its peers
    (L{Observer.bindings_changed} minus L{Mesh.own}). When local interest
    in (virtual host, exchange, key) appears or goes, every link is told
    (an interest frame); a link that comes up is told all of it at once (a
    sync frame), so a reconnect re-synchronises.

    A headers exchange routes on arguments, not keys: while it has local
    bindings (any key), its interest is one key, L{HEADERS_KEY} ("every
    message of it"), and the home of each binding matches the arguments.

Interest, in (what a peer's clients want):
    For each (virtual host, exchange, key) a peer wants, the mesh consumes
    on that exchange with that key through the link's channel: a
    L{LinkConsumer}, a live consumer (auto-ack, no queue) whose
    C{publish} encodes the message into the link. An exchange that does
    not exist yet is bound when it is declared (a topology event). When
    the peer withdraws it, or the link goes, the consumer goes.

Messages:
    A publish on this node reaches a link's consumers like any subscriber;
    a link sends one message once however many of its keys match (it
    remembers the last message it sent). A message that comes in from a
    link is published on the core through the link's channel, with an id
    of this node's (ids are unique per node only, and the store needs its
    own increasing), while L{Mesh.inbound} names it: every L{LinkConsumer} skips it, so a
    message received from a link is never sent on to another link. In a
    full mesh that is loop-free and duplicate-free: the publishing node
    sends to each interested peer directly, exactly once.

Links, and the tie-break:
    Every node dials each of its C{peers} (Twisted's L{ClientService}:
    reconnects with exponential backoff and jitter) and accepts links on
    its C{peer:} listeners, so two nodes that list each other may end up
    with two links. Of two links between the same pair, the one dialed by
    the node with the smaller id (string order) is kept; both ends decide
    the same. The other is closed with a close frame saying so, and its
    dialer waits (standby) until the kept link goes. A dialer that reached
    this node itself (a peers list shared by every node) stops for good.
    When every entry of C{peers} names its node (C{node=}), a node that is
    not one of them is refused.

Discovery:
    A link that comes up carries a peers frame each way: the sender with
    its C{advertise} endpoint and every node it learned of. A node told of
    one it neither links to nor dials dials it (L{learned}) and passes the
    news on to its other peers. Links going up and down are announced on
    C{/topic/system.peers}. A dialer its peer refused waits 2, 4, ... 60
    seconds (L{dialer_refused}).

Queues across nodes:
    Each queue lives on one home node; the core's stand-in of a queue homed
    elsewhere (L{qmq.core.remote}) reaches it through L{queues}, a
    L{qmq.cluster.queues.RemoteQueues} (the broker's C{homes} while the
    mesh runs), placed by L{qmq.cluster.placement}.

What is not guaranteed (docs/cluster.rst): fan-out messages cross a link
at most once (in flight when a link drops, they are lost); queues across
nodes are at least once (confirmed publishes, acked deliveries); interest
takes a round trip to reach a peer, so a publish right after a remote
SUBSCRIBE may miss it; no ordering between messages from different nodes.
"""

from __future__ import annotations

import json
import random
from typing import Any

from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import Service
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from qmq.cluster import wire
from qmq.cluster.endpoints import Credentials, Peer, client_endpoint, parse_peer
from qmq.cluster.link import LinkProtocol
from qmq.cluster.manage import Manage
from qmq.cluster.placement import Placement
from qmq.cluster.queues import RemoteQueues
from qmq.core.channel import Channel
from qmq.core.consumer import Consumer
from qmq.core.errors import BrokerError
from qmq.core.events import Observer
from qmq.core.ids import NODE_ID
from qmq.core.ownership import peer_owner

__all__ = ["LinkConsumer", "LinkFactory", "Mesh", "mesh_of"]

log = Logger()

#: Reconnect delays: from INITIAL_DELAY, doubling up to MAX_DELAY, plus up
#: to a second of jitter.
INITIAL_DELAY = 0.5
MAX_DELAY = 30.0

#: Exchange types whose interest is a binding key.
PROPAGATED_TYPES = ("direct", "fanout", "topic")

#: The key of a headers exchange's interest: "any message of it". Its
#: bindings match on arguments, which the core's events do not carry: a node
#: with bindings of a headers exchange wants every message published to it
#: elsewhere, and its own bindings (x-match and arguments) choose among
#: them. A peer binds it as a live consumer without arguments, which a
#: headers exchange routes everything to.
HEADERS_KEY = ""

Key = tuple[str, str, str]

#: Most seconds a refused dialer waits before it dials again.
REFUSED_DELAY = 60.0

#: Most nodes learned from peers (L{Mesh.learned}).
MAX_LEARNED = 64

#: Where links up and down are announced: C{/topic/system.peers}.
ANNOUNCE_EXCHANGE = "amq.topic"
ANNOUNCE_KEY = "system.peers"

#: Most (vhost, exchange, key) a link keeps resolved for what it receives
#: (then it forgets them all).
TARGET_CACHE_SIZE = 1000


class LinkConsumer(Consumer):
    """What a peer wants of one exchange + key, bound here: hands each
    message routed to it to its link (see the module docstring)."""

    __slots__ = ("link", "key")

    def __init__(self, link: LinkProtocol, key: Key) -> None:
        super().__init__(False, None)
        self.link = link
        self.key = key

    def publish(self, message: Any) -> None:
        link = self.link
        if message is link.last_sent or message is link.mesh.inbound:
            return
        link.last_sent = message
        link.mesh.send(link, self.key[0], message)

    def deliver(self, message: Any, queue: Any) -> None:
        self.publish(message)

    def cancelled(self) -> None:
        """Its exchange was deleted: bound again if it is declared again."""
        self.link.mesh.consumer_cancelled(self)


class LinkFactory(Factory):
    """Makes the links of a C{peer:} listener (inbound) or of a dialer."""

    # A dialer's factory starts and stops with every attempt: no log line each.
    noisy = False

    def __init__(
        self,
        mesh: Mesh,
        registry: Any = None,
        listener: str = "",
        peer: Peer | None = None,
    ) -> None:
        self.mesh = mesh
        self.registry = registry
        self.listener = listener
        self.peer = peer
        self.dialer: Any = None

    def buildProtocol(self, addr: Any) -> LinkProtocol | None:
        if self.peer is not None:
            return LinkProtocol(self.mesh, True, self.peer, self.dialer)
        if self.registry is not None:
            refused = self.registry.admit(self.listener, getattr(addr, "host", "") or "")
            if refused is not None:
                return None
        return LinkProtocol(self.mesh, False, registry=self.registry, listener=self.listener)


class Mesh(Service, Observer):
    """This node's side of the mesh (see the module docstring).

    @ivar node: this node's id.
    @ivar links: node id -> its link, while up.
    @ivar local: the (vhost, exchange, key) this node's clients want.
    @ivar own: (vhost, exchange, key) -> bindings the mesh made for peers.
    @ivar inbound: the message being published from a link, or None.
    @ivar all_links: every link that is connected, up or not.
    """

    def __init__(self, broker: Any, settings: Any, clock: Any, placement: Any = None) -> None:
        """
        @param placement: the home-node rule of queues (any object with
            C{home(vhost, name) -> node id}); None: a
            L{qmq.cluster.placement.Placement} over L{members}.
        """
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.node: str = broker.node
        self.links: dict[str, LinkProtocol] = {}
        self.all_links: set[LinkProtocol] = set()
        self.local: set[Key] = set()
        self.own: dict[Key, int] = {}
        #: (vhost, headers exchange) -> its keys with local bindings, while
        #: any (then (vhost, exchange, L{HEADERS_KEY}) is in L{local}).
        self.headers: dict[tuple[str, str], set[str]] = {}
        self.inbound: Any = None
        self.peers = [parse_peer(text) for text in settings.peers]
        self.listed = {p.node for p in self.peers} if self.peers and all(p.node for p in self.peers) else None
        self.credentials: Credentials | None = None
        if settings.ca and settings.certificate and settings.private_key:
            self.credentials = Credentials.load(settings)
        self.dialers: list[ClientService] = []
        #: Nodes a dialer targets by name (C{node=}: configured or learned).
        self.dialed: set[str] = {p.node for p in self.peers if p.node}
        #: node -> the endpoint it advertised (learned from peers, L{learned}).
        self.known: dict[str, str] = {}
        self._announcer: Channel | None = None
        self._standby: dict[ClientService, str] = {}
        # Dialers whose peer refused them: how many times in a row.
        self._refusals: dict[ClientService, int] = {}
        self._stop_observing: Any = None
        self._encoded: tuple[Any, str, list[bytes], int, bytes] | None = None
        self._vhost_bytes: dict[str, bytes] = {}
        self._next_id = broker.message_ids.__next__
        #: Nodes linked since this node started (members of the placement).
        self.seen: set[str] = set()
        #: The other workers of this host (L{qmq.workers.worker}): linked
        #: over their own sockets, never dialed as learned nodes.
        self.siblings: frozenset[str] = frozenset()
        #: Queues across nodes: the broker's homes while the mesh runs.
        self.queues = RemoteQueues(
            self,
            placement if placement is not None else Placement(self.node, self.members),
            settings.remote_window,
        )
        #: Management across nodes, topology shared (L{qmq.cluster.manage}).
        self.manage = Manage(self)

    def members(self) -> set[str]:
        """The configured membership queues are placed over
        (L{qmq.cluster.placement}): the nodes C{peers} names, those
        learned from peers, those linked since this node started."""
        return {p.node for p in self.peers if p.node} | set(self.known) | self.seen

    # -- the service ----------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self.broker.homes = self.queues
        self.queues.place_existing()
        self._stop_observing = self.broker.observe(self, replay=False)
        self.manage.start()
        for vhost in self.broker.vhosts.values():
            events = vhost.events
            for (exchange, key), count in (events.interest.items() if events is not None else ()):
                self.bindings_changed(vhost.name, exchange, key, count)
        for peer in self.peers:
            self.dial(peer)
        log.info(
            "mesh: node {node} dials {count} peer(s)",
            node=self.node,
            count=len(self.peers),
        )

    def dial(self, peer: Peer) -> None:
        """Dial C{peer} until this node stops (Twisted's L{ClientService}:
        again after each loss, with backoff and jitter)."""
        factory = LinkFactory(self, peer=peer)
        endpoint = client_endpoint(self.clock, peer, self.credentials)
        dialer = ClientService(
            endpoint,
            factory,
            retryPolicy=backoffPolicy(INITIAL_DELAY, MAX_DELAY, 2.0, jitter=random.random),
            clock=self.clock,
        )
        factory.dialer = dialer
        self.dialers.append(dialer)
        dialer.startService()

    def stopService(self) -> Any:
        super().stopService()
        if self._stop_observing is not None:
            self._stop_observing()
            self._stop_observing = None
        self.manage.stop()
        for dialer in self.dialers:
            if dialer.running:
                dialer.stopService()
        self.dialers = []
        self._standby.clear()
        for link in list(self.all_links):
            link.close("node shutting down")
        if self._announcer is not None:
            self._announcer.close()
            self._announcer = None
        return None

    # -- links ----------------------------------------------------------------

    def link_up(self, link: LinkProtocol) -> str | None:
        """C{link}'s peer said hello and passed the link's checks: keep it
        (telling it all of this node's interest), or say why not (C{""}: it
        was a second link to a linked node, closed already)."""
        node = link.node
        if not link.outbound and self.listed is not None and node not in self.listed and node not in self.known:
            return (
                f"node {node!r} is not one of cluster.peers (every entry names its node), "
                "and no peer told of it"
            )
        other = self.links.get(node)
        if other is not None and other.state == "up":
            keep_dialer = min(self.node, node)
            mine = (self.node if link.outbound else node) == keep_dialer
            theirs = (self.node if other.outbound else node) == keep_dialer
            if theirs and not mine:
                log.info(
                    "mesh: link {link} is a second link to {node}: closed, the one dialed by "
                    "{dialer} is kept",
                    link=link.describe(),
                    node=node,
                    dialer=keep_dialer,
                )
                link.close(
                    f"duplicate link: the link dialed by {keep_dialer!r} is kept",
                    extra={"duplicate": True},
                )
                self.dialer_standby(link)
                return ""
            log.info(
                "mesh: link {link} replaces {other} (the one dialed by {dialer} is kept)",
                link=link.describe(),
                other=other.describe(),
                dialer=keep_dialer,
            )
            # Registered first, so that the old link going is no link down.
            self.links[node] = link
            other.close(
                f"duplicate link: the link dialed by {keep_dialer!r} is kept"
                if mine and not theirs
                else "replaced by a new link",
                extra={"duplicate": True} if mine and not theirs else None,
            )
            if mine and not theirs:
                self.dialer_standby(other)
        self.links[node] = link
        self.seen.add(node)
        link.state = "up"
        link.up_at = self.clock.seconds()
        self.all_links.add(link)
        link.send(wire.encode_json(wire.SYNC, {"interest": sorted(list(k) for k in self.local)}))
        peers = self._peers()
        if peers:
            link.send(wire.encode_json(wire.PEERS, {"peers": peers}))
        self.queues.link_up(link)
        self.manage.link_up(link)
        log.info("mesh: link {link} up", link=link.describe())
        self._announce(node, "up")
        return None

    def link_down(self, link: LinkProtocol) -> None:
        """C{link} is closing or gone (called once): what its peer wanted
        goes at once (nothing more is routed to it); a waiting dialer to that
        node starts again."""
        if link.down:
            return
        link.down = True
        self.all_links.discard(link)
        for key in list(link.remote):
            self._unbind(link, key)
        self.queues.link_down(link)
        self.manage.link_down(link)
        for channel in link.channels.values():
            channel.close()
        link.channels.clear()
        link.targets.clear()
        link.queue_targets.clear()
        node = link.node
        if node and self.links.get(node) is link:
            del self.links[node]
            log.info("mesh: link {link} down: {reason}", link=link.describe(), reason=link.reason)
            self._announce(node, "down")
            if self.running:
                for dialer, target in list(self._standby.items()):
                    if target == node:
                        del self._standby[dialer]
                        dialer.startService()

    def dialer_refused(self, link: LinkProtocol) -> None:
        """The peer refused C{link} (it is up to the peer's operator, or
        the peer learns of this node later): its dialer waits 2, 4, ...
        up to L{REFUSED_DELAY} seconds before it dials again, instead of
        Twisted's backoff, which a connection that was made resets."""
        dialer = link.dialer
        if dialer is None or not link.outbound:
            return
        n = self._refusals[dialer] = self._refusals.get(dialer, 0) + 1
        if dialer.running:
            dialer.stopService()

        def again() -> None:
            if self.running and not dialer.running and dialer not in self._standby:
                dialer.startService()

        self.clock.callLater(min(REFUSED_DELAY, 2.0**n), again)

    def dialer_standby(self, link: LinkProtocol, forever: bool = False) -> None:
        """C{link}'s dialer waits: until the kept link to its node goes, or
        for good (it reached this node itself)."""
        dialer = link.dialer
        if dialer is None or not link.outbound:
            return
        if dialer.running:
            dialer.stopService()
        if not forever:
            self._standby[dialer] = link.node

    # -- discovery ------------------------------------------------------------

    def _peers(self) -> list[list[str]]:
        """What this node tells a peer of the mesh: itself (with
        C{advertise}) and the nodes it learned of."""
        peers = [[self.node, self.settings.advertise]] if self.settings.advertise else []
        return peers + [[n, ep] for n, ep in sorted(self.known.items())]

    def learned(self, link: LinkProtocol, items: list[list[str]]) -> None:
        """C{link}'s peer told of nodes and how to dial them: dial those
        this node neither links to nor dials (at most L{MAX_LEARNED}), and
        tell the other peers what is new."""
        changed = False
        for node, text in items:
            if node == self.node or self.known.get(node) == text:
                continue
            if not NODE_ID.match(node) or len(self.known) >= MAX_LEARNED:
                continue
            try:
                peer = parse_peer(text if "node=" in text else f"{text}:node={node}")
            except ValueError as e:
                log.warn("mesh: {link} told of node {node} at {text!r}, which is no endpoint: {error}",
                         link=link.describe(), node=node, text=text, error=str(e))
                continue
            if peer.node != node or (peer.kind == "tcp" and not self.settings.allow_plaintext) or (
                peer.kind == "ssl" and self.credentials is None
            ):
                continue
            self.known[node] = text
            changed = True
            # A sibling worker is told on (how other hosts dial it), never dialed.
            if node not in self.links and node not in self.dialed and node not in self.siblings and self.running:
                self.dialed.add(node)
                log.info("mesh: {link} told of node {node} at {text}: dialing it", link=link.describe(),
                         node=node, text=text)
                self.dial(peer)
        if changed:
            frame = wire.encode_json(wire.PEERS, {"peers": self._peers()})
            for other in self.links.values():
                if other is not link:
                    other.send(frame)

    def _announce(self, peer: str, event: str) -> None:
        """Tell this node's clients (and, through the links, those of every
        node that subscribes) that a link went up or down: a JSON message
        to C{/topic/system.peers} in the default virtual host."""
        vhost = self.broker.default_vhost
        if vhost is None or ANNOUNCE_EXCHANGE not in vhost.exchanges:
            return
        channel = self._announcer
        if channel is None:
            channel = self._announcer = Channel(self.broker, vhost, f"peer:{self.node}", protocol="peer")
        body = json.dumps(
            {"node": self.node, "peer": peer, "event": event, "links": sorted(self.links)},
            separators=(",", ":"),
        ).encode()
        message = channel.make_message(ANNOUNCE_EXCHANGE, ANNOUNCE_KEY, None, body)
        message.properties = {"content_type": "application/json"}
        try:
            channel.publish(ANNOUNCE_EXCHANGE, ANNOUNCE_KEY, message)
        except BrokerError as e:
            log.warn("mesh: cannot announce a link on system.peers: {error}", error=e.message)

    # -- interest -------------------------------------------------------------

    def bindings_changed(self, vhost: str, exchange: str, key: str, count: int) -> None:
        k = (vhost, exchange, key)
        wanted = count - self.own.get(k, 0) > 0
        if self.headers:
            keys = self.headers.get((vhost, exchange))
            if keys is not None:
                self._headers_changed(vhost, exchange, keys, key, wanted)
                return
        if wanted == (k in self.local):
            return
        if wanted:
            ex = self.broker.vhosts[vhost].exchanges.get(exchange)
            if ex is None:
                return
            if ex.type == "headers":
                self._headers_changed(vhost, exchange, set(), key, wanted)
                return
            if ex.type not in PROPAGATED_TYPES:
                return
            self.local.add(k)
        else:
            self.local.discard(k)
        self._tell_interest(k, wanted)

    def _headers_changed(self, vhost: str, exchange: str, keys: set[str], key: str, wanted: bool) -> None:
        """Headers exchange C{exchange} has local bindings with C{key}, or
        no longer: its interest (L{HEADERS_KEY}) is on while any key has."""
        was = bool(keys)
        if wanted:
            keys.add(key)
        else:
            keys.discard(key)
        if bool(keys) == was:
            return
        k = (vhost, exchange, HEADERS_KEY)
        if keys:
            self.headers[(vhost, exchange)] = keys
            self.local.add(k)
        else:
            self.headers.pop((vhost, exchange), None)
            self.local.discard(k)
        self._tell_interest(k, bool(keys))

    def _tell_interest(self, k: Key, on: bool) -> None:
        frame = wire.encode_json(wire.INTEREST, {"i": list(k), "on": on})
        for link in self.links.values():
            link.send(frame)

    def exchange_declared(self, vhost: str, exchange: str, type: str) -> None:
        # Not from inside the core's change: bind on the next turn.
        self.clock.callLater(0, self._bind_waiting, vhost, exchange)

    def _bind_waiting(self, vhost: str, exchange: str) -> None:
        for link in list(self.links.values()):
            for key, consumer in list(link.remote.items()):
                if consumer is None and key[0] == vhost and key[1] == exchange:
                    self._bind(link, key)

    def remote_interest(self, link: LinkProtocol, key: Key, on: bool) -> None:
        """The peer of C{link} wants C{key}, or no longer."""
        if on:
            if key not in link.remote:
                self._bind(link, key)
        elif key in link.remote:
            self._unbind(link, key)
            link.remote.pop(key, None)

    def remote_sync(self, link: LinkProtocol, keys: set[Key]) -> None:
        """The peer of C{link} wants C{keys} and nothing else."""
        if link.outbound:
            # The peer took the link (it syncs only then): not refused.
            self._refusals.pop(link.dialer, None)
        for key in list(link.remote):
            if key not in keys:
                self._unbind(link, key)
                link.remote.pop(key, None)
        for key in keys:
            if key not in link.remote:
                self._bind(link, key)

    def channel_for(self, link: LinkProtocol, vhost: Any) -> Channel:
        """The channel of C{link} in C{vhost} (made on first use)."""
        channel = link.channels.get(vhost.name)
        if channel is None:
            # A peer's channel: the node asking checked its client's access
            # (a durable subscription's owner) already.
            channel = link.channels[vhost.name] = Channel(
                self.broker, vhost, peer_owner(link.node), protocol="peer"
            )
        return channel

    def _bind(self, link: LinkProtocol, key: Key) -> None:
        link.remote[key] = None
        vhost = self.broker.vhosts.get(key[0])
        if vhost is None or key[1] not in vhost.exchanges:
            return
        consumer = LinkConsumer(link, key)
        own = self.own
        own[key] = own.get(key, 0) + 1
        try:
            self.channel_for(link, vhost).consume(consumer, exchange=key[1], pattern=key[2], live=True)
        except BrokerError as e:
            own[key] -= 1
            log.warn(
                "mesh: link {link}: cannot bind {key!r} for the peer: {error}",
                link=link.describe(),
                key="/".join(key),
                error=e.message,
            )
            return
        link.remote[key] = consumer

    def _unbind(self, link: LinkProtocol, key: Key) -> None:
        consumer = link.remote.get(key)
        if consumer is None:
            return
        link.remote[key] = None
        own = self.own
        n = own.get(key, 0) - 1
        if n > 0:
            own[key] = n
        else:
            own.pop(key, None)
        channel = consumer.channel
        if channel is not None and not channel.closed:
            channel.unsubscribe(consumer)

    def consumer_cancelled(self, consumer: LinkConsumer) -> None:
        link = consumer.link
        if link.remote.get(consumer.key) is consumer:
            link.remote[consumer.key] = None
            n = self.own.get(consumer.key, 0) - 1
            if n > 0:
                self.own[consumer.key] = n
            else:
                self.own.pop(consumer.key, None)
        if consumer.channel is not None:
            consumer.channel.consumer_cancelled(consumer)

    # -- messages -------------------------------------------------------------

    def send(self, link: LinkProtocol, vhost: str, message: Any) -> None:
        """Send C{message} (published in C{vhost}) on C{link}: encoded once
        for every link it goes to."""
        encoded = self._encoded
        if encoded is None or encoded[0] is not message or encoded[1] != vhost:
            name = self._vhost_bytes.get(vhost)
            if name is None:
                name = self._vhost_bytes[vhost] = vhost.encode()
            chunks, size = wire.encode_item(message)
            encoded = self._encoded = (message, vhost, chunks, size, name)
        link.send_message(wire.MESSAGE, encoded[4], encoded[2], encoded[3])

    def received(self, link: LinkProtocol, vhost_name: str, messages: list[Any]) -> None:
        """Messages from C{link}'s peer (one batch frame): published here,
        for this node's subscribers only (through the link's channel, each
        exchange + key resolved once, as STOMP's SEND does; a run with the
        same ones, which the link's decoder gives as the same strings,
        looks them up once)."""
        next_id = self._next_id
        exchange = key = found = None
        for message in messages:
            if (
                message.exchange is not exchange
                or message.routing_key is not key
                or found is None
                or found[1][4].deleted
            ):
                exchange = message.exchange
                key = message.routing_key
                found = self._target(link, vhost_name, exchange, key)
                if found is None:
                    link.refused += 1
                    continue
            # An id of this node's (docs/cluster.rst): the sender's may meet
            # this node's own, and the store needs them increasing.
            message.id = next_id()
            self.inbound = message
            try:
                durable = found[0].publish_target(found[1], message)
            except BrokerError:
                link.refused += 1
                continue
            finally:
                self.inbound = None
            if durable is not None and durable is not link.last_waiter:
                # Once per waiter (the store's group commit shares one), and
                # the failure passed on to the others waiting on it.
                link.last_waiter = durable
                durable.addErrback(_not_stored, link)

    def _target(self, link: LinkProtocol, vhost_name: str, exchange: str, key: str) -> Any:
        """(the link's channel, the resolved target) for C{exchange} and
        C{key} in C{vhost_name}, cached per link; None when there is none
        (no such virtual host, the core refuses the target)."""
        targets = link.targets
        k = (vhost_name, exchange, key)
        found = targets.get(k)
        if found is None or found[1][4].deleted:
            vhost = self.broker.vhosts.get(vhost_name)
            if vhost is None:
                return None
            channel = self.channel_for(link, vhost)
            try:
                found = (channel, channel.target(exchange, key))
            except BrokerError:
                return None
            if len(targets) >= TARGET_CACHE_SIZE:
                targets.clear()
            targets[k] = found
        return found

    # -- what the management API shows ----------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """Every connected link, and each configured peer not linked."""
        return [link.snapshot() for link in sorted(self.all_links, key=lambda lk: lk.node)]


def _not_stored(failure: Any, link: LinkProtocol) -> Any:
    log.failure("mesh: messages from {link} were not stored", failure, link=link.describe())
    return failure


def mesh_of(broker: Any, settings: Any, clock: Any) -> Mesh:
    """The broker's mesh, made on first use (one per broker)."""
    mesh = getattr(broker, "mesh", None)
    if mesh is None:
        mesh = broker.mesh = Mesh(broker, settings.section("cluster"), clock)
    return mesh
