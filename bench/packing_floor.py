"""How few GPUs could stay idle on the openb trace at 100 % arrived: two floors, solved exactly.

At 100 % arrived the pods that arrived ask for exactly the cluster's GPUs, so the unallocated GPU
is both the GPU the failed pods asked for and the room left beside the GPU shares that run; what
a policy can win is how well the shares are packed. For each seed's arrivals (the bench's own
shuffle and clones, ``replay.pods.arrivals``) this knows every pod in advance and ignores CPU,
memory, node boundaries and arrival order, each a relaxation, so both figures are floors:

- *every share runs*: the fewest GPUs the shares that arrived by 100 % fit on (a GPU holds
  1,000 milli-GPU); any policy under which every share runs leaves at least those GPUs less the
  shares' volume idle, whatever it does with the whole-GPU pods, and more where the whole-GPU pods
  that can run ask for fewer GPUs than the shares leave (NUMA on: kubelet admits some nowhere);
- *whatever runs*: the most GPU that some of the arrived pods can fill (the shares packed, the
  whole-GPU pods one GPU each), a floor for every policy, even one that would leave pods pending
  to keep room for others.

Each for NUMA ``off`` and ``on`` (``bench/trace.py --numa on``, and ``strict``, which leaves the
same pods out): with NUMA on, the pods kubelet never admits on any node (``ShapeCheck``) arrive but
never run.

Both are integer programmes in the arc-flow model of bin packing (a GPU is a path of milli-GPU
from 0 to 1,000; each share an arc of its size), solved to optimality by HiGHS through scipy
(``pip install -e '.[bench]'``), about a second per seed.
The last output line is one JSON object (``benchstats.print_figures``: json.dumps of the figures).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from benchstats import peak_rss_mib, print_figures
from replay.cluster import NumaLayout, ShapeCheck
from replay.pods import (
    MILLI,
    NODES_CSV,
    PODS_CSV,
    TraceError,
    TracePod,
    arrivals,
    parse_seeds,
    read_nodes,
    read_pods,
)

#: ``scipy.optimize.milp``'s status for a problem without a solution.
_INFEASIBLE = 2


@dataclass(frozen=True)
class Arrived:
    """The GPU pods that arrived by 100 % of the capacity and could run: shares by milli-GPU, whole
    GPUs asked."""

    shares: Counter[int]
    whole_gpus: int

    @classmethod
    def of(
        cls, sequence: Sequence[TracePod], capacity_milli: int, never_runs: Callable[[TracePod], bool]
    ) -> Arrived:
        """The pods of ``sequence`` up to the one whose arrival reaches the capacity, less those
        that ``never_runs`` (they arrive, but no node would ever admit them)."""
        shares: Counter[int] = Counter()
        whole = arrived = 0
        for pod in sequence:
            if arrived >= capacity_milli:
                break
            arrived += pod.gpu_request
            if never_runs(pod):
                continue
            if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
                shares[pod.gpu_milli] += 1
            else:
                whole += pod.num_gpu
        return cls(shares, whole)

    @property
    def share_milli(self) -> int:
        """The shares' volume in milli-GPU."""
        return sum(size * n for size, n in self.shares.items())


def _arc_flow(shares: Counter[int]) -> tuple[int, list[tuple[int, int, int]]]:
    """The arc-flow graph in units of the shares' common divisor: (GPU size in units, arcs
    ``(tail, head, share)``, ``share`` 0 for the unused room's unit arcs)."""
    unit = reduce(math.gcd, shares, MILLI)
    size = MILLI // unit
    arcs = [(j, j + s // unit, s) for s in sorted(shares) for j in range(size - s // unit + 1)]
    arcs += [(j, j + 1, 0) for j in range(size)]
    return size, arcs


def _solve(arrived: Arrived, gpus: int, every: bool) -> float:
    """The floor's unallocated milli-GPU: ``every`` share placed on the fewest GPUs, else the most
    GPU any pods fill (``gpus``: the cluster's GPUs)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    if not arrived.shares:
        return float(max(0, gpus - arrived.whole_gpus) * MILLI)
    size, arcs = _arc_flow(arrived.shares)
    kinds = sorted(arrived.shares)
    n_arcs = len(arcs)
    bins, whole = n_arcs, n_arcs + 1  # the GPUs the shares use; the whole GPUs filled
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for k, (tail, head, share) in enumerate(arcs):
        rows += [tail, head]
        cols += [k, k]
        vals += [-1.0, 1.0]
        if share:
            rows.append(size + 1 + kinds.index(share))
            cols.append(k)
            vals.append(1.0)
    # flow: every GPU leaves 0 and reaches ``size``
    rows += [0, size]
    cols += [bins, bins]
    vals += [1.0, -1.0]
    lower = [0.0] * (size + 1)
    upper = [0.0] * (size + 1)
    counts = [float(arrived.shares[s]) for s in kinds]
    lower += counts if every else [0.0] * len(kinds)
    upper += [math.inf] * len(kinds) if every else counts
    # share GPUs and whole GPUs within the cluster, whole GPUs within those asked
    last = size + 1 + len(kinds)
    rows += [last, last, last + 1]
    cols += [bins, whole, whole]
    vals += [1.0, 1.0, 1.0]
    lower += [-math.inf, -math.inf]
    upper += [float(gpus), float(arrived.whole_gpus if not every else 0)]
    cost = np.zeros(n_arcs + 2)
    if every:
        cost[bins] = 1.0
    else:
        for k, (_, _, share) in enumerate(arcs):
            cost[k] = -share
        cost[whole] = -MILLI
    matrix = coo_matrix((vals, (rows, cols)), shape=(last + 2, n_arcs + 2)).tocsr()
    result = milp(
        cost,
        constraints=LinearConstraint(matrix, lower, upper),
        integrality=np.ones(n_arcs + 2),
        bounds=Bounds(0, math.inf),
    )
    if every and result.status == _INFEASIBLE:
        raise TraceError(
            f"the shares that arrive by 100 % cannot all run on {gpus} GPUs: no floor for every share"
        )
    if result.status != 0 or result.x is None:
        raise TraceError(f"the floor's integer programme did not solve: {result.message}")
    if every:
        # the GPUs the shares leave are filled only as far as the whole-GPU pods that run ask
        left_for_whole = gpus * MILLI - arrived.share_milli - arrived.whole_gpus * MILLI
        return float(max(round(result.x[bins]) * MILLI - arrived.share_milli, left_for_whole))
    return float(gpus * MILLI + result.fun)


@dataclass(frozen=True)
class Floors:
    """One seed's floors, as % of the cluster's GPUs left unallocated at 100 % arrived."""

    every_share_runs: float
    whatever_runs: float


def floors(arrived: Arrived, gpus: int) -> Floors:
    """Both floors of one seed's arrivals on a cluster of ``gpus`` GPUs."""
    capacity = gpus * MILLI
    return Floors(
        100 * _solve(arrived, gpus, every=True) / capacity,
        100 * _solve(arrived, gpus, every=False) / capacity,
    )


def main() -> None:
    """Both floors per seed; medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51", help="seed, list or range (default 42-51, the issue's)")
    parser.add_argument("--nodes-csv", type=Path, default=NODES_CSV, help=f"node list (default {NODES_CSV})")
    parser.add_argument("--pods-csv", type=Path, default=PODS_CSV, help=f"pod list (default {PODS_CSV})")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    try:
        nodes = read_nodes(args.nodes_csv)
        gpus = sum(n.gpus for n in nodes)
        trace = read_pods(args.pods_csv)
        import scipy  # noqa: F401
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except ImportError:
        print("error: packing_floor.py needs scipy: pip install -e '.[bench]'", file=sys.stderr)
        raise SystemExit(2) from None
    nodes_numa = ShapeCheck((n.model, NumaLayout.of(n, numa=True)) for n in nodes)
    never_runs: dict[str, Callable[[TracePod], bool]] = {
        "off": lambda _: False,
        "on": lambda pod: nodes_numa.never_admissible(pod, "on"),
    }
    started = time.perf_counter()
    per_seed: dict[str, dict[str, dict[str, float]]] = {numa: {} for numa in never_runs}
    for seed in seeds:
        sequence = arrivals(trace, gpus * MILLI, seed)
        parts = []
        for numa, never in never_runs.items():
            arrived = Arrived.of(sequence, gpus * MILLI, never)
            try:
                found = floors(arrived, gpus)
            except TraceError as exc:
                print(f"error: seed {seed}, NUMA {numa}: {exc}", file=sys.stderr)
                raise SystemExit(2) from None
            per_seed[numa][str(seed)] = {
                "every_share_runs_pct": round(found.every_share_runs, 3),
                "whatever_runs_pct": round(found.whatever_runs, 3),
            }
            parts.append(
                f"NUMA {numa}: {sum(arrived.shares.values())} shares "
                f"({arrived.share_milli / MILLI:.1f} GPUs) and {arrived.whole_gpus} whole GPUs that could "
                f"run, at least {found.every_share_runs:.2f} % unallocated if every share runs, "
                f"{found.whatever_runs:.2f} % whatever runs"
            )
        print(f"seed {seed}, arrived by 100 %: " + "; ".join(parts), flush=True)
    medians = {
        numa: {
            figure: round(statistics.median(seed_figures[figure] for seed_figures in by_seed.values()), 3)
            for figure in ("every_share_runs_pct", "whatever_runs_pct")
        }
        for numa, by_seed in per_seed.items()
    }
    for numa, median in medians.items():
        print(
            f"median of {len(seeds)} seeds, NUMA {numa}: {median['every_share_runs_pct']:.2f} % if every "
            f"share runs, {median['whatever_runs_pct']:.2f} % whatever runs",
            flush=True,
        )
    print_figures(
        {
            "seeds": seeds,
            "gpus": gpus,
            "floor_pct": medians,
            "per_seed": per_seed,
            "seconds": time.perf_counter() - started,
            "peak_rss_mib": peak_rss_mib(),
        }
    )


if __name__ == "__main__":
    main()
