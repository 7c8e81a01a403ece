"""The real kubectl against the embedded API server: apply, create, replace, edit, explain, get, describe."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hamidsim.apiserver import ApiServer

from .kubectl import README_POD, Kubectl, needs_kubectl

pytestmark = needs_kubectl


@pytest.fixture
async def kubectl(apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[Kubectl]:
    yield Kubectl.for_server(apiserver.url, tmp_path)


def _header(output: str) -> list[str]:
    return output.splitlines()[0].split()


async def test_apply_then_unchanged_and_defaults(kubectl: Kubectl, apiserver: ApiServer) -> None:
    assert "pod/numa-aligned created" in await kubectl.ok("apply", "-f", "-", stdin=README_POD)
    # Integer quantities (nvidia.com/gpu: 1) come back as strings, so kubectl re-sends them, as with
    # a real server; once the manifest says what the server stores, apply has nothing to change.
    await kubectl.ok("apply", "-f", "-", stdin=README_POD)
    as_text = README_POD.replace("gpu: 1", 'gpu: "1"').replace("gpumem: 20000", 'gpumem: "20000"')
    await kubectl.ok("apply", "-f", "-", stdin=as_text)
    assert "pod/numa-aligned unchanged" in await kubectl.ok("apply", "-f", "-", stdin=as_text)
    pod = json.loads(await kubectl.ok("get", "pod", "numa-aligned", "-o", "json"))
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["resources"]["requests"] == {
        "cpu": "8",
        "memory": "8Gi",
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "20000",
    }
    assert container["resources"]["limits"]["memory"] == "8Gi"
    assert (spec["serviceAccountName"], spec["serviceAccount"]) == ("default", "default")
    assert (spec["restartPolicy"], spec["dnsPolicy"], spec["schedulerName"]) == (
        "Always",
        "ClusterFirst",
        "default-scheduler",
    )
    assert spec["terminationGracePeriodSeconds"] == 30
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert pod["status"] == {"phase": "Pending", "qosClass": "Guaranteed"}
    described = await kubectl.ok("describe", "pod", "numa-aligned")
    assert "QoS Class:" in described and "Guaranteed" in described
    assert "Service Account:  default" in described


async def test_unknown_field_is_refused_and_nothing_changes(kubectl: Kubectl, apiserver: ApiServer) -> None:
    code, out = await kubectl.run("apply", "-f", "-", stdin=README_POD.replace("image:", "imagee:"))
    assert code != 0
    assert 'strict decoding error: unknown field "spec.containers[0].imagee"' in out
    assert apiserver.get("Pod", "default", "numa-aligned") is None


async def test_create_replace_edit(kubectl: Kubectl, apiserver: ApiServer, tmp_path: Path) -> None:
    assert "pod/numa-aligned created" in await kubectl.ok("create", "-f", "-", stdin=README_POD)
    code, out = await kubectl.run("create", "-f", "-", stdin=README_POD)
    assert code != 0 and "AlreadyExists" in out
    current = await kubectl.ok("get", "pod", "numa-aligned", "-o", "yaml")
    replaced = current.replace("hami.io/numa-alignment: best-effort", "hami.io/numa-alignment: strict")
    assert "pod/numa-aligned replaced" in await kubectl.ok("replace", "-f", "-", stdin=replaced)
    editor = tmp_path / "editor.sh"
    editor.write_text(
        "#!/bin/sh\nsed -i 's/hami.io\\/numa-alignment: strict/hami.io\\/numa-alignment: disabled/' \"$1\"\n"
    )
    editor.chmod(0o755)
    assert "pod/numa-aligned edited" in await kubectl.ok(
        "edit", "pod", "numa-aligned", env={"EDITOR": str(editor), "KUBE_EDITOR": str(editor)}
    )
    stored = apiserver.get("Pod", "default", "numa-aligned")
    assert stored is not None
    assert stored["metadata"]["annotations"]["hami.io/numa-alignment"] == "disabled"


async def test_explain_reads_the_served_schema(kubectl: Kubectl) -> None:
    out = await kubectl.ok("explain", "pod.spec.containers.resources")
    assert "ResourceRequirements" in out and "limits" in out and "requests" in out
    nodes = await kubectl.ok("explain", "nodes.spec")
    assert "unschedulable" in nodes


async def test_protobuf_bodies_from_create_namespace_and_quota(
    kubectl: Kubectl, apiserver: ApiServer
) -> None:
    assert "namespace/team created" in await kubectl.ok("create", "namespace", "team")
    assert "resourcequota/gpu created" in await kubectl.ok(
        "create", "quota", "gpu", "-n", "team", "--hard=pods=4,limits.nvidia.com/gpumem=40000"
    )
    quota = apiserver.get("ResourceQuota", "team", "gpu")
    assert quota is not None
    assert quota["spec"]["hard"] == {
        "pods": "4",
        "limits.nvidia.com/gpumem": "40k",
    }  # kubectl sends it canonical
    namespace = apiserver.get("Namespace", None, "team")
    assert namespace is not None and namespace["metadata"]["labels"] == {
        "kubernetes.io/metadata.name": "team"
    }
    quotas = await kubectl.ok("get", "quota", "-n", "team")
    assert _header(quotas) == ["NAME", "AGE", "REQUEST", "LIMIT"]
    assert "pods: 0/4" in quotas and "limits.nvidia.com/gpumem: 0/40k" in quotas


async def test_get_tables_have_the_usual_columns(kubectl: Kubectl, apiserver: ApiServer) -> None:
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.35.0"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            },
        }
    )
    await kubectl.ok("apply", "-f", "-", stdin=README_POD)
    running = apiserver.get("Pod", "default", "numa-aligned")
    assert running is not None
    running["spec"]["nodeName"] = "gpu-1"
    running["status"] = {
        "phase": "Running",
        "podIP": "10.1.0.5",
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 2, "state": {"running": {}}}],
    }
    apiserver.put(running)
    apiserver.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "numa-aligned.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "numa-aligned", "namespace": "default"},
            "reason": "NumaRefitSucceed",
            "message": "NUMA refit moved container 0",
            "type": "Normal",
            "count": 1,
        }
    )
    pods = await kubectl.ok("get", "pods")
    assert _header(pods) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods.splitlines()[1].split()[:4] == ["numa-aligned", "1/1", "Running", "2"]
    wide = await kubectl.ok("get", "pods", "-o", "wide")
    assert _header(wide)[5:8] == ["IP", "NODE", "NOMINATED"]
    assert "10.1.0.5" in wide and "gpu-1" in wide
    nodes = await kubectl.ok("get", "nodes")
    assert _header(nodes) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert nodes.splitlines()[1].split()[:3] == ["gpu-1", "Ready", "worker"]
    assert nodes.splitlines()[1].split()[-1] == "v1.35.0"
    events = await kubectl.ok("get", "events")
    assert events.splitlines()[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "pod/numa-aligned" in events and "NumaRefitSucceed" in events
