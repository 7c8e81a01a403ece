"""Phase-aware pod usage, node bookkeeping and the node score."""

from __future__ import annotations

import pytest

from hamid.fit import (
    DeviceAmount,
    NodeUsage,
    effective_pod_usage,
    init_containers_succeeded,
    own_usage_for,
    phases,
    pod_quota_usage,
    usage_totals,
)
from hamid.model.devices import DeviceInfo, MigPlacement
from hamid.model.mig import MigAllocation

from .helpers import A, I, S, cd, dev, node

# HAMi pkg/device/initContainer_test.go collapse vectors (docs/hami-wire.md §3.3).
COLLAPSE = [
    ("apps share a GPU", [A, A], [(cd("g", 100, 10),), (cd("g", 200, 20),)], DeviceAmount(2, 300, 30)),
    ("inits take the peak", [I, I], [(cd("g", 100, 10),), (cd("g", 200, 30),)], DeviceAmount(1, 200, 30)),
    ("init above app", [I, A], [(cd("g", 500, 50),), (cd("g", 100, 10),)], DeviceAmount(1, 500, 50)),
    (
        "init below two apps",
        [I, A, A],
        [(cd("g", 100, 10),), (cd("g", 200, 20),), (cd("g", 300, 30),)],
        DeviceAmount(2, 500, 50),
    ),
]


@pytest.mark.parametrize(("kinds", "layout", "want"), [c[1:] for c in COLLAPSE], ids=[c[0] for c in COLLAPSE])
def test_collapse_vectors(kinds, layout, want):
    assert effective_pod_usage(tuple(layout), kinds) == {"g": want}


def test_per_field_max_and_separate_devices():
    layout = ((cd("a", 5000, 10),), (cd("a", 1000, 60), cd("b", 700, 5)), ())
    got = effective_pod_usage(layout, [I, A, A])
    assert got == {"a": DeviceAmount(1, 5000, 60), "b": DeviceAmount(1, 700, 5)}
    assert list(got) == ["a", "b"]  # sorted by UUID like HAMi


def test_init_release_keeps_only_steady_phase():
    layout = ((cd("a", 30000),), (cd("b", 20000),))
    assert effective_pod_usage(layout, [I, A]) == {
        "a": DeviceAmount(1, 30000, 0),
        "b": DeviceAmount(1, 20000, 0),
    }
    assert effective_pod_usage(layout, [I, A], init_released=True) == {"b": DeviceAmount(1, 20000, 0)}


def test_sidecars_add_to_apps_and_stay_after_release():
    layout = ((cd("b", 30000),), (cd("b", 10000),), (cd("b", 20000),))
    kinds = [I, S, A]
    assert effective_pod_usage(layout, kinds) == {"b": DeviceAmount(2, 30000, 0)}
    assert effective_pod_usage(layout, kinds, init_released=True) == {"b": DeviceAmount(2, 30000, 0)}


def test_sidecar_before_init_runs_concurrently_with_it():
    # A sidecar declared before a regular init container runs during that init container.
    layout = ((cd("b", 10000),), (cd("b", 30000),), (cd("b", 5000),))
    assert effective_pod_usage(layout, [S, I, A]) == {"b": DeviceAmount(2, 40000, 0)}


def test_phases():
    assert phases([I, S, I, A, A]) == ((0,), (1, 2), (1, 3, 4))
    assert phases([I, S, I, A, A], init_released=True) == ((1, 3, 4),)
    assert phases([A]) == ((0,),)
    assert phases([I]) == ((0,),)
    assert phases([I], init_released=True) == ()


def test_other_types_and_missing_kinds():
    from hamid.model.devices import ContainerDevice

    layout = ((ContainerDevice("x", "OTHER", 5, 5), cd("a", 1)), (cd("a", 2),))
    # kinds shorter than the layout: extra entries count as app containers
    assert effective_pod_usage(layout, [A]) == {"a": DeviceAmount(2, 3, 0)}


def test_own_usage_for_target():
    layout = ((cd("a", 5000),), (cd("a", 5000),), (cd("a", 5000),))
    own = own_usage_for(layout, [I, A, A], 0)
    assert (own["a"].con_mem, own["a"].oth_mem, own["a"].oth_slots) == (0, 10000, 2)
    own = own_usage_for(layout, [I, A, A], 1)
    assert (own["a"].con_mem, own["a"].con_slots, own["a"].oth_mem) == (5000, 1, 5000)
    assert own["a"].booked() == (1, 5000, 0)


def test_entries_on_a_gpu_the_mig_reservations_name_are_summed_for_the_pods_life():
    """Each is an instance held until the pod ends, an init container's too: no phase maximum on
    that GPU, before or after the init release; another GPU of the pod keeps the phase rule."""
    layout = ((cd("m", 4864, 15), cd("h", 30000, 30)), (cd("m", 20096, 43), cd("h", 20000, 20)))
    mig = (
        MigAllocation(0, 0, "m", "1g.5gb", MigPlacement(6, 1)),
        MigAllocation(1, 0, "m", "3g.20gb", MigPlacement(0, 4)),
    )
    held = DeviceAmount(2, 4864 + 20096, 15 + 43)
    assert effective_pod_usage(layout, [I, A], mig=mig) == {"h": DeviceAmount(1, 30000, 30), "m": held}
    assert effective_pod_usage(layout, [I, A], True, mig) == {"h": DeviceAmount(1, 20000, 20), "m": held}
    assert pod_quota_usage(layout, [I, A], False, mig) == (30000 + 24960, 30 + 58)
    assert pod_quota_usage(layout, [I, A], True, mig) == (20000 + 24960, 20 + 58)
    # the fit of the app container sees the init container's instance beside it
    own = own_usage_for(layout, [I, A], 1, mig=mig)
    assert (own["m"].con_slots, own["m"].con_mem, own["m"].con_cores) == (1, 4864, 15)
    assert (own["h"].con_mem, own["h"].oth_mem) == (0, 30000)


def test_node_add_remove_and_unknown():
    n = NodeUsage.from_infos(
        "n1",
        [
            DeviceInfo("a", 0, 10, 8000, 100, "NVIDIA-X", 0, "hami-core", True),
            DeviceInfo("b", 1, 10, 8000, 100, "NVIDIA-X"),
        ],
    )
    usage = {"a": DeviceAmount(2, 3000, 30), "zz": DeviceAmount(1, 1, 1)}
    assert n.add(usage) == ("zz",)
    a = n.by_id["a"]
    assert (a.used, a.usedmem, a.usedcores) == (2, 3000, 30)
    assert n.score() == pytest.approx(10 * (2 / 20 + 30 / 200 + 3000 / 16000))
    copy = n.copy()
    assert n.remove(usage) == ("zz",)
    assert (a.used, a.usedmem, a.usedcores) == (0, 0, 0)
    assert n.score() == 0.0
    assert copy.by_id["a"].usedmem == 3000  # the copy is independent
    # slots of 0 still book one slot (HAMi: Used += max(Slots, 1))
    n.add({"b": DeviceAmount(0, 1, 1)})
    assert n.by_id["b"].used == 1


def test_node_score_vector():
    # HAMi pkg/scheduler/score_test.go Test_calcScore.
    n = node(dev("g", count=10, core=100, mem=8000, used=5, usedcores=50, usedmem=4000))
    assert n.score() == pytest.approx(15.0)
    assert node(dev("g", count=10, core=100, mem=8000)).score() == 0.0
    assert node(dev("g", count=0, core=100, mem=8000, used=1)).score() == 0.0


def test_node_scores_are_go_float32():
    """HAMi scores nodes in float32: these two are equal in exact (and float64) arithmetic, but
    upstream's values differ, so its sort orders them (binpack takes the second, spread the
    first) where a float64 score would tie them (an outside compatibility audit found it). The
    expected values are Go's ``float32`` results, one rounding per operation."""
    a = node(dev("a0", mem=24576, used=1, usedmem=20480), dev("a1", 1, mem=24576))
    b = node(dev("b0", mem=24576, used=1, usedcores=50, usedmem=8192), dev("b1", 1, mem=24576))
    assert 10 * (1 / 20 + 0 / 200 + 20480 / 49152) == 10 * (1 / 20 + 50 / 200 + 8192 / 49152)
    assert (a.score(), b.score()) == (4.666666507720947, 4.6666669845581055)


def test_candidates_only_nvidia_types():
    n = node(dev("a"), dev("b", 1, type="Ascend-910"))
    assert [d.id for d in n.candidates] == ["a"]


def test_usage_totals():
    assert usage_totals({"a": DeviceAmount(1, 10, 20), "b": DeviceAmount(2, 5, 1)}) == (15, 21)


def _pod(init, statuses):
    return {
        "spec": {"initContainers": init, "containers": [{"name": "app"}]},
        "status": {"initContainerStatuses": statuses},
    }


def _term(name, code):
    return {"name": name, "state": {"terminated": {"exitCode": code}}}


def test_init_containers_succeeded():
    init = [{"name": "i1"}, {"name": "side", "restartPolicy": "Always"}, {"name": "i2"}]
    running_side = {"name": "side", "state": {"running": {}}}
    assert init_containers_succeeded(_pod(init, [_term("i1", 0), running_side, _term("i2", 0)]))
    assert not init_containers_succeeded(_pod(init, [_term("i1", 0), running_side, _term("i2", 1)]))
    assert not init_containers_succeeded(_pod(init, [_term("i1", 0), running_side]))
    assert not init_containers_succeeded(_pod([{"name": "side", "restartPolicy": "Always"}], [running_side]))
    assert not init_containers_succeeded({"spec": {"containers": [{"name": "app"}]}})
