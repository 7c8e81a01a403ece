"""Mutating admission webhook (HAMi ``pkg/scheduler/webhook.go`` rules, docs/hami-wire.md §1.3 and §3.9).

AdmissionReview ``admission.k8s.io/v1`` and ``v1beta1``: the answer echoes the request's
``apiVersion``, ``kind`` and ``uid``; a mutation is a base64 JSONPatch. A pod of the wrong shape
(a list where an object belongs, limits that are not a map, a quantity that is not one) is denied
with code 400 and the reason, checked by the model's own request parsing
(:func:`hamid.model.resources.pod_requests`) so the webhook and the fit agree on what a pod asks.

Trust: at CREATE the webhook removes every scheduler-owned annotation and label a pod carries
(:data:`~hamid.model.annotations.SCHEDULER_OWNED_ANNOTATIONS`), with an admission warning, so a
tenant cannot hand itself an allocation. At UPDATE (the chart registers it, docs/trust.md) a change
(add, modify or remove) to any of them by an identity other than the scheduler's and the device
plugin's ServiceAccounts (the request's ``userInfo.username``) is denied (403) with the keys it
touched: nobody else writes an allocation for the pod's whole life. A pod that asks for hamid's resources with
``spec.nodeName`` already set is denied whoever its scheduler is (with ``hami.io/webhook: ignore``
too, when the webhook is called): it would skip the fit, the quota and the node lock. An invalid
``hami.io/numa-alignment`` is denied with upstream's wording (HAMi #2729).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from hamid.fit.fit import Quota
from hamid.log import get_logger
from hamid.model import annotations as ann
from hamid.model import hamicore, objects
from hamid.model._wire import INT32_MAX, want_list, want_object
from hamid.model.alignment import parse_alignment
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.model.quantity import quantity_as_int, quantity_value
from hamid.model.resources import (
    ResourceConfig,
    all_containers,
    check_pod_metadata,
    init_container_count,
    pod_requests,
    resource_value,
)

log = get_logger("scheduler")

ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DEFAULT_SCHEDULER = "default-scheduler"
#: Operations whose AdmissionReview carries no object to judge.
_OBJECTLESS_OPERATIONS = ("DELETE", "CONNECT")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The webhook's decision on one pod: JSONPatch ops when allowed, a message when denied."""

    allowed: bool
    patch: tuple[JSON, ...] = ()
    message: str = ""
    code: int = 200


def check_pod_shape(pod: Mapping[str, Any], config: ResourceConfig) -> None:
    """Raise :class:`InvalidInput` (with the reason) for a pod the rules below cannot read.

    ``metadata`` must be an ObjectMeta (:func:`~hamid.model.resources.check_pod_metadata`) and
    ``spec`` an object; containers,
    their resources and quantities are checked by :func:`~hamid.model.resources.pod_requests`
    (the fit's own parsing), each container's ``env`` must be a list and ``securityContext``
    an object.
    """
    check_pod_metadata(pod)
    want_object(pod.get("spec"), "pod spec")
    pod_requests(pod, config)
    for container in all_containers(pod):
        where = f"container {container.get('name')!r}"
        if container.get("env") is not None:
            want_list(container["env"], f"{where} env")
        if container.get("securityContext") is not None:
            want_object(container["securityContext"], f"{where} securityContext")


_PRESET_NODE_MESSAGE = (
    "a pod asking for hamid's GPU resources must be placed by hamid's scheduler, "
    "not created with spec.nodeName set"
)


def uses_hamid_resources(pod: Mapping[str, Any], config: ResourceConfig) -> bool:
    """Whether any (init) container names one of hamid's resources in its limits or requests."""
    return any(
        resource_value(container, name)[0]
        for container in all_containers(pod)
        for name in config.resource_names
    )


def _pointer(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def scheduler_owned_removals(pod: Mapping[str, Any]) -> tuple[tuple[JSON, ...], tuple[str, ...]]:
    """JSONPatch ops removing the scheduler-owned annotations and labels ``pod`` carries, and their keys."""
    meta = objects.metadata(pod)
    ops: list[JSON] = []
    keys: list[str] = []
    for field, owned in (
        ("annotations", ann.SCHEDULER_OWNED_ANNOTATIONS),
        ("labels", ann.SCHEDULER_OWNED_LABELS),
    ):
        present = meta.get(field) or {}
        for key in owned:
            if key in present:
                ops.append({"op": "remove", "path": f"/metadata/{field}/{_pointer(key)}"})
                keys.append(f"{field[:-1]} {key}")
    return tuple(ops), tuple(keys)


def owned_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """The scheduler-owned annotations and labels whose value differs between two pod versions
    (added, modified or removed), as ``annotation <key>`` / ``label <key>``."""
    changed: list[str] = []
    for field, owned in (
        ("annotations", ann.SCHEDULER_OWNED_ANNOTATIONS),
        ("labels", ann.SCHEDULER_OWNED_LABELS),
    ):
        before = objects.metadata(old).get(field) or {}
        after = objects.metadata(new).get(field) or {}
        if not isinstance(before, Mapping) or not isinstance(after, Mapping):
            continue  # the API server's own validation refuses such a pod
        changed += [f"{field[:-1]} {key}" for key in owned if before.get(key) != after.get(key)]
    return tuple(changed)


def review_update(
    old: Any, new: JSON, username: Any, writers: Container[str], scheduler_name: str = ""
) -> Verdict:
    """The UPDATE rule: only ``writers`` change scheduler-owned annotations and labels of a pod of
    ``scheduler_name`` (or the default scheduler's, whose GPU pods the webhook hands to it); a pod
    of another scheduler is that scheduler's business (``spec.schedulerName`` is immutable)."""
    if not isinstance(old, dict):
        return Verdict(False, message="AdmissionReview request.oldObject is not a Pod object", code=400)
    scheduler = objects.section(new, "spec").get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler_name and scheduler not in (scheduler_name, DEFAULT_SCHEDULER):
        return Verdict(True)
    changed = owned_changes(old, new)
    if not changed or (isinstance(username, str) and username in writers):
        return Verdict(True)
    who = username if isinstance(username, str) and username else "an unauthenticated user"
    return Verdict(
        False,
        message=f"{', '.join(changed)} may be changed only by hamid's scheduler and device plugin, "
        f"not by {who}: the scheduler-owned annotations record what the scheduler booked",
        code=403,
    )


def _append_env(container: JSON, name: str, value: str) -> None:
    env = container.get("env")
    if env is None:  # absent, or ``env: null`` as Kubernetes reads it
        env = container["env"] = []
    env.append({"name": name, "value": value})


def _asks_whole_card(container: JSON, config: ResourceConfig, where: str) -> bool:
    """A GPU count without cores whose memory ask is the whole card (or none): HAMi sets 100 cores."""
    count_present, _ = resource_value(container, config.resource_count_name)
    cores_present, _ = resource_value(container, config.resource_core_name)
    if not count_present or cores_present:
        return False
    pct_found, pct_raw = resource_value(container, config.resource_memory_percentage_name)
    if pct_found:  # a percentage decides: only 100 % is the whole card (rounded up, as HAMi reads it)
        return quantity_value(pct_raw, where) == 100
    mem_found, _ = resource_value(container, config.resource_memory_name)
    return not config.resource_memory_name or not mem_found


def _check_ranges(container: JSON, config: ResourceConfig, where: str) -> None:
    """InvalidInput for a memory percentage or a core count the pod could not be booked with."""
    found, raw = resource_value(container, config.resource_memory_percentage_name)
    if found:  # rounded up, as HAMi's webhook reads it (Quantity.Value): "99.5" is 100
        pct = quantity_value(raw, f"{where} {config.resource_memory_percentage_name}")
        if pct is None or not 0 <= pct <= 100:
            raise InvalidInput(f"{where}: {config.resource_memory_percentage_name} must be within [0, 100]")
    found, raw = resource_value(container, config.resource_core_name)
    if found:  # HAMi keeps any integer (int32-wrapped, negative ones too) and books it as such
        cores = quantity_as_int(raw, f"{where} {config.resource_core_name}")
        if cores is not None and not 0 <= cores <= INT32_MAX:
            raise InvalidInput(f"{where}: {config.resource_core_name} must be within [0, {INT32_MAX}]")


def _mutate_container(container: JSON, config: ResourceConfig) -> bool:
    """HAMi ``MutateAdmission`` on one container (in place); True when it uses HAMi resources."""
    where = f"container {container.get('name')!r}"
    _check_ranges(container, config, where)
    resources: JSON | None = container.get("resources")
    if resources is None:  # absent or null: the same to the API server
        resources = container["resources"] = {}
    limits = resources.get("limits")
    if limits is None:
        limits = resources["limits"] = {}
    if config.resource_priority_name in limits:
        priority = quantity_value(limits[config.resource_priority_name], f"{where} priority")
        if priority is None:  # rounded up as HAMi reads it ("1.5" is 2); None: beyond int64
            raise InvalidInput(f"{where}: {config.resource_priority_name} must be an integer")
        _append_env(container, hamicore.ENV_TASK_PRIORITY, str(priority))
    if config.gpu_core_policy and config.gpu_core_policy != "default":
        _append_env(container, hamicore.ENV_CORE_UTILIZATION_POLICY, config.gpu_core_policy)
    has = config.resource_count_name in limits
    if not has and config.default_gpu_num > 0:
        others = (
            config.resource_core_name,
            config.resource_memory_name,
            config.resource_memory_percentage_name,
        )
        if any(name in limits for name in others):
            limits[config.resource_count_name] = str(config.default_gpu_num)
            has = True
    if _asks_whole_card(container, config, where):
        limits[config.resource_core_name] = "100"
        has = True
    if not limits:
        del resources["limits"]
    if not resources:
        del container["resources"]
    if not has and config.overwrite_env:
        _append_env(container, "NVIDIA_VISIBLE_DEVICES", "none")
    return has


def _pod_quota_request(pod: JSON, config: ResourceConfig) -> tuple[int, int]:
    """max(sum of app mem x nums, max init) and the same for cores (HAMi's webhook quota precheck)."""
    requests = pod_requests(pod, config)
    n_init = init_container_count(pod)
    app_mem = app_cores = init_mem = init_cores = 0
    for i, req in enumerate(requests):
        if req is None:
            continue
        mem, cores = req.memreq * req.nums, req.coresreq * req.nums
        if i < n_init:
            init_mem, init_cores = max(init_mem, mem), max(init_cores, cores)
        else:
            app_mem, app_cores = app_mem + mem, app_cores + cores
    return max(app_mem, init_mem), max(app_cores, init_cores)


def review_pod(
    pod: JSON,
    config: ResourceConfig,
    scheduler_name: str,
    quota_of: Callable[[str], Quota | None],
    namespace: str = "",
    cpu_pods: bool = False,
    take_default: bool = True,
) -> Verdict:
    """Apply the webhook rules to a pod dict; the original is not modified.

    ``cpu_pods`` (``--schedule-cpu-pods``, off by default as in HAMi) also hands pods without GPUs
    to ``scheduler_name``, so that the ``fgd`` policy places them where they strand the least GPU.
    ``take_default`` (``--force-overwrite-default-scheduler``, on as in HAMi): pods of
    ``default-scheduler`` are handed over too; off, they are left alone like another scheduler's.
    """
    try:
        check_pod_shape(pod, config)
    except InvalidInput as exc:
        return Verdict(False, message=f"malformed pod: {exc}", code=400)
    spec = objects.section(pod, "spec")
    current = spec.get("schedulerName") or ""
    ignored = objects.labels(pod).get(ann.WEBHOOK) == ann.WEBHOOK_IGNORE
    if ignored or not _hands_over(current, scheduler_name, take_default):
        if spec.get("nodeName") and uses_hamid_resources(pod, config):
            return Verdict(False, message=_PRESET_NODE_MESSAGE, code=403)
        return Verdict(True)
    if not spec.get("containers"):
        return Verdict(False, message="pod has no containers", code=400)
    try:
        parse_alignment(objects.annotations(pod))
    except InvalidInput as exc:
        return Verdict(False, message=str(exc), code=400)
    mutated = copy.deepcopy(pod)
    try:
        ops, uses = _mutate_containers(mutated["spec"], spec, config)
    except InvalidInput as exc:
        return Verdict(False, message=str(exc), code=400)
    if not uses:
        return Verdict(True, (*ops, *_cpu_pod_route(spec, current, scheduler_name if cpu_pods else "")))
    privileged = _privileged_container(mutated["spec"])
    if privileged is not None:
        return Verdict(False, message=f"container {privileged} is privileged", code=403)
    if scheduler_name:
        if spec.get("nodeName"):
            return Verdict(False, message="pod has node assigned", code=403)  # HAMi's wording
        if current != scheduler_name:
            ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    if config.runtime_class_name and not spec.get("runtimeClassName"):
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": config.runtime_class_name})
    quota = quota_of(objects.namespace(pod) or namespace)
    if quota is not None and quota.limited:
        mem, cores = _pod_quota_request(mutated, config)
        if not quota.fits(mem, cores):
            return Verdict(False, message="exceeding resource quota", code=403)
    return Verdict(True, tuple(ops))


def _hands_over(current: str, scheduler_name: str, take_default: bool) -> bool:
    """Whether the webhook may give a pod whose ``spec.schedulerName`` is ``current`` to
    ``scheduler_name``: none named, already it, or ``default-scheduler`` when ``take_default``
    (HAMi's rule; any other scheduler's pod is that scheduler's business)."""
    return not current or current == scheduler_name or (take_default and current == DEFAULT_SCHEDULER)


def _cpu_pod_route(spec: Mapping[str, Any], current: str, scheduler_name: str) -> list[JSON]:
    """The op handing a pod without GPUs to ``scheduler_name`` ("": none; a pod on a node: none)."""
    if not scheduler_name or spec.get("nodeName") or current == scheduler_name:
        return []
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler_name}]


def _mutate_containers(
    mspec: JSON, spec: Mapping[str, Any], config: ResourceConfig
) -> tuple[list[JSON], bool]:
    """Apply the per-container defaults in place; the JSON patch ops and whether any uses a GPU."""
    ops: list[JSON] = []
    uses = False
    for key in ("initContainers", "containers"):
        for i, container in enumerate(mspec.get(key) or ()):
            uses = _mutate_container(container, config) or uses
            if container != spec[key][i]:
                ops.append({"op": "replace", "path": f"/spec/{key}/{i}", "value": container})
    return ops, uses


def _privileged_container(spec: JSON) -> str | None:
    """The name of the first privileged container (HAMi refuses GPU pods with one), else None."""
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            if (container.get("securityContext") or {}).get("privileged"):
                return str(container.get("name"))
    return None


def admission_response(
    review: Any,
    judge: Callable[[JSON, str], Verdict],
    on_removed: Callable[[JSON, tuple[str, ...]], None] | None = None,
    judge_update: Callable[[Any, JSON, Any], Verdict] | None = None,
) -> JSON:
    """Answer an AdmissionReview dict; raise :class:`InvalidInput` when it is not one.

    A request whose ``object`` is not a Pod object is denied (400), except for the operations that
    carry none (DELETE, CONNECT). At CREATE the scheduler-owned annotations and labels the pod
    carries are removed (:func:`scheduler_owned_removals`), with a warning for the user, and
    ``on_removed(pod, keys)`` is told (the scheduler counts and logs them). An UPDATE is judged by
    ``judge_update(oldObject, object, userInfo.username)`` alone (:func:`review_update`; allowed
    without one), never by the CREATE rules.
    """
    if not isinstance(review, dict):
        raise InvalidInput("AdmissionReview must be a JSON object")
    api_version = review.get("apiVersion")
    if api_version not in ADMISSION_VERSIONS:
        raise InvalidInput(f"unsupported AdmissionReview apiVersion {api_version!r}")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise InvalidInput("AdmissionReview has no request.uid")
    response: JSON = {"uid": request["uid"]}
    pod = request.get("object")
    operation = request.get("operation")
    namespace = request.get("namespace")
    if pod is None and operation in _OBJECTLESS_OPERATIONS:
        response["allowed"] = True
        return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    if not isinstance(pod, dict) or pod.get("kind") not in (None, "Pod"):
        verdict = Verdict(False, message="AdmissionReview request.object is not a Pod object", code=400)
    elif namespace is not None and not isinstance(namespace, str):
        verdict = Verdict(False, message="AdmissionReview request.namespace is not a string", code=400)
    elif operation == "UPDATE":
        user = request.get("userInfo")
        username = user.get("username") if isinstance(user, dict) else None
        verdict = (
            Verdict(True) if judge_update is None else judge_update(request.get("oldObject"), pod, username)
        )
    else:
        verdict = judge(pod, namespace or "")
        if verdict.allowed and operation in (None, "CREATE"):
            removals, keys = scheduler_owned_removals(pod)
            if keys:
                verdict = Verdict(True, removals + verdict.patch)
                response["warnings"] = [
                    f"hamid removed scheduler-owned {', '.join(keys)}: only hamid sets them"
                ]
                if on_removed is not None:
                    on_removed(pod, keys)
    response["allowed"] = verdict.allowed
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "message": verdict.message}
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


class Admission:
    """The webhook of one scheduler: the rules above over its live quotas, denials counted and logged."""

    def __init__(
        self,
        config: ResourceConfig,
        scheduler_name: str,
        quota_of: Callable[[str], Quota | None],
        writers: Container[str],
        untrusted: Counter,
        cpu_pods: bool = False,
        take_default: bool = True,
    ) -> None:
        self.config = config
        self.scheduler_name = scheduler_name
        #: Hand pods without GPUs to ``scheduler_name`` too (``--schedule-cpu-pods``).
        self.cpu_pods = cpu_pods
        #: Hand pods of ``default-scheduler`` over too (``--force-overwrite-default-scheduler``).
        self.take_default = take_default
        self.quota_of = quota_of
        #: Usernames allowed to change scheduler-owned pod annotations (scheduler, plugin).
        self.writers = writers
        #: ``hamid_untrusted_annotations_total{where}``: removals and denials are counted there.
        self.untrusted = untrusted

    def respond(self, review: Any) -> JSON:
        """The answer to an AdmissionReview (:func:`admission_response`); :class:`InvalidInput` if not one."""
        return admission_response(review, self.judge, self.owned_removed, self.judge_update)

    def judge(self, pod: JSON, namespace: str) -> Verdict:
        """The CREATE verdict for a pod (quota precheck against the live state)."""
        return review_pod(
            pod, self.config, self.scheduler_name, self.quota_of, namespace, self.cpu_pods, self.take_default
        )

    def owned_removed(self, pod: JSON, keys: tuple[str, ...]) -> None:
        """Count and log the scheduler-owned keys removed from a pod being created."""
        self.untrusted.labels("webhook").inc()
        generate_name = objects.metadata(pod).get("generateName", "")
        name = f"{objects.namespace(pod)}/{objects.name(pod) or generate_name}"
        log.warning("scheduler_owned_annotations_removed", pod=name, keys=list(keys))

    def judge_update(self, old: Any, pod: JSON, username: Any) -> Verdict:
        """The UPDATE verdict (:func:`review_update`); a denial is counted and logged."""
        verdict = review_update(old, pod, username, self.writers, self.scheduler_name)
        if not verdict.allowed:
            self.untrusted.labels("webhook_denied").inc()
            log.warning("scheduler_owned_change_denied", pod=objects.namespaced_key(pod), why=verdict.message)
        return verdict
