"""Finding and stopping what the agent left running.

An agent's children may call `setsid`, double-fork, `nohup` or clear their environment
to outlive the run. ccm-guard makes itself a child subreaper (prctl), so every orphan
of the agent is re-parented to ccm-guard instead of init: after the agent exits, any
descendant of ccm-guard is the agent's. Processes carrying the run's marker variable or
sitting with their cwd in the worktree are added for good measure (a daemon started
through another service escapes the tree, not always the marker or the cwd).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclasses.dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    cmdline: str

    def describe(self) -> str:
        return f"pid {self.pid}: {self.cmdline[:120]}"


def _stat(pid: int) -> Proc | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", "replace")
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain ") ".
    rest = raw[raw.rindex(")") + 2:].split()
    return Proc(pid, int(rest[1]), rest[0], cmd or raw[raw.index("(") + 1: raw.rindex(")")])


def _all() -> dict[int, Proc]:
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = _stat(int(name))
            if proc is not None:
                procs[proc.pid] = proc
    return procs


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _cwd_inside(pid: int, root: str) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cwd == root or cwd.startswith(root + "/")


def leftovers(marker: str, worktree: Path) -> list[Proc]:
    """Live processes that belong to the run: our descendants, marked ones, ones in the worktree."""
    me = os.getpid()
    procs = _all()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = list(children.get(me, []))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    wanted = marker.encode()
    root = os.path.realpath(worktree)
    for pid in procs:
        if pid != me and pid not in found and (_has_marker(pid, wanted) or _cwd_inside(pid, root)):
            found.add(pid)
    return sorted((procs[p] for p in found if procs[p].state != "Z"), key=lambda p: p.pid)


def stop(marker: str, worktree: Path, grace: float = 1.0) -> list[Proc]:
    """Stop everything the run left behind: TERM, a grace period, then freeze and KILL.

    Freezing with SIGSTOP before SIGKILL keeps a forking process from outrunning us.
    Returns what was found at first (the report), with zombies reaped.
    """
    first = leftovers(marker, worktree)
    if not first:
        reap()
        return []
    for proc in first:
        _signal(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and leftovers(marker, worktree):
        reap()
        time.sleep(0.05)
    for _ in range(100):
        remaining = leftovers(marker, worktree)
        if not remaining:
            break
        for proc in remaining:
            _signal(proc.pid, signal.SIGSTOP)
        for proc in remaining:
            _signal(proc.pid, signal.SIGKILL)
        time.sleep(0.02)
        reap()
    reap()
    return first


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def reap() -> None:
    """Collect exited children (orphans re-parented to us become our zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(pgid: int, grace: float) -> None:
    """TERM the agent's process group, give it `grace` seconds, then KILL it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
