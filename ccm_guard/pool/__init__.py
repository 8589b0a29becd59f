"""The warm pool: checked-out work trees per repository, handed to tasks and taken back.

Making a work tree is the cost (about 10 s for 100k files on ext4); re-pointing
one that exists writes only the files that differ. A pool entry is a directory under
`$CCM_GUARD_HOME/pool/<repo-key>/<id>/` checked out at a recent base, and ccm-guard's own
index file for it (`<id>.index`, its stat data taken a second after the checkout).

While pooled an entry has no git admin entry at all. Nothing of it is in the repository:
`git worktree prune` cannot touch it, and a task running meanwhile sees nothing in its
snapshots — an admin dir that is made, moved, relocked or removed under `worktrees/`
while a task runs is what the git-metadata gate reports as tampering. Handing one over
looks, to everyone else, exactly like a fresh worktree: `git worktree add --no-checkout
-b ccm/<task>` makes the admin dir (~10 ms at any size), the pooled files are renamed
into place, ccm-guard's index goes in, and a two-tree `read-tree -m -u` moves index and
files from the pool's base to the task's, touching only what differs.

    filling -> ready -> taking -> out -> returning -> ready
                 (not pristine, or any failure: destroyed, never handed out)

`filling`, `taking` and `returning` name the process at work; if it is gone the entry
is dirty and is only destroyed (`pool fill` does it). `out` is a task's: if its ccm-guard
process dies (a crash), the entry stays out, dirty, until the task is discarded.

Here: handing entries out. What "pristine" means, the tables and destroying: `records`.
Filling, draining, status and reconciling after crashes (the `pool` command's side):
`admin`. Taking a passed task's worktree back: `returns`. Refilling, and starting the
detached processes that finish the pool's work after ccm-guard exits: `refiller`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from ccm_guard import failpoints, git
from ccm_guard.errors import GitError, StateError
from ccm_guard.pool.records import (
    Entry,
    claim,
    destroy,
    drop,
    entries,
    identity,
    open_registry,
    problem,
    set_fields,
)
from ccm_guard.state import trash
from ccm_guard.state.home import home
from ccm_guard.state.registry import Registry

__all__ = ["Entry", "drain", "entries", "fill", "finish_returns", "forget", "give_back", "has_pool",
           "open_registry", "problem", "reconcile", "refill", "status", "take"]

if TYPE_CHECKING:
    from ccm_guard.pool.admin import drain, fill, reconcile, status
    from ccm_guard.pool.refiller import refill
    from ccm_guard.pool.returns import finish_returns, give_back

# Loaded on first use: every exec asks `has_pool`, and a repository without a pool needs
# nothing more. The `pool` command's side (`gc` reconciles too) and what the detached
# processes call by these names (`pool.refill`, `pool.finish_returns`).
_LATER = {"drain": "admin", "fill": "admin", "reconcile": "admin", "status": "admin",
          "refill": "refiller", "finish_returns": "returns", "give_back": "returns"}


if not TYPE_CHECKING:
    def __getattr__(name: str) -> object:
        if name in _LATER:
            import importlib

            value = getattr(importlib.import_module(f"ccm_guard.pool.{_LATER[name]}"), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module 'ccm_guard.pool' has no attribute {name!r}")


def has_pool(registry: Registry, repo: Path) -> bool:
    """Whether exec should look in the pool by default: one is configured or holds entries."""
    try:
        row = registry.db.execute(
            "SELECT 1 FROM pool_repos WHERE repo = ? UNION SELECT 1 FROM pool WHERE repo = ? AND state = 'ready'",
            (str(repo), str(repo))).fetchone()
    except sqlite3.OperationalError:
        return False  # no pool was ever made: the tables do not exist
    return row is not None


# --- handing out -------------------------------------------------------------------------------


def take(registry: Registry, repo: Path, task: str, branch: str, base: str, dest: Path) -> Path | None:
    """Hand a pristine pooled work tree to `task` as a new worktree at `dest` on a new
    `branch` at `base`. Returns its admin dir, or None when the pool has nothing to give
    (the caller makes a fresh worktree). Entries that are not pristine are destroyed here,
    never handed out.
    """
    open_registry(registry)
    try:
        while (entry := claim(registry, repo, task)) is not None:
            failpoints.point("pool-after-claim")
            try:
                if problem(entry, trust_proof=True) is None:
                    return _hand_over(registry, entry, branch, base, dest)
            except GitError:
                # Unusable (its base pruned away, say): a fresh worktree may well work.
                _undo_hand_over(repo, branch, base, dest)
            except BaseException:
                destroy(registry, entry)
                raise
            destroy(registry, entry)  # not pristine, or broken: never handed out
        return None
    finally:
        with contextlib.suppress(sqlite3.Error, StateError):  # never in the way of the take's own outcome
            from ccm_guard.pool.refiller import refill_soon

            refill_soon(registry, repo)  # whatever this take did to it, an empty pool included


def _hand_over(registry: Registry, entry: Entry, branch: str, base: str, dest: Path) -> Path | None:
    from ccm_guard.git.layout import admin_dir_of, host_repo
    from ccm_guard.state.home import admin_lock

    repo = Path(entry.repo)
    try:
        with admin_lock(repo):
            git.worktree_add_bare(host_repo(repo), dest, branch, base)
    except GitError:
        # Not this entry's fault: it goes back, and the fresh worktree's own `worktree add`
        # reports what is wrong.
        set_fields(registry, entry, state="ready", task=None, pid=None)
        return None
    admin = admin_dir_of(dest, repo)
    set_fields(registry, entry, path=str(dest))  # where to look for the files if this process dies
    # The pointer git just wrote goes into the pooled directory, which takes its place.
    os.rename(dest / ".git", Path(entry.home) / ".git")
    os.rmdir(dest)
    os.rename(entry.home, dest)
    failpoints.point("pool-after-move")
    tmp = admin / "index.ccm-guard-tmp"
    shutil.copyfile(entry.index, tmp)
    os.replace(tmp, admin / "index")
    if entry.base != base:
        git.fast_forward_checkout(git.Repo(admin, repo, dest), entry.base, base)
    # ccm-guard's own copy of the index at hand-over: taking the worktree back starts from it.
    shutil.copyfile(admin / "index", entry.index)
    set_fields(registry, entry, state="out", fingerprint=identity(entry.index))
    return admin


def _undo_hand_over(repo: Path, branch: str, base: str, dest: Path) -> None:
    """A hand-over that failed half-way: its admin dir and branch go (the files went with
    the entry), so that the next entry, or a fresh worktree, can use the same names."""
    from ccm_guard.git.layout import admin_dirs_pointing_at, host_repo
    from ccm_guard.state.home import admin_lock

    for admin in admin_dirs_pointing_at(repo, dest):
        with admin_lock(repo):
            trash.drop_admin(admin, dest)
    host = host_repo(repo)
    ref = f"refs/heads/{branch}"
    if git.resolve_commit(host, ref) == base:
        git.delete_ref(host, ref, base)


def forget(worktree: Path, registry: Registry | None = None) -> None:
    """A task's worktree that came from the pool was removed as usual: drop its entry."""
    if not (home() / "pool").is_dir():
        return  # no pool was ever made
    try:
        registry = open_registry(registry)
    except (sqlite3.Error, StateError):
        return
    for entry in [e for e in entries(registry) if e.path == str(worktree) and e.state == "out"]:
        drop(registry, entry)

