"""The read-only Kubernetes object types make a write a type error (mypy is the checker)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from mypy import api as mypy_api

REPO = Path(__file__).resolve().parents[3]

WRITES = textwrap.dedent(
    """
    from hamid.kube.cache import PodCache
    from hamid.model.kube import Node, Pod, PodBody
    from hamid.scheduler.podtrim import trim_scheduler_pod


    def record_writes(pod: Pod, node: Node) -> None:
        pod["metadata"] = {}  # write
        pod["metadata"]["annotations"]["hami.io/x"] = "y"  # write
        node["status"]["allocatable"]["nvidia.com/gpu"] = "4"  # write


    def body_writes(pod: PodBody) -> None:
        pod["spec"]["containers"][0]["name"] = "x"  # write


    def shared_record_writes(cache: PodCache, raw: dict[str, object]) -> None:
        record = trim_scheduler_pod(dict(raw))
        record["spec"]["nodeName"] = "n1"  # write
        cached = cache.get("default/p")
        if cached is not None:
            cached["metadata"]["labels"]["app"] = "x"  # write


    def reads(pod: Pod) -> str:
        return pod.get("metadata", {}).get("annotations", {}).get("hami.io/x", "")
    """
)


def test_writes_to_read_only_objects_are_type_errors(tmp_path: Path) -> None:
    snippet = tmp_path / "writes.py"
    snippet.write_text(WRITES)
    # The project's settings and cache (warm after CI's mypy step), so only the snippet is new.
    out, err, _status = mypy_api.run(
        [
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(REPO / ".mypy_cache"),
            str(snippet),
        ]
    )
    flagged = sorted({int(m) for m in re.findall(r"writes\.py:(\d+): error", out)})
    writes = [n for n, line in enumerate(WRITES.splitlines(), 1) if line.endswith("# write")]
    assert len(writes) == 6
    assert flagged == writes, out + err
