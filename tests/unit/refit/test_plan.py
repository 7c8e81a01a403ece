"""plan_refit: every rule of the refit decision as a table row (pure; no server, no state).

Each row names the fact it changes from one valid refit (pod ``default/p``, container ``main``
holding GPU-a 1000 MiB on node n1, kubelet allowing GPU-b) and the outcome upstream's
``RefitNumaAllocation`` gives for it (docs/refit.md §3), or hamid's own extra refusal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from hamid.fit import ContainerKind, DeviceAmount, NodeUsage, Quota, effective_pod_usage
from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, NVIDIA, ContainerDevice, DeviceInfo, PodDevices
from hamid.model.refit import RefitRequest
from hamid.model.resources import ResourceConfig
from hamid.scheduler.refit import NoOp, RefitFacts, RefitPlan, RefusalCode, Refused, plan_refit

A = ContainerKind.APP
I = ContainerKind.INIT  # noqa: E741


@dataclass(frozen=True)
class FakeBooking:
    uid: str = "u1"
    namespace: str = "default"
    name: str = "p"
    node: str = "n1"
    pending: bool = False
    kinds: tuple[ContainerKind, ...] = (A,)
    init_released: bool = False
    applied: Mapping[str, DeviceAmount] = field(default_factory=dict)
    raw: str = ""
    mig_text: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def dev(uuid: str, mem: int = 1000, cores: int = 0, kind: str = NVIDIA) -> ContainerDevice:
    return ContainerDevice(uuid, kind, mem, cores)


def gpu(uuid: str, index: int, numa: int = 0, mode: str = MODE_HAMI_CORE, mem: int = 40000) -> DeviceInfo:
    return DeviceInfo(uuid, index, 10, mem, 100, "NVIDIA-A100", numa, mode, True)


def pod(
    layout: PodDevices,
    *,
    names: tuple[str, ...] = ("main",),
    annotations: dict[str, str] | None = None,
    pending: str | None = None,
    uid: str = "u1",
) -> dict[str, Any]:
    raw = ann.encode_pod_devices(layout)
    return {
        "metadata": {
            "uid": uid,
            "namespace": "default",
            "name": "p",
            "annotations": {
                ann.DEVICES_ALLOCATED: raw,
                ann.DEVICES_TO_ALLOCATE: raw if pending is None else pending,
                **(annotations or {}),
            },
        },
        "spec": {"containers": [{"name": n} for n in names]},
    }


LAYOUT: PodDevices = ((dev("GPU-a"),),)


def facts(**change: Any) -> RefitFacts:
    """The valid refit, with ``change`` applied (``layout``/``infos`` rebuild pod and node)."""
    layout = change.pop("layout", LAYOUT)
    infos = change.pop("infos", (gpu("GPU-a", 0), gpu("GPU-b", 1, numa=1), gpu("GPU-c", 2, numa=1)))
    kinds = change.pop("kinds", (A,) * len(layout))
    booking = FakeBooking(
        kinds=kinds, applied=effective_pod_usage(layout, kinds), raw=ann.encode_pod_devices(layout)
    )
    node = NodeUsage.from_infos("n1", infos)
    node.add(booking.applied)
    request = RefitRequest("u1", "default", "p", "n1", 0, NVIDIA, ("GPU-b",), "main")
    base = RefitFacts(
        request=request,
        booking=booking,
        pod=pod(layout, names=tuple(f"c{i}" for i in range(len(layout))) if len(layout) > 1 else ("main",)),
        node=node,
        config=ResourceConfig(),
        gpu_policy="spread",
        node_policy="binpack",
        quota=None,
    )
    for key in ("request", "booking"):
        if key in change and isinstance(change[key], dict):
            change[key] = dataclasses.replace(getattr(base, key), **change[key])
    return dataclasses.replace(base, **change)


def with_pod(**kw: Any) -> RefitFacts:
    return facts(pod=pod(LAYOUT, **kw))


Row = tuple[str, Callable[[], RefitFacts], RefusalCode, str]

REFUSALS: list[Row] = [
    # step 3: identity
    (
        "untracked uid",
        lambda: facts(booking=None),
        RefusalCode.UNKNOWN_POD,
        "pod u1 is not tracked by the scheduler",
    ),
    (
        "uid under another name",
        lambda: facts(booking={"name": "q"}),
        RefusalCode.IDENTITY_MISMATCH,
        "pod u1 does not match default/p",
    ),
    ("pod object replaced", lambda: with_pod(uid="u2"), RefusalCode.UNKNOWN_POD, "pod u1 is not tracked"),
    ("pod gone from the cache", lambda: facts(pod=None), RefusalCode.UNKNOWN_POD, "pod u1 is not tracked"),
    (
        "tracked on another node",
        lambda: facts(booking={"node": "n2"}),
        RefusalCode.WRONG_NODE,
        "pod default/p is tracked on node n2, not n1",
    ),
    (
        "filter patch in flight",
        lambda: facts(booking={"pending": True}),
        RefusalCode.NOT_PENDING,
        "pod default/p: its allocation is still being written",
    ),
    # step 4: container
    (
        "index outside the pod",
        lambda: facts(request={"container_index": 3}),
        RefusalCode.BAD_CONTAINER,
        "container index 3 is outside the pod's containers",
    ),
    (
        "another container's name",
        lambda: facts(request={"container_name": "side"}),
        RefusalCode.BAD_CONTAINER,
        'container index 0 is "main", not "side"',
    ),
    # step 5: the annotations
    (
        "MIG allocations",
        lambda: with_pod(annotations={ann.MIG_ALLOCATIONS: "[{}]"}),
        RefusalCode.MIG,
        "the pod holds MIG allocations",
    ),
    (
        "MIG reservations booked, annotation removed",
        lambda: facts(
            booking=FakeBooking(raw=ann.encode_pod_devices(LAYOUT), mig_text='[{"containerIndex":0}]')
        ),
        RefusalCode.MIG,
        "the pod holds MIG allocations",
    ),
    (
        "undecodable pending",
        lambda: with_pod(pending="GPU-a,NVIDIA,1000:;"),
        RefusalCode.BAD_ANNOTATION,
        "cannot decode pending allocation annotation",
    ),
    (
        "undecodable booking",
        lambda: facts(booking={"raw": "x,y:;"}),
        RefusalCode.BAD_ANNOTATION,
        "cannot decode booked allocation",
    ),
    (
        "already allocated",
        lambda: with_pod(pending=";"),
        RefusalCode.NOT_PENDING,
        "container 0 has no pending NVIDIA allocation to refit",
    ),
    (
        "nothing booked",
        lambda: facts(booking={"raw": ";"}),
        RefusalCode.NOT_PENDING,
        "container 0 has no recorded NVIDIA allocation",
    ),
    (
        "another vendor",
        lambda: facts(layout=((dev("GPU-a", kind="Ascend910"),),)),
        RefusalCode.NON_NVIDIA,
        "container 0 reserves Ascend910 devices; the NUMA refit supports only NVIDIA",
    ),
    # step 7: homogeneity
    (
        "differing amounts",
        lambda: facts(
            layout=((dev("GPU-a", 1000), dev("GPU-c", 2000)),),
            request={"allowed_device_uuids": ("GPU-b", "GPU-c")},
        ),
        RefusalCode.HETEROGENEOUS,
        "container 0 reserves differing amounts per device",
    ),
    # step 8: the node
    (
        "node not registered",
        lambda: facts(node=None),
        RefusalCode.NODE_UNAVAILABLE,
        "node n1 unavailable: not registered",
    ),
    (
        "allowed device in MIG mode",
        lambda: facts(infos=(gpu("GPU-a", 0), gpu("GPU-b", 1, mode=MODE_MIG))),
        RefusalCode.MIG,
        "allowed device GPU-b is in MIG mode",
    ),
    (
        "reserved device in MIG mode",
        lambda: facts(infos=(gpu("GPU-a", 0, mode=MODE_MIG), gpu("GPU-b", 1))),
        RefusalCode.MIG,
        "reserved device GPU-a is in MIG mode",
    ),
    # step 9: the pod's policy
    (
        "bad scoring weights",
        lambda: with_pod(annotations={ann.DEVICE_SCORING_WEIGHTS: "slot=1"}),
        RefusalCode.BAD_ANNOTATION,
        "invalid pod scheduling annotations",
    ),
    # step 11: the restricted fit
    (
        "no allowed GPU on the node",
        lambda: facts(request={"allowed_device_uuids": ("GPU-x",)}),
        RefusalCode.NO_FIT,
        "no allowed device fits: AllowedDeviceSetUnmatched",
    ),
    (
        "allowed GPU too small",
        lambda: facts(infos=(gpu("GPU-a", 0), gpu("GPU-b", 1, mem=500))),
        RefusalCode.NO_FIT,
        "no allowed device fits: 1/1 CardInsufficientMemory",
    ),
    (
        "pinned outside the allowed set",
        lambda: with_pod(annotations={ann.USE_GPU_UUID: "GPU-a"}),
        RefusalCode.PINNED,
        "no allowed device fits: 1/1 CardUuidMismatch (container 0 is pinned by "
        "nvidia.com/use-gpuuuid to [GPU-a], none of which is in the allowed set)",
    ),
    # steps 11-12: quota on the positional layout (#2828: init@A 5000 + 2 x app@A 5000 counts
    # 10000; the init container moved to GPU-b counts 15000). hamid's restricted fit checks the
    # quota phase-aware itself, so it refuses first; step 12 stays as upstream's guard.
    (
        "quota of the moved layout",
        lambda: facts(
            layout=((dev("GPU-a", 5000),), (dev("GPU-a", 5000),), (dev("GPU-a", 5000),)),
            kinds=(I, A, A),
            quota=Quota(mem_limit=12000),
            request={"container_name": ""},
        ),
        RefusalCode.NO_FIT,
        "no allowed device fits: 1/1 ResourceQuotaNotFit",
    ),
]


@pytest.mark.parametrize(("case", "build", "code", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(case: str, build: Callable[[], RefitFacts], code: RefusalCode, message: str) -> None:
    decision = plan_refit(build())
    assert isinstance(decision, Refused), decision
    assert decision.code is code
    assert message in decision.message
    # refusals about a pod the scheduler holds record an Event on it; the others cannot
    unidentified = {RefusalCode.UNKNOWN_POD, RefusalCode.IDENTITY_MISMATCH}
    assert decision.identified is (code not in unidentified)


def test_every_code_is_a_metric_label() -> None:
    assert len({c.value for c in RefusalCode}) == len(RefusalCode) == 23
    assert all(c.value.replace("_", "").isalpha() and c.value.islower() for c in RefusalCode)


def test_already_on_allowed_gpus_is_a_noop() -> None:
    decision = plan_refit(facts(request={"allowed_device_uuids": ("GPU-a", "GPU-b")}))
    assert decision == NoOp((dev("GPU-a"),))


def test_move_splices_only_the_target_entry() -> None:
    layout = ((dev("GPU-c", 700),), (dev("GPU-a", 1000),))
    base = facts(layout=layout, request={"container_index": 1, "container_name": "c1"})
    decision = plan_refit(base)
    assert isinstance(decision, RefitPlan)
    assert decision.index == 1 and [d.uuid for d in decision.devices] == ["GPU-b"]
    assert decision.current == (dev("GPU-a", 1000),)
    assert decision.new_allocated == "GPU-c,NVIDIA,700,0:;GPU-b,NVIDIA,1000,0:;"
    assert decision.new_pending == decision.new_allocated
    assert decision.layout == ((dev("GPU-c", 700),), (dev("GPU-b", 1000),))


def test_the_move_splices_into_the_booking_not_a_rewritten_annotation() -> None:
    """Past admission a tenant rewrote container 1's allocated entry to 1 MiB; the refit of
    container 0 signs (and the ledger books) the booking with its move, never the rewrite."""
    layout = ((dev("GPU-a", 1000),), (dev("GPU-c", 700),))
    rewritten = {ann.DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,0:;GPU-c,NVIDIA,1,0:;"}
    tampered = pod(layout, names=("c0", "c1"), annotations=rewritten)
    base = facts(layout=layout, request={"container_index": 0, "container_name": "c0"}, pod=tampered)
    decision = plan_refit(base)
    assert isinstance(decision, RefitPlan)
    assert decision.new_allocated == "GPU-b,NVIDIA,1000,0:;GPU-c,NVIDIA,700,0:;"
    assert decision.layout == ((dev("GPU-b", 1000),), (dev("GPU-c", 700),))


def test_rules_run_in_upstream_order() -> None:
    # a request wrong in every way is refused for the first rule: identity before container
    # before annotations before the node
    everything = facts(booking={"node": "n2"}, request={"container_index": 9}, node=None)
    assert plan_refit(everything).code is RefusalCode.WRONG_NODE  # type: ignore[union-attr]
    container_and_node = facts(request={"container_index": 9}, node=None)
    assert plan_refit(container_and_node).code is RefusalCode.BAD_CONTAINER  # type: ignore[union-attr]
    heterogeneous_no_node = facts(layout=((dev("GPU-a", 1), dev("GPU-c", 2)),), node=None)
    assert plan_refit(heterogeneous_no_node).code is RefusalCode.HETEROGENEOUS  # type: ignore[union-attr]
