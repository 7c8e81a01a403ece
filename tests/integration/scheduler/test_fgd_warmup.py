"""``fgd`` ranks a pending pod's shape in idle time, before kube-scheduler asks (FgdWarmup)."""

from __future__ import annotations

from typing import Any

from hamid.fit.fgd import parse_workload
from hamid.model import annotations as ann
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.fgd_rank import tie_order
from hamid.scheduler.settings import DEFAULT_SCHEDULER_NAME
from tests.integration.scheduler.harness import running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, node, pod

HALVES = parse_workload([{"cpu": "1", "gpus": 1, "gpuShare": 50}])
NAMES = [f"n{i}" for i in range(16)]  # one node changed re-keys that node alone


def _pending(name: str, cores: int = 20, **annotations: str) -> dict[str, Any]:
    """A pending pod of hamid's scheduler asking one share of a GPU."""
    body = pod(name, containers=[container("c", 1, 1600, cores)], annotations=annotations)
    body["spec"]["schedulerName"] = DEFAULT_SCHEDULER_NAME
    return body


async def test_a_pending_pods_shape_is_ranked_before_its_filter_which_then_ranks_nothing() -> None:
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=HALVES)
    async with running_scheduler(settings) as env:
        fgd, warmup = env.scheduler.fgd, env.scheduler.fgd_warmup
        for name in NAMES:
            env.add_node(name)
        await wait_for(lambda: set(NAMES) <= env.scheduler.ledger.nodes.keys())
        before = fgd.reranks
        first = await env.create_pod(_pending("p1"))
        await warmup.idle()
        assert fgd.reranks == before + 1  # every node ranked for the new shape, in idle time
        answer = await env.filter(first, NAMES)
        assert answer["NodeNames"] == [max(NAMES, key=tie_order)]
        assert fgd.reranks == before + 1  # the filter found its ranking ready

        # under another node policy nothing is ranked ahead: a new shape waits for its filter
        other = await env.create_pod(_pending("p2", cores=30, **{ann.NODE_SCHEDULER_POLICY: "binpack"}))
        await warmup.idle()
        assert fgd.reranks == before + 1
        assert (await env.filter(other, NAMES))["NodeNames"]

        # a follower ranks nothing ahead (the leader decides)
        env.scheduler.readiness.follow()
        await env.create_pod(_pending("p3", cores=40))
        await warmup.idle()
        assert fgd.reranks == before + 1


def test_only_pending_pods_of_hamid_under_fgd_wait_and_the_queue_is_bounded(monkeypatch: Any) -> None:
    """A bound, finished, terminating or foreign pod is not ranked ahead (and leaves the queue);
    past the bound the oldest pending pod is dropped, its filter ranks it."""
    from hamid.scheduler import fgd_warmup

    scheduler = Scheduler(None, settings=SchedulerSettings(node_policy="fgd", fgd_workload=HALVES))
    scheduler._node_seen(node("n1"))
    warmup = scheduler.fgd_warmup
    queued = lambda: list(warmup._queue)  # noqa: E731
    scheduler._pod_seen(_pending("a"))
    assert queued() == ["uid-a"]
    bound = _pending("a")
    bound["spec"]["nodeName"] = "n1"
    scheduler._pod_updated(_pending("a"), bound)
    assert queued() == []
    for change in (
        lambda p: p["status"].update(phase="Succeeded"),
        lambda p: p["metadata"].update(deletionTimestamp="2026-12-03T00:00:00Z"),
        lambda p: p["spec"].update(schedulerName="default-scheduler"),
    ):
        body = _pending("b")
        change(body)
        scheduler._pod_seen(body)
        assert queued() == []
    scheduler._pod_seen(_pending("c"))
    scheduler._pod_gone(_pending("c"))
    assert queued() == []

    monkeypatch.setattr(fgd_warmup, "_QUEUE_MAX", 2)
    for name in ("d", "e", "f"):
        scheduler._pod_seen(_pending(name))
    assert queued() == ["uid-e", "uid-f"]
