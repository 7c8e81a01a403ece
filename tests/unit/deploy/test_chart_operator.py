"""The chart's schema and the keys users of HAMi's and NVIDIA's charts expect (real Helm engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from hamid.plugin.cli import plugin_command
from tests.unit.deploy.helm_render import CHART_DIR, KUBE_VERSION, NAMESPACE, container, flag_values, render

PLUGIN, SCHED = "hamid-device-plugin", "hamid-scheduler"
REPO = Path(__file__).resolve().parents[3]


def lint_errors(values: dict[str, Any]) -> list[str]:
    return helm_python.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)["errors"]


@pytest.mark.parametrize(
    ("values", "path"),
    [
        (
            {"devicePlugin": {"numaRefit": {"tlsInsecre": True}}},
            "'/devicePlugin/numaRefit': additional properties 'tlsInsecre'",
        ),
        ({"scheduler": {"replcas": 2}}, "'/scheduler': additional properties 'replcas'"),
        ({"imagePullSecret": []}, "additional properties 'imagePullSecret'"),
        ({"scheduler": {"replicas": "two"}}, "'/scheduler/replicas'"),
        ({"devicePlugin": {"metricsPort": 70000}}, "'/devicePlugin/metricsPort'"),
        ({"scheduler": {"podAntiAffinity": "always"}}, "'/scheduler/podAntiAffinity'"),
        # what the API server refuses for a Deployment / a DaemonSet
        ({"scheduler": {"updateStrategy": {"type": "OnDelete"}}}, "'/scheduler/updateStrategy/type'"),
        ({"devicePlugin": {"updateStrategy": {"type": "Recreate"}}}, "'/devicePlugin/updateStrategy/type'"),
    ],
)
def test_schema_refuses_unknown_keys_and_bad_types_with_the_path(values: dict[str, Any], path: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(path)):
        render(values)
    assert any(path in e for e in lint_errors(values)), "helm lint must fail too"


@pytest.mark.parametrize(
    "values",
    [
        {"scheduler": {"refitAuth": ["mtls"]}},
        {"scheduler": {"refitAuth": ["password"]}},
        {"devicePlugin": {"numaRefit": {"enabled": True, "tlsInsecure": True}}},
    ],
)
def test_cross_field_refusals_fail_lint(values: dict[str, Any]) -> None:
    """Helm 4's lint turns a template `fail` into INFO; the schema's refusals are lint errors."""
    assert lint_errors(values)


def _keys(node: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Paths of values.yaml keys that values.schema.json does not describe."""
    missing: list[str] = []
    props = schema.get("properties") or {}
    if not isinstance(node, dict) or not props:
        return missing
    for key, value in node.items():
        if key not in props:
            missing.append(prefix + key)
        else:
            missing += _keys(value, props[key], f"{prefix}{key}.")
    return missing


def test_schema_describes_every_value() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert _keys(values, schema) == []
    assert set(schema["properties"]) == set(values)


def _plugin(r: Any) -> dict[str, Any]:
    return r.get("DaemonSet", PLUGIN)["spec"]["template"]["spec"]


def test_plugin_defaults_for_gpu_nodes() -> None:
    r = render()
    spec = _plugin(r)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"gpu": "on"}
    plugin = container(r.get("DaemonSet", PLUGIN), "device-plugin")
    args = flag_values(plugin["args"])
    assert args["--metrics-listen"] == ":9394"
    assert plugin["ports"] == [{"name": "metrics", "containerPort": 9394, "protocol": "TCP"}]
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert plugin["securityContext"]["privileged"] is True
    strategy = r.get("DaemonSet", PLUGIN)["spec"]["updateStrategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # the probes' paths are the plugin's health endpoints (hamid/plugin/metrics.py)
    assert {o.name for o in plugin_command.params} >= {"metrics_listen"}
    service = r.get("Service", f"{PLUGIN}-metrics")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == 9394


def test_one_scheduler_without_leader_election_is_never_rolled_beside_its_successor() -> None:
    """A rolling update started the new scheduler before the old one stopped: two deciding
    schedulers (the same GPU booked twice) on every upgrade of the default install."""

    def strategy(values: dict[str, Any]) -> Any:
        return render(values).get("Deployment", SCHED)["spec"].get("strategy")

    assert strategy({}) == {"type": "Recreate"}
    assert strategy({"scheduler": {"replicas": 2, "leaderElect": False}}) == {"type": "Recreate"}
    assert strategy({"scheduler": {"replicas": 2}}) is None  # followers wait for the Lease
    given = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert strategy({"scheduler": {"updateStrategy": given}}) == given


def test_hami_nvidia_node_selector_is_honoured() -> None:
    r = render(
        {
            "devicePlugin": {
                "nvidiaNodeSelector": {"gpu": None, "nvidia.com/gpu.present": "true"},
                "nodeSelector": {"pool": "gpu"},
            }
        }
    )
    assert _plugin(r)["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "gpu"}
    assert "nvidia.com/gpu.present" in r.notes


def test_common_keys_render() -> None:
    r = render(
        {
            "imagePullSecrets": [{"name": "regcred"}],
            "scheduler": {
                "podAnnotations": {"a": "1"},
                "extraArgs": ["--bind-wait=20s"],
                "updateStrategy": {"type": "Recreate"},
                "resources": {"limits": {"memory": "512Mi"}},
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "kubeScheduler": {"securityContext": {"runAsUser": None, "runAsGroup": None}},
            },
            "devicePlugin": {
                "podAnnotations": {"b": "2"},
                "extraArgs": ["--device-plugin-dir=/var/lib/kubelet/device-plugins/"],
                "resources": {"requests": {"cpu": "50m"}},
                "tolerations": [{"operator": "Exists"}],
                "securityContext": {"privileged": True},
                "podSecurityContext": {"fsGroup": 0},
                "readinessProbe": None,
            },
        }
    )
    deploy, ds = r.get("Deployment", SCHED), r.get("DaemonSet", PLUGIN)
    for owner in (deploy, ds):
        assert owner["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert deploy["spec"]["template"]["metadata"]["annotations"]["a"] == "1"
    assert ds["spec"]["template"]["metadata"]["annotations"]["b"] == "2"
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    hamid = container(deploy, "hamid-scheduler")
    assert hamid["args"][-1] == "--bind-wait=20s"
    # Helm merges maps: the given keys win, the restricted defaults stay (null removes one)
    assert hamid["securityContext"]["runAsUser"] == 1000
    assert hamid["securityContext"]["readOnlyRootFilesystem"] is True
    kube = container(deploy, "kube-scheduler")["securityContext"]  # OpenShift assigns the user
    assert "runAsUser" not in kube and "runAsGroup" not in kube and kube["runAsNonRoot"] is True
    plugin = container(ds, "device-plugin")
    assert plugin["args"][-1] == "--device-plugin-dir=/var/lib/kubelet/device-plugins/"
    assert plugin["resources"] == {"requests": {"cpu": "50m"}} and "readinessProbe" not in plugin
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    for obj in r.objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_namespace_override() -> None:
    r = render({"namespaceOverride": "gpu-system", "devicePlugin": {"numaRefit": {"enabled": True}}})
    # kube-scheduler's extension-apiserver-authentication reader binding lives where that Role is
    namespaced = [o for o in r.objects if o["metadata"]["name"] != "hamid-scheduler-auth-reader"]
    assert {o["metadata"].get("namespace") for o in namespaced} - {None} == {"gpu-system"}
    webhook = r.get("MutatingWebhookConfiguration", "hamid-webhook")
    assert webhook["webhooks"][0]["clientConfig"]["service"]["namespace"] == "gpu-system"
    for binding in r.all("ClusterRoleBinding") + r.all("RoleBinding"):
        assert {s["namespace"] for s in binding["subjects"]} == {"gpu-system"}
    args = flag_values(container(r.get("DaemonSet", PLUGIN), "device-plugin")["args"])
    assert args["--scheduler-endpoint"] == "https://hamid-scheduler.gpu-system.svc:443"


def test_replicas_get_a_pdb_and_anti_affinity() -> None:
    assert not render().all("PodDisruptionBudget")
    r = render({"scheduler": {"replicas": 3}})
    pdb = r.get("PodDisruptionBudget", SCHED)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    anti = r.get("Deployment", SCHED)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == pdb["spec"]["selector"]["matchLabels"]
    hard = render({"scheduler": {"replicas": 2, "podAntiAffinity": "hard"}})
    spec = hard.get("Deployment", SCHED)["spec"]["template"]["spec"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["podAntiAffinity"]
    own = render({"scheduler": {"replicas": 2, "affinity": {"nodeAffinity": {}}}})
    assert own.get("Deployment", SCHED)["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {}}
    for obj in r.objects + hard.objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_service_monitor_scrapes_both_paths_of_both_parts() -> None:
    r = render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    monitors = {m["metadata"]["name"]: m for m in r.all("ServiceMonitor")}
    assert set(monitors) == {"hamid-scheduler", "hamid-device-plugin"}
    services = {s["metadata"]["name"]: s for s in r.all("Service")}
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert [e["path"] for e in monitor["spec"]["endpoints"]] == ["/metrics", "/metrics/hami"]
        # the per-pod families' namespace/pod/container labels stand (an install audit saw them
        # renamed exported_* with the plugin's own pod in their place)
        assert all(e["honorLabels"] is True for e in monitor["spec"]["endpoints"])
        # the two paths' targets differ by a label, so their up and scrape_* series are apart
        for endpoint in monitor["spec"]["endpoints"]:
            assert {"sourceLabels": ["__metrics_path__"], "targetLabel": "metrics_path"} in endpoint[
                "relabelings"
            ]
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matching = [s for s in services.values() if wanted.items() <= s["metadata"]["labels"].items()]
        assert any(p["name"] == "metrics" for s in matching for p in s["spec"]["ports"]), name
    only = render({"serviceMonitor": {"enabled": True, "hamiNames": False}})
    assert {e["path"] for m in only.all("ServiceMonitor") for e in m["spec"]["endpoints"]} == {"/metrics"}
    # a CRD kind: not in the Kubernetes schemas; everything else still validates
    for obj in r.objects:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


#: Metric families the dashboard may query: every name hamid exports (scheduler and plugin).
def _exported_names() -> set[str]:
    names: set[str] = set()
    sources = ("hamid/scheduler/metrics.py", "hamid/plugin/metrics.py", "hamid/scheduler/refit/handler.py")
    for source in sources:
        names |= set(re.findall(r'"(hamid_[a-z_]+)"', (REPO / source).read_text()))
    return names


def test_grafana_dashboard_queries_exported_metrics() -> None:
    dashboard = json.loads((CHART_DIR / "dashboards" / "hamid.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\b(hamid_[a-z_]+)", e)}
    suffixes = ("_bucket", "_total")
    known = _exported_names()
    unknown = {n for n in used if n not in known and not any(n.removesuffix(s) in known for s in suffixes)}
    assert used and not unknown, sorted(unknown)
    r = render({"grafanaDashboard": {"enabled": True}})
    cm = r.get("ConfigMap", "hamid-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["hamid.json"]) == dashboard
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
