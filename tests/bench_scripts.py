"""Running a ``bench/`` script as a user does, in its own process, for the tests of its figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
#: The CSV header lines of the trace's node and pod lists.
NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
PODS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos"


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> args`` with the bench's own modules importable (as from ``bench/``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def assert_names_where_the_trace_lives(result: subprocess.CompletedProcess[str], missing: str) -> None:
    """A missing trace file: exit status 2 and one line naming the file and the public trace."""
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{missing} not found" in lines[0]
    assert "github.com/alibaba/clusterdata" in lines[0]
