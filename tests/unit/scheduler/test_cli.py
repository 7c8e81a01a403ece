from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hamid.scheduler import cli
from hamid.scheduler.options import SchedulerOptions
from hamid.scheduler.settings import SchedulerSettings
from hamid.scheduler.signing import AllocationKeys, key_id

UNSIGNED = "--allow-unsigned-allocations"


def test_gpu_policy_flag_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options.settings.gpu_policy)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    good = runner.invoke(cli.scheduler_command, [UNSIGNED, "--gpu-scheduler-policy", "binpack,numa"])
    assert good.exit_code == 0
    bad = runner.invoke(cli.scheduler_command, [UNSIGNED, "--gpu-scheduler-policy", "binpak"])
    assert bad.exit_code == 2 and "unknown policy 'binpak'" in bad.output
    assert runner.invoke(cli.scheduler_command, [UNSIGNED, "--node-scheduler-policy", "mutex"]).exit_code == 2
    assert seen == ["binpack,numa"]


def test_hami_plugin_service_account_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options.refit_hami_plugin_service_account)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    assert runner.invoke(cli.scheduler_command, [UNSIGNED]).exit_code == 0
    flag = "--refit-hami-plugin-service-account"
    assert (
        runner.invoke(cli.scheduler_command, [UNSIGNED, flag, "kube-system/hami-device-plugin"]).exit_code
        == 0
    )
    bad = runner.invoke(cli.scheduler_command, [UNSIGNED, flag, "hami-device-plugin"])
    assert bad.exit_code == 2 and "is not <namespace>/<serviceaccount>" in bad.output
    assert [None if a is None else (a.namespace, a.name) for a in seen] == [
        None,
        ("kube-system", "hami-device-plugin"),
    ]


def test_a_production_start_needs_an_allocation_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[SchedulerOptions] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    refused = runner.invoke(cli.scheduler_command, [])
    assert refused.exit_code == 2 and "--allocation-key-file" in refused.output
    assert "--allow-unsigned-allocations" in refused.output and not seen
    text = "old-key-0123456789abcdef0123456789abcdef\nnew-key-0123456789abcdef0123456789abcdef\n"
    keys = AllocationKeys.parse(text)
    key_file = tmp_path / "keys"
    key_file.write_text(text)
    assert runner.invoke(cli.scheduler_command, [f"--allocation-key-file={key_file}"]).exit_code == 0
    assert seen[0].allocation_keys is not None
    assert [key_id(k) for k in seen[0].allocation_keys.keys] == [key_id(k) for k in keys.keys]
    monkeypatch.setenv("HAMID_ALLOCATION_KEY_FILE", str(tmp_path / "missing"))
    missing = runner.invoke(cli.scheduler_command, [])
    assert missing.exit_code == 2 and "cannot read the allocation key file" in missing.output
    (tmp_path / "short").write_text("too-short\n")
    short = runner.invoke(cli.scheduler_command, [f"--allocation-key-file={tmp_path / 'short'}"])
    assert short.exit_code == 2 and "at least 32" in short.output


def test_fgd_policy_flags_and_pinned_workload(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: list[Any] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        s = options.settings
        seen.append((s.node_policy, s.gpu_policy, s.fgd_half_life, s.fgd_workload))

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    good = tmp_path / "workload.yaml"
    good.write_text("- {cpu: '4', memory: 16Gi, gpus: 1, gpuShare: 50, weight: 3}\n- {cpu: 500m}\n")
    args = [
        "--allow-unsigned-allocations",
        "--node-scheduler-policy",
        "fgd",
        "--gpu-scheduler-policy",
        "fgd",
        "--fgd-half-life",
        "1000",
    ]
    assert runner.invoke(cli.scheduler_command, [*args, "--fgd-workload-file", str(good)]).exit_code == 0
    node, gpu, half_life, workload = seen[0]
    assert (node, gpu, half_life) == ("fgd", "fgd", 1000.0)
    assert [round(p, 2) for _, p in workload.shapes] == [0.75, 0.25]
    assert runner.invoke(cli.scheduler_command, ["--allow-unsigned-allocations"]).exit_code == 0
    assert seen[1][:2] == ("binpack", "spread") and seen[1][3] is None  # HAMi's defaults, learned online
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {cpu: '4', gpus: 1, gpuShare: 150}\n")
    result = runner.invoke(
        cli.scheduler_command, ["--allow-unsigned-allocations", "--fgd-workload-file", str(bad)]
    )
    assert result.exit_code == 2 and "fgd workload entry 0.gpuShare" in result.output
    bad.write_text(
        "[" * 5000 + "]" * 5000
    )  # past the YAML reader's depth: a RecursionError, once a traceback
    result = runner.invoke(
        cli.scheduler_command, ["--allow-unsigned-allocations", "--fgd-workload-file", str(bad)]
    )
    assert result.exit_code == 2 and "Invalid value for --fgd-workload-file: " in result.output, result.output
    bad.write_text("- {cpu: [}\n")
    result = runner.invoke(
        cli.scheduler_command, ["--allow-unsigned-allocations", "--fgd-workload-file", str(bad)]
    )
    assert result.exit_code == 2 and "not valid YAML: while parsing a flow node" in result.output
    assert "^" not in result.output  # PyYAML's caret drawing stays out of the one line
    missing = runner.invoke(
        cli.scheduler_command,
        ["--allow-unsigned-allocations", "--fgd-workload-file", str(tmp_path / "none.yaml")],
    )
    assert missing.exit_code == 2 and "cannot read" in missing.output
    for absurd in ("0", "1e-300", "0.01", "1e13"):  # 1e-300 overflowed; 0.01 learned nothing
        refused = runner.invoke(
            cli.scheduler_command, ["--allow-unsigned-allocations", "--fgd-half-life", absurd]
        )
        assert refused.exit_code == 2 and "Traceback" not in refused.output
        assert "--fgd-half-life: the fgd half-life must be 1 to 1,000,000,000,000 pods" in refused.output
    assert len(seen) == 2


def test_metrics_tls_needs_the_serving_certificate() -> None:
    bad = CliRunner().invoke(cli.scheduler_command, [UNSIGNED, "--metrics-tls"])
    assert bad.exit_code == 2
    assert "--metrics-tls" in bad.output and "needs --tls-cert-file and --tls-key-file" in bad.output
    assert "Traceback" not in bad.output


def test_durations_beyond_go_are_usage_errors_and_a_bind_wait_beyond_the_budget_is_capped() -> None:
    for args in (["--bind-wait", "99999999999999h"], ["--reconcile-interval", "9" * 40 + "s"]):
        bad = CliRunner().invoke(cli.scheduler_command, [UNSIGNED, *args])
        assert bad.exit_code == 2 and "longer than a Go duration can be" in bad.output, args
    # the old default, 25 s, still starts (a review: refusing it broke upgrades), used as 19 s
    assert SchedulerOptions(settings=SchedulerSettings(bind_wait_s=25.0)).settings.bind_wait_s == 19.0


def test_names_a_running_scheduler_needs_are_not_empty() -> None:
    """A docs audit: an empty --scheduler-name left GPU pods to the default scheduler, an empty
    Lease name made a replica that could never lead; they started without a word."""
    for args, flag in (
        (["--scheduler-name="], "--scheduler-name"),
        (["--leader-elect", "--leader-elect-name="], "--leader-elect-name"),
        (["--device-plugin-namespace="], "--device-plugin-namespace"),
        (["--scheduler-pod-selector=!!!=="], "--scheduler-pod-selector"),
    ):
        bad = CliRunner().invoke(cli.scheduler_command, [UNSIGNED, *args])
        assert bad.exit_code == 2 and f"Invalid value for {flag}" in bad.output, args
    options = SchedulerOptions(
        scheduler_pod_selector="app=hamid, tier!=web,!legacy,app.kubernetes.io/name==x"
    )
    assert options.scheduler_pod_selector.startswith("app=hamid")


def test_node_label_selector_and_force_overwrite_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SchedulerSettings] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options.settings)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    assert runner.invoke(cli.scheduler_command, [UNSIGNED]).exit_code == 0
    selector = "--node-label-selector=gpu=on, example.com/pool=a,empty="
    assert runner.invoke(cli.scheduler_command, [UNSIGNED, selector]).exit_code == 0
    assert (
        runner.invoke(cli.scheduler_command, [UNSIGNED, "--no-force-overwrite-default-scheduler"]).exit_code
        == 0
    )
    repeated = ["--node-label-selector", "gpu=on", "--node-label-selector", "pool=a"]  # pflag merges
    assert runner.invoke(cli.scheduler_command, [UNSIGNED, *repeated]).exit_code == 0
    monkeypatch.setenv("HAMID_FORCE_OVERWRITE_DEFAULT_SCHEDULER", "false")
    monkeypatch.setenv("HAMID_NODE_LABEL_SELECTOR", "gpu=on, pool=b")
    assert runner.invoke(cli.scheduler_command, [UNSIGNED]).exit_code == 0
    assert [(str(s.node_label_selector), s.force_overwrite_default_scheduler) for s in seen] == [
        ("", True),  # HAMi's defaults: every node, default-scheduler pods handed over
        ("empty=,example.com/pool=a,gpu=on", True),
        ("", False),
        ("gpu=on,pool=a", True),
        ("gpu=on,pool=b", False),
    ]
    assert seen[1].node_label_selector.matches({"gpu": "on", "example.com/pool": "a", "empty": ""})
    assert not seen[1].node_label_selector.matches({"gpu": "on", "example.com/pool": "a"})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("gpu", "pair 'gpu' is not key=value"),
        ("gpu=on,=x", "pair '=x' has an empty key"),
        ("gpu=on,,pool=a", "has an empty pair"),
        ("gpu=on,", "has an empty pair"),
        ("gpu=o n", "pair 'gpu=o n': value 'o n' is not a label value"),
        ("gpu=on=off", "pair 'gpu=on=off': value 'on=off' is not a label value"),
        ("gpu=" + "x" * 64, "is not a label value"),
        ("Example.com/gpu=on", "prefix 'Example.com' is not a DNS subdomain"),
        ("example.com/=on", "the name is empty"),
        ("-gpu=on", "name '-gpu' is not a label name"),
        ("gpu=on,gpu=off", "pair 'gpu=off': key 'gpu' is given twice"),
    ],
)
def test_a_bad_node_label_selector_stops_the_start_naming_the_pair(
    monkeypatch: pytest.MonkeyPatch, value: str, error: str
) -> None:
    started: list[SchedulerOptions] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        started.append(options)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    bad = CliRunner().invoke(cli.scheduler_command, [UNSIGNED, "--node-label-selector", value])
    assert bad.exit_code == 2 and not started
    assert "Invalid value for --node-label-selector: " in bad.output and error in bad.output, bad.output
    assert "Traceback" not in bad.output


def test_hamis_bool_spelling_is_refused_loudly() -> None:
    """click flags take no value: HAMi's ``--force-overwrite-default-scheduler=false`` is a usage
    error (never read as true); ``--no-force-overwrite-default-scheduler`` is the spelling."""
    bad = CliRunner().invoke(cli.scheduler_command, [UNSIGNED, "--force-overwrite-default-scheduler=false"])
    assert bad.exit_code == 2 and "does not take a value" in bad.output


def test_steer_wait_is_a_duration_zero_disables_it_and_it_must_leave_time_for_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float] = []

    async def fake_run(options: SchedulerOptions, **_: Any) -> None:
        seen.append(options.settings.steer_wait_s)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    for args in ([], ["--steer-wait", "0"], ["--steer-wait", "250ms"]):
        assert runner.invoke(cli.scheduler_command, [UNSIGNED, *args]).exit_code == 0, args
    assert seen == [5.0, 0.0, 0.25]
    bad = runner.invoke(cli.scheduler_command, [UNSIGNED, "--steer-wait", "19s"])
    assert (
        bad.exit_code == 2
        and "--steer-wait" in bad.output
        and "no time to wait for the node lock" in bad.output
    )
    helped = runner.invoke(cli.scheduler_command, ["--help"])
    assert "--steer-wait" in helped.output and "HAMID_STEER_WAIT; default: 5s" in helped.output
