"""The series selectors and grouping labels of a PromQL expression (enough of PromQL for alert rules).

A small lexer, not a parser: it tells apart metric names, functions and aggregations (a name before
``(``, or an aggregation before ``by``/``without``), keywords, and the label lists of ``by``,
``without``, ``on``, ``ignoring`` and ``group_left``/``group_right``. A character it cannot lex
raises, so a rule it does not understand fails the test instead of passing unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<range>\[[^\]]*\])
    |(?P<number>\d[\w.]*)
    |(?P<ident>[A-Za-z_:][\w:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[{}(),=<>+\-*/^%])
    |(?P<space>\s+)""",
    re.X,
)
_KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "inf", "nan"})
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "count",
        "count_values",
        "quantile",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
    }
)


@dataclass(frozen=True)
class Selector:
    """One series selector: its metric name and label matchers ``(label, op, value)``."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]

    def value(self, label: str) -> str | None:
        """The value an equality matcher gives ``label`` (None without one)."""
        return next((v for name, op, v in self.matchers if name == label and op == "="), None)


@dataclass(frozen=True)
class Parsed:
    """The selectors of an expression and every label its label lists name."""

    selectors: tuple[Selector, ...]
    grouping: frozenset[str]


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    for match in _TOKEN.finditer(expr):
        if match.start() != position:
            raise ValueError(f"cannot lex {expr[position : match.start()]!r} in {expr!r}")
        position = match.end()
        if match.lastgroup != "space":
            tokens.append((str(match.lastgroup), match.group()))
    if position != len(expr):
        raise ValueError(f"cannot lex {expr[position:]!r} in {expr!r}")
    return tokens


def _matchers(tokens: list[tuple[str, str]], i: int) -> tuple[tuple[tuple[str, str, str], ...], int]:
    """The matchers of the ``{...}`` at ``tokens[i]``, and the index after its ``}``."""
    found: list[tuple[str, str, str]] = []
    i += 1
    while tokens[i][1] != "}":
        (kind, label), (_, op), (value_kind, value) = tokens[i : i + 3]
        if kind != "ident" or value_kind != "string":
            raise ValueError(f"unexpected matcher {label} {op} {value}")
        found.append((label, op, value[1:-1]))
        i += 3
        if tokens[i][1] == ",":
            i += 1
    return tuple(found), i + 1


def parse(expr: str) -> Parsed:
    """The selectors and grouping labels of ``expr``."""
    tokens = _tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _LABEL_LISTS and following == "(":
            end = tokens.index(("op", ")"), i)
            grouping |= {t for k, t in tokens[i + 2 : end] if k == "ident"}
            i = end + 1
        elif kind == "ident" and following != "(" and text not in _KEYWORDS | _AGGREGATIONS | _LABEL_LISTS:
            matchers: tuple[tuple[str, str, str], ...] = ()
            i += 1
            if following == "{":
                matchers, i = _matchers(tokens, i)
            selectors.append(Selector(text, matchers))
        else:
            i += 1
    return Parsed(tuple(selectors), frozenset(grouping))
