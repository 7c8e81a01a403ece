"""`hamid plugin` loads kubernetes-asyncio's client without its generated models (the plugin's RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import kubernetes_asyncio.client

from hamid.kube.lean import use_lean_client

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from hamid.kube.lean import use_lean_client
    first = use_lean_client()
    import hamid.plugin.app  # the plugin's whole import graph
    from hamid.kube.client import connect
    from hamid.kube.errors import KubeError

    async def main():
        client = await connect(None, sys.argv[1])
        try:
            await client.get_node("n1", timeout=2)
        except KubeError as exc:
            return str(exc)
        finally:
            await client.close()

    error = asyncio.run(main())
    loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
    print(json.dumps({"first": first, "again": use_lean_client(), "loaded": len(loaded),
                      "models": any(".models." in m for m in loaded), "error": error}))
    """
)

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_plugin_imports_no_generated_model_and_still_talks_http(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["first"] is True and result["again"] is False
    assert not result["models"] and result["loaded"] < 40  # the full package is ~860 modules
    assert "GET /api/v1/nodes/n1" in result["error"]  # the kubeconfig was loaded and a request made


def test_a_process_that_loaded_the_typed_client_is_left_alone() -> None:
    assert use_lean_client() is False
    assert hasattr(kubernetes_asyncio.client, "CoreV1Api")
