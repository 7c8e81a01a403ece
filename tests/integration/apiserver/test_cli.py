"""`hamid sim apiserver` as a subprocess: first line, one request, terminate."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner
from kubernetes_asyncio import client

from hamid.cli import cli

HAMID = (sys.executable, "-c", "from hamid.cli import main; main()")


async def test_sim_apiserver_command(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: gpu-node-1\n---\n"
        "apiVersion: v1\nkind: List\nitems:\n"
        "- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: team\n"
    )
    proc = await asyncio.create_subprocess_exec(
        *HAMID,
        "sim",
        "apiserver",
        "--listen",
        "127.0.0.1:0",
        "--seed-file",
        str(seed),
        "--write-kubeconfig",
        str(tmp_path / "kubeconfig"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.removeprefix("listening on ")
        written = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert written.startswith(f"kubeconfig written to {tmp_path / 'kubeconfig'}")
        kubeconfig = yaml.safe_load((tmp_path / "kubeconfig").read_text())
        assert kubeconfig["clusters"][0]["cluster"]["server"] == url
        assert kubeconfig["current-context"] == "hamid-sim"
        async with client.ApiClient(client.Configuration(host=url)) as api:
            nodes = await client.CoreV1Api(api).list_node()
            assert [n.metadata.name for n in nodes.items] == ["gpu-node-1"]
            team = await client.CoreV1Api(api).read_namespace("team")
            assert team.status.phase == "Active"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0


def test_sim_apiserver_rejects_bad_listen() -> None:
    result = CliRunner().invoke(cli, ["sim", "apiserver", "--listen", "nonsense"])
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output
