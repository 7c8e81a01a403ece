"""docs/compatibility.md's example of where hamid's GPU choice differs from HAMi's (mixed GPU sizes)."""

from __future__ import annotations

from typing import TypedDict

from hamid.fit import Fitted, device_score, fit_pod

from .helpers import dev, node, req, spec


class Gpu(TypedDict):
    count: int
    mem: int
    core: int
    used: int
    usedmem: int


#: GPU-a: 80 GiB holding 16 GiB of one pod; GPU-b: 24 GiB holding 4 GiB of one pod.
A: Gpu = {"count": 10, "mem": 81920, "core": 100, "used": 1, "usedmem": 16384}
B: Gpu = {"count": 10, "mem": 24576, "core": 100, "used": 1, "usedmem": 4096}
REQUEST = req(1, mem=8192)


def hami_score(d: Gpu) -> float:
    """HAMi's score on real GPUs: the request's type never equals the model name, so it adds 0."""
    return device_score(d["count"], d["core"], d["mem"], d["used"], 0, d["usedmem"], None)


def hamid_score(d: Gpu) -> float:
    return device_score(d["count"], d["core"], d["mem"], d["used"], 0, d["usedmem"], REQUEST)


def test_scores_of_the_example() -> None:
    assert round(hami_score(A), 3) == 3.0 and round(hami_score(B), 3) == 2.667
    assert round(hamid_score(A), 3) == 5.0 and round(hamid_score(B), 3) == 7.0


def test_binpack_and_spread_pick_the_other_gpu_than_hami() -> None:
    n = node(dev("GPU-a", 0, **A), dev("GPU-b", 1, **B))
    binpack = fit_pod(n, spec(REQUEST, gpu_policy="binpack"))
    spread = fit_pod(n, spec(REQUEST, gpu_policy="spread"))
    assert isinstance(binpack, Fitted) and isinstance(spread, Fitted)
    # HAMi: binpack takes the highest score (GPU-a, 3.0), spread the lowest (GPU-b, 2.667)
    assert binpack.devices[0][0].uuid == "GPU-b"
    assert spread.devices[0][0].uuid == "GPU-a"
