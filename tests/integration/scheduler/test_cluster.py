"""/webhook (v1, v1beta1), /healthz, /readyz, body limits, TLS, metrics and the CLI runner."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest

from hamid.scheduler.app import run_scheduler
from hamid.scheduler.http import MAX_BODY_BYTES
from hamid.scheduler.options import SchedulerOptions, parse_duration
from hamid.tls import client_ssl_context
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.scheduler.harness import running_scheduler, wait_for
from tests.unit.scheduler.helpers import pod


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
async def test_webhook_over_http(version: str) -> None:
    async with running_scheduler() as env:
        review = {
            "apiVersion": version,
            "kind": "AdmissionReview",
            "request": {"uid": "r1", "object": pod("a")},
        }
        status, body = await env.post(env.cluster, "/webhook", review)
        assert status == 200 and body["apiVersion"] == version
        patch = json.loads(base64.b64decode(body["response"]["patch"]))
        assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in patch
        env.server.put(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "q", "namespace": "default"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "500"}},
            }
        )
        await wait_for(lambda: env.scheduler.ledger.fit_quota("default") is not None)
        status, body = await env.post(env.cluster, "/webhook", review)
        assert body["response"] == {
            "uid": "r1",
            "allowed": False,
            "status": {"code": 403, "message": "exceeding resource quota"},
        }


async def test_body_limits_and_malformed_json() -> None:
    async with running_scheduler() as env:
        for base, path in ((env.extender, "/filter"), (env.extender, "/bind"), (env.cluster, "/webhook")):
            async with env.session.post(base + path, data=b"{not json") as resp:
                assert resp.status == 400 and "malformed JSON" in await resp.text()
            async with env.session.post(base + path, data=b" " * (MAX_BODY_BYTES + 1)) as resp:
                assert resp.status == 413
            # a plain body said to be compressed: gzip fails as the handler reads it, deflate in
            # aiohttp's parser (its own 400, naming the encoding)
            for encoding, reason in (("gzip", "cannot read the request body"), ("deflate", "deflate")):
                headers = {"Content-Encoding": encoding, "Connection": "close"}
                async with (
                    aiohttp.ClientSession() as session,  # no connection the 413 closed
                    session.post(base + path, data=b"{}", headers=headers) as resp,
                ):
                    assert resp.status == 400 and reason in await resp.text(), resp.status
        # extender args of the wrong shape are answered in-band, like HAMi (kube-scheduler reads Error)
        status, body = await env.post(env.extender, "/filter", {"NodeNames": ["a"]})
        assert status == 200 and body["Error"] == "extender args missing pod"
        status, body = await env.post(env.extender, "/filter", {"Pod": pod("a"), "NodeNames": "a"})
        assert status == 200 and body["Error"] == "NodeNames must be a list of strings"
        status, body = await env.post(env.extender, "/bind", {"PodName": "a"})
        assert status == 200 and "PodNamespace" in body["Error"]
        status, body = await env.post(env.cluster, "/webhook", {"apiVersion": "admission.k8s.io/v1"})
        assert status == 400 and "request.uid" in body["error"]
        assert env.server.count("Pod") == 0


def _malformed(**changes: object) -> dict:
    """A GPU pod with parts of the wrong type (``spec``/``metadata`` keys replaced)."""
    p = pod("a")
    for key, value in changes.items():
        section, _, field = key.partition("__")
        p[section][field] = value
    return p


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (_malformed(spec__containers=[{"name": "c", "resources": {"limits": "nvidia.com/gpu=1"}}]), "limits"),
        (_malformed(spec__containers=["main"]), "containers[0]"),
        (_malformed(spec__containers={"name": "main"}), "containers"),
        (_malformed(spec__initContainers="init"), "initContainers"),
        (_malformed(metadata__labels=["a"]), "labels"),
        (_malformed(metadata__annotations="x"), "annotations"),
        ({**pod("a"), "spec": ["x"]}, "spec"),
        ({**pod("a"), "metadata": "x"}, "metadata"),
        (
            _malformed(spec__containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": [1]}}}]),
            "gpu",
        ),
    ],
)
async def test_webhook_denies_malformed_pods_with_a_reason(obj: dict, reason: str) -> None:
    async with running_scheduler() as env:
        review: dict[str, Any] = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "r"},
        }
        review["request"]["object"] = obj
        status, body = await env.post(env.cluster, "/webhook", review)
        assert status == 200, body
        answer = body["response"]
        assert answer["uid"] == "r" and answer["allowed"] is False
        assert answer["status"]["code"] == 400 and reason in answer["status"]["message"]


async def test_readyz_follows_sync_and_leadership() -> None:
    async with running_scheduler(start=False) as env:
        async with env.session.get(env.cluster + "/readyz") as resp:
            assert resp.status == 503 and "caches not synced" in await resp.text()
        _status, body = await env.post(env.extender, "/filter", {"Pod": pod("a"), "NodeNames": ["n"]})
        assert "not ready" in body["Error"]
        task = asyncio.create_task(env.scheduler.run())
        try:
            await asyncio.wait_for(env.scheduler.pods.wait_synced(), 10)
            await asyncio.wait_for(env.scheduler.nodes.wait_synced(), 10)
            await asyncio.wait_for(env.scheduler.quotas.wait_synced(), 10)
            async with env.session.get(env.cluster + "/readyz") as resp:
                assert resp.status == 200
            env.scheduler.readiness.follow()
            async with env.session.get(env.cluster + "/readyz") as resp:
                assert resp.status == 503 and "not the leader" in await resp.text()
            async with env.session.get(env.cluster + "/healthz") as resp:
                assert resp.status == 200
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_run_scheduler_with_tls_and_metrics(tls_files: TLSFiles) -> None:
    async with ApiServer() as server:
        options = SchedulerOptions(
            extender_listen="127.0.0.1:0",
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            tls_cert_file=str(tls_files.server.cert_file),
            tls_key_file=str(tls_files.server.key_file),
            client_ca_file=str(tls_files.ca_file),
            api_server=server.url,
        )
        stop = asyncio.Event()
        ports: dict[str, int] = {}
        started = asyncio.Event()

        def ready(_scheduler: object, bound: dict[str, int]) -> None:
            ports.update(bound)
            started.set()

        runner = asyncio.create_task(run_scheduler(options, stop=stop, ready=ready))
        try:
            await asyncio.wait_for(started.wait(), 10)
            ctx = client_ssl_context(tls_files.ca_file)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.get(f"https://localhost:{ports['cluster']}/healthz", ssl=ctx) as resp:
                    assert resp.status == 200
                async with asyncio.timeout(10):
                    while True:
                        async with session.get(
                            f"https://localhost:{ports['cluster']}/readyz", ssl=ctx
                        ) as resp:
                            if resp.status == 200:
                                break
                        await asyncio.sleep(0.05)
                async with session.get(f"http://127.0.0.1:{ports['metrics']}/metrics") as resp:
                    text = await resp.text()
                    assert "hamid_filter_duration_seconds" in text
        finally:
            stop.set()
            await asyncio.wait_for(runner, 10)


def test_parse_duration() -> None:
    assert parse_duration("5m").total_seconds() == 300
    assert parse_duration("1h30m").total_seconds() == 5400
    assert parse_duration("250ms").total_seconds() == 0.25
    for bad in ("", "5", "m5", "-1s", "0s", "5m garbage"):
        with pytest.raises(ValueError):
            parse_duration(bad)
