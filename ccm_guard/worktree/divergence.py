"""What an apply would do now: how far the task and its target have moved apart since the
base, and the paths that would conflict."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from ccm_guard import git, worktree
from ccm_guard.errors import GuardError, UsageError
from ccm_guard.git import layout
from ccm_guard.state.registry import Registry, Task
from ccm_guard.worktree import apply as applying
from ccm_guard.worktree.apply import resolve_target
from ccm_guard.worktree.rollback import reconcile as reconcile_rollback
from ccm_guard.worktree.rollback import snapshots


@dataclasses.dataclass(frozen=True)
class Divergence:
    """How a task and its target have moved apart since the task began."""

    target: str
    task_commits: int  # base..head
    target_commits: int  # base..target: how far the target moved since the task began
    conflicts: dict[str, str]  # what `apply` would report (empty: it applies cleanly)
    applied: bool  # the task's commits are already in the target

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def divergence(task: Task, into: str | None = None) -> Divergence | None:
    """How far the task and its target have each moved since the base; objects only."""
    host = layout.host_repo(Path(task.repo))
    head = git.resolve_commit(host, f"refs/heads/{task.branch}")
    try:
        target = resolve_target(host, task, into)
    except UsageError:
        return None
    tip = git.resolve_commit(host, target.ref) if not target.url else None
    if head is None or tip is None:
        return None
    applied = git.is_ancestor(host, head, tip)
    conflicts = {} if applied or git.is_ancestor(host, tip, head) else git.merge_tree(host, tip, head).conflicts
    return Divergence(target.name, git.count_commits(host, task.base, head), git.count_commits(host, task.base, tip),
                      conflicts, applied)


def describe(registry: Registry, task: Task) -> dict[str, Any]:
    """What `task show` adds to the row: divergence, snapshots, archive, crash repairs."""
    info: dict[str, Any] = {}
    repaired = applying.reconcile(registry, task) or reconcile_rollback(registry, task)
    if repaired:
        info["repaired"] = repaired
    host = layout.host_repo(Path(task.repo))
    with contextlib.suppress(GuardError):
        div = divergence(registry.get(task.id))
        if div is not None:
            info["divergence"] = div.to_json()
    with contextlib.suppress(GuardError):
        info["snapshots"] = {str(n): sha for n, sha in sorted(snapshots(host, task.id).items())}
    info["worktree_present"] = Path(task.worktree).is_dir()
    alive = worktree.in_use(task)
    if alive:  # an agent that outlived its ccm-guard, or the person's shell or editor
        info["processes"] = [p.describe() for p in alive]
    return info
