"""`hamid sim kubelet`: the simulated kubelet as a standalone process."""

from __future__ import annotations

import asyncio

import click

from hamid.kube.client import connect
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.options import option
from hamid.signals import run_until_signal
from hamidsim.kubelet import SimKubelet
from hamidsim.kubelet.config import SIM_DEFAULTS, KubeletConfig, load_kubelet_config
from hamidsim.kubelet.cpumanager import CPU_POLICIES
from hamidsim.kubelet.topologymanager import TOPOLOGY_POLICIES, TOPOLOGY_SCOPES
from hamidsim.machine import SAMPLES, Machine, load_machine_file, sample_machine_path

log = get_logger("sim.kubelet")
SAMPLE_PREFIX = "sample:"


def load_machine(value: str) -> Machine:
    """A machine file path, or ``sample:<name>`` for a file shipped with hamid."""
    path = (
        sample_machine_path(value.removeprefix(SAMPLE_PREFIX)) if value.startswith(SAMPLE_PREFIX) else value
    )
    return load_machine_file(path)


async def _serve(api_server: str | None, kubeconfig: str | None, make: SimKubeletFactory) -> None:
    kube = await connect(api_server, kubeconfig)
    try:
        kubelet = make(kube)
        if await run_until_signal(kubelet.run()):
            log.info("kubelet_stopped", node=kubelet.node_name)
    finally:
        await kube.close()


class SimKubeletFactory:
    """Everything but the API client, validated before anything connects."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    def __call__(self, kube: object) -> SimKubelet:
        return SimKubelet(kube, **self.kwargs)  # type: ignore[arg-type]


@click.command("kubelet")
@option("--api-server", default=None, help="API server URL (plain, no auth: e.g. `hamid sim apiserver`).")
@option(
    "--kubeconfig", default=None, help="Kubeconfig to use instead of --api-server (or with it, for auth)."
)
@option(
    "--node-name", aliases=["NODE_NAME"], required=True, help="Node this kubelet runs (created if missing)."
)
@option(
    "--machine-file",
    required=True,
    help="Machine file (NUMA nodes or lscpu output, reserved CPUs, GPUs; YAML/JSON) or "
    f"`sample:<name>` for a shipped one ({', '.join(sorted(SAMPLES))}).",
)
@option(
    "--root",
    required=True,
    help="Device-plugin directory: kubelet.sock is served here, plugin sockets are dialled here.",
)
@option(
    "--config",
    "config_file",
    default=None,
    help="A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1): CPU, Topology and Memory Manager "
    "settings; the flags below override it. Without it: static CPU manager, single-numa-node.",
)
@option(
    "--topology-policy",
    type=click.Choice(TOPOLOGY_POLICIES),
    default=None,
    help="Topology Manager policy, as kubelet's --topology-manager-policy (overrides --config).",
)
@option(
    "--topology-scope",
    type=click.Choice(TOPOLOGY_SCOPES),
    default=None,
    help="Topology Manager scope, as kubelet's --topology-manager-scope (overrides --config).",
)
@option(
    "--cpu-manager-policy",
    type=click.Choice(CPU_POLICIES),
    default=None,
    help="CPU manager policy; static gives Guaranteed integer-CPU containers exclusive CPUs "
    "(overrides --config).",
)
@option(
    "--pod-resources-socket",
    default=None,
    help="PodResources API v1 socket (default: ROOT/../pod-resources/kubelet.sock, as kubelet lays it out).",
)
@option(
    "--rpc-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    help="Deadline in seconds for every device plugin RPC (kubelet itself sets none).",
)
@option(
    "--status-interval",
    type=click.FloatRange(min=0.1),
    default=10.0,
    help="Seconds between node status updates (changes are also published at once).",
)
def kubelet_command(
    api_server: str | None,
    kubeconfig: str | None,
    node_name: str,
    machine_file: str,
    root: str,
    config_file: str | None,
    topology_policy: str | None,
    topology_scope: str | None,
    cpu_manager_policy: str | None,
    pod_resources_socket: str | None,
    rpc_timeout: float,
    status_interval: float,
) -> None:
    """Run a simulated kubelet: device manager, Topology Manager, static CPU manager, PodResources.

    It serves v1beta1.Registration on ROOT/kubelet.sock, drives registered device plugins like kubelet
    (GetPreferredAllocation with the NUMA-restricted set, Allocate), admits the pods bound to
    NODE_NAME, records each decision in the pod annotation sim.hamid.io/assignment and serves the
    PodResources API v1 with the same data.
    """
    try:
        machine = load_machine(machine_file)
        config: KubeletConfig = load_kubelet_config(config_file) if config_file else SIM_DEFAULTS
        make = SimKubeletFactory(
            node_name=node_name,
            machine=machine,
            root=root,
            config=config,
            topology_policy=topology_policy,
            topology_scope=topology_scope,
            cpu_manager_policy=cpu_manager_policy,
            pod_resources_socket=pod_resources_socket,
            rpc_timeout=rpc_timeout,
            status_interval=status_interval,
        )
        make(None)  # validate the configuration against the machine before connecting
        asyncio.run(_serve(api_server, kubeconfig, make))
    except (InvalidInput, KubeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot serve in {root}: {exc}") from exc
