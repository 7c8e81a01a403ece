"""Safe-by-construction HTML: every value is escaped unless it is already :class:`Safe` markup.

Pages are built only with :func:`el` (an element, its attributes and children) and
:func:`join`; a string from the cluster — a name, an annotation, an Event message — can only
enter as text or as an attribute value, both escaped (quotes included). There is no way to
pass raw markup in except by constructing :class:`Safe`, which only this module and the
page skeleton do.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
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
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(str(value), quote=True))


def _children(children: Iterable[object]) -> Iterable[Safe]:
    for child in children:
        if child is None or child is False:
            continue
        if isinstance(child, str | int | float):
            yield esc(child)
        else:
            yield from _children(child)  # type: ignore[arg-type]


def join(*children: object) -> Safe:
    """Children concatenated (each escaped unless Safe; ``None`` and nested iterables allowed)."""
    return Safe("".join(_children(children)))


def el(tag: str, *children: object, **attributes: object) -> Safe:
    """``<tag attr="value">children</tag>``; attributes ``None``/``False`` are left out, ``True`` bare."""
    if not _TAG.match(tag):
        raise ValueError(f"not an element name: {tag!r}")
    parts = [tag]
    for key, value in attributes.items():
        name = key.rstrip("_").replace("_", "-")
        if not _ATTRIBUTE.match(name):
            raise ValueError(f"not an attribute name: {key!r}")
        if value is None or value is False:
            continue
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    opening = f"<{' '.join(parts)}>"
    if tag in _VOID:
        return Safe(opening)
    return Safe(f"{opening}{join(*children)}</{tag}>")


def path_part(value: str) -> str:
    """One URL path segment (every reserved character quoted)."""
    return quote(value, safe="")
