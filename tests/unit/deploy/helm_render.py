"""Render the hamid chart offline with the real Helm engine (helm-python-sdk's libhelm_c)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

CHART_DIR = Path(__file__).resolve().parents[3] / "config" / "helm" / "hamid"
RELEASE = "hamid"
NAMESPACE = "kube-system"
#: The Kubernetes version the rendered objects are validated against (kubernetes-validate schemas).
KUBE_VERSION = "1.35.0"


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, plus NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind``."""
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The one object of ``kind`` named ``name`` (AssertionError when absent)."""
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        """Whether an object of ``kind`` named ``name`` was rendered."""
        return any(o["metadata"]["name"] == name for o in self.all(kind))


def render(
    values: Mapping[str, Any] | None = None, chart_dir: Path = CHART_DIR, upgrade: bool = False
) -> Rendered:
    """Render the chart as ``helm install hamid -n kube-system`` would (``upgrade``: ``helm
    upgrade``; no cluster: lookup is empty)."""
    with helm_python.Chart.load(chart_dir) as chart:
        manifests = chart.render(
            values=dict(values or {}),
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=not upgrade,
            is_upgrade=upgrade,
        )
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects=objects, notes=notes)


def lint(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``helm lint --strict`` findings of severity warning or error (info dropped)."""
    report = helm_python.lint(CHART_DIR, dict(values or {}), strict=True, namespace=NAMESPACE)
    assert not report["errors"], report["errors"]
    return [m for m in report["messages"] if m["severity"] >= 2]


def container(pod_owner: Mapping[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    """The (init) container ``name`` of a Deployment/DaemonSet."""
    spec = pod_owner["spec"]["template"]["spec"]
    found = [c for c in spec["initContainers" if init else "containers"] if c["name"] == name]
    assert len(found) == 1, f"container {name}: found {len(found)}"
    return found[0]


def volumes(pod_owner: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod volumes by name."""
    return {v["name"]: v for v in pod_owner["spec"]["template"]["spec"].get("volumes", [])}


def mounts(c: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's volume mounts by mount path."""
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def flag_values(args: list[str]) -> dict[str, str | None]:
    """``--flag=value`` / bare ``--flag`` arguments as a dict (value None for a bare flag)."""
    out: dict[str, str | None] = {}
    for arg in args:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            out[name] = value if sep else None
    return out


def split_mode_args(args: list[str], mode: str) -> tuple[list[str], list[str]]:
    """``hamid`` arguments split into (global options, mode options) around the mode name."""
    position = args.index(mode)
    return args[:position], args[position + 1 :]


def iter_rules(role: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples granted by a Role/ClusterRole."""
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    yield group, resource, verb
