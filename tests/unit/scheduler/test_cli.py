from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hamid.scheduler import cli
from hamid.scheduler.signing import AllocationKeys, key_id

UNSIGNED = "--allow-unsigned-allocations"


def test_gpu_policy_flag_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
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

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
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
    seen: list[cli.SchedulerOptions] = []

    async def fake_run(options: cli.SchedulerOptions, **_: Any) -> None:
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
