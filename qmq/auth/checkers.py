# -*- test-case-name: tests.test_auth -*-
"""twisted.cred credentials, checkers and the realm.

Each way of logging in is a kind of credentials and a checker for it
(C{ICredentialsChecker}): the checker turns credentials into an avatar id
(a L{Principal}: a name, how it logged in, and for a token its expiry and
narrowing) or fails with C{UnauthorizedLogin}; the L{Realm} turns a
principal into a L{qmq.auth.permissions.User}.

    credentials                 checker                 source
    UsernamePassword            L{PasswordChecker}      C{[users.NAME] password}
    L{CertificateCredentials}   L{CertificateChecker}   C{[users.NAME] certificate_names}
    L{TokenCredentials}         L{TokenChecker}         C{[vhosts."V".tokens]}
    Anonymous                   L{AnonymousChecker}     C{[auth] anonymous}

A password is checked in a thread (scrypt is slow on purpose); a user that
does not exist is checked against a dummy hash with the parameters of the
costliest hash in use (configured, or set at run time through the HTTP
API), so that the answer takes the same time whether or not the user
exists.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import IAnonymous, ICredentials, IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import IRealm
from twisted.internet import defer
from zope.interface import Attribute, Interface, implementer

from qmq.auth.passwords import ScryptHash, hash_password, parse_hash, verify_password
from qmq.auth.permissions import Permission, User
from qmq.auth.tokens import InvalidToken, TokenExpired, TokenVerifier

__all__ = [
    "AnonymousChecker",
    "CertificateChecker",
    "CertificateCredentials",
    "ICertificateCredentials",
    "ITokenCredentials",
    "IUser",
    "PasswordChecker",
    "Principal",
    "Realm",
    "TokenChecker",
    "TokenCredentials",
    "TokenRefused",
]


class IUser(Interface):
    """The avatar interface: a L{qmq.auth.permissions.User}."""

    name = Attribute("The user's name.")


class ICertificateCredentials(ICredentials):
    """A verified TLS client certificate."""

    identity = Attribute("The L{qmq.tls.PeerIdentity} of the certificate.")
    login = Attribute("The user name the client asked for, or None.")


class ITokenCredentials(ICredentials):
    """A browser token for one virtual host."""

    token = Attribute("The token (a JWT).")
    vhost = Attribute("The virtual host it is presented to.")
    login = Attribute("The user name the client gave, or None.")


@implementer(ICertificateCredentials)
@dataclass(frozen=True)
class CertificateCredentials:
    identity: Any
    login: str | None = None


@implementer(ITokenCredentials)
@dataclass(frozen=True)
class TokenCredentials:
    token: str
    vhost: str
    login: str | None = None


@dataclass(frozen=True)
class Principal:
    """
    The avatar id every checker returns.

    @ivar name: the user's name.
    @ivar source: C{"password"}, C{"certificate"}, C{"token"} or C{"anonymous"}.
    @ivar vhost: for a token, the virtual host it was issued for.
    @ivar expires: for a token, its C{exp}.
    @ivar destinations: for a token, its narrowing.
    """

    name: str
    source: str
    vhost: str | None = None
    expires: float | None = None
    destinations: Permission | None = None


class TokenRefused(UnauthorizedLogin):
    """A token was refused; C{expired} says whether only its time was wrong."""

    def __init__(self, message: str, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


def _in_thread(f: Callable[..., Any], *args: Any) -> defer.Deferred:
    from twisted.internet.threads import deferToThread  # noqa: PLC0415

    return deferToThread(f, *args)


#: The dummy's cost while no user has a password.
_CHEAPEST = 4


def _cost(h: ScryptHash) -> tuple[int, int]:
    """What checking a password against C{h} costs, as an order: scrypt's
    work is N * r * p, its memory N * r."""
    return ((1 << h.ln) * h.r * h.p, (1 << h.ln) * h.r)


def _dummy_like(model: ScryptHash | None) -> ScryptHash:
    """A hash no password matches (a random key) with C{model}'s
    parameters: checking it costs what checking C{model} does.  Made
    without deriving anything, so it is cheap to make again whenever a
    costlier hash appears.  Without a model (no user has a password, so
    there is nothing to tell apart) it is cheap."""
    ln, r, p = (model.ln, model.r, model.p) if model is not None else (_CHEAPEST, 8, 1)
    key_bytes = len(model.key) if model is not None else 32
    return ScryptHash(ln, r, p, os.urandom(16), os.urandom(key_bytes))


@implementer(ICredentialsChecker)
class PasswordChecker:
    """
    Users and their scrypt hashes.

    @param hashes: user name -> hash string (checked when made).
    @param run: runs a slow function and returns a Deferred of its result:
        a thread by default; tests pass a synchronous one.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(
        self,
        hashes: Mapping[str, str],
        run: Callable[..., defer.Deferred] | None = None,
    ) -> None:
        self._hashes: dict[str, ScryptHash] = {name: parse_hash(h) for name, h in hashes.items()}
        self._dummy = _dummy_like(None)
        self._follow_costliest()
        self._run = run if run is not None else _in_thread

    @property
    def dummy(self) -> ScryptHash:
        """The hash an unknown user (or one without a password) is checked
        against: the parameters of the costliest hash in use, so that a
        wrong password and an unknown user take the same time."""
        return self._dummy

    def _follow_costliest(self) -> None:
        costliest = max(self._hashes.values(), key=_cost, default=None)
        if costliest is None or _cost(costliest) != _cost(self._dummy):
            self._dummy = _dummy_like(costliest)

    def hash(self, password: str) -> defer.Deferred:
        """A new hash of C{password} (L{hash_password}, run as checks are:
        in a thread)."""
        return self._run(hash_password, password)

    def set(self, name: str, hashed: str | None) -> None:
        """Give C{name} the hash C{hashed} (None: no password login).

        @raise HashError: C{hashed} is not a valid hash.
        """
        if hashed is None:
            self._hashes.pop(name, None)
        else:
            self._hashes[name] = parse_hash(hashed)
        self._follow_costliest()

    def requestAvatarId(self, credentials: Any) -> defer.Deferred:
        username = credentials.username
        password = credentials.password
        if isinstance(username, bytes):
            username = username.decode("utf-8", "replace")
        hashed = self._hashes.get(username)
        d = self._run(verify_password, password, hashed if hashed is not None else self._dummy)

        def checked(ok: bool) -> Principal:
            if ok and hashed is not None:
                return Principal(username, "password")
            raise UnauthorizedLogin("bad user name or password")

        return d.addCallback(checked)


@implementer(ICredentialsChecker)
class CertificateChecker:
    """
    Certificate names mapped to users.

    @param names: a name in a certificate -> the user it logs in as.
    """

    credentialInterfaces = (ICertificateCredentials,)

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = dict(names)

    def user_of(self, identity: Any) -> str | None:
        """The user a certificate logs in as, or None."""
        for name in identity.names:
            user = self.names.get(name)
            if user is not None:
                return user
        return None

    def requestAvatarId(self, credentials: Any) -> defer.Deferred:
        user = self.user_of(credentials.identity)
        if user is None or (credentials.login and credentials.login != user):
            return defer.fail(UnauthorizedLogin("certificate names no user"))
        return defer.succeed(Principal(user, "certificate"))


@implementer(ICredentialsChecker)
class TokenChecker:
    """
    Each virtual host's token verifier.

    @param verifiers: virtual host name -> its L{TokenVerifier}.
    """

    credentialInterfaces = (ITokenCredentials,)

    def __init__(self, verifiers: Mapping[str, TokenVerifier]) -> None:
        self.verifiers = dict(verifiers)

    def requestAvatarId(self, credentials: Any) -> defer.Deferred:
        verifier = self.verifiers.get(credentials.vhost)
        if verifier is None:
            return defer.fail(TokenRefused("this virtual host takes no tokens"))
        try:
            claims = verifier.verify(credentials.token)
        except TokenExpired as e:
            return defer.fail(TokenRefused(str(e), expired=True))
        except InvalidToken as e:
            return defer.fail(TokenRefused(str(e)))
        if credentials.login and credentials.login != claims["sub"]:
            return defer.fail(TokenRefused("the login names another user than the token"))
        return defer.succeed(
            Principal(
                claims["sub"],
                "token",
                vhost=credentials.vhost,
                expires=float(claims["exp"]),
                destinations=claims.get("destinations"),
            )
        )


@implementer(ICredentialsChecker)
class AnonymousChecker:
    """Lets a client without credentials in as C{name} (C{[auth] anonymous})."""

    credentialInterfaces = (IAnonymous,)

    def __init__(self, name: str) -> None:
        self.name = name

    def requestAvatarId(self, credentials: Any) -> defer.Deferred:
        return defer.succeed(Principal(self.name, "anonymous"))


@implementer(IRealm)
class Realm:
    """
    Turns a L{Principal} into a L{User} with its permissions.

    A token's subject is an identity of its own (L{User.account} None, an
    owner that no user name collides with, never an admin) with the
    virtual host's token permissions, unless the virtual host's
    C{speak_for} names it: it is then that configured user, with that
    user's permissions in the token's virtual host (and the token's
    narrowing).

    @param permissions: virtual host -> user name -> its three patterns
        (C{(configure, write, read)}).
    @param token_permissions: virtual host -> the patterns of its token users.
    @param speak_for: virtual host -> the configured users its tokens may
        speak for.
    """

    def __init__(
        self,
        permissions: Mapping[str, Mapping[str, tuple[str, str, str]]],
        token_permissions: Mapping[str, tuple[str, str, str]],
        speak_for: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        #: virtual host -> user -> (configure, write, read); changed at run
        #: time by L{qmq.auth.Authenticator.set_permission}.
        self.permissions = {v: dict(users) for v, users in permissions.items()}
        self._token_permissions = dict(token_permissions)
        self._speak_for = {v: frozenset(names) for v, names in (speak_for or {}).items()}

    def user(self, principal: Principal) -> User:
        """The L{User} of a principal."""
        name = principal.name
        speaks_for = None
        if principal.source == "token":
            vhost: str = principal.vhost  # type: ignore[assignment]
            if name in self._speak_for.get(vhost, ()):
                speaks_for = name
                patterns = self.permissions.get(vhost, {}).get(name)
            else:
                patterns = self._token_permissions.get(vhost)
            grants = {vhost: patterns} if patterns is not None else {}
        else:
            grants = {v: users[name] for v, users in self.permissions.items() if name in users}
        return User(
            name=name,
            source=principal.source,
            permissions={v: Permission.of(*p, user=name) for v, p in grants.items()},
            destinations=principal.destinations,
            expires=principal.expires,
            speaks_for=speaks_for,
        )

    def requestAvatar(self, avatarId: Any, mind: Any, *interfaces: Any) -> tuple:
        if IUser not in interfaces:
            raise NotImplementedError("QMQ's realm only makes IUser avatars")
        return (IUser, self.user(avatarId), lambda: None)
