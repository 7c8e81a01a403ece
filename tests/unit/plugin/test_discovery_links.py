"""The devices file's ``links`` matrix, GPU links from (fake) NVML, and config files that are bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.gpulinks import GpuLink
from hamid.model.nodeconfig import NodeConfig, resolve_node_config
from hamid.plugin.discovery import (
    NvmlTopologyError,
    PhysicalGpu,
    devices_file_json,
    discover_nvml_links,
    load_devices_file,
    load_devices_inventory,
    normalized_bus_id,
    parse_devices_document,
)
from tests.unit.plugin.fake_nvml import NVML_NVLINK_DEVICE_TYPE_GPU as GPU
from tests.unit.plugin.fake_nvml import NVML_NVLINK_DEVICE_TYPE_SWITCH as SWITCH
from tests.unit.plugin.fake_nvml import FakeGpu, FakeNvml


def device(uuid: str, index: int, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "name": "A100",
        "memoryMiB": 40960,
        "numa": 0,
        "pciBusId": f"0000:{index:02x}:00.0",
        **extra,
    }


def document(links: Any = None, devices: list[dict[str, Any]] | None = None) -> str:
    doc: dict[str, Any] = {"devices": devices or [device("GPU-0", 0), device("GPU-1", 1), device("GPU-2", 2)]}
    if links is not None:
        doc["links"] = links
    return json.dumps(doc)


# --- the links matrix ------------------------------------------------------------------------------


def test_without_links_there_is_no_topology() -> None:
    assert parse_devices_document(document()).links is None


def test_one_direction_holds_for_both_and_both_describe_an_asymmetric_pair() -> None:
    links = {
        "GPU-0": {"GPU-1": {"level": "SINGLE", "nvlinks": 4}, "GPU-2": {"level": "SYSTEM"}},
        "GPU-2": {"GPU-0": {"level": "SYSTEM", "nvlinks": 2}},
    }
    parsed = parse_devices_document(document(links)).links
    assert parsed == {
        "GPU-0": {"GPU-1": GpuLink("SINGLE", 4), "GPU-2": GpuLink("SYSTEM", 0)},
        "GPU-1": {"GPU-0": GpuLink("SINGLE", 4)},
        "GPU-2": {"GPU-0": GpuLink("SYSTEM", 2)},
    }


def test_yaml_file_round_trips_through_devices_file_json(tmp_path: Path) -> None:
    gpus = [
        PhysicalGpu("GPU-a", 0, "T4", 15360, 0, "0000:3b:00.0"),
        PhysicalGpu("GPU-b", 1, "T4", 15360, 1, ""),
    ]
    raw = {"GPU-a": {"GPU-b": {"level": "NODE"}}}
    path = tmp_path / "devices.json"
    path.write_text(devices_file_json(gpus, raw))
    inventory = load_devices_inventory(path)
    assert inventory.gpus == tuple(gpus)
    assert inventory.links == {"GPU-a": {"GPU-b": GpuLink("NODE")}, "GPU-b": {"GPU-a": GpuLink("NODE")}}
    yaml_path = tmp_path / "devices.yaml"
    yaml_path.write_text(
        "devices:\n"
        "  - {uuid: GPU-a, index: 0, name: T4, memoryMiB: 15360, numa: 0, pciBusId: ''}\n"
        "  - {uuid: GPU-b, index: 1, name: T4, memoryMiB: 15360, numa: 1, pciBusId: ''}\n"
        "links:\n  GPU-a:\n    GPU-b: {level: HOSTBRIDGE, nvlinks: 18}\n"
    )
    assert load_devices_inventory(yaml_path).links == {
        "GPU-a": {"GPU-b": GpuLink("HOSTBRIDGE", 18)},
        "GPU-b": {"GPU-a": GpuLink("HOSTBRIDGE", 18)},
    }


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ([], "expected a mapping of GPU UUID"),
        ({"GPU-9": {}}, "'GPU-9' is not a uuid under 'devices'"),
        ({"GPU-0": []}, "GPU-0: expected a mapping"),
        ({"GPU-0": {"GPU-0": {"level": "NODE"}}}, "is not another uuid"),
        ({"GPU-0": {"GPU-7": {"level": "NODE"}}}, "'GPU-7' is not another uuid"),
        ({"GPU-0": {"GPU-1": "NV4"}}, "expected a mapping with 'level'"),
        ({"GPU-0": {"GPU-1": {"level": "PIX"}}}, "level must be one of"),
        ({"GPU-0": {"GPU-1": {}}}, "level must be one of"),
        ({"GPU-0": {"GPU-1": {"level": ["NODE"]}}}, "level must be one of"),  # unhashable: no TypeError
        ({"GPU-0": {"GPU-1": {"level": "NODE", "nvlinks": 19}}}, "nvlinks must be an integer in [0, 18]"),
        ({"GPU-0": {"GPU-1": {"level": "NODE", "nvlinks": True}}}, "nvlinks must be an integer"),
        ({"GPU-0": {"GPU-1": {"level": "NODE", "bandwidth": 3}}}, "unknown keys ['bandwidth']"),
    ],
)
def test_bad_links_are_refused_naming_the_entry(links: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_devices_document(document(links), "devices.json")
    assert message in str(err.value) and "devices.json: links" in str(err.value)


# --- bad devices files and node configs ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"devices": ' + "[" * 20000 + "]" * 20000 + "}", "nested too deeply"),
        ("devices: " + "[" * 20000 + "]" * 20000, "nested too deeply"),
        (document(devices=[device("GPU-0", 0, memoryMiB=10**30)]), "memoryMiB must be an integer in [0, "),
        (document(devices=[device("GPU-0", 0, memoryMiB=1e30)]), "memoryMiB must be an integer"),
        (document(devices=[device("GPU-0", 2**40)]), "index must be an integer in [0, 65535]"),
        (document(devices=[device("GPU-0", 0, numa=2**40)]), "numa must be an integer in [-1, 1023]"),
        (document(devices=[device("GPU-0\nGPU-1", 0)]), "uuid must be 1-256 printable ASCII"),
        (document(devices=[device("GPU 0", 0)]), "uuid must be"),
        (document(devices=[device("x" * 300, 0)]), "uuid must be"),
        (document(devices=[device("GPU-0", 0, name="A100\n")]), "name must be 1-256 printable"),
        (document(devices=[device("GPU-0", 0, pciBusId="0000:3b\n")]), "pciBusId must be a string"),
    ],
)
def test_bad_devices_file_is_refused_at_load(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_devices_document(text, "devices.json")
    assert message in str(err.value)
    assert "\n" not in str(err.value)  # control characters are shown escaped, never raw


def test_devices_file_with_invalid_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_bytes(b"devices:\n  - uuid: GPU-\xff\xfe\n")
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        load_devices_file(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"nodeconfig": [{"name": "n", "devicememoryscaling": 1e308}]}', "at most 100"),
        (b'{"nodeconfig": [{"name": "n", "devicecorescaling": 1e308}]}', "at most 100"),
        (b'{"nodeconfig": [{"name": "n", "preconfigureddevicememory": 1000000000000}]}', "preconfigured"),
        (b'{"nodeconfig": [{"name": "n", "devicememoryscaling": 1e999}]}', "positive number"),
        (b'{"nodeconfig": ' + b"[" * 20000 + b"]" * 20000 + b"}", "malformed JSON"),
        (b'{"nodeconfig": [{"name": "n\xff"}]}', "not valid UTF-8"),
    ],
)
def test_bad_node_config_is_refused_at_load(content: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        resolve_node_config(content, "n", NodeConfig())
    assert message in str(err.value)


def test_node_config_bytes_are_read_as_utf8() -> None:
    content = '{"nodeconfig": [{"name": "nœud", "devicememoryscaling": 2}]}'.encode()
    assert resolve_node_config(content, "nœud", NodeConfig()).device_memory_scaling == 2.0


# --- links from NVML ------------------------------------------------------------------------------


def physical(gpu: FakeGpu, index: int) -> PhysicalGpu:
    return PhysicalGpu(gpu.uuid, index, gpu.name, 15360, 0, gpu.bus_id)


def test_bus_ids_are_normalized_as_hami_does() -> None:
    assert normalized_bus_id("00000000:3B:00.0\x00junk") == "0000:3b:00.0"
    assert normalized_bus_id("0000:3B:00.0") == ":3b:00.0"  # both sides lose the same prefix
    assert normalized_bus_id("0000") == "0000"


def test_nvml_levels_and_direct_nvlinks() -> None:
    a = FakeGpu("GPU-a", bus_id="00000000:3B:00.0")
    b = FakeGpu("GPU-b", bus_id="00000000:5E:00.0")
    c = FakeGpu("GPU-c", bus_id="00000000:86:00.0")
    # a has 3 enabled links to b and one disabled; b has 3 to a; c has no NVLink at all
    a.nvlinks = [("00000000:5e:00.0", GPU, True)] * 3 + [("00000000:5E:00.0", GPU, False)]
    b.nvlinks = [("00000000:3B:00.0", GPU, True)] * 3
    nvml = FakeNvml([a, b, c])
    nvml.topology = {("GPU-a", "GPU-b"): 10, ("GPU-a", "GPU-c"): 50, ("GPU-b", "GPU-c"): 0}
    links = discover_nvml_links([physical(g, i) for i, g in enumerate((a, b, c))], nvml)
    assert links == {
        "GPU-a": {"GPU-b": GpuLink("SINGLE", 3), "GPU-c": GpuLink("SYSTEM", 0)},
        "GPU-b": {"GPU-a": GpuLink("SINGLE", 3), "GPU-c": GpuLink("INTERNAL", 0)},
        "GPU-c": {"GPU-a": GpuLink("SYSTEM", 0), "GPU-b": GpuLink("INTERNAL", 0)},
    }


def test_nvml_nvswitch_links_count_the_smaller_side() -> None:
    switch = "00000000:C0:00.0"
    a = FakeGpu("GPU-a", bus_id="00000000:3B:00.0", nvlinks=[(switch, SWITCH, True)] * 12)
    b = FakeGpu("GPU-b", bus_id="00000000:5E:00.0", nvlinks=[(switch, SWITCH, True)] * 10)
    links = discover_nvml_links([physical(a, 0), physical(b, 1)], FakeNvml([a, b]))
    assert links["GPU-a"]["GPU-b"] == GpuLink("NODE", 10) == links["GPU-b"]["GPU-a"]


def test_nvml_failure_for_a_pair_is_a_topology_error() -> None:
    a = FakeGpu("GPU-a", fail={"topology"})
    b = FakeGpu("GPU-b", bus_id="00000000:5E:00.0")
    with pytest.raises(NvmlTopologyError):
        discover_nvml_links([physical(a, 0), physical(b, 1)], FakeNvml([a, b]))
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b", bus_id="00000000:5E:00.0")])
    nvml.topology = {("GPU-a", "GPU-b"): 45}
    with pytest.raises(NvmlTopologyError, match="unknown topology level 45"):
        discover_nvml_links([physical(g, i) for i, g in enumerate(nvml.gpus)], nvml)
