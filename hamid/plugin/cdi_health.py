"""GPUs no CDI spec names are reported unhealthy until one does (with a CDI device list strategy).

``Allocate`` refuses a container whose CDI device no spec defines (``cdi-device-missing``);
advertised healthy, such a GPU would draw pod after pod into that refusal (kubelet's
``UnexpectedAdmissionError``) until the spec is generated. So every scan of the spec directories
(at start, each ``Allocate``'s, and one every :data:`RESCAN_INTERVAL_S`) sets the recoverable
condition :data:`CONDITION` on exactly the GPUs whose CDI device it leaves undefined: kubelet
(``ListAndWatch``) and the scheduler (``hami.io/node-nvidia-register``) see them unhealthy, and
healthy again after the first scan that defines them. A scan's result is applied only if no later
scan's was (the scans run in threads and hand results back in any order). XID health stays apart,
and sticky. A feature's device (``nvidia.com/gds=all``) concerns every GPU alike: left to
``Allocate``'s refusal and the start's log.
"""

from __future__ import annotations

import asyncio

from hamid.log import get_logger
from hamid.plugin.cdi_specs import GENERATE_SPEC, RESCAN_INTERVAL_S, CdiScan, CdiSpecs
from hamid.plugin.device_lists import DeviceLists
from hamid.plugin.inventory import GpuInventory

log = get_logger("plugin.cdi")

#: The inventory condition of a GPU whose CDI device no spec defines.
CONDITION = "cdi-spec-missing"


class CdiHealth:
    """Keeps :data:`CONDITION` on the GPUs the latest scan of ``specs`` leaves undefined."""

    def __init__(
        self,
        specs: CdiSpecs,
        lists: DeviceLists,
        inventory: GpuInventory,
        *,
        interval: float = RESCAN_INTERVAL_S,
    ) -> None:
        self.specs = specs
        self.lists = lists
        self.inventory = inventory
        self.interval = interval
        #: The number of the last scan applied (:attr:`CdiScan.seq`).
        self._applied = 0

    async def start(self) -> None:
        """The first scan, before kubelet or the scheduler is told of the GPUs; what is wrong is
        logged (a file that defines nothing, a device no spec defines). Never raises: the spec may
        be generated after the plugin, and a failed scan is tried again by :meth:`run`."""
        scan = await self._scan()
        if scan is None:
            return
        for problem in scan.problems:
            log.warning("cdi_spec_problem", problem=problem)
        missing = scan.missing(self.lists.cdi_names([g.uuid for g in self.inventory.gpus]))
        if missing:
            log.error("cdi_devices_missing_allocate_refuses", devices=missing, dirs=list(scan.dirs))
        else:
            log.info("cdi_devices_found", gpus=len(self.inventory.gpus), dirs=list(scan.dirs))
        self.apply(scan)

    def apply(self, scan: CdiScan) -> None:
        """Set the condition from one scan, logging each GPU that began or ceased to hold it; a scan
        older than the last applied is ignored (it read the directories before that one)."""
        if scan.seq < self._applied:
            log.debug("cdi_scan_stale_ignored", seq=scan.seq, applied=self._applied)
            return
        self._applied = scan.seq
        name = self.lists.gpu_cdi_name
        undefined = [g.uuid for g in self.inventory.gpus if name(g.uuid) not in scan.devices]
        change = self.inventory.set_condition(CONDITION, undefined)
        for uuid in change.began:
            log.warning(
                "gpu_unhealthy_cdi_spec_missing",
                uuid=uuid,
                device=name(uuid),
                dirs=list(scan.dirs),
                problems=list(scan.problems),
                hint=f"generate a spec naming GPUs by UUID: {GENERATE_SPEC}",
            )
        for uuid in change.ended:
            where = {"uuid": uuid, "device": name(uuid), "dirs": list(scan.dirs)}
            if self.inventory.is_healthy(uuid):
                log.info("gpu_healthy_cdi_spec_found", **where)
            else:  # an XID marked it: that stays
                log.info("gpu_cdi_spec_found_still_unhealthy", **where)

    async def run(self) -> None:
        """Scan every ``interval`` s until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            scan = await self._scan()
            if scan is not None:
                self.apply(scan)

    async def _scan(self) -> CdiScan | None:
        """One scan in a thread; None, logged, when it failed (whatever a spec holds never stops
        the plugin; the condition is kept as it was)."""
        try:
            return await asyncio.to_thread(self.specs.scan)
        except Exception as exc:
            log.error("cdi_spec_scan_failed", error=f"{type(exc).__name__}: {exc}", retry_in_s=self.interval)
            return None
