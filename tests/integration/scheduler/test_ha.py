"""Three `hamid scheduler` replicas following a simulated kube-scheduler Lease (A→B→A).

Each replica is a full ``run_scheduler`` (real listeners, TLS, /refit with mTLS) against the
embedded API server; the test plays the kube-scheduler by writing the Lease holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from hamid.model import annotations as ann
from hamid.model import objects
from hamid.model.annotations import ROLE_FOLLOWER, ROLE_LEADER
from hamid.model.devices import NVIDIA
from hamid.model.refit import RefitRequest
from hamid.scheduler.app import refit_route_factory, run_scheduler
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.ha import caught_up
from hamid.scheduler.options import SchedulerOptions
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.kube.helpers import eventually
from tests.unit.scheduler.helpers import node, pod

NS = "kube-system"
LEASE = "hamid-kube-scheduler"
SELECTOR = {"app.kubernetes.io/name": "hamid", "app.kubernetes.io/component": "scheduler"}
NAMES = ("a", "b", "c")


@dataclass
class Replica:
    """One running scheduler replica."""

    name: str
    scheduler: Scheduler
    ports: dict[str, int]
    stop: asyncio.Event

    @property
    def extender(self) -> str:
        return f"http://127.0.0.1:{self.ports['extender']}"

    @property
    def cluster(self) -> str:
        return f"https://127.0.0.1:{self.ports['cluster']}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    @property
    def decides(self) -> bool:
        return not self.scheduler.not_ready_reason()


def hold_lease(server: ApiServer, holder: str, *, renewed_ago: float = 0.0, duration: int = 60) -> None:
    """Play kube-scheduler: ``holder`` (``<hostname>_<uuid>``) holds the Lease."""
    renew = (datetime.now(UTC) - timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    existing = server.get("Lease", NS, LEASE)
    transitions = int(((existing or {}).get("spec") or {}).get("leaseTransitions") or 0)
    if existing is not None and existing["spec"].get("holderIdentity") != holder:
        transitions += 1
    server.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "acquireTime": renew,
                "renewTime": renew,
                "leaseTransitions": transitions,
            },
        }
    )


def kube_scheduler_of(name: str) -> str:
    """A kube-scheduler holder identity in replica ``name``'s pod."""
    return f"host-{name}_{uuid.uuid4()}"


def role(server: ApiServer, name: str) -> str | None:
    stored = server.get("Pod", NS, f"sched-{name}") or {}
    return objects.labels(stored).get(ann.SCHEDULER_ROLE)


def roles(server: ApiServer) -> dict[str, str | None]:
    return {name: role(server, name) for name in NAMES}


@contextlib.asynccontextmanager
async def replicas(
    server: ApiServer, tls: TLSFiles, names: tuple[str, ...] = NAMES, mode: str = "follow"
) -> AsyncIterator[dict[str, Replica]]:
    """Start replicas (pods ``sched-<x>``, hostnames ``host-<x>``) in one TaskGroup."""
    for name in names:
        server.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"sched-{name}", "namespace": NS, "labels": dict(SELECTOR)},
                "spec": {"containers": [{"name": "hamid"}]},
                "status": {"phase": "Running"},
            }
        )
    started: dict[str, Replica] = {}
    async with asyncio.TaskGroup() as tg:
        for name in names:
            stop = asyncio.Event()
            options = SchedulerOptions(
                extender_listen="127.0.0.1:0",
                listen="127.0.0.1:0",
                metrics_listen="127.0.0.1:0",
                tls_cert_file=str(tls.server.cert_file),
                tls_key_file=str(tls.server.key_file),
                client_ca_file=str(tls.ca_file),
                refit_auth=("mtls",),
                api_server=server.url,
                settings=SchedulerSettings(handshake_interval_s=0.05),
                leader_elect=True,
                leader_elect_namespace=NS,
                leader_elect_name=LEASE,
                leader_elect_mode=mode,
                leader_elect_retry_period_s=0.05,
                leader_identity=f"host-{name}",
                pod_name=f"sched-{name}",
                pod_namespace=NS,
                scheduler_pod_selector=",".join(f"{k}={v}" for k, v in SELECTOR.items()),
            )

            def ready(scheduler: Scheduler, ports: dict[str, int], name: str = name, stop=stop) -> None:
                started[name] = Replica(name, scheduler, ports, stop)

            tg.create_task(run_scheduler(options, [refit_route_factory], stop=stop, ready=ready))
        try:
            await eventually(lambda: len(started) == len(names), what="replicas started")
            for r in started.values():
                await asyncio.wait_for(r.scheduler.pods.wait_synced(), 10)
            yield started
        finally:
            for r in started.values():
                r.stop.set()


def leaders(reps: dict[str, Replica]) -> list[str]:
    return [name for name, r in reps.items() if r.scheduler.leading]


@pytest.fixture
def client_ssl(tls_files: TLSFiles) -> ssl.SSLContext:
    """Trusts the test CA and presents ``system:node:n1`` (an mTLS /refit caller)."""
    ctx = ssl.create_default_context(cafile=str(tls_files.ca_file))
    pair = tls_files.client("system:node:n1")
    ctx.load_cert_chain(str(pair.cert_file), str(pair.key_file))
    return ctx


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with session.request(method, url, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, (await resp.json(content_type=None)) if text else text
        except ValueError:
            return resp.status, text


async def filter_error(session: aiohttp.ClientSession, r: Replica, p: dict[str, Any]) -> str:
    status, body = await call(session, "POST", r.extender + "/filter", {"Pod": p, "NodeNames": ["n1"]})
    assert status == 200, body
    return str(body.get("Error") or "")


async def bind_error(session: aiohttp.ClientSession, r: Replica, p: dict[str, Any]) -> str:
    meta = p["metadata"]
    args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": "n1"}
    status, body = await call(session, "POST", r.extender + "/bind", args)
    assert status == 200, body
    return str(body.get("Error") or "")


async def refit_reason(session: aiohttp.ClientSession, r: Replica, p: dict[str, Any]) -> str:
    meta = p["metadata"]
    req = RefitRequest(
        pod_uid=meta["uid"],
        pod_namespace=meta["namespace"],
        pod_name=meta["name"],
        node_name="n1",
        container_index=0,
        container_name="",
        device_type=NVIDIA,
        allowed_device_uuids=("n1-gpu0",),
    )
    status, body = await call(session, "POST", r.cluster + "/refit", req.to_json())
    assert status == 200, body
    assert body["succeeded"] is False, body
    return str(body["failureReason"])


def admission(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "review-1", "operation": "CREATE", "namespace": "default", "object": p},
    }


async def test_leadership_follows_the_kube_scheduler_lease(
    apiserver: ApiServer, tls_files: TLSFiles, client_ssl: ssl.SSLContext
) -> None:
    apiserver.put({"apiVersion": "v1", "kind": "Node", **node("n1", 2)})
    gpu_pod = apiserver.put({"apiVersion": "v1", "kind": "Pod", **pod("p1")})
    hold_lease(apiserver, kube_scheduler_of("a"))
    connector = aiohttp.TCPConnector(ssl=client_ssl)
    async with (
        replicas(apiserver, tls_files) as reps,
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as session,
    ):
        a, b, c = reps["a"], reps["b"], reps["c"]
        # A leads (once its term has synced); exactly one replica leads; roles are labelled.
        await eventually(lambda: a.decides, what="a decides")
        assert leaders(reps) == ["a"]
        await eventually(
            lambda: roles(apiserver) == {"a": ROLE_LEADER, "b": ROLE_FOLLOWER, "c": ROLE_FOLLOWER},
            what="roles a/b/c = leader/follower/follower",
        )

        # Followers refuse the decisions with the reason, and still answer webhook and probes.
        await eventually(lambda: b.scheduler.synced and c.scheduler.synced, what="followers synced")
        for f in (b, c):
            assert "not the leader" in await filter_error(session, f, gpu_pod)
            assert "not the leader" in await bind_error(session, f, gpu_pod)
            assert "not the leader" in await refit_reason(session, f, gpu_pod)
            status, text = await call(session, "GET", f.cluster + "/readyz")
            assert status == 503 and "not the leader" in text
            assert (await call(session, "GET", f.cluster + "/readyz/webhook"))[0] == 200
            assert (await call(session, "GET", f.cluster + "/healthz"))[0] == 200
            status, review = await call(session, "POST", f.cluster + "/webhook", admission(pod("w")))
            assert status == 200 and review["response"]["allowed"] is True
        assert (await call(session, "GET", a.cluster + "/readyz"))[0] == 200

        # Only the leader exports the cluster (per-GPU, per-node) metrics.
        _, leader_metrics = await call(session, "GET", a.metrics)
        _, follower_metrics = await call(session, "GET", b.metrics)
        assert 'hamid_gpu_memory_limit_bytes{device_index="0"' in leader_metrics
        assert "hamid_gpu_memory_limit_bytes" not in follower_metrics
        assert "hamid_filter_duration_seconds" in follower_metrics
        # HAMi's names (/metrics/hami) describe the cluster too: the leader's only
        _, leader_hami = await call(session, "GET", a.metrics + "/hami")
        _, follower_hami = await call(session, "GET", b.metrics + "/hami")
        assert "GPUDeviceMemoryLimit{" in leader_hami and 'zone="vGPU"' in leader_hami
        assert "GPUDeviceMemoryLimit" not in follower_hami

        # A → B: B leads in a new term; roles move; A refuses.
        hold_lease(apiserver, kube_scheduler_of("b"))
        await eventually(lambda: b.decides and not a.scheduler.leading, what="b decides, a follows")
        assert leaders(reps) == ["b"]
        await eventually(
            lambda: roles(apiserver) == {"a": ROLE_FOLLOWER, "b": ROLE_LEADER, "c": ROLE_FOLLOWER},
            what="roles follow b",
        )
        assert "not the leader" in await filter_error(session, a, gpu_pod)

        # B → A while the term sync cannot list quotas: A leads but refuses until re-synced.
        fault = apiserver.faults.fail_next(10_000, verb="list", path_pattern="resourcequotas")
        hold_lease(apiserver, kube_scheduler_of("a"))
        await eventually(lambda: a.scheduler.leading and not b.scheduler.leading, what="a leads again")
        assert leaders(reps) == ["a"]
        for check in (filter_error, bind_error, refit_reason):
            assert "cache of this term not synced yet" in await check(session, a, gpu_pod)
        status, text = await call(session, "GET", a.cluster + "/readyz")
        assert status == 503 and "cache of this term not synced yet" in text
        apiserver.faults.remove(fault.id)
        await eventually(lambda: a.decides, what="a's term synced")
        assert await filter_error(session, a, gpu_pod) == ""
        stored = apiserver.get("Pod", "default", "p1") or {}
        assert stored["metadata"]["annotations"][ann.VGPU_NODE] == "n1"
        await eventually(lambda: roles(apiserver)["a"] == ROLE_LEADER, what="a labelled leader")

        # An expired lease leaves no leader (the kube-scheduler stopped renewing).
        hold_lease(apiserver, kube_scheduler_of("a"), renewed_ago=120, duration=15)
        await eventually(lambda: leaders(reps) == [], what="no leader on an expired lease")
        assert "not the leader" in await filter_error(session, a, pod("p2"))


async def test_a_new_term_waits_until_the_watch_has_caught_up(
    apiserver: ApiServer, tls_files: TLSFiles, client_ssl: ssl.SSLContext
) -> None:
    """HAMi #2911: a replica that regains leadership must not decide from what its cache saw before."""
    apiserver.put({"apiVersion": "v1", "kind": "Node", **node("n1", 2)})
    gpu_pod = apiserver.put({"apiVersion": "v1", "kind": "Pod", **pod("p1")})
    hold_lease(apiserver, kube_scheduler_of("z"))  # another replica's kube-scheduler leads
    connector = aiohttp.TCPConnector(ssl=client_ssl)
    async with (
        replicas(apiserver, tls_files, names=("a",)) as reps,
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as session,
    ):
        a = reps["a"]
        await eventually(lambda: a.scheduler.synced, what="a synced")
        assert not a.scheduler.leading
        # a's pod watch breaks and cannot resume; meanwhile the other leader places a pod on n1.
        broken = apiserver.faults.fail_next(1_000_000, verb="watch", path_pattern="/pods")
        apiserver.close_watches("Pod")
        apiserver.put({"apiVersion": "v1", "kind": "Pod", **pod("other")})
        hold_lease(apiserver, kube_scheduler_of("a"))
        await eventually(lambda: a.scheduler.leading, what="a leads")
        assert a.scheduler.pods.get("default/other") is None
        assert "cache of this term not synced yet" in await filter_error(session, a, gpu_pod)
        apiserver.faults.remove(broken.id)
        await eventually(lambda: a.decides, what="a's term synced", within=40)
        assert a.scheduler.pods.get("default/other") is not None


async def test_campaign_mode_without_a_kube_scheduler(apiserver: ApiServer, tls_files: TLSFiles) -> None:
    async with replicas(apiserver, tls_files, names=("a", "b"), mode="campaign") as reps:
        await eventually(lambda: any(r.decides for r in reps.values()), what="one replica decides")
        (leader,) = leaders(reps)
        lease = apiserver.get("Lease", NS, LEASE) or {}
        assert lease["spec"]["holderIdentity"].startswith(f"host-{leader}_")
        await eventually(
            lambda: (
                role(apiserver, leader) == ROLE_LEADER
                and {role(apiserver, n) for n in reps if n != leader} == {ROLE_FOLLOWER}
            ),
            what="roles labelled",
        )


@pytest.mark.parametrize(
    ("cache_rv", "cached", "list_rv", "listed", "expected"),
    [
        ("12", {"a": "3"}, "10", {"a": "9"}, True),  # applied events past the list
        ("8", {"a": "3"}, "10", {"a": "3"}, True),  # idle resource: same objects, same versions
        ("8", {"a": "3"}, "10", {"a": "9"}, False),  # an update not seen yet
        ("8", {"a": "3", "b": "5"}, "10", {"a": "3"}, False),  # a deletion not seen yet
        ("x", {"a": "3"}, "y", {"a": "3"}, True),  # opaque versions: compare contents only
        ("x", {"a": "3"}, "y", {}, False),
        ("x", {"a": "3"}, "x", {}, True),  # equal versions are the same version, whatever they hold
    ],
)
def test_caught_up(
    cache_rv: str, cached: dict[str, str], list_rv: str, listed: dict[str, str], expected: bool
) -> None:
    assert caught_up(cache_rv, cached, list_rv, listed) is expected
