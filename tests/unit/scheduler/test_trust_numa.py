"""The webhook removes a forged ``hamid.io/numa-placement`` at CREATE: only the node agent writes it
(the scheduler's per-NUMA ledger books it as what kubelet chose)."""

from __future__ import annotations

from tests.unit.scheduler.helpers import pod
from tests.unit.scheduler.test_trust import patch_of, review

FORGED = '{"v":1,"gen":1,"containers":[{"name":"main","numa":"0","cpus":"0-63"}]}'


def test_forged_placement_is_removed_at_create() -> None:
    response = review(pod("a", annotations={"hamid.io/numa-placement": FORGED, "team.io/keep": "yes"}))
    assert response["allowed"] is True
    removed = {op["path"] for op in patch_of(response) if op["op"] == "remove"}
    assert removed == {"/metadata/annotations/hamid.io~1numa-placement"}
    assert "scheduler-owned" in response["warnings"][0]


def test_placement_is_kept_on_update() -> None:
    response = review(pod("a", annotations={"hamid.io/numa-placement": FORGED}), operation="UPDATE")
    assert not [op for op in patch_of(response) if op["op"] == "remove"]
