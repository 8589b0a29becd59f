"""The linked worktrees as git's own admin dirs describe them, for `gc`.

gc reads `<common>/worktrees/*` itself rather than `git worktree list`: it must see
entries git would prune, locks and their reasons, and directories whose `.git` file an
agent may have rewritten. Which of them ccm-guard made, which it may run git in, and
whether the ccm-guard that locked one is still alive are decided here too.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from ccm_guard import git
from ccm_guard.errors import UntrustedRepoError
from ccm_guard.git import config as configfile
from ccm_guard.state.home import key_hash
from ccm_guard.state.registry import Task

_LOCK_REASON = re.compile(r"ccm-guard pid (\d+) task (\S+)")


@dataclasses.dataclass(frozen=True)
class AdminEntry:
    """One linked worktree's admin dir, as gc reads it."""

    admin: Path  # <common>/worktrees/<name>
    gitfile: Path | None  # the worktree's `.git` file, as the admin dir's `gitdir` names it
    locked: str | None  # the lock reason ("" when locked without one)
    head_ref: str | None  # the branch checked out there

    @property
    def path(self) -> Path | None:
        return self.gitfile.parent if self.gitfile else None

    @property
    def vanished(self) -> bool:
        """Git's own test for `worktree prune`: the `.git` file it names is gone."""
        return self.gitfile is None or not os.path.lexists(self.gitfile)


def admin_entries(common: Path) -> list[AdminEntry]:
    found = []
    for admin in sorted((common / "worktrees").glob("*")):
        if not admin.is_dir() or admin.is_symlink():
            continue
        gitdir = read(admin / "gitdir")
        gitfile = Path(os.path.normpath(admin / gitdir)) if gitdir else None
        locked = (read(admin / "locked") or "") if os.path.lexists(admin / "locked") else None
        found.append(AdminEntry(admin, gitfile, locked, head_ref(admin / "HEAD")))
    return found


def entry_at(entries: list[AdminEntry], path: Path) -> AdminEntry | None:
    return next((e for e in entries if e.path and same(e.path, path)), None)


def head_ref(head_file: Path) -> str | None:
    """The branch a HEAD file names, or None when it is detached (or unreadable)."""
    head = read(head_file) or ""
    return head[5:].strip() if head.startswith("ref: ") else None


def read(path: Path) -> str | None:
    try:
        return path.read_text(errors="surrogateescape").strip()
    except OSError:
        return None


def same(a: Path | str, b: Path | str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


# --- trust ------------------------------------------------------------------------------------------


def identify(path: Path) -> tuple[Path, Path] | None:
    """(common dir, admin dir) of a worktree directory ccm-guard made, checked both ways.

    The `.git` file is the agent's to write, so it only counts when git's own admin dir
    names this directory back, and the repository is the one the directory's parent
    (named by ccm-guard after the repository) was made for.
    """
    gitfile = path / ".git"
    text = read(gitfile) if gitfile.is_file() and not gitfile.is_symlink() else None
    if not text or not text.startswith("gitdir: "):
        return None
    admin = Path(os.path.realpath(path / text[len("gitdir: "):]))
    common_text = read(admin / "commondir")
    back = read(admin / "gitdir")
    if not common_text or not back:
        return None
    common = Path(os.path.realpath(admin / common_text))
    if (admin.parent != common / "worktrees" or not same(admin / back, gitfile)
            or not path.parent.name.endswith("-" + key_hash(common))):
        return None
    return common, admin


def trusted(task: Task | None, common: Path, admin: Path, path: Path) -> git.Repo:
    """The worktree as a git.Repo, refused when running git there would run code the
    agent planted (its config, or a run that found its metadata tampered with)."""
    if task is not None and task.verdict and '"git_trusted": false' in task.verdict:
        reason: str | None = "its run found its git metadata tampered with (see `ccm-guard task show`)"
    else:
        reason = configfile.unsafe_to_run(common / "config", admin / "config.worktree")
    if reason:
        raise UntrustedRepoError(f"git will not run in {path}: {reason}; inspect it by hand")
    return git.Repo(admin, common, path)


# --- locks --------------------------------------------------------------------------------------------


def lock_reason(pid: int, task_id: str) -> str:
    """The reason a ccm-guard `git worktree lock` carries ("ccm-guard pid N task ID"), the
    form gc recognises (no current ccm-guard takes one; earlier versions' may be left)."""
    return f"ccm-guard pid {pid} task {task_id}"


def lock_owner(reason: str | None) -> tuple[int, str] | None:
    """(pid, task) of a lock ccm-guard took, or None for anybody else's (or no) lock."""
    found = _LOCK_REASON.fullmatch((reason or "").strip())
    return (int(found.group(1)), found.group(2)) if found else None


