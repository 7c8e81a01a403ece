"""Caller authentication of ``/refit`` (mTLS and bound ServiceAccount tokens), HTTP codes, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hamid.listen import serve
from hamid.model import annotations as ann
from hamid.plugin.refit_client import RefitClient, RefitClientConfig, RefitError
from hamid.scheduler.http import cluster_app
from hamid.scheduler.refit import MSG_NO_BODY, refit_routes
from hamid.scheduler.refit.auth import DEFAULT_TOKEN_AUDIENCE, RefitAuthenticator, ServiceAccount
from hamidsim.certs import CertificateAuthority
from tests.fixtures.tls import TLSFiles
from tests.integration.refit.harness import PLUGIN_NS, PLUGIN_SA, Env, d, gpu, refit_env, request

AL = ann.DEVICES_ALLOCATED


async def setup(env: Env) -> dict:
    env.add_node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
    env.add_node("n2", [gpu("GPU-c", 0)])
    return await env.place("p", "n1", ((d("GPU-a", 20000),),))


async def reason_of(client: RefitClient, req: object) -> str:
    with pytest.raises(RefitError) as info:
        await client.refit(req)  # type: ignore[arg-type]
    return str(info.value)


async def test_token_authentication(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        before = env.annotations("p")
        wrong_sa = await reason_of(env.token_client(env.token_for("n1", service_account="default")), req)
        assert (
            "caller authentication failed: caller 'system:serviceaccount:kube-system:default' is not"
            in wrong_sa
        )
        wrong_node = await reason_of(env.token_client(env.token_for("n2")), req)
        assert wrong_node.endswith(
            f"caller pod {PLUGIN_NS}/hami-device-plugin-n2 runs on node 'n2', not 'n1'"
        )
        garbage = tmp_path / "garbage"
        garbage.write_text("not-a-token")
        assert "caller authentication failed: token is not authenticated" in await reason_of(
            env.token_client(garbage), req
        )
        missing = await reason_of(env.token_client(tmp_path / "absent"), req)
        assert missing.startswith("cannot read service account token for refit authentication")
        anonymous = RefitClient(
            RefitClientConfig(env.cluster, ca_file=str(tls_files.ca_file), token_file=None)
        )
        assert (await reason_of(anonymous, req)).endswith(
            "caller authentication failed: no caller credentials presented"
        )
        unbound = tmp_path / "unbound"
        unbound.write_text("unbound-token")
        env.server.register_token("unbound-token", f"system:serviceaccount:{PLUGIN_NS}:{PLUGIN_SA}")
        assert (await reason_of(env.token_client(unbound), req)).endswith(
            "token is not a bound pod service account token"
        )
        good = env.token_for("n1")
        env.server.delete("Pod", PLUGIN_NS, "hami-device-plugin-n1")
        assert "cannot look up caller pod kube-system/hami-device-plugin-n1" in await reason_of(
            env.token_client(good), req
        )
        assert env.annotations("p") == before
        assert (await env.token_client(env.token_for("n1")).refit(req))[0].uuid == "GPU-b"


async def test_token_must_be_issued_for_the_refit_audience(tls_files: TLSFiles, tmp_path: Path) -> None:
    """The pod's API-audience token (replayable against the API server) is not accepted."""
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        api_token = env.token_for("n1", audiences=["https://kubernetes.default.svc"])
        reason = await reason_of(env.token_client(api_token), req)
        assert "caller authentication failed: token is not authenticated" in reason
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"
        refit_token = env.token_for("n1", audiences=[DEFAULT_TOKEN_AUDIENCE])
        assert (await env.token_client(refit_token).refit(req))[0].uuid == "GPU-b"


API_AUDIENCE = ["https://kubernetes.default.svc"]
UPSTREAM_SA = "hami-upstream-device-plugin"


async def test_audience_refusal_says_so_and_how_to_accept_hami_plugins(
    tls_files: TLSFiles, tmp_path: Path, logs: list[dict]
) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        api_token = env.token_for("n1", service_account=UPSTREAM_SA, audiences=API_AUDIENCE)
        reason = await reason_of(env.token_client(api_token), request(pod, "n1", 0, ["GPU-b"]))
        assert "caller authentication failed: token is not authenticated: token audiences" in reason
        assert "['hamid-refit']" in reason  # the audience it was checked for
        assert reason.endswith(
            "(an upstream HAMi plugin sends its pod's default token; accept those with "
            "--refit-hami-plugin-service-account <namespace>/<serviceaccount>)"
        )
        assert any(e.get("auth_failure") == "audience" for e in logs)


async def test_mixed_fleet_accepts_hami_plugins_default_tokens(
    tls_files: TLSFiles, tmp_path: Path, logs: list[dict]
) -> None:
    """One value (``--refit-hami-plugin-service-account``) admits upstream plugins, only them."""
    hami = ServiceAccount.parse(f"{PLUGIN_NS}/{UPSTREAM_SA}")
    async with refit_env(tls_files, tmp_path, hami_plugins=hami) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        # hamid's own plugins must keep their refit-audience token: an API token of theirs is refused
        own_api_token = env.token_for("n1", audiences=API_AUDIENCE)
        reason = await reason_of(env.token_client(own_api_token), req)
        assert reason.endswith(
            f"caller 'system:serviceaccount:{PLUGIN_NS}:{PLUGIN_SA}' is not the device-plugin service "
            f"account 'system:serviceaccount:{PLUGIN_NS}:{UPSTREAM_SA}'"
        )
        assert any(e.get("auth_failure") == "user" for e in logs)
        # an upstream plugin on another node is refused for the node
        on_n2 = env.token_for("n2", service_account=UPSTREAM_SA, audiences=API_AUDIENCE)
        assert (await reason_of(env.token_client(on_n2), req)).endswith(
            f"caller pod {PLUGIN_NS}/hami-device-plugin-n2 runs on node 'n2', not 'n1'"
        )
        assert any(e.get("auth_failure") == "node" for e in logs)
        garbage = tmp_path / "garbage"
        garbage.write_text("not-a-token")
        assert (await reason_of(env.token_client(garbage), req)).endswith(
            "token is not authenticated: invalid bearer token; as a HAMi plugin's default token: "
            "token is not authenticated: invalid bearer token"
        )
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"
        upstream = env.token_for("n1", service_account=UPSTREAM_SA, audiences=API_AUDIENCE)
        assert (await env.token_client(upstream).refit(req))[0].uuid == "GPU-b"
        # hamid's plugins with their refit-audience token still work alongside
        pod2 = await env.place("q", "n1", ((d("GPU-a", 1000),),))
        own = env.token_for("n1", audiences=[DEFAULT_TOKEN_AUDIENCE])
        assert (await env.token_client(own).refit(request(pod2, "n1", 0, ["GPU-b"])))[0].uuid == "GPU-b"


def test_service_account_values() -> None:
    assert ServiceAccount.parse("") is None
    assert ServiceAccount.parse(" kube-system/hami-device-plugin ") == ServiceAccount(
        "kube-system", "hami-device-plugin"
    )
    for bad in ("kube-system", "/x", "x/", "a/b/c", "system:serviceaccount:a:b"):
        with pytest.raises(ValueError, match="is not <namespace>/<serviceaccount>"):
            ServiceAccount.parse(bad)


async def test_empty_token_audience_uses_the_api_default(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path, token_audience="") as env:
        pod = await setup(env)
        token = env.token_for("n1", audiences=["https://kubernetes.default.svc"])
        assert (await env.token_client(token).refit(request(pod, "n1", 0, ["GPU-b"])))[0].uuid == "GPU-b"


async def test_bound_uid_mismatch_is_refused(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        token = env.token_for("n1")
        env.server.delete("Pod", PLUGIN_NS, "hami-device-plugin-n1")
        env.plugin_pod("n1")  # same name, new UID
        reason = await reason_of(env.token_client(token), request(pod, "n1", 0, ["GPU-b"]))
        assert reason.endswith(
            "caller pod kube-system/hami-device-plugin-n1 no longer matches the token's bound UID"
        )


async def test_mtls_node_identity(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        other_node = await reason_of(env.mtls_client("system:node:n2"), req)
        assert other_node.endswith("client certificate 'system:node:n2' is for node 'n2', not 'n1'")
        # node n2 speaking for itself still cannot move a pod tracked on n1
        as_n2 = request(pod, "n2", 0, ["GPU-c"])
        assert (await reason_of(env.mtls_client("system:node:n2"), as_n2)).endswith(
            "pod default/p is tracked on node n1, not n2"
        )
        other_ca = CertificateAuthority.create(tmp_path / "rogue", "rogue CA")
        rogue = other_ca.issue_client(tmp_path / "rogue", "system:node:n1")
        rogue_client = env.certificate_client(rogue)
        assert (await reason_of(rogue_client, req)).startswith("scheduler refit request failed")
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"
        # a bare CN <node> (any user named like a node has one from the cluster CA) is refused
        bare = await reason_of(env.mtls_client("n1"), req)
        assert bare.endswith("client certificate 'n1' is not a node identity (want CN system:node:<node>)")
        # the node CN outside O=system:nodes is refused too
        no_group = await reason_of(env.mtls_client("system:node:n1", organizations=()), req)
        assert no_group.endswith("client certificate 'system:node:n1' is not in O=system:nodes (its O: none)")
        other_group = await reason_of(env.mtls_client("system:node:n1", organizations=("developers",)), req)
        assert other_group.endswith("is not in O=system:nodes (its O: developers)")
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"
        # another O alongside: kubelet's client certificate signer allows O=system:nodes alone
        extra = await reason_of(
            env.mtls_client("system:node:n1", organizations=("system:nodes", "extra")), req
        )
        assert extra.endswith(
            "client certificate 'system:node:n1' has 2 O (system:nodes, extra); "
            "a node's has O=system:nodes only"
        )
        # kubelet's identity: CN system:node:n1, O system:nodes
        kubelet = env.mtls_client("system:node:n1")
        assert (await kubelet.refit(req))[0].uuid == "GPU-b"


async def test_a_certificate_with_several_common_names_speaks_for_no_node(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    """Kubernetes (Go's pkix) reads a subject's last CN, hamid read the first: node n2 can get a
    certificate approved as itself (last CN system:node:n2) whose first CN names n1, and it was
    accepted for n1's pods. A subject with several CNs is refused whichever node it names."""
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        for names in (("system:node:n1", "system:node:n2"), ("system:node:n1", "system:node:n1")):
            pair = tls_files.ca.issue_client(tmp_path / "two", names[0], more_common_names=names[1:])
            client = env.certificate_client(pair)
            reason = await reason_of(client, req)
            assert reason.endswith(
                f"client certificate has 2 subject common names ({', '.join(names)}); "
                "Kubernetes reads the last, so it names no single node"
            )
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"


async def test_only_configured_methods_are_accepted(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path, methods=("token",)) as env:
        pod = await setup(env)
        req = request(pod, "n1", 0, ["GPU-b"])
        assert (await reason_of(env.mtls_client("system:node:n1"), req)).endswith(
            "no caller credentials presented"
        )
    async with refit_env(tls_files, tmp_path, methods=("mtls",)) as env:
        pod = await setup(env)
        assert (await reason_of(env.token_client(env.token_for("n1")), req)).endswith(
            "no caller credentials presented"
        )
    async with refit_env(tls_files, tmp_path, methods=()) as env:
        pod = await setup(env)
        reason = await reason_of(env.mtls_client("system:node:n1"), req)
        assert "no caller authentication method is configured for /refit (--refit-auth is empty)" in reason
    async with refit_env(tls_files, tmp_path, methods=("mtls",), client_ca=False) as env:
        pod = await setup(env)
        reason = await reason_of(env.mtls_client("system:node:n1"), req)
        assert "mtls needs --client-ca-file" in reason
        assert env.annotations("p")[AL] == "GPU-a,NVIDIA,20000,0:;"


async def test_token_over_plain_http_is_refused(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        token = env.token_for("n1").read_text().strip()
        auth = RefitAuthenticator(
            ["token"],
            kube=env.kube,
            device_plugin_namespace=PLUGIN_NS,
            device_plugin_service_account=PLUGIN_SA,
        )
        runner, port = await serve(
            cluster_app(
                env.scheduler.readiness, env.scheduler.admission, [refit_routes(env.scheduler, auth)]
            ),
            "127.0.0.1:0",
        )
        try:
            body = request(pod, "n1", 0, ["GPU-b"]).to_json()
            headers = {"Authorization": f"Bearer {token}"}
            async with env.session.post(f"http://127.0.0.1:{port}/refit", json=body, headers=headers) as resp:
                answer = await resp.json()
        finally:
            await runner.cleanup()
        assert answer == {
            "succeeded": False,
            "failureReason": "caller authentication failed: bearer tokens are accepted only over TLS",
        }


async def test_route_status_codes_and_metrics(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path) as env:
        pod = await setup(env)
        assert await env.post_raw(None) == (400, MSG_NO_BODY)
        status, text = await env.post_raw(b"{}", headers={"Content-Encoding": "gzip"})  # not gzip
        assert status == 400 and "cannot read the request body" in text, (status, text)
        # upstream TestNumaRefitRoute_DecodeError: malformed JSON and wrong field types are
        # in-band refusals carrying the decode error
        status, text = await env.post_raw(b"{not json")
        assert status == 200
        answer = json.loads(text)
        assert answer["succeeded"] is False
        assert answer["failureReason"].startswith("cannot decode refit request: ")
        for hostile in (b"[" * 20000 + b"]" * 20000, b'{"nodeName": NaN}', b"\xff\xfe{}"):
            status, text = await env.post_raw(hostile)  # deep nesting, non-standard JSON, not UTF-8
            assert status == 200
            assert json.loads(text)["failureReason"].startswith("cannot decode refit request: ")
        body = request(pod, "n1", 0, ["GPU-b"]).to_json()
        status, text = await env.post_raw(json.dumps({**body, "containerIndex": "zero"}).encode())
        assert status == 200
        answer = json.loads(text)
        assert answer["succeeded"] is False and "containerIndex" in answer["failureReason"]
        status, _ = await env.post_raw(b" " * (2 << 20))
        assert status == 413
        status, text = await env.post_raw(json.dumps({**body, "allowedDeviceUUIDs": []}).encode())
        assert status == 200 and json.loads(text)["succeeded"] is False
        status, text = await env.post_raw(json.dumps(body).encode())
        assert status == 200
        assert json.loads(text) == {"succeeded": True, "containerDevices": "GPU-b,NVIDIA,20000,0:"}
        registry = env.scheduler.metrics.registry
        assert registry.get_sample_value("hamid_refit_total", {"outcome": "moved", "reason": ""}) == 1
        refused = {"outcome": "refused", "reason": "invalid_request"}
        assert registry.get_sample_value("hamid_refit_total", refused) == 2
        decode = {"outcome": "refused", "reason": "decode_error"}
        assert registry.get_sample_value("hamid_refit_total", decode) == 4
        assert env.annotations("p")[ann.DEVICES_ALLOCATED] == "GPU-b,NVIDIA,20000,0:;"
        assert registry.get_sample_value("hamid_refit_duration_seconds_count", {"outcome": "moved"}) == 1


async def test_not_synced_scheduler_refuses(tls_files: TLSFiles, tmp_path: Path) -> None:
    async with refit_env(tls_files, tmp_path, start=False, sync_wait=0.2) as env:
        env.add_node("n1", [gpu("GPU-a")])
        req = request({"metadata": {"uid": "u", "namespace": "default", "name": "p"}}, "n1", 0, ["GPU-a"])
        reason = await reason_of(env.mtls_client("system:node:n1"), req)
        # upstream answers "context cancelled" (TestNumaRefitRoute_CacheNotSynced); hamid says why
        assert reason == "scheduler refused refit: context cancelled: scheduler not ready: caches not synced"
