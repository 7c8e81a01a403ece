"""Shared click option helpers: every option is also read from ``HAMID_<OPTION>``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click


def env_name(option_name: str) -> str:
    """The ``HAMID_<OPTION>`` environment variable for a ``--long-option`` name."""
    return "HAMID_" + option_name.lstrip("-").replace("-", "_").upper()


def option(*param_decls: str, aliases: Sequence[str] = (), **attrs: Any) -> Callable[..., Any]:
    """A ``click.option`` that also reads ``HAMID_<OPTION>`` and any HAMi-compatible ``aliases``.

    The first long name in ``param_decls`` decides the env var name; ``aliases`` are extra env var
    names (for example ``NODE_NAME``) read when the ``HAMID_`` one is unset.
    """
    long_name = next(d for d in param_decls if d.startswith("--")).split("/")[0]
    attrs.setdefault("envvar", [env_name(long_name), *aliases])
    attrs.setdefault("show_envvar", True)
    if "default" in attrs and "show_default" not in attrs:
        attrs["show_default"] = True
    return click.option(*param_decls, **attrs)
