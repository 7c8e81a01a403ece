"""What the kubelet writes to the API server: the node status (capacity and allocatable, like
``setters.go``) and pod statuses through a status manager that keeps a failed write and retries it
until it lands, as kubelet's ``status_manager`` does on its periodic sync, and that leaves the
conditions kubelet does not own as it found them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from hamid.kube.client import KubeClient
from hamid.kube.errors import KubeError, NotFound
from hamid.kube.events import EventRecorder
from hamid.model.kube import JSON, PodBody
from hamidsim.kubelet.assignment import ASSIGNMENT_ANNOTATION, ContainerAssignment, PodAdmission
from hamidsim.kubelet.errors import REJECTED_PREFIX
from hamidsim.kubelet.podutil import is_restartable_init, pod_containers, pod_qos_class


def now_text() -> str:
    """The current time as Kubernetes writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container_base(uid: str, name: str, image: str) -> JSON:
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "restartCount": 0,
        "containerID": f"sim://{uid}/{name}",
    }


def running_status(pod: Mapping[str, Any], record: PodAdmission, error: str | None) -> JSON:
    """``Running`` with every container started, or ``Pending`` with ``CreateContainerConfigError``."""
    now = now_text()
    statuses: list[JSON] = []
    init_statuses: list[JSON] = []
    for (container, is_init), assignment in zip(pod_containers(pod), record.containers, strict=True):
        base = _container_base(record.uid, assignment.name, str(container.get("image") or ""))
        if error is not None:
            state: JSON = {"waiting": {"reason": "CreateContainerConfigError", "message": error}}
            base |= {"ready": False, "started": False, "state": state}
        elif is_init and not is_restartable_init(container):
            done = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            base |= {"ready": True, "started": False, "state": {"terminated": done}}
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


def rejected_status(pod: Mapping[str, Any], record: PodAdmission) -> JSON:
    """kubelet's ``rejectPod``: phase Failed with the reason and the prefixed message."""
    return {
        "phase": "Failed",
        "reason": record.reason,
        "message": REJECTED_PREFIX + record.message,
        "qosClass": pod_qos_class(pod),
    }


def stopped_containers(record: PodAdmission, exit_code: int) -> list[JSON]:
    """Every app container terminated with ``exit_code``."""
    now = now_text()
    reason = "Completed" if exit_code == 0 else "Error"
    return [
        _container_base(record.uid, c.name, "")
        | {
            "ready": False,
            "started": False,
            "state": {
                "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}
            },
        }
        for c in record.containers
        if not c.init
    ]


#: The pod conditions kubelet owns (``kubetypes.PodConditionsByKubelet``); it keeps any other.
KUBELET_CONDITIONS = frozenset(
    {"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers"}
)


def kubelet_status_patch(status: JSON) -> JSON:
    """A status as kubelet's status manager patches it: its own conditions merged by type, so a
    condition it does not own (a readiness gate's, the scheduler's record) stays as another writer
    left it (``mergePodStatus`` keeps them, and its two-way strategic patch leaves them out); each
    container status replaced whole."""
    patch = dict(status)
    if "conditions" in status:
        patch["conditions"] = [c for c in status["conditions"] if c.get("type") in KUBELET_CONDITIONS]
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in status:
            patch[key] = [{**c, "$patch": "replace"} for c in status[key]]
    return patch


class StatusManager:
    """Writes pod statuses; a failed write is kept (the latest one per pod) and retried."""

    def __init__(self, kube: KubeClient, log: Any, retry_interval: float = 1.0) -> None:
        self.kube = kube
        self.retry_interval = retry_interval
        self._log = log
        self._pending: dict[str, tuple[str, str, JSON]] = {}
        self._wake = asyncio.Event()
        self.retries = 0

    @property
    def pending(self) -> int:
        """Pod statuses still waiting to be written."""
        return len(self._pending)

    async def set_status(self, uid: str, namespace: str, name: str, status: JSON) -> bool:
        """Write now; on failure keep it for the retry loop. True if it landed."""
        self._pending.pop(uid, None)
        return await self._write(uid, namespace, name, status)

    async def _write(self, uid: str, namespace: str, name: str, status: JSON) -> bool:
        try:
            await self.kube.patch_pod_status(namespace, name, kubelet_status_patch(status), strategic=True)
        except NotFound:
            return False
        except KubeError as exc:
            self._log.warning("pod_status_update_failed_retrying", pod=f"{namespace}/{name}", error=str(exc))
            self._pending[uid] = (namespace, name, status)
            self._wake.set()
            return False
        return True

    def forget(self, uid: str) -> None:
        """Drop a pending write (the pod is gone)."""
        self._pending.pop(uid, None)

    async def run(self) -> None:
        """Retry pending writes every ``retry_interval`` seconds until each lands or its pod is gone."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.retry_interval)
            for uid, (namespace, name, status) in list(self._pending.items()):
                if self._pending.get(uid) != (namespace, name, status):
                    continue
                del self._pending[uid]
                self.retries += 1
                await self._write(uid, namespace, name, status)
            if self._pending:
                self._wake.set()


class PodPublisher:
    """Writes a decision out: the assignment annotation, then the pod status (Running, or Failed
    with a Warning event, as kubelet's ``rejectPod``)."""

    def __init__(
        self,
        kube: KubeClient,
        status: StatusManager,
        pre_start: Callable[[Iterable[ContainerAssignment]], Awaitable[str | None]],
        on_change: Callable[[], None],
        log: Any,
    ) -> None:
        self.kube = kube
        self.status = status
        self.events: EventRecorder | None = None
        self._pre_start = pre_start
        self._on_change = on_change
        self._log = log

    async def publish(self, pod: PodBody, record: PodAdmission) -> None:
        """Annotation and status for an admitted pod; event and Failed status for a rejected one."""
        if not record.admitted:
            if self.events is not None:
                await self.events.record(pod, "Warning", record.reason, record.message)
            await self.status.set_status(
                record.uid, record.namespace, record.name, rejected_status(pod, record)
            )
            return
        await self.annotate(record)
        pre_start_error = await self._pre_start(record.containers)
        status = running_status(pod, record, pre_start_error)
        await self.status.set_status(record.uid, record.namespace, record.name, status)
        if pre_start_error and self.events is not None:
            await self.events.record(pod, "Warning", "Failed", f"Error: {pre_start_error}")

    async def annotate(self, record: PodAdmission, attempts: int = 5) -> None:
        """Write the assignment annotation, retrying a failed write with backoff."""
        annotation = json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True)
        for attempt in range(attempts):
            try:
                await self.kube.patch_pod_metadata(
                    record.namespace, record.name, annotations={ASSIGNMENT_ANNOTATION: annotation}
                )
            except NotFound:
                return
            except KubeError as exc:
                self._log.warning("assignment_annotation_not_recorded", attempt=attempt, error=str(exc))
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            record.annotated = True
            self._on_change()
            return
