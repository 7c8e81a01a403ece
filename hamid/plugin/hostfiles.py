"""Bounded reads of the host files the plugin parses (sysfs, CDI specs). Blocking: run in a thread.

A file is opened without blocking and checked to be a regular file once opened (a FIFO swapped in
after a directory was listed cannot hang the reader), then read no further than its limit (a
runaway generator or a link to ``/proc/kcore`` is refused, not read whole).
"""

from __future__ import annotations

import os
import stat

from hamid.model.errors import InvalidInput


def read_text(path: str | os.PathLike[str], limit: int, encoding: str = "utf-8") -> str:
    """The text of ``path``: OSError when it cannot be opened or is no regular file, InvalidInput
    when it is larger than ``limit`` bytes or not ``encoding`` text."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = b""
        while len(data) <= limit:
            more = os.read(fd, limit + 1 - len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
        raise InvalidInput(f"{path}: larger than {size}")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not {encoding.upper()} text") from None
