"""``--node-label-selector`` against the embedded API server: which nodes are GPU candidates, and
what a node whose labels change (in both directions) does to the bookings of the pods on it."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.labels import parse_node_label_selector
from hamid.scheduler.ledger import Ledger
from hamid.scheduler.settings import SchedulerSettings
from tests.integration.scheduler.harness import (
    Env,
    loopback_options,
    running_app,
    running_scheduler,
    wait_for,
)
from tests.unit.scheduler.helpers import container, node, pod

SELECTED = {"gpu": "on", "pool": "a"}
SETTINGS = SchedulerSettings(node_label_selector=parse_node_label_selector("gpu=on,pool=a"), bind_wait_s=19.0)
Logs = list[MutableMapping[str, Any]]


def labelled(name: str, labels: dict[str, str], gpus: int = 1) -> dict[str, Any]:
    """A Node with a register of ``gpus`` GPUs (8000 MiB each) and ``labels``."""
    body = node(name, gpus)
    body["metadata"]["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Node", **body}


def selection_logs(logs: Logs) -> list[tuple[str, str, Any]]:
    return [
        (e["event"], e["node"], e.get("was_registered"))
        for e in logs
        if e["event"] in ("node_selected", "node_not_selected")
    ]


def booked_on(ledger: Ledger, uid: str) -> str | None:
    reservation = ledger.reservation(uid)
    return reservation.node if reservation is not None else None


async def placed(env: Env, name: str, candidates: list[str]) -> str:
    """Create a GPU pod (1 GPU, 1000 MiB, 10 %), filter and bind it, then allocate it as the
    device plugin does (bind phase success, node lock released); its UID."""
    p = await env.create_pod(pod(name))
    body = await env.filter(p, candidates)
    [chosen] = body["NodeNames"]
    assert await env.bind(p, chosen) == ""
    env.server.patch("Pod", "default", name, {"metadata": {"annotations": {ann.BIND_PHASE: "success"}}})
    env.server.patch("Node", None, chosen, {"metadata": {"annotations": {ann.NODE_LOCK: None}}})
    return str(p["metadata"]["uid"])


async def test_only_nodes_matching_every_pair_are_registered(logs: Logs) -> None:
    seed = [
        labelled("n1", SELECTED),
        labelled("n2", {"gpu": "on"}),  # a pair missing
        labelled("n3", {"gpu": "on", "pool": "b"}),  # a pair with another value
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu1", "labels": SELECTED}},
    ]
    async with running_scheduler(SETTINGS, seed=seed) as env:
        ledger = env.scheduler.ledger
        assert set(ledger.nodes) == {"n1"}
        assert ledger.handshake_wanted == {"n1"}  # no handshake is written on a node not selected
        p = await env.create_pod(pod("a"))
        body = await env.filter(p, ["n2", "n3", "cpu1", "n1"])
        assert body["NodeNames"] == ["n1"]
        assert body["FailedNodes"] == {
            "n2": R.NODE_NOT_SELECTED,
            "n3": R.NODE_NOT_SELECTED,
            "cpu1": R.NODE_UNREGISTERED,  # no register: not a GPU node, selector or not
        }
        big = await env.create_pod(pod("big", containers=[container("c", 1, 9000, 10)]))
        body = await env.filter(big, ["n2", "n3"])
        assert body.get("NodeNames") is None
        assert body["FailedNodes"] == {"n2": R.NODE_NOT_SELECTED, "n3": R.NODE_NOT_SELECTED}
        # the metrics see the registered nodes only
        sample = env.scheduler.metrics.registry.get_sample_value
        assert sample("hamid_node_schedulable", {"node": "n1"}) == 1
        assert sample("hamid_node_schedulable", {"node": "n2"}) is None
    assert sorted(selection_logs(logs)) == [
        ("node_not_selected", "n2", False),
        ("node_not_selected", "n3", False),
    ]


async def test_a_node_leaving_and_rejoining_the_selection_keeps_its_bookings(logs: Logs) -> None:
    seed = [labelled("n1", SELECTED), labelled("n2", {"gpu": "on"})]
    async with running_scheduler(SETTINGS, seed=seed) as env:
        ledger = env.scheduler.ledger
        uid_a = await placed(env, "a", ["n1", "n2"])
        uid_c = await placed(env, "c", ["n1", "n2"])
        assert ledger.snapshot()["n1"] == {"n1-gpu0": (2, 2000, 20)}

        # n1 stops matching: no new GPU pod goes there, its pods stay booked on it
        await env.kube.patch_node_metadata("n1", labels={"pool": None})
        await wait_for(lambda: "n1" not in ledger.nodes)
        assert booked_on(ledger, uid_a) == booked_on(ledger, uid_c) == "n1"
        b = await env.create_pod(pod("b"))
        body = await env.filter(b, ["n1", "n2"])
        assert body.get("NodeNames") is None
        assert body["FailedNodes"] == {"n1": R.NODE_NOT_SELECTED, "n2": R.NODE_NOT_SELECTED}
        # c ends while n1 is out: its booking goes with it
        assert env.server.delete("Pod", "default", "c") is not None
        await wait_for(lambda: ledger.reservation(uid_c) is None)

        # a replica starting now (a restart, or an HA peer with the same flags) ...
        async with running_app(loopback_options(env.server, settings=SETTINGS)) as other:
            peer = other.scheduler.ledger
            assert set(peer.nodes) == set() and peer.inventory.unselected == {"n1", "n2"}
            assert booked_on(peer, uid_a) == "n1"

            # n1 matches again: registered with exactly a's booking (c's gone, nothing doubled)
            await env.kube.patch_node_metadata("n1", labels={"pool": "a"})
            await wait_for(lambda: "n1" in ledger.nodes and "n1" in peer.nodes)
            assert ledger.snapshot() == peer.snapshot() == {"n1": {"n1-gpu0": (1, 1000, 10)}}
        report = await env.scheduler.reconciler.reconcile_once()
        assert report is not None and report.drifts == []

        # n2 starts matching: registered, a candidate at once
        await env.kube.patch_node_metadata("n2", labels={"pool": "a"})
        await wait_for(lambda: "n2" in ledger.nodes)
        body = await env.filter(b, ["n2"])
        assert body["NodeNames"] == ["n2"] and not body.get("FailedNodes")
    # each replica says once why a node is out, and when it is back
    assert sorted(selection_logs(logs)) == [
        ("node_not_selected", "n1", False),  # the peer's start
        ("node_not_selected", "n1", True),
        ("node_not_selected", "n2", False),  # both starts
        ("node_not_selected", "n2", False),
        ("node_selected", "n1", None),  # both replicas
        ("node_selected", "n1", None),
        ("node_selected", "n2", None),
    ]
