"""Node lock decisions: value format, expiry, re-entrancy, holder states (upstream #3096)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hamid.model import annotations as ann
from hamid.model.nodelock import Decision, Holder, decide, holder_state
from tests.unit.scheduler.helpers import pod

NOW = datetime(2026, 7, 3, 7, 35, 10, tzinfo=UTC)
TIMEOUT = timedelta(minutes=5)


def lock(ns: str = "ns", name: str = "holder", age: float = 10) -> str:
    return ann.format_node_lock(NOW - timedelta(seconds=age), ns, name)


def always(state: Holder):
    return lambda _ns, _name: state


def test_unlocked_and_own_lock() -> None:
    assert decide(None, "ns", "p", NOW, TIMEOUT, always(Holder.PENDING)).decision is Decision.TAKE
    view = decide(lock(name="p"), "ns", "p", NOW, TIMEOUT, always(Holder.PENDING))
    assert view.decision is Decision.OWN


def test_prefix_names_are_not_owners() -> None:  # upstream #1433
    view = decide(lock(name="abc-1"), "ns", "abc", NOW, TIMEOUT, always(Holder.PENDING))
    assert view.decision is Decision.WAIT


@pytest.mark.parametrize(
    ("holder", "expected"),
    [
        (Holder.PENDING, Decision.WAIT),
        (Holder.UNKNOWN, Decision.WAIT),
        (Holder.ABSENT, Decision.TAKE),
        (Holder.DONE, Decision.TAKE),
    ],
)
def test_holder_states(holder: Holder, expected: Decision) -> None:
    assert decide(lock(), "ns", "p", NOW, TIMEOUT, always(holder)).decision is expected


def test_expiry_and_legacy() -> None:
    for gone in (Holder.ABSENT, Holder.DONE):
        assert decide(lock(age=301), "ns", "p", NOW, TIMEOUT, always(gone)).decision is Decision.TAKE
    legacy_expired = ann.format_rfc3339(NOW - timedelta(seconds=301))
    assert decide(legacy_expired, "ns", "p", NOW, TIMEOUT, always(Holder.UNKNOWN)).decision is Decision.TAKE
    legacy = ann.format_rfc3339(NOW - timedelta(seconds=30))
    assert decide(legacy, "ns", "p", NOW, TIMEOUT, always(Holder.ABSENT)).decision is Decision.WAIT
    old_legacy = "2026-07-03T15:35:10+08:00"  # HAMi's vector: 7:35:10Z, i.e. NOW → not expired
    assert decide(old_legacy, "ns", "p", NOW, TIMEOUT, always(Holder.ABSENT)).decision is Decision.WAIT
    assert decide("garbage,a", "ns", "p", NOW, TIMEOUT, always(Holder.PENDING)).decision is Decision.TAKE


def test_holder_state_classification() -> None:
    assert holder_state(None, "n1") is Holder.ABSENT
    assert holder_state(None, "n1", known=False) is Holder.UNKNOWN
    pending = pod("h", annotations={ann.VGPU_NODE: "n1", ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING})
    assert holder_state(pending, "n1") is Holder.PENDING
    assert holder_state(pending, "n2") is Holder.DONE  # re-filtered elsewhere
    allocated = pod("h", annotations={ann.BIND_PHASE: ann.BIND_PHASE_SUCCESS})
    assert holder_state(allocated, "n1") is Holder.DONE
    failed = pod("h", phase="Failed")
    assert holder_state(failed, "n1") is Holder.DONE
    deleting = pod("h")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert holder_state(deleting, "n1") is Holder.DONE


@pytest.mark.parametrize("holder", [Holder.PENDING, Holder.UNKNOWN])
def test_pending_holder_keeps_an_expired_lock_until_the_max_hold(holder: Holder) -> None:
    """Upstream #3096: an expired lock never passes while its holder is Pending and unallocated."""
    max_hold = timedelta(minutes=30)
    view = decide(lock(age=301), "ns", "p", NOW, TIMEOUT, always(holder), max_hold)
    assert view.decision is Decision.WAIT and "--node-lock-max-hold" in view.why and not view.forced
    view = decide(lock(age=1799), "ns", "p", NOW, TIMEOUT, always(holder), max_hold)
    assert view.decision is Decision.WAIT
    view = decide(lock(age=1801), "ns", "p", NOW, TIMEOUT, always(holder), max_hold)
    assert view.decision is Decision.TAKE and view.forced  # taken with a warning
    assert decide(lock(age=1801), "ns", "p", NOW, TIMEOUT, always(Holder.DONE), max_hold).forced is False


@pytest.mark.parametrize(
    ("holder", "quiet_s", "stall_s", "expected"),
    [
        (Holder.PENDING, 19, 20, Decision.WAIT),  # still within the stall
        (Holder.PENDING, 20, 20, Decision.TAKE),  # no progress for the whole stall
        (Holder.PENDING, 600, None, Decision.WAIT),  # stall detection off
        (Holder.UNKNOWN, 600, 20, Decision.WAIT),  # a cache that cannot tell never counts as stalled
    ],
)
def test_a_pending_holder_without_progress_loses_the_lock(
    holder: Holder, quiet_s: float, stall_s: float | None, expected: Decision
) -> None:
    view = decide(
        lock(age=quiet_s),
        "ns",
        "p",
        NOW,
        TIMEOUT,
        always(holder),
        timedelta(minutes=30),
        timedelta(seconds=quiet_s),
        None if stall_s is None else timedelta(seconds=stall_s),
    )
    assert view.decision is expected
    assert view.forced is (expected is Decision.TAKE)
    if expected is Decision.TAKE:
        assert "no progress" in view.why
