"""``fgd`` ranks a pending pod's shape in idle time, before kube-scheduler asks (FgdWarmup)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import structlog

from hamid.fit.fgd import parse_workload
from hamid.model import annotations as ann
from hamid.scheduler import fgd_rank
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.fgd_rank import FgdRanker, tie_order
from hamid.scheduler.settings import DEFAULT_SCHEDULER_NAME
from tests.builders import node as plain_node
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.scheduler.helpers import container, node, pod

HALVES = parse_workload([{"cpu": "1", "gpus": 1, "gpuShare": 50}])
NAMES = [f"n{i}" for i in range(16)]  # one node changed re-keys that node alone


def _pending(name: str, cores: int = 20, **annotations: str) -> dict[str, Any]:
    """A pending pod of hamid's scheduler asking one share of a GPU."""
    body = pod(name, containers=[container("c", 1, 1600, cores)], annotations=annotations)
    body["spec"]["schedulerName"] = DEFAULT_SCHEDULER_NAME
    return body


def _post(url: str, body: dict[str, Any], names: list[str]) -> tuple[dict[str, Any], float]:
    """POST /filter from a plain client (blocking; run in a thread) and time the answer."""
    data = json.dumps({"Pod": body, "NodeNames": names}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    return answer, time.perf_counter() - started


@contextlib.asynccontextmanager
async def _fgd_cluster(names: list[str] = NAMES) -> AsyncIterator[Env]:
    """A scheduler whose default policies are ``fgd`` (a pinned workload), its GPU nodes registered."""
    settings = SchedulerSettings(node_policy="fgd", gpu_policy="fgd", fgd_workload=HALVES)
    async with running_scheduler(settings) as env:
        for name in names:
            env.add_node(name)
        await wait_for(lambda: set(names) <= env.scheduler.ledger.nodes.keys())
        yield env


async def test_a_pending_pods_shape_is_ranked_before_its_filter_which_then_ranks_nothing() -> None:
    async with _fgd_cluster() as env:
        fgd, warmup = env.scheduler.fgd, env.scheduler.fgd_warmup
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


async def test_a_ranking_that_fails_in_the_warmup_leaves_the_scheduler_serving(monkeypatch: Any) -> None:
    """A bug ranking one pod's shape is logged; the warm-up and the scheduler go on (the pod's own
    filter then ranks it and answers for it)."""
    real = FgdRanker.ranking

    def ranking(self: FgdRanker, shape: Any, nodes: Any) -> Any:
        if shape.share == 770:  # stands for any shape a ranking bug trips on
            raise ValueError("a ranking bug for one odd shape")
        return real(self, shape, nodes)

    monkeypatch.setattr(FgdRanker, "ranking", ranking)
    async with _fgd_cluster() as env:
        with structlog.testing.capture_logs() as logs:
            await env.create_pod(_pending("odd", cores=77))
            await env.scheduler.fgd_warmup.idle()
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["fgd_warmup_failed"]
        fine = await env.create_pod(_pending("fine"))
        await env.scheduler.fgd_warmup.idle()
        assert (await env.filter(fine, NAMES))["NodeNames"]


async def test_a_backlog_gives_way_to_a_filter_between_rankings(monkeypatch: Any) -> None:
    """Forty pending pods of new shapes (a burst): a filter waits for the ranking in progress, not
    one ranking per event-loop turn its request needs."""
    rerank_s = 0.05
    real = fgd_rank.GainIndex._rebuild

    def slow(self: Any, *args: Any) -> None:
        time.sleep(rerank_s)
        real(self, *args)

    monkeypatch.setattr(fgd_rank.GainIndex, "_rebuild", slow)
    names = NAMES[:4]
    async with _fgd_cluster(names) as env:
        other = _pending("other", cores=30, **{ann.NODE_SCHEDULER_POLICY: "binpack"})
        other["spec"]["containers"] = [container("c", 1, 10**7, 30)]  # fits nowhere: no API call
        other = await env.create_pod(other)
        for i in range(40):
            env.scheduler._pod_seen(_pending(f"burst-{i}", cores=1 + i))
        # the client in its own thread, as kube-scheduler is another process
        answer, waited = await asyncio.to_thread(_post, env.extender + "/filter", other, names)
        assert not answer.get("NodeNames") and answer["FailedNodes"]
        assert waited < 2.5 * rerank_s, f"the filter waited {waited * 1000:.0f} ms behind the warm-up"


async def test_cpu_only_pods_are_not_ranked_ahead_where_nodes_without_gpus_take_them() -> None:
    """A CPU-only pod's filter ranks nothing when kube-scheduler sends nodes without hamid's GPUs
    (it keeps those): ranking its shape ahead would only push a GPU shape's index out."""
    async with _fgd_cluster() as env:
        fgd, warmup = env.scheduler.fgd, env.scheduler.fgd_warmup
        cpu = _pending("cpu")
        cpu["spec"]["containers"] = [container("c", resources={"requests": {"cpu": "1", "memory": "1Gi"}})]
        await env.create_pod(cpu)
        await warmup.idle()
        ranked = fgd.reranks
        assert ranked == 1  # only GPU nodes: its filter ranks them, so it is ranked ahead
        env.server.put(plain_node("cpu-node", allocatable={"cpu": "8", "memory": "16Gi", "pods": "110"}))
        await wait_for(lambda: env.scheduler.nodes.get("cpu-node") is not None)
        cpu2 = _pending("cpu2")
        cpu2["spec"]["containers"] = [container("c", resources={"requests": {"cpu": "3", "memory": "1Gi"}})]
        await env.create_pod(cpu2)
        await warmup.idle()
        assert fgd.reranks == ranked
