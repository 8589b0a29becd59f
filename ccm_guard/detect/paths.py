"""What a run changed, path by path, checked against a role's rules.

Committed changes are taken commit by commit (a forbidden file changed and changed
back, or one smuggled in by a merge, is still seen), renames as a deletion plus an
addition (both sides are checked), and then what is left uncommitted in the work tree.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
import unicodedata
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from ccm_guard import git

if TYPE_CHECKING:
    from ccm_guard.policy import Role
    from ccm_guard.policy.rules import (
        Rules,  # pathspec costs ~35 ms to import: only when paths are checked
    )

SYMLINK, GITLINK, EXECUTABLE, MISSING = "120000", "160000", "100755", "000000"


@dataclasses.dataclass(frozen=True)
class PathChange:
    path: str
    status: str  # A, M, D, T (committed or staged), or "?" untracked
    old_mode: str
    new_mode: str
    old_blob: str | None  # None where the content is in the work tree
    new_blob: str | None
    where: str  # "commit <sha>", "staged", "uncommitted", "untracked"


@dataclasses.dataclass(frozen=True)
class Violation:
    path: str
    reason: str
    where: str
    severity: str = "fail"

    def line(self) -> str:
        return f"{self.path}: {self.reason} ({self.where})"


def from_raw(raw: Iterable[git.RawChange]) -> list[PathChange]:
    return [
        PathChange(r.path, r.status, r.old_mode, r.new_mode, _blob(r.old_blob), _blob(r.new_blob),
                   "staged" if r.where == "staged" else f"commit {r.where[:12]}")
        for r in raw
    ]


def _blob(oid: str) -> str | None:
    return None if oid and not oid.strip("0") else oid  # git's null id: all zeros


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
            changes.append(PathChange(entry.path, status, entry.head_mode, mode, _blob(entry.head_blob or "0"),
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


def check(
    changes: list[PathChange],
    rules: Rules,
    link_target: Callable[[PathChange], str | None],
    final_paths: Callable[[], Iterable[str]],
) -> list[Violation]:
    """Every way a change can break the role's rules, one Violation each, in the order of
    the changes.

    A run may change 100k paths and nearly all are fine: the paths are decided in one scan
    (Rules.violations), the modes and statuses by set, and only the changes something
    was found in are looked at one by one.
    """
    found: list[Violation] = []
    paths = [c.path for c in changes]
    offenders = rules.violations(paths)
    special = {c.new_mode for c in changes} & _SPECIAL
    if offenders or special:
        for c in changes:
            if c.path in offenders or c.new_mode in special:
                found += _change(c, offenders.get(c.path), rules, link_target)
    statuses = {c.status for c in changes}
    if statuses and statuses <= _ADDED:  # all added (a first commit, a new tree): no need to pick them out
        found += _twins(changes, paths, final_paths())
    elif statuses & _ADDED:
        added = [c for c in changes if c.status in _ADDED]
        found += _twins(added, [c.path for c in added], final_paths())
    return found


_SPECIAL = frozenset((SYMLINK, GITLINK, EXECUTABLE))  # new modes that need a look on their own
_ADDED = frozenset(("A", "?"))


def _change(c: PathChange, why: str | None, rules: Rules, link_target: Callable[[PathChange], str | None]
            ) -> list[Violation]:
    found = []
    if why:
        verb = "deleted" if c.status == "D" else "changed"
        found.append(Violation(c.path, f"{verb}, but {why}", c.where))
    if c.new_mode == SYMLINK:
        found += _symlink(c, rules, link_target(c))
    elif c.new_mode == GITLINK and c.status != "D":
        what = "a nested git repository" if c.status == "?" else "a gitlink (submodule entry)"
        found.append(Violation(c.path, f"{what} was added", c.where))
    elif c.new_mode == EXECUTABLE and c.old_mode != EXECUTABLE:
        found.append(Violation(c.path, "made executable", c.where, "warn"))
    return found


def _symlink(c: PathChange, rules: Rules, target: str | None) -> list[Violation]:
    if target is None:
        return [Violation(c.path, "is a symlink whose target could not be read", c.where)]
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(c.path), target))
    if posixpath.isabs(target) or resolved == ".." or resolved.startswith("../"):
        return [Violation(c.path, f"is a symlink pointing outside the worktree ({target!r})", c.where)]
    why = rules.violation(resolved)
    if why:
        return [Violation(c.path, f"is a symlink to {resolved!r}, which is {why}", c.where)]
    return []


def _twins(added: list[PathChange], paths: list[str], final: Iterable[str]) -> list[Violation]:
    """New paths (`paths` are theirs) that are another path on a case-insensitive or
    normalising file system."""
    final = list(final)
    if not _may_have_twins(paths, final):
        return []
    seen: dict[str, set[str]] = {}
    for path in final:
        seen.setdefault(_fold(path), set()).add(path)
    found = []
    for c in added:
        others = sorted(seen.get(_fold(c.path), set()) - {c.path})
        if others:
            found.append(Violation(c.path, f"is the same file as {others[0]!r} on case-insensitive "
                                   "or Unicode-normalising file systems", c.where))
    return found


def _may_have_twins(paths: list[str], final: list[str]) -> bool:
    """False only when no added path (of `paths`) can have a twin, found without folding the
    names one by one (they are folded as one text) and with sets: True sends _twins the
    long way, which decides."""
    folded = _fold_all(final)
    if folded is None:
        return True
    folds, names = set(folded), set(final)
    if len(folds) != len(names):
        # Some names in the tree fold alike (two it has long held, perhaps): only a fold
        # an added path shares with them matters.
        shared = {fold for fold, n in Counter(folded).items() if n > 1}
        added = _fold_all(paths)
        if added is None or not shared.isdisjoint(added):
            return True
    # Every other fold in the tree belongs to one name: an added path in the tree is that
    # name itself, and one not in it (added, then deleted) has a twin if its fold is there.
    if names.issuperset(paths):
        return False
    outside = _fold_all(list(set(paths) - names))
    return outside is None or not folds.isdisjoint(outside)


def _fold_all(paths: list[str]) -> list[str] | None:
    """_fold of each path, done on them joined (normalising and case-folding never act
    across a newline); None when a name holds a newline and the text would not split back."""
    text = "\n".join(paths)
    if text.count("\n") != len(paths) - 1:
        return None
    return (text if text.isascii() else unicodedata.normalize("NFC", text)).casefold().split("\n")


def _fold(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()


@dataclasses.dataclass(frozen=True)
class Figures:
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
    blobs = {b for c in first.values() for b in (c.old_blob,) if b} | {b for c in last.values() if (b := c.new_blob)}
    sizes = git.blob_sizes(repo, sorted(blobs))
    largest, growth = (0, ""), 0
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
    """Where each symlink points: committed ones from their blobs (one git call for all),
    uncommitted ones from the work tree."""
    links = git.blobs(repo, [c.new_blob for c in changes if c.new_blob and c.new_mode == SYMLINK])

    def target(c: PathChange) -> str | None:
        if c.new_blob is None:
            try:
                return os.readlink((worktree or Path("/nonexistent")) / c.path)
            except OSError:
                return None
        data = links.get(c.new_blob)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    return target


def staged_violations(repo: git.Repo, role: "Role | Rules") -> list[Violation]:
    """The path rules on what is staged for the next commit (for hooks and pre-commit)."""
    changes = from_raw(git.staged_changes(repo))
    return check(changes, _rules(role), link_targets(repo, changes),
                 lambda: git.index_paths(repo))


def range_violations(repo: git.Repo, role: "Role", base: str, head: str) -> list[Violation]:
    """The path rules on every commit of base..head."""
    changes = from_raw(git.commit_changes(repo, base, head))
    return check(changes, _rules(role), link_targets(repo, changes),
                 lambda: git.tree_paths(repo, head))


def _rules(role: "Role | Rules") -> "Rules":
    from ccm_guard.policy.rules import Rules

    return role if isinstance(role, Rules) else Rules(role.allow, role.forbid)
