"""Signed allocations (issue 22): HMAC over pod UID, node and allocation; key rings and rotation;
after a restart the ledger books only what verifies."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model.booked import booked_condition, booked_record
from hamid.model.errors import InvalidInput
from hamid.scheduler.signing import AllocationKeys, key_id, load_key_file
from hamid.scheduler.state import SchedulerState
from tests.unit.scheduler.helpers import container, node, placed, pod, signed, ticking_keys, undecided_refit

OLD = b"old-key-0123456789abcdef0123456789ab"
NEW = b"new-key-0123456789abcdef0123456789ab"
RAW = "n1-gpu0,NVIDIA,1000,10:;"


def test_the_annotation_is_hamids_and_scheduler_owned() -> None:
    assert ann.ALLOCATION_SIGNATURE == "hamid.io/allocation-signature"
    assert ann.ALLOCATION_SIGNATURE in ann.SCHEDULER_OWNED_ANNOTATIONS


def test_a_signature_binds_uid_node_and_allocation() -> None:
    keys = AllocationKeys((NEW,), clock=lambda: 1700000000.5)
    value = keys.sign("uid-a", "n1", RAW)
    assert value.startswith(f"v1:{key_id(NEW)}:1700000000500:")
    signed_by = keys.verify("uid-a", "n1", RAW, value)
    assert signed_by is not None and (signed_by.key_id, signed_by.issued) == (key_id(NEW), 1700000000500)
    for uid, node_name, raw in (("uid-b", "n1", RAW), ("uid-a", "n2", RAW), ("uid-a", "n1", RAW + ";")):
        assert keys.verify(uid, node_name, raw, value) is None
    mac = value.rsplit(":", 1)[1]
    for forged in (
        None,
        "",
        ":::",
        value.replace("v1:", "v2:", 1),
        value.replace(":1700000000500:", ":1700000000501:"),  # a later issue time is not for sale
        value[:-1] + ("0" if value[-1] != "0" else "1"),
        f"v1:{key_id(NEW)}:1:{mac}",
        f"v1:{key_id(NEW)}:{'9' * 40}:{mac}",
        f"v1:{key_id(NEW)}:\u00b2:{mac}",  # '²'.isdigit() holds, but int() refuses it: no crash
        f"v1:{key_id(NEW)}:\u0663:{mac}",  # an Arabic-Indic 3, which int() would read as 3
    ):
        assert keys.verify("uid-a", "n1", RAW, forged) is None, forged


def test_rotation_signs_with_the_newest_and_accepts_any() -> None:
    before = AllocationKeys((OLD,))
    old_signature = before.sign("uid-a", "n1", RAW)
    rotated = AllocationKeys((OLD, NEW))
    assert rotated.verify("uid-a", "n1", RAW, old_signature) is not None
    new_signature = rotated.sign("uid-a", "n1", RAW)
    assert new_signature.split(":")[1] == key_id(NEW)
    assert before.verify("uid-a", "n1", RAW, new_signature) is None
    retired = AllocationKeys((NEW,))  # the old key dropped once no pod carries its signatures
    assert retired.verify("uid-a", "n1", RAW, old_signature) is None
    assert retired.verify("uid-a", "n1", RAW, new_signature) is not None


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2026-12-01\n{OLD.decode()}\n\n{NEW.decode()}\n")
    keys = load_key_file(str(path))
    assert keys.keys == (OLD, NEW)
    for text, error in (
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("short\n", "at least 32"),
    ):
        path.write_text(text)
        with pytest.raises(InvalidInput, match=error):
            load_key_file(str(path))
    with pytest.raises(InvalidInput, match="cannot read"):
        load_key_file(str(tmp_path / "missing"))
    assert len(AllocationKeys.generate().keys[0]) >= 32


def _restarted(
    keys: AllocationKeys, *pods: dict[str, object], accept_unsigned: bool = False
) -> SchedulerState:
    """A fresh ledger (a restart) fed the pods as its first list."""
    state = SchedulerState(keys=keys, accept_unsigned=accept_unsigned)
    state.on_node(node("n1"))
    for p in pods:
        state.ledger.on_pod(p)
    return state


def test_after_a_restart_only_verified_allocations_book() -> None:
    keys = ticking_keys(OLD, NEW)
    mine = signed(placed(pod("mine"), "n1", RAW), keys)
    unsigned = placed(pod("unsigned"), "n1", "n1-gpu1,NVIDIA,1000,10:;")
    missigned = signed(placed(pod("missigned"), "n1", "n1-gpu1,NVIDIA,2000,10:;"), ticking_keys(b"x" * 32))
    copied = placed(pod("copied"), "n1", RAW)  # another pod's signature copied onto it
    copied["metadata"]["annotations"][ann.ALLOCATION_SIGNATURE] = mine["metadata"]["annotations"][
        ann.ALLOCATION_SIGNATURE
    ]
    state = _restarted(keys, mine, unsigned, missigned, copied)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}
    foreign = {p["metadata"]["name"]: why for p, why in state.ledger.foreign}
    assert set(foreign) == {"unsigned", "missigned", "copied"}
    assert "has no hamid.io/allocation-signature" in foreign["unsigned"]
    # what an operator migrating from HAMi sees on the pods HAMi placed (their GPUs look free)
    assert "--allow-unsigned-allocations" in foreign["unsigned"]
    assert "does not verify" in foreign["missigned"] and "does not verify" in foreign["copied"]
    # an upgrade's one rollout: pods placed before signing (no signature at all) book; forged ones do not
    upgrade = _restarted(keys, mine, unsigned, missigned, accept_unsigned=True)
    assert upgrade.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (1, 1000, 10)}
    assert [p["metadata"]["name"] for p, _ in upgrade.ledger.foreign] == ["missigned"]


def test_a_booking_follows_only_a_later_signature() -> None:
    keys = ticking_keys()
    first = signed(placed(pod("a"), "n1", RAW), keys)
    state = _restarted(keys, first)
    refit = signed(placed(copy.deepcopy(first), "n1", "n1-gpu1,NVIDIA,1000,10:;"), keys)
    state.ledger.on_pod(refit)  # another replica's refit, signed after the booking
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}
    state.ledger.on_pod(first)  # the older signed allocation replayed: ignored and reported
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}
    assert "replayed" in state.ledger.disagreed[-1][1]


def test_the_filter_signature_is_what_the_booking_remembers() -> None:
    keys = ticking_keys()
    state = _restarted(keys)
    p = pod("a")
    notes = state.ledger.signature("uid-a", "n1", RAW)
    state.ledger.reserve(p, "n1", tuple(ann.decode_pod_devices(RAW)), RAW, notes[ann.ALLOCATION_SIGNATURE])
    res = state.ledger.reservation("uid-a")
    assert res is not None and res.issued > 0
    assert SchedulerState().ledger.signature("uid-a", "n1", RAW) == {ann.ALLOCATION_SIGNATURE: None}


RAW1 = "n1-gpu1,NVIDIA,1000,10:;"


def recorded(p: dict[str, Any], keys: AllocationKeys, node_name: str, raw: str) -> dict[str, Any]:
    """The pod with the booked-allocation record a bind or refit writes in its status (merged by
    type, as the strategic patch does: it replaces an earlier record)."""
    uid = p["metadata"]["uid"]
    condition = booked_condition(node_name, raw, keys.sign(uid, node_name, raw), keys.clock())
    status = p.setdefault("status", {})
    others = [c for c in status.get("conditions", []) if c["type"] != condition["type"]]
    status["conditions"] = [*others, condition]
    return p


def tampered(p: dict[str, Any], raw: str) -> dict[str, Any]:
    """A tenant rewrote the allocation past admission (its signature no longer verifies)."""
    out = copy.deepcopy(p)
    out["metadata"]["annotations"][ann.DEVICES_ALLOCATED] = raw
    return out


def test_the_booked_record_reads_back_and_refuses_garbage() -> None:
    keys = ticking_keys()
    p = recorded(pod("a"), keys, "n1", RAW)
    record = booked_record(p)
    assert record is not None and (record.node, record.allocated) == ("n1", RAW)
    assert keys.verify("uid-a", "n1", RAW, record.signature) is not None
    condition = p["status"]["conditions"][0]
    assert condition["type"] == ann.ALLOCATION_BOOKED_CONDITION == "hamid.io/AllocationBooked"
    for message in ("", "{", "[]", '{"node": "n1"}', '{"node": 1, "allocated": "x", "signature": "y"}'):
        assert booked_record({"status": {"conditions": [{**condition, "message": message}]}}) is None
    assert booked_record({"status": {"conditions": "x"}}) is None
    assert booked_record({}) is None


def test_after_a_restart_a_tampered_pod_books_what_its_record_proves() -> None:
    """The soak's leader pause: a tenant rewrote a running pod's allocation past both admission
    layers; the restarted scheduler books the record (what the container holds) and reports."""
    keys = ticking_keys()
    original = recorded(signed(placed(pod("a"), "n1", RAW), keys), keys, "n1", RAW)
    moved = tampered(original, RAW1)
    garbage = tampered(original, ":::")
    for p in (moved, garbage):
        state = _restarted(keys, p)
        assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}
        assert state.ledger.foreign == [] and state.ledger.undecodable == []
        ((reported, why),) = state.ledger.disagreed
        assert reported is p and "hamid.io/AllocationBooked" in why and f"n1: {RAW} is what it books" in why
    # a record that does not verify proves nothing: the pod is foreign as before
    forged = recorded(tampered(original, RAW1), ticking_keys(b"y" * 32), "n1", RAW1)
    state = _restarted(keys, forged)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (0, 0, 0)}
    assert [why for _, why in state.ledger.foreign] == [
        "its hamid.io/allocation-signature does not verify: this scheduler did not write it"
    ]


def test_the_later_of_record_and_annotations_stands() -> None:
    keys = ticking_keys()
    first = recorded(signed(placed(pod("a"), "n1", RAW), keys), keys, "n1", RAW)
    # a refit's annotations landed (signed later), its record not yet: the annotations stand
    refit = signed(placed(copy.deepcopy(first), "n1", RAW1), keys)
    state = _restarted(keys, refit)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}
    assert state.ledger.disagreed == []
    # the refit's record landed; a tenant then writes the older signed allocation back: the record
    # stands (the replay that verified across a restart before the record existed)
    refit = recorded(refit, keys, "n1", RAW1)
    replayed = copy.deepcopy(refit)
    replayed["metadata"]["annotations"] = dict(first["metadata"]["annotations"])
    state = _restarted(keys, replayed)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}
    assert len(state.ledger.disagreed) == 1


def test_a_live_booking_still_reports_a_tampered_annotation_its_record_contradicts() -> None:
    keys = ticking_keys()
    original = recorded(signed(placed(pod("a"), "n1", RAW), keys), keys, "n1", RAW)
    state = _restarted(keys, original)
    state.ledger.on_pod(tampered(original, RAW1))
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 1000, 10), "n1-gpu1": (0, 0, 0)}
    assert len(state.ledger.disagreed) == 1
    # unsigned mode writes no record and reads none (it books a pod without a booking as found)
    unsigned = SchedulerState()
    unsigned.on_node(node("n1"))
    unsigned.ledger.on_pod(tampered(original, RAW1))
    assert unsigned.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 1000, 10)}


def test_a_pending_pods_signed_allocation_that_no_longer_fits_is_not_booked() -> None:
    """An HA audit: a leader's filter patch, sent before it lost its lease, landed after the new
    leader had placed another pod on the same GPU; the new leader booked it (a valid signature)
    and bound it, 12,000 of 10,000 MiB. A first booking of a pod not yet bound must fit; a bound
    pod is booked as it runs, whatever the sum."""
    keys = ticking_keys()
    six = "n1-gpu0,NVIDIA,6000,10:;"
    state = _restarted(keys)
    state.ledger.on_pod(signed(placed(pod("new", containers=[container("c", 1, 6000, 10)]), "n1", six), keys))
    late = signed(placed(pod("late", containers=[container("c", 1, 6000, 10)]), "n1", six), keys)
    state.ledger.on_pod(late)
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (1, 6000, 10)
    (refused, why), *_ = state.ledger.refused
    assert refused is late and "6000 of 8000 MiB" in why and "do not fit" in why
    assert state.ledger.reservation(late["metadata"]["uid"]) is None
    bound = copy.deepcopy(late)
    bound["spec"]["nodeName"] = "n1"
    state.ledger.on_pod(bound)
    assert state.ledger.snapshot()["n1"]["n1-gpu0"] == (2, 12000, 20)


def test_a_pending_pods_signed_allocation_past_its_namespaces_quota_is_not_booked() -> None:
    """An HA audit: the old leader's filter write landed after the new leader admitted another pod
    of the namespace under its quota without seeing the first; both were booked and bound, 40,000
    MiB of a 20,000 MiB quota. A first booking of a pod not yet bound must fit the quota too."""
    keys = ticking_keys()
    state = _restarted(keys)
    state.on_quota(
        {
            "metadata": {"name": "gpu", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}},
        }
    )
    state.ledger.on_pod(signed(placed(pod("new", namespace="team"), "n1", RAW), keys))
    late = signed(placed(pod("late", namespace="team"), "n1", "n1-gpu1,NVIDIA,1000,10:;"), keys)
    state.ledger.on_pod(late)
    assert state.ledger.quota_usage("team") == ((1000, None), (1000, 10))
    (refused, why), *_ = state.ledger.refused
    assert refused is late and "GPU quota" in why and "do not fit" in why
    assert state.ledger.reservation(late["metadata"]["uid"]) is None


def test_a_later_signed_allocation_that_does_not_fit_beside_the_others_keeps_the_booking() -> None:
    """An audit: a refit's patch the API server applied late (after its replica had undone the move
    and released its hold, or after a takeover) was booked over the pod placed meanwhile on the
    GPU it named: 60,000 of 40,000 MiB, and the reconcile found nothing to repair. A later-signed
    replacement is booked only where it fits beside the other bookings; refused, the earlier
    booking stays (the pod's container may still run there) until it fits."""
    keys = ticking_keys()
    six = [container("c", 1, 6000, 10)]
    gpu0, gpu1 = "n1-gpu0,NVIDIA,6000,10:;", "n1-gpu1,NVIDIA,6000,10:;"
    state = _restarted(keys)
    first = signed(placed(pod("p", containers=six), "n1", gpu0), keys)
    first["spec"]["nodeName"] = "n1"
    state.ledger.on_pod(first)
    q = signed(placed(pod("q", containers=six), "n1", gpu1), keys)
    state.ledger.on_pod(q)
    late = signed(placed(copy.deepcopy(first), "n1", gpu1), keys)
    state.ledger.on_pod(late)
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (1, 6000, 10), "n1-gpu1": (1, 6000, 10)}
    ((refused, why),) = state.ledger.refused
    assert refused is late and "6000 of 8000 MiB" in why and f"n1: {gpu0} stays booked" in why
    res = state.ledger.reservation("uid-p")
    assert res is not None and res.raw == gpu0
    state.ledger.on_pod_deleted(q)
    state.ledger.on_pod(late)  # the pod's next event, once there is room
    assert state.ledger.snapshot()["n1"] == {"n1-gpu0": (0, 0, 0), "n1-gpu1": (1, 6000, 10)}


def _running(name: str, raw: str, keys: AllocationKeys, version: int, **kw: Any) -> dict[str, Any]:
    """Pod ``name`` bound to n1 and running there with the signed allocation ``raw``."""
    p = placed(pod(name, phase="Running", **kw), "n1", raw)
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["resourceVersion"] = str(version)
    return signed(p, keys)


def test_a_replacement_is_judged_without_the_init_containers_that_finished() -> None:
    """Review s23 R3: the booking of a pod whose init containers finished leaves their GPU free,
    but a replacement was judged with them, so moving its app container was refused while another
    pod used the init container's GPU; the ledger kept a GPU the container had left."""
    keys = ticking_keys()
    state = SchedulerState(keys=keys)
    state.on_node(node("n1", gpus=3))
    app = [container("main", 1, 1000, 10)]
    init = [container("setup", 1, 6000, 10)]
    old, new = (
        "n1-gpu0,NVIDIA,6000,10:;n1-gpu1,NVIDIA,1000,10:;",
        "n1-gpu0,NVIDIA,6000,10:;n1-gpu2,NVIDIA,1000,10:;",
    )
    p = _running("p", old, keys, 5, containers=app, init=init)
    p["status"]["initContainerStatuses"] = [{"name": "setup", "state": {"terminated": {"exitCode": 0}}}]
    state.ledger.on_pod(p)
    six = [container("c", 1, 6000, 10)]
    state.ledger.on_pod(_running("q", "n1-gpu0,NVIDIA,6000,10:;", keys, 6, containers=six))
    state.ledger.on_pod(signed(placed(copy.deepcopy(p), "n1", new), keys))
    res = state.ledger.reservation("uid-p")
    assert res is not None and res.raw == new, state.ledger.refused
    assert state.ledger.snapshot()["n1"]["n1-gpu1"] == (0, 0, 0)


def test_a_replacement_is_refused_for_its_namespaces_quota_only_where_it_grows_the_usage() -> None:
    """Review s23 R5: in a namespace over its quota (lowered after its pods ran), every replacement
    was refused, even one using less; the ledger then kept an allocation the container had left.
    Only growth past the quota is refused."""
    keys = ticking_keys()
    state = SchedulerState(keys=keys)
    state.on_node(node("n1"))
    six = [container("c", 1, 6000, 10)]
    for version, (name, gpu) in enumerate((("p", "n1-gpu0"), ("r", "n1-gpu1")), 5):
        raw = f"{gpu},NVIDIA,6000,10:;"
        state.ledger.on_pod(_running(name, raw, keys, version, containers=six, namespace="team"))
    state.on_quota(
        {
            "metadata": {"name": "gpu", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}},
        }
    )
    smaller = "n1-gpu0,NVIDIA,6000,5:;"
    state.ledger.on_pod(_running("p", smaller, keys, 9, containers=six, namespace="team"))
    res = state.ledger.reservation("uid-p")
    assert res is not None and res.raw == smaller, state.ledger.refused
    larger = "n1-gpu0,NVIDIA,7000,5:;"
    state.ledger.on_pod(_running("p", larger, keys, 10, containers=six, namespace="team"))
    ((refused, why),) = state.ledger.refused
    assert refused["metadata"]["resourceVersion"] == "10" and "GPU quota" in why
    assert state.ledger.quota_usage("team")[1] == (12000, 15)


def test_only_the_rollback_of_this_replicas_undecided_refit_skips_the_room_check() -> None:
    """Review s23 R4: the event that settled this replica's undecided refit booked whatever it
    named unjudged, also a third allocation (another replica's later refit, after a takeover) on
    a GPU full of another pod. Only the old allocation, whose GPUs the hold kept, may skip it."""
    keys = ticking_keys()
    six = [container("c", 1, 6000, 10)]
    gpu0, gpu1, gpu2 = (f"n1-gpu{i},NVIDIA,6000,10:;" for i in range(3))

    def undecided() -> SchedulerState:
        """p refitted gpu0 -> gpu1 by this replica, outcome unknown; q runs on gpu2."""
        state = SchedulerState(keys=keys)
        state.on_node(node("n1", gpus=3))
        ledger = state.ledger
        ledger.on_pod(_running("p", gpu0, keys, 100, containers=six))
        ledger.on_pod(_running("q", gpu2, keys, 101, containers=six))
        undecided_refit(ledger, "uid-p", "n1", gpu1, "100")
        return state

    old = _running("p", gpu0, keys, 102, containers=six)  # signed before the move
    state = undecided()
    state.ledger.on_pod(old)  # not applied: the rollback books, though signed before the move
    assert state.ledger.snapshot()["n1"] == {
        "n1-gpu0": (1, 6000, 10),
        "n1-gpu1": (0, 0, 0),
        "n1-gpu2": (1, 6000, 10),
    }
    state = undecided()
    other = _running("p", gpu2, keys, 102, containers=six)  # signed after the move
    state.ledger.on_pod(other)
    ((refused, why),) = state.ledger.refused
    assert refused is other and "6000 of 8000 MiB" in why and f"n1: {gpu1} stays booked" in why
    assert state.ledger.snapshot()["n1"]["n1-gpu2"] == (1, 6000, 10)
