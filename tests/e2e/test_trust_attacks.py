"""Issue 22's attacks, end to end through the embedded API server (docs/trust.md).

Attack 1: a tenant patches its running pod's ``hami.io/vgpu-devices-allocated`` (a 1 MiB entry on
another GPU, or ``:::``) so that the scheduler frees the GPU the container still runs on. Attack 2:
a tenant patches a parked pod of this scheduler with ``hami.io/vgpu-node`` and an unreadable
allocation, so that the node's GPUs are booked full. Past admission, a restarted scheduler books
what it recorded in the pod's status (``hamid.io/AllocationBooked``), not the tampered annotation.
The tenant here is the anonymous client (``system:anonymous``); the scheduler and the plugin talk
as their own ServiceAccounts.
"""

from __future__ import annotations

from typing import Any

import pytest

from hamid.kube.errors import KubeError
from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.booked import booked_record
from hamidsim.cluster import WEBHOOK_CONFIGURATION, ClusterOptions, SimCluster
from hamidsim.cluster_view import wait_until
from hamidsim.demo import seed_pod
from tests.e2e.helpers import uuids

NODE = "node-1"
MIB = 60000  # two of these over-commit one 97,887 MiB card


def _pinned(name: str, gpu: str) -> dict[str, Any]:
    return seed_pod(name, alignment="", gpumem=MIB, annotations={ann.USE_GPU_UUID: gpu})


async def _tenant_patch(cluster: SimCluster, name: str, notes: dict[str, str]) -> None:
    await cluster.kube.patch_pod_metadata("default", name, annotations=notes)


async def _bypassed(cluster: SimCluster, name: str, notes: dict[str, str]) -> None:
    """The tenant's patch while the webhook is not registered (deleted, then put back)."""
    cluster.server.delete("MutatingWebhookConfiguration", None, WEBHOOK_CONFIGURATION)
    try:
        await _tenant_patch(cluster, name, notes)
    finally:
        cluster.server.put(cluster.webhook_configuration())


def _untrusted(cluster: SimCluster, where: str) -> float:
    counter = cluster.scheduler.metrics.untrusted_annotations.labels(where)
    return float(counter._value.get())


async def _events(cluster: SimCluster, name: str, reason: str) -> list[dict[str, Any]]:
    await wait_until(lambda: bool(cluster.events(name, reason=reason)), 10, f"{reason} Event on {name}")
    return cluster.events(name, reason=reason)


async def _stays_pending(cluster: SimCluster, name: str) -> None:
    """The pod was tried (a scheduling failure) and is neither placed nor booked."""
    await wait_until(lambda: bool(cluster.scheduling_failures(name)), 15, f"a failed attempt for {name}")
    pod = cluster.pod(name)
    assert not pod["spec"].get("nodeName") and cluster.reservation(name) is None


@pytest.mark.parametrize("shape", ["another-gpu", ":::"])
async def test_attack_1_is_denied_and_bypassing_admission_moves_no_booking(shape: str) -> None:
    options = ClusterOptions(numa_publish=False, refit=False, admission_webhook=True)
    async with SimCluster(options) as cluster:
        await cluster.create_pod(seed_pod("victim", alignment="", gpumem=MIB))
        await cluster.wait_settled("victim", timeout=15)
        [gpu] = uuids(cluster.allocated("victim"))
        other = next(g for g in cluster.gpu_numa(NODE) if g != gpu)
        forged = f"{other},NVIDIA,1,0:;" if shape == "another-gpu" else ":::"
        booked = cluster.booked_usage()
        assert booked[NODE][gpu][1] == MIB
        allocated = cluster.annotations("victim")[ann.DEVICES_ALLOCATED]

        # the webhook denies the tenant's patch: nothing changes
        with pytest.raises(KubeError) as denied:
            await _tenant_patch(cluster, "victim", {ann.DEVICES_ALLOCATED: forged})
        assert denied.value.status == 403
        assert "annotation hami.io/vgpu-devices-allocated may be changed only by hamid's scheduler" in str(
            denied.value
        )
        assert "system:anonymous" in str(denied.value)
        assert ("vgpu.hami.io", "denied") in cluster.server.admission.calls
        assert _untrusted(cluster, "webhook_denied") >= 1
        assert cluster.annotations("victim")[ann.DEVICES_ALLOCATED] != forged
        # the tenant's own annotations are its business
        await _tenant_patch(cluster, "victim", {"team.io/owner": "alice"})

        # with the webhook bypassed (down a while) the patch lands, but the booking stays, reported
        await _bypassed(cluster, "victim", {ann.DEVICES_ALLOCATED: forged})
        [event] = await _events(cluster, "victim", R.EVENT_ALLOCATION_IGNORED)
        assert f"{NODE}: {gpu}" in event["message"] and event["type"] == "Warning"
        assert _untrusted(cluster, "disagreement") == 1
        assert cluster.booked_usage() == booked

        # a second pod asking for the same GPU is not placed on the over-committed card
        await cluster.create_pod(_pinned("second", gpu))
        await _stays_pending(cluster, "second")
        assert cluster.booked_usage() == booked

        # the bind recorded the booking in the pod's status (pods/status: tenants get no write
        # there), and kubelet's status writes kept it; a restart books that record, not the
        # tampered annotation, so the card is still not given away
        record = booked_record(cluster.pod("victim"))
        assert record is not None and (record.node, record.allocated) == (NODE, allocated)
        tried = len(cluster.scheduling_failures("second"))
        await cluster.restart_scheduler()

        def victim_booked() -> bool:
            res = cluster.reservation("victim")
            return res is not None and (res.node, res.raw) == (NODE, allocated)

        await wait_until(victim_booked, 10, "the recorded allocation rebooked")
        more = lambda: len(cluster.scheduling_failures("second")) > tried  # noqa: E731
        await wait_until(more, 30, "the second pod tried again after the restart")
        assert not cluster.pod("second")["spec"].get("nodeName") and cluster.reservation("second") is None
        assert cluster.booked_usage() == booked


async def test_attack_2_an_unreadable_allocation_books_nothing_and_restarts_trust_signatures() -> None:
    options = ClusterOptions(numa_publish=False, refit=False, admission_webhook=True)
    async with SimCluster(options) as cluster:
        gpus = list(cluster.gpu_numa(NODE))
        await cluster.create_pod(_pinned("parked", "GPU-not-on-any-node"))
        await _stays_pending(cluster, "parked")
        forged = {ann.VGPU_NODE: NODE, ann.DEVICES_ALLOCATED: ":::"}
        with pytest.raises(KubeError) as denied:
            await _tenant_patch(cluster, "parked", forged)
        assert denied.value.status == 403

        await _bypassed(cluster, "parked", forged)
        await _events(cluster, "parked", R.EVENT_ALLOCATION_FOREIGN)  # unsigned: not this scheduler's
        assert cluster.booked_usage() == {}
        # pods pinned to that node's GPUs are placed as if nothing happened
        await cluster.create_pod(_pinned("pinned", gpus[0]))
        await cluster.wait_settled("pinned", timeout=15)
        booked = cluster.booked_usage()
        assert booked == {NODE: {gpus[0]: (1, MIB, 0)}}
        signature = cluster.annotations("pinned")[ann.ALLOCATION_SIGNATURE]
        assert signature.startswith("v1:") and cluster.annotations("pinned")[ann.DEVICES_ALLOCATED] == (
            f"{gpus[0]},NVIDIA,{MIB},0:;"
        )

        # a restart rebuilds the booking from the signed allocation, and only from it
        await cluster.restart_scheduler()
        await wait_until(lambda: cluster.booked_usage() == booked, 10, "the signed allocation rebooked")
        await _events(cluster, "parked", R.EVENT_ALLOCATION_FOREIGN)
        await cluster.create_pod(_pinned("over", gpus[0]))
        await _stays_pending(cluster, "over")
