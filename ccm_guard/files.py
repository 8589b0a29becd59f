"""Reading files the agent could have written: never through a link, never blocking on a
FIFO, never more than a limit (a link to /dev/zero, a device node, a huge file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes | None:
    """Up to `limit` bytes of a regular file (its last ones with `tail`); None when it is
    missing, a link, or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if tail and info.st_size > limit:
            fh.seek(info.st_size - limit)
        return fh.read(limit)
