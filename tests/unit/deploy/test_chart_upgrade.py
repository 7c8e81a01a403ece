"""``helm upgrade --reuse-values`` from an installed release: the new templates over old values."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

import hamid
from hamid.exposition import register_hami_build_info
from tests.unit.deploy.helm_render import CHART_DIR, Rendered, render, volumes

#: The values.yaml of chart 0.1.0 (commit 4ea4387), the oldest release an upgrade starts from.
OLD_VALUES = Path(__file__).parent / "fixtures" / "values-0.1.0.yaml"


def _blank(value: Any, key: str = "") -> Any:
    """``value`` with what a render generates afresh each time blanked: Secret data (keys,
    certificates), certificates and CA bundles, and the checksums of them in annotations."""
    if isinstance(value, dict):
        return {k: _blank(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    if isinstance(value, str) and (
        "BEGIN CERTIFICATE" in value or key == "caBundle" or key.startswith("checksum/")
    ):
        return "<generated>"
    return value


def _stable(rendered: Rendered) -> dict[tuple[str, str], Any]:
    """Each object by kind and name, what a render generates afresh blanked."""
    out = {}
    for o in rendered.objects:
        o = _blank(o)
        if o["kind"] == "Secret":
            o["data"] = dict.fromkeys(o.get("data", {}), "<generated>")
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


def _key_readable(rendered: Rendered) -> dict[str, Any]:
    """The scheduler's key volume and pod security context, after checking that the non-root
    scheduler can read the key: by its group (fsGroup, mode 0440) or by mode 0444."""
    deployment = rendered.get("Deployment", "hamid-scheduler")
    spec = deployment["spec"]["template"]["spec"]
    mode = volumes(deployment)["allocation-keys"]["secret"]["defaultMode"]
    assert mode == (0o440 if "fsGroup" in spec.get("securityContext", {}) else 0o444)
    return {"mode": mode, "securityContext": spec.pop("securityContext", None)}


def test_reuse_values_renders_what_the_old_values_file_with_the_new_defaults_would(tmp_path: Path) -> None:
    """With ``--reuse-values`` Helm coalesces the release's values with the *old* chart's defaults
    and never reads the new values.yaml, so every key added since is absent: the templates must
    read it as its new default (a nil-pointer render refused the upgrade). One difference is
    meant: 0.1.0 set no fsGroup, so the key is mounted readable by mode instead of by group (it
    was unreadable to the scheduler then)."""
    chart = tmp_path / "hamid"
    shutil.copytree(CHART_DIR, chart)
    (chart / "values.yaml").write_text(OLD_VALUES.read_text())
    old: dict[str, Any] = yaml.safe_load(OLD_VALUES.read_text())
    reused = render(chart_dir=chart, upgrade=True)
    upgraded = render(old, upgrade=True)  # helm upgrade -f old-values.yaml: the new defaults beneath
    assert _key_readable(reused)["mode"] == 0o444 and _key_readable(upgraded)["mode"] == 0o440
    for rendered in (reused, upgraded):
        volumes(rendered.get("Deployment", "hamid-scheduler"))["allocation-keys"]["secret"].pop("defaultMode")
    assert _stable(reused) == _stable(upgraded)
    assert reused.has("ValidatingAdmissionPolicy", "hamid-device-plugin-node-scope")


def test_without_an_fs_group_the_key_is_still_readable() -> None:
    """``podSecurityContext.fsGroup: null`` (Helm's way to drop a default; OpenShift assigns its own)
    renders no fsGroup, and the key readable by mode."""
    plain = render({"scheduler": {"podSecurityContext": {"fsGroup": None}}})
    assert _key_readable(plain) == {
        "mode": 0o444,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    assert _key_readable(render())["mode"] == 0o440


def test_the_chart_installs_this_version_and_the_build_names_its_revision(monkeypatch: Any) -> None:
    """The default image tag is the chart's appVersion: it must be hamid's version, or an upgrade
    renders the same image while the binary changed. The image's HAMID_REVISION (Containerfile)
    is hami_build_info's ``revision``, so nodes running different builds can be told apart."""
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == hamid.__version__
    containerfile = (CHART_DIR.parents[2] / "Containerfile").read_text()
    assert "ARG HAMID_REVISION" in containerfile and "HAMID_REVISION=${HAMID_REVISION}" in containerfile
    monkeypatch.setenv("HAMID_REVISION", "9d9c30c")
    registry = CollectorRegistry()
    register_hami_build_info(registry)
    assert (
        registry.get_sample_value(
            "hami_build_info",
            {
                "version": hamid.__version__,
                "revision": "9d9c30c",
                "build_date": "",
                "go_version": "",
                "compiler": platform.python_implementation().lower(),
                "platform": f"{sys.platform}/{platform.machine()}",
            },
        )
        == 1
    )
