"""Run the real ``promtool check metrics`` on an exposition (tests skip only where it is absent)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; .ci/run installs it)"
)


def promtool_problems(exposition: bytes) -> str:
    """promtool's lint findings for ``exposition`` ("" when clean)."""
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, timeout=60, check=False
    )
    return (done.stdout + done.stderr).decode().strip() if done.returncode else ""
