"""Where ccm-guard keeps its state ($CCM_GUARD_HOME, default ~/.ccm), the locks it takes
there, and the disk-room check before anything large is written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from pathlib import Path
from typing import Iterator

from ccm_guard import git
from ccm_guard.digest import sha256_hex
from ccm_guard.errors import RepoError, UsageError


def key_hash(path: Path, size: int = 10) -> str:
    """The digest of a repository's common dir (or a copied directory's source) that
    names its places under the state home: worktrees and hooks (size 10), locks (16)."""
    return sha256_hex(str(path).encode())[:size]


def home() -> Path:
    """The state home: $CCM_GUARD_HOME, else ~/.ccm. Always absolute: a relative one would
    put worktrees wherever a later command happens to run (inside the person's checkout)."""
    chosen = os.environ.get("CCM_GUARD_HOME")
    if chosen:
        if not os.path.isabs(chosen):
            raise UsageError(f"CCM_GUARD_HOME={chosen} is a relative path: set it to an absolute one "
                             f"(e.g. CCM_GUARD_HOME=\"$PWD/{chosen}\")")
        return Path(chosen)
    try:
        return Path.home() / ".ccm"
    except RuntimeError:  # no HOME and no passwd entry
        raise UsageError("HOME is not set, so ccm-guard has no state home: set HOME or CCM_GUARD_HOME") from None


def require_space(dest: Path, files: int, total: int, what: str, share: float = 0.0) -> None:
    """Refuse, with the figures, when `files` files of `total` bytes will not fit under
    `dest` and still leave a margin: 64 MB for git's metadata and the agent, or (`share`)
    that share of the file system if it is more."""
    parent = _existing_parent(dest)
    st = os.statvfs(parent)
    free = st.f_bavail * st.f_frsize
    margin = max(64 * 2**20, int(share * st.f_blocks * st.f_frsize))
    # Each file costs at least a block.
    need = total + files * st.f_frsize + margin + total // 10
    if free < need:
        raise RepoError(
            f"not enough disk space {what}: need about {_mb(need)} ({files} files), "
            f"{_mb(free)} free under {parent}; free some space or point CCM_GUARD_HOME elsewhere"
        )
    if st.f_favail and st.f_favail < files * 2:
        raise RepoError(f"not enough free inodes under {parent} for {files} files: free some, or move CCM_GUARD_HOME")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


@contextlib.contextmanager
def admin_lock(common_dir: Path, purpose: str = "admin") -> Iterator[None]:
    """Serialise worktree administration on one repository across ccm-guard processes.

    Concurrent `git worktree add`s read each other's half-written `commondir` files and
    fail ("failed to read .../commondir"); an flock is released even by a killed process.
    """
    with open(lock_file(common_dir, purpose), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def lock_file(common_dir: Path, purpose: str = "admin") -> Path:
    """Where the lock for `purpose` on a repository lives (its directory made)."""
    locks = home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    suffix = "" if purpose == "admin" else f"-{purpose}"
    return locks / f"{key_hash(common_dir, 16)}{suffix}.lock"


@contextlib.contextmanager
def no_interrupts() -> Iterator[None]:
    """Ctrl-C must not stop a clean-up halfway (a half-removed worktree with its row gone)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def hooks_dir(common: Path) -> Path:
    """Where ccm-guard keeps a repository's guard hooks: `worktrees/<admin dir name>/` for
    each task's, `repo/` for a whole-repository install (prevent.hooks writes them; every
    snapshot of the repository covers them all)."""
    name = common.parent.name if common.name == ".git" else common.name
    return home() / "hooks" / f"{name}-{key_hash(common)}"


def repo_key(main: git.Discovered) -> str:
    return f"{main.toplevel.name}-{key_hash(main.common_dir)}"
