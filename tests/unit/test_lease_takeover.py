"""When a campaigning replica may take another holder's Lease (:func:`hamid.kube.leader.takeover_at`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hamid.kube.leader import takeover_at

WALL = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
#: The loop clock reads NOW when the wall clock reads WALL.
NOW = 1000.0


def spec(renewed: datetime | None, duration: object = 15) -> dict[str, object]:
    record: dict[str, object] = {"holderIdentity": "a", "leaseDurationSeconds": duration}
    if renewed is not None:
        record["renewTime"] = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return record


def at(record: dict[str, object], observed_at: float, default: float = 15.0) -> float:
    return takeover_at(record, observed_at, NOW, WALL.timestamp(), default)


def test_a_renewal_seen_late_expires_at_its_renew_time_plus_the_duration() -> None:
    # renewed 1.8 s before this replica saw the record change (a poll's lag): the renewTime bound
    # is 1.8 s sooner than client-go's observed bound
    seen = NOW - 0.5
    assert at(spec(WALL - timedelta(seconds=2.3)), seen) == pytest.approx(NOW - 2.3 + 15)
    assert at(spec(WALL - timedelta(seconds=2.3)), seen) < seen + 15


def test_the_observed_bound_holds_when_it_is_the_earlier() -> None:
    # a renewTime far behind its write (the holder's clock behind this one's) cannot delay expiry
    assert at(spec(WALL - timedelta(seconds=1)), NOW - 3) == pytest.approx(NOW - 3 + 15)


def test_a_renew_time_in_the_future_or_absent_leaves_the_observed_bound() -> None:
    # this replica's clock is behind the holder's: the renewTime says nothing safe
    assert at(spec(WALL + timedelta(seconds=4)), NOW - 1) == pytest.approx(NOW - 1 + 15)
    assert at(spec(None), NOW - 1) == pytest.approx(NOW - 1 + 15)
    assert at({**spec(None), "renewTime": "yesterday"}, NOW - 1) == pytest.approx(NOW - 1 + 15)


def test_the_records_duration_counts_and_a_missing_one_falls_back() -> None:
    renewed = WALL - timedelta(seconds=1)
    assert at(spec(renewed, 40), NOW) == pytest.approx(NOW - 1 + 40)
    assert at(spec(renewed, None), NOW, default=10) == pytest.approx(NOW - 1 + 10)
    assert at(spec(renewed, 0), NOW, default=10) == pytest.approx(NOW - 1 + 10)
