"""Every object hamid writes or emits validates against the official Kubernetes 1.35 schemas.

After a refit that succeeds and one that is refused under ``strict`` (Warning events, a failed pod),
every Pod, Node, Event, Lease and Namespace in the embedded API server — the targets of hamid's
patches (annotations, labels, node lock, bind phase), the Events it records, the Binding's effect and
the simulated kubelet's status writes — is checked with ``kubernetes-validate`` in strict mode.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamidsim.cluster import ClusterOptions, SimCluster
from hamidsim.demo import SEED_NAME, data_machine_gpus, seed_pod
from tests.e2e.helpers import stage
from tests.unit.deploy.helm_render import KUBE_VERSION

KINDS = ("Pod", "Node", "Event", "Lease", "Namespace")
NUMA1 = [g.uuid for g in data_machine_gpus() if g.numa == 1]


@pytest.mark.parametrize("mode", ["best-effort", "strict"])
async def test_written_objects_validate(mode: str) -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await stage(cluster)
        # strict: pinned to a GPU on the NUMA node kubelet cannot use, so the refit is refused
        pin = {} if mode == "best-effort" else {ann.USE_GPU_UUID: NUMA1[0]}
        await cluster.create_pod(seed_pod(alignment=mode, annotations=pin))
        await cluster.wait_settled(SEED_NAME, timeout=15)
        reasons = {e.get("reason") for e in cluster.events(SEED_NAME)}
        expected = R.EVENT_NUMA_REFIT_SUCCEED if mode == "best-effort" else R.EVENT_NUMA_REFIT_FAILED
        assert expected in reasons
        objects = [obj for kind in KINDS for obj in cluster.server.list(kind, None)]
    assert {obj["kind"] for obj in objects} >= {"Pod", "Node", "Event"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
