"""CDI facts: qualified names, the annotation form, which spec files the runtime accepts, and how
it resolves devices across spec directories (cncf-tags/container-device-interface, pkg/cdi)."""

from __future__ import annotations

import json

import pytest

from hamid.model import cdi
from hamid.model.errors import InvalidInput

NVIDIA_CTK_YAML = """\
---
cdiVersion: 0.5.0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
kind: nvidia.com/gpu
"""


def test_nvidia_ctk_yaml_and_the_same_spec_as_json() -> None:
    spec = cdi.parse_spec(NVIDIA_CTK_YAML, "/var/run/cdi/nvidia.yaml")
    assert spec == cdi.SpecDevices("nvidia.com/gpu", ("0", "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c", "all"))
    assert spec.qualified()[1] == "nvidia.com/gpu=GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
    as_json = json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gds", "devices": [{"name": "all"}]})
    assert cdi.parse_spec(as_json, "x.json").qualified() == ("nvidia.com/gds=all",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("devices: [", "not valid YAML"),
        ("- a\n- b\n", "want a CDI spec"),
        ("kind: nvidia.com/gpu\ndevices: [{name: a}]\n", "no cdiVersion"),
        ("cdiVersion: 0.5.0\ndevices: [{name: a}]\n", "kind: want a string, got null"),
        ("cdiVersion: 0.5.0\nkind: gpu\ndevices: [{name: a}]\n", "kind 'gpu' is not vendor/class"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/g=pu\ndevices: [{name: a}]\n", "not vendor/class"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n", "no devices"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: -a}]\n", "devices[0]: name '-a'"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [a]\n", "devices[0]: name None"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: a}, {name: a}]\n", "'a' defined twice"),
    ],
)
def test_specs_the_runtime_rejects_define_nothing(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=r"^/etc/cdi/x\.yaml: .*" + message.replace("[", r"\[")):
        cdi.parse_spec(text, "/etc/cdi/x.yaml")


def test_annotation_key_is_the_cdi_form_and_bounded() -> None:
    key = cdi.annotation_key("nvidia-device-plugin", "5b9e0c5a-5f1e-4a55-9a1d-0c1c2b5e8f00")
    assert key == "cdi.k8s.io/nvidia-device-plugin_5b9e0c5a-5f1e-4a55-9a1d-0c1c2b5e8f00"
    assert cdi.annotation_value(["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]) == (
        "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"
    )
    with pytest.raises(ValueError, match="not a CDI annotation name"):
        cdi.annotation_key("nvidia-device-plugin", "x" * 43)  # 21 + 43 > 63 characters
    with pytest.raises(ValueError, match="not a CDI annotation name"):
        cdi.annotation_key("nvidia-device-plugin", "a/b")


def _spec(kind: str, *names: str) -> cdi.SpecDevices:
    return cdi.SpecDevices(kind, names)


def test_a_later_directory_wins_and_a_tie_resolves_nothing() -> None:
    resolved = cdi.resolve(
        [
            (0, "/etc/cdi/a.yaml", _spec("nvidia.com/gpu", "GPU-a", "GPU-b", "all")),
            (0, "/etc/cdi/b.yaml", _spec("nvidia.com/gpu", "GPU-b")),
            (1, "/var/run/cdi/c.yaml", _spec("nvidia.com/gpu", "all", "GPU-c")),
            (1, "/var/run/cdi/d.yaml", _spec("nvidia.com/gds", "all")),
        ]
    )
    assert resolved.devices == {
        "nvidia.com/gpu=GPU-a",
        "nvidia.com/gpu=all",
        "nvidia.com/gpu=GPU-c",
        "nvidia.com/gds=all",
    }
    assert resolved.conflicts == {"nvidia.com/gpu=GPU-b": ("/etc/cdi/a.yaml", "/etc/cdi/b.yaml")}


def test_a_conflict_is_not_healed_by_a_later_directory() -> None:
    """The runtime's registry drops every name that had a tie, after the whole scan."""
    resolved = cdi.resolve(
        [
            (0, "/etc/cdi/a.yaml", _spec("nvidia.com/gpu", "GPU-a")),
            (0, "/etc/cdi/b.yaml", _spec("nvidia.com/gpu", "GPU-a")),
            (1, "/var/run/cdi/c.yaml", _spec("nvidia.com/gpu", "GPU-a")),
        ]
    )
    assert resolved.devices == frozenset()
    assert list(resolved.conflicts) == ["nvidia.com/gpu=GPU-a"]
