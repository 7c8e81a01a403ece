"""The bounded memory of the Events the scheduler records."""

from __future__ import annotations

from hamid.model import reasons as R
from hamid.scheduler.ui import history
from hamid.scheduler.ui.history import EventHistory
from tests.builders import pod


def _pod(name: str, uid: str = "") -> dict:
    return pod(name, uid=uid or f"uid-{name}")


def test_refits_are_kept_per_pod_with_their_exact_text_and_counted_per_hour() -> None:
    now = [1000.0]
    h = EventHistory(lambda: now[0])
    h.note(_pod("a"), "Normal", R.EVENT_NUMA_REFIT_SUCCEED, "moved <x>")
    now[0] += 4000
    h.note(_pod("a"), "Warning", R.EVENT_NUMA_REFIT_FAILED, "refused")
    h.note(_pod("b"), "Normal", R.EVENT_BINDING_SUCCEED, "ignored here")
    h.note(_pod("b"), "Normal", "SomethingElse", "ignored")
    assert [(e.reason, e.message, e.at) for e in h.refits("default/a")] == [
        (R.EVENT_NUMA_REFIT_SUCCEED, "moved <x>", 1000.0),
        (R.EVENT_NUMA_REFIT_FAILED, "refused", 5000.0),
    ]
    assert h.refits("default/a", uid="another") == ()
    assert h.refits_since(3600) == {R.EVENT_NUMA_REFIT_SUCCEED: 0, R.EVENT_NUMA_REFIT_FAILED: 1}
    assert h.refits_since(5000) == {R.EVENT_NUMA_REFIT_SUCCEED: 1, R.EVENT_NUMA_REFIT_FAILED: 1}


def test_a_fit_failure_is_remembered_until_a_filter_or_bind_succeeds() -> None:
    h = EventHistory(lambda: 0.0)
    h.note(_pod("p"), "Warning", R.EVENT_FILTERING_FAILED, "1 nodes 1/1 CardTypeMismatch(n)")
    got = h.unfit("default/p")
    assert got is not None and got.message == "1 nodes 1/1 CardTypeMismatch(n)"
    assert h.unfit("default/p", uid="other") is None
    version = h.version
    h.note(_pod("p"), "Normal", R.EVENT_FILTERING_SUCCEED, "ok")
    assert h.unfit("default/p") is None and h.version > version


def test_memory_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(history, "MAX_PODS", 3)
    monkeypatch.setattr(history, "MAX_PER_POD", 2)
    h = EventHistory(lambda: 0.0)
    for i in range(5):
        h.note(_pod(f"p{i}"), "Warning", R.EVENT_FILTERING_FAILED, "x")
        for k in range(3):
            h.note(_pod(f"p{i}"), "Normal", R.EVENT_NUMA_REFIT_SUCCEED, f"m{k}")
    assert [h.unfit(f"default/p{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert h.refits("default/p0") == ()
    assert [e.message for e in h.refits("default/p4")] == ["m1", "m2"]
