"""What regular init containers keep, which no placement shows (outside audit s24, F1).

kubelet's PodResources ``List`` reports app and restartable init containers only, while kubelet
keeps what a regular init container took — less what later containers reused — until the pod ends.
The scheduler's NUMA ledger keeps that part beside the placement, from the prediction or replay it
booked before (after a restart: the pod's own prediction, or a replay on the node). The simulated
kubelet, whose PodResources lists as kubelet's does, is the oracle; the node agent's side is the
real one (PodResources decoded, :func:`placement_of`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from hamid.fit.numa_fit import pod_shape
from hamid.fit.numa_predict import NumaUsage, Outcome, Prediction, predict
from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.model.numa import (
    NO_TOPOLOGY,
    NUMA_PLACEMENT,
    NUMA_PREDICTED,
    NUMA_PROFILE,
    ContainerPlacement,
    MemoryBlock,
    PodPlacement,
    encode_placement,
    encode_prediction,
    encode_profile,
)
from hamid.plugin.numa_publisher import holds_anything, placement_of
from hamid.scheduler import numa_ledger
from hamid.scheduler.numa_ledger import NumaLedgers, Source
from hamidsim.kubelet.assignment import PodAdmission
from tests.unit.fit.test_numa_differential import (
    EXAMPLES,
    GPU,
    NIC,
    NOW,
    SEED,
    Machine,
    Plugin,
    SimNode,
    _case,
    _container,
    check_agreement,
    held_of,
    machines,
    plugin,
    pods,
    profile_of,
)
from tests.unit.scheduler.test_numa_ledger import _filtered, _node, _plan, _pod, _scheduler

__all__ = ["plugin"]  # the simulated kubelet's device plugins (a module fixture)

SCHEDULER = "hami-scheduler"
NODE = "n1"
GI = 1 << 30


def _infos(m: Machine) -> list[DeviceInfo] | None:
    """The node's registered GPUs, one replica each, as the simulated kubelet sees them (None: no
    GPU plugin, so the GPU is no device-plugin resource there)."""
    gpus = sorted(m.device_ids(GPU).items())
    return [
        DeviceInfo(d, i, 1, 8000, 100, "NVIDIA-A100", numa, MODE_HAMI_CORE, healthy)
        for i, (d, (numa, healthy)) in enumerate(gpus)
    ] or None


class Chain:
    """One node twice: the simulated kubelet admitting pods, and the scheduler's NUMA ledger fed
    as its events feed it — the filter's prediction (own pods) or the bind (another scheduler's),
    then the node agent's placement read from PodResources."""

    def __init__(self, m: Machine, plugin: Plugin) -> None:
        self.machine = m
        self.sim = SimNode(m, plugin)
        self.profile = profile_of(m)
        #: Own pods booked with a prediction (the GPU ledger's reservations, for ``booked_on``).
        self.booked: set[str] = set()
        self.ledgers = self.restarted()
        self.ledgers.on_node(self.node(), _infos(m))
        self.idle = self.sim.cpus.available(), self.ledgers.free_cpus(NODE)
        #: The admitted pods as the API server has them now, in admission order.
        self.pods: list[dict[str, Any]] = []

    def restarted(self) -> NumaLedgers:
        """An empty ledger (a scheduler started afresh) that trusts this chain's predictions."""
        return NumaLedgers(
            SCHEDULER, GPU, lambda: float(NOW), booked_on=lambda uid: NODE if uid in self.booked else None
        )

    def node(self) -> dict[str, Any]:
        return {"metadata": {"name": NODE, "annotations": {NUMA_PROFILE: encode_profile(self.profile)}}}

    def rebuilt(self, pods_first: bool) -> NumaLedgers:
        """The ledger a restarted scheduler builds from the node and the pods as they are now, the
        pods listed before the node or after it (in admission order)."""
        ledgers = self.restarted()
        if not pods_first:
            ledgers.on_node(self.node(), _infos(self.machine))
        for p in self.pods:
            ledgers.on_pod(p)
        if pods_first:
            ledgers.on_node(self.node(), _infos(self.machine))
        return ledgers

    def restamp(self) -> None:
        """The node agent's re-stamp (a new ``at``, every 10 minutes): the live ledger is rebuilt."""
        self.profile = dataclasses.replace(self.profile, observed_at=self.profile.observed_at + 600)
        self.ledgers.on_node(self.node(), _infos(self.machine))

    def predict(self, pod: dict[str, Any]) -> Prediction:
        got = self.ledgers.predict(NODE, pod, pod_shape(pod), pod["metadata"]["uid"])
        assert got is not None
        return got

    def admit(self, pod: dict[str, Any], own: bool, check: bool = True) -> tuple[Prediction, PodAdmission]:
        """Predict, admit and observe one pod; with ``check`` the prediction must match kubelet."""
        pod = copy.deepcopy(pod)
        uid = pod["metadata"]["uid"]
        pod["spec"]["schedulerName"] = SCHEDULER if own else "default-scheduler"
        notes = pod["metadata"].setdefault("annotations", {})
        got = self.predict(pod)
        if own and got.outcome is Outcome.PLACED:
            self.ledgers.book(uid, NODE, got, pod)
            self.booked.add(uid)
            notes[NUMA_PREDICTED] = encode_prediction(got.record(self.profile.generation))
        record = check_agreement(self.sim, pod, got) if check else self.sim.admit(pod)
        if not record.admitted:
            self.ledgers.on_pod_deleted(pod)
            self.booked.discard(uid)
            return got, record
        pod["spec"]["nodeName"] = NODE
        self.ledgers.on_pod(pod)  # bound, not observed yet
        held = held_of(self.sim, record)
        if holds_anything(held) or NUMA_PREDICTED in notes:
            placement = placement_of(
                held, {c.cpu: c.numa for c in self.profile.cpus}, self.profile.generation
            )
            notes[NUMA_PLACEMENT] = encode_placement(placement)
            self.ledgers.on_pod(pod)
        self.pods.append(pod)
        return got, record

    def delete(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        for manager in (self.sim.devices, self.sim.cpus, self.sim.memory):
            if manager is not None:
                manager.release(uid)
        self.sim.admitted.remove(uid)
        self.ledgers.on_pod_deleted(pod)
        self.pods.remove(pod)

    def kubelet_state(self) -> tuple[object, ...]:
        """What kubelet holds: the CPUs taken since idle, GPUs (total, free) per bucket, memory."""
        ledger = self.sim.ledger(self.profile.generation)
        memory = self.sim.memory_ledger()
        devices = ledger.device_counts(GPU)
        return self.idle[0] - self.sim.cpus.available(), devices, memory.state_key() if memory else None

    def ledger_state(self, ledgers: NumaLedgers | None = None) -> tuple[object, ...]:
        """The same, as the scheduler's NUMA ledger books it."""
        entry = (ledgers or self.ledgers).nodes[NODE]
        ledger = entry.ledger
        assert ledger is not None and entry.unbooked == 0
        assert self.idle[1] is not None
        memory = ledger.memory.state_key() if ledger.memory is not None else None
        return self.idle[1] - ledger.free_cpus, ledger.device_counts(GPU), memory


def _gpu_only(m: Machine) -> Machine:
    """The machine without the second plugin's NICs: the scheduler's ledger keeps its GPUs only."""
    return dataclasses.replace(m, devices=tuple(d for d in m.devices if d[0] == GPU))


def _without_nics(pod: dict[str, Any]) -> dict[str, Any]:
    for section in ("initContainers", "containers"):
        for c in pod["spec"].get(section) or ():
            for part in c["resources"].values():
                part.pop(NIC, None)
    return pod


def _guaranteed(
    name: str, init: tuple[tuple[str, str, int], ...], apps: tuple[tuple[str, str, int], ...]
) -> dict[str, Any]:
    spec = {
        "initContainers": [_container(n, "Guaranteed", cpu, g, False) for n, cpu, g in init],
        "containers": [_container(n, "Guaranteed", cpu, g, False) for n, cpu, g in apps],
    }
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": spec}


def _machine(**changes: Any) -> Machine:
    """2 NUMA nodes x 3 CPUs (no SMT), CPU 0 reserved, one GPU on NUMA 0, single-numa-node."""
    base: dict[str, Any] = {
        "cores_per_numa": 3,
        "threads": 1,
        "devices": ((GPU, 0, 1, 0),),
        "tm_policy": "single-numa-node",
    }
    return _case(**(base | changes))


def _pod_a() -> dict[str, Any]:
    """Init 2 CPUs, app 1 (reused from them): NUMA 0's two free CPUs, one of them held by the init
    container alone."""
    return _guaranteed("a", (("init", "2", 0),), (("app", "1", 0),))


def _pod_b() -> dict[str, Any]:
    """1 CPU and the GPU on NUMA 0: kubelet (single-numa-node) admits it only with a CPU free there."""
    return _guaranteed("b", (), (("c", "1", 1),))


def test_init_cpus_stay_booked_when_the_placement_shows_the_app_only(plugin: Plugin) -> None:
    """The audit's case: the placement lists the app's CPU only; the ledger kept the init
    container's other CPU beside it, so pod B is not predicted onto NUMA 0 (where kubelet rejects
    it, TopologyAffinityError: the ledger built from the placement alone showed that CPU free)."""
    for own in (True, False):
        chain = Chain(_machine(), plugin)
        _got, record = chain.admit(_pod_a(), own)
        init, app = record.containers
        assert init.cpus == {1, 2} and app.cpus < init.cpus
        assert [c.name for c in held_of(chain.sim, record).containers] == ["app"]
        rec = chain.ledgers.nodes[NODE].records["uid-a"]
        assert rec.source is Source.PLACEMENT and rec.usage.cpus == app.cpus
        assert rec.kept == NumaUsage(init.cpus - app.cpus)
        assert chain.ledger_state() == chain.kubelet_state()
        assert chain.ledgers.free_cpus(NODE) == frozenset({3, 4, 5})
        got, b = chain.admit(_pod_b(), own)  # checked against kubelet
        assert (got.outcome, got.reason, b.admitted) == (Outcome.REJECT, "TopologyAffinityError", False)


def test_the_leftovers_go_with_the_pod(plugin: Plugin) -> None:
    chain = Chain(_machine(), plugin)
    chain.admit(_pod_a(), own=True)
    chain.delete(chain.pods[0])
    assert chain.ledgers.free_cpus(NODE) == frozenset(range(1, 6))
    assert chain.ledger_state() == chain.kubelet_state()
    got, b = chain.admit(_pod_b(), own=True)
    assert got.outcome is Outcome.PLACED and b.admitted


def test_a_restarted_scheduler_books_the_leftovers_again(plugin: Plugin) -> None:
    """After a restart the ledger is rebuilt from the annotations: an own pod's leftovers from its
    ``numa-predicted``; another scheduler's from a replay of its spec on the node with its
    placement free, as its prediction would have been made (pods listed before their node replay
    on every placement booked, exact here, not in general)."""
    for own in (True, False):
        chain = Chain(_machine(cores_per_numa=4), plugin)
        chain.admit(_guaranteed("x", (("init", "3", 0),), (("app", "1", 0),)), own)
        chain.admit(_guaranteed("y", (("init", "2", 0), ("init2", "1", 0)), (("app", "1", 0),)), own)
        want = chain.kubelet_state()
        assert chain.ledger_state() == want
        for pods_first in (False, True):
            ledgers = chain.rebuilt(pods_first)
            assert chain.ledger_state(ledgers) == want, (own, pods_first)
            assert all(
                r.source is Source.PLACEMENT and r.pod is None for r in ledgers.nodes[NODE].records.values()
            )


def _init_pod(name: str) -> dict[str, Any]:
    """An own GPU pod: init 2 CPUs, app 1 CPU and a GPU (on the ledger tests' node)."""
    p = _pod(name, cpus=1, gpus=1)
    limits = {"cpu": "2", "memory": "1Gi"}
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": limits, "requests": limits}}]
    p["spec"]["containers"][0]["name"] = "app"
    return p


def _placement(
    container: str, cpus: set[int], numa: int, devices: tuple[str, ...] = (), bucket: int | None = None
) -> str:
    """One container's placement, its ``devices`` listed under ``bucket`` (default: ``numa``)."""
    held = {GPU: {numa if bucket is None else bucket: devices}} if devices else {}
    placed = ContainerPlacement(container, frozenset({numa}), frozenset(cpus), held)
    return encode_placement(PodPlacement(1, (placed,)))


def test_a_placement_wins_over_a_missed_guess_of_the_leftovers() -> None:
    """A prediction that missed (kubelet put the pod on NUMA 1) leaves the init container's leftover
    where the prediction had it (NUMA 0): both its CPUs, as the app's CPU kubelet lists is not one
    of them (whether kubelet's app reused its init container's CPUs is not in the placement; taking
    the prediction's reuse for kubelet's could book fewer CPUs than kubelet holds, review2 R3). A
    later placement holding one of them is the truth: it is booked, the guess yields, and the node
    keeps answering (never `unknown`); a rebuild with room again books the guess again."""
    scheduler, _ = _scheduler(_node())
    p = _init_pod("p")
    node, _fitted, _failed, numa = _plan(scheduler, p)
    prediction = numa.predictions[node]
    assert prediction is not None and [c.cpus for c in prediction.containers] == [{1, 2}, {1}]
    scheduler.numa.book("uid-p", "n1", prediction, p)
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["annotations"][NUMA_PLACEMENT] = _placement("app", {4}, 1, ("n1-g1-0",))
    scheduler._pod_seen(p)
    rec = scheduler.numa.nodes["n1"].records["uid-p"]
    # the init container's CPUs beside the app's, where the prediction had them
    assert rec.kept == NumaUsage(frozenset({1, 2})) and rec.usage.devices == {GPU: {1: 1}}
    assert scheduler.numa.free_cpus("n1") == {3, 5, 6, 7}
    foreign = _pod("f", cpus=1, gpus=0, scheduler="default-scheduler", node="n1")
    foreign["metadata"]["annotations"][NUMA_PLACEMENT] = _placement("main", {1}, 0)
    scheduler._pod_seen(foreign)
    entry = scheduler.numa.nodes["n1"]
    assert entry.unbooked == 0 and entry.records["uid-f"].held is not None
    assert entry.records["uid-p"].held == rec.usage.plus(NumaUsage(frozenset({2})))  # yielded
    assert scheduler.numa.free_cpus("n1") == {3, 5, 6, 7}
    scheduler._pod_gone(foreign)
    scheduler.numa.on_node_deleted("n1")  # a rebuild
    scheduler._node_seen(_node())
    assert entry.records["uid-p"].held == rec.usage.plus(rec.kept)
    assert scheduler.numa.free_cpus("n1") == {3, 5, 6, 7}


def _flat_node(numa: int) -> dict[str, Any]:
    """The ledger tests' node with one GPU, registered on NUMA ``numa`` (-1: none)."""
    node = _node()
    gpu = DeviceInfo("GPU-flat", 0, 10, 8000, 100, "NVIDIA-A100", numa, MODE_HAMI_CORE, True)
    node["metadata"]["annotations"][ann.NODE_REGISTER] = ann.encode_node_devices([gpu])
    return node


def test_a_gpu_without_numa_topology_is_booked_alike_by_prediction_and_placement() -> None:
    """kubelet lists a GPU its plugin sends no topology for under -1 (s24 F2). Registered without a
    NUMA node, the prediction books it in -1: the filter's record carries it (its patch failed on
    it before) and the placement books it there too. Registered on a NUMA node (HAMi's register
    says 0 for none), the placement's replica is booked in its GPU's bucket, as the prediction
    books it — also when the pod comes before its node."""
    for registered in (NO_TOPOLOGY, 0):
        scheduler, _ = _scheduler(_flat_node(registered))
        p = _filtered(scheduler, "p")
        assert json.loads(p["metadata"]["annotations"][NUMA_PREDICTED])["v"] == (
            3 if registered == NO_TOPOLOGY else 1
        )
        booked = scheduler.numa.nodes["n1"].ledger
        assert booked is not None and booked.device_counts(GPU) == {registered: (10, 9)}
        p["spec"]["nodeName"] = "n1"
        p["metadata"]["annotations"][NUMA_PLACEMENT] = _placement("main", {1, 2}, 0, ("GPU-flat-3",), -1)
        scheduler._pod_seen(p)
        entry = scheduler.numa.nodes["n1"]
        assert entry.records["uid-p"].source is Source.PLACEMENT and entry.unbooked == 0
        assert entry.ledger is not None and entry.ledger.device_counts(GPU) == {registered: (10, 9)}
        restarted = NumaLedgers(SCHEDULER, GPU, lambda: float(NOW), booked_on=scheduler._booked_on)
        restarted.on_pod(p)  # before its node: the replica is bucketed once the node's GPUs are known
        restarted.on_node(_flat_node(registered), scheduler.ledger.nodes["n1"].infos)
        ledger = restarted.nodes["n1"].ledger
        assert ledger is not None and ledger.device_counts(GPU) == {registered: (10, 9)}


def test_another_plugins_devices_in_a_placement_leave_the_node_answering() -> None:
    """The ledger keeps the scheduler's GPUs only: a placement holding another plugin's device (a
    NIC, with or without topology) could not be booked, and the node answered `unknown` while the
    pod lived."""
    scheduler, _ = _scheduler(_node())
    for name, numa in (("nic", 0), ("key", NO_TOPOLOGY)):
        f = _pod(name, cpus=1, gpus=0, scheduler="default-scheduler", node="n1")
        f["spec"]["containers"][0]["resources"]["limits"]["example.com/dev"] = "1"
        held = {"example.com/dev": {numa: (f"{name}-0",)}}
        placed = ContainerPlacement("main", frozenset({0}), frozenset({1 if name == "nic" else 2}), held)
        f["metadata"]["annotations"][NUMA_PLACEMENT] = encode_placement(PodPlacement(1, (placed,)))
        scheduler._pod_seen(f)
    assert scheduler.numa.nodes["n1"].unbooked == 0
    assert scheduler.numa.free_cpus("n1") == {3, 4, 5, 6, 7}


def test_init_memory_is_kept_as_kubelet_shrinks_it(plugin: Plugin) -> None:
    """Memory Manager Static: the init container's block, shrunk by what the app reused, is held
    until the pod ends; the placement shows the app's block only (at its full size)."""
    m = _machine(cores_per_numa=4, memory_gib=(8, 8), hugepages=(0, 0), reserved_mib=(512, 0))
    chain = Chain(m, plugin)
    pod = _guaranteed("m", (("init", "2", 0),), (("app", "1", 0),))
    pod["spec"]["initContainers"][0]["resources"]["limits"]["memory"] = "4Gi"
    pod["spec"]["initContainers"][0]["resources"]["requests"]["memory"] = "4Gi"
    _got, record = chain.admit(pod, own=True)
    assert record.container("init").memory == {"memory": ((0,), 4 * GI - 64 * (1 << 20))}
    rec = chain.ledgers.nodes[NODE].records["uid-m"]
    assert rec.usage.memory[0].size == 64 * (1 << 20) and rec.kept.memory[0].size == 4 * GI - 64 * (1 << 20)
    assert chain.ledger_state() == chain.kubelet_state()
    chain.delete(chain.pods[0])
    assert chain.ledger_state() == chain.kubelet_state()


# -- review2 (R1-R5): restarts, rebuilds, memory groups, a placement that changes ---------------


def _static(**changes: Any) -> Machine:
    """2 NUMA nodes x 4 CPUs, CPU 0 reserved, no GPU, best-effort, Memory Manager Static (4 GiB per
    node, 256 MiB reserved on NUMA 0)."""
    base: dict[str, Any] = {
        "cores_per_numa": 4,
        "threads": 1,
        "devices": (),
        "tm_policy": "best-effort",
        "memory_gib": (4, 4),
        "hugepages": (0, 0),
        "reserved_mib": (256, 0),
    }
    return _case(**(base | changes))


def _limits(**amounts: str) -> dict[str, Any]:
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _foreign(
    name: str, init: dict[str, dict[str, Any]], apps: dict[str, dict[str, Any]], *placed: ContainerPlacement
) -> dict[str, Any]:
    """Another scheduler's pod bound to the node, with its placement (none when nothing is placed)."""
    spec = {
        "schedulerName": "default-scheduler",
        "nodeName": NODE,
        "initContainers": [{"name": n, "resources": r} for n, r in init.items()],
        "containers": [{"name": n, "resources": r} for n, r in apps.items()],
    }
    notes = {NUMA_PLACEMENT: encode_placement(PodPlacement(1, placed))} if placed else {}
    meta = {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": notes}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}


def test_a_kept_part_no_replay_finds_leaves_the_rebuild_whole() -> None:
    """review2 R1. F's app is pinned on NUMA 0-1, then G's on NUMA 1 alone (kubelet allows it). A
    restarted scheduler sees the pods before their node: F's kept part is replayed with F's
    placement taken out of the ledger, which raised (the 0-1 block could not be released once a
    block on NUMA 1 was pinned after it): the rebuild stopped, the replay H behind it stayed unbooked
    and uncounted, at every re-stamp. Now every record is booked; F's kept part, which no replay on
    the node finds (its app's 0-1 mask breaks G's group), is unknown, counted and not replayed at
    every rebuild."""
    profile = profile_of(_static())
    f = _foreign(
        "f",
        {"init": _limits(cpu="2", memory="1Gi")},
        {"app": _limits(cpu="1", memory="6Gi")},
        ContainerPlacement(
            "app", frozenset({0, 1}), frozenset({1}), {}, (MemoryBlock(frozenset({0, 1}), "memory", 6 * GI),)
        ),
    )
    g = _foreign(
        "g",
        {},
        {"main": _limits(cpu="1", memory="64Mi")},
        ContainerPlacement(
            "main", frozenset({1}), frozenset({5}), {}, (MemoryBlock(frozenset({1}), "memory", 64 << 20),)
        ),
    )
    h = _foreign("h", {}, {"main": _limits(cpu="2", memory="64Mi")})
    ledgers = NumaLedgers(SCHEDULER, GPU, lambda: float(NOW), booked_on=lambda uid: None)
    for p in (f, g, h):
        ledgers.on_pod(p)
    node: dict[str, Any] = {
        "metadata": {"name": NODE, "annotations": {NUMA_PROFILE: encode_profile(profile)}}
    }
    ledgers.on_node(node, None)
    entry = ledgers.nodes[NODE]
    for _restamp in range(2):
        assert entry.ledger is not None and entry.unbooked == 0 and entry.kept_unknown == 1
        assert all(r.booked for r in entry.records.values())
        assert entry.records["uid-f"].kept == NumaUsage() and entry.records["uid-h"].source is Source.REPLAY
        assert len(frozenset(range(1, 8)) - entry.ledger.free_cpus) == 4  # F's app, G, H's two
        profile = dataclasses.replace(profile, observed_at=profile.observed_at + 600)
        node["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
        ledgers.on_node(node, None)


def _r2_machine() -> Machine:
    """3 NUMA nodes x 3 cores x 2 threads, best-effort, pod scope, Static memory with 1Gi pages on
    NUMA 0, GPUs on NUMA 0 and 2 (the review's sweep seed 4185)."""
    return _case(
        numa=3,
        cores_per_numa=3,
        reserved=frozenset({3, 6, 8}),
        devices=((GPU, 0, 4, 0), (GPU, 2, 2, 0)),
        distances=((10, 27, 24), (27, 10, 24), (24, 24, 10)),
        tm_policy="best-effort",
        scope="pod",
        prefer_closest=True,
        cores_per_uncore=2,
        distribute_numa=True,
        hamid_gpus=True,
        memory_gib=(4, 2, 6),
        hugepages=(2, 0, 0),
        reserved_mib=(256, 0, 0),
    )


def _own(name: str, init: dict[str, dict[str, Any]], apps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec = {
        "schedulerName": SCHEDULER,
        "initContainers": [{"name": n, "resources": r} for n, r in init.items()],
        "containers": [{"name": n, "resources": r} for n, r in apps.items()],
    }
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": spec}


def test_init_memory_is_pinned_before_the_apps_as_kubelet_pins_it(plugin: Plugin) -> None:
    """review2 R2. kubelet pins the init container's memory on NUMA 0+2 and then the app's on NUMA
    2 alone: node 2's group is NUMA 2 (a node's group is the mask of the last block pinned on it).
    The ledger booked the kept init block after the placement's app block, so node 2's group was
    0+2, and the next pod was predicted on NUMA 0+2 where kubelet pins it on NUMA 2."""
    chain = Chain(_r2_machine(), plugin)
    pod = _own(
        "p",
        {"init": _limits(cpu="2", memory="3Gi", **{"hugepages-1Gi": "1Gi", GPU: "1"})},
        {"app": _limits(cpu="1", memory="2Gi", **{GPU: "1"})},
    )
    _got, record = chain.admit(pod, own=True)
    init, app = record.containers
    assert init.memory["memory"][0] == (0, 2) and app.memory["memory"][0] == (2,)
    assert chain.ledger_state() == chain.kubelet_state()
    for pods_first in (False, True):
        assert chain.ledger_state(chain.rebuilt(pods_first)) == chain.kubelet_state()
    got, _next = chain.admit(_own("q", {}, {"main": _limits(cpu="1", memory="1Gi", **{GPU: "1"})}), own=True)
    assert got.containers[0].memory[0].numa == {2}  # checked against kubelet by admit


def test_a_restarted_scheduler_books_no_fewer_init_cpus_than_kubelet_holds(plugin: Plugin) -> None:
    """review2 R3 (the review's sweep seed 3094). Another scheduler's pod P1: kubelet gave its init
    container CPUs 3 and 15 and its app CPU 14, not reused: kubelet holds 3 CPUs. A scheduler
    restarted after P0 went replays P1 on the emptier node: init 0 and 12, the app reusing 0. The
    kept part was sized by the replay's reuse (one CPU): the ledger booked 2, and a 6-CPU pod was
    predicted on NUMA 0, where kubelet has 5 CPUs free. A listed CPU now counts as reused only
    where the replay's init container held it: its place is still the replay's, its size kubelet's."""
    machine = _case(
        numa=3,
        numa_per_socket=0,
        cores_per_numa=4,
        threads=2,
        reserved=frozenset({5, 17, 21}),
        devices=((GPU, 0, 2, 0), (GPU, 1, 1, 1), (GPU, 2, 3, 0)),
        distances=((10, 20, 29), (20, 10, 23), (29, 23, 10)),
        tm_policy="restricted",
        scope="pod",
        prefer_closest=True,
        align_uncore=True,
        hamid_gpus=True,
    )
    chain = Chain(machine, plugin)
    p0 = _own(
        "p0",
        {
            "init0": _limits(cpu="4", memory="256Mi", **{GPU: "1"}),
            "init1": _limits(cpu="2", memory="2Gi", **{GPU: "1"}),
        },
        {"app0": _limits(cpu="2", memory="64Mi"), "app1": _limits(cpu="1", memory="512Mi", **{GPU: "1"})},
    )
    p0["spec"]["initContainers"][1]["restartPolicy"] = "Always"
    chain.admit(p0, own=True)
    _got, p1 = chain.admit(
        _own("p1", {"init0": _limits(cpu="2", memory="1Gi")}, {"app0": _limits(cpu="1", memory="256Mi")}),
        own=False,
    )
    assert [c.cpus for c in p1.containers] == [{3, 15}, {14}]
    chain.delete(chain.pods[0])
    chain.booked.discard("uid-p0")
    assert chain.ledger_state() == chain.kubelet_state()  # the bind-time replay was kubelet's
    chain.ledgers = chain.rebuilt(pods_first=False)
    assert chain.ledgers.nodes[NODE].records["uid-p1"].kept.cpus == {0, 12}  # the replay's place
    held = [state[0] for state in (chain.ledger_state(), chain.kubelet_state())]
    assert all(isinstance(cpus, frozenset) and len(cpus) == 3 for cpus in held)  # kubelet's size
    chain.admit(_own("q", {}, {"main": _limits(cpu="6", memory="64Mi")}), own=True)  # on NUMA 1


def test_a_placement_read_during_admission_is_measured_again(plugin: Plugin) -> None:
    """review2 R4. kubelet's List shows a pod while its admission allocates container by container,
    so the node agent may publish a placement holding nothing, then the full one. The kept part was
    measured once, against the first: the GPU the app reused from the init container was booked
    twice. It is now measured again from the booked prediction whenever the placement changes."""
    chain = Chain(_machine(devices=((GPU, 0, 2, 0),)), plugin)
    pod = _guaranteed("a", (("init", "2", 1),), (("app", "1", 1),))
    pod["spec"]["schedulerName"] = SCHEDULER
    got = chain.predict(pod)
    chain.ledgers.book("uid-a", NODE, got, pod)
    chain.booked.add("uid-a")
    notes = pod["metadata"].setdefault("annotations", {})
    notes[NUMA_PREDICTED] = encode_prediction(got.record(chain.profile.generation))
    record = chain.sim.admit(pod)
    assert record.admitted
    pod["spec"]["nodeName"] = NODE
    chain.ledgers.on_pod(pod)
    empty = ContainerPlacement("app", frozenset(), frozenset(), {})
    notes[NUMA_PLACEMENT] = encode_placement(PodPlacement(chain.profile.generation, (empty,)))
    chain.ledgers.on_pod(copy.deepcopy(pod))
    cpus = {c.cpu: c.numa for c in chain.profile.cpus}
    full = placement_of(held_of(chain.sim, record), cpus, chain.profile.generation)
    notes[NUMA_PLACEMENT] = encode_placement(full)
    chain.ledgers.on_pod(copy.deepcopy(pod))
    chain.pods.append(pod)
    assert chain.ledger_state() == chain.kubelet_state()  # 2 CPUs, 1 of 2 GPUs
    assert chain.ledgers.nodes[NODE].records["uid-a"].kept.devices == {}


def _r5_chain(plugin: Plugin) -> Chain:
    """X (another scheduler's, 2 CPUs) on NUMA 0, A (another scheduler's: init 2 CPUs, app 500m, so
    its List entry holds nothing and it never gets a placement) on NUMA 1's 3 and 4; X goes."""
    chain = Chain(_machine(devices=((GPU, 1, 1, 0),)), plugin)
    chain.admit(_guaranteed("x", (), (("main", "2", 0),)), own=False)
    _got, a = chain.admit(_guaranteed("a", (("init", "2", 0),), (("app", "500m", 0),)), own=False)
    assert a.container("init").cpus == {3, 4}
    assert chain.ledgers.nodes[NODE].records["uid-a"].source is Source.REPLAY
    chain.delete(chain.pods[0])
    return chain


def test_a_pod_without_a_placement_stays_where_kubelet_admitted_it(plugin: Plugin) -> None:
    """review2 R5. Every rebuild (the profile's re-stamp, every 10 minutes) replayed A again on the
    ledger as it stood: with X gone its init CPUs moved to NUMA 0 in the ledger, not in kubelet, and
    B (2 CPUs and the GPU on NUMA 1, single-numa-node) was predicted placed where kubelet answers
    TopologyAffinityError. kubelet admits a pod once: a replay answered on the node's profile is
    not made again (after a restart, or a new profile generation, it is)."""
    chain = _r5_chain(plugin)
    chain.restamp()
    assert chain.ledger_state() == chain.kubelet_state()
    got, b = chain.admit(_guaranteed("b", (), (("main", "2", 1),)), own=True)  # checked against kubelet
    assert (got.outcome, b.admitted) == (Outcome.REJECT, False)


def test_a_replay_is_made_once_per_profile(plugin: Plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rebuild replayed every replay record, and a kept part still to be found, anew: a whole
    prediction each, forever for a pod whose replay never placed it (review2, cost note). A placed
    replay now stands (kubelet admitted the pod once), also over a new profile generation where it
    still fits; one not placed is made again once per profile generation, one the ledger could not
    answer (no ledger yet, a stale profile) at the next rebuild."""
    chain = _r5_chain(plugin)
    r = _guaranteed("r", (), (("main", "2", 1),))  # bound by another scheduler, rejected by the replay
    r["spec"] |= {"schedulerName": "default-scheduler", "nodeName": NODE}
    chain.ledgers.on_pod(r)
    assert chain.ledgers.nodes[NODE].records["uid-r"].held == NumaUsage()
    calls: list[str] = []
    real = predict

    def counted(*args: Any, **kwargs: Any) -> Prediction:
        calls.append(str(args[2]["metadata"]["name"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(numa_ledger, "predict", counted)
    for _restamp in range(3):
        chain.restamp()
    assert calls == []
    chain.profile = dataclasses.replace(chain.profile, generation=2)
    chain.ledgers.on_node(chain.node(), _infos(chain.machine))
    assert calls == ["r"]
    assert chain.ledger_state() == chain.kubelet_state()


#: Chains run: fewer than the single-arrival differential's examples, each admits several pods.
CHAIN_EXAMPLES = int(os.environ.get("HAMID_CHAIN_EXAMPLES", str(max(EXAMPLES // 3, 20))))


@seed(SEED)
@settings(
    max_examples=CHAIN_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    machine=machines(),
    earlier=st.lists(st.tuples(pods("earlier"), st.booleans()), max_size=4),
    arrival=pods("arrival"),
)
def test_the_ledger_books_what_kubelet_holds(
    plugin: Plugin, machine: Machine, earlier: list[tuple[dict[str, Any], bool]], arrival: dict[str, Any]
) -> None:
    """The audit's chain mode: pods predicted (own, or replayed: another scheduler's), admitted by
    the simulated kubelet and observed through its PodResources as the node agent reads it. While
    every prediction is definite, the scheduler's ledger equals kubelet's state (CPUs, GPUs per
    bucket, memory) after each admission, after a restart (node first; pods first too where every
    pod carries its own prediction) and after a deletion (and the profile's re-stamp after it), and
    the arrival is predicted as kubelet admits it."""
    chain = Chain(_gpu_only(machine), plugin)
    definite = True
    for i, (pod, own) in enumerate(earlier):
        pod = _without_nics(pod) | {"metadata": {"name": f"e{i}", "namespace": "default", "uid": f"uid-e{i}"}}
        got, _record = chain.admit(pod, own, check=definite)
        definite = definite and got.outcome is not Outcome.UNKNOWN
        if definite:
            assert chain.ledger_state() == chain.kubelet_state()
    if not definite:
        return
    want = chain.kubelet_state()
    every_own = all(NUMA_PREDICTED in p["metadata"]["annotations"] for p in chain.pods)
    for pods_first in (False, True) if every_own else (False,):
        assert chain.ledger_state(chain.rebuilt(pods_first)) == want
    got, _record = chain.admit(_without_nics(arrival), own=True)
    assert chain.ledger_state() == chain.kubelet_state() or got.outcome is Outcome.UNKNOWN
    if got.outcome is not Outcome.UNKNOWN and chain.pods and not chain.machine.memory_gib:
        chain.delete(chain.pods[0])  # (a memory state rebuilt after a release is a known gap)
        assert chain.ledger_state() == chain.kubelet_state()
        chain.restamp()  # the live ledger's rebuild after a deletion replays nothing anew
        assert chain.ledger_state() == chain.kubelet_state()
