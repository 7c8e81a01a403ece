"""``--hide-replicas``: which replicas the plugin hides from kubelet, and which it never hides."""

from __future__ import annotations

from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from hamid.kube.cache import PodCache
from hamid.model.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, encode_pod_devices
from hamid.model.devices import ContainerDevice, PodDevices
from hamid.model.nodeconfig import NodeConfig
from hamid.options import OptionError
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.metrics import PluginMetrics
from hamid.plugin.options import AUTO_HIDE_RULE, PluginOptions, hide_rule
from hamid.plugin.podresources_client import HeldContainer, HeldPod
from hamid.plugin.replica_room import ReplicaRoom
from hamid.plugin.service import HEALTHY, list_response
from tests.builders import container, pod

RESOURCE = "nvidia.com/gpu"
SPLIT = 4
G0, G1 = "GPU-0", "GPU-1"  # 16384 MiB, 100 cores each; NUMA 0 and 1


def _inventory() -> GpuInventory:
    gpus = [PhysicalGpu(G0, 0, "T4", 16384, 0, ""), PhysicalGpu(G1, 1, "T4", 16384, 1, "")]
    return GpuInventory(gpus, NodeConfig(device_split_count=SPLIT, enable_numa_topology=True))


def _gpu_pod(
    name: str, uuid: str, mem: int, cores: int, *, pending: bool = False, phase: str = "Running"
) -> Any:
    """A hamid pod booked on ``uuid``: admitted (Allocate consumed its entry) unless ``pending``."""
    devices: PodDevices = ((ContainerDevice(uuid, "NVIDIA", mem, cores),),)
    notes = {
        DEVICES_ALLOCATED: encode_pod_devices(devices),
        DEVICES_TO_ALLOCATE: encode_pod_devices(devices if pending else ((),)),
    }
    limits = {RESOURCE: 1}
    return pod(
        name, node="n1", annotations=notes, containers=[container(limits=limits)], status={"phase": phase}
    )


class Node:
    """The node's pods, as the plugin's pod cache lists them."""

    def __init__(self, rule: str = "full") -> None:
        self.pods: list[Any] = []
        self.inventory = _inventory()
        self.policy: str | None = "restricted"
        self.room = ReplicaRoom(self.inventory, lambda: list(self.pods), RESOURCE, rule, lambda: self.policy)

    def healthy(self, uuid: str) -> set[str]:
        return {
            d.ID
            for d in list_response(self.inventory).devices
            if d.ID.startswith(uuid) and d.health == HEALTHY
        }


def test_a_full_gpu_hides_its_free_replicas_but_never_the_held_ones() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 30))  # all of G0's memory
    node.room.allocated("default/a", [f"{G0}-2"])  # kubelet gave it replica 2
    assert node.healthy(G0) == {f"{G0}-2"}
    assert len(node.healthy(G1)) == SPLIT
    # kubelet's allocatable (the healthy count) covers what the pods hold
    assert len(node.healthy(G0)) + len(node.healthy(G1)) >= 1


def test_the_metrics_count_hidden_replicas_and_keep_the_gpu_healthy() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 30))
    node.room.allocated("default/a", [f"{G0}-2"])
    metrics = PluginMetrics(node.inventory, hook_path="/nonexistent")
    text = generate_latest(metrics.registry).decode()
    labels = f'device_index="0",device_uuid="{G0}",numa="0"'
    assert f"hamid_plugin_gpu_replicas_hidden{{{labels}}} 3.0" in text
    assert f"hamid_plugin_gpu_healthy{{{labels}}} 1.0" in text  # XID health, not room
    assert f"hamid_plugin_gpu_replicas{{{labels}}} 4.0" in text


def test_cores_alone_make_a_gpu_full_and_shares_with_room_keep_every_replica() -> None:
    node = Node()
    node.pods += [_gpu_pod("a", G0, 1000, 60), _gpu_pod("b", G0, 1000, 30), _gpu_pod("c", G1, 8000, 99)]
    node.room.allocated("default/a", [f"{G0}-0"])
    node.room.allocated("default/b", [f"{G0}-1"])
    node.room.allocated("default/c", [f"{G1}-0"])
    assert len(node.healthy(G0)) == SPLIT and len(node.healthy(G1)) == SPLIT  # 90 and 99 cores: room
    node.pods.append(_gpu_pod("d", G0, 1000, 10))
    node.room.allocated("default/d", [f"{G0}-3"])
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1", f"{G0}-3"}


def test_a_pending_booking_keeps_its_gpus_replicas_until_it_is_admitted() -> None:
    """A bound pod kubelet has not admitted yet books room on a GPU that had room: every free
    replica stays (kubelet sizes its hints as without hiding); once Allocate served it, they go."""
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 100, pending=True))
    node.room.sync()
    assert len(node.healthy(G0)) == SPLIT
    node.pods[0] = _gpu_pod("a", G0, 16384, 100)
    node.room.allocated("default/a", [f"{G0}-0"])
    assert node.healthy(G0) == {f"{G0}-0"}


def test_a_pending_booking_on_a_gpu_without_room_keeps_the_replica_it_needs() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 4096, 100))  # every core of G0
    node.room.allocated("default/a", [f"{G0}-0"])
    assert node.healthy(G0) == {f"{G0}-0"}
    node.pods.append(_gpu_pod("b", G0, 4096, 0, pending=True))  # no cores: it still fits G0
    node.room.sync()
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"}


def test_a_freed_gpu_re_offers_its_replicas_and_wakes_list_and_watch() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 100))
    node.room.allocated("default/a", [f"{G0}-0"])
    generation = node.inventory.generation
    node.pods[0] = _gpu_pod("a", G0, 16384, 100, phase="Succeeded")
    assert node.room.sync()
    assert node.inventory.generation > generation
    assert len(node.healthy(G0)) == SPLIT
    assert not node.room.sync()  # nothing changed: no update sent


def test_nothing_is_hidden_while_a_holder_s_replicas_are_unknown() -> None:
    """After a restart the plugin does not know what admitted pods hold until PodResources was read:
    hiding a held replica would shrink kubelet's allocatable below the pods' requests."""
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 100))
    node.room.sync()
    assert len(node.healthy(G0)) == SPLIT
    held = HeldPod("default", "a", (HeldContainer("main", frozenset(), {RESOURCE: {0: (f"{G0}-3",)}}),))
    node.room.listed([held])
    assert node.healthy(G0) == {f"{G0}-3"}


def test_replicas_allocated_before_the_pod_cache_lists_the_pod_stay_known() -> None:
    node = Node()
    node.room.allocated("default/a", [f"{G0}-1"])  # the cache lags: not listed yet
    node.pods.append(_gpu_pod("a", G0, 16384, 100))
    node.room.sync()
    assert node.healthy(G0) == {f"{G0}-1"}
    node.pods.clear()  # gone: its replicas are forgotten, G0 re-offered
    node.room.sync()
    assert len(node.healthy(G0)) == SPLIT


def test_xid_unhealthiness_stays_when_room_comes_back() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G1, 16384, 100))
    node.room.allocated("default/a", [f"{G1}-0"])
    node.inventory.mark_unhealthy(G1, "XID 79")
    node.pods.clear()
    node.room.sync()
    assert node.healthy(G1) == set()


def test_an_undecodable_allocation_hides_nothing() -> None:
    node = Node()
    node.pods.append(_gpu_pod("a", G0, 16384, 100))
    node.room.allocated("default/a", [f"{G0}-0"])
    bad = _gpu_pod("b", G1, 1, 1)
    bad["metadata"]["annotations"][DEVICES_ALLOCATED] = "not,an;allocation"
    node.pods.append(bad)
    node.room.sync()
    assert len(node.healthy(G0)) == SPLIT


def test_busy_hides_partly_booked_gpus_while_the_node_has_an_idle_one() -> None:
    """``busy``: G1 idle, so G0 (a share booked, room left) offers kubelet only its held replica;
    once G1 is booked too no GPU is idle and G0's free replicas are offered again."""
    node = Node("busy")
    node.pods.append(_gpu_pod("a", G0, 4096, 25))
    node.room.allocated("default/a", [f"{G0}-1"])
    assert node.healthy(G0) == {f"{G0}-1"}
    assert len(node.healthy(G1)) == SPLIT
    node.pods.append(_gpu_pod("b", G1, 4096, 25))
    node.room.allocated("default/b", [f"{G1}-0"])
    assert len(node.healthy(G0)) == SPLIT and len(node.healthy(G1)) == SPLIT
    full = Node("full")  # ``full`` leaves a GPU with room alone
    full.pods.append(_gpu_pod("a", G0, 4096, 25))
    full.room.allocated("default/a", [f"{G0}-1"])
    assert len(full.healthy(G0)) == SPLIT


def test_busy_keeps_the_replica_a_pending_share_needs_and_counts_only_healthy_idle_gpus() -> None:
    node = Node("busy")
    node.pods.append(_gpu_pod("a", G0, 4096, 25))
    node.room.allocated("default/a", [f"{G0}-0"])
    node.pods.append(_gpu_pod("b", G0, 4096, 25, pending=True))  # a Burstable share booked on G0
    node.room.sync()
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"}
    node.inventory.mark_unhealthy(G1, "XID 79")  # an unhealthy GPU is no idle one
    node.room.sync()
    assert len(node.healthy(G0)) == SPLIT


def _listed(node: Node) -> dict[str, int]:
    """Replicas kubelet sees per GPU (healthy or not): what the plugin lists."""
    devices = list_response(node.inventory).devices
    return {u: sum(1 for d in devices if d.ID.startswith(u)) for u in (G0, G1)}


def test_span_lists_one_replica_per_gpu_while_no_pod_holds_any() -> None:
    """``span``: nothing held, so each GPU lists one replica (the rest left out of the list, not
    Unhealthy: kubelet counts Unhealthy devices when it sizes its hints); a pending booking keeps
    what it needs listed; once a pod holds a replica every replica is listed again (``busy``)."""
    node = Node("span")
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: 1}
    assert node.healthy(G0) == {f"{G0}-0"} and node.healthy(G1) == {f"{G1}-0"}
    node.pods.append(_gpu_pod("a", G0, 4096, 25, pending=True))
    node.pods.append(_gpu_pod("b", G0, 4096, 25, pending=True))
    node.room.sync()
    assert _listed(node) == {G0: 2, G1: 1}
    node.pods[0] = _gpu_pod("a", G0, 4096, 25)
    node.room.allocated("default/a", [f"{G0}-0"])
    assert _listed(node) == {G0: SPLIT, G1: SPLIT}
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"}  # busy: G1 idle, G0 keeps held + pending
    node.pods.clear()
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: 1}


def test_steer_lists_only_what_the_locked_pod_needs_until_the_pod_cache_lists_it() -> None:
    """``steer``: the pod the node lock names, not bound yet, counts as a pending booking, so
    every other free replica is Unhealthy (held ones stay Healthy); bound, it counts once; served,
    the steering for it ends (``busy``: G1 idle, G0's free replicas hidden)."""
    node = Node("steer")
    node.pods.append(_gpu_pod("a", G0, 4096, 25))
    node.room.allocated("default/a", [f"{G0}-0"])
    assert node.healthy(G0) == {f"{G0}-0"} and len(node.healthy(G1)) == SPLIT
    assert node.room.binding("default/b", {G0: 1})
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"} and node.healthy(G1) == set()
    node.pods.append(_gpu_pod("b", G0, 4096, 25, pending=True))  # bound: the pod cache lists it
    assert not node.room.binding("default/b", {G0: 1})  # counted once, not twice
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"}
    node.pods[1] = _gpu_pod("b", G0, 4096, 25)
    node.room.allocated("default/b", [f"{G0}-1"])
    assert node.healthy(G0) == {f"{G0}-0", f"{G0}-1"} and len(node.healthy(G1)) == SPLIT


def test_steer_on_an_idle_node_lists_the_locked_pods_replica_alone_healthy() -> None:
    node = Node("steer")
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: 1}
    node.room.binding("default/b", {G1: 1})
    assert _listed(node) == {G0: 1, G1: 1}
    assert node.healthy(G0) == set() and node.healthy(G1) == {f"{G1}-0"}
    node.room.binding(None)
    assert node.healthy(G0) == {f"{G0}-0"} and node.healthy(G1) == {f"{G1}-0"}


class _Cache:
    """The pod cache's part the room reads: whether its first list was applied."""

    synced = False

    def add_handlers(self, **_: Any) -> None:
        return None


@pytest.mark.parametrize("policy", [None, "single-numa-node", "best-effort"])
def test_span_lists_everything_but_under_restricted(policy: str | None) -> None:
    """``span`` leaves replicas out only where kubelet's policy is ``restricted`` (the profile not
    published yet, None, counts as not known: nothing is left out)."""
    node = Node("span")
    node.policy = policy
    node.room.sync()
    assert _listed(node) == {G0: SPLIT, G1: SPLIT}
    node.policy = "restricted"
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: 1}


def test_span_lists_everything_until_the_pod_cache_listed_the_node() -> None:
    """Before the first list an empty pod view says nothing about the node: no replica is left out."""
    node = Node("span")
    cache = _Cache()
    node.room.watch(cast(PodCache, cache))
    node.room.sync()
    assert _listed(node) == {G0: SPLIT, G1: SPLIT}
    cache.synced = True
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: 1}


def test_span_lists_everything_while_a_holder_is_not_known_and_skips_unhealthy_gpus() -> None:
    node = Node("span")
    node.inventory.mark_unhealthy(G1, "XID 79")
    node.room.sync()
    assert _listed(node) == {G0: 1, G1: SPLIT}  # an unhealthy GPU keeps its (Unhealthy) replicas
    held = _gpu_pod("a", G0, 4096, 25)
    node.pods.append(held)  # admitted, its replicas not known yet (after a restart)
    node.room.sync()
    assert _listed(node) == {G0: SPLIT, G1: SPLIT}


@pytest.mark.parametrize(
    ("setting", "numa", "rule"),
    [
        ("auto", True, AUTO_HIDE_RULE),
        ("auto", False, None),
        ("full", False, "full"),
        ("busy", True, "busy"),
        ("span", True, "span"),
        ("off", True, None),
    ],
)
def test_auto_hides_by_the_default_rule_where_numa_topology_is_reported(
    setting: str, numa: bool, rule: str | None
) -> None:
    assert hide_rule(setting, numa) == rule


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(OptionError, match="--hide-replicas"):
        PluginOptions(node_name="n1", hide_replicas="sometimes")


def test_steer_only_the_pod_the_lock_names_steers_and_a_pod_holding_replicas_keeps_the_node_busy() -> None:
    """A running pod holds G1-0 and its own annotation (a tenant can write it) says an entry on G1
    is pending again: that never steers (G0's free replicas stay listed), and the node is not
    idle for ``span``'s listing, whatever the annotation says. The pod the lock names steers."""
    node = Node("steer")
    node.pods.append(_gpu_pod("running", G1, 1024, 10, pending=True))
    node.room.allocated("default/running", [f"{G1}-0"])
    node.room.sync()
    assert node.healthy(G0) == {f"{G0}-{i}" for i in range(SPLIT)}
    assert not node.room.steering_applied
    node.room.binding("default/b", {G1: 1})
    assert node.healthy(G0) == set() and node.room.steering_applied
    node.room.binding(None)
    assert node.healthy(G0) == {f"{G0}-{i}" for i in range(SPLIT)}


def test_steer_lasts_until_the_last_container_of_the_locked_pod_is_served() -> None:
    """The pod the lock names needs two replicas of G1 (two containers): the first Allocate leaves
    the steering on for the second, which kubelet admits next, even before the pod cache lists it."""
    node = Node("steer")
    node.room.sync()
    node.room.binding("default/b", {G1: 2})
    assert node.healthy(G0) == set()
    node.room.allocated("default/b", [f"{G1}-0"])
    assert node.healthy(G0) == set() and node.room.steering_applied
    node.room.allocated("default/b", [f"{G1}-1"])
    assert not node.room.steering_applied


def test_steer_is_not_applied_while_a_booking_cannot_be_read() -> None:
    """A pod whose booking cannot be decoded makes the plugin hide nothing (its GPUs' room is not
    known): the steering is then not applied, which the handshake reads before it confirms."""
    node = Node("steer")
    bad = _gpu_pod("bad", G0, 1024, 10)
    bad["metadata"]["annotations"][DEVICES_ALLOCATED] = "garbage"
    node.pods.append(bad)
    node.room.binding("default/b", {G1: 1})
    assert not node.room.steering_applied
    node.pods.clear()
    node.room.sync()
    assert node.room.steering_applied and node.healthy(G0) == set()
