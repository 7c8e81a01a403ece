"""Assembly of ``hamid plugin``: setup, the wired :class:`Plugin`, and :class:`PluginApp` that starts it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hamid.kube.client import KubeClient, connect
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.devices import MODE_MIG
from hamid.model.errors import InvalidInput
from hamid.model.gpulinks import GpuLinks
from hamid.model.mig import AllowedMigProfiles
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.model.numa import HIDE_STEER
from hamid.model.resources import DeviceConfig, ResourceConfig, load_device_config
from hamid.plugin.allocator import CALL_TIMEOUT_S, Allocator
from hamid.plugin.cachedirs import CLEANUP_INTERVAL_S, CacheDirCleaner
from hamid.plugin.cdi_health import CdiHealth
from hamid.plugin.cdi_specs import RESCAN_INTERVAL_S, CdiSpecs
from hamid.plugin.device_lists import DeviceLists
from hamid.plugin.device_nodes import DeviceNodes
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
from hamid.plugin.hamicore_answer import HamiCoreSettings
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.kubelet_connector import KubeletConnector
from hamid.plugin.metrics import PluginMetrics, serve_metrics
from hamid.plugin.mig_manager import RECONCILE_INTERVAL_S, MigManager
from hamid.plugin.numa_policy import MismatchHandler, log_mismatch, make_mismatch_handler
from hamid.plugin.numa_publisher import NumaPublisher, NumaSources
from hamid.plugin.options import PluginOptions, hide_rule
from hamid.plugin.pods import NodePods
from hamid.plugin.refit_client import RefitClient, build_refit_client
from hamid.plugin.register import ERROR_INTERVAL_S, REGISTER_INTERVAL_S, NodeRegistrar
from hamid.plugin.replica_room import ReplicaRoom
from hamid.plugin.service import DevicePluginService
from hamid.plugin.steering import LockSteering
from hamid.plugin.vgpu_feedback import VgpuFeedback

log = get_logger("plugin")


class PluginStartupError(Exception):
    """The plugin cannot start; the message says why and what to do (no traceback)."""


@dataclass(frozen=True, slots=True)
class PluginTimings:
    """How often the node agent's loops run: the product's defaults; the simulator and tests go faster."""

    register_interval: float = REGISTER_INTERVAL_S
    error_interval: float = ERROR_INTERVAL_S
    cleanup_interval: float = CLEANUP_INTERVAL_S
    #: Age below which a cache directory is never removed (None: the cleaner's default).
    cleanup_min_age: float | None = None
    #: The NUMA publisher's PodResources poll period (None: the publisher's default).
    numa_interval: float | None = None
    #: How often a ``mig`` mode node reconciles its MIG instances with its active pods.
    mig_interval: float = RECONCILE_INTERVAL_S
    #: How often the CDI spec directories are read for the GPUs' health (with a CDI strategy).
    cdi_interval: float = RESCAN_INTERVAL_S


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
    #: the device config's ``migProfileAllowlist`` (what a ``mig`` mode node may register)
    mig_allowlist: tuple[AllowedMigProfiles, ...] = ()


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
        log.info("node_config_absent_using_defaults", path=options.node_config_file)
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
            log.error("gpu_links_unreadable_score_not_written", error=str(exc))
    resource_name = options.resource_name or device_config.resources.resource_count_name
    return NodeSetup(
        config,
        device_config.resources,
        resource_name,
        tuple(gpus),
        nvml,
        links,
        device_config.mig_profile_allowlist,
    )


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
        hide_replicas: str | None = None,
        vgpu_feedback: bool = True,
        device_nodes: DeviceNodes | None = None,
        device_lists: DeviceLists | None = None,
        cdi_specs: CdiSpecs | None = None,
        mig_interval: float = RECONCILE_INTERVAL_S,
        cdi_interval: float = RESCAN_INTERVAL_S,
    ) -> None:
        self.setup = setup
        self.inventory = GpuInventory(setup.gpus, setup.config, setup.mig_allowlist)
        #: Reports the GPUs no CDI spec names unhealthy (None: no CDI strategy).
        self.cdi: CdiHealth | None = None
        if cdi_specs is not None:
            self.cdi = CdiHealth(
                cdi_specs, device_lists or DeviceLists(), self.inventory, interval=cdi_interval
            )
        self.pods = NodePods(client, node_name, call_timeout=CALL_TIMEOUT_S)
        #: Owns the MIG instances of a ``mig`` mode node (None: another mode, or no NVML).
        self.mig: MigManager | None = None
        if self.inventory.is_mig and setup.nvml is not None:
            self.mig = MigManager(
                setup.nvml,
                self.inventory.mig,
                self.pods.fetch_pods,
                resource_name=setup.resource_name,
                interval=mig_interval,
                retry=error_interval,
            )
        #: Hides free replicas from kubelet by the ``--hide-replicas`` rule; None: off.
        self.room: ReplicaRoom | None = None
        if hide_replicas is not None and not self.inventory.is_mig:
            self.room = ReplicaRoom(
                self.inventory, self.pods.pods, setup.resource_name, hide_replicas, self._topology_policy
            )
            self.room.watch(self.pods.pod_cache)
            self.inventory.on_health_change = self.room.sync  # at once: one list per change
        self.cleaner = CacheDirCleaner(
            self.pods, hook_path, interval=cleanup_interval, min_age=cleanup_min_age
        )
        #: HAMi's vGPU monitor feedback (priority, the ``default`` core policy); None: off.
        self.feedback: VgpuFeedback | None = None
        if vgpu_feedback:
            self.feedback = VgpuFeedback(hook_path, self.pods.pods)
        self.health_policy = health_policy or HealthCheckPolicy()
        preferred = setup.config.enable_get_preferred_allocation
        self.allocator = self._allocator(
            client, hook_path, mismatch_handler, device_nodes, device_lists, cdi_specs
        )
        self.service = DevicePluginService(self.inventory, self.allocator, preferred_allocation=preferred)
        #: The ``steer`` handshake with the scheduler's /bind (None: another rule).
        self.steering: LockSteering | None = None
        if self.room is not None and self.room.rule == HIDE_STEER:
            self.steering = LockSteering(self.pods, self.room, self.service.sent)
        self.metrics = PluginMetrics(
            self.inventory, hook_path=hook_path, nvml=setup.nvml, node_name=node_name
        )
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
        self.metrics.mig = self.mig
        self.numa: NumaPublisher | None = None
        if numa_sources is not None:
            self.numa = NumaPublisher(
                client,
                self.pods,
                numa_sources,
                resource_name=setup.resource_name,
                preferred_allocation=preferred,
                on_prediction=self.metrics.numa_prediction,
                on_held=self.room.listed if self.room is not None else None,
                hide_rule=self.room.rule if self.room is not None else None,
                on_profile=self._profile_set,
            )

    def _allocator(
        self,
        client: KubeClient,
        hook_path: str,
        mismatch_handler: MismatchHandler,
        device_nodes: DeviceNodes | None,
        device_lists: DeviceLists | None,
        cdi_specs: CdiSpecs | None,
    ) -> Allocator:
        """Allocate's rules with this node's HAMi-core settings (from its node config)."""
        config = self.setup.config
        hami = HamiCoreSettings(
            hook_path=hook_path,
            oversubscribe=config.device_memory_scaling > 1,
            log_level=config.lib_cuda_log_level or "",
            disable_core_limit=self.setup.resources.disable_core_limit,
        )
        return Allocator(
            client,
            self.pods,
            self.inventory,
            hami,
            resource_name=self.setup.resource_name,
            mismatch_handler=mismatch_handler,
            preferred_allocation=config.enable_get_preferred_allocation,
            on_allocated=self.room.allocated if self.room is not None else None,
            device_nodes=device_nodes,
            device_lists=device_lists,
            cdi_specs=cdi_specs,
            on_cdi_scan=self.cdi.apply if self.cdi is not None else None,
            mig=self.mig,
        )

    async def run(self) -> None:
        """Run every task until cancelled (zero GPUs: keep running, register nothing)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.pods.run())
            if self.room is not None:
                tg.create_task(self._judge_room_once_synced(self.room))
            if not self.inventory.gpus:
                log.warning("no_gpus_to_advertise", cause="none discovered, or all filtered/MIG-enabled")
                return
            if self.mig is not None:  # before kubelet can call Allocate
                await self.mig.start()
                tg.create_task(self.mig.run())
            if self.cdi is not None:  # before kubelet and the scheduler see the GPUs' health
                await self.cdi.start()
                tg.create_task(self.cdi.run())
            tg.create_task(self.registrar.run())
            tg.create_task(self.connector.run())
            if self.steering is not None:
                tg.create_task(self.steering.run())
            tg.create_task(self.cleaner.run())
            if self.feedback is not None:
                tg.create_task(self.feedback.run())
            if self.numa is not None:
                tg.create_task(self.numa.run())
            if self.setup.nvml is not None and self.health_policy.active:
                tg.create_task(self._watch_health(self.setup.nvml))

    def _profile_set(self) -> None:
        """The published profile was set: the rule in effect (``span``, ``steer`` only under
        ``restricted``) is judged again, and the steering looks at the node lock again."""
        if self.room is not None:
            self.room.poke()
        if self.steering is not None:
            self.steering.poke()

    def _topology_policy(self) -> str | None:
        """kubelet's Topology Manager policy as this plugin last published it (None: not yet)."""
        profile = self.numa.profile if self.numa is not None else None
        return profile.policies.topology_manager_policy if profile is not None else None

    async def _judge_room_once_synced(self, room: ReplicaRoom) -> None:
        """Judge the hidden replicas once the pod cache listed the node's pods: a node without pods
        sends no event, and ``span`` lists its GPUs one replica each only then."""
        await self.pods.wait_synced()
        room.sync()

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
                "xid_watcher_failed_no_health_checks",
                error=f"{type(exc).__name__}: {exc}",
            )
        finally:
            stop.set()


class PluginApp:
    """The one composition root of ``hamid plugin``: :meth:`start` → bound ports, :meth:`stop`.

    The CLI, the simulator and the test harnesses all start the node agent here: the refit client
    the options describe, setup (device and node config, GPU discovery), the API client, the wired
    :class:`Plugin` and its metrics and health listener. Collaborators a caller owns are passed at
    construction: the API client (``kube``, left open), an already discovered ``setup``, the
    ``mismatch_handler`` (instead of the refit client) or ``wrap_mismatch`` (decorates the handler,
    e.g. to record every mismatch), the XID ``health_policy`` (default: from the environment, as
    NVIDIA's plugin reads it), ``timings``, and ``numa`` (False: no NUMA publisher).
    """

    def __init__(
        self,
        options: PluginOptions,
        *,
        kube: KubeClient | None = None,
        setup: NodeSetup | None = None,
        mismatch_handler: MismatchHandler | None = None,
        wrap_mismatch: Callable[[MismatchHandler], MismatchHandler] | None = None,
        health_policy: HealthCheckPolicy | None = None,
        timings: PluginTimings | None = None,
        numa: bool = True,
    ) -> None:
        self.options = options
        #: Bound ports by listener: ``metrics`` (absent when ``metrics_listen`` is empty).
        self.ports: dict[str, int] = {}
        self._kube = kube
        self._owns_kube = kube is None
        self._setup = setup
        self._mismatch_handler = mismatch_handler
        self._wrap_mismatch = wrap_mismatch
        self._health_policy = health_policy
        self._timings = timings or PluginTimings()
        self._numa = numa
        self._refit_client: RefitClient | None = None
        self._cdi_specs: CdiSpecs | None = None
        self._plugin: Plugin | None = None
        self._task: asyncio.Task[None] | None = None
        self._listeners = contextlib.AsyncExitStack()

    @property
    def plugin(self) -> Plugin:
        """The running node agent (after :meth:`start`)."""
        if self._plugin is None:
            raise RuntimeError("the plugin app is not started")
        return self._plugin

    async def start(self) -> dict[str, int]:
        """Configure, discover, connect, wire, serve metrics and start the tasks; the bound ports.

        Raises :class:`PluginStartupError` (or :class:`~hamid.listen.ListenError`) with one line
        saying what to change; whatever was started is stopped first.
        """
        try:
            handler = self._mismatch_handler or self._refit_handler()
            if self._wrap_mismatch is not None:
                handler = self._wrap_mismatch(handler)
            setup = self._setup or await load_setup(self.options)
            policy = self._health_policy or _policy_from_env()
            _log_configured(self.options, setup)
            _check_mig(self.options, setup)
            await _check_device_nodes(self.options.device_nodes(), setup)
            self._cdi_specs = _cdi_specs_of(self.options)
            if self._kube is None:
                self._kube = await _connect(self.options)
            self._plugin = plugin = self._wire(self._kube, setup, handler, policy)
            port = await self._listeners.enter_async_context(
                serve_metrics(plugin.metrics, self.options.metrics_listen)
            )
            if port is not None:
                self.ports["metrics"] = port
            self._task = asyncio.create_task(plugin.run(), name=f"plugin-{self.options.node_name}")
        except BaseException:
            await self.stop()
            raise
        return dict(self.ports)

    def _refit_handler(self) -> MismatchHandler:
        """The refit seam the options describe (the log-only policy when refit is disabled)."""
        try:
            self._refit_client = build_refit_client(self.options.refit)
        except InvalidInput as exc:
            raise PluginStartupError(str(exc)) from exc
        return make_mismatch_handler(self._refit_client)

    def _wire(
        self, kube: KubeClient, setup: NodeSetup, handler: MismatchHandler, policy: HealthCheckPolicy
    ) -> Plugin:
        options, timings = self.options, self._timings
        sources = options.numa_sources() if self._numa else None
        if sources is not None and timings.numa_interval is not None:
            sources = dataclasses.replace(sources, interval=timings.numa_interval)
        plugin = Plugin(
            kube,
            options.node_name,
            setup,
            device_plugin_dir=options.device_plugin_dir,
            hook_path=options.hook_path,
            mismatch_handler=handler,
            register_interval=timings.register_interval,
            error_interval=timings.error_interval,
            health_policy=policy,
            cleanup_interval=timings.cleanup_interval,
            cleanup_min_age=timings.cleanup_min_age,
            numa_sources=sources,
            hide_replicas=hide_rule(options.hide_replicas, setup.config.enable_numa_topology),
            vgpu_feedback=options.vgpu_feedback,
            device_nodes=options.device_nodes(),
            device_lists=options.device_lists(),
            cdi_specs=self._cdi_specs,
            mig_interval=timings.mig_interval,
            cdi_interval=timings.cdi_interval,
        )
        if self._refit_client is not None:
            self._refit_client.observer = plugin.metrics.observe_refit
        return plugin

    async def wait_synced(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109  # a deadline inside
        """Wait until the node's pod cache applied its first list."""
        async with asyncio.timeout(timeout):
            await self.plugin.pods.wait_synced()

    async def wait(self) -> None:
        """Serve until cancelled (a task that fails raises here)."""
        if self._task is None:
            raise RuntimeError("the plugin app is not started")
        await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop the tasks and the metrics listener; close the API client if this app opened it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._listeners.aclose()
        if self._kube is not None and self._owns_kube:
            await self._kube.close()
            self._kube = None
        self._plugin = None


def _policy_from_env() -> HealthCheckPolicy:
    try:
        return health_policy_from_env(os.environ)
    except InvalidInput as exc:
        raise PluginStartupError(str(exc)) from exc


def _check_mig(options: PluginOptions, setup: NodeSetup) -> None:
    """A ``mig`` mode node answers Allocate with MIG UUIDs of instances made at that moment: a CDI
    spec generated before names none of them, so only the envvar and volume-mounts strategies
    serve (HAMi's plugin would name CDI devices no spec defines). Without NVML (a devices file)
    nothing can be created: logged, Allocate refuses."""
    if setup.config.operating_mode != MODE_MIG:
        return
    if options.device_lists().any_cdi:
        raise PluginStartupError(
            "--device-list-strategy: dynamic MIG (operatingmode mig) names MIG devices created at "
            "Allocate, which no CDI spec defines; use envvar or volume-mounts on this node"
        )
    if setup.nvml is None:
        log.error("mig_mode_without_nvml_allocate_refuses", hint="dynamic MIG creates instances through NVML")


async def _check_device_nodes(nodes: DeviceNodes | None, setup: NodeSetup) -> None:
    """With ``--pass-device-specs``: the device directory must be visible (else no Allocate could
    be served), and GPUs without a minor number are named now, not first at their Allocate."""
    if nodes is None:
        return
    problem = await asyncio.to_thread(nodes.check_root)
    if problem is not None:
        raise PluginStartupError(f"--pass-device-specs: {problem}")
    unknown = [g.uuid for g in setup.gpus if g.minor is None]
    if unknown:
        log.error("gpu_minor_unknown_allocate_refuses", uuids=unknown, option="--pass-device-specs")


def _cdi_specs_of(options: PluginOptions) -> CdiSpecs | None:
    """With a CDI device list strategy: the spec directories (first read when the plugin runs:
    :class:`~hamid.plugin.cdi_health.CdiHealth`, then again at each Allocate and periodically)."""
    lists = options.device_lists()
    if options.pass_device_specs and lists.all_cdi:
        log.warning(
            "pass_device_specs_ignored",
            reason="every device list strategy is a CDI one: the CDI spec declares the device nodes",
        )
    return CdiSpecs(options.cdi_spec_dirs) if lists.any_cdi else None


async def _connect(options: PluginOptions) -> KubeClient:
    try:
        return await connect(options.api_server, options.kubeconfig)
    except KubeError as exc:
        raise PluginStartupError(str(exc)) from exc


def _log_configured(options: PluginOptions, setup: NodeSetup) -> None:
    log.info(
        "plugin_configured",
        node=options.node_name,
        gpus=len(setup.gpus),
        mode=setup.config.operating_mode,
        split=setup.config.device_split_count,
        numa_topology=setup.config.enable_numa_topology,
        preferred_allocation=setup.config.enable_get_preferred_allocation,
        hide_replicas=hide_rule(options.hide_replicas, setup.config.enable_numa_topology) or "off",
        resource=setup.resource_name,
        source="devices-file" if options.devices_file else "nvml",
        pass_device_specs=options.pass_device_specs,
        device_list_strategy=",".join(options.device_list_strategy),
        features=list(options.device_lists().features),
    )


async def run_plugin(options: PluginOptions) -> None:
    """Start ``hamid plugin`` and run until cancelled."""
    app = PluginApp(options)
    try:
        await app.start()
        await app.wait()
    finally:
        await app.stop()
