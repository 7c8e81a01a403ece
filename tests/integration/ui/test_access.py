"""Who may read ``/ui``: the Host guard (DNS rebinding) and ``--metrics-auth``'s cached decisions."""

from __future__ import annotations

import asyncio

from hamid.kube.client import KubeClient
from hamid.scheduler.ui.access import KubeAccess
from hamid.scheduler.ui.routes import CSP
from hamidsim.apiserver import ApiServer
from tests.integration.ui.test_http import running_ui


async def test_a_foreign_host_name_is_refused_and_the_documented_ones_answered() -> None:
    """A page that rebinds its own name to 127.0.0.1 reads nothing through ``kubectl port-forward``:
    the browser sends that name as Host."""
    async with running_ui() as ui:
        port = ui.app.ports["metrics"]
        for path in ("/ui", "/ui/node/node-a", "/ui/api/stamp/cluster", "/ui/static/ui.js"):
            status, page, headers = await ui.get(path, headers={"Host": f"rebound.attacker.example:{port}"})
            assert status == 421, (path, status)
            assert "answers only its own host names" in page
            assert headers["Content-Security-Policy"] == CSP
        for host in ("localhost", "127.0.0.1", "[::1]", "hamid-scheduler.kube-system.svc"):
            assert (await ui.get("/ui", headers={"Host": f"{host}:{port}"}))[0] == 200, host
        assert (await ui.get("/metrics", headers={"Host": "rebound.attacker.example"}))[0] == 200  # not /ui


async def test_names_given_with_ui_hosts_are_answered() -> None:
    """A custom cluster domain and an Ingress's name, given to ``--ui-hosts``, reach the view."""
    async with running_ui(ui_hosts=("*.svc.example.internal", "hamid.example.com")) as ui:
        for host in ("hamid-scheduler.kube-system.svc.example.internal", "hamid.example.com"):
            assert (await ui.get("/ui", headers={"Host": host}))[0] == 200, host
        assert (await ui.get("/ui", headers={"Host": "example.com"}))[0] == 421


async def test_forged_tokens_do_not_flush_a_readers_cached_decision() -> None:
    """Refusals are cached apart from grants: more forged tokens than the cache holds leave a
    reader's grant in place (her page's polling costs the API server nothing)."""
    async with running_ui(metrics_auth=True) as ui:
        ui.server.register_token("alice-token", "alice", groups=("ops",))
        ui.server.access.grant(groups=["ops"], paths=["/metrics", "/ui", "/ui/*"])
        alice = {"headers": {"Authorization": "Bearer alice-token"}}
        assert (await ui.get("/ui/api/stamp/cluster", **alice))[0] == 200
        gate = asyncio.Semaphore(32)

        async def forged(i: int) -> None:
            async with gate:
                status, _, _ = await ui.get("/ui", headers={"Authorization": f"Bearer forged-{i}"})
                assert status == 401

        await asyncio.gather(*(forged(i) for i in range(4200)))  # past the 4,096 a cache holds
        before = ui.server.requests["create tokenreviews"]
        assert (await ui.get("/ui/api/stamp/cluster", **alice))[0] == 200
        assert ui.server.requests["create tokenreviews"] == before


async def test_a_full_cache_lets_its_least_recently_used_decision_go(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    for user in ("alice", "bob", "carol"):
        apiserver.register_token(f"{user}-token", user, groups=("ops",))
    apiserver.access.grant(groups=["ops"], paths=["/ui"])
    access = KubeAccess(kube, cache_max=2)

    async def reviews(user: str) -> int:
        before = apiserver.requests["create tokenreviews"]
        assert (await access.decide(f"{user}-token", "/ui")).status == 200
        return apiserver.requests["create tokenreviews"] - before

    assert [await reviews(u) for u in ("alice", "bob", "alice", "carol")] == [1, 1, 0, 1]
    assert await reviews("alice") == 0  # used last but one: kept
    assert await reviews("bob") == 1  # the least recently used: gone, not the whole cache


async def test_metrics_auth_refusals_carry_the_views_headers() -> None:
    async with running_ui(metrics_auth=True) as ui:
        ui.server.register_token("bob-token", "bob")
        for token, status in ((None, 401), ("forged", 401), ("bob-token", 403)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            got, _, answer = await ui.get("/ui", headers=headers)
            assert got == status
            assert answer["Content-Security-Policy"] == CSP
            assert answer["Cache-Control"] == "no-store"
            assert answer["X-Content-Type-Options"] == "nosniff"
            assert answer["X-Frame-Options"] == "DENY"
