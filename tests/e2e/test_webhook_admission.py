"""The cluster with the scheduler's webhook registered in a MutatingWebhookConfiguration.

The embedded API server, not the harness, calls the webhook on pod create (over TLS, trusting the
caBundle): the refit flow runs as in the demo, and every object, the configuration included,
validates against the 1.35 schemas.
"""

from __future__ import annotations

import kubernetes_validate

from hamid.model import reasons as R
from hamidsim.cluster import WEBHOOK_CONFIGURATION, ClusterOptions, SimCluster
from hamidsim.demo import SEED_NAME, seed_pod
from tests.e2e.helpers import stage
from tests.unit.deploy.helm_render import KUBE_VERSION


async def test_api_server_calls_the_registered_webhook() -> None:
    async with SimCluster(ClusterOptions(numa_publish=False, admission_webhook=True)) as cluster:
        await stage(cluster)
        await cluster.create_pod(seed_pod())
        pod = await cluster.wait_settled(SEED_NAME, timeout=15)
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["schedulerName"] == cluster.options.scheduler_name
        assert ("vgpu.hami.io", "patched") in cluster.server.admission.calls
        assert R.EVENT_NUMA_REFIT_SUCCEED in {e.get("reason") for e in cluster.events(SEED_NAME)}
        configuration = cluster.server.get("MutatingWebhookConfiguration", None, WEBHOOK_CONFIGURATION)
        objects = [
            obj for kind in ("Pod", "Node", "Event", "Namespace") for obj in cluster.server.list(kind, None)
        ]
    assert configuration is not None
    for obj in [configuration, *objects]:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
