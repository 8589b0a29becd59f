"""The warm pool: checked-out work trees per repository, handed to tasks and taken back.

Making a work tree is the cost (PERF-NOTES: ~10 s for 100k files on ext4); re-pointing
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

What "pristine" means, the tables and destroying: `pool_entries.py`. Filling, draining,
status and reconciling after crashes (the `pool` command's side): `pool_admin.py`.

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
import shutil
import sqlite3
from pathlib import Path

from ccm_guard import failpoints, git
from ccm_guard.errors import GitError, GuardError, StateError
from ccm_guard.pool import admin as pool_admin

# The `pool` command's side, for callers that know it as pool.* (`gc` reconciles).
from ccm_guard.pool.admin import drain, fill, reconcile, status
from ccm_guard.pool.entries import (
    Entry,
    RepoConfig,
    claim,
    config_of,
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
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry

__all__ = ["Entry", "drain", "entries", "fill", "finish_returns", "forget", "give_back", "has_pool",
           "open_registry", "problem", "reconcile", "refill", "status", "take"]

# Everyday files a task's own git leaves in its admin dir; anything else (a sparse task's
# settings, an operation in progress) and the worktree is not taken back.
_EVERYDAY = {"HEAD", "commondir", "gitdir", "index", "logs", "ORIG_HEAD", "COMMIT_EDITMSG", "AUTO_MERGE"}


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
                if problem(entry) is None:
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
            _refill_soon(registry, repo)  # whatever this take did to it, an empty pool included


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


# --- taking back -------------------------------------------------------------------------------


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


def _detached(call: str, *args: str, orphan: bool = False) -> int | None:
    """Run `pool.<call>(args)` in a process of its own session, which outlives this one.
    Returns its pid, or None when it could not be started (or, `orphan`, is not ours to
    know: it is started through a shell that exits at once, so that it is not among this
    process's descendants, which the processes gate stops after a run)."""
    import subprocess
    import sys

    code = f"import sys; sys.path.insert(0, sys.argv[1]); from ccm_guard import pool; pool.{call}(sys.argv[2:])"
    argv = [sys.executable, "-c", code, str(Path(__file__).resolve().parents[2]), *args]
    try:
        child = subprocess.Popen(["/bin/sh", "-c", '"$@" &', "sh", *argv] if orphan else argv,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, close_fds=True, cwd="/")
        if orphan:
            child.wait()
            return None
        return child.pid
    except OSError:
        return None


def _start_finisher() -> None:
    """One detached process resets and cleans what this process gave back; the entries
    name it as their worker from the start, so none of them looks interrupted."""
    ids = list(_returning)
    _returning.clear()
    pid = _detached("finish_returns", *ids)
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
            base = (_recent_base(config) if config else None) or entry.base
            repo = entry.pool_repo()
            git.checkout_with_index(repo, entry.index, base)
            git.clean_with_index(repo, entry.index)
            set_fields(registry, entry, base=base, fingerprint=identity(entry.index))
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


def _refill_soon(registry: Registry, repo: Path) -> None:
    """The pool keeps its size: what it lacks is made by a detached process, which first
    lets the task's own start-up have the machine."""
    config = config_of(registry, repo)
    if config is not None and config.refill and pool_admin.missing(registry, config):
        _detached("refill", str(repo), orphan=True)


REFILL_DELAY = 1.0  # seconds: the agent starts first


def refill(args: list[str]) -> None:
    """The detached refiller: `refill_now`, niced, after the agent has had its start."""
    import time

    time.sleep(REFILL_DELAY)
    with contextlib.suppress(OSError):
        os.nice(10)
    refill_now(Path(args[0]))


def refill_now(repo: Path, registry: Registry | None = None) -> None:
    """Make as many entries as the pool lacks, at a recent base, if the disk has room to
    spare beside the running task (one refiller per repository at a time)."""
    registry = open_registry(registry)
    with pool_admin.sizing(repo):
        config = config_of(registry, repo)
        base = _recent_base(config) if config else None
        if config is None or base is None:
            return
        count = pool_admin.missing(registry, config)
        # A detached process: nobody to tell, and the next take tries again.
        with contextlib.suppress(GuardError, OSError, sqlite3.Error):
            if count:
                _require_room(config, base, count)
                pool_admin.make(registry, config, base, count)
            pool_admin.trim(registry, config)  # a worktree given back meanwhile


def _require_room(config: RepoConfig, base: str, count: int) -> None:
    """Room for `count` more checkouts of `base`, plus 512 MB for the task that runs
    meanwhile, plus a margin of 5% of the file system (64 MB at least); else RepoError."""
    from ccm_guard.git.layout import host_repo
    from ccm_guard.state.home import require_space

    files, total = git.tree_size(host_repo(Path(config.repo)), base)
    require_space(pool_admin.pool_home(config), files * count, total * count + 512 * 2**20, "to refill the pool",
                  share=0.05)


def _returnable(entry: Entry, pins: Pins, registry: Registry) -> bool:
    try:
        if registry.get(entry.task or "").status not in ("COMMITTED", "APPLIED"):
            return False  # a task that failed a gate, or never finished, gives nothing back
        return identity(entry.index) == entry.fingerprint and set(os.listdir(pins.admin_dir)) <= _EVERYDAY
    except (OSError, StateError):
        return False


def _wants_one(registry: Registry, config: RepoConfig) -> bool:
    return pool_admin.missing(registry, config) > 0


def _recent_base(config: RepoConfig) -> str | None:
    main = git.Repo(Path(config.main_git_dir), Path(config.repo), Path(config.main_worktree))
    try:
        return git.resolve_commit(main, config.rev)
    except GitError:
        return None


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


def out_with(worktree: Path, registry: Registry) -> Entry | None:
    found = [e for e in entries(registry, None, ("out",)) if e.path == str(worktree)]
    return found[0] if found else None
