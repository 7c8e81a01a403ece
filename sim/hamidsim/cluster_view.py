"""What tests, the demo and the soak do with a simulated cluster: pods in, facts out.

:class:`ClusterView` is the part of :class:`~hamidsim.cluster.SimCluster` that needs no start-up:
admitting and creating pods through the scheduler's webhook, waiting on them, and reading what
each component decided (allocation annotations and their history, the kubelet's admissions, the
scheduler's accounting, events, the plugins' refit calls).
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import base64
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from hamid.kube.client import KubeClient
from hamid.model import objects
from hamid.model.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, VGPU_NODE, decode_pod_devices
from hamid.model.devices import PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.scheduler.core import Scheduler
from hamid.scheduler.ledger import Reservation
from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.patch import json_patch
from hamidsim.apiserver.store import Change
from hamidsim.kube_scheduler import KubeSchedulerDriver
from hamidsim.kubelet import PodAdmission, SimKubelet, read_assignment
from hamidsim.machine import Machine

#: Per node, per GPU UUID: (slots, MiB, cores).
GpuUsage = dict[str, dict[str, tuple[int, int, int]]]
_POLL_S = 0.01
#: Name of the MutatingWebhookConfiguration registering the scheduler's webhook.
WEBHOOK_CONFIGURATION = "hamid-webhook"


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll an in-process predicate until true; TimeoutError naming ``what`` after ``timeout`` s."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                if predicate():
                    return
                await asyncio.sleep(_POLL_S)
    except TimeoutError:
        raise TimeoutError(f"{what}: not reached within {timeout:g}s") from None


@dataclass(frozen=True, slots=True)
class RefitCall:
    """One mismatch the plugin saw (``door``: GetPreferredAllocation or Allocate) and what its
    NUMA mismatch policy answered.

    ``outcome`` is ``refitted`` (``devices`` holds the new GPUs), ``unaligned`` (no refit applied:
    the allocation annotation stands and the pod runs on its accounted GPUs without NUMA alignment)
    or ``failed`` (the allocation was failed; ``error`` says why).
    """

    node: str
    pod: str
    container_index: int
    annotated: tuple[str, ...]
    missing: tuple[str, ...]
    allowed: tuple[str, ...]
    outcome: str
    devices: tuple[str, ...] = ()
    error: str = ""
    door: str = "GetPreferredAllocation"


class ViewOptions(Protocol):
    """What the view reads of the cluster's options (:class:`~hamidsim.cluster.ClusterOptions`)."""

    @property
    def admission_webhook(self) -> bool: ...


class ViewNode(Protocol):
    """What the view reads of a simulated node (:class:`~hamidsim.cluster.SimNode`)."""

    @property
    def machine(self) -> Machine: ...

    @property
    def kubelet(self) -> SimKubelet: ...


class ClusterView(ABC):
    """Pods in, facts out, over the parts :class:`~hamidsim.cluster.SimCluster` started."""

    options: ViewOptions
    server: ApiServer
    nodes: Mapping[str, ViewNode]
    refits: list[RefitCall]
    _session: aiohttp.ClientSession | None
    _driver: KubeSchedulerDriver | None
    _history: dict[str, dict[str, list[str]]]

    @property
    @abstractmethod
    def kube(self) -> KubeClient:
        """A client of the embedded API server."""

    @property
    @abstractmethod
    def scheduler(self) -> Scheduler:
        """The running scheduler."""

    @property
    @abstractmethod
    def cluster_url(self) -> str:
        """Base URL of the scheduler's TLS cluster listener."""

    @property
    @abstractmethod
    def ca_file(self) -> Path:
        """The CA certificate the cluster listener's certificate chains to."""

    # -- pods -----------------------------------------------------------------------------------

    async def _review(self, request: JSON) -> JSON:
        """POST one AdmissionReview request to the scheduler's webhook over TLS; its response."""
        assert self._session is not None
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        async with self._session.post(self.cluster_url + "/webhook", json=review) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise InvalidInput(f"webhook answered {resp.status}: {body}")
        response: JSON = body.get("response") or {}
        return response

    async def review_update(self, old: Mapping[str, Any], new: Mapping[str, Any], username: str) -> JSON:
        """The scheduler's webhook verdict on ``username`` updating pod ``old`` to ``new``."""
        return await self._review(
            {
                "uid": f"review-update-{objects.name(old)}",
                "namespace": objects.namespace(old) or "default",
                "operation": "UPDATE",
                "userInfo": {"username": username, "groups": ["system:authenticated"]},
                "object": dict(new),
                "oldObject": dict(old),
            }
        )

    async def admit(self, pod: Mapping[str, Any]) -> JSON:
        """Run ``pod`` through the scheduler's mutating webhook over TLS; the mutated pod."""
        response = await self._review(
            {
                "uid": f"review-{objects.name(pod)}",
                "namespace": objects.namespace(pod) or "default",
                "operation": "CREATE",
                "object": dict(pod),
            }
        )
        if not response.get("allowed"):
            raise InvalidInput(f"webhook denied the pod: {(response.get('status') or {}).get('message')}")
        if not response.get("patch"):
            return dict(pod)
        ops = json.loads(base64.b64decode(response["patch"]))
        mutated: JSON = json_patch(json.loads(json.dumps(pod)), ops)
        return mutated

    async def create_pod(self, pod: Mapping[str, Any]) -> JSON:
        """Admit ``pod`` through the webhook and create it (as the API server would)."""
        body = {"apiVersion": "v1", "kind": "Pod", **pod}
        body.setdefault("metadata", {}).setdefault("namespace", "default")
        if self.options.admission_webhook:  # the API server calls the webhook itself
            return await self.kube.create_pod(body)
        return await self.kube.create_pod(await self.admit(body))

    def webhook_configuration(self) -> JSON:
        """The chart's MutatingWebhookConfiguration, pointing at this cluster's scheduler over TLS."""
        ignore = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
        ca_pem = self.ca_file.read_bytes()
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": [
                {
                    "name": "vgpu.hami.io",
                    "admissionReviewVersions": ["v1", "v1beta1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 10,
                    "reinvocationPolicy": "Never",
                    "matchPolicy": "Equivalent",
                    "clientConfig": {
                        "url": self.cluster_url + "/webhook",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE", "UPDATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "objectSelector": ignore,
                    "namespaceSelector": ignore,
                }
            ],
        }

    def pod(self, name: str, namespace: str = "default") -> JSON:
        """The pod as stored now (raises KeyError when absent)."""
        pod = self.server.get("Pod", namespace, name)
        if pod is None:
            raise KeyError(f"pod {namespace}/{name} does not exist")
        return pod

    async def wait_pod(
        self,
        name: str,
        predicate: Callable[[JSON], bool],
        namespace: str = "default",
        timeout: float = 10.0,
        what: str = "condition",
    ) -> JSON:
        """Wait until the stored pod satisfies ``predicate``; returns it."""
        found: list[JSON] = []

        def check() -> bool:
            pod = self.server.get("Pod", namespace, name)
            if pod is not None and predicate(pod):
                found.append(pod)
                return True
            return False

        await wait_until(check, timeout, f"pod {namespace}/{name}: {what}")
        return found[0]

    async def wait_settled(self, name: str, namespace: str = "default", timeout: float = 10.0) -> JSON:
        """Wait until the pod is Running, Succeeded or Failed (admitted or rejected by its kubelet)."""
        return await self.wait_pod(
            name,
            lambda p: (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"),
            namespace,
            timeout,
            "settled (Running/Failed)",
        )

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete a pod (its kubelet releases CPUs and devices, the scheduler its reservation)."""
        await self.kube.delete_pod(namespace, name)

    async def complete_pod(self, name: str, namespace: str = "default", phase: str = "Succeeded") -> None:
        """End a running pod's containers (``Succeeded`` or ``Failed``) as its kubelet would."""
        pod = self.pod(name, namespace)
        node = str(objects.section(pod, "spec").get("nodeName") or "")
        await self.nodes[node].kubelet.terminate_pod(namespace, name, phase)

    # -- readers --------------------------------------------------------------------------------

    def _record_change(self, change: Change) -> None:
        """Keep every distinct value the allocation annotations of each pod took (API server listener)."""
        if change.resource.kind != "Pod" or change.type == "DELETED":
            return
        notes = objects.annotations(change.new.obj)
        history = self._history.setdefault(objects.namespaced_key(change.new.obj), {})
        for key in (DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE):
            value = notes.get(key)
            values = history.setdefault(key, [])
            if value is not None and (not values or values[-1] != value):
                values.append(value)

    def annotation_history(self, name: str, key: str, namespace: str = "default") -> list[str]:
        """Every distinct value annotation ``key`` of the pod took, in order (allocation keys only)."""
        return list(self._history.get(f"{namespace}/{name}", {}).get(key, []))

    def scheduler_choice(self, name: str, namespace: str = "default") -> PodDevices | None:
        """The allocation the scheduler's filter first wrote for the pod (before any refit)."""
        values = self.annotation_history(name, DEVICES_ALLOCATED, namespace)
        return decode_pod_devices(values[0]) if values else None

    def assignment(self, name: str, namespace: str = "default") -> PodAdmission | None:
        """The kubelet's decision for the pod (CPUs, NUMA node, devices, Allocate env, or the rejection).

        Read from the pod's assignment annotation, else from its kubelet's records (rejections).
        """
        pod = self.pod(name, namespace)
        recorded = read_assignment(pod)
        if recorded is not None:
            return recorded
        node = self.nodes.get(str(objects.section(pod, "spec").get("nodeName") or ""))
        return None if node is None else node.kubelet.admission(namespace, name)

    def annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        """The pod's annotations."""
        return dict(objects.annotations(self.pod(name, namespace)))

    def allocated(self, name: str, namespace: str = "default") -> PodDevices | None:
        """Decoded ``hami.io/vgpu-devices-allocated`` (None when absent)."""
        raw = self.annotations(name, namespace).get(DEVICES_ALLOCATED)
        return None if raw is None else decode_pod_devices(raw)

    def to_allocate(self, name: str, namespace: str = "default") -> PodDevices | None:
        """Decoded ``hami.io/vgpu-devices-to-allocate`` (None when absent)."""
        raw = self.annotations(name, namespace).get(DEVICES_TO_ALLOCATE)
        return None if raw is None else decode_pod_devices(raw)

    def events(self, name: str, namespace: str = "default", reason: str | None = None) -> list[JSON]:
        """Events whose involved object is the pod (optionally only ``reason``), oldest first."""
        out = [
            e
            for e in self.server.list("Event", namespace)
            if (e.get("involvedObject") or {}).get("name") == name
            and (reason is None or e.get("reason") == reason)
        ]
        return sorted(out, key=lambda e: int(objects.resource_version(e) or 0))

    def reservation(self, name: str, namespace: str = "default") -> Reservation | None:
        """The scheduler's in-memory reservation of the pod (its accounting), if any."""
        return self.scheduler.ledger.reservation(objects.uid(self.pod(name, namespace)))

    def booked_usage(self) -> GpuUsage:
        """The scheduler's accounting: per node and GPU (slots, MiB, cores), idle GPUs left out."""
        return {
            node: used
            for node, gpus in self.scheduler.ledger.snapshot().items()
            if (used := {u: v for u, v in gpus.items() if v != (0, 0, 0)})
        }

    def annotated_usage(self) -> GpuUsage:
        """Per node and GPU (slots, MiB, cores) summed from live pods' allocated annotations.

        A plain sum: equal to :meth:`booked_usage` while no live pod has GPU init containers.
        """
        usage: dict[str, dict[str, tuple[int, int, int]]] = {}
        for pod in self.server.list("Pod", None):
            notes = objects.annotations(pod)
            if objects.section(pod, "status").get("phase") in ("Succeeded", "Failed") or objects.metadata(
                pod
            ).get("deletionTimestamp"):
                continue
            raw, node = notes.get(DEVICES_ALLOCATED), notes.get(VGPU_NODE)
            if raw is None or node is None:
                continue
            gpus = usage.setdefault(node, {})
            for container in decode_pod_devices(raw):
                for d in container:
                    slots, mem, cores = gpus.get(d.uuid, (0, 0, 0))
                    gpus[d.uuid] = (slots + 1, mem + d.usedmem, cores + d.usedcores)
        return usage

    def scheduling_failures(self, name: str, namespace: str = "default") -> list[str]:
        """Errors of the kube-scheduler driver's failed attempts for the pod (unschedulable, extender)."""
        if self._driver is None:
            return []
        return [a.error for a in self._driver.attempts_for(namespace, name) if a.error]

    def refit_calls(self, name: str | None = None, namespace: str = "default") -> list[RefitCall]:
        """Refit seam calls the plugins made (for one pod when ``name`` is given)."""
        if name is None:
            return list(self.refits)
        return [r for r in self.refits if r.pod == f"{namespace}/{name}"]

    def machine(self, node: str) -> Machine:
        """The machine of a node."""
        return self.nodes[node].machine

    def gpu_numa(self, node: str) -> dict[str, int | None]:
        """GPU UUID → NUMA node on ``node``."""
        return {g.uuid: g.numa for g in self.nodes[node].machine.gpus}
