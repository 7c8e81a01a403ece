"""Parsing helpers shared by the model codecs: Go-compatible JSON, Go integer/bool parsing, type checks.

Every helper raises :class:`hamid.model.errors.InvalidInput` (never anything else) on bad input, with
the caller-provided ``where`` prefix naming the annotation key, config key or JSON field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from hamid.model.errors import InvalidInput

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_GO_INT = re.compile(r"[+-]?[0-9]+\Z")
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_SURROGATE = re.compile("[\ud800-\udfff]")
# Go's encoding/json escapes these (HTML safety and JS line separators); Python's json does not.
_GO_EXTRA_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def type_name(value: object) -> str:
    """The JSON-ish name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def load_yaml(text: str, where: str) -> Any:
    """A YAML (or JSON) document, or InvalidInput in one line: the reader's first line of complaint
    (PyYAML's own spans several, with a caret drawing), or that it nests past the reader's depth."""
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise InvalidInput(f"{where}: nested too deeply") from None
    except Exception as exc:  # PyYAML's constructors let ValueError (2026-13-01),
        # OverflowError ("\UFFFFFFFF") and AttributeError (a year 99999) out as well as YAMLError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidInput(f"{where}: not valid YAML: {first:.200}") from None


def load_json(text: object, where: str) -> Any:
    """Parse JSON text the way Go's encoding/json would accept it (no NaN/Infinity)."""
    if not isinstance(text, str):
        raise InvalidInput(f"{where}: want a JSON string, got {type_name(text)}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{where}: malformed JSON: {exc}") from None


def go_json_string(value: str) -> str:
    """Encode a string exactly as Go's ``encoding/json`` does (HTML escaping on, invalid UTF-16 → U+FFFD)."""
    return json.dumps(_SURROGATE.sub("\ufffd", value), ensure_ascii=False).translate(_GO_EXTRA_ESCAPES)


def go_quote(value: str) -> str:
    """Approximate Go's ``%q`` for messages (double-quoted, backslash escapes)."""
    return json.dumps(value, ensure_ascii=False)


def go_field(obj: Mapping[str, Any], name: str) -> Any:
    """The value Go's ``encoding/json`` decodes into field ``name`` (None: no key for it): every key
    equal to the name but for case sets the field, in the object's order, so the last one wins
    (``{"deviceSplitCount": 4}`` sets HAMi's ``devicesplitcount``)."""
    folded = name.casefold()
    value = None
    for key, item in obj.items():
        if key == name or key.casefold() == folded:
            value = item
    return value


def printable(text: str) -> str:
    """``text`` with every non-printable character (control codes: ESC, BEL, CR, newline, C1, ...)
    as its backslash escape: cluster text shown on a terminal or in an Event must not carry
    escape sequences (a tenant writes its own pod's annotations)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def is_decimal(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: ``str.isdigit`` alone also admits digits such
    as ``'²'`` that ``int`` refuses, so a check by it still lets ``int`` raise on hostile input."""
    return text.isascii() and text.isdigit()


def parse_go_int(text: str, lo: int, hi: int, where: str) -> int:
    """Go ``strconv.ParseInt(text, 10, bits)``: optional sign, decimal digits only, range-checked."""
    if not _GO_INT.match(text):
        raise InvalidInput(f"{where}: {text!r:.40} is not a decimal integer")
    if len(text.lstrip("+-").lstrip("0")) > 25:  # far outside int64; also avoids huge int() conversions
        raise InvalidInput(f"{where}: {text:.40}... is out of range [{lo}, {hi}]")
    number = int(text)
    if not lo <= number <= hi:
        raise InvalidInput(f"{where}: {text!r} is out of range [{lo}, {hi}]")
    return number


def parse_go_bool(text: str, where: str) -> bool:
    """Go ``strconv.ParseBool``: 1,t,T,TRUE,true,True / 0,f,F,FALSE,false,False; anything else is an error."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise InvalidInput(f"{where}: {text!r} is not a boolean (want true/false, 1/0, t/f)")


def want_int(value: object, where: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """A JSON integer (not a boolean, not a float) within ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{where}: want an integer, got {type_name(value)}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{where}: {value} is out of range [{lo}, {hi}]")
    return value


def want_number(value: object, where: str) -> float:
    """A JSON number (integer or float, not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{where}: want a number, got {type_name(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer of some 309 digits or more
        raise InvalidInput(f"{where}: {str(value)[:20]}... is out of range") from None


def want_str(value: object, where: str) -> str:
    """A JSON string."""
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: want a string, got {type_name(value)}")
    return value


def want_bool(value: object, where: str) -> bool:
    """A JSON boolean."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}: want a boolean, got {type_name(value)}")
    return value


def want_object(value: object, where: str) -> Mapping[str, Any]:
    """A JSON object."""
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where}: want an object, got {type_name(value)}")
    return value


def want_list(value: object, where: str) -> list[Any] | tuple[Any, ...]:
    """A JSON array."""
    if not isinstance(value, list | tuple):
        raise InvalidInput(f"{where}: want an array, got {type_name(value)}")
    return value
