"""Removing a worktree off the critical path: one rename now, the deletion after ccm-guard
has answered.

`git worktree remove` costs as much as the checkout did (~10 s at 100k files on ext4;
docs/design-notes.md#removal-off-the-critical-path), because unlinking every file is the cost. Here the worktree's directory is
renamed into `$CCM_GUARD_HOME/trash/` (the same file system as the worktrees, so one
`rename`), its admin dir is removed (a handful of files), and when this process exits,
after the verdict is printed, a detached deleter empties the trash entry. Not earlier:
a deleter started while the agent runs would be one of ccm-guard's children, which the
`processes` gate rightly kills and reports. Each deleter holds an flock on its entry;
`sweep` (gc) deletes what no deleter holds: what a killed ccm-guard left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, ContextManager

from ccm_guard.files import lock_now
from ccm_guard.state.home import home

# Entries this process put in the trash, for the deleter started when it exits.
_pending: list[Path] = []


def trash_dir() -> Path:
    return home() / "trash"


def discard(path: Path) -> Path | None:
    """Move `path` (a directory) into the trash and have it deleted after this process.

    Returns the trash entry, or None when `path` did not exist or was deleted here and
    now (it is on another file system than the trash).
    """
    if not os.path.lexists(path):
        return None
    trash = trash_dir()
    trash.mkdir(parents=True, exist_ok=True)
    entry = trash / f"{time.time_ns()}-{os.getpid()}-{os.urandom(3).hex()}-{path.name}"
    try:
        os.rename(path, entry)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _delete_now(path)  # a rename cannot cross file systems: pay for the deletion here
        return None
    if not _pending:
        atexit.register(release)
    _pending.append(entry)
    return entry


def _delete_now(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        # rm, not shutil.rmtree: an agent's tree can be deeper than Python's recursion
        # limit (the adversarial suite makes one past PATH_MAX).
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def release() -> None:
    """Start one detached deleter for this process's trash entries. Runs when ccm-guard
    exits; a long-lived caller may call it sooner (after its own child processes are
    accounted for)."""
    if _pending:
        _start_deleter(list(_pending))
        _pending.clear()


_CHUNK = 256  # entries per deleter: their locks stay well within the open-file limit, their names within ARG_MAX


def _start_deleter(paths: list[Path]) -> None:
    """`nice rm -rf` of the entries, holding their locks: each is locked here (one another
    process holds is left to it, and to a later `gc`) and the lock's file descriptor is
    passed on, so that it is held until rm exits, whatever becomes of this process
    (`sweep` deletes only what no deleter holds). A deleter per `_CHUNK` entries. In its
    own session (Ctrl-C to ccm-guard's group does not reach it), with no stdout or stderr
    (whoever waits for ccm-guard's output is not kept waiting). No interpreter in
    between: one cost ~15 ms of CPU after every run."""
    for start in range(0, len(paths), _CHUNK):
        locked = {str(path): fd for path in paths[start:start + _CHUNK] if (fd := _try_lock(path)) is not None}
        try:
            if locked:
                _spawn_rm(list(locked), [fd for fd in locked.values() if fd >= 0])
        except OSError:
            pass  # no deleter: `sweep` finds the entries later
        finally:
            for fd in locked.values():
                if fd >= 0:
                    os.close(fd)  # the deleter's copy keeps the lock


def _spawn_rm(paths: list[str], fds: list[int]) -> None:
    rm = ["rm", "-rf", "--one-file-system", "--", *paths]
    for command in (["nice", "-n", "10", *rm], rm):  # without nice where there is none
        try:
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, pass_fds=fds, cwd="/")
            return
        except FileNotFoundError:
            continue


def remove_worktree(worktree: Path, admin_dir: Path,
                    admin_lock: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> Path | None:
    """What `git worktree remove --force` does, with the per-file deletion deferred: the
    directory goes to the trash, then its admin dir is removed (git's order: a crash in
    between leaves an entry `git worktree prune` knows to be stale). `admin_lock` guards
    the admin dir's removal against a concurrent `git worktree add` reading it.

    Returns the trash entry.
    """
    entry = discard(worktree)
    with admin_lock():
        drop_admin(admin_dir, worktree)
    with contextlib.suppress(OSError):
        worktree.parent.rmdir()  # the repository's directory under worktrees/, if now empty
    return entry


def drop_admin(admin_dir: Path, worktree: Path) -> bool:
    """Remove a worktree's admin dir, only if its `gitdir` still names `worktree`: a
    recycled name must not cost another worktree its metadata."""
    try:
        named = (admin_dir / "gitdir").read_text().strip()
    except OSError:
        return False
    if Path(named).parent != worktree:
        return False
    shutil.rmtree(admin_dir, ignore_errors=True)
    return True


@dataclasses.dataclass
class SweepReport:
    """What a sweep of the trash deleted, and what it left to a deleter at work."""

    deleted: list[str] = dataclasses.field(default_factory=list)
    busy: list[str] = dataclasses.field(default_factory=list)  # a deleter is at work on them

    def to_json(self) -> dict[str, list[str]]:
        return dataclasses.asdict(self)


def entries() -> list[Path]:
    try:
        return sorted(trash_dir().iterdir())
    except FileNotFoundError:
        return []


def sweep(dry_run: bool = False, wait: bool = True) -> SweepReport:
    """Delete every trash entry no deleter holds (what a crash left); say which are busy.
    `wait=False` hands them to a detached deleter instead of deleting them here."""
    report = SweepReport()
    for entry in entries():
        fd = _try_lock(entry)
        if fd is None:
            report.busy.append(str(entry))
            continue
        try:
            if not dry_run and wait:
                _delete_now(entry)
            report.deleted.append(str(entry))
        finally:
            if fd >= 0:
                os.close(fd)
    if report.deleted and not dry_run and not wait:
        _start_deleter([Path(e) for e in report.deleted])
    return report


def _try_lock(entry: Path) -> int | None:
    """An fd holding the entry's lock (-1 for what cannot be locked: a plain file, a link,
    or gone), or None when another process holds it or it cannot be opened now (too many
    open files, no permission): then it is left for later."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
            return -1  # not a directory (or just deleted): nothing can hold it
        return None
    return lock_now(fd)


def busy(entry: Path) -> bool:
    fd = _try_lock(entry)
    if fd is None:
        return True
    if fd >= 0:
        os.close(fd)
    return False
