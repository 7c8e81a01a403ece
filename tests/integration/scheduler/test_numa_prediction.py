"""/filter over real HTTP predicts kubelet's NUMA node from the node's profile and records it."""

from __future__ import annotations

import dataclasses
import time

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.devices import MODE_HAMI_CORE, DeviceInfo
from hamid.model.numa import NUMA_PREDICTED, NUMA_PROFILE, NumaProfile, decode_prediction, encode_profile
from tests.integration.scheduler.harness import Env, running_scheduler, wait_for
from tests.unit.fit.test_numa_predict import profile_of
from tests.unit.scheduler.test_numa_ledger import GPU, PROFILE, _node, _pod


async def _profiled_node(env: Env) -> NumaProfile:
    """Node ``n1`` with :data:`PROFILE`, confirmed now; returns the profile once the ledger has it."""
    node = _node()
    profile = dataclasses.replace(PROFILE, observed_at=int(time.time()))
    node["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
    env.server.put({"apiVersion": "v1", "kind": "Node", **node})
    await wait_for(lambda: env.scheduler.numa.free_cpus("n1") is not None)
    return profile


async def test_filter_patch_carries_the_prediction_and_the_ledger_books_it() -> None:
    async with running_scheduler() as env:
        profile = await _profiled_node(env)
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


async def test_where_hamids_plugin_picks_the_replicas_the_fitted_gpus_decide() -> None:
    """Policy ``none``: kubelet gives no NUMA hint and lets the device plugin choose among the
    replicas of both NUMA nodes, so the prediction alone is unknown. On a node whose profile says
    hamid's plugin offers ``GetPreferredAllocation`` for the GPUs, the plugin prefers the annotated
    GPU's replica: the filter predicts again with the fitted GPU and records a definite placement on
    that GPU's NUMA node; without it, nothing is recorded and the unknown is counted."""
    async with running_scheduler() as env:
        policies = dataclasses.replace(PROFILE.policies, topology_manager_policy="none")
        base = dataclasses.replace(PROFILE, observed_at=int(time.time()), policies=policies)
        for name, preferred in (("n1", GPU), ("n2", None)):
            node = _node(name)
            profile = dataclasses.replace(base, preferred_allocation=preferred)
            node["metadata"]["annotations"][NUMA_PROFILE] = encode_profile(profile)
            env.server.put({"apiVersion": "v1", "kind": "Node", **node})
            await wait_for(lambda name=name: env.scheduler.numa.free_cpus(name) is not None)
        for pod, node_name in (("a", "n1"), ("b", "n2")):
            p = await env.create_pod(_pod(pod))
            assert (await env.filter(p, [node_name]))["NodeNames"] == [node_name]
        annos = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        gpu = annos[ann.DEVICES_ALLOCATED].split(",")[0]
        predicted = decode_prediction(annos[NUMA_PREDICTED])
        numa = 0 if gpu == "n1-g0" else 1
        assert predicted.containers[0].devices == {GPU: {numa: 1}}
        assert NUMA_PREDICTED not in env.server.get("Pod", "default", "b")["metadata"]["annotations"]
        unknown = env.scheduler.metrics.registry.get_sample_value(
            "hamid_numa_prediction_total", {"result": "unknown"}
        )
        assert unknown == 1.0


async def test_an_unknown_fits_the_gpus_where_kubelet_lets_hamids_plugin_choose() -> None:
    """best-effort, 3 NUMA nodes, one single-slot GPU on NUMA 2 (registered first) and two on each
    of NUMA 0 and 1; the pod asks 6 CPUs and 3 GPUs. kubelet's hint is NUMA {0,1} and it lets the
    plugin choose 3 of its 4 aligned GPUs: unknown, naming NUMA {0,1}. The filter fits the GPUs
    there (the plain fit would take NUMA 2's GPU, which kubelet does not offer), so hamid's plugin
    prefers them and the prediction with them chosen is definite and recorded."""
    async with running_scheduler() as env:
        policies = dataclasses.replace(PROFILE.policies, topology_manager_policy="best-effort")
        profile = dataclasses.replace(
            profile_of([(c, c, 0, c // 4) for c in range(12)], reserved=(0,)),
            observed_at=int(time.time()),
            policies=policies,
            preferred_allocation=GPU,
        )
        numas = (2, 0, 0, 1, 1)
        gpus = [
            DeviceInfo(f"g{i}", i, 1, 8000, 100, "NVIDIA-A100", n, MODE_HAMI_CORE, True)
            for i, n in enumerate(numas)
        ]
        node = {
            "metadata": {
                "name": "n1",
                "annotations": {
                    ann.NODE_REGISTER: ann.encode_node_devices(gpus),
                    NUMA_PROFILE: encode_profile(profile),
                },
            },
            "status": {"allocatable": {GPU: "5"}},
        }
        env.server.put({"apiVersion": "v1", "kind": "Node", **node})
        await wait_for(lambda: env.scheduler.numa.free_cpus("n1") is not None)
        p = await env.create_pod(_pod("a", cpus=6, gpus=3))
        assert (await env.filter(p, ["n1"]))["NodeNames"] == ["n1"]
        annos = env.server.get("Pod", "default", "a")["metadata"]["annotations"]
        assert "g0," not in annos[ann.DEVICES_ALLOCATED]
        predicted = decode_prediction(annos[NUMA_PREDICTED])
        assert predicted.containers[0].numa == frozenset({0, 1})
        assert sum(predicted.containers[0].devices[GPU].values()) == 3


async def test_a_node_that_would_reject_the_pod_even_idle_says_so() -> None:
    """Under ``single-numa-node``, on a node of 3 + 4 assignable CPUs: a GPU pod asking 5 exclusive
    CPUs is rejected however empty the node is (``NumaNeverAdmissible``); one asking 4 is placed on
    NUMA 1 and the next such pod is only refused for now (``NumaPredictedNotFit``): NUMA 1's CPUs
    are taken, and the idle node would admit it."""
    async with running_scheduler() as env:
        await _profiled_node(env)
        wide = await env.create_pod(_pod("wide", cpus=5))
        assert (await env.filter(wide, ["n1"]))["FailedNodes"] == {"n1": R.NUMA_NEVER_ADMISSIBLE}
        first = await env.create_pod(_pod("first", cpus=4))
        assert (await env.filter(first, ["n1"]))["NodeNames"] == ["n1"]
        second = await env.create_pod(_pod("second", cpus=4))
        assert (await env.filter(second, ["n1"]))["FailedNodes"] == {"n1": R.NUMA_PREDICTED_NOT_FIT}
