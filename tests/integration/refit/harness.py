"""A scheduler serving ``/refit`` over TLS against the embedded API server, and refit callers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from hamid.kube.client import KubeClient
from hamid.model import annotations as ann
from hamid.model.devices import MODE_HAMI_CORE, NVIDIA, ContainerDevice, DeviceInfo, PodDevices
from hamid.model.refit import RefitRequest
from hamid.plugin.refit_client import RefitClient, RefitClientConfig
from hamid.scheduler.app import authenticator_from_options
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.http import RouteRegistrar
from hamid.scheduler.options import DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT, DEFAULT_NAMESPACE, SchedulerOptions
from hamid.scheduler.refit import refit_routes
from hamid.scheduler.refit.auth import DEFAULT_TOKEN_AUDIENCE, ServiceAccount
from hamid.scheduler.signing import AllocationKeys
from hamid.tls import client_ssl_context
from hamidsim.apiserver import ApiServer
from tests.fixtures.tls import TLSFiles
from tests.integration.scheduler.harness import loopback_options, running_app

#: Where the scheduler expects the device plugin's ServiceAccount (its defaults, as HAMi's chart).
PLUGIN_NS = DEFAULT_NAMESPACE
PLUGIN_SA = DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll an in-process predicate until true; fail after ``within`` s (a bound, not an assertion)."""
    async with asyncio.timeout(within):
        for _ in itertools.count():
            if check():
                return
            await asyncio.sleep(0.01)


def gpu(
    uuid: str, numa: int = 0, mem: int = 40000, count: int = 10, mode: str = MODE_HAMI_CORE
) -> DeviceInfo:
    """A healthy GPU record for a node register."""
    return DeviceInfo(
        id=uuid,
        index=0,
        count=count,
        devmem=mem,
        devcore=100,
        type="NVIDIA-A100",
        numa=numa,
        mode=mode,
        health=True,
    )


def d(uuid: str, mem: int, cores: int = 0) -> ContainerDevice:
    """One allocated device."""
    return ContainerDevice(uuid, NVIDIA, mem, cores)


def container(name: str, gpus: int = 1, mem: int = 1000, **extra: Any) -> dict[str, Any]:
    """A container spec requesting GPUs (0 = none)."""
    out: dict[str, Any] = {"name": name, "image": "cuda", **extra}
    if gpus:
        out["resources"] = {"limits": {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(mem)}}
    return out


@dataclass
class Env:
    """The API server, the scheduler and its TLS ``/refit`` endpoint."""

    server: ApiServer
    kube: KubeClient
    scheduler: Scheduler
    tls: TLSFiles
    cluster: str
    extender: str
    session: aiohttp.ClientSession
    tmp: Path

    # -- seeding -----------------------------------------------------------------------------

    def add_node(self, name: str, gpus: Sequence[DeviceInfo]) -> None:
        """A registered GPU node."""
        devices = [dataclasses.replace(g, index=i) for i, g in enumerate(gpus)]
        self.server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {ann.NODE_REGISTER: ann.encode_node_devices(devices)},
                },
                "status": {"allocatable": {"nvidia.com/gpu": str(10 * len(devices))}},
            }
        )

    async def place(
        self,
        name: str,
        node: str,
        layout: PodDevices,
        *,
        containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None,
        pending: str | None = None,
        annotations: dict[str, str] | None = None,
        namespace: str = "default",
        status: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A pod scheduled by hamid on ``node`` (both annotations), bound, waiting for Allocate."""
        raw = ann.encode_pod_devices(layout)
        spec: dict[str, Any] = {"nodeName": node, "containers": containers or [container("main")]}
        if init:
            spec["initContainers"] = init
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "annotations": {
                    ann.VGPU_NODE: node,
                    ann.DEVICES_ALLOCATED: raw,
                    ann.DEVICES_TO_ALLOCATE: raw if pending is None else pending,
                    ann.BIND_PHASE: ann.BIND_PHASE_ALLOCATING,
                    ann.BIND_TIME: "1700000000",
                    **(annotations or {}),
                },
            },
            "spec": spec,
            "status": {"phase": "Pending", **(status or {})},
        }
        stored = self.server.put(pod)
        uid = stored["metadata"]["uid"]
        rv = stored["metadata"]["resourceVersion"]
        await eventually(
            lambda: (
                self.scheduler.ledger.reservation(uid) is not None
                and (self.scheduler.pods.get(f"{namespace}/{name}") or {})
                .get("metadata", {})
                .get("resourceVersion")
                == rv
            )
        )
        return stored

    def quota(self, namespace: str, mem: int) -> None:
        """A ResourceQuota limiting ``limits.nvidia.com/gpumem``."""
        self.server.put(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": namespace},
                "spec": {"hard": {"limits.nvidia.com/gpumem": str(mem)}},
            }
        )

    def plugin_pod(self, node: str, name: str | None = None) -> dict[str, Any]:
        """The device-plugin pod on ``node`` in the plugin namespace (created when absent)."""
        name = name or f"hami-device-plugin-{node}"
        existing = self.server.get("Pod", PLUGIN_NS, name)
        if existing is not None:
            return existing
        return self.server.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": PLUGIN_NS},
                "spec": {"nodeName": node, "serviceAccountName": PLUGIN_SA, "containers": [{"name": "p"}]},
                "status": {"phase": "Running"},
            }
        )

    def token_for(
        self,
        node: str,
        *,
        service_account: str = PLUGIN_SA,
        audiences: Sequence[str] | None = None,
    ) -> Path:
        """A bound ServiceAccount token of the device-plugin pod on ``node``, written to a file.

        ``audiences``: what the token is valid for (None: any audience TokenReview asks for).
        """
        pod = self.plugin_pod(node)
        scope = "".join(c if c.isalnum() else "-" for c in ",".join(audiences)) if audiences else "any"
        token = f"token-{node}-{service_account}-{scope}"
        self.server.register_pod_token(
            token,
            namespace=PLUGIN_NS,
            pod_name=pod["metadata"]["name"],
            pod_uid=pod["metadata"]["uid"],
            service_account=service_account,
            node_name=node,
            audiences=audiences,
        )
        path = self.tmp / f"{token}.txt"
        path.write_text(token + "\n")
        return path

    # -- callers -----------------------------------------------------------------------------

    def mtls_client(self, cn: str, organizations: tuple[str, ...] | None = None, **kw: Any) -> RefitClient:
        """A refit client presenting a client certificate with subject CN ``cn`` (no token).

        ``organizations``: the certificate's ``O`` (default: ``system:nodes`` for a node CN).
        """
        return self.certificate_client(self.tls.client(cn, organizations), **kw)

    def certificate_client(self, pair: Any, **kw: Any) -> RefitClient:
        """A refit client presenting the client certificate ``pair`` (any CA's; no token)."""
        config = RefitClientConfig(
            endpoint=self.cluster,
            ca_file=str(self.tls.ca_file),
            client_cert_file=str(pair.cert_file),
            client_key_file=str(pair.key_file),
            token_file=None,
            **kw,
        )
        return RefitClient(config)

    def token_client(self, token_file: Path | str) -> RefitClient:
        """A refit client sending a ServiceAccount token (no client certificate)."""
        return RefitClient(
            RefitClientConfig(
                endpoint=self.cluster, ca_file=str(self.tls.ca_file), token_file=str(token_file)
            )
        )

    async def post_raw(
        self, body: bytes | None, cn: str = "system:node:n1", headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """POST raw bytes to /refit with a node client certificate: (status, text)."""
        pair = self.tls.client(cn)
        ctx = client_ssl_context(self.tls.ca_file, cert_file=pair.cert_file, key_file=pair.key_file)
        async with self.session.post(self.cluster + "/refit", data=body, ssl=ctx, headers=headers) as resp:
            return resp.status, await resp.text()

    def annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        """The pod's current annotations on the API server."""
        obj = self.server.get("Pod", namespace, name)
        assert obj is not None
        return obj["metadata"].get("annotations") or {}

    def events(self, reason: str, namespace: str = "default") -> list[dict[str, Any]]:
        """Events with ``reason``."""
        return [e for e in self.server.list("Event", namespace) if e.get("reason") == reason]


def request(
    pod: dict[str, Any],
    node: str,
    index: int,
    allowed: Sequence[str],
    name: str = "",
    device_type: str = NVIDIA,
) -> RefitRequest:
    """A refit request for ``pod`` (UID, namespace, name from the stored object)."""
    meta = pod["metadata"]
    return RefitRequest(
        pod_uid=meta["uid"],
        pod_namespace=meta["namespace"],
        pod_name=meta["name"],
        node_name=node,
        container_index=index,
        container_name=name,
        device_type=device_type,
        allowed_device_uuids=tuple(allowed),
    )


@contextlib.asynccontextmanager
async def refit_env(
    tls: TLSFiles,
    tmp: Path,
    *,
    methods: Sequence[str] = ("mtls", "token"),
    client_ca: bool = True,
    patch_timeout: float = 2.0,
    sync_wait: float = 2.0,
    start: bool = True,
    settings: SchedulerSettings | None = None,
    token_audience: str = DEFAULT_TOKEN_AUDIENCE,
    hami_plugins: ServiceAccount | None = None,
    server: ApiServer | None = None,
    keys: AllocationKeys | None = None,
) -> AsyncIterator[Env]:
    """API server + scheduler (caches synced unless ``start`` is False) + TLS cluster app with /refit.

    ``server``: an API server already running (another replica's); ``keys``: signed mode.
    """
    async with ApiServer() if server is None else contextlib.nullcontext(server) as api:
        options = loopback_options(
            api,
            tls_cert_file=str(tls.server.cert_file),
            tls_key_file=str(tls.server.key_file),
            client_ca_file=str(tls.ca_file) if client_ca else None,
            settings=settings or SchedulerSettings(gpu_policy="binpack"),
            refit_auth=tuple(methods),
            refit_token_audience=token_audience,
            refit_hami_plugin_service_account=hami_plugins,
            allocation_keys=keys,
        )

        def routes(scheduler: Scheduler, opts: SchedulerOptions) -> RouteRegistrar:
            auth = authenticator_from_options(scheduler, opts)
            return refit_routes(scheduler, auth, patch_timeout=patch_timeout, sync_wait=sync_wait)

        async with (
            running_app(options, [routes], start=start) as app,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        ):
            yield Env(
                api,
                app.scheduler.kube,
                app.scheduler,
                tls,
                f"https://localhost:{app.ports['cluster']}",
                f"http://127.0.0.1:{app.ports['extender']}",
                session,
                tmp,
            )
