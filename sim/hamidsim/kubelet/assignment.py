"""The simulated kubelet's record of each decision, published in the pod annotation
:data:`ASSIGNMENT_ANNOTATION` (the sim's counterpart of kubelet's checkpoints): per container the
Topology Manager's hint, the exclusive CPUs, the devices with their NUMA nodes, every
``GetPreferredAllocation`` call and the ``Allocate`` answer."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hamid.model import objects
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamidsim.kubelet.cadvisor import format_cpu_list, parse_cpu_list
from hamidsim.kubelet.topologymanager import TopologyHint

#: Pod annotation with the kubelet's decision (JSON, see :meth:`PodAdmission.to_json`).
ASSIGNMENT_ANNOTATION = "sim.hamid.io/assignment"


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
    #: The Static memory manager's blocks: memory type → (NUMA nodes, bytes).
    memory: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    #: An init container with ``restartPolicy: Always`` (a sidecar): PodResources reports it.
    restartable: bool = False

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
            "restartable": self.restartable,
            "hint": hint,
            "numaNode": self.numa_node,
            "cpus": format_cpu_list(self.cpus),
            "cpuNumaNodes": list(self.cpu_numa_nodes),
            "devices": {k: list(v) for k, v in self.devices.items()},
            "deviceNumaNodes": {k: list(v) for k, v in self.device_numa_nodes.items()},
            "preferredAllocation": [c.to_json() for c in self.preferred_calls],
            "allocate": self.allocate,
            "env": self.env,
            "memory": {k: {"numaNodes": list(n), "size": size} for k, (n, size) in self.memory.items()},
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
            restartable=bool(data.get("restartable")),
            hint=hint,
            cpus=parse_cpu_list(str(data.get("cpus") or ""), "assignment cpus"),
            cpu_numa_nodes=tuple(data.get("cpuNumaNodes") or ()),
            devices={k: tuple(v) for k, v in (data.get("devices") or {}).items()},
            device_numa_nodes={k: tuple(v) for k, v in (data.get("deviceNumaNodes") or {}).items()},
            preferred_calls=[PreferredCall.from_json(c) for c in data.get("preferredAllocation") or ()],
            allocate=dict(data.get("allocate") or {}),
            memory={
                k: (tuple(int(n) for n in v["numaNodes"]), int(v["size"]))
                for k, v in (data.get("memory") or {}).items()
            },
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
    topology_scope: str = ""
    cpu_manager_policy: str = ""
    #: True once the pod's containers stopped and its CPUs and devices went back.
    released: bool = False
    #: True once the annotation and the pod status have been written (or failed to be).
    published: bool = False
    #: True once the annotation holds this record (PodResources reports only such pods).
    annotated: bool = False

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
            "topologyScope": self.topology_scope,
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
            topology_scope=str(data.get("topologyScope") or ""),
            cpu_manager_policy=str(data.get("cpuManagerPolicy") or ""),
        )


def read_assignment(pod: Mapping[str, Any]) -> PodAdmission | None:
    """The simulated kubelet's decision recorded on ``pod`` (a wire-form dict), or None.

    Raises :class:`InvalidInput` when the annotation is present but not a valid document.
    """
    raw = objects.annotations(pod).get(ASSIGNMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        return PodAdmission.from_json(objects.namespace(pod), objects.name(pod), json.loads(raw))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"pod annotation {ASSIGNMENT_ANNOTATION}: not a valid assignment: {exc}") from exc


class AdmissionRecords:
    """Every decision by pod UID (the newest ``max_records``), and the latest UID per ``namespace/name``."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._by_uid: OrderedDict[str, PodAdmission] = OrderedDict()
        self._uid_by_key: dict[str, str] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def get(self, uid: str) -> PodAdmission | None:
        """The decision on the pod with this UID."""
        return self._by_uid.get(uid)

    def by_key(self, key: str) -> PodAdmission | None:
        """The decision on the latest incarnation of ``namespace/name``."""
        uid = self._uid_by_key.get(key)
        return None if uid is None else self._by_uid.get(uid)

    def remember(self, record: PodAdmission) -> None:
        """Keep ``record``, dropping the oldest beyond ``max_records``."""
        self._by_uid[record.uid] = record
        self._uid_by_key[record.key] = record.uid
        while len(self._by_uid) > self.max_records:
            _, old = self._by_uid.popitem(last=False)
            if self._uid_by_key.get(old.key) == old.uid:
                del self._uid_by_key[old.key]

    def active(self) -> list[PodAdmission]:
        """Admitted pods whose containers have not stopped yet."""
        return [r for r in self._by_uid.values() if r.admitted and not r.released]

    def reported(self) -> list[PodAdmission]:
        """What PodResources ``List`` shows: active pods whose annotation already says the same."""
        return [r for r in self.active() if r.annotated]
