"""`hamid doctor`: check a node's prerequisites for NUMA alignment, line by line.

Each check yields a :class:`Finding` (OK / WARN / FAIL / SKIP, what was seen, how to fix it).
The command exits 1 when any finding is FAIL, i.e. when something blocks NUMA alignment.
"""

from __future__ import annotations

import asyncio
import enum
import os
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import click
import yaml

from hamid.model._wire import load_yaml
from hamid.model.devices import MODE_HAMI_CORE
from hamid.model.errors import InvalidInput
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.model.numa import SINGLE_NUMA_NODE
from hamid.model.quantity import parse_quantity
from hamid.model.resources import load_device_config
from hamid.options import option
from hamid.plugin.discovery import NvmlUnavailable, PhysicalGpu, discover_nvml, load_devices_file
from hamid.plugin.kubelet_config import DEFAULT_KUBELET_CONFIG
from hamid.tls import client_ssl_context

#: kubelet's default ``max-allowable-numa-nodes`` (``defaultMaxAllowableNUMANodes``).
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8
MAX_ALLOWABLE_NUMA_NODES_OPTION = "max-allowable-numa-nodes"
#: Budget of the scheduler ``/healthz`` probe (connect + answer).
ENDPOINT_TIMEOUT_S = 3.0
_NUMA_NODE_DIR = re.compile(r"node(\d+)\Z")


class Status(enum.Enum):
    """Outcome of one check; only FAIL makes the command exit non-zero."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report: what was checked, what was found and how to fix it."""

    status: Status
    check: str
    message: str
    fix: str = ""

    def render(self) -> str:
        """``STATUS check: message`` plus an indented ``fix:`` line when there is one."""
        line = f"{self.status.value:<4}  {self.check}: {self.message}"
        return f"{line}\n      fix: {self.fix}" if self.fix else line


def _ok(check: str, message: str) -> Finding:
    return Finding(Status.OK, check, message)


def _warn(check: str, message: str, fix: str = "") -> Finding:
    return Finding(Status.WARN, check, message, fix)


def _fail(check: str, message: str, fix: str) -> Finding:
    return Finding(Status.FAIL, check, message, fix)


# --- kubelet ------------------------------------------------------------------------------------


def load_kubelet_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a KubeletConfiguration file (YAML or JSON); :class:`InvalidInput` when unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read kubelet config {os.fspath(path)!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"kubelet config {os.fspath(path)!r} is not UTF-8 (byte offset {exc.start}: {exc.reason})"
        ) from None
    doc = load_yaml(text, f"kubelet config {os.fspath(path)!r}")
    if not isinstance(doc, dict):
        raise InvalidInput(f"kubelet config {os.fspath(path)!r} is not a mapping")
    return doc


def _cpu_reservation(config: Mapping[str, Any]) -> str:
    """The kubelet setting that reserves CPUs ("" when none does)."""
    if str(config.get("reservedSystemCPUs") or "").strip():
        return "reservedSystemCPUs"
    for key in ("kubeReserved", "systemReserved"):
        reserved = config.get(key)
        if isinstance(reserved, Mapping) and _positive_quantity(reserved.get("cpu")):
            return f"{key}.cpu"
    return ""


def _positive_quantity(value: object) -> bool:
    """Whether ``value`` is a quantity above zero (``"0m"`` and ``"0.0"`` reserve nothing)."""
    try:
        return value is not None and parse_quantity(value, "cpu") > 0
    except InvalidInput:
        return False


def check_kubelet(config: Mapping[str, Any]) -> list[Finding]:
    """The four kubelet settings NUMA alignment needs (seed: "Node prerequisites")."""
    kind = config.get("kind")
    findings = (
        []
        if kind == "KubeletConfiguration"
        else [
            _warn(
                "kubelet config",
                f"kind is {kind!r}, not 'KubeletConfiguration'",
                "point --kubelet-config at the file kubelet reads (its --config flag)",
            )
        ]
    )
    checks = (_check_cpu_manager, _check_cpu_reservation, _check_topology_policy, _check_topology_scope)
    return [*findings, *(check(config) for check in checks)]


def _check_cpu_manager(config: Mapping[str, Any]) -> Finding:
    policy = config.get("cpuManagerPolicy", "none")
    if policy == "static":
        return _ok("kubelet cpuManagerPolicy", "static")
    return _fail(
        "kubelet cpuManagerPolicy",
        f"is {policy!r}: CPUs give the Topology Manager no NUMA hints",
        "set cpuManagerPolicy: static (drain, stop kubelet, remove "
        "/var/lib/kubelet/cpu_manager_state, start kubelet)",
    )


def _check_cpu_reservation(config: Mapping[str, Any]) -> Finding:
    setting = _cpu_reservation(config)
    if setting:
        return _ok("kubelet CPU reservation", f"{setting} is set")
    return _fail(
        "kubelet CPU reservation",
        "no CPU reservation (reservedSystemCPUs, kubeReserved.cpu or systemReserved.cpu); "
        "the static CPU manager refuses to start without one",
        'set reservedSystemCPUs, e.g. "0,1"',
    )


def _check_topology_policy(config: Mapping[str, Any]) -> Finding:
    policy = config.get("topologyManagerPolicy", "none")
    if policy == SINGLE_NUMA_NODE:
        return _ok("kubelet topologyManagerPolicy", SINGLE_NUMA_NODE)
    if policy in ("best-effort", "restricted"):
        return _warn(
            "kubelet topologyManagerPolicy",
            f"is {policy!r}: CPUs and GPUs are not guaranteed to share one NUMA node",
            f"set topologyManagerPolicy: {SINGLE_NUMA_NODE}",
        )
    return _fail(
        "kubelet topologyManagerPolicy",
        f"is {policy!r}: kubelet never restricts GPU replicas to the CPUs' NUMA node",
        f"set topologyManagerPolicy: {SINGLE_NUMA_NODE}",
    )


def _check_topology_scope(config: Mapping[str, Any]) -> Finding:
    scope = config.get("topologyManagerScope", "container")
    if scope == "container":
        return _ok("kubelet topologyManagerScope", "container")
    return _warn(
        "kubelet topologyManagerScope",
        f"is {scope!r}: hamid aligns and refits each container on its own",
        "set topologyManagerScope: container",
    )


def max_allowable_numa_nodes(config: Mapping[str, Any]) -> int:
    """kubelet's ``max-allowable-numa-nodes`` policy option (default 8); InvalidInput if malformed."""
    options = config.get("topologyManagerPolicyOptions") or {}
    if not isinstance(options, Mapping):
        raise InvalidInput("topologyManagerPolicyOptions is not a mapping")
    raw = options.get(MAX_ALLOWABLE_NUMA_NODES_OPTION)
    if raw is None:
        return DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    try:
        return int(str(raw).strip())
    except ValueError:
        raise InvalidInput(
            f"{MAX_ALLOWABLE_NUMA_NODES_OPTION} is {raw!r}, not an integer (kubelet will not start)"
        ) from None


def count_numa_nodes(sysfs_root: str | os.PathLike[str] = "/sys") -> int | None:
    """NUMA nodes of this machine from ``<sysfs>/devices/system/node/node<N>`` (None if unreadable)."""
    try:
        names = os.listdir(Path(sysfs_root, "devices", "system", "node"))
    except OSError:
        return None
    count = sum(1 for name in names if _NUMA_NODE_DIR.match(name))
    return count or None


def check_numa_count(config: Mapping[str, Any] | None, numa_nodes: int | None) -> list[Finding]:
    """NUMA node count against kubelet's ``max-allowable-numa-nodes``."""
    check = "NUMA nodes"
    if numa_nodes is None:
        return [_warn(check, "cannot count NUMA nodes (no /sys/devices/system/node)", "run on the node")]
    if numa_nodes == 1:
        return [_warn(check, "1 NUMA node: nothing to align on this machine")]
    if config is None:
        return [_ok(check, f"{numa_nodes} (limit not checked without a kubelet config)")]
    try:
        limit = max_allowable_numa_nodes(config)
    except InvalidInput as exc:
        return [_fail(check, str(exc), f'set {MAX_ALLOWABLE_NUMA_NODES_OPTION}: "16" (a quoted integer)')]
    if numa_nodes > limit:
        return [
            _fail(
                check,
                f"{numa_nodes} NUMA nodes exceed max-allowable-numa-nodes {limit}: kubelet refuses to "
                "start the Topology Manager",
                f'set topologyManagerPolicyOptions: {{{MAX_ALLOWABLE_NUMA_NODES_OPTION}: "{numa_nodes}"}}',
            )
        ]
    return [_ok(check, f"{numa_nodes} (max-allowable-numa-nodes {limit})")]


# --- GPUs ---------------------------------------------------------------------------------------


def check_gpus(gpus: Sequence[PhysicalGpu], numa_nodes: int | None) -> list[Finding]:
    """GPUs whose NUMA node is unknown (their replicas carry no topology) and MIG-mode GPUs."""
    check = "GPU NUMA"
    if not gpus:
        return [_fail("GPUs", "no GPU found", "check the NVIDIA driver (nvidia-smi) or --devices-file")]
    findings = [_ok("GPUs", f"{len(gpus)} found")]
    unknown = [g for g in gpus if g.numa is None]
    single_node = numa_nodes is not None and numa_nodes <= 1
    if not unknown:
        per_node: dict[int, int] = {}
        for gpu in gpus:
            if gpu.numa is not None:
                per_node[gpu.numa] = per_node.get(gpu.numa, 0) + 1
        layout = ", ".join(f"node {n}: {c}" for n, c in sorted(per_node.items()))
        findings.append(_ok(check, f"every GPU has a NUMA node ({layout})"))
    elif single_node:
        findings.append(_warn(check, f"{len(unknown)} GPU(s) with unknown NUMA node on a 1-NUMA machine"))
    else:
        names = ", ".join(f"{g.index}:{g.uuid}" for g in unknown)
        fix = "enable NUMA in the BIOS (ACPI SRAT) so /sys/bus/pci/devices/<bdf>/numa_node is not -1"
        if len(unknown) == len(gpus):
            findings.append(_fail(check, f"no GPU has a known NUMA node ({names})", fix))
        else:
            findings.append(
                _warn(check, f"unknown NUMA node for {names}: their replicas are never aligned", fix)
            )
    mig = [g for g in gpus if g.mig_enabled]
    if mig:
        names = ", ".join(f"{g.index}:{g.uuid}" for g in mig)
        findings.append(_warn("GPU MIG", f"MIG mode on {names}: MIG GPUs take no part in NUMA refit"))
    sick = [g for g in gpus if not g.healthy]
    if sick:
        names = ", ".join(f"{g.index}:{g.uuid}" for g in sick)
        findings.append(
            _warn("GPU health", f"unhealthy: {names}", "check nvidia-smi and the kernel log (XID)")
        )
    return findings


# --- plugin node config -------------------------------------------------------------------------


def check_node_config(config: NodeConfig, node_name: str, has_entry: bool) -> list[Finding]:
    """The per-node plugin settings NUMA alignment needs (seed: ``nodeConfiguration.config``)."""
    entry = "devicePlugin.nodeConfiguration.config entry" + f' "name": "{node_name}"'
    findings: list[Finding] = []
    if not has_entry:
        findings.append(
            _warn("node config", f"no entry for node {node_name!r}: defaults apply", f"add a {entry}")
        )
    if config.operating_mode == MODE_HAMI_CORE:
        findings.append(_ok("node config operatingmode", MODE_HAMI_CORE))
    else:
        findings.append(
            _fail(
                "node config operatingmode",
                f"is {config.operating_mode!r}: only hami-core nodes take part in NUMA alignment",
                f'set "operatingmode": "hami-core" in the {entry}',
            )
        )
    switches = (
        ("enablenumatopology", config.enable_numa_topology, _fail, "replicas report no NUMA node to kubelet"),
        (
            "enablegetpreferredallocation",
            config.enable_get_preferred_allocation,
            _warn,
            "the plugin gives kubelet no preferred allocation: kubelet picks replicas itself, so more "
            "pods are refitted (at Allocate)",
        ),
    )
    for key, value, finding, why in switches:
        if value:
            findings.append(_ok(f"node config {key}", "true"))
        else:
            findings.append(
                finding(f"node config {key}", f"is false: {why}", f'set "{key}": true in the {entry}')
            )
    return findings


def _has_node_entry(config_json: str, node_name: str) -> bool:
    try:
        entries = yaml.safe_load(config_json).get("nodeconfig") or []
    except (yaml.YAMLError, AttributeError):
        return False
    return any(isinstance(e, Mapping) and e.get("name") == node_name for e in entries)


# --- scheduler endpoint -------------------------------------------------------------------------


def _os_reason(exc: aiohttp.ClientConnectorError) -> str:
    """The OS-level reason of a connection failure (aiohttp's own text embeds the SSLContext repr)."""
    error = exc.os_error
    return error.strerror or str(error) if isinstance(error, OSError) else str(error)


async def probe_endpoint(
    endpoint: str, ssl_context: ssl.SSLContext | None, timeout_s: float = ENDPOINT_TIMEOUT_S
) -> Finding:
    """``GET <endpoint>/healthz`` within ``timeout_s``; OK only on HTTP 200."""
    check = "scheduler endpoint"
    url = endpoint.rstrip("/") + "/healthz"
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, ssl=ssl_context or True, allow_redirects=False) as resp,
        ):
            status = resp.status
    except aiohttp.ClientConnectorCertificateError as exc:
        return _fail(
            check,
            f"{url}: the server certificate is not trusted ({exc.certificate_error})",
            "pass --scheduler-ca-file with the scheduler's CA (ConfigMap <fullname>-scheduler-ca)",
        )
    except aiohttp.ClientSSLError as exc:
        return _fail(
            check, f"{url}: TLS failed ({_os_reason(exc)})", "check the scheduler's certificate and the CA"
        )
    except TimeoutError:
        return _fail(
            check, f"{url}: no answer within {timeout_s:g}s", "check the scheduler pod, Service and DNS"
        )
    except aiohttp.ClientConnectorError as exc:
        return _fail(
            check,
            f"{url}: cannot connect to {exc.host}:{exc.port} ({_os_reason(exc)})",
            "check the scheduler pod, Service, DNS and network policy",
        )
    except aiohttp.ClientError as exc:
        return _fail(check, f"{url}: {exc}", "check the scheduler pod, Service, DNS and network policy")
    if status != 200:
        return _fail(check, f"{url} answered HTTP {status}", "check the scheduler's log")
    return _ok(check, f"{url} answered 200")


# --- the command ----------------------------------------------------------------------------------


def _kubelet_findings(path: str) -> tuple[dict[str, Any] | None, list[Finding]]:
    try:
        config = load_kubelet_config(path)
    except InvalidInput as exc:
        return None, [_fail("kubelet config", str(exc), "pass --kubelet-config with kubelet's config file")]
    return config, [_ok("kubelet config", path), *check_kubelet(config)]


def _gpu_findings(devices_file: str | None, sysfs_root: str, numa_nodes: int | None) -> list[Finding]:
    if devices_file:
        try:
            gpus = load_devices_file(devices_file)
        except (InvalidInput, OSError) as exc:
            return [_fail("GPUs", f"cannot use devices file: {exc}", "fix the devices file")]
    else:
        try:
            gpus = discover_nvml(sysfs_root)
        except NvmlUnavailable as exc:
            return [_warn("GPUs", f"not checked: {exc}", "run on the GPU node, or pass --devices-file")]
    return check_gpus(gpus, numa_nodes)


def _node_config_findings(
    path: str | None, device_config: str | None, node_name: str | None
) -> list[Finding]:
    if not path:
        return [Finding(Status.SKIP, "node config", "not checked (pass --node-config-file and --node-name)")]
    if not node_name:
        return [
            _fail("node config", "--node-config-file needs --node-name", "pass --node-name (or NODE_NAME)")
        ]
    defaults = NodeConfig()
    if device_config:
        try:
            defaults = load_device_config(Path(device_config).read_text(encoding="utf-8")).node_defaults
        except (InvalidInput, OSError, UnicodeDecodeError) as exc:
            fix = "fix the chart's devices.nvidia values"
            return [_fail("device config", f"{device_config}: {exc}", fix)]
    try:
        text = Path(path).read_text(encoding="utf-8")
        config = resolve_node_config(text, node_name, defaults)
    except (InvalidInput, OSError, UnicodeDecodeError) as exc:
        return [_fail("node config", str(exc), "fix devicePlugin.nodeConfiguration.config")]
    return check_node_config(config, node_name, _has_node_entry(text, node_name))


def _endpoint_finding(endpoint: str | None, ca_file: str | None) -> Finding:
    if not endpoint:
        return Finding(Status.SKIP, "scheduler endpoint", "not checked (pass --scheduler-endpoint)")
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 -- raises for a port that is no number or out of range
    except ValueError as exc:
        return _fail("scheduler endpoint", f"{endpoint!r} is not a URL: {exc}", "pass https://<host>:<port>")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return _fail(
            "scheduler endpoint", f"{endpoint!r} is not an http(s) URL", "pass https://<host>:<port>"
        )
    if parts.scheme != "https":
        return _fail(
            "scheduler endpoint",
            f"{endpoint} is plain HTTP: the plugin sends its ServiceAccount token only over verified "
            "TLS (it refuses to start with this endpoint and a token), and nothing verifies the scheduler",
            "use the https:// endpoint with --scheduler-ca-file",
        )
    try:
        context = client_ssl_context(ca_file) if endpoint.startswith("https:") else None
    except InvalidInput as exc:
        return _fail("scheduler endpoint", str(exc), "pass a readable PEM CA bundle as --scheduler-ca-file")
    return asyncio.run(probe_endpoint(endpoint, context))


def run_checks(
    kubelet_config: str,
    devices_file: str | None = None,
    node_config_file: str | None = None,
    device_config_file: str | None = None,
    node_name: str | None = None,
    scheduler_endpoint: str | None = None,
    scheduler_ca_file: str | None = None,
    sysfs_root: str = "/sys",
) -> list[Finding]:
    """Every doctor check, in report order (blocking: reads files, NVML, one HTTP probe)."""
    config, findings = _kubelet_findings(kubelet_config)
    numa_nodes = count_numa_nodes(sysfs_root)
    findings += check_numa_count(config, numa_nodes)
    findings += _gpu_findings(devices_file, sysfs_root, numa_nodes)
    findings += _node_config_findings(node_config_file, device_config_file, node_name)
    findings.append(_endpoint_finding(scheduler_endpoint, scheduler_ca_file))
    return findings


def blocking(findings: Iterable[Finding]) -> bool:
    """Whether any finding blocks NUMA alignment."""
    return any(f.status is Status.FAIL for f in findings)


@click.command("doctor")
@option(
    "--kubelet-config",
    default=DEFAULT_KUBELET_CONFIG,
    help="kubelet's KubeletConfiguration file (cpuManagerPolicy, Topology Manager settings).",
)
@option(
    "--devices-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Static GPU inventory (YAML/JSON `devices:` list) instead of NVML discovery.",
)
@option(
    "--node-config-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="The plugin's node config JSON (devicePlugin.nodeConfiguration.config; the plugin reads "
    "it at /config/config.json). Not checked without it.",
)
@option(
    "--device-config-file",
    default=None,
    help="HAMi device config YAML whose nvidia: node defaults apply under the node config.",
)
@option(
    "--node-name",
    aliases=["NODE_NAME"],
    default=None,
    help="This node's name (selects the node config entry).",
)
@option(
    "--scheduler-endpoint",
    aliases=["HAMI_SCHEDULER_ENDPOINT"],
    default=None,
    help="Scheduler base URL the plugin's refit uses; GET <url>/healthz must answer 200.",
)
@option(
    "--scheduler-ca-file",
    aliases=["HAMI_SCHEDULER_CA_FILE"],
    default=None,
    help="PEM CA bundle to verify the scheduler's certificate (default: system roots).",
)
@option("--sysfs-root", default="/sys", help="Where sysfs is mounted (NUMA nodes, GPU NUMA affinity).")
def doctor_command(
    kubelet_config: str,
    devices_file: str | None,
    node_config_file: str | None,
    device_config_file: str | None,
    node_name: str | None,
    scheduler_endpoint: str | None,
    scheduler_ca_file: str | None,
    sysfs_root: str,
) -> None:
    """Check whether NUMA alignment can work on this node; exit 1 when something blocks it.

    \b
    Checks, one line each (OK / WARN / FAIL / SKIP, with how to fix):
      kubelet: cpuManagerPolicy static, a CPU reservation, topologyManagerPolicy
               single-numa-node, topologyManagerScope container
      NUMA node count vs kubelet's max-allowable-numa-nodes (default 8)
      GPUs (NVML or --devices-file) whose NUMA node is unknown
      plugin node config: operatingmode hami-core, enablenumatopology, enablegetpreferredallocation
      the scheduler endpoint answers GET /healthz (3 s timeout)
    """
    findings = run_checks(
        kubelet_config,
        devices_file=devices_file,
        node_config_file=node_config_file,
        device_config_file=device_config_file,
        node_name=node_name,
        scheduler_endpoint=scheduler_endpoint,
        scheduler_ca_file=scheduler_ca_file,
        sysfs_root=sysfs_root,
    )
    for finding in findings:
        click.echo(finding.render())
    if blocking(findings):
        click.echo("NUMA alignment is blocked on this node (see FAIL lines).")
        raise SystemExit(1)
    click.echo("Nothing blocks NUMA alignment on this node.")
