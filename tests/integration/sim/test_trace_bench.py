"""``bench/trace.py`` on a tiny synthetic trace (never the real one): its accounting, by hand.

Two nodes: ``a`` (16 CPUs, 2 T4) and ``b`` (2 CPUs, 1 A10): 3 GPUs of capacity. Four pods of one
whole GPU and 4 CPUs (they fit ``a`` only, by CPU), one 50 % share that must run on an A10 with 4
CPUs (``b`` is short of CPU), one CPU-only pod: 4,500 milli-GPU arrive (150 %), so no clones are
drawn, and in every shuffled order the first two whole-GPU pods run on ``a`` and the other GPU pods
fail where GPU room is left only on ``b``, which lacks the CPUs. Allocated: 2 GPUs of 3 from 100 %
arrived on, so 33.33 % unallocated at 100, 110 and 130 %.

NUMA on, both pods on ``a`` are LS (Guaranteed, best-effort alignment). With the plugin's
``--hide-replicas`` (``full`` or ``busy``; on by default with NUMA) both are aligned: once the first runs, the
whole-used GPU 0 reports its 19 free replicas Unhealthy, so kubelet's device hint is NUMA 1 alone,
the second's CPUs go there, hamid predicted it and fits GPU 1: 100 % aligned, no refit. With
``--hide-replicas off`` only the first is aligned: the second's CPUs go to NUMA 0 again (kubelet
still sees 19 of GPU 0's 20 replicas free there), hamid's filter finds no GPU room on the predicted
NUMA node and falls back to GPU 1 (best-effort), and the refit to GPU 0 is refused (it is full):
50 % aligned, one refit refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench_scripts import NODES_HEADER, PODS_HEADER, assert_names_where_the_trace_lives, run_bench

NODES = f"""{NODES_HEADER}
a,16000,65536,2,T4
b,2000,8192,1,A10
"""
PODS = f"""{PODS_HEADER}
w1,4000,4096,1,1000,,LS
w2,4000,4096,1,1000,,LS
w3,4000,4096,1,1000,,Guaranteed
w4,4000,4096,1,1000,,LS
s1,4000,2048,1,500,A10,BE
c1,1000,1024,0,0,,LS
"""


def _trace(tmp_path: Path) -> tuple[str, str]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return str(nodes), str(pods)


@pytest.mark.parametrize(
    ("numa", "policies", "cpu_pods", "hide", "to_score"),
    [
        ("off", "binpack/spread", "kube-scheduler", "auto", "100"),
        ("on", "spread/spread", "kube-scheduler", "auto", "100"),
        ("on", "spread/spread", "kube-scheduler", "off", "100"),
        ("on", "fgd/fgd", "hamid", "busy", "100"),
        ("off", "fgd/fgd", "hamid", "auto", "0"),
    ],
)
def test_replay_accounts_allocated_failed_and_idle_gpus_by_hand(
    tmp_path: Path, numa: str, policies: str, cpu_pods: str, hide: str, to_score: str
) -> None:
    """With ``--cpu-pods hamid`` the CPU-only pod goes through hamid's fgd filter: it strands no GPU
    on either node (a keeps CPUs for the 4-CPU shapes, b never had them), so the gains tie and
    hamid answers ``a``, registered first: the figures are kube-scheduler's. kube-scheduler's
    adaptive share of the nodes (``--nodes-to-score 0``) is every node of a cluster this small."""
    nodes, pods = _trace(tmp_path)
    result = run_bench("trace.py",
        "--nodes-csv", nodes, "--pods-csv", pods, "--numa", numa, "--seeds", "42-43",
        "--policies", policies, "--jobs", "1", "--cpu-pods", cpu_pods, "--hide-replicas", hide,
        "--nodes-to-score", to_score,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["seeds"] == [42, 43] and summary["cpu_pods"] == cpu_pods
    assert summary["hide_replicas"] == hide and summary["nodes_to_score"] == int(to_score)
    for figures in summary["policies"].values():
        _check(figures, numa, hiding=hide != "off")
        per_seed = figures["per_seed"]  # beside each median, the figure of every seed
        assert per_seed["unallocated_pct_at_100"] == [pytest.approx(100 / 3)] * 2
        assert per_seed["ls_alignable_aligned_pct"] == ([100.0] * 2 if numa == "on" else [None] * 2)


def _check(figures: dict[str, Any], numa: str, *, hiding: bool) -> None:
    assert figures["pods"] == 6
    for arrived in (100, 110, 130):
        assert figures[f"unallocated_pct_at_{arrived}"] == pytest.approx(100 / 3)
    # two whole-GPU pods and the A10 share fail where only node b (short of CPU) has GPU room
    assert figures["failed_cpu_memory_short"] == 3
    assert figures["failed_no_gpu_room"] == figures["failed_numa_refused"] == figures["failed_not_sent"] == 0
    assert figures["failed_never_admissible"] == 0
    assert figures["never_admissible_failed_pct_at_100"] == 0
    assert figures["failed_kubelet"] == figures["failed_other"] == 0
    assert figures["failed_cpu_only"] == 0
    assert figures["idle_gpus"] == 1  # b's A10; b keeps its 2 CPUs (the CPU-only pod prefers a)
    assert figures["idle_gpus_stranded_without_cpu"] == 0
    if numa == "on":  # see the module docs
        assert figures["ls_gpu_pods_placed"] == 2
        aligned = 100.0 if hiding else 50.0
        assert figures["ls_aligned_pct"] == figures["ls_one_numa_aligned_pct"] == aligned
        # the unaligned one had no aligned place: a's NUMA 0 GPU was full, b lacks the CPUs
        assert figures["ls_unalignable_pods"] == (0 if hiding else 1)
        assert figures["ls_alignable_aligned_pct"] == 100.0
        assert figures["refits_moved"] == 0
        assert figures["refits_refused"] == (0 if hiding else 1)
        assert figures["never_single_numa_pods"] == figures["never_admissible_pods"] == 0
    else:
        assert figures["ls_gpu_pods_placed"] == 0


def test_a_missing_trace_file_is_one_line_saying_where_the_trace_lives(tmp_path: Path) -> None:
    result = run_bench("trace.py", "--nodes-csv", str(tmp_path / "absent.csv"))
    assert_names_where_the_trace_lives(result, "absent.csv")


def test_parallel_replays_report_in_the_policies_order(tmp_path: Path) -> None:
    """``--jobs 2`` starts the ``fgd`` replay (the longest) first, yet reports in the order asked."""
    nodes, pods = _trace(tmp_path)
    asked = ["binpack/spread", "spread/spread", "fgd/fgd"]
    result = run_bench("trace.py",
        "--nodes-csv", nodes, "--pods-csv", pods, "--numa", "off", "--policies", ",".join(asked),
        "--jobs", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(summary["policies"]) == asked
    reported = [line.split(":")[0] for line in result.stdout.splitlines() if line.split(":")[0] in asked]
    assert reported == asked
    for figures in summary["policies"].values():
        _check(figures, "off", hiding=False)


@pytest.mark.parametrize("policies", ["binpack/spread", "fgd/fgd"])
@pytest.mark.parametrize("numa", ["off", "on", "strict"])
def test_a_pod_wider_than_every_numa_node_is_never_admissible_with_numa(
    tmp_path: Path, numa: str, policies: str
) -> None:
    """One node of 16 CPUs (8 per NUMA node) and 2 T4s; an LS pod asking 12 CPUs and one GPU, and two
    Burstable ones asking 2 CPUs and one GPU each: 3 GPUs arrive (150 %, no clones). With NUMA the LS
    pod is Guaranteed with 12 exclusive CPUs, more than a NUMA node holds, beside replicas that fit
    one: kubelet's ``restricted`` and ``single-numa-node`` can never admit it, hamid's prediction
    refuses it and the bench files it apart, and the two others run. Without NUMA the first two to
    arrive run."""
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(f"{NODES_HEADER}\na,16000,65536,2,T4\n")
    pods.write_text(
        f"{PODS_HEADER}\n"
        "wide,12000,4096,1,1000,,LS\nnarrow1,2000,4096,1,1000,,BE\nnarrow2,2000,4096,1,1000,,BE\n"
    )
    result = run_bench("trace.py",
        "--nodes-csv", str(nodes), "--pods-csv", str(pods), "--numa", numa, "--policies", policies,
        "--jobs", "1", "--cpu-pods", "hamid",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])["policies"][policies]
    never = 0 if numa == "off" else 1
    assert figures["pods"] == 3
    assert figures["never_admissible_pods"] == figures["failed_never_admissible"] == never
    assert figures["never_admissible_failed_pct_at_130"] == 50 * never  # 1 GPU of 2
    assert figures["unallocated_pct_at_130"] == 0  # both GPUs run a pod
    assert figures["failed_numa_refused"] == figures["failed_kubelet"] == figures["failed_other"] == 0
    assert figures["failed_no_gpu_room"] == 1 - never
    assert ("no node could ever admit" in result.stdout) == bool(never)


@pytest.mark.parametrize(("hide", "aligned"), [("off", 0.0), ("auto", 100.0), ("steer", 100.0)])
def test_an_unaligned_pod_that_had_an_aligned_place_elsewhere_counts_against_alignment(
    tmp_path: Path, hide: str, aligned: float
) -> None:
    """Six nodes of 16 CPUs and 2 T4s (one per NUMA node); five Burstable whole-GPU pods of 10 CPUs,
    one per node by CPU, each on GPU 0 (NUMA 0, kubelet's choice for its replica), then (seed 19) an
    LS pod of 4 CPUs. With ``--hide-replicas off`` kubelet gives its CPUs NUMA 0 on every used node
    (GPU 0 still shows free replicas), ``binpack`` tries the used nodes first and falls back to GPU 1
    of the first once four more nodes gave no aligned fit: it runs unaligned while the idle sixth
    node had an aligned place, which the bench's judge (the simulated kubelet and the bookings) finds.
    With the replicas hidden kubelet gives NUMA 1 on a used node, and the pod runs aligned there;
    steered, kubelet follows ``binpack``'s GPU 1 of the first used node to NUMA 1."""
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(f"{NODES_HEADER}\n" + "".join(f"n{i},16000,65536,2,T4\n" for i in range(6)))
    pods.write_text(
        f"{PODS_HEADER}\n"
        + "".join(f"b{i},10000,4096,1,1000,,BE\n" for i in range(5))
        + "ls,4000,4096,1,1000,,LS\n"
    )
    result = run_bench("trace.py",
        "--nodes-csv", str(nodes), "--pods-csv", str(pods), "--numa", "on", "--seeds", "19",
        "--policies", "binpack/binpack", "--jobs", "1", "--limit", "6", "--hide-replicas", hide,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])["policies"]["binpack/binpack"]
    assert figures["ls_gpu_pods_placed"] == 1
    assert figures["ls_one_numa_aligned_pct"] == figures["ls_alignable_aligned_pct"] == aligned
    assert figures["ls_unalignable_pods"] == 0
    assert figures["refits_refused"] == (1 if hide == "off" else 0)
