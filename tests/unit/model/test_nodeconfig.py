"""Per-node config JSON (docs/hami-wire.md §4.1) merged over defaults."""

from __future__ import annotations

import json

import pytest

from hamid.model.errors import InvalidInput
from hamid.model.nodeconfig import NodeConfig, resolve_node_config

CHART_EXAMPLE = (
    '{"nodeconfig":[{"name":"your-node-name","operatingmode":"hami-core","devicememoryscaling":1,'
    '"devicesplitcount":10,"preconfigureddevicememory":0,"enablenumatopology":false,"migstrategy":"none",'
    '"filterdevices":{"uuid":[],"index":[]},"enablegetpreferredallocation":false}]}'
)
DEFAULTS = NodeConfig(device_split_count=4, lib_cuda_log_level="1")


def test_chart_example() -> None:
    assert resolve_node_config(CHART_EXAMPLE, "your-node-name", DEFAULTS) == NodeConfig(
        device_split_count=10, lib_cuda_log_level="1"
    )
    assert resolve_node_config(CHART_EXAMPLE, "other-node", DEFAULTS) == DEFAULTS


def test_keys_match_whatever_their_case_as_gos_decoder_matches_them() -> None:
    """HAMi reads the file with Go's ``encoding/json``: ``operatingMode``, ``filterDevices``,
    ``deviceSplitCount``, ``Name``, ``nodeConfig`` are its keys too (the last of equal ones wins)."""
    text = json.dumps(
        {
            "nodeConfig": [
                {
                    "Name": "gpu-1",
                    "operatingMode": "mig",
                    "filterDevices": {"UUID": ["GPU-broken"], "Index": [3]},
                    "deviceSplitCount": 4,
                    "DEVICESPLITCOUNT": 6,
                }
            ]
        }
    )
    config = resolve_node_config(text, "gpu-1", DEFAULTS)
    assert (config.operating_mode, config.device_split_count) == ("mig", 6)
    assert (config.filter_uuids, config.filter_indices) == (("GPU-broken",), (3,))


def test_no_file_means_defaults() -> None:
    assert resolve_node_config(None, "n", DEFAULTS) is DEFAULTS
    assert resolve_node_config("{}", "n", DEFAULTS) == DEFAULTS
    assert resolve_node_config('{"nodeconfig":null}', "n", DEFAULTS) == DEFAULTS


def test_every_key() -> None:
    entry = {
        "name": "gpu-1",
        "operatingmode": "mps",
        "devicesplitcount": 3,
        "devicememoryscaling": 1.5,
        "devicecorescaling": 2,
        "preconfigureddevicememory": 16384,
        "libcudaloglevel": "4",
        "enablenumatopology": True,
        "migstrategy": "mixed",
        "filterdevices": {"uuid": ["GPU-x"], "index": [2, 3]},
        "enablegetpreferredallocation": True,
        "unknownkey": "ignored",
    }
    text = json.dumps({"nodeconfig": [{"name": "other", "devicesplitcount": 7}, entry]})
    assert resolve_node_config(text, "gpu-1", NodeConfig()) == NodeConfig(
        operating_mode="mps",
        device_split_count=3,
        device_memory_scaling=1.5,
        device_core_scaling=2.0,
        preconfigured_device_memory=16384,
        lib_cuda_log_level="4",
        enable_numa_topology=True,
        enable_get_preferred_allocation=True,
        filter_uuids=("GPU-x",),
        filter_indices=(2, 3),
        mig_strategy="mixed",
    )


def test_null_fields_do_not_override_and_entries_apply_in_order() -> None:
    text = json.dumps(
        {
            "nodeconfig": [
                {"name": "n", "devicesplitcount": 5, "enablenumatopology": True},
                {"name": "n", "devicesplitcount": None, "operatingmode": "mig", "libcudaloglevel": None},
            ]
        }
    )
    assert resolve_node_config(text, "n", DEFAULTS) == NodeConfig(
        operating_mode="mig", device_split_count=5, enable_numa_topology=True, lib_cuda_log_level="1"
    )


def test_filterdevices_replaces_both_lists() -> None:
    defaults = NodeConfig(filter_uuids=("GPU-a",), filter_indices=(1,))
    text = '{"nodeconfig":[{"name":"n","filterdevices":{"uuid":["GPU-b"]}}]}'
    assert resolve_node_config(text, "n", defaults) == NodeConfig(filter_uuids=("GPU-b",))


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"operatingmode": "turbo"}, "unknown operatingmode 'turbo'"),
        ({"devicesplitcount": -1}, "devicesplitcount -1"),
        ({"devicesplitcount": 0}, "devicesplitcount 0"),
        ({"devicesplitcount": "10"}, "devicesplitcount: want an integer"),
        ({"devicesplitcount": 2.5}, "devicesplitcount"),
        ({"devicememoryscaling": 0}, "devicememoryscaling"),
        ({"devicecorescaling": "1"}, "devicecorescaling"),
        ({"preconfigureddevicememory": -5}, "preconfigureddevicememory"),
        ({"libcudaloglevel": 4}, "libcudaloglevel"),
        ({"enablenumatopology": "true"}, "enablenumatopology"),
        ({"enablegetpreferredallocation": 1}, "enablegetpreferredallocation"),
        ({"migstrategy": "all"}, "migstrategy"),
        ({"filterdevices": []}, "filterdevices"),
        ({"filterdevices": {"index": [-1]}}, r"filterdevices.index\[0\]"),
        ({"filterdevices": {"uuid": [1]}}, r"filterdevices.uuid\[0\]"),
    ],
)
def test_validation_names_entry_and_key(entry: dict[str, object], match: str) -> None:
    text = json.dumps({"nodeconfig": [{"name": "n"} | entry]})
    with pytest.raises(InvalidInput, match=match) as info:
        resolve_node_config(text, "n", NodeConfig())
    assert "nodeconfig[0]" in str(info.value)


def test_type_errors_in_other_entries_fail_the_file() -> None:
    text = '{"nodeconfig":[{"name":"other","devicesplitcount":"x"},{"name":"n"}]}'
    with pytest.raises(InvalidInput, match=r"nodeconfig\[0\] \(name 'other'\)"):
        resolve_node_config(text, "n", NodeConfig())


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"nodeconfig":{}}', '{"nodeconfig":[1]}', '{"nodeconfig":[{"name":1}]}']
)
def test_malformed_files(text: str) -> None:
    with pytest.raises(InvalidInput, match="node config"):
        resolve_node_config(text, "n", NodeConfig())


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidInput, match="operatingmode"):
        NodeConfig(operating_mode="x")
