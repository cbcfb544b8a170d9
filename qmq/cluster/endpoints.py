# -*- test-case-name: tests.test_cluster_settings -*-
"""Where links between nodes go: peer endpoint strings, the C{peer:}
listener's endpoint, and the TLS options of both ends.

The flow:

    1. C{[cluster] peers} holds Twisted client endpoint strings; each is
       checked when the configuration is loaded (L{parse_peer}): C{ssl:} or
       C{tcp:}, a host and a port, and optionally C{node=NAME}, the node
       expected there. The PEM files of C{ca}, C{certificate} and
       C{private_key} are read then too (L{read_pem}).
    2. When the service is built, L{check_settings} checks what needs two
       keys together: an C{ssl:} peer or listener needs the three files, a
       C{tcp:} one needs C{allow_plaintext}.
    3. L{client_endpoint} turns a peer into an endpoint: C{ssl:} becomes a
       L{HostnameEndpoint} wrapped in TLS with Twisted's
       L{optionsForClientTLS}: the peer's certificate must be signed by
       C{ca} (the trust root) and name the host dialed, or the C{node=}
       given (service-identity checks it), and this node presents its own
       certificate. C{tcp:} is Twisted's own C{clientFromString}.
    4. L{server_endpoint} makes the C{peer:} listener's endpoint:
       C{peer:ssl:PORT[:interface=...][:backlog=N]} is an
       L{SSL4ServerEndpoint} that requires a client certificate signed by
       C{ca} (L{qmq.tls.server_options}); C{peer:tcp:...} is Twisted's own,
       with C{allow_plaintext} only.

A verified certificate is not enough: the link (L{qmq.cluster.link})
checks, once the peer said who it is, that its certificate names that node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from OpenSSL import crypto
from twisted.internet.endpoints import (
    HostnameEndpoint,
    SSL4ServerEndpoint,
    clientFromString,
    serverFromString,
    wrapClientTLS,
)
from twisted.internet.ssl import (
    Certificate,
    KeyPair,
    PrivateCertificate,
    optionsForClientTLS,
    trustRootFromCertificates,
)

from qmq.core.ids import NODE_ID
from qmq.tls import EndpointError, server_options

__all__ = [
    "Peer",
    "certified_name",
    "check_settings",
    "client_endpoint",
    "parse_peer",
    "read_pem",
    "server_endpoint",
    "shift_port",
]

#: The parameters an C{ssl:} peer may have.
_SSL_PARAMETERS = ("host", "port", "node", "timeout", "bindAddress")
_SPLIT = re.compile(r"(?<!\\):")


def _split(text: str) -> tuple[list[str], dict[str, str]]:
    """Twisted's endpoint-string syntax: C{:}-separated, C{\\:} escaped,
    positional arguments and C{name=value} ones."""
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for part in _SPLIT.split(text):
        part = part.replace("\\:", ":")
        name, eq, value = part.partition("=")
        if eq:
            kwargs[name] = value
        else:
            args.append(part)
    return args, kwargs


@dataclass(frozen=True)
class Peer:
    """One entry of C{[cluster] peers}.

    @ivar text: the entry as written.
    @ivar kind: C{"ssl"} or C{"tcp"}.
    @ivar host: the host dialed.
    @ivar port: the port dialed.
    @ivar node: the node expected there, or C{""} (any node the CA signed
        a certificate for that also names the host).
    @ivar endpoint: for C{tcp:}, the endpoint string without C{node=}.
    @ivar options: for C{ssl:}, C{timeout} and C{bindAddress}.
    """

    text: str
    kind: str
    host: str
    port: int
    node: str = ""
    endpoint: str = ""
    options: dict[str, Any] = field(default_factory=dict, compare=False)


#: A worker's node id: its host's node id, then C{-w} and its index
#: (L{qmq.workers.worker.worker_node}).
_WORKER_NODE = re.compile(r"(.+)-w[0-9]+\Z")


def certified_name(node: str) -> str:
    """The name node C{node}'s certificate carries: a worker of a host's
    (C{NODE-wI}) presents its host's certificate, which names C{NODE}
    (docs/workers.rst); any other node, its own id."""
    match = _WORKER_NODE.match(node)
    return match.group(1) if match else node


def shift_port(text: str, by: int, positional: int) -> str:
    """Endpoint string C{text} with its port C{by} higher (worker I of a
    host listens for links on the C{peer:} port plus I, and says so in
    its C{advertise}). The port is the C{port=} parameter, else the
    positional argument at index C{positional} (1 for a client's
    C{ssl:HOST:PORT}, 0 for a server's C{ssl:PORT}).

    @raise ValueError: no port there, or the new one is out of range.
    """
    kind, colon, rest = text.partition(":")
    parts = _SPLIT.split(rest)
    index = next((i for i, part in enumerate(parts) if part.startswith("port=")), None)
    prefix = "port="
    if index is None:
        prefix = ""
        plain = [i for i, part in enumerate(parts) if "=" not in part]
        index = plain[positional] if len(plain) > positional else None
    if index is None or not parts[index][len(prefix):].isdigit():
        raise ValueError(f"no port in {text!r}")
    port = int(parts[index][len(prefix):]) + by
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range ({text!r} plus {by})")
    parts[index] = f"{prefix}{port}"
    return f"{kind}{colon}{':'.join(parts)}"


def parse_peer(text: str) -> Peer:
    """Check a peer endpoint string.

    @raise ValueError: naming what is wrong.
    """
    kind, colon, rest = text.partition(":")
    if not colon or kind not in ("ssl", "tcp"):
        raise ValueError(
            f"expected an ssl: (or, with allow_plaintext, tcp:) client endpoint string, got {text!r}"
        )
    args, kwargs = _split(rest)
    node = kwargs.pop("node", "")
    if node and not NODE_ID.match(node):
        raise ValueError(f"node={node!r} is not a node id (1 to 32 letters, digits, '_' or '-')")
    if kind == "ssl":
        unknown = sorted(set(kwargs) - set(_SSL_PARAMETERS))
        if unknown:
            raise ValueError(
                f"ssl: parameter {unknown[0]!r} is not accepted (expected {', '.join(_SSL_PARAMETERS)}; "
                "the certificates are [cluster] ca, certificate and private_key)"
            )
    host = kwargs.get("host", args[0] if args else "")
    port_text = kwargs.get("port", args[1] if len(args) > 1 else "")
    if not host:
        raise ValueError(f"no host in {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"no port (an integer) in {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range in {text!r}")
    options: dict[str, Any] = {}
    if "timeout" in kwargs:
        try:
            options["timeout"] = float(kwargs["timeout"])
        except ValueError:
            raise ValueError(f"timeout={kwargs['timeout']!r} is not a number") from None
    if "bindAddress" in kwargs:
        options["bindAddress"] = (kwargs["bindAddress"], 0)
    endpoint = ""
    if kind == "tcp":
        endpoint = ":".join(p for p in _SPLIT.split(text) if not p.startswith("node="))
    return Peer(text, kind, host, port, node, endpoint, options)


def read_pem(kind: str, path: str) -> list[Any]:
    """Read a PEM file of C{kind} (C{"certificates"} or C{"private key"}).

    @return: pyOpenSSL certificates (at least one), or a one-item list of
        the key.
    @raise ValueError: it cannot be read or holds no such thing.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None
    try:
        if kind == "private key":
            return [crypto.load_privatekey(crypto.FILETYPE_PEM, data)]
        from cryptography import x509  # noqa: PLC0415

        return [crypto.X509.from_cryptography(c) for c in x509.load_pem_x509_certificates(data)]
    except (ValueError, crypto.Error):
        raise ValueError(f"no PEM {kind} found in {path!r}") from None


@dataclass(frozen=True)
class Credentials:
    """This node's TLS material: the CA, its certificate chain and key."""

    ca: list[Any]
    chain: list[Any]
    key: Any

    @classmethod
    def load(cls, settings: Any) -> Credentials:
        return cls(
            read_pem("certificates", settings.ca),
            read_pem("certificates", settings.certificate),
            read_pem("private key", settings.private_key)[0],
        )

    def client_options(self, hostname: str) -> Any:
        """Twisted's client TLS options: the peer's certificate must be
        signed by the CA and name C{hostname}; this node presents its own."""
        own = PrivateCertificate.fromCertificateAndKeyPair(
            Certificate(self.chain[0]), KeyPair(self.key)
        )
        trust = trustRootFromCertificates([Certificate(c) for c in self.ca])
        return optionsForClientTLS(
            hostname,
            trustRoot=trust,
            clientCertificate=own,
            extraCertificateOptions={"extraCertChain": self.chain[1:]} if len(self.chain) > 1 else None,
        )

    def server_options(self) -> Any:
        """Server TLS options requiring a client certificate the CA signed."""
        return server_options(self.key, self.chain[0], self.ca, "require", self.chain[1:])


def check_settings(settings: Any, listeners: list[str]) -> tuple[str, str] | None:
    """What needs two keys of C{[cluster]} together (or a listener and
    them).

    @param settings: the C{[cluster]} settings.
    @param listeners: the C{peer:} listeners' endpoint descriptions.
    @return: None, or C{(key, problem)} (the key C{"listen"} for a listener).
    """
    tls = _missing(settings)
    for index, text in enumerate(settings.peers):
        peer = parse_peer(text)
        if peer.kind == "tcp" and not settings.allow_plaintext:
            return (
                f"cluster.peers[{index}]",
                "a tcp: peer is neither encrypted nor authenticated; "
                "use ssl:, or set cluster.allow_plaintext = true (tests only)",
            )
        if peer.kind == "ssl" and tls:
            return f"cluster.peers[{index}]", f"an ssl: peer needs cluster.{tls}"
    for description in listeners:
        problem = _check_listener(settings, description)
        if problem is not None:
            return "listen", problem
    return None


def _missing(settings: Any) -> str:
    """The first TLS key of C{[cluster]} not set, or C{""}."""
    for key in ("ca", "certificate", "private_key"):
        if not getattr(settings, key):
            return key
    return ""


def _check_listener(settings: Any, description: str) -> str | None:
    kind = description.partition(":")[0]
    if kind == "tcp" and not settings.allow_plaintext:
        return (
            f"peer:{description}: a tcp: link listener is neither encrypted nor "
            "authenticated; use peer:ssl:, or set cluster.allow_plaintext = true (tests only)"
        )
    if kind == "ssl" and _missing(settings):
        return f"peer:{description} needs cluster.{_missing(settings)}"
    if kind not in ("ssl", "tcp"):
        return f"expected peer:ssl:PORT (or peer:tcp:PORT), got peer:{description}"
    return None


def client_endpoint(reactor: Any, peer: Peer, credentials: Credentials | None) -> Any:
    """The endpoint to dial C{peer} with (see the module docstring); a
    C{unix} peer is made by code only (the workers of one host,
    L{qmq.workers.worker}), never read from C{peers}."""
    if peer.kind in ("tcp", "unix"):
        return clientFromString(reactor, peer.endpoint)
    assert credentials is not None
    tcp = HostnameEndpoint(reactor, peer.host, peer.port, **peer.options)
    return wrapClientTLS(credentials.client_options(certified_name(peer.node) if peer.node else peer.host), tcp)


def server_endpoint(reactor: Any, description: str, settings: Any) -> Any:
    """The C{peer:} listener's endpoint for C{description} (what follows
    C{peer:}).

    @raise ValueError: it cannot be used (the message says why).
    """
    problem = _check_listener(settings, description)
    if problem is not None:
        raise ValueError(problem)
    kind, _, rest = description.partition(":")
    if kind == "tcp":
        return serverFromString(reactor, description)
    args, kwargs = _split(rest)
    unknown = sorted(set(kwargs) - {"port", "interface", "backlog"})
    if unknown:
        raise ValueError(
            f"parameter {unknown[0]!r} is not accepted (port, interface, backlog; the "
            "certificates are [cluster] ca, certificate and private_key)"
        )
    try:
        port = int(kwargs.get("port", args[0] if args else ""))
        backlog = int(kwargs.get("backlog", "1024"))
    except ValueError:
        raise ValueError(f"expected a port and a backlog as integers in peer:{description}") from None
    try:
        options = Credentials.load(settings).server_options()
    except EndpointError as e:
        raise ValueError(f"cluster.private_key does not match cluster.certificate ({e})") from None
    return SSL4ServerEndpoint(
        reactor, port, options, backlog=backlog, interface=kwargs.get("interface", "")
    )
