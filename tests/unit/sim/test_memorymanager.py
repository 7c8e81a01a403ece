"""The simulated kubelet's Static memory manager against kubelet's own tables
(``pkg/kubelet/cm/memorymanager/policy_static_test.go``: ``TestStaticPolicyNew``,
``TestStaticPolicyStart``, ``TestStaticPolicyAllocate``, ``TestStaticPolicyRemoveContainer``,
``TestStaticPolicyGetTopologyHints``; the case descriptions are quoted), plus the start-up checks of
``memory_manager.go`` (``validateReservedMemory``) and the machine file's memory per NUMA node."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.admission import Admitter
from hamidsim.kubelet.assignment import PodAdmission
from hamidsim.kubelet.cadvisor import NodeMemory
from hamidsim.kubelet.config import parse_kubelet_config
from hamidsim.kubelet.cpumanager import CpuManager, StaticPolicyOptions
from hamidsim.kubelet.devicemanager import DeviceManager
from hamidsim.kubelet.errors import AdmissionFailure
from hamidsim.kubelet.memorymanager import (
    MemoryBlock,
    MemoryManagerError,
    MemoryTable,
    NumaMemoryState,
    StaticMemoryPolicy,
    default_machine_state,
    hugepages_resource,
    pod_memory,
)
from hamidsim.kubelet.node import build_managers, build_memory_manager, node_status
from hamidsim.kubelet.topologymanager import TopologyHint
from hamidsim.machine import parse_machine_text
from tests.builders import container, pod

MB = 1024 * 1024
GB = 1024 * MB
HP1G = "hugepages-1Gi"


def guaranteed(
    name: str = "pod1", ctr: str = "container1", memory: str = "1Gi", huge: str | None = "1Gi"
) -> Any:
    """kubelet's ``requirementsGuaranteed``: 1Gi memory and one 1Gi hugepage, limits = requests."""
    resources = {"cpu": "1", "memory": memory} | ({HP1G: huge} if huge else {})
    return pod(name, uid=name, containers=[container(ctr, limits=resources, requests=resources)])


def burstable() -> Any:
    """kubelet's ``requirementsBurstable``: limits above the requests."""
    limits = {"cpu": "1", "memory": "2Gi", HP1G: "2Gi"}
    requests = {"cpu": "1", "memory": "1Gi", HP1G: "1Gi"}
    return pod("pod1", uid="pod1", containers=[container("container1", limits=limits, requests=requests)])


def node_state(
    memory: tuple[int, int],
    huge: tuple[int, int] = (GB, GB),
    cells: tuple[int, ...] = (0,),
    assignments: int = 0,
) -> NumaMemoryState:
    """A NUMA node with (allocatable, free) memory (512Mi system-reserved) and 1Gi hugepages."""
    alloc, free = memory
    return NumaMemoryState(
        {
            "memory": MemoryTable(alloc + 512 * MB, 512 * MB, alloc, free, alloc - free),
            HP1G: MemoryTable(huge[0], 0, huge[0], huge[1], huge[0] - huge[1]),
        },
        cells,
        assignments,
    )


def free_of(policy: StaticMemoryPolicy) -> dict[int, tuple[int, int]]:
    return {n: (s.tables["memory"].free, s.tables[HP1G].free) for n, s in policy.machine.items()}


# --- TestStaticPolicyNew / TestStaticPolicyStart ------------------------------------------------------


def test_new_needs_system_reserved_memory() -> None:
    """'should fail, when machine does not have reserved memory for the system workloads'"""
    with pytest.raises(
        InvalidInput, match=r"\[memorymanager\] you should specify the system reserved memory"
    ):
        StaticMemoryPolicy.create([NodeMemory(0, 2 * GB)], {})


def test_new_with_reserved_memory_on_one_node() -> None:
    """'should succeed, when at least one NUMA node has reserved memory'"""
    policy = StaticMemoryPolicy.create(
        [NodeMemory(0, 2 * GB), NodeMemory(1, 2 * GB)], {0: {}, 1: {"memory": 512 * MB}}
    )
    assert policy.machine[0].tables["memory"].allocatable == 2 * GB
    assert policy.machine[1].tables["memory"].allocatable == 1536 * MB


def test_start_fills_the_default_state() -> None:
    """'should fill the state with default values, when the state is empty': 3Gi with one 1Gi page
    and 512Mi reserved leaves 1536Mi of regular memory."""
    state = default_machine_state([NodeMemory(0, 3 * GB, ((GB, 1),))], {0: {"memory": 512 * MB}})
    assert state[0].tables["memory"] == MemoryTable(3 * GB, 512 * MB, 1536 * MB, 1536 * MB, 0)
    assert state[0].tables[HP1G] == MemoryTable(GB, 0, GB, GB, 0)
    assert (state[0].cells, state[0].assignments) == ((0,), 0)


# --- TestStaticPolicyAllocate -------------------------------------------------------------------------


def test_allocate_does_nothing_for_non_guaranteed_pods() -> None:
    """'should do nothing for non-guaranteed pods'"""
    policy = StaticMemoryPolicy({0: node_state((1536 * MB, 1536 * MB))})
    p = burstable()
    policy.allocate(p, "pod1", p["spec"]["containers"][0], TopologyHint(None, False))
    assert policy.assignments == {}
    assert free_of(policy) == {0: (1536 * MB, GB)}


def test_allocate_calculates_a_default_hint() -> None:
    """'should calculate a default topology hint when no NUMA affinity was provided by the topology
    manager hint'"""
    policy = StaticMemoryPolicy({0: node_state((1536 * MB, 1536 * MB))})
    p = guaranteed()
    policy.allocate(p, "pod1", p["spec"]["containers"][0], TopologyHint(None, False))
    assert sorted(policy.assignments["pod1"]["container1"], key=lambda b: b.resource) == [
        MemoryBlock((0,), HP1G, GB),
        MemoryBlock((0,), "memory", GB),
    ]
    assert free_of(policy) == {0: (512 * MB, 0)}
    assert policy.machine[0].assignments == 2


def test_allocate_fails_without_a_default_hint() -> None:
    """'should fail when no NUMA affinity was provided under the topology manager hint and calculation
    of the default hint failed'"""
    policy = StaticMemoryPolicy({0: node_state((1536 * MB, 512 * MB), (GB, 0), assignments=2)})
    p = guaranteed("pod2", "container2")
    with pytest.raises(MemoryManagerError, match="failed to get the default NUMA affinity, no NUMA nodes"):
        policy.allocate(p, "pod2", p["spec"]["containers"][0], TopologyHint(None, False))


def test_allocate_fails_when_the_default_hint_is_not_preferred() -> None:
    """'should fail when no NUMA affinity was provided under the topology manager preferred hint and
    default hint has preferred false': node 0 alone could hold 1Gi if it were empty, so only a
    single node is preferred; the free nodes 1 and 2 hold it only together."""
    policy = StaticMemoryPolicy(
        {
            0: node_state((GB, 512 * MB), assignments=1),
            1: node_state((512 * MB, 512 * MB), cells=(1,)),
            2: node_state((512 * MB, 512 * MB), cells=(2,)),
        }
    )
    p = guaranteed("pod2", "container2")
    hints = policy.container_hints(p, "pod2", p["spec"]["containers"][0])
    assert hints == {r: [TopologyHint(frozenset({1, 2}), False)] for r in ("memory", HP1G)}
    with pytest.raises(
        MemoryManagerError, match=r"^\[memorymanager\] failed to find the default preferred hint$"
    ):
        policy.allocate(p, "pod2", p["spec"]["containers"][0], TopologyHint(None, True))


def test_allocate_fails_when_the_hint_cannot_be_extended() -> None:
    """'should fail when NUMA affinity provided under the topology manager hint did not satisfy
    container requirements and extended hint generation failed': nodes 1 and 2 form a group."""
    policy = StaticMemoryPolicy(
        {
            0: node_state((512 * MB, 512 * MB)),
            1: node_state((1536 * MB, 512 * MB), cells=(1, 2), assignments=1),
            2: node_state((1536 * MB, 512 * MB), cells=(1, 2), assignments=1),
        }
    )
    p = guaranteed()
    with pytest.raises(
        MemoryManagerError, match="failed to find NUMA nodes to extend the current topology hint"
    ):
        policy.allocate(p, "pod1", p["spec"]["containers"][0], TopologyHint(frozenset({0}), False))


def test_allocate_extends_a_short_hint_and_forms_a_group() -> None:
    """A hint whose free memory falls short is extended to the narrowest mask that holds it; the
    mask becomes a group that later single-node hints avoid (``updateMachineState``)."""
    policy = StaticMemoryPolicy({n: node_state((GB, GB), cells=(n,)) for n in range(3)})
    p = guaranteed(memory="1536Mi", huge=None)
    policy.allocate(p, "pod1", p["spec"]["containers"][0], TopologyHint(frozenset({1}), False))
    assert policy.assignments["pod1"]["container1"] == [MemoryBlock((0, 1), "memory", 1536 * MB)]
    assert [policy.machine[n].tables["memory"].free for n in range(3)] == [0, 512 * MB, GB]
    assert policy.machine[1].cells == (0, 1)
    later = guaranteed("pod2", "c", memory="256Mi", huge=None)
    hints = policy.container_hints(later, "pod2", later["spec"]["containers"][0])
    assert hints is not None
    assert [h.affinity for h in hints["memory"]] == [frozenset({2}), frozenset({0, 1})]


# --- TestStaticPolicyRemoveContainer ------------------------------------------------------------------


def test_remove_cross_numa_container() -> None:
    """'should delete the cross NUMA container assignment and update the machine state': the group
    dissolves once no block uses it."""
    policy = StaticMemoryPolicy(
        {
            0: node_state((512 * MB, 0), (GB, 0), cells=(0, 1), assignments=2),
            1: node_state((512 * MB, 0), (GB, GB), cells=(0, 1), assignments=2),
        },
        assignments={
            "pod1": {"container1": [MemoryBlock((0, 1), "memory", GB), MemoryBlock((0, 1), HP1G, GB)]}
        },
    )
    policy.remove_container("pod1", "container1")
    assert policy.assignments == {}
    assert free_of(policy) == {0: (512 * MB, GB), 1: (512 * MB, GB)}
    assert [(s.cells, s.assignments) for s in policy.machine.values()] == [((0,), 0), ((1,), 0)]


# --- TestStaticPolicyGetTopologyHints -----------------------------------------------------------------


def test_no_hints_for_non_guaranteed_pods() -> None:
    """'should not provide topology hints for non-guaranteed pods'"""
    policy = StaticMemoryPolicy({0: node_state((1536 * MB, 1536 * MB))})
    p = burstable()
    assert policy.container_hints(p, "pod1", p["spec"]["containers"][0]) is None


def test_hints_from_the_existing_assignment() -> None:
    """'should provide topology hints based on the existent memory assignment'"""
    policy = StaticMemoryPolicy(
        {0: node_state((1536 * MB, 512 * MB), (GB, 0), assignments=2)},
        assignments={"pod1": {"container1": [MemoryBlock((0,), "memory", GB), MemoryBlock((0,), HP1G, GB)]}},
    )
    p = guaranteed()
    assert policy.container_hints(p, "pod1", p["spec"]["containers"][0]) == {
        r: [TopologyHint(frozenset({0}), True)] for r in ("memory", HP1G)
    }


def test_hints_none_when_the_assignment_differs_from_the_request() -> None:
    """'should fail when existing memory assignment size is different from one requested by the
    container' and 'should fail when number of existing memory assignment resources are different
    from resources requested by container'"""
    for blocks in (
        [MemoryBlock((0,), "memory", 512 * MB), MemoryBlock((0,), HP1G, GB)],
        [MemoryBlock((0,), "memory", GB)],
    ):
        policy = StaticMemoryPolicy(
            {0: node_state((1536 * MB, 512 * MB))}, assignments={"pod1": {"container1": blocks}}
        )
        p = guaranteed()
        assert policy.container_hints(p, "pod1", p["spec"]["containers"][0]) is None


def test_new_hints_respect_groups() -> None:
    """'should calculate new topology hints, when the container does not exist under assignments':
    nodes 0 and 1 form a group, so only 2, 3 (preferred) and {2,3} remain."""
    policy = StaticMemoryPolicy(
        {
            0: node_state((1536 * MB, 0), (GB, 0), cells=(0, 1), assignments=2),
            1: node_state((1536 * MB, GB), (GB, 0), cells=(0, 1), assignments=2),
            2: node_state((1536 * MB, 1536 * MB), cells=(2,)),
            3: node_state((1536 * MB, 1536 * MB), cells=(3,)),
        }
    )
    p = guaranteed("pod2", "container2")
    expected = [
        TopologyHint(frozenset({2}), True),
        TopologyHint(frozenset({3}), True),
        TopologyHint(frozenset({2, 3}), False),
    ]
    assert policy.container_hints(p, "pod2", p["spec"]["containers"][0]) == {
        "memory": expected,
        HP1G: expected,
    }


# --- beyond the tables ----------------------------------------------------------------------------------


def test_no_feasible_mask_means_no_preference_then_an_admission_error() -> None:
    """Both nodes hold single-node blocks and neither has 1Gi free: no mask is feasible, so the hints
    are an empty map, which the Topology Manager reads as "no preference"; ``Allocate`` then fails."""
    policy = StaticMemoryPolicy(
        {n: node_state((2 * GB, 768 * MB), cells=(n,), assignments=1) for n in range(2)}
    )
    p = guaranteed(huge=None)
    assert policy.container_hints(p, "pod1", p["spec"]["containers"][0]) == {}
    with pytest.raises(MemoryManagerError, match="failed to get the default NUMA affinity"):
        policy.allocate(p, "pod1", p["spec"]["containers"][0], TopologyHint(None, False))


def test_init_container_memory_is_reused_by_the_app_container() -> None:
    """``initContainersReusableMemory``: an app container on the init container's mask takes only
    what the init container did not leave, and the init block shrinks by what was reused."""
    policy = StaticMemoryPolicy(
        {0: node_state((2 * GB, 2 * GB)), 1: node_state((2 * GB, 2 * GB), cells=(1,))}
    )
    limits = {"cpu": "1", "memory": "1Gi"}
    p = pod(
        "p",
        uid="p",
        init_containers=[container("init", limits=limits)],
        containers=[container("app", limits={"cpu": "1", "memory": "1536Mi"})],
    )
    hint = TopologyHint(frozenset({0}), True)
    for c in [*p["spec"]["initContainers"], *p["spec"]["containers"]]:
        policy.allocate(p, "p", c, hint)
    assert policy.machine[0].tables["memory"].free == 512 * MB
    assert policy.assignments["p"]["init"] == [MemoryBlock((0,), "memory", 0)]
    assert pod_memory(p) == {"memory": 1536 * MB}
    policy.release("p")
    assert policy.machine[0].tables["memory"].free == 2 * GB and policy.machine[0].assignments == 0


def test_hugepages_resource_names() -> None:
    assert [hugepages_resource(s) for s in (2 * MB, GB, 64 * 1024)] == [
        "hugepages-2Mi",
        "hugepages-1Gi",
        "hugepages-64Ki",
    ]


# --- start-up (memory_manager.go) and the machine file -----------------------------------------------

MACHINE = """
numaNodes: [{id: 0, cpus: "0-7"}, {id: 1, cpus: "8-15"}]
reservedCpus: "0"
numaMemory: {0: 64Gi, 1: 32Gi}
hugepages: {1: {1Gi: 4}}
"""
CONFIG = """
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
memoryManagerPolicy: Static
systemReserved: {memory: 1Gi}
"""


def test_machine_file_memory_per_numa_node() -> None:
    machine = parse_machine_text(MACHINE)
    assert machine.memory == str(96 * GB)
    assert machine.memory_per_numa() == (NodeMemory(0, 64 * GB), NodeMemory(1, 32 * GB, ((GB, 4),)))
    config = parse_kubelet_config(_yaml(CONFIG))
    cpus = CpuManager(machine.cpu_topology, "none", frozenset(), StaticPolicyOptions())
    status = node_status(machine, config, cpus, ({}, {}, set()), (), "n")
    assert status["capacity"][HP1G] == str(4 * GB)
    assert status["allocatable"]["memory"] == str(92 * GB)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("numaMemory: {0: 64Gi}", "numaMemory must name every NUMA node"),
        ("numaMemory: {0: 64Gi, 1: 32Gi}\nmemory: 64Gi", "is not the sum of numaMemory"),
        ("numaMemory: {0: 64Gi, 2: 32Gi}", "2 is not one of the NUMA nodes"),
        ("hugepages: {0: {1Gi: 300}}", "hugepages of NUMA node 0 exceed its memory"),
        ("hugepages: {0: {1Gi: -1}}", "want a page count"),
    ],
)
def test_machine_file_memory_errors(text: str, error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        parse_machine_text('numaNodes: [{id: 0, cpus: "0-7"}, {id: 1, cpus: "8-15"}]\n' + text)


def test_reserved_memory_must_match_node_allocatable() -> None:
    """``validateReservedMemory``: reservedMemory adds up to kube + system reserved + hard eviction
    (kubelet's default 100Mi)."""
    machine = parse_machine_text(MACHINE)
    with pytest.raises(
        InvalidInput, match=r'the total amount "0" of type "memory" is not equal to the value "1178599424"'
    ):
        build_memory_manager(machine, parse_kubelet_config(_yaml(CONFIG)))
    good = CONFIG + "reservedMemory: [{numaNode: 0, limits: {memory: 1124Mi}}]\n"
    policy = build_memory_manager(machine, parse_kubelet_config(_yaml(good)))
    assert policy is not None
    assert policy.machine[0].tables["memory"].allocatable == 64 * GB - 1124 * MB
    assert policy.machine[1].tables["memory"].allocatable == 28 * GB
    assert policy.machine[1].tables[HP1G].allocatable == 4 * GB
    missing = CONFIG + "reservedMemory: [{numaNode: 5, limits: {memory: 1124Mi}}]\n"
    with pytest.raises(InvalidInput, match="references a NUMA node 5 that does not exist"):
        build_memory_manager(machine, parse_kubelet_config(_yaml(missing)))
    zero = CONFIG.replace("systemReserved: {memory: 1Gi}", "evictionHard: {nodefs.available: 10%}")
    with pytest.raises(InvalidInput, match="you should specify the system reserved memory"):
        build_memory_manager(machine, parse_kubelet_config(_yaml(zero)))


def _yaml(text: str) -> Any:
    return yaml.safe_load(text)


# --- through the Topology Manager's admission -------------------------------------------------------

ADMIT_MACHINE = """
numaNodes: [{id: 0, cpus: "0-7"}, {id: 1, cpus: "8-15"}]
reservedCpus: "0"
numaMemory: {0: 16Gi, 1: 64Gi}
"""
ADMIT_CONFIG = """
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
topologyManagerPolicy: single-numa-node
memoryManagerPolicy: Static
evictionHard: {memory.available: 1Gi}
reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}]
"""


LOG = structlog.get_logger()


def admit(admitter: Admitter, name: str, memory: str) -> PodAdmission:
    resources = {"cpu": "2", "memory": memory}
    p = pod(
        name, uid=name, containers=[container("main", limits=resources)], status={"qosClass": "Guaranteed"}
    )
    record = PodAdmission("default", name, name, "node", admitted=False)
    try:
        asyncio.run(admitter.admit(p, record))
        record.admitted = True
    except AdmissionFailure as failure:
        record.reason, record.message = failure.reason, failure.message
    return record


def test_memory_decides_the_numa_node(tmp_path: Path) -> None:
    """Both NUMA nodes have free CPUs (CPU alone would pick node 0); 32Gi fits only node 1's
    allocatable memory, so the merge picks node 1 for CPUs and memory. The next 48Gi pod is
    preferred on node 1 as if it were empty, but no mask has the free memory: the memory manager
    gives no hints, the merge follows the CPUs to node 0, and ``Allocate`` cannot extend it."""
    machine = parse_machine_text(ADMIT_MACHINE)
    config = parse_kubelet_config(yaml.safe_load(ADMIT_CONFIG))
    cpus, settings = build_managers(machine, config)
    devices = DeviceManager(
        tmp_path,
        rpc_timeout=1,
        dial_timeout=1,
        endpoint_stop_grace=1,
        on_change=lambda: None,
        log=structlog.get_logger(),
    )
    admitter = Admitter(
        settings, devices, cpus, structlog.get_logger(), build_memory_manager(machine, config)
    )
    first = admit(admitter, "big", "32Gi")
    assert first.admitted
    main = first.container("main")
    assert main.hint == TopologyHint(frozenset({1}), True)
    assert main.cpu_numa_nodes == (1,)
    assert main.memory == {"memory": ((1,), 32 * GB)}
    second = admit(admitter, "bigger", "48Gi")
    assert (second.reason, second.message) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to [memorymanager] failed to find NUMA nodes to extend the current "
        "topology hint, which is unexpected",
    )
