"""Snapshots of a task's worktree (refs/ccm-guard/snapshots/<task>/<n>) and rolling back:
the worktree to its base, a snapshot or one file, or an applied task's target (reset when
nothing landed since, else a revert commit)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ccm_guard import git, worktree
from ccm_guard.errors import (
    ApplyRefused,
    StateError,
    UsageError,
)
from ccm_guard.git import layout
from ccm_guard.state.pins import SNAPSHOT_PREFIX
from ccm_guard.state.registry import Registry, Task, in_flight
from ccm_guard.worktree import apply as applying
from ccm_guard.worktree.ops import _not_running, _work_head, require_git, task_repo


def snapshots(host: git.Repo, task_id: str) -> dict[int, str]:
    prefix = f"{SNAPSHOT_PREFIX}{task_id}/"
    found = git.refs_under(host, prefix)
    return {int(ref[len(prefix):]): oid for ref, oid in found.items() if ref[len(prefix):].isdigit()}


def take_snapshot(registry: Registry, task_id: str, why: str = "by hand") -> dict[str, Any]:
    """The worktree as it is now (commits and uncommitted work) under refs/ccm-guard/snapshots/<task>/<n>."""
    task = registry.get(task_id)
    require_git(task, "task snapshot")
    repo = task_repo(task)
    return _snapshot(registry, repo, task, why)


def record_snapshots(registry: Registry, task_id: str, made: dict[int, str]) -> None:
    """Which snapshot refs ccm-guard writes (number -> commit), on the task's row, before it
    writes them: a run at work meanwhile excuses exactly those new refs under
    refs/ccm-guard/, and no other."""
    if made:
        registry.merge_option(task_id, "snapshots", {str(n): sha for n, sha in made.items()})


def _snapshot(registry: Registry, repo: git.Repo, task: Task, why: str) -> dict[str, Any]:
    host = layout.host_repo(Path(task.repo))
    head = _work_head(task, repo, host)
    message = f"ccm-guard snapshot of task {task.id} ({why})\n\nCcm-Guard-Snapshot-Head: {head}\n"
    commit = git.archive_commit(repo, head, message, worktree.IDENTITY)
    if git.tree_of(host, commit) == git.tree_of(host, head):
        commit = head  # nothing uncommitted: the snapshot is the commit itself
    number = max(snapshots(host, task.id), default=0) + 1
    record_snapshots(registry, task.id, {number: commit})
    git.update_ref(host, f"{SNAPSHOT_PREFIX}{task.id}/{number}", commit, message=f"ccm-guard: snapshot ({why})")
    return {"task": task.id, "snapshot": number, "commit": commit, "head": head, "uncommitted": commit != head}


def auto_snapshots(registry: Registry, host: git.Repo, task: Task, head: str, every: int,
                   commits: list[tuple[str, str]] | None = None) -> dict[int, str]:
    """A snapshot at every `every`-th commit of the run (docs/design-notes.md#rollback-points), so a later rollback can
    go back part of the way. Commits already snapshotted are not taken twice. `commits`:
    base..head as the verdict listed them (oldest first), spared a second walk. Recorded
    on the task's row before any is written."""
    if every <= 0 or head == task.base:
        return {}
    taken = snapshots(host, task.id)
    have = set(taken.values())
    listed = commits if commits is not None else git.commits(host, task.base, head)
    due = [(index, sha) for index, (sha, _) in enumerate(listed, start=1) if index % every == 0 and sha not in have]
    made = {number: sha for number, (_, sha) in enumerate(due, start=max(taken, default=0) + 1)}
    record_snapshots(registry, task.id, made)
    for (number, sha), (index, _) in zip(made.items(), due):
        git.update_ref(host, f"{SNAPSHOT_PREFIX}{task.id}/{number}", sha,
                       message=f"ccm-guard: snapshot after commit {index}")
    return made


def _snapshot_parts(host: git.Repo, commit: str) -> tuple[str, str]:
    """(head, work) of a snapshot: a commit with uncommitted work names its head in a
    trailer, and that head is its parent. A snapshot ref can point at an agent's own
    commit, whose message may carry such a line too: naming anything but the commit's
    parent, it names nothing (and naming the parent, it changes nothing: the commit's
    whole tree comes back on top of it either way)."""
    parents, message = git.parents_and_message(host, commit)
    for line in message.split("\n"):
        if line.startswith("Ccm-Guard-Snapshot-Head: "):
            named = line.split(": ", 1)[1].strip()
            return (named, commit) if named in parents else (commit, commit)
    return commit, commit


def reconcile(registry: Registry, task: Task) -> str | None:
    """A rollback of an applied task killed between moving the target and recording it:
    finish the record (and bring the checkout along), or forget the attempt. None when
    there was nothing to do."""
    pending = task.option("rolled_back")
    if not pending or task.status != "APPLIED" or pending.get("remote") or in_flight(pending):
        return None
    host = layout.host_repo(Path(task.repo))
    old, new = pending["old"], pending["new"]
    tip = git.resolve_commit(host, pending["ref"])
    # A revert commit is on the target only if the rollback landed; a reset (new is an
    # ancestor of old) landed if the target no longer holds what it was reset from.
    landed = tip is not None and (tip == new or (git.is_ancestor(host, new, tip) and (
        not git.is_ancestor(host, new, old) or not git.is_ancestor(host, old, tip))))
    if not landed or tip is None:
        registry.set_option(task.id, "rolled_back", None)
        return "an interrupted rollback did not land; the apply stands"
    target = applying.Target(pending["ref"], None)
    checkout = applying.catch_up_checkout(host, task, target, old, new, tip)
    registry.move(task.id, "ROLLED_BACK")
    found = f"an interrupted rollback had landed on {target.name} as {new[:12]}; recorded it as ROLLED_BACK"
    return found + (f"; {checkout[1]}" if checkout else "")


def rollback(registry: Registry, task_id: str, to_snapshot: int | None = None, path: str | None = None) -> dict[str, Any]:
    task = registry.get(task_id)
    require_git(task, "task rollback")
    applying.reconcile(registry, task)
    repaired = reconcile(registry, registry.get(task_id))
    task = registry.get(task_id)
    if repaired and task.status == "ROLLED_BACK" and to_snapshot is None and path is None:
        return {"task": task.id, "repaired": repaired}
    if task.status == "APPLIED":
        if to_snapshot is not None or path is not None:
            raise UsageError(f"task {task.id} is applied: roll back the apply first (no --file/--to-snapshot)")
        return _rollback_apply(registry, task)
    if task.status in ("DISCARDED", "CLEANED_UP"):
        raise StateError(f"task {task.id} is {task.status}: `ccm-guard task restore {task.id}` first")
    _not_running(task)
    repo = task_repo(task)
    host = layout.host_repo(Path(task.repo))
    current = git.symbolic_head(repo)
    if current != f"refs/heads/{task.branch}":
        raise StateError(f"the worktree is on {current or 'a detached HEAD'}, not {task.branch}: "
                         f"check it out there (git -C {task.worktree} switch {task.branch}), then roll back")
    saved = _snapshot(registry, repo, task, "before rollback")  # nothing a rollback drops is lost
    if path is not None:
        kept = git.restore_path(repo, task.base, path)
        return {"task": task.id, "file": path, "to": "base" if kept else "removed (not in the base)",
                "saved_as_snapshot": saved["snapshot"]}
    if to_snapshot is not None:
        commit = snapshots(host, task.id).get(to_snapshot)
        if commit is None:
            raise UsageError(f"task {task.id} has no snapshot {to_snapshot}: `ccm-guard task show {task.id}` lists them")
        head, work = _snapshot_parts(host, commit)
    else:
        head, work = task.base, task.base
    git.reset_work_tree(repo, head, work)
    if task.status != "ROLLED_BACK":
        registry.move(task.id, "ROLLED_BACK")
    return {"task": task.id, "to": f"snapshot {to_snapshot}" if to_snapshot else "base", "head": head,
            "saved_as_snapshot": saved["snapshot"]}


def _rollback_apply(registry: Registry, task: Task) -> dict[str, Any]:
    """The target back to before the apply if nothing landed on it since, else a revert commit."""
    applied = task.option("applied") or {}
    host = layout.host_repo(Path(task.repo))
    target = applying.Target(applied["ref"], applied.get("remote"))
    old, new = applied["old"], applied["new"]
    if target.url:
        how = _revert_remote(host, task, target, old, new)
    else:
        how = _revert_local(registry, host, task, target, old, new)
    registry.move(task.id, "ROLLED_BACK")
    return {"task": task.id, "target": target.name, **how}


def _revert_commit(host: git.Repo, task: Task, tip: str, old: str, new: str) -> str:
    """A commit on `tip` that undoes old..new. merge-tree with a scratch commit (old's tree
    on top of new) as the other side makes `new` the merge base, so the result is tip
    minus the apply's change, with later work kept (git 2.39 has no --merge-base)."""
    scratch = git.commit_tree(host, git.tree_of(host, old), [new], "ccm-guard: revert scratch\n", worktree.IDENTITY)
    merged = git.merge_tree(host, tip, scratch)
    if merged.tree is None:
        listing = "; ".join(f"{p} ({why})" for p, why in sorted(merged.conflicts.items()))
        raise ApplyRefused(f"reverting task {task.id} conflicts with later work, nothing was changed: {listing}")
    message = (f"Revert ccm-guard task {task.id}\n\nThis undoes {old[:12]}..{new[:12]}.\n\n"
               f"Ccm-Guard-Task: {task.id}\nCcm-Guard-Revert: {new}\n")
    return git.commit_tree(host, merged.tree, [tip], message, worktree.IDENTITY)


def _revert_local(registry: Registry, host: git.Repo, task: Task, target: applying.Target, old: str,
                  new: str) -> dict[str, Any]:
    for _ in range(applying.MAX_ATTEMPTS):
        tip = git.branch_tip(host, target.ref)
        if tip is None:
            raise StateError(f"branch {target.name} is gone: nothing to roll back")
        if not git.is_ancestor(host, new, tip):
            raise StateError(f"{target.name} no longer contains the apply ({new[:12]}): it was already undone")
        result = old if tip == new else _revert_commit(host, task, tip, old, new)
        move = {"ref": target.ref, "old": tip, "new": result, "pid": os.getpid()}
        moved, _ = applying.move_target(host, task, target, tip, result, f"ccm-guard: roll back task {task.id}",
                                        registry=registry, intent=move, label="rollback")
        if not moved:
            continue
        how = "reset (nothing had landed since)" if result == old else "revert commit (later work kept)"
        return {"how": how, "from": tip, "to": result}
    raise ApplyRefused(f"{target.name} kept moving: try the rollback again")


def _revert_remote(host: git.Repo, task: Task, target: applying.Target, old: str, new: str) -> dict[str, Any]:
    # A remote is never force-pushed: always a revert commit on its tip.
    assert target.url is not None
    branch = target.ref.removeprefix("refs/heads/")
    tracking = f"refs/ccm-guard/push/{task.id}"
    for attempt in range(1, applying.PUSH_RETRIES + 1):
        tip = git.fetch_ref(host, target.url, branch, tracking)
        if tip is None or not git.is_ancestor(host, new, tip):
            raise StateError(f"{target.name} no longer contains the apply ({new[:12]})")
        result = _revert_commit(host, task, tip, old, new)
        if git.push_ref(host, target.url, result, branch) is None:
            return {"how": "revert commit pushed", "from": tip, "to": result}
        time.sleep(0.02 * attempt)
    raise ApplyRefused(f"{target.name} kept moving: try the rollback again")
