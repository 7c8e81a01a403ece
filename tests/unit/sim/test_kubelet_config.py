"""KubeletConfiguration files and the start-up refusals kubelet makes, with its own reasons; the
Topology Manager's policy options (max-allowable-numa-nodes, prefer-closest-numa-nodes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.config import SIM_DEFAULTS, load_kubelet_config, parse_kubelet_config
from hamidsim.kubelet.node import build_managers, build_memory_manager, reserved_cpus
from hamidsim.kubelet.topologymanager import (
    TopologyHint,
    check_manager,
    merge_hints,
    parse_policy_options,
)
from hamidsim.machine import load_machine_file, parse_machine_text, sample_machine_path

REPO = Path(__file__).resolve().parents[3]
HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
SMT = load_machine_file(sample_machine_path("smt-2socket-8gpu"))
MANY = load_machine_file(sample_machine_path("16numa-8gpu"))


def config(body: str):
    return parse_kubelet_config(yaml.safe_load(HEAD + body), "k.yaml")


def test_shipped_config_is_read_and_runs_on_the_smt_machine() -> None:
    cfg = load_kubelet_config(REPO / "config" / "kubelet" / "config.yaml")
    assert cfg.cpu_manager_policy == "static"
    assert cfg.topology_manager_policy == "single-numa-node"
    assert cfg.topology_manager_scope == "container"
    cpus, settings = build_managers(SMT, cfg)
    assert cpus.reserved == cfg.reserved_system_cpus
    assert settings.numa_ids == (0, 1)


def test_defaults_are_kubelets_and_sim_defaults_the_seeds() -> None:
    cfg = config("")
    assert (cfg.cpu_manager_policy, cfg.topology_manager_policy, cfg.memory_manager_policy) == (
        "none",
        "none",
        "None",
    )
    assert (SIM_DEFAULTS.cpu_manager_policy, SIM_DEFAULTS.topology_manager_policy) == (
        "static",
        "single-numa-node",
    )
    assert (
        config("cpuManagerPolicy: static").with_overrides(cpu_manager_policy="none").cpu_manager_policy
        == "none"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "topologyManagerPolicy: strict",
            'topologyManagerPolicy (--topology-manager-policy) "strict" must be',
        ),
        (
            "topologyManagerScope: node",
            'topologyManagerScope (--topology-manager-scope) "node" must be one of',
        ),
        ("reservedSystemCPUs: '0-x'", "unable to parse reserved-cpus list"),
        ("topologyManagerPolicyy: none", 'strict decoding error: unknown field "topologyManagerPolicyy"'),
        ("topologyManagerPolicyOptions: {max-allowable-numa-nodes: 16}", "quote numbers"),
        ("featureGates: {X: maybe}", "featureGates"),
        ("maxPods: 0", "maxPods"),
    ],
)
def test_file_refusals(body: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(body)


def test_header_and_ignored_fields() -> None:
    with pytest.raises(InvalidInput, match=r"want apiVersion kubelet\.config\.k8s\.io/v1beta1"):
        parse_kubelet_config({"kind": "KubeletConfiguration"}, "k.yaml")
    cfg = config("cgroupDriver: systemd\nevictionHard: {memory.available: 100Mi}\nmaxPods: 250\n")
    assert cfg.max_pods == 250


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("cpuManagerPolicy: static", "the static policy requires systemreserved.cpu + kubereserved.cpu"),
        ("cpuManagerPolicy: dynamic", 'unknown policy: "dynamic"'),
        ("cpuManagerPolicyOptions: {full-pcpus-only: 'true'}", "None policy: received unsupported options"),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: '0'\ncpuManagerPolicyOptions: {bogus: 'true'}",
            'unknown CPU Manager Policy option: "bogus"',
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: '0'\ntopologyManagerPolicy: single-numa-node\n"
            "cpuManagerPolicyOptions: {align-by-socket: 'true'}",
            "single-numa-node policy is incompatible with CPUManager align-by-socket",
        ),
        ("topologyManagerPolicyOptions: {bogus: 'x'}", 'unknown Topology Manager Policy option: "bogus"'),
        ("topologyManagerPolicyOptions: {max-allowable-numa-nodes: '4'}", "should not be less than 8"),
        ("topologyManagerPolicyOptions: {max-allowable-numa-nodes: 'x'}", "unable to convert policy option"),
        (
            "memoryManagerPolicy: Static",
            'the total amount "0" of type "memory" is not equal to the value "104857600"',
        ),
        ("memoryManagerPolicy: Dynamic", 'unknown policy: "Dynamic"'),
        ("reservedSystemCPUs: '999'", "reserved CPUs 999 are not CPUs of this machine"),
    ],
)
def test_start_refusals(body: str, message: str) -> None:
    machine = parse_machine_text("numaNodes: [{id: 0, cpus: '0-3'}, {id: 1, cpus: '4-7'}]")
    with pytest.raises(InvalidInput, match=message.replace("+", r"\+")):
        build_managers(machine, config(body))
        build_memory_manager(machine, config(body))


def test_more_than_8_numa_nodes_needs_max_allowable() -> None:
    with pytest.raises(InvalidInput, match="unsupported on machines with more than 8 NUMA Nodes"):
        build_managers(MANY, config("topologyManagerPolicy: single-numa-node"))
    build_managers(MANY, config("topologyManagerPolicy: none"))  # policy none checks nothing
    cfg = config(
        "topologyManagerPolicy: single-numa-node\n"
        "topologyManagerPolicyOptions: {max-allowable-numa-nodes: '16'}"
    )
    _, settings = build_managers(MANY, cfg)
    assert len(settings.numa_ids) == 16
    with pytest.raises(InvalidInput, match="more than 12 NUMA Nodes"):
        check_manager(
            list(range(16)), "restricted", options=parse_policy_options({"max-allowable-numa-nodes": "12"})
        )


def test_reserved_cpus_from_kube_reserved_count() -> None:
    machine = load_machine_file(sample_machine_path("smt-2socket-8gpu"))
    bare = parse_machine_text("lscpu: |\n  0,0,0,0\n  1,1,0,0\n  2,0,0,0\n  3,1,0,0\n")
    # kubeReserved.cpu 1 + systemReserved.cpu 1 → kubelet takes 2 CPUs by topology: one whole core.
    assert reserved_cpus(bare, config("kubeReserved: {cpu: '1'}\nsystemReserved: {cpu: 500m}")) == frozenset(
        {0, 2}
    )
    assert reserved_cpus(machine, config("reservedSystemCPUs: '1,65'")) == frozenset({1, 65})


N = frozenset


def distances_4(a: int, b: int) -> int:
    # Nodes 0 and 2 are close (11); every other pair is far (30).
    return 10 if a == b else (11 if {a, b} == {0, 2} else 30)


def test_prefer_closest_numa_nodes_picks_the_closest_pair() -> None:
    nodes = [0, 1, 2, 3]
    hints = [{"gpu": [TopologyHint(N({0, 1}), True), TopologyHint(N({0, 2}), True)]}]
    assert merge_hints("best-effort", nodes, hints)[0].affinity == N({0, 1})  # Narrowest: lowest mask
    assert merge_hints("best-effort", nodes, hints, distances_4)[0].affinity == N({0, 2})
    assert merge_hints("restricted", nodes, hints, distances_4)[0].affinity == N({0, 2})
    # Still narrower first: a single node beats any pair.
    single = [{"gpu": [TopologyHint(N({0, 2}), True), TopologyHint(N({3}), True)]}]
    assert merge_hints("best-effort", nodes, single, distances_4)[0].affinity == N({3})
    assert parse_policy_options({"prefer-closest-numa-nodes": "true"}).prefer_closest


def test_machine_distances_feed_prefer_closest() -> None:
    cfg = config(
        "topologyManagerPolicy: best-effort\n"
        "topologyManagerPolicyOptions: {max-allowable-numa-nodes: '16', prefer-closest-numa-nodes: 'true'}"
    )
    _, settings = build_managers(MANY, cfg)
    assert settings.distance is not None
    assert settings.distance(0, 1) == 12 and settings.distance(0, 4) == 32
