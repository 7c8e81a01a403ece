"""``--force-overwrite-default-scheduler`` as a cluster sees it: the embedded API server defaults
``spec.schedulerName`` to ``default-scheduler`` and then calls the scheduler's webhook (registered
in a MutatingWebhookConfiguration, over TLS), as a real API server does."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from hamid.scheduler.settings import SchedulerSettings
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.scheduler.harness import loopback_options, running_app
from tests.unit.scheduler.helpers import container, pod


def webhook_configuration(url: str, ca_pem: bytes) -> dict[str, Any]:
    """The chart's webhook registration (pods, CREATE), pointing at ``url``."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "hamid-webhook"},
        "webhooks": [
            {
                "name": "vgpu.hami.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
            }
        ],
    }


def created(name: str, scheduler: str | None, gpu: bool) -> dict[str, Any]:
    """A pod to create: memory-only GPU request (the webhook injects the count) or CPU only."""
    limits = {"nvidia.com/gpumem": "1000"} if gpu else {"cpu": "1"}
    body = pod(name, containers=[container("c", resources={"limits": limits})])
    del body["status"], body["metadata"]["uid"]
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", **body}


@pytest.mark.parametrize("force", [True, False])
async def test_default_scheduler_pods_follow_the_flag(force: bool, tls_files: TLSFiles) -> None:
    settings = SchedulerSettings(force_overwrite_default_scheduler=force)
    async with ApiServer() as server:
        options = loopback_options(
            server,
            settings=settings,
            tls_cert_file=str(tls_files.server.cert_file),
            tls_key_file=str(tls_files.server.key_file),
        )
        async with running_app(options) as app:
            url = f"https://127.0.0.1:{app.ports['cluster']}/webhook"
            server.put(webhook_configuration(url, tls_files.ca_file.read_bytes()))
            kube = app.scheduler.kube
            pods = {
                name: await kube.create_pod(created(name, scheduler, gpu))
                for name, scheduler, gpu in (
                    ("unnamed", None, True),
                    ("named", "hami-scheduler", True),
                    ("cpu", None, False),
                    ("other", "volcano", True),
                )
            }
        calls = [outcome for _, outcome in server.admission.calls]
    # the API server defaulted every unnamed pod to default-scheduler before calling the webhook
    scheduler = {name: p["spec"]["schedulerName"] for name, p in pods.items()}
    gpus = {
        name: p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
        for name, p in pods.items()
    }
    if force:  # HAMi's default: the unnamed GPU pod is handed to hamid and the rules apply
        assert scheduler == {
            "unnamed": "hami-scheduler",
            "named": "hami-scheduler",
            "cpu": "default-scheduler",
            "other": "volcano",
        }
        assert gpus == {"unnamed": "1", "named": "1", "cpu": None, "other": None}
        assert calls == ["patched", "patched", "allowed", "allowed"]
    else:  # left alone like another scheduler's pod: not mutated at all
        assert scheduler == {
            "unnamed": "default-scheduler",
            "named": "hami-scheduler",
            "cpu": "default-scheduler",
            "other": "volcano",
        }
        assert gpus == {"unnamed": None, "named": "1", "cpu": None, "other": None}
        assert calls == ["allowed", "patched", "allowed", "allowed"]
