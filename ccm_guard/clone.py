"""Copying files the cheapest way the file system allows, and hashing what was copied.

Reflink first (FICLONE: btrfs, XFS, bcachefs), else a copy in the kernel
(copy_file_range), else read and write; modes and times are kept. A symlink is copied as
a symlink, never followed. Shared by `.worktreeinclude` (worktree.include) and the
copied-directory strategy (copy.tree).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Callable

from ccm_guard.digest import sha256_hex

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h

# errnos that mean "this file system (pair) cannot do that", not "this file is bad".
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF, errno.EPERM}


# --- copying one file, reflink first ---------------------------------------------------------


class Cloner:
    """Copies regular files, reflinking where the file systems allow it.

    Remembers which (source device, destination device) pairs refused a reflink, so a
    large tree on ext4 pays for one failed ioctl, not one per file.
    """

    def __init__(self) -> None:
        self._no_reflink: set[tuple[int, int]] = set()
        self._no_kernel_copy: set[tuple[int, int]] = set()

    def copy(self, src: str | Path, dst: str | Path, *,
             digest: bool = False) -> tuple[str, os.stat_result, os.stat_result, str | None]:
        """Copy `src` (not following a symlink) to a new file `dst` (never over one).

        Returns how ("reflink" or "copy"), the source's stat as it was opened, the copy's
        stat once written, and the sha256 of what was written when `digest` is asked for.
        """
        # Non-blocking: a FIFO put where a file was listed must not hang the copy.
        src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(src_fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(src))
            dst_fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                how = self._fill(src_fd, dst_fd, st, os.fstat(dst_fd).st_dev)
                os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))
                os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
                hashed = self._digest(src_fd, dst_fd, st) if digest else None
                written = os.fstat(dst_fd)
            except BaseException:
                os.close(dst_fd)
                os.unlink(dst)  # a half-written copy must not pass for a faithful one
                raise
            os.close(dst_fd)
        finally:
            os.close(src_fd)
        return how, st, written, hashed

    @staticmethod
    def _digest(src_fd: int, dst_fd: int, st: os.stat_result) -> str:
        """The sha256 of the copy, read from the source: its pages are the ones in memory (a
        reflinked copy's are not), and it holds the same bytes unless it changed meanwhile,
        which its ctime would show: then the copy itself is read."""
        hashed = digest_fd(src_fd, st.st_size)
        now = os.fstat(src_fd)
        if (now.st_size, now.st_mtime_ns, now.st_ctime_ns) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return hashed
        return digest_fd(dst_fd, os.fstat(dst_fd).st_size)

    def _fill(self, src_fd: int, dst_fd: int, st: os.stat_result, dst_dev: int) -> str:
        pair = (st.st_dev, dst_dev)
        if st.st_size == 0:
            return "copy"
        if pair not in self._no_reflink:
            try:
                fcntl.ioctl(dst_fd, FICLONE, src_fd)
                return "reflink"
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._no_reflink.add(pair)
        if pair not in self._no_kernel_copy and _kernel_copy(src_fd, dst_fd):
            return "copy"
        self._no_kernel_copy.add(pair)
        _user_copy(src_fd, dst_fd)
        return "copy"


def _kernel_copy(src_fd: int, dst_fd: int) -> bool:
    """copy_file_range until the end; False when the kernel refuses before any byte moved."""
    moved = 0
    while True:
        try:
            n = os.copy_file_range(src_fd, dst_fd, 1 << 30)
        except OSError as exc:
            if moved == 0 and exc.errno in _UNSUPPORTED:
                return False
            raise
        if n == 0:
            return True
        moved += n


def _user_copy(src_fd: int, dst_fd: int) -> None:
    os.lseek(src_fd, 0, os.SEEK_SET)
    os.lseek(dst_fd, 0, os.SEEK_SET)
    os.ftruncate(dst_fd, 0)
    while chunk := os.read(src_fd, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view):]


def digest_fd(fd: int, size: int) -> str:
    """The sha256 of an open regular file of about `size` bytes, read from its start."""
    if size < 1 << 20:  # most files: one read, no file object
        return sha256_hex(os.pread(fd, size + 1, 0))
    import hashlib  # OpenSSL, loaded only where a large file is copied

    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def copy_symlink(src: str | Path, dst: str | Path) -> str:
    """Make `dst` a symlink with `src`'s target (never followed); returns the target."""
    target = os.readlink(src)
    os.symlink(target, dst)
    return target


# --- copying a tree ------------------------------------------------------------------------------

# Called for everything copied or left out: (relative path, kind "f"/"l"/"d"/"o", the
# source's lstat, how, a file's sha256 or a symlink's target, a file copy's stat).
Visit = Callable[[str, str, os.stat_result, str, "str | None", "os.stat_result | None"], None]


def copy_tree(cloner: Cloner, src: str | Path, dst: str | Path, visit: Visit, *, rel: str = "",
              skip_names: frozenset[str] = frozenset(), digest: bool = False,
              st: os.stat_result | None = None) -> None:
    """Copy the directory `src` to `dst` (which must not exist), never following a symlink.

    Symlinks are copied as symlinks, special files (FIFOs, sockets, devices) are not
    copied (a FIFO would block the copy) but reported to `visit` as kind "o". A
    directory gets its mode and times after its content, so a read-only one can be filled.
    Paths are plain strings inside: pathlib costs more than the copying on small files.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    st = st or os.lstat(src)
    os.mkdir(dst, 0o700)
    visit(rel, "d", st, "mkdir", None, None)
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if entry.name in skip_names:
            continue
        copy_entry(cloner, entry.path, os.path.join(dst, entry.name), visit,
                   rel=f"{rel}/{entry.name}" if rel else entry.name, skip_names=skip_names, digest=digest,
                   st=entry.stat(follow_symlinks=False))
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_entry(cloner: Cloner, src: str | Path, dst: str | Path, visit: Visit, *, rel: str,
               skip_names: frozenset[str] = frozenset(), digest: bool = False,
               st: os.stat_result | None = None) -> None:
    """Copy one file, symlink or directory (recursively) as it is, not following links."""
    st = st or os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        copy_tree(cloner, src, dst, visit, rel=rel, skip_names=skip_names, digest=digest, st=st)
    elif stat.S_ISLNK(st.st_mode):
        visit(rel, "l", st, "symlink", copy_symlink(src, dst), None)
    elif stat.S_ISREG(st.st_mode):
        how, opened, written, hashed = cloner.copy(src, dst, digest=digest)
        visit(rel, "f", opened, how, hashed, written)
    else:
        visit(rel, "o", st, "skipped", None, None)
