"""Test certificates: a throw-away CA, a server certificate and client certificates.

Built with C{trustme} and written as PEM files into a directory, so a test can
put them in an endpoint string (L{TestPKI.qmqtls}) or hand them to a client
(L{TestPKI.client_options}, L{ClientCertificate.ssl_context})::

    pki = TestPKI(self.mktemp())
    endpoint = serverFromString(reactor, pki.qmqtls(verify="require"))
    alice = pki.client("alice.example.org", common_name="alice")
    options = pki.client_options(alice)

Any test may reuse it; it depends on nothing of QMQ.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme
from twisted.internet.endpoints import quoteStringArgument
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import Certificate, PrivateCertificate, optionsForClientTLS

__all__ = ["ClientCertificate", "TestPKI"]


@dataclass(frozen=True)
class ClientCertificate:
    """
    A client's certificate and key on disk.

    @ivar pem: a PEM file holding the key and the certificate chain.
    @ivar identities: the subject alternative names it was issued for.
    @ivar common_name: its subject CN, if any.
    """

    pem: Path
    identities: tuple[str, ...]
    common_name: str | None

    def private_certificate(self) -> PrivateCertificate:
        """
        @return: the key and certificate, for Twisted's TLS options.
        """
        return PrivateCertificate.loadPEM(self.pem.read_text())

    def ssl_context(self, ca: Path) -> ssl.SSLContext:
        """
        A standard-library client context that trusts C{ca} and presents this
        certificate (for raw-socket tests).

        @param ca: the CA file the server's certificate is checked against.
        """
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(self.pem))
        return context


class TestPKI:
    """
    A CA with a server certificate for C{localhost} and C{127.0.0.1}, written
    to C{directory} as C{ca.pem}, C{server-key.pem} and C{server-cert.pem}.

    @ivar ca: the C{trustme.CA}.
    @ivar ca_pem: the CA's certificate file.
    @ivar server_key: the server's private-key file.
    @ivar server_cert: the server's certificate-chain file.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_pem = self.directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        server = self.ca.issue_cert("localhost", "127.0.0.1")
        self.server_key = self.directory / "server-key.pem"
        self.server_cert = self.directory / "server-cert.pem"
        server.private_key_pem.write_to_path(str(self.server_key))
        for i, blob in enumerate(server.cert_chain_pems):
            blob.write_to_path(str(self.server_cert), append=i > 0)
        self._clients = 0

    def client(self, *identities: str, common_name: str | None = None) -> ClientCertificate:
        """
        Issue a client certificate signed by this CA.

        @param identities: subject alternative names (host names, IP
            addresses, e-mail addresses); C{"client.example.org"} if none.
        @param common_name: the subject CN, if one is wanted.
        """
        identities = identities or ("client.example.org",)
        self._clients += 1
        leaf = self.ca.issue_cert(*identities, common_name=common_name)
        pem = self.directory / f"client-{self._clients}.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(pem))
        return ClientCertificate(pem, tuple(identities), common_name)

    def qmqtls(
        self,
        port: int = 0,
        verify: str | None = "require",
        interface: str = "127.0.0.1",
        **extra: str,
    ) -> str:
        """
        A C{qmqtls:} endpoint string that serves this PKI's server certificate.

        @param port: the port (0: any free one).
        @param verify: C{require}, C{optional}, C{none}, or L{None} to leave
            out both C{verify} and C{caCerts}.
        @param interface: the address to bind.
        @param extra: more parameters, as they are.
        """
        params = {
            "privateKey": str(self.server_key),
            "certKey": str(self.server_cert),
            "interface": interface,
        }
        if verify is not None:
            params["caCerts"] = str(self.ca_pem)
            params["verify"] = verify
        params.update(extra)
        quoted = ":".join(f"{k}={quoteStringArgument(v)}" for k, v in params.items())
        return f"qmqtls:{port}:{quoted}"

    def client_options(
        self, client: ClientCertificate | None = None, hostname: str = "localhost"
    ) -> IOpenSSLClientConnectionCreator:
        """
        Twisted client TLS options that trust this CA and present C{client}.

        @param client: the certificate to present, or L{None} for none.
        @param hostname: the server name to verify.
        """
        trust = Certificate.loadPEM(self.ca_pem.read_text())
        if client is None:
            return optionsForClientTLS(hostname, trustRoot=trust)
        return optionsForClientTLS(
            hostname, trustRoot=trust, clientCertificate=client.private_certificate()
        )
