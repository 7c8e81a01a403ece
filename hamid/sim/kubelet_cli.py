"""`hamid sim kubelet`: the simulated kubelet as a standalone process."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from hamid.kube.client import connect
from hamid.kube.errors import KubeError
from hamid.log import get_logger
from hamid.model.errors import InvalidInput
from hamid.options import option
from hamid.sim.kubelet import SimKubelet
from hamid.sim.machine import SAMPLES, Machine, load_machine_file, sample_machine_path
from hamid.sim.topology import CPU_POLICIES, TOPOLOGY_POLICIES

log = get_logger("sim.kubelet")
SAMPLE_PREFIX = "sample:"


def load_machine(value: str) -> Machine:
    """A machine file path, or ``sample:<name>`` for a file shipped with hamid."""
    path = (
        sample_machine_path(value.removeprefix(SAMPLE_PREFIX)) if value.startswith(SAMPLE_PREFIX) else value
    )
    return load_machine_file(path)


async def _serve(
    api_server: str | None,
    kubeconfig: str | None,
    machine: Machine,
    node_name: str,
    root: str,
    topology_policy: str,
    cpu_manager_policy: str,
    rpc_timeout: float,
    status_interval: float,
) -> None:
    kube = await connect(api_server, kubeconfig)
    try:
        kubelet = SimKubelet(
            kube,
            node_name=node_name,
            machine=machine,
            root=root,
            topology_policy=topology_policy,
            cpu_manager_policy=cpu_manager_policy,
            rpc_timeout=rpc_timeout,
            status_interval=status_interval,
        )
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await kubelet.run()
        except asyncio.CancelledError:
            log.info("simulated kubelet stopped", node=node_name)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(ValueError, RuntimeError):
                    loop.remove_signal_handler(sig)
    finally:
        await kube.close()


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
    help="Machine file (NUMA nodes, CPUs, reserved CPUs, GPUs; YAML/JSON) or "
    f"`sample:<name>` for a shipped one ({', '.join(sorted(SAMPLES))}).",
)
@option(
    "--root",
    required=True,
    help="Device-plugin directory: kubelet.sock is served here, plugin sockets are dialled here.",
)
@option(
    "--topology-policy",
    type=click.Choice(TOPOLOGY_POLICIES),
    default="single-numa-node",
    help="Topology Manager policy (scope: container), as kubelet's --topology-manager-policy.",
)
@option(
    "--cpu-manager-policy",
    type=click.Choice(CPU_POLICIES),
    default="static",
    help="CPU manager policy; static gives Guaranteed integer-CPU containers exclusive CPUs.",
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
    topology_policy: str,
    cpu_manager_policy: str,
    rpc_timeout: float,
    status_interval: float,
) -> None:
    """Run a simulated kubelet: device manager, Topology Manager and static CPU manager.

    It serves v1beta1.Registration on ROOT/kubelet.sock, drives registered device plugins like kubelet
    (GetPreferredAllocation with the NUMA-restricted set, Allocate), admits the pods bound to
    NODE_NAME one at a time, and records each decision in the pod annotation sim.hamid.io/assignment.
    """
    try:
        machine = load_machine(machine_file)
        asyncio.run(
            _serve(
                api_server,
                kubeconfig,
                machine,
                node_name,
                root,
                topology_policy,
                cpu_manager_policy,
                rpc_timeout,
                status_interval,
            )
        )
    except (InvalidInput, KubeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot serve in {root}: {exc}") from exc
