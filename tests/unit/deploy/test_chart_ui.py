"""The chart's ``/ui`` and ``metricsAuth`` values: flags, RBAC, ServiceMonitor, schemas and lint."""

from __future__ import annotations

import click
import helm_python
import kubernetes_validate
import pytest

from hamid.cli import cli
from tests.unit.deploy.helm_render import KUBE_VERSION, container, flag_values, iter_rules, lint, render

SCHED = "hamid-scheduler"
READER = "hamid-metrics-reader"
PROMETHEUS = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
AUTH = {
    "scheduler": {"metricsAuth": {"enabled": True, "readers": [PROMETHEUS]}},
    "serviceMonitor": {"enabled": True},
}


def _args(values: dict) -> list[str]:
    return container(render(values).get("Deployment", SCHED), "hamid-scheduler")["args"]


def test_ui_is_on_by_default_and_metrics_open() -> None:
    rendered = render({})
    args = _args({})
    assert "--ui" in args and "--metrics-auth" not in args
    rules = set(iter_rules(rendered.get("ClusterRole", SCHED)))
    assert ("authorization.k8s.io", "subjectaccessreviews", "create") not in rules
    assert all(r["metadata"]["name"] != READER for r in rendered.all("ClusterRole"))


def test_ui_can_be_turned_off() -> None:
    args = _args({"scheduler": {"ui": False}})
    assert "--no-ui" in args and "--ui" not in args


def test_ui_hosts_reach_the_flag_and_a_bad_name_is_refused_by_the_schema() -> None:
    args = _args({"scheduler": {"uiHosts": ["*.svc.example.internal", "hamid.example.com"]}})
    assert "--ui-hosts=*.svc.example.internal,hamid.example.com" in args
    assert not [a for a in _args({}) if a.startswith("--ui-hosts")]
    with pytest.raises(helm_python.HelmError, match="uiHosts"):
        render({"scheduler": {"uiHosts": ["http://evil.example"]}})


def test_metrics_auth_grants_reviews_a_reader_role_and_prometheus_its_token() -> None:
    rendered = render(AUTH)
    assert "--metrics-auth" in _args(AUTH)
    rules = set(iter_rules(rendered.get("ClusterRole", SCHED)))
    assert {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    } <= rules
    reader = rendered.get("ClusterRole", READER)
    assert reader["rules"] == [
        {"nonResourceURLs": ["/metrics", "/metrics/hami", "/ui", "/ui/*"], "verbs": ["get"]}
    ]
    binding = rendered.get("ClusterRoleBinding", READER)
    assert binding["roleRef"]["name"] == READER and binding["subjects"] == [PROMETHEUS]
    monitors = {m["metadata"]["name"]: m for m in rendered.all("ServiceMonitor")}
    scheduler = next(m for name, m in monitors.items() if name.endswith("-scheduler"))
    plugin = next(m for name, m in monitors.items() if name.endswith("-device-plugin"))
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert all(e["bearerTokenFile"] == token for e in scheduler["spec"]["endpoints"])
    assert all("bearerTokenFile" not in e for e in plugin["spec"]["endpoints"])


def test_every_object_validates_lints_and_passes_real_flags() -> None:
    rendered = render(AUTH)
    for obj in rendered.objects:
        if obj["kind"] != "ServiceMonitor":  # a CRD: not in the Kubernetes schemas
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    assert lint(AUTH) == []
    command = cli.get_command(click.Context(cli), "scheduler")
    assert command is not None
    known = {name for p in command.params for name in (*p.opts, *p.secondary_opts)}
    args = _args(AUTH)
    mode_args = args[args.index("scheduler") + 1 :]
    assert set(flag_values(mode_args)) <= known


def _scheduler_monitor(values: dict) -> dict:
    monitors = render(values).all("ServiceMonitor")
    return next(m for m in monitors if m["metadata"]["name"].endswith("-scheduler"))


def test_metrics_tls_follows_metrics_auth_and_prometheus_verifies_the_certificate() -> None:
    assert "--metrics-tls" in _args(AUTH)  # tokens never in clear text by default
    for endpoint in _scheduler_monitor(AUTH)["spec"]["endpoints"]:
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == {
            "serverName": "hamid-scheduler.kube-system.svc",
            "ca": {"configMap": {"name": "hamid-scheduler-ca", "key": "ca.crt"}},
        }
    plain = {"serviceMonitor": {"enabled": True}}
    assert "--metrics-tls" not in _args(plain)
    assert all("scheme" not in e for e in _scheduler_monitor(plain)["spec"]["endpoints"])
    explicit_off = {
        "scheduler": {"metricsAuth": {"enabled": True}, "metricsTls": {"enabled": False}},
        "serviceMonitor": {"enabled": True},
    }
    assert "--metrics-tls" not in _args(explicit_off)
    tls_only = {"scheduler": {"metricsTls": {"enabled": True}}, "serviceMonitor": {"enabled": True}}
    assert "--metrics-tls" in _args(tls_only) and "--metrics-auth" not in _args(tls_only)
    # a publicly trusted certificate of the operator's: no CA to hand Prometheus, the name still checked
    own = {
        "scheduler": {"metricsTls": {"enabled": True}, "tls": {"existingSecret": "mine"}},
        "serviceMonitor": {"enabled": True},
    }
    endpoint = _scheduler_monitor(own)["spec"]["endpoints"][0]
    assert endpoint["tlsConfig"] == {"serverName": "hamid-scheduler.kube-system.svc"}
