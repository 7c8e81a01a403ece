"""The simulated kubelet: one node's device manager, Topology Manager, CPU manager, admission,
status and PodResources API over real sockets (see the package docs for the layout).

It watches the pods bound to its node and admits each batch in creation order; a pod being deleted
keeps its CPUs and devices until its containers have stopped; before each admission the CPUs and
devices of pods no longer active are taken back (kubelet's ``removeStaleState``); a restart
(in-process or a new process finding Running pods) re-admits the running pods from what they hold.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from hamid.kube.cache import PodCache
from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.kube.events import EventRecorder
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON, PodBody
from hamidsim.kubelet.admission import Admitter, admit_pod
from hamidsim.kubelet.assignment import (
    AdmissionRecords,
    PodAdmission,
    read_assignment,
)
from hamidsim.kubelet.cadvisor import MachineInfo, format_cpu_list
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig
from hamidsim.kubelet.devicemanager import DeviceManager, ResourceState
from hamidsim.kubelet.errors import REASON_UNEXPECTED_ADMISSION, AdmissionFailure
from hamidsim.kubelet.node import NodeStatusPublisher, build_managers, build_memory_manager
from hamidsim.kubelet.podresources import PodResourcesServer, PodResourcesView, default_socket
from hamidsim.kubelet.quantity import quantity_milli_value, quantity_value
from hamidsim.kubelet.registration import RegistrationServer
from hamidsim.kubelet.status import PodPublisher, StatusManager, stopped_containers
from hamidsim.pulse import Pulse

log = get_logger("sim.kubelet")
EVENT_COMPONENT = "kubelet"


def _creation_key(pod: Mapping[str, Any]) -> str:
    return str(objects.metadata(pod).get("creationTimestamp") or "")


class SimKubelet:
    """A simulated kubelet for one node. Use ``async with SimKubelet(...) as kubelet:`` or :meth:`run`.

    ``config`` is the node's ``KubeletConfiguration`` (default :data:`SIM_DEFAULTS`);
    ``topology_policy`` / ``cpu_manager_policy`` / ``topology_scope`` override it like flags.
    ``root`` is the device-plugin directory; PodResources is served on ``pod_resources_socket``
    (default ``<root>/../pod-resources/kubelet.sock``). ``container_stop_seconds`` is how long a
    deleted pod's containers take to stop (bounded by its grace period).
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        machine: MachineInfo,
        root: str | os.PathLike[str],
        config: KubeletConfig | None = None,
        topology_policy: str | None = None,
        cpu_manager_policy: str | None = None,
        topology_scope: str | None = None,
        pod_resources_socket: str | os.PathLike[str] | None = None,
        rpc_timeout: float = 10.0,
        dial_timeout: float = 10.0,
        status_interval: float = 10.0,
        status_retry_interval: float = 1.0,
        container_stop_seconds: float = 0.0,
        endpoint_stop_grace: float = 300.0,
        register_node: bool = True,
        max_records: int = 10000,
    ) -> None:
        """Validate the configuration against the machine and wire the managers (long: wiring only)."""
        if not node_name:
            raise InvalidInput("a simulated kubelet needs a node name")
        for name, value in (("rpc_timeout", rpc_timeout), ("dial_timeout", dial_timeout)):
            if value <= 0:
                raise InvalidInput(f"{name} must be positive, got {value}")
        self.config = (config or SIM_DEFAULTS).with_overrides(
            topology_manager_policy=topology_policy,
            cpu_manager_policy=cpu_manager_policy,
            topology_manager_scope=topology_scope,
        )
        self.kube = kube
        self.node_name = node_name
        self.machine = machine
        self.root = Path(root)
        self.rpc_timeout = rpc_timeout
        self.status_interval = status_interval
        self.container_stop_seconds = container_stop_seconds
        self.register_node = register_node
        self.restarts = 0
        self._log = log.bind(node=node_name)
        self.devices = DeviceManager(
            self.root,
            rpc_timeout=rpc_timeout,
            dial_timeout=dial_timeout,
            endpoint_stop_grace=endpoint_stop_grace,
            on_change=self._changed,
            log=self._log,
        )
        self.cpus, settings = build_managers(machine, self.config)
        self.memory = build_memory_manager(machine, self.config)
        self._admitter = Admitter(settings, self.devices, self.cpus, self._log, self.memory)
        self.status = StatusManager(kube, self._log, status_retry_interval)
        self._registration = RegistrationServer(self.root, self.devices.register, self._log)
        self._records = AdmissionRecords(max_records)
        socket = Path(pod_resources_socket) if pod_resources_socket else default_socket(self.root)
        view = PodResourcesView(
            self._records.reported,
            lambda: self.resources,
            self.cpus.allocatable,
            self._topology,
            list if self.memory is None else self.memory.allocatable,
        )
        self.pod_resources = PodResourcesServer(socket, view)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pods: PodCache | None = None
        self._publisher = PodPublisher(kube, self.status, self.devices.pre_start, self._changed, self._log)
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[str] = set()
        self._deleting: set[str] = set()
        self._admit_lock = asyncio.Lock()
        self._pulse = Pulse()
        self._node = NodeStatusPublisher(
            kube, node_name, machine, self.config, self.cpus, self.devices, self._log
        )
        self._node.interval = status_interval
        self._started = False

    # -- views kept for callers ------------------------------------------------------------------

    @property
    def topology_policy(self) -> str:
        """The Topology Manager policy in force."""
        return self.config.topology_manager_policy

    @property
    def cpu_manager_policy(self) -> str:
        """The CPU manager policy in force."""
        return self.config.cpu_manager_policy

    @property
    def resources(self) -> dict[str, ResourceState]:
        """The device manager's per-resource state."""
        return self.devices.resources

    @property
    def socket_path(self) -> Path:
        """``<root>/kubelet.sock``."""
        return self._registration.socket_path

    def _topology(self, resource: str) -> Mapping[str, Any]:
        state = self.resources.get(resource)
        return {} if state is None else state.all_devices

    def allocated_devices(self, resource: str) -> set[str]:
        """Devices of ``resource`` held by live pods on this node."""
        return self.devices.allocated_devices(resource)

    def allocatable(self, resource: str) -> int:
        """Healthy device count of ``resource`` (0 when unknown)."""
        state = self.resources.get(resource)
        return 0 if state is None else len(state.healthy)

    def free_cpus(self) -> frozenset[int]:
        """CPUs in the shared pool that exclusive assignment may take (not reserved, not assigned)."""
        return self.cpus.available()

    def device_capacity(self) -> tuple[dict[str, int], dict[str, int], set[str]]:
        """kubelet's ``GetCapacity``."""
        return self.devices.device_capacity()

    def active_records(self) -> list[PodAdmission]:
        """Admitted pods whose containers have not stopped yet (what PodResources ``List`` reports)."""
        return self._records.active()

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> SimKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the directory, serve ``kubelet.sock`` and PodResources, register the node, admit pods."""
        if self._started:
            raise RuntimeError("this simulated kubelet is already running")
        self._started = True
        try:
            await asyncio.to_thread(self.root.mkdir, mode=0o750, parents=True, exist_ok=True)
            await self._registration.start()
            await self.pod_resources.start()
            if self.register_node:
                await self._node.ensure_node()
            self._publisher.events = EventRecorder(self.kube, EVENT_COMPONENT, self.node_name)
            self._pods = PodCache(
                self.kube,
                node_name=self.node_name,
                on_add=self._consider,
                on_update=lambda _old, new: self._consider(new),
                on_delete=self._pod_deleted,
            )
            self._spawn(self._pods.run(), "pod-cache")
            self._spawn(self._admission_worker(), "admission")
            self._spawn(self._node.run(), "node-status")
            self._spawn(self.status.run(), "pod-status")
            await self._pods.wait_synced(timeout=max(self.rpc_timeout, 10.0))
        except BaseException:
            await self.stop()
            raise
        self._log.info(
            "kubelet_started",
            socket=str(self.socket_path),
            pod_resources=str(self.pod_resources.socket),
            topology_policy=self.topology_policy,
            topology_scope=self.config.topology_manager_scope,
            cpu_manager_policy=self.cpu_manager_policy,
        )

    async def stop(self) -> None:
        """Stop serving, cut every plugin connection and cancel the background tasks."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await self._stop_grpc()
        await self.pod_resources.stop(self.rpc_timeout)
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
        survive (checkpoint) and every running pod is admitted again from them; each known resource
        restarts with no devices, so capacity reads 0 until its plugin registers again.
        """
        async with self._admit_lock:
            await self._registration.start_anew(self._stop_grpc)
            self.devices.forget_devices()
            self.restarts += 1
            for record in self.active_records():
                pod = None if self._pods is None else self._pods.get(record.key)
                if pod is not None:
                    await self._readmit(pod, record)
            self._changed()
        self._log.info("kubelet_restarted", restarts=self.restarts)

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(f"sim-kubelet-{self.node_name}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _stop_grpc(self) -> None:
        await self._registration.stop(self.rpc_timeout)
        await self.devices.stop_endpoints()

    # -- waiting helpers ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._pulse.fire()
        self._node.mark_dirty()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        """Wait until ``predicate()`` holds (checked on each state change); TimeoutError after ``timeout``."""
        await self._pulse.wait_until(predicate, timeout, what)

    async def wait_registered(self, resource: str, timeout: float = 5.0) -> ResourceState:
        """Wait until ``resource`` is registered and its plugin's first ListAndWatch message arrived."""

        def ready() -> bool:
            state = self.resources.get(resource)
            endpoint = None if state is None else state.endpoint
            return endpoint is not None and not endpoint.stopped and endpoint.updates > 0

        await self.wait_until(ready, timeout, f"registration of {resource}")
        return self.resources[resource]

    # -- node status ------------------------------------------------------------------------------

    def node_status(self) -> JSON:
        """The node ``status`` the kubelet publishes (merge-patch form: removed resources map to None)."""
        return self._node.status()

    async def sync_node_status(self) -> JSON:
        """Publish the node status now; returns the node as the API server answered."""
        return await self._node.sync()

    # -- pod bookkeeping -------------------------------------------------------------------------

    def admission(self, namespace: str, name: str) -> PodAdmission | None:
        """The decision on the pod ``namespace/name`` (latest incarnation), or None if not yet decided."""
        return self._records.by_key(f"{namespace}/{name}")

    async def wait_admission(
        self, namespace: str, name: str, timeout: float = 5.0, *, published: bool = False
    ) -> PodAdmission:
        """Wait for the kubelet's decision on ``namespace/name`` (``published``: also written out)."""

        def decided() -> bool:
            record = self.admission(namespace, name)
            return record is not None and (record.published or not published)

        await self.wait_until(decided, timeout, f"admission of {namespace}/{name}")
        record = self.admission(namespace, name)
        assert record is not None
        return record

    def _release(self, uid: str) -> None:
        released = self.devices.release(uid) | self.cpus.release(uid)
        if self.memory is not None:
            released |= self.memory.release(uid)
        record = self._records.get(uid)
        if record is not None:
            record.released = True
        if released or record is not None:
            self._log.info("pod_resources_released", uid=uid)
            self._changed()

    def _remove_stale_state(self) -> None:
        """kubelet's CPU manager ``removeStaleState`` and device manager ``UpdateAllocatedDevices``,
        run before every admission: the CPUs and devices of pods that are no longer active (gone
        from the API server or terminated) go back, including those of a pod deleted while it was
        being admitted, whose allocation finished after its deletion released nothing yet."""
        assert self._pods is not None
        active = {
            objects.uid(p)
            for p in self._pods.values()
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        held = self.cpus.assignments.keys() | self.devices.pod_devices.keys()
        if self.memory is not None:
            held |= self.memory.assignments.keys()
        for uid in held - active:
            self._log.info("stale_pod_state_removed", uid=uid)
            self._release(uid)

    def _pod_deleted(self, pod: PodBody) -> None:
        uid = objects.uid(pod)
        self.status.forget(uid)
        self._release(uid)

    def _consider(self, pod: PodBody) -> None:
        uid = objects.uid(pod)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Succeeded", "Failed"):
            self._release(uid)
        if objects.metadata(pod).get("deletionTimestamp"):
            if uid not in self._deleting:
                self._deleting.add(uid)
                self._spawn(self._finish_deletion(pod), f"delete-{objects.object_key(pod)}")
                self._changed()
            return
        if phase != "Pending" or uid in self._records or uid in self._queued:
            if phase == "Running" and uid not in self._records:
                self._spawn(self._restore(pod), f"restore-{objects.object_key(pod)}")
            return
        self._queued.add(uid)
        self._queue.put_nowait((objects.object_key(pod), uid))

    async def _finish_deletion(self, pod: PodBody) -> None:
        """Graceful deletion: the containers stop (holding their CPUs and devices), then the kubelet
        releases them and confirms the deletion."""
        uid, namespace, name = objects.uid(pod), objects.namespace(pod), objects.name(pod)
        try:
            grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            await asyncio.sleep(max(0.0, min(self.container_stop_seconds, grace)))
            record = self._records.get(uid)
            if record is not None and record.admitted and not record.released:
                await self.status.set_status(
                    uid, namespace, name, {"containerStatuses": stopped_containers(record, 0)}
                )
            self._release(uid)
            await self.kube.delete_pod(namespace, name, grace_period_seconds=0, uid=uid)
        except NotFound:
            pass
        except KubeError as exc:
            self._log.warning("pod_deletion_unconfirmed", pod=objects.object_key(pod), error=str(exc))
        finally:
            self._deleting.discard(uid)

    async def _restore(self, pod: PodBody) -> None:
        """Take over a pod already Running here (a new kubelet process): re-read its recorded
        assignment (the checkpoint) and admit it again from what it holds."""
        try:
            record = read_assignment(pod)
        except InvalidInput as exc:
            self._log.warning(
                "running_pod_assignment_unreadable", pod=objects.object_key(pod), error=str(exc)
            )
            return
        if record is None or not record.admitted:
            return
        uid = objects.uid(pod)
        record.uid, record.annotated = uid, True
        async with self._admit_lock:
            if uid in self._records:
                return
            self._records.remember(record)
            for c in record.containers:
                self.devices.pod_devices.setdefault(uid, {})[c.name] = {
                    r: frozenset(d) for r, d in c.devices.items()
                }
                if c.cpus:
                    self.cpus.assignments.setdefault(uid, {})[c.name] = c.cpus
                if c.memory and self.memory is not None:
                    self.memory.restore(uid, c.name, c.memory)
            self._log.info("running_pod_restored", pod=record.key)
            await self._readmit(pod, record)
            self._changed()

    async def _readmit(self, pod: PodBody, record: PodAdmission) -> None:
        """kubelet's re-admission after a restart: hints from what the pod holds, merge, allocate
        (a no-op for what is held); a pod that no longer fits is rejected and its resources freed."""
        scratch = PodAdmission(record.namespace, record.name, record.uid, self.node_name, admitted=False)
        try:
            await self._admitter.admit(pod, scratch)
        except (AdmissionFailure, InvalidInput) as exc:
            failure = (
                exc
                if isinstance(exc, AdmissionFailure)
                else AdmissionFailure(REASON_UNEXPECTED_ADMISSION, str(exc))
            )
            record.admitted, record.reason, record.message = False, failure.reason, failure.message
            self._release(record.uid)
            self._log.warning("running_pod_rejected_on_readmission", pod=record.key, reason=failure.reason)
            await self._publisher.publish(pod, record)

    def _active_pods(self, uid: str) -> list[PodBody]:
        pods: list[PodBody] = []
        for record in self.active_records():
            pod = None if self._pods is None else self._pods.get(record.key)
            if record.uid != uid and pod is not None:
                pods.append(pod)
        return pods

    def _next_batch(self, first: tuple[str, str]) -> list[PodBody]:
        """Every pod waiting now, oldest first (``HandlePodAdditions`` sorts by creation time).

        Called with the admission lock held: what arrived while the last pod was admitted joins.
        """
        assert self._pods is not None
        items = [first]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        batch: list[PodBody] = []
        for key, uid in items:
            self._queued.discard(uid)
            pod = self._pods.get(key)
            if pod is None or objects.uid(pod) != uid:
                continue
            if uid in self._records or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            if not objects.metadata(pod).get("deletionTimestamp"):
                batch.append(pod)
        return sorted(batch, key=_creation_key)

    async def _admission_worker(self) -> None:
        while True:
            first = await self._queue.get()
            async with self._admit_lock:
                batch = self._next_batch(first)
            for pod in batch:
                key = objects.object_key(pod)
                async with self._admit_lock:
                    with structlog.contextvars.bound_contextvars(pod=key, node=self.node_name):
                        try:
                            await self._admit_and_publish(pod)
                        except Exception:
                            self._log.exception("admission_crashed", pod=key)

    # -- admission --------------------------------------------------------------------------------

    async def _admit_and_publish(self, pod: PodBody) -> None:
        meta = pod["metadata"]
        record = PodAdmission(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            node=self.node_name,
            admitted=False,
            topology_policy=self.topology_policy,
            topology_scope=self.config.topology_manager_scope,
            cpu_manager_policy=self.cpu_manager_policy,
        )
        self._remove_stale_state()
        await admit_pod(self._admitter, pod, record, self._active_pods(record.uid), self._allocatable())
        self._records.remember(record)
        self._changed()
        if record.admitted:
            self._log.info(
                "pod_admitted",
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
        else:
            self._log.warning("pod_rejected", reason=record.reason, message=record.message)
        await self._publisher.publish(pod, record)
        record.published = True
        self._changed()

    def _allocatable(self) -> tuple[int, int, int]:
        status = self.node_status()["allocatable"]
        return (
            quantity_milli_value(status["cpu"]),
            quantity_value(status["memory"]),
            int(status["pods"]),
        )

    async def terminate_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        """End a pod's containers (``Succeeded`` or ``Failed``) and release its CPUs and devices."""
        if phase not in ("Succeeded", "Failed"):
            raise InvalidInput(f"a terminated pod's phase is Succeeded or Failed, not {phase!r}")
        record = self.admission(namespace, name)
        if record is None or not record.admitted:
            raise InvalidInput(f"pod {namespace}/{name} was not admitted by the kubelet of {self.node_name}")
        statuses = stopped_containers(record, 0 if phase == "Succeeded" else 1)
        await self.kube.patch_pod_status(namespace, name, {"phase": phase, "containerStatuses": statuses})
        self._release(record.uid)

    def describe_resources(self) -> list[JSON]:
        """Per resource: device counts, registration count and plugin options (for logs and demos)."""
        return self.devices.describe()
