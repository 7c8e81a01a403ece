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
