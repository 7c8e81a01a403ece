"""Kubernetes label syntax, and the node label selector HAMi's scheduler takes (pure).

``--node-label-selector`` is HAMi's ``StringToString`` flag: ``key=value`` pairs separated by
commas, every pair an exact match (``labels.Set(...).AsSelector()``). The same key and value rules
as the API server's (``IsQualifiedName``, ``IsValidLabelValue``) are checked here, so a typo stops
the scheduler at start instead of silently selecting no node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hamid.model.errors import InvalidInput

#: A label name, and a label value when non-empty: alphanumeric at both ends, ``-_.`` inside.
LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
#: A DNS-1123 subdomain: the optional prefix of a label key (``example.com/``).
DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
#: A label key: ``[prefix/]name`` (lengths checked apart: :func:`label_key_problem`).
LABEL_KEY = rf"(?:{DNS_SUBDOMAIN}/)?{LABEL_NAME}"
_NAME = re.compile(LABEL_NAME)
_PREFIX = re.compile(DNS_SUBDOMAIN)
_NAME_MAX = 63
_PREFIX_MAX = 253


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (None: it is one)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= _PREFIX_MAX and _PREFIX.fullmatch(prefix)):
        return f"prefix {prefix!r} is not a DNS subdomain (lowercase letters, digits, '-', '.'; at most 253)"
    if not name:
        return "the name is empty"
    if len(name) > _NAME_MAX or not _NAME.fullmatch(name):
        return (
            f"name {name!r} is not a label name (at most 63 letters, digits, '-', '_', '.', "
            "beginning and ending with a letter or digit)"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value (None: it is one; empty is one)."""
    if value and (len(value) > _NAME_MAX or not _NAME.fullmatch(value)):
        return (
            f"value {value!r} is not a label value (empty, or at most 63 letters, digits, '-', '_', "
            "'.', beginning and ending with a letter or digit)"
        )
    return None


@dataclass(frozen=True, slots=True)
class NodeLabelSelector:
    """Labels a node must carry, each with exactly this value (none: every node matches)."""

    pairs: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` carry every pair (a label set to another value does not match)."""
        return all(key in labels and labels[key] == value for key, value in self.pairs)

    def __str__(self) -> str:
        """The selector as the flag and Kubernetes write it (``k1=v1,k2=v2``, keys sorted)."""
        return ",".join(f"{key}={value}" for key, value in self.pairs)


#: The empty selector: every node matches (the default).
EVERY_NODE = NodeLabelSelector()


def parse_node_label_selector(text: str) -> NodeLabelSelector:
    """``k1=v1,k2=v2`` (HAMi's ``--node-label-selector``); empty text selects every node.

    Raises :class:`InvalidInput` naming the pair at fault: one without ``=``, an empty one (two
    commas), an invalid key or value, or a key given twice.
    """
    if not text.strip():
        return EVERY_NODE
    pairs: dict[str, str] = {}
    for raw in text.split(","):
        pair = raw.strip()
        if not pair:
            raise InvalidInput(f"{text!r} has an empty pair (two commas in a row, or one at an end)")
        key, eq, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise InvalidInput(f"pair {pair!r} is not key=value")
        if not key:
            raise InvalidInput(f"pair {pair!r} has an empty key")
        problem = label_key_problem(key) or label_value_problem(value)
        if problem is not None:
            raise InvalidInput(f"pair {pair!r}: {problem}")
        if key in pairs:
            raise InvalidInput(f"pair {pair!r}: key {key!r} is given twice")
        pairs[key] = value
    return NodeLabelSelector(tuple(sorted(pairs.items())))
