"""The chart's PrometheusRule (``prometheusRule.*``): rendering and values, promtool's check and unit
tests of every alert (fixtures in ``alerts/``), the metrics and labels the rules name against the
product's own registries, and a ``docs/alerts.md`` section per alert."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.inventory import GpuInventory
from hamid.plugin.metrics import PluginMetrics
from hamid.scheduler.metrics import SchedulerMetrics
from hamid.scheduler.refit.handler import RefitMetrics
from hamid.scheduler.refit.plan import RefusalCode
from tests.unit.deploy.helm_render import CHART_DIR, KUBE_VERSION, NAMESPACE, lint, render
from tests.unit.deploy.promql import Selector, parse
from tests.unit.deploy.test_chart_upgrade import OLD_VALUES
from tests.unit.metrics.promtool import PROMTOOL, needs_promtool
from tests.unit.metrics.test_scheduler_metrics import _fgd, _state
from tests.unit.test_docs_citations import anchors

REPO = Path(__file__).resolve().parents[3]
#: promtool unit tests; their ``rule_files`` name RULES_FILE, written from the render next to them.
FIXTURES = Path(__file__).parent / "alerts"
RULES_FILE = "rendered-rules.yaml"
#: The fixture in which no alert may fire (an idle, healthy cluster).
IDLE = "idle.yaml"
#: Labels Prometheus Operator gives every target of a ServiceMonitor (job: the Service's name).
OPERATOR_LABELS = frozenset({"job", "namespace", "service", "endpoint", "pod", "container", "instance"})
#: The sample names of a family of each type (OpenMetrics' suffixes).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
    "info": ("_info",),
}


def _rule(values: Mapping[str, Any] | None = None, **chart: Any) -> dict[str, Any]:
    rendered = render({"prometheusRule": {"enabled": True, **(values or {})}, **chart})
    [rule] = rendered.all("PrometheusRule")
    return rule


def _alerts(rule: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


@pytest.fixture(scope="module")
def default_rule() -> dict[str, Any]:
    return _rule()


def test_off_by_default() -> None:
    assert not render({"serviceMonitor": {"enabled": True}}).all("PrometheusRule")


def test_labels_namespace_severities_and_runbooks() -> None:
    rule = _rule(
        {
            "namespace": "monitoring",
            "labels": {"release": "prom"},
            "additionalLabels": {"team": "gpu"},
            "severities": {"HamidGpuUnhealthy": "critical"},
            "runbookUrl": "https://docs.example/hamid/alerts.md",
        }
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "hamid"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "hamid"
    alerts = _alerts(rule)
    assert alerts["HamidGpuUnhealthy"]["labels"] == {"severity": "critical", "team": "gpu"}
    assert alerts["HamidSchedulerDown"]["labels"] == {"severity": "critical", "team": "gpu"}
    assert alerts["HamidGpuOvercommitted"]["labels"] == {"severity": "warning", "team": "gpu"}
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == f"https://docs.example/hamid/alerts.md#{name.lower()}"
        assert {"summary", "description"} <= alert["annotations"].keys()


def test_rules_select_this_releases_jobs_and_namespace(default_rule: dict[str, Any]) -> None:
    def selected(rule: Mapping[str, Any], label: str) -> set[str | None]:
        return {s.value(label) for a in _alerts(rule).values() for s in parse(a["expr"]).selectors}

    assert default_rule["metadata"]["namespace"] == NAMESPACE
    assert selected(default_rule, "job") == set(_scrape_jobs())
    assert selected(default_rule, "namespace") == {NAMESPACE}
    other = _rule(fullnameOverride="gpu", namespaceOverride="gpu-system")
    assert other["metadata"]["namespace"] == "gpu-system"
    assert selected(other, "job") == {"gpu-scheduler", "gpu-device-plugin-metrics"}
    assert selected(other, "namespace") == {"gpu-system"}


def test_disabling_alerts_removes_them_and_an_empty_group(default_rule: dict[str, Any]) -> None:
    every = set(_alerts(default_rule))
    kept = _alerts(_rule({"disabled": {"HamidNumaPredictionStopped": True, "HamidGpuUnhealthy": False}}))
    assert set(kept) == every - {"HamidNumaPredictionStopped"}
    [plugin_group] = [g for g in default_rule["spec"]["groups"] if g["name"] == "hamid-device-plugin"]
    without = _rule({"disabled": {r["alert"]: True for r in plugin_group["rules"]}})
    assert [g["name"] for g in without["spec"]["groups"]] == ["hamid-scheduler"]


def test_reuse_values_from_a_release_without_the_key(default_rule: dict[str, Any], tmp_path: Path) -> None:
    """``helm upgrade --reuse-values --set prometheusRule.enabled=true`` from an older release: its
    values have no prometheusRule but the one key set, which must render the same rule."""
    chart = tmp_path / "hamid"
    shutil.copytree(CHART_DIR, chart)
    (chart / "values.yaml").write_text(OLD_VALUES.read_text())
    assert not render(chart_dir=chart, upgrade=True).all("PrometheusRule")
    reused = render({"prometheusRule": {"enabled": True}}, chart_dir=chart, upgrade=True)
    assert reused.get("PrometheusRule", "hamid")["spec"] == default_rule["spec"]
    assert "PrometheusRule hamid" in reused.notes


@pytest.mark.parametrize("key", ["disabled", "severities"])
def test_a_misspelt_alert_name_fails_the_render(key: str) -> None:
    value = True if key == "disabled" else "info"
    with pytest.raises(helm_python.HelmError, match="there is no alert HamidGpuUnhealty"):
        _rule({key: {"HamidGpuUnhealty": value}})


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"prometheusRule": {"enable": True}}, "additional properties 'enable'"),
        ({"prometheusRule": {"severities": {"HamidGpuUnhealthy": "page"}}}, "/prometheusRule/severities"),
        ({"prometheusRule": {"disabled": {"HamidGpuUnhealthy": "yes"}}}, "/prometheusRule/disabled"),
    ],
)
def test_schema_refuses_bad_values(values: dict[str, Any], path: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(path)):
        render(values)


def test_validates_as_the_service_monitor_does_and_lints_clean() -> None:
    """Prometheus Operator's kinds are not in the Kubernetes schemas: every other object validates,
    the PrometheusRule's metadata validates as any object's, its spec is promtool's (below)."""
    values = {
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "serviceMonitor": {"enabled": True},
    }
    rendered = render(values)
    for obj in rendered.objects:
        if obj["kind"] not in ("ServiceMonitor", "PrometheusRule"):
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    rule = rendered.get("PrometheusRule", "hamid")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"} and set(rule["spec"]) == {"groups"}
    as_meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": rule["metadata"]}
    kubernetes_validate.validate(as_meta, KUBE_VERSION, strict=True)
    assert lint(values) == []


# -- promtool ----------------------------------------------------------------------------------


def _promtool(cwd: Path, *args: str) -> str:
    """promtool's output; AssertionError with it when promtool fails."""
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _write_rules(rule: Mapping[str, Any], directory: Path) -> None:
    (directory / RULES_FILE).write_text(yaml.safe_dump(rule["spec"]))


@needs_promtool
def test_promtool_checks_the_rendered_rules(default_rule: dict[str, Any], tmp_path: Path) -> None:
    _write_rules(default_rule, tmp_path)
    out = _promtool(tmp_path, "check", "rules", RULES_FILE)
    assert f"SUCCESS: {len(_alerts(default_rule))} rules found" in out


@needs_promtool
@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_promtool_unit_tests(fixture: str, default_rule: dict[str, Any], tmp_path: Path) -> None:
    _write_rules(default_rule, tmp_path)
    shutil.copy(FIXTURES / fixture, tmp_path)
    assert "SUCCESS" in _promtool(tmp_path, "test", "rules", fixture)


def _cases() -> Iterator[tuple[str, str, bool]]:
    """(fixture, alert, whether it is expected to fire) of every alert test of the fixtures."""
    for path in sorted(FIXTURES.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group["alert_rule_test"]:
                yield path.name, case["alertname"], bool(case.get("exp_alerts"))


def test_every_alert_fires_in_a_test_stays_quiet_in_another_and_in_the_idle_cluster(
    default_rule: dict[str, Any],
) -> None:
    """promtool passes a test of an alert that does not exist, and one that never expects it to fire."""
    alerts = set(_alerts(default_rule))
    cases = list(_cases())
    assert {a for _, a, fires in cases if fires} == alerts
    assert {a for fixture, a, fires in cases if not fires and fixture != IDLE} == alerts
    assert {a for fixture, a, _ in cases if fixture == IDLE} == alerts
    assert not [a for fixture, a, fires in cases if fixture == IDLE and fires]


def test_each_alert_has_a_section_in_docs_alerts(default_rule: dict[str, Any]) -> None:
    sections = anchors(REPO / "docs" / "alerts.md")
    assert {name.lower() for name in _alerts(default_rule)} <= sections


# -- the metrics the rules name --------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """What a sample name of an exposition carries: its labels, and the values seen of each label."""

    labels: frozenset[str]
    values: Mapping[str, frozenset[str]]


#: ``up``: written by Prometheus for each target, with the target's labels only.
UP = Family(frozenset(), {})


def _declared_labels(registry: CollectorRegistry, family: Metric) -> tuple[str, ...]:
    """A family's declared label names: prometheus_client exports a labelled metric's labels only
    with its first child, so a counter no event has touched yet (binds failed, refits refused) is
    read from its declaration."""
    declared: tuple[str, ...] = getattr(family, "_labelnames", ())
    collector = registry._names_to_collectors.get(family.name)
    return declared or tuple(getattr(collector, "_labelnames", ()))


def _families(*registries: CollectorRegistry) -> dict[str, Family]:
    """Every sample name the registries can export, with its labels and the values seen."""
    out: dict[str, Family] = {}
    for registry in registries:
        for family in registry.collect():
            labels = {k for s in family.samples for k in s.labels} | set(_declared_labels(registry, family))
            seen: dict[str, set[str]] = {}
            for sample in family.samples:
                for key, value in sample.labels.items():
                    seen.setdefault(key, set()).add(value)
            values = {key: frozenset(v) for key, v in seen.items()}
            for suffix in _SUFFIXES[family.type]:
                own = labels if suffix == "_bucket" else labels - {"le"}
                out[family.name + suffix] = Family(frozenset(own), values)
    return out


def _exported() -> dict[str, dict[str, Family]]:
    """By ServiceMonitor component, what its targets export, from the product's registries: the
    scheduler's with a node, a pod and a quota booked (HAMi's families exist only then) and each
    refit refusal reason observed once, and the device plugin's."""
    state = _state()
    scheduler = SchedulerMetrics(state.ledger, _fgd(state))
    refits = RefitMetrics.of(scheduler.registry)
    for code in RefusalCode:
        refits.observe("refused", code, 0.0)
    plugin = PluginMetrics(GpuInventory([], NodeConfig()), hook_path="/nonexistent")
    return {
        "scheduler": _families(scheduler.registry, scheduler.hami_registry),
        "device-plugin": _families(plugin.registry, plugin.hami_registry),
    }


def _scrape_jobs() -> dict[str, tuple[str, frozenset[str]]]:
    """job -> (component, target labels) of the chart's ServiceMonitors: Prometheus Operator names a
    job after the Service it scrapes and labels its targets with OPERATOR_LABELS and the relabelings."""
    rendered = render({"serviceMonitor": {"enabled": True}})
    jobs: dict[str, tuple[str, frozenset[str]]] = {}
    for monitor in rendered.all("ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        endpoints = monitor["spec"]["endpoints"]
        relabeled = {r["targetLabel"] for e in endpoints for r in e.get("relabelings", [])}
        ports = {e["port"] for e in endpoints}
        for service in rendered.all("Service"):
            served = {p["name"] for p in service["spec"]["ports"]}
            if wanted <= service["metadata"]["labels"].items() and ports & served:
                component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
                jobs[service["metadata"]["name"]] = (component, OPERATOR_LABELS | relabeled)
    return jobs


def _regex_values(value: str) -> set[str]:
    """The values a plain alternation ``a|b|c`` matches (empty for any other regex: not checked)."""
    return set(value.split("|")) if re.fullmatch(r"[\w|]+", value) else set()


def metric_problems(exprs: Mapping[str, str]) -> list[str]:
    """What in ``exprs`` (alert -> PromQL) names a series, label or value no hamid target exports.

    Each selector must name a scrape job of the chart's ServiceMonitors; its metric must be one the
    job's part exports; a matcher must name one of the family's labels or a target label (and not a
    target label the family carries itself: ``honorLabels`` lets the family's win), and match values
    the family takes where the product pre-creates them; ``by``/``on`` lists name labels the
    selected series carry."""
    exported, jobs = _exported(), _scrape_jobs()
    found: list[str] = []
    for alert, expr in exprs.items():
        parsed = parse(expr)
        carried: set[str] = set()
        for selector in parsed.selectors:
            job = selector.value("job")
            if job not in jobs:
                found.append(f"{alert}: {selector.metric} selects no scrape job of the chart ({job})")
                continue
            component, targets = jobs[job]
            family = UP if selector.metric == "up" else exported[component].get(selector.metric)
            if family is None:
                found.append(f"{alert}: the {component} exports no {selector.metric}")
                continue
            carried |= family.labels | targets
            found += [f"{alert}: {selector.metric} {p}" for p in _matcher_problems(selector, family, targets)]
        found += [
            f"{alert}: no selected series carries {label}" for label in sorted(parsed.grouping - carried)
        ]
    return found


def _matcher_problems(selector: Selector, family: Family, targets: frozenset[str]) -> Iterator[str]:
    for label, op, value in selector.matchers:
        if label in targets and label in family.labels:
            yield f"carries its own {label} (honorLabels)"
        elif label not in targets | family.labels:
            yield f"has no label {label}"
        elif label in family.values:
            unseen = (_regex_values(value) if op in ("=~", "!~") else {value}) - family.values[label]
            if unseen:
                yield f"{label} never is {sorted(unseen)}"


def test_rules_name_only_exported_metrics_labels_and_values(default_rule: dict[str, Any]) -> None:
    assert metric_problems({name: a["expr"] for name, a in _alerts(default_rule).items()}) == []


def test_the_metric_check_sees_wrong_names_labels_values_and_jobs() -> None:
    wrong = {
        "name": 'rate(hamid_filter_errors_total{job="hamid-scheduler"}[5m])',
        "part": 'hamid_plugin_gpu_healthy{job="hamid-scheduler"} == 0',
        "job": 'up{job="hamid"} == 0',
        "label": 'hamid_gpu_slots{job="hamid-scheduler", gpu="0"}',
        "value": 'hamid_untrusted_annotations_total{job="hamid-scheduler", where=~"foreign|forged"}',
        "reason": 'hamid_refit_total{job="hamid-scheduler", reason="unauthorized"}',
        "honour": 'hamid_container_gpu_memory_used_bytes{job="hamid-device-plugin-metrics", namespace="x"}',
        "grouping": 'sum by (gpu) (hamid_gpu_slots{job="hamid-scheduler"})',
    }
    problems = metric_problems(wrong)
    assert sorted(p.partition(":")[0] for p in problems) == sorted(wrong), problems


def test_the_promql_reader_finds_selectors_and_label_lists() -> None:
    parsed = parse(
        'sum by (a) (rate(x_total{b="c", d=~"e|f"}[5m])) / on (g) group_left (h) y offset 1h '
        "unless count without (i) (group by (j) (z)) > 0.5"
    )
    assert [(s.metric, s.matchers) for s in parsed.selectors] == [
        ("x_total", (("b", "=", "c"), ("d", "=~", "e|f"))),
        ("y", ()),
        ("z", ()),
    ]
    assert parsed.grouping == {"a", "g", "h", "i", "j"}
    with pytest.raises(ValueError, match="cannot lex"):
        parse("x @ 100")
