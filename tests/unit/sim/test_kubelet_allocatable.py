"""kubelet's allocatable predicate: the active pods' requests summed, read afresh at every admission."""

from __future__ import annotations

from typing import Any

import pytest

from hamidsim.kubelet.admission import check_allocatable
from hamidsim.kubelet.errors import AdmissionFailure

GI = 1024**3


def _pod(uid: str, cpu: str, memory: str = "1Gi", version: str = "1") -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": memory}}
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "resourceVersion": version},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
    }


def test_a_pod_beside_the_active_ones_fits_until_the_cpu_is_spent() -> None:
    active = [_pod("a", "2"), _pod("b", "1500m")]
    check_allocatable(_pod("new", "500m"), active, 4000, 8 * GI, 110)
    with pytest.raises(AdmissionFailure, match="cpu, requested: 600, used: 3500, capacity: 4000"):
        check_allocatable(_pod("new", "600m"), active, 4000, 8 * GI, 110)


def test_a_new_version_of_a_pod_is_read_again() -> None:
    check_allocatable(_pod("x", "1"), [_pod("a", "1", version="7")], 4000, 8 * GI, 110)
    resized = _pod("a", "3500m", version="8")
    with pytest.raises(AdmissionFailure, match="used: 3500"):
        check_allocatable(_pod("x", "1"), [resized], 4000, 8 * GI, 110)


def test_an_equal_uid_and_version_from_another_cluster_is_read_again() -> None:
    """The trace bench replays several clusters in one process, each counting versions from 1: a
    remembered (uid, version) once summed the previous cluster's requests (OutOfcpu by thousands)."""
    check_allocatable(_pod("x", "1"), [_pod("a", "1", version="3")], 4000, 8 * GI, 110)
    with pytest.raises(AdmissionFailure, match="used: 3500"):
        check_allocatable(_pod("x", "1"), [_pod("a", "3500m", version="3")], 4000, 8 * GI, 110)


def test_pods_without_uid_or_version_are_read_each_time() -> None:
    plain = _pod("", "3")
    check_allocatable(_pod("x", "1"), [plain], 4000, 8 * GI, 110)
    plain["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3500m"
    with pytest.raises(AdmissionFailure, match="used: 3500"):
        check_allocatable(_pod("x", "1"), [plain], 4000, 8 * GI, 110)


def test_the_pod_count_is_checked_first() -> None:
    with pytest.raises(AdmissionFailure, match="pods"):
        check_allocatable(_pod("x", "1"), [_pod("a", "1")], 4000, 8 * GI, 1)
