"""Discovery: fake NVML, fake sysfs tree, the static devices file, XID health."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from hamid.model.errors import InvalidInput
from hamid.plugin.discovery import (
    HealthCheckPolicy,
    PhysicalGpu,
    devices_file_json,
    discover_nvml,
    health_policy_from_env,
    load_devices_file,
    numa_from_sysfs,
    parse_devices_text,
    sysfs_bus_id,
    watch_xid_events,
)
from tests.unit.plugin.fake_nvml import FakeGpu, FakeNvml, NVMLError


def make_sysfs(root: Path, numa: dict[str, str]) -> Path:
    for bdf, value in numa.items():
        d = root / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "numa_node").write_text(value + "\n")
    return root


def test_sysfs_bus_id_forms() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("0000:AF:00.0") == "0000:af:00.0"


def test_numa_from_sysfs(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {"0000:3b:00.0": "1", "0000:5e:00.0": "-1", "0000:86:00.0": "junk"})
    assert numa_from_sysfs("00000000:3B:00.0", root) == 1
    assert numa_from_sysfs("00000000:5E:00.0", root) is None
    assert numa_from_sysfs("00000000:86:00.0", root) is None
    assert numa_from_sysfs("00000000:D8:00.0", root) is None  # missing file
    assert numa_from_sysfs("", root) is None


def test_discover_nvml(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {"0000:3b:00.0": "0", "0000:af:00.0": "1"})
    nvml = FakeNvml(
        [
            FakeGpu("GPU-a", bus_id="00000000:3B:00.0", memory_bytes=16 * 1024**3, minor=2),
            FakeGpu("GPU-b", name="NVIDIA A100", bus_id="00000000:AF:00.0", mig=1),
            FakeGpu("GPU-c", bus_id="00000000:D8:00.0", fail={"name"}),
            FakeGpu("GPU-lost", fail={"uuid"}),
            FakeGpu("GPU-e", bus_id="00000000:3B:00.0", fail={"memory"}, fail_code=3),
            FakeGpu("GPU-f", fail={"minor"}),
        ]
    )
    gpus = discover_nvml(root, nvml)
    by = {g.uuid: g for g in gpus}
    assert list(by) == ["GPU-a", "GPU-b", "GPU-c", "GPU-e", "GPU-f"]  # the unidentifiable one is skipped
    assert by["GPU-a"] == PhysicalGpu("GPU-a", 0, "Tesla T4", 16384, 0, "00000000:3B:00.0", False, True, 2)
    # the minor number names the device node (--pass-device-specs); unreadable is unknown, not a fault
    assert by["GPU-f"].minor is None and by["GPU-f"].healthy
    assert by["GPU-b"].numa == 1 and by["GPU-b"].mig_enabled
    assert by["GPU-c"].numa is None and not by["GPU-c"].healthy  # one bad card: only it is unhealthy
    assert by["GPU-e"].memory_mib == 0 and by["GPU-e"].healthy  # "not supported" memory is not a fault


DEVICES_YAML = """
devices:
  - {uuid: GPU-0, index: 0, name: Tesla T4, memoryMiB: 15360, numa: 0, pciBusId: "0000:3b:00.0"}
  - uuid: GPU-1
    index: 1
    name: Tesla T4
    memoryMiB: 15360
    numa: -1
    pciBusId: "0000:af:00.0"
    migEnabled: true
    healthy: false
"""


def test_devices_file_yaml_and_json(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(DEVICES_YAML)
    gpus = load_devices_file(path)
    assert gpus == [
        PhysicalGpu("GPU-0", 0, "Tesla T4", 15360, 0, "0000:3b:00.0", False, True),
        PhysicalGpu("GPU-1", 1, "Tesla T4", 15360, None, "0000:af:00.0", True, False),
    ]
    json_path = tmp_path / "devices.json"
    json_path.write_text(devices_file_json(gpus))
    assert load_devices_file(json_path) == gpus
    assert json.loads(json_path.read_text())["devices"][1]["numa"] == -1


def test_devices_file_minor_is_optional_and_round_trips(tmp_path: Path) -> None:
    """``minor`` names a GPU's /dev/nvidia<minor> node for --pass-device-specs; absent = unknown."""
    gpus = parse_devices_text(
        "devices:\n"
        "  - {uuid: GPU-0, index: 0, name: T4, memoryMiB: 1, numa: 0, pciBusId: '', minor: 247}\n"
        "  - {uuid: GPU-1, index: 1, name: T4, memoryMiB: 1, numa: 0, pciBusId: ''}\n"
    )
    assert [g.minor for g in gpus] == [247, None]
    path = tmp_path / "devices.json"
    path.write_text(devices_file_json(gpus))
    assert load_devices_file(path) == gpus
    assert [("minor" in d) for d in json.loads(path.read_text())["devices"]] == [True, False]


def _with_minor(*minors: object) -> str:
    items = ", ".join(
        f"{{uuid: g{i}, index: {i}, name: n, memoryMiB: 1, numa: 0, pciBusId: '', minor: {m}}}"
        for i, m in enumerate(minors)
    )
    return f"devices: [{items}]"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (_with_minor(-1), r"devices\[0\]: minor must be an integer in \[0, 247\], got -1"),
        (_with_minor(248), r"minor must be an integer in \[0, 247\], got 248"),  # nvidia-modeset: 254
        (_with_minor("'3'"), r"minor must be an integer .*, got '3'"),
        (_with_minor("true"), r"minor must be an integer .*, got True"),
        (_with_minor("null"), r"minor must be an integer .*, got None"),
        (_with_minor(0, 1, 1), r"devices file>: duplicate minor 1"),
    ],
)
def test_devices_file_rejects_bad_minor(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        parse_devices_text(text)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[]", "top-level 'devices:'"),
        ("devices: [{uuid: a}]", "missing keys"),
        (
            "devices: [{uuid: a, index: 0, name: n, memoryMiB: 1, numa: 0, pciBusId: '', colour: red}]",
            "unknown",
        ),
        ("devices: [{uuid: a, index: -1, name: n, memoryMiB: 1, numa: 0, pciBusId: ''}]", "index"),
        ("devices: [{uuid: 'a,b', index: 0, name: n, memoryMiB: 1, numa: 0, pciBusId: ''}]", "uuid"),
        ("devices: [{uuid: a, index: 0, name: n, memoryMiB: '1', numa: 0, pciBusId: ''}]", "memoryMiB"),
        (
            "devices: [{uuid: a, index: 0, name: n, memoryMiB: 1, numa: 0, pciBusId: '', healthy: 1}]",
            "healthy",
        ),
        (
            "devices: [{uuid: a, index: 0, name: n, memoryMiB: 1, numa: 0, pciBusId: ''},"
            " {uuid: a, index: 1, name: n, memoryMiB: 1, numa: 0, pciBusId: ''}]",
            "duplicate uuid",
        ),
        ("devices: [", "not valid"),
    ],
)
def test_devices_file_rejects(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        parse_devices_text(text)


def test_health_policy_env() -> None:
    default = health_policy_from_env({})
    assert not default.is_critical(13) and not default.is_critical(109) and default.is_critical(79)
    off = health_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all"})
    assert not off.active and not off.is_critical(79)
    extra = health_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "79, 94"})
    assert not extra.is_critical(79) and extra.is_critical(48)
    forced = health_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "xids", "DP_ENABLE_HEALTHCHECKS": "48"})
    assert forced.active and forced.is_critical(48) and not forced.is_critical(79)
    mixed = health_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "48,xids"})  # upstream: all of them
    assert not mixed.active and not mixed.is_critical(79)
    with pytest.raises(InvalidInput, match="DP_DISABLE_HEALTHCHECKS"):
        health_policy_from_env({"DP_DISABLE_HEALTHCHECKS": "sometimes"})


def run_watcher(
    nvml: FakeNvml, uuids: list[str], policy: HealthCheckPolicy
) -> tuple[Any, threading.Event, list]:
    reports: list[tuple[str, str]] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=watch_xid_events,
        args=(uuids, lambda u, r: reports.append((u, r)), stop, policy, nvml),
        kwargs={"wait_ms": 20},
    )
    thread.start()
    return thread, stop, reports


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_xid_events() -> None:
    a, b = FakeGpu("GPU-a"), FakeGpu("GPU-b")
    nvml = FakeNvml([a, b])
    thread, stop, reports = run_watcher(nvml, ["GPU-a", "GPU-b"], HealthCheckPolicy())
    try:
        nvml.xid(a, 13)  # application error: ignored
        nvml.xid(b, 79)  # fell off the bus: unhealthy
        wait_for(lambda: reports)
        assert reports == [("GPU-b", "XID 79")]
        nvml.events.put(NVMLError(999))  # a wait error: every GPU unhealthy, thread ends
        thread.join(5)
        assert not thread.is_alive()
        assert [u for u, _ in reports[1:]] == ["GPU-a", "GPU-b"]
        assert nvml.freed
    finally:
        stop.set()
        thread.join(5)


def test_xid_registration_failure_marks_only_that_gpu() -> None:
    good, bad, old = FakeGpu("GPU-good"), FakeGpu("GPU-bad", fail={"register"}), FakeGpu("GPU-old")
    old.fail, old.fail_code = {"register"}, 3  # not supported: too old, not unhealthy
    nvml = FakeNvml([good, bad, old])
    thread, stop, reports = run_watcher(nvml, ["GPU-good", "GPU-bad", "GPU-old"], HealthCheckPolicy())
    stop.set()
    thread.join(5)
    assert [u for u, _ in reports] == ["GPU-bad"]
    assert nvml.registered == ["GPU-good"]
