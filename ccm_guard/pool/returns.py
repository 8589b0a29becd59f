"""Taking a pooled worktree back from a task that passed.

Giving one back (a passed task removed by `exec --cleanup`, `task apply --cleanup` or
`task discard`) costs the person what a removal costs: the
files are renamed back to the entry's home and the admin dir goes. Resetting them to a
recent base and cleaning out leftovers runs in a detached process after ccm-guard has
exited; the entry is `returning` until then. A task's index is the agent's to write: with
stat data that hide a changed file (or `--assume-unchanged`), a change can be invisible to
git. So the reset starts from ccm-guard's copy of the index made at hand-over: every file
the task touched has a new ctime, and is rewritten.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
from pathlib import Path

import ccm_guard.pool.admin as pool_admin
from ccm_guard import failpoints, git
from ccm_guard.errors import GitError, GuardError, StateError
from ccm_guard.pool.records import (
    Entry,
    RepoConfig,
    config_of,
    destroy,
    entries,
    identity,
    open_registry,
    problem,
    record_proof,
    set_fields,
)
from ccm_guard.pool.refiller import detached, recent_base
from ccm_guard.state import trash
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry

# Everyday files a task's own git leaves in its admin dir; anything else (a sparse task's
# settings, an operation in progress) and the worktree is not taken back.
_EVERYDAY = {"HEAD", "commondir", "gitdir", "index", "logs", "ORIG_HEAD", "COMMIT_EDITMSG", "AUTO_MERGE"}


def give_back(pins: Pins, fallback_base: str, registry: Registry | None = None) -> bool:
    """Put a passed task's pooled worktree back in the pool, if the pool wants one. False:
    the pool did not take it, and the caller removes it as usual.

    Called after the task's hooks were removed. Only a worktree that came from the pool,
    whose task passed (COMMITTED or APPLIED), with ccm-guard's copy of its index intact and
    only everyday files in its admin dir, is taken back; the task's branch stays for the
    caller to delete. Here, only what a removal does: the files leave the worktree (one
    rename) and its admin dir goes. Resetting and cleaning them runs after this process
    has exited (`finish_returns`), off the person's critical path.
    """
    registry = open_registry(registry)
    entry = out_with(pins.worktree, registry)
    config = config_of(registry, pins.common_dir)
    if entry is None or config is None or not _wants_one(registry, config) or not _returnable(entry, pins, registry):
        return False
    from ccm_guard.state.home import admin_lock

    set_fields(registry, entry, state="returning", pid=os.getpid(), base=fallback_base)
    try:
        failpoints.point("pool-returning")
        os.unlink(pins.worktree / ".git")
        Path(entry.home).parent.mkdir(parents=True, exist_ok=True)
        set_fields(registry, entry, path=entry.home)
        os.rename(pins.worktree, entry.home)
        with admin_lock(pins.common_dir):
            trash.drop_admin(pins.admin_dir, pins.worktree)
    except OSError:
        destroy(registry, entry)
        return False  # the caller removes what is left (the admin dir)
    except BaseException:
        destroy(registry, entry)
        raise
    if not _returning:
        atexit.register(_start_finisher)
    _returning.append(entry.id)
    return True


# Entries this process gave back, for the finisher started when it exits.
_returning: list[str] = []


def _start_finisher() -> None:
    """One detached process resets and cleans what this process gave back; the entries
    name it as their worker from the start, so none of them looks interrupted."""
    ids = list(_returning)
    _returning.clear()
    pid = detached("finish_returns", *ids)
    if pid is None:
        return  # the entries stay `returning` under a dead pid: `pool fill` destroys them
    with contextlib.suppress(sqlite3.Error, StateError):
        registry = open_registry()
        for entry_id in ids:
            registry.db.execute("UPDATE pool SET pid = ? WHERE id = ? AND state = 'returning'", (pid, entry_id))


def finish_returns(ids: list[str], registry: Registry | None = None) -> None:
    """Files and index of each returning entry to a recent base, leftovers cleaned,
    checked; then ready. Starts from ccm-guard's copy of the index made at hand-over."""
    registry = open_registry(registry)
    for entry in [e for e in entries(registry, None, ("returning",)) if e.id in ids]:
        try:
            failpoints.point("pool-finishing")
            config = config_of(registry, Path(entry.repo))
            base = (recent_base(config) if config else None) or entry.base
            repo = entry.pool_repo()
            git.checkout_with_index(repo, entry.index, base)
            git.clean_with_index(repo, entry.index)
            set_fields(registry, entry, base=base, fingerprint=identity(entry.index))
            record_proof(registry, entry)
            why = problem(entry)
            if why is not None:
                raise GitError(f"not pristine after reset and clean: {why}")
        except (GitError, OSError):
            destroy(registry, entry)
            continue
        _settle_return(registry, entry)


def _settle_return(registry: Registry, entry: Entry) -> None:
    """A reset entry becomes ready, unless the pool was drained meanwhile; then whatever
    is beyond the pool's size (a refill may have made up for it) goes."""
    with pool_admin.sizing(Path(entry.repo)):
        config = config_of(registry, Path(entry.repo))  # as it is now, not as the reset began
        if config is None:
            destroy(registry, entry)
            return
        set_fields(registry, entry, state="ready", task=None, pid=None)
        with contextlib.suppress(GuardError, OSError, sqlite3.Error):  # a detached process: nobody to tell
            pool_admin.trim(registry, config)


def _returnable(entry: Entry, pins: Pins, registry: Registry) -> bool:
    try:
        if registry.get(entry.task or "").status not in ("COMMITTED", "APPLIED"):
            return False  # a task that failed a gate, or never finished, gives nothing back
        return identity(entry.index) == entry.fingerprint and set(os.listdir(pins.admin_dir)) <= _EVERYDAY
    except (OSError, StateError):
        return False


def _wants_one(registry: Registry, config: RepoConfig) -> bool:
    return pool_admin.missing(registry, config) > 0


def out_with(worktree: Path, registry: Registry) -> Entry | None:
    found = [e for e in entries(registry, None, ("out",)) if e.path == str(worktree)]
    return found[0] if found else None
