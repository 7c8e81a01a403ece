"""The plugin's KubeletConfiguration reader: the placement policies, kubelet's defaults, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hamid.model.errors import InvalidInput
from hamid.plugin.kubelet_config import load_kubelet_policies, parse_kubelet_policies
from hamidsim.cluster import kubelet_config_document
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig

HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def test_the_placement_fields_are_read_verbatim() -> None:
    text = HEAD + (
        "cpuManagerPolicy: static\n"
        "cpuManagerPolicyOptions: {full-pcpus-only: 'true'}\n"
        "topologyManagerPolicy: single-numa-node\n"
        "topologyManagerScope: pod\n"
        "topologyManagerPolicyOptions: {prefer-most-allocated-numa-node: 'true'}\n"
        "memoryManagerPolicy: Static\n"
        "reservedSystemCPUs: '0,64'\n"
        "evictionHard: {memory.available: 100Mi}\n"
    )
    p = parse_kubelet_policies(text.encode())
    assert p.cpu_manager_policy == "static"
    assert dict(p.cpu_manager_options) == {"full-pcpus-only": "true"}
    assert p.topology_manager_policy == "single-numa-node"
    assert p.topology_manager_scope == "pod"
    assert dict(p.topology_manager_options) == {"prefer-most-allocated-numa-node": "true"}
    assert p.memory_manager_policy == "Static"


def test_absent_and_empty_fields_are_kubelets_defaults() -> None:
    p = parse_kubelet_policies((HEAD + "cpuManagerPolicy: ''\ntopologyManagerPolicyOptions: null\n").encode())
    assert (p.cpu_manager_policy, p.topology_manager_policy, p.topology_manager_scope) == (
        "none",
        "none",
        "container",
    )
    assert p.memory_manager_policy == "None" and not p.topology_manager_options


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"a: [1, 2\n", "not valid YAML"),
        (b"- 1\n", "want a KubeletConfiguration mapping"),
        (b"apiVersion: v1\nkind: ConfigMap\n", "want apiVersion kubelet.config.k8s.io/v1beta1"),
        ((HEAD + "cpuManagerPolicy: dynamic\n").encode(), "cpuManagerPolicy: 'dynamic'"),
        ((HEAD + "topologyManagerScope: node\n").encode(), "topologyManagerScope"),
        ((HEAD + "cpuManagerPolicyOptions: {full-pcpus-only: true}\n").encode(), "must be a string"),
        ((HEAD + "cpuManagerPolicyOptions: [a]\n").encode(), "must map option names"),
        ((HEAD + "cpuManagerPolicy: 3\n").encode(), "must be a string, got int"),
        (b"a: " + b"x" * (1 << 20), "larger than"),
    ],
)
def test_bad_bytes_are_clear_errors(data: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_kubelet_policies(data, "config.yaml")


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=f"cannot read kubelet config {tmp_path}/missing.yaml"):
        load_kubelet_policies(tmp_path / "missing.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(HEAD + "topologyManagerPolicy: restricted\n")
    assert load_kubelet_policies(path).topology_manager_policy == "restricted"


@pytest.mark.parametrize(
    "config",
    [
        SIM_DEFAULTS,
        KubeletConfig(
            cpu_manager_policy="static",
            cpu_manager_policy_options={"full-pcpus-only": "true"},
            topology_manager_policy="best-effort",
            topology_manager_scope="pod",
            topology_manager_policy_options={"prefer-closest-numa-nodes": "true"},
            reserved_system_cpus=frozenset({0, 1}),
        ),
    ],
)
def test_the_simulators_file_reads_back_as_its_config(config: KubeletConfig) -> None:
    p = parse_kubelet_policies(yaml.safe_dump(kubelet_config_document(config)).encode())
    assert (p.cpu_manager_policy, p.topology_manager_policy, p.topology_manager_scope) == (
        config.cpu_manager_policy,
        config.topology_manager_policy,
        config.topology_manager_scope,
    )
    assert dict(p.cpu_manager_options) == dict(config.cpu_manager_policy_options)
    assert dict(p.topology_manager_options) == dict(config.topology_manager_policy_options)
