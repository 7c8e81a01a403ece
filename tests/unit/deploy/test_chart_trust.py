"""The chart's trust objects (issue 22): the allocation key Secret and the ValidatingAdmissionPolicy
that keeps scheduler-owned pod annotations to the scheduler and the device plugin.

The policy's CEL is evaluated with a CEL interpreter (cel-python) against the requests it judges,
so a policy that validates against the schemas but denies nothing (or everything) fails here.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from hamid.model import annotations as ann
from hamid.scheduler.signing import AllocationKeys
from tests.unit.deploy.helm_render import NAMESPACE, Rendered, render

POLICY = "hamid-scheduler-owned-annotations"
SCHEDULER = f"system:serviceaccount:{NAMESPACE}:hamid-scheduler"
PLUGIN = f"system:serviceaccount:{NAMESPACE}:hamid-device-plugin"
TENANT = "system:serviceaccount:team-a:default"
BOOKED = {
    ann.VGPU_NODE: "n1",
    ann.DEVICES_ALLOCATED: "GPU-0,NVIDIA,60000,50:;",
    ann.DEVICES_TO_ALLOCATE: ";",
    ann.ALLOCATION_SIGNATURE: "v1:0a1b2c3d:1700000000000:00",
    "team.io/owner": "alice",
}


def rendered(**values: Any) -> Rendered:
    """One render per distinct values per test session (rendering generates RSA keys)."""
    return _rendered(json.dumps(values, sort_keys=True))


@functools.cache
def _rendered(values: str) -> Rendered:
    return render(json.loads(values))


def _join(items: Any, separator: Any) -> celpy.celtypes.StringType:
    """Kubernetes' CEL string library ``<list>.join(<sep>)`` (cel-python lacks it)."""
    return celpy.celtypes.StringType(str(separator).join(str(i) for i in items))


def _cel(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression), functions={"join": _join})
    return program.evaluate({k: json_to_cel(v) for k, v in activation.items()})


def _judge(
    policy: dict[str, Any],
    old: dict[str, Any],
    new: dict[str, Any],
    username: str,
    extra: dict[str, list[str]] | None = None,
) -> list[str]:
    """The messages of the policy's failed validations for one UPDATE, as the API server runs it
    (``extra``: the user's extra attributes, as a pod-bound token's node name)."""
    spec = policy["spec"]
    user: dict[str, Any] = {"username": username, **({"extra": extra} if extra is not None else {})}
    resource = {"group": "", "version": "v1", "resource": "nodes" if new.get("kind") == "Node" else "pods"}
    request = {"operation": "UPDATE", "userInfo": user, "resource": resource}
    base = {"object": new, "oldObject": old, "request": request}
    if not all(_cel(c["expression"], base) for c in spec["matchConditions"]):
        return []  # not matched: the policy does not apply
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:  # in order: a variable may read the ones before it
        variables[variable["name"]] = _cel(variable["expression"], {**base, "variables": variables})
    activation = {**base, "variables": variables}
    failures = []
    for validation in spec["validations"]:
        if not _cel(validation["expression"], activation):
            message = validation.get("message") or str(_cel(validation["messageExpression"], activation))
            failures.append(message)
    return failures


def _pod(
    annotations: dict[str, str] | None,
    labels: dict[str, str] | None = None,
    scheduler: str = "hami-scheduler",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "victim", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": scheduler, "containers": []},
    }


def test_the_policy_names_exactly_the_scheduler_owned_keys() -> None:
    policy = rendered().get("ValidatingAdmissionPolicy", POLICY)
    owned = {v["name"]: _cel(v["expression"], {}) for v in policy["spec"]["variables"]}
    assert list(owned["ownedAnnotations"]) == list(ann.SCHEDULER_OWNED_ANNOTATIONS)
    assert list(owned["ownedLabels"]) == list(ann.SCHEDULER_OWNED_LABELS)
    binding = rendered().get("ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["operations"] == ["UPDATE"] and rules[0]["resources"] == ["pods", "pods/status"]
    assert policy["spec"]["failurePolicy"] == "Fail"


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({ann.DEVICES_ALLOCATED: "GPU-1,NVIDIA,1,0:;"}, "attack 1: a 1 MiB entry on another GPU"),
        ({ann.DEVICES_ALLOCATED: ":::"}, "attack 1: an unreadable allocation"),
        ({ann.VGPU_NODE: "n2"}, "another node"),
        ({ann.ALLOCATION_SIGNATURE: "v1:ffffffff:1:00"}, "a forged signature"),
        ({ann.BIND_PHASE: "success"}, "an added key"),
        ({ann.DEVICES_ALLOCATED: None}, "a removed key"),
    ],
)
def test_a_tenant_cannot_change_an_owned_annotation(change: dict[str, str | None], what: str) -> None:
    policy = rendered().get("ValidatingAdmissionPolicy", POLICY)
    old = _pod(BOOKED)
    new = copy.deepcopy(old)
    for key, value in change.items():
        if value is None:
            del new["metadata"]["annotations"][key]
        else:
            new["metadata"]["annotations"][key] = value
    [message] = _judge(policy, old, new, TENANT)
    assert f"({next(iter(change))})" in message and TENANT in message, what
    assert _judge(policy, old, new, SCHEDULER) == [] and _judge(policy, old, new, PLUGIN) == []


def test_what_the_policy_lets_through() -> None:
    policy = rendered().get("ValidatingAdmissionPolicy", POLICY)
    old = _pod(BOOKED)
    tenant_note = copy.deepcopy(old)
    tenant_note["metadata"]["annotations"]["team.io/owner"] = "bob"  # the tenant's own annotation
    assert _judge(policy, old, tenant_note, TENANT) == []
    assert _judge(policy, old, copy.deepcopy(old), TENANT) == []  # e.g. a label on an unchanged pod
    assert _judge(policy, _pod(None), _pod({"team.io/owner": "x"}), TENANT) == []  # no annotations before
    # another scheduler's pods are that scheduler's business; the default scheduler's are hamid's
    other = _pod(BOOKED, scheduler="volcano")
    assert (
        _judge(policy, other, {**other, "metadata": {**other["metadata"], "annotations": {}}}, TENANT) == []
    )
    default = _pod(BOOKED, scheduler="default-scheduler")
    assert (
        len(
            _judge(
                policy, default, {**default, "metadata": {**default["metadata"], "annotations": {}}}, TENANT
            )
        )
        == 1
    )
    # attack 2: a parked pod given a node and an allocation by its tenant
    parked = _pod({"team.io/owner": "alice"})
    forged = _pod({"team.io/owner": "alice", ann.VGPU_NODE: "n1", ann.DEVICES_ALLOCATED: ":::"})
    assert len(_judge(policy, parked, forged, TENANT)) == 1
    assert len(_judge(policy, _pod(None), forged, TENANT)) == 1
    # the label the filter sets
    assert _judge(policy, _pod({}, {}), _pod({}, {ann.VGPU_NODE: "n1"}), TENANT) == [
        "the scheduler-owned pod label hami.io/vgpu-node may be changed only by hamid's scheduler"
    ]
    assert _judge(policy, _pod({}, {}), _pod({}, {ann.VGPU_NODE: "n1"}), SCHEDULER) == []


def test_a_mixed_fleets_hami_plugins_may_write_too() -> None:
    r = rendered(scheduler={"refitHamiPluginServiceAccount": "hami-system/hami-device-plugin"})
    policy = r.get("ValidatingAdmissionPolicy", POLICY)
    old, new = _pod(BOOKED), _pod({**BOOKED, ann.BIND_PHASE: "success"})
    assert _judge(policy, old, new, "system:serviceaccount:hami-system:hami-device-plugin") == []
    assert len(_judge(policy, old, new, TENANT)) == 1


def _secret_file_readable(pod: dict[str, Any], container: dict[str, Any], volume: dict[str, Any]) -> bool:
    """Whether ``container`` can read a file of Secret ``volume`` as kubelet writes it: owned by
    root, its group the pod's ``fsGroup`` when set (else root's), with the volume's mode
    (``defaultMode``, 0644 unless given)."""
    mode = volume["secret"].get("defaultMode", 0o644)
    pod_context, context = pod.get("securityContext") or {}, container.get("securityContext") or {}
    uid = context.get("runAsUser", pod_context.get("runAsUser", 0))
    groups = {
        context.get("runAsGroup", pod_context.get("runAsGroup", 0)),
        *pod_context.get("supplementalGroups", ()),
    }
    group = pod_context.get("fsGroup", 0)
    if group in groups or "fsGroup" in pod_context:  # kubelet adds the fsGroup to every container
        groups.add(group)
    return uid == 0 or bool(mode & 0o004) or (group in groups and bool(mode & 0o040))


def test_the_scheduler_can_read_its_key_file() -> None:
    """An outside install audit: the key was mode 0400 with no fsGroup, so the file stayed root's
    and the scheduler (uid 65532) could not read it: a default install crash-looped. Judged as
    kubelet writes Secret files; the same with the pod's context changed as operators do."""
    for values in ({}, {"scheduler": {"podSecurityContext": {"runAsNonRoot": True, "fsGroup": 1000}}}):
        pod = rendered(**values).get("Deployment", "hamid-scheduler")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        [scheduler] = [c for c in pod["containers"] if c["name"] == "hamid-scheduler"]
        assert _secret_file_readable(pod, scheduler, volumes["allocation-keys"]), values
        assert _secret_file_readable(pod, scheduler, volumes["tls"]), values


def test_the_policies_can_be_turned_off() -> None:
    r = rendered(
        scheduler={"annotationPolicy": {"enabled": False}},
        devicePlugin={"nodeScopePolicy": {"enabled": False}},
    )
    assert not [o for o in r.objects if o["kind"].startswith("ValidatingAdmissionPolicy")]


def test_the_generated_key_secret_is_a_key_ring_the_scheduler_reads() -> None:
    secret = rendered().get("Secret", "hamid-allocation-keys")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    keys = AllocationKeys.parse(base64.b64decode(secret["data"]["keys"]).decode())
    assert len(keys.keys) == 1 and len(keys.keys[0]) == 64
    own = rendered(scheduler={"allocationKeys": {"existingSecret": "my-keys", "allowUnsigned": True}})
    assert not [o for o in own.objects if o["metadata"]["name"] == "hamid-allocation-keys"]
    deployment = own.get("Deployment", "hamid-scheduler")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["allocation-keys"]["secret"]["secretName"] == "my-keys"
    [scheduler] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "hamid-scheduler"
    ]
    assert "--allow-unsigned-allocations" in scheduler["args"]


NODE_SCOPE = "hamid-device-plugin-node-scope"


def _on(node: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = _pod(annotations or {})
    pod["spec"]["nodeName"] = node
    return pod


def _node(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "annotations": annotations or {}, "labels": {"gpu": "on"}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"unschedulable": False}}


def test_the_device_plugin_writes_only_annotations_of_its_node_and_its_pods() -> None:
    """An install audit: RBAC gives the plugin's ServiceAccount every pod and node, so one node's
    token (readable by root there) could rewrite any pod or node in the cluster. The policy holds
    it to annotations of its own Node and of pods bound to it, by the node its token names."""
    policy = rendered().get("ValidatingAdmissionPolicy", NODE_SCOPE)
    binding = rendered().get("ValidatingAdmissionPolicyBinding", NODE_SCOPE)
    assert binding["spec"] == {"policyName": NODE_SCOPE, "validationActions": ["Deny"]}
    mine = {"authentication.kubernetes.io/node-name": ["n1"]}

    def judge(old: dict[str, Any], new: dict[str, Any], extra: Any = mine, user: str = PLUGIN) -> list[str]:
        return _judge(policy, old, new, user, extra)

    served = {ann.DEVICES_TO_ALLOCATE: ";", ann.BIND_PHASE: "success"}
    assert judge(_on("n1"), _on("n1", served)) == []  # what Allocate writes
    assert judge(_node("n1"), _node("n1", {ann.NODE_LOCK: ""})) == []  # the register, the lock
    assert judge(_on("n2"), _on("n2", served)) == [
        "the device plugin of node n1 may write only pods bound to it"
    ]
    assert judge(_node("n2"), _node("n2", {ann.NODE_LOCK: ""})) == [
        "the device plugin of node n1 may write only its own Node"
    ]
    image = _on("n1")
    image["spec"]["containers"] = [{"name": "c", "image": "evil"}]
    cordoned = _node("n1")
    cordoned["spec"]["unschedulable"] = True
    relabelled = _node("n1")
    relabelled["metadata"]["labels"] = {"gpu": "off"}
    owned = _on("n1")  # the garbage collector would delete the pod with its "owner"
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "n9", "uid": "u"}]
    held = _node("n1")  # its deletion would wait for nobody
    held["metadata"]["finalizers"] = ["example.com/never"]
    changed = (image, cordoned, relabelled, owned, held)
    for old, new in zip((_on("n1"), _node("n1"), _node("n1"), _on("n1"), _node("n1")), changed, strict=True):
        assert judge(old, new) == [
            "the device plugin writes annotations only, never a spec, labels, owners or finalizers"
        ]
    assert "names no node" in judge(_on("n1"), _on("n1", served), extra=None)[0]
    assert judge(_on("n2"), image, user=SCHEDULER) == []  # not the plugin: not matched
