"""Assembly of ``hamid plugin``: configuration, discovery, and the tasks of one node agent."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from hamid.kube.client import KubeClient, connect
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.model.gpulinks import GpuLinks
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.model.resources import DeviceConfig, ResourceConfig, load_device_config
from hamid.plugin.allocator import CALL_TIMEOUT_S, Allocator
from hamid.plugin.allocator_rules import HamiCoreSettings
from hamid.plugin.cachedirs import CLEANUP_INTERVAL_S, CacheDirCleaner
from hamid.plugin.discovery import (
    HealthCheckPolicy,
    NvmlTopologyError,
    NvmlUnavailable,
    PhysicalGpu,
    discover_nvml,
    discover_nvml_links,
    health_policy_from_env,
    import_nvml,
    load_devices_inventory,
    watch_xid_events,
)
from hamid.plugin.inventory import Inventory
from hamid.plugin.kubelet_connector import KubeletConnector
from hamid.plugin.metrics import PluginMetrics, serve_metrics
from hamid.plugin.numa_policy import MismatchHandler, log_mismatch, make_mismatch_handler
from hamid.plugin.numa_publisher import DEFAULT_KUBELET_CONFIG, NumaPublisher, NumaSources
from hamid.plugin.podresources_client import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET
from hamid.plugin.pods import NodePods
from hamid.plugin.refit_client import RefitClientConfig, build_refit_client
from hamid.plugin.register import ERROR_INTERVAL_S, REGISTER_INTERVAL_S, NodeRegistrar
from hamid.plugin.service import DevicePluginService

log = get_logger("plugin")


class PluginStartupError(Exception):
    """The plugin cannot start; the message says why and what to do (no traceback)."""


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """Everything ``hamid plugin`` is started with (the CLI flags)."""

    node_name: str
    devices_file: str | None = None
    node_config_file: str = "/config/config.json"
    device_config_file: str | None = None
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins/"
    resource_name: str | None = None
    hook_path: str = "/usr/local"
    api_server: str | None = None
    kubeconfig: str | None = None
    sysfs_root: str = "/sys"
    refit: RefitClientConfig = field(default_factory=RefitClientConfig)
    #: host:port of /metrics, /metrics/hami, /healthz, /readyz ("" = none).
    metrics_listen: str = ""
    #: kubelet's KubeletConfiguration file (None: no NUMA profile is published).
    kubelet_config: str | None = DEFAULT_KUBELET_CONFIG
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET

    def numa_sources(self) -> NumaSources:
        """Where the NUMA publisher reads the topology, kubelet's policies and PodResources."""
        return NumaSources(
            sysfs_root=self.sysfs_root,
            kubelet_config=self.kubelet_config,
            pod_resources_socket=self.pod_resources_socket,
        )


@dataclass(frozen=True, slots=True)
class NodeSetup:
    """Resolved configuration and discovered GPUs of this node."""

    config: NodeConfig
    resources: ResourceConfig
    resource_name: str
    gpus: tuple[PhysicalGpu, ...]
    nvml: ModuleType | None
    #: links between the GPUs (NVML, or the devices file's ``links``); None: no pair scores
    links: GpuLinks | None = None


def _read_optional(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


async def load_setup(options: PluginOptions) -> NodeSetup:
    """Read the device config and node config, discover GPUs (all blocking work in threads)."""
    device_config = DeviceConfig()
    if options.device_config_file:
        try:
            text = await asyncio.to_thread(Path(options.device_config_file).read_text, encoding="utf-8")
            device_config = load_device_config(text)
        except (OSError, UnicodeDecodeError, InvalidInput) as exc:
            raise PluginStartupError(f"--device-config-file {options.device_config_file}: {exc}") from exc
    try:
        node_json = await asyncio.to_thread(_read_optional, options.node_config_file)
        config = resolve_node_config(node_json, options.node_name, device_config.node_defaults)
    except (OSError, InvalidInput) as exc:
        raise PluginStartupError(f"--node-config-file {options.node_config_file}: {exc}") from exc
    if node_json is None:
        log.info("no node config file; using defaults", path=options.node_config_file)
    nvml: ModuleType | None = None
    links: GpuLinks | None = None
    if options.devices_file:
        try:
            inventory = await asyncio.to_thread(load_devices_inventory, options.devices_file)
        except (OSError, InvalidInput) as exc:
            raise PluginStartupError(f"--devices-file {options.devices_file}: {exc}") from exc
        gpus, links = list(inventory.gpus), inventory.links
    else:
        try:
            nvml = await asyncio.to_thread(import_nvml)
            gpus = await asyncio.to_thread(discover_nvml, options.sysfs_root, nvml)
        except NvmlUnavailable as exc:
            raise PluginStartupError(
                f"NVML is not available ({exc}); run on a node with the NVIDIA driver, "
                "or pass --devices-file with a static inventory"
            ) from exc
        try:
            links = await asyncio.to_thread(discover_nvml_links, gpus, nvml)
        except NvmlTopologyError as exc:
            log.error("GPU links unreadable; hami.io/node-nvidia-score is not written", error=str(exc))
    resource_name = options.resource_name or device_config.resources.resource_count_name
    return NodeSetup(config, device_config.resources, resource_name, tuple(gpus), nvml, links)


class Plugin:
    """The parts of one node agent, wired together; :meth:`run` owns their tasks."""

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        setup: NodeSetup,
        *,
        device_plugin_dir: str,
        hook_path: str,
        mismatch_handler: MismatchHandler = log_mismatch,
        register_interval: float = REGISTER_INTERVAL_S,
        error_interval: float = ERROR_INTERVAL_S,
        health_policy: HealthCheckPolicy | None = None,
        cleanup_interval: float = CLEANUP_INTERVAL_S,
        cleanup_min_age: float | None = None,
        numa_sources: NumaSources | None = None,
    ) -> None:
        self.setup = setup
        config = setup.config
        self.inventory = Inventory(setup.gpus, config)
        self.pods = NodePods(client, node_name, call_timeout=CALL_TIMEOUT_S)
        self.cleaner = CacheDirCleaner(
            self.pods, hook_path, interval=cleanup_interval, min_age=cleanup_min_age
        )
        self.health_policy = health_policy or HealthCheckPolicy()
        hami = HamiCoreSettings(
            hook_path=hook_path,
            oversubscribe=config.device_memory_scaling > 1,
            log_level=config.lib_cuda_log_level or "",
            disable_core_limit=setup.resources.disable_core_limit,
        )
        preferred = config.enable_get_preferred_allocation
        self.allocator = Allocator(
            client,
            self.pods,
            self.inventory,
            hami,
            resource_name=setup.resource_name,
            mismatch_handler=mismatch_handler,
            preferred_allocation=preferred,
        )
        self.service = DevicePluginService(self.inventory, self.allocator, preferred_allocation=preferred)
        self.metrics = PluginMetrics(self.inventory, hook_path=hook_path)
        self.connector = KubeletConnector(
            lambda: [self.metrics.instrument(self.service)],
            device_plugin_dir,
            setup.resource_name,
            preferred_allocation=preferred,
        )
        self.registrar = NodeRegistrar(
            client,
            self.pods,
            self.inventory,
            links=setup.links,
            interval=register_interval,
            error_interval=error_interval,
        )
        self.metrics.attach(self.connector, self.registrar, self.pods)
        self.numa: NumaPublisher | None = None
        if numa_sources is not None:
            self.numa = NumaPublisher(
                client,
                self.pods,
                numa_sources,
                resource_name=setup.resource_name,
                on_prediction=self.metrics.numa_prediction,
            )

    async def run(self) -> None:
        """Run every task until cancelled (zero GPUs: keep running, register nothing)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.pods.run())
            if not self.inventory.gpus:
                log.warning(
                    "no GPUs to advertise on this node (none discovered, or all filtered/MIG-enabled); "
                    "not registering with kubelet or the scheduler"
                )
                return
            tg.create_task(self.registrar.run())
            tg.create_task(self.connector.run())
            tg.create_task(self.cleaner.run())
            if self.numa is not None:
                tg.create_task(self.numa.run())
            if self.setup.nvml is not None and self.health_policy.active:
                tg.create_task(self._watch_health(self.setup.nvml))

    async def _watch_health(self, nvml: ModuleType) -> None:
        """The XID watcher; its failure disables health checks only, never serving or registration."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def report(uuid: str, reason: str) -> None:
            loop.call_soon_threadsafe(self.inventory.mark_unhealthy, uuid, reason)

        uuids = [g.uuid for g in self.inventory.gpus]
        try:
            await asyncio.to_thread(
                watch_xid_events, uuids, report, stop, self.health_policy, nvml, on_xid=self.metrics.xid
            )
        except Exception as exc:
            log.error(
                "XID health watcher failed; serving without GPU health checks",
                error=f"{type(exc).__name__}: {exc}",
            )
        finally:
            stop.set()


async def run_plugin(options: PluginOptions) -> None:
    """Start ``hamid plugin`` and run until cancelled."""
    try:
        refit_client = build_refit_client(options.refit)
    except InvalidInput as exc:
        raise PluginStartupError(str(exc)) from exc
    setup = await load_setup(options)
    try:
        policy = health_policy_from_env(os.environ)
    except InvalidInput as exc:
        raise PluginStartupError(str(exc)) from exc
    log.info(
        "plugin configured",
        node=options.node_name,
        gpus=len(setup.gpus),
        mode=setup.config.operating_mode,
        split=setup.config.device_split_count,
        numa_topology=setup.config.enable_numa_topology,
        preferred_allocation=setup.config.enable_get_preferred_allocation,
        resource=setup.resource_name,
        source="devices-file" if options.devices_file else "nvml",
    )
    try:
        client = await connect(options.api_server, options.kubeconfig)
    except KubeError as exc:
        raise PluginStartupError(str(exc)) from exc
    try:
        plugin = Plugin(
            client,
            options.node_name,
            setup,
            device_plugin_dir=options.device_plugin_dir,
            hook_path=options.hook_path,
            mismatch_handler=make_mismatch_handler(refit_client),
            health_policy=policy,
            numa_sources=options.numa_sources(),
        )
        if refit_client is not None:
            refit_client.observer = plugin.metrics.observe_refit
        async with serve_metrics(plugin.metrics, options.metrics_listen):
            await plugin.run()
    finally:
        await client.close()
