"""`ccm-guard gc`: stale tasks, orphans in every direction, dead locks, expired archives.

`plan` (here) only looks, and returns what it would do as data (a list of `Action`s);
`execute` (gc_run.py) does the safe ones, each checked again against the state it finds.
One rule holds over all of it: nothing is removed whose work no surviving ref keeps
(keep.py, where every removal lives). Seed 004 (cleanup policies) is the source; its
"remove stale worktrees after 7 days" becomes "archive, then remove".

    gc.py         options, plan: what is stale, orphaned, locked or expired
    gc_action.py  Action, the task-status rules, the dry run's forecast of the steps
    gc_run.py     execute: each action re-checked, then done
    keep.py       the invariant, archives, and every removal
    linked.py     git's admin entries, trust in a worktree, ccm-guard's locks
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

from ccm_guard import git
from ccm_guard.errors import GuardError, StateError, UsageError
from ccm_guard.gc.action import (
    GONE,
    TASK_BRANCHES,
    Action,
    Forecast,
    admin_steps,
    branch_refs,
    branch_step,
    orphan_branch_of,
    running,
    task_steps,
    to_audit,
    worktree_steps,
)
from ccm_guard.state.pins import ARCHIVE_PREFIX, SNAPSHOT_PREFIX
from ccm_guard.gc.linked import (
    AdminEntry,
    admin_entries,
    entry_at,
    head_ref,
    identify,
    lock_owner,
    lock_reason,
    trusted,
)
from ccm_guard.gc.run import execute
from ccm_guard.git import layout
from ccm_guard.state.home import home, key_hash
from ccm_guard.state.registry import COPIED_DIRECTORY, RUNNING, Registry, Task, pid_alive

__all__ = ["Action", "Options", "options", "parse_age", "human_age", "plan", "execute", "lock_reason", "lock_owner"]

FINISHED = ("COMMITTED", "APPLIED", "ERRORED", "ROLLED_BACK", "BLOCKED", "DISCARDED", "CLEANED_UP")
# A row changed this recently may be in the middle of another ccm-guard's discard or
# apply (worktree removed, branch not yet): gc repairs it only once it has been still.
GRACE = 600.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclasses.dataclass(frozen=True)
class Options:
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


def human_age(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds / _UNITS[unit]:.0f}{unit}"
    return f"{seconds:.0f}s"


def plan(registry: Registry, opts: Options) -> list[Action]:
    """Everything gc would do, and what it leaves alone and why. Changes nothing."""
    every = registry.list(live_only=False)
    rows = [t for t in every if t.strategy != COPIED_DIRECTORY]
    only = opts.repo
    dirs = _unknown_dirs(rows, only)
    repos = [only] if only else sorted({Path(t.repo) for t in rows} | {c for c in dirs if c})
    actions: list[Action] = []
    for common in repos:
        actions += _plan_repo(common, [t for t in rows if Path(t.repo) == common], dirs.get(common, []), opts)
    for path in dirs.get(None, []):
        actions.append(_plan_foreign_dir(path))
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
    actions += [a for t in rows for a in [_plan_task(host, t, entries, held, refs, opts)] if a]
    tasked = {t.id for t in rows} & {a.task for a in actions if a.task}
    claimed = branch_refs(rows)
    actions += [_plan_dir(host, path, entries, held, claimed) for path in dirs]
    actions += _plan_branches(host, rows, entries, branches)
    actions += _plan_prune(host, rows, entries, held, tasked)
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
    if t.status == "COMMITTED" and t.option("applying"):
        return Action("interrupted-apply", str(host.common_dir), t.id, "an apply of it was killed before it was "
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


# --- orphans: what no task row names ---------------------------------------------------------------


def _unknown_dirs(rows: list[Task], only: Path | None) -> dict[Path | None, list[Path]]:
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


def _plan_dir(host: git.Repo, path: Path, entries: list[AdminEntry], held: dict[Path, str],
              claimed: set[str]) -> Action:
    action = Action("orphan-dir", str(host.common_dir), str(path), "no task row names this worktree", True, [])
    pinned = identify(path)
    if pinned is None:
        return _plan_foreign_dir(path, str(host.common_dir))
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


def _plan_foreign_dir(path: Path, repo: str = "") -> Action:
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return Action("orphan-dir", repo, str(path), "an empty directory no task row names", True,
                      [f"remove the empty directory {path}"])
    return Action("orphan-dir", repo, str(path), "no task row names it, and it is no worktree ccm-guard can "
                  "trace to its repository, so gc cannot archive it: look inside, then remove it by hand", False, [])


def _plan_branches(host: git.Repo, rows: list[Task], entries: list[AdminEntry],
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


def _plan_prune(host: git.Repo, rows: list[Task], entries: list[AdminEntry], held: dict[Path, str],
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


def _plan_expiry(host: git.Repo | None, t: Task, refs: dict[str, str], opts: Options) -> Action | None:
    """A discarded task past retention: its archive (ref, or a copied directory's), its
    snapshot refs and its logs go; the row stays, as history. `host` is None for a task
    that ran in a copied directory (no git)."""
    age = opts.now - t.updated_at
    if t.status not in GONE or age < opts.archive_days * 86400:
        return None
    ref = ARCHIVE_PREFIX + t.id
    commit = refs.get(ref)
    snapshots = {name: sha for name, sha in refs.items() if name.startswith(f"{SNAPSHOT_PREFIX}{t.id}/")}
    copied = (t.option("archive") or {}).get("path") if host is None else None
    paths = [p for p in (copied, t.log_dir) if p and os.path.isdir(p)]
    if commit is None and not snapshots and not paths:
        return None
    steps = [f"remove {path}" for path in paths] + ([f"delete {ref}"] if commit else [])
    steps += [f"delete {name}" for name in sorted(snapshots)]
    if t.status == "DISCARDED":
        steps.append("mark CLEANED_UP (no longer restorable)")
    return Action("expired-archive", str(host.common_dir) if host else t.repo, ref if commit else t.id,
                  f"{t.status} for {human_age(age)}, past --archive-days {opts.archive_days:g}", True, steps,
                  task=t.id, status=t.status, commit=commit, refs=snapshots, paths=paths)
