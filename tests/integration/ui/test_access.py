"""Who may read ``/ui``: the Host guard (DNS rebinding) and ``--metrics-auth``'s cached decisions."""

from __future__ import annotations

import asyncio

from hamid.kube.client import KubeClient
from hamid.scheduler.ui.access import CACHE_TTL_S, CHECK_BURST, KubeAccess
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
        for host in ("localhost", "127.0.0.1", "[::1]"):
            assert (await ui.get("/ui", headers={"Host": f"{host}:{port}"}))[0] == 200, host
        # this connection is loopback, as a port-forward's: a Service's name there is a neighbour's
        # multicast-DNS answer, not the Service (in-cluster clients come from a pod address)
        for host in ("hamid-scheduler", "hamid-scheduler.kube-system.svc"):
            assert (await ui.get("/ui", headers={"Host": f"{host}:{port}"}))[0] == 421, host
        assert (await ui.get("/metrics", headers={"Host": "rebound.attacker.example"}))[0] == 200  # not /ui


async def test_names_given_with_ui_hosts_are_answered() -> None:
    """A custom cluster domain and an Ingress's name, given to ``--ui-hosts``, reach the view."""
    async with running_ui(ui_hosts=("*.svc.example.internal", "hamid.example.com")) as ui:
        for host in ("hamid-scheduler.kube-system.svc.example.internal", "hamid.example.com"):
            assert (await ui.get("/ui", headers={"Host": host}))[0] == 200, host
        assert (await ui.get("/ui", headers={"Host": "example.com"}))[0] == 421


async def test_forged_tokens_do_not_flush_a_readers_cached_decision(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    """Refusals are cached apart from grants: more forged tokens than the caches hold (from
    clients within their budgets) leave a reader's grant in place (her page's polling costs the
    API server nothing)."""
    apiserver.register_token("alice-token", "alice", groups=("ops",))
    apiserver.access.grant(groups=["ops"], paths=["/ui"])
    access = KubeAccess(kube, cache_max=64)
    assert (await access.decide("alice-token", "/ui", "10.0.0.1")).status == 200
    for i in range(100):  # past the 64 each cache holds, from 100 addresses
        assert (await access.decide(f"forged-{i}", "/ui", f"10.1.0.{i}")).status == 401
    before = dict(apiserver.requests)
    assert (await access.decide("alice-token", "/ui", "10.0.0.1")).status == 200
    assert apiserver.requests == before


async def test_a_flood_of_forged_tokens_costs_the_api_server_a_bounded_rate() -> None:
    """One TokenReview per never-seen token made the metrics port an amplifier onto the API
    server the scheduler shares: past the client's budget the answer is 429 with Retry-After,
    and a reader's cached grant is still served meanwhile."""
    async with running_ui(metrics_auth=True) as ui:
        ui.server.register_token("alice-token", "alice", groups=("ops",))
        ui.server.access.grant(groups=["ops"], paths=["/metrics", "/ui", "/ui/*"])
        alice = {"headers": {"Authorization": "Bearer alice-token"}}
        assert (await ui.get("/ui", **alice))[0] == 200
        before = ui.server.requests["create tokenreviews"]
        statuses: list[int] = []
        for i in range(300):
            status, page, headers = await ui.get("/ui", headers={"Authorization": f"Bearer forged-{i}"})
            statuses.append(status)
            if status == 429:
                assert int(headers["Retry-After"]) >= 1
                assert "too many token checks" in page
                assert headers["Content-Security-Policy"] == CSP
        reviews = ui.server.requests["create tokenreviews"] - before
        assert statuses[: CHECK_BURST - 1] == [401] * (CHECK_BURST - 1)  # alice's check was one
        assert statuses.count(429) >= 250, statuses.count(429)
        assert reviews == statuses.count(401) <= CHECK_BURST + 10, reviews
        assert (await ui.get("/ui", **alice))[0] == 200


async def test_one_review_per_token_and_one_check_for_requests_waiting_together(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    """A reader's new pages cost one SubjectAccessReview each, not a TokenReview each; requests
    arriving together for one token and path share one check."""
    apiserver.register_token("alice-token", "alice", groups=("ops",))
    apiserver.access.grant(groups=["ops"], paths=["/ui", "/ui/*"])
    access = KubeAccess(kube)
    paths = [f"/ui/node/node-{i}" for i in range(12)]
    assert all(
        d.status == 200 for d in await asyncio.gather(*(access.decide("alice-token", p, "a") for p in paths))
    )
    assert apiserver.requests["create tokenreviews"] == 1
    assert apiserver.requests["create subjectaccessreviews"] == len(paths)
    together = await asyncio.gather(*(access.decide("alice-token", "/ui", "b") for _ in range(50)))
    assert {d.status for d in together} == {200}
    assert apiserver.requests["create tokenreviews"] == 1
    assert apiserver.requests["create subjectaccessreviews"] == len(paths) + 1


async def test_checks_in_flight_are_bounded_for_every_client_together(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    """Many addresses, each within its budget, still cannot hold more checks open on a slow API
    server than the bound; a first caller that gives up does not cancel the check for the others."""
    apiserver.register_token("alice-token", "alice", groups=("ops",))
    apiserver.access.grant(groups=["ops"], paths=["/ui"])
    slow = apiserver.faults.add_latency(0.3, verb="create", path_pattern="tokenreviews")
    access = KubeAccess(kube, checks_in_flight=4)
    first = asyncio.create_task(access.decide("alice-token", "/ui", "10.0.0.1"))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(access.decide("alice-token", "/ui", "10.0.0.2"))
    others = [asyncio.create_task(access.decide(f"forged-{i}", "/ui", f"10.1.0.{i}")) for i in range(8)]
    await asyncio.sleep(0.05)
    first.cancel()
    decided = await asyncio.gather(*others)
    assert sorted(d.status for d in decided) == [401] * 3 + [429] * 5
    assert (await waiting).status == 200
    apiserver.faults.remove(slow.id)
    assert apiserver.requests["create tokenreviews"] == 4


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


class _Clock:
    """A monotonic clock the test moves (the caches' expiry only)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_readers_renewal_passes_a_flood_that_fills_the_checks_in_flight(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    """Forged tokens from a few addresses, each within its budget, fill every check in flight on
    a slow authenticator; Prometheus's token, whose grant just expired, was allowed lately and is
    checked anyway instead of answered 429 (this session's review: scrapes were refused)."""
    apiserver.register_token("prom-token", "prometheus", groups=("monitoring",))
    apiserver.access.grant(groups=["monitoring"], paths=["/metrics"])
    clock = _Clock()
    access = KubeAccess(kube, clock=clock, checks_in_flight=4)
    assert (await access.decide("prom-token", "/metrics", "10.0.0.9")).status == 200
    slow = apiserver.faults.add_latency(0.5, verb="create", path_pattern="tokenreviews")
    flood = [asyncio.create_task(access.decide(f"forged-{a}", "/metrics", f"10.1.0.{a}")) for a in range(4)]
    await asyncio.sleep(0.05)
    assert (await access.decide("forged-late", "/metrics", "10.1.0.9")).status == 429  # the cap holds
    clock.now += CACHE_TTL_S + 1  # the scrape's grant and review expired
    assert (await access.decide("prom-token", "/metrics", "10.0.0.9")).status == 200
    assert {d.status for d in await asyncio.gather(*flood)} == {401}
    apiserver.faults.remove(slow.id)


async def test_a_decision_lasts_no_longer_than_the_review_it_rests_on(
    apiserver: ApiServer, kube: KubeClient
) -> None:
    """A page first read 29 s after the token's review is decided from that review: its grant
    ends with the review, so a token revoked meanwhile reads nothing 31 s after its review (it
    read on for up to 60 s)."""
    apiserver.register_token("alice-token", "alice", groups=("ops",))
    apiserver.access.grant(groups=["ops"], paths=["/ui", "/ui/*"])
    clock = _Clock()
    access = KubeAccess(kube, clock=clock)
    assert (await access.decide("alice-token", "/ui", "a")).status == 200
    apiserver.revoke_token("alice-token")
    clock.now += CACHE_TTL_S - 1
    assert (await access.decide("alice-token", "/ui/node/n1", "a")).status == 200  # the cached review
    clock.now += 2
    assert (await access.decide("alice-token", "/ui/node/n1", "a")).status == 401


async def test_a_token_rbac_refuses_does_not_pass_the_cap(apiserver: ApiServer, kube: KubeClient) -> None:
    """Only a token allowed a path lately passes the cap of checks in flight: any pod's
    ServiceAccount token authenticates, and from many addresses on ever-new paths it held
    unbounded SubjectAccessReviews open (this session's second review)."""
    apiserver.register_token("any-pod-sa", "system:serviceaccount:team:default")
    access = KubeAccess(kube, checks_in_flight=4)
    assert (await access.decide("any-pod-sa", "/ui", "10.2.0.1")).status == 403
    slow = apiserver.faults.add_latency(0.3, verb="create", path_pattern="subjectaccessreviews")
    flood = [asyncio.create_task(access.decide("any-pod-sa", f"/ui/p{i}", f"10.2.1.{i}")) for i in range(12)]
    answers = await asyncio.gather(*flood)
    apiserver.faults.remove(slow.id)
    assert sorted(d.status for d in answers) == [403] * 4 + [429] * 8
