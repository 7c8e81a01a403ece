"""Run the real kubectl against an embedded API server (skipped where no kubectl is installed)."""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from hamidsim.apiserver.kubeconfig import write_kubeconfig

#: Versioned binaries some installations (the Cloud SDK) ship beside a version-dispatching kubectl.
_VERSIONED = "/usr/lib/google-cloud-sdk/bin/kubectl.1.*"


def _minor(path: str) -> int:
    match = re.search(r"\.1\.(\d+)$", path)
    return int(match[1]) if match else 0


def newest_kubectl() -> str | None:
    """The newest versioned kubectl (1.32+ sends protobuf bodies), else ``kubectl`` on PATH."""
    versioned = sorted(glob.glob(_VERSIONED), key=_minor)
    return versioned[-1] if versioned else shutil.which("kubectl")


needs_kubectl = pytest.mark.skipif(newest_kubectl() is None, reason="kubectl is not installed")


@dataclass
class Kubectl:
    """kubectl with a generated kubeconfig and its own cache directory."""

    binary: str
    kubeconfig: Path
    home: Path

    @classmethod
    def for_server(cls, url: str, directory: Path, binary: str | None = None) -> Kubectl:
        """A kubectl for the server at ``url`` (kubeconfig and cache under ``directory``)."""
        chosen = binary or newest_kubectl()
        assert chosen is not None
        return cls(chosen, write_kubeconfig(directory / "kubeconfig", url), directory)

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, directory: Path) -> Kubectl:
        """The newest kubectl with an existing kubeconfig (cache under ``directory``)."""
        chosen = newest_kubectl()
        assert chosen is not None
        return cls(chosen, kubeconfig, directory)

    async def run(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run kubectl (bounded: 60 s); returns (exit code, stdout + stderr)."""
        environ = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.home / "cache"),
            "HOME": str(self.home),
            **(env or {}),
        }
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=environ,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        return int(proc.returncode or 0), out.decode()

    async def ok(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        """Run kubectl and insist on success; returns its output."""
        code, out = await self.run(*args, stdin=stdin, env=env)
        assert code == 0, f"kubectl {' '.join(args)} failed ({code}): {out}"
        return out


README_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: numa-aligned
  annotations:
    hami.io/numa-alignment: best-effort
spec:
  containers:
  - name: main
    image: ubuntu:22.04
    command: ["sleep", "infinity"]
    resources:
      limits:
        cpu: "8"
        memory: 8Gi
        nvidia.com/gpu: 1
        nvidia.com/gpumem: 20000
"""
