# -*- test-case-name: tests.test_config -*-
"""QMQ's configuration: TOML files in, typed frozen settings out.

The flow::

    qmq/default.toml (embedded) ─┐
                                 ├─ tomllib ─▶ check each layer ─▶ merge ─▶ Settings
    --config FILE (optional) ────┘

1. The embedded default (C{qmq/default.toml}, package data read with
   L{importlib.resources}) and the user's file are each parsed with
   L{tomllib}.
2. Each layer is checked on its own against the schema below (built from the
   checkers of L{qmq.settings_schema}), so that every
   error names the file it comes from, the dotted key (C{stomp.heartbeat_grace},
   C{vhosts."/".queues[0].name}) and what was expected.  Unknown keys are
   errors: a typo must not pass silently.
3. The user's layer is merged over the default: tables merge key by key, any
   other value (a number, a string, an array) is replaced whole.
4. The merged tree becomes L{Settings}: frozen dataclasses, each settings
   section (C{[stomp]}, C{[connections]}, C{[limits]}, C{[commit_log]}) as
   the frozen dataclass of the part of QMQ that owns it.

Every problem is raised as a L{ConfigError} whose message is ready to print,
for instance::

    qmq.toml: stomp.heartbeat_grace: expected a number >= 1.5, got "x"

B{Sections: each part of QMQ owns its table.}  A top-level table such as
C{[stomp]} is a I{section}: L{SECTIONS} maps its name to a frozen dataclass
that lives with the code it configures (L{qmq.stomp.settings.StompSettings},
L{qmq.connections.ConnectionSettings}, L{qmq.core.limits.LimitSettings},
L{qmq.store.settings.CommitLogSettings}).
This module knows nothing of their fields: each table's schema is derived
from the dataclass (L{qmq.settings_schema._section_schema}).

  - The type annotation gives the TOML type: C{int} (an integer), C{float}
    (a number; an integer is accepted and stored as a float), C{bool},
    C{str}, or a union of these (C{int | float | str}: the value keeps the
    type of the first member it is).
  - The field's C{metadata} gives the constraint:
    C{{"min": N}} (C{>= N}), C{{"above": N}} (C{> N}), C{{"max": N}}
    (C{<= N}; with C{min}: C{from MIN to MAX}),
    C{{"choices": ("a", "b")}} (one of them), C{{"parse": callable}} (called
    with the type-checked value, returns the value to keep, raises
    L{ValueError} whose message becomes the error's problem text), and
    C{{"expected": "..."}} (the text that replaces the derived
    C{"an integer >= 1"} after C{expected} in errors).
  - A number field that states no range must not be negative: an C{int}
    is C{>= 0}, a C{float} is C{> 0}.
  - The dataclass's defaults are the defaults; C{qmq/default.toml} repeats
    them so that C{--print-default-config} shows them, and a test sees that
    the two agree and that C{docs/configuration.rst} has a row for every key.

Adding a frontend (or any other part with settings) is therefore its
dataclass plus one line in L{SECTIONS}; its settings are then
C{settings.section("NAME")}.  Five of the sections are also typed
attributes of L{Settings} (C{settings.stomp}, C{settings.connections},
C{settings.limits}, C{settings.commit_log}, C{settings.auth}).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from qmq.amqp.settings import AmqpSettings
from qmq.auth.settings import (
    AuthSettings,
    PermissionSettings,
    TokenSettings,
    UserSettings,
    check_permissions,
    check_tokens,
    check_users,
)
from qmq.cluster.settings import ClusterSettings
from qmq.connections import ConnectionSettings
from qmq.core.errors import PreconditionFailed
from qmq.core.limits import LimitSettings
from qmq.core.names import problem as name_problem
from qmq.core.policy import FSYNC_POLICIES, QUEUE_ARGUMENTS, QueueArgument, argument_name
from qmq.logs import LogSettings
from qmq.settings_schema import (
    _arguments,
    _boolean,
    _declarations,
    _fail,
    _Invalid,
    _join,
    _name,
    _number,
    _one_of,
    _Schema,
    _section,
    _string,
    _table,
)
from qmq.stomp.settings import StompSettings
from qmq.store.settings import CommitLogSettings
from qmq.web.api.settings import ApiSettings
from qmq.web.settings import WebSettings
from qmq.web.sockjs.settings import SockJSSettings
from qmq.workers.settings import WorkerSettings

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "EXCHANGE_TYPES",
    "QUEUE_DEFAULTS",
    "SECTIONS",
    "STORES",
    "BindingDeclaration",
    "ConfigError",
    "ExchangeDeclaration",
    "QueueDeclaration",
    "Settings",
    "VirtualHostSettings",
    "default_toml",
    "load",
    "load_string",
    "with_overrides",
]

#: The name under which errors in the embedded default are reported.
DEFAULT_CONFIG_NAME = "qmq/default.toml"

#: Exchange types that a declaration may name.
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")

#: Message stores that C{store} may name; each has its builder in
#: L{qmq.service.STORES} (a test sees that the two agree).  C{"log"} is the
#: commit log (L{qmq.store.log}), set up by the C{[commit_log]} table.
STORES = ("memory", "log")

#: The settings sections: a top-level table name and the frozen dataclass
#: that its keys fill (see the module docstring).  A new frontend adds its
#: own line here.
SECTIONS: dict[str, type] = {
    "stomp": StompSettings,
    "connections": ConnectionSettings,
    "limits": LimitSettings,
    "commit_log": CommitLogSettings,
    "web": WebSettings,
    "sockjs": SockJSSettings,
    "http_api": ApiSettings,
    "auth": AuthSettings,
    "cluster": ClusterSettings,
    "log": LogSettings,
    "amqp": AmqpSettings,
    "workers": WorkerSettings,
}

#: The queue arguments of a queue created on demand (a client names a queue
#: that does not exist) in a virtual host whose configuration sets no
#: C{queue_defaults}; C{qmq/default.toml} repeats them for C{"/"}.
QUEUE_DEFAULTS: Mapping[str, Any] = types.MappingProxyType(
    {
        "x-max-length": 1_000_000,
        "x-max-length-bytes": 256 * 1024 * 1024,
        "x-overflow": "reject-publish",
        "x-expires": 3_600_000,
        "x-delivery-limit": 100,
    }
)


class ConfigError(Exception):
    """
    The configuration cannot be used.

    C{str(error)} is the whole message, ready to show to a person: it names
    the file, the key (a dotted path) and what was expected.

    @ivar source: the file (or command-line option) the problem is in.
    @ivar key: the dotted path of the key, or C{""} for the file as a whole.
    @ivar problem: what is wrong, e.g. C{'expected a string, got 3'}.
    """

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        parts = [p for p in (source, key, problem) if p]
        super().__init__(": ".join(parts))


@dataclass(frozen=True)
class ExchangeDeclaration:
    """
    An exchange that exists when the broker starts.

    @ivar name: the exchange's name.
    @ivar type: one of L{EXCHANGE_TYPES}.
    @ivar durable: whether it survives a restart.
    @ivar auto_delete: whether it goes away with its last binding.
    @ivar origin: where it was declared (C{'FILE: KEY'}), for error messages.
    """

    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    origin: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class QueueDeclaration:
    """
    A queue that exists when the broker starts.

    @ivar name: the queue's name.
    @ivar durable: whether it survives a restart with its persistent
        messages (with C{store = "log"}; with C{"memory"} nothing survives
        one: the queue is declared again from the configuration, empty).
    @ivar auto_delete: whether it goes away with its last consumer.
    @ivar arguments: optional queue arguments (limits, TTL, ...), passed to
        the core as they are.
    @ivar origin: where it was declared (C{'FILE: KEY'}), for error messages.
    """

    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    origin: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class BindingDeclaration:
    """
    A binding of a queue to an exchange that exists when the broker starts.

    @ivar queue: the queue's name.
    @ivar exchange: the exchange's name.
    @ivar routing_key: the binding key (a pattern for topic exchanges).
    @ivar arguments: binding arguments (C{x-match} and header values for a
        headers exchange).
    @ivar origin: where it was declared (C{'FILE: KEY'}), for error messages.
    """

    queue: str
    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    origin: str = field(default="", compare=False, repr=False)


def _queue_defaults() -> dict[str, Any]:
    return dict(QUEUE_DEFAULTS)


@dataclass(frozen=True)
class VirtualHostSettings:
    """
    A virtual host and what is declared in it, in the order declared.

    @ivar name: the virtual host's name (C{"/"} is the default one).
    @ivar allow_create: whether clients may create queues by naming them
        (a SEND or SUBSCRIBE to a C{/queue/} that does not exist); when
        false only declared queues (and the broker's own: temporary,
        topic subscription, durable subscription queues) exist.
    @ivar queue_defaults: the queue arguments of queues created on demand
        (a client names a queue that does not exist, a durable topic
        subscription's queue), by argument name (C{x-max-length}, ...).
        Without a C{queue_defaults} table, a virtual host gets
        L{QUEUE_DEFAULTS}; a table that sets some keys replaces those keys
        only.
    @ivar fsync: the commit log's fsync policy for the durable queues of
        this virtual host that do not set C{x-fsync}, or None for
        C{commit_log.fsync}.
    """

    name: str
    exchanges: tuple[ExchangeDeclaration, ...] = ()
    queues: tuple[QueueDeclaration, ...] = ()
    bindings: tuple[BindingDeclaration, ...] = ()
    queue_defaults: Mapping[str, Any] = field(default_factory=_queue_defaults)
    allow_create: bool = True
    fsync: str | None = None
    permissions: tuple[PermissionSettings, ...] = ()
    tokens: TokenSettings | None = None


def _other_sections() -> dict[str, Any]:
    """The defaults of the sections that have no attribute of their own on L{Settings}."""
    return {name: cls() for name, cls in SECTIONS.items() if name not in _SETTINGS_ATTRIBUTES}


@dataclass(frozen=True)
class Settings:
    """
    Everything the broker needs to start.

    @ivar listen: where to listen, each C{PROTOCOL:ENDPOINT} (e.g.
        C{"stomp:tcp:61613:interface=127.0.0.1:backlog=1024"}).
    @ivar data_dir: the directory for persistent data.
    @ivar store: the message store, one of L{STORES}.
    @ivar stomp: the STOMP frontend's settings (the C{[stomp]} section).
    @ivar connections: the connection registry's settings (C{[connections]}).
    @ivar limits: the broker-wide limits (C{[limits]}).
    @ivar commit_log: the commit-log store's settings (C{[commit_log]}),
        used when C{store} is C{"log"}.
    @ivar auth: authentication's settings (C{[auth]}; L{qmq.auth}).
    @ivar vhosts: the virtual hosts with their declarations.
    @ivar shutdown_timeout: seconds a graceful shutdown may take.
    @ivar users: the users (C{[users.NAME]}), for authentication.
    @ivar other_sections: the settings of sections registered in
        L{SECTIONS} that have no attribute here, by name; read them with
        L{section}.
    @ivar listen_source: where C{listen} was set (a file name, or
        C{"--listen"}), so errors about a listener name it.
    """

    listen: list[str] = field(
        default_factory=lambda: [
            "stomp:tcp:61613:interface=127.0.0.1:backlog=1024",
            "http:tcp:15674:interface=127.0.0.1:backlog=1024",
            "amqp:tcp:5672:interface=127.0.0.1:backlog=1024",
        ]
    )
    data_dir: Path = Path("qmq-data")
    store: str = "log"
    stomp: StompSettings = field(default_factory=StompSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    commit_log: CommitLogSettings = field(default_factory=CommitLogSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    vhosts: tuple[VirtualHostSettings, ...] = (VirtualHostSettings("/"),)
    shutdown_timeout: float = 10.0
    users: tuple[UserSettings, ...] = ()
    other_sections: Mapping[str, Any] = field(default_factory=_other_sections)
    listen_source: str = field(default=DEFAULT_CONFIG_NAME, compare=False)

    def section(self, name: str) -> Any:
        """
        The settings of any section registered in L{SECTIONS}.

        @param name: the section's table name (C{"stomp"}, ...).
        @return: an instance of C{SECTIONS[name]}.
        @raise KeyError: no section is registered under C{name}.
        """
        cls = SECTIONS[name]
        if name in _SETTINGS_ATTRIBUTES:
            return getattr(self, name)
        value = self.other_sections.get(name)
        return value if value is not None else cls()


_SETTINGS_ATTRIBUTES = frozenset(f.name for f in dataclasses.fields(Settings))


# -- the schema ---------------------------------------------------------------
#
# Built from the checkers of qmq.settings_schema: a checker takes (value, key)
# and returns the normalised value or raises _Invalid(key, problem);
# _check_layer turns that into a ConfigError naming the file.


def _store_name(value: object, key: str) -> str:
    if isinstance(value, dict):
        # [store] read as the commit log's settings: TOML cannot make one key
        # both the store's name and a table.
        raise _Invalid(
            key,
            "expected one of " + ", ".join(STORES) + ", got a table (the commit log's"
            " settings are the [commit_log] table)",
        )
    return _one_of(STORES)(value, key)


def _listen_specs(value: object, key: str) -> list[str]:
    expected = "a non-empty array of PROTOCOL:ENDPOINT strings"
    if not isinstance(value, list) or not value:
        raise _fail(key, expected, value)
    for index, spec in enumerate(value):
        _listen_spec(spec, _join(key, index))
    return list(value)


def _listen_spec(spec: object, key: str) -> str:
    # Only the shape: whether the protocol and the endpoint exist is checked
    # when the service is built (qmq.service.make_service).
    expected = 'PROTOCOL:ENDPOINT (e.g. "stomp:tcp:61613")'
    if not isinstance(spec, str):
        raise _fail(key, expected, spec)
    protocol, colon, endpoint = spec.partition(":")
    if not colon or not protocol or not endpoint or ":" in protocol:
        raise _fail(key, expected, spec)
    return spec


def _directory(value: object, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(key, "a directory name (a non-empty string)", value)
    return Path(value)


_EXCHANGE_SCHEMA: _Schema = {
    "name": _name,
    "type": _one_of(EXCHANGE_TYPES),
    "durable": _boolean,
    "auto_delete": _boolean,
}
_EXCHANGE_REQUIRED = {"name": "a non-empty string", "type": "one of " + ", ".join(EXCHANGE_TYPES)}

def _queue_arguments(value: object, key: str) -> dict[str, Any]:
    # A declared queue's arguments are checked like queue_defaults (the
    # core's names, each by the core's own parser: defined below).
    if not isinstance(value, dict):
        raise _fail(key, "a table of arguments", value)
    return _queue_defaults_table(value, key)


_QUEUE_SCHEMA: _Schema = {
    "name": _name,
    "durable": _boolean,
    "auto_delete": _boolean,
    "arguments": _queue_arguments,
}
_QUEUE_REQUIRED = {"name": "a non-empty string"}

_BINDING_SCHEMA: _Schema = {
    "queue": _name,
    "exchange": _string,
    "routing_key": _string,
    "arguments": _arguments,
}
_BINDING_REQUIRED = {"queue": "a non-empty string", "exchange": "a string"}


def _queue_argument(spec: QueueArgument) -> Callable[[object, str], Any]:
    def check(value: object, key: str) -> Any:
        if isinstance(value, bool | float | dict):
            raise _fail(key, spec.expected, value)
        try:
            spec.parse(spec.name, value)
        except PreconditionFailed:
            raise _fail(key, spec.expected, value) from None
        return list(value) if isinstance(value, list) else value

    return check


#: Queue arguments that C{queue_defaults} may set: the core's names
#: (L{qmq.core.policy.QUEUE_ARGUMENTS}); each may also be written without its
#: C{x-} prefix, and is kept under the core's name.
_QUEUE_DEFAULTS_SCHEMA: _Schema = {name: _queue_argument(spec) for name, spec in QUEUE_ARGUMENTS.items()}


def _queue_defaults_table(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        return _table(value, key, _QUEUE_DEFAULTS_SCHEMA)  # raises
    result = {}
    for name, item in value.items():
        canonical = argument_name(name)
        if canonical not in _QUEUE_DEFAULTS_SCHEMA:
            _table({name: item}, key, _QUEUE_DEFAULTS_SCHEMA)  # raises, naming the key
        result[canonical] = _QUEUE_DEFAULTS_SCHEMA[canonical](item, _join(key, name))
    return result


#: The keys of a virtual host that declare things (arrays of tables).
_DECLARATION_KEYS = ("exchanges", "queues", "bindings")

_VHOST_SCHEMA: _Schema = {
    "exchanges": _declarations(_EXCHANGE_SCHEMA, _EXCHANGE_REQUIRED, "name"),
    "queues": _declarations(_QUEUE_SCHEMA, _QUEUE_REQUIRED, "name"),
    "bindings": _declarations(_BINDING_SCHEMA, _BINDING_REQUIRED, None),
    "queue_defaults": _queue_defaults_table,
    "allow_create": _boolean,
    "fsync": _one_of(FSYNC_POLICIES),
    "permissions": check_permissions,
    "tokens": check_tokens,
}


def _vhosts(value: object, key: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise _fail(key, 'a table of virtual hosts (e.g. [vhosts."/"])', value)
    result = {}
    for name, vhost in value.items():
        vhost_key = _join(key, name)
        if not name:
            raise _Invalid(vhost_key, "a virtual host needs a non-empty name")
        reason = name_problem("virtual host name", name)
        if reason is not None:
            raise _Invalid(vhost_key, reason)
        result[name] = _table(vhost, vhost_key, _VHOST_SCHEMA)
    return result


_TOP_SCHEMA: _Schema = {
    "listen": _listen_specs,
    "data_dir": _directory,
    "store": _store_name,
    "shutdown_timeout": _number(above=0),
    "vhosts": _vhosts,
    "users": check_users,
}


def _top_schema() -> _Schema:
    """The top-level schema: the fixed keys and a table per registered section."""
    schema = dict(_TOP_SCHEMA)
    for name, cls in SECTIONS.items():
        if name in _TOP_SCHEMA:
            raise TypeError(f"qmq.config: section {name!r} would hide a top-level key")
        schema[name] = _section(cls)
    return schema


# -- loading --------------------------------------------------------------------


_TOML_POSITION = re.compile(r"^(?P<what>.*?) \(at line (?P<line>\d+), column (?P<column>\d+)\)$")


def _parse(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error names the file and the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        match = _TOML_POSITION.match(message)
        if match:
            raise ConfigError(
                source,
                "",
                f"line {match['line']}, column {match['column']}: invalid TOML: {match['what']}",
            ) from None
        if message.endswith(" (at end of document)"):
            what = message.removesuffix(" (at end of document)")
            raise ConfigError(source, "", f"at end of file: invalid TOML: {what}") from None
        raise ConfigError(source, "", f"invalid TOML: {message}") from None


def _check_layer(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Check one parsed file against the schema; every key is optional."""
    try:
        checked = _table(data, "", _top_schema())
    except _Invalid as e:
        raise ConfigError(source, e.key, e.problem) from None
    # Record where declarations and listeners come from, for later errors.
    for vhost in checked.get("vhosts", {}).values():
        for name in _DECLARATION_KEYS:
            for declaration in vhost.get(name, ()):
                declaration["origin"] = f"{source}: {declaration['origin']}"
    if "listen" in checked:
        checked["listen_source"] = source
    return checked


def _merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """Layer C{layer} over C{base}: tables merge, other values are replaced."""
    merged = dict(base)
    for name, value in layer.items():
        if isinstance(value, dict) and isinstance(merged.get(name), dict):
            merged[name] = _merge(merged[name], value)
        else:
            merged[name] = value
    return merged


def _build(tree: Mapping[str, Any]) -> Settings:
    """Turn a checked, merged tree into L{Settings}."""
    vhosts = []
    for name, vhost in tree.get("vhosts", {}).items():
        vhosts.append(
            VirtualHostSettings(
                name=name,
                exchanges=tuple(ExchangeDeclaration(**d) for d in vhost.get("exchanges", [])),
                queues=tuple(QueueDeclaration(**d) for d in vhost.get("queues", [])),
                bindings=tuple(BindingDeclaration(**d) for d in vhost.get("bindings", [])),
                # "/" has the embedded default's table merged under it; any
                # other virtual host starts from the same defaults.
                queue_defaults={**QUEUE_DEFAULTS, **vhost.get("queue_defaults", {})},
                allow_create=vhost.get("allow_create", True),
                fsync=vhost.get("fsync"),
                permissions=tuple(
                    PermissionSettings(user, **p) for user, p in vhost.get("permissions", {}).items()
                ),
                tokens=TokenSettings(**vhost["tokens"]) if "tokens" in vhost else None,
            )
        )
    users = tuple(
        UserSettings(
            name,
            password=user.get("password"),
            certificate_names=user.get("certificate_names", ()),
        )
        for name, user in tree.get("users", {}).items()
    )
    values: dict[str, Any] = {"vhosts": tuple(vhosts), "users": users}
    others = {}
    for name, cls in SECTIONS.items():
        section = cls(**tree.get(name, {}))
        if name in _SETTINGS_ATTRIBUTES:
            values[name] = section
        else:
            others[name] = section
    values["other_sections"] = others
    for name in ("listen", "data_dir", "store", "shutdown_timeout", "listen_source"):
        if name in tree:
            values[name] = tree[name]
    return Settings(**values)


def default_toml() -> str:
    """
    @return: the text of the embedded default configuration.
    """
    return resources.files("qmq").joinpath("default.toml").read_text(encoding="utf-8")


def _default_layer() -> dict[str, Any]:
    return _check_layer(_parse(default_toml(), DEFAULT_CONFIG_NAME), DEFAULT_CONFIG_NAME)


def load_string(text: str, source: str = "<string>") -> Settings:
    """
    Build settings from the embedded default with TOML text layered over it.

    @param text: TOML text.
    @param source: the name to give the text in error messages.
    @return: the settings.
    @raise ConfigError: if the text is not valid TOML or not a valid
        configuration.
    """
    layer = _check_layer(_parse(text, source), source)
    return _build(_merge(_default_layer(), layer))


def load(path: str | Path | None = None) -> Settings:
    """
    Build settings from the embedded default, with a file layered over it.

    @param path: the user's configuration file, or L{None} for the embedded
        default alone.  Errors name it as given.
    @return: the settings.
    @raise ConfigError: if the file cannot be read, is not valid TOML or not a
        valid configuration.
    """
    if path is None:
        return _build(_default_layer())
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(source, "", f"cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(source, "", f"not UTF-8 text (byte {e.start})") from None
    return load_string(text, source)


def with_overrides(
    settings: Settings,
    listen: list[str] | None = None,
    data_dir: str | None = None,
) -> Settings:
    """
    Apply command-line overrides.

    @param settings: the loaded settings.
    @param listen: if not L{None} and not empty, replaces C{settings.listen}.
    @param data_dir: if not L{None}, replaces C{settings.data_dir}.
    @return: new settings.
    @raise ConfigError: naming the option, if a value is malformed.
    """
    changes: dict[str, Any] = {}
    if listen:
        for spec in listen:
            try:
                _listen_spec(spec, "")
            except _Invalid as e:
                raise ConfigError("--listen", "", e.problem) from None
        changes["listen"] = list(listen)
        changes["listen_source"] = "--listen"
    if data_dir is not None:
        try:
            changes["data_dir"] = _directory(data_dir, "")
        except _Invalid as e:
            raise ConfigError("--data-dir", "", e.problem) from None
    return dataclasses.replace(settings, **changes)
