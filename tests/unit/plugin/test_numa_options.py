"""``hamid plugin``'s NUMA publishing options reach the publisher's sources."""

from __future__ import annotations

from click.testing import CliRunner

from hamid.cli import cli
from hamid.plugin.options import PluginOptions


def test_help_lists_the_numa_options_with_their_defaults() -> None:
    result = CliRunner().invoke(cli, ["plugin", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for flag, default in (
        ("--kubelet-config", "/var/lib/kubelet/config.yaml"),
        ("--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock"),
        ("--sysfs-root", "/sys"),
    ):
        assert flag in result.output and default in result.output


def test_options_become_the_publishers_sources() -> None:
    sources = PluginOptions(
        node_name="n", sysfs_root="/host/sys", kubelet_config=None, pod_resources_socket="/run/pr.sock"
    ).numa_sources()
    assert (sources.sysfs_root, sources.kubelet_config, sources.pod_resources_socket) == (
        "/host/sys",
        None,
        "/run/pr.sock",
    )
    assert PluginOptions(node_name="n").numa_sources().kubelet_config == "/var/lib/kubelet/config.yaml"
