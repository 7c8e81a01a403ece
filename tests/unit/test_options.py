"""Options defined once: dataclass fields become click options; defaults, env vars and checks follow."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import click
import pytest
from click.testing import CliRunner

from hamid.options import OptionError, click_options, from_cli
from hamid.plugin.cli import plugin_command
from hamid.plugin.device_lists import DeviceLists
from hamid.plugin.device_nodes import DeviceNodes
from hamid.plugin.options import PluginOptions
from hamid.scheduler.core import DEFAULT_SCHEDULER_NAME, SchedulerSettings
from hamid.scheduler.options import SchedulerOptions, format_duration


def _parse(cls: type, args: list[str], env: dict[str, str] | None = None) -> Any:
    """Run a throwaway command generated from ``cls``; the dataclass it built (or the click result)."""
    seen: list[Any] = []

    @click.command()
    @click_options(cls)
    def command(**values: object) -> None:
        seen.append(from_cli(cls, values))

    result = CliRunner().invoke(command, args, env=env)
    return seen[0] if seen else result


def test_no_flags_give_the_dataclass_defaults() -> None:
    assert _parse(SchedulerOptions, []) == SchedulerOptions()
    assert _parse(PluginOptions, ["--node-name=n1"]) == PluginOptions(node_name="n1")


def test_settings_defaults_stay_with_the_settings() -> None:
    options = SchedulerOptions()
    assert options.settings == SchedulerSettings()
    assert options.leader_elect_name == DEFAULT_SCHEDULER_NAME == SchedulerSettings().scheduler_name


def test_go_durations_and_env_vars_reach_the_fields() -> None:
    options = _parse(
        SchedulerOptions,
        ["--node-lock-timeout=90s", "--bind-wait=1500ms", "--leader-elect-retry-period=500ms"],
        env={"HAMID_RECONCILE_INTERVAL": "0", "POD_NAME": "sched-0", "HAMID_POD_NAMESPACE": "hami"},
    )
    assert options.settings.node_lock_timeout == timedelta(seconds=90)
    assert options.settings.bind_wait_s == 1.5
    assert options.settings.reconcile_interval_s == 0.0
    assert options.leader_elect_retry_period_s == 0.5
    assert (options.pod_name, options.pod_namespace) == ("sched-0", "hami")


def test_nested_flags_fill_the_refit_client_config() -> None:
    options = _parse(
        PluginOptions,
        ["--node-name=n1", "--scheduler-endpoint=https://s:443", "--service-account-token-file="],
        env={"HAMI_SCHEDULER_TLS_INSECURE": "true"},
    )
    assert options.refit.endpoint == "https://s:443"
    assert options.refit.insecure is True
    assert options.refit.token_file is None


def test_pass_device_specs_is_off_by_default_and_reads_nvidias_env_names() -> None:
    assert _parse(PluginOptions, ["--node-name=n1"]).device_nodes() is None
    hami_chart = {"PASS_DEVICE_SPECS": "true", "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}
    options = _parse(PluginOptions, ["--node-name=n1"], env=hami_chart)
    assert options.device_nodes() == DeviceNodes("/run/nvidia/driver", "/run/nvidia/driver")
    # NVIDIA's plugin takes the dev root from the driver root only when no dev root is given
    options = _parse(PluginOptions, ["--node-name=n1"], env={**hami_chart, "NVIDIA_DEV_ROOT": "/"})
    assert options.device_nodes() == DeviceNodes("/", "/")
    options = _parse(PluginOptions, ["--node-name=n1", "--dev-root-ctr-path=/driver-root"], env=hami_chart)
    assert options.device_nodes() == DeviceNodes("/run/nvidia/driver", "/driver-root")
    for flag in ("--dev-root", "--dev-root-ctr-path"):
        result = _parse(PluginOptions, ["--node-name=n1", f"{flag}=run/nvidia/driver"])
        assert result.exit_code == 2
        assert flag in result.output and "'run/nvidia/driver' is not an absolute path" in result.output


def test_cross_field_checks_name_the_flag() -> None:
    result = _parse(SchedulerOptions, ["--node-lock-timeout=1h", "--node-lock-max-hold=10m"])
    assert result.exit_code == 2
    assert "--node-lock-max-hold" in result.output and "10m is shorter than" in result.output
    result = _parse(SchedulerOptions, ["--tls-cert-file=/c.pem"])
    assert result.exit_code == 2 and "must be given together" in result.output


def test_the_same_checks_guard_direct_construction() -> None:
    with pytest.raises(OptionError, match="--gpu-scheduler-policy"):
        SchedulerOptions(settings=SchedulerSettings(gpu_policy="binpak"))
    with pytest.raises(OptionError, match="--node-name"):
        PluginOptions(node_name=" ")
    with pytest.raises(OptionError, match="--leader-elect-mode"):
        SchedulerOptions(leader_elect_mode="vote")


def test_lease_timings_are_flags_checked_like_kube_scheduler() -> None:
    options = _parse(SchedulerOptions, [])
    timings = (
        options.leader_elect_lease_duration_s,
        options.leader_elect_renew_deadline_s,
        options.leader_elect_retry_period_s,
    )
    assert timings == (15.0, 10.0, 2.0)  # kube-scheduler's defaults
    options = _parse(
        SchedulerOptions,
        [
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=1s",
        ],
    )
    assert options.leader_elect_lease_duration_s == 4.0 and options.leader_elect_renew_deadline_s == 3.0
    result = _parse(SchedulerOptions, ["--leader-elect-renew-deadline=15s"])
    assert result.exit_code == 2
    assert "--leader-elect-renew-deadline" in result.output and "not shorter than" in result.output
    result = _parse(SchedulerOptions, ["--leader-elect-retry-period=10s"])
    assert result.exit_code == 2 and "--leader-elect-retry-period" in result.output
    with pytest.raises(OptionError, match="--leader-elect-retry-period"):
        SchedulerOptions(leader_elect_retry_period_s=12.0)


def test_refit_auth_default_depends_on_the_client_ca() -> None:
    def with_ca(refit_auth: tuple[str, ...] | None = None) -> SchedulerOptions:
        tls = SchedulerOptions(tls_cert_file="/tls.crt", tls_key_file="/tls.key", client_ca_file="/ca.pem")
        if refit_auth is None:
            return tls
        return SchedulerOptions(
            tls_cert_file="/tls.crt", tls_key_file="/tls.key", client_ca_file="/ca.pem", refit_auth=refit_auth
        )

    assert SchedulerOptions().refit_auth == ("token",)
    assert with_ca().refit_auth == ("mtls", "token")
    assert SchedulerOptions(refit_auth=("mtls",)).refit_auth == ("mtls",)
    assert with_ca(refit_auth=()).refit_auth == ()  # none: every refit refused
    assert _parse(SchedulerOptions, ["--refit-auth="]).refit_auth == ()
    kept = dataclasses.replace(with_ca(), client_ca_file=None)
    assert kept.refit_auth == ("mtls", "token")  # resolved once: a replace keeps the value
    # a client CA without TLS was ignored without a word (a docs audit): client certificates need TLS
    with pytest.raises(OptionError, match="--client-ca-file"):
        SchedulerOptions(client_ca_file="/ca.pem")


def test_help_shows_defaults_as_go_durations() -> None:
    @click.command()
    @click_options(SchedulerOptions)
    def command(**_: object) -> None:
        raise AssertionError("--help runs nothing")

    out = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    for text in ("default: 5m", "default: 30m", "default: 19s", "default: 2s", "HAMID_BIND_WAIT"):
        assert text in out


@pytest.mark.parametrize(
    ("value", "text"),
    [(300.0, "5m"), (timedelta(minutes=30), "30m"), (25.0, "25s"), (0.5, "500ms"), (0.0, "0"), (5400, "90m")],
)
def test_format_duration(value: float | timedelta, text: str) -> None:
    assert format_duration(value) == text


def test_device_list_strategy_takes_repeats_comma_lists_and_hamis_env() -> None:
    assert _parse(PluginOptions, ["--node-name=n1"]).device_lists() == DeviceLists(("envvar",), ())
    options = _parse(
        PluginOptions,
        ["--node-name=n1", "--device-list-strategy=cdi-cri", "--device-list-strategy", "envvar, cdi-cri"],
    )
    assert options.device_list_strategy == ("cdi-cri", "envvar")
    hami_chart = {
        "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri",
        "GDRCOPY_ENABLED": "true",
        "GDS_ENABLED": "false",
        "MOFED_ENABLED": "true",
    }
    options = _parse(PluginOptions, ["--node-name=n1"], env=hami_chart)
    assert options.device_lists() == DeviceLists(("cdi-annotations", "cdi-cri"), ("gdrcopy", "mofed"))
    options = _parse(PluginOptions, ["--node-name=n1", "--cdi-spec-dirs=/a", "--cdi-spec-dirs=/b,/c"])
    assert options.cdi_spec_dirs == ("/a", "/b", "/c")
    assert _parse(PluginOptions, ["--node-name=n1"]).cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")


@pytest.mark.parametrize(
    ("args", "env", "flag", "message"),
    [
        (["--device-list-strategy=cdi"], {}, "--device-list-strategy", "'cdi': not a device list strategy"),
        ([], {"DEVICE_LIST_STRATEGY": "envvar,nvml"}, "--device-list-strategy", "'nvml': not a device list"),
        (["--device-list-strategy= ,"], {}, "--device-list-strategy", "no device list strategy"),
        (["--cdi-spec-dirs=etc/cdi"], {}, "--cdi-spec-dirs", "'etc/cdi': not an absolute path"),
        (["--cdi-spec-dirs="], {}, "--cdi-spec-dirs", "no directory"),
    ],
)
def test_bad_device_list_values_are_one_usage_error(
    args: list[str], env: dict[str, str], flag: str, message: str
) -> None:
    result = _parse(PluginOptions, ["--node-name=n1", *args], env=env)
    assert result.exit_code == 2
    assert f"Invalid value for {flag}: " in result.output and message in result.output


def test_device_list_checks_guard_direct_construction() -> None:
    with pytest.raises(OptionError, match="--device-list-strategy: 'index': not a device list strategy"):
        PluginOptions(node_name="n1", device_list_strategy=("index",))
    with pytest.raises(OptionError, match="--cdi-spec-dirs: no directory"):
        PluginOptions(node_name="n1", cdi_spec_dirs=())


def test_with_cdi_only_no_device_specs_are_declared() -> None:
    """The CDI spec declares the device nodes: --pass-device-specs then adds nothing (upstream)."""
    on = PluginOptions(node_name="n1", pass_device_specs=True, device_list_strategy=("envvar", "cdi-cri"))
    assert on.device_nodes() == DeviceNodes("/", "/")
    off = dataclasses.replace(on, device_list_strategy=("cdi-annotations", "cdi-cri"))
    assert off.device_nodes() is None


@pytest.mark.parametrize(
    ("args", "env", "refused"),
    [
        (
            ["--device-id-strategy=index"],
            {},
            "--device-id-strategy (env DEVICE_ID_STRATEGY): 'index' is refused",
        ),
        ([], {"DEVICE_ID_STRATEGY": "index"}, "'index' is refused: GPUs are named by UUID"),
        (["--cdi-annotation-prefix=example.com/"], {}, "--cdi-annotation-prefix (env CDI_ANNOTATION_PREFIX)"),
        ([], {"IMEX_CHANNEL_IDS": "0"}, "'0' is refused: IMEX channels are not built in hamid"),
        (["--imex-channel-ids=0", "--imex-channel-ids=1"], {}, "IMEX channels are not built in hamid"),
        (["--imex-required"], {}, "--imex-required (env IMEX_REQUIRED): on is refused"),
        ([], {"IMEX_REQUIRED": "true"}, "on is refused: IMEX channels"),
    ],
)
def test_hamis_unbuilt_plugin_options_are_refused_by_name(
    args: list[str], env: dict[str, str], refused: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(click.BadParameter) as err:
        plugin_command.make_context("plugin", ["--node-name=n1", *args])
    assert refused in err.value.format_message()


def test_hamis_unbuilt_options_at_their_defaults_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"DEVICE_ID_STRATEGY": "uuid", "IMEX_REQUIRED": "false"}.items():
        monkeypatch.setenv(name, value)
    args = ["--node-name=n1", "--cdi-annotation-prefix=cdi.k8s.io/", "--imex-channel-ids="]
    context = plugin_command.make_context("plugin", args)
    assert from_cli(PluginOptions, context.params) == PluginOptions(node_name="n1")


def test_help_explains_the_device_list_options() -> None:
    out = " ".join(CliRunner().invoke(plugin_command, ["--help"], terminal_width=400).output.split())
    for flag, text in {
        "--device-list-strategy TEXT": "volume-mounts (NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container",
        "--cdi-spec-dirs TEXT": "hamid writes no spec",
        "--gdrcopy-enabled / --no-gdrcopy-enabled": "NVIDIA_GDRCOPY=enabled unless every device list",
        "--gds-enabled / --no-gds-enabled": "the CDI device nvidia.com/gds=all with a CDI strategy",
        "--mofed-enabled / --no-mofed-enabled": "NVIDIA_MOFED=enabled",
    }.items():
        own = out.split(flag, 1)[1].split(" --", 1)[0]  # the flag's own help
        assert text in own, own
    assert "DEVICE_LIST_STRATEGY" in out and "GDS_ENABLED" in out and "default: (envvar)" in out
    assert "--imex-required" not in out  # refused options are hidden
