"""`.worktreeinclude`: the ignored files of the person's checkout a new worktree needs.

The convention Claude Code uses (Codex, Conductor and ccmanager read the same file): a
file at the top of the checkout, in gitignore syntax, naming files git ignores that a
fresh worktree lacks: `.env`, `node_modules/`, build caches. A path is copied only when
a pattern matches it AND git ignores it, so a tracked file is never copied, nor an
untracked one the repository does not ignore; git does both matchings (its own rules,
exactly). Nothing is followed out of the checkout: a symlink is copied as a symlink, a
nested `.git` is never copied, and nothing is written through a symlink or over an
existing file in the new worktree.

Files are reflinked where the file system can (FICLONE: btrfs, XFS, bcachefs), else
copied in the kernel (copy_file_range), else read and written; modes and times are kept.
With `link_dirs`, each directory the patterns take whole is a symlink to the checkout's
instead of a copy (fast for a big `node_modules/`, but the agent then writes into the
person's checkout unless the sandbox stops it).

The copying itself (reflink first) is ccm_guard.clone, shared with the copied-directory strategy.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import stat
import tempfile
from pathlib import Path

from ccm_guard import git
from ccm_guard.clone import Cloner, copy_entry
from ccm_guard.files import read_regular

INCLUDE_FILE = ".worktreeinclude"


# --- .worktreeinclude ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Included:
    """One path the patterns selected: a file, a symlink, or a directory taken whole."""

    path: str  # relative to the top; a directory ends in "/"
    how: str  # "reflink", "copy", "mixed" (a directory of both), "symlink", or "link" (--link-dirs)
    files: int  # regular files and symlinks written
    bytes: int


@dataclasses.dataclass
class IncludeResult:
    """What .worktreeinclude brought into a new worktree, and what it skipped."""

    source: str | None  # the .worktreeinclude read; None when the checkout has none
    included: list[Included] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (path, why)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Files written by each method ("reflink", "copy", "symlink"), and directories linked ("link").
    by_how: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def files(self) -> int:
        return sum(i.files for i in self.included)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.included)

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "files": self.files, "bytes": self.bytes, "by_how": dict(self.by_how),
                "included": [dataclasses.asdict(i) for i in self.included],
                "skipped": [{"path": p, "why": w} for p, w in self.skipped], "warnings": self.warnings}


def copy_included(main_worktree: Path, new_worktree: Path, link_dirs: bool = False) -> IncludeResult:
    """Copy into `new_worktree` the ignored files of `main_worktree` its .worktreeinclude names.

    Runs right after the worktree is made, before any agent exists: both trees are the
    person's and ccm-guard's. A path that cannot be copied is skipped with its reason
    (the run goes on without it); git failing on the checkout is an error.
    """
    found = git.discover(main_worktree)
    include = found.toplevel / INCLUDE_FILE
    patterns = _read_patterns(include)
    if patterns is None:
        return IncludeResult(None)
    result = IncludeResult(str(include))
    repo = found.repo()
    cloner = Cloner()
    for path in _selected(repo, patterns):
        result.included += _include_one(cloner, found.toplevel, new_worktree, path, link_dirs, result)
    linked = [i.path for i in result.included if i.how == "link"]
    if linked:
        _copy_unignored_links(cloner, found.toplevel, new_worktree, linked, result)
    return result


INCLUDE_LIMIT = 1 << 20  # bytes of patterns read


def _read_patterns(include: Path) -> str | None:
    """The file's text, or None when there is none. Only a regular file counts: a symlink
    is not followed (the patterns come from the checkout itself), and a FIFO or a device
    is not opened for reading (it would block exec, or never end)."""
    data = read_regular(include, INCLUDE_LIMIT)
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _selected(repo: git.Repo, patterns: str) -> list[str]:
    """Paths both ignored by the repository and matched by the patterns (git matches both).

    Either listing may name a directory whole ("node_modules/") where the other names
    paths inside it; the intersection keeps the narrower of each overlapping pair.
    """
    with tempfile.NamedTemporaryFile("wb", prefix="ccm-guard-include-", suffix=".txt") as fh:
        fh.write(patterns.encode("utf-8", "surrogateescape"))
        fh.flush()
        matched = git.untracked_matching(repo, Path(fh.name))
    if not matched:
        return []
    ignored = set(git.ignored_untracked(repo))
    wanted = set(matched)
    both = {a for a in ignored if _within(a, wanted)} | {m for m in wanted if _within(m, ignored)}
    # git lists an ignored directory and files in it side by side at times: keep the top.
    kept = [p for p in both if not _inside(p, both)]
    return sorted(p for p in kept if ".git" not in p.rstrip("/").split("/"))


def _within(path: str, entries: set[str]) -> bool:
    """Whether `path` is one of `entries` or inside one of its directories ("dir/")."""
    return path in entries or _inside(path, entries)


def _inside(path: str, entries: set[str]) -> bool:
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in entries for i in range(1, len(parts)))


def _include_one(cloner: Cloner, top: Path, new: Path, path: str, link_dirs: bool,
                 result: IncludeResult) -> list[Included]:
    rel = path.rstrip("/")
    src, dst = top / rel, new / rel
    try:
        if _both_directories(src, dst):
            # The worktree has this directory (it tracks files in it): add what it lacks.
            return [item for name in sorted(os.listdir(src)) if name != ".git"
                    for item in _include_one(cloner, top, new, f"{rel}/{name}", link_dirs, result)]
        why = _unsafe(top, new, rel)
        if why:
            result.skipped.append((path, why))
            return []
        if link_dirs and stat.S_ISDIR(os.lstat(src).st_mode):
            os.symlink(src, dst)
            result.by_how["link"] += 1
            return [Included(rel + "/", "link", 0, 0)]
        return [_copy_one(cloner, src, dst, rel, result)]
    except OSError as exc:
        result.skipped.append((path, f"could not copy: {exc.strerror or exc}"))
        return []


def _both_directories(src: Path, dst: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(src).st_mode) and stat.S_ISDIR(os.lstat(dst).st_mode)
    except FileNotFoundError:
        return False


def _copy_one(cloner: Cloner, src: Path, dst: Path, rel: str, result: IncludeResult) -> Included:
    files, size, hows = 0, 0, set()

    def visit(child: str, kind: str, st: os.stat_result, how: str, *_: object) -> None:
        nonlocal files, size
        if kind == "o":
            result.skipped.append((child, "not a regular file, symlink or directory"))
        elif kind in ("f", "l"):
            files += 1
            size += st.st_size if kind == "f" else 0
            hows.add(how)
            result.by_how[how] += 1

    is_dir = stat.S_ISDIR(os.lstat(src).st_mode)
    copy_entry(cloner, src, dst, visit, rel=rel, skip_names=frozenset({".git"}))
    how = hows.pop() if len(hows) == 1 else ("mixed" if hows else "copy")
    return Included(rel + "/" if is_dir else rel, how, files, size)


def _unsafe(top: Path, new: Path, rel: str) -> str | None:
    """Why `rel` must not be copied from `top` to `new`, or None when it may (making the
    directories it needs in `new`: only ignored files live there, so git made none)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if not stat.S_ISDIR(os.lstat(top / parent).st_mode):
            return f"{parent} is not a directory in your checkout (a symlink is never followed)"
        try:
            mode = os.lstat(new / parent).st_mode
        except FileNotFoundError:
            os.mkdir(new / parent)
            continue
        if not stat.S_ISDIR(mode):
            return f"{parent} is a symlink or file in the new worktree: nothing is written through it"
    if os.path.lexists(new / rel):
        return "the new worktree already has this path (tracked at the task's base): not overwritten"
    return None


def _copy_unignored_links(cloner: Cloner, top: Path, new: Path, linked: list[str], result: IncludeResult) -> None:
    """A directory-only rule (`node_modules/`), or rules matching only what is inside, do not
    match a symlink: git would count the link as an untracked file, and the clean-tree and
    path-policy gates would fail every run. Such a directory is copied instead, with a
    warning saying how to get it linked."""
    found = git.discover(new)
    repo = found.repo()
    names = [p.rstrip("/") for p in linked]
    ignored = {rule.path for rule in git.check_ignore(repo, names)}
    for path, rel in zip(linked, names):
        if rel in ignored:
            continue
        os.unlink(new / rel)
        result.by_how["link"] -= 1
        result.included = [i for i in result.included if i.path != path]
        result.included.append(_copy_one(cloner, top / rel, new / rel, rel, result))
        result.warnings.append(
            f"{rel}/ was copied, not linked: git would not ignore a symlink there (its rules match "
            f"directories only, or what is inside), and the gates would count it as an untracked file; "
            f"ignore `{rel}` itself, without a trailing slash, to have it linked"
        )
    if not result.by_how["link"]:
        del result.by_how["link"]
