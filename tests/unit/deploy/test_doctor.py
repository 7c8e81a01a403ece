"""`hamid doctor` on good and bad sample configs, a fake sysfs and a real scheduler endpoint."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from hamid.cli import cli
from hamid.doctor import Status, _endpoint_finding, probe_endpoint
from hamid.tls import client_ssl_context
from tests.fixtures.tls import TLSFiles

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[3]
GOOD_KUBELET = REPO / "config" / "kubelet" / "config.yaml"
NODE = "gpu-node-1"
STARTUP_TIMEOUT_S = 10.0


def make_sysfs(root: Path, numa_nodes: int) -> Path:
    """A fake sysfs with ``numa_nodes`` NUMA nodes (plus the non-node entries Linux has)."""
    node_dir = root / "sys" / "devices" / "system" / "node"
    node_dir.mkdir(parents=True)
    for n in range(numa_nodes):
        (node_dir / f"node{n}").mkdir()
    (node_dir / "possible").write_text(f"0-{numa_nodes - 1}\n")
    return root / "sys"


def node(
    tmp_path: Path, numa: int = 2, devices: str = "devices-2-numa.yaml", kubelet: Path = GOOD_KUBELET
) -> list[str | Path]:
    """Doctor arguments for a node: kubelet config, a fake sysfs with ``numa`` nodes, a devices file."""
    return [
        "--kubelet-config", kubelet,
        "--sysfs-root", make_sysfs(tmp_path, numa),
        "--devices-file", DATA / devices,
    ]  # fmt: skip


def doctor(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, ["doctor", *map(str, args)], catch_exceptions=False)


def lines(result: Result, status: Status) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith(status.value)]


def test_good_node_passes(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path), "--node-config-file", DATA / "nodeconfig-seed.json", "--node-name", NODE)
    assert result.exit_code == 0, result.output
    assert not lines(result, Status.FAIL)
    assert not lines(result, Status.WARN)
    for setting in (
        "cpuManagerPolicy",
        "reservedSystemCPUs",
        "topologyManagerPolicy",
        "topologyManagerScope",
    ):
        assert any(setting in line for line in lines(result, Status.OK)), setting
    assert "node 0: 2, node 1: 2" in result.output
    assert "scheduler endpoint: not checked" in result.output


def test_bad_kubelet_config_blocks_with_fixes(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path, kubelet=DATA / "kubelet-bad.yaml"))
    assert result.exit_code == 1
    failed = "\n".join(lines(result, Status.FAIL))
    assert "cpuManagerPolicy: is 'none'" in failed
    assert "reservedSystemCPUs" in failed
    assert "topologyManagerPolicy: is 'none'" in failed
    assert any("topologyManagerScope: is 'pod'" in line for line in lines(result, Status.WARN))
    assert "fix: set cpuManagerPolicy: static" in result.output
    assert "fix: set topologyManagerPolicy: single-numa-node" in result.output
    assert "NUMA alignment is blocked" in result.output


def test_missing_kubelet_config_fails(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path, kubelet=tmp_path / "absent.yaml"))
    assert result.exit_code == 1
    assert "cannot read kubelet config" in result.output


def test_a_kubelet_config_that_is_not_utf8_fails_in_one_line(tmp_path: Path) -> None:
    """One byte that is no UTF-8 raised a traceback and printed no report."""
    config = tmp_path / "kubelet.yaml"
    config.write_bytes(GOOD_KUBELET.read_bytes() + b"\n# \xff\n")
    result = doctor(*node(tmp_path, kubelet=config))
    assert result.exit_code == 1
    assert "is not UTF-8 (byte offset" in "\n".join(lines(result, Status.FAIL))


def test_more_numa_nodes_than_kubelet_allows(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path, numa=16))
    assert result.exit_code == 1
    (numa,) = [line for line in lines(result, Status.FAIL) if "NUMA nodes" in line]
    assert "16 NUMA nodes exceed max-allowable-numa-nodes 8" in numa
    assert 'max-allowable-numa-nodes: "16"' in result.output


def _ok_line(result: Result, check: str) -> str:
    (line,) = [found for found in lines(result, Status.OK) if check in found]
    return line


def test_the_reservation_line_names_the_setting_that_reserves(tmp_path: Path) -> None:
    """Only kubeReserved.cpu set: the line says so (it was labelled reservedSystemCPUs)."""
    config = tmp_path / "kubelet.yaml"
    only_kube_reserved = "kubeReserved: {cpu: '1'}\n#reservedSystemCPUs:"
    config.write_text(GOOD_KUBELET.read_text().replace("reservedSystemCPUs:", only_kube_reserved))
    assert "kubeReserved.cpu is set" in _ok_line(doctor(*node(tmp_path, kubelet=config)), "CPU reservation")
    assert "reservedSystemCPUs is set" in _ok_line(doctor(*node(tmp_path / "good")), "CPU reservation")


@pytest.mark.parametrize("cpu", ["0m", "0.0", "0", "none"])
def test_a_reservation_of_no_cpu_is_none(tmp_path: Path, cpu: str) -> None:
    """``kubeReserved.cpu: 0m`` reserves nothing (kubelet's static policy then refuses to start):
    it passed as a reservation, compared as text."""
    config = tmp_path / "kubelet.yaml"
    zero = f"kubeReserved: {{cpu: '{cpu}'}}\n#reservedSystemCPUs:"
    config.write_text(GOOD_KUBELET.read_text().replace("reservedSystemCPUs:", zero))
    result = doctor(*node(tmp_path, kubelet=config))
    assert any("reservedSystemCPUs" in line for line in lines(result, Status.FAIL)), result.output


def test_one_numa_node_is_one_verdict_with_or_without_a_kubelet_config(tmp_path: Path) -> None:
    with_config = doctor(*node(tmp_path / "a", numa=1))
    sysfs = make_sysfs(tmp_path / "b", 1)
    without = doctor("--kubelet-config", tmp_path / "absent.yaml", "--sysfs-root", sysfs)
    for result in (with_config, without):
        warned = [found for found in lines(result, Status.WARN) if "1 NUMA node: nothing to align" in found]
        assert warned, result.output


def test_file_options_refuse_a_directory(tmp_path: Path) -> None:
    for flag in ("--devices-file", "--node-config-file"):
        result = CliRunner().invoke(cli, ["doctor", flag, str(tmp_path)])
        assert result.exit_code == 2 and "is a directory" in result.output, (flag, result.output)


def test_raised_max_allowable_numa_nodes(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path, numa=16, kubelet=DATA / "kubelet-16-numa.yaml"))
    assert result.exit_code == 0, result.output
    assert "16 (max-allowable-numa-nodes 16)" in result.output


def test_malformed_max_allowable_numa_nodes(tmp_path: Path) -> None:
    config = tmp_path / "kubelet.yaml"
    text = (DATA / "kubelet-16-numa.yaml").read_text().replace('"16"', '"true"')
    config.write_text(text)
    result = doctor(*node(tmp_path, kubelet=config))
    assert result.exit_code == 1
    assert "not an integer" in result.output


def test_gpus_with_unknown_numa_block_alignment(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path, devices="devices-unknown-numa.yaml"))
    assert result.exit_code == 1
    (gpu,) = [line for line in lines(result, Status.FAIL) if "GPU NUMA" in line]
    assert "GPU-bbbb0000" in gpu
    assert "GPU-bbbb0001" in gpu


def test_node_config_without_the_seed_switches(tmp_path: Path) -> None:
    result = doctor(*node(tmp_path), "--node-config-file", DATA / "nodeconfig-mig.json", "--node-name", NODE)
    assert result.exit_code == 1
    failed = "\n".join(lines(result, Status.FAIL))
    assert "operatingmode: is 'mig'" in failed
    assert "enablenumatopology: is false" in failed
    # without a preferred allocation the refit still happens, at Allocate (a docs audit: it said
    # "no refit happens" and blocked the node)
    warned = "\n".join(lines(result, Status.WARN))
    assert "enablegetpreferredallocation: is false" in warned and "refitted (at Allocate)" in warned
    assert '"enablegetpreferredallocation": true' in result.output


def test_device_config_defaults_apply_under_the_node_entry(tmp_path: Path) -> None:
    node_config = tmp_path / "config.json"
    node_config.write_text('{"nodeconfig": [{"name": "gpu-node-1", "enablegetpreferredallocation": true}]}')
    device_config = tmp_path / "device-config.yaml"
    device_config.write_text("nvidia:\n  enableNumaTopology: true\n")
    base = [*node(tmp_path), "--node-config-file", node_config, "--node-name", NODE]
    assert doctor(*base).exit_code == 1
    result = doctor(*base, "--device-config-file", device_config)
    assert result.exit_code == 0, result.output


def test_unreadable_node_and_device_configs_fail_in_one_line(tmp_path: Path) -> None:
    """Bytes that are not UTF-8, a number past a float's range: a FAIL line each, no traceback."""
    node_config = tmp_path / "config.json"
    device_config = tmp_path / "device-config.yaml"
    device_config.write_text("nvidia:\n  enableNumaTopology: true\n")
    base = [*node(tmp_path), "--node-config-file", node_config, "--node-name", NODE]
    for config, text, named in (
        (node_config, b"\xff\xfe\x00garbage", "node config"),
        (
            node_config,
            f'{{"nodeconfig": [{{"name": "{NODE}", "devicememoryscaling": {10**400}}}]}}'.encode(),
            "node config",
        ),
        # a bad device config is named as such, with its own fix (a docs audit: it read as the node config)
        (device_config, f"nvidia:\n  deviceMemoryScaling: {10**400}\n".encode(), "device config"),
    ):
        node_config.write_text('{"nodeconfig": []}')
        config.write_bytes(text)
        result = doctor(*base, "--device-config-file", device_config)
        assert result.exit_code == 1
        [failed] = [line for line in lines(result, Status.FAIL) if named in line]
        assert "utf-8" in failed or "out of range" in failed
        assert ("devices.nvidia" in result.output) == (named == "device config")


def test_node_without_entry_and_node_name_missing(tmp_path: Path) -> None:
    base = [*node(tmp_path), "--node-config-file", DATA / "nodeconfig-seed.json"]
    other = doctor(*base, "--node-name", "other-node")
    assert other.exit_code == 1
    assert "no entry for node 'other-node'" in other.output
    assert "--node-config-file needs --node-name" in doctor(*base).output


def test_bad_devices_file_fails(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("devices: [{uuid: GPU-x}]\n")
    result = doctor(
        "--kubelet-config", GOOD_KUBELET, "--sysfs-root", make_sysfs(tmp_path, 2), "--devices-file", devices
    )
    assert result.exit_code == 1
    assert "cannot use devices file" in result.output


# --- scheduler endpoint -----------------------------------------------------------------------------


def _app(status: int = 200, gate: asyncio.Event | None = None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        if gate is not None:
            await gate.wait()
        return web.Response(status=status, text="ok" if status == 200 else "broken")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    return app


async def _serve(app: web.Application, tls: TLSFiles | None) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    ssl_ctx = None
    if tls is not None:
        ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_ctx.load_cert_chain(tls.server.cert_file, tls.server.key_file)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"{'https' if tls else 'http'}://127.0.0.1:{port}"


@pytest.fixture
async def https_endpoint(tls_files: TLSFiles) -> AsyncIterator[str]:
    runner, url = await _serve(_app(), tls_files)
    yield url
    await runner.cleanup()


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("http://127.0.0.1:9", "is plain HTTP"),
        ("notaurl", "is not an http(s) URL"),
        ("ftp://x", "not an http"),
        ("https://[::1", "is not a URL: Invalid IPv6 URL"),  # raised a traceback
        ("https://h:99999", "is not a URL: Port out of range"),
        ("https://h:https", "is not a URL: Port could not be cast"),
    ],
)
def test_an_endpoint_the_plugin_would_refuse_fails_before_any_probe(endpoint: str, says: str) -> None:
    """A docs audit: a plain http:// endpoint answered OK, though the plugin refuses to send its
    token there; a string that is no URL read as a network problem."""
    finding = _endpoint_finding(endpoint, None)
    assert finding.status is Status.FAIL and says in finding.message


async def test_endpoint_ok_with_the_ca(https_endpoint: str, tls_files: TLSFiles) -> None:
    finding = await probe_endpoint(https_endpoint, client_ssl_context(tls_files.ca_file))
    assert finding.status is Status.OK, finding


async def test_endpoint_untrusted_certificate(https_endpoint: str) -> None:
    finding = await probe_endpoint(https_endpoint, client_ssl_context())
    assert finding.status is Status.FAIL
    assert "not trusted" in finding.message
    assert "--scheduler-ca-file" in finding.fix


async def test_endpoint_unhealthy_answer() -> None:
    runner, url = await _serve(_app(status=503), None)
    try:
        finding = await probe_endpoint(url, None)
    finally:
        await runner.cleanup()
    assert finding.status is Status.FAIL
    assert "HTTP 503" in finding.message


async def test_endpoint_that_never_answers() -> None:
    gate = asyncio.Event()
    runner, url = await _serve(_app(gate=gate), None)
    try:
        finding = await probe_endpoint(url, None, timeout_s=0.2)
    finally:
        gate.set()
        await runner.cleanup()
    assert finding.status is Status.FAIL
    assert "no answer within 0.2s" in finding.message


async def test_endpoint_refusing_connections() -> None:
    runner, url = await _serve(_app(), None)
    await runner.cleanup()  # the port is now closed
    finding = await probe_endpoint(url, None)
    assert finding.status is Status.FAIL


@pytest.fixture
def threaded_https_endpoint(tls_files: TLSFiles) -> Iterator[str]:
    """The fake scheduler in its own thread and loop (the CLI runs its own asyncio.run)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(_serve(_app(), tls_files))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert started.wait(STARTUP_TIMEOUT_S)
    yield str(box["url"])
    runner = box["runner"]
    assert isinstance(runner, web.AppRunner)
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(STARTUP_TIMEOUT_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(STARTUP_TIMEOUT_S)
    loop.close()


def test_cli_checks_the_scheduler_endpoint(
    tmp_path: Path, threaded_https_endpoint: str, tls_files: TLSFiles
) -> None:
    base = [*node(tmp_path), "--scheduler-endpoint", threaded_https_endpoint]
    good = doctor(*base, "--scheduler-ca-file", tls_files.ca_file)
    assert good.exit_code == 0, good.output
    assert f"OK    scheduler endpoint: {threaded_https_endpoint}/healthz answered 200" in good.output
    untrusted = doctor(*base)
    assert untrusted.exit_code == 1
    assert "not trusted" in untrusted.output
    unreadable = doctor(*base, "--scheduler-ca-file", tmp_path / "missing.crt")
    assert unreadable.exit_code == 1
