"""Tests for the C{[cluster]} keys of the mesh (L{qmq.cluster.settings},
L{qmq.cluster.endpoints}) and the C{peer:} listener kind: every mistake is
a configuration error naming the key and the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trustme
from twisted.internet.endpoints import SSL4ServerEndpoint, TCP4ServerEndpoint
from twisted.internet.testing import MemoryReactorClock
from twisted.trial import unittest

from qmq import config
from qmq.cluster.endpoints import certified_name, parse_peer, shift_port
from qmq.cluster.mesh import Mesh
from qmq.config import ConfigError
from qmq.service import make_service


class Files:
    """A CA and a node certificate on disk (trustme)."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        self.ca = self.dir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        leaf = ca.issue_cert("a", "127.0.0.1")
        self.cert = self.dir / "a.pem"
        self.key = self.dir / "a.key"
        leaf.cert_chain_pems[0].write_to_path(str(self.cert))
        leaf.private_key_pem.write_to_path(str(self.key))
        self.other_key = self.dir / "other.key"
        trustme.CA().issue_cert("x").private_key_pem.write_to_path(str(self.other_key))

    def toml(self, **extra: str) -> str:
        values = {
            "node": '"a"',
            "ca": f'"{self.ca}"',
            "certificate": f'"{self.cert}"',
            "private_key": f'"{self.key}"',
            **extra,
        }
        return "[cluster]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


class PeerStringTests(unittest.TestCase):
    def test_forms(self) -> None:
        peer = parse_peer("ssl:host=10.0.0.2:port=61700")
        self.assertEqual((peer.kind, peer.host, peer.port, peer.node), ("ssl", "10.0.0.2", 61700, ""))
        peer = parse_peer("ssl:b.example:61700:node=b:timeout=3")
        self.assertEqual((peer.host, peer.port, peer.node, peer.options), ("b.example", 61700, "b", {"timeout": 3.0}))
        peer = parse_peer("tcp:host=127.0.0.1:port=5:node=c")
        self.assertEqual((peer.endpoint, peer.node), ("tcp:host=127.0.0.1:port=5", "c"))

    def test_errors(self) -> None:
        for text, problem in [
            ("unix:/tmp/x", "expected an ssl:"),
            ("ssl:host=h", "no port"),
            ("ssl:port=5", "no host"),
            ("ssl:host=h:port=70000", "out of range"),
            ("ssl:host=h:port=5:node=no.dots", "not a node id"),
            ("ssl:host=h:port=5:certKey=x.pem", "'certKey' is not accepted"),
        ]:
            with self.assertRaises(ValueError) as caught:
                parse_peer(text)
            self.assertIn(problem, str(caught.exception), text)


class WorkerNamesTests(unittest.TestCase):
    def test_certified_name(self) -> None:
        """A worker of a host presents its host's certificate."""
        for node, name in [("dc1-w0", "dc1"), ("dc1-w12", "dc1"), ("a-b-w3", "a-b"), ("w1", "w1"),
                           ("dc1", "dc1"), ("dc1-w", "dc1-w"), ("dc1-wx", "dc1-wx")]:
            self.assertEqual(certified_name(node), name, node)

    def test_shift_port(self) -> None:
        """Worker I listens on each peer: port plus I and advertises it."""
        for text, by, positional, shifted in [
            ("ssl:host=h:port=7000", 2, 1, "ssl:host=h:port=7002"),
            ("ssl:h:7000:node=x", 1, 1, "ssl:h:7001:node=x"),
            ("ssl:7000:interface=127.0.0.1", 3, 0, "ssl:7003:interface=127.0.0.1"),
            ("tcp:interface=\\:\\:1:7000", 1, 0, "tcp:interface=\\:\\:1:7001"),
        ]:
            self.assertEqual(shift_port(text, by, positional), shifted, text)
        for text, by, problem in [("ssl:host=h", 1, "no port"), ("ssl:65535", 1, "out of range"),
                                  ("ssl:interface=x", 0, "no port")]:
            with self.assertRaises(ValueError) as caught:
                shift_port(text, by, 0 if "host" not in text else 1)
            self.assertIn(problem, str(caught.exception), text)


class ClusterConfigTests(unittest.TestCase):
    def setUp(self) -> None:
        self.files = Files(self.mktemp())

    def load(self, text: str) -> config.Settings:
        return config.load_string(text, "qmq.toml")

    def test_loaded(self) -> None:
        settings = self.load(self.files.toml(peers='["ssl:host=127.0.0.1:port=61700:node=b"]'))
        cluster = settings.section("cluster")
        self.assertEqual(cluster.peers, ("ssl:host=127.0.0.1:port=61700:node=b",))
        self.assertEqual(cluster.ca, str(self.files.ca))

    def test_errors_name_key_and_file(self) -> None:
        cases = [
            (self.files.toml(peers='["unix:/x"]'), "qmq.toml: cluster.peers: [0]: expected an ssl:"),
            (self.files.toml(peers='"ssl:host=h:port=1"'), "qmq.toml: cluster.peers: expected an array"),
            (self.files.toml(peers="[3]"), "qmq.toml: cluster.peers: [0]: expected an endpoint string"),
            (self.files.toml(ca='"missing.pem"'), "qmq.toml: cluster.ca: cannot read 'missing.pem'"),
            (self.files.toml(ca=f'"{self.files.key}"'), "qmq.toml: cluster.ca: no PEM certificates found"),
            (self.files.toml(private_key=f'"{self.files.cert}"'), "qmq.toml: cluster.private_key: no PEM private key"),
            (self.files.toml(heartbeat="0"), "qmq.toml: cluster.heartbeat: expected a number from 0.1 to 3600"),
            (self.files.toml(allow_plaintext='"yes"'), "qmq.toml: cluster.allow_plaintext: expected true or false"),
        ]
        for text, message in cases:
            with self.assertRaises(ConfigError) as caught:
                self.load(text)
            self.assertTrue(str(caught.exception).startswith(message), (str(caught.exception), message))

    def build(self, text: str, *listen: str) -> object:
        settings = config.with_overrides(self.load(text), listen=list(listen) or None)
        settings = dataclasses.replace(settings, store="memory", data_dir=Path(self.mktemp()))
        return make_service(settings, MemoryReactorClock())

    def test_pairs_checked_at_build(self) -> None:
        """What needs two keys is checked when the service is built."""
        plain = '[cluster]\nnode = "a"\npeers = ["tcp:host=127.0.0.1:port=1"]\n'
        with self.assertRaises(ConfigError) as caught:
            self.build(plain)
        self.assertIn("cluster.peers[0]: a tcp: peer is neither encrypted", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.build('[cluster]\npeers = ["ssl:host=h:port=1"]\n')
        self.assertIn("cluster.peers[0]: an ssl: peer needs cluster.ca", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.build("", "peer:tcp:0:interface=127.0.0.1")
        self.assertIn("--listen: cannot use endpoint", str(caught.exception))
        self.assertIn("allow_plaintext", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.build("", "peer:ssl:0:interface=127.0.0.1")
        self.assertIn("needs cluster.ca", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.build(self.files.toml(private_key=f'"{self.files.other_key}"'), "peer:ssl:0")
        self.assertIn("does not match", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.build(self.files.toml(), "peer:ssl:0:privateKey=x.pem")
        self.assertIn("'privateKey' is not accepted", str(caught.exception))

    def test_listeners_built(self) -> None:
        """peer:ssl: is a TLS listener on the [cluster] certificates (on any
        interface: mutual TLS authenticates); peer:tcp: needs
        allow_plaintext; the mesh starts and stops with the broker."""
        service = self.build(self.files.toml(), "peer:ssl:0", "stomp:tcp:0:interface=127.0.0.1")
        listener = service.listeners[0]  # type: ignore[attr-defined]
        self.assertIsInstance(listener.endpoint, SSL4ServerEndpoint)
        self.assertIsInstance(service.broker.mesh, Mesh)  # type: ignore[attr-defined]
        self.assertIn(service.broker.mesh, list(service))  # type: ignore[attr-defined]
        service = self.build(
            '[cluster]\nallow_plaintext = true\n', "peer:tcp:0:interface=127.0.0.1"
        )
        self.assertIsInstance(service.listeners[0].endpoint, TCP4ServerEndpoint)  # type: ignore[attr-defined]

    def test_exposure(self) -> None:
        """peer:ssl: may listen on every interface without users (mutual TLS
        authenticates); peer:tcp: may not, even with allow_plaintext."""
        service = self.build(self.files.toml(), "peer:ssl:0")
        self.assertEqual(len(service.listeners), 1)  # type: ignore[attr-defined]
        with self.assertRaises(ConfigError) as caught:
            self.build("[cluster]\nallow_plaintext = true\n", "peer:tcp:0")
        self.assertIn("not only on loopback", str(caught.exception))

    def test_no_mesh_without_peers(self) -> None:
        service = self.build("", "stomp:tcp:0:interface=127.0.0.1")
        self.assertIsNone(getattr(service.broker, "mesh", None))  # type: ignore[attr-defined]
