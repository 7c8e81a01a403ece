"""The per-device check tables hold HAMi's order (docs/hami-wire.md §3.5), each gate leaves out only checks
that cannot fail without it."""

from __future__ import annotations

from hamid.fit import PodPolicy, fit_pod
from hamid.fit import fit as F
from hamid.model import annotations as ann

from .helpers import dev, node, req, spec


def test_tables_follow_hamis_order() -> None:
    assert [row[0] for row in F.DEVICE_CHECKS] == [
        "CardNotHealth",
        "CardCordoned",
        "CardTypeMismatch",
    ]
    assert [row[0] for row in F.CAPACITY_CHECKS] == [
        "CardUuidMismatch",
        "CardTimeSlicingExhausted",
        "ExclusiveDeviceAllocateConflict",
        "ResourceQuotaNotFit",
        "CardInsufficientMemory",
        "CardInsufficientCore",
        "ExclusiveDeviceAllocateConflict",
        "CardComputeUnitsExhausted",
        "CardMigTopologyInfeasible",
    ]


def test_gated_checks_run_when_their_gate_is_on() -> None:
    n = node(dev("a", 0, used=1), dev("b", 1), cordoned=("b",))
    assert fit_pod(n, spec(req(2))).reason == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardCordoned"  # type: ignore[union-attr]
    mutex = PodPolicy.from_annotations({ann.GPU_SCHEDULER_POLICY: "mutex"})
    n = node(dev("a", 0, used=1), dev("b", 1, used=1))
    assert fit_pod(n, spec(req(1), policy=mutex)).reason == "2/2 ExclusiveDeviceAllocateConflict"  # type: ignore[union-attr]
    pinned = PodPolicy.from_annotations({ann.NOUSE_GPU_UUID: "a,b"})
    assert fit_pod(n, spec(req(1), policy=pinned)).reason == "2/2 CardUuidMismatch"  # type: ignore[union-attr]
    typed = PodPolicy.from_annotations({ann.USE_GPU_TYPE: "H100"})
    assert fit_pod(n, spec(req(1), policy=typed)).reason == "2/2 CardTypeMismatch"  # type: ignore[union-attr]
    assert F._active_checks(frozenset()) != F._active_checks(frozenset({F.MUTEX}))
