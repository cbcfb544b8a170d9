# -*- test-case-name: tests.test_container -*-
"""The container image's entry point (``Dockerfile``; docs/running.rst,
"Container").

``python -m qmq.container [TWISTD QMQ OPTIONS]`` is the image's
``ENTRYPOINT``.  The flow:

1. read the image's configuration, ``/etc/qmq/qmq.toml`` (``QMQ_CONFIG``
   names another; mount your own file there to configure everything);
2. when the environment names an administrator (``QMQ_ADMIN_PASSWORD_HASH``,
   a hash printed by ``qmq-passwd``, or ``QMQ_ADMIN_PASSWORD_FILE``, a file
   such as a mounted secret whose first line is the password, hashed here),
   add the user ``QMQ_ADMIN_USER`` (``admin``) with every permission on each
   virtual host and in ``http_api.admins``;
3. check the result as ``twistd qmq`` would (L{qmq.config.load_string}: a
   mistake is one message naming the key, exit status 2), write it to a
   private temporary file and replace this process with
   ``twistd -n --pidfile= qmq --config FILE`` and the container's arguments
   (twistd becomes the container's first process and gets its signals).

The image listens on every interface, so the broker refuses to start until
the configuration has users (``auth.allow_unauthenticated_remote`` is
false): the environment's administrator is the quickest way to give it one.
A plaintext password in the environment is not taken: environments are
shown by ``docker inspect`` and inherited by child processes.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, NoReturn

from qmq import config

#: The image's configuration (docker/qmq.toml in the repository).
DEFAULT_CONFIG = "/etc/qmq/qmq.toml"
#: The names a user may have here: what a TOML bare key allows.
_USER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HASH = re.compile(r"\$scrypt\$[^\s\"\\]+")


class ContainerError(Exception):
    """The environment or the configuration cannot be used; the message says why."""


def configuration(environ: Mapping[str, str], text: str, source: str) -> str:
    """The configuration to run: C{text} (TOML, from C{source}) with the
    administrator C{environ} names, if any, checked by L{qmq.config}.

    @raise ContainerError: for a bad variable, a file that cannot be read,
        or a configuration that QMQ refuses (its message names key and file).
    """
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ContainerError(f"{source}: not valid TOML: {e}") from None
    password = _admin_password(environ)
    if password is not None:
        name = environ.get("QMQ_ADMIN_USER", "admin") or "admin"
        if not _USER_NAME.fullmatch(name):
            raise ContainerError(f"QMQ_ADMIN_USER: {name!r} is not a user name "
                                 "(letters, digits, '_', '.', '-', at most 64)")
        users = tree.setdefault("users", {})
        if name in users:
            raise ContainerError(f"QMQ_ADMIN_USER: {source} already has [users.{name}]")
        users[name] = {"password": password}
        vhosts = tree.setdefault("vhosts", {})
        vhosts.setdefault("/", {})
        for vhost in vhosts.values():
            vhost.setdefault("permissions", {}).setdefault(
                name, {"configure": ".*", "write": ".*", "read": ".*"})
        api = tree.setdefault("http_api", {})
        admins = str(api.get("admins", "")).split()
        api["admins"] = " ".join([*admins, name] if name not in admins else admins)
    out = dumps(tree)
    try:
        config.load_string(out, source)
    except config.ConfigError as e:
        raise ContainerError(str(e)) from None
    return out


def _admin_password(environ: Mapping[str, str]) -> str | None:
    """The administrator's password hash, or None when none is asked for."""
    given = environ.get("QMQ_ADMIN_PASSWORD_HASH", "")
    path = environ.get("QMQ_ADMIN_PASSWORD_FILE", "")
    if given and path:
        raise ContainerError("QMQ_ADMIN_PASSWORD_HASH and QMQ_ADMIN_PASSWORD_FILE: set one")
    if given:
        if not _HASH.fullmatch(given.strip()):
            raise ContainerError("QMQ_ADMIN_PASSWORD_HASH: expected a hash printed by "
                                 "qmq-passwd ($scrypt$...), not a password")
        return given.strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ContainerError(f"QMQ_ADMIN_PASSWORD_FILE: cannot read {path}: {e}") from None
    if not line:
        raise ContainerError(f"QMQ_ADMIN_PASSWORD_FILE: {path} has an empty first line")
    from qmq.auth import hash_password  # noqa: PLC0415 - scrypt only when needed

    return hash_password(line)


# -- TOML out ------------------------------------------------------------------------
#
# The standard library reads TOML but does not write it; a configuration has
# tables, arrays (of tables too) and plain values, which this writes back
# (arrays of tables as arrays of inline tables).  Comments are not kept.


def dumps(tree: Mapping[str, Any]) -> str:
    """C{tree} (as from C{tomllib}) as TOML text that reads back equal."""
    lines: list[str] = []
    _table(lines, [], tree)
    return "\n".join(lines) + "\n"


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _string(k)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, datetime | date | time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"not a TOML value: {type(v).__name__}")


def _table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (plain or not tables):
        if lines:
            lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for k, v in plain.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables.items():
        _table(lines, [*path, k], v)


# -- the entry point ---------------------------------------------------------------


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> NoReturn:
    """Build the configuration and become C{twistd -n qmq} (never returns)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    source = environ.get("QMQ_CONFIG", DEFAULT_CONFIG)
    try:
        try:
            text = Path(source).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ContainerError(f"{source}: cannot read the configuration: {e}") from None
        out = configuration(environ, text, source)
    except ContainerError as e:
        sys.stderr.write(f"qmq-container: {e}\n")
        sys.exit(2)
    # Private: the file holds password hashes.
    fd, path = tempfile.mkstemp(prefix="qmq-", suffix=".toml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(out)
    args = ["twistd", "-n", "--pidfile=", "qmq", "--config", path, *argv]
    sys.stdout.flush()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
