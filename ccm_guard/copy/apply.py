"""After a run in a copied directory: apply the copy's work, discard the copy, restore it.

`apply_copy` writes the changed paths back only where the original is still as the copy
was made from it (else it refuses, naming the paths, and changes nothing); `discard_copy`
moves the copy into the archive under the state home: no work is ever deleted;
`restore_copy` brings it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ccm_guard.clone import Cloner
from ccm_guard.copy.tree import (
    STRATEGY,
    Change,
    Item,
    diff,
    file_changes,
    line_stats,
    manifest_hash,
    observe,
    observe_one,
    read_manifest,
    same,
    walk,
)
from ccm_guard.errors import ApplyRefused, StateError, UsageError
from ccm_guard.state.home import admin_lock, home
from ccm_guard.state.registry import TRANSITIONS, Registry, Task


@dataclasses.dataclass(frozen=True)
class CopyApplied:
    """What applying a copied directory's task into the original did."""

    task: str
    target: str  # the original directory
    strategy: str
    old: str  # the manifest the copy started from
    new: str  # the copy's state that was applied
    files: int
    insertions: int
    deletions: int
    added: tuple[str, ...]
    modified: tuple[str, ...]
    deleted: tuple[str, ...]
    already: tuple[str, ...]  # paths the original already had as the copy has them

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- apply -----------------------------------------------------------------------------------------


def apply_copy(registry: Registry, task: Task) -> CopyApplied:
    """Write the copy's changes back into the original, only where the original is still
    as the copy was made from it; else refuse, naming the paths, and change nothing.

    A path the original already has as the copy has it is not a conflict (so an apply
    that was interrupted can simply be run again).
    """
    _require_copy(task)
    source, copy = Path(task.main_worktree), Path(task.worktree)
    # One apply into a directory at a time: the check and the writes must not interleave.
    with admin_lock(source, "copy"):
        task = registry.get(task.id)
        if task.status != "COMMITTED":
            raise StateError(f"task {task.id} is {task.status}: only a task whose gates passed (COMMITTED) "
                             "can be applied; `ccm-guard task show` says why")
        if not copy.is_dir() or not source.is_dir():
            raise StateError(f"task {task.id}: {copy if not copy.is_dir() else source} is gone, so nothing can be "
                             "applied")
        base = read_manifest(task)
        hidden: list[str] = []
        after = observe(copy, base, "copy", hidden)
        if hidden:
            raise StateError(f"could not list {', '.join(hidden[:5])} in {copy}: nothing was applied; make it "
                             "readable and apply again")
        pending, already = _check_original(source, base, diff(base, after))
        stats = list(line_stats(file_changes(pending), source, copy).values())
        write_back(source, copy, pending)
    applied = CopyApplied(
        task=task.id, target=str(source), strategy=STRATEGY, old=task.base, new=manifest_hash(after),
        files=len(stats), insertions=sum(a or 0 for a, _ in stats), deletions=sum(d or 0 for _, d in stats),
        added=tuple(c.path for c in pending if c.status == "A"),
        modified=tuple(c.path for c in pending if c.status in ("M", "T")),
        deleted=tuple(c.path for c in pending if c.status == "D"), already=tuple(already),
    )
    registry.set_option(task.id, "applied", {**applied.to_json(), "at": time.time()})
    registry.move(task.id, "APPLIED")
    return applied


def _check_original(source: Path, base: Mapping[str, Item], changes: list[Change]) -> tuple[list[Change], list[str]]:
    """The changes still to write, and those the original already has; refuse on conflicts."""
    by_path = {c.path: c for c in changes}
    pending, already, conflicts = [], [], []
    for c in changes:
        now = observe_one(source, c.path, base.get(c.path), "src")
        if same(now, c.after):
            already.append(c.path)
            continue
        pending.append(c)
        if not same(now, base.get(c.path)):
            conflicts.append(c.path)
        elif not _parents_intact(source, c.path, by_path):
            conflicts.append(c.path)
        elif c.before is not None and c.before.kind == "d" and _added_below(source, c.path, base):
            conflicts.append(c.path)
    if conflicts:
        shown = ", ".join(conflicts[:10]) + (f" (and {len(conflicts) - 10} more)" if len(conflicts) > 10 else "")
        raise ApplyRefused(f"{len(conflicts)} path(s) changed in {source} since the copy was made: {shown}; "
                           "nothing was applied: merge them by hand, or discard the task")
    return pending, already


def _parents_intact(source: Path, rel: str, changing: Mapping[str, Change]) -> bool:
    """Every directory above `rel` that the run did not change is still a real directory in
    the original (a symlink there would carry the write elsewhere)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in changing:
            continue  # judged as a change of its own
        try:
            if not stat.S_ISDIR(os.lstat(source / parent).st_mode):
                return False
        except OSError:
            return False
    return True


def _added_below(source: Path, rel: str, base: Mapping[str, Item]) -> bool:
    """Whether the original gained something inside a directory the run removed."""
    root = source / rel
    if not stat.S_ISDIR(os.lstat(root).st_mode):
        return False
    return any(f"{rel}/{child}" not in base for child, _ in walk(root))


def write_back(source: Path, copy: Path, changes: list[Change]) -> None:
    """Stage every new file next to where it goes (nothing changes if that fails), then
    remove, make directories, rename into place, and set modes."""
    depth: Callable[[Change], int] = lambda c: c.path.count("/")  # noqa: E731
    writes = [c for c in changes if c.after is not None and c.after.kind in ("f", "l")
              and not (c.before is not None and c.before.kind == c.after.kind and c.before.digest == c.after.digest)]
    removals = sorted((c for c in changes if c.before is not None and c.before.kind != "o"
                       and (c.after is None or c.after.kind != c.before.kind)), key=depth, reverse=True)
    new_dirs = sorted((c for c in changes if c.after is not None and c.after.kind == "d"
                       and (c.before is None or c.before.kind != "d")), key=depth)
    written = {c.path for c in writes}
    modes = sorted((c for c in changes if c.after is not None and c.after.kind in ("f", "d") and c.path not in written),
                   key=depth, reverse=True)
    staged = _stage(source, copy, writes)
    step = ""
    try:
        for c in removals:
            step = c.path
            target = source / c.path
            if stat.S_ISDIR(os.lstat(target).st_mode):
                os.rmdir(target)  # emptied already: what was inside was removed first (deepest first)
            else:
                os.unlink(target)
        for c in new_dirs:
            step = c.path
            os.mkdir(source / c.path, 0o700)
        for c in writes:
            step = c.path
            os.replace(staged.pop(c.path), source / c.path)
        for c in modes:
            step = c.path
            assert c.after is not None
            os.chmod(source / c.path, c.after.mode)
    except OSError as exc:
        _unstage(staged)
        raise StateError(f"applying stopped at {step} ({exc.strerror}): part of the change is in {source}, the "
                         f"rest still only in {copy}; fix the cause and apply again (it goes on where it "
                         "stopped)") from exc


def _stage(source: Path, copy: Path, writes: list[Change]) -> dict[str, Path]:
    staged: dict[str, Path] = {}
    cloner = Cloner()
    try:
        for c in writes:
            assert c.after is not None
            tmp = _stage_dir(source, c.path) / f".ccm-guard-apply-{os.urandom(6).hex()}"
            if c.after.kind == "l":
                os.symlink(os.readlink(copy / c.path), tmp)
            else:
                cloner.copy(copy / c.path, tmp)
            staged[c.path] = tmp
    except BaseException as exc:
        _unstage(staged)
        if isinstance(exc, OSError):
            raise StateError(f"could not prepare {exc.filename}: {exc.strerror}; nothing was applied") from exc
        raise
    return staged


def _unstage(staged: Mapping[str, Path]) -> None:
    for tmp in staged.values():
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _stage_dir(source: Path, rel: str) -> Path:
    """The nearest directory above `rel` that exists in the original (same file system as
    where the file goes, so the final rename is atomic)."""
    parent = os.path.dirname(rel)
    while parent:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(source / parent).st_mode):
                return source / parent
        parent = os.path.dirname(parent)
    return source


# --- discard and restore ---------------------------------------------------------------------------


def discard_copy(registry: Registry, task: Task) -> dict[str, Any]:
    """Move the copy into the archive under the state home (never delete it)."""
    _require_copy(task)
    if task.status in ("DISCARDED", "CLEANED_UP"):
        saved = (task.option("archive") or {}).get("path")
        raise StateError(f"task {task.id} is already {task.status}" + (f"; its copy is archived at {saved}"
                                                                       if saved else ""))
    if task.running:
        raise StateError(f"task {task.id} is still running (pid {task.pid}): stop its ccm-guard first")
    final = "CLEANED_UP" if task.status in ("APPLIED", "PENDING") else "DISCARDED"
    if final not in TRANSITIONS[task.status]:
        raise StateError(f"task {task.id} cannot go from {task.status} to {final}")
    copy = Path(task.worktree)
    archive = _archive(copy, task.id) if os.path.lexists(copy) else None
    archived = str(archive) if archive else None
    registry.set_option(task.id, "archive", {"path": archived, "status": task.status})
    registry.move(task.id, final)
    return {"task": task.id, "archive": archived, "removed": str(copy) if archive else None, "to_pool": False,
            "restore": f"ccm-guard task restore {task.id}" if archive else None}


def _archive(copy: Path, task_id: str) -> Path:
    """Move `copy` to a new place in the archive; return that place."""
    archive = home() / "archive" / "copies" / copy.parent.name / task_id
    if os.path.lexists(archive):
        archive = archive.with_name(f"{task_id}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}")
    archive.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(copy), str(archive))  # a rename: both live under the state home
    with contextlib.suppress(OSError):
        copy.parent.rmdir()
    return archive


def restore_copy(registry: Registry, task: Task) -> dict[str, Any]:
    """Bring a discarded copy back where it was, in the status it had."""
    _require_copy(task)
    saved = task.option("archive") or {}
    archive = saved.get("path")
    if task.status not in ("DISCARDED", "CLEANED_UP") or not archive or not os.path.isdir(archive):
        raise StateError(f"task {task.id} ({task.status}) has no archived copy to restore")
    if os.path.lexists(task.worktree):
        raise StateError(f"{task.worktree} exists: move it away, then restore")
    Path(task.worktree).parent.mkdir(parents=True, exist_ok=True)
    shutil.move(archive, task.worktree)
    status = saved.get("status")
    registry.set_option(task.id, "archive", None)
    registry.move(task.id, status if status in TRANSITIONS[task.status] else "ERRORED")
    return {"task": task.id, "worktree": task.worktree, "status": registry.get(task.id).status}


def _require_copy(task: Task) -> None:
    if task.option("strategy") != STRATEGY:
        raise UsageError(f"task {task.id} is not a copied-directory task: use the git commands for it")
