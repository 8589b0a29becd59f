"""Removing a worktree off the critical path: one rename now, the deletion after ccm-guard
has answered.

`git worktree remove` costs as much as the checkout did (~10 s at 100k files on ext4;
docs/design-notes.md#removal-off-the-critical-path), because unlinking every file is the cost. Here the worktree's directory is
renamed into `$CCM_GUARD_HOME/trash/` (the same file system as the worktrees, so one
`rename`), its admin dir is removed (a handful of files), and when this process exits,
after the verdict is printed, a detached deleter empties the trash entry. Not earlier:
a deleter started while the agent runs would be one of ccm-guard's children, which the
`processes` gate rightly kills and reports. Each deleter holds an flock on its entry;
`sweep` (gc) deletes what no deleter holds: what a killed ccm-guard left behind. A large
tree is shared among several rm processes (docs/design-notes.md#removal-off-the-critical-path).
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
from typing import IO, Callable, ContextManager, Mapping

from ccm_guard.files import lock_now
from ccm_guard.git.index import entry_count
from ccm_guard.state.home import home

# Entries this process put in the trash, for the deleter started when it exits, with the
# number of files each holds where known (0 where not).
_pending: dict[Path, int] = {}


def trash_dir() -> Path:
    return home() / "trash"


def discard(path: Path, files: int = 0) -> Path | None:
    """Move `path` (a directory) into the trash and have it deleted after this process;
    `files`, where known, is how many files it holds (a large tree is deleted by several
    processes at once).

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
    _pending[entry] = files
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
        _start_deleter(dict(_pending))
        _pending.clear()


_CHUNK = 256  # entries per deleter: their locks stay well within the open-file limit, their names within ARG_MAX
_RM = ["rm", "-rf", "--one-file-system", "--"]

# A tree of this many files or more is deleted by several rm processes at once, its top
# directory's names shared among them: unlinking is the kernel's work, and it shares out.
# Two take half the time of one here (100k files: 0.58 -> 0.30 s on tmpfs, 6.1 -> 4.3 s
# on ext4); a smaller tree is not worth a process more.
_SHARED_FROM = 5000
_SHARERS = min(os.cpu_count() or 1, 4)
# In the tree `$0`, xargs runs rm on the names its standard input holds (NUL-separated,
# bare names: whatever becomes of the list, a name cut short still names something in the
# tree, or "." or "..", which rm refuses), `$1` at a time, `$2` names to an rm; then one
# rm takes what is left.
_SHARED_RM = ('cd -P -- "$0" || exit; xargs -0 -P "$1" -n "$2" rm -rf --one-file-system -- 2>/dev/null; '
              'cd / && exec rm -rf --one-file-system -- "$0"')
# The names given are at most these many, in one write that the pipe takes whole (an
# exiting ccm-guard never waits on the deleter); the rest is the final rm's.
_PARTS_MAX, _PARTS_BYTES = 512, 60_000


def _start_deleter(entries: Mapping[Path, int]) -> None:
    """`nice rm -rf` of the entries, holding their locks: each is locked here (one another
    process holds is left to it, and to a later `gc`) and the lock's file descriptor is
    passed on, so that it is held until rm exits, whatever becomes of this process
    (`sweep` deletes only what no deleter holds). A deleter per `_CHUNK` entries, and one
    of its own for an entry that holds (`entries`: how many files each holds, 0 where not
    known) `_SHARED_FROM` files or more, whose parts several rm processes share. In its own session (Ctrl-C to ccm-guard's group
    does not reach it), with no stdout or stderr (whoever waits for ccm-guard's output is
    not kept waiting). No interpreter in between: one cost ~15 ms of CPU after every run."""
    listed = list(entries)
    shared_from = _SHARED_FROM if _SHARERS > 1 else None
    for start in range(0, len(listed), _CHUNK):
        locked = {path: fd for path in listed[start:start + _CHUNK] if (fd := _try_lock(path)) is not None}
        large = [path for path in locked if shared_from is not None and entries[path] >= shared_from]
        rest = [path for path in locked if path not in large]
        try:
            for path in large:
                with contextlib.suppress(OSError):  # no deleter: `sweep` finds it later
                    _spawn_shared(str(path), [fd for fd in (locked[path],) if fd >= 0])
            if rest:
                _spawn([*_RM, *map(str, rest)], [locked[path] for path in rest if locked[path] >= 0])
        except OSError:
            pass  # no deleter: `sweep` finds the entries later
        finally:
            for fd in locked.values():
                if fd >= 0:
                    os.close(fd)  # the deleter's copy keeps the lock


def _spawn_shared(entry: str, fds: list[int]) -> None:
    """The deleter of a large tree: its parts to xargs, which keeps `_SHARERS` rm
    processes at work on them; then one rm for the rest."""
    names, size = [], 0
    for name in _parts(entry):
        size += len(name) + 1
        if size > _PARTS_BYTES:
            break
        names.append(name)
    each = max(1, -(-len(names) // (8 * _SHARERS)))  # up to 8 rm processes each: their shares even out
    stdin = _spawn(["/bin/sh", "-c", _SHARED_RM, entry, str(_SHARERS), str(each)], fds, stdin=subprocess.PIPE)
    if stdin is not None:
        with contextlib.suppress(OSError):  # (what is not written is the final rm's)
            os.set_blocking(stdin.fileno(), False)
            os.write(stdin.fileno(), b"".join(name + b"\0" for name in names))
        with contextlib.suppress(OSError):
            stdin.close()


def _parts(entry: str) -> list[bytes]:
    """The names in the tree's top directory to share out (`_PARTS_MAX` at most), nothing
    deeper: rm is given them in the tree (`cd`), and never follows the link a name it is
    given is, nor any it finds below. (A deeper path would be looked up through a directory
    of the tree, which a process the agent left could swap for a link: Landlock's rules
    follow the renamed worktree into the trash.) Where the top directory holds fewer
    directories than four per rm (a tree under one `src/`), what they hold is moved up into it
    first, a level at a time (twice, `_PARTS_MAX` names at most), by renames relative to
    directories opened without following links: nothing outside the tree can be moved in.
    A mount point is left to the final rm, which keeps to the tree's file system."""
    try:
        top = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        moved = 0
        for _ in range(2):
            with os.scandir(top) as listing:
                directories = [held.name for held in listing if held.is_dir(follow_symlinks=False)]
            if len(directories) >= 4 * _SHARERS:
                break
            for name in directories:
                moved = _move_up(top, name, moved)
        device, found = os.fstat(top).st_dev, list[bytes]()
        with os.scandir(top) as listing:
            for held in listing:
                if len(found) >= _PARTS_MAX:
                    break
                if held.stat(follow_symlinks=False).st_dev == device:
                    found.append(os.fsencode(held.name))
        return found
    except OSError:
        return []  # the final rm takes the whole tree
    finally:
        os.close(top)


def _move_up(top: int, name: str, moved: int) -> int:
    """Rename what the directory `name` in `top` holds into `top` (the names numbered on
    from `moved`, up to `_PARTS_MAX`; a name there already is written over or left where
    it is); the count."""
    try:
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
    except OSError:
        return moved  # no longer a directory: a part as it is
    try:
        with os.scandir(inner) as listing:
            for held in listing:
                if moved >= _PARTS_MAX:
                    break
                with contextlib.suppress(OSError):
                    os.rename(held.name, f".ccm-guard-part-{moved}", src_dir_fd=inner, dst_dir_fd=top)
                    moved += 1
    finally:
        os.close(inner)
    return moved


def _spawn(command: list[str], fds: list[int], stdin: int = subprocess.DEVNULL) -> IO[bytes] | None:
    """Start a deleter (niced, where there is nice); its standard input where asked for."""
    for argv in (["nice", "-n", "10", *command], command):  # without nice where there is none
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True, pass_fds=fds, cwd="/")
            return proc.stdin
        except FileNotFoundError:
            continue
    return None


def remove_worktree(worktree: Path, admin_dir: Path,
                    admin_lock: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> Path | None:
    """What `git worktree remove --force` does, with the per-file deletion deferred: the
    directory goes to the trash, then its admin dir is removed (git's order: a crash in
    between leaves an entry `git worktree prune` knows to be stale). `admin_lock` guards
    the admin dir's removal against a concurrent `git worktree add` reading it.

    Returns the trash entry.
    """
    entry = discard(worktree, files=_files_in(admin_dir))
    with admin_lock():
        drop_admin(admin_dir, worktree)
    with contextlib.suppress(OSError):
        worktree.parent.rmdir()  # the repository's directory under worktrees/, if now empty
    return entry


def _files_in(admin_dir: Path) -> int:
    """How many files a worktree holds, as its index counts them (0 where it cannot be
    read, and for a sparse checkout, whose index lists what it leaves out too)."""
    if os.path.lexists(admin_dir / "info" / "sparse-checkout"):
        return 0
    return entry_count(admin_dir / "index") or 0


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
        _start_deleter(dict.fromkeys(map(Path, report.deleted), 0))
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
