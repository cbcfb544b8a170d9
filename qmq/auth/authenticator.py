# -*- test-case-name: tests.test_auth -*-
"""One authenticator for every protocol: credentials in, a L{User} out.

A frontend (the STOMP session today; the HTTP API and WebSocket helpers
later) does two things at login::

    credentials = auth.credentials(vhost, login, passcode, identity)
    d = auth.authenticate(vhost, credentials, address)   # Deferred[User]

L{Authenticator.credentials} picks the kind: a passcode shaped like a JWT is
a token (when the virtual host takes tokens); a login or passcode is a
password; else a verified client certificate; else anonymous.

L{Authenticator.authenticate} runs the twisted.cred portal (one
L{twisted.cred.portal.Portal} with every checker of L{qmq.auth.checkers})
and then checks that the user may use the virtual host.  It fails with an
L{AuthError} whose C{short} and C{message} a frontend shows as they are:

    L{LoginFailed}      bad credentials: the same answer whether or not the
                        user exists, given after the throttle's delay
                        (L{qmq.auth.throttle}) and logged
    L{TokenRejected}    a token that has expired (said as such, so a browser
                        fetches a new one); other token faults are
                        L{LoginFailed}
    L{VhostRefused}     the user may not use that virtual host, or it does
                        not exist (one answer for both: nothing is told
                        about other applications)
    L{TooManyFailures}  the user name has failed so often from the address
                        (or the address, over all names) that its next
                        attempt would wait too long
    L{Busy}             too many password checks are under way or waiting

Password checks cost CPU on purpose (scrypt), so they are gated
(L{PasswordGate}): at most two at a time from one address (the others wait
their turn, in order), and at most C{max_pending} under way or waiting over
all addresses; past that a login is refused at once.  A burst of guesses
from one address thus costs two threads at a time, and after its first
failures the throttle spaces the rest.

The authenticator is off (L{Authenticator.enabled} false) when no user and
no token key is configured: the broker then keeps its anonymous,
loopback-only mode and frontends skip it entirely (no cost at CONNECT).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from twisted.cred.credentials import Anonymous, IUsernamePassword, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.cred.portal import Portal
from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq.auth.checkers import (
    AnonymousChecker,
    CertificateChecker,
    CertificateCredentials,
    IUser,
    PasswordChecker,
    Principal,
    Realm,
    TokenChecker,
    TokenCredentials,
    TokenRefused,
)
from qmq.auth.permissions import User
from qmq.auth.settings import AuthSettings, PermissionSettings, TokenSettings, UserSettings
from qmq.auth.throttle import LoginThrottle
from qmq.auth.tokens import TokenVerifier, looks_like_token

__all__ = [
    "AuthError",
    "Authenticator",
    "Busy",
    "LoginFailed",
    "TokenRejected",
    "TooManyFailures",
    "VhostRefused",
]

log = Logger()


class AuthError(Exception):
    """
    A login refused.

    @ivar short: a few words (a STOMP ERROR's C{message} header).
    @ivar message: a sentence for the client.
    """

    short = "access refused"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def login_refusal(failure: Failure, session: str) -> AuthError | None:
    """What a session's failed login check means for its client, in one
    place for every frontend that logs in (STOMP's CONNECT, AMQP's
    connection.open): the L{AuthError} to tell the client in its protocol's
    words, or None when the check itself broke (logged here with the
    session's id; the client is told the broker failed, never why).

    @param session: the session's id, for the log.
    """
    e = failure.value
    if isinstance(e, AuthError):
        return e
    log.failure("authentication failed in session {session}", failure, session=session)
    return None


class LoginFailed(AuthError):
    """Bad credentials (the same whether or not the user exists)."""


class TokenRejected(AuthError):
    """An expired token."""

    short = "token expired"


class VhostRefused(AuthError):
    """The virtual host does not exist or is not open to the user."""


class TooManyFailures(AuthError):
    """Too many failed logins from the client's address lately."""

    short = "too many failed logins"


class Busy(AuthError):
    """Too many password checks under way or waiting."""

    short = "broker busy"


class PasswordGate:
    """
    Bounds the password checks under way (see the module docstring).

    @ivar per_address: most checks at once from one address.
    @ivar max_pending: most checks under way or waiting, over all addresses.
    @ivar pending: checks under way or waiting now.
    """

    def __init__(self, per_address: int = 2, max_pending: int = 1000) -> None:
        self.per_address = per_address
        self.max_pending = max_pending
        self.pending = 0
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[defer.Deferred]] = {}

    def acquire(self, address: str) -> defer.Deferred | None:
        """A Deferred that fires when a check from C{address} may start, or
        None: refuse it (L{max_pending} reached).  Call L{release} after."""
        if self.pending >= self.max_pending:
            return None
        self.pending += 1
        running = self._running.get(address, 0)
        if running < self.per_address:
            self._running[address] = running + 1
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._waiting.setdefault(address, deque()).append(d)
        return d

    def release(self, address: str) -> None:
        """A check from C{address} is done: the next waiting one starts."""
        self.pending -= 1
        waiting = self._waiting.get(address)
        if waiting:
            d = waiting.popleft()
            if not waiting:
                del self._waiting[address]
            d.callback(None)  # the slot passes to it
            return
        running = self._running[address] - 1
        if running:
            self._running[address] = running
        else:
            del self._running[address]


#: The message of every bad-credentials refusal.
LOGIN_FAILED = "Login failed: unknown user, wrong password, or credentials not accepted here."


class Authenticator:
    """
    The broker's authentication and the source of L{User}s.

    @ivar enabled: whether any user or token key is configured.
    @ivar anonymous: whether clients without credentials are let in (as
        C{settings.anonymous_user}) while enabled.
    @ivar portal: the twisted.cred portal.
    @ivar throttle: the failed-login throttle.
    @ivar gate: the bound on password checks under way.
    """

    def __init__(
        self,
        settings: AuthSettings,
        clock: Any,
        users: Iterable[UserSettings] = (),
        permissions: Mapping[str, Iterable[PermissionSettings]] | None = None,
        tokens: Mapping[str, TokenSettings] | None = None,
        run: Callable[..., defer.Deferred] | None = None,
    ) -> None:
        """
        @param settings: the C{[auth]} section.
        @param clock: the reactor (delays, token times).
        @param users: the configured users.
        @param permissions: virtual host -> its users' permissions.
        @param tokens: virtual host -> its token settings.
        @param run: runs password checks (a thread by default).
        """
        self.settings = settings
        self.clock = clock
        users = list(users)
        tokens = dict(tokens or {})
        self.enabled = bool(users or tokens)
        self.anonymous = settings.anonymous
        self.throttle = LoginThrottle(
            clock,
            delay=settings.failure_delay,
            max_delay=settings.failure_max_delay,
            window=settings.failure_window,
            max_addresses=settings.max_tracked_addresses,
            address_threshold=settings.failure_address_threshold,
        )
        self.gate = PasswordGate()
        self.realm = Realm(
            {
                vhost: {p.user: (p.configure, p.write, p.read) for p in perms}
                for vhost, perms in (permissions or {}).items()
            },
            {vhost: (t.configure, t.write, t.read) for vhost, t in tokens.items()},
            {vhost: t.speak_for for vhost, t in tokens.items()},
        )
        self.portal = Portal(self.realm)
        hashes = {u.name: u.password for u in users if u.password}
        self.passwords = PasswordChecker(hashes, run)
        self.portal.registerChecker(self.passwords)
        #: The users by name (changed at run time by L{set_user} and
        #: L{delete_user}); C{"config"} or C{"runtime"} says where each came from.
        self.users: dict[str, UserSettings] = {u.name: u for u in users}
        self.user_sources: dict[str, str] = {u.name: "config" for u in users}
        #: Bumped by every change at run time (caches of logged-in users
        #: compare it, L{qmq.web.api}).
        self.generation = 0
        self.certificates = CertificateChecker(
            {name: u.name for u in users for name in u.certificate_names}
        )
        self.portal.registerChecker(self.certificates)
        self.tokens = TokenChecker({v: TokenVerifier(t, clock) for v, t in tokens.items()})
        self.portal.registerChecker(self.tokens)
        if settings.anonymous:
            self.portal.registerChecker(AnonymousChecker(settings.anonymous_user))

    # -- users and permissions at run time --------------------------------------

    def set_user(self, name: str, password_hash: str | None, certificate_names: tuple[str, ...] = ()) -> bool:
        """
        Add or replace the user C{name} (the HTTP API's C{PUT
        /api/v1/users/NAME}). It takes effect for the next login; sessions
        logged in already keep the user they got. Not written anywhere: a
        restart goes back to the configuration.

        @param password_hash: a hash from L{qmq.auth.hash_password} (checked),
            or None: no password login.
        @param certificate_names: names in a client certificate that log in
            as this user (replacing any it had).
        @return: whether the user is new.
        @raise qmq.auth.passwords.HashError: a bad hash.
        @raise ValueError: a certificate name belongs to another user.
        """
        for cert in certificate_names:
            owner = self.certificates.names.get(cert)
            if owner is not None and owner != name:
                raise ValueError(f"the certificate name {cert!r} logs in as the user {owner!r} already")
        self.passwords.set(name, password_hash)
        names = self.certificates.names
        for cert in [c for c, owner in names.items() if owner == name]:
            del names[cert]
        for cert in certificate_names:
            names[cert] = name
        new = name not in self.users
        self.users[name] = UserSettings(name, password_hash, tuple(certificate_names))
        if new:
            self.user_sources[name] = "runtime"
        self.generation += 1
        return new

    def delete_user(self, name: str) -> bool:
        """
        Remove the user C{name} and its permissions in every virtual host
        (until a restart, which reads the configuration again).

        @return: whether there was such a user.
        """
        if name not in self.users:
            return False
        del self.users[name]
        self.user_sources.pop(name, None)
        self.passwords.set(name, None)
        names = self.certificates.names
        for cert in [c for c, owner in names.items() if owner == name]:
            del names[cert]
        for users in self.realm.permissions.values():
            users.pop(name, None)
        self.generation += 1
        return True

    def permissions(self) -> list[tuple[str, PermissionSettings]]:
        """Every user's permissions: (virtual host, its settings), by virtual
        host then user."""
        return [
            (vhost, PermissionSettings(user, *patterns))
            for vhost, users in sorted(self.realm.permissions.items())
            for user, patterns in sorted(users.items())
        ]

    def permission(self, vhost: str, user: str) -> tuple[str, str, str] | None:
        """The (configure, write, read) patterns of C{user} in C{vhost}, or None."""
        return self.realm.permissions.get(vhost, {}).get(user)

    def set_permission(self, vhost: str, user: str, configure: str, write: str, read: str) -> bool:
        """
        Set C{user}'s patterns in C{vhost}; they apply from its next login.

        @return: whether the user had none there before.
        @raise re.error: a pattern is not a regular expression.
        """
        from qmq.auth.permissions import compile_pattern  # noqa: PLC0415

        for pattern in (configure, write, read):
            compile_pattern(pattern, user)
        users = self.realm.permissions.setdefault(vhost, {})
        new = user not in users
        users[user] = (configure, write, read)
        self.generation += 1
        return new

    def clear_permission(self, vhost: str, user: str) -> bool:
        """Take C{user}'s permissions in C{vhost} away; @return: whether it had some."""
        users = self.realm.permissions.get(vhost)
        if not users or user not in users:
            return False
        del users[user]
        self.generation += 1
        return True

    def refreshed(self, user: User) -> User | None:
        """C{user} (logged in before a change) with the permissions it has
        now, or None for a token's own subject (a token carries its own).
        A token that speaks for a user follows that user's permissions in
        its virtual host (the one it was let into), keeping its narrowing."""
        if user.source == "token":
            vhost = next(iter(user.permissions), None)
            if user.speaks_for is None or vhost is None:
                return None
            return self.realm.user(
                Principal(user.name, "token", vhost=vhost, expires=user.expires, destinations=user.destinations)
            )
        return self.realm.user(Principal(user.name, user.source))

    def credentials(
        self,
        vhost: str,
        login: str | None = None,
        passcode: str | None = None,
        identity: Any = None,
    ) -> Any:
        """
        The credentials a client presented, as twisted.cred credentials.

        @param vhost: the virtual host it asked for.
        @param login: its user name, if it gave one.
        @param passcode: its password or token, if it gave one.
        @param identity: its verified TLS client identity
            (L{qmq.tls.PeerIdentity}), if any.
        """
        if passcode and vhost in self.tokens.verifiers and looks_like_token(passcode):
            return TokenCredentials(passcode, vhost, login or None)
        if passcode is not None or login:
            return UsernamePassword(login or "", passcode or "")
        if identity is not None:
            return CertificateCredentials(identity, login or None)
        return Anonymous()

    def authenticate(
        self, vhost: str, credentials: Any, address: str = "", use_vhost: bool = True
    ) -> defer.Deferred:
        """
        Log a client in to C{vhost}.

        @param vhost: the virtual host's name.
        @param use_vhost: False: only identify the client (its tokens are
            still C{vhost}'s), without asking whether it may use C{vhost}
            (a monitoring identity may have no permission anywhere; what it
            may read is decided by L{qmq.core.access.may_monitor}).
        @param credentials: from L{credentials}.
        @param address: the client's address (for the throttle and the log).
        @return: a Deferred that fires with the L{User}, or fails with an
            L{AuthError} (after the throttle's delay for bad credentials).
        """
        wait = self.throttle.wait(address, _claimed(credentials))
        if wait is None:
            self._log_failure(address, credentials, vhost, "too many failed logins")
            return defer.fail(
                TooManyFailures(
                    "Too many failed logins from this address lately; try again later."
                )
            )
        if wait:
            d = deferLater(self.clock, wait, self._login, credentials, address)
        else:
            d = self._login(credentials, address)
        d.addCallback(self._logged_in, vhost if use_vhost else None, address, credentials)
        d.addErrback(self._refused, vhost, address, credentials)
        return d

    def _login(self, credentials: Any, address: str) -> defer.Deferred:
        if not IUsernamePassword.providedBy(credentials):
            return self.portal.login(credentials, None, IUser)
        gate = self.gate
        turn = gate.acquire(address)
        if turn is None:
            return defer.fail(Busy("The broker is busy checking other logins; try again later."))

        def done(result: Any) -> Any:
            gate.release(address)
            return result

        turn.addCallback(lambda _: self.portal.login(credentials, None, IUser))
        return turn.addBoth(done)

    def _logged_in(self, result: tuple, vhost: str | None, address: str, credentials: Any) -> User:
        user: User = result[1]
        # Right credentials: this pair's failures are forgotten.
        self.throttle.succeeded(address, _claimed(credentials))
        if vhost is not None and not user.may_use(vhost):
            self._log_failure(address, credentials, vhost, "virtual host refused", user.name)
            raise VhostRefused(f"Virtual host {vhost!r} is not open to this user.")
        return user

    def _refused(self, failure: Failure, vhost: str, address: str, credentials: Any) -> Any:
        if failure.check(AuthError):
            return failure
        if not failure.check(UnauthorizedLogin, UnhandledCredentials):
            return failure
        reason = failure.getErrorMessage()
        self._log_failure(address, credentials, vhost, reason)
        delay = self.throttle.failed(address, _claimed(credentials))
        if failure.check(TokenRefused) and failure.value.expired:
            error: AuthError = TokenRejected("The token has expired; log in with a new one.")
        else:
            error = LoginFailed(LOGIN_FAILED)

        def refuse(_: object = None) -> None:
            raise error

        return deferLater(self.clock, delay, refuse)

    def _log_failure(
        self, address: str, credentials: Any, vhost: str, reason: str, user: str | None = None
    ) -> None:
        if user is None:
            user = _claimed(credentials)
        log.warn(
            "login failed peer={address} user={user!r} vhost={vhost!r} method={method} "
            "reason={reason}",
            address=address or "?",
            user=(user or "")[:128],
            vhost=vhost[:128],
            method=type(credentials).__name__,
            reason=reason,
        )


def _claimed(credentials: Any) -> str:
    """The user name C{credentials} claim (a password's user name, the login
    sent with a certificate or a token), or C{""}: the throttle's key with
    the address, and the log's."""
    user = getattr(credentials, "username", None) or getattr(credentials, "login", None) or ""
    if isinstance(user, bytes):
        user = user.decode("utf-8", "replace")
    return user
