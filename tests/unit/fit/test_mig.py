"""The fit on GPUs in MIG mode: HAMi's profile and placement choice, the revisit of one GPU, the
reason strings, and occupancy booked through :class:`NodeUsage` (vectors from HAMi's
``mig_capability_test.go``, ``mig_topology_test.go`` and ``scheduler/mig_allocation_test.go``)."""

from __future__ import annotations

import pytest

from hamid.fit import DeviceAmount, DeviceUsage, Fitted, PodPolicy, Quota, Unfit, fit_pod
from hamid.fit.mig import next_candidate, select_candidate
from hamid.fit.usage import with_mig
from hamid.model import annotations as ann
from hamid.model.devices import MODE_MIG, MigPlacement, MigProfile
from hamid.model.mig import MigAllocation

from .helpers import A, I, cd, dev, fitted, node, req, spec


def reason(result: Fitted | Unfit) -> str:
    assert isinstance(result, Unfit), result
    return result.reason


def _slots(*spans: tuple[int, int]) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(s, n) for s, n in spans)


P1G = MigProfile("1g.5gb", 5120, 14, 1, _slots(*((i, 1) for i in range(7))))
P2G = MigProfile("2g.10gb", 10240, 28, 2, _slots((0, 2), (2, 2), (4, 2)))
P3G = MigProfile("3g.20gb", 20480, 42, 3, _slots((0, 4), (4, 4)))
A100 = (P2G, P3G, P1G)  # registered out of order: the choice sorts by memory, then slices


def mig(
    uuid: str = "a", index: int = 0, profiles: tuple[MigProfile, ...] = A100, used: int = 0, usedmem: int = 0
) -> DeviceUsage:
    """An A100-40GB in MIG mode offering ``profiles``."""
    d = dev(uuid, index, count=7, mem=40960, mode=MODE_MIG, used=used, usedmem=usedmem)
    d.mig_profiles = profiles
    return d


def booked(uuid: str, *spans: tuple[str, int, int]) -> tuple[MigAllocation, ...]:
    """Reservations as booked by another pod (its container/device indexes do not matter here)."""
    return tuple(MigAllocation(0, i, uuid, p, MigPlacement(s, n)) for i, (p, s, n) in enumerate(spans))


def test_smallest_profile_with_the_memory_and_its_placement_are_booked() -> None:
    r = fitted(fit_pod(node(mig()), spec(req(mem=10000))))
    assert r.devices == ((cd("a", 10240, 28),),)  # the profile's memory and cores, not the request's
    assert r.mig == (MigAllocation(0, 0, "a", "2g.10gb", MigPlacement(0, 2)),)


def test_placement_order_packs_1g_and_3g_from_the_top() -> None:
    occupied: list[MigPlacement] = []
    got = []
    for memory in (20480, 10240, 5120, 5120):
        chosen = select_candidate(A100, occupied, memory)
        assert chosen is not None
        got.append((chosen[0].name, chosen[1].start))
        occupied.append(chosen[1])
    assert got == [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 3), ("1g.5gb", 2)]


def test_a_larger_profile_serves_when_the_smallest_has_no_free_placement() -> None:
    taken = [MigPlacement(i, 1) for i in (2, 3, 4, 5, 6)]  # slices 0-1 free, but no 1g is listed there
    only_high_1g = MigProfile("1g.5gb", 5120, 14, 1, _slots((2, 1), (3, 1), (4, 1), (5, 1), (6, 1)))
    chosen = select_candidate((P2G, only_high_1g), taken, 4000)
    assert chosen is not None and (chosen[0].name, chosen[1]) == ("2g.10gb", MigPlacement(0, 2))


def test_reported_placements_bound_the_fit() -> None:
    three_2g = [MigPlacement(0, 2), MigPlacement(2, 2), MigPlacement(4, 2)]
    assert next_candidate(A100, three_2g, [], 10000) is None
    assert next_candidate(A100, three_2g, [], 5000) is not None
    assert next_candidate(A100, three_2g, [5000], 5000) is None  # the container's earlier device took slice 6


def test_two_devices_of_one_container_take_two_instances_of_one_gpu() -> None:
    r = fitted(fit_pod(node(mig(profiles=(P1G,))), spec(req(2, mem=4000))))
    assert r.devices == ((cd("a", 5120, 14), cd("a", 5120, 14)),)
    assert [(a.device_index, a.placement.start) for a in r.mig] == [(0, 6), (1, 5)]


def test_too_few_placements_for_the_request() -> None:
    only = MigProfile("1g.5gb", 5120, 14, 1, _slots((6, 1)))
    assert reason(fit_pod(node(mig(profiles=(only,))), spec(req(2, mem=4000)))) == (
        "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible"
    )


def test_no_profile_large_enough() -> None:
    assert reason(fit_pod(node(mig()), spec(req(mem=30000)))) == "1/1 CardMigTopologyInfeasible"


def test_percentage_memory_is_resolved_before_the_profile_choice() -> None:
    d = mig(used=3, usedmem=30720)
    d.mig_used.extend(booked("a", ("2g.10gb", 0, 2), ("2g.10gb", 2, 2), ("2g.10gb", 4, 2)))
    assert reason(fit_pod(node(d), spec(req(pct=25)))) == "1/1 CardMigTopologyInfeasible"
    assert fitted(fit_pod(node(d), spec(req(pct=10)))).mig[0].placement == MigPlacement(6, 1)


def test_a_non_mig_node_keeps_the_device_count_check() -> None:
    assert reason(fit_pod(node(dev("a")), spec(req(2)))) == "NodeInsufficientDevice"


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("hami-core", "NodeInsufficientDevice"),  # not a MIG request: HAMi's device count check
        ("mig", None),
        ("hami-core,mig", None),
    ],
)
def test_vgpu_mode_decides_whether_a_mig_gpu_may_serve(mode: str, want: str | None) -> None:
    policy = PodPolicy.from_annotations({ann.VGPU_MODE: mode})
    result = fit_pod(node(mig()), spec(req(2, mem=4000), policy=policy))
    assert (reason(result) if want else len(fitted(result).mig)) == (want or 2)


def test_vgpu_mode_hami_core_skips_mig_gpus_and_mig_skips_hami_core_ones() -> None:
    core = PodPolicy.from_annotations({ann.VGPU_MODE: "hami-core"})
    assert reason(fit_pod(node(mig()), spec(req(mem=1000), policy=core))) == "1/1 CardTypeMismatch"
    only_mig = PodPolicy.from_annotations({ann.VGPU_MODE: "mig"})
    r = fitted(fit_pod(node(dev("h", 0), mig("m", 1)), spec(req(mem=1000), policy=only_mig)))
    assert r.devices[0][0].uuid == "m"
    assert reason(fit_pod(node(dev("h")), spec(req(mem=1000), policy=only_mig))) == "1/1 CardTypeMismatch"


def test_containers_of_one_pod_never_share_a_slice() -> None:
    r = fitted(fit_pod(node(mig(profiles=(P1G,))), spec(req(mem=4000), req(mem=4000))))
    assert [(a.container_index, a.device_index, a.placement.start) for a in r.mig] == [(0, 0, 6), (1, 0, 5)]


def test_a_later_container_is_fitted_beside_an_init_containers_instance() -> None:
    """The init container's instance lives until the pod ends, so the app's instance counts against
    the quota on top of it (5120 MiB booked + 5120 MiB, the profile its 4000 MiB take), not instead."""
    pod = spec(req(mem=4000), req(mem=4000), kinds=(I, A))
    assert (
        fitted(fit_pod(node(mig(profiles=(P1G,))), pod, Quota(mem_limit=10240))).mig[1].placement.start == 5
    )
    assert (
        reason(fit_pod(node(mig(profiles=(P1G,))), pod, Quota(mem_limit=10239))) == "1/1 ResourceQuotaNotFit"
    )


def test_the_quota_counts_the_profile_a_request_takes_not_the_request() -> None:
    """4000 MiB asked take a 1g.5gb instance of 5120 MiB, which is what gets booked: a quota of 5000
    MiB refuses it (HAMi checks the 4000 and books 5120, over the quota)."""
    one = spec(req(mem=4000))
    assert fitted(fit_pod(node(mig(profiles=(P1G,))), one, Quota(mem_limit=5120))).mig[0].profile == "1g.5gb"
    assert (
        reason(fit_pod(node(mig(profiles=(P1G,))), one, Quota(mem_limit=5000))) == "1/1 ResourceQuotaNotFit"
    )


def test_booked_placements_are_occupied_until_removed() -> None:
    n = node(mig(profiles=(P1G,)))
    amount = DeviceAmount(1, 5120, 14, mig=booked("a", ("1g.5gb", 6, 1)))
    n.add({"a": amount})
    assert fitted(fit_pod(n, spec(req(mem=4000)))).mig[0].placement == MigPlacement(5, 1)
    # a re-filter of the pod that booked it treats its own placement as free
    again = fitted(fit_pod(n, spec(req(mem=4000)), release={"a": amount}))
    assert again.mig[0].placement == MigPlacement(6, 1)
    n.remove({"a": amount})
    assert n.by_id["a"].mig_used == [] and fitted(fit_pod(n, spec(req(mem=4000)))).mig[0].placement.start == 6


@pytest.mark.parametrize(
    ("first", "second", "fault"),
    [
        ([("1g.5gb", 6, 1)], [("1g.5gb", 6, 1)], "1g.5gb at [6,7) overlaps 1g.5gb at [6,7) booked on GPU a"),
        (
            [("2g.10gb", 0, 2)],
            [("3g.20gb", 0, 4)],
            "3g.20gb at [0,4) overlaps 2g.10gb at [0,2) booked on GPU a",
        ),
        ([], [("7g.40gb", 0, 8)], "GPU a does not offer profile 7g.40gb"),
        ([], [("1g.5gb", 0, 2)], "GPU a does not offer 1g.5gb at [0,2)"),
    ],
)
def test_inconsistent_bookings_make_the_gpu_unfit_until_they_go(first, second, fault) -> None:
    n = node(mig())
    if first:
        n.add({"a": DeviceAmount(1, 5120, 14, mig=booked("a", *first))})
    amount = {"a": DeviceAmount(1, 5120, 14, mig=booked("a", *second))}
    assert n.mig_problems(amount) == [fault]
    n.add(amount)
    assert reason(fit_pod(n, spec(req(mem=1000)))) == "1/1 CardNotHealth"
    assert n.room()[0] == 0
    n.remove(amount)
    assert n.by_id["a"].mig_faults == 0 and fitted(fit_pod(n, spec(req(mem=1000))))


def test_a_mig_device_entry_without_a_reservation_and_a_reservation_off_mig_are_faults() -> None:
    n = node(mig("m", 0), dev("h", 1))
    layout = ((cd("m", 5120, 14), cd("h", 100)),)
    usage = with_mig({"m": DeviceAmount(1, 5120, 14), "h": DeviceAmount(1, 100, 0)}, layout, (), n.by_id)
    assert usage["m"].unreserved == 1 and usage["h"].unreserved == 0
    n.add(usage)
    assert n.by_id["m"].mig_faults == 1 and n.by_id["h"].mig_faults == 0
    n.remove(usage)
    stray = (MigAllocation(0, 1, "h", "1g.5gb", MigPlacement(6, 1)),)
    off = with_mig({"h": DeviceAmount(1, 100, 0)}, ((cd("m", 1), cd("h", 100)),), stray, n.by_id)
    assert n.mig_problems(off) == ["GPU h is not in MIG mode but 1g.5gb at [6,7) is reserved on it"]


def test_room_counts_each_placement_of_a_usable_mig_gpu() -> None:
    assert node(mig(profiles=(P1G,))).room() == (7, 40960, 100)
    assert node(mig(profiles=(P1G,), used=7)).room() == (0, 0, 0)
