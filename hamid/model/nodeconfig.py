"""Per-node device-plugin configuration: HAMi's ``{"nodeconfig":[...]}`` JSON merged over defaults."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hamid.model._wire import (
    INT32_MAX,
    INT32_MIN,
    go_field,
    load_json,
    want_bool,
    want_int,
    want_list,
    want_number,
    want_object,
    want_str,
)
from hamid.model.devices import MODE_HAMI_CORE, OPERATING_MODES
from hamid.model.errors import InvalidInput

MIG_STRATEGIES = ("none", "single", "mixed")
#: Largest memory/core scaling: beyond it the registered MiB/cores leave HAMi's int32 fields
#: (16 TiB x 100 < 2^31), and no oversubscription is meant that far.
MAX_SCALING = 100.0
#: Largest preconfigured memory per GPU (16 TiB, as for a devices file's ``memoryMiB``).
MAX_PRECONFIGURED_MIB = 2**24


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Effective device-plugin settings for one node.

    Defaults follow HAMi's chart (split count 10, scaling 1, ``hami-core``, features off).
    ``lib_cuda_log_level`` is ``None`` when not configured (HAMi-core's own default applies).
    ``filter_uuids``/``filter_indices`` name devices that are neither advertised nor registered.
    """

    operating_mode: str = MODE_HAMI_CORE
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    preconfigured_device_memory: int = 0
    lib_cuda_log_level: str | None = None
    enable_numa_topology: bool = False
    enable_get_preferred_allocation: bool = False
    filter_uuids: tuple[str, ...] = ()
    filter_indices: tuple[int, ...] = ()
    mig_strategy: str = "none"

    def __post_init__(self) -> None:
        """Reject values the plugin cannot work with (same checks as for the JSON file)."""
        _check(self)


def _check(config: NodeConfig) -> None:
    if config.operating_mode not in OPERATING_MODES:
        raise InvalidInput(
            f"unknown operatingmode {config.operating_mode!r} (want one of {', '.join(OPERATING_MODES)})"
        )
    if isinstance(config.device_split_count, bool) or not isinstance(config.device_split_count, int):
        raise InvalidInput("devicesplitcount must be an integer")
    if config.device_split_count < 1:
        raise InvalidInput(f"devicesplitcount {config.device_split_count} must be at least 1")
    for name, scaling in (
        ("devicememoryscaling", config.device_memory_scaling),
        ("devicecorescaling", config.device_core_scaling),
    ):
        if isinstance(scaling, bool) or not isinstance(scaling, int | float):
            raise InvalidInput(f"{name} must be a number")
        if not math.isfinite(scaling) or not 0 < scaling <= MAX_SCALING:
            raise InvalidInput(f"{name} {scaling} must be a positive number of at most {MAX_SCALING:g}")
    if not 0 <= config.preconfigured_device_memory <= MAX_PRECONFIGURED_MIB:
        raise InvalidInput(
            f"preconfigureddevicememory {config.preconfigured_device_memory} must be in "
            f"[0, {MAX_PRECONFIGURED_MIB}] MiB"
        )
    if config.mig_strategy not in MIG_STRATEGIES:
        raise InvalidInput(
            f"unknown migstrategy {config.mig_strategy!r} (want one of {', '.join(MIG_STRATEGIES)})"
        )
    if any(i < 0 for i in config.filter_indices):
        raise InvalidInput("filterdevices.index entries must not be negative")


def _int32(value: object, where: str) -> int:
    return want_int(value, where, INT32_MIN, INT32_MAX)


#: ``nodeconfig`` entry keys → (NodeConfig field, parser of the JSON value).
_SCALAR_KEYS: tuple[tuple[str, str, Callable[[object, str], Any]], ...] = (
    ("operatingmode", "operating_mode", want_str),
    ("devicesplitcount", "device_split_count", _int32),
    ("devicememoryscaling", "device_memory_scaling", want_number),
    ("devicecorescaling", "device_core_scaling", want_number),
    ("preconfigureddevicememory", "preconfigured_device_memory", want_int),
    ("libcudaloglevel", "lib_cuda_log_level", want_str),
    ("enablenumatopology", "enable_numa_topology", want_bool),
    ("enablegetpreferredallocation", "enable_get_preferred_allocation", want_bool),
    ("migstrategy", "mig_strategy", want_str),
)


def _filter_devices(value: object, where: str) -> dict[str, Any]:
    fd = want_object(value, f"{where}.filterdevices")
    uuids, indices = go_field(fd, "uuid"), go_field(fd, "index")
    uuid_list = () if uuids is None else want_list(uuids, f"{where}.filterdevices.uuid")
    index_list = () if indices is None else want_list(indices, f"{where}.filterdevices.index")
    return {
        "filter_uuids": tuple(
            want_str(u, f"{where}.filterdevices.uuid[{i}]") for i, u in enumerate(uuid_list)
        ),
        "filter_indices": tuple(
            want_int(x, f"{where}.filterdevices.index[{i}]", 0) for i, x in enumerate(index_list)
        ),
    }


def _entry_overrides(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The non-null fields of one ``nodeconfig`` entry as NodeConfig field overrides (type-checked)."""
    out: dict[str, Any] = {}
    for key, name, parse in _SCALAR_KEYS:
        value = go_field(entry, key)
        if value is not None:
            out[name] = parse(value, f"{where}.{key}")
    if (value := go_field(entry, "filterdevices")) is not None:
        out.update(_filter_devices(value, where))
    return out


def _config_text(config_json: object, where: str) -> object:
    """Bytes decoded as strict UTF-8; anything else as is (``load_json`` checks the type)."""
    if not isinstance(config_json, bytes):
        return config_json
    try:
        return config_json.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{where}: not valid UTF-8 (byte offset {exc.start}: {exc.reason})") from None


def resolve_node_config(config_json: str | bytes | None, node_name: str, defaults: NodeConfig) -> NodeConfig:
    """Merge the ``nodeconfig`` entries whose ``name`` equals ``node_name`` over ``defaults``.

    ``config_json`` is the content of ``/config/config.json`` (text, or bytes that must be UTF-8;
    ``None`` when there is no file: defaults). Nesting too deep for JSON is refused as malformed.
    Only non-null fields override; matching entries apply in file order. Every entry is type-checked
    (like Go's decoder, a type error anywhere fails the file); the merged result is then validated
    (known ``operatingmode``/``migstrategy``, split count ≥ 1, positive scalings, ...).
    Keys match as Go's decoder matches them, whatever their case (``deviceSplitCount``); unknown
    keys are ignored, as in HAMi. Errors name the entry (index and name) and the key.
    """
    if config_json is None:
        return defaults
    where = "node config"
    root = want_object(load_json(_config_text(config_json, where), where), where)
    raw_entries = go_field(root, "nodeconfig")
    entries = () if raw_entries is None else want_list(raw_entries, f"{where}.nodeconfig")
    result = defaults
    for i, raw in enumerate(entries):
        entry = want_object(raw, f"{where}.nodeconfig[{i}]")
        raw_name = go_field(entry, "name")
        name = "" if raw_name is None else want_str(raw_name, f"{where}.nodeconfig[{i}].name")
        entry_where = f"{where}.nodeconfig[{i}] (name {name!r})"
        overrides = _entry_overrides(entry, entry_where)
        if name == node_name:
            try:
                result = dataclasses.replace(result, **overrides)
            except InvalidInput as exc:
                raise InvalidInput(f"{entry_where}: {exc}") from None
    return result
