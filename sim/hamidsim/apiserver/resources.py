"""The kinds the embedded API server serves, their paths, field selectors and discovery documents."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hamidsim.apiserver.select import FieldGetter, path_getter

Converter = Callable[[dict[str, Any]], dict[str, Any]]

_CRUD = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_META_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": path_getter("metadata", "name"),
    "metadata.namespace": path_getter("metadata", "namespace"),
}


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


@dataclass(frozen=True)
class Resource:
    """One served resource (a group/version/plural), possibly a view onto another's storage."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    fields: Mapping[str, FieldGetter] = field(default_factory=lambda: dict(_META_FIELDS))
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _CRUD
    #: Key of the storage this resource reads and writes (views share their base's storage).
    storage: str = ""
    #: Storage form -> this resource's wire form, and back.
    to_view: Converter = _identity
    from_view: Converter = _identity

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def store_key(self) -> str:
        """Key of the storage this resource uses."""
        return self.storage or self.plural

    @property
    def stored(self) -> bool:
        """Whether objects of this resource are kept (TokenReview and Binding are not)."""
        return "list" in self.verbs

    @property
    def has_status(self) -> bool:
        """Whether the resource has a ``/status`` subresource (status is then ignored on the main path)."""
        return "status" in self.subresources

    def describe(self) -> list[dict[str, Any]]:
        """``APIResource`` entries for discovery (the resource and its subresources)."""
        entries = [
            {
                "name": self.plural,
                "singularName": self.kind.lower(),
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": list(self.verbs),
                **({"shortNames": list(self.short_names)} if self.short_names else {}),
            }
        ]
        for sub in self.subresources:
            sub_kind = "Binding" if sub == "binding" else self.kind
            sub_verbs = ["create"] if sub == "binding" else ["get", "patch", "update"]
            entries.append(
                {
                    "name": f"{self.plural}/{sub}",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": sub_kind,
                    "verbs": sub_verbs,
                }
            )
        return entries


# --- events: core/v1 is the storage form, events.k8s.io/v1 a converted view ----------------------

_EVENT_RENAMES = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
)
_EVENT_SHARED = (
    "metadata",
    "reason",
    "type",
    "action",
    "related",
    "series",
    "eventTime",
    "reportingInstance",
)


def core_event_to_events_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored core/v1 Event as events.k8s.io/v1 serves it."""
    out: dict[str, Any] = {"kind": "Event", "apiVersion": "events.k8s.io/v1"}
    for key in _EVENT_SHARED:
        if key in obj:
            out[key] = obj[key]
    for core, new in _EVENT_RENAMES:
        if obj.get(core) not in (None, "", {}):
            out[new] = obj[core]
    return out


def events_v1_to_core_event(obj: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event in the core/v1 storage form."""
    out: dict[str, Any] = {"kind": "Event", "apiVersion": "v1"}
    for key in _EVENT_SHARED:
        if key in obj:
            out[key] = obj[key]
    for core, new in _EVENT_RENAMES:
        if obj.get(new) not in (None, "", {}):
            out[core] = obj[new]
    return out


#: Boolean fields: a missing one reads as Go's zero value.
_BOOL_FIELDS = frozenset({"spec.hostNetwork", "spec.unschedulable"})


def _getters(*paths: str, **renamed: tuple[str, ...]) -> dict[str, FieldGetter]:
    getters = dict(_META_FIELDS)
    for dotted in paths:
        getters[dotted] = path_getter(*dotted.split("."), default="false" if dotted in _BOOL_FIELDS else "")
    for name, path in renamed.items():
        getters[name] = path_getter(*path)
    return getters


_POD_FIELDS = _getters(
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = _getters(
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
    source=("source", "component"),
)
_EVENT_V1_FIELDS = _getters(
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
)

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", False, ("status",), _getters("status.phase"), ("ns",)),
    Resource("", "v1", "nodes", "Node", False, ("status",), _getters("spec.unschedulable"), ("no",)),
    Resource("", "v1", "pods", "Pod", True, ("status", "binding"), _POD_FIELDS, ("po",)),
    Resource("", "v1", "events", "Event", True, (), _EVENT_FIELDS, ("ev",)),
    Resource("", "v1", "resourcequotas", "ResourceQuota", True, ("status",), short_names=("quota",)),
    Resource("", "v1", "bindings", "Binding", True, verbs=("create",)),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        True,
        fields=_EVENT_V1_FIELDS,
        short_names=("ev",),
        storage="events",
        to_view=core_event_to_events_v1,
        from_view=events_v1_to_core_event,
    ),
    Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=("create",)),
    Resource(
        "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False, verbs=("create",)
    ),
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
)

#: (api_version, plural) -> resource.
BY_PATH: dict[tuple[str, str], Resource] = {(r.api_version, r.plural): r for r in RESOURCES}
#: Storage key -> the resource whose wire form is the storage form.
BY_STORAGE: dict[str, Resource] = {r.plural: r for r in RESOURCES if r.stored and not r.storage}
GROUPS: dict[str, list[str]] = {}
for _resource in RESOURCES:
    if _resource.group and _resource.version not in GROUPS.setdefault(_resource.group, []):
        GROUPS[_resource.group].append(_resource.version)


def lookup_kind(kind: str, api_version: str | None = None) -> Resource:
    """The stored resource for a kind, plural or short name (case-insensitive), e.g. ``Pod`` or ``pods``.

    ``Event`` means the core/v1 form unless ``api_version`` is ``events.k8s.io/v1``.
    """
    wanted = kind.lower()
    for resource in RESOURCES:
        if not resource.stored or (api_version is not None and resource.api_version != api_version):
            continue
        if wanted in (resource.kind.lower(), resource.plural, *resource.short_names):
            return resource
    raise KeyError(
        f"the embedded API server does not serve kind {kind!r}"
        + (f" in {api_version}" if api_version else "")
    )


def discovery_api_versions(address: str) -> dict[str, Any]:
    """``GET /api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def discovery_groups() -> dict[str, Any]:
    """``GET /apis``."""
    groups = []
    for group, versions in GROUPS.items():
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def discovery_group(group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``, or ``None`` for an unknown group."""
    versions = GROUPS.get(group)
    if versions is None:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def discovery_resources(api_version: str) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``GET /apis/<group>/<version>``, or ``None`` when not served."""
    entries = [e for r in RESOURCES if r.api_version == api_version for e in r.describe()]
    if not entries:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": entries}
