"""kubelet's placement policies from its config file (``--config``, a ``KubeletConfiguration``).

Only the fields that decide where kubelet puts a container's CPUs and devices are read; every other
field is left to kubelet. Values are checked as kubelet's strict decoding and validation would
(option maps hold strings, policies are enumerations), so a file kubelet would not start with is an
error here too, never a guess. Flags given to kubelet on its command line override the file and
are invisible to the node agent (see docs/operating.md, "What the plugin publishes").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hamid.model._wire import load_yaml
from hamid.model.errors import InvalidInput
from hamid.model.numa import KubeletPolicies

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"
#: Where kubelet reads its config file on a kubeadm-installed node.
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
#: A kubelet config file is a few KiB; anything far larger is not one.
MAX_CONFIG_BYTES = 1 << 20
#: KubeletConfiguration field -> KubeletPolicies attribute (kubelet's defaults apply when absent).
_FIELDS = {
    "cpuManagerPolicy": "cpu_manager_policy",
    "cpuManagerPolicyOptions": "cpu_manager_options",
    "topologyManagerPolicy": "topology_manager_policy",
    "topologyManagerScope": "topology_manager_scope",
    "topologyManagerPolicyOptions": "topology_manager_options",
    "memoryManagerPolicy": "memory_manager_policy",
}


def _field(doc: Mapping[str, Any], key: str, where: str) -> object:
    value = doc[key]
    if key.endswith("Options"):
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise InvalidInput(f"{where}: {key} must map option names to strings")
        for name, option in value.items():
            if not isinstance(option, str):
                raise InvalidInput(f'{where}: {key}.{name} must be a string (quote it: "{option}")')
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: {key} must be a string, got {type(value).__name__}")
    return value


def parse_kubelet_policies(data: bytes, where: str = "kubelet config") -> KubeletPolicies:
    """The placement policies of a ``KubeletConfiguration`` document (YAML or JSON bytes)."""
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{where}: larger than {MAX_CONFIG_BYTES} bytes; not a kubelet config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{where}: not UTF-8 text") from exc
    doc = load_yaml(text, where)
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{where}: want a {KIND} mapping")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise InvalidInput(
            f"{where}: want apiVersion {API_VERSION} and kind {KIND}, got "
            f"{doc.get('apiVersion')!r:.60} / {doc.get('kind')!r:.60}"
        )
    kwargs = {attr: _field(doc, key, where) for key, attr in _FIELDS.items() if key in doc}
    # kubelet treats an empty policy string as its default
    kwargs = {attr: value for attr, value in kwargs.items() if value != ""}
    try:
        return KubeletPolicies(**kwargs)  # type: ignore[arg-type]
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from exc


def load_kubelet_policies(path: str | os.PathLike[str]) -> KubeletPolicies:
    """Read ``path`` (blocking: call it in a thread) and parse it; InvalidInput says what is wrong."""
    name = os.fspath(path)
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read kubelet config {name}: {exc.strerror or exc}") from exc
    return parse_kubelet_policies(data, name)
