"""The kubelet configuration file (``kubelet.config.k8s.io/v1beta1`` ``KubeletConfiguration``).

The simulator reads the same file an operator writes. It models the resource-manager keys
(:data:`MODELLED_KEYS`); every other field kubelet knows is accepted and ignored; a field kubelet
does not know is refused as kubelet's strict decoding does. Validation happens here (kubelet's
``ValidateKubeletConfiguration``) and when the managers are built (:mod:`.kubelet`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from hamid.model.errors import InvalidInput
from hamidsim.kubelet.cadvisor import parse_cpu_list
from hamidsim.kubelet.cpumanager import CPU_POLICY_NONE, CPU_POLICY_STATIC
from hamidsim.kubelet.memorymanager import (
    MEMORY_POLICY_NONE,
    MemoryReservation,
    is_memory_resource,
    parse_reserved_memory,
)
from hamidsim.kubelet.quantity import parse_quantity, quantity_value
from hamidsim.kubelet.topologymanager import (
    POLICY_NONE,
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_CONTAINER,
    TOPOLOGY_POLICIES,
    TOPOLOGY_SCOPES,
)

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"
MODELLED_KEYS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "reservedSystemCPUs",
    "kubeReserved",
    "systemReserved",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "memoryManagerPolicy",
    "reservedMemory",
    "evictionHard",
    "featureGates",
    "maxPods",
)
#: Every other ``KubeletConfiguration`` field (v1beta1, 1.35): accepted, not modelled.
IGNORED_KEYS = frozenset(
    [
        "enableServer",
        "staticPodPath",
        "podLogsDir",
        "syncFrequency",
        "fileCheckFrequency",
        "httpCheckFrequency",
        "staticPodURL",
        "staticPodURLHeader",
        "address",
        "port",
        "readOnlyPort",
        "tlsCertFile",
        "tlsPrivateKeyFile",
        "tlsCipherSuites",
        "tlsCurvePreferences",
        "tlsMinVersion",
        "rotateCertificates",
        "serverTLSBootstrap",
        "authentication",
        "authorization",
        "registryPullQPS",
        "registryBurst",
        "imagePullCredentialsVerificationPolicy",
        "preloadedImagesVerificationAllowlist",
        "eventRecordQPS",
        "eventBurst",
        "enableDebuggingHandlers",
        "enableContentionProfiling",
        "healthzPort",
        "healthzBindAddress",
        "oomScoreAdj",
        "clusterDomain",
        "clusterDNS",
        "streamingConnectionIdleTimeout",
        "nodeStatusUpdateFrequency",
        "nodeStatusReportFrequency",
        "nodeLeaseDurationSeconds",
        "imageMinimumGCAge",
        "imageMaximumGCAge",
        "imageGCHighThresholdPercent",
        "imageGCLowThresholdPercent",
        "volumeStatsAggPeriod",
        "kubeletCgroups",
        "systemCgroups",
        "cgroupRoot",
        "cgroupsPerQOS",
        "cgroupDriver",
        "singleProcessOOMKill",
        "cpuManagerReconcilePeriod",
        "qosReserved",
        "runtimeRequestTimeout",
        "hairpinMode",
        "podCIDR",
        "podPidsLimit",
        "resolvConf",
        "runOnce",
        "cpuCFSQuota",
        "cpuCFSQuotaPeriod",
        "nodeStatusMaxImages",
        "maxOpenFiles",
        "contentType",
        "kubeAPIQPS",
        "kubeAPIBurst",
        "serializeImagePulls",
        "maxParallelImagePulls",
        "evictionSoft",
        "evictionSoftGracePeriod",
        "evictionPressureTransitionPeriod",
        "evictionMaxPodGracePeriod",
        "evictionMinimumReclaim",
        "mergeDefaultEvictionSettings",
        "podsPerCore",
        "enableControllerAttachDetach",
        "protectKernelDefaults",
        "makeIPTablesUtilChains",
        "iptablesMasqueradeBit",
        "iptablesDropBit",
        "failSwapOn",
        "memorySwap",
        "containerLogMaxSize",
        "containerLogMaxFiles",
        "containerLogMaxWorkers",
        "containerLogMonitorInterval",
        "configMapAndSecretChangeDetectionStrategy",
        "showHiddenMetricsForVersion",
        "systemReservedCgroup",
        "kubeReservedCgroup",
        "enforceNodeAllocatable",
        "allowedUnsafeSysctls",
        "defaultPodSysctls",
        "volumePluginDir",
        "providerID",
        "kernelMemcgNotification",
        "logging",
        "enableSystemLogHandler",
        "enableSystemLogQuery",
        "shutdownGracePeriod",
        "shutdownGracePeriodCriticalPods",
        "shutdownGracePeriodByPodPriority",
        "crashLoopBackOff",
        "enableProfilingHandler",
        "enableDebugFlagsHandler",
        "seccompDefault",
        "memoryThrottlingFactor",
        "memoryReservationPolicy",
        "registerWithTaints",
        "registerNode",
        "tracing",
        "localStorageCapacityIsolation",
        "containerRuntimeEndpoint",
        "imageServiceEndpoint",
        "failCgroupV1",
        "userNamespaces",
    ]
)


@dataclass(frozen=True)
class KubeletConfig:
    """The modelled part of a ``KubeletConfiguration`` (defaults are kubelet's)."""

    cpu_manager_policy: str = CPU_POLICY_NONE
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    #: ``reservedSystemCPUs``; None = not set (the machine file's ``reservedCpus`` then apply).
    reserved_system_cpus: frozenset[int] | None = None
    #: ``kubeReserved.cpu + systemReserved.cpu`` rounded up (kubelet's ``numReservedCPUs``).
    reserved_cpu_count: int = 0
    topology_manager_policy: str = POLICY_NONE
    topology_manager_scope: str = SCOPE_CONTAINER
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    memory_manager_policy: str = MEMORY_POLICY_NONE
    reserved_memory: tuple[MemoryReservation, ...] = ()
    #: ``kubeReserved`` + ``systemReserved`` of memory and ``hugepages-*``, in bytes per type.
    reserved_memory_types: Mapping[str, int] = field(default_factory=dict)
    #: ``evictionHard`` as given (None: unset, kubelet's defaults apply).
    eviction_hard: Mapping[str, str] | None = None
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    max_pods: int | None = None

    def with_overrides(self, **overrides: Any) -> KubeletConfig:
        """This configuration with the given fields replaced (command-line flags win over the file)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


#: What ``hamid sim kubelet`` runs without ``--config``: the seed's node prerequisites.
SIM_DEFAULTS = KubeletConfig(
    cpu_manager_policy=CPU_POLICY_STATIC, topology_manager_policy=POLICY_SINGLE_NUMA_NODE
)


def _go_quote_list(values: tuple[str, ...]) -> str:
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def _string_map(doc: Mapping[str, Any], key: str, source: str) -> dict[str, str]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInput(f'{source}: {key} must map option names to strings (quote numbers: "16")')
    return {str(k): v for k, v in value.items()}


def _reserved_cpu_count(doc: Mapping[str, Any], source: str) -> int:
    total = Fraction(0)
    for key in ("kubeReserved", "systemReserved"):
        section = doc.get(key) or {}
        if not isinstance(section, Mapping):
            raise InvalidInput(f"{source}: {key} must be a map of resource quantities")
        if "cpu" in section:
            total += parse_quantity(section["cpu"], f"{source}: {key}.cpu")
    return -((-total.numerator) // total.denominator) if total else 0


def _reserved_memory_types(doc: Mapping[str, Any], source: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for key in ("kubeReserved", "systemReserved"):
        section = doc.get(key) or {}
        for name, raw in section.items() if isinstance(section, Mapping) else ():
            if is_memory_resource(str(name)):
                total[str(name)] = total.get(str(name), 0) + quantity_value(raw, f"{source}: {key}.{name}")
    return total


def _eviction_hard(doc: Mapping[str, Any], source: str) -> dict[str, str] | None:
    value = doc.get("evictionHard")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{source}: evictionHard must map eviction signals to thresholds")
    return {str(k): str(v) for k, v in value.items()}


def _check_header(doc: Mapping[str, Any], source: str) -> None:
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise InvalidInput(
            f"{source}: want apiVersion {API_VERSION} and kind {KIND}, got "
            f"{doc.get('apiVersion')!r} / {doc.get('kind')!r}"
        )
    for key in doc:
        if key not in ("apiVersion", "kind") and key not in MODELLED_KEYS and key not in IGNORED_KEYS:
            raise InvalidInput(f'{source}: strict decoding error: unknown field "{key}"')


def parse_kubelet_config(doc: Any, source: str = "<kubelet config>") -> KubeletConfig:
    """Validate a decoded ``KubeletConfiguration`` with kubelet's own reasons."""
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{source}: expected a KubeletConfiguration mapping")
    _check_header(doc, source)
    topology_policy = str(doc.get("topologyManagerPolicy") or POLICY_NONE)
    if topology_policy not in TOPOLOGY_POLICIES:
        raise InvalidInput(
            f"invalid configuration: topologyManagerPolicy (--topology-manager-policy) {topology_policy!r} "
            f"must be one of: {_go_quote_list(TOPOLOGY_POLICIES)}".replace("'", '"')
        )
    scope = str(doc.get("topologyManagerScope") or SCOPE_CONTAINER)
    if scope not in TOPOLOGY_SCOPES:
        raise InvalidInput(
            "invalid configuration: topologyManagerScope (--topology-manager-scope) "
            f'"{scope}" must be one of: '
            f'"{TOPOLOGY_SCOPES[0]}", or "{TOPOLOGY_SCOPES[1]}"'
        )
    reserved = doc.get("reservedSystemCPUs")
    if reserved is not None and not isinstance(reserved, str):
        raise InvalidInput(f'{source}: reservedSystemCPUs is a CPU list string such as "0,64"')
    try:
        reserved_cpus = None if reserved is None else parse_cpu_list(reserved, "reservedSystemCPUs")
    except InvalidInput as exc:
        raise InvalidInput(f"unable to parse reserved-cpus list: {exc}") from exc
    gates = doc.get("featureGates") or {}
    if not isinstance(gates, Mapping) or not all(isinstance(v, bool) for v in gates.values()):
        raise InvalidInput(f"{source}: featureGates maps gate names to true or false")
    max_pods = doc.get("maxPods")
    if max_pods is not None and (
        isinstance(max_pods, bool) or not isinstance(max_pods, int) or max_pods <= 0
    ):
        raise InvalidInput(f"{source}: maxPods must be a positive integer, got {max_pods!r}")
    return KubeletConfig(
        cpu_manager_policy=str(doc.get("cpuManagerPolicy") or CPU_POLICY_NONE),
        cpu_manager_policy_options=_string_map(doc, "cpuManagerPolicyOptions", source),
        reserved_system_cpus=reserved_cpus or None,
        reserved_cpu_count=_reserved_cpu_count(doc, source),
        topology_manager_policy=topology_policy,
        topology_manager_scope=scope,
        topology_manager_policy_options=_string_map(doc, "topologyManagerPolicyOptions", source),
        memory_manager_policy=str(doc.get("memoryManagerPolicy") or MEMORY_POLICY_NONE),
        reserved_memory=parse_reserved_memory(doc.get("reservedMemory"), source),
        reserved_memory_types=_reserved_memory_types(doc, source),
        eviction_hard=_eviction_hard(doc, source),
        feature_gates={str(k): bool(v) for k, v in gates.items()},
        max_pods=max_pods,
    )


def load_kubelet_config(path: str | os.PathLike[str]) -> KubeletConfig:
    """Read and validate a kubelet config file (blocking read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read kubelet config {os.fspath(path)!r}: {exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{os.fspath(path)}: not valid YAML: {exc}") from exc
    return parse_kubelet_config(doc, os.fspath(path))
