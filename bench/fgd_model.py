"""The fgd maths alone on the openb trace: the paper's simulator in miniature, for one question.

Not the product path (``bench/trace.py`` is): every pod, CPU-only ones included, is placed by
``hamid.fit.fgd`` on a plain model of each node (free CPU, memory and milli-GPU per GPU; no NUMA,
no HAMi fit, no kubelet), the typical workload learned online as the scheduler learns it. It
answers how much of FGD's published figure comes from placing the CPU-only pods too:
``--cpu-pods fgd`` places them where they add the least fragmentation (the paper), and
``least-allocated`` where kube-scheduler's default profile puts them (the most free CPU, as a
share), which is what happens to them in a cluster where hamid schedules only GPU pods.
``--sample K`` keeps every K-th node and pod (default 8: about 150 nodes, under a minute a run).
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchstats import print_figures
from replay.pods import MILLI, NODES_CSV, PODS_CSV, TracePod, arrivals, read_nodes, read_pods

from hamid.fit.fgd import (
    EMPTY,
    Gpu,
    NodeState,
    Shape,
    ShapeHistogram,
    Workload,
    after,
    best_placement,
    fragmentation,
)

#: The typical workload is refreshed every this many pods (the scheduler's rule is proportional).
REFRESH = 50


def shape(pod: TracePod) -> Shape:
    """The pod's FGD shape (model rule upper-case, as the scheduler reads ``use-gputype``)."""
    models = tuple(pod.gpu_spec.upper().split("|")) if pod.gpu_spec else None
    share = pod.gpu_milli if pod.num_gpu else 0
    return Shape(pod.cpu_milli, pod.memory_mib, pod.num_gpu, share, models if pod.num_gpu else None)


class Model:
    """Nodes as FGD states, the learned workload and its memo."""

    def __init__(self, states: list[NodeState], cpus: list[int]) -> None:
        self.states = states
        self.cpus = cpus
        self.histogram = ShapeHistogram()
        self.workload: Workload = EMPTY
        self.memo: dict[NodeState, float] = {}

    def frag(self, state: NodeState) -> float:
        value = self.memo.get(state)
        if value is None:
            value = self.memo[state] = fragmentation(state, self.workload)
        return value

    def place(self, pod: Shape, cpu_pods: str) -> bool:
        """Place one pod on the best node; whether it fitted."""
        best: tuple[tuple[float, int], int, tuple[int, ...]] | None = None
        for i, state in enumerate(self.states):
            if pod.cpu > state.cpu or pod.memory > state.memory:
                continue
            if pod.gpus == 0:
                if cpu_pods == "fgd":
                    gain = self.frag(state) - self.frag(after(state, pod, ()))
                else:
                    gain = (state.cpu - pod.cpu) / self.cpus[i]
                option: tuple[tuple[float, int], int, tuple[int, ...]] = ((gain, -i), i, ())
            else:
                placed = best_placement(state, pod, self.frag)
                if placed is None:
                    continue
                option = ((placed.gain, -i), i, placed.gpus)
            if best is None or option[0] > best[0]:
                best = option
        if best is None:
            return False
        self.states[best[1]] = after(self.states[best[1]], pod, best[2])
        return True


def replay(sample: int, seed: int, cpu_pods: str) -> dict[int, float]:
    """Unallocated GPU % at 100 and 130 % arrived for one seed."""
    nodes = read_nodes(NODES_CSV)[::sample]
    pods = read_pods(PODS_CSV)[::sample]
    capacity = sum(n.gpus for n in nodes) * MILLI
    model = Model(
        [NodeState.of(n.cpu_milli, n.memory_mib, [Gpu(MILLI, 0, n.model.upper())] * n.gpus) for n in nodes],
        [n.cpu_milli for n in nodes],
    )
    arrived = allocated = 0
    out: dict[int, float] = {}
    for k, pod in enumerate(arrivals(pods, capacity, seed)):
        s = shape(pod)
        model.histogram.observe(s)
        if k % REFRESH == 0:
            model.workload, model.memo = model.histogram.typical(), {}
        arrived += pod.gpu_request
        if model.place(s, cpu_pods):
            allocated += pod.gpu_request
        for pct in (100, 130):
            if pct not in out and arrived >= pct / 100 * capacity:
                out[pct] = 100 - 100 * allocated / capacity
    return out


def main() -> None:
    """Both ways of placing CPU-only pods, every seed; medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=8, help="keep every K-th node and pod (default 8)")
    parser.add_argument("--seeds", default="42", help="seeds, e.g. 42-44")
    parser.add_argument("--cpu-pods", default="fgd,least-allocated", help="fgd, least-allocated or both")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    figures: dict[str, object] = {"sample": args.sample, "seeds": seeds, "nodes_file": str(Path(NODES_CSV))}
    for mode in args.cpu_pods.split(","):
        runs = [replay(args.sample, seed, mode) for seed in seeds]
        medians = {pct: statistics.median(r[pct] for r in runs) for pct in (100, 130)}
        at100, at130 = medians[100], medians[130]
        print(f"CPU-only pods by {mode}: unallocated {at100:.2f} % at 100 %, {at130:.2f} % at 130 % arrived")
        figures[mode] = {f"unallocated_pct_at_{p}": round(v, 2) for p, v in medians.items()}
    print_figures(figures)


if __name__ == "__main__":
    main()
