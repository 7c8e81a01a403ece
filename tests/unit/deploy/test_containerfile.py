"""Static checks of the Containerfile (no image can be built here: no network to git hosts).

What is checked: HAMi-core is built from source at a pinned commit in its own stage (or taken
prebuilt by a build argument), the runtime stage (the product alone, the default target) takes it
from the selected stage to where the device-plugin DaemonSet's init container reads it and runs as a
non-root user, the ``demo`` target adds the simulator and runs ``hamid demo``, and
every file copied from the build context exists and is let through ``.containerignore``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.deploy.helm_render import container, render

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Containerfile; continuation lines joined."""
    logical = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            stages.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
    return args, stages


def stage_args(stage: Stage) -> dict[str, str]:
    out = {}
    for a in stage.all("ARG"):
        name, _, default = a.partition("=")
        out[name] = default
    return out


def included(path: str, patterns: list[str]) -> bool:
    """Whether ``.containerignore`` (``*`` then ``!`` re-includes) lets ``path`` into the context."""
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pat) for p in prefixes) or fnmatch.fnmatch(path, pat):
            keep = negate
    return keep


TEXT = (REPO / "Containerfile").read_text()
GLOBAL_ARGS, STAGES = parse(TEXT)
BY_NAME = {s.name: s for s in STAGES if s.name}
IGNORE = [
    line.strip()
    for line in (REPO / ".containerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def test_hami_core_is_built_from_source_at_a_pinned_revision() -> None:
    source = BY_NAME["hami-core-source"]
    assert "cuda" in source.base.lower() and "devel" in GLOBAL_ARGS["CUDA_DEVEL_IMAGE"]
    args = stage_args(source)
    assert args["HAMI_CORE_REPO"].endswith("/Project-HAMi/HAMi-core.git")
    assert re.fullmatch(r"[0-9a-f]{40}", args["HAMI_CORE_REF"]), "pin a full commit, not a branch"
    runs = " ".join(source.all("RUN"))
    assert 'git fetch -q --depth 1 origin "${HAMI_CORE_REF}"' in runs
    assert 'test "$(git rev-parse HEAD)" = "${HAMI_CORE_REF}"' in runs
    assert "bash ./build.sh" in runs and "/out/libvgpu.so" in runs


def test_a_build_argument_selects_prebuilt_instead() -> None:
    assert GLOBAL_ARGS["HAMI_CORE"] == "source"
    chosen = BY_NAME["hami-core"]
    assert chosen.base == "hami-core-${HAMI_CORE}"
    for mode in ("source", "prebuilt"):
        assert f"hami-core-{mode}" in BY_NAME
    prebuilt = BY_NAME["hami-core-prebuilt"]
    assert stage_args(prebuilt)["HAMI_CORE_DIR"] == "config/hami-core"
    assert prebuilt.all("COPY") == ["${HAMI_CORE_DIR}/libvgpu.so /out/libvgpu.so"]
    assert included("config/hami-core/libvgpu.so", IGNORE) and included("hami-core/libvgpu.so", IGNORE)


def test_runtime_is_the_product_as_non_root_with_hami_core_where_the_chart_reads_it() -> None:
    runtime = BY_NAME["runtime"]
    user = runtime.all("USER")[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["hamid"]
    assert json.loads(runtime.all("CMD")[-1]) == ["--help"]
    installs = " ".join(runtime.all("RUN"))
    assert "pip install --no-index --find-links /wheels hamid " in installs and "hamidsim" not in installs
    copies = runtime.all("COPY")
    assert "--from=hami-core /out/libvgpu.so /opt/hamid/hami-core/libvgpu.so" in copies
    init = container(render().get("DaemonSet", "hamid-device-plugin"), "install-hami-core", init=True)
    assert "src=/opt/hamid/hami-core" in init["args"][0]


def test_the_default_target_is_the_product_and_the_demo_target_adds_the_simulator() -> None:
    final = STAGES[-1]
    assert final.name is None and final.base == "runtime" and not final.instructions
    demo = BY_NAME["demo"]
    assert demo.base == "runtime"
    assert "pip install --no-index --find-links /wheels hamidsim" in " ".join(demo.all("RUN"))
    assert json.loads(demo.all("CMD")[-1]) == ["demo"]
    uid = demo.all("USER")[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_every_context_file_exists_and_passes_the_ignore_file() -> None:
    sources: list[str] = []
    for stage in STAGES:
        for copy in stage.all("COPY"):
            words = [w for w in shlex.split(copy) if not w.startswith("--")]
            if any(w.startswith("--from") for w in shlex.split(copy)):
                continue
            sources += words[:-1]
    literal = [s for s in sources if "$" not in s]
    assert literal, "the Containerfile copies files from the build context"
    for src in literal:
        assert (REPO / src).exists(), src
        assert included(src.rstrip("/"), IGNORE), f"{src} is excluded by .containerignore"
    assert not included("tests/unit/deploy/test_chart.py", IGNORE)
