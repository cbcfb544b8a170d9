"""TOML of users, permissions and token keys for the authentication tests
(in memory, with stomp.py, and one verdict over every frontend), written
from Python values rather than each test repeating the blocks by hand.

Patterns are plain Python strings (C{r"^(bob\\.|amq\\.topic$)"}); they are
written as TOML basic strings (JSON's escaping is TOML's).
"""

from __future__ import annotations

import json

from qmq.auth import hash_password

#: The bcrypt cost of the tests' passwords (cheap: tests check thousands).
COST = 4


def _value(v: object) -> str:
    return json.dumps(v)


def user(name: str, password: str, certificate_names: list[str] | None = None) -> str:
    """A C{[users.NAME]} block with C{password} hashed."""
    lines = [f"[users.{name}]", f"password = {_value(hash_password(password, COST))}"]
    if certificate_names is not None:
        lines.append(f"certificate_names = {_value(certificate_names)}")
    return "\n".join(lines) + "\n"


def users(**passwords: str) -> str:
    """A C{[users.NAME]} block for each C{NAME=password}."""
    return "\n".join(user(name, password) for name, password in passwords.items())


def permissions(
    vhost: str,
    name: str,
    configure: str | None = None,
    write: str | None = None,
    read: str | None = None,
) -> str:
    """A C{[vhosts.VHOST.permissions.NAME]} block (a pattern left out is
    not written: the default, nothing)."""
    return _block(f"[vhosts.{vhost}.permissions.{name}]", configure=configure, write=write, read=read)


def tokens(vhost: str, key_file: str, algorithm: str = "HS256", **fields: object) -> str:
    """A C{[vhosts.VHOST.tokens]} block: the key file, the algorithm and any
    other field (C{configure}, C{write}, C{read}, C{max_lifetime}...)."""
    return _block(f"[vhosts.{vhost}.tokens]", algorithm=algorithm, key_file=key_file, **fields)


def queues(vhost: str, *names: str) -> str:
    """A C{[[vhosts.VHOST.queues]]} entry for each of C{names}."""
    return "".join(f"[[vhosts.{vhost}.queues]]\nname = {_value(n)}\n\n" for n in names)


def everything(vhost: str, name: str) -> str:
    """Every permission of C{name} on C{vhost}."""
    return permissions(vhost, name, ".*", ".*", ".*")


def _block(head: str, **fields: object) -> str:
    lines = [head] + [f"{k} = {_value(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines) + "\n"


#: alice, as the STOMP authentication tests know her: a password and a
#: client certificate's name.
ALICE = user("alice", "wonderland", ["alice.example.org"])

#: alice's permissions in the virtual host "app": her own queues, the queue
#: orders, amq.topic and her reply queues.
ALICE_APP = permissions(
    "app",
    "alice",
    configure=r"^(alice\.|amq\.tmp\.)",
    write=r"^(alice\.|orders$|amq\.topic$|amq\.tmp\.)",
    read=r"^(alice\.|orders$|amq\.topic$)",
)
