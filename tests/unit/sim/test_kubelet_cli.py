"""`hamid sim kubelet` argument handling (the serving path is covered by the integration tests)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from hamid.cli import cli
from hamidsim.kubelet_cli import load_machine


def test_help_explains_options() -> None:
    result = CliRunner().invoke(cli, ["sim", "kubelet", "--help"])
    assert result.exit_code == 0
    for flag in ("--api-server", "--node-name", "--machine-file", "--root", "--topology-policy"):
        assert flag in result.output


def test_bad_machine_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("numaNodes: []\n")
    args = [
        "sim",
        "kubelet",
        "--api-server",
        "http://127.0.0.1:1",
        "--node-name",
        "n",
        "--root",
        str(tmp_path),
    ]
    result = CliRunner().invoke(cli, [*args, "--machine-file", str(bad)])
    assert result.exit_code == 1
    assert "'numaNodes' must be a non-empty list" in result.output
    result = CliRunner().invoke(cli, [*args, "--machine-file", "sample:nope"])
    assert "unknown sample machine 'nope'" in result.output
    result = CliRunner().invoke(cli, [*args, "--machine-file", "sample:1numa-2gpu", "--topology-policy", "x"])
    assert result.exit_code == 2


def test_sample_prefix() -> None:
    assert load_machine("sample:2numa-8gpu").numa_ids == [0, 1]


def test_config_file_is_validated_before_serving(tmp_path: Path) -> None:
    args = [
        "sim",
        "kubelet",
        "--api-server",
        "http://127.0.0.1:1",
        "--node-name",
        "n",
        "--root",
        str(tmp_path),
    ]
    many = [*args, "--machine-file", "sample:16numa-8gpu"]
    shipped = str(Path(__file__).resolve().parents[3] / "config" / "kubelet" / "config.yaml")
    result = CliRunner().invoke(cli, [*many, "--config", shipped])
    assert result.exit_code == 1
    assert "unsupported on machines with more than 8 NUMA Nodes" in result.output
    bad = tmp_path / "k.yaml"
    bad.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n"
    )
    result = CliRunner().invoke(cli, [*args, "--machine-file", "sample:1numa-2gpu", "--config", str(bad)])
    # The machine file's reservedCpus satisfy the reservation; a flag overrides the file's policy.
    assert "requires systemreserved.cpu" not in result.output
    result = CliRunner().invoke(
        cli, [*many, "--config", str(bad), "--topology-policy", "restricted", "--cpu-manager-policy", "none"]
    )
    assert "unsupported on machines with more than 8 NUMA Nodes" in result.output
