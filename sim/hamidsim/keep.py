"""Keep a simulated cluster serving for kubectl: webhook registered, kubeconfig written, until a signal.

Used by `hamid sim up` and `hamid demo --keep`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import yaml

from hamid.model import objects
from hamid.signals import wait_for_signal
from hamidsim.apiserver.kubeconfig import write_kubeconfig
from hamidsim.cluster import WEBHOOK_CONFIGURATION, SimCluster

DEFAULT_KUBECONFIG = "hamid-sim.kubeconfig"
EXAMPLE_POD_FILE = "numa-aligned.yaml"


def usage(cluster: SimCluster, kubeconfig: Path, example: Path, pod_name: str) -> str:
    """What to type next: the kubectl commands for the running cluster."""
    nodes = ", ".join(cluster.nodes) or "-"
    return "\n".join(
        [
            f"hamid sim: cluster up (API server {cluster.server.url}; nodes {nodes};"
            f" scheduler webhook, extender and /refit at {cluster.cluster_url})",
            f"kubeconfig: {kubeconfig}",
            f"web view: {cluster.metrics_url}/ui (NUMA alignment per node and pod; docs/ui.md)",
            "",
            f"  export KUBECONFIG={kubeconfig}",
            "  kubectl get nodes",
            f"  kubectl apply -f {example}",
            "  kubectl get pods -o wide",
            f"  kubectl describe pod {pod_name}",
            "  kubectl get events",
            "",
            "Ctrl-C stops the cluster.",
        ]
    )


async def keep_serving(cluster: SimCluster, kubeconfig: Path, example_pod: dict[str, Any]) -> None:
    """Register the webhook (once), write kubeconfig and example pod, print usage, serve until a signal."""
    if cluster.server.get("MutatingWebhookConfiguration", None, WEBHOOK_CONFIGURATION) is None:
        cluster.server.put(cluster.webhook_configuration())
    written = await asyncio.to_thread(write_kubeconfig, kubeconfig, cluster.server.url)
    example = written.with_name(EXAMPLE_POD_FILE)
    pod = {"apiVersion": "v1", "kind": "Pod", **example_pod}
    await asyncio.to_thread(example.write_text, yaml.safe_dump(pod, sort_keys=False), "utf-8")
    click.echo(usage(cluster, written, example, objects.name(pod)))
    await wait_for_signal()
    click.echo("hamid sim: stopping")
