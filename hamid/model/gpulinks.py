"""GPU pair links and HAMi's pair scores (``hami.io/node-nvidia-score``), from NVML or a file.

HAMi's plugin (``pkg/device/nvidia/links.go``, ``calculate_score.go``) records, for every ordered
pair of GPUs, one P2P link from NVML's common ancestor and, when there are 1-18 NVLinks between
them, one NVLink link; a pair scores the sum of its links (P2P level 10-60, ``100·k`` for ``k``
NVLinks). A pair whose two directions hold a different number of links scores 0 both ways and
the node gets an ``AsymmetricGPUP2PLink`` Warning. This module is that computation, shared by
the NVML and the devices-file paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: NVML common-ancestor levels (``nvmlGpuTopologyLevel_t``) by name, with HAMi's P2P score.
#: nvidia-smi ``topo -m`` shows SINGLE as PIX, MULTIPLE as PXB, HOSTBRIDGE as PHB, NODE as NODE
#: and SYSTEM as SYS; INTERNAL is two GPUs on one board.
P2P_LEVEL_SCORES: Mapping[str, int] = {
    "SYSTEM": 10,  # P2PLinkCrossCPU
    "NODE": 20,  # P2PLinkSameCPU
    "HOSTBRIDGE": 30,  # P2PLinkHostBridge
    "MULTIPLE": 40,  # P2PLinkMultiSwitch
    "SINGLE": 50,  # P2PLinkSingleSwitch
    "INTERNAL": 60,  # P2PLinkSameBoard
}
#: NVML's numeric level constants (``NVML_TOPOLOGY_*``) → level names.
NVML_TOPOLOGY_LEVELS: Mapping[int, str] = {
    0: "INTERNAL",
    10: "SINGLE",
    20: "MULTIPLE",
    30: "HOSTBRIDGE",
    40: "NODE",
    50: "SYSTEM",
}
#: HAMi knows NVLink link types for 1..18 links (H100/B200); other counts add no link.
MAX_SCORED_NVLINKS = 18
NVLINK_SCORE = 100

#: Node Warning event HAMi's plugin emits when a pair is asymmetric.
ASYMMETRIC_REASON = "AsymmetricGPUP2PLink"
ASYMMETRIC_MESSAGE = (
    "One or more GPU pairs on this node have asymmetric P2P link data; "
    "affected pairs scored 0 (possible NVLink hardware or driver issue)"
)


@dataclass(frozen=True, slots=True)
class GpuLink:
    """What one GPU sees towards another: its P2P level (None = unknown) and NVLink count."""

    level: str | None
    nvlinks: int = 0

    def links(self) -> int:
        """How many HAMi ``P2PLink`` entries this direction holds (0, 1 or 2)."""
        return (self.level is not None) + (1 <= self.nvlinks <= MAX_SCORED_NVLINKS)

    def score(self) -> int:
        """The sum of this direction's link scores."""
        p2p = P2P_LEVEL_SCORES[self.level] if self.level is not None else 0
        nvlink = NVLINK_SCORE * self.nvlinks if 1 <= self.nvlinks <= MAX_SCORED_NVLINKS else 0
        return p2p + nvlink


#: ``{gpu uuid: {other gpu uuid: link}}``, one entry per ordered pair known.
GpuLinks = Mapping[str, Mapping[str, GpuLink]]
_NO_LINK = GpuLink(level=None)


@dataclass(frozen=True, slots=True)
class PairScores:
    """HAMi's ``ListDeviceScore`` for some GPUs, and whether any pair was asymmetric."""

    scores: dict[str, dict[str, int]]
    asymmetric: tuple[tuple[str, str], ...] = ()


def pair_scores(links: GpuLinks, uuids: Sequence[str]) -> PairScores:
    """Score every ordered pair of ``uuids`` (the registered GPUs, in register order).

    HAMi's ``calculateGPUScore``: a pair missing from ``links`` holds no link and scores 0; a
    pair whose directions hold different link counts scores 0 and is reported as asymmetric.
    """
    scores: dict[str, dict[str, int]] = {}
    asymmetric: list[tuple[str, str]] = []
    for a in uuids:
        row: dict[str, int] = {}
        for b in uuids:
            if a == b:
                continue
            forward = links.get(a, {}).get(b, _NO_LINK)
            backward = links.get(b, {}).get(a, _NO_LINK)
            if forward.links() != backward.links():
                row[b] = 0
                if a < b:
                    asymmetric.append((a, b))
                continue
            row[b] = forward.score()
        scores[a] = row
    return PairScores(scores, tuple(asymmetric))
