"""An in-process simulated cluster: the whole hamid flow in one event loop, over real sockets.

:class:`SimCluster` starts, in this order: the embedded API server; the scheduler (its extender
app on loopback HTTP and its cluster app — ``/webhook``, ``/healthz``, ``/readyz``, ``/refit`` —
over TLS with certificates generated at start, client certificates verified against the same CA);
per node a simulated kubelet (machine file, Topology Manager policy, static CPU manager) and a
``hamid plugin`` (devices file, node config with NUMA topology and preferred allocation, refit
client with a node client certificate); finally the kube-scheduler driver that sends pods with our
``schedulerName`` through ``/filter`` and ``/bind``.

Knobs (:class:`ClusterOptions`, :class:`NodeSpec`): refit enabled/disabled, refit caller
authentication (mTLS or ServiceAccount token), topology policy, MIG operating mode per node,
scheduler unreachable for the refit client (a listener that accepts and never answers), GPU and
node policies. At runtime: :meth:`SimCluster.restart_kubelet`, :meth:`SimCluster.restart_scheduler`.

Readers for tests, the demo and the soak: :meth:`SimCluster.pod`, :meth:`SimCluster.assignment`,
:meth:`SimCluster.events`, :meth:`SimCluster.reservation`, :meth:`SimCluster.refit_calls`.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from hamid.kube.client import JSON, KubeClient, connect
from hamid.log import get_logger
from hamid.model.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, VGPU_NODE, decode_pod_devices
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, ContainerDevices, PodDevices
from hamid.model.errors import InvalidInput
from hamid.model.resources import DeviceConfig
from hamid.plugin.allocator_rules import AllocationError
from hamid.plugin.app import Plugin, PluginOptions, load_setup
from hamid.plugin.numa_policy import MismatchHandler, NumaMismatch, make_mismatch_handler
from hamid.plugin.numa_publisher import NumaSources
from hamid.plugin.refit_client import RefitClient, RefitClientConfig
from hamid.scheduler.cli import SchedulerOptions
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.http import cluster_app, extender_app, serve
from hamid.scheduler.refit import refit_route_factory
from hamid.scheduler.refit_auth import DEFAULT_TOKEN_AUDIENCE
from hamid.scheduler.state import Reservation
from hamid.sim.apiserver import ApiServer
from hamid.sim.apiserver.patch import json_patch
from hamid.sim.apiserver.store import Change
from hamid.sim.certs import CertificateAuthority, CertPair
from hamid.sim.kube_scheduler import KubeSchedulerDriver
from hamid.sim.kubelet import PodAdmission, SimKubelet, read_assignment
from hamid.sim.kubelet.cadvisor import format_cpu_list
from hamid.sim.kubelet.config import SIM_DEFAULTS, KubeletConfig, load_kubelet_config
from hamid.sim.machine import Machine, load_machine_file
from hamid.sim.sysfs import write_sysfs_tree
from hamid.tls import ReloadingServerContext, client_ssl_context, server_ssl_context

#: Per node, per GPU UUID: (slots, MiB, cores).
GpuUsage = dict[str, dict[str, tuple[int, int, int]]]

log = get_logger("sim.cluster")

#: The demo node's machine file (2 NUMA nodes x 16 CPUs, 8 GPUs, 4 per NUMA node).
DEMO_MACHINE = "demo-2numa-8gpu.yaml"
#: A node with MIG-enabled GPUs (its plugin runs in ``mig`` operating mode).
DEMO_MIG_MACHINE = "demo-mig-node.yaml"
RESOURCE_NAME = "nvidia.com/gpu"
DEVICE_PLUGIN_NAMESPACE = "kube-system"
DEVICE_PLUGIN_SERVICE_ACCOUNT = "hami-device-plugin"
_POLL_S = 0.01
#: Name of the MutatingWebhookConfiguration registering the scheduler's webhook.
WEBHOOK_CONFIGURATION = "hamid-webhook"


def data_file(name: str) -> Path:
    """Path of a file shipped in ``hamid/sim/data/``."""
    return Path(str(resources.files("hamid.sim") / "data" / name))


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated node: its machine file, Topology Manager policy and operating mode."""

    name: str
    machine_file: str | Path = field(default_factory=lambda: data_file(DEMO_MACHINE))
    topology_policy: str = "single-numa-node"
    mig: bool = False
    split: int = 10
    #: The node's KubeletConfiguration (None: the simulator's defaults); ``topology_policy`` overrides it.
    kubelet_config: KubeletConfig | None = None


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """How the simulated cluster is wired (see the module docs)."""

    nodes: tuple[NodeSpec, ...] = (NodeSpec("node-1"),)
    refit: bool = True
    refit_auth: str = "mtls"
    scheduler_unreachable: bool = False
    gpu_policy: str = "spread"
    node_policy: str = "binpack"
    scheduler_name: str = "hami-scheduler"
    numa_topology: bool = True
    preferred_allocation: bool = True
    #: Where the embedded API server listens (port 0: a free port).
    api_host: str = "127.0.0.1"
    api_port: int = 0
    #: Register the scheduler's webhook in a MutatingWebhookConfiguration that the API server calls
    #: on pod create (as on a real cluster); otherwise :meth:`SimCluster.create_pod` calls it itself.
    admission_webhook: bool = False
    #: Run the plugin's NUMA publisher (profile and placements) against the simulated kubelet.
    numa_publish: bool = True
    #: Its PodResources poll period (the product's default is 1 s).
    numa_interval: float = 0.5
    #: Run the kube-scheduler driver; off, the caller drives ``/filter`` and ``/bind`` itself.
    kube_scheduler: bool = True

    def __post_init__(self) -> None:
        """Reject inconsistent knobs before anything starts."""
        if not self.nodes:
            raise InvalidInput("a simulated cluster needs at least one node")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise InvalidInput(f"duplicate node names in {names}")
        if self.refit_auth not in ("mtls", "token"):
            raise InvalidInput(f"refit_auth must be 'mtls' or 'token', got {self.refit_auth!r}")


@dataclass(frozen=True, slots=True)
class RefitCall:
    """One mismatch the plugin saw (``door``: GetPreferredAllocation or Allocate) and what its
    NUMA mismatch policy answered.

    ``outcome`` is ``refitted`` (``devices`` holds the new GPUs), ``unaligned`` (no refit applied:
    the allocation annotation stands and the pod runs on its accounted GPUs without NUMA alignment)
    or ``failed`` (the allocation was failed; ``error`` says why).
    """

    node: str
    pod: str
    container_index: int
    annotated: tuple[str, ...]
    missing: tuple[str, ...]
    allowed: tuple[str, ...]
    outcome: str
    devices: tuple[str, ...] = ()
    error: str = ""
    door: str = "GetPreferredAllocation"


@dataclass
class _SchedulerProcess:
    kube: KubeClient
    scheduler: Scheduler
    runners: list[web.AppRunner]
    task: asyncio.Task[None]
    tls: ReloadingServerContext


@dataclass
class _Node:
    spec: NodeSpec
    machine: Machine
    root: Path
    kubelet_kube: KubeClient
    kubelet: SimKubelet
    plugin_kube: KubeClient | None = None
    plugin: Plugin | None = None
    plugin_task: asyncio.Task[None] | None = None
    client_cert: CertPair | None = None
    #: The kubelet config file both the simulated kubelet and the plugin read.
    kubelet_config_file: Path | None = None
    sysfs_root: Path | None = None


def kubelet_config_document(config: KubeletConfig) -> JSON:
    """The ``KubeletConfiguration`` file of a simulated node (the modelled fields that are set)."""
    doc: JSON = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cpuManagerPolicy": config.cpu_manager_policy,
        "cpuManagerPolicyOptions": dict(config.cpu_manager_policy_options),
        "topologyManagerPolicy": config.topology_manager_policy,
        "topologyManagerScope": config.topology_manager_scope,
        "topologyManagerPolicyOptions": dict(config.topology_manager_policy_options),
        "memoryManagerPolicy": config.memory_manager_policy,
    }
    if config.reserved_system_cpus is not None:
        doc["reservedSystemCPUs"] = format_cpu_list(config.reserved_system_cpus)
    if config.reserved_cpu_count:
        doc["kubeReserved"] = {"cpu": str(config.reserved_cpu_count)}
    if config.reserved_memory:
        doc["reservedMemory"] = [
            {"numaNode": r.numa_node, "limits": {kind: str(value) for kind, value in r.limits}}
            for r in config.reserved_memory
        ]
    if config.feature_gates:
        doc["featureGates"] = dict(config.feature_gates)
    if config.max_pods is not None:
        doc["maxPods"] = config.max_pods
    return doc


def _write_node_files(spec: NodeSpec, machine: Machine, directory: Path) -> tuple[Path, Path]:
    """The node's kubelet config file (the spec's config, topology policy applied) and sysfs tree."""
    directory.mkdir(parents=True, exist_ok=True)
    config = (spec.kubelet_config or SIM_DEFAULTS).with_overrides(
        topology_manager_policy=spec.topology_policy
    )
    config_file = directory / "kubelet-config.yaml"
    config_file.write_text(yaml.safe_dump(kubelet_config_document(config), sort_keys=False), "utf-8")
    return config_file, write_sysfs_tree(machine, directory / "sys")


def _node_config(spec: NodeSpec, options: ClusterOptions) -> str:
    return json.dumps(
        {
            "nodeconfig": [
                {
                    "name": spec.name,
                    "operatingmode": MODE_MIG if spec.mig else MODE_HAMI_CORE,
                    "devicesplitcount": spec.split,
                    "enablenumatopology": options.numa_topology,
                    "enablegetpreferredallocation": options.preferred_allocation,
                }
            ]
        }
    )


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll an in-process predicate until true; TimeoutError naming ``what`` after ``timeout`` s."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                if predicate():
                    return
                await asyncio.sleep(_POLL_S)
    except TimeoutError:
        raise TimeoutError(f"{what}: not reached within {timeout:g}s") from None


class SimCluster:
    """The whole stack in-process; ``async with SimCluster(options) as cluster:``."""

    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self.server = ApiServer(self.options.api_host, self.options.api_port, bookmark_interval=0.5)
        self.nodes: dict[str, _Node] = {}
        self.refits: list[RefitCall] = []
        self.scheduler_restarts = 0
        self._dir: Path | None = None
        self._ca: CertificateAuthority | None = None
        self._server_cert: CertPair | None = None
        self._sched: _SchedulerProcess | None = None
        self._ports: dict[str, int] = {"extender": 0, "cluster": 0}
        self._blackhole: asyncio.Server | None = None
        self._blackhole_conns: set[asyncio.StreamWriter] = set()
        self._driver: KubeSchedulerDriver | None = None
        self._driver_task: asyncio.Task[None] | None = None
        self._driver_kube: KubeClient | None = None
        self._client: KubeClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._history: dict[str, dict[str, list[str]]] = {}
        self._unlisten: Callable[[], None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def kube(self) -> KubeClient:
        """A client of the embedded API server for callers (tests, the demo, the soak)."""
        if self._client is None:
            raise RuntimeError("the cluster is not started")
        return self._client

    @property
    def scheduler(self) -> Scheduler:
        """The running scheduler."""
        if self._sched is None:
            raise RuntimeError("the scheduler is not running")
        return self._sched.scheduler

    @property
    def cluster_url(self) -> str:
        """Base URL of the scheduler's TLS cluster listener (``/webhook``, ``/refit``)."""
        return f"https://127.0.0.1:{self._ports['cluster']}"

    @property
    def extender_url(self) -> str:
        """Base URL of the scheduler's extender (``/filter``, ``/bind``)."""
        return f"http://127.0.0.1:{self._ports['extender']}"

    @property
    def ca_file(self) -> Path:
        """The generated CA certificate (trust anchor of the server and client certificates)."""
        if self._ca is None:
            raise RuntimeError("the cluster is not started")
        return self._ca.cert_file

    async def start(self) -> None:
        """Start every component and wait until each node's GPUs are schedulable."""
        try:
            self._dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hamid-sim-"))
            await self.server.start()
            self._unlisten = self.server.add_listener(self._record_change)
            self._client = await connect(api_server=self.server.url, request_timeout=5.0)
            ca, self._server_cert = await asyncio.to_thread(self._make_certs, self._dir / "tls")
            self._ca = ca
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=10),
                connector=aiohttp.TCPConnector(ssl=client_ssl_context(ca.cert_file)),
            )
            if self.options.scheduler_unreachable:
                self._blackhole = await asyncio.start_server(self._swallow, "127.0.0.1", 0)
            await self._start_scheduler()
            if self.options.admission_webhook:
                self.server.put(self.webhook_configuration())
            for spec in self.options.nodes:
                await self._start_node(spec)
            if self.options.kube_scheduler:
                await self._start_driver()
            await self.wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def _start_driver(self) -> None:
        self._driver_kube = await connect(api_server=self.server.url, request_timeout=5.0)
        self._driver = KubeSchedulerDriver(
            self._driver_kube,
            scheduler_name=self.options.scheduler_name,
            extender_url=self.extender_url,
            initial_backoff=0.2,
            max_backoff=1.0,
        )
        self._driver_task = asyncio.create_task(self._driver.run(), name="kube-scheduler")

    @staticmethod
    def _make_certs(directory: Path) -> tuple[CertificateAuthority, CertPair]:
        ca = CertificateAuthority.create(directory, common_name="hamid sim CA")
        return ca, ca.issue_server(directory)

    async def stop(self) -> None:
        """Stop everything started (in reverse order); safe to call on a partial start."""
        if self._driver_task is not None:
            self._driver_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._driver_task
            self._driver_task = None
        self._driver = None
        for node in reversed(list(self.nodes.values())):
            await node.kubelet.stop()
            await self._stop_plugin(node)
            await node.kubelet_kube.close()
        self.nodes.clear()
        await self._stop_scheduler()
        if self._blackhole is not None:
            self._blackhole.close()
            for writer in list(self._blackhole_conns):
                writer.close()
            self._blackhole = None
        for closable in (self._driver_kube, self._client):
            if closable is not None:
                await closable.close()
        self._driver_kube = self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.server.stop()
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
            self._dir = None

    async def wait_ready(self, timeout: float = 15.0) -> None:
        """Wait until every node's kubelet has the plugin registered and the scheduler knows its GPUs."""
        for node in self.nodes.values():
            await node.kubelet.wait_registered(RESOURCE_NAME, timeout=timeout)
            count = len(node.plugin.inventory.device_infos()) if node.plugin is not None else 0
            await wait_until(
                functools.partial(self._registered, node.spec.name, count),
                timeout,
                f"scheduler sees the GPUs of {node.spec.name}",
            )

    def _registered(self, node: str, count: int) -> bool:
        entry = self._sched.scheduler.state.nodes.get(node) if self._sched is not None else None
        return entry is not None and len(entry.infos) == count and entry.allocatable_gpu > 0

    # -- scheduler ---------------------------------------------------------------------------------

    def scheduler_options(self) -> SchedulerOptions:
        """The ``hamid scheduler`` options this cluster runs with."""
        assert self._server_cert is not None and self._ca is not None
        return SchedulerOptions(
            extender_listen=f"127.0.0.1:{self._ports['extender']}",
            listen=f"127.0.0.1:{self._ports['cluster']}",
            tls_cert_file=str(self._server_cert.cert_file),
            tls_key_file=str(self._server_cert.key_file),
            client_ca_file=str(self._ca.cert_file),
            settings=SchedulerSettings(
                scheduler_name=self.options.scheduler_name,
                node_policy=self.options.node_policy,
                gpu_policy=self.options.gpu_policy,
                bind_wait_s=10.0,
            ),
            device_config=DeviceConfig(),
            api_server=self.server.url,
            device_plugin_namespace=DEVICE_PLUGIN_NAMESPACE,
            device_plugin_service_account=DEVICE_PLUGIN_SERVICE_ACCOUNT,
            refit_auth=(self.options.refit_auth,),
            refit_token_audience=DEFAULT_TOKEN_AUDIENCE,
        )

    async def _start_scheduler(self) -> None:
        options = self.scheduler_options()
        assert options.tls_cert_file and options.tls_key_file
        tls = server_ssl_context(options.tls_cert_file, options.tls_key_file, options.client_ca_file)
        kube = await connect(api_server=self.server.url, request_timeout=options.settings.api_timeout_s)
        scheduler = Scheduler(kube, options.device_config, options.settings)
        runners: list[web.AppRunner] = []
        task = asyncio.create_task(scheduler.run(), name="scheduler")
        self._sched = _SchedulerProcess(kube, scheduler, runners, task, tls)
        routes = [refit_route_factory(scheduler, options)]
        for key, app, listen, ctx in (
            ("extender", extender_app(scheduler), options.extender_listen, None),
            ("cluster", cluster_app(scheduler, routes), options.listen, tls.context),
        ):
            runner, self._ports[key] = await serve(app, listen, ctx)
            runners.append(runner)
        async with asyncio.timeout(15):
            await scheduler.pods.wait_synced()
            await scheduler.nodes.wait_synced()
            await scheduler.quotas.wait_synced()

    async def _stop_scheduler(self) -> None:
        proc, self._sched = self._sched, None
        if proc is None:
            return
        for runner in reversed(proc.runners):
            await runner.cleanup()
        proc.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await proc.task
        await proc.scheduler.close()
        await proc.kube.close()

    async def restart_scheduler(self) -> None:
        """Stop the scheduler (state lost) and start a fresh one on the same ports; waits until synced."""
        await self._stop_scheduler()
        await self._start_scheduler()
        self.scheduler_restarts += 1
        for node in self.nodes.values():
            count = len(node.plugin.inventory.device_infos()) if node.plugin is not None else 0
            await wait_until(
                functools.partial(self._registered, node.spec.name, count),
                15.0,
                f"restarted scheduler sees the GPUs of {node.spec.name}",
            )

    # -- nodes ----------------------------------------------------------------------------------

    async def _start_node(self, spec: NodeSpec) -> None:
        assert self._dir is not None
        machine = await asyncio.to_thread(load_machine_file, spec.machine_file)
        root = self._dir / spec.name / "device-plugins"
        config_file, sysfs_root = await asyncio.to_thread(
            _write_node_files, spec, machine, self._dir / spec.name
        )
        config = await asyncio.to_thread(load_kubelet_config, config_file)
        kubelet_kube = await connect(api_server=self.server.url, request_timeout=5.0)
        kubelet = SimKubelet(
            kubelet_kube,
            node_name=spec.name,
            machine=machine,
            root=root,
            config=config,
            rpc_timeout=10.0,
            status_interval=1.0,
        )
        node = _Node(
            spec, machine, root, kubelet_kube, kubelet, kubelet_config_file=config_file, sysfs_root=sysfs_root
        )
        self.nodes[spec.name] = node
        await kubelet.start()
        await self._start_plugin(node)

    async def _start_plugin(self, node: _Node) -> None:
        assert self._dir is not None and self._ca is not None
        spec = node.spec
        directory = self._dir / spec.name
        config_file = directory / "config.json"
        devices_file = directory / "devices.json"
        await asyncio.to_thread(config_file.write_text, _node_config(spec, self.options), "utf-8")
        await asyncio.to_thread(devices_file.write_text, json.dumps(node.machine.devices_document()), "utf-8")
        if node.client_cert is None:
            node.client_cert = await asyncio.to_thread(
                self._ca.issue_client, directory / "tls", f"system:node:{spec.name}"
            )
        setup = await load_setup(
            PluginOptions(
                node_name=spec.name,
                devices_file=str(devices_file),
                node_config_file=str(config_file),
                device_plugin_dir=str(node.root),
                hook_path=str(directory / "hook"),
                api_server=self.server.url,
            )
        )
        node.plugin_kube = await connect(api_server=self.server.url, request_timeout=5.0)
        handler = await self._mismatch_handler(node)
        node.plugin = Plugin(
            node.plugin_kube,
            spec.name,
            setup,
            device_plugin_dir=str(node.root),
            hook_path=str(directory / "hook"),
            mismatch_handler=self._recording(spec.name, handler),
            register_interval=1.0,
            error_interval=0.2,
            numa_sources=self._numa_sources(node),
        )
        node.plugin_task = asyncio.create_task(node.plugin.run(), name=f"plugin-{spec.name}")

    def _numa_sources(self, node: _Node) -> NumaSources | None:
        """The plugin's NUMA publisher inputs: the node's sysfs tree, kubelet config and PodResources."""
        if not self.options.numa_publish:
            return None
        return NumaSources(
            sysfs_root=str(node.sysfs_root),
            kubelet_config=str(node.kubelet_config_file),
            pod_resources_socket=str(node.kubelet.pod_resources.socket),
            interval=self.options.numa_interval,
        )

    async def _stop_plugin(self, node: _Node) -> None:
        if node.plugin_task is not None:
            node.plugin_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await node.plugin_task
            node.plugin_task = None
        if node.plugin_kube is not None:
            await node.plugin_kube.close()
            node.plugin_kube = None
        node.plugin = None

    async def _mismatch_handler(self, node: _Node) -> MismatchHandler:
        """The plugin's refit seam: the refit client when enabled, else the log-only handler."""
        if not self.options.refit:
            return make_mismatch_handler(None)
        assert node.client_cert is not None and self._ca is not None and self._dir is not None
        endpoint = self.cluster_url
        if self._blackhole is not None:
            endpoint = f"https://127.0.0.1:{self._blackhole.sockets[0].getsockname()[1]}"
        token_file: Path | None = None
        if self.options.refit_auth == "token":
            token_file = self._dir / node.spec.name / "token"
            plugin_pod = await self.kube.create_pod(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"hamid-plugin-{node.spec.name}",
                        "namespace": DEVICE_PLUGIN_NAMESPACE,
                    },
                    "spec": {
                        "nodeName": node.spec.name,
                        "serviceAccountName": DEVICE_PLUGIN_SERVICE_ACCOUNT,
                        "containers": [{"name": "plugin", "image": "hamid"}],
                    },
                }
            )
            token = f"sa-token-{node.spec.name}-{plugin_pod['metadata']['uid']}"
            self.server.register_pod_token(
                token,
                namespace=DEVICE_PLUGIN_NAMESPACE,
                pod_name=plugin_pod["metadata"]["name"],
                pod_uid=plugin_pod["metadata"]["uid"],
                service_account=DEVICE_PLUGIN_SERVICE_ACCOUNT,
                node_name=node.spec.name,
                audiences=[DEFAULT_TOKEN_AUDIENCE],  # a projected token for /refit only
            )
            await asyncio.to_thread(token_file.write_text, token, "utf-8")
        client = RefitClient(
            RefitClientConfig(
                endpoint=endpoint,
                ca_file=str(self._ca.cert_file),
                client_cert_file=None if token_file is not None else str(node.client_cert.cert_file),
                client_key_file=None if token_file is not None else str(node.client_cert.key_file),
                token_file=None if token_file is None else str(token_file),
            )
        )
        return make_mismatch_handler(client)

    def _recording(self, node: str, inner: MismatchHandler) -> MismatchHandler:
        async def handler(mismatch: NumaMismatch) -> ContainerDevices | None:
            meta = mismatch.pod.get("metadata") or {}
            call = functools.partial(
                RefitCall,
                node=node,
                pod=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                container_index=mismatch.container_index,
                annotated=tuple(d.uuid for d in mismatch.annotated),
                missing=tuple(mismatch.missing),
                allowed=tuple(mismatch.allowed_uuids),
                door=mismatch.door.value,
            )
            try:
                result = await inner(mismatch)
            except AllocationError as exc:
                self.refits.append(call(outcome="failed", error=str(exc)))
                raise
            if result is None:
                self.refits.append(call(outcome="unaligned"))
            else:
                self.refits.append(call(outcome="refitted", devices=tuple(d.uuid for d in result)))
            return result

        return handler

    async def restart_kubelet(self, node: str, timeout: float = 10.0) -> None:
        """Restart a node's kubelet (sockets wiped) and wait until the plugin has registered again."""
        sim = self.nodes[node].kubelet
        before = sim.resources[RESOURCE_NAME].registrations if RESOURCE_NAME in sim.resources else 0
        await sim.restart()
        await sim.wait_until(
            lambda: (
                sim.resources[RESOURCE_NAME].registrations > before
                and sim.resources[RESOURCE_NAME].connected
                and sim.allocatable(RESOURCE_NAME) > 0
            ),
            timeout=timeout,
            what=f"plugin re-registered with the restarted kubelet of {node}",
        )

    # -- the unreachable scheduler -------------------------------------------------------------

    async def _swallow(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Accept a connection and never answer (a scheduler that hangs)."""
        self._blackhole_conns.add(writer)
        try:
            await _reader.read()
        finally:
            self._blackhole_conns.discard(writer)
            writer.close()

    # -- pods -----------------------------------------------------------------------------------

    async def admit(self, pod: Mapping[str, Any]) -> JSON:
        """Run ``pod`` through the scheduler's mutating webhook over TLS; the mutated pod."""
        assert self._session is not None
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"review-{(pod.get('metadata') or {}).get('name', '')}",
                "namespace": (pod.get("metadata") or {}).get("namespace", "default"),
                "operation": "CREATE",
                "object": dict(pod),
            },
        }
        async with self._session.post(self.cluster_url + "/webhook", json=review) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise InvalidInput(f"webhook answered {resp.status}: {body}")
        response = body.get("response") or {}
        if not response.get("allowed"):
            raise InvalidInput(f"webhook denied the pod: {(response.get('status') or {}).get('message')}")
        if not response.get("patch"):
            return dict(pod)
        ops = json.loads(base64.b64decode(response["patch"]))
        mutated: JSON = json_patch(json.loads(json.dumps(pod)), ops)
        return mutated

    async def create_pod(self, pod: Mapping[str, Any]) -> JSON:
        """Admit ``pod`` through the webhook and create it (as the API server would)."""
        body = {"apiVersion": "v1", "kind": "Pod", **pod}
        body.setdefault("metadata", {}).setdefault("namespace", "default")
        if self.options.admission_webhook:  # the API server calls the webhook itself
            return await self.kube.create_pod(body)
        return await self.kube.create_pod(await self.admit(body))

    def webhook_configuration(self) -> JSON:
        """The chart's MutatingWebhookConfiguration, pointing at this cluster's scheduler over TLS."""
        ignore = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
        ca_pem = self.ca_file.read_bytes()
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": [
                {
                    "name": "vgpu.hami.io",
                    "admissionReviewVersions": ["v1", "v1beta1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 10,
                    "reinvocationPolicy": "Never",
                    "matchPolicy": "Equivalent",
                    "clientConfig": {
                        "url": self.cluster_url + "/webhook",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "objectSelector": ignore,
                    "namespaceSelector": ignore,
                }
            ],
        }

    def pod(self, name: str, namespace: str = "default") -> JSON:
        """The pod as stored now (raises KeyError when absent)."""
        pod = self.server.get("Pod", namespace, name)
        if pod is None:
            raise KeyError(f"pod {namespace}/{name} does not exist")
        return pod

    async def wait_pod(
        self,
        name: str,
        predicate: Callable[[JSON], bool],
        namespace: str = "default",
        timeout: float = 10.0,
        what: str = "condition",
    ) -> JSON:
        """Wait until the stored pod satisfies ``predicate``; returns it."""
        found: list[JSON] = []

        def check() -> bool:
            pod = self.server.get("Pod", namespace, name)
            if pod is not None and predicate(pod):
                found.append(pod)
                return True
            return False

        await wait_until(check, timeout, f"pod {namespace}/{name}: {what}")
        return found[0]

    async def wait_settled(self, name: str, namespace: str = "default", timeout: float = 10.0) -> JSON:
        """Wait until the pod is Running, Succeeded or Failed (admitted or rejected by its kubelet)."""
        return await self.wait_pod(
            name,
            lambda p: (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"),
            namespace,
            timeout,
            "settled (Running/Failed)",
        )

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete a pod (its kubelet releases CPUs and devices, the scheduler its reservation)."""
        await self.kube.delete_pod(namespace, name)

    async def complete_pod(self, name: str, namespace: str = "default", phase: str = "Succeeded") -> None:
        """End a running pod's containers (``Succeeded`` or ``Failed``) as its kubelet would."""
        pod = self.pod(name, namespace)
        node = (pod.get("spec") or {}).get("nodeName") or ""
        await self.nodes[node].kubelet.terminate_pod(namespace, name, phase)

    # -- readers --------------------------------------------------------------------------------

    def _record_change(self, change: Change) -> None:
        """Keep every distinct value the allocation annotations of each pod took (API server listener)."""
        if change.resource.kind != "Pod" or change.type == "DELETED":
            return
        meta = change.new.obj.get("metadata") or {}
        notes = meta.get("annotations") or {}
        history = self._history.setdefault(f"{meta.get('namespace', '')}/{meta.get('name', '')}", {})
        for key in (DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE):
            value = notes.get(key)
            values = history.setdefault(key, [])
            if value is not None and (not values or values[-1] != value):
                values.append(value)

    def annotation_history(self, name: str, key: str, namespace: str = "default") -> list[str]:
        """Every distinct value annotation ``key`` of the pod took, in order (allocation keys only)."""
        return list(self._history.get(f"{namespace}/{name}", {}).get(key, []))

    def scheduler_choice(self, name: str, namespace: str = "default") -> PodDevices | None:
        """The allocation the scheduler's filter first wrote for the pod (before any refit)."""
        values = self.annotation_history(name, DEVICES_ALLOCATED, namespace)
        return decode_pod_devices(values[0]) if values else None

    def assignment(self, name: str, namespace: str = "default") -> PodAdmission | None:
        """The kubelet's decision for the pod (CPUs, NUMA node, devices, Allocate env, or the rejection).

        Read from the pod's assignment annotation, else from its kubelet's records (rejections).
        """
        pod = self.pod(name, namespace)
        recorded = read_assignment(pod)
        if recorded is not None:
            return recorded
        node = self.nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        return None if node is None else node.kubelet.admission(namespace, name)

    def annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        """The pod's annotations."""
        return dict((self.pod(name, namespace).get("metadata") or {}).get("annotations") or {})

    def allocated(self, name: str, namespace: str = "default") -> PodDevices | None:
        """Decoded ``hami.io/vgpu-devices-allocated`` (None when absent)."""
        raw = self.annotations(name, namespace).get(DEVICES_ALLOCATED)
        return None if raw is None else decode_pod_devices(raw)

    def to_allocate(self, name: str, namespace: str = "default") -> PodDevices | None:
        """Decoded ``hami.io/vgpu-devices-to-allocate`` (None when absent)."""
        raw = self.annotations(name, namespace).get(DEVICES_TO_ALLOCATE)
        return None if raw is None else decode_pod_devices(raw)

    def events(self, name: str, namespace: str = "default", reason: str | None = None) -> list[JSON]:
        """Events whose involved object is the pod (optionally only ``reason``), oldest first."""
        out = [
            e
            for e in self.server.list("Event", namespace)
            if (e.get("involvedObject") or {}).get("name") == name
            and (reason is None or e.get("reason") == reason)
        ]
        return sorted(out, key=lambda e: int((e.get("metadata") or {}).get("resourceVersion") or 0))

    def reservation(self, name: str, namespace: str = "default") -> Reservation | None:
        """The scheduler's in-memory reservation of the pod (its accounting), if any."""
        uid = str((self.pod(name, namespace).get("metadata") or {}).get("uid") or "")
        return self.scheduler.state.reservation(uid)

    def booked_usage(self) -> GpuUsage:
        """The scheduler's accounting: per node and GPU (slots, MiB, cores), idle GPUs left out."""
        return {
            node: used
            for node, gpus in self.scheduler.state.snapshot().items()
            if (used := {u: v for u, v in gpus.items() if v != (0, 0, 0)})
        }

    def annotated_usage(self) -> GpuUsage:
        """Per node and GPU (slots, MiB, cores) summed from live pods' allocated annotations.

        A plain sum: equal to :meth:`booked_usage` while no live pod has GPU init containers.
        """
        usage: dict[str, dict[str, tuple[int, int, int]]] = {}
        for pod in self.server.list("Pod", None):
            meta = pod.get("metadata") or {}
            notes = meta.get("annotations") or {}
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or meta.get(
                "deletionTimestamp"
            ):
                continue
            raw, node = notes.get(DEVICES_ALLOCATED), notes.get(VGPU_NODE)
            if raw is None or node is None:
                continue
            gpus = usage.setdefault(node, {})
            for container in decode_pod_devices(raw):
                for d in container:
                    slots, mem, cores = gpus.get(d.uuid, (0, 0, 0))
                    gpus[d.uuid] = (slots + 1, mem + d.usedmem, cores + d.usedcores)
        return usage

    def scheduling_failures(self, name: str, namespace: str = "default") -> list[str]:
        """Errors of the kube-scheduler driver's failed attempts for the pod (unschedulable, extender)."""
        if self._driver is None:
            return []
        return [a.error for a in self._driver.attempts_for(namespace, name) if a.error]

    def refit_calls(self, name: str | None = None, namespace: str = "default") -> list[RefitCall]:
        """Refit seam calls the plugins made (for one pod when ``name`` is given)."""
        if name is None:
            return list(self.refits)
        return [r for r in self.refits if r.pod == f"{namespace}/{name}"]

    def machine(self, node: str) -> Machine:
        """The machine of a node."""
        return self.nodes[node].machine

    def gpu_numa(self, node: str) -> dict[str, int | None]:
        """GPU UUID → NUMA node on ``node``."""
        return {g.uuid: g.numa for g in self.nodes[node].machine.gpus}
