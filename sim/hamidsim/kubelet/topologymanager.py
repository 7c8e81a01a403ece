"""kubelet's Topology Manager (``pkg/kubelet/cm/topologymanager``) as pure code.

Hints, bitmask order, the merge of every provider's hints per policy with the Narrowest (or, with
``prefer-closest-numa-nodes``, the Closest) rule, policy options and the checks kubelet makes when
it creates the manager. Where Go iterates a map, this code iterates in sorted order, which is one
of the orders Go may produce. NUMA masks are ``frozenset[int]``; ``None`` is kubelet's nil mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from hamid.model.errors import InvalidInput

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
TOPOLOGY_POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)
SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
TOPOLOGY_SCOPES = (SCOPE_CONTAINER, SCOPE_POD)

OPTION_PREFER_CLOSEST = "prefer-closest-numa-nodes"
OPTION_MAX_ALLOWABLE = "max-allowable-numa-nodes"
#: Every option is GA in 1.35 (``stableOptions``); kubelet knows no others.
TOPOLOGY_OPTIONS = (OPTION_PREFER_CLOSEST, OPTION_MAX_ALLOWABLE)
#: kubelet's ``defaultMaxAllowableNUMANodes``.
MAX_ALLOWABLE_NUMA_NODES = 8

NumaMask = frozenset[int]
#: ``distance(a, b)`` between two NUMA nodes.
Distance = Callable[[int, int], int]


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """kubelet's ``TopologyHint``: a NUMA mask (None = any) and whether it is preferred."""

    affinity: NumaMask | None
    preferred: bool

    def describe(self) -> str:
        """``{0}+``-style text for logs (``any`` for a nil mask, ``-`` when not preferred)."""
        mask = "any" if self.affinity is None else "{" + ",".join(map(str, sorted(self.affinity))) + "}"
        return f"{mask}{'+' if self.preferred else '-'}"


# One provider's answer: None (no map at all) or resource → hints (None = don't care, [] = cannot).
ProviderHints = Mapping[str, list[TopologyHint] | None] | None


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """``topologymanager.PolicyOptions``."""

    prefer_closest: bool = False
    max_allowable_numa_nodes: int = MAX_ALLOWABLE_NUMA_NODES


def parse_go_bool(name: str, value: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise InvalidInput(f'bad value for option "{name}": strconv.ParseBool: parsing "{value}": invalid syntax')


def parse_policy_options(options: Mapping[str, str]) -> PolicyOptions:
    """``NewPolicyOptions``: kubelet's own errors for unknown options and bad values."""
    prefer_closest = False
    max_allowable = MAX_ALLOWABLE_NUMA_NODES
    for name in sorted(options):
        value = options[name]
        if name not in TOPOLOGY_OPTIONS:
            raise InvalidInput(f'unknown Topology Manager Policy option: "{name}"')
        if name == OPTION_PREFER_CLOSEST:
            prefer_closest = parse_go_bool(name, value)
            continue
        try:
            max_allowable = int(value, 10)
        except ValueError:
            raise InvalidInput(
                f'unable to convert policy option to integer "{name}": strconv.Atoi: parsing "{value}": '
                "invalid syntax"
            ) from None
        if max_allowable < MAX_ALLOWABLE_NUMA_NODES:
            raise InvalidInput(
                f'the minimum value of "{name}" should not be less than {MAX_ALLOWABLE_NUMA_NODES}'
            )
    return PolicyOptions(prefer_closest, max_allowable)


def check_manager(
    numa_nodes: Sequence[int], policy: str, scope: str = SCOPE_CONTAINER, options: PolicyOptions | None = None
) -> None:
    """What ``topologymanager.NewManager`` refuses: too many NUMA nodes, an unknown policy or scope."""
    opts = options or PolicyOptions()
    if policy != POLICY_NONE and len(numa_nodes) > opts.max_allowable_numa_nodes:
        raise InvalidInput(
            f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes"
        )
    if policy not in TOPOLOGY_POLICIES:
        raise InvalidInput(f'unknown policy: "{policy}"')
    if scope not in TOPOLOGY_SCOPES:
        raise InvalidInput(f'unknown scope: "{scope}"')


# --- bitmask ---------------------------------------------------------------------------------------


def mask_value(mask: Iterable[int]) -> int:
    """The mask as kubelet's uint64 bitmask (bit n = NUMA node n)."""
    return sum(1 << n for n in set(mask) if 0 <= n < 64)


def is_narrower(a: NumaMask, b: NumaMask) -> bool:
    """``bitmask.IsNarrowerThan``: fewer nodes, or as many nodes and numerically smaller."""
    if len(a) == len(b):
        return mask_value(a) < mask_value(b)
    return len(a) < len(b)


def iterate_masks(numa_nodes: Sequence[int]) -> Iterator[NumaMask]:
    """``bitmask.IterateBitMasks``: every non-empty subset, by size, in combination order."""
    nodes = list(numa_nodes)
    for size in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, size):
            yield frozenset(combo)


def average_distance(mask: NumaMask, distance: Distance) -> Fraction:
    """``NUMADistances.CalculateAverageFor``: the mean over every ordered pair of nodes in the mask."""
    if not mask:
        return Fraction(0)
    total = sum(distance(a, b) for a in mask for b in mask)
    return Fraction(total, len(mask) ** 2)


def closest(a: NumaMask, b: NumaMask, distance: Distance) -> NumaMask:
    """``NUMAInfo.Closest``: narrower first; equal width → smaller average distance → smaller mask."""
    if len(a) != len(b):
        return a if is_narrower(a, b) else b
    da, db = average_distance(a, distance), average_distance(b, distance)
    if da == db:
        return a if mask_value(a) < mask_value(b) else b
    return a if da < db else b


# --- merge (policy.go, policy_*.go) ----------------------------------------------------------------


def filter_providers_hints(providers_hints: Sequence[ProviderHints]) -> list[list[TopologyHint]]:
    """``filterProvidersHints``: normalise each provider's answer into one hint list per resource."""
    result: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:
            result.append([TopologyHint(None, True)])
            continue
        for resource in sorted(hints):
            resource_hints = hints[resource]
            if resource_hints is None:
                result.append([TopologyHint(None, True)])
            elif not resource_hints:
                result.append([TopologyHint(None, False)])
            else:
                result.append(list(resource_hints))
    return result


def _narrowest_hint(hints: Sequence[TopologyHint]) -> TopologyHint | None:
    best: TopologyHint | None = None
    for hint in hints:
        if hint.affinity is None:
            continue
        if best is None or is_narrower(hint.affinity, best.affinity or frozenset()):
            best = hint
    return best


def _max_of_min_affinity_counts(filtered: Sequence[Sequence[TopologyHint]]) -> int:
    result = 0
    for hints in filtered:
        narrowest = _narrowest_hint(hints)
        if narrowest is not None and narrowest.affinity is not None:
            result = max(result, len(narrowest.affinity))
    return result


def _merge_permutation(default: NumaMask, permutation: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    affinities: list[NumaMask] = []
    for hint in permutation:
        if hint.affinity is not None:
            affinities.append(hint.affinity)
            if hint.affinity != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default
    for affinity in affinities:
        merged = merged & affinity
    return TopologyHint(frozenset(merged), preferred)


class _HintMerger:
    """``HintMerger``: walks every permutation of one hint per resource and keeps the best merge."""

    def __init__(
        self, numa_nodes: Sequence[int], hints: list[list[TopologyHint]], distance: Distance | None
    ) -> None:
        self.default = frozenset(numa_nodes)
        self.hints = hints
        self.best_non_preferred = _max_of_min_affinity_counts(hints)
        self.distance = distance

    def _compare_masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        cur, cand = current.affinity or frozenset(), candidate.affinity or frozenset()
        if cand == cur:
            return current
        if self.distance is not None:
            return current if closest(cur, cand, self.distance) == cur else candidate
        return candidate if is_narrower(cand, cur) else current

    def _compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        cand_count = len(candidate.affinity or ())
        if cand_count == 0:
            return current
        if current is None:
            return candidate
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self._compare_masks(current, candidate)
        return self._compare_non_preferred(current, candidate, cand_count)

    def _compare_non_preferred(
        self, current: TopologyHint, candidate: TopologyHint, cand_count: int
    ) -> TopologyHint:
        cur_count = len(current.affinity or ())
        best = self.best_non_preferred
        if cur_count > best:
            if cand_count > cur_count:
                return current
            if cand_count == cur_count:
                return self._compare_masks(current, candidate)
            return candidate
        if cur_count == best:
            if cand_count != best:
                return current
            return self._compare_masks(current, candidate)
        if cand_count > best:
            return current
        if cand_count == best:
            return candidate
        if cand_count > cur_count:
            return candidate
        if cand_count == cur_count:
            return self._compare_masks(current, candidate)
        return current

    def merge(self) -> TopologyHint:
        best: TopologyHint | None = None
        for permutation in itertools.product(*self.hints):
            best = self._compare(best, _merge_permutation(self.default, permutation))
        return best if best is not None else TopologyHint(self.default, False)


def _filter_single_numa_hints(all_hints: list[list[TopologyHint]]) -> list[list[TopologyHint]]:
    return [
        [h for h in hints if h.preferred and (h.affinity is None or len(h.affinity) == 1)]
        for hints in all_hints
    ]


def merge_hints(
    policy: str,
    numa_nodes: Sequence[int],
    providers_hints: Sequence[ProviderHints],
    distance: Distance | None = None,
) -> tuple[TopologyHint, bool]:
    """The Topology Manager's ``Merge`` for ``policy``: ``(best hint, admit)``.

    ``distance`` is given when ``prefer-closest-numa-nodes`` is on (ignored by single-numa-node,
    as in kubelet). Policy ``none`` computes nothing: ``(TopologyHint(None, False), True)``.
    """
    if policy == POLICY_NONE:
        return TopologyHint(None, False), True
    filtered = filter_providers_hints(providers_hints)
    if policy == POLICY_SINGLE_NUMA_NODE:
        best = _HintMerger(numa_nodes, _filter_single_numa_hints(filtered), None).merge()
        if best.affinity == frozenset(numa_nodes):
            best = TopologyHint(None, best.preferred)
        return best, best.preferred
    if policy == POLICY_RESTRICTED:
        best = _HintMerger(numa_nodes, filtered, distance).merge()
        return best, best.preferred
    if policy == POLICY_BEST_EFFORT:
        return _HintMerger(numa_nodes, filtered, distance).merge(), True
    raise InvalidInput(f'unknown policy: "{policy}"')
