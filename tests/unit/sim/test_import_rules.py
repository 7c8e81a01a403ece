"""What the simulator's stand-ins may import from the product.

The simulated kubelet, kube-scheduler and API server are the oracle hamid is judged against, so
none of them may reach ``hamid.fit``, ``hamid.scheduler`` or ``hamid.plugin`` — directly or through
any hamid module they import. ``hamid.model`` (codecs), ``hamid.kube``, ``hamid.log`` and
``hamid._proto`` are fine. (``hamidsim.machine``, ``cluster``, ``demo`` and the CLIs are fixtures
and composition roots, not stand-ins: they may use the product.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STAND_INS = ("hamidsim.kubelet", "hamidsim.kube_scheduler", "hamidsim.apiserver")
FORBIDDEN = ("hamid.fit", "hamid.scheduler", "hamid.plugin")


def _top(module: str) -> Path:
    """The folder holding the module's import root (the simulator's distribution lives in sim/)."""
    return ROOT / "sim" if module.split(".")[0] == "hamidsim" else ROOT


def _module_file(module: str) -> Path | None:
    base = _top(module).joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str) -> set[str]:
    path = _module_file(module)
    if path is None:
        return set()
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    result: set[str] = set()
    for name in found:
        if name.startswith("hamid"):
            # a parent package's __init__ runs on import, so it counts too
            parts = name.split(".")
            result.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return result


def _package_modules(module: str) -> list[str]:
    """A package's submodules (all of them are part of the stand-in), or [] for a plain module."""
    path = _module_file(module)
    if path is None or path.name != "__init__.py":
        return []
    return [
        ".".join(p.relative_to(_top(module)).with_suffix("").parts).removesuffix(".__init__")
        for p in sorted(path.parent.rglob("*.py"))
    ]


def _closure(start: str) -> dict[str, str]:
    """Every hamid module reachable from ``start`` → the module that imported it."""
    seen = {start: ""}
    todo = [start]
    for sub in _package_modules(start):
        seen.setdefault(sub, start)
        todo.append(sub)
    while todo:
        current = todo.pop()
        for name in _imports(current):
            if name not in seen and _module_file(name) is not None:
                seen[name] = current
                todo.append(name)
    return seen


def _stand_in_modules() -> list[str]:
    """The stand-ins (packages or modules), plus any ``apiserver_*`` modules beside them."""
    extra = sorted(f"hamidsim.{p.stem}" for p in (ROOT / "sim" / "hamidsim").glob("apiserver_*.py"))
    return [m for m in STAND_INS if _module_file(m) is not None] + extra


@pytest.mark.parametrize("module", _stand_in_modules())
def test_stand_ins_do_not_reach_product_logic(module: str) -> None:
    reached = _closure(module)
    bad = sorted(name for name in reached if name.startswith(FORBIDDEN))
    chains = []
    for name in bad:
        chain = [name]
        while reached.get(chain[-1]):
            chain.append(reached[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not bad, f"{module} reaches product logic: " + "; ".join(chains)


def test_the_rule_can_fail() -> None:
    # The fixture module is allowed to use the plugin's devices-file codec, and the check sees it.
    assert any(name.startswith("hamid.plugin") for name in _closure("hamidsim.machine"))
    assert set(STAND_INS) <= set(_stand_in_modules())
    assert len(_closure("hamidsim.apiserver")) > 3  # a package: all its submodules are walked


#: The product's quantity parser; the stand-ins parse quantities themselves (sim/kubelet/quantity.py).
PRODUCT_QUANTITY = "hamid.model.quantity"


@pytest.mark.parametrize("module", _stand_in_modules())
def test_stand_ins_keep_their_own_quantity_parser(module: str) -> None:
    # A stand-in may load hamid.model.resources (and so the module) for a wire helper, but none of
    # its own modules imports the product's parser: a parsing bug must not hide by being shared.
    own = [module, *_package_modules(module)]
    users = sorted(m for m in own if PRODUCT_QUANTITY in _imports(m))
    assert not users, f"{', '.join(users)} import {PRODUCT_QUANTITY}"


def test_the_quantity_rule_can_fail() -> None:
    assert PRODUCT_QUANTITY in _imports("hamid.model.resources")
