"""Safe-by-construction HTML: every value is escaped unless it is already :class:`Safe` markup.

Pages are built only with :func:`el` (an element, its attributes and children) and
:func:`join`; a string from the cluster — a name, an annotation, an Event message — can only
enter as text or as an attribute value, both escaped (quotes included). There is no way to
pass raw markup in except by constructing :class:`Safe`, which only this module and the
page skeleton do.
"""

from __future__ import annotations

import functools
import html
import re
from urllib.parse import quote

#: Attribute names the builder accepts (``class_`` → ``class``, ``data_pod`` → ``data-pod``).
_ATTRIBUTE = re.compile(r"[a-zA-Z][a-zA-Z0-9-]*\Z")
#: Elements without content or end tag.
_VOID = frozenset({"meta", "link", "br", "hr", "img", "input"})
#: Element names the builder accepts.
_TAG = re.compile(r"[a-z][a-z0-9]*\Z")


class Safe(str):
    """Markup that is already escaped."""

    __slots__ = ()


def esc(value: object) -> Safe:
    """``value`` as text (Safe markup passes unchanged)."""
    kind = type(value)
    if kind is Safe:
        return value  # type: ignore[return-value]
    if kind is int:
        return Safe(value)
    return Safe(html.escape(str(value), quote=True))


def _render(child: object, out: list[str]) -> None:
    """Append ``child`` escaped (Safe as is; ``None``/``False`` dropped; iterables flattened)."""
    kind = type(child)
    if kind is Safe:
        out.append(child)  # type: ignore[arg-type]
    elif kind is str:
        out.append(html.escape(child, quote=True))  # type: ignore[arg-type]
    elif child is None or child is False:
        return
    elif kind is int or kind is float or isinstance(child, str | int | float):
        out.append(esc(child))
    else:
        for item in child:  # type: ignore[attr-defined]
            _render(item, out)


def join(*children: object) -> Safe:
    """Children concatenated (each escaped unless Safe; ``None`` and nested iterables allowed)."""
    out: list[str] = []
    for child in children:
        _render(child, out)
    return Safe("".join(out))


@functools.cache
def _tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise ValueError(f"not an element name: {tag!r}")
    return tag


@functools.cache
def _attribute(key: str) -> str:
    name = key.rstrip("_").replace("_", "-")
    if not _ATTRIBUTE.match(name):
        raise ValueError(f"not an attribute name: {key!r}")
    return name


def el(tag: str, *children: object, **attributes: object) -> Safe:
    """``<tag attr="value">children</tag>``; attributes ``None``/``False`` are left out, ``True`` bare."""
    out = ["<", _tag(tag)]
    for key, value in attributes.items():
        if value is None or value is False:
            continue
        out.append(" ")
        out.append(_attribute(key))
        if value is not True:
            out += ('="', esc(value), '"')
    out.append(">")
    if tag in _VOID:
        return Safe("".join(out))
    for child in children:
        _render(child, out)
    out += ("</", tag, ">")
    return Safe("".join(out))


def path_part(value: str) -> str:
    """One URL path segment (every reserved character quoted)."""
    return quote(value, safe="")
