"""Machine files: the samples load, bad files get clear errors."""

from __future__ import annotations

import pytest

from hamid.model.errors import InvalidInput
from hamid.plugin.discovery import parse_devices_text
from hamid.sim.machine import SAMPLES, load_machine_file, parse_machine_text, sample_machine_path

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
