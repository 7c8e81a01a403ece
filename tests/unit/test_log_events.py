"""One log-event style: an event name is a snake_case identifier; what varies goes in key=value fields.

Structured logs are filtered and counted by event name (``jq 'select(.event == "kubelet_registered")'``),
so a name must be a stable identifier, never a sentence with values or advice spliced in. The AST
walk covers every ``log.<level>(...)`` call in ``hamid/`` whose event is a literal (or a choice
between literals).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVENT = re.compile(r"[a-z][a-z0-9_]*\Z")
LEVELS = frozenset({"debug", "info", "warning", "error", "exception", "critical"})


def _events(node: ast.expr) -> Iterator[str | None]:
    """The literal event names a call's first argument can take; None for a computed one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _events(node.body)
        yield from _events(node.orelse)
    else:
        yield None


def _offences(source: str) -> Iterator[tuple[int, str]]:
    """(line, event) for each log call in ``source`` whose event is not an identifier."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LEVELS or not node.args:
            continue
        if not isinstance(node.func.value, ast.Name | ast.Attribute | ast.Call):
            continue
        for event in _events(node.args[0]):
            if event is None:
                yield node.lineno, ast.unparse(node.args[0])
            elif not EVENT.match(event):
                yield node.lineno, event


def _all_offences() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted((ROOT / "hamid").rglob("*.py")):
        if "_proto" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        out += [(rel, line, event) for line, event in _offences(path.read_text(encoding="utf-8"))]
    return out


def test_log_events_are_identifiers() -> None:
    bad = [f"{path}:{line}: {event!r}" for path, line, event in _all_offences()]
    assert not bad, "log event names must match [a-z][a-z0-9_]* (values go in fields):\n" + "\n".join(bad)


def test_the_check_sees_prose_computed_and_conditional_events() -> None:
    source = (
        "log.info('pod bound', node=n)\n"
        "self._log.warning(f'{x} failed')\n"
        "bound.info('a_b' if c else 'not ok')\n"
        "log.debug('fine_event', a=1)\n"
        "click.echo('not a log call')\n"
    )
    assert list(_offences(source)) == [(1, "pod bound"), (2, "f'{x} failed'"), (3, "not ok")]
