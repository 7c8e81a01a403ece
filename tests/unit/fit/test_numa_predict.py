"""The NUMA predictor against kubelet's own test tables (restated) and ledger properties."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamid.fit.numa_predict import (
    CANNOT,
    DONT_CARE,
    SMT_ALIGNMENT_ERROR,
    TOPOLOGY_AFFINITY_ERROR,
    UNEXPECTED_ADMISSION_ERROR,
    UNKNOWN_PROFILE_MISSING,
    UNKNOWN_PROFILE_STALE,
    UNKNOWN_UNMODELLED,
    CpuTopology,
    Hint,
    NumaLedger,
    NumaUsage,
    Outcome,
    Packing,
    PluginView,
    generate_hints,
    mask_of,
    merge_hints,
    predict,
    take_by_topology_distributed,
    take_by_topology_packed,
    usage_of_placement,
    usage_of_prediction,
)
from hamid.model.devices import ContainerDevice
from hamid.model.errors import InvalidInput
from hamid.model.numa import (
    NO_TOPOLOGY,
    ContainerPlacement,
    CpuInfo,
    KubeletPolicies,
    NumaProfile,
    PodPlacement,
    parse_cpu_list,
)
from tests.kubelet_cpu_tables import DISTRIBUTED_CASES, UNCORE_CASES, Row

GPU = "nvidia.com/gpu"
NOW = 1_000_000


def cpus(text: str) -> frozenset[int]:
    return parse_cpu_list(text, "test")


def profile_of(
    layout: Iterable[tuple[int, int, int, int]],
    *,
    reserved: Iterable[int] = (0,),
    numa_nodes: Iterable[int] | None = None,
    distances: tuple[tuple[int, ...], ...] | None = None,
    **policies: Any,
) -> NumaProfile:
    """A profile from ``(cpu, core, socket, numa)`` rows; kubelet's core id = lowest sibling."""
    rows = sorted(layout)
    first: dict[int, int] = {}
    for cpu, core, _s, _n in rows:
        first.setdefault(core, cpu)
    infos = tuple(CpuInfo(cpu, first[core], socket, numa) for cpu, core, socket, numa in rows)
    defaults: dict[str, Any] = {
        "cpu_manager_policy": "static",
        "topology_manager_policy": "single-numa-node",
    }
    defaults.update(policies)
    nodes = tuple(sorted(set(numa_nodes) if numa_nodes is not None else {i.numa for i in infos}))
    return NumaProfile(1, NOW, nodes, infos, frozenset(reserved), distances, KubeletPolicies(**defaults))


# kubelet's test topologies (cpumanager policy_test.go), restated as (cpu, core, socket, numa).
SINGLE_SOCKET_HT = [(c, c % 4, 0, 0) for c in range(8)]
DUAL_SOCKET_HT = [(c, c % 6, c % 2, c % 2) for c in range(12)]
DUAL_SOCKET_MULTI_NUMA_HT = [(c, c % 40, (c % 40) // 20, (c % 40) // 10) for c in range(80)]


def machine(
    sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int
) -> list[tuple[int, int, int, int]]:
    """A Linux-style layout: thread t of core k is CPU ``t * n_cores + k``."""
    n_cores = sockets * numa_per_socket * cores_per_numa
    return [
        (t * n_cores + k, k, k // (numa_per_socket * cores_per_numa), k // cores_per_numa)
        for t in range(threads)
        for k in range(n_cores)
    ]


def pod(
    *containers: Mapping[str, Any], init: Iterable[Mapping[str, Any]] = (), qos: str | None = None
) -> dict:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    out: dict[str, Any] = {"metadata": {"name": "p", "uid": "u"}, "spec": spec}
    if qos:
        out["status"] = {"qosClass": qos}
    return out


def ctr(name: str, cpu: str | None = None, gpu: int = 0, mem: str = "1Gi", sidecar: bool = False) -> dict:
    limits: dict[str, Any] = {"memory": mem}
    if cpu is not None:
        limits["cpu"] = cpu
    if gpu:
        limits[GPU] = str(gpu)
    out: dict[str, Any] = {"name": name, "resources": {"limits": limits}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def ledger_for(
    profile: NumaProfile, gpus: Mapping[int, int] | None = None, busy: Iterable[int] = ()
) -> NumaLedger:
    ledger = NumaLedger.for_profile(profile, {GPU: dict(gpus or {})})
    ledger.apply(NumaUsage(frozenset(busy)))
    return ledger


# ==========================================================================================
# takeByTopologyNUMAPacked (cpu_assignment_test.go: commonTakeByTopologyTestCases + packed)
# ==========================================================================================

TAKE_CASES = [
    ("take more cpus than are available from single socket with HT", SINGLE_SOCKET_HT, "0,2,4,6", 5, None),
    ("take zero cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 0, ""),
    ("take one cpu from single socket with HT", SINGLE_SOCKET_HT, "0-7", 1, "0"),
    ("take one cpu from single socket with HT, some cpus are taken", SINGLE_SOCKET_HT, "1,3,5-7", 1, "6"),
    ("take two cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 2, "0,4"),
    ("take all cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 8, "0-7"),
    ("take two cpus, only one core totally free", SINGLE_SOCKET_HT, "0-3,6", 2, "2,6"),
    ("take a socket of cpus from dual socket with HT", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    (
        "take a socket from dual socket multi-numa-per-socket HT",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        40,
        "0-19,40-59",
    ),
    ("take a NUMA node from dual socket multi-numa HT", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 20, "0-9,40-49"),
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
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, "2"),
    ("allocate 4 full cores, 3 from the first NUMA node", DUAL_SOCKET_HT, "0-11", 8, "0-2,4,6-8,10"),
    (
        "allocate 32 full cores, 30 from the first 3 NUMA nodes",
        DUAL_SOCKET_MULTI_NUMA_HT,
        "0-79",
        64,
        "0-31,40-71",
    ),
    # policy_static_test.go (no topology hint: the whole assignable pool)
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", DUAL_SOCKET_HT, "1,3-11", 6, "1,3,5,7,9,11"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", DUAL_SOCKET_HT, "2-4,6-11", 6, "2-4,8-10"),
]


@pytest.mark.parametrize(
    ("layout", "available", "count", "expected"), [c[1:] for c in TAKE_CASES], ids=[c[0] for c in TAKE_CASES]
)
def test_take_by_topology_packed(layout: list, available: str, count: int, expected: str | None) -> None:
    topo = CpuTopology(profile_of(layout))
    got = take_by_topology_packed(topo, cpus(available), count)
    assert got == (None if expected is None else cpus(expected))


def _with_uncore(machine: list[Row]) -> CpuTopology:
    """The predictor's topology of a restated kubelet machine, uncore caches included."""
    profile = profile_of([r[:4] for r in machine])
    uncore = {r[0]: r[4] for r in machine}
    return CpuTopology(
        dataclasses.replace(
            profile, cpus=tuple(dataclasses.replace(c, uncore=uncore[c.cpu]) for c in profile.cpus)
        )
    )


@pytest.mark.parametrize(
    ("machine", "available", "count", "expected"),
    [c[1:] for c in UNCORE_CASES],
    ids=[c[0] for c in UNCORE_CASES],
)
def test_take_by_topology_aligned_by_uncore_cache(
    machine: list[Row], available: str, count: int, expected: str
) -> None:
    """``prefer-align-cpus-by-uncorecache``: whole uncore caches after whole NUMA nodes and sockets,
    then the first cache whose lowest free cores hold exactly the rest, then cores and threads."""
    got = take_by_topology_packed(_with_uncore(machine), cpus(available), count, Packing(uncore=True))
    assert got == cpus(expected)


@pytest.mark.parametrize(
    ("machine", "available", "count", "group", "expected"),
    [c[1:] for c in DISTRIBUTED_CASES],
    ids=[c[0] for c in DISTRIBUTED_CASES],
)
def test_take_by_topology_numa_distributed(
    machine: list[Row], available: str, count: int, group: int, expected: str
) -> None:
    """``distribute-cpus-across-numa``: an even share over the fewest NUMA nodes that can hold it
    (the fewest counted from the whole machine's CPUs per NUMA node), the most balanced choice."""
    topo = CpuTopology(profile_of([r[:4] for r in machine]))
    assert take_by_topology_distributed(topo, cpus(available), count, group) == cpus(expected)


def test_uncore_option_needs_the_caches_and_excludes_the_distribute_options() -> None:
    """A profile without uncore caches cannot be predicted with the option (an older node agent);
    kubelet refuses it with either distribute option."""
    option = {"prefer-align-cpus-by-uncorecache": "true"}
    profile = profile_of(machine(2, 1, 4, 1), cpu_manager_options=option)
    p = predict(profile, ledger_for(profile), pod(ctr("c", "2")), now=NOW)
    assert (p.outcome, p.message) == (
        Outcome.UNKNOWN,
        "prefer-align-cpus-by-uncorecache needs the uncore caches, which the profile lacks",
    )
    for other in ("distribute-cpus-across-cores", "distribute-cpus-across-numa"):
        clash = profile_of(machine(2, 1, 4, 1), cpu_manager_options={**option, other: "true"})
        p = predict(clash, ledger_for(clash), pod(ctr("c", "2")), now=NOW)
        assert p.outcome is Outcome.UNKNOWN and "exclude each other" in p.message


# ==========================================================================================
# Hint generation (topology_hints_test.go / policy_static_test.go hint tables)
# ==========================================================================================


def hints(*items: tuple[Iterable[int], bool]) -> list[Hint]:
    return [Hint(mask_of(nodes), preferred) for nodes, preferred in items]


HINT_CASES = [
    # 2 NUMA nodes x 4 devices, request 2: both single nodes preferred, the pair not.
    (
        "2 free on each node, request 2",
        {0: 4, 1: 4},
        {0: 4, 1: 4},
        {},
        2,
        hints(([0], True), ([1], True), ([0, 1], False)),
    ),
    ("1 free on each node, request 2", {0: 4, 1: 4}, {0: 1, 1: 1}, {}, 2, hints(([0, 1], False))),
    ("request more than one node holds", {0: 4, 1: 4}, {0: 4, 1: 4}, {}, 6, hints(([0, 1], True))),
    (
        "reusable on node 1 excludes node 0",
        {0: 4, 1: 4},
        {0: 4, 1: 0},
        {1: 2},
        2,
        hints(([1], True), ([0, 1], False)),
    ),
    ("nothing free", {0: 4, 1: 4}, {0: 0, 1: 0}, {}, 1, []),
]


@pytest.mark.parametrize(
    ("totals", "free", "reusable", "wanted", "expected"),
    [c[1:] for c in HINT_CASES],
    ids=[c[0] for c in HINT_CASES],
)
def test_generate_hints(totals: dict, free: dict, reusable: dict, wanted: int, expected: list[Hint]) -> None:
    assert generate_hints([0, 1], totals, free, reusable, wanted, single_only=False) == expected
    single = [h for h in expected if (h.mask or 0).bit_count() == 1]
    assert generate_hints([0, 1], totals, free, reusable, wanted, single_only=True) == single


# ==========================================================================================
# Merge per policy (policy_test.go / policy_*_test.go, restated)
# ==========================================================================================

P01 = profile_of(DUAL_SOCKET_HT)


def with_policy(policy: str, **extra: Any) -> NumaProfile:
    return profile_of(DUAL_SOCKET_HT, topology_manager_policy=policy, **extra)


MERGE_CASES = [
    # (name, policy, provider hint lists, expected best hint, admit)
    ("no providers' preference", "single-numa-node", [[DONT_CARE]], Hint(None, True), True),
    (
        "two providers, same single node preferred",
        "single-numa-node",
        [hints(([0], True), ([1], True), ([0, 1], False))] * 2,
        Hint(1, True),
        True,
    ),
    (
        "tie between nodes -> lowest NUMA id",
        "restricted",
        [hints(([0], True), ([1], True))],
        Hint(1, True),
        True,
    ),
    (
        "providers disagree (0 vs 1)",
        "single-numa-node",
        [hints(([0], True)), hints(([1], True))],
        Hint(None, False),
        False,
    ),
    (
        "providers disagree under best-effort",
        "best-effort",
        [hints(([0], True)), hints(([1], True))],
        Hint(3, False),
        True,
    ),
    (
        "only the pair fits: restricted rejects",
        "restricted",
        [hints(([0, 1], False)), hints(([0], True), ([1], True))],
        Hint(1, False),
        False,
    ),
    (
        "only the pair fits: single-numa-node rejects",
        "single-numa-node",
        [hints(([0, 1], False))],
        Hint(None, False),
        False,
    ),
    (
        "pair preferred (request > a node) under restricted",
        "restricted",
        [hints(([0, 1], True))],
        Hint(3, True),
        True,
    ),
    ("cannot satisfy a resource", "best-effort", [[CANNOT], hints(([0], True))], Hint(1, False), True),
    (
        "don't care and node 1",
        "single-numa-node",
        [[DONT_CARE], hints(([1], True), ([0, 1], False))],
        Hint(2, True),
        True,
    ),
    (
        "narrower preferred beats wider preferred",
        "restricted",
        [hints(([0, 1], True), ([1], True))],
        Hint(2, True),
        True,
    ),
]


@pytest.mark.parametrize(
    ("policy", "providers", "best", "admit"), [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES]
)
def test_merge(policy: str, providers: list[list[Hint]], best: Hint, admit: bool) -> None:
    assert merge_hints(with_policy(policy), providers) == (best, admit)


def test_single_numa_machine_rewrites_to_no_affinity() -> None:
    one = profile_of(SINGLE_SOCKET_HT)
    assert merge_hints(one, [hints(([0], True))]) == (Hint(None, True), True)


def test_prefer_closest_picks_the_closest_pair() -> None:
    layout = [(c, c, 0, c % 4) for c in range(8)]
    far = ((10, 30, 12, 30), (30, 10, 30, 12), (12, 30, 10, 30), (30, 12, 30, 10))
    profile = profile_of(
        layout,
        topology_manager_policy="restricted",
        topology_manager_options={"prefer-closest-numa-nodes": "true"},
        distances=far,
    )
    pairs = [Hint(mask_of(p), True) for p in ([0, 1], [0, 2])]
    assert merge_hints(profile, [pairs]) == (Hint(mask_of([0, 2]), True), True)
    plain = profile_of(layout, topology_manager_policy="restricted")
    assert merge_hints(plain, [pairs]) == (Hint(mask_of([0, 1]), True), True)


# ==========================================================================================
# Whole-pod predictions
# ==========================================================================================


def test_policy_static_three_cores_case_end_to_end() -> None:
    # policy_static_test.go "GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores" with TM none.
    profile = profile_of(DUAL_SOCKET_HT, topology_manager_policy="none")
    p = predict(profile, ledger_for(profile, busy=[1, 5]), pod(ctr("c", "6")), now=NOW)
    assert p.outcome is Outcome.PLACED
    assert p.containers[0].cpus == cpus("2-4,8-10")
    assert p.containers[0].numa == frozenset({0, 1})


def test_cpu_and_gpu_on_the_same_node_lowest_first() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    p = predict(profile, ledger_for(profile, {0: 4, 1: 4}), pod(ctr("c", "4", gpu=2)), now=NOW)
    assert p.outcome is Outcome.PLACED
    (c,) = p.containers
    assert c.numa == frozenset({0})
    assert c.cpus == cpus("1-2,17-18")  # whole cores, packed next to the reserved CPU 0's sibling
    assert c.devices == {GPU: {0: 2}}
    assert p.usage == NumaUsage(c.cpus, {GPU: {0: 2}})


def test_a_pod_asking_another_plugins_numa_device_is_unknown_not_guessed() -> None:
    """A differential audit: kubelet weighs every device-plugin resource's hints (an RDMA NIC on
    NUMA 1 only puts the pod there), while the ledger tracks hamid's GPUs only, so the predictor
    said NUMA 0. The profile now names such resources, and a pod asking one is unknown."""
    profile = dataclasses.replace(profile_of(machine(2, 1, 8, 2)), other_devices=("example.com/nic",))
    nic = ctr("c", "4", gpu=1)
    nic["resources"]["limits"]["example.com/nic"] = "1"
    p = predict(profile, ledger_for(profile, {0: 4, 1: 4}), pod(nic), now=NOW)
    assert p.outcome is Outcome.UNKNOWN and p.reason == UNKNOWN_UNMODELLED
    assert "example.com/nic" in p.message
    plain = predict(profile, ledger_for(profile, {0: 4, 1: 4}), pod(ctr("c", "4", gpu=1)), now=NOW)
    assert plain.outcome is Outcome.PLACED


def test_gpus_decide_the_node_when_cpus_are_free_everywhere() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    p = predict(profile, ledger_for(profile, {0: 1, 1: 4}), pod(ctr("c", "4", gpu=2)), now=NOW)
    assert p.containers[0].numa == frozenset({1})
    assert all(profile.cpus[x].numa == 1 for x in p.containers[0].cpus)


def test_cpus_on_one_node_gpus_on_the_other_is_a_topology_affinity_error() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    busy = [x for x in profile.cpus_of_numa(1)]
    p = predict(profile, ledger_for(profile, {0: 0, 1: 4}, busy=busy), pod(ctr("c", "4", gpu=1)), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.REJECT, TOPOLOGY_AFFINITY_ERROR)


def test_shared_pool_pod_is_aligned_by_its_gpus_only() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    p = predict(profile, ledger_for(profile, {0: 0, 1: 2}), pod(ctr("c", "500m", gpu=1)), now=NOW)
    assert p.outcome is Outcome.PLACED
    assert p.containers[0].cpus == frozenset()
    assert p.containers[0].numa == frozenset({1})


def test_burstable_pod_gets_no_exclusive_cpus() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    burstable = pod({"name": "c", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4", GPU: "1"}}})
    p = predict(profile, ledger_for(profile, {0: 1, 1: 1}), burstable, now=NOW)
    assert p.containers[0].cpus == frozenset() and p.containers[0].numa == frozenset({0})


@pytest.mark.parametrize(
    ("request_", "reserved", "outcome", "reason"),
    [
        ("3", (0, 16), Outcome.REJECT, SMT_ALIGNMENT_ERROR),  # not a multiple of 2 threads per core
        ("4", (0, 16), Outcome.PLACED, ""),
        ("30", (0,), Outcome.PLACED, ""),  # 31 free, 30 physical (the reserved CPU's sibling is out)
        ("32", (0,), Outcome.REJECT, SMT_ALIGNMENT_ERROR),
    ],
)
def test_full_pcpus_only(request_: str, reserved: tuple[int, ...], outcome: Outcome, reason: str) -> None:
    profile = profile_of(
        machine(2, 1, 8, 2),
        reserved=reserved,
        topology_manager_policy="none",
        cpu_manager_options={"full-pcpus-only": "true"},
    )
    p = predict(profile, ledger_for(profile), pod(ctr("c", request_)), now=NOW)
    assert (p.outcome, p.reason) == (outcome, reason)
    if outcome is Outcome.PLACED:
        taken = p.containers[0].cpus
        assert all((x + 16 if x < 16 else x - 16) in taken for x in taken)  # whole cores only


def test_full_pcpus_only_counts_the_reserved_cpus_siblings_as_unavailable() -> None:
    # Reserved CPUs 0 and 1 are not siblings: their siblings 16 and 17 stay assignable, yet kubelet
    # does not count them as free physical CPUs.
    profile = profile_of(
        machine(2, 1, 8, 2),
        reserved=(0, 1),
        topology_manager_policy="none",
        cpu_manager_options={"full-pcpus-only": "true"},
    )
    ledger = ledger_for(profile, busy=cpus("2-11,18-27"))  # free: 16, 17 and cores 12-15
    p = predict(profile, ledger, pod(ctr("c", "10")), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.REJECT, SMT_ALIGNMENT_ERROR)
    p = predict(profile, ledger, pod(ctr("c", "8")), now=NOW)
    assert p.outcome is Outcome.PLACED and p.containers[0].cpus == cpus("12-15,28-31")


def test_container_scope_places_each_container_on_its_own_node() -> None:
    profile = profile_of(machine(2, 1, 4, 1), reserved=(0,))  # node 0: CPUs 1-3 assignable, node 1: 4-7
    p = predict(profile, ledger_for(profile), pod(ctr("a", "3"), ctr("b", "3")), now=NOW)
    assert [c.numa for c in p.containers] == [frozenset({0}), frozenset({1})]
    assert [c.cpus for c in p.containers] == [cpus("1-3"), cpus("4-6")]


def test_pod_scope_needs_the_whole_pod_on_one_node() -> None:
    profile = profile_of(machine(2, 1, 4, 1), reserved=(0,), topology_manager_scope="pod")
    p = predict(profile, ledger_for(profile), pod(ctr("a", "3"), ctr("b", "3")), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.REJECT, TOPOLOGY_AFFINITY_ERROR)
    p = predict(profile, ledger_for(profile), pod(ctr("a", "2"), ctr("b", "2")), now=NOW)
    assert [c.numa for c in p.containers] == [frozenset({1})] * 2  # node 0 has only 3 assignable


def test_init_container_cpus_are_reused_by_app_containers() -> None:
    profile = profile_of(machine(2, 1, 8, 1))
    p = predict(profile, ledger_for(profile), pod(ctr("app", "4"), init=[ctr("init", "4")]), now=NOW)
    init, app = p.containers
    assert init.cpus == app.cpus and len(p.usage.cpus) == 4


def test_sidecar_cpus_are_not_reused() -> None:
    profile = profile_of(machine(2, 1, 8, 1))
    p = predict(
        profile, ledger_for(profile), pod(ctr("app", "4"), init=[ctr("side", "2", sidecar=True)]), now=NOW
    )
    side, app = p.containers
    assert not side.cpus & app.cpus and len(p.usage.cpus) == 6


def test_init_container_gpus_are_reused() -> None:
    profile = profile_of(machine(2, 1, 8, 1))
    p = predict(
        profile, ledger_for(profile, {0: 2, 1: 2}), pod(ctr("app", gpu=1), init=[ctr("init", gpu=2)]), now=NOW
    )
    assert p.outcome is Outcome.PLACED
    init, app = p.containers
    assert init.devices == {GPU: {0: 2}} and app.devices == {}  # the app reuses one of the init's
    assert app.numa == frozenset({0}) and p.usage.devices == {GPU: {0: 2}}
    assert usage_of_prediction(p.record(1).containers) == p.usage


def test_usage_of_placement_counts_distinct_device_ids() -> None:
    held = {GPU: {0: ("GPU-a-1", "GPU-a-2")}}
    placement = PodPlacement(
        1,
        (
            ContainerPlacement("init", frozenset({0}), frozenset({1, 2}), held),
            ContainerPlacement("app", frozenset({0}), frozenset({1, 2}), {GPU: {0: ("GPU-a-1",)}}),
        ),
    )
    assert usage_of_placement(placement.containers) == NumaUsage(frozenset({1, 2}), {GPU: {0: 2}})


def test_not_enough_cpus_under_best_effort_is_unexpected_admission_error() -> None:
    profile = profile_of(machine(2, 1, 4, 1), topology_manager_policy="best-effort")
    p = predict(profile, ledger_for(profile), pod(ctr("c", "8")), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.REJECT, UNEXPECTED_ADMISSION_ERROR)


def test_device_split_chosen_by_the_plugin_is_unknown() -> None:
    profile = profile_of(machine(2, 1, 4, 1), topology_manager_policy="none")
    p = predict(profile, ledger_for(profile, {0: 2, 1: 2}), pod(ctr("c", "500m", gpu=1)), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.UNKNOWN, UNKNOWN_UNMODELLED)
    p = predict(profile, ledger_for(profile, {0: 0, 1: 2}), pod(ctr("c", "500m", gpu=1)), now=NOW)
    assert p.outcome is Outcome.PLACED and p.containers[0].numa == frozenset({1})


def test_an_unknown_names_the_numa_nodes_kubelet_offers_the_plugin() -> None:
    """best-effort, 2 GPUs on each of 3 NUMA nodes, 3 GPUs asked: kubelet's hint is NUMA {0,1}
    (the lowest of the preferred pairs) and it lets the plugin choose 3 of the 4 aligned replicas:
    unknown, naming container 0 and NUMA {0,1}. With hamid's plugin preferring annotated GPUs there,
    the choice is known: 2 on NUMA 0 and 1 on NUMA 1."""
    profile = profile_of(machine(3, 1, 4, 1), topology_manager_policy="best-effort")
    ledger = ledger_for(profile, {0: 2, 1: 2, 2: 2})
    asked = pod(ctr("c", "500m", gpu=3))
    p = predict(profile, ledger, asked, now=NOW)
    assert (p.outcome, p.offered) == (Outcome.UNKNOWN, {GPU: {0: frozenset({0, 1})}})
    gpus = {f"GPU-{n}-{i}": (n, 1) for n in range(3) for i in range(2)}
    annotated = (
        (
            ContainerDevice("GPU-0-0", "NVIDIA", 0, 0),
            ContainerDevice("GPU-0-1", "NVIDIA", 0, 0),
            ContainerDevice("GPU-1-1", "NVIDIA", 0, 0),
        ),
    )
    chosen = predict(profile, ledger, asked, now=NOW, plugin=PluginView(GPU, gpus, annotated))
    assert chosen.outcome is Outcome.PLACED and chosen.usage.devices == {GPU: {0: 2, 1: 1}}
    assert chosen.containers[0].numa == frozenset({0, 1})


def test_a_choice_that_changes_nothing_kubelet_reports_is_answered() -> None:
    """best-effort: the init container takes both GPUs (one per NUMA node), the app container reuses
    one of them — which one is kubelet's map order, but the app's NUMA nodes are its hint {0,1} and
    reused replicas stay counted on the init container, so every choice ends in one placement."""
    profile = profile_of(machine(2, 1, 4, 1), topology_manager_policy="best-effort")
    asked = pod(ctr("app", "500m", gpu=1), init=[ctr("init", "500m", gpu=2)])
    p = predict(profile, ledger_for(profile, {0: 1, 1: 1}), asked, now=NOW)
    assert p.outcome is Outcome.PLACED
    assert [c.numa for c in p.containers] == [frozenset({0, 1})] * 2
    assert p.usage.devices == {GPU: {0: 1, 1: 1}}


def test_devices_without_topology_give_no_hint() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    ledger = NumaLedger.for_profile(profile, {GPU: {NO_TOPOLOGY: 2}})
    p = predict(profile, ledger, pod(ctr("c", "2", gpu=1)), now=NOW)
    assert p.containers[0].numa == frozenset({0}) and p.containers[0].devices == {GPU: {NO_TOPOLOGY: 1}}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"topology_manager_options": {"prefer-most-allocated-numa-node": "true"}}, UNKNOWN_UNMODELLED),
        ({"cpu_manager_options": {"full-pcpus-only": "yes"}}, UNKNOWN_UNMODELLED),
        ({"topology_manager_options": {"max-allowable-numa-nodes": "1"}}, UNKNOWN_UNMODELLED),
        ({"memory_manager_policy": "Static"}, UNKNOWN_UNMODELLED),
        (
            {
                "topology_manager_policy": "restricted",
                "topology_manager_options": {"prefer-closest-numa-nodes": "true"},
            },
            UNKNOWN_UNMODELLED,
        ),
    ],
)
def test_unmodelled_configurations_are_unknown(changes: dict, reason: str) -> None:
    profile = profile_of(machine(2, 1, 4, 1), **changes)
    p = predict(profile, ledger_for(profile), pod(ctr("c", "2")), now=NOW)
    assert (p.outcome, p.reason) == (Outcome.UNKNOWN, reason)


def test_missing_and_stale_profiles_are_unknown() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    ledger = ledger_for(profile)
    assert predict(None, ledger, pod(ctr("c", "2")), now=NOW).reason == UNKNOWN_PROFILE_MISSING
    assert predict(profile, ledger, pod(ctr("c", "2")), now=NOW + 10**6).reason == UNKNOWN_PROFILE_STALE
    other = NumaLedger(profile.generation + 1, ledger.free_cpus, {})
    assert predict(profile, other, pod(ctr("c", "2")), now=NOW).reason == UNKNOWN_PROFILE_STALE
    foreign = NumaLedger(profile.generation, ledger.free_cpus | {0, 99}, {})
    assert predict(profile, foreign, pod(ctr("c", "2")), now=NOW).reason == UNKNOWN_PROFILE_STALE


def test_pod_level_resources_are_unknown() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    p = pod(ctr("c", "2"))
    p["spec"]["resources"] = {"limits": {"cpu": "2"}}
    assert predict(profile, ledger_for(profile), p, now=NOW).reason == UNKNOWN_UNMODELLED


def test_malformed_pod_raises() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    with pytest.raises(InvalidInput):
        predict(profile, ledger_for(profile), pod(ctr("c", "two")), now=NOW)


def test_prediction_does_not_change_the_ledger() -> None:
    profile = profile_of(machine(2, 1, 8, 2))
    ledger = ledger_for(profile, {0: 4, 1: 4})
    before = (ledger.free_cpus, ledger.device_counts(GPU))
    predict(profile, ledger, pod(ctr("c", "4", gpu=2)), now=NOW)
    assert (ledger.free_cpus, ledger.device_counts(GPU)) == before


# ==========================================================================================
# Ledger properties
# ==========================================================================================

PROFILE = profile_of(machine(2, 1, 8, 2))
TOTALS = {0: 4, 1: 4}


@st.composite
def usages(draw: st.DrawFn) -> NumaUsage:
    free = sorted(PROFILE.all_cpus - PROFILE.reserved_cpus)
    taken = draw(st.sets(st.sampled_from(free), max_size=8))
    devices = {n: draw(st.integers(0, 5)) for n in TOTALS}
    return NumaUsage(frozenset(taken), {GPU: {n: k for n, k in devices.items() if k}})


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(usages(), max_size=8))
def test_ledger_apply_release_invariants(steps: list[NumaUsage]) -> None:
    ledger = NumaLedger.for_profile(PROFILE, {GPU: TOTALS})
    booked: list[NumaUsage] = []
    for usage in steps:
        snapshot = (ledger.free_cpus, ledger.device_counts(GPU))
        try:
            ledger.apply(usage)
            booked.append(usage)
        except InvalidInput:
            assert (ledger.free_cpus, ledger.device_counts(GPU)) == snapshot  # nothing changed
        for total, free in ledger.device_counts(GPU).values():
            assert 0 <= free <= total
        assert not ledger.free_cpus & PROFILE.reserved_cpus
    for usage in reversed(booked):
        ledger.release(usage)
    fresh = NumaLedger.for_profile(PROFILE, {GPU: TOTALS})
    assert (ledger.free_cpus, ledger.device_counts(GPU)) == (fresh.free_cpus, fresh.device_counts(GPU))


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3), st.booleans()), min_size=1, max_size=6),
    st.sampled_from(["container", "pod"]),
)
def test_placed_predictions_fit_the_ledger_and_stay_on_their_node(
    pods: list[tuple[int, int, bool]], scope: str
) -> None:
    profile = profile_of(machine(2, 1, 8, 2), topology_manager_scope=scope)
    ledger = NumaLedger.for_profile(profile, {GPU: TOTALS})
    for n_cpu, n_gpu, guaranteed in pods:
        cpu = str(n_cpu) if guaranteed else f"{n_cpu * 1000 + 500}m"
        p = predict(profile, ledger, pod(ctr("c", cpu, gpu=n_gpu)), now=NOW)
        assert p.outcome is not Outcome.UNKNOWN
        if p.outcome is Outcome.REJECT:
            assert p.reason == TOPOLOGY_AFFINITY_ERROR
            continue
        (c,) = p.containers
        assert len(c.cpus) == (n_cpu if guaranteed else 0)
        if c.cpus or n_gpu:
            (node,) = c.numa
            assert c.cpus <= profile.cpus_of_numa(node)
            assert set(c.devices.get(GPU, {})) <= {node}
        ledger.apply(p.usage)  # a placed prediction always fits what it was predicted against


# cpu_assignment_test.go TestCPUAccumulatorFreeCPUs: the first CPU of kubelet's order is the one
# taken for a one-CPU request (no whole core is claimed for fewer CPUs than a core has).
FIRST_FREE_CPU = [
    ("single socket HT, 8 cpus free", SINGLE_SOCKET_HT, "0-7", 0),
    ("single socket HT, 5 cpus free", SINGLE_SOCKET_HT, "3-7", 4),
    ("dual socket HT, 12 cpus free", DUAL_SOCKET_HT, "0-11", 0),
    ("dual socket HT, 11 cpus free", DUAL_SOCKET_HT, "1-11", 6),
    ("dual socket HT, 10 cpus free", DUAL_SOCKET_HT, "1-5,7-11", 2),
]


@pytest.mark.parametrize(
    ("layout", "available", "first"), [c[1:] for c in FIRST_FREE_CPU], ids=[c[0] for c in FIRST_FREE_CPU]
)
def test_first_free_cpu_order(layout: list, available: str, first: int) -> None:
    assert take_by_topology_packed(CpuTopology(profile_of(layout)), cpus(available), 1) == {first}


def test_max_allowable_numa_nodes_below_the_minimum_is_unknown() -> None:
    profile = profile_of(machine(2, 1, 4, 1), topology_manager_options={"max-allowable-numa-nodes": "4"})
    assert predict(profile, ledger_for(profile), pod(ctr("c", "2")), now=NOW).reason == UNKNOWN_UNMODELLED
    profile = profile_of(machine(2, 1, 4, 1), topology_manager_options={"max-allowable-numa-nodes": "16"})
    assert predict(profile, ledger_for(profile), pod(ctr("c", "2")), now=NOW).outcome is Outcome.PLACED


def test_strict_cpu_reservation_is_modelled() -> None:
    profile = profile_of(machine(2, 1, 4, 1), cpu_manager_options={"strict-cpu-reservation": "true"})
    p = predict(profile, ledger_for(profile), pod(ctr("c", "3")), now=NOW)
    assert p.outcome is Outcome.PLACED and p.containers[0].cpus == cpus("1-3")


def test_best_effort_pod_is_aligned_by_its_gpus() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    best_effort = pod({"name": "c", "resources": {"limits": {GPU: "1"}}})
    p = predict(profile, ledger_for(profile, {0: 0, 1: 1}), best_effort, now=NOW)
    assert p.containers[0].numa == frozenset({1}) and p.containers[0].devices == {GPU: {1: 1}}


def test_hamis_scheduler_only_resources_are_not_device_plugin_resources() -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    c = ctr("c", "2", gpu=1)
    c["resources"]["limits"]["nvidia.com/gpumem"] = "4000"
    p = predict(profile, ledger_for(profile, {0: 1, 1: 1}), pod(c), now=NOW)
    assert p.outcome is Outcome.PLACED and set(p.containers[0].devices) == {GPU}


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": "x"},
        {"containers": [{"name": 1}]},
        {"containers": [{"name": "c", "resources": []}]},
        {"containers": [{"name": "c", "resources": {"limits": {"cpu": True}}}]},
        {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1e999999"}}}]},
    ],
)
def test_bad_pod_shapes_raise_invalid_input(spec: dict) -> None:
    profile = profile_of(machine(2, 1, 4, 1))
    with pytest.raises(InvalidInput):
        predict(profile, ledger_for(profile), {"spec": spec}, now=NOW)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[NumaProfile, NumaLedger, dict]:
    sockets, numa_per_socket = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    layout = machine(sockets, numa_per_socket, draw(st.integers(1, 4)), draw(st.integers(1, 2)))
    all_cpus = sorted(row[0] for row in layout)
    reserved = draw(st.sets(st.sampled_from(all_cpus), min_size=1, max_size=2))
    profile = profile_of(
        layout,
        reserved=reserved,
        topology_manager_policy=draw(
            st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"])
        ),
        topology_manager_scope=draw(st.sampled_from(["container", "pod"])),
        cpu_manager_options=draw(st.sampled_from([{}, {"full-pcpus-only": "true"}])),
    )
    numa = profile.numa_nodes
    totals = {n: draw(st.integers(0, 3)) for n in numa}
    ledger = NumaLedger.for_profile(profile, {GPU: totals})
    free = sorted(ledger.free_cpus)
    busy = draw(st.sets(st.sampled_from(free), max_size=len(all_cpus))) if free else set()
    ledger.apply(NumaUsage(frozenset(busy), {GPU: {n: draw(st.integers(0, t)) for n, t in totals.items()}}))

    def container(name: str, sidecar: bool = False) -> dict:
        n = draw(st.integers(0, 4))
        cpu = str(n) if draw(st.booleans()) else f"{n}500m"
        return ctr(name, cpu, gpu=draw(st.integers(0, 2)), sidecar=sidecar)

    inits = [container(f"i{i}", sidecar=draw(st.booleans())) for i in range(draw(st.integers(0, 2)))]
    apps = [container(f"a{i}") for i in range(draw(st.integers(1, 2)))]
    return profile, ledger, pod(*apps, init=inits)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_pod_gets_a_definite_or_explained_answer(scenario: tuple[NumaProfile, NumaLedger, dict]) -> None:
    profile, ledger, p = scenario
    before = (ledger.free_cpus, ledger.device_counts(GPU))
    result = predict(profile, ledger, p, now=NOW)
    assert (ledger.free_cpus, ledger.device_counts(GPU)) == before
    if result.outcome is Outcome.REJECT:
        assert result.reason in (TOPOLOGY_AFFINITY_ERROR, SMT_ALIGNMENT_ERROR, UNEXPECTED_ADMISSION_ERROR)
    elif result.outcome is Outcome.UNKNOWN:
        assert result.reason == UNKNOWN_UNMODELLED and result.message
    else:
        assert [c.name for c in result.containers] == [
            c["name"] for c in p["spec"].get("initContainers", [])
        ] + [c["name"] for c in p["spec"]["containers"]]
        if profile.policies.topology_manager_policy == "single-numa-node":
            for c in result.containers:
                assert len(c.numa) <= 1 or len(profile.numa_nodes) == 1
        ledger.apply(result.usage)
        ledger.release(result.usage)
        assert (ledger.free_cpus, ledger.device_counts(GPU)) == before


@pytest.mark.parametrize(
    ("inits", "apps", "fits_node0"),
    [
        ([ctr("i", "6")], [ctr("a", "2"), ctr("b", "2")], False),  # pod request max(6, 4) = 6 > 5 free
        ([ctr("i", "5")], [ctr("a", "2"), ctr("b", "2")], True),  # max(5, 4) = 5
        ([ctr("s", "2", sidecar=True), ctr("i", "3")], [ctr("a", "2")], True),  # max(2 + 3, 2 + 2) = 5
        ([ctr("s", "2", sidecar=True), ctr("i", "4")], [ctr("a", "2")], False),  # 2 + 4 = 6
    ],
)
def test_pod_scope_effective_request_with_init_containers_and_sidecars(
    inits: list, apps: list, fits_node0: bool
) -> None:
    # Node 0 has 5 free CPUs (1-5), node 1 has 8: the pod lands on node 0 only if it fits there.
    profile = profile_of(machine(2, 1, 8, 1), topology_manager_scope="pod")
    ledger = ledger_for(profile, busy=[6, 7])
    p = predict(profile, ledger, pod(*apps, init=inits), now=NOW)
    assert p.outcome is Outcome.PLACED
    assert {n for c in p.containers for n in c.numa} == ({0} if fits_node0 else {1})


def test_single_numa_machine_places_on_its_only_node() -> None:
    profile = profile_of(SINGLE_SOCKET_HT)
    p = predict(profile, ledger_for(profile, {0: 2}), pod(ctr("c", "2", gpu=1)), now=NOW)
    assert p.outcome is Outcome.PLACED and p.containers[0].numa == frozenset({0})
    assert p.containers[0].cpus == cpus("1,5")  # a whole core next to the reserved CPU 0
