"""gc's orphans: what no task row names (worktree directories, task branches, git admin
entries whose directory vanished), planned as `Action`s like everything else gc does.
"""

from __future__ import annotations

import os
from pathlib import Path

from ccm_guard import git
from ccm_guard.errors import GuardError, StateError
from ccm_guard.gc.action import (
    TASK_BRANCHES,
    Action,
    Forecast,
    admin_steps,
    branch_refs,
    branch_step,
    orphan_branch_of,
    running,
    worktree_steps,
)
from ccm_guard.gc.linked import AdminEntry, head_ref, identify, trusted
from ccm_guard.state.home import home, key_hash
from ccm_guard.state.registry import Task


def unknown_dirs(rows: list[Task], only: Path | None) -> dict[Path | None, list[Path]]:
    """Directories under $CCM_GUARD_HOME/worktrees that no task row names, by repository."""
    known = {os.path.realpath(t.worktree) for t in rows}
    suffix = "-" + key_hash(only) if only else None
    found: dict[Path | None, list[Path]] = {}
    for path in sorted((home() / "worktrees").glob("*/*")):
        if os.path.realpath(path) in known or (suffix and not path.parent.name.endswith(suffix)):
            continue
        pinned = identify(path)
        common = pinned[0] if pinned else (only if suffix else None)
        found.setdefault(common, []).append(path)
    return found


def plan_dir(host: git.Repo, path: Path, entries: list[AdminEntry], held: dict[Path, str],
              claimed: set[str]) -> Action:
    action = Action("orphan-dir", str(host.common_dir), str(path), "no task row names this worktree", True, [])
    pinned = identify(path)
    if pinned is None:
        return plan_foreign_dir(path, str(host.common_dir))
    entry = next((e for e in entries if e.admin == pinned[1]), None)
    try:
        if entry is None or entry.admin in held:
            raise StateError(held.get(pinned[1], "git has no admin entry for it"))
        branch = orphan_branch_of(entry, claimed)
        repo = trusted(None, host.common_dir, entry.admin, path)
        action.steps = worktree_steps(host, repo, path.name, (branch,) if branch else (), Forecast())
        if branch:
            action.steps.append(f"delete branch {branch.removeprefix('refs/heads/')} (no task uses it)")
    except GuardError as exc:
        action.safe, action.reason = False, f"{action.reason}; left alone: {exc.message}"
    return action


def plan_foreign_dir(path: Path, repo: str = "") -> Action:
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return Action("orphan-dir", repo, str(path), "an empty directory no task row names", True,
                      [f"remove the empty directory {path}"])
    return Action("orphan-dir", repo, str(path), "no task row names it, and it is no worktree ccm-guard can "
                  "trace to its repository, so gc cannot archive it: look inside, then remove it by hand", False, [])


def plan_branches(host: git.Repo, rows: list[Task], entries: list[AdminEntry],
                   branches: dict[str, str]) -> list[Action]:
    """ccm/* branches (`branches`: ref -> tip) that no task row names and no worktree has checked out."""
    used = branch_refs(rows) | {e.head_ref for e in entries if e.head_ref}
    used.add(head_ref(host.common_dir / "HEAD") or "")
    actions = []
    for ref, tip in sorted(branches.items()):
        if ref in used:
            continue
        name = ref.removeprefix(TASK_BRANCHES)
        action = Action("orphan-branch", str(host.common_dir), ref, "no task and no worktree uses it", True, [],
                        commit=tip)
        try:
            action.steps = [branch_step(host, ref, tip, name, Forecast())]
        except GuardError as exc:
            action.safe, action.reason = False, f"{action.reason}; left alone: {exc.message}"
        actions.append(action)
    return actions


def plan_prune(host: git.Repo, rows: list[Task], entries: list[AdminEntry], held: dict[Path, str],
                tasked: set[str]) -> list[Action]:
    """Admin entries whose directory vanished (not the ones a task action removes itself)."""
    mine = {os.path.realpath(t.worktree): t for t in rows}
    busy = {os.path.realpath(t.worktree): t.id for t in rows if running(t)}
    doomed = [e for e in entries if e.vanished and e.admin not in held]
    listed = [e for e in doomed if not (e.path and getattr(mine.get(os.path.realpath(e.path)), "id", None) in tasked)]
    if not listed:
        return []
    action = Action("prune", str(host.common_dir), str(host.common_dir / "worktrees"),
                    "git admin entries whose worktree directory is gone", True, [])
    try:
        for e in doomed:
            if e.path and os.path.realpath(e.path) in busy:
                raise StateError(f"{e.admin} belongs to running task {busy[os.path.realpath(e.path)]} "
                                 "and `git worktree prune` would drop it too; run gc when it ends")
        for e in listed:
            owner = mine.get(os.path.realpath(e.path)) if e.path else None
            action.steps += admin_steps(host, e, owner.id if owner else e.admin.name, (), Forecast())[:-1]
        action.steps.append("git worktree prune (" + ", ".join(e.admin.name for e in listed) + ")")
    except GuardError as exc:
        action.safe, action.reason = False, f"{action.reason}; left alone: {exc.message}"
    return [action]
