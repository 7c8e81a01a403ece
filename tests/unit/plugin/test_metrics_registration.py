"""The node-registration gauge follows the registrar's state, not the mere presence of one."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import generate_latest

from hamid.model.kube import PodBody
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.metrics import PluginMetrics


@dataclass
class _Kubelet:
    registrations: int = 0
    registered: bool = False


@dataclass
class _Node:
    node_registered: bool
    patches: int = 0


def _gauge(node: _Node) -> float:
    metrics = PluginMetrics(GpuInventory([], NodeConfig()), hook_path="/nonexistent")
    metrics.attach(_Kubelet(), node, pods=_NoPods())
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("hamid_plugin_node_registered "):
            return float(line.split()[1])
    raise AssertionError("hamid_plugin_node_registered not exported")


class _NoPods:
    def pods(self) -> list[PodBody]:
        return []


def test_node_registered_gauge_is_zero_until_written_or_found_current() -> None:
    assert _gauge(_Node(node_registered=False)) == 0
    assert _gauge(_Node(node_registered=True)) == 1
