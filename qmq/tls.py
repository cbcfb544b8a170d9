# -*- test-case-name: tests.test_tls -*-
"""TLS listeners that can require client certificates, and the peer's identity.

Twisted's server C{ssl:} endpoint string cannot ask for, nor verify, a
client certificate.  This module adds QMQ's own endpoint type, C{qmqtls:},
registered as an L{IStreamServerEndpointStringParser} plugin by
C{twisted/plugins/qmq_endpoints.py}, so it works wherever an endpoint string
does (C{--listen stomp:qmqtls:...}, C{listen = [...]} in the configuration)::

    qmqtls:61614:privateKey=key.pem:certKey=cert.pem:caCerts=ca.pem:verify=require

The flow:

    1. L{QMQTLSServerParser.parseStreamServer} gets the endpoint string's
       parameters, reads the PEM files and checks everything, raising
       L{EndpointError} (which names the parameter) for a mistake.
    2. L{server_options} builds a L{CertificateOptions}: with C{verify=require}
       a client without a certificate signed by one of C{caCerts} is refused
       during the handshake; with C{verify=optional} a client may send no
       certificate, but one it sends must verify; with C{verify=none} none is
       asked for.
    3. The result is an L{SSL4ServerEndpoint}: the same listener as C{ssl:}
       (Twisted's memory-BIO TLS), with C{backlog=1024} by default.

Once a connection's handshake is done (a protocol that provides
L{IHandshakeListener} is told so by C{handshakeCompleted}),
L{peer_identity} reads the verified client certificate from the transport:
its subject common name and subject alternative names.  Cluster links and
certificate-based authentication build on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.interfaces import (
    IReactorSSL,
    ISSLTransport,
    IStreamServerEndpoint,
    IStreamServerEndpointStringParser,
)
from twisted.internet.ssl import CertificateOptions
from twisted.plugin import IPlugin
from zope.interface import implementer

__all__ = [
    "DEFAULT_BACKLOG",
    "VERIFY_MODES",
    "EndpointError",
    "PeerIdentity",
    "QMQTLSServerParser",
    "peer_identity",
    "server_options",
]

#: The listen backlog of a C{qmqtls:} endpoint that names none.  Twisted's
#: default of 50 overflows under a burst of connects (docs/tls.rst).
DEFAULT_BACKLOG = 1024

#: The values of C{verify=}.
VERIFY_MODES = ("require", "optional", "none")

_PARAMETERS = (
    "port",
    "privateKey",
    "certKey",
    "caCerts",
    "verify",
    "interface",
    "backlog",
    "extraCertChain",
)


class EndpointError(ValueError):
    """
    A C{qmqtls:} endpoint string is wrong; the message names the parameter,
    e.g. C{qmqtls: caCerts: cannot read 'ca.pem': No such file or directory}.
    """

    def __init__(self, parameter: str, problem: str) -> None:
        self.parameter = parameter
        self.problem = problem
        super().__init__(f"qmqtls: {parameter}: {problem}" if parameter else f"qmqtls: {problem}")


def _read(parameter: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise EndpointError(parameter, f"cannot read {path!r}: {e.strerror or e}") from None


def _certificates(parameter: str, path: str) -> list[x509.Certificate]:
    """Every certificate in a PEM file, in order (at least one)."""
    data = _read(parameter, path)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise EndpointError(parameter, f"no PEM certificate found in {path!r}") from None


def _private_key(parameter: str, path: str) -> crypto.PKey:
    data = _read(parameter, path)
    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:
        raise EndpointError(
            parameter, f"the key in {path!r} is encrypted; QMQ needs it unencrypted"
        ) from None
    except (ValueError, crypto.Error):
        raise EndpointError(parameter, f"no PEM private key found in {path!r}") from None
    return crypto.PKey.from_cryptography_key(key)  # type: ignore[arg-type]


class _ServerOptions(CertificateOptions):
    """
    L{CertificateOptions} that also tell clients which CAs they may present a
    certificate from (the TLS C{certificate_authorities} list), so a client
    holding several certificates can pick the right one.
    """

    def __init__(self, *args: Any, clientCAs: Sequence[crypto.X509] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clientCANames = [ca.get_subject() for ca in clientCAs]

    def getContext(self) -> SSL.Context:
        # The context is cached and shared by every connection; once one
        # connection used it, pyOpenSSL refuses to change it: set the list once.
        fresh = self._context is None
        context = super().getContext()
        if fresh and self._clientCANames:
            context.set_client_ca_list(self._clientCANames)
        return context


def server_options(
    private_key: crypto.PKey,
    certificate: crypto.X509,
    ca_certs: Sequence[crypto.X509] = (),
    verify: str = "none",
    extra_chain: Sequence[crypto.X509] = (),
) -> CertificateOptions:
    """
    Build the TLS options of a server that may verify client certificates.

    @param private_key: the server's private key.
    @param certificate: the server's certificate.
    @param ca_certs: the CAs that sign acceptable client certificates.
    @param verify: C{"require"}: a client must present a certificate signed by
        one of C{ca_certs}; C{"optional"}: a client may present none, but one
        it presents must verify; C{"none"}: no client certificate is asked for.
    @param extra_chain: intermediate certificates sent after C{certificate}.
    @return: options for L{SSL4ServerEndpoint}.
    @raise EndpointError: if C{verify} is unknown, if it needs C{ca_certs} and
        there are none, or if the key does not match the certificate.
    """
    if verify not in VERIFY_MODES:
        raise EndpointError("verify", f"expected one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    if verify != "none" and not ca_certs:
        raise EndpointError(
            "caCerts", f"verify={verify} needs caCerts=FILE (the CAs of client certificates)"
        )
    common = dict(
        privateKey=private_key,
        certificate=certificate,
        extraCertChain=list(extra_chain),
    )
    if verify == "none":
        options = _ServerOptions(**common)
    else:
        # verify=True with caCerts is CertificateOptions' own spelling of
        # "ask for a certificate and verify it"; requireCertificate=False
        # leaves out VERIFY_FAIL_IF_NO_PEER_CERT, which is what "optional"
        # means.  (trustRoot= would always require one.)
        options = _ServerOptions(
            verify=True,
            caCerts=list(ca_certs),
            requireCertificate=verify == "require",
            clientCAs=ca_certs,
            **common,
        )
    try:
        options.getContext()
    except SSL.Error as e:
        raise EndpointError("privateKey", f"does not match certKey ({e})") from None
    return options


@implementer(IPlugin, IStreamServerEndpointStringParser)
class QMQTLSServerParser:
    """
    The C{qmqtls:} server endpoint string parser.

    Parameters (Twisted's endpoint-string syntax; escape a C{:} in a path as
    C{\\:}):

        - C{port} (or the first positional argument): the TCP port.
        - C{privateKey}: PEM file with the server's private key (required).
        - C{certKey}: PEM file with the server's certificate, optionally
          followed by its chain; defaults to C{privateKey}.
        - C{caCerts}: PEM file with the CA certificates that sign client
          certificates.
        - C{verify}: C{require}, C{optional} or C{none}; C{require} if
          C{caCerts} is given, else C{none}.
        - C{interface}: the address to bind (default: all).
        - C{backlog}: the listen backlog (default L{DEFAULT_BACKLOG}).
        - C{extraCertChain}: PEM file with more chain certificates.
    """

    prefix = "qmqtls"

    def parseStreamServer(
        self, reactor: IReactorSSL, *args: str, **kwargs: str
    ) -> IStreamServerEndpoint:
        """
        Parse C{qmqtls:} parameters into a listening endpoint.

        @param reactor: the reactor the endpoint listens with.
        @param args: positional parameters (only the port).
        @param kwargs: named parameters, all strings.
        @return: an L{SSL4ServerEndpoint}.
        @raise EndpointError: naming the parameter at fault.
        """
        if len(args) > 1:
            raise EndpointError("", f"unexpected positional parameters {list(args[1:])!r}")
        params = dict(kwargs)
        if args:
            if "port" in params:
                raise EndpointError("port", "given twice")
            params["port"] = args[0]
        unknown = sorted(set(params) - set(_PARAMETERS))
        if unknown:
            raise EndpointError(
                unknown[0], f"unknown parameter (expected one of {', '.join(_PARAMETERS)})"
            )
        port = _int_parameter(params, "port", None, 0, 65535)
        backlog = _int_parameter(params, "backlog", DEFAULT_BACKLOG, 1, None)
        if "privateKey" not in params:
            raise EndpointError("privateKey", "required (a PEM file with the server's key)")
        key = _private_key("privateKey", params["privateKey"])
        chain = _certificates("certKey", params.get("certKey", params["privateKey"]))
        extra = chain[1:]
        if "extraCertChain" in params:
            extra += _certificates("extraCertChain", params["extraCertChain"])
        cas = _certificates("caCerts", params["caCerts"]) if "caCerts" in params else []
        verify = params.get("verify", "require" if cas else "none")
        options = server_options(
            key,
            crypto.X509.from_cryptography(chain[0]),
            [crypto.X509.from_cryptography(ca) for ca in cas],
            verify,
            [crypto.X509.from_cryptography(c) for c in extra],
        )
        return SSL4ServerEndpoint(
            reactor, port, options, backlog=backlog, interface=params.get("interface", "")
        )


def _int_parameter(
    params: dict[str, str], name: str, default: int | None, low: int, high: int | None
) -> int:
    if name not in params:
        if default is None:
            raise EndpointError(name, "required")
        return default
    raw = params[name]
    expected = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
    try:
        value = int(raw)
    except ValueError:
        raise EndpointError(name, f"expected {expected}, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise EndpointError(name, f"expected {expected}, got {raw!r}")
    return value


@dataclass(frozen=True)
class PeerIdentity:
    """
    Who is at the other end of a TLS connection, from their certificate.

    @ivar common_name: the subject's CN, or L{None} (certificates made by
        C{trustme}, among others, have none: use the SANs).
    @ivar subject: the whole subject, RFC 4514 (C{"CN=node1,O=QMQ"}).
    @ivar issuer: the issuer, RFC 4514.
    @ivar dns_names: DNS names among the subject alternative names.
    @ivar ip_addresses: IP addresses among them, as text.
    @ivar emails: e-mail addresses among them.
    @ivar uris: URIs among them.
    @ivar fingerprint: the SHA-256 of the certificate (DER), lower-case hex.
    """

    common_name: str | None
    subject: str
    issuer: str
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    fingerprint: str = ""

    @classmethod
    def from_certificate(cls, certificate: x509.Certificate | crypto.X509) -> PeerIdentity:
        """
        Read the identity in a certificate.

        @param certificate: a C{cryptography} or C{pyOpenSSL} certificate.
        @return: its identity.
        """
        if isinstance(certificate, crypto.X509):
            certificate = certificate.to_cryptography()
        names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        common_name = str(names[0].value) if names else None
        try:
            san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            san = x509.SubjectAlternativeName([])
        return cls(
            common_name=common_name,
            subject=certificate.subject.rfc4514_string(),
            issuer=certificate.issuer.rfc4514_string(),
            dns_names=tuple(san.get_values_for_type(x509.DNSName)),
            ip_addresses=tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress)),
            emails=tuple(san.get_values_for_type(x509.RFC822Name)),
            uris=tuple(san.get_values_for_type(x509.UniformResourceIdentifier)),
            fingerprint=hashlib.sha256(certificate.public_bytes(Encoding.DER)).hexdigest(),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """
        Every name the certificate gives its subject: the CN first (if any),
        then the DNS names, e-mail addresses, URIs and IP addresses.
        """
        cn = (self.common_name,) if self.common_name is not None else ()
        return cn + self.dns_names + self.emails + self.uris + self.ip_addresses


def peer_identity(transport: object) -> PeerIdentity | None:
    """
    The identity in the client certificate of a TLS connection.

    On a C{qmqtls:} listener with C{verify=require} or C{verify=optional} a
    certificate that is there has been verified against C{caCerts} (the
    handshake fails otherwise); with C{verify=none} and on C{ssl:} listeners
    none is asked for, so there is none.  Call it once the handshake is done:
    in C{handshakeCompleted} (L{IHandshakeListener}) or when data arrives.

    @param transport: a protocol's transport.
    @return: the identity, or L{None} if the transport is not TLS, the
        handshake is not done, or the peer sent no certificate.
    """
    if not ISSLTransport.providedBy(transport):
        return None
    try:
        certificate = transport.getPeerCertificate()  # type: ignore[attr-defined]
    except SSL.Error:
        return None
    if certificate is None:
        return None
    return PeerIdentity.from_certificate(certificate)
