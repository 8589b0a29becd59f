"""Where git keeps a repository's parts: the shared (common) dir and the admin dirs of
linked worktrees under `worktrees/`. Read from the files themselves, without running git."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ccm_guard.errors import RepoError
from ccm_guard.git.core import Repo


def host_repo(common_dir: Path) -> Repo:
    """The shared repository, for ref and worktree administration (no work tree)."""
    return Repo(git_dir=common_dir, common_dir=common_dir)


def admin_dir_of(worktree: Path, common: Path) -> Path:
    # Read once, right after git wrote it and before the agent exists: from here on the
    # admin dir is pinned and the pointer file is only something to compare.
    text = (worktree / ".git").read_text().strip()
    admin = Path(os.path.realpath(text.removeprefix("gitdir: ")))
    if admin.parent != common / "worktrees":
        raise RepoError(f"git put the worktree's metadata at {admin}, outside {common}/worktrees")
    return admin


def admin_dirs_pointing_at(common: Path, worktree: Path) -> list[Path]:
    """The admin dirs under `common` whose `gitdir` names `worktree`'s `.git`."""
    found = []
    for gitdir_file in (common / "worktrees").glob("*/gitdir"):
        with contextlib.suppress(OSError):
            if Path(gitdir_file.read_text().strip()).parent == worktree:
                found.append(gitdir_file.parent)
    return found
