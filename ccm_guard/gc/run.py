"""`ccm-guard gc --yes`: doing the safe actions `gc.plan` found.

The plan may be minutes old and another ccm-guard may have moved on since: each runner
looks again (the task's status, the branch's tip, the lock, who names the directory)
and refuses with a one-line reason when the thing changed. Every removal goes through
keep.py, which refuses to drop work no surviving ref keeps; `keep` archives it first.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from ccm_guard import failpoints, git
from ccm_guard.errors import GuardError, StateError
from ccm_guard.gc.action import (
    TASK_BRANCHES,
    Action,
    branch_refs,
    final_status,
    live_entry,
    orphan_branch_of,
    running,
    to_audit,
)
from ccm_guard.gc.keep import (
    Work,
    admin_work,
    delete_branch,
    keep,
    prune_entries,
    remove_admin_entry,
    remove_unmade,
    remove_worktree,
    worktree_work,
)
from ccm_guard.gc.linked import (
    admin_entries,
    entry_at,
    identify,
    lock_owner,
    same,
    trusted,
)
from ccm_guard.git import layout
from ccm_guard.state import trash
from ccm_guard.state.home import admin_lock, home
from ccm_guard.state.pins import ARCHIVE_PREFIX
from ccm_guard.state.registry import RUNNING, Registry, Task, pid_alive


def execute(actions: list[Action], registry: Registry) -> None:
    """Do every safe action, in order; one that fails stops only itself (its error says why)."""
    runners = {"dead-lock": _run_unlock, "interrupted-apply": _run_reconcile, "abandoned-run": _run_task,
               "orphan-row": _run_task, "stale-task": _run_task, "orphan-dir": _run_dir,
               "orphan-branch": _run_branch, "prune": _run_prune, "expired-archive": _run_expiry,
               "expired-row": _run_forget}
    for action in actions:
        if not action.safe:
            continue
        try:
            runners[action.kind](action, registry)
        except GuardError as exc:
            action.error = exc.message
        except OSError as exc:
            action.error = f"{exc.filename or action.subject}: {exc.strerror}"


def _run_unlock(action: Action, registry: Registry) -> None:
    host = layout.host_repo(Path(action.repo))
    entry = entry_at(admin_entries(host.common_dir), Path(action.subject))
    owner = lock_owner(entry.locked) if entry else None
    if owner is None or pid_alive(owner[0]):
        raise StateError(f"{action.subject} is no longer locked by a dead ccm-guard: left as it is")
    with admin_lock(host.common_dir):
        git.worktree_unlock(host, Path(action.subject))
    action.done.append("unlocked")


def _run_reconcile(action: Action, registry: Registry) -> None:
    # apply's machinery is heavy and only this action needs it
    from ccm_guard.worktree import apply as applying
    from ccm_guard.worktree import rollback

    found = applying.reconcile(registry, registry.get(action.subject))
    found = found or rollback.reconcile(registry, registry.get(action.subject))
    action.done.append(found or "nothing to finish")


def _run_task(action: Action, registry: Registry) -> None:
    t = registry.get(action.subject)
    if t.status != action.status or running(t):
        raise StateError(f"task {t.id} is now {t.status}{' and running' if t.status in RUNNING else ''} "
                         f"(it was {action.status} when gc looked): run gc again")
    if to_audit(t):
        registry.move(t.id, "ERRORED")
        action.done.append(f"marked ERRORED; worktree kept: `ccm-guard audit {t.id}` judges it")
        return
    common = Path(t.repo)
    host = layout.host_repo(common)
    wt, ref = Path(t.worktree), f"refs/heads/{t.branch}"
    entry = entry_at(admin_entries(common), wt)
    if entry and entry.locked is not None and t.status != "PENDING":
        raise StateError(f"{wt} is locked ({entry.locked or 'no reason given'}): left as it is")
    keepers: list[tuple[str, Work]] = []
    if t.status == "PENDING" and os.path.lexists(wt):
        remove_unmade(host, wt, t.base)
        action.done.append(f"removed the half-made {wt}")
    elif os.path.lexists(wt):
        repo = trusted(t, common, live_entry(entry, wt).admin, wt)
        keepers.append(_drop_worktree(host, repo, t.id, (ref,), action.done))
    elif entry:
        work = admin_work(common, entry.admin)
        keepers.append((keep(host, t.id, work, (ref,), None, action.done), work))
        remove_admin_entry(host, entry, (ref,))
        action.done.append(f"removed {entry.admin}")
    tip = git.resolve_commit(host, ref)
    if tip:
        keepers.append(_drop_branch(host, t.id, ref, tip, action.done))
    with contextlib.suppress(OSError):
        wt.parent.rmdir()
    _record(registry, t, keepers, host)
    archived = any(k.startswith(ARCHIVE_PREFIX) for k, _ in keepers)
    if t.status in ("PENDING", "CREATED") and not archived:
        # Its agent never ran and nothing needed keeping: as if it had never been created
        # (worktree.abandon does the same), so the id can be used again.
        registry.delete(t.id)
        action.done.append("forgot the task (nothing of it needed keeping)")
        return
    action.done.append(f"marked {_settle(registry, t, archived)}")


def _drop_worktree(host: git.Repo, repo: git.Repo, name: str, dropping: tuple[str, ...],
                   done: list[str]) -> tuple[str, Work]:
    """Keep (archive if need be), then remove a worktree; the keeping ref and what it keeps."""
    work = worktree_work(repo)
    kept_in = keep(host, name, work, dropping, repo, done)
    failpoints.point("gc-after-archive")
    remove_worktree(host, repo, dropping)
    done.append(f"removed the worktree {repo.work_tree}")
    return kept_in, work


def _drop_branch(host: git.Repo, name: str, ref: str, tip: str, done: list[str]) -> tuple[str, Work]:
    """Keep (archive if need be), then delete a branch still at `tip`."""
    work = Work(tip)
    kept_in = keep(host, name, work, (ref,), None, done)
    delete_branch(host, ref, tip)
    done.append(f"deleted branch {ref.removeprefix('refs/heads/')}")
    return kept_in, work


def _record(registry: Registry, t: Task, keepers: list[tuple[str, Work]], host: git.Repo) -> None:
    """Note the archive that keeps the task's work where `task restore` looks for it."""
    for kept_in, work in keepers:
        if kept_in == ARCHIVE_PREFIX + t.id:
            registry.set_option(t.id, "archive", {"ref": kept_in, "head": work.tip, "status": t.status,
                                                  "commit": git.resolve_commit(host, kept_in)})
            return


def _settle(registry: Registry, t: Task, archived: bool) -> str:
    current = registry.get(t.id).status
    status = final_status(current, archived)
    if status is None:
        registry.update(t.id)  # stays; an archive's retention counts from now
        return current
    registry.move(t.id, status)
    return status


def _run_dir(action: Action, registry: Registry) -> None:
    path = Path(action.subject)
    if any(same(t.worktree, path) for t in registry.list(live_only=False)):
        raise StateError(f"a task now names {path}: left as it is")
    pinned = identify(path)
    if pinned is None:
        path.rmdir()  # planned only when empty; rmdir refuses anything else
        action.done.append(f"removed the empty directory {path}")
        return
    common, admin = pinned
    host = layout.host_repo(common)
    entry = next((e for e in admin_entries(common) if e.admin == admin), None)
    if entry is None or entry.locked is not None:
        raise StateError(f"{path} is locked or has no admin entry any more: left as it is")
    branch = orphan_branch_of(entry, branch_refs(registry.list(repo=str(common), live_only=False)))
    _drop_worktree(host, trusted(None, common, admin, path), path.name, (branch,) if branch else (), action.done)
    tip = git.resolve_commit(host, branch) if branch else None
    if branch and tip:
        _drop_branch(host, path.name, branch, tip, action.done)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def _run_branch(action: Action, registry: Registry) -> None:
    host = layout.host_repo(Path(action.repo))
    tip = git.resolve_commit(host, action.subject)
    if tip is None or tip != action.commit:
        raise StateError(f"{action.subject} moved since gc looked: left as it is; run gc again")
    if action.subject in branch_refs(registry.list(repo=action.repo, live_only=False)):
        raise StateError(f"a task now uses {action.subject}: left as it is")
    _drop_branch(host, action.subject.removeprefix(TASK_BRANCHES), action.subject, tip, action.done)


def _run_prune(action: Action, registry: Registry) -> None:
    common = Path(action.repo)
    host = layout.host_repo(common)
    owners = {os.path.realpath(t.worktree): t for t in registry.list(repo=action.repo, live_only=False)}
    busy = set()
    for e in admin_entries(common):
        if not (e.vanished and e.locked is None):
            continue
        owner = owners.get(os.path.realpath(e.path)) if e.path else None
        if owner and running(owner):
            busy.add(e.admin)
            continue
        keep(host, owner.id if owner else e.admin.name, admin_work(common, e.admin), (), None, action.done)
    pruned = prune_entries(host, busy)
    action.done.append("pruned " + (", ".join(Path(p).name for p in pruned) or "nothing (already gone)"))


def _made_for(task_id: str, path: Path) -> bool:
    """`path` is the task's logs (home/logs/<repo>/<task>) or its copied directory's
    archive (home/archive/copies/<repo>/<task>[-<when>])."""
    if not path.is_absolute() or os.path.normpath(path) != str(path) or os.path.islink(path):
        return False
    real = Path(os.path.realpath(path))
    logs, copies = (Path(os.path.realpath(home() / sub)) for sub in ("logs", "archive/copies"))
    if real.parent.parent == logs:
        return real.name == task_id
    # copyapply names a second archive of the same task <task>-<date>-<time>-<4 hex>.
    return real.parent.parent == copies and re.fullmatch(re.escape(task_id) + r"(-\d{8}-\d{6}-[0-9a-f]{4})?",
                                                          real.name) is not None


def _run_expiry(action: Action, registry: Registry) -> None:
    t = registry.get(action.task or "")
    host = layout.host_repo(Path(action.repo)) if action.commit or action.refs else None
    planned = {action.subject: action.commit, **action.refs} if action.commit else dict(action.refs)
    if t.status != action.status or (host and any(git.resolve_commit(host, r) != v for r, v in planned.items())):
        raise StateError(f"{action.subject} or its task changed since gc looked: left as it is; run gc again")
    # Only the places ccm-guard makes for this task: a row naming another place is not trusted.
    foreign = [p for p in action.paths if not _made_for(t.id, Path(p))]
    if foreign:
        raise StateError(f"{foreign[0]} is not a place ccm-guard made for task {t.id}: nothing of it was removed")
    for path in action.paths:  # first: a directory that cannot be moved leaves the refs, and a retry
        trash.discard(Path(path))
        action.done.append(f"removed {path}")
    for ref, value in planned.items():
        assert host is not None and value is not None
        git.delete_ref(host, ref, value)
        action.done.append(f"deleted {ref}")
    if t.status == "DISCARDED":
        registry.move(t.id, "CLEANED_UP")
        action.done.append("marked CLEANED_UP")
    registry.set_option(t.id, "expired_at", time.time())  # its row goes one retention later


def _run_forget(action: Action, registry: Registry) -> None:
    t = registry.get(action.task or "")
    if t.status != action.status:
        raise StateError(f"task {t.id} changed since gc looked: left as it is; run gc again")
    registry.delete(t.id)
    action.done.append("forgot the row")
