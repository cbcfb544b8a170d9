"""Tests for L{qmq.tls}: the C{qmqtls:} endpoint and L{qmq.tls.peer_identity}.

The parser tests need no sockets.  The connection tests run a tiny echo
protocol on 127.0.0.1, port 0, behind real C{qmqtls:} listeners, with
certificates from L{tests.integration.certs}, so they do not depend on the
broker.
"""

from __future__ import annotations

from pathlib import Path

from OpenSSL import crypto
from twisted.internet import defer, reactor
from twisted.internet.endpoints import SSL4ClientEndpoint, serverFromString
from twisted.internet.interfaces import IHandshakeListener
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.python.failure import Failure
from twisted.trial import unittest
from zope.interface import implementer

from qmq import tls
from qmq.tls import EndpointError, PeerIdentity, peer_identity
from tests.integration.certs import ClientCertificate, TestPKI


class ParserTests(unittest.TestCase):
    """
    C{qmqtls:} endpoint strings, parsed without listening.
    """

    def setUp(self) -> None:
        self.pki = TestPKI(self.mktemp())
        self.reactor = MemoryReactor()

    def parse(self, description: str):
        return serverFromString(self.reactor, description)

    def error(self, description: str) -> str:
        return str(self.assertRaises(EndpointError, self.parse, description))

    def test_plugin(self) -> None:
        """
        C{serverFromString} finds the C{qmqtls} plugin; the endpoint listens
        with TLS on the given port and interface, backlog 1024 by default.
        """
        endpoint = self.parse(self.pki.qmqtls(port=61614))
        endpoint.listen(Factory.forProtocol(Protocol))
        port, factory, contextFactory, backlog, interface = self.reactor.sslServers[0]
        self.assertEqual((port, backlog, interface), (61614, 1024, "127.0.0.1"))
        self.assertIsInstance(contextFactory, tls.CertificateOptions)
        self.assertTrue(contextFactory.verify)
        self.assertTrue(contextFactory.requireCertificate)

    def test_positionalAndNamedPort(self) -> None:
        """
        The port may be given by name, and the backlog set.
        """
        description = (
            f"qmqtls:port=7000:privateKey={self.pki.server_key}"
            f":certKey={self.pki.server_cert}:backlog=5"
        )
        self.parse(description).listen(Factory.forProtocol(Protocol))
        port, _, options, backlog, interface = self.reactor.sslServers[0]
        self.assertEqual((port, backlog, interface), (7000, 5, ""))
        self.assertFalse(options.verify)

    def test_verifyModes(self) -> None:
        """
        C{require} requires a certificate, C{optional} asks for one, C{none}
        asks for none; with C{caCerts}, C{require} is the default.
        """
        expected = {"require": (True, True), "optional": (True, False), "none": (False, None)}
        for mode, (verify, required) in expected.items():
            endpoint = self.parse(self.pki.qmqtls(verify=mode))
            self.assertEqual(endpoint._sslContextFactory.verify, verify, mode)
            if required is not None:
                self.assertEqual(endpoint._sslContextFactory.requireCertificate, required)
        default = self.pki.qmqtls(verify=None) + f":caCerts={self.pki.ca_pem}"
        self.assertTrue(self.parse(default)._sslContextFactory.requireCertificate)

    def test_keyAndCertInOneFile(self) -> None:
        """
        C{certKey} defaults to C{privateKey}, which may hold both.
        """
        both = Path(self.mktemp())
        both.write_bytes(self.pki.server_key.read_bytes() + self.pki.server_cert.read_bytes())
        self.parse(f"qmqtls:0:privateKey={both}")

    def test_missingFile(self) -> None:
        """
        A file that cannot be read is named with its parameter.
        """
        self.assertEqual(
            self.error(self.pki.qmqtls(caCerts="nope.pem")),
            "qmqtls: caCerts: cannot read 'nope.pem': No such file or directory",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(privateKey="k.pem")),
            "qmqtls: privateKey: cannot read 'k.pem': No such file or directory",
        )

    def test_notPEM(self) -> None:
        """
        Files without the expected PEM block.
        """
        junk = Path(self.mktemp())
        junk.write_text("junk")
        self.assertEqual(
            self.error(self.pki.qmqtls(certKey=str(junk))),
            f"qmqtls: certKey: no PEM certificate found in '{junk}'",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(privateKey=str(self.pki.server_cert))),
            f"qmqtls: privateKey: no PEM private key found in '{self.pki.server_cert}'",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(extraCertChain=str(junk))),
            f"qmqtls: extraCertChain: no PEM certificate found in '{junk}'",
        )

    def test_mismatchedKey(self) -> None:
        """
        A key that does not belong to the certificate.
        """
        other = TestPKI(self.mktemp())
        message = self.error(self.pki.qmqtls(privateKey=str(other.server_key)))
        self.assertTrue(message.startswith("qmqtls: privateKey: does not match certKey"), message)

    def test_badVerify(self) -> None:
        """
        An unknown C{verify} value, or one that needs C{caCerts} without it.
        """
        self.assertEqual(
            self.error(self.pki.qmqtls(verify="yes")),
            "qmqtls: verify: expected one of require, optional, none, got 'yes'",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(verify=None) + ":verify="),
            "qmqtls: verify: expected one of require, optional, none, got ''",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(verify=None) + ":verify=optional"),
            "qmqtls: caCerts: verify=optional needs caCerts=FILE (the CAs of client certificates)",
        )

    def test_badParameters(self) -> None:
        """
        Unknown parameters, a missing key, bad numbers.
        """
        message = self.error(self.pki.qmqtls(cacerts="x"))
        self.assertTrue(message.startswith("qmqtls: cacerts: unknown parameter"), message)
        self.assertEqual(
            self.error("qmqtls:0"),
            "qmqtls: privateKey: required (a PEM file with the server's key)",
        )
        self.assertEqual(
            self.error(f"qmqtls:privateKey={self.pki.server_key}"), "qmqtls: port: required"
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(port="http")),  # type: ignore[arg-type]
            "qmqtls: port: expected an integer from 0 to 65535, got 'http'",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(port=70000)),
            "qmqtls: port: expected an integer from 0 to 65535, got '70000'",
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(backlog="0")),
            "qmqtls: backlog: expected an integer >= 1, got '0'",
        )
        self.assertEqual(self.error(self.pki.qmqtls() + ":port=1"), "qmqtls: port: given twice")
        self.assertEqual(self.error("qmqtls:1:2"), "qmqtls: unexpected positional parameters ['2']")

    def test_encryptedKey(self) -> None:
        """
        An encrypted private key is refused with a clear message.
        """
        key = crypto.load_privatekey(crypto.FILETYPE_PEM, self.pki.server_key.read_bytes())
        encrypted = Path(self.mktemp())
        encrypted.write_bytes(
            crypto.dump_privatekey(crypto.FILETYPE_PEM, key, "aes-256-cbc", b"secret")
        )
        self.assertEqual(
            self.error(self.pki.qmqtls(privateKey=str(encrypted))),
            f"qmqtls: privateKey: the key in '{encrypted}' is encrypted; QMQ needs it unencrypted",
        )


class PeerIdentityTests(unittest.TestCase):
    """
    L{PeerIdentity} and L{peer_identity} without a connection.
    """

    def test_fromCertificate(self) -> None:
        """
        The CN and every kind of subject alternative name are read.
        """
        pki = TestPKI(self.mktemp())
        client = pki.client("node1.example.org", "10.0.0.1", "ops@example.org", common_name="node1")
        identity = PeerIdentity.from_certificate(client.private_certificate().original)
        self.assertEqual(identity.common_name, "node1")
        self.assertEqual(identity.dns_names, ("node1.example.org",))
        self.assertEqual(identity.ip_addresses, ("10.0.0.1",))
        self.assertEqual(identity.emails, ("ops@example.org",))
        self.assertEqual(
            identity.names, ("node1", "node1.example.org", "ops@example.org", "10.0.0.1")
        )
        self.assertIn("CN=node1", identity.subject)
        self.assertEqual(len(identity.fingerprint), 64)

    def test_notTLS(self) -> None:
        """
        A transport that is not TLS has no peer identity.
        """
        self.assertIsNone(peer_identity(StringTransport()))
        self.assertIsNone(peer_identity(None))


@implementer(IHandshakeListener)
class Echo(Protocol):
    """
    Echo, and record the peer's identity when the handshake is done.
    """

    def handshakeCompleted(self) -> None:
        self.factory.identities.append(peer_identity(self.transport))

    def dataReceived(self, data: bytes) -> None:
        self.transport.write(data)

    def connectionMade(self) -> None:
        self.factory.open += 1

    def connectionLost(self, reason: Failure) -> None:
        self.factory.open -= 1
        if self.factory.open == 0 and self.factory.idle is not None:
            idle, self.factory.idle = self.factory.idle, None
            idle.callback(None)


class EchoFactory(Factory):
    protocol = Echo

    def __init__(self) -> None:
        self.identities: list[PeerIdentity | None] = []
        self.open = 0
        self.idle: defer.Deferred[None] | None = None

    def whenIdle(self) -> defer.Deferred[None]:
        if self.open == 0:
            return defer.succeed(None)
        self.idle = defer.Deferred()
        return self.idle


class Ping(Protocol):
    """
    Send C{ping}; C{self.result} fires with C{"echo"} if it comes back,
    or C{"refused"} if the connection is lost first.
    """

    def __init__(self) -> None:
        self.result: defer.Deferred[str] = defer.Deferred()
        self.closed: defer.Deferred[None] = defer.Deferred()
        self.received = b""

    def connectionMade(self) -> None:
        self.transport.write(b"ping")

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.received == b"ping" and not self.result.called:
            self.result.callback("echo")
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure) -> None:
        if not self.result.called:
            self.result.callback("refused")
        self.closed.callback(None)


class ConnectionTests(unittest.TestCase):
    """
    Real TLS connections to C{qmqtls:} listeners on 127.0.0.1.
    """

    def setUp(self) -> None:
        self.pki = TestPKI(self.mktemp())
        self.alice = self.pki.client("alice.example.org", common_name="alice")
        # A certificate from another CA (the stranger trusts our server).
        self.stranger = TestPKI(self.mktemp()).client("mallory.example.org")

    @defer.inlineCallbacks
    def listen(self, verify: str | None):
        factory = EchoFactory()
        port = yield serverFromString(reactor, self.pki.qmqtls(verify=verify)).listen(factory)
        self.addCleanup(port.stopListening)
        return factory, port.getHost().port

    @defer.inlineCallbacks
    def ping(self, verify: str | None, client: ClientCertificate | None, listener=None):
        """
        Connect with C{client}'s certificate (or none) and ping.

        @param listener: (factory, port) of a listener to reuse, or L{None}
            for a new one with C{verify}.
        @return: a Deferred firing with (outcome, identities the server saw).
        """
        factory, port = listener if listener is not None else (yield self.listen(verify))
        options = self.pki.client_options(client)
        endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, options)
        protocol = Ping()
        yield endpoint.connect(Factory.forProtocol(lambda: protocol))
        outcome = yield protocol.result
        yield protocol.closed
        yield factory.whenIdle()
        return outcome, factory.identities

    @defer.inlineCallbacks
    def test_manyConnections(self):
        """
        One listener serves connection after connection (its TLS context is
        made once and shared).
        """
        for verify in ("require", "optional", "none"):
            listener = yield self.listen(verify)
            for _ in range(3):
                outcome, _ = yield self.ping(verify, self.alice, listener)
                self.assertEqual(outcome, "echo")
            if verify != "require":
                outcome, _ = yield self.ping(verify, None, listener)
                self.assertEqual(outcome, "echo")

    @defer.inlineCallbacks
    def test_requireRefusesWithoutCertificate(self):
        """
        C{verify=require}: a client without a certificate is refused.
        """
        outcome, identities = yield self.ping("require", None)
        self.assertEqual(outcome, "refused")
        self.assertEqual(identities, [])

    @defer.inlineCallbacks
    def test_requireAcceptsSignedCertificate(self):
        """
        C{verify=require}: a client with a certificate from C{caCerts} gets in,
        and the server reads who it is.
        """
        outcome, identities = yield self.ping("require", self.alice)
        self.assertEqual(outcome, "echo")
        [identity] = identities
        self.assertEqual(identity.common_name, "alice")
        self.assertEqual(identity.dns_names, ("alice.example.org",))

    @defer.inlineCallbacks
    def test_requireRefusesStranger(self):
        """
        C{verify=require}: a certificate from another CA is refused.
        """
        outcome, identities = yield self.ping("require", self.stranger)
        self.assertEqual(outcome, "refused")
        self.assertEqual(identities, [])

    @defer.inlineCallbacks
    def test_optionalAcceptsBoth(self):
        """
        C{verify=optional}: clients with and without a certificate get in; the
        identity is there only for the one that sent a certificate.
        """
        outcome, identities = yield self.ping("optional", None)
        self.assertEqual((outcome, identities), ("echo", [None]))
        outcome, identities = yield self.ping("optional", self.alice)
        self.assertEqual(outcome, "echo")
        self.assertEqual(identities[0].common_name, "alice")

    @defer.inlineCallbacks
    def test_optionalRefusesStranger(self):
        """
        C{verify=optional}: a certificate that is sent must verify.
        """
        outcome, _ = yield self.ping("optional", self.stranger)
        self.assertEqual(outcome, "refused")

    @defer.inlineCallbacks
    def test_none(self):
        """
        C{verify=none}: no certificate is asked for, so even a client that has
        one is anonymous.
        """
        outcome, identities = yield self.ping("none", self.alice)
        self.assertEqual((outcome, identities), ("echo", [None]))
        outcome, identities = yield self.ping(None, None)
        self.assertEqual((outcome, identities), ("echo", [None]))
