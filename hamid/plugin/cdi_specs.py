"""The CDI devices the node's spec directories define, as this process sees them (blocking reads).

hamid generates no CDI spec (NVIDIA's plugin can, through nvidia-container-toolkit's Go library);
the node must have one (``nvidia-ctk cdi generate``, or the toolkit's ``nvidia-cdi-refresh``
service). Before it names a CDI device, the plugin checks that a spec defines it: the runtime
would otherwise fail the container's creation later, with a vaguer error, or a container could
start without its GPU. Each scan lists the directories and re-reads only files whose size or
modification time changed, so a spec written after the plugin started is seen at the next
``Allocate``. A file that cannot be parsed is reported (logged once per version, naming the file)
and defines nothing, as in the runtime; it never stops the plugin. A file or directory this process
cannot read now (a passing EMFILE or EIO; the runtime, another process, reads it) keeps what it
defined at the last scan that read it, and is read again at the next scan. Run
:meth:`CdiSpecs.scan` in a thread; scans are serialised and numbered (Allocate's and the periodic
one of :mod:`hamid.plugin.cdi_health` may overlap, and their results arrive in any order).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from hamid.log import get_logger
from hamid.model import cdi
from hamid.model.errors import InvalidInput
from hamid.plugin.errors import AllocationError, summarize
from hamid.plugin.hostfiles import read_text

log = get_logger("plugin.cdi")

#: A file's identity for the cache: inode, size, modification time (ns).
_Stamp = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CdiScan:
    """One scan: the resolvable devices and what is wrong with the directories or their files."""

    dirs: tuple[str, ...]
    devices: frozenset[str]
    problems: tuple[str, ...]
    #: Its place among the scans of its :class:`CdiSpecs`: a higher one read the directories later.
    seq: int

    def missing(self, names: Sequence[str]) -> list[str]:
        """Those of ``names`` no spec makes resolvable."""
        return [n for n in names if n not in self.devices]

    def require(self, names: Sequence[str]) -> None:
        """Refuse (``cdi-device-missing``) a container whose CDI devices are not all defined: the
        runtime would fail to create it, later and with a vaguer error."""
        missing = self.missing(names)
        if not missing:
            return
        problems = f"; spec problems: {summarize(self.problems)}" if self.problems else ""
        raise AllocationError(
            f"no CDI spec in {', '.join(self.dirs)} defines {', '.join(missing)}: generate one on the "
            f"node ({GENERATE_SPEC}; for a feature add --mode=<feature> --class=<feature>), or use "
            f"--device-list-strategy=envvar{problems}",
            code="cdi-device-missing",
        )


class CdiSpecs:
    """The spec directories (lowest priority first, as the runtime is configured) and a cache of
    their files' parsed contents."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = tuple(dirs)
        self._files: dict[str, tuple[_Stamp, cdi.SpecDevices | str]] = {}
        #: Each directory's file names at the last scan that listed it.
        self._names: dict[str, list[str]] = {}
        self._scans = 0
        self._lock = threading.Lock()

    def scan(self) -> CdiScan:
        """Read the directories now (files unchanged since the last scan are not parsed again)."""
        with self._lock:
            self._scans += 1
            return self._scan(self._scans)

    def _scan(self, seq: int) -> CdiScan:
        problems: list[str] = []
        entries: list[tuple[int, str, cdi.SpecDevices]] = []
        seen: dict[str, tuple[_Stamp, cdi.SpecDevices | str]] = {}
        listed: dict[str, list[str]] = {}
        for priority, directory in enumerate(self.dirs):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as exc:
                names = self._names.get(directory, [])
                problems.append(f"cannot list {directory}: {exc.strerror or exc}")
                if names:
                    log.warning(
                        "cdi_spec_dir_unlisted_last_listing_kept",
                        dir=directory,
                        error=exc.strerror or str(exc),
                        files=len(names),
                    )
            listed[directory] = names
            for name in names:
                if not name.endswith(cdi.SPEC_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                read = self._read(path)
                if read is None:
                    continue
                seen[path] = read
                content = read[1]
                if isinstance(content, str):
                    problems.append(content)
                else:
                    entries.append((priority, path, content))
        self._files = seen
        self._names = listed
        resolved = cdi.resolve(entries)
        for device, paths in sorted(resolved.conflicts.items()):
            files = " and ".join(paths)
            problems.append(f"{device} is defined by {files}: a conflict, the runtime resolves neither")
        return CdiScan(self.dirs, resolved.devices, tuple(problems), seq)

    def _read(self, path: str) -> tuple[_Stamp, cdi.SpecDevices | str] | None:
        """The cached or freshly parsed content of one file (a string: why it defines nothing);
        None for what is no regular file or a file gone meanwhile."""
        cached = self._files.get(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._unreadable(path, exc, cached)
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if cached is not None and cached[0] == stamp:
            return cached
        content: cdi.SpecDevices | str
        try:
            content = cdi.parse_spec(read_text(path, MAX_SPEC_BYTES), path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._unreadable(path, exc, cached)
        except InvalidInput as exc:
            content = str(exc)
        except Exception as exc:  # whatever a spec holds, it never stops the plugin
            content = f"{path}: cannot parse: {type(exc).__name__}: {str(exc)[:200]}"
        if isinstance(content, str):
            log.warning("cdi_spec_ignored", path=path, problem=content)
        else:
            log.info("cdi_spec_read", path=path, kind=content.kind, devices=len(content.names))
        return stamp, content

    @staticmethod
    def _unreadable(
        path: str, exc: OSError, cached: tuple[_Stamp, cdi.SpecDevices | str] | None
    ) -> tuple[_Stamp, cdi.SpecDevices | str]:
        """A file this process cannot read now: what it defined at the last read (a passing EMFILE
        or EIO must neither refuse every Allocate nor turn its GPUs unhealthy), read again at the
        next scan (:data:`_UNREAD`)."""
        problem = f"{path}: cannot read: {exc.strerror or exc}"
        if cached is None or isinstance(cached[1], str):
            log.warning("cdi_spec_ignored", path=path, problem=problem)
            return _UNREAD, problem
        log.warning("cdi_spec_unreadable_last_content_kept", path=path, problem=problem)
        return _UNREAD, cached[1]


#: How often the plugin reads the directories besides at start and at each ``Allocate`` (the GPUs'
#: CDI health: :mod:`hamid.plugin.cdi_health`).
RESCAN_INTERVAL_S = 30.0
#: The stamp of a file that could not be read: it matches no file, so the next scan reads it again.
_UNREAD: _Stamp = (-1, -1, -1)
#: How a spec the plugin can use is written: GPUs named by UUID (``nvidia-ctk`` before 1.15 names
#: them by index only unless told; a toolkit whose flag takes several values keeps the index names
#: other consumers may use too, one that takes one value uses the last).
GENERATE_SPEC = (
    "nvidia-ctk cdi generate --device-name-strategy=index --device-name-strategy=uuid "
    "--output=/var/run/cdi/nvidia.yaml"
)
#: The largest spec read (``nvidia-ctk``'s for 8 GPUs is a few KiB): a bigger file defines nothing.
MAX_SPEC_BYTES = 4 << 20
