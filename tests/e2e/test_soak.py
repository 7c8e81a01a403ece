"""A small soak in CI: ``bench/soak.py`` as a separate process (it configures logging for the whole
process), every invariant checked continuously, a hostile tenant included, and its seed reproducing
its workload."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


async def _soak(*args: str, limit: float = 240.0) -> tuple[int, dict[str, Any]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SOAK.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SOAK),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    lines = out.decode().strip().splitlines()
    assert lines, err.decode()[-2000:]
    return int(proc.returncode or 0), json.loads(lines[-1])


@pytest.mark.slow
async def test_small_soak_keeps_every_invariant_and_its_seed_reproduces_the_workload() -> None:
    # the refit path under churn: prediction off, batches of 8 (the soak's defaults before prediction)
    args = (
        "--pods",
        "40",
        "--nodes",
        "2",
        "--seed",
        "7",
        "--live",
        "16",
        "--prediction",
        "off",
        "--concurrency",
        "8",
    )
    code, result = await _soak(*args)
    assert result["violations"] == 0 and result["violation_kinds"] == {}, result
    assert code == 0
    assert result["pods"] == 40 and result["running"] > 0 and result["checks"] > result["pods"]
    assert result["hostile_pods"] > 0 and result["mismatches"] > 0 and result["refits"] > 0, result
    tamper = result["tamper"]  # running pods' allocations rewritten, a parked pod given one
    assert tamper["parked"] > 0 and tamper["patches"] > tamper["parked"], result
    assert tamper["webhook_denied"] == tamper["patches"], result
    assert tamper["reported"] == tamper["patches"] - tamper["parked"], result
    _code, again = await _soak(*args, "--draw-only")
    assert again["workload_sha256"] == result["workload_sha256"]
    _code, other = await _soak("--pods", "40", "--nodes", "2", "--seed", "8", "--draw-only")
    assert other["workload_sha256"] != result["workload_sha256"]


@pytest.mark.slow
async def test_small_soak_with_prediction_scores_every_prediction() -> None:
    args = ("--pods", "40", "--nodes", "2", "--seed", "7", "--live", "16", "--concurrency", "20")
    code, result = await _soak(*args)
    assert result["violations"] == 0 and code == 0, result
    assert result["prediction"] == "on" and result["prediction_hits"] > 0, result
    assert result["prediction_misses"] == sum(result["miss_causes"].values()), result
    assert result["opted_in_refitted"] <= result["opted_in"] and 0 <= result["refit_rate"] <= 1


@pytest.mark.slow
async def test_small_soak_with_the_static_memory_manager_predicts_memory() -> None:
    """Nodes with kubelet's Memory Manager Static and pods whose memory binds before their CPUs: every
    invariant holds and the scheduler predicts kubelet (profiles of format 3 with memory)."""
    args = ("--pods", "40", "--nodes", "2", "--seed", "7", "--live", "16", "--concurrency", "20")
    code, result = await _soak(*args, "--memory-manager", "static")
    assert result["violations"] == 0 and code == 0, result
    assert result["memory_manager"] == "static" and result["prediction_hits"] > 0, result
    assert result["prediction_unknown"] == 0, result
