"""The Kubernetes objects hamid reads, as typed read-only views of their wire JSON.

Objects travel as decoded JSON dicts in wire form (camelCase keys, exactly as the API server
serves them). :data:`JSON` is a dict hamid owns and may build or change (a request body, a fresh
copy); the TypedDicts below describe an object hamid only *reads*, with the fields hamid reads
(kopf's ``bodies`` is the model). Every field is ``ReadOnly`` and every nested collection a
``Mapping`` or ``Sequence``, so a write anywhere inside — ``pod["metadata"]["annotations"][key] =
value`` — is a type error. That matters most for the records the caches share: the scheduler's pod
records share their parts between pods (see :mod:`hamid.scheduler.podtrim`), so one stray write
would change many pods at once.

Every field is optional (``total=False``): a wire object may lack any of them, and readers use
``.get`` or :mod:`hamid.model.objects`. A view is made from decoded JSON by :func:`view`, at the
one place that owns the object (a cache's trim); nothing is copied or checked at run time. A
reader that also takes dicts its callers own takes :data:`PodBody` (and the like), which still
makes a write an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from typing_extensions import ReadOnly, TypedDict

#: A wire-form object hamid owns: built for a request, or a fresh copy it may change.
JSON = dict[str, Any]
#: Any object, read only (kind unknown or not modelled).
Body = Mapping[str, Any]
#: A resource quantity as the wire carries it ("1500m", "16Gi"; tests and old clients send numbers).
Quantity = str | int | float


class ObjectMeta(TypedDict, total=False):
    """``metadata``: the fields hamid reads."""

    name: ReadOnly[str]
    namespace: ReadOnly[str]
    uid: ReadOnly[str]
    resourceVersion: ReadOnly[str]
    generation: ReadOnly[int]
    labels: ReadOnly[Mapping[str, str]]
    annotations: ReadOnly[Mapping[str, str]]
    deletionTimestamp: ReadOnly[str]
    creationTimestamp: ReadOnly[str]
    ownerReferences: ReadOnly[Sequence[Mapping[str, Any]]]


class Object(TypedDict, total=False):
    """What every object has: its kind and its metadata."""

    apiVersion: ReadOnly[str]
    kind: ReadOnly[str]
    metadata: ReadOnly[ObjectMeta]


class ResourceRequirements(TypedDict, total=False):
    """A container's ``resources``."""

    limits: ReadOnly[Mapping[str, Quantity]]
    requests: ReadOnly[Mapping[str, Quantity]]


class Container(TypedDict, total=False):
    """One entry of ``spec.containers`` or ``spec.initContainers``."""

    name: ReadOnly[str]
    image: ReadOnly[str]
    resources: ReadOnly[ResourceRequirements]
    restartPolicy: ReadOnly[str]
    env: ReadOnly[Sequence[Mapping[str, Any]]]
    securityContext: ReadOnly[Mapping[str, Any]]


class PodSpec(TypedDict, total=False):
    """A pod's ``spec``."""

    nodeName: ReadOnly[str]
    schedulerName: ReadOnly[str]
    runtimeClassName: ReadOnly[str]
    nodeSelector: ReadOnly[Mapping[str, str]]
    terminationGracePeriodSeconds: ReadOnly[int]
    overhead: ReadOnly[Mapping[str, Quantity]]
    containers: ReadOnly[Sequence[Container]]
    initContainers: ReadOnly[Sequence[Container]]


class ContainerStatus(TypedDict, total=False):
    """One entry of ``status.containerStatuses`` or ``status.initContainerStatuses``."""

    name: ReadOnly[str]
    state: ReadOnly[Mapping[str, Mapping[str, Any]]]


class Condition(TypedDict, total=False):
    """One entry of a ``status.conditions`` list."""

    type: ReadOnly[str]
    status: ReadOnly[str]
    reason: ReadOnly[str]
    message: ReadOnly[str]


class PodStatus(TypedDict, total=False):
    """A pod's ``status``."""

    phase: ReadOnly[str]
    reason: ReadOnly[str]
    qosClass: ReadOnly[str]
    conditions: ReadOnly[Sequence[Condition]]
    containerStatuses: ReadOnly[Sequence[ContainerStatus]]
    initContainerStatuses: ReadOnly[Sequence[ContainerStatus]]


class Pod(Object, total=False):
    """A pod, read only (a cache record or an object just read)."""

    spec: ReadOnly[PodSpec]
    status: ReadOnly[PodStatus]


class NodeStatus(TypedDict, total=False):
    """A node's ``status``."""

    allocatable: ReadOnly[Mapping[str, Quantity]]
    capacity: ReadOnly[Mapping[str, Quantity]]
    conditions: ReadOnly[Sequence[Condition]]


class Node(Object, total=False):
    """A node, read only."""

    status: ReadOnly[NodeStatus]


class ResourceQuotaSpec(TypedDict, total=False):
    """A ResourceQuota's ``spec``."""

    hard: ReadOnly[Mapping[str, Quantity]]


class ResourceQuotaStatus(ResourceQuotaSpec, total=False):
    """A ResourceQuota's ``status``: the ``hard`` limits in force and what is ``used``."""

    used: ReadOnly[Mapping[str, Quantity]]


class ResourceQuota(Object, total=False):
    """A ResourceQuota, read only."""

    spec: ReadOnly[ResourceQuotaSpec]
    status: ReadOnly[ResourceQuotaStatus]


#: A pod or node hamid reads: a cache's record, or a wire dict its caller owns and hands over for
#: reading. Either way the reader may not write (a write must type-check against the view too).
PodBody = Pod | JSON
NodeBody = Node | JSON
QuotaBody = ResourceQuota | JSON

View = TypeVar("View", Pod, Node, ResourceQuota)


def view(kind: type[View], obj: Mapping[str, Any]) -> View:
    """``obj`` (decoded wire JSON of that kind) typed as the read-only view ``kind``.

    No copy and no check: the caller owns ``obj`` and from here on only reads it.
    """
    return cast(View, obj)
