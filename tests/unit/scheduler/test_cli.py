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
