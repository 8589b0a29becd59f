"""`exec --fork N` and `--fork-cmd CMD`: several agents (or one agent several times) on one
task, from one base, side by side; their comparison; and `task pick`, which applies one
and archives the rest.

Each fork is a whole `ccm-guard exec` of its own, in a process of its own: its own
worktree (from the pool when there is one), sandbox, agent home, gates and registry row,
exactly as a single exec, so a fork is judged no differently. This module starts them,
at most `jobs` at a time, prefixes their output, and reads the comparison back from the
registry (the forks' rows carry the group's name), which is why `task compare` can print
it again later, and why a fork run that is killed leaves every fork explained by its row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from ccm_guard import git
from ccm_guard.agent.options import ExecOptions
from ccm_guard.errors import GuardError, RepoError, StateError, UsageError
from ccm_guard.state.registry import LIVE, Registry, Task, new_task_id, sanitise_task_id

FORK_OPTIONS_NOT_ALLOWED = ("apply", "cleanup")  # pick one afterwards: `task pick`
LONG_LINE = 64 << 10  # bytes of a fork's output line held back for its end, at most


def fork_commands(command: list[str], count: int | None, fork_cmds: tuple[str, ...]) -> list[list[str]]:
    """The command line of each fork: the trailing command N times, or one per --fork-cmd."""
    if fork_cmds:
        if command:
            raise UsageError("give the forks' commands with --fork-cmd or after --, not both")
        if count is not None and count != len(fork_cmds):
            raise UsageError(f"--fork {count} with {len(fork_cmds)} --fork-cmd: drop --fork (it defaults to their count)")
        return [["/bin/sh", "-c", cmd] for cmd in fork_cmds]  # run in each fork's worktree, as an agent is
    if not command:
        raise UsageError("no agent command: put it after -- (ccm-guard exec --fork 3 -- claude -p '...'; "
                         "see `ccm-guard exec --help`)")
    if count is None or count < 2:
        raise UsageError("--fork needs 2 or more forks (a single run is plain exec)")
    program = command[0]
    if "/" in program and not os.path.isabs(program):  # from where ccm-guard runs, as exec takes it
        program = os.path.abspath(program)
    return [[program, *command[1:]] for _ in range(count)]


def child_args(opts: ExecOptions, task_id: str) -> list[str]:
    """The `exec` options of one fork: the group's own, with its task id, the shared base
    and the group recorded. What a fork cannot do on its own (apply, clean up) is refused
    before any fork starts."""
    args = ["--json", "--no-pty", "--task", task_id, "--base", opts.base, "--repo", str(opts.start),
            "--group", opts.group or task_id, "--on-fail", opts.on_fail, "--grace", str(opts.grace),
            "--sandbox", opts.sandbox]
    flags: list[tuple[str, Any]] = [
        ("--timeout", opts.timeout), ("--role", opts.role), ("--policy", opts.policy), ("--agent", opts.agent),
        ("--snapshot-every", opts.snapshot_every), ("--setup-timeout", opts.setup_timeout),
        ("--check", opts.check), ("--check-timeout", opts.check_timeout if opts.check else None),
    ]
    args += [a for flag, value in flags if value is not None for a in (flag, str(value))]
    args += [a for name in opts.keep_env for a in ("--pass-env", name)]
    args += [a for port in opts.allow_ports for a in ("--allow-port", str(port))]
    args += [a for cone in opts.sparse for a in ("--sparse", cone)]
    if opts.setup is not None:
        args += [a for cmd in opts.setup for a in ("--setup", cmd)] if opts.setup else ["--no-setup"]
    switches = [("--read-only", opts.read_only), ("--no-network", opts.no_network), ("--link-dirs", opts.link_dirs),
                ("--require-commit", opts.require_commit is True), ("--no-require-commit", opts.require_commit is False),
                ("--pool", opts.pool is True), ("--no-pool", opts.pool is False)]
    return args + [flag for flag, on in switches if on]


@dataclasses.dataclass
class ForkRun:
    """One fork's process while a fork group runs."""

    task: str
    exit_code: int | None = None
    error: str | None = None  # the fork's exec failed before it had a verdict


def run_forks(opts: ExecOptions, commands: list[list[str]], jobs: int, *, entry: Callable[[list[str]], None],
              echo: IO[str] | None = None) -> tuple[str, list[ForkRun], bool]:
    """Start the forks, at most `jobs` at a time, and wait for all. Their output (agent and
    ccm-guard) goes to `echo` line by line, each prefixed with its task id. Returns the
    group, the forks that ran, and whether Ctrl-C stopped the run (forks not yet started
    are not started then; the ones running finish with their own verdicts).

    Each fork is this process forked, running `ccm-guard exec ARGS` through `entry` (the
    command line's main, as a fresh process would): what the caller imported before is imported once, not once per fork
    (exec's modules are ~0.1 s of CPU). No thread runs here while forking, and the
    registry is closed first (an SQLite connection must not cross a fork)."""
    for refused in FORK_OPTIONS_NOT_ALLOWED:
        if getattr(opts, refused):
            raise UsageError(f"--{refused} does not go with --fork: pick one fork afterwards (`ccm-guard task pick`)")
    found = git.discover(opts.start)
    base = git.resolve_commit(found.repo(), opts.base)
    if base is None:
        raise RepoError(f"--base {opts.base!r} does not name a commit in {found.toplevel}: check `git log`")
    group = sanitise_task_id(opts.task) if opts.task else new_task_id()
    runs = [ForkRun(f"{group}-{n}") for n in range(1, len(commands) + 1)]
    registry = Registry()
    try:
        taken = [r.task for r in runs + [ForkRun(group)] if registry.exists(r.task)]
    finally:
        registry.close()
    if taken:
        raise StateError(f"task {taken[0]} already exists: choose another --task for the fork group")
    shared = dataclasses.replace(opts, base=base, group=group, start=found.toplevel)

    pending = list(zip(runs, commands))
    live: dict[int, _Child] = {}  # by the fd still open: stdout or stderr
    children: list[_Child] = []
    stopping: list[int] = []  # the signals asking the fork run to stop (the handler only notes them)
    told: set[int] = set()  # forks already passed a SIGTERM

    # Explicit handlers (not KeyboardInterrupt): they also work where SIGINT was ignored
    # when this process started, as it is for a background job; each fork resets them.
    previous = {s: signal.signal(s, lambda signum, frame: stopping.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while pending or children:
            if stopping:
                pending.clear()  # start no more forks; the running ones end with their own verdicts
                if signal.SIGTERM in stopping:  # a Ctrl-C reached every fork already (one process group)
                    for child in children:
                        if child.pid not in told:
                            told.add(child.pid)
                            with contextlib.suppress(OSError):
                                os.kill(child.pid, signal.SIGTERM)
            if pending and len(children) < jobs:
                run, command = pending.pop(0)
                child = _Child.start(run, ["exec", *child_args(shared, run.task), "--", *command], found.toplevel,
                                     entry)
                children.append(child)
                live.update({child.out_fd: child, child.err_fd: child})
                continue
            _collect(children, live, echo)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    interrupted = bool(stopping)
    return group, [r for r in runs if r.exit_code is not None or not interrupted], interrupted


def _collect(children: list["_Child"], live: dict[int, "_Child"], echo: IO[str] | None) -> None:
    """Relay what the forks printed, for up to 50 ms, and finish the forks that exited."""
    ready, _, _ = select.select(list(live), [], [], 0.05)  # (a signal's handler returns: select goes on)
    for fd in ready:
        if not live[fd].read(fd, echo):
            live.pop(fd)
    for child in [c for c in children if c.reaped()]:
        for fd in (child.out_fd, child.err_fd):  # what a process it left behind holds open
            if fd in live:
                live.pop(fd)
                child.drain(fd, echo)
        child.finish()
        children.remove(child)


@dataclasses.dataclass
class _Child:
    """One fork: `ccm-guard exec ARGS` in a forked process; its stdout (the verdict) kept,
    its stderr relayed to the person line by line, prefixed with the fork's task id."""

    run: ForkRun
    pid: int
    out_fd: int
    err_fd: int
    out: bytearray = dataclasses.field(default_factory=bytearray)
    partial: bytearray = dataclasses.field(default_factory=bytearray)
    status: int | None = None

    @classmethod
    def start(cls, run: ForkRun, args: list[str], cwd: Path, entry: Callable[[list[str]], None]) -> "_Child":
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # or the fork would print it again
        # No signal between the fork and the child's own handlers: it would run the parent's.
        stops = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            pid = os.fork()
            if pid == 0:
                _become_fork(entry, args, cwd, out_w, err_w, (out_r, err_r), unblock=stops)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        os.close(out_w)
        os.close(err_w)
        return cls(run, pid, out_r, err_r)

    def read(self, fd: int, echo: IO[str] | None) -> bool:
        """Take what is there on fd; at its end, close it and return False."""
        data = os.read(fd, 65536)
        if not data:
            self.close(fd, echo)
            return False
        if fd == self.out_fd:
            self.out += data
        else:
            self._echo(echo, data)
        return True

    def drain(self, fd: int, echo: IO[str] | None) -> None:
        """After the fork exited: what is left on fd, until 0.2 s pass quietly (a process
        it left behind may hold the pipe open); then close it."""
        while select.select([fd], [], [], 0.2)[0]:
            if not self.read(fd, echo):
                return
        self.close(fd, echo)

    def close(self, fd: int, echo: IO[str] | None) -> None:
        os.close(fd)
        if fd == self.err_fd:
            self._echo(echo, b"", flush=True)  # a last line without its newline

    def _echo(self, echo: IO[str] | None, data: bytes, flush: bool = False) -> None:
        """Whole lines, prefixed; a line without its end waits, up to LONG_LINE bytes."""
        end = data.rfind(b"\n")
        if end < 0:
            self.partial += data
            lines: list[bytes] = []
        else:
            lines = (bytes(self.partial) + data[:end]).split(b"\n")
            self.partial = bytearray(data[end + 1:])
        if self.partial and (flush or len(self.partial) > LONG_LINE):
            lines.append(bytes(self.partial))
            self.partial = bytearray()
        if echo is not None and lines:
            prefix = f"[{self.run.task}] "
            echo.write("".join(prefix + line.decode("utf-8", "replace") + "\n" for line in lines))
            echo.flush()

    def reaped(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def finish(self) -> None:
        self.run.exit_code = self.status
        try:
            data = json.loads(bytes(self.out))
            self.run.error = data.get("error") if isinstance(data, dict) else None
        except ValueError:
            self.run.error = (f"ccm-guard exec printed no verdict (exit {self.status}): "
                              f"`task show {self.run.task}` explains")


def _become_fork(entry: Callable[[list[str]], None], args: list[str], cwd: Path, out_w: int, err_w: int,
                 parent_ends: tuple[int, ...], unblock: set[signal.Signals]) -> None:
    """In the forked child: stdin from /dev/null, stdout and stderr into the pipes, then
    `ccm-guard exec ARGS`; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # not the fork run's handlers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        for fd in parent_ends:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (null, out_w, err_w):
            os.close(fd)
        os.chdir(cwd)
        entry(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a fork must never return into the parent's loop
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the parent may be gone (broken pipe)
                pass
        os._exit(code)


# --- the comparison ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fork:
    """One fork's line in a fork group's comparison."""

    task: str
    status: str
    outcome: str | None  # None: the fork has no verdict (killed, or still running)
    failed_gates: tuple[str, ...]
    files: tuple[str, ...]
    added: int
    deleted: int
    commits: int
    agent_seconds: float | None
    agent_exit: int | None
    check: dict[str, Any] | None  # {"ok", "exit_code", "duration", "timed_out", "discarded"}

    @property
    def pickable(self) -> bool:
        return self.status == "COMMITTED" and (self.check is None or bool(self.check["ok"]))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A fork group's forks side by side."""

    group: str
    base: str
    forks: tuple[Fork, ...]

    @property
    def overlaps(self) -> dict[str, list[str]]:
        """Paths that more than one fork changed, and which."""
        by_path: dict[str, list[str]] = {}
        for fork in self.forks:
            for path in fork.files:
                by_path.setdefault(path, []).append(fork.task)
        return {p: tasks for p, tasks in sorted(by_path.items()) if len(tasks) > 1}

    @property
    def best(self) -> Fork | None:
        """The first fork that passed its gates (and its check, when there was one)."""
        return next((f for f in self.forks if f.pickable), None)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "base": self.base,
                "forks": [{**dataclasses.asdict(f), "pickable": f.pickable} for f in self.forks],
                "overlaps": self.overlaps, "best": self.best.task if self.best else None}


def members(registry: Registry, group: str) -> list[Task]:
    """The forks of a group, in order."""
    rows = [t for t in registry.list(live_only=False) if t.option("group") == group]
    if not rows:
        raise StateError(f"no fork group {group!r}: `ccm-guard task list --all` shows the tasks "
                         "(a fork group's tasks are named GROUP-1, GROUP-2, ...)")
    return sorted(rows, key=lambda t: _fork_number(t.id))


def _fork_number(task_id: str) -> int:
    tail = task_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def compare(registry: Registry, group: str) -> Comparison:
    rows = members(registry, group)
    return Comparison(group, rows[0].base, tuple(_fork_of(t) for t in rows))


def _fork_of(task: Task) -> Fork:
    v: dict[str, Any] = json.loads(task.verdict) if task.verdict else {}
    agent = v.get("agent") or {}
    check = v.get("check")
    return Fork(
        task=task.id, status=task.status, outcome=v.get("outcome"),
        failed_gates=tuple(g["name"] for g in v.get("gates", []) if g["status"] == "fail"),
        files=tuple(f["path"] for f in v.get("files", [])),
        added=sum(f.get("added") or 0 for f in v.get("files", [])),
        deleted=sum(f.get("deleted") or 0 for f in v.get("files", [])),
        commits=len(v.get("commits", [])), agent_seconds=agent.get("duration"), agent_exit=agent.get("exit_code"),
        check=None if not check else {"ok": check.get("failed") is None, "exit_code": check.get("exit_code"),
                                      "duration": check.get("duration"), "timed_out": check.get("timed_out"),
                                      "discarded": check.get("discarded", [])},
    )


# --- pick ------------------------------------------------------------------------------------------


def pick(registry: Registry, task_id: str, apply: Callable[[], dict[str, Any]],
         discard: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Apply one fork (`apply`, as `task apply` does: a fork that failed its gates is
    refused there) and discard its siblings (archived first, restorable)."""
    chosen = registry.get(task_id)
    group = chosen.option("group")
    if not group:
        raise UsageError(f"task {task_id} is not a fork (no fork group): use `ccm-guard task apply {task_id}`")
    siblings = [t for t in members(registry, group) if t.id != task_id and t.status in LIVE]
    applied = apply()
    discarded, left = [], []
    for sibling in siblings:
        try:
            discarded.append(discard(sibling.id))
        except GuardError as exc:  # still running, in use, untrusted: said, not hidden
            left.append({"task": sibling.id, "reason": exc.message})
    return {"picked": task_id, "group": group, "applied": applied, "discarded": discarded, "left": left}


def sorted_by_group(tasks: Iterable[Task]) -> list[Task]:
    """Tasks in creation order, a fork group's members together where its first one is."""
    order: dict[str, list[Task]] = {}
    for t in tasks:
        order.setdefault(t.option("group") or f"\0{t.id}", []).append(t)
    return [t for group in order.values() for t in group]


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

