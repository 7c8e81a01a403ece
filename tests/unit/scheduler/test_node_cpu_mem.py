"""CPU and memory per node as kube-scheduler counts them (requests, init containers, overhead)."""

from __future__ import annotations

from typing import Any

import pytest

from hamid.fit.node_room import CpuMem, is_guaranteed, node_allocatable, pod_cpu_mem
from hamid.model.errors import InvalidInput
from hamid.scheduler.node_cpu_mem import NodeCpuMem
from tests.builders import container, node, pod

GI = 1 << 30


def _c(name: str, cpu: str, memory: str, **fields: Any) -> dict[str, Any]:
    return container(name, requests={"cpu": cpu, "memory": memory}, **fields)


def test_pod_request_follows_kube_scheduler() -> None:
    p = pod(
        "p",
        containers=[_c("a", "1", "1Gi"), _c("b", "500m", "1Gi")],
        init_containers=[
            _c("side", "250m", "1Gi", restartPolicy="Always"),
            _c("init", "3", "512Mi"),  # 3 CPUs + the sidecar before it: 3.25 > 1.5 + 0.25
        ],
        spec={"overhead": {"cpu": "100m", "memory": "1Gi"}},
    )
    assert pod_cpu_mem(p) == CpuMem(3350, 4 * GI)
    limits_only = pod("l", containers=[container("a", limits={"cpu": "2", "memory": "1Gi"})])
    assert pod_cpu_mem(limits_only) == CpuMem(2000, GI)
    assert pod_cpu_mem(pod("none")) == CpuMem()
    with pytest.raises(InvalidInput, match="cpu"):
        pod_cpu_mem(pod("bad", containers=[_c("a", "lots", "1Gi")]))


def test_guaranteed() -> None:
    both = {"cpu": "2", "memory": "1Gi"}
    assert is_guaranteed(pod("g", containers=[container("a", limits=both)]))
    assert is_guaranteed(pod("g", containers=[container("a", limits=both, requests=both)]))
    assert not is_guaranteed(pod("b", containers=[container("a", limits=both, requests={"cpu": "1"})]))
    assert not is_guaranteed(pod("b", containers=[container("a", limits={"cpu": "2"})]))
    assert not is_guaranteed(pod("b"))


def test_node_room_counts_bound_and_assumed_pods() -> None:
    rooms = NodeCpuMem()
    changed: list[str] = []
    rooms.on_change = changed.append
    assert node_allocatable(node("n")) is None
    rooms.on_node(node("n", allocatable={"cpu": "8", "memory": "16Gi", "pods": "110"}))
    assert rooms.room("n") == CpuMem(8000, 16 * GI) and changed == ["n"]
    foreign = pod("f", node="n", uid="u1", containers=[_c("a", "2", "4Gi")])
    rooms.on_pod(foreign)
    assert rooms.room("n") == CpuMem(6000, 12 * GI) and changed == ["n", "n"]
    rooms.on_pod(foreign)  # an update without change counts once
    assert rooms.room("n") == CpuMem(6000, 12 * GI) and len(changed) == 2
    mine = pod("m", uid="u2", containers=[_c("a", "1", "1Gi")])
    rooms.on_pod(mine)  # pending, unbound: not counted
    assert rooms.room("n") == CpuMem(6000, 12 * GI)
    undo = rooms.assume("u2", "n", pod_cpu_mem(mine))
    assert rooms.room("n") == CpuMem(5000, 11 * GI)
    undo()
    assert rooms.room("n") == CpuMem(6000, 12 * GI)
    rooms.assume("u2", "n", pod_cpu_mem(mine))
    mine["spec"]["nodeName"] = "n"
    rooms.on_pod(mine)  # bound: the cache's count replaces the assumption
    assert rooms.room("n") == CpuMem(5000, 11 * GI)
    rooms.on_pod({**foreign, "status": {"phase": "Succeeded"}})  # finished: no longer counted
    assert rooms.room("n") == CpuMem(7000, 15 * GI)
    rooms.on_pod_deleted(mine)
    assert rooms.room("n") == CpuMem(8000, 16 * GI) and rooms.requested("n") == CpuMem()
    rooms.on_node_deleted("n")
    assert rooms.room("n") is None
