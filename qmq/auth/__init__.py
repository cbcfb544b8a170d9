"""Authentication and authorization, shared by every protocol.

The API other frontends build on (HTTP, WebSocket; STOMP uses it at
CONNECT):

  - L{Authenticator} (C{broker.auth}, or None when authentication is off):
    C{credentials(vhost, login, passcode, identity)} and
    C{authenticate(vhost, credentials, address) -> Deferred[User]}, failing
    with an L{AuthError} (C{short}, C{message}) to show the client.
  - L{User}: C{name}, C{source}, C{expires} and
    C{can(operation, vhost, resource, destination=None)}; the core's channel
    asks it before every new destination (L{qmq.core.channel.Channel}).
  - L{hash_password} / L{verify_password} and the C{qmq-passwd} script.

See C{docs/security.rst}.
"""

from qmq.auth.authenticator import (
    Authenticator,
    AuthError,
    Busy,
    LoginFailed,
    TokenRejected,
    TooManyFailures,
    VhostRefused,
    login_refusal,
)
from qmq.auth.passwords import hash_password, verify_password
from qmq.auth.permissions import OPERATIONS, Permission, User
from qmq.auth.settings import AuthSettings, PermissionSettings, TokenSettings, UserSettings

__all__ = [
    "OPERATIONS",
    "AuthError",
    "AuthSettings",
    "Authenticator",
    "Busy",
    "LoginFailed",
    "Permission",
    "PermissionSettings",
    "TokenRejected",
    "TokenSettings",
    "TooManyFailures",
    "User",
    "UserSettings",
    "VhostRefused",
    "hash_password",
    "login_refusal",
    "verify_password",
]
