"""Every ``hamid plugin`` option, defined once (flag, env vars, default, parser, help, checks).

Light on imports on purpose: ``hamid plugin`` parses its flags before it loads kubernetes-asyncio
(lean, see :mod:`hamid.kube.lean`), so nothing here may import the API client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from hamid.listen import OPTIONAL_LISTEN
from hamid.model import cdi
from hamid.model import nvidia_runtime as nv
from hamid.model.numa import HIDE_BUSY, HIDE_RULES
from hamid.options import Opt, OptionError, nested_field, option_field, or_none
from hamid.plugin.cdi_specs import GENERATE_SPEC, RESCAN_INTERVAL_S
from hamid.plugin.device_lists import DeviceLists, check_strategies
from hamid.plugin.device_nodes import DeviceNodes
from hamid.plugin.kubelet_config import DEFAULT_KUBELET_CONFIG
from hamid.plugin.podresources_client import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET
from hamid.plugin.refit_client import RefitClientConfig

if TYPE_CHECKING:
    from hamid.plugin.numa_publisher import NumaSources

_FILE = click.Path(dir_okay=False)

#: The ``hamid plugin`` flags of :class:`RefitClientConfig` fields (defaults: that class's).
REFIT_FLAGS = {
    "endpoint": Opt(
        "Base URL (https://...) of the scheduler's POST /refit; empty disables NUMA refit.",
        flag="--scheduler-endpoint",
        aliases=("HAMI_SCHEDULER_ENDPOINT",),
    ),
    "ca_file": Opt(
        "PEM CA bundle that verifies the scheduler [default: system roots]; unreadable is an error.",
        flag="--scheduler-ca-file",
        aliases=("HAMI_SCHEDULER_CA_FILE",),
        parse=or_none,
    ),
    "insecure": Opt(
        "Skip verifying the scheduler's certificate (logged; refused when a token would be sent).",
        flag="--scheduler-tls-insecure/--no-scheduler-tls-insecure",
        aliases=("HAMI_SCHEDULER_TLS_INSECURE",),
    ),
    "client_cert_file": Opt(
        "PEM client certificate (CN system:node:<node>) presented to /refit for mTLS.",
        flag="--scheduler-client-cert-file",
        parse=or_none,
    ),
    "client_key_file": Opt(
        "Private key of --scheduler-client-cert-file.", flag="--scheduler-client-key-file", parse=or_none
    ),
    "token_file": Opt(
        "Projected ServiceAccount token sent to /refit (TokenReview); empty sends none (mTLS only).",
        flag="--service-account-token-file",
        parse=or_none,
    ),
}


#: ``--hide-replicas`` values: ``auto`` (:data:`AUTO_HIDE_RULE` where the plugin reports NUMA
#: topology to kubelet, else off), ``off``, or a rule of :mod:`hamid.fit.replica_room`.
HIDE_CHOICES = ("auto", "off", *HIDE_RULES)
#: The rule ``auto`` applies: the one that left the fewest GPUs unallocated on the trace
#: (docs/packing.md, "Aligned LS pods with NUMA on"; the measurements: docs/packing-log.md).
AUTO_HIDE_RULE = HIDE_BUSY


def hide_rule(setting: str, numa_topology: bool) -> str | None:
    """The ``--hide-replicas`` rule in effect (None: off); ``auto`` hides where the replicas carry
    NUMA topology (kubelet aligns by replicas there, and replicas of GPUs without room mislead it)."""
    if setting == "auto":
        return AUTO_HIDE_RULE if numa_topology else None
    return setting if setting in HIDE_RULES else None


@dataclass(frozen=True, slots=True)
class Unbuilt:
    """An option of HAMi's plugin that hamid does not build. Given, as a flag or as HAMi's env var,
    with anything but the value that changes nothing, it stops the start with ``why``."""

    flag: str
    env: str
    #: The value accepted (upstream's default); None: a switch, refused when on.
    inert: str | None
    why: str


#: HAMi's plugin options near the device list strategies that are not built (its chart sets none).
UNBUILT = (
    Unbuilt(
        "--device-id-strategy",
        "DEVICE_ID_STRATEGY",
        "uuid",
        "GPUs are named by UUID (NVIDIA_VISIBLE_DEVICES, CDI devices, volume mounts); the index "
        "strategy is not built",
    ),
    Unbuilt(
        "--cdi-annotation-prefix",
        "CDI_ANNOTATION_PREFIX",
        cdi.ANNOTATION_PREFIX,
        f"CDI annotations are written under {cdi.ANNOTATION_PREFIX}, the prefix containerd and CRI-O "
        "read; another prefix is not built",
    ),
    Unbuilt("--imex-channel-ids", "IMEX_CHANNEL_IDS", "", "IMEX channels are not built"),
    Unbuilt("--imex-required", "IMEX_REQUIRED", None, "IMEX channels are not built"),
)

_C = TypeVar("_C", bound=Callable[..., Any])


def refuse_unbuilt(command: _C) -> _C:
    """Decorate ``hamid plugin`` with the :data:`UNBUILT` options (hidden), each refusing a value
    that would change something: a clear usage error instead of an unknown flag or an ignored env."""

    def refuser(unbuilt: Unbuilt) -> Callable[[click.Context, click.Parameter, Any], None]:
        def check(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
            if value is None or value is False or value == unbuilt.inert:
                return
            given = "on" if value is True else repr(value)
            raise click.BadParameter(
                f"{given} is refused: {unbuilt.why} in hamid",
                ctx=ctx,
                param_hint=f"{unbuilt.flag} (env {unbuilt.env})",
            )

        return check

    for unbuilt in reversed(UNBUILT):
        command = click.option(
            unbuilt.flag,
            envvar=unbuilt.env,
            hidden=True,
            expose_value=False,
            is_flag=unbuilt.inert is None,
            default=None,
            callback=refuser(unbuilt),
        )(command)
    return command


def _strategies(text: str) -> tuple[str, ...]:
    return check_strategies(text.split(","))


def check_spec_dirs(dirs: tuple[str, ...]) -> tuple[str, ...]:
    """The CDI spec directories given (blank entries skipped); ValueError unless each is absolute
    and there is one at least."""
    chosen = tuple(d.strip() for d in dirs if d.strip())
    relative = [d for d in chosen if not d.startswith("/")]
    if relative:
        raise ValueError(f"{', '.join(map(repr, relative))}: not an absolute path")
    if not chosen:
        raise ValueError("no directory")
    return chosen


def _spec_dirs(text: str) -> tuple[str, ...]:
    return check_spec_dirs(tuple(text.split(",")))


def _feature_help(what: str, feature: str) -> str:
    device = f"{nv.feature_kind(feature)}={nv.FEATURE_DEVICE}"
    return (
        f"Start GPU containers with {what} (HAMi's flag): {nv.FEATURE_ENVS[feature]}={nv.FEATURE_ENABLED} "
        f"unless every device list strategy is a CDI one, and the CDI device {device} with a CDI "
        "strategy (a spec must define it)."
    )


def _resource_name(text: str) -> str | None:
    if not text.strip():
        return None
    if "/" not in text:
        raise ValueError(f"{text!r} is not an extended resource name")
    return text


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """Everything ``hamid plugin`` is started with (the CLI flags)."""

    node_name: str = option_field(
        "This node's name (as in the Node object); selects its entry in the node config file.",
        aliases=["NODE_NAME"],
    )
    devices_file: str | None = option_field(
        "Static GPU inventory (YAML/JSON, top-level 'devices:' list) used instead of NVML.",
        default=None,
        type=_FILE,
        parse=or_none,
    )
    node_config_file: str = option_field(
        'HAMi per-node config JSON ({"nodeconfig":[...]}); a missing file means defaults.',
        default="/config/config.json",
    )
    device_config_file: str | None = option_field(
        "HAMi device-config YAML; its 'nvidia:' section gives resource names and node defaults.",
        default=None,
        type=_FILE,
        parse=or_none,
    )
    device_plugin_dir: str = option_field(
        "Kubelet's device-plugin directory (holds kubelet.sock and the plugin's nvidia-<name>.sock).",
        default="/var/lib/kubelet/device-plugins/",
    )
    resource_name: str | None = option_field(
        "Extended resource to advertise [default: the device config's resourceCountName, nvidia.com/gpu].",
        default=None,
        parse=_resource_name,
    )
    hook_path: str = option_field(
        "Host directory holding HAMi-core (vgpu/libvgpu.so, vgpu/ld.so.preload, per-container caches).",
        default="/usr/local",
        aliases=["HOOK_PATH"],
    )
    vgpu_feedback: bool = option_field(
        "Do what HAMi's vGPU monitor feeds back to HAMi-core every 5 s: hold a container's kernels "
        "while a higher-priority one (CUDA_TASK_PRIORITY, from nvidia.com/priority) uses its GPU, "
        "and switch its core limit on only while its GPU is shared at its priority or above "
        "(GPU_CORE_UTILIZATION_POLICY=default leaves a container alone on its GPU unthrottled).",
        default=True,
    )
    pass_device_specs: bool = option_field(
        "Declare each GPU container's device nodes to kubelet as DeviceSpecs in Allocate (rw): the "
        "control nodes that exist (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, "
        "/dev/nvidia-modeset) and /dev/nvidia<minor> of each GPU it is given, so it keeps GPU access "
        "when the runtime rebuilds its device cgroup (systemctl daemon-reload with the systemd cgroup "
        "driver). Allocate refuses a GPU whose minor number or device node is not found.",
        default=False,
        aliases=["PASS_DEVICE_SPECS"],
    )
    dev_root: str = option_field(
        "Host directory whose dev/ holds the NVIDIA device nodes, for the DeviceSpecs' host paths: / "
        "or the driver container's root (/run/nvidia/driver under the GPU Operator).",
        default="/",
        aliases=["NVIDIA_DEV_ROOT", "NVIDIA_DRIVER_ROOT"],
    )
    dev_root_ctr_path: str | None = option_field(
        "Where this process sees --dev-root: the device nodes declared are looked up under its dev/ "
        "[default: --dev-root itself].",
        default=None,
        parse=or_none,
    )
    device_list_strategy: tuple[str, ...] = option_field(
        "How Allocate names each container's booked GPUs to the container runtime (HAMi's and "
        "NVIDIA's values; repeat the flag or give a comma list): envvar (NVIDIA_VISIBLE_DEVICES=<GPU "
        "UUIDs>, read by the NVIDIA runtime), volume-mounts (NVIDIA_VISIBLE_DEVICES="
        f"{nv.VOLUME_MOUNTS_ROOT} and a mount of /dev/null per GPU UUID under it), cdi-annotations "
        f"(the container annotation {cdi.ANNOTATION_PREFIX}{nv.CDI_ANNOTATION_PLUGIN}_<id> naming the "
        f"CDI devices {nv.GPU_KIND}=<GPU UUID>), cdi-cri (the same CDI devices in the answer's CDI "
        "field; kubelet 1.29+, where DevicePluginCDIDevices is on by default). With CDI strategies "
        "only, NVIDIA_VISIBLE_DEVICES, DeviceSpecs and the feature env vars are left to the CDI "
        "spec, as upstream; HAMi-core's env and mounts "
        "always stay. CDI devices need a spec on the node (see --cdi-spec-dirs).",
        default=(nv.ENVVAR,),
        aliases=["DEVICE_LIST_STRATEGY"],
        parse=_strategies,
        show=",".join,
        repeatable=True,
    )
    cdi_spec_dirs: tuple[str, ...] = option_field(
        "The node's CDI spec directories where this process sees them, lowest priority first "
        "(comma list or repeated; mount the runtime's). hamid writes no spec: with a CDI strategy it "
        f"checks at start, at each Allocate and every {RESCAN_INTERVAL_S:g} s that a spec of kind "
        f"{nv.GPU_KIND} names every GPU by UUID ({GENERATE_SPEC} writes one); a GPU none names is "
        "reported Unhealthy until one does, and Allocate refuses a container whose CDI device no "
        "spec defines.",
        default=cdi.DEFAULT_SPEC_DIRS,
        parse=_spec_dirs,
        show=",".join,
        repeatable=True,
    )
    gdrcopy_enabled: bool = option_field(
        _feature_help("GDRCopy", nv.GDRCOPY), default=False, aliases=["GDRCOPY_ENABLED"]
    )
    gds_enabled: bool = option_field(
        _feature_help("GPUDirect Storage", nv.GDS), default=False, aliases=["GDS_ENABLED"]
    )
    mofed_enabled: bool = option_field(
        _feature_help("the MOFED (RDMA) stack", nv.MOFED), default=False, aliases=["MOFED_ENABLED"]
    )
    refit: RefitClientConfig = nested_field(RefitClientConfig, REFIT_FLAGS)
    #: host:port of /metrics, /metrics/hami, /healthz, /readyz ("" = none).
    metrics_listen: str = option_field(
        "host:port of /metrics, /metrics/hami (HAMi's vGPU monitor names), /healthz and /readyz; "
        "empty disables.",
        default=":9394",
        type=OPTIONAL_LISTEN,
    )
    #: kubelet's KubeletConfiguration file (None: no NUMA profile is published).
    kubelet_config: str | None = option_field(
        "kubelet's KubeletConfiguration file (its CPU, Topology and Memory Manager policies), for the "
        "hamid.io/numa-profile annotation; empty publishes no profile.",
        default=DEFAULT_KUBELET_CONFIG,
        parse=or_none,
    )
    pod_resources_socket: str = option_field(
        "kubelet's PodResources API socket: allocatable CPUs and what each pod holds "
        "(hamid.io/numa-profile, hamid.io/numa-placement).",
        default=DEFAULT_POD_RESOURCES_SOCKET,
    )
    sysfs_root: str = option_field(
        "Where sysfs is mounted: CPU topology and NUMA nodes (devices/system/cpu, devices/system/node).",
        default="/sys",
    )
    hide_replicas: str = option_field(
        "Report some free GPU replicas as Unhealthy to kubelet (held ones stay Healthy), so kubelet's "
        "Topology Manager aligns pods with GPUs that can take them: full (those of a GPU whose cores "
        "or memory are fully booked), busy (also those of a partly booked GPU while the node has an "
        "idle one), span (busy, and while no pod holds a replica each GPU lists one, the others left "
        "out of the list, so a pod wider than a NUMA node gets a preferred hint under restricted), "
        "steer (span, and while a pod the scheduler booked here is admitted, those on the NUMA nodes "
        "its GPUs are not on, so kubelet puts its CPUs with the GPUs the scheduler chose; under "
        "restricted, single-numa-node and best-effort, the span part under restricted only; the "
        "scheduler's bind waits for this plugin's confirmation), "
        f"off, or auto ({AUTO_HIDE_RULE} where the node config sets enablenumatopology, else off). "
        "Announced in hamid.io/numa-profile for the scheduler.",
        default="auto",
        type=click.Choice(HIDE_CHOICES),
    )
    api_server: str | None = option_field(
        "Kubernetes API server URL (overrides the kubeconfig's).", default=None, parse=or_none
    )
    kubeconfig: str | None = option_field(
        "Kubeconfig file (default: $KUBECONFIG, then in-cluster).", default=None, parse=or_none
    )

    def __post_init__(self) -> None:
        """The checks the CLI reports against the flag (the simulator and tests get them too)."""
        if not self.node_name.strip():
            raise OptionError("--node-name", "must not be empty")
        if self.hide_replicas not in HIDE_CHOICES:
            raise OptionError(
                "--hide-replicas", f"{self.hide_replicas!r} is not one of {', '.join(HIDE_CHOICES)}"
            )
        if self.resource_name is not None and "/" not in self.resource_name:
            raise OptionError("--resource-name", f"{self.resource_name!r} is not an extended resource name")
        for flag, path in (("--dev-root", self.dev_root), ("--dev-root-ctr-path", self.dev_root_ctr_path)):
            if path is not None and not path.startswith("/"):
                raise OptionError(flag, f"{path!r} is not an absolute path")
        for flag, check, value in (
            ("--device-list-strategy", check_strategies, self.device_list_strategy),
            ("--cdi-spec-dirs", check_spec_dirs, self.cdi_spec_dirs),
        ):
            try:
                check(value)
            except ValueError as exc:
                raise OptionError(flag, str(exc)) from None

    def device_lists(self) -> DeviceLists:
        """How Allocate names the GPUs to the runtime, and the features each container gets."""
        switches = (self.gdrcopy_enabled, self.gds_enabled, self.mofed_enabled)
        features = tuple(f for f, on in zip(nv.FEATURES, switches, strict=True) if on)
        return DeviceLists(self.device_list_strategy, features)

    def device_nodes(self) -> DeviceNodes | None:
        """Where the device nodes declared to kubelet are (None: ``--pass-device-specs`` is off, or
        every device list strategy is a CDI one, whose spec declares the nodes)."""
        if not self.pass_device_specs or self.device_lists().all_cdi:
            return None
        return DeviceNodes(dev_root=self.dev_root, seen_root=self.dev_root_ctr_path or self.dev_root)

    def numa_sources(self) -> NumaSources:
        """Where the NUMA publisher reads the topology, kubelet's policies and PodResources."""
        from hamid.plugin.numa_publisher import NumaSources  # the API client: after use_lean_client

        return NumaSources(
            sysfs_root=self.sysfs_root,
            kubelet_config=self.kubelet_config,
            pod_resources_socket=self.pod_resources_socket,
        )
