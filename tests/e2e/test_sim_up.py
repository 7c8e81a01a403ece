"""`hamid sim up` and `hamid demo --keep` as a user runs them: real kubectl, bounded time, Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
from click.testing import CliRunner

from hamid.cli import cli
from tests.integration.apiserver.kubectl import Kubectl, needs_kubectl

pytestmark = needs_kubectl
HAMID = (sys.executable, "-c", "from hamid.cli import main; main()")
READY_LINE = "Ctrl-C stops the cluster."


async def _start(tmp_path: Path, *args: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    """Start hamid with ``args`` and read stdout up to the ready line (60 s at most)."""
    log = (tmp_path / "hamid.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *HAMID,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log.close()
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(60):
        while READY_LINE not in lines:
            line = (await proc.stdout.readline()).decode()
            assert line, f"hamid exited before it was ready: {lines}"
            lines.append(line.rstrip("\n"))
    return proc, lines


def _web_view(lines: list[str]) -> str:
    """The ``/ui`` URL hamid printed."""
    found = [line.split()[2] for line in lines if line.startswith("web view: ")]
    assert len(found) == 1 and found[0].endswith("/ui"), lines
    return found[0]


async def _page(url: str) -> str:
    """GET one page of the web view (200 expected)."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200, url
        return await resp.text()


async def _interrupt(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        return await proc.wait()


async def _wait_running(kubectl: Kubectl, name: str) -> dict:
    async with asyncio.timeout(30):
        while True:
            code, out = await kubectl.run("get", "pod", name, "-o", "json")
            pod = json.loads(out) if code == 0 else {}
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed"):
                return pod
            await asyncio.sleep(0.3)


async def test_sim_up_mutates_schedules_binds_admits_and_refits(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sim.kubeconfig"
    proc, lines = await _start(
        tmp_path, "sim", "up", "--listen", "127.0.0.1:0", "--write-kubeconfig", str(kubeconfig)
    )
    try:
        assert f"  export KUBECONFIG={kubeconfig}" in lines
        example = tmp_path / "numa-aligned.yaml"
        assert f"  kubectl apply -f {example}" in lines
        kubectl = Kubectl.for_kubeconfig(kubeconfig, tmp_path)
        assert "node-1" in await kubectl.ok("get", "nodes")
        assert "pod/numa-aligned created" in await kubectl.ok("apply", "-f", str(example))
        pod = await _wait_running(kubectl, "numa-aligned")
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["schedulerName"] == "hami-scheduler", (
            "mutated by the webhook the API server called"
        )
        assert pod["spec"]["nodeName"] == "node-1"
        notes = pod["metadata"]["annotations"]
        assert notes["hami.io/bind-phase"] == "success"
        events = await kubectl.ok("get", "events", "--field-selector", "involvedObject.name=numa-aligned")
        for reason in ("FilteringSucceed", "BindingSucceed", "Scheduled", "NumaRefitSucceed"):
            assert reason in events, events
        described = await kubectl.ok("describe", "pod", "numa-aligned")
        assert "NUMA refit moved container 0" in described
        assert "Guaranteed" in described
        page = await _page(_web_view(lines) + "/pod/default/numa-aligned")
        assert "NumaRefitSucceed" in page and "NUMA refit moved container 0" in page
    finally:
        code = await _interrupt(proc)
    assert code == 0
    assert (tmp_path / "hamid.log").read_text().count("Traceback") == 0


async def test_demo_keep_prints_the_scenario_then_serves(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "demo.kubeconfig"
    proc, lines = await _start(
        tmp_path, "demo", "--keep", "--scenario", "refit", "--write-kubeconfig", str(kubeconfig)
    )
    try:
        assert "== refit: PASS" in lines
        kubectl = Kubectl.for_kubeconfig(kubeconfig, tmp_path)
        pods = await kubectl.ok("get", "pods")
        assert "numa-aligned" in pods and "Running" in pods
        assert "pod/numa-aligned-2 created" in await kubectl.ok(
            "apply", "-f", str(tmp_path / "numa-aligned.yaml")
        )
        pod = await _wait_running(kubectl, "numa-aligned-2")
        assert pod["status"]["phase"] == "Running" and pod["spec"]["schedulerName"] == "hami-scheduler"
        assert "node-1" in await _page(_web_view(lines))
    finally:
        code = await _interrupt(proc)
    assert code == 0


def test_sim_up_on_a_busy_port_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["sim", "up", "--listen", f"127.0.0.1:{port}", "--write-kubeconfig", str(tmp_path / "k")]
        )
    assert result.exit_code == 1
    assert f"cannot start the cluster on 127.0.0.1:{port}" in result.output
    assert not (tmp_path / "k").exists()


def test_demo_keep_needs_one_scenario() -> None:
    result = CliRunner().invoke(cli, ["demo", "--keep", "--scenario", "all"])
    assert result.exit_code == 2
    assert "--keep keeps one scenario's cluster" in result.output
