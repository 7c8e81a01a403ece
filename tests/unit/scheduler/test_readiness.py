"""Readiness: the one decision gate, moved only by leadership terms."""

from __future__ import annotations

from hamid.scheduler.readiness import Readiness


def test_a_term_decides_only_once_its_caches_caught_up() -> None:
    synced = [False]
    gate = Readiness(lambda: synced[0])
    assert gate.reason() == "caches not synced"
    synced[0] = True
    assert gate.reason() == ""  # no election: leads from the start
    gate.follow()
    assert gate.reason() == "not the leader"
    gate.caught_up()  # a late sync of an ended term changes nothing
    assert (gate.leading, gate.term_synced) == (False, False)
    gate.lead()
    assert gate.reason() == "cache of this term not synced yet"
    gate.caught_up()
    assert gate.reason() == "" and gate.leading and gate.term_synced


class _Lease:
    """A fence whose lease validity and term the test sets."""

    def __init__(self) -> None:
        self.epoch = "a@t0#1"
        self.invalid = ""

    def lease_invalid(self) -> str:
        return self.invalid


def test_the_fence_is_checked_at_every_decision_and_a_stale_epoch_is_refused() -> None:
    gate, lease = Readiness(lambda: True), _Lease()
    gate.fence(lease)
    gate.lead()
    gate.caught_up()
    started = gate.epoch()
    assert gate.reason() == "" and gate.check(started) == ""
    lease.invalid = "lease not renewed for 16.0s"  # a pause: no renew loop ran, the clock did
    assert gate.reason() == gate.check(started) == "lease not renewed for 16.0s"
    lease.invalid = ""
    assert gate.check(started) == ""  # renewed with nobody else in between: same term
    lease.epoch = "b@t1#2"  # another replica held the lease in between
    assert gate.check(started).startswith("leadership changed while deciding")
    later = gate.epoch()
    gate.follow()
    gate.lead()
    gate.caught_up()
    assert gate.check(later).startswith("leadership changed while deciding")  # a new term


def test_stopping_refuses_new_decisions_and_lets_those_in_flight_write() -> None:
    gate = Readiness(lambda: True)
    started = gate.epoch()
    gate.stop()
    assert gate.reason() == "shutting down"
    assert gate.check(started) == ""
