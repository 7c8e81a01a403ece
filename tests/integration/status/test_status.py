"""``hamid status`` against the embedded API server: GPUs per node and NUMA node, pods, refits."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hamid.kube.client import connect
from hamid.kube.events import EventRecorder
from hamid.model.annotations import (
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    NODE_REGISTER,
    encode_node_devices,
    encode_pod_devices,
)
from hamid.model.devices import MODE_HAMI_CORE, MODE_MIG, ContainerDevice, DeviceInfo, MigPlacement
from hamid.model.mig import MigAllocation, encode_mig_allocations
from hamid.model.reasons import EVENT_NUMA_REFIT_SUCCEED
from hamid.status import ClusterStatus, build_status, collect, refit_records, render_text
from hamidsim.apiserver import ApiServer
from tests import builders

REPO = Path(__file__).resolve().parents[3]


def gpu(i: int, numa: int) -> DeviceInfo:
    return DeviceInfo(f"GPU-{i}", i, 10, 16000, 100, "NVIDIA-A100", numa, MODE_HAMI_CORE, True)


def pod(
    name: str, devices: list[list[ContainerDevice]], phase: str = "Running", **spec: Any
) -> dict[str, Any]:
    return builders.pod(
        name,
        node="n1",
        annotations={DEVICES_ALLOCATED: encode_pod_devices(devices)},
        containers=[builders.container(f"c{i}", image="cuda") for i in range(len(devices))],
        status={"phase": phase},
        spec=spec,
    )


async def seed(server: ApiServer) -> None:
    register = encode_node_devices([gpu(0, 0), gpu(1, 0), gpu(2, 1)])
    server.put(builders.node("n1", annotations={NODE_REGISTER: register}))
    server.put(builders.node("cpu-only"))
    server.put(pod("a", [[ContainerDevice("GPU-2", "NVIDIA", 4000, 30)]]))
    server.put(
        pod(
            "b",
            [[ContainerDevice("GPU-2", "NVIDIA", 2000, 20)], [ContainerDevice("GPU-0", "NVIDIA", 1000, 0)]],
        )
    )
    server.put(pod("done", [[ContainerDevice("GPU-1", "NVIDIA", 8000, 50)]], phase="Succeeded"))
    kube = await connect(api_server=server.url)
    try:
        recorder = EventRecorder(kube, "hami-scheduler")
        target = server.get("Pod", "default", "a")
        assert target is not None
        await recorder.record(
            target, "Normal", EVENT_NUMA_REFIT_SUCCEED, "NUMA refit moved container 0 from [GPU-0] to [GPU-2]"
        )
    finally:
        await kube.close()


async def test_status_per_node_numa_gpu(apiserver: ApiServer) -> None:
    await seed(apiserver)
    kube = await connect(api_server=apiserver.url)
    try:
        status = await collect(kube, None, 10)
    finally:
        await kube.close()
    (node,) = status.nodes
    assert node.name == "n1" and node.problems == []
    gpus = {g.uuid: g for g in node.gpus}
    assert (gpus["GPU-2"].numa, gpus["GPU-2"].used_memory_mib, gpus["GPU-2"].used_cores) == (1, 6000, 50)
    assert sorted(gpus["GPU-2"].pods) == ["default/a", "default/b"]
    assert (gpus["GPU-0"].used_memory_mib, gpus["GPU-0"].pods) == (1000, ["default/b"])
    assert (gpus["GPU-1"].used_memory_mib, gpus["GPU-1"].pods) == (0, [])  # Succeeded pods free their GPUs
    (refit,) = status.refits
    assert (refit.reason, refit.pod) == (EVENT_NUMA_REFIT_SUCCEED, "default/a")
    text = render_text(status)
    assert "  NUMA 1\n    GPU 2 GPU-2 NVIDIA-A100: memory 6000/16000 MiB, cores 50/100%, slots 2/10" in text
    assert "from [GPU-0] to [GPU-2]" in text


def test_status_text_carries_no_terminal_escape() -> None:
    """What tenants or nodes wrote (an Event message quoting a pod's annotation, a GPU type from a
    registration) is shown with its control characters escaped, never run by the terminal."""
    hostile = "\x1b]0;PWNED\x07\x1b[2J\x1b]52;c;Zm9v\x07\r\x9b31m"
    register = encode_node_devices([dataclasses.replace(gpu(0, 0), type=f"NVIDIA-A100{hostile}")])
    node = builders.node("n1", annotations={NODE_REGISTER: register})
    event = {
        "type": "Warning",
        "reason": EVENT_NUMA_REFIT_SUCCEED,
        "message": f"refused: pinned to [{hostile}]",
        "involvedObject": {"namespace": "default", "name": "a"},
        "lastTimestamp": "2026-12-04T10:00:00Z",
    }
    text = render_text(ClusterStatus(build_status([node], []), refit_records([event], 10)))
    assert all(c.isprintable() for line in text.splitlines() for c in line), text
    assert "NVIDIA-A100\\x1b]0;PWNED\\x07" in text and "pinned to [\\x1b]0;PWNED" in text


async def hamid(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KUBECONFIG", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from hamid.cli import main; main()",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def test_status_counts_every_mig_instance_of_a_pod_as_the_scheduler_books_them() -> None:
    """An init container's MIG instance stays beside the app's after the init release: their sum."""
    register = encode_node_devices([DeviceInfo("GPU-m", 0, 7, 40960, 100, "NVIDIA-A100", 0, MODE_MIG, True)])
    p = pod(
        "p", [[ContainerDevice("GPU-m", "NVIDIA", 5120, 14)], [ContainerDevice("GPU-m", "NVIDIA", 10240, 28)]]
    )
    p["spec"]["initContainers"] = [p["spec"]["containers"].pop(0)]
    p["status"]["initContainerStatuses"] = [{"name": "c0", "state": {"terminated": {"exitCode": 0}}}]
    p["metadata"]["annotations"][MIG_ALLOCATIONS] = encode_mig_allocations(
        [
            MigAllocation(0, 0, "GPU-m", "1g.5gb", MigPlacement(6, 1)),
            MigAllocation(1, 0, "GPU-m", "2g.10gb", MigPlacement(0, 2)),
        ]
    )
    (node,) = build_status([builders.node("n1", annotations={NODE_REGISTER: register})], [p])
    (gpu_m,) = node.gpus
    assert (gpu_m.used_slots, gpu_m.used_memory_mib, gpu_m.used_cores) == (2, 15360, 42)


async def test_status_cli_with_a_kubeconfig(apiserver: ApiServer, tmp_path: Path) -> None:
    await seed(apiserver)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u"}}],
                "current-context": "sim",
            }
        )
    )
    code, out, err = await hamid("status", f"--kubeconfig={kubeconfig}", "--output=json")
    assert code == 0, err
    data = json.loads(out)
    assert [n["name"] for n in data["nodes"]] == ["n1"]
    assert data["refits"][0]["pod"] == "default/a"
    code, out, err = await hamid("status", f"--api-server={apiserver.url}", "--node=n1")
    assert code == 0, err
    assert out.startswith("node n1\n  NUMA 0\n")


async def test_status_with_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    code, _out, err = await hamid("status", f"--kubeconfig={tmp_path / 'none'}")
    assert code == 1
    assert err.strip() == f"Error: kubeconfig {tmp_path / 'none'} does not exist (--kubeconfig or KUBECONFIG)"


async def test_kubectl_hamid_status_with_a_context_of_the_kubeconfig(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    """``kubectl hamid status --context other``: kubectl finds the ``kubectl-hamid`` plugin on
    ``PATH`` (the package's second console script) and the plugin reads the named context, not
    the kubeconfig's current one; an unknown context is one line."""
    plugin = Path(sys.executable).with_name("kubectl-hamid")
    kubectl = shutil.which("kubectl")
    if kubectl is None or not plugin.exists():
        pytest.skip("kubectl, or the kubectl-hamid script of an installed hamid, is not here")
    await seed(apiserver)
    async with ApiServer() as empty:
        kubeconfig = tmp_path / "config"
        clusters = {"gpus": apiserver.url, "empty": empty.url}
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": n, "cluster": {"server": url}} for n, url in clusters.items()],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in clusters],
                    "current-context": "empty",
                }
            )
        )
        env = {**os.environ, "PATH": f"{plugin.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env["KUBECONFIG"] = str(kubeconfig)
        env["PYTHONPATH"] = str(REPO)

        async def kubectl_hamid(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                kubectl,
                "hamid",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            return proc.returncode or 0, out.decode(), err.decode()

        code, out, err = await kubectl_hamid("status", "--context", "gpus", "-o", "json")
        assert code == 0, err
        assert [n["name"] for n in json.loads(out)["nodes"]] == ["n1"]
        code, out, err = await kubectl_hamid("status", "-o", "json")  # the current context: no GPUs
        assert code == 0, err
        assert json.loads(out)["nodes"] == []
        code, out, err = await kubectl_hamid("status", "--context", "nowhere")
        assert code == 1
        assert (
            err == f"Error: context 'nowhere' is not in kubeconfig {kubeconfig} (its contexts: gpus, empty)\n"
        )
        code, out, _ = await kubectl_hamid("--help")
        assert code == 0 and out.startswith("Usage: kubectl hamid"), out


async def test_a_kubeconfig_list_is_read_as_kubectl_reads_it(apiserver: ApiServer, tmp_path: Path) -> None:
    """``KUBECONFIG=a:b``: the current context is the first file's that sets one (the client
    library took the last file's, so hamid read another cluster than kubectl), and a file of the
    list that does not exist is skipped; both checked against the real kubectl when it is here."""
    await seed(apiserver)
    async with ApiServer() as empty:

        def config(name: str, url: str) -> Path:
            path = tmp_path / f"{name}.yaml"
            path.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": name, "cluster": {"server": url}}],
                        "users": [{"name": name, "user": {}}],
                        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                        "current-context": name,
                    }
                )
            )
            return path

        first, second = config("gpus", apiserver.url), config("empty", empty.url)
        merged = os.pathsep.join([str(tmp_path / "missing.yaml"), str(first), str(second)])
        kubectl = shutil.which("kubectl")
        if kubectl is not None:
            shown = await asyncio.create_subprocess_exec(
                kubectl,
                "config",
                "current-context",
                stdout=asyncio.subprocess.PIPE,
                env={"KUBECONFIG": merged, "HOME": str(tmp_path)},  # kubectl caches under HOME/.kube
            )
            assert (await shown.communicate())[0].decode().strip() == "gpus"
        kube = await connect(None, merged)
        try:
            status = await collect(kube, None, 10)
        finally:
            await kube.close()
        assert [n.name for n in status.nodes] == ["n1"]
