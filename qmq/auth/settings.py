# -*- test-case-name: tests.test_config,tests.test_auth -*-
"""Settings of authentication and authorization.

L{AuthSettings} is the C{[auth]} section (registered in
L{qmq.config.SECTIONS}); the users (C{[users.NAME]}), each virtual host's
permissions (C{[vhosts."V".permissions.NAME]}) and its token key
(C{[vhosts."V".tokens]}) are tables that L{qmq.config} checks with
L{check_users}, L{check_permissions} and L{check_tokens} (below, built from
the checkers of L{qmq.settings_schema}: each error names the dotted key)
and turns into the dataclasses below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qmq.auth.permissions import compile_pattern
from qmq.settings_schema import (
    _fail,
    _Invalid,
    _join,
    _number,
    _one_of,
    _Schema,
    _string,
    _string_list,
    _table,
)

__all__ = [
    "AuthSettings",
    "PermissionSettings",
    "TokenSettings",
    "UserSettings",
    "check_permissions",
    "check_tokens",
    "check_users",
]

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


# -- the tables' schemas (used by qmq.config) ---------------------------------


def _pattern(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise _fail(key, "a string (a regular expression)", value)
    try:
        compile_pattern(value, "user")
    except re.error as e:
        raise _Invalid(key, f"not a regular expression: {e}") from None
    return value


_PERMISSION_SCHEMA: _Schema = {"configure": _pattern, "write": _pattern, "read": _pattern}


def check_permissions(value: object, key: str) -> dict[str, dict[str, str]]:
    """Check a virtual host's C{permissions} table (user name -> patterns)."""
    if not isinstance(value, dict):
        raise _fail(key, "a table of users' permissions (e.g. [vhosts.\"/\".permissions.alice])", value)
    return {
        name: _table(item, _join(key, name), _PERMISSION_SCHEMA)
        for name, item in value.items()
    }


def _key_file(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, str) or not value:
        raise _fail(key, "a file name (a non-empty string)", value)
    try:
        data = Path(value).read_bytes()
    except OSError as e:
        raise _Invalid(key, f"cannot read {value!r}: {e.strerror or e}") from None
    return {"key_file": value, "key": data}


_TOKEN_SCHEMA: _Schema = {
    "algorithm": _one_of(TOKEN_ALGORITHMS),
    "key_file": _key_file,
    "audience": _string,
    "issuer": _string,
    "leeway": _number(minimum=0),
    "max_lifetime": _number(minimum=0),
    "speak_for": lambda value, key: _string_list(value, key),
    **_PERMISSION_SCHEMA,
}


def check_tokens(value: object, key: str) -> dict[str, Any]:
    """Check a virtual host's C{tokens} table; the key file is read (and an
    HMAC secret's length or a public key's PEM checked) here, so a bad key
    is a configuration error naming C{key_file}."""
    table = _table(
        value,
        key,
        _TOKEN_SCHEMA,
        {"algorithm": "one of " + ", ".join(TOKEN_ALGORITHMS), "key_file": "a file name"},
    )
    table.update(table.pop("key_file"))
    key_bytes = table["key"]
    if table["algorithm"].startswith("HS"):
        table["key"] = key_bytes.strip()
        if len(table["key"]) < 32:
            raise _Invalid(
                _join(key, "key_file"),
                f"an HMAC secret needs at least 32 bytes; {table['key_file']!r} has "
                f"{len(table['key'])}",
            )
    else:
        from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
            load_pem_public_key,
        )

        try:
            load_pem_public_key(key_bytes)
        except ValueError:
            raise _Invalid(
                _join(key, "key_file"),
                f"{table['key_file']!r} holds no PEM public key (needed for "
                f"{table['algorithm']})",
            ) from None
    return table



def _password_hash(value: object, key: str) -> str:
    from qmq.auth.passwords import HashError, parse_hash  # noqa: PLC0415

    if not isinstance(value, str):
        raise _fail(key, "a password hash printed by qmq-passwd", value)
    try:
        parse_hash(value)
    except HashError as e:
        raise _Invalid(key, str(e)) from None
    return value


_USER_SCHEMA: _Schema = {"password": _password_hash, "certificate_names": _string_list}


def check_users(value: object, key: str) -> dict[str, dict[str, Any]]:
    """Check the top-level C{users} table (user name -> password hash and
    certificate names)."""
    if not isinstance(value, dict):
        raise _fail(key, "a table of users (e.g. [users.alice])", value)
    result = {}
    for name, item in value.items():
        if not name:
            raise _Invalid(_join(key, name), "a user needs a non-empty name")
        result[name] = _table(item, _join(key, name), _USER_SCHEMA)
    return result
