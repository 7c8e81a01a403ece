"""MIG reservations in the ledger: signed with the allocation (non-MIG signatures unchanged), recorded,
booked on their GPU's placements, kept when the plugin adds runtime ids, rebuilt after a restart,
and inconsistent ones (HAMi's fail-closed cases) making their GPU unfit."""

from __future__ import annotations

import copy
import hashlib
import hmac
from typing import Any

import pytest
import structlog

from hamid.fit import fit_pod
from hamid.fit.fit import Fitted, PodFitSpec, Unfit
from hamid.fit.policy import PodPolicy
from hamid.fit.usage import ContainerKind
from hamid.model import annotations as ann
from hamid.model.booked import booked_condition, booked_record
from hamid.model.devices import MODE_MIG, DeviceInfo, MigPlacement, MigProfile
from hamid.model.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations, reservation_text
from hamid.model.resources import ContainerDeviceRequest
from hamid.scheduler.signing import AllocationKeys, key_id
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import container, placed, pod, signed, ticking_keys

KEY = b"test-key-0123456789abcdef0123456789"
P1G = MigProfile("1g.5gb", 5120, 14, 1, tuple(MigPlacement(i, 1) for i in range(7)))
P2G = MigProfile("2g.10gb", 10240, 28, 2, (MigPlacement(0, 2), MigPlacement(2, 2), MigPlacement(4, 2)))
RAW = "GPU-m,NVIDIA,5120,14:;"


def reservation(start: int, profile: str = "1g.5gb", size: int = 1, container_index: int = 0) -> str:
    return encode_mig_allocations(
        [MigAllocation(container_index, 0, "GPU-m", profile, MigPlacement(start, size))]
    )


def mig_node(name: str = "n1") -> dict[str, Any]:
    gpus = [
        DeviceInfo("GPU-m", 0, 7, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, MODE_MIG, True, (P1G, P2G)),
        DeviceInfo("GPU-h", 1, 10, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, "hami-core", True),
    ]
    return {
        "metadata": {"name": name, "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(gpus)}},
        "status": {"allocatable": {"nvidia.com/gpu": "17"}},
    }


def mig_pod(name: str, keys: AllocationKeys | None, start: int, **kw: Any) -> dict[str, Any]:
    """A pod placed on GPU-m's 1g instance at ``start`` (signed with ``keys`` over both annotations)."""
    p = placed(pod(name, containers=[container("main", 1, 4000)], **kw), "n1", RAW)
    notes = p["metadata"]["annotations"]
    notes[ann.MIG_ALLOCATIONS] = reservation(start)
    if keys is not None:
        notes[ann.ALLOCATION_SIGNATURE] = keys.sign(p["metadata"]["uid"], "n1", RAW, reservation(start))
    return p


def state_of(
    keys: AllocationKeys | None, *pods: dict[str, Any], accept_unsigned: bool = False
) -> SchedulerState:
    state = SchedulerState(keys=keys, accept_unsigned=accept_unsigned)
    state.on_node(mig_node())
    for p in pods:
        state.ledger.on_pod(p)
    return state


def occupied(state: SchedulerState) -> list[tuple[str, int]]:
    gpu = state.ledger.nodes["n1"].usage.by_id["GPU-m"]
    return sorted((a.profile, a.placement.start) for a in gpu.mig_used)


def next_fit(state: SchedulerState) -> Fitted | Unfit:
    """What a 4000 MiB pod would get on n1 now."""
    request = ContainerDeviceRequest(nums=1, type="NVIDIA", memreq=4000, mem_percentage_req=101, coresreq=0)
    policy = PodPolicy.from_annotations({ann.VGPU_MODE: "mig"})
    return fit_pod(state.ledger.nodes["n1"].usage, PodFitSpec((request,), (ContainerKind.APP,), policy))


def test_a_signature_without_mig_is_byte_for_byte_the_old_one() -> None:
    keys = AllocationKeys((KEY,), clock=lambda: 1700000000.5)
    message = b"\0".join((b"hamid-allocation-v1", b"uid-a", b"n1", b"1700000000500", RAW.encode()))
    mac = hmac.new(KEY, message, hashlib.sha256).hexdigest()
    assert keys.sign("uid-a", "n1", RAW) == f"v1:{key_id(KEY)}:1700000000500:{mac}"


def test_a_mig_signature_covers_the_reservation() -> None:
    keys = AllocationKeys((KEY,), clock=lambda: 1700000000.5)
    value = keys.sign("uid-a", "n1", RAW, reservation(6))
    assert value != keys.sign("uid-a", "n1", RAW)
    assert keys.verify("uid-a", "n1", RAW, value, reservation(6)) is not None
    for mig in ("", reservation(5), reservation(6, container_index=1), reservation(0, "2g.10gb", 2)):
        assert keys.verify("uid-a", "n1", RAW, value, mig) is None, mig


def test_the_record_carries_mig_only_when_there_is_some() -> None:
    plain = booked_condition("n1", RAW, "sig", 0.0)
    assert plain["message"] == '{"allocated":"GPU-m,NVIDIA,5120,14:;","node":"n1","signature":"sig"}'
    with_mig = booked_condition("n1", RAW, "sig", 0.0, reservation(6))
    record = booked_record({"status": {"conditions": [with_mig]}})
    assert record is not None and (record.allocated, record.mig) == (RAW, reservation(6))
    broken = dict(with_mig, message='{"allocated":"a","node":"n1","signature":"s","mig":7}')
    assert booked_record({"status": {"conditions": [broken]}}) is None


def test_runtime_ids_leave_the_signed_reservation_unchanged() -> None:
    realized = decode_mig_allocations(reservation(6))[0]
    with_ids = MigAllocation(0, 0, "GPU-m", "1g.5gb", MigPlacement(6, 1), "MIG-x", 7, 0)
    assert reservation_text([with_ids]) == reservation_text([realized]) == reservation(6)


def test_a_signed_reservation_books_its_placement_and_a_restart_rebuilds_it() -> None:
    keys = ticking_keys(KEY)
    first = mig_pod("first", keys, 6)
    state = state_of(keys, first)
    assert occupied(state) == [("1g.5gb", 6)]
    assert state.ledger.snapshot()["n1"]["GPU-m"] == (1, 5120, 14)
    assert isinstance(f := next_fit(state), Fitted) and f.mig[0].placement == MigPlacement(5, 1)
    # the plugin realizes it: runtime ids added to the annotation change nothing
    realized = copy.deepcopy(first)
    realized["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = encode_mig_allocations(
        [MigAllocation(0, 0, "GPU-m", "1g.5gb", MigPlacement(6, 1), "MIG-x", 7, 0)]
    )
    state.ledger.on_pod(realized)
    assert occupied(state) == [("1g.5gb", 6)] and not state.ledger.disagreed
    assert occupied(state_of(keys, realized)) == [("1g.5gb", 6)]  # a restart books it again
    state.ledger.on_pod(dict(realized, status={"phase": "Succeeded"}))
    assert occupied(state) == [] and state.ledger.snapshot()["n1"]["GPU-m"] == (0, 0, 0)


def test_a_rewritten_placement_is_not_booked() -> None:
    keys = ticking_keys(KEY)
    first = mig_pod("first", keys, 6)
    state = state_of(keys, first)
    moved = copy.deepcopy(first)
    moved["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = reservation(0, "2g.10gb", 2)
    state.ledger.on_pod(moved)  # a tenant moves its instance: the booking stays
    assert occupied(state) == [("1g.5gb", 6)]
    assert "stays booked" in state.ledger.disagreed[-1][1]
    restarted = state_of(keys, moved)  # after a restart the moved reservation does not verify
    assert occupied(restarted) == [] and [p["metadata"]["name"] for p, _ in restarted.ledger.foreign] == [
        "first"
    ]
    # ... but the record in the pod's status, which tenants cannot write, books what was signed
    moved["status"]["conditions"] = [
        booked_condition("n1", RAW, keys.sign("uid-first", "n1", RAW, reservation(6)), 0.0, reservation(6))
    ]
    assert occupied(state_of(keys, moved)) == [("1g.5gb", 6)]


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        (reservation(6), "1g.5gb at [6,7) overlaps 1g.5gb at [6,7) booked on GPU GPU-m"),
        (reservation(0, "7g.40gb", 8), "GPU GPU-m does not offer profile 7g.40gb"),
    ],
)
def test_an_inconsistent_reservation_makes_the_gpu_unfit_until_it_goes(second: str, problem: str) -> None:
    first = mig_pod("first", None, 6)
    other = mig_pod("other", None, 0, namespace="b")
    other["spec"]["nodeName"] = "n1"  # running: booked as it runs
    other["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = second
    with structlog.testing.capture_logs() as logs:
        state = state_of(None, first, other)
    assert state.ledger.reservation("uid-other") is not None
    assert state.ledger.nodes["n1"].usage.by_id["GPU-m"].mig_faults >= 1
    [logged] = [e for e in logs if e["event"] == "mig_reservation_inconsistent"]
    assert logged["pod"] == "b/other" and problem in logged["problems"]
    assert isinstance(f := next_fit(state), Unfit) and f.reason == "1/2 CardNotHealth, 1/2 CardTypeMismatch"
    state.ledger.on_pod_deleted(other)
    assert state.ledger.nodes["n1"].usage.by_id["GPU-m"].mig_faults == 0 and isinstance(
        next_fit(state), Fitted
    )


def test_a_mig_device_without_a_reservation_fails_closed() -> None:
    bare = placed(pod("bare", containers=[container("main", 1, 4000)]), "n1", RAW)
    state = state_of(None, bare)
    assert state.ledger.nodes["n1"].usage.by_id["GPU-m"].mig_faults == 1
    assert isinstance(next_fit(state), Unfit)


def test_a_reservation_for_a_gpu_the_allocation_does_not_hold_is_refused() -> None:
    stray = mig_pod("stray", None, 6)
    stray["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = encode_mig_allocations(
        [MigAllocation(0, 0, "GPU-h", "1g.5gb", MigPlacement(6, 1))]
    )
    state = state_of(None, stray)
    assert state.ledger.reservation("uid-stray") is None
    assert "names GPU GPU-h, which the allocation does not hold" in state.ledger.refused[-1][1]


def test_an_unreadable_reservation_books_nothing() -> None:
    keys = ticking_keys(KEY)
    p = signed(placed(pod("p", containers=[container("main", 1, 4000)]), "n1", RAW), keys)
    p["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = "[{"
    state = state_of(None, p)
    assert state.ledger.reservation("uid-p") is None and state.ledger.undecodable


def test_an_init_containers_instance_is_booked_with_the_apps_until_the_pod_ends() -> None:
    """Both instances live until the pod ends: GPU-m and the namespace's quota book their sum (not the
    larger phase), through the init release and a restart, and the pod's end gives all of it back."""
    raw = "GPU-m,NVIDIA,5120,14:;GPU-m,NVIDIA,10240,28:;"
    mig = encode_mig_allocations(
        [
            MigAllocation(0, 0, "GPU-m", "1g.5gb", MigPlacement(6, 1)),
            MigAllocation(1, 0, "GPU-m", "2g.10gb", MigPlacement(0, 2)),
        ]
    )
    p = placed(
        pod("p", containers=[container("main", 1, 8000)], init=[container("init", 1, 4000)]), "n1", raw
    )
    p["metadata"]["annotations"][ann.MIG_ALLOCATIONS] = mig
    p["spec"]["nodeName"] = "n1"
    done = copy.deepcopy(p)
    done["status"] = {
        "phase": "Running",
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
    }
    both = (2, 5120 + 10240, 14 + 28)

    def booked(state: SchedulerState) -> tuple[tuple[int, int, int], tuple[int, int]]:
        return state.ledger.snapshot()["n1"]["GPU-m"], state.ledger.quotas.used("default")

    state = state_of(None, p)
    assert booked(state) == (both, both[1:])
    state.ledger.on_pod(done)  # the init container succeeded: its instance stays
    assert booked(state) == (both, both[1:]) and occupied(state) == [("1g.5gb", 6), ("2g.10gb", 0)]
    assert booked(state_of(None, done)) == (both, both[1:])  # a restart books the same
    state.ledger.on_pod(dict(done, status={"phase": "Succeeded"}))
    assert booked(state) == ((0, 0, 0), (0, 0)) and occupied(state) == []
