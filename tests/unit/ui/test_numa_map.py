"""The node page's NUMA map stays bounded work whatever a node's profile lists."""

from __future__ import annotations

import time

from hamid.model.numa import CpuInfo, KubeletPolicies, NumaProfile
from hamid.scheduler.ui.numa_map import MAX_DRAWN_CPUS, MapInput, numa_map


def _profile(cpus: int) -> NumaProfile:
    """One NUMA node of ``cpus`` CPUs (a profile writes them as ranges: a few hundred bytes)."""
    policies = KubeletPolicies(cpu_manager_policy="static", topology_manager_policy="single-numa-node")
    cpu_infos = tuple(CpuInfo(c, c, 0, 0) for c in range(cpus))
    return NumaProfile(1, int(time.time()), (0,), cpu_infos, frozenset(), None, policies)


def _draw(cpus: int) -> str:
    return str(numa_map(MapInput(_profile(cpus), ()), {}, lambda pod: f"/ui/pod/{pod}"))


def test_a_square_per_cpu_up_to_the_cap() -> None:
    drawn = _draw(MAX_DRAWN_CPUS)
    assert drawn.count('class="cpu shared"') == MAX_DRAWN_CPUS
    assert f"NUMA 0: {MAX_DRAWN_CPUS} CPUs" in drawn


def test_a_profile_listing_65536_cpus_is_counted_not_drawn() -> None:
    """A hostile profile (root on a node writes its own) made a 9 MB page rendered on the loop."""
    drawn = _draw(65536)
    assert 'class="cpu' not in drawn and "NUMA 0: 65536 CPUs (0 exclusive, 0 reserved, 65536 shared)" in drawn
    assert len(drawn) < 10_000
