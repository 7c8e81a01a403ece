"""A simulated kubelet: device manager, Topology Manager and static CPU manager over real sockets.

It drives a device plugin exactly as kubelet does (``reference/kubelet-and-extender.md`` §2-3):

* serves ``v1beta1.Registration`` on ``<root>/kubelet.sock``; inside ``Register`` it validates the
  version and resource name, dials ``<root>/<endpoint>``, calls ``GetDevicePluginOptions``, then
  consumes ``ListAndWatch`` (each message replaces the whole device set; the stream ending marks
  every device unhealthy); node ``capacity``/``allocatable`` follow like kubelet's ``GetCapacity``;
* watches the pods bound to its node and admits them one at a time: per container (init containers
  first) device hints + static-CPU hints → Topology Manager merge per policy → device selection
  (``devicesToAllocate``, including the ``GetPreferredAllocation`` cases) → ``Allocate`` → CPUs;
* rejects with kubelet's reasons and messages (pod ``Failed`` + Warning event), marks admitted pods
  ``Running`` and records what it assigned in the pod annotation :data:`ASSIGNMENT_ANNOTATION`;
* can restart in-process (:meth:`SimKubelet.restart`): sockets wiped, ``kubelet.sock`` recreated,
  allocations kept (kubelet's checkpoint), capacity 0 until the plugin registers again.

Python callers read decisions with :meth:`SimKubelet.admission` / :meth:`SimKubelet.wait_admission`
or from a pod with :func:`read_assignment`.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from grpclib.server import Server, Stream

from hamid._proto.deviceplugin.v1beta1 import api_pb2 as pb
from hamid._proto.deviceplugin.v1beta1.api_grpc import DevicePluginStub, RegistrationBase
from hamid.kube.cache import PodCache
from hamid.kube.client import JSON, KubeClient, object_key
from hamid.kube.errors import KubeError, NotFound
from hamid.kube.events import EventRecorder
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.sim.machine import Machine
from hamid.sim.pulse import Pulse
from hamid.sim.topology import (
    CPU_POLICIES,
    CPU_POLICY_STATIC,
    POLICY_NONE,
    CpuAllocationError,
    DeviceTopology,
    TopologyHint,
    allocate_cpus,
    check_numa_nodes,
    container_limits,
    device_hints_for_resource,
    filter_by_affinity,
    format_cpu_list,
    generate_cpu_hints,
    guaranteed_cpus,
    is_restartable_init,
    merge_hints,
    parse_cpu_list,
    pod_containers,
    pod_qos_class,
    quantity_value,
)

log = get_logger("sim.kubelet")

#: Pod annotation with the kubelet's decision (JSON, see :meth:`PodAdmission.to_json`).
ASSIGNMENT_ANNOTATION = "sim.hamid.io/assignment"
#: kubelet's admission failure reasons (``pkg/kubelet/cm/admission``, ``topologymanager``).
REASON_TOPOLOGY_AFFINITY = "TopologyAffinityError"
REASON_UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
REJECTED_PREFIX = "Pod was rejected: "
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"
EVENT_COMPONENT = "kubelet"

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """``v1helper.IsExtendedResourceName`` (what kubelet's ``Register`` checks)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        return False
    return 0 < len(short) <= 63 and _QUALIFIED_NAME.fullmatch(short) is not None


def _go_status_name(status: Status) -> str:
    return "".join(part.capitalize() for part in status.name.split("_"))


def rpc_error_text(exc: BaseException) -> str:
    """A gRPC failure as Go's ``status.Error`` prints it (``rpc error: code = ... desc = ...``)."""
    if isinstance(exc, GRPCError):
        return f"rpc error: code = {_go_status_name(exc.status)} desc = {exc.message or ''}"
    if isinstance(exc, TimeoutError):
        return "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    return f"rpc error: code = Unavailable desc = {type(exc).__name__}: {exc}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AdmissionFailure(Exception):
    """A pod admission failure carrying kubelet's reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _unexpected(error: str) -> AdmissionFailure:
    return AdmissionFailure(
        REASON_UNEXPECTED_ADMISSION, f"Allocate failed due to {error}, which is unexpected"
    )


# --- records --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreferredCall:
    """One ``GetPreferredAllocation`` call the kubelet made (``answer`` is the plugin's ``deviceIDs``)."""

    resource: str
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int
    answer: tuple[str, ...]

    def to_json(self) -> JSON:
        """Wire form in the assignment annotation."""
        return {
            "resource": self.resource,
            "available": list(self.available),
            "mustInclude": list(self.must_include),
            "size": self.size,
            "answer": list(self.answer),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreferredCall:
        """Inverse of :meth:`to_json`."""
        return cls(
            resource=str(data["resource"]),
            available=tuple(data.get("available") or ()),
            must_include=tuple(data.get("mustInclude") or ()),
            size=int(data.get("size") or 0),
            answer=tuple(data.get("answer") or ()),
        )


def _allocate_response_json(response: pb.ContainerAllocateResponse) -> JSON:
    return {
        "envs": dict(sorted(response.envs.items())),
        "mounts": [
            {"containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only}
            for m in response.mounts
        ],
        "devices": [
            {"containerPath": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in response.devices
        ],
        "annotations": dict(sorted(response.annotations.items())),
        "cdiDevices": [c.name for c in response.cdi_devices],
    }


@dataclass(slots=True)
class ContainerAssignment:
    """What the kubelet gave one container."""

    name: str
    index: int
    init: bool
    hint: TopologyHint | None
    cpus: frozenset[int] = frozenset()
    cpu_numa_nodes: tuple[int, ...] = ()
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    device_numa_nodes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    preferred_calls: list[PreferredCall] = field(default_factory=list)
    allocate: dict[str, JSON] = field(default_factory=dict)

    @property
    def numa_node(self) -> int | None:
        """The one NUMA node of the Topology Manager's hint, or None (no hint / several nodes)."""
        if self.hint is None or self.hint.affinity is None or len(self.hint.affinity) != 1:
            return None
        return next(iter(self.hint.affinity))

    @property
    def env(self) -> dict[str, str]:
        """Allocate envs merged across resources, first value wins (kubelet's runtime merge)."""
        merged: dict[str, str] = {}
        for resource in sorted(self.allocate):
            for key, value in self.allocate[resource].get("envs", {}).items():
                merged.setdefault(key, value)
        return merged

    def to_json(self) -> JSON:
        """Wire form in the assignment annotation."""
        hint = None
        if self.hint is not None:
            nodes = None if self.hint.affinity is None else sorted(self.hint.affinity)
            hint = {"numaNodes": nodes, "preferred": self.hint.preferred}
        return {
            "name": self.name,
            "index": self.index,
            "init": self.init,
            "hint": hint,
            "numaNode": self.numa_node,
            "cpus": format_cpu_list(self.cpus),
            "cpuNumaNodes": list(self.cpu_numa_nodes),
            "devices": {k: list(v) for k, v in self.devices.items()},
            "deviceNumaNodes": {k: list(v) for k, v in self.device_numa_nodes.items()},
            "preferredAllocation": [c.to_json() for c in self.preferred_calls],
            "allocate": self.allocate,
            "env": self.env,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContainerAssignment:
        """Inverse of :meth:`to_json`."""
        raw_hint = data.get("hint")
        hint = None
        if raw_hint is not None:
            nodes = raw_hint.get("numaNodes")
            hint = TopologyHint(None if nodes is None else frozenset(nodes), bool(raw_hint.get("preferred")))
        return cls(
            name=str(data["name"]),
            index=int(data["index"]),
            init=bool(data.get("init")),
            hint=hint,
            cpus=parse_cpu_list(str(data.get("cpus") or ""), "assignment cpus"),
            cpu_numa_nodes=tuple(data.get("cpuNumaNodes") or ()),
            devices={k: tuple(v) for k, v in (data.get("devices") or {}).items()},
            device_numa_nodes={k: tuple(v) for k, v in (data.get("deviceNumaNodes") or {}).items()},
            preferred_calls=[PreferredCall.from_json(c) for c in data.get("preferredAllocation") or ()],
            allocate=dict(data.get("allocate") or {}),
        )


@dataclass(slots=True)
class PodAdmission:
    """The kubelet's decision on one pod: admitted (with assignments) or rejected (reason, message)."""

    namespace: str
    name: str
    uid: str
    node: str
    admitted: bool
    reason: str = ""
    message: str = ""
    containers: list[ContainerAssignment] = field(default_factory=list)
    topology_policy: str = ""
    cpu_manager_policy: str = ""
    released: bool = False
    #: True once the annotation and the pod status have been written (or failed to be).
    published: bool = False

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def container(self, name: str) -> ContainerAssignment:
        """The assignment of the container called ``name``."""
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"{self.key} has no container {name!r}")

    def to_json(self) -> JSON:
        """The :data:`ASSIGNMENT_ANNOTATION` document."""
        return {
            "node": self.node,
            "uid": self.uid,
            "admitted": self.admitted,
            "reason": self.reason,
            "message": self.message,
            "topologyPolicy": self.topology_policy,
            "cpuManagerPolicy": self.cpu_manager_policy,
            "containers": [c.to_json() for c in self.containers],
        }

    @classmethod
    def from_json(cls, namespace: str, name: str, data: Mapping[str, Any]) -> PodAdmission:
        """Inverse of :meth:`to_json`."""
        return cls(
            namespace=namespace,
            name=name,
            uid=str(data.get("uid") or ""),
            node=str(data.get("node") or ""),
            admitted=bool(data.get("admitted")),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            containers=[ContainerAssignment.from_json(c) for c in data.get("containers") or ()],
            topology_policy=str(data.get("topologyPolicy") or ""),
            cpu_manager_policy=str(data.get("cpuManagerPolicy") or ""),
        )


def read_assignment(pod: Mapping[str, Any]) -> PodAdmission | None:
    """The simulated kubelet's decision recorded on ``pod`` (a wire-form dict), or None.

    Raises :class:`InvalidInput` when the annotation is present but not a valid document.
    """
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        return PodAdmission.from_json(
            str(meta.get("namespace") or ""), str(meta.get("name") or ""), json.loads(raw)
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"pod annotation {ASSIGNMENT_ANNOTATION}: not a valid assignment: {exc}") from exc


# --- device plugin endpoints ---------------------------------------------------------------------


@dataclass(eq=False)
class _Endpoint:
    resource: str
    socket: str
    channel: Channel
    stub: DevicePluginStub
    options: pb.DevicePluginOptions
    stopped: bool = False
    updates: int = 0
    task: asyncio.Task[None] | None = None

    def close(self) -> None:
        self.stopped = True
        self.channel.close()


@dataclass
class ResourceState:
    """kubelet's per-resource device state (``allDevices``, ``healthyDevices``, ``unhealthyDevices``)."""

    name: str
    all_devices: dict[str, DeviceTopology] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    endpoint: _Endpoint | None = None
    stopped_at: float | None = None
    registrations: int = 0
    updates: int = 0

    @property
    def options(self) -> pb.DevicePluginOptions | None:
        """The options from ``GetDevicePluginOptions`` of the current endpoint (None if stopped)."""
        return None if self.endpoint is None else self.endpoint.options

    @property
    def connected(self) -> bool:
        """True while a registered plugin's ListAndWatch stream is live."""
        return self.endpoint is not None and not self.endpoint.stopped


class _RegistrationService(RegistrationBase):
    def __init__(self, kubelet: SimKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, stream: Stream[pb.RegisterRequest, pb.Empty]) -> None:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "empty RegisterRequest")
        await self.kubelet._register(request)
        await stream.send_message(pb.Empty())


# --- the kubelet ----------------------------------------------------------------------------------


class SimKubelet:
    """A simulated kubelet for one node. Use ``async with SimKubelet(...) as kubelet:`` or :meth:`run`.

    ``root`` is the device-plugin directory (``kubelet.sock`` and the plugins' sockets live there).
    Every plugin RPC is bounded by ``rpc_timeout`` (kubelet itself sets none); the dial inside
    ``Register`` by ``dial_timeout`` (kubelet: 10 s).
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        machine: Machine,
        root: str | os.PathLike[str],
        topology_policy: str = "single-numa-node",
        cpu_manager_policy: str = CPU_POLICY_STATIC,
        rpc_timeout: float = 10.0,
        dial_timeout: float = 10.0,
        status_interval: float = 10.0,
        endpoint_stop_grace: float = 300.0,
        register_node: bool = True,
        max_records: int = 10000,
    ) -> None:
        check_numa_nodes(machine.numa_ids, topology_policy)
        if cpu_manager_policy not in CPU_POLICIES:
            raise InvalidInput(
                f"unknown CPU manager policy {cpu_manager_policy!r}; choose one of {CPU_POLICIES}"
            )
        if cpu_manager_policy == CPU_POLICY_STATIC and not machine.reserved_cpus:
            raise InvalidInput(
                "the static CPU manager policy requires a non-zero CPU reservation: set reservedCpus in the "
                "machine file"
            )
        if not node_name:
            raise InvalidInput("a simulated kubelet needs a node name")
        for name, value in (("rpc_timeout", rpc_timeout), ("dial_timeout", dial_timeout)):
            if value <= 0:
                raise InvalidInput(f"{name} must be positive, got {value}")
        self.kube = kube
        self.node_name = node_name
        self.machine = machine
        self.root = Path(root)
        self.topology_policy = topology_policy
        self.cpu_manager_policy = cpu_manager_policy
        self.rpc_timeout = rpc_timeout
        self.dial_timeout = dial_timeout
        self.status_interval = status_interval
        self.endpoint_stop_grace = endpoint_stop_grace
        self.register_node = register_node
        self.max_records = max_records
        self.resources: dict[str, ResourceState] = {}
        self.restarts = 0
        self._topology = machine.cpu_topology
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._endpoint_tasks: set[asyncio.Task[None]] = set()
        self._pods: PodCache | None = None
        self._events: EventRecorder | None = None
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[str] = set()
        self._deleting: set[str] = set()
        self._records: OrderedDict[str, PodAdmission] = OrderedDict()
        self._uid_by_key: dict[str, str] = {}
        self._pod_devices: dict[str, dict[str, dict[str, frozenset[str]]]] = {}
        self._pod_cpus: dict[str, dict[str, frozenset[int]]] = {}
        self._admit_lock = asyncio.Lock()
        self._status_dirty = asyncio.Event()
        self._pulse = Pulse()
        self._published_resources: set[str] = set()
        self._started = False
        self._log = log.bind(node=node_name)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        """``<root>/kubelet.sock``."""
        return self.root / KUBELET_SOCKET

    async def __aenter__(self) -> SimKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the directory, serve ``kubelet.sock``, register the node and start admitting pods."""
        if self._started:
            raise RuntimeError("this simulated kubelet is already running")
        self._started = True
        try:
            await asyncio.to_thread(self.root.mkdir, mode=0o750, parents=True, exist_ok=True)
            await self._start_server()
            if self.register_node:
                await self._ensure_node()
            self._events = EventRecorder(self.kube, EVENT_COMPONENT, self.node_name)
            self._pods = PodCache(
                self.kube,
                node_name=self.node_name,
                on_add=self._pod_added,
                on_update=self._pod_updated,
                on_delete=self._pod_deleted,
            )
            self._spawn(self._pods.run(), "pod-cache")
            self._spawn(self._admission_worker(), "admission")
            self._spawn(self._status_loop(), "node-status")
            await self._pods.wait_synced(timeout=max(self.rpc_timeout, 10.0))
        except BaseException:
            await self.stop()
            raise
        self._log.info(
            "simulated kubelet started",
            socket=str(self.socket_path),
            topology_policy=self.topology_policy,
            cpu_manager_policy=self.cpu_manager_policy,
        )

    async def stop(self) -> None:
        """Stop serving, cut every plugin connection and cancel the background tasks."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await self._stop_grpc()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._started = False

    async def run(self) -> None:
        """Start, then serve until cancelled (for ``hamid sim kubelet``)."""
        async with self:
            await asyncio.Event().wait()

    async def restart(self) -> None:
        """Simulate a kubelet restart (between two pod admissions).

        The Registration server stops, every plugin connection is cut, every unix socket in
        ``root`` except the checkpoint is removed and ``kubelet.sock`` is created anew. Allocations
        survive (checkpoint); each known resource restarts with no devices and a stopped endpoint,
        so capacity/allocatable read 0 until its plugin registers again.
        """
        async with self._admit_lock:
            await self._start_server_anew()
            now = time.monotonic()
            for state in self.resources.values():
                state.all_devices = {}
                state.healthy = set()
                state.unhealthy = set()
                state.endpoint = None
                state.stopped_at = now
            self.restarts += 1
            self._changed()
        self._log.info("simulated kubelet restarted", restarts=self.restarts)

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(f"sim-kubelet-{self.node_name}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_server(self) -> None:
        await asyncio.to_thread(self._cleanup_plugin_dir)
        server = Server([_RegistrationService(self)])
        await server.start(path=str(self.socket_path))
        self._server = server

    async def _start_server_anew(self) -> None:
        """Serve a new ``kubelet.sock`` with a new inode (plugins may watch the inode to spot restarts).

        The new socket is bound under a temporary name while the old file still exists, so the
        filesystem cannot hand the old inode back; then the old sockets are wiped and it is renamed.
        """
        staging = self.root / f".{KUBELET_SOCKET}.restart"
        await asyncio.to_thread(staging.unlink, missing_ok=True)
        server = Server([_RegistrationService(self)])
        await server.start(path=str(staging))
        await self._stop_grpc()
        await asyncio.to_thread(self._cleanup_plugin_dir, staging.name)
        await asyncio.to_thread(staging.rename, self.socket_path)
        self._server = server

    def _cleanup_plugin_dir(self, keep: str = "") -> None:
        """kubelet's ``CleanupPluginDirectory``: remove every unix socket but the checkpoint."""
        for entry in self.root.iterdir():
            if entry.name in (CHECKPOINT_FILE, keep):
                continue
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()

    async def _stop_grpc(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rpc_timeout):
                    await server.wait_closed()
        for state in self.resources.values():
            if state.endpoint is not None:
                state.endpoint.close()
        tasks = list(self._endpoint_tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._endpoint_tasks.clear()

    # -- waiting helpers ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._pulse.fire()
        self._status_dirty.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        """Wait until ``predicate()`` holds (checked on each state change); TimeoutError after ``timeout``."""
        await self._pulse.wait_until(predicate, timeout, what)

    async def wait_registered(self, resource: str, timeout: float = 5.0) -> ResourceState:
        """Wait until ``resource`` is registered and its plugin's first ListAndWatch message arrived."""

        def ready() -> bool:
            state = self.resources.get(resource)
            endpoint = None if state is None else state.endpoint
            return endpoint is not None and not endpoint.stopped and endpoint.updates > 0

        await self.wait_until(
            ready,
            timeout,
            f"registration of {resource}",
        )
        return self.resources[resource]

    # -- capacity -------------------------------------------------------------------------------

    def device_capacity(self) -> tuple[dict[str, int], dict[str, int], set[str]]:
        """kubelet's ``GetCapacity``: (capacity, allocatable, resources dropped after the grace period)."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        deleted: set[str] = set()
        now = time.monotonic()
        for name, state in list(self.resources.items()):
            expired = state.stopped_at is not None and now - state.stopped_at > self.endpoint_stop_grace
            if expired and not state.connected:
                del self.resources[name]
                deleted.add(name)
                continue
            capacity[name] = len(state.healthy) + len(state.unhealthy)
            allocatable[name] = len(state.healthy)
        return capacity, allocatable, deleted

    def allocatable(self, resource: str) -> int:
        """Healthy device count of ``resource`` (0 when unknown)."""
        state = self.resources.get(resource)
        return 0 if state is None else len(state.healthy)

    def node_status(self) -> JSON:
        """The node ``status`` the kubelet publishes (merge-patch form: removed resources map to None)."""
        capacity, allocatable, deleted = self.device_capacity()
        cpus = len(self.machine.all_cpus)
        cap: dict[str, Any] = {
            "cpu": str(cpus),
            "memory": self.machine.memory,
            "pods": str(self.machine.pods),
        }
        alloc: dict[str, Any] = {
            "cpu": str(cpus - len(self.machine.reserved_cpus)),
            "memory": self.machine.memory,
            "pods": str(self.machine.pods),
        }
        for name in sorted(capacity):
            cap[name] = str(capacity[name])
            alloc[name] = str(allocatable[name])
        for name in sorted((deleted | self._published_resources) - set(capacity)):
            cap[name] = None
            alloc[name] = None
        now = _now()
        return {
            "capacity": cap,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
        }

    async def sync_node_status(self) -> JSON:
        """Publish the node status now; returns the node as the API server answered."""
        status = self.node_status()
        node = await self.kube.patch_node_status(self.node_name, status)
        self._published_resources = {k for k, v in status["capacity"].items() if v is not None} - {
            "cpu",
            "memory",
            "pods",
        }
        return node

    async def _ensure_node(self) -> None:
        try:
            await self.kube.get_node(self.node_name)
        except NotFound:
            labels = {
                "kubernetes.io/hostname": self.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }
            with contextlib.suppress(KubeError):
                await self.kube.create_node(
                    {"metadata": {"name": self.node_name, "labels": labels}, "spec": {}}
                )
        await self.sync_node_status()

    async def _status_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.status_interval):
                    await self._status_dirty.wait()
            self._status_dirty.clear()
            try:
                await self.sync_node_status()
            except KubeError as exc:
                self._log.warning("node status update failed", error=str(exc))

    # -- registration and ListAndWatch (plugin/v1beta1 server.go, client.go; manager.go) ---------

    async def _register(self, request: pb.RegisterRequest) -> None:
        resource = request.resource_name
        bound = self._log.bind(resource=resource, endpoint=request.endpoint)
        bound.info("got registration request from device plugin")
        if request.version not in SUPPORTED_VERSIONS:
            supported = "[" + " ".join(json.dumps(v) for v in SUPPORTED_VERSIONS) + "]"
            message = (
                f"requested API version {json.dumps(request.version)} is not supported by kubelet. "
                f"Supported version is {supported}"
            )
            bound.warning("bad registration request", error=message)
            raise GRPCError(Status.UNKNOWN, message)
        if not is_extended_resource_name(resource):
            message = f"the ResourceName {json.dumps(resource)} is invalid"
            bound.warning("bad registration request", error=message)
            raise GRPCError(Status.UNKNOWN, message)
        socket = self.plugin_socket(request.endpoint)
        channel = await self._dial(socket)
        stub = DevicePluginStub(channel)
        try:
            async with asyncio.timeout(self.rpc_timeout):
                options = await stub.GetDevicePluginOptions(pb.Empty())
        except (GRPCError, TimeoutError, OSError, StreamTerminatedError) as exc:
            channel.close()
            message = f"failed to get device plugin options: {rpc_error_text(exc)}"
            bound.warning("error connecting to device plugin client", error=message)
            raise GRPCError(Status.UNKNOWN, message) from exc
        endpoint = _Endpoint(resource, socket, channel, stub, options)
        state = self.resources.setdefault(resource, ResourceState(resource))
        previous = state.endpoint
        state.endpoint = endpoint
        state.stopped_at = None
        state.registrations += 1
        if previous is not None:
            bound.info("registration replaces an earlier endpoint", previous=previous.socket)
        task: asyncio.Task[None] = asyncio.ensure_future(self._list_and_watch(endpoint))
        task.set_name(f"sim-kubelet-{self.node_name}-law-{resource}")
        endpoint.task = task
        self._endpoint_tasks.add(task)
        task.add_done_callback(self._endpoint_tasks.discard)
        bound.info(
            "device plugin connected",
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
        )
        self._changed()

    def plugin_socket(self, endpoint: str) -> str:
        """``filepath.Join(socketDir, endpoint)``: an absolute endpoint still lands inside ``root``."""
        return os.path.normpath(os.path.join(self.root, endpoint.lstrip("/")))

    async def _dial(self, socket: str) -> Channel:
        """A blocking dial like ``grpc.WithBlock`` with a deadline of ``dial_timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.dial_timeout
        delay = 0.02
        last = "no attempt"
        while True:
            try:
                async with asyncio.timeout(max(0.01, deadline - loop.time())):
                    _, writer = await asyncio.open_unix_connection(socket)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return Channel(path=socket)
            except (OSError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if loop.time() + delay >= deadline:
                message = f"failed to dial device plugin: context deadline exceeded (last error: {last})"
                self._log.warning("unable to connect to device plugin client", socket=socket, error=message)
                raise GRPCError(Status.UNKNOWN, message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            async with endpoint.stub.ListAndWatch.open() as stream:
                await stream.send_message(pb.Empty(), end=True)
                while True:
                    response = await stream.recv_message()
                    if response is None:
                        break
                    self._devices_updated(endpoint, response)
            self._stream_ended(endpoint, "stream closed")
        except (GRPCError, OSError, StreamTerminatedError, ConnectionError) as exc:
            self._stream_ended(endpoint, rpc_error_text(exc))
        finally:
            self._disconnected(endpoint)

    def _stream_ended(self, endpoint: _Endpoint, error: str) -> None:
        """Log a ListAndWatch end: a warning, unless this kubelet closed the endpoint (stop, restart)."""
        bound = self._log.bind(resource=endpoint.resource, error=error)
        if endpoint.stopped:
            bound.debug("ListAndWatch stream closed by the kubelet's own shutdown")
        else:
            bound.warning("ListAndWatch ended unexpectedly for device plugin")

    def _devices_updated(self, endpoint: _Endpoint, response: pb.ListAndWatchResponse) -> None:
        state = self.resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint:
            self._log.info("ignoring ListAndWatch update of a replaced endpoint", resource=endpoint.resource)
            return
        state.all_devices = {}
        state.healthy = set()
        state.unhealthy = set()
        for device in response.devices:
            topology = tuple(n.ID for n in device.topology.nodes) if device.HasField("topology") else None
            state.all_devices[device.ID] = topology
            (state.healthy if device.health == HEALTHY else state.unhealthy).add(device.ID)
        state.updates += 1
        endpoint.updates += 1
        self._log.info(
            "processed device updates for resource",
            resource=endpoint.resource,
            total=len(response.devices),
            healthy=len(state.healthy),
        )
        self._changed()

    def _disconnected(self, endpoint: _Endpoint) -> None:
        endpoint.close()
        state = self.resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint:
            return
        state.unhealthy |= state.healthy
        state.healthy = set()
        state.stopped_at = time.monotonic()
        self._log.info("endpoint became unhealthy; all devices marked unhealthy", resource=endpoint.resource)
        self._changed()

    # -- pod bookkeeping -------------------------------------------------------------------------

    def admission(self, namespace: str, name: str) -> PodAdmission | None:
        """The decision on the pod ``namespace/name`` (latest incarnation), or None if not yet decided."""
        uid = self._uid_by_key.get(f"{namespace}/{name}")
        return None if uid is None else self._records.get(uid)

    async def wait_admission(
        self, namespace: str, name: str, timeout: float = 5.0, *, published: bool = False
    ) -> PodAdmission:
        """Wait for the kubelet's decision on ``namespace/name``.

        With ``published=True`` also wait until the annotation and pod status have been written.
        """

        def decided() -> bool:
            record = self.admission(namespace, name)
            return record is not None and (record.published or not published)

        await self.wait_until(decided, timeout, f"admission of {namespace}/{name}")
        record = self.admission(namespace, name)
        assert record is not None
        return record

    def allocated_devices(self, resource: str) -> set[str]:
        """Devices of ``resource`` held by live pods on this node (kubelet's ``allocatedDevices``)."""
        result: set[str] = set()
        for containers in self._pod_devices.values():
            for resources in containers.values():
                result |= resources.get(resource, frozenset())
        return result

    def free_cpus(self) -> frozenset[int]:
        """CPUs in the shared pool that exclusive assignment may take (not reserved, not assigned)."""
        taken: set[int] = set()
        for containers in self._pod_cpus.values():
            for cpus in containers.values():
                taken |= cpus
        return self.machine.all_cpus - self.machine.reserved_cpus - taken

    def _release(self, uid: str) -> None:
        devices = self._pod_devices.pop(uid, None)
        cpus = self._pod_cpus.pop(uid, None)
        record = self._records.get(uid)
        if record is not None:
            record.released = True
        if devices or cpus:
            self._log.info("released pod resources", uid=uid)
            self._changed()

    def _pod_added(self, pod: JSON) -> None:
        self._consider(pod)

    def _pod_updated(self, old: JSON, new: JSON) -> None:
        self._consider(new)

    def _pod_deleted(self, pod: JSON) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._release(uid)

    def _consider(self, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        key = object_key(pod)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Succeeded", "Failed"):
            self._release(uid)
        if meta.get("deletionTimestamp"):
            # Graceful deletion: the containers stop, resources go back, the kubelet confirms.
            self._release(uid)
            if uid not in self._deleting:
                self._deleting.add(uid)
                self._spawn(self._finish_deletion(pod), f"delete-{key}")
            return
        if phase != "Pending" or uid in self._records or uid in self._queued:
            if phase == "Running" and uid not in self._records:
                self._restore(pod)
            return
        self._queued.add(uid)
        self._queue.put_nowait((key, uid))

    async def _finish_deletion(self, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        try:
            await self.kube.delete_pod(
                str(meta.get("namespace") or ""), str(meta.get("name") or ""), grace_period_seconds=0, uid=uid
            )
        except NotFound:
            pass
        except KubeError as exc:
            self._log.warning("could not confirm a pod deletion", pod=object_key(pod), error=str(exc))
        finally:
            self._deleting.discard(uid)

    def _restore(self, pod: JSON) -> None:
        """Take over a pod already Running here (a new kubelet process): re-read its recorded assignment."""
        try:
            record = read_assignment(pod)
        except InvalidInput as exc:
            self._log.warning("running pod has an unreadable assignment", pod=object_key(pod), error=str(exc))
            return
        if record is None or not record.admitted:
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        record.uid = uid
        self._remember(record)
        for c in record.containers:
            self._pod_devices.setdefault(uid, {})[c.name] = {r: frozenset(d) for r, d in c.devices.items()}
            if c.cpus:
                self._pod_cpus.setdefault(uid, {})[c.name] = c.cpus
        self._log.info("restored running pod from its assignment", pod=record.key)
        self._changed()

    def _remember(self, record: PodAdmission) -> None:
        self._records[record.uid] = record
        self._uid_by_key[record.key] = record.uid
        while len(self._records) > self.max_records:
            _, old = self._records.popitem(last=False)
            if self._uid_by_key.get(old.key) == old.uid:
                del self._uid_by_key[old.key]

    async def _admission_worker(self) -> None:
        assert self._pods is not None
        while True:
            key, uid = await self._queue.get()
            self._queued.discard(uid)
            pod = self._pods.get(key)
            if pod is None or str((pod.get("metadata") or {}).get("uid") or "") != uid:
                continue
            if uid in self._records or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            async with self._admit_lock:
                with structlog.contextvars.bound_contextvars(pod=key, node=self.node_name):
                    try:
                        await self._admit_and_publish(pod)
                    except Exception:
                        self._log.exception("admission crashed", pod=key)

    # -- admission --------------------------------------------------------------------------------

    async def _admit_and_publish(self, pod: JSON) -> None:
        meta = pod["metadata"]
        record = PodAdmission(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            node=self.node_name,
            admitted=False,
            topology_policy=self.topology_policy,
            cpu_manager_policy=self.cpu_manager_policy,
        )
        try:
            await self._admit(pod, record)
            record.admitted = True
        except AdmissionFailure as failure:
            record.reason = failure.reason
            record.message = failure.message
            self._pod_devices.pop(record.uid, None)
            self._pod_cpus.pop(record.uid, None)
        except InvalidInput as exc:
            record.reason = REASON_UNEXPECTED_ADMISSION
            record.message = f"Allocate failed due to {exc}, which is unexpected"
            self._pod_devices.pop(record.uid, None)
            self._pod_cpus.pop(record.uid, None)
        self._remember(record)
        self._changed()
        if record.admitted:
            self._log.info(
                "pod admitted",
                containers=[
                    {
                        "name": c.name,
                        "numa": c.numa_node,
                        "cpus": format_cpu_list(c.cpus),
                        "devices": c.devices,
                    }
                    for c in record.containers
                ],
            )
            await self._publish_admitted(pod, record)
        else:
            self._log.warning("pod rejected", reason=record.reason, message=record.message)
            await self._publish_rejected(pod, record)
        record.published = True
        self._changed()

    async def _admit(self, pod: JSON, record: PodAdmission) -> None:
        uid = record.uid
        reuse_devices: dict[str, set[str]] = {}
        reuse_cpus: set[int] = set()
        numa_ids = self.machine.numa_ids
        for index, (container, is_init) in enumerate(pod_containers(pod)):
            name = str(container.get("name") or "")
            with structlog.contextvars.bound_contextvars(container=name):
                requests = self._device_requests(container)
                ncpus = guaranteed_cpus(pod, container) if self.cpu_manager_policy == CPU_POLICY_STATIC else 0
                hint: TopologyHint | None = None
                if self.topology_policy != POLICY_NONE:
                    device_provider = {
                        resource: device_hints_for_resource(
                            numa_ids,
                            self.resources[resource].all_devices if resource in self.resources else {},
                            self._available_devices(resource),
                            reuse_devices.get(resource, set()),
                            count,
                        )
                        for resource, count in requests.items()
                    }
                    cpu_provider = None
                    if ncpus:
                        cpu_provider = {
                            "cpu": generate_cpu_hints(self._topology, self.free_cpus(), reuse_cpus, ncpus)
                        }
                    hint, admit = merge_hints(
                        self.topology_policy, numa_ids, [device_provider or None, cpu_provider, None]
                    )
                    self._log.info("best topology hint", hint=hint.describe(), admit=admit)
                    if not admit:
                        raise AdmissionFailure(REASON_TOPOLOGY_AFFINITY, TOPOLOGY_AFFINITY_MESSAGE)
                assignment = ContainerAssignment(name=name, index=index, init=is_init, hint=hint)
                record.containers.append(assignment)
                affinity = None if hint is None else hint.affinity
                restartable = is_init and is_restartable_init(container)
                for resource, count in requests.items():
                    devices = await self._devices_to_allocate(
                        uid, name, resource, count, reuse_devices.get(resource, set()), affinity, assignment
                    )
                    if not devices:
                        continue
                    response = await self._allocate_rpc(resource, devices)
                    self._pod_devices.setdefault(uid, {}).setdefault(name, {})[resource] = frozenset(devices)
                    assignment.devices[resource] = tuple(sorted(devices))
                    topo = self.resources[resource].all_devices
                    assignment.device_numa_nodes[resource] = tuple(
                        sorted({n for d in devices for n in (topo.get(d) or ())})
                    )
                    assignment.allocate[resource] = _allocate_response_json(response)
                    if is_init and not restartable:
                        reuse_devices.setdefault(resource, set()).update(devices)
                    else:
                        reuse_devices.setdefault(resource, set()).difference_update(devices)
                if ncpus:
                    try:
                        cpus = allocate_cpus(self._topology, ncpus, affinity, self.free_cpus() | reuse_cpus)
                    except CpuAllocationError as exc:
                        raise _unexpected(str(exc)) from exc
                    self._pod_cpus.setdefault(uid, {})[name] = cpus
                    assignment.cpus = cpus
                    assignment.cpu_numa_nodes = tuple(
                        sorted(n for n in numa_ids if cpus & self._topology.numa_cpus[n])
                    )
                    if is_init and not restartable:
                        reuse_cpus |= cpus
                    else:
                        reuse_cpus -= cpus

    def _device_requests(self, container: Mapping[str, Any]) -> dict[str, int]:
        """``getContainerDeviceRequest``: limits of resources the device manager knows."""
        requests: dict[str, int] = {}
        for resource, value in container_limits(container).items():
            known = resource in self.resources or any(
                resource in r for c in self._pod_devices.values() for r in c.values()
            )
            if known:
                requests[resource] = quantity_value(
                    value, f"container {container.get('name')!r} limits.{resource}"
                )
        return requests

    def _available_devices(self, resource: str) -> set[str]:
        state = self.resources.get(resource)
        if state is None:
            return set()
        return state.healthy - self.allocated_devices(resource)

    async def _devices_to_allocate(
        self,
        uid: str,
        container: str,
        resource: str,
        required: int,
        reusable: set[str],
        affinity: frozenset[int] | None,
        assignment: ContainerAssignment,
    ) -> set[str]:
        """``devicesToAllocate`` (manager.go), including both ``GetPreferredAllocation`` cases."""
        state = self.resources.get(resource)
        if state is None:
            raise _unexpected(f"cannot allocate unregistered device {resource}")
        if not state.healthy:
            raise _unexpected(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        needed = required
        if needed == 0:
            return set()
        allocated: set[str] = set()

        def take(devices: set[str]) -> bool:
            nonlocal needed
            for device in sorted(devices - allocated):
                allocated.add(device)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(reusable):
            return allocated
        available = state.healthy - self.allocated_devices(resource) - allocated
        if len(available) < needed:
            raise _unexpected(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned, unaligned, no_affinity = filter_by_affinity(state.all_devices, available, affinity)
        shortfall = _unexpected(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )
        if needed < len(aligned):
            preferred = await self._preferred(
                state, aligned | allocated, set(allocated), required, assignment
            )
            if take(preferred & aligned) or take(aligned):
                return allocated
            raise shortfall
        if take(aligned):
            return allocated
        preferred = await self._preferred(state, available | allocated, set(allocated), required, assignment)
        if take(preferred & available) or take(unaligned) or take(no_affinity):
            return allocated
        raise shortfall

    async def _preferred(
        self,
        state: ResourceState,
        available: set[str],
        must_include: set[str],
        size: int,
        assignment: ContainerAssignment,
    ) -> set[str]:
        """``callGetPreferredAllocationIfAvailable``."""
        endpoint = state.endpoint
        if endpoint is None or endpoint.stopped:
            raise _unexpected(
                "device plugin GetPreferredAllocation rpc failed with err: "
                f"endpoint {state.name} has been stopped"
            )
        if not endpoint.options.get_preferred_allocation_available:
            return set()
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted(available),
                    must_include_deviceIDs=sorted(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            async with asyncio.timeout(self.rpc_timeout):
                response = await endpoint.stub.GetPreferredAllocation(request)
        except (GRPCError, TimeoutError, OSError, StreamTerminatedError) as exc:
            raise _unexpected(
                f"device plugin GetPreferredAllocation rpc failed with err: {rpc_error_text(exc)}"
            ) from exc
        answer = tuple(response.container_responses[0].deviceIDs) if response.container_responses else ()
        assignment.preferred_calls.append(
            PreferredCall(state.name, tuple(sorted(available)), tuple(sorted(must_include)), size, answer)
        )
        outside = sorted(set(answer) - available)
        missing = sorted(must_include - set(answer))
        if not answer:
            # "no opinion" is legal (kubelet fills the request from its own sets, §2.6 step 8).
            self._log.debug("GetPreferredAllocation answered no preference", resource=state.name, size=size)
        elif outside or missing or len(answer) != size:
            # kubelet does not refuse such answers (it intersects and tops up); say so loudly.
            self._log.warning(
                "GetPreferredAllocation answer breaks the contract",
                resource=state.name,
                outside_offered=outside,
                missing_must_include=missing,
                size=len(answer),
                expected_size=size,
            )
        self._log.info(
            "GetPreferredAllocation",
            resource=state.name,
            available=sorted(available),
            must_include=sorted(must_include),
            size=size,
            answer=list(answer),
        )
        return set(answer)

    async def _allocate_rpc(self, resource: str, devices: set[str]) -> pb.ContainerAllocateResponse:
        state = self.resources[resource]
        endpoint = state.endpoint
        if endpoint is None or endpoint.stopped:
            raise _unexpected(f"endpoint {resource} has been stopped")
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=sorted(devices))]
        )
        try:
            async with asyncio.timeout(self.rpc_timeout):
                response = await endpoint.stub.Allocate(request)
        except (GRPCError, TimeoutError, OSError, StreamTerminatedError) as exc:
            raise _unexpected(rpc_error_text(exc)) from exc
        if not response.container_responses:
            raise _unexpected(f"no containers return in allocation response {response}")
        self._log.info("Allocate", resource=resource, devices=sorted(devices))
        return response.container_responses[0]

    async def _pre_start(self, record: PodAdmission) -> str | None:
        """``PreStartContainer`` for each container with devices when the plugin asks; error text or None."""
        for assignment in record.containers:
            for resource, devices in assignment.devices.items():
                state = self.resources.get(resource)
                endpoint = None if state is None else state.endpoint
                if endpoint is None or not endpoint.options.pre_start_required:
                    continue
                request = pb.PreStartContainerRequest(devices_ids=list(devices))
                try:
                    async with asyncio.timeout(min(self.rpc_timeout, 30.0)):
                        await endpoint.stub.PreStartContainer(request)
                except (GRPCError, TimeoutError, OSError, StreamTerminatedError) as exc:
                    return f"device plugin PreStartContainer rpc failed with err: {rpc_error_text(exc)}"
        return None

    # -- publishing -------------------------------------------------------------------------------

    async def _publish_admitted(self, pod: JSON, record: PodAdmission) -> None:
        annotation = json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True)
        try:
            await self.kube.patch_pod_metadata(
                record.namespace, record.name, annotations={ASSIGNMENT_ANNOTATION: annotation}
            )
        except KubeError as exc:
            self._log.warning("could not record the assignment annotation", error=str(exc))
        pre_start_error = await self._pre_start(record)
        status = self._running_status(pod, record, pre_start_error)
        try:
            await self.kube.patch_pod_status(record.namespace, record.name, status)
        except KubeError as exc:
            self._log.warning("could not update the pod status", error=str(exc))
        if pre_start_error and self._events is not None:
            await self._events.record(pod, "Warning", "Failed", f"Error: {pre_start_error}")

    def _running_status(self, pod: JSON, record: PodAdmission, error: str | None) -> JSON:
        now = _now()
        statuses: list[JSON] = []
        init_statuses: list[JSON] = []
        for (container, is_init), assignment in zip(pod_containers(pod), record.containers, strict=True):
            base = {
                "name": assignment.name,
                "image": str(container.get("image") or ""),
                "imageID": "",
                "restartCount": 0,
                "containerID": f"sim://{record.uid}/{assignment.name}",
            }
            if error is not None:
                base |= {
                    "ready": False,
                    "started": False,
                    "state": {"waiting": {"reason": "CreateContainerConfigError", "message": error}},
                }
            elif is_init and not is_restartable_init(container):
                base |= {
                    "ready": True,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
            else:
                base |= {"ready": True, "started": True, "state": {"running": {"startedAt": now}}}
            (init_statuses if is_init else statuses).append(base)
        ready = "False" if error else "True"
        conditions = [
            {"type": t, "status": s, "lastTransitionTime": now}
            for t, s in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", ready),
                ("Ready", ready),
            )
        ]
        status: JSON = {
            "phase": "Pending" if error else "Running",
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "startTime": now,
            "qosClass": pod_qos_class(pod),
            "containerStatuses": statuses,
        }
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        return status

    async def _publish_rejected(self, pod: JSON, record: PodAdmission) -> None:
        """kubelet's ``rejectPod``: Warning event + phase Failed with reason and message."""
        if self._events is not None:
            await self._events.record(pod, "Warning", record.reason, record.message)
        status = {
            "phase": "Failed",
            "reason": record.reason,
            "message": REJECTED_PREFIX + record.message,
            "qosClass": pod_qos_class(pod),
        }
        try:
            await self.kube.patch_pod_status(record.namespace, record.name, status)
        except KubeError as exc:
            self._log.warning("could not update the pod status", error=str(exc))

    async def terminate_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        """End a pod's containers (``Succeeded`` or ``Failed``) and release its CPUs and devices."""
        if phase not in ("Succeeded", "Failed"):
            raise InvalidInput(f"a terminated pod's phase is Succeeded or Failed, not {phase!r}")
        record = self.admission(namespace, name)
        if record is None or not record.admitted:
            raise InvalidInput(f"pod {namespace}/{name} was not admitted by the kubelet of {self.node_name}")
        now = _now()
        code = 0 if phase == "Succeeded" else 1
        statuses = [
            {
                "name": c.name,
                "ready": False,
                "started": False,
                "restartCount": 0,
                "image": "",
                "imageID": "",
                "containerID": f"sim://{record.uid}/{c.name}",
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in record.containers
            if not c.init
        ]
        await self.kube.patch_pod_status(namespace, name, {"phase": phase, "containerStatuses": statuses})
        self._release(record.uid)

    # -- views ----------------------------------------------------------------------------------

    def describe_resources(self) -> list[JSON]:
        """Per resource: device counts, registration count and plugin options (for logs and demos)."""
        result = []
        for name in sorted(self.resources):
            state = self.resources[name]
            options = state.options
            result.append(
                {
                    "resource": name,
                    "healthy": len(state.healthy),
                    "unhealthy": len(state.unhealthy),
                    "allocated": len(self.allocated_devices(name)),
                    "registrations": state.registrations,
                    "connected": state.connected,
                    "getPreferredAllocationAvailable": bool(
                        options and options.get_preferred_allocation_available
                    ),
                    "preStartRequired": bool(options and options.pre_start_required),
                }
            )
        return result


def devices_on_numa(state: ResourceState, numa: int) -> list[str]:
    """IDs of ``state``'s devices reporting NUMA node ``numa`` (sorted)."""
    return sorted(d for d, topo in state.all_devices.items() if topo and numa in topo)


def sockets_in(root: str | os.PathLike[str]) -> list[str]:
    """Names of the unix sockets in ``root`` (blocking; for tests and diagnostics)."""
    result = []
    for entry in Path(root).iterdir():
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(entry.lstat().st_mode):
                result.append(entry.name)
    return sorted(result)


__all__: Sequence[str] = (
    "ASSIGNMENT_ANNOTATION",
    "REASON_TOPOLOGY_AFFINITY",
    "REASON_UNEXPECTED_ADMISSION",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "AdmissionFailure",
    "ContainerAssignment",
    "PodAdmission",
    "PreferredCall",
    "ResourceState",
    "SimKubelet",
    "devices_on_numa",
    "is_extended_resource_name",
    "read_assignment",
    "rpc_error_text",
    "sockets_in",
)
