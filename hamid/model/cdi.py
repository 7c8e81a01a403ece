"""Container Device Interface (CDI) facts the plugin relies on (one definition, no I/O).

What hamid needs from the CDI specification (cncf-tags/container-device-interface): how a device
is named to the runtime (``vendor/class=name``), the annotation form a device plugin hands it, and
which devices a set of spec files makes resolvable. The last follows the runtime's own registry, so
that the plugin refuses what the runtime would fail on: spec files are the ``.json`` and ``.yaml``
files directly in the spec directories, a later directory wins over an earlier one, and a device
defined by two files of the same directory is resolvable from neither. A spec file the runtime
would reject contributes nothing; of its checks, this module repeats those on the version, kind and
device names (container edits are the runtime's to judge).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hamid.model._wire import load_json, load_yaml, type_name
from hamid.model.errors import InvalidInput

#: Where runtimes look for spec files by default, lowest priority first.
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The file name endings the runtime reads as spec files (``.yml`` is not one).
SPEC_SUFFIXES = (".json", ".yaml")
#: Container annotations under this prefix name CDI devices (containerd and CRI-O read them).
ANNOTATION_PREFIX = "cdi.k8s.io/"
#: Longest ``<plugin>_<device id>`` part of an annotation key.
ANNOTATION_NAME_MAX = 63

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")


def qualified_name(kind: str, name: str) -> str:
    """A device's fully qualified name, ``vendor/class=name``."""
    return f"{kind}={name}"


def annotation_key(plugin: str, device_id: str) -> str:
    """The key of the annotation by which ``plugin`` hands one allocation's devices to the runtime."""
    name = f"{plugin}_{device_id}"
    if len(name) > ANNOTATION_NAME_MAX or not _DEVICE_NAME.match(name):
        raise ValueError(f"{name!r} is not a CDI annotation name")
    return ANNOTATION_PREFIX + name


def annotation_value(devices: Iterable[str]) -> str:
    """The annotation's value: the qualified names, comma-separated, in order."""
    return ",".join(devices)


def check_kind(kind: object, where: str) -> str:
    """``kind`` when it is a valid ``vendor/class``, else InvalidInput."""
    if not isinstance(kind, str):
        raise InvalidInput(f"{where}: kind: want a string, got {type_name(kind)}")
    vendor, _, cls = kind.partition("/")
    if not (_VENDOR_OR_CLASS.match(vendor) and _VENDOR_OR_CLASS.match(cls)):
        raise InvalidInput(f"{where}: kind {kind!r} is not vendor/class")
    return kind


@dataclass(frozen=True, slots=True)
class SpecDevices:
    """What one spec file defines: its kind and its devices' names."""

    kind: str
    names: tuple[str, ...]

    def qualified(self) -> tuple[str, ...]:
        """The qualified names of its devices."""
        return tuple(qualified_name(self.kind, n) for n in self.names)


def parse_spec(text: str, where: str) -> SpecDevices:
    """The kind and device names of one spec file's text (YAML or JSON); InvalidInput when the
    runtime would reject the file."""
    # JSON by its own parser: many times faster than YAML's on a large file
    doc = load_json(text, where) if where.endswith(".json") else load_yaml(text, where)
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{where}: want a CDI spec (a mapping), got {type_name(doc)}")
    version = doc.get("cdiVersion")
    if not isinstance(version, str) or not version:
        raise InvalidInput(f"{where}: no cdiVersion")
    kind = check_kind(doc.get("kind"), where)
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        raise InvalidInput(f"{where}: no devices")
    names: list[str] = []
    for i, device in enumerate(devices):
        name = device.get("name") if isinstance(device, Mapping) else None
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            raise InvalidInput(f"{where}: devices[{i}]: name {name!r} is not a CDI device name")
        if name in names:
            raise InvalidInput(f"{where}: device {name!r} defined twice")
        names.append(name)
    return SpecDevices(kind, tuple(names))


@dataclass(frozen=True, slots=True)
class Resolved:
    """The devices a runtime can resolve from a set of spec files, and those two files of one
    directory both define (``conflicts``: device → the files)."""

    devices: frozenset[str]
    conflicts: Mapping[str, tuple[str, ...]]


def resolve(specs: Iterable[tuple[int, str, SpecDevices]]) -> Resolved:
    """Resolve ``(priority, path, spec)`` entries, in scan order (priority: the directory's
    position), as the runtime's registry does: a higher priority replaces a device, a lower one is
    ignored, and two files of one priority defining it make it a conflict, which nothing resolves
    (not even a file of a higher priority: the registry drops every conflicting name at the end)."""
    owner: dict[str, tuple[int, str]] = {}
    conflicts: dict[str, list[str]] = {}
    for priority, path, spec in specs:
        for device in spec.qualified():
            held = owner.get(device)
            if held is None or priority > held[0]:
                owner[device] = (priority, path)
            elif priority == held[0]:
                conflicts.setdefault(device, [held[1]]).append(path)
    return Resolved(frozenset(owner.keys() - conflicts.keys()), {d: tuple(p) for d, p in conflicts.items()})
