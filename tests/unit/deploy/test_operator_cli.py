"""The operator's CLI: parse-time checks, one-line failures, ``--version``, plugin start checks."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hamid import __version__
from hamid.cli import cli
from hamid.doctor import Status, check_node_config, probe_endpoint
from hamid.model.nodeconfig import NodeConfig
from hamid.plugin.cli import check_refit_config
from hamid.plugin.refit_client import RefitClientConfig
from hamid.tls import client_ssl_context
from tests.fixtures.tls import TLSFiles, commented_bundle

REPO = Path(__file__).resolve().parents[3]


def hamid(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``hamid ARGS`` in a subprocess (stdout and stderr as a user sees them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KUBECONFIG", None)
    code = "from hamid.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_version_flag() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"hamid {__version__}"


@pytest.mark.parametrize("flag", ["--listen", "--extender-listen", "--metrics-listen"])
def test_listen_addresses_are_checked_at_parse_time(flag: str) -> None:
    result = CliRunner().invoke(cli, ["scheduler", flag, "nonsense"])
    assert result.exit_code == 2
    assert "listen address 'nonsense' must be host:port" in result.output


def test_busy_port_is_one_line_and_non_zero() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = hamid(
            "scheduler",
            "--allow-unsigned-allocations",
            "--api-server=http://127.0.0.1:1",
            f"--listen=127.0.0.1:{port}",
            "--extender-listen=127.0.0.1:0",
            "--metrics-listen=127.0.0.1:0",
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: cannot start the cluster listener on 127.0.0.1:{port}: address already in use "
        "(another process listens there)"
    ]
    # the default --refit-auth (token; mtls only with --client-ca-file) does not warn without mTLS
    assert "refit_auth_method_unusable" not in done.stderr


def test_missing_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = hamid(
        "scheduler", "--allow-unsigned-allocations", f"--kubeconfig={missing}", "--listen=127.0.0.1:0"
    )
    assert done.returncode == 1
    assert f"Error: kubeconfig {missing} does not exist" in done.stderr
    assert "current-context" not in done.stderr and "Config not found" not in done.stderr
    assert "Traceback" not in done.stderr


def test_plugin_refuses_an_unreadable_ca_file(tmp_path: Path) -> None:
    config = RefitClientConfig(
        endpoint="https://s:443", ca_file=str(tmp_path / "missing.pem"), token_file=None
    )
    with pytest.raises(click.UsageError, match=r"NUMA refit TLS: .*missing\.pem"):
        check_refit_config(config)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(click.UsageError, match="NUMA refit TLS"):
        check_refit_config(RefitClientConfig(endpoint="https://s:443", ca_file=str(garbage), token_file=None))


def test_plugin_accepts_a_ca_bundle_with_non_ascii_comments(tls_files: TLSFiles, tmp_path: Path) -> None:
    """A certifi-style ``--scheduler-ca-file`` (issuers named in non-ASCII comment lines) was a
    TypeError traceback at start; OpenSSL reads it, and so does the start check now."""
    bundle = commented_bundle(tls_files.ca_file, tmp_path / "bundle.pem")
    assert (
        check_refit_config(RefitClientConfig(endpoint="https://s:443", ca_file=str(bundle), token_file=None))
        == []
    )
    inside = tmp_path / "inside.pem"
    inside.write_text(bundle.read_text().replace("-----\n", "-----\n\u0151", 1), encoding="utf-8")
    with pytest.raises(click.UsageError, match=r"NUMA refit TLS: .*not a valid PEM bundle"):
        check_refit_config(RefitClientConfig(endpoint="https://s:443", ca_file=str(inside), token_file=None))


def test_plugin_http_endpoint(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n")
    with pytest.raises(click.UsageError, match="only ever sent over https"):
        check_refit_config(RefitClientConfig(endpoint="http://s:80", token_file=str(token)))
    warnings = check_refit_config(RefitClientConfig(endpoint="http://s:80", token_file=None))
    assert len(warnings) == 1 and "plain http://" in warnings[0]


def test_plugin_endpoint_that_is_no_url_and_a_directory_as_token_are_named(tmp_path: Path) -> None:
    """A docs audit: ``notaurl`` was reported as a missing token file, and a directory passed the
    token check (readable), so every refit would have failed at its first call."""
    for endpoint in ("notaurl", "ftp://x", "https://"):
        with pytest.raises(click.UsageError, match="is not a URL like https://"):
            check_refit_config(RefitClientConfig(endpoint=endpoint, token_file=None))
    with pytest.raises(click.UsageError, match="is missing, not a file or unreadable"):
        check_refit_config(RefitClientConfig(endpoint="https://s:443", token_file=str(tmp_path)))


def test_plugin_client_cert_without_the_token_file(tls_files: TLSFiles, tmp_path: Path) -> None:
    pair = tls_files.client("system:node:n1")
    config = RefitClientConfig(
        endpoint="https://s:443",
        ca_file=str(tls_files.ca_file),
        client_cert_file=str(pair.cert_file),
        client_key_file=str(pair.key_file),
        token_file=str(tmp_path / "no-token"),
    )
    with pytest.raises(
        click.UsageError, match="--service-account-token-file='' to authenticate by mTLS only"
    ):
        check_refit_config(config)
    assert check_refit_config(dataclasses.replace(config, token_file=None)) == []


def test_plugin_start_check_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "plugin",
            "--node-name=n1",
            "--scheduler-endpoint=https://s:443",
            f"--scheduler-ca-file={tmp_path / 'missing.pem'}",
        ],
    )
    assert result.exit_code == 2
    assert "NUMA refit TLS:" in result.output and "Traceback" not in result.output


async def test_doctor_connect_failure_has_no_ssl_context_repr(tls_files: TLSFiles) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    finding = await probe_endpoint(f"https://127.0.0.1:{port}", client_ssl_context(tls_files.ca_file))
    assert finding.status is Status.FAIL
    assert "SSLContext" not in finding.message and "ssl:" not in finding.message
    assert f"cannot connect to 127.0.0.1:{port}" in finding.message


def test_doctor_grammar() -> None:
    findings = check_node_config(NodeConfig(), "n1", has_entry=False)
    assert any("add a devicePlugin.nodeConfiguration.config entry" in f.fix for f in findings)
    assert not any("add an " in f.fix for f in findings)


def test_plugin_busy_metrics_port_is_one_line(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        "devices:\n"
        "  - {uuid: GPU-a, index: 0, name: T4, memoryMiB: 15360, numa: 0, pciBusId: '0000:01:00.0'}\n"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = hamid(
            "plugin",
            "--node-name=n1",
            f"--devices-file={devices}",
            f"--node-config-file={tmp_path / 'none.json'}",
            f"--device-plugin-dir={tmp_path}/",
            "--api-server=http://127.0.0.1:1",
            f"--metrics-listen=127.0.0.1:{port}",
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: cannot start the metrics listener on 127.0.0.1:{port}: address already in use "
        "(another process listens there)"
    ]
