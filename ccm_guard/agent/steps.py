"""Steps around the agent: commands run in the task's worktree with the agent's sandbox,
shim, hooks and environment, their own timeout and their own logs.

The setup step (`npm ci`, `python -m venv .venv && ...`) runs before the agent; the check
(`--check "pytest -q"`) after an agent whose run passed, to compare forks.

What setup leaves is the run's starting point: the metadata snapshot is taken after it,
and the files it leaves uncommitted are recorded (path -> identity) so clean-tree does
not blame the agent for them unless the agent changed them. A setup that fails stops the
run before the agent starts (ExitCode.SETUP_FAILED, the log's tail in the verdict).
What a check writes is put back (run/exec.py): it never changes the task's work.
The processes of a step do not outlive it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Mapping

from ccm_guard.agent import processes, runner

TAIL_LINES = 20


@dataclasses.dataclass(frozen=True)
class StepResult:
    """How a setup or check step (one or more shell commands) ended."""

    commands: tuple[str, ...]
    failed: str | None  # the command that failed (None: all passed)
    exit_code: int | None  # of the failed command (None: killed by a signal or timed out)
    timed_out: bool
    duration: float  # all commands, seconds
    log_dir: str
    tail: tuple[str, ...] = ()  # the failed command's last lines of output
    # A check's writes, put back afterwards: paths it left changed, and whether it moved
    # the task's branch (which was then set back).
    discarded: tuple[str, ...] = ()
    moved_branch: bool = False

    @property
    def ok(self) -> bool:
        return self.failed is None

    def describe(self) -> str:
        if self.ok:
            return f"{len(self.commands)} command(s) passed in {self.duration:.1f}s"
        how = "timed out" if self.timed_out else f"exited {self.exit_code}" if self.exit_code is not None \
            else "was killed"
        return f"{self.failed!r} {how}"


def run_steps(commands: tuple[str, ...], *, worktree: Path, env: Mapping[str, str], log_dir: Path,
              timeout: float, confine: Callable[[], None] | None, marker: str) -> StepResult:
    """Each command with /bin/sh in the worktree, in order, stopping at the first failure;
    `timeout` is for all of them together. Output goes to the person's stderr and to
    log_dir/<n>/ (stdout stays the verdict's)."""
    total = 0.0
    processes.become_subreaper()  # what a step leaves running comes back to us to stop and reap
    # Once for all the commands: they share one marker, and what an earlier one left (past
    # its stop's deadline) is still the run's, to be found by the marker or in the worktree.
    since = processes.now_ticks()
    for number, command in enumerate(commands, 1):
        logs = log_dir / str(number)
        logs.mkdir(parents=True, exist_ok=True)
        with processes.watchdog(marker, worktree, since):
            result = runner.run(["/bin/sh", "-c", command], worktree, env, logs, max(timeout - total, 0.001),
                                grace=2.0, terminal=False, echo_stdout_to_stderr=True, confine=confine)
        processes.stop(marker, worktree, since)  # a daemon a step started would outlive it
        total += result.duration
        if not result.ok:
            return StepResult(commands, command, result.exit_code, result.timed_out, total, str(log_dir),
                               _tail(result.logs))
    return StepResult(commands, None, 0, False, total, str(log_dir))


def _tail(logs: tuple[str, ...]) -> tuple[str, ...]:
    lines: list[str] = []
    for path in logs:  # stdout, then stderr: where the error usually is
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(f.tell() - 8192, 0))
                lines += f.read().decode("utf-8", "replace").splitlines()[-TAIL_LINES:]
        except OSError:
            continue
    return tuple(lines[-TAIL_LINES:])
