"""The cluster ``bench/trace.py`` replays the trace on, in one process and without HTTP.

Every decision is made by product code or by the simulator, called in-process:

* the webhook: :meth:`hamid.scheduler.webhook.Admission.judge` (``review_pod``), its JSON patch applied;
* kube-scheduler's part: ``NodeResourcesFit`` (cpu, memory, pods) and, for pods hamid does not
  schedule, the default profile's scores and ``selectHost`` (:mod:`hamidsim.kube_scheduler`);
* hamid's filter and bind: :meth:`Filter.filter` and :meth:`Binder.bind`, the extender verbs
  behind ``/filter`` and ``/bind`` (node lock and Binding included), over the scheduler's own
  watch caches;
* the plugin: one :class:`~hamid.plugin.service.DevicePluginService` per node (its
  ``GetPreferredAllocation`` and ``Allocate`` handlers, with the real
  :class:`~hamid.plugin.allocator.Allocator` and NUMA mismatch policy), whose refits go to the
  scheduler's ``/refit`` handler (:class:`~hamid.scheduler.refit.RefitService`);
* kubelet: the simulator's device manager, CPU manager and Topology Manager
  (:func:`hamidsim.kubelet.admission.admit_pod`) on a NUMA model of the node; the plugin's
  ``hamid.io/numa-placement`` is written from what kubelet assigned (PodResources' view).

What is left out: HTTP and TLS, the API server's validation (:mod:`replay.api` stands in for it),
caller authentication of ``/refit``, Events, the kubelet's status and PodResources servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from hamid.fit.fit import PodFitSpec
from hamid.kube.client import KubeClient
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model.devices import ContainerDevices
from hamid.model.kube import JSON
from hamid.model.nodeconfig import NodeConfig
from hamid.model.numa import (
    HIDE_STEER,
    NUMA_PLACEMENT,
    NUMA_PROFILE,
    CpuInfo,
    KubeletPolicies,
    ReplicaHiding,
    encode_placement,
    encode_profile,
)
from hamid.model.refit import REFIT_TIMEOUT_S, RefitRequest
from hamid.plugin.allocator import Allocator
from hamid.plugin.cpu_topology import CpuTopology as PluginCpuTopology
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.hamicore_answer import HamiCoreSettings
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.numa_policy import NumaMismatchPolicy, log_mismatch
from hamid.plugin.numa_publisher import build_profile, holds_anything, placement_of
from hamid.plugin.options import hide_rule
from hamid.plugin.podresources_client import held_pod
from hamid.plugin.pods import NodePods
from hamid.plugin.refit_client import RefitRefused
from hamid.plugin.replica_room import ReplicaRoom
from hamid.plugin.service import DevicePluginService, list_response
from hamid.plugin.steering import binding_needs
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.extender_json import BindArgs, FilterArgs
from hamid.scheduler.refit import RefitService
from hamid.scheduler.refit.auth import Caller
from hamidsim.kube_scheduler import NodeRequests, NodeRoomIndex, NodeSampler, Resources
from hamidsim.kubelet.admission import Admitter, admit_pod
from hamidsim.kubelet.assignment import PodAdmission
from hamidsim.kubelet.cadvisor import CpuTopology, MachineInfo, numa_nodes_of
from hamidsim.kubelet.config import KubeletConfig
from hamidsim.kubelet.devicemanager import DeviceManager, ResourceState
from hamidsim.kubelet.node import build_managers
from hamidsim.kubelet.podresources import PodResourcesView
from replay.api import MemoryApi
from replay.pods import MILLI, RESOURCES, TraceNode, TracePod, aligned_shape

RESOURCE = RESOURCES.resource_count_name
#: vGPU replicas per card (twenty 5 % shares fit one GPU; the trace's smallest share is 5 %).
SPLIT = 20
#: kubelet's default ``maxPods``.
MAX_PODS = 110
MIB = 1024 * 1024
#: ``--numa``: the Topology Manager policy of every node (``off``: no topology at all).
TOPOLOGY_POLICIES = {"off": "none", "on": "restricted", "strict": "single-numa-node"}
#: Nodes with at most this many CPUs have one NUMA node (the shared README's model).
SINGLE_NUMA_MAX_CPUS = 8
#: GPU memory per trace model (MiB); shares ask for a percentage, so this only scales the fit.
GPU_MEMORY_MIB = {"V100M32": 32768, "A10": 24576, "G3": 32768}
DEFAULT_GPU_MEMORY_MIB = 16384


@dataclasses.dataclass(frozen=True, slots=True)
class NumaLayout:
    """The NUMA model of one trace node: CPUs and GPUs split evenly over its NUMA nodes.

    NUMA on: one extra CPU (the highest id, on NUMA 0) is kubelet's ``reservedSystemCPUs`` (the
    static CPU manager needs one), so the allocatable CPUs are exactly the trace's.
    """

    cpus: int
    numa_cpus: Mapping[int, frozenset[int]]
    reserved: frozenset[int]
    gpu_numa: tuple[int, ...]

    @classmethod
    def of(cls, node: TraceNode, numa: bool) -> NumaLayout:
        """The layout of ``node`` (``numa`` False: one NUMA node, nothing reserved)."""
        cpus = node.cpu_milli // MILLI
        count = 2 if numa and cpus > SINGLE_NUMA_MAX_CPUS else 1
        half = cpus // count
        numa_cpus = {
            n: frozenset(range(n * half, cpus if n == count - 1 else (n + 1) * half)) for n in range(count)
        }
        reserved = frozenset({cpus}) if numa else frozenset()
        numa_cpus[0] |= reserved
        gpu_numa = tuple(g * count // node.gpus for g in range(node.gpus))
        return cls(cpus, numa_cpus, reserved, gpu_numa)

    def machine(self, memory_mib: int) -> MachineInfo:
        """The machine as kubelet's cAdvisor sees it (one thread per core, a socket per NUMA node)."""
        topology = CpuTopology.from_numa(self.numa_cpus)
        return MachineInfo(numa_nodes_of(topology), self.reserved, topology, f"{memory_mib}Mi", MAX_PODS)

    def profile(self, topology_policy: str, hide_replicas: ReplicaHiding | None = None) -> str:
        """The ``hamid.io/numa-profile`` the plugin's NUMA publisher writes for this node
        (``hide_replicas``: which free replicas the plugin hides)."""
        infos = tuple(
            sorted(
                (CpuInfo(cpu, cpu, numa, numa) for numa, cpus in self.numa_cpus.items() for cpu in cpus),
                key=lambda info: info.cpu,
            )
        )
        topology = PluginCpuTopology(tuple(sorted(self.numa_cpus)), infos, None)
        policies = KubeletPolicies(cpu_manager_policy="static", topology_manager_policy=topology_policy)
        allocatable = frozenset(c.cpu for c in infos) - self.reserved
        content = build_profile(topology, policies, allocatable, hide_replicas=hide_replicas)
        return encode_profile(dataclasses.replace(content, generation=1, observed_at=int(time.time())))


class _Stream:
    """One gRPC call's stream, in process: the request in, the answer out."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.response: Any = None

    async def recv_message(self) -> Any:
        return self.request

    async def send_message(self, message: Any) -> None:
        self.response = message


class LocalEndpoint:
    """kubelet's endpoint to the device plugin, calling the plugin's service handlers in process."""

    def __init__(self, resource: str, service: DevicePluginService) -> None:
        self.resource = resource
        self.service = service
        self.options = service.options()
        self.socket = "in-process"
        self.stopped = False
        self.updates = 0

    async def preferred(self, request: Any) -> Any:
        stream = _Stream(request)
        await self.service.GetPreferredAllocation(stream)  # type: ignore[arg-type]
        return stream.response

    async def allocate(self, request: Any) -> Any:
        stream = _Stream(request)
        await self.service.Allocate(stream)  # type: ignore[arg-type]
        return stream.response

    async def pre_start(self, devices: list[str]) -> None:
        return None


class _TrustedNode:
    """``/refit`` caller authentication stands aside: the in-process plugin speaks for its node."""

    async def authenticate(self, request: Any, node_name: str) -> Caller:
        return Caller(node_name, "in-process", f"system:node:{node_name}")


class LocalRefitClient:
    """The plugin's refit client, in process: the scheduler's ``/refit`` handler, outcomes counted."""

    def __init__(self, service: RefitService) -> None:
        self.service = service
        self.outcomes: dict[str, int] = {}

    async def refit(self, request: RefitRequest) -> ContainerDevices:
        deadline = asyncio.get_running_loop().time() + REFIT_TIMEOUT_S
        outcome = await self.service.refit(request, None, deadline)  # type: ignore[arg-type]
        self.outcomes[outcome.outcome] = self.outcomes.get(outcome.outcome, 0) + 1
        if not outcome.response.succeeded:
            raise RefitRefused(outcome.response.failure_reason)
        return outcome.response.devices()


class _NoEvents:
    """Events are not recorded (nothing reads them here)."""

    async def record(self, *_: Any, **__: Any) -> None:
        return None


class ShapeCheck:
    """Which pod shapes fit one NUMA node of some node whose model they accept (memoised)."""

    def __init__(self, layouts: Iterable[tuple[str, NumaLayout]], spans: bool = False) -> None:
        """``layouts``: every node's GPU model and NUMA layout; ``spans``: kubelet admits an aligned
        pod across NUMA nodes on an idle node with fewer GPUs per NUMA node than it asks (the
        plugin's ``span`` rule under ``restricted``)."""
        listed = list(layouts)
        self._numas = {
            (model, layout.gpu_numa.count(numa), len(cpus - layout.reserved))
            for model, layout in listed
            for numa, cpus in layout.numa_cpus.items()
        }
        #: (model, GPUs, GPUs of its widest NUMA node, CPUs of its widest NUMA node, CPUs) of every
        #: kind of node (assignable CPUs: the reserved one aside)
        self._nodes = {
            (
                model,
                len(layout.gpu_numa),
                max(Counter(layout.gpu_numa).values(), default=0),
                max(len(cpus - layout.reserved) for cpus in layout.numa_cpus.values()),
                layout.cpus,
            )
            for model, layout in listed
        }
        self.spans = spans
        self._memo: dict[tuple[int, int, int, str], bool] = {}

    def fits_one_numa(self, pod: TracePod) -> bool:
        """Whether one NUMA node holds the aligned pod's exclusive CPUs and its GPUs."""
        return self._one_numa_holds(pod, 1)

    def admissible(self, pod: TracePod) -> bool:
        """Whether one NUMA node holds the aligned pod's exclusive CPUs and its GPUs' replicas, so
        that kubelet can give it a preferred hint there, or (``spans``) an idle node of its model
        lets it span NUMA nodes (the trace bench files it never admissible when neither does)."""
        return self._one_numa_holds(pod, SPLIT) or (self.spans and self._spans_some_node(pod))

    def _spans_some_node(self, pod: TracePod) -> bool:
        """Whether some idle node of the pod's model admits it across NUMA nodes: it asks more GPUs
        than any NUMA node has and more CPUs than any NUMA node assigns, within the node's."""
        models, cpus = pod.gpu_models, math.ceil(pod.cpu_milli / MILLI)
        return any(
            (models is None or model in models)
            and widest < pod.num_gpu <= gpus
            and numa_cpus < cpus <= node_cpus
            for model, gpus, widest, numa_cpus, node_cpus in self._nodes
        )

    def never_admissible(self, pod: TracePod, numa: str) -> bool:
        """Whether NUMA is on and the pod is aligned but no node could ever admit it."""
        return aligned_shape(pod, numa != "off") and not self.admissible(pod)

    def _one_numa_holds(self, pod: TracePod, per_gpu: int) -> bool:
        """Whether some NUMA node of a node of the pod's model has its whole CPUs and ``per_gpu``
        devices per GPU for its GPU count."""
        key = (per_gpu, pod.num_gpu, math.ceil(pod.cpu_milli / MILLI), pod.gpu_spec)
        if key not in self._memo:
            models = pod.gpu_models
            self._memo[key] = any(
                (models is None or model in models) and gpus * per_gpu >= key[1] and cpus >= key[2]
                for model, gpus, cpus in self._numas
            )
        return self._memo[key]


class SimNode:
    """One GPU node: hamid's plugin (inventory, allocator, service) and kubelet's managers."""

    def __init__(
        self,
        trace: TraceNode,
        api: MemoryApi,
        numa: str,
        hook_path: str,
        refit: LocalRefitClient | None,
        hide_replicas: str = "auto",
    ) -> None:
        self.trace = trace
        self.name = trace.name
        self.layout = NumaLayout.of(trace, numa != "off")
        self.topology_policy = TOPOLOGY_POLICIES[numa]
        config = KubeletConfig(
            cpu_manager_policy="none" if numa == "off" else "static",
            topology_manager_policy=self.topology_policy,
            reserved_system_cpus=self.layout.reserved or None,
        )
        log = get_logger("sim.kubelet").bind(node=self.name)
        self.cpus, settings = build_managers(self.layout.machine(trace.memory_mib), config)
        self.devices = DeviceManager(
            Path(hook_path),
            rpc_timeout=10.0,
            dial_timeout=10.0,
            endpoint_stop_grace=300.0,
            on_change=lambda: None,
            log=log,
        )
        self.admitter = Admitter(settings, self.devices, self.cpus, log)
        memory = GPU_MEMORY_MIB.get(trace.model, DEFAULT_GPU_MEMORY_MIB)
        gpus = [
            PhysicalGpu(
                f"GPU-{self.name}-{g}",
                g,
                trace.model,
                memory,
                numa_of if numa != "off" else None,
                f"0000:{g:02x}:00.0",
            )
            for g, numa_of in enumerate(self.layout.gpu_numa)
        ]
        node_config = NodeConfig(
            device_split_count=SPLIT, enable_numa_topology=numa != "off", enable_get_preferred_allocation=True
        )
        self.inventory = GpuInventory(gpus, node_config)
        self.gpu_numa = {g.uuid: self.layout.gpu_numa[g.index] for g in gpus}
        kube = cast(KubeClient, api)  # MemoryApi has the KubeClient verbs the plugin calls
        self.pods = NodePods(kube, self.name)
        #: The plugin's ``--hide-replicas`` (as :class:`~hamid.plugin.app.Plugin` wires it).
        self.room: ReplicaRoom | None = None
        rule = hide_rule(hide_replicas, node_config.enable_numa_topology)
        if rule is not None:
            self.room = ReplicaRoom(
                self.inventory, self.pods.pods, RESOURCE, rule, lambda: self.topology_policy
            )
        handler = log_mismatch if refit is None else NumaMismatchPolicy(refit)  # type: ignore[arg-type]
        allocator = Allocator(
            kube,
            self.pods,
            self.inventory,
            HamiCoreSettings(hook_path=hook_path),
            mismatch_handler=handler,
            on_allocated=self.room.allocated if self.room is not None else None,
        )
        self.endpoint = LocalEndpoint(
            RESOURCE, DevicePluginService(self.inventory, allocator, preferred_allocation=True)
        )
        state = self.devices.resources.setdefault(RESOURCE, ResourceState(RESOURCE))
        state.endpoint = self.endpoint  # type: ignore[assignment]
        self._sent = -1
        self.list_and_watch()
        self.active: dict[str, JSON] = {}

    def list_and_watch(self) -> None:
        """What the plugin's ``ListAndWatch`` stream does: send kubelet's device manager the device
        list again when the inventory changed (health, or a GPU's free replicas hidden or re-offered
        after bookings changed), after the plugin re-judged the node's bookings."""
        if self.room is not None:
            self.room.sync()
        if self.inventory.generation != self._sent:
            self._sent = self.inventory.generation
            self.devices._devices_updated(self.endpoint, list_response(self.inventory))  # type: ignore[arg-type]

    @property
    def allocatable(self) -> tuple[int, int, int]:
        """(milli-CPU, memory bytes, pods) as kubelet's node status reports them."""
        return self.layout.cpus * MILLI, self.trace.memory_mib * MIB, MAX_PODS

    def node_object(self, profiles: dict[tuple[int, int, str | None], str]) -> JSON:
        """The Node as the API holds it once kubelet and the plugin registered it (``profiles``:
        the NUMA profiles encoded so far, by CPUs and NUMA nodes: nodes alike share one)."""
        annotations = {ann.NODE_REGISTER: ann.encode_node_devices(self.inventory.device_infos())}
        if self.topology_policy != "none":
            rule = self.room.rule if self.room is not None else None
            shape = (self.layout.cpus, len(self.layout.numa_cpus), rule)
            if shape not in profiles:
                hides = ReplicaHiding(RESOURCE, rule) if rule is not None else None
                profiles[shape] = self.layout.profile(self.topology_policy, hides)
            annotations[NUMA_PROFILE] = profiles[shape]
        amounts = {
            "cpu": str(self.layout.cpus),
            "memory": f"{self.trace.memory_mib}Mi",
            "pods": str(MAX_PODS),
            RESOURCE: str(self.trace.gpus * SPLIT),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {"kubernetes.io/hostname": self.name},
                "annotations": annotations,
            },
            "status": {"capacity": dict(amounts), "allocatable": amounts},
        }

    def requests(self) -> NodeRequests:
        """kube-scheduler's view of the empty node."""
        cpu, memory, pods = self.allocatable
        return NodeRequests(Resources(cpu, memory), pods)

    async def admit(self, pod: JSON) -> PodAdmission:
        """kubelet admits the bound pod (Topology Manager with the plugin's Allocate, then the
        allocatable predicate); an admitted pod stays active."""
        meta = pod["metadata"]
        record = PodAdmission(meta["namespace"], meta["name"], meta["uid"], self.name, admitted=False)
        steering = self.room if self.room is not None and self.room.rule == HIDE_STEER else None
        if steering is not None:  # what the plugin did for the pod the lock named, before the bind
            needs = binding_needs(pod, self.name, RESOURCE)
            key = f"{meta['namespace']}/{meta['name']}"
            steering.binding(key, None if isinstance(needs, str) else needs)
        self.list_and_watch()
        await admit_pod(self.admitter, pod, record, self.active.values(), self.allocatable)
        if steering is not None:  # the plugin released the lock after Allocate: steering ends
            steering.binding(None)
        if record.admitted:
            self.active[record.uid] = pod
        return record

    def placement(self, record: PodAdmission) -> str | None:
        """The ``hamid.io/numa-placement`` the NUMA publisher writes from PodResources (None: none),
        from the simulated kubelet's answer for the pod (the containers kubelet's ``List`` reports)."""
        view = PodResourcesView(list, dict, frozenset, lambda r: self.devices.resources[r].all_devices)
        held = held_pod(view.pod(record))
        if not holds_anything(held):
            return None
        numa_of = {cpu: n for n, cpus in self.layout.numa_cpus.items() for cpu in cpus}
        return encode_placement(placement_of(held, numa_of, 1))

    def kubelet_numa(self, pod: JSON) -> int | None:
        """The one NUMA node kubelet's Topology Manager would give the pod's container here now
        (None: it would reject the pod, or span several NUMA nodes), with the plugin's device list
        as it stands."""
        self.list_and_watch()
        hint, admit = self.admitter.container_hint(pod, pod["spec"]["containers"][0])
        if not admit or hint.affinity is None or len(hint.affinity) != 1:
            return None
        return next(iter(hint.affinity))

    def free_cpus_on(self, numa: int) -> int:
        """CPUs the static CPU manager could still assign exclusively on NUMA node ``numa``."""
        return len(self.cpus.available() & self.layout.numa_cpus[numa])


class Cluster:
    """hamid's scheduler over :class:`SimNode` s, with kube-scheduler's part (see the module docs)."""

    def __init__(
        self,
        nodes: list[TraceNode],
        numa: str,
        node_policy: str,
        gpu_policy: str,
        hook_path: str,
        cpu_pods: bool = False,
        hide_replicas: str = "auto",
        nodes_to_score: int = 100,
    ) -> None:
        self.api = MemoryApi()
        self.numa = numa
        #: The rule every node's plugin hides replicas by (None: none).
        self.hide_rule = hide_rule(hide_replicas, numa != "off")
        # steer_wait_s=0: the simulated kubelet reads each plugin's list when it admits the pod,
        # after the bind, so the list is current without the plugin's confirmation the bind waits for
        settings = SchedulerSettings(
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            reconcile_interval_s=0,
            schedule_cpu_pods=cpu_pods,
            steer_wait_s=0,
        )
        self.scheduler = Scheduler(self.api, settings=settings, events=_NoEvents())  # type: ignore[arg-type]
        self.refit: LocalRefitClient | None = None
        if numa != "off":
            self.refit = LocalRefitClient(RefitService(self.scheduler, _TrustedNode()))
        self.nodes = {n.name: SimNode(n, self.api, numa, hook_path, self.refit, hide_replicas) for n in nodes}
        self.names = tuple(self.nodes)
        self.kube = {name: node.requests() for name, node in self.nodes.items()}
        #: kube-scheduler's NodeResourcesFit over ``kube`` (pods bound and gone go through it).
        self.room = NodeRoomIndex(self.kube)
        #: The nodes each kube-scheduler sends on (``percentageOfNodesToScore``): the one with hamid
        #: as extender, and the default one, for the pods hamid leaves alone.
        self.extender_search = NodeSampler(self.names, nodes_to_score)
        self.default_search = NodeSampler(self.names, nodes_to_score)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Register every node, then run and sync the scheduler's and the plugins' watch caches."""
        profiles: dict[tuple[int, int, str | None], str] = {}
        for node in self.nodes.values():
            self.api.put_node(node.node_object(profiles))
        caches = [self.scheduler.pods, self.scheduler.nodes, self.scheduler.quotas]
        for cache in caches:
            self._tasks.append(asyncio.create_task(cache.run()))
        for node in self.nodes.values():
            self._tasks.append(asyncio.create_task(node.pods.run()))
        self._tasks.append(asyncio.create_task(self.scheduler.fgd_warmup.run()))
        for cache in caches:
            await cache.wait_synced()
        for node in self.nodes.values():
            await node.pods.wait_synced()

    async def stop(self) -> None:
        """Cancel the caches."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.scheduler.close()

    def gpu_room(self, pod: JSON, names: tuple[str, ...]) -> bool:
        """Whether one of ``names`` has GPU room for the pod, CPUs, memory and NUMA aside (hamid's
        plain fit under HAMi's default policies, which look at GPUs only: :meth:`Filter.plan`
        without prediction, which changes nothing)."""
        plain = SchedulerSettings()
        spec = PodFitSpec.from_pod(pod, self.scheduler.config, plain.gpu_policy, plain.node_policy)
        node, _fitted, _failed = self.scheduler.planner.plan(pod, spec, names)
        return node is not None

    async def filter(self, pod: JSON, candidates: tuple[str, ...]) -> tuple[list[str], str]:
        """hamid's ``/filter``: the nodes it keeps (one for a GPU pod), or none and the error."""
        result = await self.scheduler.filtering.filter(FilterArgs(pod, candidates, None))
        if result.error:
            return [], result.error
        return list(result.node_names or ()), ""

    async def bind(self, pod: JSON, node: str) -> str:
        """hamid's ``/bind`` ("" on success, else the error)."""
        meta = pod["metadata"]
        return await self.scheduler.binder.bind(BindArgs(meta["name"], meta["namespace"], meta["uid"], node))

    async def publish(self, node: SimNode, pod: JSON, record: PodAdmission) -> None:
        """kubelet's pod status and, NUMA on, the plugin's observed placement."""
        meta = pod["metadata"]
        status = (
            {"phase": "Running"}
            if record.admitted
            else {"phase": "Failed", "reason": record.reason, "message": record.message}
        )
        await self.api.patch_pod_status(meta["namespace"], meta["name"], status)
        placement = node.placement(record) if record.admitted and self.numa != "off" else None
        if placement is not None:
            await self.api.patch_pod_metadata(
                meta["namespace"], meta["name"], annotations={NUMA_PLACEMENT: placement}
            )
        await self.api.settle()
