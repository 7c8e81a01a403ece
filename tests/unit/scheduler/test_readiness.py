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
