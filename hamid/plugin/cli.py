"""`hamid plugin` command: the node agent (kubelet device plugin + node registration)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import click

from hamid.kube.lean import use_lean_client
from hamid.listen import OPTIONAL_LISTEN, ListenError
from hamid.log import get_logger
from hamid.options import option
from hamid.plugin.refit_client import DEFAULT_TOKEN_FILE, RefitClientConfig
from hamid.tls import TLSConfigError, client_ssl_context

if TYPE_CHECKING:
    from hamid.plugin.app import PluginOptions

log = get_logger("plugin")


def check_refit_config(config: RefitClientConfig) -> list[str]:
    """Refit settings that would make every refit fail, checked once at start.

    Raises :class:`click.UsageError` (one line, what to change) for a configuration under which
    no refit can succeed; returns warnings for one that works but is unsafe.
    """
    if not config.endpoint.strip():
        return []
    scheme = urlsplit(config.endpoint.strip()).scheme
    if scheme == "http":
        if config.token_file:
            raise click.UsageError(
                f"--scheduler-endpoint {config.endpoint} is plain http://, but the ServiceAccount token is "
                "only ever sent over https: use https:// (the chart's default), or "
                "--service-account-token-file='' for unauthenticated refit (development only)"
            )
        return [f"NUMA refit over plain http:// ({config.endpoint}): unauthenticated and unencrypted"]
    if scheme == "https" and not config.insecure:
        try:
            client_ssl_context(
                ca_file=config.ca_file, cert_file=config.client_cert_file, key_file=config.client_key_file
            )
        except TLSConfigError as exc:
            raise click.UsageError(f"NUMA refit TLS: {exc}") from None
    if config.token_file and not os.access(config.token_file, os.R_OK):
        hint = (
            "with --scheduler-client-cert-file set, pass --service-account-token-file='' to authenticate "
            "by mTLS only"
            if config.client_cert_file
            else "mount a projected token there (the chart does) or authenticate by mTLS"
        )
        raise click.UsageError(
            f"--service-account-token-file {config.token_file} is missing or unreadable, so every "
            f"NUMA refit would fail; {hint}"
        )
    return []


async def _run_until_signal(options: PluginOptions) -> None:
    from hamid.plugin.app import run_plugin  # loaded by plugin_command, after use_lean_client

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await run_plugin(options)
    except asyncio.CancelledError:
        log.info("plugin stopped")


@click.command("plugin")
@option(
    "--node-name",
    aliases=["NODE_NAME"],
    required=True,
    help="This node's name (as in the Node object); selects its entry in the node config file.",
)
@option(
    "--devices-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Static GPU inventory (YAML/JSON, top-level 'devices:' list) used instead of NVML.",
)
@option(
    "--node-config-file",
    default="/config/config.json",
    help='HAMi per-node config JSON ({"nodeconfig":[...]}); a missing file means defaults.',
)
@option(
    "--device-config-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="HAMi device-config YAML; its 'nvidia:' section gives resource names and node defaults.",
)
@option(
    "--device-plugin-dir",
    default="/var/lib/kubelet/device-plugins/",
    help="Kubelet's device-plugin directory (holds kubelet.sock and the plugin's nvidia-<name>.sock).",
)
@option(
    "--resource-name",
    default=None,
    help="Extended resource to advertise [default: the device config's resourceCountName, nvidia.com/gpu].",
)
@option(
    "--hook-path",
    aliases=["HOOK_PATH"],
    default="/usr/local",
    help="Host directory holding HAMi-core (vgpu/libvgpu.so, vgpu/ld.so.preload, per-container caches).",
)
@option(
    "--scheduler-endpoint",
    aliases=["HAMI_SCHEDULER_ENDPOINT"],
    default="",
    help="Base URL (https://...) of the scheduler's POST /refit; empty disables NUMA refit.",
)
@option(
    "--scheduler-ca-file",
    aliases=["HAMI_SCHEDULER_CA_FILE"],
    default=None,
    help="PEM CA bundle that verifies the scheduler [default: system roots]; unreadable is an error.",
)
@option(
    "--scheduler-tls-insecure/--no-scheduler-tls-insecure",
    aliases=["HAMI_SCHEDULER_TLS_INSECURE"],
    default=False,
    help="Skip verifying the scheduler's certificate (logged; refused when a token would be sent).",
)
@option(
    "--scheduler-client-cert-file",
    default=None,
    help="PEM client certificate (CN system:node:<node>) presented to /refit for mTLS.",
)
@option("--scheduler-client-key-file", default=None, help="Private key of --scheduler-client-cert-file.")
@option(
    "--service-account-token-file",
    default=DEFAULT_TOKEN_FILE,
    help="Projected ServiceAccount token sent to /refit (TokenReview); empty sends none (mTLS only).",
)
@option(
    "--metrics-listen",
    type=OPTIONAL_LISTEN,
    default=":9394",
    help="host:port of /metrics, /metrics/hami (HAMi's vGPU monitor names), /healthz and /readyz; "
    "empty disables.",
)
@option(
    "--kubelet-config",
    default="/var/lib/kubelet/config.yaml",
    help="kubelet's KubeletConfiguration file (its CPU, Topology and Memory Manager policies), for the "
    "hamid.io/numa-profile annotation; empty publishes no profile.",
)
@option(
    "--pod-resources-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    help="kubelet's PodResources API socket: allocatable CPUs and what each pod holds "
    "(hamid.io/numa-profile, hamid.io/numa-placement).",
)
@option(
    "--sysfs-root",
    default="/sys",
    help="Where sysfs is mounted: CPU topology and NUMA nodes (devices/system/cpu, devices/system/node).",
)
@option("--api-server", default=None, help="Kubernetes API server URL (overrides the kubeconfig's).")
@option("--kubeconfig", default=None, help="Kubeconfig file (default: $KUBECONFIG, then in-cluster).")
def plugin_command(
    node_name: str,
    devices_file: str | None,
    node_config_file: str,
    device_config_file: str | None,
    device_plugin_dir: str,
    resource_name: str | None,
    hook_path: str,
    scheduler_endpoint: str,
    scheduler_ca_file: str | None,
    scheduler_tls_insecure: bool,
    scheduler_client_cert_file: str | None,
    scheduler_client_key_file: str | None,
    service_account_token_file: str,
    metrics_listen: str,
    kubelet_config: str,
    pod_resources_socket: str,
    sysfs_root: str,
    api_server: str | None,
    kubeconfig: str | None,
) -> None:
    """Run the node agent: GPU discovery, node registration, and the kubelet device plugin."""
    if not node_name.strip():
        raise click.BadParameter("must not be empty", param_hint="--node-name")
    if resource_name is not None and "/" not in resource_name:
        raise click.BadParameter(
            f"{resource_name!r} is not an extended resource name", param_hint="--resource-name"
        )
    # The plugin never uses kubernetes-asyncio's typed models: load its client without them (the
    # plugin's peak RSS, see hamid.kube.lean), so hamid.plugin.app is imported only after this.
    use_lean_client()
    from hamid.plugin.app import PluginOptions, PluginStartupError

    refit = RefitClientConfig(
        endpoint=scheduler_endpoint,
        ca_file=scheduler_ca_file,
        insecure=scheduler_tls_insecure,
        client_cert_file=scheduler_client_cert_file,
        client_key_file=scheduler_client_key_file,
        token_file=service_account_token_file or None,
    )
    for warning in check_refit_config(refit):
        log.warning(warning)
    options = PluginOptions(
        node_name=node_name,
        devices_file=devices_file,
        node_config_file=node_config_file,
        device_config_file=device_config_file,
        device_plugin_dir=device_plugin_dir,
        resource_name=resource_name,
        hook_path=hook_path,
        api_server=api_server,
        kubeconfig=kubeconfig,
        refit=refit,
        metrics_listen=metrics_listen,
        kubelet_config=kubelet_config or None,
        pod_resources_socket=pod_resources_socket,
        sysfs_root=sysfs_root,
    )
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_run_until_signal(options))
        except (PluginStartupError, ListenError) as exc:
            raise click.ClickException(str(exc)) from None
