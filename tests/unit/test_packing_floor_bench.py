"""``bench/packing_floor.py`` on a tiny synthetic trace (never the real one), its floors by hand.

Two nodes of two GPUs each: 4,000 milli-GPU. The pods ask for exactly that, so all of them arrive
by 100 % in every shuffled order (the clones come after): shares of 810, 810, 470, 470 and 440
milli-GPU and one whole GPU.

- Every share placed: an 810 leaves room for no other share, and 470 + 470 + 440 exceed one GPU,
  so the shares need 4 GPUs for their 3,000 milli-GPU: at least 1,000 (25 %) stays unallocated.
- Whatever runs: the whole GPU, the two 810s and 470 + 470 on the fourth GPU fill 3,560, the most
  any choice of these pods fills: at least 440 (11 %) stays unallocated.

NUMA on, each node's 16 CPUs are two NUMA nodes of 8 assignable CPUs, and the whole-GPU pod is
``LS`` (Guaranteed) asking 9 exclusive CPUs: kubelet never admits it, so whatever runs is the
shares alone (25 %), and every share still runs on 4 GPUs (25 %).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_scripts import NODES_HEADER, PODS_HEADER, assert_names_where_the_trace_lives, run_bench

NODES = f"""{NODES_HEADER}
a,16000,65536,2,T4
b,16000,65536,2,T4
"""
PODS = f"""{PODS_HEADER}
s1,4000,2048,1,810,,BE
s2,4000,2048,1,810,,BE
s3,4000,2048,1,470,,LS
s4,4000,2048,1,470,,BE
s5,4000,2048,1,440,,BE
w1,9000,4096,1,1000,,LS
c1,1000,1024,0,0,,LS
"""


def test_both_floors_match_the_hand_count_in_every_order(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    result = run_bench(
        "packing_floor.py", "--nodes-csv", str(nodes), "--pods-csv", str(pods), "--seeds", "1-3"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["gpus"] == 4 and figures["seeds"] == [1, 2, 3]
    assert figures["floor_pct"] == {
        "off": {"every_share_runs_pct": 25.0, "whatever_runs_pct": 11.0},
        "on": {"every_share_runs_pct": 25.0, "whatever_runs_pct": 25.0},
    }
    for seed in ("1", "2", "3"):
        assert figures["per_seed"]["off"][seed] == {"every_share_runs_pct": 25.0, "whatever_runs_pct": 11.0}
        assert figures["per_seed"]["on"][seed] == {"every_share_runs_pct": 25.0, "whatever_runs_pct": 25.0}
    assert "seed 2, arrived by 100 %: NUMA off: 5 shares (3.0 GPUs) and 1 whole GPUs" in result.stdout
    assert "NUMA on: 5 shares (3.0 GPUs) and 0 whole GPUs that could run" in result.stdout


def test_every_share_running_still_leaves_idle_the_gpus_no_admitted_pod_asks_for(tmp_path: Path) -> None:
    """Two shares of 500 fill one GPU; the three whole-GPU pods ask 9 exclusive CPUs (``LS``).

    NUMA off, everything fits: 0 % both ways. NUMA on, kubelet admits none of the whole-GPU pods,
    so three of the four GPUs stay idle however well the shares pack: 75 % both ways.
    """
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    lines = ["h1,4000,2048,1,500,,BE", "h2,4000,2048,1,500,,BE"]
    lines += [f"w{i},9000,4096,1,1000,,LS" for i in range(3)]
    pods.write_text(PODS_HEADER + "\n" + "\n".join(lines) + "\n")
    result = run_bench("packing_floor.py", "--nodes-csv", str(nodes), "--pods-csv", str(pods), "--seeds", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["floor_pct"] == {
        "off": {"every_share_runs_pct": 0.0, "whatever_runs_pct": 0.0},
        "on": {"every_share_runs_pct": 75.0, "whatever_runs_pct": 75.0},
    }


def test_a_missing_trace_file_is_one_line_saying_where_the_trace_lives(tmp_path: Path) -> None:
    result = run_bench("packing_floor.py", "--nodes-csv", str(tmp_path / "absent.csv"))
    assert_names_where_the_trace_lives(result, "absent.csv")


def test_bad_seeds_are_named() -> None:
    result = run_bench("packing_floor.py", "--seeds", "x-1")
    assert result.returncode != 0
    assert "--seeds: 'x-1' is not like 42, 42,44 or 42-51" in result.stderr


def test_shares_that_cannot_all_run_are_named_not_solved(tmp_path: Path) -> None:
    """Four shares of 600 milli-GPU arrive by 100 % of two GPUs: no placement runs them all."""
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(f"{NODES_HEADER}\na,16000,65536,2,T4\n")
    pods.write_text(PODS_HEADER + "\n" + "".join(f"s{i},1000,1024,1,600,,BE\n" for i in range(4)))
    result = run_bench("packing_floor.py", "--nodes-csv", str(nodes), "--pods-csv", str(pods), "--seeds", "1")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: seed 1, NUMA off: the shares that arrive by 100 % cannot all run on 2 GPUs: "
        "no floor for every share"
    )
