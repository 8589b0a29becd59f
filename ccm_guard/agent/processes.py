"""Finding and stopping what the agent left running.

An agent's children may call `setsid`, double-fork, `nohup` or clear their environment
to outlive the run. ccm-guard makes itself a child subreaper (prctl), so every orphan
of the agent is re-parented to ccm-guard instead of init: after the agent exits, any
descendant of ccm-guard is the agent's. Processes carrying the run's marker variable,
sitting with their cwd in the worktree or holding a file there open are added for good
measure (a daemon started through another service escapes the tree, not always these).
No cgroup: this machine's hierarchy is a v1/v2 hybrid that an unprivileged user cannot
delegate; the subreaper needs no privilege.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path
from typing import Iterator, NamedTuple

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Proc(NamedTuple):
    pid: int
    ppid: int
    state: str
    cmdline: str
    started: int  # clock ticks after boot

    def describe(self) -> str:
        return f"pid {self.pid}: {self.cmdline[:120]}"


def _stat(pid: int) -> Proc | None:
    """The process from its stat file alone, named by its command name: reading every
    process's command line too would double the cost of a walk of /proc (_described reads
    it for the few a walk finds)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain ") ".
    rest = raw[raw.rindex(")") + 2:].split()
    name = raw[raw.index("(") + 1: raw.rindex(")")]
    return Proc(pid, int(rest[1]), rest[0], name, int(rest[19]))


def _described(proc: Proc) -> Proc:
    """`proc` with its whole command line, where it can still be read."""
    try:
        cmd = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return proc
    return proc._replace(cmdline=cmd) if cmd else proc


def now_ticks() -> int:
    """The current time in the unit of /proc/<pid>/stat's start time."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return int(uptime * os.sysconf("SC_CLK_TCK"))


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


def _in(pid: int, root: str) -> bool:
    """The process works in `root` (its cwd) or holds a file there open."""
    return _cwd_inside(pid, root) or _fd_inside(pid, root)


def _cwd_inside(pid: int, root: str) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cwd == root or cwd.startswith(root + "/")


def _open_files(pid: int) -> Iterator[str]:
    """What process `pid` holds open, as paths (none where it cannot be looked into)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for fd in fds:
        try:
            yield os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue


def _fd_inside(pid: int, root: str) -> bool:
    return any(target == root or target.startswith(root + "/") for target in _open_files(pid))


def held_open(paths: set[str]) -> set[str]:
    """Which of `paths` some live process holds open (a git writing its lock file does, from
    taking the lock to committing it). Processes of other users cannot be looked into:
    what only they hold counts as not held."""
    return {target for name in os.listdir("/proc") if name.isdigit()
            for target in _open_files(int(name)) if target in paths}


def _ancestry(procs: dict[int, Proc]) -> set[int]:
    """This process and those it runs under, up to init (and, for a command a warm server
    runs, its client and those the client runs under: the person's shell, a git alias)."""
    from ccm_guard import caller

    mine: set[int] = set()
    for pid in caller.pids():
        while pid in procs and pid not in mine:
            mine.add(pid)
            pid = procs[pid].ppid
    return mine


def gits_at_work(roots: list[Path], started_by: float) -> list[Proc]:
    """Live git processes that work in one of `roots` (their cwd there) and started by
    `started_by` (seconds since the epoch): a git that closed its lock file while a hook
    or the editor runs (`git commit -a` does) still owns it. ccm-guard itself and the
    processes it runs under (a `git` alias or `git rebase -x` that started it) do not count."""
    procs = _all()
    mine = _ancestry(procs)
    ticks = os.sysconf("SC_CLK_TCK")
    latest = now_ticks() - int((time.time() - started_by - 1) * ticks)  # started_by (+1 s), in /proc's unit
    found = []
    for pid, proc in sorted(procs.items()):
        if pid in mine or proc.state == "Z" or proc.started > latest:
            continue
        try:
            if Path(f"/proc/{pid}/comm").read_bytes() != b"git\n":
                continue
        except OSError:
            continue
        if any(_cwd_inside(pid, os.path.realpath(root)) for root in roots):
            found.append(_described(proc))
    return found


def leftovers(marker: str, worktree: Path, since: int) -> list[Proc]:
    """Live processes that belong to the run: our descendants, marked ones, ones in the worktree.

    A process found only by its cwd or open files counts if it started after the agent
    (`since`, in clock ticks): the person's own shell or editor in the worktree is not killed.
    Only those are asked for the marker too: the caller makes the marker before `since`, so
    no older process can carry it.
    """
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
    for pid, proc in procs.items():
        # The marker is new to this run (and made before `since`): a process older than the
        # agent cannot carry it, and is not asked (one file read per process on a busy machine).
        if pid == me or pid in found or proc.started < since - 1:
            continue
        if _has_marker(pid, wanted) or (proc.started >= since and _in(pid, root)):
            found.add(pid)
    return sorted((_described(procs[p]) for p in found if procs[p].state != "Z"), key=lambda p: p.pid)


def using(worktree: Path, marker: str | None) -> list[Proc]:
    """Live processes of a finished task: the run's marked ones, and any with its cwd or
    an open file in the worktree. ccm-guard itself and the processes it runs under (the
    person's shell, `cd`-ed into the worktree) do not count."""
    procs = _all()
    mine = _ancestry(procs)
    wanted = marker.encode() if marker else None
    root = os.path.realpath(worktree)
    return [_described(proc) for pid, proc in sorted(procs.items())
            if pid not in mine and proc.state != "Z" and (
                (wanted is not None and _has_marker(pid, wanted)) or _in(pid, root))]


def stop(marker: str, worktree: Path, since: int, grace: float = 1.0) -> list[Proc]:
    """Stop everything the run left behind: TERM, a grace period, then freeze and KILL.

    Freezing with SIGSTOP before SIGKILL keeps a forking process from outrunning us.
    Returns what was found at first (the report), with zombies reaped.
    """
    first = leftovers(marker, worktree, since)
    if not first:
        reap()
        return []
    for proc in first:
        _signal(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and leftovers(marker, worktree, since):
        reap()
        time.sleep(0.05)
    # Until nothing is left, bounded in time rather than in rounds: a family whose members
    # restart each other spawns new ones while a round looks at /proc, so rounds must be
    # quick (our descendants only: every orphan of the agent is ours), and the full search
    # (marker, cwd, open files) only confirms that nothing is left.
    deadline = time.monotonic() + KILL_DEADLINE
    while time.monotonic() < deadline:
        remaining = _descendants() or [p.pid for p in leftovers(marker, worktree, since)]
        if not remaining:
            break
        for pid in remaining:
            _signal(pid, signal.SIGSTOP)
        for pid in remaining:
            _signal(pid, signal.SIGKILL)
        reap()
    reap()
    return first


KILL_DEADLINE = 30.0  # seconds to stop a run's leftovers for good, however fast they fork


@contextlib.contextmanager
def watchdog(marker: str, worktree: Path, since: int) -> Iterator[None]:
    """While the agent runs: a small process that stops the run (`stop`) if ccm-guard dies
    first (SIGKILL, the OOM killer, a CI runner cancelling the job), so that no agent goes
    on writing into a worktree nobody watches.

    It is forked before the agent, in a session of its own (a kill of ccm-guard's process
    group does not reach it), and waits on a pipe only ccm-guard can write to: a byte
    means the run ended and ccm-guard stops what is left itself; end of file without one
    means ccm-guard is gone. The subreaper dies with ccm-guard, so the watchdog finds the
    run's processes by what `leftovers` looks for besides descent: the run's marker, a
    cwd or an open file in the worktree. A parent-death signal would reach the agent's
    first process only, and a cgroup cannot be delegated here (module docstring).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_end)
            os.setsid()
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # holds open no pipe or terminal that someone reads to its end
                os.dup2(quiet, fd)
            if os.read(read_end, 1) == b"":
                stop(marker, worktree, since)
        finally:
            os._exit(0)
    os.close(read_end)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.write(write_end, b"x")
        os.close(write_end)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _descendants() -> list[int]:
    """Our live descendants, from /proc/<pid>/stat alone (the quick search)."""
    me = os.getpid()
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(name))
        if fields[0] != b"Z":
            live.add(int(name))
    found: list[int] = []
    stack = list(children.get(me, []))
    while stack:
        pid = stack.pop()
        if pid in live:
            found.append(pid)
        stack.extend(children.get(pid, []))
    return found


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


def _live_members(pgid: int) -> bool:
    """Whether any process of the group is still alive (zombies only wait to be reaped)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_group(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _live_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_group(pgid: int, grace: float) -> None:
    """TERM the agent's process group, give it `grace` seconds, then KILL it and wait.

    Waiting for the KILL to land matters: a process still dying when the gates look
    would be reported as left running.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    if _wait_group(pgid, grace):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _wait_group(pgid, 5.0)
