# -*- test-case-name: tests.test_auth -*-
"""Browser tokens: short-lived JWTs an application's own server issues.

An application (a virtual host) that serves browsers does not give them
passwords: its web server, which knows who the visitor is, signs a token
(PyJWT, HMAC or an asymmetric key) and the browser presents it as its STOMP
passcode (or, later, an HTTP bearer token).  The token's claims:

    sub           the user's name (required)
    exp           when it expires, epoch seconds (required)
    iat, nbf      when it was issued (not after now + leeway), from when it
                  is valid (optional)
    aud, iss      checked when the virtual host's C{[tokens]} names them
    destinations  optional narrowing: C{{"read": "^/topic/chat\\.", ...}},
                  a regular expression per operation that the destination
                  text must match; an operation left out is refused

The signature, the algorithm (only the one configured: a token cannot pick
C{none} or switch HMAC for RSA) and the times are checked here; times against
the injected clock, not the system's, so trial tests drive expiry with
C{task.Clock}.  What a token user may do is the virtual host's token
permissions (C{configure}/C{write}/C{read} in C{[tokens]}) narrowed by
C{destinations}; a connection is closed when its token expires (the STOMP
session's timer).
"""

from __future__ import annotations

import re
from typing import Any

import jwt

from qmq.auth.permissions import Permission
from qmq.auth.settings import TokenSettings

__all__ = ["InvalidToken", "TokenExpired", "TokenVerifier", "looks_like_token"]

_JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*$")
#: Longest token accepted (a STOMP header may be long; a token is not).
MAX_TOKEN_LENGTH = 8192


def looks_like_token(text: str | None) -> bool:
    """Whether a passcode has the shape of a JWT (three base64url parts)."""
    return bool(text) and len(text) <= MAX_TOKEN_LENGTH and _JWT_SHAPE.match(text) is not None  # type: ignore[arg-type]


class InvalidToken(Exception):
    """The token is not valid: bad signature, wrong algorithm, missing claim..."""


class TokenExpired(InvalidToken):
    """The token was valid but has expired (or is not valid yet)."""


class TokenVerifier:
    """
    Checks the tokens of one virtual host.

    @ivar settings: the virtual host's C{[tokens]} settings.
    """

    def __init__(self, settings: TokenSettings, clock: Any) -> None:
        self.settings = settings
        self.clock = clock
        key: Any = settings.key
        if not settings.algorithm.startswith("HS"):
            from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
                load_pem_public_key,
            )

            key = load_pem_public_key(settings.key)
        self._key = key

    def verify(self, token: str) -> dict[str, Any]:
        """
        Check a token and return its claims.

        @raise TokenExpired: past C{exp} (or before C{nbf}).
        @raise InvalidToken: anything else wrong with it.
        """
        s = self.settings
        if len(token) > MAX_TOKEN_LENGTH:
            raise InvalidToken("token too long")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[s.algorithm],
                audience=s.audience,
                issuer=s.issuer,
                options={
                    "require": ["exp", "sub"],
                    # Times are checked below, against the injected clock.
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": s.audience is not None,
                    "verify_iss": s.issuer is not None,
                },
            )
        except jwt.PyJWTError as e:
            raise InvalidToken(str(e)) from None
        now = self.clock.seconds()
        exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
        for name, value in (("exp", exp), ("nbf", nbf), ("iat", iat)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InvalidToken(f"claim {name!r} is not a number")
        if now > exp + s.leeway:
            raise TokenExpired("the token has expired")
        if nbf is not None and now + s.leeway < nbf:
            raise TokenExpired("the token is not valid yet")
        if iat is not None and iat > now + s.leeway:
            # Issued in the future: a clock gone wrong, or a token minted to
            # look short-lived (exp - iat) while it lives long from now.
            raise InvalidToken("the token was issued in the future ('iat')")
        # Measured from now as well as from iat: what a stolen token is
        # worth is the time it still has to live.
        if s.max_lifetime and exp - min(now, iat if iat is not None else now) > s.max_lifetime:
            raise InvalidToken(f"the token lives longer than {s.max_lifetime:g} s")
        if not isinstance(claims["sub"], str) or not claims["sub"]:
            raise InvalidToken("claim 'sub' is not a name")
        narrowing = claims.get("destinations")
        if narrowing is not None:
            claims["destinations"] = narrowing_of(narrowing)
        return claims


def narrowing_of(value: Any) -> Permission:
    """The L{Permission} over destinations that a C{destinations} claim states."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidToken("claim 'destinations' is not an object of patterns")
    patterns: dict[str, str] = {}
    for operation in ("configure", "write", "read"):
        pattern = value.get(operation, "")
        if not isinstance(pattern, str) or len(pattern) > 1024:
            raise InvalidToken(f"claim 'destinations.{operation}' is not a pattern")
        patterns[operation] = pattern
    try:
        return Permission.of(**patterns)
    except re.error as e:
        raise InvalidToken(f"claim 'destinations' holds a bad pattern: {e}") from None
