from typing import Any

import pytest
from click.testing import CliRunner

from hamid.scheduler import cli


def test_gpu_policy_flag_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
        seen.append(options.settings.gpu_policy)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    assert runner.invoke(cli.scheduler_command, ["--gpu-scheduler-policy", "binpack,numa"]).exit_code == 0
    bad = runner.invoke(cli.scheduler_command, ["--gpu-scheduler-policy", "binpak"])
    assert bad.exit_code == 2 and "unknown policy 'binpak'" in bad.output
    assert runner.invoke(cli.scheduler_command, ["--node-scheduler-policy", "mutex"]).exit_code == 2
    assert seen == ["binpack,numa"]


def test_hami_plugin_service_account_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
        seen.append(options.refit_hami_plugin_service_account)

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    assert runner.invoke(cli.scheduler_command, []).exit_code == 0
    flag = "--refit-hami-plugin-service-account"
    assert runner.invoke(cli.scheduler_command, [flag, "kube-system/hami-device-plugin"]).exit_code == 0
    bad = runner.invoke(cli.scheduler_command, [flag, "hami-device-plugin"])
    assert bad.exit_code == 2 and "is not <namespace>/<serviceaccount>" in bad.output
    assert [None if a is None else (a.namespace, a.name) for a in seen] == [
        None,
        ("kube-system", "hami-device-plugin"),
    ]


def test_fgd_policy_flags_and_pinned_workload(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: list[Any] = []

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
        s = options.settings
        seen.append((s.node_policy, s.gpu_policy, s.fgd_half_life, s.fgd_workload))

    monkeypatch.setattr(cli, "run_scheduler", fake_run)
    runner = CliRunner()
    good = tmp_path / "workload.yaml"
    good.write_text("- {cpu: '4', memory: 16Gi, gpus: 1, gpuShare: 50, weight: 3}\n- {cpu: 500m}\n")
    args = ["--node-scheduler-policy", "fgd", "--gpu-scheduler-policy", "fgd", "--fgd-half-life", "1000"]
    assert runner.invoke(cli.scheduler_command, [*args, "--fgd-workload-file", str(good)]).exit_code == 0
    node, gpu, half_life, workload = seen[0]
    assert (node, gpu, half_life) == ("fgd", "fgd", 1000.0)
    assert [round(p, 2) for _, p in workload.shapes] == [0.75, 0.25]
    assert runner.invoke(cli.scheduler_command, []).exit_code == 0
    assert seen[1][:2] == ("binpack", "spread") and seen[1][3] is None  # HAMi's defaults, learned online
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {cpu: '4', gpus: 1, gpuShare: 150}\n")
    result = runner.invoke(cli.scheduler_command, ["--fgd-workload-file", str(bad)])
    assert result.exit_code == 2 and "fgd workload entry 0.gpuShare" in result.output
    missing = runner.invoke(cli.scheduler_command, ["--fgd-workload-file", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    assert runner.invoke(cli.scheduler_command, ["--fgd-half-life", "0"]).exit_code == 2
    assert len(seen) == 2
