"""Options defined once: a dataclass field's metadata makes its click option.

A mode's options are one frozen dataclass (``SchedulerOptions``, ``PluginOptions``). Each field
declared with :func:`option_field` carries its help text, flag name, extra env vars and the parser
from command-line text to the field's value; its default is the dataclass default, shown in
``--help`` through ``show``. :func:`click_options` turns the fields into click options (every one
also read from ``HAMID_<OPTION>``) and :func:`from_cli` builds the dataclass from what click
parsed. A field whose value is another dataclass owned elsewhere (``SchedulerSettings``) gets its
flags from :func:`nested_field`, the defaults still read from that dataclass. Checks that span
several fields belong in the dataclass's ``__post_init__``, raising :class:`OptionError`; the CLI
reports it against the flag it names and the simulator and tests get the same check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar

import click

from hamid.model.errors import InvalidInput

_OPTION = "hamid.option"
_NESTED = "hamid.nested"
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class OptionError(InvalidInput):
    """An option value (or a combination of them) that cannot work; ``flag`` names the culprit."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.reason = message


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


@dataclass(frozen=True, slots=True)
class Opt:
    """How one dataclass field appears on the command line."""

    help: str
    #: ``--long-name`` (default: the field name with dashes; ``--x/--no-x`` for a bool).
    flag: str = ""
    #: Extra env vars read when ``HAMID_<OPTION>`` is unset (HAMi's names, e.g. ``NODE_NAME``).
    aliases: tuple[str, ...] = ()
    #: Command-line text → field value; raises InvalidInput or ValueError for a bad value.
    parse: Callable[[str], Any] | None = None
    #: Field default → the text ``--help`` shows (None: no default shown).
    show: Callable[[Any], str | None] | None = None
    #: The click type checking the text at parse time (listen addresses, choices, paths).
    type: Any = None
    #: The flag may be given more than once, its values joined with commas before ``parse``, as
    #: HAMi's map flags merge their repeats; the env var holds them comma-separated.
    repeatable: bool = False


class _CommaList(click.types.StringParamType):
    """Text whose env var splits on commas (a repeatable option's values)."""

    envvar_list_splitter = ","


def option_field(
    help: str,
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    flag: str = "",
    aliases: Sequence[str] = (),
    parse: Callable[[str], Any] | None = None,
    show: Callable[[Any], str | None] | None = None,
    type: Any = None,
    repeatable: bool = False,
) -> Any:
    """A dataclass field that is also a command-line option (see :class:`Opt`)."""
    spec = Opt(help, flag, tuple(aliases), parse, show, type, repeatable)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_OPTION: spec})


def nested_field(cls: type[T], flags: Mapping[str, Opt]) -> Any:
    """A field holding a ``cls`` (default ``cls()``) whose fields named in ``flags`` are options."""
    return dataclasses.field(default_factory=cls, metadata={_NESTED: (cls, dict(flags))})


@dataclass(frozen=True, slots=True)
class _Param:
    """One generated option: where its value goes and what it defaults to."""

    dest: str
    owner: str | None  # the nested field holding it; None: a field of the mode's dataclass
    spec: Opt
    default: Any
    required: bool

    @property
    def flag(self) -> str:
        if self.spec.flag:
            return self.spec.flag
        name = "--" + self.dest.replace("_", "-")
        return f"{name}/--no-{name[2:]}" if isinstance(self.default, bool) else name

    @property
    def long_name(self) -> str:
        return self.flag.split("/")[0]

    def click_decorator(self) -> Callable[..., Any]:
        shown = self._shown_default()
        attrs: dict[str, Any] = {"help": self.spec.help, "required": self.required}
        if isinstance(self.default, bool):
            attrs["default"] = self.default
        elif shown is not None:
            attrs["default"] = shown
        elif not self.required:  # click 8.3+ takes an explicit None as a given default
            attrs["default"] = None
        if self.spec.type is not None:
            attrs["type"] = self.spec.type
        if self.spec.repeatable:  # click's default would be one value per character: --help shows it
            attrs.update(multiple=True, type=_CommaList(), default=None, show_default=shown or False)
        return option(self.flag, self.dest, aliases=self.spec.aliases, **attrs)

    def _shown_default(self) -> str | None:
        if self.required:
            return None
        if self.spec.show is not None:
            return self.spec.show(self.default)
        if self.default is None or isinstance(self.default, bool):
            return None
        return str(self.default)

    def value(self, raw: Any) -> Any:
        """The field value for what click parsed (None: the default)."""
        if isinstance(raw, tuple):  # a repeatable option: its values, () when not given
            raw = ",".join(raw) if raw else None
        if raw is None:
            return self.default
        if isinstance(raw, bool) or self.spec.parse is None:
            return raw
        try:
            return self.spec.parse(str(raw))
        except (InvalidInput, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint=self.long_name) from None


def _field_default(f: dataclasses.Field[Any]) -> tuple[Any, bool]:
    """(default, required) of a dataclass field."""
    if f.default is not MISSING:
        return f.default, False
    if f.default_factory is not MISSING:
        return f.default_factory(), False
    return None, True


def _params(cls: type) -> Iterator[_Param]:
    for f in dataclasses.fields(cls):
        if _OPTION in f.metadata:
            default, required = _field_default(f)
            yield _Param(f.name, None, f.metadata[_OPTION], default, required)
        elif _NESTED in f.metadata:
            inner, flags = f.metadata[_NESTED]
            inner_fields = {g.name: g for g in dataclasses.fields(inner)}
            for name, spec in flags.items():
                default, required = _field_default(inner_fields[name])
                yield _Param(name, f.name, spec, default, required)


def click_options(cls: type) -> Callable[[F], F]:
    """Decorate a click command with one option per option field of ``cls``, in field order."""
    params = list(_params(cls))
    dests = [p.dest for p in params]
    if len(set(dests)) != len(dests):
        raise TypeError(f"{cls.__name__}: two options share a name in {dests}")

    def decorate(command: F) -> F:
        for param in reversed(params):  # click lists options in the order they are applied
            command = param.click_decorator()(command)
        return command

    return decorate


def from_cli(cls: type[T], values: Mapping[str, Any], **fixed: Any) -> T:
    """A ``cls`` from click's parsed ``values`` (plus ``fixed`` fields); bad values are usage errors."""
    top: dict[str, Any] = dict(fixed)
    nested: dict[str, dict[str, Any]] = {}
    for param in _params(cls):
        value = param.value(values.get(param.dest))
        if param.owner is None:
            top[param.dest] = value
        else:
            nested.setdefault(param.owner, {})[param.dest] = value
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for owner, kwargs in nested.items():
        inner, _flags = fields[owner].metadata[_NESTED]
        base = top.pop(owner, None)
        top[owner] = dataclasses.replace(base, **kwargs) if base is not None else inner(**kwargs)
    try:
        return cls(**top)
    except OptionError as exc:
        raise click.BadParameter(exc.reason, param_hint=exc.flag) from None


def or_none(text: str) -> str | None:
    """Empty text is None (an optional file or address left unset)."""
    return text.strip() or None
