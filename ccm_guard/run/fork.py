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

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from ccm_guard import git
from ccm_guard.agent.options import ExecOptions
from ccm_guard.errors import RepoError, StateError, UsageError
from ccm_guard.state.registry import LIVE, Registry, Task, new_task_id, sanitise_task_id

FORK_OPTIONS_NOT_ALLOWED = ("apply", "cleanup")  # pick one afterwards: `task pick`


def fork_commands(command: list[str], count: int | None, fork_cmds: tuple[str, ...]) -> list[list[str]]:
    """The command line of each fork: the trailing command N times, or one per --fork-cmd."""
    if fork_cmds:
        if command:
            raise UsageError("give the forks' commands with --fork-cmd or after --, not both")
        if count is not None and count != len(fork_cmds):
            raise UsageError(f"--fork {count} with {len(fork_cmds)} --fork-cmd: drop --fork (it defaults to their count)")
        return [["/bin/sh", "-c", cmd] for cmd in fork_cmds]
    if not command:
        raise UsageError("no agent command: put it after -- (ccm-guard exec --fork 3 -- claude -p '...')")
    if count is None or count < 2:
        raise UsageError("--fork needs 2 or more forks (a single run is plain exec)")
    return [list(command) for _ in range(count)]


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
    task: str
    exit_code: int | None = None
    error: str | None = None  # the fork's exec failed before it had a verdict


def run_forks(opts: ExecOptions, commands: list[list[str]], jobs: int, registry: Registry,
              echo: IO[str] | None = None) -> tuple[str, list[ForkRun]]:
    """Start the forks, at most `jobs` at a time, and wait for all. Their output (agent and
    ccm-guard) goes to `echo` line by line, each prefixed with its task id."""
    for refused in FORK_OPTIONS_NOT_ALLOWED:
        if getattr(opts, refused):
            raise UsageError(f"--{refused} does not go with --fork: pick one fork afterwards (`ccm-guard task pick`)")
    found = git.discover(opts.start)
    base = git.resolve_commit(found.repo(), opts.base)
    if base is None:
        raise RepoError(f"--base {opts.base!r} does not name a commit in {found.toplevel}: check `git log`")
    group = sanitise_task_id(opts.task) if opts.task else new_task_id()
    runs = [ForkRun(f"{group}-{n}") for n in range(1, len(commands) + 1)]
    taken = [r.task for r in runs if registry.exists(r.task)]
    if taken or registry.exists(group):
        raise StateError(f"task {(taken or [group])[0]} already exists: choose another --task for the fork group")
    shared = dataclasses.replace(opts, base=base, group=group, start=found.toplevel)
    pending = list(zip(runs, commands))
    live: list[_Child] = []
    while pending or live:
        while pending and len(live) < max(jobs, 1):
            run, command = pending.pop(0)
            argv = [sys.executable, "-m", "ccm_guard", "exec", *child_args(shared, run.task), "--", *command]
            live.append(_Child.start(run, argv, found.toplevel, echo))
        done = [child for child in live if child.proc.poll() is not None]
        for child in done:  # whichever finished: its slot goes to the next fork at once
            live.remove(child)
            child.finish()
        if not done:
            time.sleep(0.02)
    return group, runs


@dataclasses.dataclass
class _Child:
    """One fork's `ccm-guard exec` process, its output read as it comes (a full pipe would
    stop it): stdout kept (the verdict), stderr relayed to the person, prefixed."""

    run: ForkRun
    proc: subprocess.Popen[str]
    readers: tuple[threading.Thread, ...]
    out: list[str]

    @classmethod
    def start(cls, run: ForkRun, argv: list[str], cwd: Path, echo: IO[str] | None) -> "_Child":
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
        assert proc.stdout is not None and proc.stderr is not None
        out: list[str] = []
        readers = (threading.Thread(target=_relay, args=(proc.stderr, f"[{run.task}] ", echo), daemon=True),
                   threading.Thread(target=out.extend, args=(proc.stdout,), daemon=True))
        for reader in readers:
            reader.start()
        return cls(run, proc, readers, out)

    def finish(self) -> None:
        for reader in self.readers:
            reader.join()
        self.run.exit_code = self.proc.returncode
        try:
            data = json.loads("".join(self.out))
            self.run.error = data.get("error") if isinstance(data, dict) else None
        except ValueError:
            self.run.error = (f"ccm-guard exec printed no verdict (exit {self.proc.returncode}): "
                              f"`task show {self.run.task}` explains")


def _relay(stream: IO[str], prefix: str, echo: IO[str] | None) -> None:
    for line in stream:
        if echo is not None:
            echo.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
            echo.flush()


# --- the comparison ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fork:
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
    """The forks of a group, in order (a group's name is also accepted as one fork's id)."""
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
        except (StateError, RepoError, UsageError) as exc:  # still running, or in use: said, not hidden
            left.append({"task": sibling.id, "reason": exc.message})
    return {"picked": task_id, "group": group, "applied": applied, "discarded": discarded, "left": left}


def sorted_by_group(tasks: Iterable[Task]) -> list[Task]:
    """Tasks in creation order, a fork group's members together where its first one is."""
    order: dict[str, list[Task]] = {}
    for t in tasks:
        order.setdefault(t.option("group") or f"\0{t.id}", []).append(t)
    return [t for group in order.values() for t in group]


def default_jobs() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

