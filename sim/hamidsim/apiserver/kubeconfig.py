"""A kubeconfig for kubectl (or any client) pointing at the embedded API server."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

CONTEXT = "hamid-sim"


def kubeconfig_document(
    server_url: str, namespace: str = "default", token: str | None = None
) -> dict[str, object]:
    """One cluster, one user (anonymous, or a bearer ``token``), one context named :data:`CONTEXT`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {"token": token} if token else {}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server_url: str, token: str | None = None) -> Path:
    """Write the kubeconfig (mode 0600, replaced atomically); returns its absolute path."""
    target = path.expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    document = kubeconfig_document(server_url, token=token)
    tmp.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    os.chmod(tmp, 0o600)
    tmp.replace(target)
    return target
