"""`ccm-guard gc`: stale tasks, orphans in every direction, dead locks, expired archives.

`plan` (here) only looks, and returns what it would do as data (a list of `Action`s);
`execute` (run.py) does the safe ones, each checked again against the state it finds.
One rule holds over all of it: nothing is removed whose work no surviving ref keeps
(keep.py, where every removal lives). So a stale worktree is never just removed: it is
archived, then removed.

    __init__.py   options, plan: what is stale, locked or expired
    orphans.py    plan, continued: what no task row names
    action.py     Action, the task-status rules, the dry run's forecast of the steps
    run.py        execute: each action re-checked, then done
    keep.py       the invariant, archives, and every removal
    linked.py     git's admin entries, trust in a worktree, ccm-guard's locks
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

from ccm_guard import git, worktree
from ccm_guard.errors import GuardError, UsageError
from ccm_guard.gc.action import (
    GONE,
    TASK_BRANCHES,
    Action,
    branch_refs,
    running,
    task_steps,
    to_audit,
)
from ccm_guard.gc.linked import (
    AdminEntry,
    admin_entries,
    entry_at,
    lock_owner,
    lock_reason,
)
from ccm_guard.gc.orphans import (
    plan_branches,
    plan_dir,
    plan_foreign_dir,
    plan_prune,
    unknown_dirs,
)
from ccm_guard.gc.run import execute
from ccm_guard.git import layout
from ccm_guard.state.pins import ARCHIVE_PREFIX, SNAPSHOT_PREFIX
from ccm_guard.state.registry import (
    COPIED_DIRECTORY,
    RUNNING,
    Registry,
    Task,
    pid_alive,
)
from ccm_guard.text import human_age

__all__ = ["Action", "Options", "options", "parse_age", "human_age", "plan", "execute", "lock_reason", "lock_owner"]

FINISHED = ("COMMITTED", "APPLIED", "ERRORED", "ROLLED_BACK", "BLOCKED", "DISCARDED", "CLEANED_UP")
# A row changed this recently may be in the middle of another ccm-guard's discard or
# apply (worktree removed, branch not yet): gc repairs it only once it has been still.
GRACE = 600.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclasses.dataclass(frozen=True)
class Options:
    """What gc removes: age thresholds, and optionally one repository only."""

    older_than: float = 7 * 86400.0
    archive_days: float = 30.0
    repo: Path | None = None  # a common dir: only this repository
    now: float = dataclasses.field(default_factory=time.time)


def options(older_than: str, archive_days: float, repo: Path | None) -> Options:
    """Checked before anything else is opened: bad input changes nothing."""
    common = git.discover(repo).common_dir if repo else None
    return Options(parse_age(older_than), archive_days, common)


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '45s', '2w' or '0' as seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not found or (not found.group(2) and float(found.group(1)) != 0):
        raise UsageError(f"--older-than {text!r} is not an age: give a number and a unit (s, m, h, d, w), e.g. 7d")
    return float(found.group(1)) * _UNITS.get(found.group(2) or "s", 1)


def plan(registry: Registry, opts: Options) -> list[Action]:
    """Everything gc would do, and what it leaves alone and why. Changes nothing."""
    every = registry.list(live_only=False)
    rows = [t for t in every if t.strategy != COPIED_DIRECTORY]
    only = opts.repo
    dirs = unknown_dirs(rows, only)
    repos = [only] if only else sorted({Path(t.repo) for t in rows} | {c for c in dirs if c})
    actions: list[Action] = []
    for common in repos:
        actions += _plan_repo(common, [t for t in rows if Path(t.repo) == common], dirs.get(common, []), opts)
    for path in dirs.get(None, []):
        actions.append(plan_foreign_dir(path))
    copies = [t for t in every if t.strategy == COPIED_DIRECTORY and (not only or Path(t.repo) == only)]
    actions += [a for t in copies for a in [_plan_expiry(None, t, {}, opts)] if a]
    return actions


def _plan_repo(common: Path, rows: list[Task], dirs: list[Path], opts: Options) -> list[Action]:
    if not (common / "HEAD").is_file():
        left = [t.id for t in rows if t.status not in GONE]
        return [Action("repo-gone", str(common), str(common), f"the repository is gone; rows of {', '.join(left)} "
                       "are kept (their worktrees may hold the only copy of the work)", False, [])] if left else []
    host = layout.host_repo(common)
    entries = admin_entries(common)
    unmade = {os.path.realpath(t.worktree) for t in rows if t.status == "PENDING" and t.abandoned}
    actions, held = _plan_locks(common, entries, unmade)
    # Every task branch and archive in two git calls, not two per row (rows pile up for years).
    branches = git.refs_under(host, TASK_BRANCHES)
    refs = {**branches, **git.refs_under(host, ARCHIVE_PREFIX), **git.refs_under(host, SNAPSHOT_PREFIX)}
    # A fork group is one: nothing of it goes while any of its forks still runs.
    busy = {t.option("group") for t in rows if t.status in RUNNING and running(t) and t.option("group")}
    actions += [a for t in rows if t.option("group") not in busy or not t.option("group")
                for a in [_plan_task(host, t, entries, held, refs, opts)] if a]
    tasked = {t.id for t in rows} & {a.task for a in actions if a.task}
    claimed = branch_refs(rows)
    actions += [plan_dir(host, path, entries, held, claimed) for path in dirs]
    actions += plan_branches(host, rows, entries, branches)
    actions += plan_prune(host, rows, entries, held, tasked)
    actions += [a for t in rows if t.id not in tasked for a in [_plan_expiry(host, t, refs, opts)] if a]
    return actions


def _plan_locks(common: Path, entries: list[AdminEntry], unmade: set[str]) -> tuple[list[Action], dict[Path, str]]:
    """Unlock what dead ccm-guard processes locked; say who holds the other locks."""
    actions, held = [], {}
    for e in entries:
        if e.locked is None or (e.path and os.path.realpath(e.path) in unmade):
            continue  # `git worktree add` locks while it works: a killed PENDING task's is dead
        owner = lock_owner(e.locked)
        where = str(e.path or e.admin)
        if owner and not pid_alive(owner[0]):
            safe = e.path is not None
            why = f"locked by ccm-guard pid {owner[0]} (task {owner[1]}), which is gone"
            if not safe:
                why += f"; git cannot name its directory: remove {e.admin}/locked by hand"
            actions.append(Action("dead-lock", str(common), where, why, safe, [f"git worktree unlock {where}"],
                                  task=owner[1]))
            if not safe:
                held[e.admin] = "locked by a dead ccm-guard, and git cannot unlock it"
        elif owner:
            held[e.admin] = f"in use: locked by ccm-guard pid {owner[0]} (task {owner[1]})"
        else:
            held[e.admin] = f"locked ({e.locked or 'no reason given'}): `git worktree unlock {where}` first"
    return actions, held


def _plan_task(host: git.Repo, t: Task, entries: list[AdminEntry], held: dict[Path, str], refs: dict[str, str],
               opts: Options) -> Action | None:
    if (t.status == "COMMITTED" and t.option("applying")) or (t.status == "APPLIED" and t.option("rolled_back")):
        what = "apply" if t.option("applying") else "rollback"
        return Action("interrupted-apply", str(host.common_dir), t.id, f"an {what} of it was killed before it was "
                      "recorded", True, ["finish the record as `task show` does (gc looks at it again next time)"],
                      task=t.id, status=t.status)
    wt = Path(t.worktree)
    act = _task_kind(t, wt, opts.now - t.updated_at, opts)
    if act is None:
        return None
    kind, reason = act
    tip = refs.get(f"refs/heads/{t.branch}")
    if t.status in GONE and not (os.path.lexists(wt) or tip):
        return None  # nothing of it is left (an admin entry at most: prune's): only retention applies
    action = Action(kind, str(host.common_dir), t.id, reason, True, [], task=t.id, status=t.status)
    if to_audit(t):
        action.steps = ["mark ERRORED", f"keep the worktree {wt}: `ccm-guard audit {t.id}` judges it"]
        return action
    try:
        worktree.not_in_use(t)
        action.steps = task_steps(host, t, entry_at(entries, wt), held, tip)
    except GuardError as exc:
        action.safe, action.reason = False, f"{reason}; left alone: {exc.message}"
    return action


def _task_kind(t: Task, wt: Path, age: float, opts: Options) -> tuple[str, str] | None:
    if t.status in RUNNING:
        if running(t):
            return None
        if to_audit(t):
            return "abandoned-run", f"the ccm-guard process that ran it (pid {t.pid}) is gone"
        return "abandoned-run", f"{t.status}, and the ccm-guard process that set it up (pid {t.pid}) is gone"
    if t.status not in GONE and not os.path.lexists(wt):
        return ("orphan-row", f"{t.status} but its worktree {wt} is gone") if age >= GRACE else None
    if t.status in FINISHED and age >= opts.older_than:
        return "stale-task", f"{t.status} for {human_age(age)}, older than {human_age(opts.older_than)}"
    return None


def _plan_expiry(host: git.Repo | None, t: Task, refs: dict[str, str], opts: Options) -> Action | None:
    """A discarded task past retention: its archive (ref, or a copied directory's), its
    snapshot refs and its logs go; the row stays, as history, for one more retention, and
    then goes too (rows stay bounded). `host` is None for a task that ran in a copied
    directory (no git)."""
    age = opts.now - t.updated_at
    if t.status not in GONE or age < opts.archive_days * 86400:
        return None
    ref = ARCHIVE_PREFIX + t.id
    commit = refs.get(ref)
    snapshots = {name: sha for name, sha in refs.items() if name.startswith(f"{SNAPSHOT_PREFIX}{t.id}/")}
    copied = (t.option("archive") or {}).get("path") if host is None else None
    paths = [p for p in (copied, t.log_dir) if p and os.path.isdir(p)]
    if commit is None and not snapshots and not paths:
        # One more retention, counted from when its archive went (or its last change).
        if t.status != "CLEANED_UP" or opts.now - (t.option("expired_at") or 0) < opts.archive_days * 86400:
            return None
        return Action("expired-row", str(host.common_dir) if host else t.repo, t.id,
                      f"CLEANED_UP for {human_age(age)} with nothing of it left, past --archive-days "
                      f"{opts.archive_days:g}", True, ["forget the task's row"], task=t.id, status=t.status)
    steps = [f"remove {path}" for path in paths] + ([f"delete {ref}"] if commit else [])
    steps += [f"delete {name}" for name in sorted(snapshots)]
    if t.status == "DISCARDED":
        steps.append("mark CLEANED_UP (no longer restorable)")
    return Action("expired-archive", str(host.common_dir) if host else t.repo, ref if commit else t.id,
                  f"{t.status} for {human_age(age)}, past --archive-days {opts.archive_days:g}", True, steps,
                  task=t.id, status=t.status, commit=commit, refs=snapshots, paths=paths)
