"""`hamid plugin` command: the node agent (kubelet device plugin + node registration)."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from hamid.log import get_logger
from hamid.options import option
from hamid.plugin.app import PluginOptions, PluginStartupError, run_plugin

log = get_logger("plugin")


async def _run_until_signal(options: PluginOptions) -> None:
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
    )
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_run_until_signal(options))
        except PluginStartupError as exc:
            raise click.ClickException(str(exc)) from exc
