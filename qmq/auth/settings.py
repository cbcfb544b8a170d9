"""Settings of authentication and authorization.

L{AuthSettings} is the C{[auth]} section (registered in
L{qmq.config.SECTIONS}); the users (C{[users.NAME]}), each virtual host's
permissions (C{[vhosts."V".permissions.NAME]}) and its token key
(C{[vhosts."V".tokens]}) are tables that L{qmq.config} checks and turns into
the dataclasses below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AuthSettings", "PermissionSettings", "TokenSettings", "UserSettings"]

#: Algorithms a virtual host's tokens may be signed with (PyJWT names).
TOKEN_ALGORITHMS = (
    "HS256", "HS384", "HS512",
    "RS256", "RS384", "RS512",
    "PS256", "PS384", "PS512",
    "ES256", "ES384", "ES512",
    "EdDSA",
)


@dataclass(frozen=True)
class AuthSettings:
    """
    The C{[auth]} section.

    @ivar anonymous: once authentication is on (users or tokens are
        configured), whether a client that presents no credentials is let in
        as the user C{anonymous_user} (with that name's permissions).
    @ivar anonymous_user: the name anonymous clients get.
    @ivar allow_unauthenticated_remote: let a listener on a non-loopback
        interface start although clients reach it without authentication
        (authentication off, or C{anonymous} on).
    @ivar failure_delay: seconds before a failed login is answered; it
        doubles with each failure of the same user name from the same
        address (a success forgets them).
    @ivar failure_max_delay: the longest such delay.
    @ivar failure_window: seconds after which failures are forgotten.
    @ivar max_tracked_addresses: most (address, user name) pairs, and most
        addresses, whose failures are remembered.
    @ivar failure_address_threshold: failed logins from one address, over
        all user names, within C{failure_window}, past which every login
        from that address is slowed (password spraying), but for the names
        that logged in from it within the window.
    """

    anonymous: bool = False
    anonymous_user: str = "anonymous"
    allow_unauthenticated_remote: bool = False
    failure_delay: float = field(default=1.0, metadata={"above": 0})
    failure_max_delay: float = field(default=30.0, metadata={"above": 0})
    failure_window: float = field(default=300.0, metadata={"above": 0})
    max_tracked_addresses: int = field(default=10_000, metadata={"min": 1})
    failure_address_threshold: int = field(default=20, metadata={"min": 0})


@dataclass(frozen=True)
class UserSettings:
    """
    A user (C{[users.NAME]}).

    @ivar password: the scrypt hash (from C{qmq-passwd}), or None: the user
        cannot log in with a password.
    @ivar certificate_names: names in a client certificate (its CN, or a DNS
        name, e-mail or URI among its subject alternative names) that log in
        as this user.
    """

    name: str
    password: str | None = None
    certificate_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PermissionSettings:
    """One user's patterns in one virtual host (C{[vhosts."V".permissions.NAME]})."""

    user: str
    configure: str = ""
    write: str = ""
    read: str = ""
    speak_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenSettings:
    """
    How a virtual host checks browser tokens (C{[vhosts."V".tokens]}).

    @ivar algorithm: one of L{TOKEN_ALGORITHMS}.
    @ivar key: the HMAC secret, or the PEM public key (read from C{key_file}).
    @ivar key_file: where the key was read from.
    @ivar audience: the C{aud} a token must name, or None.
    @ivar issuer: the C{iss} a token must name, or None.
    @ivar leeway: seconds of clock skew allowed on C{exp} and C{nbf}.
    @ivar max_lifetime: most seconds a token may live, from now and from its
        C{iat} (C{exp} - now and C{exp} - C{iat} are both at most this);
        0: no limit.  An C{iat} later than now + C{leeway} is refused.
    @ivar configure: the most any token user of this virtual host may
        configure (a pattern, as a permission's).
    @ivar write: the most it may write.
    @ivar read: the most it may read.
    @ivar speak_for: configured users (names) this virtual host's tokens may
        speak for: a token whose C{sub} is one of them is that user (its
        permissions here, its durable subscriptions, its admin rights).  Any
        other subject is an identity of its own, never a configured user.
    """

    algorithm: str
    key: bytes
    key_file: str = ""
    audience: str | None = None
    issuer: str | None = None
    leeway: float = 0.0
    max_lifetime: float = 86_400.0
    configure: str = ""
    write: str = ""
    read: str = ""
    speak_for: tuple[str, ...] = ()
