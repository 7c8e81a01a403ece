"""`hamid demo` itself, run as a separate process (it configures logging for the whole process)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from hamidsim.demo import SCENARIOS

_RUN = "from hamid.cli import main; main()"


async def _hamid(*args: str, limit: float = 120.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RUN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_demo_default_scenario_predicts_kubelet_without_a_refit() -> None:
    code, out, err = await _hamid("demo")
    assert code == 0, out + err
    assert "predicted kubelet's NUMA 0 (hamid.io/numa-predicted)" in out
    assert "plugin sent no refit request" in out and "prediction scored: hit" in out
    assert "== prediction: PASS" in out and "FAIL" not in out
    assert err == ""


async def test_demo_prediction_miss_is_corrected_by_the_refit() -> None:
    code, out, err = await _hamid("demo", "--scenario", "prediction-miss")
    assert code == 0, out + err
    assert "Normal  NumaRefitSucceed  NUMA refit moved container 0 from [GPU-f4c61521" in out
    assert "prediction scored: miss, cause foreign" in out
    assert "== prediction-miss: PASS" in out and "FAIL" not in out


async def test_demo_memory_decides_the_numa_node_and_is_predicted() -> None:
    code, out, err = await _hamid("demo", "--scenario", "memory-prediction")
    assert code == 0, out + err
    assert "memory pinned to NUMA 0" in out and "kubelet's memory manager pinned 64Gi to NUMA 1" in out
    assert "predicted kubelet's NUMA 1" in out and "plugin sent no refit request" in out
    assert "== memory-prediction: PASS" in out and "FAIL" not in out


async def test_demo_refit_scenario_prints_the_timeline() -> None:
    code, out, err = await _hamid("demo", "--scenario", "refit")
    assert code == 0, out + err
    for step in ("scheduler", "kubelet", "refit", "event", "allocate", "check"):
        assert f" {step} " in out
    assert "Normal  NumaRefitSucceed  NUMA refit moved container 0 from [GPU-ba09367f" in out
    assert "== refit: PASS" in out and "FAIL" not in out
    assert err == ""  # nothing on stderr: no warning for expected behaviour (empty answers, own shutdown)


@pytest.mark.slow
async def test_demo_all_scenarios_json() -> None:
    code, out, err = await _hamid("demo", "--scenario", "all", "--json", limit=240.0)
    assert code == 0, out + err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] is True
    assert [s["scenario"] for s in result["scenarios"]] == list(SCENARIOS)
    for scenario in result["scenarios"]:
        assert scenario["ok"] and all(c["ok"] for c in scenario["checks"]), scenario
    refit = result["scenarios"][0]
    assert refit["event"].startswith("NUMA refit moved container 0 from [")
    running = [s["final"] for s in result["scenarios"] if s.get("final", {}).get("phase") == "Running"]
    # refit, numa-bind, exact-fit, many-numa, the three best-effort/disabled fallbacks, prediction,
    # prediction-miss and memory-prediction
    assert len(running) == 10
    for final in running:  # every running container is on its accounted GPUs, fallback or not
        assert (
            sorted(final["runtimeGpus"])
            == sorted(final["allocatedAnnotation"])
            == sorted(final["accounting"])
        )


async def test_demo_rejects_unknown_scenario() -> None:
    code, _out, err = await _hamid("demo", "--scenario", "nope", limit=60.0)
    assert code == 2 and "nope" in err
