"""Node config merge (config.json over device-config defaults and flags) and startup errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hamid.cli import cli
from hamid.plugin.app import PluginStartupError, load_setup
from hamid.plugin.discovery import PhysicalGpu
from hamid.plugin.options import PluginOptions

DEVICE_CONFIG = """
nvidia:
  resourceCountName: example.com/vgpu
  deviceSplitCount: 6
  deviceMemoryScaling: 1
  enableNumaTopology: false
"""
DEVICES = (
    "devices:\n  - {uuid: GPU-0, index: 0, name: T4, memoryMiB: 15360, numa: 1, pciBusId: '0000:3b:00.0'}\n"
)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


async def test_node_entry_merges_over_device_config(tmp_path: Path) -> None:
    node_json = {
        "nodeconfig": [
            {"name": "other", "devicesplitcount": 99},
            {
                "name": "n1",
                "operatingmode": "hami-core",
                "devicesplitcount": 3,
                "enablenumatopology": True,
                "enablegetpreferredallocation": True,
                "filterdevices": {"uuid": ["GPU-9"], "index": [7]},
                "libcudaloglevel": "4",
            },
        ]
    }
    options = PluginOptions(
        node_name="n1",
        devices_file=await asyncio.to_thread(write, tmp_path / "d.yaml", DEVICES),
        node_config_file=await asyncio.to_thread(write, tmp_path / "c.json", json.dumps(node_json)),
        device_config_file=await asyncio.to_thread(write, tmp_path / "dc.yaml", DEVICE_CONFIG),
    )
    setup = await load_setup(options)
    c = setup.config
    assert (c.device_split_count, c.enable_numa_topology, c.enable_get_preferred_allocation) == (
        3,
        True,
        True,
    )
    assert (c.filter_uuids, c.filter_indices, c.lib_cuda_log_level) == (("GPU-9",), (7,), "4")
    assert setup.resource_name == "example.com/vgpu"  # from the device config
    assert setup.gpus == (PhysicalGpu("GPU-0", 0, "T4", 15360, 1, "0000:3b:00.0"),)
    flagged = await load_setup(dataclasses.replace(options, resource_name="nvidia.com/gpu"))
    assert flagged.resource_name == "nvidia.com/gpu"  # the flag wins
    defaults = await load_setup(dataclasses.replace(options, node_name="n2"))
    assert defaults.config.device_split_count == 6 and not defaults.config.enable_numa_topology


async def test_startup_errors_are_clear(tmp_path: Path) -> None:
    bad_json = await asyncio.to_thread(
        write, tmp_path / "c.json", '{"nodeconfig":[{"name":"n1","devicesplitcount":0}]}'
    )
    devices = await asyncio.to_thread(write, tmp_path / "d.yaml", DEVICES)
    with pytest.raises(PluginStartupError, match="devicesplitcount"):
        await load_setup(PluginOptions(node_name="n1", devices_file=devices, node_config_file=bad_json))
    with pytest.raises(PluginStartupError, match="--devices-file"):
        await load_setup(PluginOptions(node_name="n1", devices_file=str(tmp_path / "missing.yaml")))


def test_cli_without_nvml_or_devices_file_exits_with_one_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["plugin", "--node-name", "n1", "--node-config-file", str(tmp_path / "none.json")], env={}
    )
    assert result.exit_code == 1
    assert "pass --devices-file" in result.output and "Traceback" not in result.output


def test_cli_refuses_insecure_tls_with_a_token_at_startup(tmp_path: Path) -> None:
    """--scheduler-tls-insecure with a token file can never refit (the token is never sent over
    unverified TLS): one clear startup error instead of failing every call."""
    devices = write(tmp_path / "d.yaml", DEVICES)
    base = [
        "plugin",
        "--node-name",
        "n1",
        "--devices-file",
        devices,
        "--node-config-file",
        str(tmp_path / "x"),
    ]
    refit = ["--scheduler-endpoint", "https://sched.example:443", "--scheduler-tls-insecure"]
    token = ["--service-account-token-file", write(tmp_path / "token", "tok")]
    result = CliRunner().invoke(cli, [*base, *refit, *token], env={})
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert "--scheduler-tls-insecure cannot be used with a ServiceAccount token" in line
    assert "--scheduler-ca-file" in line


async def test_bad_config_files_stop_the_start_cleanly(tmp_path: Path) -> None:
    """Issue 16: each bad file is a PluginStartupError naming it, never a traceback later."""
    devices = await asyncio.to_thread(write, tmp_path / "d.yaml", DEVICES)
    cases: list[tuple[str, bytes, str]] = [
        ("node_config_file", b'{"nodeconfig": [{"name": "n1\xff"}]}', "not valid UTF-8"),
        ("node_config_file", b'{"nodeconfig": ' + b"[" * 20000 + b"]" * 20000 + b"}", "malformed JSON"),
        (
            "node_config_file",
            b'{"nodeconfig": [{"name": "n1", "devicememoryscaling": 1e308}]}',
            "at most 100",
        ),
        ("device_config_file", b"nvidia:\n  resourceCountName: \xff\n", "--device-config-file"),
        ("devices_file", b"devices:\n  - {uuid: GPU-\xfe}\n", "not valid UTF-8"),
        ("devices_file", b'{"devices": ' + b"[" * 20000 + b"]" * 20000 + b"}", "nested too deeply"),
        ("devices_file", DEVICES.replace("15360", str(10**30)).encode(), "memoryMiB must be an integer"),
        ("devices_file", DEVICES.replace("index: 0", f"index: {2**40}").encode(), "index must be an integer"),
        ("devices_file", DEVICES.replace("numa: 1", f"numa: {2**40}").encode(), "numa must be an integer"),
        ("devices_file", DEVICES.replace("GPU-0", '"GPU-0\\nGPU-1"').encode(), "uuid must be"),
    ]
    for i, (option, content, message) in enumerate(cases):
        path = tmp_path / f"bad-{i}"
        await asyncio.to_thread(path.write_bytes, content)
        override: dict[str, Any] = {option: str(path)}
        options = dataclasses.replace(PluginOptions(node_name="n1", devices_file=devices), **override)
        with pytest.raises(PluginStartupError) as err:
            await load_setup(options)
        assert message in str(err.value), (option, str(err.value))
        assert str(path) in str(err.value)
