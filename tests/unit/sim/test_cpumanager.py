"""The static CPU manager on SMT and non-SMT machines: kubelet's own tables restated
(``cpu_assignment_test.go``, ``policy_static_test.go``), policy options, and a differential property
test against a small independent model of ``takeByTopologyNUMAPacked``."""

from __future__ import annotations

from collections.abc import Callable

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
from tests.kubelet_cpu_tables import DISTRIBUTED_CASES, UNCORE_CASES, Row


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

    def take_whole(
        groups: dict[int, frozenset[int]], size: int, key: Callable[[int], tuple[int, ...]]
    ) -> None:
        for gid in sorted((g for g in groups if groups[g] & free), key=key):
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


# kubelet's ``topology_hints_test.go`` machine (``returnMachineInfo``): 2 sockets = 2 NUMA nodes,
# 3 cores x 2 threads each, siblings i and i+6 (NUMA 0: 0-2,6-8; NUMA 1: 3-5,9-11).
HINTS_MACHINE = CpuTopology({c: CpuInfo(c % 6, (c % 6) // 3, (c % 6) // 3) for c in range(12)})


def _hints_pod(cpus: str) -> dict:
    limits = {"cpu": cpus, "memory": "1G"}
    container = {"name": "fakeContainer", "resources": {"limits": limits, "requests": limits}}
    return {"metadata": {"uid": "fakePod"}, "spec": {"containers": [container]}}


@pytest.mark.parametrize(
    ("name", "wanted", "held", "expected"),
    [
        (
            "Regenerate Single-Node NUMA Hints if already allocated 1/2",
            "2",
            "0,6",
            [({0}, True), ({0, 1}, False)],
        ),
        (
            "Regenerate Single-Node NUMA Hints if already allocated 1/2",
            "2",
            "3,9",
            [({1}, True), ({0, 1}, False)],
        ),
        ("Regenerate Cross-NUMA Hints if already allocated", "11", "0-10", [({0, 1}, True)]),
        ("Requested less than already allocated", "2", "0,3,6,9", []),
        ("Requested more than already allocated", "11", "0,3,6,9", []),
    ],
)
def test_pod_hints_of_a_container_already_holding_cpus(
    name: str, wanted: str, held: str, expected: list[tuple[set[int], bool]]
) -> None:
    """``TestGetPodTopologyHints`` over ``returnTestCases`` (``cpumanager/topology_hints_test.go``):
    a container holding a number of exclusive CPUs other than it requests gets no hints at all (an
    empty list, which the Topology Manager reads as "cannot satisfy"), never hints built from the
    held CPUs pooled as reusable; held CPUs matching the request regenerate their own hints.
    ``GetPodTopologyHints`` in ``policy_static.go`` makes the same check per container."""
    manager = CpuManager(HINTS_MACHINE, "static", frozenset(), StaticPolicyOptions())
    manager.assignments["fakePod"] = {"fakeContainer": cpus(held)}
    manager.assignments["others"] = {"c": HINTS_MACHINE.cpus - cpus(held)}  # defaultCPUSet: empty
    got = manager.pod_hints(_hints_pod(wanted), "fakePod")
    assert got == [TopologyHint(frozenset(m), p) for m, p in expected], name


def test_pod_hints_without_held_cpus_follow_the_free_cpus() -> None:
    """``returnTestCases`` "Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1"
    (defaultCPUSet 2-11) through ``GetPodTopologyHints``: only the cross-NUMA mask, preferred."""
    manager = CpuManager(HINTS_MACHINE, "static", frozenset(), StaticPolicyOptions())
    manager.assignments["others"] = {"c": cpus("0,1")}
    assert manager.pod_hints(_hints_pod("7"), "fakePod") == [TopologyHint(frozenset({0, 1}), True)]
    assert manager.pod_hints(_hints_pod("11"), "fakePod") == []  # more than available: no hint


@pytest.mark.parametrize(("name", "machine", "available", "count", "group", "expected"), DISTRIBUTED_CASES)
def test_take_by_topology_numa_distributed(
    name: str, machine: list[Row], available: str, count: int, group: int, expected: str
) -> None:
    got = take_by_topology_distributed(_topology(machine), cpus(available), count, group)
    assert got == cpus(expected), name


def test_distributed_minimum_numa_count_comes_from_the_whole_machine() -> None:
    """``rangeNUMANodesNeededToSatisfy`` (``cpu_assignment.go``) sizes the minimum number of NUMA
    nodes from the CPU groups per NUMA node of the whole machine (``topo.CPUDetails``), not of the
    free CPUs. 2 NUMA nodes of 8 CPUs, 1 free on NUMA 0 and 8 on NUMA 1, 6 wanted: one NUMA node of
    the machine holds 6, so kubelet tries NUMA 1 alone and takes all 6 there. Dividing the 9 free
    CPUs instead (5 per node) makes the minimum 2, no pair balances, and packing then starts on
    NUMA 0 (fewest free CPUs first)."""
    got = take_by_topology_distributed(NON_HT, cpus("0,8-15"), 6)
    assert got <= NON_HT.numa_cpus[1] and len(got) == 6


def test_strict_cpu_reservation_keeps_reserved_cpus_out_of_the_shared_pool() -> None:
    """``strict-cpu-reservation``: ``validateState`` (``policy_static.go``) initialises the default
    cpuset without the reserved CPUs (``TestStaticPolicyStart``, topoDualSocketHT with 2 reserved
    CPUs 0 and 6: the shared pool is 1-5,7-11); exclusive CPUs come from the same available set as
    without the option (the e2e "reservedSystemCPUs are excluded for both Gu and non-Gu pods")."""
    reserved = cpus("0,6")
    strict = CpuManager(
        DUAL_SOCKET_HT, "static", reserved, parse_cpu_options({"strict-cpu-reservation": "true"})
    )
    plain = CpuManager(DUAL_SOCKET_HT, "static", reserved, StaticPolicyOptions())
    assert strict.default_set() == cpus("1-5,7-11")
    assert plain.default_set() == cpus("0-11")
    assert strict.available() == plain.available() == cpus("1-5,7-11")
    assert strict.allocate("p", "c", 4, None, frozenset()) == plain.allocate("p", "c", 4, None, frozenset())


DUAL_SOCKET_NO_HT = CpuTopology.from_numa({0: range(0, 4), 1: range(4, 8)})

SPREAD_TABLE = [
    # ``TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption`` (``cpu_assignment_test.go``),
    # ``distribute-cpus-across-cores``: (name, topology, available, count, expected)
    ("take a socket of cpus from single socket with HT, 3 cpus", SINGLE_SOCKET_HT, "0-7", 3, "0-2"),
    ("take a socket of cpus from dual socket with HT, 2 cpus", DUAL_SOCKET_HT, "0-11", 2, "0,2"),
    ("take a socket of cpus from dual socket with HT, 3 cpus", DUAL_SOCKET_HT, "0-11", 3, "0,2,4"),
    ("take a socket of cpus from dual socket with HT, 6 cpus", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("take cpus from dual socket with HT, 8 cpus", DUAL_SOCKET_HT, "0-11", 8, "0,2,4,6,8,10,1,3"),
    ("take a socket of cpus from dual socket without HT, 2 cpus", DUAL_SOCKET_NO_HT, "0-7", 2, "0,1"),
    ("dual socket with multi numa per socket and HT, 8 cpus", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 8, "0-7"),
]


@pytest.mark.parametrize(("name", "topology", "available", "count", "expected"), SPREAD_TABLE)
def test_take_by_topology_spread_across_cores(
    name: str, topology: CpuTopology, available: str, count: int, expected: str
) -> None:
    """Sorting strategy spread (``takeByTopologyNUMAPacked`` in ``cpu_assignment.go``): whole NUMA
    nodes and sockets as before, no whole cores, then threads socket by socket in CPU id order."""
    assert take_by_topology(topology, cpus(available), count, spread=True) == cpus(expected), name


def test_distribute_cpus_across_cores_options() -> None:
    """``NewStaticPolicyOptions`` (``policy_options.go``) refuses it with ``full-pcpus-only`` and with
    ``distribute-cpus-across-numa``; the static policy then spreads its picks (and its pick of
    reserved CPUs) over the cores."""
    with pytest.raises(
        InvalidInput, match="full-pcpus-only and distribute-cpus-across-cores can not be used"
    ):
        parse_cpu_options({"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"})
    with pytest.raises(InvalidInput, match="distribute-cpus-across-numa and distribute-cpus-across-cores"):
        parse_cpu_options({"distribute-cpus-across-numa": "true", "distribute-cpus-across-cores": "true"})
    options = parse_cpu_options({"distribute-cpus-across-cores": "true"})
    manager = CpuManager(SINGLE_SOCKET_HT, "static", frozenset(), options)
    assert manager.allocate("p", "c", 2, None, frozenset()) == cpus("0,1")  # packed: 0,4 (one core)


def _topology(machine: list[Row]) -> CpuTopology:
    """The simulator's topology of a restated kubelet machine."""
    return CpuTopology({c: CpuInfo(core, s, n, u) for c, core, s, n, u in machine})


@pytest.mark.parametrize(("name", "machine", "available", "count", "expected"), UNCORE_CASES)
def test_take_by_topology_aligned_by_uncore_cache(
    name: str, machine: list[Row], available: str, count: int, expected: str
) -> None:
    """``prefer-align-cpus-by-uncorecache``: after whole NUMA nodes and sockets, whole free uncore
    caches while the request needs one, then the first cache (NUMA nodes and caches by fewest free
    CPUs) whose lowest free cores hold exactly the rest (``takeUncoreCache`` /
    ``takePartialUncore``), else whole cores and threads as before. In ``topoDualSocketHT`` every
    CPU shares cache 0, so the one CPU comes from the lowest core with a free CPU (packed: CPU 2)."""
    assert take_by_topology(_topology(machine), cpus(available), count, uncore=True) == cpus(expected), name


def test_uncore_cache_option_conflicts_and_lscpu_cache_column() -> None:
    """``NewStaticPolicyOptions`` refuses ``prefer-align-cpus-by-uncorecache`` with either distribute
    option; ``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`` gives each CPU its L3 (last) cache id."""
    for other in ("distribute-cpus-across-cores", "distribute-cpus-across-numa"):
        with pytest.raises(InvalidInput, match="can not be used at the same time"):
            parse_cpu_options({"prefer-align-cpus-by-uncorecache": "true", other: "true"})
    text = (
        "# CPU,Core,Socket,Node,Cache\n0,0,0,0,0:0:0:0\n1,1,0,0,1:1:1:0\n2,2,0,0,2:2:2:1\n3,3,0,0,3:3:3:1\n"
    )
    assert parse_lscpu(text).uncore_cpus == {0: frozenset({0, 1}), 1: frozenset({2, 3})}
    assert parse_lscpu("0,0,0,0\n1,1,1,0\n").uncore_cpus == {0: frozenset({0}), 1: frozenset({1})}  # socket
