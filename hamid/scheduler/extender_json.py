"""kube-scheduler extender wire types (``k8s.io/kube-scheduler/extender/v1``), decoded like Go.

The Go structs carry no JSON tags, so keys are the Go field names (``Pod``, ``NodeNames``, ...);
Go's decoder matches keys case-insensitively (:func:`hamid.model._wire.go_field`), so
``pod``/``nodenames`` from older HAMi-style clients are accepted too. Responses use the canonical
Go names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from hamid.model import objects
from hamid.model._wire import go_field, type_name
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.resources import all_containers, check_pod_metadata


@dataclass(frozen=True, slots=True)
class FilterArgs:
    """``ExtenderArgs`` of a filter call: the pod and either node names or full Node objects."""

    pod: JSON
    node_names: tuple[str, ...] | None
    nodes: tuple[JSON, ...] | None

    @property
    def candidate_names(self) -> tuple[str, ...]:
        """Names of every candidate node, in request order (from NodeNames or Nodes.items)."""
        if self.node_names is not None:
            return self.node_names
        return tuple(objects.name(n) for n in self.nodes or ())


def decode_filter_args(body: Any) -> FilterArgs:
    """Decode ``ExtenderArgs``; raise :class:`InvalidInput` with the reason when malformed."""
    if not isinstance(body, dict):
        raise InvalidInput("extender args must be a JSON object")
    pod = go_field(body, "Pod")
    if not isinstance(pod, dict):
        raise InvalidInput("extender args missing pod")
    if not isinstance(pod.get("metadata"), dict):
        raise InvalidInput("extender args pod has no metadata")
    check_pod_metadata(pod)
    _check_containers(pod)
    raw_names = go_field(body, "NodeNames")
    node_names: tuple[str, ...] | None = None
    if raw_names is not None:
        if not isinstance(raw_names, list) or not all(map(isinstance, raw_names, repeat(str))):  # C speed
            raise InvalidInput("NodeNames must be a list of strings")
        node_names = tuple(raw_names)
    raw_nodes = go_field(body, "Nodes")
    nodes = None if raw_nodes is None else _decode_node_list(raw_nodes)
    if node_names is None and nodes is None:
        raise InvalidInput("extender args carry neither NodeNames nor Nodes")
    return FilterArgs(pod=pod, node_names=node_names, nodes=nodes)


def _check_containers(pod: JSON) -> None:
    """Every (init) container an object with a non-empty string ``name``, as the API server ensures.

    Names are keys downstream (the NUMA prediction names its containers, memoized per pod shape).
    """
    for i, c in enumerate(all_containers(pod)):
        name = c.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"extender args pod container {i}: name must be a non-empty string")


def _decode_node_list(raw: Any) -> tuple[JSON, ...]:
    """``Nodes``: a NodeList object whose ``items`` is a list of Nodes with string names."""
    if not isinstance(raw, dict):
        raise InvalidInput("Nodes must be a NodeList object")
    items = go_field(raw, "items")
    if not isinstance(items, list):
        raise InvalidInput(f"Nodes.items must be a list of Node objects, got {type_name(items)}")
    for i, n in enumerate(items):
        meta = n.get("metadata") if isinstance(n, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise InvalidInput(f"Nodes.items[{i}] must be a Node object with a metadata.name string")
    return tuple(items)


@dataclass(slots=True)
class FilterResult:
    """``ExtenderFilterResult``."""

    node_names: list[str] | None = None
    nodes: list[JSON] | None = None
    failed_nodes: dict[str, str] = field(default_factory=dict)
    failed_and_unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> JSON:
        """The Go-cased response body."""
        out: JSON = {"FailedNodes": self.failed_nodes}
        if self.node_names is not None:
            out["NodeNames"] = self.node_names
        if self.nodes is not None:
            out["Nodes"] = {"metadata": {}, "items": self.nodes}
        if self.failed_and_unresolvable:
            out["FailedAndUnresolvableNodes"] = self.failed_and_unresolvable
        if self.error:
            out["Error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class BindArgs:
    """``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def decode_bind_args(body: Any) -> BindArgs:
    """Decode ``ExtenderBindingArgs``; every field must be a non-empty string."""
    if not isinstance(body, dict):
        raise InvalidInput("binding args must be a JSON object")
    values: dict[str, str] = {}
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = go_field(body, name)
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"binding args field {name} must be a non-empty string")
        values[name] = value
    return BindArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])
