"""An in-process simulated cluster: the whole hamid flow in one event loop, over real sockets.

:class:`SimCluster` starts, in this order: the embedded API server; the scheduler through the
product's own :class:`~hamid.scheduler.app.SchedulerApp` (extender on loopback HTTP; cluster app
— ``/webhook``, ``/healthz``, ``/readyz``, ``/refit`` — over TLS with certificates generated at
start, client certificates verified against the same CA; the metrics app; leader election in
``campaign`` mode on its own Lease); per node a simulated kubelet (machine file, Topology Manager
policy, static CPU manager) and a ``hamid plugin`` through :class:`~hamid.plugin.app.PluginApp`
(devices file, node config with NUMA topology and preferred allocation, refit client with a node
client certificate or a projected token, metrics listener); finally the kube-scheduler driver that
sends pods with our ``schedulerName`` through ``/filter`` and ``/bind``.

Knobs (:class:`ClusterOptions`, :class:`NodeSpec`): refit enabled/disabled, refit caller
authentication (mTLS or ServiceAccount token), topology policy, MIG operating mode per node,
scheduler unreachable for the refit client (a listener that accepts and never answers), GPU and
node policies. At runtime: :meth:`SimCluster.restart_kubelet`, :meth:`SimCluster.restart_scheduler`.

Readers for tests, the demo and the soak are in :class:`~hamidsim.cluster_view.ClusterView`.
"""

# Every ``timeout`` parameter here is a deadline enforced inside with ``asyncio.timeout``.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import aiohttp
import yaml

from hamid.kube.client import KubeClient, connect
from hamid.log import get_logger
from hamid.model import objects
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, ContainerDevices
from hamid.model.errors import InvalidInput
from hamid.model.kube import JSON
from hamid.plugin.app import Plugin, PluginApp, PluginTimings
from hamid.plugin.errors import AllocationError
from hamid.plugin.numa_policy import MismatchHandler, NumaMismatch, make_mismatch_handler
from hamid.plugin.options import PluginOptions
from hamid.plugin.refit_client import RefitClientConfig
from hamid.scheduler.app import SchedulerApp
from hamid.scheduler.core import Scheduler, SchedulerSettings
from hamid.scheduler.options import (
    DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT,
    DEFAULT_NAMESPACE,
    DEFAULT_SCHEDULER_SERVICE_ACCOUNT,
    SchedulerOptions,
)
from hamid.scheduler.refit.auth import DEFAULT_TOKEN_AUDIENCE, MTLS, TOKEN
from hamid.scheduler.signing import AllocationKeys
from hamid.tls import client_ssl_context
from hamidsim.apiserver import ApiServer
from hamidsim.apiserver.kubeconfig import write_kubeconfig
from hamidsim.certs import CertificateAuthority, CertPair
from hamidsim.cluster_view import (
    WEBHOOK_CONFIGURATION,
    ClusterView,
    GpuUsage,
    RefitCall,
    wait_until,
)
from hamidsim.kube_scheduler import KubeSchedulerDriver
from hamidsim.kubelet import SimKubelet
from hamidsim.kubelet.cadvisor import format_cpu_list
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig, load_kubelet_config
from hamidsim.kubelet.topologymanager import POLICY_SINGLE_NUMA_NODE
from hamidsim.machine import Machine, load_machine_file
from hamidsim.sysfs import write_sysfs_tree

__all__ = [
    "DEMO_MACHINE",
    "DEMO_MIG_MACHINE",
    "RESOURCE_NAME",
    "WEBHOOK_CONFIGURATION",
    "ClusterOptions",
    "GpuUsage",
    "NodeSpec",
    "RefitCall",
    "SimCluster",
    "data_file",
    "kubelet_config_document",
    "wait_until",
]

log = get_logger("sim.cluster")

#: The demo node's machine file (2 NUMA nodes x 16 CPUs, 8 GPUs, 4 per NUMA node).
DEMO_MACHINE = "demo-2numa-8gpu.yaml"
#: A node with MIG-enabled GPUs (its plugin runs in ``mig`` operating mode).
DEMO_MIG_MACHINE = "demo-mig-node.yaml"
#: The device config of a MIG-mode node's plugin: the profiles of the demo's A100-SXM4-80GB it may
#: register (HAMi's chart list for the model).
MIG_DEVICE_CONFIG = {
    "nvidia": {
        "migProfileAllowlist": [
            {"models": ["A100-SXM4-80GB"], "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]}
        ]
    }
}
RESOURCE_NAME = "nvidia.com/gpu"
#: The scheduler's decision settings the simulator starts from: the product's, except binds wait less.
SCHEDULER_SETTINGS = SchedulerSettings(bind_wait_s=10.0)
#: The Lease the simulated cluster's scheduler campaigns for (kube-system).
SIM_LEASE_NAME = "hamid-sim-scheduler"
#: How long the simulated components wait for the API server and each other.
_CALL_TIMEOUT_S = 5.0
#: The simulator's loops run faster than the product's (registration retried within a second).
_PLUGIN_TIMINGS = PluginTimings(register_interval=1.0, error_interval=0.2)


def data_file(name: str) -> Path:
    """Path of a file shipped in ``sim/hamidsim/data/``."""
    return Path(str(resources.files("hamidsim") / "data" / name))


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated node: its machine file, Topology Manager policy and operating mode."""

    name: str
    machine_file: str | Path = field(default_factory=lambda: data_file(DEMO_MACHINE))
    topology_policy: str = POLICY_SINGLE_NUMA_NODE
    mig: bool = False
    split: int = 10
    #: The node's KubeletConfiguration (None: the simulator's defaults); ``topology_policy`` overrides it.
    kubelet_config: KubeletConfig | None = None


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """How the simulated cluster is wired (see the module docs)."""

    nodes: tuple[NodeSpec, ...] = (NodeSpec("node-1"),)
    refit: bool = True
    refit_auth: str = MTLS
    scheduler_unreachable: bool = False
    gpu_policy: str = SCHEDULER_SETTINGS.gpu_policy
    node_policy: str = SCHEDULER_SETTINGS.node_policy
    scheduler_name: str = SCHEDULER_SETTINGS.scheduler_name
    numa_topology: bool = True
    preferred_allocation: bool = True
    #: The plugins' ``--hide-replicas`` (auto: the default rule with ``numa_topology``).
    hide_replicas: str = "auto"
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
        if self.refit_auth not in (MTLS, TOKEN):
            raise InvalidInput(f"refit_auth must be 'mtls' or 'token', got {self.refit_auth!r}")


@dataclass
class SimNode:
    """One simulated node's files, kubelet and (while running) its plugin."""

    spec: NodeSpec
    machine: Machine
    directory: Path
    kubelet_kube: KubeClient
    kubelet: SimKubelet
    #: The kubelet config file both the simulated kubelet and the plugin read.
    kubelet_config_file: Path
    sysfs_root: Path
    plugin_app: PluginApp | None = None
    client_cert: CertPair | None = None

    @property
    def root(self) -> Path:
        """kubelet's device-plugin directory."""
        return self.directory / "device-plugins"

    @property
    def plugin(self) -> Plugin | None:
        """The node's running plugin (None while stopped)."""
        return self.plugin_app.plugin if self.plugin_app is not None else None


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
    if config.reserved_memory_types:
        doc["systemReserved"] = {
            kind: str(value) for kind, value in sorted(config.reserved_memory_types.items())
        }
    if config.eviction_hard is not None:
        doc["evictionHard"] = dict(config.eviction_hard)
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


class SimCluster(ClusterView):
    """The whole stack in-process; ``async with SimCluster(options) as cluster:``."""

    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options: ClusterOptions = options or ClusterOptions()
        self.server = ApiServer(self.options.api_host, self.options.api_port, bookmark_interval=0.5)
        self.nodes: dict[str, SimNode] = {}
        self.refits: list[RefitCall] = []
        self.scheduler_restarts = 0
        self._dir: Path | None = None
        self._ca: CertificateAuthority | None = None
        self._server_cert: CertPair | None = None
        self._app: SchedulerApp | None = None
        self._ports: dict[str, int] = {"extender": 0, "cluster": 0, "metrics": 0}
        self._blackhole: asyncio.Server | None = None
        self._blackhole_conns: set[asyncio.StreamWriter] = set()
        self._driver: KubeSchedulerDriver | None = None
        self._driver_task: asyncio.Task[None] | None = None
        self._driver_kube: KubeClient | None = None
        self._client: KubeClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._history: dict[str, dict[str, list[str]]] = {}
        self._unlisten: Callable[[], None] | None = None
        #: The scheduler's allocation key ring: one per cluster, kept across scheduler restarts.
        self.allocation_keys = AllocationKeys.generate()

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
        if self._app is None:
            raise RuntimeError("the scheduler is not running")
        return self._app.scheduler

    @property
    def cluster_url(self) -> str:
        """Base URL of the scheduler's TLS cluster listener (``/webhook``, ``/refit``)."""
        return f"https://127.0.0.1:{self._ports['cluster']}"

    @property
    def extender_url(self) -> str:
        """Base URL of the scheduler's extender (``/filter``, ``/bind``)."""
        return f"http://127.0.0.1:{self._ports['extender']}"

    @property
    def metrics_url(self) -> str:
        """Base URL of the scheduler's metrics listener (``/metrics``, ``/metrics/hami``)."""
        return f"http://127.0.0.1:{self._ports['metrics']}"

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
            self._client = await connect(api_server=self.server.url, request_timeout=_CALL_TIMEOUT_S)
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

    @staticmethod
    def _make_certs(directory: Path) -> tuple[CertificateAuthority, CertPair]:
        ca = CertificateAuthority.create(directory, common_name="hamid sim CA")
        return ca, ca.issue_server(directory)

    def identity_kubeconfig(self, name: str, username: str, groups: tuple[str, ...] = ()) -> str:
        """A kubeconfig whose bearer token the API server authenticates as ``username``.

        Each component talks to the API server as its own identity (as on a real cluster), so
        admission sees who changes what: the scheduler's and the plugin's ServiceAccounts, the
        kubelets' nodes, kube-scheduler; :attr:`kube` (tests, tenants) stays anonymous.
        """
        assert self._dir is not None
        token = f"sim-{name}-{secrets.token_hex(8)}"
        self.server.register_token(token, username, groups=(*groups, "system:authenticated"))
        return str(write_kubeconfig(self._dir / "kubeconfigs" / f"{name}.yaml", self.server.url, token))

    def _service_account_kubeconfig(self, name: str) -> str:
        username = f"system:serviceaccount:{DEFAULT_NAMESPACE}:{name}"
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{DEFAULT_NAMESPACE}")
        return self.identity_kubeconfig(name, username, groups)

    async def _start_driver(self) -> None:
        """kube-scheduler: sends our pods through the extender's ``/filter`` and ``/bind``."""
        self._driver_kube = await connect(
            api_server=self.server.url,
            kubeconfig=self.identity_kubeconfig("kube-scheduler", "system:kube-scheduler"),
            request_timeout=_CALL_TIMEOUT_S,
        )
        self._driver = KubeSchedulerDriver(
            self._driver_kube,
            scheduler_name=self.options.scheduler_name,
            extender_url=self.extender_url,
            initial_backoff=0.2,
            max_backoff=1.0,
        )
        self._driver_task = asyncio.create_task(self._driver.run(), name="kube-scheduler")

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
        for closable in (self._driver_kube, self._client, self._session):
            if closable is not None:
                await closable.close()
        self._driver_kube = self._client = self._session = None
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
        await self._wait_gpus_known(timeout, "scheduler sees the GPUs of")

    async def _wait_gpus_known(self, timeout: float, what: str) -> None:
        for node in self.nodes.values():
            count = len(node.plugin.inventory.device_infos()) if node.plugin is not None else 0
            await wait_until(
                functools.partial(self._registered, node.spec.name, count),
                timeout,
                f"{what} {node.spec.name}",
            )

    def _registered(self, node: str, count: int) -> bool:
        entry = self._app.scheduler.ledger.nodes.get(node) if self._app is not None else None
        return entry is not None and len(entry.infos) == count and entry.allocatable_gpu > 0

    # -- scheduler ---------------------------------------------------------------------------------

    def scheduler_options(self) -> SchedulerOptions:
        """The ``hamid scheduler`` options this cluster runs with (the same ports across restarts)."""
        assert self._server_cert is not None and self._ca is not None
        return SchedulerOptions(
            extender_listen=f"127.0.0.1:{self._ports['extender']}",
            listen=f"127.0.0.1:{self._ports['cluster']}",
            metrics_listen=f"127.0.0.1:{self._ports['metrics']}",
            tls_cert_file=str(self._server_cert.cert_file),
            tls_key_file=str(self._server_cert.key_file),
            client_ca_file=str(self._ca.cert_file),
            settings=dataclasses.replace(
                SCHEDULER_SETTINGS,
                scheduler_name=self.options.scheduler_name,
                node_policy=self.options.node_policy,
                gpu_policy=self.options.gpu_policy,
            ),
            # one replica campaigning for its own Lease: the leader-election path of a real start
            leader_elect=True,
            leader_elect_mode="campaign",
            leader_elect_name=SIM_LEASE_NAME,
            leader_elect_retry_period_s=0.5,
            leader_identity="hamid-sim",
            api_server=self.server.url,
            kubeconfig=self._service_account_kubeconfig(DEFAULT_SCHEDULER_SERVICE_ACCOUNT),
            refit_auth=(self.options.refit_auth,),
            allocation_keys=self.allocation_keys,
        )

    async def _start_scheduler(self, lead: bool = True) -> None:
        """Start the scheduler app; wait until its caches synced (and, with ``lead``, it decides)."""
        app = SchedulerApp(self.scheduler_options())
        self._app = app
        self._ports.update(await app.start())
        await app.wait_synced()
        if lead:
            await wait_until(lambda: not app.scheduler.not_ready_reason(), 15.0, "the scheduler is ready")

    async def hand_over_scheduler(self, taken: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
        """Stop the scheduler (it releases its Lease to another replica), wait until ``taken()``
        says the other replica leads, and start it again as a follower: HA runs with a second
        scheduler on :data:`SIM_LEASE_NAME`. (Restarting at once would race the other replica for
        the released Lease.)"""
        await self._stop_scheduler()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not await taken():
            if loop.time() > deadline:
                raise TimeoutError(f"no other replica took the released Lease within {within:g}s")
            await asyncio.sleep(0.05)
        await self._start_scheduler(lead=False)
        self.scheduler_restarts += 1

    async def _stop_scheduler(self) -> None:
        app, self._app = self._app, None
        if app is not None:
            await app.stop()

    async def restart_scheduler(self) -> None:
        """Stop the scheduler (state lost) and start a fresh one on the same ports; waits until synced."""
        await self._stop_scheduler()
        await self._start_scheduler()
        self.scheduler_restarts += 1
        await self._wait_gpus_known(15.0, "restarted scheduler sees the GPUs of")

    # -- nodes ----------------------------------------------------------------------------------

    async def _start_node(self, spec: NodeSpec) -> None:
        assert self._dir is not None
        directory = self._dir / spec.name
        machine = await asyncio.to_thread(load_machine_file, spec.machine_file)
        config_file, sysfs_root = await asyncio.to_thread(_write_node_files, spec, machine, directory)
        config = await asyncio.to_thread(load_kubelet_config, config_file)
        kubelet_kube = await connect(
            api_server=self.server.url,
            kubeconfig=self.identity_kubeconfig(
                f"kubelet-{spec.name}", f"system:node:{spec.name}", ("system:nodes",)
            ),
            request_timeout=_CALL_TIMEOUT_S,
        )
        kubelet = SimKubelet(
            kubelet_kube,
            node_name=spec.name,
            machine=machine,
            root=directory / "device-plugins",
            config=config,
            rpc_timeout=10.0,
            status_interval=1.0,
        )
        node = SimNode(spec, machine, directory, kubelet_kube, kubelet, config_file, sysfs_root)
        self.nodes[spec.name] = node
        await kubelet.start()
        await self._start_plugin(node)

    async def _start_plugin(self, node: SimNode) -> None:
        """``hamid plugin`` on the node: its files written, then the product's own start-up."""
        assert self._ca is not None
        spec, directory = node.spec, node.directory
        config_file, devices_file = directory / "config.json", directory / "devices.json"
        await asyncio.to_thread(config_file.write_text, _node_config(spec, self.options), "utf-8")
        await asyncio.to_thread(devices_file.write_text, json.dumps(node.machine.devices_document()), "utf-8")
        device_config: Path | None = None
        if spec.mig:
            device_config = directory / "device-config.yaml"
            await asyncio.to_thread(device_config.write_text, yaml.safe_dump(MIG_DEVICE_CONFIG), "utf-8")
        if node.client_cert is None:
            node.client_cert = await asyncio.to_thread(
                self._ca.issue_client, directory / "tls", f"system:node:{spec.name}"
            )
        options = PluginOptions(
            node_name=spec.name,
            devices_file=str(devices_file),
            node_config_file=str(config_file),
            device_config_file=None if device_config is None else str(device_config),
            device_plugin_dir=str(node.root),
            hook_path=str(directory / "hook"),
            refit=await self._refit_config(node),
            metrics_listen="127.0.0.1:0",
            kubelet_config=str(node.kubelet_config_file),
            pod_resources_socket=str(node.kubelet.pod_resources.socket),
            sysfs_root=str(node.sysfs_root),
            hide_replicas=self.options.hide_replicas,
            api_server=self.server.url,
            kubeconfig=self._service_account_kubeconfig(DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT),
        )
        node.plugin_app = PluginApp(
            options,
            # refit disabled: the log-only policy as such (no refit client is built, none logged)
            mismatch_handler=None if self.options.refit else make_mismatch_handler(None),
            wrap_mismatch=functools.partial(self._recording, spec.name),
            timings=dataclasses.replace(_PLUGIN_TIMINGS, numa_interval=self.options.numa_interval),
            numa=self.options.numa_publish,
        )
        await node.plugin_app.start()

    async def _stop_plugin(self, node: SimNode) -> None:
        app, node.plugin_app = node.plugin_app, None
        if app is not None:
            await app.stop()

    async def _refit_config(self, node: SimNode) -> RefitClientConfig:
        """The plugin's refit flags: disabled, mTLS with the node certificate, or a projected token."""
        if not self.options.refit:
            return RefitClientConfig(endpoint="")
        assert node.client_cert is not None and self._ca is not None
        endpoint = self.cluster_url
        if self._blackhole is not None:
            endpoint = f"https://127.0.0.1:{self._blackhole.sockets[0].getsockname()[1]}"
        if self.options.refit_auth == TOKEN:
            token_file = await self._plugin_token(node)
            return RefitClientConfig(
                endpoint=endpoint, ca_file=str(self._ca.cert_file), token_file=token_file
            )
        return RefitClientConfig(
            endpoint=endpoint,
            ca_file=str(self._ca.cert_file),
            client_cert_file=str(node.client_cert.cert_file),
            client_key_file=str(node.client_cert.key_file),
            token_file=None,
        )

    async def _plugin_token(self, node: SimNode) -> str:
        """A device-plugin pod on the node and its projected /refit token, written to a file."""
        plugin_pod = await self.kube.create_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"hamid-plugin-{node.spec.name}", "namespace": DEFAULT_NAMESPACE},
                "spec": {
                    "nodeName": node.spec.name,
                    "serviceAccountName": DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT,
                    "containers": [{"name": "plugin", "image": "hamid"}],
                },
            }
        )
        token = f"sa-token-{node.spec.name}-{objects.uid(plugin_pod)}"
        self.server.register_pod_token(
            token,
            namespace=DEFAULT_NAMESPACE,
            pod_name=objects.name(plugin_pod),
            pod_uid=objects.uid(plugin_pod),
            service_account=DEFAULT_DEVICE_PLUGIN_SERVICE_ACCOUNT,
            node_name=node.spec.name,
            audiences=[DEFAULT_TOKEN_AUDIENCE],  # a projected token for /refit only
        )
        token_file = node.directory / "token"
        await asyncio.to_thread(token_file.write_text, token, "utf-8")
        return str(token_file)

    def _recording(self, node: str, inner: MismatchHandler) -> MismatchHandler:
        """``inner``, recording every mismatch and its outcome in :attr:`refits`."""

        async def handler(mismatch: NumaMismatch) -> ContainerDevices | None:
            call = functools.partial(
                RefitCall,
                node=node,
                pod=objects.namespaced_key(mismatch.pod),
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
