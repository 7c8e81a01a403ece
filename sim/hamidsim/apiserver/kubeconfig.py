"""A kubeconfig for kubectl (or any client) pointing at the embedded API server."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

CONTEXT = "hamid-sim"


def kubeconfig_document(server_url: str, namespace: str = "default") -> dict[str, object]:
    """One cluster, one (anonymous) user, one context named :data:`CONTEXT`, made current."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """Write the kubeconfig (mode 0600, replaced atomically); returns its absolute path."""
    target = path.expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig_document(server_url), sort_keys=False), encoding="utf-8")
    os.chmod(tmp, 0o600)
    tmp.replace(target)
    return target
