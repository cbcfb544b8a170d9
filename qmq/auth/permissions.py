# -*- test-case-name: tests.test_auth -*-
"""Who may do what: RabbitMQ's permission model, and the L{User} every frontend holds.

A user has, per virtual host, three regular expressions, as in RabbitMQ:

    configure   create or delete a resource (a queue made by naming it, a
                durable subscription's queue, a temporary reply queue)
    write       publish to a resource (a queue, an exchange)
    read        consume from a resource (a queue), or bind to it (an exchange)

A regular expression is searched for in the resource's name (unanchored, as
RabbitMQ's C{re:run}: write C{^orders$} for one name); the empty string
allows nothing.  C{$} means the end of the name and nothing else: Python's
(and PCRE's) C{$} also matches before a final newline, so C{^orders$} would
allow C{"orders\\n"}; L{compile_pattern} writes every C{$} outside a
character class as C{\\Z} (L{end_anchored}).  C{{user}} in a pattern stands
for the user's own name (escaped), so C{"^user\\.{user}\\."} gives each
user queues of their own.
A user with no entry for a virtual host may not use it at all.

A browser token may narrow a user further to destinations: its
C{destinations} claim holds, per operation, one more regular expression that
the destination text (C{/topic/chat.room1}) must match too; an operation it
does not name is refused.

The broker core asks L{User.can} (through the channel,
L{qmq.core.channel.Channel}), so every protocol is checked the same way; how
each STOMP destination maps to resources is in C{docs/security.rst}.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from qmq.core.ownership import Owner

__all__ = ["CONFIGURED_KINDS", "OPERATIONS", "Permission", "User", "compile_pattern", "end_anchored"]

#: The operations a permission names.
OPERATIONS = ("configure", "write", "read")

_NOTHING = re.compile(r"(?!)")


def end_anchored(pattern: str) -> str:
    """
    C{pattern} with each C{$} that is an anchor written C{\\Z}, so that it
    matches at the very end of the name only (not before a final newline).

    A C{$} escaped (C{\\$}) or inside a character class (C{[$]}) is a
    literal dollar and stays; in a verbose pattern (C{(?x)}) a comment is
    copied as it is.  The scan is one pass over the pattern.
    """
    if "$" not in pattern:
        return pattern
    verbose = bool(re.compile(pattern).flags & re.VERBOSE)
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if verbose and not in_class and c == "#":
            end = pattern.find("\n", i)
            end = n if end < 0 else end
            out.append(pattern[i:end])
            i = end
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            # A "]" right after "[" or "[^" is a literal, not the class's end.
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":
                j += 1
            out.append(pattern[i:j])
            i, in_class = j, True
            continue
        elif c == "$":
            c = "\\Z"
        out.append(c)
        i += 1
    return "".join(out)


def compile_pattern(pattern: str, user: str = "") -> re.Pattern[str]:
    """
    Compile a permission pattern for C{user}.

    @param pattern: a regular expression; C{""} allows nothing; C{{user}}
        becomes the escaped user name; C{$} anchors at the end of the name
        only (L{end_anchored}).
    @raise re.error: the pattern is not a regular expression.
    """
    if not pattern:
        return _NOTHING
    if "{user}" in pattern:
        pattern = pattern.replace("{user}", re.escape(user))
    return re.compile(end_anchored(pattern))


@dataclass(frozen=True)
class Permission:
    """The three patterns of one user in one virtual host (compiled)."""

    configure: re.Pattern[str] = _NOTHING
    write: re.Pattern[str] = _NOTHING
    read: re.Pattern[str] = _NOTHING

    @classmethod
    def of(cls, configure: str = "", write: str = "", read: str = "", user: str = "") -> Permission:
        """Compile three patterns (see L{compile_pattern})."""
        return cls(
            compile_pattern(configure, user),
            compile_pattern(write, user),
            compile_pattern(read, user),
        )

    def allows(self, operation: str, name: str) -> bool:
        """Whether C{operation} is allowed on the resource or destination C{name}."""
        pattern = getattr(self, operation, None) if operation in OPERATIONS else None
        return pattern is not None and pattern.search(name) is not None


#: The ways of logging in whose name is a configured user's: a password, a
#: certificate (mapped by C{[users.NAME] certificate_names}) and anonymous
#: (mapped by C{[auth] anonymous_user}).  A token's subject is not one unless
#: its virtual host's C{[tokens] speak_for} names it.
CONFIGURED_KINDS = frozenset({"password", "certificate", "anonymous"})


@dataclass(frozen=True)
class User:
    """
    An authenticated client, its identity and its permissions: what every
    frontend gets from L{qmq.auth.Authenticator.authenticate}.

    The identity is (how it logged in, name): C{kind} and C{name}.  Rights
    that go by name (the API's admins, the owner of durable subscriptions,
    deleting a user) go by L{account}, the configured user it is, never by
    the bare name: a token whose subject is C{admin} is not the password
    user C{admin}, unless the configuration maps it (C{speak_for}).

    @ivar name: the user's name (a token's C{sub}).
    @ivar source: how it logged in: C{"password"}, C{"certificate"},
        C{"token"} or C{"anonymous"} (also L{kind}).
    @ivar permissions: virtual host name -> its L{Permission}.
    @ivar destinations: a token's narrowing (a L{Permission} over destination
        texts), or None.
    @ivar expires: when its credentials expire (clock seconds; a token's
        C{exp}), or None.
    @ivar speaks_for: for a token, the configured user it speaks for (its
        virtual host's C{[tokens] speak_for} names its subject), or None.
    """

    name: str
    source: str = "password"
    permissions: Mapping[str, Permission] = field(default_factory=dict)
    destinations: Permission | None = None
    expires: float | None = None
    speaks_for: str | None = None

    @property
    def kind(self) -> str:
        """How it logged in (C{source})."""
        return self.source

    @property
    def identity(self) -> tuple[str, str]:
        """(how it logged in, name): two users are the same client only if
        these are equal (frontends key per-client state on it)."""
        return (self.source, self.name)

    @property
    def account(self) -> str | None:
        """The configured user this is (C{[users.NAME]}, a user added through
        the HTTP API, or the anonymous user), or None: an identity of its own
        (a token's subject that no C{speak_for} maps)."""
        if self.source in CONFIGURED_KINDS:
            return self.name
        return self.speaks_for

    @property
    def owner(self) -> str | Owner:
        """Who owns its durable subscriptions (L{qmq.core.ownership}): a
        configured user's name (their queue names as they always were), or
        an L{Owner} of its kind, which no user name can collide with."""
        account = self.account
        return account if account is not None else Owner(self.name, self.source)

    def is_admin(self, admins: Collection[str]) -> bool:
        """Whether it is one of C{admins} (user names, such as C{[http_api]
        admins}): only a configured user can be, by its L{account}."""
        account = self.account
        return account is not None and account in admins

    def may_use(self, vhost: str) -> bool:
        """Whether the user may connect to the virtual host C{vhost} at all."""
        return vhost in self.permissions

    def can(self, operation: str, vhost: str, resource: str, destination: str | None = None) -> bool:
        """
        Whether the user may do C{operation} on C{resource} in C{vhost}.

        @param operation: one of L{OPERATIONS}.
        @param resource: the queue or exchange name.
        @param destination: the destination text it was named by; a token's
            narrowing is checked against it (without one, a narrowed user is
            refused).
        """
        permission = self.permissions.get(vhost)
        if permission is None or not permission.allows(operation, resource):
            return False
        narrowing = self.destinations
        if narrowing is None:
            return True
        return destination is not None and narrowing.allows(operation, destination)
