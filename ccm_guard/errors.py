"""The error types ccm-guard raises and the exit code each one maps to.

One hierarchy, one handler (cli.options.handled), one table (README, `ccm-guard --help`).
Every message is one line that names the problem and the fix.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Every exit code ccm-guard documents; `--help` prints the table from the texts here."""

    text: str

    def __new__(cls, code: int, text: str) -> "ExitCode":
        member = int.__new__(cls, code)
        member._value_ = code
        member.text = text
        return member

    OK = 0, "pass: the agent exited 0 and every gate passed"
    GATES_FAILED = 1, "one or more gates failed (the verdict names them)"
    USAGE = 2, "usage error: bad arguments or configuration"  # click uses 2 as well
    AGENT_FAILED = 3, "the agent exited non-zero (gates passed)"
    AGENT_TIMEOUT = 4, "the agent timed out (--timeout)"
    REPO = 5, ("the repository cannot be used as asked (not a repository, bare, no commits, --base does not "
               "resolve, task/branch/worktree exists, not enough disk)")
    GIT = 6, "git failed, or ccm-guard refused to run git on tampered repository metadata"
    STATE = 7, "ccm-guard state error (unknown task, registry problem, illegal status change)"
    APPLY_REFUSED = 8, ("apply refused: the merge conflicts, or the checked-out target has uncommitted changes "
                        "in its way (nothing was changed)")
    BLOCKED = 9, "the agent is blocked on a question (question.json); `task resume` continues"
    SETUP_FAILED = 10, "the setup step failed (--setup, the policy's setup): the agent did not run"
    NOT_EXECUTABLE = 126, "the agent command is not executable"
    NOT_FOUND = 127, "the agent command was not found"
    INTERRUPTED = 130, "interrupted (Ctrl-C)"
    SERVER_GONE = 137, ("the warm server went away during the command, which went with it (as a killed command's "
                        "128+9); run it again")


def _exit_code_table(width: int = 88) -> str:
    """The table for `--help` epilogs: "\\b" keeps click from rewrapping it."""
    lines = ["\b", "Exit codes:"]
    for code in ExitCode:
        words, line = code.text.split(), f"  {int(code):<4} "
        for word in words:
            if len(line) + len(word) > width and line.strip():
                lines.append(line.rstrip())
                line = " " * 7
            line += word + " "
        lines.append(line.rstrip())
    lines += ["When several apply: a security finding is 1; then 10, 130, 9 and 4 win over the",
              "new-commit and clean-tree failures they explain; then 1; then 3."]
    return "\n".join(lines)


EXIT_CODE_TABLE = _exit_code_table()


class GuardError(Exception):
    """Base class: an expected failure with a one-line message and an exit code."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(GuardError):
    exit_code = ExitCode.USAGE


class RepoError(GuardError):
    exit_code = ExitCode.REPO


class NotARepository(RepoError):
    """The directory is in no git repository (exec falls back to a copied directory)."""


class ApplyRefused(GuardError):
    exit_code = ExitCode.APPLY_REFUSED


class GitError(GuardError):
    exit_code = ExitCode.GIT


class UntrustedRepoError(GitError):
    """Raised instead of running git where agent-writable config would run code."""


class StateError(GuardError):
    exit_code = ExitCode.STATE


class AgentNotFound(GuardError):
    exit_code = ExitCode.NOT_FOUND


class AgentNotExecutable(GuardError):
    exit_code = ExitCode.NOT_EXECUTABLE


class ForkRefused(GuardError):
    """`exec --fork`: every fork's exec refused before making anything; the first one's
    reason and exit code are the fork run's."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = next((c for c in ExitCode if c == code), ExitCode.USAGE)
