# -*- test-case-name: tests.test_auth -*-
"""Password hashes: scrypt (C{hashlib.scrypt}), never plaintext.

A hash is one self-describing string, so its cost can change without
breaking the hashes already in a configuration::

    $scrypt$ln=15,r=8,p=1$<salt, base64>$<key, base64>

C{ln} is log2 of scrypt's CPU/memory cost N (15: N = 32768, 32 MiB with
r = 8), C{r} the block size and C{p} the parallelism; the salt is 16 random
bytes and the key 32 bytes.  L{hash_password} makes one; L{verify_password}
checks a password against one in constant time.  The console script
C{qmq-passwd} (L{main}) prints a hash for a password read from the terminal
or from standard input, to paste into C{[users.NAME] password}.

Verifying costs about as much as hashing (0.1-0.3 s of CPU at C{ln=15}),
which is the point: the broker runs it in a thread (C{hashlib.scrypt} lets
go of the GIL), never in the reactor (L{qmq.auth.checkers}).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import getpass
import hashlib
import hmac
import os
import re
import sys
from dataclasses import dataclass

__all__ = [
    "DEFAULT_COST",
    "HashError",
    "hash_password",
    "main",
    "parse_hash",
    "verify_password",
]

#: log2 of scrypt's N for new hashes (N = 32768: 32 MiB, ~0.1-0.3 s).
DEFAULT_COST = 15
#: The bounds on the cost a hash may state: a hash in a configuration must
#: not make every login take minutes or gigabytes.
MIN_COST, MAX_COST = 1, 20
_MAX_R, _MAX_P = 32, 16
_SALT_BYTES = 16
_KEY_BYTES = 32

_FORMAT = re.compile(
    r"^\$scrypt\$ln=(?P<ln>\d{1,2}),r=(?P<r>\d{1,2}),p=(?P<p>\d{1,2})"
    r"\$(?P<salt>[A-Za-z0-9+/=]+)\$(?P<key>[A-Za-z0-9+/=]+)$"
)


class HashError(ValueError):
    """A string that is not a QMQ password hash (the message says why)."""


@dataclass(frozen=True)
class ScryptHash:
    """A parsed hash: the scrypt parameters, the salt and the derived key."""

    ln: int
    r: int
    p: int
    salt: bytes
    key: bytes

    def derive(self, password: bytes) -> bytes:
        """The key C{password} derives to under these parameters."""
        n = 1 << self.ln
        return hashlib.scrypt(
            password,
            salt=self.salt,
            n=n,
            r=self.r,
            p=self.p,
            maxmem=256 * n * self.r + (1 << 20),
            dklen=len(self.key),
        )


def parse_hash(text: str) -> ScryptHash:
    """
    Parse a hash made by L{hash_password}.

    @raise HashError: it is not one, or its cost is out of bounds.
    """
    match = _FORMAT.match(text)
    if match is None:
        raise HashError(
            "expected a hash printed by qmq-passwd ($scrypt$ln=N,r=N,p=N$SALT$KEY), "
            "never a plaintext password"
        )
    ln, r, p = int(match["ln"]), int(match["r"]), int(match["p"])
    if not MIN_COST <= ln <= MAX_COST or not 1 <= r <= _MAX_R or not 1 <= p <= _MAX_P:
        raise HashError(
            f"scrypt parameters out of bounds (ln from {MIN_COST} to {MAX_COST}, "
            f"r from 1 to {_MAX_R}, p from 1 to {_MAX_P})"
        )
    try:
        salt = base64.b64decode(match["salt"], validate=True)
        key = base64.b64decode(match["key"], validate=True)
    except binascii.Error:
        raise HashError("the salt or the key is not valid base64") from None
    if len(salt) < 8 or len(key) < 16:
        raise HashError("the salt or the key is too short")
    return ScryptHash(ln, r, p, salt, key)


def hash_password(password: str, cost: int = DEFAULT_COST) -> str:
    """
    Hash a password with a fresh random salt.

    @param password: the password (UTF-8 encoded before hashing).
    @param cost: log2 of scrypt's N (L{DEFAULT_COST}; tests use less).
    @return: the hash string.
    """
    if not MIN_COST <= cost <= MAX_COST:
        raise ValueError(f"cost must be from {MIN_COST} to {MAX_COST}")
    params = ScryptHash(cost, 8, 1, os.urandom(_SALT_BYTES), b"\0" * _KEY_BYTES)
    key = params.derive(password.encode("utf-8"))
    b64 = base64.b64encode
    return f"$scrypt$ln={cost},r=8,p=1${b64(params.salt).decode()}${b64(key).decode()}"


def verify_password(password: str | bytes, hashed: str | ScryptHash) -> bool:
    """
    Whether C{password} matches C{hashed} (compared in constant time).

    @param hashed: a hash string or a parsed L{ScryptHash}.
    @raise HashError: C{hashed} is not a valid hash.
    """
    parsed = parse_hash(hashed) if isinstance(hashed, str) else hashed
    if isinstance(password, str):
        password = password.encode("utf-8")
    return hmac.compare_digest(parsed.derive(password), parsed.key)


def main(argv: list[str] | None = None) -> int:
    """
    C{qmq-passwd}: print the hash of a password.

    The password is asked for twice on a terminal, or read as the first line
    of standard input when that is not a terminal (for scripts:
    C{printf '%s\\n' "$PASSWORD" | qmq-passwd}); never from the command line,
    where other users could see it.
    """
    parser = argparse.ArgumentParser(
        prog="qmq-passwd",
        description="Print the scrypt hash of a password, for [users.NAME] password "
        "in the QMQ configuration.",
    )
    parser.add_argument(
        "--cost",
        type=int,
        default=DEFAULT_COST,
        help=f"log2 of scrypt's N, from {MIN_COST} to {MAX_COST} (default {DEFAULT_COST}: "
        "32 MiB and about 0.1-0.3 s per login)",
    )
    args = parser.parse_args(argv)
    if not MIN_COST <= args.cost <= MAX_COST:
        parser.error(f"--cost must be from {MIN_COST} to {MAX_COST}")
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("qmq-passwd: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("qmq-passwd: empty password", file=sys.stderr)
        return 1
    print(hash_password(password, args.cost))
    return 0


def main_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())
