"""Machine files: the samples load, bad files get clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hamid.model.errors import InvalidInput
from hamid.plugin.discovery import parse_devices_text
from hamidsim.machine import SAMPLES, load_machine_file, parse_machine_text, sample_machine_path

GOOD = """
numaNodes:
  - {id: 0, cpus: "0-3"}
  - {id: 1, cpus: [4, 5, 6, 7]}
reservedCpus: "0"
devices:
  - {uuid: GPU-a, index: 0, name: T4, memoryMiB: 15360, numa: 1, pciBusId: "0000:3b:00.0"}
  - {uuid: GPU-b, index: 1, name: T4, memoryMiB: 15360, numa: -1, pciBusId: "0000:5e:00.0"}
"""


def test_samples_load_and_serve_as_plugin_devices_file() -> None:
    for name in SAMPLES:
        path = sample_machine_path(name)
        machine = load_machine_file(path)
        assert machine.gpus
        assert machine.reserved_cpus
        # The same file is a valid `hamid plugin --devices-file`.
        assert [g.uuid for g in parse_devices_text(path.read_text())] == [g.uuid for g in machine.gpus]
    big = load_machine_file(sample_machine_path("2numa-8gpu"))
    assert big.numa_ids == [0, 1]
    assert len(big.all_cpus) == 64
    assert sorted(g.numa for g in big.gpus) == [0] * 4 + [1] * 4


def test_good_file() -> None:
    machine = parse_machine_text(GOOD)
    assert machine.cpu_topology.numa_cpus == {0: frozenset(range(4)), 1: frozenset(range(4, 8))}
    assert machine.gpus[1].numa is None
    assert machine.devices_document()["devices"][1]["numa"] == -1
    assert "NUMA 1: CPUs 4-7; GPUs GPU-a" in machine.describe()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "expected a mapping"),
        ("numaNodes: []", "non-empty list"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\nextra: 1", "unknown keys \\['extra'\\]"),
        ("numaNodes: [{id: 0, cpus: '0-3'}, {id: 0, cpus: '4'}]", "duplicate NUMA node id 0"),
        ("numaNodes: [{id: 0, cpus: '0-3'}, {id: 1, cpus: '3-4'}]", "CPU 3 is already on NUMA node 0"),
        ("numaNodes: [{id: 0}]", "missing 'cpus'"),
        ("numaNodes: [{id: -1, cpus: '0'}]", "id must be an integer"),
        ("numaNodes: [{id: 0, cpus: 'x'}]", "not a CPU id or range"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\nreservedCpus: '9'", "reservedCpus 9 are on no NUMA node"),
        ("numaNodes: [{id: 0, cpus: '0-1'}]\nreservedCpus: '0-1'", "cover every CPU"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\nmemory: lots", "not a Kubernetes quantity"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\npods: 0", "pods must be a positive integer"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\ndevices: [{uuid: x}]", "missing keys"),
        (
            "numaNodes: [{id: 0, cpus: '0-3'}]\n"
            "devices: [{uuid: G, index: 0, name: T4, memoryMiB: 1, numa: 3, pciBusId: ''}]",
            "GPU G is on NUMA node 3",
        ),
        ("numaNodes: [", "not valid YAML"),
    ],
)
def test_bad_files(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_machine_text(text, "m.yaml")


def test_missing_file_and_unknown_sample(tmp_path) -> None:
    with pytest.raises(InvalidInput, match="cannot read machine file"):
        load_machine_file(tmp_path / "nope.yaml")
    with pytest.raises(InvalidInput, match="unknown sample machine"):
        sample_machine_path("nope")


def test_lscpu_machine_distances_and_links_pass_through() -> None:
    text = """
lscpu: |
  # CPU,Core,Socket,Node
  0,0,0,0
  1,1,1,1
  2,0,0,0
  3,1,1,1
distances: [[10, 21], [21, 10]]
reservedCpus: "0,2"
links: {G0: {G1: {level: SYSTEM, nvlinks: 0}}}
devices:
  - {uuid: G0, index: 0, name: T4, memoryMiB: 15360, numa: 0, pciBusId: "0000:3b:00.0"}
  - {uuid: G1, index: 1, name: T4, memoryMiB: 15360, numa: 1, pciBusId: "0000:af:00.0"}
"""
    machine = parse_machine_text(text)
    assert machine.cpu_topology.cpus_per_core() == 2
    assert machine.numa_ids == [0, 1] and machine.distance(0, 1) == 21
    # Passed through unchanged (the plugin's devices-file parser checks the matrix itself).
    assert machine.devices_document()["links"] == {"G0": {"G1": {"level": "SYSTEM", "nvlinks": 0}}}
    assert "links" not in parse_machine_text(GOOD).devices_document()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lscpu: '0,0,0,0'\nnumaNodes: [{id: 0, cpus: '0'}]", "either 'numaNodes' or 'lscpu'"),
        ("lscpu: [1]", "as a block"),
        ("lscpu: |\n  0,0,0,0\n  1,0,0,1\n", "threads .* of one core are on NUMA nodes"),
        ("numaNodes: [{id: 0, cpus: '0-3'}]\ndistances: [[10, 20]]", "1x1 matrix"),
        ("numaNodes: [{id: 0, cpus: '0'}, {id: 1, cpus: '1'}]\ndistances: [[10, 21], [20, 10]]", "symmetric"),
        ("numaNodes: [{id: 0, cpus: '0'}, {id: 1, cpus: '1'}]\ndistances: [[11, 21], [21, 10]]", "to itself"),
    ],
)
def test_bad_topology(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_machine_text(text, "m.yaml")


def test_documented_example_is_a_valid_machine_file() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "simulator.md").read_text(encoding="utf-8")
    start = doc.index("```yaml\nlscpu: |") + len("```yaml\n")
    machine = parse_machine_text(doc[start : doc.index("```", start)], "docs/simulator.md")
    assert machine.cpu_topology.describe() == "2 sockets, 2 NUMA nodes, 4 cores, 8 CPUs"


def test_smt_samples() -> None:
    smt = load_machine_file(sample_machine_path("smt-2socket-8gpu"))
    assert len(smt.all_cpus) == 128 and smt.cpu_topology.cpus_per_core() == 2
    assert smt.cpu_topology.core_cpus[0] == frozenset({0, 64})
    rtx = load_machine_file(sample_machine_path("rtx-pro-6000-8gpu"))
    assert {g.name for g in rtx.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    many = load_machine_file(sample_machine_path("16numa-8gpu"))
    assert len(many.numa_ids) == 16 and len(many.cpu_topology.sockets) == 4
