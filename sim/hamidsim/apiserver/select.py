"""Label and field selectors as the real API server parses them.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists),
``!k`` (does not exist), ``k>n``, ``k<n``; requirements are ANDed with commas.
Field selectors: ``f=v``, ``f==v``, ``f!=v`` ANDed with commas, on the fields each kind supports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hamidsim.apiserver.errors import ApiError, bad_request

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_NOT_EXISTS = re.compile(rf"^\s*!\s*({_KEY})\s*$")
_EXISTS = re.compile(rf"^\s*({_KEY})\s*$")
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^()]*)\)\s*$")
_INTEGER = re.compile(r"-?[0-9]{1,18}")  # a label value compared with > or < (ASCII digits only)
_COMPARE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=|>|<)\s*({_VALUE})\s*$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")

Labels = Mapping[str, str]
LabelTest = Callable[[Labels], bool]


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    for pos, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(f"unable to parse requirement: unbalanced ')' in {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    if depth:
        raise bad_request(f"unable to parse requirement: unbalanced '(' in {text!r}")
    parts.append(text[start:])
    return parts


def _requirement(text: str) -> LabelTest:
    if match := _NOT_EXISTS.match(text):
        key = match[1]
        return lambda labels: key not in labels
    if match := _SET.match(text):
        key, op = match[1], match[2]
        values = frozenset(v.strip() for v in match[3].split(","))
        bad = [v for v in values if not _VALUE_RE.match(v)]
        if bad or not values:
            raise bad_request(f"unable to parse requirement: invalid values in {text.strip()!r}")
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _COMPARE.match(text):
        key, op, value = match[1], match[2], match[3]
        if op in ("=", "=="):
            return lambda labels: labels.get(key) == value
        if op == "!=":
            return lambda labels: labels.get(key) != value
        if not _INTEGER.fullmatch(value):
            raise bad_request(f"unable to parse requirement: for {op!r}, {value!r} must be an integer")
        bound = int(value)
        return lambda labels: _int_compare(labels.get(key), bound, greater=op == ">")
    if match := _EXISTS.match(text):
        key = match[1]
        return lambda labels: key in labels
    raise bad_request(
        f"unable to parse requirement: {text.strip()!r} is not a valid label selector requirement"
    )


def _int_compare(value: str | None, bound: int, *, greater: bool) -> bool:
    if value is None or not _INTEGER.fullmatch(value):
        return False
    return int(value) > bound if greater else int(value) < bound


def parse_label_selector(text: str | None) -> LabelTest | None:
    """Compile a label selector; ``None`` for an empty selector (matches everything)."""
    if text is None or not text.strip():
        return None
    tests = [_requirement(part) for part in _split_top_level(text)]
    if len(tests) == 1:
        return tests[0]
    return lambda labels: all(test(labels) for test in tests)


@dataclass(frozen=True, slots=True)
class FieldTerm:
    """One ``field op value`` term of a field selector."""

    field: str
    value: str
    equal: bool


FieldGetter = Callable[[dict[str, Any]], str]


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A parsed field selector: terms ANDed together."""

    terms: tuple[FieldTerm, ...]

    def equality(self, field: str) -> str | None:
        """The value of an ``field=value`` term, if the selector has one (used to pick an index)."""
        for term in self.terms:
            if term.field == field and term.equal:
                return term.value
        return None

    def compile(self, getters: Mapping[str, FieldGetter]) -> Callable[[dict[str, Any]], bool]:
        """A predicate on wire-form objects, using each supported field's getter."""
        checks = [(getters[t.field], t.value, t.equal) for t in self.terms]
        return lambda obj: all((get(obj) == value) == equal for get, value, equal in checks)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _field_term(part: str) -> tuple[str, str, bool]:
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        field, sep, value = part.partition(op)
        if sep:
            return field.strip(), value, equal
    raise bad_request(f"invalid selector: {part!r}; can't understand it")


def parse_field_selector(
    text: str | None, supported: Mapping[str, FieldGetter], resource: str
) -> FieldSelector | None:
    """Parse a field selector against the fields ``resource`` supports; ``None`` when empty."""
    if text is None or not text.strip():
        return None
    terms: list[FieldTerm] = []
    for raw in re.split(r"(?<!\\),", text):
        part = raw.strip()
        if not part:
            continue
        field, value, equal = _field_term(part)
        if field not in supported:
            raise ApiError(400, f'field label not supported: "{field}" (on {resource})')
        terms.append(FieldTerm(field, _unescape(value.strip()), equal))
    return FieldSelector(tuple(terms)) if terms else None


def path_getter(*path: str, default: str = "") -> FieldGetter:
    """A field getter reading a path; missing fields read as ``default``, booleans as ``true``/``false``."""

    def get(obj: dict[str, Any]) -> str:
        node: Any = obj
        for key in path:
            if not isinstance(node, dict):
                return default
            node = node.get(key)
        if node is None:
            return default
        if isinstance(node, bool):
            return "true" if node else "false"
        return str(node)

    return get


ObjectTest = Callable[[dict[str, Any]], bool]


def compile_selectors(
    label_selector: str | None,
    field_selector: str | None,
    fields: Mapping[str, FieldGetter],
    plural: str,
) -> tuple[ObjectTest | None, FieldSelector | None]:
    """One test over whole objects for both selectors (``None``: everything matches), and the field
    selector itself (the store narrows candidates by its equality terms)."""
    labels = parse_label_selector(label_selector)
    parsed = parse_field_selector(field_selector, fields, plural)
    field_test = parsed.compile(fields) if parsed is not None else None
    if labels is None:
        return field_test, parsed
    label_test = labels
    if field_test is None:
        return lambda obj: label_test(obj["metadata"].get("labels") or {}), parsed
    return lambda obj: label_test(obj["metadata"].get("labels") or {}) and field_test(obj), parsed


def _expression(key: str, operator: Any, values: Any) -> LabelTest:
    """One ``matchExpressions`` requirement."""
    if not isinstance(values, list):
        raise bad_request(f"values of the requirement on {key!r} must be a list")
    allowed = frozenset(str(v) for v in values)
    if operator == "In":
        return lambda labels: labels.get(key) in allowed
    if operator == "NotIn":
        return lambda labels: labels.get(key) not in allowed
    if operator == "Exists":
        return lambda labels: key in labels
    if operator == "DoesNotExist":
        return lambda labels: key not in labels
    raise bad_request(f"{operator!r} is not a valid label selector operator")


def label_selector_test(selector: Any) -> LabelTest:
    """A ``metav1.LabelSelector`` object (``matchLabels``, ``matchExpressions``) as a test.

    An empty or missing selector matches everything; a malformed one is a 400.
    """
    if selector in (None, {}):
        return lambda labels: True
    if not isinstance(selector, dict):
        raise bad_request("a label selector must be an object")
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, dict) or not isinstance(expressions, list):
        raise bad_request("matchLabels must be an object and matchExpressions a list")
    tests = [_expression(str(k), "In", [v]) for k, v in match_labels.items()]
    for expr in expressions:
        if not isinstance(expr, dict):
            raise bad_request("each matchExpressions entry must be an object")
        tests.append(_expression(str(expr.get("key", "")), expr.get("operator"), expr.get("values") or []))
    return lambda labels: all(test(labels) for test in tests)
