"""Reading files the agent could have written: never through a link, never blocking on a
FIFO, never more than a limit (a link to /dev/zero, a device node, a huge file). Writing
beside them: never through anything planted at a name the agent could guess."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_regular(path: Path, *, follow_links: bool = False) -> BinaryIO:
    """A regular file opened for reading without waiting on a FIFO; a link is not
    followed unless `follow_links` (a file the person named). Anything else is an OSError:
    ELOOP for a link, EINVAL for what is not a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fh = os.fdopen(os.open(path, flags), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fh


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes | None:
    """Up to `limit` bytes of a regular file (its last ones with `tail`); None when it is
    missing, a link, or not a regular file."""
    try:
        fh = open_regular(path)
    except OSError:
        return None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if tail and size > limit:
            fh.seek(size - limit)
        return fh.read(limit)


def replace_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Make `path` hold `data`, with exactly `mode`, whole or not at all: a new file of a
    random name beside it, created exclusively and through no link (a link or a hard link
    planted at a name that could be guessed is never written through), then renamed over
    it. OSError where that fails; the new file does not stay."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.ccm-guard-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def lock_now(fd: int) -> int | None:
    """`fd` once it holds an exclusive flock, taken without waiting; None, with `fd`
    closed, when another process holds the lock."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def identity(st: os.stat_result) -> str:
    """What tells one version of a file from another: git writes a file anew and renames it
    into place, and a change time cannot be set back by an unprivileged process, so a
    rewrite always shows."""
    return f"id:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
