"""The refiller, which keeps the pool at its size, and how the pool starts the processes
that work on after ccm-guard has exited (the refiller, and the finisher of returns).

Those processes run `ccm_guard.pool.<call>(argv)` by name (`detached`): whatever they
call stays reachable as `ccm_guard.pool.<call>` (the package re-exports it).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import ccm_guard.pool.admin as pool_admin
from ccm_guard import git
from ccm_guard.errors import GitError, GuardError
from ccm_guard.files import lock_now
from ccm_guard.pool.records import RepoConfig, config_of, open_registry
from ccm_guard.state.home import lock_file
from ccm_guard.state.registry import Registry

# Waits and lowers its priority before it imports ccm-guard: the imports cost about 60 ms of
# CPU, which a refiller started by the takes of a fork group would take from the forks.
_BOOTSTRAP = """import os, sys, time
time.sleep(float(sys.argv[2]))
try:
    os.nice(int(sys.argv[3]))
except OSError:
    pass
sys.path.insert(0, sys.argv[1])
from ccm_guard import pool
pool.{call}(sys.argv[4:])
"""


def detached(call: str, *args: str, orphan: bool = False, keep: tuple[int, ...] = (),
             after: float = 0.0, nice: int = 0) -> int | None:
    """Run `pool.<call>(args)` in a process of its own session, which outlives this one,
    `after` seconds from now and `nice` lower in priority. Returns its pid, or None when
    it could not be started (or, `orphan`, is not ours to know: it is started through a
    shell that exits at once, so that it is not among this process's descendants, which
    the processes gate stops after a run). `keep`: open descriptors it inherits (a lock it
    goes on holding)."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", _BOOTSTRAP.format(call=call), str(Path(__file__).resolve().parents[2]),
            str(after), str(nice), *args]
    try:
        child = subprocess.Popen(["/bin/sh", "-c", '"$@" &', "sh", *argv] if orphan else argv,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, close_fds=True, pass_fds=keep, cwd="/")
        if orphan:
            child.wait()
            return None
        return child.pid
    except OSError:
        return None


def refill_soon(registry: Registry, repo: Path) -> None:
    """The pool keeps its size: what it lacks is made by a detached process, which first
    lets the task's own start-up have the machine."""
    config = config_of(registry, repo)
    if config is None or not config.refill or not pool_admin.missing(registry, config):
        return
    pending = _pending(repo)
    if pending is None:
        return  # a refiller is waiting to start: it counts what is missing when it does
    # Without a lock to be had (the state home unwritable?): a refiller all the same.
    held = (pending,) if pending >= 0 else ()
    try:
        detached("refill", str(repo), *map(str, held), orphan=True, keep=held, after=REFILL_DELAY, nice=REFILL_NICE)
    finally:
        for fd in held:
            os.close(fd)  # the refiller holds it on


REFILL_DELAY = 1.0  # seconds: the agent starts first
REFILL_NICE = 10


def _pending(repo: Path) -> int | None:
    """A descriptor holding the repository's refill-pending lock; None when another holds
    it, -1 when the lock file cannot be opened. A refiller holds it while it waits to
    start, so that the takes of a fork group (or of runs started together) start one
    refiller, not one each: each is a Python process, and they would compete with the
    runs for the cores."""
    try:
        fd = os.open(lock_file(repo, "refill-pending"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1
    try:
        return lock_now(fd)
    except OSError:  # no locks on this file system: a refiller all the same
        os.close(fd)
        return -1


def refill(args: list[str]) -> None:
    """The detached refiller (started niced, after the agent has had its start): `refill_now`.
    args: the repository, and the descriptor of the refill-pending lock it was handed
    (given up once it starts: what is taken from then on starts another refiller)."""
    if len(args) > 1:
        with contextlib.suppress(OSError, ValueError):
            os.close(int(args[1]))
    refill_now(Path(args[0]))


def refill_now(repo: Path, registry: Registry | None = None) -> None:
    """Make as many entries as the pool lacks, at a recent base, if the disk has room to
    spare beside the running task (one refiller per repository at a time)."""
    registry = open_registry(registry)
    with pool_admin.sizing(repo):
        config = config_of(registry, repo)
        base = recent_base(config) if config else None
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


def recent_base(config: RepoConfig) -> str | None:
    """The commit new and returned entries are checked out at: the pool's rev, resolved
    in the main checkout now (None when it does not resolve)."""
    main = git.Repo(Path(config.main_git_dir), Path(config.repo), Path(config.main_worktree))
    try:
        return git.resolve_commit(main, config.rev)
    except GitError:
        return None
