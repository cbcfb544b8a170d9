# -*- test-case-name: tests.test_config -*-
"""The configuration's schema: TOML value checkers, and a section's schema
derived from its settings dataclass.

L{qmq.config} checks each TOML layer against a schema: a mapping from key to
a I{checker}, a callable C{(value, key)} that returns the normalised value
or raises L{_Invalid} naming the dotted key and what was expected
(L{qmq.config} turns that into a L{qmq.config.ConfigError} naming the
file). This module holds what every part of the schema is built from:

  - the value checkers (C{_integer}, C{_number}, C{_boolean}, C{_string},
    C{_name}, C{_one_of}, C{_arguments}, C{_string_list}) and the error
    text (C{_join} builds the dotted key, C{_describe} shows the value
    the way TOML writes it);
  - C{_table} (a table against a schema: an unknown key is an error with
    a did-you-mean hint, or the reason a removed key went) and
    C{_declarations} (an array of tables, optionally unique by a key);
  - C{_section}/C{_section_schema}: the schema of a settings section
    derived from its frozen dataclass (the rules are in L{qmq.config}'s
    docstring), cached per class.

The names keep their leading underscore: they are the configuration's own
machinery (L{qmq.config}, L{qmq.auth.settings}), not a public interface.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# -- the schema ---------------------------------------------------------------
#
# A checker takes (value, key) and returns the normalised value or raises
# _Invalid(problem, key); _check_layer turns that into a ConfigError naming the
# file.


class _Invalid(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = problem


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")  # \Z: "$" would let a trailing line break pass


def _join(prefix: str, name: str | int) -> str:
    """Append a table key or an array index to a dotted key path."""
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    part = name if _BARE_KEY.match(name) else json.dumps(name)
    return f"{prefix}.{part}" if prefix else part


def _describe(value: object) -> str:
    """Show a TOML value the way it would be written, briefly."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


def _fail(key: str, expected: str, value: object) -> _Invalid:
    return _Invalid(key, f"expected {expected}, got {_describe(value)}")


def _integer(minimum: int | None = None) -> Callable[[object, str], int]:
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")

    def check(value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(key, expected, value)
        if minimum is not None and value < minimum:
            raise _fail(key, expected, value)
        return value

    return check


def _number(
    minimum: float | None = None, above: float | None = None
) -> Callable[[object, str], float]:
    if above is not None:
        expected = f"a number > {above:g}"
    elif minimum is not None:
        expected = f"a number >= {minimum:g}"
    else:
        expected = "a number"

    def check(value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(key, expected, value)
        if not math.isfinite(value):
            raise _fail(key, expected, value)
        if minimum is not None and value < minimum:
            raise _fail(key, expected, value)
        if above is not None and value <= above:
            raise _fail(key, expected, value)
        return float(value)

    return check


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, "true or false", value)
    return value


def _string(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise _fail(key, "a string", value)
    return value


def _name(value: object, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(key, "a non-empty string", value)
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[object, str], str]:
    expected = "one of " + ", ".join(choices)

    def check(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise _fail(key, expected, value)
        return value

    return check


def _arguments(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(key, "a table of arguments", value)
    for name, argument in value.items():
        if isinstance(argument, dict | list) or not isinstance(argument, str | int | float | bool):
            raise _fail(_join(key, name), "a string, number or boolean", argument)
    return dict(value)


_Schema = dict[str, Callable[[object, str], Any]]


# -- sections: a schema derived from a settings dataclass -----------------------

#: The TOML type of each Python type a section field may have: what errors
#: call it, and whether a TOML value is one.
_KINDS: dict[type, tuple[str, Callable[[object], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: (
        "a number",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    ),
    str: ("a string", lambda v: isinstance(v, str)),
    # tuple[str, ...]: an array (its C{parse} checks the items and returns a tuple).
    tuple: ("an array", lambda v: isinstance(v, list)),
}

_METADATA = frozenset({"min", "above", "max", "choices", "parse", "expected"})


def _bound(value: float) -> str:
    """Show a range bound: C{1.5}, C{0}, C{1000000} (not C{1e+06})."""
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class _FieldChecker:
    """
    Checks one key of a section against the field it fills.

    @ivar kinds: the Python types the value may have, in the annotation's
        order (L{_KINDS} keys).
    @ivar expected: what errors say was expected (C{"an integer >= 1"}).
    """

    kinds: tuple[type, ...]
    expected: str
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    parse: Callable[[Any], Any] | None = None

    def __call__(self, value: Any, key: str) -> Any:
        for kind in self.kinds:
            if _KINDS[kind][1](value):
                break
        else:
            raise _fail(key, self.expected, value)
        if kind in (int, float):
            if self.minimum is not None and value < self.minimum:
                raise _fail(key, self.expected, value)
            if self.above is not None and value <= self.above:
                raise _fail(key, self.expected, value)
            if self.maximum is not None and value > self.maximum:
                raise _fail(key, self.expected, value)
        if kind is float:
            value = float(value)
        if self.choices is not None and value not in self.choices:
            raise _fail(key, self.expected, value)
        if self.parse is not None:
            try:
                value = self.parse(value)
            except ValueError as e:
                raise _Invalid(key, str(e)) from None
        return value


def _field_checker(cls: type, f: dataclasses.Field, annotation: Any) -> _FieldChecker:
    """Derive the checker of one section field from its annotation and metadata."""
    where = f"{cls.__module__}.{cls.__qualname__}.{f.name}"
    kinds = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    if typing.get_origin(annotation) is tuple:
        kinds = (tuple,)
    if not kinds or any(kind not in _KINDS for kind in kinds):
        raise TypeError(
            f"qmq.config cannot map {where}: {annotation!r} (expected int, float, bool, str,"
            " a union of them, or tuple[str, ...] with a parse)"
        )
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise TypeError(f"qmq.config: {where} needs a default (the key is optional)")
    meta = f.metadata
    unknown = set(meta) - _METADATA
    if unknown:
        raise TypeError(f"qmq.config: unknown metadata {sorted(unknown)} on {where}")
    minimum, above, maximum = meta.get("min"), meta.get("above"), meta.get("max")
    numeric = int in kinds or float in kinds
    if numeric and minimum is None and above is None and "parse" not in meta:
        # A count, a size or a duration: never negative unless a field says so.
        if float in kinds:
            above = 0
        else:
            minimum = 0
    choices = tuple(meta["choices"]) if "choices" in meta else None
    if choices is not None:
        expected = "one of " + ", ".join(map(str, choices))
    else:
        descriptions = []
        for kind in kinds:
            text = _KINDS[kind][0]
            if kind in (int, float):
                if above is not None:
                    text += f" > {_bound(above)}"
                    if maximum is not None:
                        text += f" and <= {_bound(maximum)}"
                elif minimum is not None and maximum is not None:
                    text += f" from {_bound(minimum)} to {_bound(maximum)}"
                elif minimum is not None:
                    text += f" >= {_bound(minimum)}"
                elif maximum is not None:
                    text += f" <= {_bound(maximum)}"
            descriptions.append(text)
        expected = " or ".join(descriptions)
    return _FieldChecker(
        kinds=kinds,
        expected=meta.get("expected", expected),
        minimum=minimum,
        above=above,
        maximum=maximum,
        choices=choices,
        parse=meta.get("parse"),
    )


def _is_union(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union


@functools.cache
def _section_schema(cls: type) -> dict[str, _FieldChecker]:
    """
    The schema of a section, derived from its frozen dataclass.

    @raise TypeError: a field has a type or metadata this module cannot map
        (a programming error, found the first time the section is used).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"qmq.config: section {cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    return {
        f.name: _field_checker(cls, f, hints[f.name]) for f in dataclasses.fields(cls) if f.init
    }


def _section(cls: type) -> Callable[[object, str], dict[str, Any]]:
    schema = _section_schema(cls)

    def check(value: object, key: str) -> dict[str, Any]:
        return _table(value, key, schema)

    return check


#: Keys that were removed, with what replaced them: an old configuration
#: setting one is told so in its error.
_REMOVED = {
    "http_api.max_delay": "delays are bounded by the core for every protocol (docs/stomp.rst, "
    "Delivery options); remove the key",
    "http_api.max_delayed": "delayed messages wait in their queues (durably, under the memory "
    "alarm), as STOMP's always did; remove the key",
}


def _table(
    value: object, key: str, schema: _Schema, required: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Check a table against a schema: unknown keys and missing required keys are errors."""
    if not isinstance(value, dict):
        raise _fail(key, "a table", value)
    result = {}
    for name, item in value.items():
        item_key = _join(key, name)
        if name not in schema:
            known = ", ".join(sorted(schema))
            close = difflib.get_close_matches(name, schema, n=1)
            hint = f"; did you mean {json.dumps(close[0])}?" if close else ""
            if item_key in _REMOVED:
                hint = f"; removed: {_REMOVED[item_key]}"
            raise _Invalid(item_key, f"unknown key (expected one of: {known}){hint}")
        result[name] = schema[name](item, item_key)
    for name, expected in (required or {}).items():
        if name not in value:
            raise _Invalid(key, f"missing key {json.dumps(name)} (expected {expected})")
    return result


def _declarations(
    schema: _Schema, required: Mapping[str, str], unique: str | None
) -> Callable[[object, str], list[dict[str, Any]]]:
    def check(value: object, key: str) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise _fail(key, "an array of tables", value)
        result = []
        seen: set[str] = set()
        for index, item in enumerate(value):
            item_key = _join(key, index)
            table = _table(item, item_key, schema, required)
            if unique is not None:
                if table[unique] in seen:
                    raise _Invalid(
                        _join(item_key, unique),
                        f"{json.dumps(table[unique])} is declared twice",
                    )
                seen.add(table[unique])
            table["origin"] = item_key
            result.append(table)
        return result

    return check


def _string_list(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, "an array of non-empty strings", value)
    return tuple(value)
