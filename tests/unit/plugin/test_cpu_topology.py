"""The plugin's sysfs reader: trees written in tmp_path, Linux's layout, and the simulator's trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.numa import KubeletPolicies, encode_profile
from hamid.plugin.cpu_topology import parse_sysfs_cpu_list, read_cpu_topology
from hamid.plugin.numa_publisher import build_profile
from hamidsim.machine import SAMPLES, load_machine_file, parse_machine_text, sample_machine_path
from hamidsim.sysfs import write_sysfs_tree


def write_tree(
    root: Path,
    nodes: dict[int, str],
    cpus: dict[int, tuple[int, int]],
    *,
    distances: dict[int, str] | None = None,
    online: str | None = None,
) -> Path:
    """A Linux-style tree: node cpulists, per-CPU (core_id, physical_package_id)."""
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(cpulist + "\n")
        if distances is not None:
            (d / "distance").write_text(distances[node] + "\n")
    (root / "devices/system/node/possible").write_text("0-1\n")  # not a node directory
    for cpu, (core, socket) in cpus.items():
        d = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True, exist_ok=True)
        (d / "core_id").write_text(f"{core}\n")
        (d / "physical_package_id").write_text(f"{socket}\n")
    if online is not None:
        (root / "devices/system/cpu/online").write_text(online + "\n")
    return root


def smt_tree(root: Path, **kw: object) -> Path:
    # 2 sockets x 2 cores x 2 threads; siblings i and i+4; core_id numbered per socket (0, 1)
    cpus = {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1), 4: (0, 0), 5: (1, 0), 6: (0, 1), 7: (1, 1)}
    return write_tree(root, {0: "0-1,4-5", 1: "2-3,6-7"}, cpus, **kw)  # type: ignore[arg-type]


def test_smt_cores_are_the_lowest_sibling_and_distances_are_read(tmp_path: Path) -> None:
    topo = read_cpu_topology(smt_tree(tmp_path, distances={0: "10 21", 1: "21 10"}))
    assert topo.numa_nodes == (0, 1)
    assert [(c.cpu, c.core, c.socket, c.numa) for c in topo.cpus] == [
        (0, 0, 0, 0),
        (1, 1, 0, 0),
        (2, 2, 1, 1),
        (3, 3, 1, 1),
        (4, 0, 0, 0),
        (5, 1, 0, 0),
        (6, 2, 1, 1),
        (7, 3, 1, 1),
    ]
    assert topo.distances == ((10, 21), (21, 10))


def test_offline_cpus_are_left_out_and_missing_distances_are_none(tmp_path: Path) -> None:
    topo = read_cpu_topology(smt_tree(tmp_path, online="0-5"))
    assert [c.cpu for c in topo.cpus] == [0, 1, 2, 3, 4, 5]
    assert topo.distances is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: (r / "devices/system/cpu/cpu3/topology/core_id").unlink(), "cpu3/topology/core_id"),
        (lambda r: (r / "devices/system/cpu/cpu2/topology/core_id").write_text("two\n"), "not an integer"),
        (lambda r: (r / "devices/system/node/node1/cpulist").write_text("2-x\n"), "node1/cpulist"),
        (lambda r: (r / "devices/system/node/node1/cpulist").write_text("1-3\n"), "NUMA nodes 0 and 1"),
        (lambda r: (r / "devices/system/node/node0/cpulist").write_bytes(b"\xff\n"), "not ASCII"),
        (lambda r: (r / "devices/system/node/node0/distance").write_text("10\n"), "want 2 distances"),
    ],
)
def test_malformed_trees_name_the_file(tmp_path: Path, damage: object, message: str) -> None:
    root = smt_tree(tmp_path, distances={0: "10 21", 1: "21 10"})
    damage(root)  # type: ignore[operator]
    with pytest.raises(InvalidInput, match=message):
        read_cpu_topology(root)


def add_l3(root: Path, caches: dict[int, str]) -> Path:
    """``cpu*/cache/index3`` for the CPUs of each cache id (its ``shared_cpu_list`` as given)."""
    for cache, cpulist in caches.items():
        for cpu in parse_sysfs_cpu_list(cpulist, "test"):
            d = root / "devices/system/cpu" / f"cpu{cpu}" / "cache/index3"
            d.mkdir(parents=True, exist_ok=True)
            (d / "id").write_text(f"{cache}\n")
            (d / "shared_cpu_list").write_text(cpulist + "\n")
    return root


def test_uncore_caches_are_the_l3_ids_else_the_socket(tmp_path: Path) -> None:
    """kubelet's ``UncoreCacheID``: the L3 cache's id (``cache/index3``), the socket id without one."""
    plain = read_cpu_topology(smt_tree(tmp_path / "plain"))
    assert [c.uncore for c in plain.cpus] == [c.socket for c in plain.cpus]
    split = read_cpu_topology(add_l3(smt_tree(tmp_path / "l3"), {7: "0,4", 8: "1,5", 9: "2-3,6-7"}))
    assert [c.uncore for c in split.cpus] == [7, 8, 9, 9, 7, 8, 9, 9]


def test_unreadable_uncore_caches_are_left_out_with_the_reason(tmp_path: Path) -> None:
    """An L3 whose ids and ``shared_cpu_list`` disagree, or without an ``id``: the topology is still
    read (only ``prefer-align-cpus-by-uncorecache`` needs the caches), without uncore caches, and
    says why; a profile for that option then lacks them and the predictor answers unknown."""
    root = add_l3(smt_tree(tmp_path), {7: "0-1,4-5", 9: "2-3,6-7"})
    (root / "devices/system/cpu/cpu5/cache/index3/id").write_text("9\n")
    topo = read_cpu_topology(root)
    assert {c.uncore for c in topo.cpus} == {None} and "shared_cpu_list" in (topo.uncore_error or "")
    (root / "devices/system/cpu/cpu5/cache/index3/id").unlink()
    assert "cpu5/cache/index3/id" in (read_cpu_topology(root).uncore_error or "")
    aligned = KubeletPolicies("static", {"prefer-align-cpus-by-uncorecache": "true"})
    assert build_profile(topo, aligned, frozenset(range(1, 8))).cpus[0].uncore is None


def test_no_sysfs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot list"):
        read_cpu_topology(tmp_path / "nothing")


def test_cpu_list_syntax() -> None:
    assert parse_sysfs_cpu_list("0-2,8\n", "x") == {0, 1, 2, 8}
    assert parse_sysfs_cpu_list("\n", "x") == frozenset()
    for bad in ("3-1", "a", "0-70000", "1,,2"):
        with pytest.raises(InvalidInput):
            parse_sysfs_cpu_list(bad, "x")


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_the_simulators_tree_reads_back_as_its_machine(tmp_path: Path, sample: str) -> None:
    machine = load_machine_file(sample_machine_path(sample))
    topo = read_cpu_topology(write_sysfs_tree(machine, tmp_path))
    assert {c.cpu: (c.core, c.socket, c.numa, c.uncore) for c in topo.cpus} == {
        cpu: (i.core, i.socket, i.numa, i.uncore_id) for cpu, i in machine.cpu_topology.details.items()
    }
    ids = machine.numa_ids
    assert topo.distances == tuple(tuple(machine.distance(a, b) for b in ids) for a in ids)


def test_the_profile_carries_uncore_caches_only_where_kubelet_reads_them(tmp_path: Path) -> None:
    """With ``prefer-align-cpus-by-uncorecache`` the profile carries the uncore caches (format 3);
    without it they are left out, so the profile stays readable by older schedulers."""
    topo = read_cpu_topology(add_l3(smt_tree(tmp_path), {7: "0-1,4-5", 9: "2-3,6-7"}))
    plain = build_profile(topo, KubeletPolicies("static"), frozenset(range(1, 8)))
    assert {c.uncore for c in plain.cpus} == {None}
    aligned = KubeletPolicies("static", {"prefer-align-cpus-by-uncorecache": "true"})
    profile = build_profile(topo, aligned, frozenset(range(1, 8)))
    assert [c.uncore for c in profile.cpus] == [7, 7, 9, 9, 7, 7, 9, 9]
    assert json.loads(encode_profile(profile))["v"] == 3


def test_the_simulators_tree_carries_the_machines_uncore_caches(tmp_path: Path) -> None:
    """A machine file's ``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`` L3 ids become ``cache/index3``,
    which the plugin reads back as kubelet's uncore caches."""
    rows = [f"{c},{c % 4},0,{c % 4 // 2},{c % 4}:{c % 4}:{c % 4}:{c % 4 // 2}" for c in range(8)]
    text = "lscpu: |\n  # CPU,Core,Socket,Node,Cache\n" + "".join(f"  {r}\n" for r in rows)
    machine = parse_machine_text(text + 'reservedCpus: "0"\n')
    topo = read_cpu_topology(write_sysfs_tree(machine, tmp_path))
    assert {c.cpu: c.uncore for c in topo.cpus} == {c: c % 4 // 2 for c in range(8)}
