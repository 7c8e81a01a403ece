"""The static CPU manager on SMT and non-SMT machines: kubelet's own tables restated
(``cpu_assignment_test.go``, ``policy_static_test.go``), policy options, and a differential property
test against a small independent model of ``takeByTopologyNUMAPacked``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.cadvisor import CpuInfo, CpuTopology, parse_cpu_list, parse_lscpu
from hamidsim.kubelet.cpu_assignment import (
    CpuAllocationError,
    take_by_topology,
    take_by_topology_distributed,
)
from hamidsim.kubelet.cpumanager import (
    CpuManager,
    SMTAlignmentError,
    StaticPolicyOptions,
    generate_cpu_hints,
    parse_cpu_options,
    pod_guaranteed_cpus,
    validate_cpu_options,
)
from hamidsim.kubelet.topologymanager import TopologyHint


def topo(sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int) -> CpuTopology:
    """Linux's enumeration: thread t of core c is CPU t*cores + c; core ids are the first thread."""
    cores = sockets * numa_per_socket * cores_per_numa
    details = {}
    for t in range(threads):
        for core in range(cores):
            numa = core // cores_per_numa
            details[t * cores + core] = CpuInfo(core, numa // numa_per_socket, numa)
    return CpuTopology(details)


def cpus(text: str) -> frozenset[int]:
    return parse_cpu_list(text)


# kubelet's fixtures: topoSingleSocketHT (1 socket, 4 cores x 2), topoDualSocketHT (siblings
# i and i+6, sockets alternate), topoDualSocketMultiNumaPerSocketHT (2 sockets x 2 NUMA x 10 cores x 2).
SINGLE_SOCKET_HT = CpuTopology({c: CpuInfo(c % 4, 0, 0) for c in range(8)})
DUAL_SOCKET_HT = CpuTopology({c: CpuInfo(c % 6, c % 2, c % 2) for c in range(12)})
DUAL_SOCKET_MULTI_NUMA_HT = topo(2, 2, 10, 2)
NON_HT = CpuTopology.from_numa({0: range(0, 8), 1: range(8, 16)})

PACKED_TABLE = [
    # (name, topology, available, count, expected)
    ("take zero cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 0, ""),
    ("take one cpu from single socket with HT", SINGLE_SOCKET_HT, "0-7", 1, "0"),
    ("take one cpu, some cpus taken", SINGLE_SOCKET_HT, "1,3,5-7", 1, "6"),
    ("take two cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 2, "0,4"),
    ("take all cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 8, "0-7"),
    ("take two cpus, only one core totally free", SINGLE_SOCKET_HT, "0-3,6", 2, "2,6"),
    ("take a socket of cpus from dual socket with HT", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("ExpectAllocThreeCores (policy_static_test)", DUAL_SOCKET_HT, "2-4,6-11", 6, "2-4,8-10"),
    ("ExpectAllocOneSocket (policy_static_test)", DUAL_SOCKET_HT, "1-11", 6, "1,3,5,7,9,11"),
    ("ExpectAllocOneCore (policy_static_test)", SINGLE_SOCKET_HT, "1-7", 2, "1,5"),
    ("take a socket from multi-numa-per-socket with HT", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 40, "0-19,40-59"),
    (
        "take a NUMA node from multi-numa-per-socket with HT",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        20,
        "0-9,40-49",
    ),
    (
        "take a NUMA node, 1 NUMA node already taken",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "10-39,50-79",
        20,
        "10-19,50-59",
    ),
    ("take a socket and a NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 60, "0-29,40-69"),
    (
        "take a socket and a NUMA node, a core taken",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "1-39,41-79",
        60,
        "10-39,50-79",
    ),
    ("non-SMT: fullest NUMA node first", NON_HT, "2-15", 2, "2,3"),
    ("non-SMT: a whole free NUMA node", NON_HT, "2-15", 8, "8-15"),
]


@pytest.mark.parametrize(("name", "topology", "available", "count", "expected"), PACKED_TABLE)
def test_take_by_topology_numa_packed(
    name: str, topology: CpuTopology, available: str, count: int, expected: str
) -> None:
    assert take_by_topology(topology, cpus(available), count) == cpus(expected), name


def test_take_more_than_available() -> None:
    with pytest.raises(CpuAllocationError, match="requested=5, available=4"):
        take_by_topology(SINGLE_SOCKET_HT, cpus("0,2,4,6"), 5)


def test_issue_example_on_numa_hint_none_gives_four_cpus_on_numa0() -> None:
    # 2 sockets x 3 cores x 2 threads; CPU 0 reserved, 1 and 5 held: 6 CPUs, no NUMA hint.
    manager = CpuManager(DUAL_SOCKET_HT, "static", frozenset({0}), StaticPolicyOptions())
    manager.assignments["other"] = {"c": frozenset({1, 5})}
    got = manager.allocate("pod", "c", 6, None, frozenset())
    assert got == frozenset({2, 3, 4, 8, 9, 10})
    assert len(got & DUAL_SOCKET_HT.numa_cpus[0]) == 4


def test_distributed_spreads_evenly_over_numa_nodes() -> None:
    # distribute-cpus-across-numa: when one NUMA node (20 CPUs) cannot hold 24, spread 12 + 12
    # in whole cores (packed would give 20 + 4); when one node can, it stays on the fewest nodes.
    topology = topo(1, 2, 10, 2)
    got = take_by_topology_distributed(topology, topology.cpus, 24, group=2)
    assert len(got & topology.numa_cpus[0]) == 12 and len(got & topology.numa_cpus[1]) == 12
    assert all(topology.core_cpus[topology.details[c].core] <= got for c in got)
    packed = take_by_topology(topology, topology.cpus, 24)
    assert sorted(len(packed & topology.numa_cpus[n]) for n in (0, 1)) == [4, 20]
    assert len(take_by_topology_distributed(topology, topology.cpus, 4, group=2) & topology.numa_cpus[0]) == 4
    # A group size that does not divide the request falls back to packing.
    assert take_by_topology_distributed(topology, topology.cpus, 3, group=2) == take_by_topology(
        topology, topology.cpus, 3
    )


def test_full_pcpus_only_smt_alignment_errors() -> None:
    options = parse_cpu_options({"full-pcpus-only": "true"})
    manager = CpuManager(SINGLE_SOCKET_HT, "static", frozenset({0}), options)
    with pytest.raises(SMTAlignmentError, match=r"requested 3 cpus not multiple cpus per core = 2"):
        manager.allocate("p", "c", 3, None, frozenset())
    # Reserved CPU 0's sibling 4 is not physically available: 6 CPUs = 3 whole cores are.
    assert len(manager.allocate("p", "c", 6, None, frozenset())) == 6
    with pytest.raises(SMTAlignmentError, match=r"available physical CPUs = 0, requested CPUs = 2"):
        manager.allocate("q", "c", 2, None, frozenset())


def test_cpu_options_refusals() -> None:
    with pytest.raises(InvalidInput, match='unknown CPU Manager Policy option: "nope"'):
        parse_cpu_options({"nope": "true"})
    with pytest.raises(InvalidInput, match="bad value for option"):
        parse_cpu_options({"full-pcpus-only": "yes"})
    with pytest.raises(InvalidInput, match="not modelled"):
        parse_cpu_options({"strict-cpu-reservation": "true"})
    with pytest.raises(InvalidInput, match="incompatible with CPUManager align-by-socket"):
        validate_cpu_options(StaticPolicyOptions(align_by_socket=True), NON_HT, "single-numa-node")


def test_cpu_hints_on_smt_and_align_by_socket() -> None:
    topology = DUAL_SOCKET_MULTI_NUMA_HT  # 4 NUMA nodes, 2 per socket, 20 CPUs each
    n = frozenset
    hints = generate_cpu_hints(topology, topology.cpus, (), 30)
    assert TopologyHint(n({0, 1}), True) in hints and TopologyHint(n({1, 2}), True) in hints
    by_socket = generate_cpu_hints(topology, topology.cpus, (), 30, align_by_socket=True)
    # align-by-socket: masks spanning the minimum number of sockets stay preferred...
    assert TopologyHint(n({0, 1}), True) in by_socket
    assert TopologyHint(n({0, 1, 2}), False) in by_socket
    # ...and a two-node mask across sockets is still preferred (width 2 == minimum).
    assert TopologyHint(n({1, 2}), True) in by_socket


def test_pod_guaranteed_cpus_counts_sidecars() -> None:
    def c(name: str, cpu: str, **extra: str) -> dict:
        return {"name": name, "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}, **extra}

    pod = {
        "spec": {
            "initContainers": [c("side", "2", restartPolicy="Always"), c("init", "6")],
            "containers": [c("a", "3"), c("b", "1")],
        }
    }
    assert pod_guaranteed_cpus(pod) == 8  # max(2 + 6, 3 + 1 + 2)


def test_lscpu_parsing() -> None:
    text = "# CPU,Core,Socket,Node\n0,0,0,0\n1,1,0,0\n2,0,0,0\n3,1,0,0\n"
    parsed = parse_lscpu(text)
    assert parsed.core_cpus == {0: frozenset({0, 2}), 1: frozenset({1, 3})}
    assert parsed.cpus_per_core() == 2
    with pytest.raises(InvalidInput, match="columns"):
        parse_lscpu("# CPU,Socket,Core,Node\n0,0,0,0\n")
    with pytest.raises(InvalidInput, match="line 2"):
        parse_lscpu("0,0,0,0\n1,x,0,0\n")
    with pytest.raises(InvalidInput, match="listed twice"):
        parse_lscpu("0,0,0,0\n0,1,0,0\n")


# --- differential property test ----------------------------------------------------------------


def model_packed(  # noqa: C901 - one readable restatement of kubelet's ladder, kept whole on purpose
    topology: CpuTopology, available: frozenset[int], count: int
) -> frozenset[int]:
    """An independent restatement: one composite sort key per level instead of nested sorting."""
    details = topology.details
    free = set(available)
    numa_first = len(topology.sockets) >= len(topology.numa_nodes)

    def n_free(group: frozenset[int]) -> int:
        return len(group & free)

    def core_key(core: int) -> tuple[int, ...]:
        info = details[core]
        numa, sock = topology.numa_cpus[info.numa], topology.socket_cpus[info.socket]
        outer = (n_free(numa), info.numa, n_free(sock), info.socket)
        if not numa_first:
            outer = (n_free(sock), info.socket, n_free(numa), info.numa)
        return (*outer, n_free(topology.core_cpus[core]), core)

    taken: set[int] = set()

    def take_whole(groups: dict[int, frozenset[int]], size: int, key: object) -> None:
        for gid in sorted((g for g in groups if groups[g] & free), key=key):  # type: ignore[arg-type]
            group = groups[gid]
            if len(group & free) == size and count - len(taken) >= len(group):
                taken.update(group)
                free.difference_update(group)

    numa_key = lambda g: (n_free(topology.numa_cpus[g]), g)  # noqa: E731
    socket_key = lambda g: (n_free(topology.socket_cpus[g]), g)  # noqa: E731
    levels = [
        (topology.numa_cpus, None, numa_key),
        (topology.socket_cpus, topology.cpus_per_socket(), socket_key),
    ]
    if not numa_first:
        levels.reverse()
    for groups, size, key in levels:
        if len(taken) < count:
            for gid in sorted((g for g in groups if groups[g] <= free), key=key):
                if (
                    groups[gid] <= free
                    and count - len(taken) >= len(groups[gid])
                    and (size is None or len(groups[gid] & free) == size)
                ):
                    taken.update(groups[gid])
                    free.difference_update(groups[gid])
    if len(taken) < count:
        take_whole(topology.core_cpus, topology.cpus_per_core(), core_key)
    if len(taken) < count:
        order = sorted({details[c].core for c in free}, key=core_key)
        for cpu in [c for core in order for c in sorted(topology.core_cpus[core] & free)]:
            if len(taken) == count:
                break
            taken.add(cpu)
    return frozenset(taken)


SHAPES = [(1, 1, 4, 2), (2, 1, 3, 2), (2, 2, 3, 2), (1, 2, 4, 1), (2, 1, 4, 1), (4, 1, 2, 2), (1, 4, 2, 2)]


@settings(max_examples=300, deadline=None)
@given(shape=st.sampled_from(SHAPES), data=st.data())
def test_packed_matches_independent_model(shape: tuple[int, int, int, int], data: st.DataObject) -> None:
    topology = topo(*shape)
    available = frozenset(data.draw(st.sets(st.sampled_from(sorted(topology.cpus)))))
    count = data.draw(st.integers(min_value=0, max_value=len(available)))
    got = take_by_topology(topology, available, count)
    assert got == model_packed(topology, available, count)
    assert got <= available and len(got) == count
    # With at least `count` CPUs in whole free cores and an SMT-sized request, no core is split.
    per_core = topology.cpus_per_core()
    whole = [c for c in topology.core_cpus.values() if c <= available]
    if count % per_core == 0 and len(whole) * per_core >= count:
        assert all(topology.core_cpus[topology.details[c].core] <= got for c in got)
