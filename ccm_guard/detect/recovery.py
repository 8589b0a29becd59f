"""Commit on the agent's behalf when the sandbox blocked its own `git commit`.

Runs on the host after the agent's processes are stopped, only when signatures.py found
git's own lock-file denial for this task and the snapshot showed the git metadata can be
trusted (the caller passes a distrusted Repo otherwise, and git.run refuses it).

Only paths the role's policy allows are committed; the others are reported and left as
they are in the work tree, for the archive and the gates. A spoofed signature therefore
gains nothing: the agent could have committed exactly these paths itself.

Everything is plumbing over a private index, so the agent's staging and its config
(commit.template, trailer.*.cmd, ...) play no part, and nothing moves unless the commit
is made: read-tree HEAD -> refresh -> diff-index + ls-files (what differs from HEAD) ->
update-index the allowed paths -> write-tree -> commit-tree -> update-ref HEAD new old
(compare-and-swap) -> the task's index reset to the new commit.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from ccm_guard import git
from ccm_guard.errors import GitError, RepoError

TRAILER = "Recovery-Reason: sandbox blocked commit"
DEFAULT_MESSAGE = "Commit work the sandbox kept the agent from committing"
# git matches trailer tokens case-insensitively and allows blanks before the colon.
# Lines of the agent's message that only ccm-guard may write: the commit is made (and
# recorded) as ccm-guard's, so a claim the agent put in it would be believed later.
_OLD_TRAILER = re.compile(r"\s*(recovery-reason|ccm-guard-[a-z0-9-]*)\s*:", re.IGNORECASE)
_TRAILER_LINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*\s*:\s|\s")


@dataclasses.dataclass(frozen=True)
class RecoveryResult:
    """What the host-side commit of sandbox-blocked work committed, and what it left."""

    commit: str | None  # the new commit, None when nothing was committed
    committed: tuple[str, ...]  # paths in the commit
    refused: tuple[str, ...]  # changed paths the policy does not allow, left in the work tree
    message: str  # the commit message used ("" when nothing was committed)
    removed_lock: Path | None = None  # a stale index.lock of this task that was removed
    warning: str | None = None  # the commit was made but something after it failed

    @property
    def recovered(self) -> bool:
        return self.commit is not None


def recover(repo: git.Repo, allowed: Callable[[str], bool], message: str | None,
            identity: Mapping[str, str]) -> RecoveryResult:
    """Commit the allowed uncommitted work of `repo`'s work tree onto its HEAD."""
    if repo.work_tree is None:
        raise RepoError(f"{repo.git_dir} has no work tree to recover: pass the task's worktree")
    head = git.resolve_commit(repo, "HEAD")  # first: git.run refuses a distrusted repo
    if head is None:
        raise RepoError(f"HEAD of {repo.work_tree} is not a commit: recovery needs the task's base commit")
    removed = _clear_stale_lock(repo)
    with tempfile.TemporaryDirectory(prefix="ccm-guard-recovery-") as tmp:
        index = Path(tmp, "index")
        _seed_index(repo, index, head)
        verdicts = {p: allowed(p) for p in git.changed_with_index(repo, index)}
        take = [p for p, ok in verdicts.items() if ok]
        refused = tuple(p for p, ok in verdicts.items() if not ok)
        if not take:
            return RecoveryResult(None, (), refused, "", removed)
        tree = git.stage_with_index(repo, index, take)
    if tree == git.tree_of(repo, head):
        return RecoveryResult(None, (), refused, "", removed)  # e.g. only a dirty submodule's insides
    text = with_trailer(message)
    new = git.commit_tree(repo, tree, [head], text, identity)
    git.update_ref(repo, "HEAD", new, head, message="ccm-guard: recovery commit", identity=identity)
    warning = _reset_index(repo, new)
    return RecoveryResult(new, tuple(take), refused, text, removed, warning)


def _clear_stale_lock(repo: git.Repo) -> Path | None:
    """Remove index.lock from a linked worktree's own admin dir, left by the agent's git.

    Only there: that directory belongs to this task alone, and its processes are gone.
    Any other index.lock (a main worktree's) may be a person's running git: refuse then,
    before anything moves, rather than commit and be unable to update the index.
    """
    lock = repo.git_dir / "index.lock"
    try:
        mode = os.lstat(lock).st_mode
    except FileNotFoundError:
        return None
    if repo.git_dir.parent != repo.common_dir / "worktrees":
        raise GitError(f"{lock} exists: another git may be running in {repo.work_tree}; "
                       "wait for it, or remove the file if none is")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        return None  # a planted directory: git's own error will name it
    lock.unlink()
    return lock


def _seed_index(repo: git.Repo, index: Path, head: str) -> None:
    # Start from the task's index for its stat cache (so unchanged files are not hashed
    # again), then make its content exactly HEAD: what the agent staged does not count,
    # only what is in the work tree does.
    try:
        shutil.copyfile(repo.git_dir / "index", index)
    except OSError:
        pass  # no index, or unreadable: read-tree builds one from HEAD
    try:
        git.index_from(repo, index, head)
    except GitError:
        index.unlink(missing_ok=True)  # a corrupt copy: start from nothing
        git.index_from(repo, index, head)


def _reset_index(repo: git.Repo, commit: str) -> str | None:
    """Make the task's index match the new commit; refused changes stay unstaged."""
    try:
        git.reset_index(repo, commit)
    except GitError as exc:
        return f"committed, but the worktree's index was not updated: {exc.message}"
    return None


def with_trailer(message: str | None) -> str:
    """`message` (or the default) ending with exactly one Recovery-Reason trailer.

    Done here rather than by `git interpret-trailers`, which reads trailer.* from the
    repository's config, where `trailer.<token>.cmd` runs a command the agent chose.
    Any Recovery-Reason or Ccm-Guard-* line the agent wrote is dropped, with its
    continuation lines, so the one ccm-guard adds is the only one (and the agent's text
    makes no claim in a commit recorded as ccm-guard's).
    """
    lines: list[str] = []
    dropping = False
    for line in (message or "").splitlines():
        if _OLD_TRAILER.match(line):
            dropping = True
            continue
        if dropping and line[:1] in (" ", "\t") and line.strip():
            continue  # a folded continuation of the dropped trailer
        dropping = False
        lines.append(line.rstrip())
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        lines = [DEFAULT_MESSAGE]
    last = _last_paragraph(lines)
    if len(lines) == len(last) or not all(_TRAILER_LINE.match(line) for line in last):
        lines.append("")  # the subject, or prose: the trailer needs its own paragraph
    return "\n".join([*lines, TRAILER]) + "\n"


def _last_paragraph(lines: list[str]) -> list[str]:
    for i in range(len(lines) - 1, -1, -1):
        if not lines[i]:
            return lines[i + 1:]
    return lines
