"""What happens to a task after its run: discard, restore, rollback, snapshot, diff.

Every operation that drops work first saves it as a commit under refs/ccm-guard/
(an archive or a snapshot), so none of them loses anything. None of them runs git on a
worktree whose config the agent made unsafe (it could run code on the host).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ccm_guard import failpoints, git, worktree
from ccm_guard.errors import (
    GuardError,
    StateError,
    UntrustedRepoError,
    UsageError,
)
from ccm_guard.git import config as configfile
from ccm_guard.git import layout
from ccm_guard.prevent import arm as prevention
from ccm_guard.state.home import admin_lock
from ccm_guard.state.pins import ARCHIVE_PREFIX, Pins
from ccm_guard.state.registry import COPIED_DIRECTORY, Registry, Task
from ccm_guard.worktree import apply as applying


def require_git(task: Task, command: str) -> None:
    """Refuse, saying what to do instead, a git-only command on a task that ran in a
    copied directory (no repository: no branch, no commits, no snapshots)."""
    if task.strategy == COPIED_DIRECTORY:
        raise UsageError(f"task {task.id} ran in a copied directory, which has no git: `ccm-guard {command}` needs "
                         f"a repository; compare by hand with `diff -ru {task.main_worktree} {task.worktree}`, "
                         f"and `ccm-guard task apply {task.id}` or `task discard {task.id}` what it did")


def pins_of(task: Task) -> Pins:
    return Pins(Path(task.worktree), Path(task.admin_dir), Path(task.repo), task.branch)


def task_repo(task: Task) -> git.Repo:
    """The task's worktree for git, refused if its metadata now runs code (agent-writable)."""
    pins = pins_of(task)
    if not pins.worktree.is_dir() or not pins.admin_dir.is_dir():
        raise StateError(f"task {task.id}'s worktree {task.worktree} is gone ({task.status}): "
                         f"`ccm-guard task restore {task.id}` brings an archived task back")
    reason = configfile.unsafe_to_run(pins.common_dir / "config", pins.admin_dir / "config.worktree")
    if reason:
        raise UntrustedRepoError(f"refusing to run git in {task.worktree}: {reason}; inspect it by hand")
    return git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)


def _not_running(task: Task) -> None:
    if task.running:
        raise StateError(f"task {task.id} is still running (pid {task.pid}): stop its ccm-guard first")
    worktree.not_in_use(task)


def _work_head(task: Task, repo: git.Repo | None, host: git.Repo) -> str:
    """The commit the task's work sits on: its worktree's HEAD, else its branch, else its base."""
    if repo is not None:
        head = git.resolve_commit(repo, "HEAD")
        if head:
            return head
    return git.resolve_commit(host, f"refs/heads/{task.branch}") or task.base


# --- discard and restore ---------------------------------------------------------------------


def discard(registry: Registry, task_id: str) -> dict[str, Any]:
    """Archive all work (committed and not), then remove worktree and branch."""
    task = registry.get(task_id)
    if task.status in ("DISCARDED", "CLEANED_UP"):
        raise StateError(f"task {task.id} is already {task.status}" + _archive_hint(task))
    _not_running(task)
    applying.reconcile(registry, task)
    task = registry.get(task_id)
    host = layout.host_repo(Path(task.repo))
    pins = pins_of(task)
    present = pins.worktree.is_dir() and pins.admin_dir.is_dir()
    repo = task_repo(task) if present else None
    head = _work_head(task, repo, host)
    earlier = task.option("archive") or {}
    if repo is None and earlier.get("head") and not git.ref_exists(host, f"refs/heads/{task.branch}"):
        # A discard killed after removing worktree and branch: the head it recorded is the
        # work's, not the base this lookup falls back to (restore makes the branch there).
        head = earlier["head"]
    if repo is not None:
        archive = worktree.archive(repo, host, task.id, task.base, head)
    elif head != task.base or git.ref_exists(host, ARCHIVE_PREFIX + task.id):
        # No worktree (a discard killed after removing it): the archive it made stays.
        archive = worktree.keep_archive(host, task.id, head)
    else:
        archive = None
    registry.set_option(task.id, "archive", {"ref": archive, "head": head, "status": task.status,
                                             "commit": git.resolve_commit(host, archive) if archive else None})
    failpoints.point("discard-after-archive")
    if present:
        with contextlib.suppress(GuardError, OSError):
            prevention.disarm(pins)
        # A pooled worktree whose task passed goes back to the pool (it checks that); the
        # archive above already holds everything the reset there throws away.
        returned = worktree.remove(host, pins, head, reuse=True)
        failpoints.point("discard-after-remove")
    else:
        returned = False
        _drop_branch(host, pins, head)
        _drop_admin_entry(pins)
    registry.move(task.id, "CLEANED_UP" if task.status == "APPLIED" else "DISCARDED")
    return {"task": task.id, "archive": archive, "head": head, "removed": str(pins.worktree) if present else None,
            "to_pool": returned,
            "restore": f"ccm-guard task restore {task.id}" if archive else None}


def _drop_admin_entry(pins: Pins) -> None:
    """Only this task's admin entry: `git worktree prune` would also drop other vanished
    worktrees' entries, with whatever detached commit or staged work they still hold."""
    gitdir = pins.admin_dir / "gitdir"
    with contextlib.suppress(OSError):
        if Path(gitdir.read_text().strip()).parent == pins.worktree:
            with admin_lock(pins.common_dir):
                shutil.rmtree(pins.admin_dir)


def _drop_branch(host: git.Repo, pins: Pins, head: str) -> None:
    if git.resolve_commit(host, pins.branch_ref) == head:
        git.delete_ref(host, pins.branch_ref, head)


def _archive_hint(task: Task) -> str:
    archive = (task.option("archive") or {}).get("ref")
    return f"; its work is archived at {archive}: `ccm-guard task restore {task.id}`" if archive else ""


def restore(registry: Registry, task_id: str) -> dict[str, Any]:
    """Bring a discarded task back: worktree and branch as they were, uncommitted work uncommitted."""
    task = registry.get(task_id)
    if task.status not in ("DISCARDED", "CLEANED_UP"):
        raise StateError(f"task {task.id} is {task.status}, not discarded: there is nothing to restore")
    host = layout.host_repo(Path(task.repo))
    saved = task.option("archive") or {}
    ref = saved.get("ref") or ARCHIVE_PREFIX + task.id
    work = git.resolve_commit(host, ref)
    if work is None:
        raise StateError(f"task {task.id} has no archive ({ref} does not exist): its work was empty or removed by gc")
    head = saved.get("head") or work
    status = saved.get("status") or "ERRORED"
    status = "ERRORED" if status in ("PENDING", "CREATED", "ACTIVE") else status  # it was killed mid-run
    registry.check_move(task.id, status)
    if not _half_restored(host, task, head):  # a restore killed half-way is simply finished
        if git.ref_exists(host, f"refs/heads/{task.branch}"):
            raise StateError(f"branch {task.branch} exists again: rename or delete it, then restore")
        if os.path.lexists(task.worktree):
            raise StateError(f"{task.worktree} exists: move it away, then restore")
        Path(task.worktree).parent.mkdir(parents=True, exist_ok=True)
        with admin_lock(Path(task.repo)):
            git.worktree_add(host, Path(task.worktree), task.branch, head)
        failpoints.point("restore-after-worktree-add")
    admin = layout.admin_dir_of(Path(task.worktree), Path(task.repo))
    repo = git.Repo(admin, Path(task.repo), Path(task.worktree))
    git.reset_work_tree(repo, head, work)
    registry.update(task.id, admin_dir=str(admin))
    registry.set_option(task.id, "restored", {"at": time.time(), "head": head})  # audit's baseline knows
    registry.move(task.id, status)
    return {"task": task.id, "worktree": task.worktree, "branch": task.branch, "head": head,
            "uncommitted_work": work != head}


def _half_restored(host: git.Repo, task: Task, head: str) -> bool:
    """The task's worktree is back on its branch at the archived head, registered with git:
    what an earlier restore of it did before it was killed. Finishing that restore
    rewrites the work tree from the archive, which is what it was about to hold."""
    if not os.path.isdir(task.worktree) or git.resolve_commit(host, f"refs/heads/{task.branch}") != head:
        return False
    where = os.path.realpath(task.worktree)
    return any(os.path.realpath(e.path) == where and e.branch == f"refs/heads/{task.branch}"
               for e in git.worktree_list(host))


# --- snapshots ---------------------------------------------------------------------------------


# --- rollback ------------------------------------------------------------------------------


# --- diff ----------------------------------------------------------------------------------


def diff(registry: Registry, task_id: str, other_id: str | None = None) -> str:
    """The task's change against its base as git shows it, uncommitted work included; with
    `other_id`, from that task's work to this one's (two forks of one group)."""
    task = registry.get(task_id)
    require_git(task, "task diff")
    host = layout.host_repo(Path(task.repo))
    if other_id is None:
        return git.diff_text(host, task.base, _work(task, host))
    other = registry.get(other_id)
    require_git(other, "task diff")
    if other.repo != task.repo:
        raise UsageError(f"tasks {task_id} and {other_id} are of different repositories: nothing to compare")
    return git.diff_text(host, _work(other, host), _work(task, host))


def _work(task: Task, host: git.Repo) -> str:
    """A commit of all of the task's work: its worktree's (uncommitted included), or its archive."""
    if pins_of(task).worktree.is_dir():
        repo = task_repo(task)
        return git.archive_commit(repo, _work_head(task, repo, host), "ccm-guard diff\n", worktree.IDENTITY)
    archive = (task.option("archive") or {}).get("ref")
    return (git.resolve_commit(host, archive) if archive else None) or _work_head(task, None, host)


