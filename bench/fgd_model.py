"""The fgd maths alone on the openb trace: the paper's simulator in miniature, for one question.

Not the product path (``bench/trace.py`` is): every pod, CPU-only ones included, is placed by
``hamid.fit.fgd`` on a plain model of each node (free CPU, memory and milli-GPU per GPU; no NUMA,
no HAMi fit, no kubelet), the typical workload learned online as the scheduler learns it. Each
``--variants`` entry departs from hamid's choices one way, to measure a divergence from the
paper's simulator: ``cpu_pods=least-allocated`` puts the CPU-only pods where kube-scheduler's
default profile does (the most free CPU, as a share: a cluster where hamid schedules GPU pods
only), ``workload=trace`` knows the typical workload from the trace up front, ``memory=off``
leaves memory out of fragmentation, ``score=paper`` scores as the simulator does (an integer
0..100 instead of hamid's whole 50 milli-GPU steps; ``exact``: the gain itself), ``ties=first``
breaks equal scores by the node list's order and ``ties=random`` draws among them, where hamid and
the paper's simulator both use one fixed pseudo-random order of the nodes (docs/packing.md);
``ties=fewest-gpus`` (``most-gpus``, ``most-cpu-per-gpu``, ``least-cpu-per-gpu``) fills one kind
of node first, in the hashed order within it, and ``tie_salt=TEXT`` draws another fixed order
(the node names hashed after ``TEXT``), to see how much the arbitrary order alone moves a figure;
``cpu_ties=least-idle-gpu`` (``most-spare-cpu``) breaks a CPU-only pod's equal scores toward the
node with the least idle GPU (the most free CPU per idle GPU) before the fixed order;
``gpu_ties=match`` breaks a GPU pod's equal scores toward the node whose free CPU per free GPU is
nearest the pod's own, ``gpu_ties=balance`` toward the node left nearest the cluster's,
``gpu_ties=fullest`` toward the node with the least idle milli-GPU (best fit among equal gains);
``shares=ss`` places the one-GPU shares by the Sum-of-Squares rule of online bin packing instead
(the GPU that least raises the sum of squares of the cluster's GPU counts per free milli-GPU),
``shares=ss-gpu`` only chooses their GPU that way on the node fgd chose, and ``shares=fgd-ss-ties``
breaks their equal gain steps by it before the fixed order. ``reverse=shares`` (``cpu``,
``multi``) sends that class of pods the fixed order's other way among equal scores, so the
classes fill different nodes first instead of the same ones.
``step=N`` compares gains in steps of N milli-GPU (hamid: ``GAIN_STEP``), ``half_life=N``
decays the learned workload over N pods (hamid: ``DEFAULT_HALF_LIFE``) and ``coverage=F`` keeps
the most frequent shapes covering that share of the pods as the typical ones (hamid and the
paper: ``COVERAGE``, 0.95). Each variant prints its
medians, every seed's figures and the GPU remnants at 100 % arrived (GPUs by free milli-GPU),
largest in volume.
``--sample K`` keeps every K-th node and pod (default 8: about 150 nodes, under a minute a run;
1: the full trace, about 3-4 minutes of CPU a run).
The last output line is one JSON object (``benchstats.print_figures``: json.dumps of the figures).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchstats import print_figures
from replay.pods import (
    MILLI,
    NODES_CSV,
    PODS_CSV,
    TraceNode,
    TracePod,
    arrivals,
    parse_seeds,
    read_nodes,
    read_pods,
)

from hamid.fit.fgd import (
    COVERAGE,
    DEFAULT_HALF_LIFE,
    EMPTY,
    GAIN_STEP,
    Gpu,
    NodeState,
    Shape,
    ShapeHistogram,
    Workload,
    after,
    best_placement,
    fitting_gpus,
    fragmentation,
    gain_steps,
)
from hamid.scheduler.fgd_rank import tie_order

#: The typical workload is refreshed every this many pods (the scheduler's rule is proportional).
REFRESH = 50
#: The paper's simulator scores as kube-scheduler does: an integer 0..100 per node.
MAX_SCORE = 100
#: Tie orders that fill one kind of node first (a larger key first), hashed within the kind.
TIE_KINDS: dict[str, Callable[[TraceNode], float]] = {
    "fewest-gpus": lambda n: -n.gpus,
    "most-gpus": lambda n: n.gpus,
    "most-cpu-per-gpu": lambda n: n.cpu_milli / n.gpus,
    "least-cpu-per-gpu": lambda n: -n.cpu_milli / n.gpus,
}


@dataclass(frozen=True)
class Variant:
    """How the model departs from hamid's choices, to measure one divergence from the paper at a time."""

    cpu_pods: str = "fgd"  #: ``fgd`` or ``least-allocated``
    workload: str = (
        "online"  #: ``online`` (learned, decayed) or ``trace`` (the trace's own shapes, known up front)
    )
    memory: bool = True  #: memory in the shapes and in the shortage (the paper's fragmentation ignores it)
    #: ``steps`` of the gain (hamid), the ``exact`` gain, or ``paper``: ``int(sigmoid(gain / 1 GPU) * 100)``
    score: str = "steps"
    #: equal scores go by a ``fixed`` hash order of node names (hamid), to the ``first`` node,
    #: or to a ``random`` one
    ties: str = "fixed"
    tie_salt: str = ""  #: hashed before each node name for the fixed order ("": hamid's order)
    #: equal scores of a CPU-only pod: ``fixed`` as any pod, ``least-idle-gpu`` the node with the least
    #: idle milli-GPU first, ``most-spare-cpu`` the most free CPU per idle GPU first (then ``fixed``)
    cpu_ties: str = "fixed"
    #: a share (one GPU, part of it) goes where ``fgd`` says, or by ``ss``: the GPU (then the node
    #: in the fixed order) that least raises the sum of squares of the cluster's count of GPUs per
    #: free milli-GPU (the Sum-of-Squares rule of online bin packing; CPU and memory only as limits)
    shares: str = "fgd"
    #: equal scores of a GPU pod: ``fixed`` as any pod; ``match`` the node whose free CPU per free
    #: milli-GPU is nearest the pod's own (log ratio), ``balance`` the node left nearest the cluster's
    #: free CPU per free milli-GPU (then ``fixed``)
    gpu_ties: str = "fixed"
    step: int = GAIN_STEP  #: with ``score=steps``: milli-GPU of gain per step
    half_life: float = DEFAULT_HALF_LIFE  #: with ``workload=online``: pods after which a shape weighs half
    coverage: float = COVERAGE  #: the share of the observed pods the typical shapes cover (at most 1)
    #: one class of pods (``shares``, ``cpu``: CPU-only, ``multi``: several whole GPUs) whose equal
    #: scores go the fixed order's other way, so it fills the nodes the other pods reach last
    reverse: str = "none"


def paper_score(gain: float) -> float:
    """The simulator's score of a gain (milli-GPU): a sigmoid of GPUs, times 100, truncated."""
    return float(int(MAX_SCORE / (1 + math.exp(-gain / MILLI))))


def shape(pod: TracePod, memory: bool = True) -> Shape:
    """The pod's FGD shape (model rule upper-case, as the scheduler reads ``use-gputype``)."""
    models = tuple(pod.gpu_spec.upper().split("|")) if pod.gpu_spec else None
    share = pod.gpu_milli if pod.num_gpu else 0
    mib = pod.memory_mib if memory else 0
    return Shape(pod.cpu_milli, mib, pod.num_gpu, share, models if pod.num_gpu else None)


class Model:
    """Nodes as FGD states, the typical workload and its memo."""

    def __init__(self, nodes: list[TraceNode], variant: Variant, seed: int) -> None:
        mem = variant.memory
        self.states = [
            NodeState.of(n.cpu_milli, n.memory_mib if mem else 0, [Gpu(MILLI, 0, n.model.upper())] * n.gpus)
            for n in nodes
        ]
        self.cpus = [n.cpu_milli for n in nodes]
        #: Each node's place among equal scores (the largest wins), as the scheduler keeps it
        #: (``ties=fixed``) or after a kind of node (``TIE_KINDS``).
        kind = TIE_KINDS.get(variant.ties)
        self.ties = [(kind(n) if kind else 0.0, tie_order(variant.tie_salt + n.name)) for n in nodes]
        #: Free MiB per node, always enforced (NodeResourcesFit), whether or not FGD counts memory.
        self.memory = [n.memory_mib for n in nodes]
        self.variant = variant
        self.rng = random.Random(seed)
        self.histogram = ShapeHistogram(1e12 if variant.workload == "trace" else variant.half_life)
        self.workload: Workload = EMPTY
        self.memo: dict[NodeState, float] = {}
        #: GPUs per free milli-GPU, neither empty nor full (``shares=ss``)
        self.holes: Counter[int] = Counter()
        #: log of the cluster's free milli-CPU per free milli-GPU (``gpu_ties=balance``)
        self.cluster_ratio = 0.0

    def frag(self, state: NodeState) -> float:
        value = self.memo.get(state)
        if value is None:
            value = self.memo[state] = fragmentation(state, self.workload)
        return value

    def _score(self, i: int, state: NodeState, pod: Shape) -> tuple[float, tuple[int, ...]] | None:
        if pod.gpus == 0:
            if self.variant.cpu_pods == "fgd":
                gain = self.frag(state) - self.frag(after(state, pod, ()))
            else:
                return (state.cpu - pod.cpu) / self.cpus[i], ()
            gpus: tuple[int, ...] = ()
        else:
            placed = best_placement(state, pod, self.frag)
            if placed is None:
                return None
            gain, gpus = placed.gain, placed.gpus
        return self._scored(gain), gpus

    def _scored(self, gain: float) -> float:
        if self.variant.score == "paper":
            return paper_score(gain)
        return gain_steps(gain, self.variant.step) if self.variant.score == "steps" else gain

    def _cpu_tie(self, i: int) -> float:
        state = self.states[i]
        idle = sum(state.frees)
        if self.variant.cpu_ties == "least-idle-gpu":
            return -idle
        return state.cpu / (idle + 1)

    def _gpu_tie(self, i: int, pod: Shape) -> float:
        state = self.states[i]
        idle = sum(state.frees)
        asked = pod.gpus * pod.share
        if self.variant.gpu_ties == "fullest":
            return -idle
        if self.variant.gpu_ties == "match":
            return -abs(math.log((pod.cpu + 1) / asked) - math.log((state.cpu + 1) / idle))
        left = idle - asked
        if left <= 0:
            return 0.0
        return -abs(math.log((state.cpu - pod.cpu + 1) / left) - self.cluster_ratio)

    def _ss(self, state: NodeState, pod: Shape) -> tuple[float, tuple[int, ...]] | None:
        """The share's best GPU on a node by Sum-of-Squares: (-rise of the sum, (GPU,)); None: none fits."""
        holes = self.holes
        best: tuple[float, tuple[int, ...]] | None = None
        for i in fitting_gpus(state, pod):
            free = state.frees[i]
            left = free - pod.share
            rise = (1 - 2 * holes[free] if 0 < free < MILLI else 0) + (2 * holes[left] + 1 if left > 0 else 0)
            if best is None or -rise > best[0]:
                best = (-float(rise), (i,))
        return best

    def place(self, pod: Shape, real_memory: int) -> bool:
        """Place one pod on the best node; whether it fitted (``real_memory``: its MiB, always enforced)."""
        share = pod.gpus == 1 and 0 < pod.share < MILLI
        by_ss = self.variant.shares == "ss" and share
        top: float | None = None
        best: list[tuple[int, tuple[int, ...]]] = []
        for i, state in enumerate(self.states):
            if pod.cpu > state.cpu or real_memory > self.memory[i]:
                continue
            scored = self._ss(state, pod) if by_ss else self._score(i, state, pod)
            if scored is None:
                continue
            if top is None or scored[0] > top:
                top, best = scored[0], [(i, scored[1])]
            elif scored[0] == top:
                best.append((i, scored[1]))
        if not best:
            return False
        if share and self.variant.shares == "fgd-ss-ties":
            i, gpus = max(
                best, key=lambda b: ((self._ss(self.states[b[0]], pod) or (0.0,))[0], self.ties[b[0]])
            )
        elif pod.gpus and self.variant.gpu_ties != "fixed":
            if self.variant.gpu_ties == "balance":
                cpu = sum(st.cpu for st in self.states)
                self.cluster_ratio = math.log((cpu + 1) / (sum(sum(st.frees) for st in self.states) + 1))
            i, gpus = max(best, key=lambda b: (self._gpu_tie(b[0], pod), self.ties[b[0]]))
        elif pod.gpus == 0 and self.variant.cpu_ties != "fixed":
            i, gpus = max(best, key=lambda b: (self._cpu_tie(b[0]), self.ties[b[0]]))
        elif self.variant.ties == "fixed" or self.variant.ties in TIE_KINDS:
            kind = "cpu" if pod.gpus == 0 else "shares" if share else "multi" if pod.gpus > 1 else "whole"
            last = min if kind == self.variant.reverse else max
            i, gpus = last(best, key=lambda b: self.ties[b[0]])
        else:
            i, gpus = self.rng.choice(best) if self.variant.ties == "random" else best[0]
        old = self.states[i]
        if share and self.variant.shares == "ss-gpu":
            gpus = (self._ss(old, pod) or (0.0, gpus))[1]
        self.states[i] = new = after(old, pod, gpus)
        for g in gpus:
            self.holes[old.frees[g]] -= 0 < old.frees[g] < MILLI
            self.holes[new.frees[g]] += 0 < new.frees[g] < MILLI
        self.memory[i] -= real_memory
        return True


@dataclass(frozen=True)
class Run:
    """One seed's figures: unallocated GPU % when arrivals reach 100 and 130 % of the GPUs, and the
    GPU remnants at 100 % (GPUs by free milli-GPU, neither empty nor whole)."""

    unallocated: dict[int, float]
    remnants: Counter[int]


def replay(sample: int, seed: int, variant: Variant) -> Run:
    """One seed replayed under ``variant``."""
    nodes = read_nodes(NODES_CSV)[::sample]
    trace = read_pods(PODS_CSV)[::sample]
    capacity = sum(n.gpus for n in nodes) * MILLI
    mem = variant.memory
    model = Model(nodes, variant, seed)
    if variant.workload == "trace":
        for pod in trace:
            model.histogram.observe(shape(pod, mem))
        model.workload = model.histogram.typical(variant.coverage)
    arrived = allocated = 0
    out: dict[int, float] = {}
    remnants: Counter[int] = Counter()
    for k, pod in enumerate(arrivals(trace, capacity, seed)):
        s = shape(pod, mem)
        if variant.workload == "online":
            model.histogram.observe(s)
            if k % REFRESH == 0:
                model.workload, model.memo = model.histogram.typical(variant.coverage), {}
        arrived += pod.gpu_request
        if model.place(s, pod.memory_mib):
            allocated += pod.gpu_request
        for pct in (100, 130):
            if pct not in out and arrived >= pct / 100 * capacity:
                out[pct] = 100 - 100 * allocated / capacity
                if pct == 100:
                    remnants = Counter(f for st in model.states for f in st.frees if 0 < f < MILLI)
    return Run(out, remnants)


def remnants(runs: list[Run], capacity_gpus: int, top: int = 5) -> list[tuple[int, float, float]]:
    """The largest remnant sizes at 100 % arrived by volume: (free milli-GPU, GPUs per seed (mean),
    % of the capacity)."""
    total: Counter[int] = Counter()
    for run in runs:
        total.update(run.remnants)
    by_volume = sorted(total.items(), key=lambda kv: -kv[0] * kv[1])[:top]
    per_seed = ((free, count / len(runs)) for free, count in by_volume)
    return [(free, n, 100 * free * n / MILLI / capacity_gpus) for free, n in per_seed]


def main() -> None:
    """Each variant over every seed; medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=8, help="keep every K-th node and pod (default 8)")
    parser.add_argument("--seeds", default="42", help="seed, list or range, e.g. 42-44")
    parser.add_argument(
        "--variants",
        default="cpu_pods=fgd;cpu_pods=least-allocated",
        help="';'-separated variants, each ','-separated field=value of cpu_pods (fgd, least-allocated), "
        "workload (online, trace), memory (on, off), score (steps, exact, paper), "
        "ties (fixed, first, random, fewest-gpus, most-gpus, most-cpu-per-gpu, least-cpu-per-gpu), "
        "tie_salt (text hashed before node names), cpu_ties (fixed, least-idle-gpu, most-spare-cpu), "
        "shares (fgd, ss, ss-gpu, fgd-ss-ties), gpu_ties (fixed, match, balance), "
        "reverse (none, shares, cpu, multi), "
        "step (milli-GPU per gain step), half_life (pods), coverage (share of the pods, at most 1); "
        "default: CPU-only pods by fgd, then by least-allocated",
    )
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    capacity_gpus = sum(n.gpus for n in read_nodes(NODES_CSV)[:: args.sample])
    figures: dict[str, object] = {"sample": args.sample, "seeds": seeds, "nodes_file": str(Path(NODES_CSV))}
    for text in args.variants.split(";"):
        variant = parse_variant(text)
        runs = [replay(args.sample, seed, variant) for seed in seeds]
        medians = {pct: statistics.median(r.unallocated[pct] for r in runs) for pct in (100, 130)}
        at100, at130 = medians[100], medians[130]
        per_seed = ", ".join(f"{r.unallocated[100]:.2f}/{r.unallocated[130]:.2f}" for r in runs)
        print(
            f"{text or 'hamid'}: unallocated {at100:.2f} % at 100 %, {at130:.2f} % at 130 % arrived "
            f"(seed by seed: {per_seed})",
            flush=True,
        )
        largest = remnants(runs, capacity_gpus)
        parts = [f"{free} free on {n:.0f} GPUs ({pct:.2f} %)" for free, n, pct in largest]
        print("  GPU remnants at 100 % arrived, largest in volume: " + "; ".join(parts), flush=True)
        figures[text or "hamid"] = {
            **{f"unallocated_pct_at_{p}": round(v, 2) for p, v in medians.items()},
            "remnant_pct_by_free_milli_gpu": {str(free): round(pct, 2) for free, _, pct in largest},
        }
    print_figures(figures)


#: Variant fields that take a positive number: step in whole milli-GPU, half-life in pods, coverage
#: a share of the pods (at most 1).
_NUMBERS: dict[str, type[int] | type[float]] = {"step": int, "half_life": float, "coverage": float}


def parse_variant(text: str) -> Variant:
    """``field=value,...`` as a :class:`Variant` (SystemExit naming a bad field or value)."""
    allowed = {
        "cpu_pods": ("fgd", "least-allocated"),
        "workload": ("online", "trace"),
        "memory": ("on", "off"),
        "score": ("steps", "exact", "paper"),
        "ties": ("fixed", "first", "random", *TIE_KINDS),
        "cpu_ties": ("fixed", "least-idle-gpu", "most-spare-cpu"),
        "shares": ("fgd", "ss", "ss-gpu", "fgd-ss-ties"),
        "gpu_ties": ("fixed", "match", "balance", "fullest"),
        "reverse": ("none", "shares", "cpu", "multi"),
    }
    fields: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key in _NUMBERS:
            fields[key] = _number(text, key, value)
            continue
        if key == "tie_salt":
            fields[key] = value
            continue
        if value not in allowed.get(key, ()):
            choices = allowed.get(key, sorted([*allowed, *_NUMBERS, "tie_salt"]))
            raise SystemExit(f"variant {text!r}: {key}={value!r} is not one of {choices}")
        fields[key] = value == "on" if key == "memory" else value
    return Variant(**fields)  # type: ignore[arg-type]


def _number(text: str, key: str, value: str) -> float:
    try:
        number = _NUMBERS[key](value)
    except ValueError:
        number = 0
    if not 0 < number < math.inf or (key == "coverage" and number > 1):
        raise SystemExit(
            f"variant {text!r}: {key}={value!r} is not a positive number (a coverage: at most 1)"
        )
    return number


if __name__ == "__main__":
    main()
