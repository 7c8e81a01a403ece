"""/filter over real HTTP predicts kubelet's NUMA node from the node's profile and records it."""

from __future__ import annotations

import dataclasses
import time

from hamid.model import annotations as ann
from hamid.model.numa import NUMA_PREDICTED, NUMA_PROFILE, decode_prediction, encode_profile
from tests.integration.scheduler.harness import running_scheduler, wait_for
from tests.unit.scheduler.test_numa_ledger import PROFILE, _node, _pod


async def test_filter_patch_carries_the_prediction_and_the_ledger_books_it() -> None:
    async with running_scheduler() as env:
        node = _node()
        profile = dataclasses.replace(PROFILE, observed_at=int(time.time()))
        node["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
        env.server.put({"apiVersion": "v1", "kind": "Node", **node})
        await wait_for(lambda: env.scheduler.numa.free_cpus("n1") is not None)
        p = await env.create_pod(_pod("a"))
        body = await env.filter(p, ["n1"])
        assert body["NodeNames"] == ["n1"]
        annos = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        predicted = decode_prediction(annos[NUMA_PREDICTED])
        assert predicted.generation == profile.generation
        assert predicted.containers[0].numa == frozenset({0})
        assert annos[ann.DEVICES_ALLOCATED].startswith("n1-g0,")  # the GPU of the predicted NUMA node
        # the ledger keeps the booking once the patched pod comes back from the watch
        await wait_for(
            lambda: (
                NUMA_PREDICTED
                in (env.scheduler.pods.get("default/a") or {}).get("metadata", {}).get("annotations", {})
            )
        )
        assert env.scheduler.numa.free_cpus("n1") == frozenset(range(1, 8)) - predicted.containers[0].cpus
        text = env.scheduler.metrics.registry.get_sample_value(
            "hamid_numa_prediction_total", {"result": "unknown"}
        )
        assert text == 0.0
