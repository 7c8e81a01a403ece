"""`hamid sim up` (and `hamid demo --keep`): a simulated cluster that stays up for kubectl.

It runs what the demo runs — the embedded API server, `hamid scheduler` (extender, `/refit`, and its
webhook registered in a MutatingWebhookConfiguration that the API server calls over TLS on every
pod create), a kube-scheduler driver and per node a simulated kubelet with `hamid plugin` — writes a
kubeconfig and an example pod, prints how to use them, and serves until SIGINT or SIGTERM. By
default it first pins a CPU-only `cpu-batch` pod to one NUMA node of `node-1`, so the example GPU
pod's CPUs land on the other NUMA node and the scheduler's GPU pick is refitted, as in the demo.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import click

from hamid.options import option
from hamidsim.apiserver.cli import parse_listen
from hamidsim.cluster import ClusterOptions, NodeSpec, SimCluster
from hamidsim.demo import FILLER_NAME, NODE, filler_pod, quiet_logs, seed_pod
from hamidsim.keep import DEFAULT_KUBECONFIG, EXAMPLE_POD_FILE, keep_serving


async def run_up(options: ClusterOptions, kubeconfig: Path, stage: bool) -> None:
    """Start the cluster, stage the NUMA node, keep serving; everything is stopped on the way out."""
    async with SimCluster(options) as cluster:
        if stage:
            await cluster.create_pod(filler_pod(NODE))
            await cluster.wait_settled(FILLER_NAME)
        await keep_serving(cluster, kubeconfig, seed_pod())


@click.command("up")
@option(
    "--listen",
    default="127.0.0.1:8080",
    help="HOST:PORT of the embedded API server (plain HTTP; port 0 picks a free port).",
)
@option(
    "--write-kubeconfig",
    "kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_KUBECONFIG,
    help=f"Where to write the kubeconfig (the example pod {EXAMPLE_POD_FILE} goes beside it).",
)
@option(
    "--stage/--no-stage",
    default=True,
    help=f"Pin the CPU-only {FILLER_NAME} pod to one NUMA node of {NODE} first, so GPU pods get refitted.",
)
@click.pass_context
def up_command(ctx: click.Context, listen: str, kubeconfig: Path, stage: bool) -> None:
    """Run a simulated cluster (API server, scheduler with webhook, kubelet and plugin) for kubectl.

    Writes a kubeconfig and an example pod and prints the kubectl commands to try; Ctrl-C stops it.
    Component logs go to stderr (warning level unless --log-level is given to hamid).
    """
    quiet_logs(ctx.parent or ctx)
    host, port = parse_listen(listen)
    options = replace(
        ClusterOptions(nodes=(NodeSpec(NODE),), numa_publish=False),
        api_host=host,
        api_port=port,
        admission_webhook=True,
    )
    try:
        asyncio.run(run_up(options, kubeconfig, stage))
    except OSError as err:
        raise click.ClickException(f"cannot start the cluster on {listen}: {err}") from err
