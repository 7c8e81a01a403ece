"""``/ui`` in a real browser: headless Chromium driven by selenium against a running simulated cluster.

Skipped only where Chromium and its driver cannot be had (Debian: ``apt-get install chromium
chromium-driver``; ``.ci/run`` installs them). Selenium's calls block, so they run in a thread
while the cluster keeps serving on the event loop. Each page's screenshot is written under the
test's temporary directory.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamid.model import annotations as ann
from hamid.model import reasons as R
from hamid.model.numa import NUMA_PLACEMENT, decode_placement
from hamidsim.cluster import ClusterOptions, SimCluster, wait_until
from hamidsim.demo import SEED_NAME, seed_pod
from tests.e2e.helpers import NODE, stage

MARKUP = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
MARKUP_POD = "markup-in-annotation"


def _chromium() -> tuple[str, str] | None:
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium session (console messages kept for the checks)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    found = _chromium()
    if found is None:
        pytest.skip(
            "headless Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=found[1]))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """Blocking selenium calls made from the event loop (in a thread)."""

    def __init__(self, driver: Any, base: str, shots: Path) -> None:
        self.driver, self.base, self.shots = driver, base, shots

    async def open(self, path: str) -> None:
        await asyncio.to_thread(self.driver.get, self.base + path)

    async def js(self, script: str) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script)

    async def shot(self, name: str) -> Path:
        """A screenshot of the whole page (the window grown to the page's height, at most 2000 px)."""
        path = self.shots / f"{name}.png"
        height = await self.js("return document.documentElement.scrollHeight")
        await asyncio.to_thread(self.driver.set_window_size, 1280, min(int(height) + 120, 2000))
        await asyncio.to_thread(self.driver.save_screenshot, str(path))
        assert path.stat().st_size > 1000
        return path

    async def console_errors(self) -> list[dict[str, Any]]:
        logs = await asyncio.to_thread(self.driver.get_log, "browser")
        return [entry for entry in logs if entry.get("level") == "SEVERE"]


def _expected_marks(cluster: SimCluster) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """What the API says is on the node: (pod, GPU UUID) allocations and (pod, CPU) exclusive CPUs."""
    gpus, cpus = set(), set()
    for pod in cluster.server.list("Pod", None):
        if pod["spec"].get("nodeName") != NODE or pod.get("status", {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        notes = pod["metadata"].get("annotations") or {}
        for devices in ann.decode_pod_devices(notes.get(ann.DEVICES_ALLOCATED) or ""):
            gpus |= {(key, d.uuid) for d in devices}
        if notes.get(NUMA_PLACEMENT):
            for c in decode_placement(notes[NUMA_PLACEMENT]).containers:
                cpus |= {(key, str(cpu)) for cpu in c.cpus}
    return gpus, cpus


def _observed(cluster: SimCluster, *names: str) -> bool:
    """Whether the scheduler's NUMA ledger books the pods' observed placements (the plugin published them)."""
    for name in names:
        if NUMA_PLACEMENT not in cluster.annotations(name):
            return False
        uid = cluster.pod(name)["metadata"]["uid"]
        records = [e.records[uid] for e in cluster.scheduler.numa.nodes.values() if uid in e.records]
        if [str(record.source) for record in records] != ["placement"]:
            return False
    return True


_MARKS = """return Array.from(document.querySelectorAll('svg.numa-map [data-pod]')).map(
    e => [e.getAttribute('data-pod'), e.getAttribute('data-gpu'), e.getAttribute('data-cpu'),
          e.getAttribute('class')])"""


async def test_pages_show_what_the_api_says_and_markup_stays_inert(browser: Any, tmp_path: Path) -> None:
    async with SimCluster(ClusterOptions()) as cluster:
        await stage(cluster)
        await cluster.create_pod(seed_pod())
        await cluster.wait_settled(SEED_NAME, timeout=15)
        typed = seed_pod(name=MARKUP_POD, annotations={ann.USE_GPU_TYPE: MARKUP})
        typed["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"  # fits the CPUs; no GPU type does
        await cluster.create_pod(typed)
        await wait_until(
            lambda: bool(cluster.events(MARKUP_POD, reason=R.EVENT_FILTERING_FAILED)),
            15.0,
            "the filter fails",
        )
        await wait_until(lambda: _observed(cluster, "cpu-batch", SEED_NAME), 15.0, "placements observed")
        gpus, cpus = _expected_marks(cluster)
        assert {p for p, _ in gpus} == {f"default/{SEED_NAME}"} and len(cpus) > 8  # seed and cpu-batch
        page = Page(browser, cluster.metrics_url, tmp_path)

        await page.open("/ui")
        assert (await page.js("return document.querySelector('#nodes').innerText")).count(NODE) == 1
        assert "1\naligned" in await page.js("return document.querySelector('#pods').innerText")
        await page.shot("cluster")

        await page.open(f"/ui/node/{NODE}")
        marks = await page.js(_MARKS)
        shown_gpus = {(pod, gpu) for pod, gpu, _, cls in marks if gpu and "memory" in cls}
        shown_cpus = {(pod, cpu) for pod, _, cpu, _ in marks if cpu}
        assert shown_gpus == gpus
        assert shown_cpus == cpus
        await page.shot("node")

        await page.open(f"/ui/pod/default/{SEED_NAME}")
        summary = await page.js("return document.querySelector('#summary').innerText")
        assert "aligned" in summary and "best-effort" in summary
        await page.shot("pod")

        await page.open(f"/ui/pod/default/{MARKUP_POD}")
        assert await page.js("return window.pwned === undefined")
        assert await page.js("return document.querySelectorAll('main script, main img').length") == 0
        assert MARKUP in await page.js("return document.querySelector('#annotations').innerText")
        assert "CardTypeMismatch" in await page.js("return document.querySelector('#unfit').innerText")
        await page.shot("pod-markup")

        await page.open("/ui/no/such/page")
        assert "Not found" in await page.js("return document.title")
        errors = await page.console_errors()
        # the 404 page itself is logged as a failed resource load; nothing else may be
        assert [e for e in errors if "404" not in e["message"]] == []

        # the page refreshes itself when its figures change
        await page.open(f"/ui/node/{NODE}")
        await page.js("window.marker = 1")
        await cluster.kube.delete_pod("default", "cpu-batch")
        deadline = asyncio.get_running_loop().time() + 20
        while await page.js("return window.marker === 1"):
            assert asyncio.get_running_loop().time() < deadline, "the node page did not refresh"
            await asyncio.sleep(0.5)
        assert await page.console_errors() == []


async def test_the_pod_page_shows_the_refit_with_the_events_exact_text(browser: Any, tmp_path: Path) -> None:
    async with SimCluster(ClusterOptions(numa_publish=False)) as cluster:
        await stage(cluster)
        await cluster.create_pod(seed_pod())
        await cluster.wait_settled(SEED_NAME, timeout=15)
        events = cluster.events(SEED_NAME, reason=R.EVENT_NUMA_REFIT_SUCCEED)
        assert events
        page = Page(browser, cluster.metrics_url, tmp_path)
        await page.open(f"/ui/pod/default/{SEED_NAME}")
        history = await page.js("return document.querySelector('#refits').innerText")
        assert events[-1]["message"] in history and R.EVENT_NUMA_REFIT_SUCCEED in history
        await page.shot("pod-refit")
        await page.open("/ui")
        refits = await page.js("return document.querySelector('#refits').innerText")
        assert "1\nmoved" in refits
        await page.shot("cluster-refit")
        assert await page.console_errors() == []
