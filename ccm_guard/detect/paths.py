"""What a run changed, path by path, as the path check (pathrules.check) takes it.

Committed changes are taken commit by commit (a forbidden file changed and changed
back, or one smuggled in by a merge, is still seen), renames as a deletion plus an
addition (both sides are checked), and then what is left uncommitted in the work tree.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, cast

from ccm_guard import git
from ccm_guard.pathrules.check import (
    EXECUTABLE,
    GITLINK,
    MISSING,
    SYMLINK,
    PathChange,
    blob_id,
)


def from_raw(raw: Iterable[git.RawChange]) -> list[PathChange]:
    """git's raw changes as the path check takes them. A RawChange has PathChange's fields,
    by name and in order, so it is taken as it is: a range of 100k changes makes no second
    object per path."""
    return cast("list[PathChange]", list(raw))


def from_status(entries: Iterable[git.StatusEntry], worktree: Path) -> list[PathChange]:
    """Uncommitted and untracked paths, with their modes as they are on disk."""
    changes = []
    for entry in entries:
        if entry.code == "!!":
            continue
        mode = _disk_mode(worktree / entry.path)
        if entry.code == "??":
            changes.append(PathChange(entry.path, "?", MISSING, mode, None, None, "untracked"))
        else:
            status = "D" if mode == MISSING else "M"
            changes.append(PathChange(entry.path, status, entry.head_mode, mode, blob_id(entry.head_blob or "0"),
                                      None, "uncommitted"))
    return changes


def _disk_mode(path: Path) -> str:
    try:
        st = os.lstat(path)
    except OSError:
        return MISSING
    if stat.S_ISLNK(st.st_mode):
        return SYMLINK
    if stat.S_ISDIR(st.st_mode):
        return GITLINK  # an untracked directory status lists as one entry holds a repository
    return EXECUTABLE if st.st_mode & 0o111 else "100644"


class Figures(NamedTuple):
    files: int  # paths changed, committed or not
    largest: tuple[int, str]  # the largest file the run left, and its path
    added_bytes: int  # how much the changed files grew, in all
    commits: int


def measure(changes: list[PathChange], commits: int, repo: git.Repo, worktree: Path) -> Figures:
    """The figures the limits gate compares: one `cat-file --batch-check` for all sizes."""
    first: dict[str, PathChange] = {}
    last: dict[str, PathChange] = {}
    for c in changes:  # committed ones oldest first, then the work tree's
        first.setdefault(c.path, c)
        last[c.path] = c
    # Every version a commit added counts for the largest file: one added, then removed, is
    # in the history a merge brings into the person's branch.
    blobs = {b for c in first.values() for b in (c.old_blob,) if b} | {b for c in changes if (b := c.new_blob)}
    sizes = git.blob_sizes(repo, sorted(blobs))
    largest, growth = max(((sizes.get(b, 0), c.path) for c in changes if (b := c.new_blob)), default=(0, "")), 0
    for path, c in last.items():
        size = _size_on_disk(worktree / path) if c.new_blob is None else sizes.get(c.new_blob, 0)
        old = first[path].old_blob
        before = sizes.get(old, 0) if old else 0
        largest = max(largest, (size, path))
        growth += max(0, size - before)
    return Figures(len(last), largest, growth, commits)


def _size_on_disk(path: Path) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def link_targets(repo: git.Repo, changes: list[PathChange], worktree: Path | None = None
                 ) -> Callable[[PathChange], str | None]:
    """Where each symlink points: committed ones from their blobs (one git call for all,
    made when the first is asked for: most ranges have none), uncommitted ones from the
    work tree."""
    @functools.cache
    def committed() -> dict[str, bytes]:
        return git.blobs(repo, [c.new_blob for c in changes if c.new_blob and c.new_mode == SYMLINK])

    def target(c: PathChange) -> str | None:
        if c.new_blob is None:
            try:
                return os.readlink((worktree or Path("/nonexistent")) / c.path)
            except OSError:
                return None
        data = committed().get(c.new_blob)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    return target
