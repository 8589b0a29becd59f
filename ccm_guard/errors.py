"""The error types ccm-guard raises and the exit code each one maps to.

One hierarchy, one handler (in cli.py), one table (README, `ccm-guard --help`).
Every message is one line that names the problem and the fix.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # the agent exited 0 and every gate passed
    GATES_FAILED = 1  # one or more gates failed
    USAGE = 2  # bad arguments or configuration (click uses 2 as well)
    AGENT_FAILED = 3  # gates passed but the agent exited non-zero
    AGENT_TIMEOUT = 4  # the agent was stopped by --timeout
    REPO = 5  # the repository cannot be used as asked (not a repo, bare, empty, ...)
    GIT = 6  # git itself failed, or refused to be run on a tampered repository
    STATE = 7  # ccm-guard's own state (registry, task) is missing or inconsistent
    APPLY_REFUSED = 8  # apply would conflict, or the checked-out target is dirty: nothing changed
    BLOCKED = 9  # the agent left question.json: the worktree is kept for `task resume`
    NOT_EXECUTABLE = 126  # the agent command exists but cannot be run
    NOT_FOUND = 127  # the agent command does not exist
    INTERRUPTED = 130  # Ctrl-C


EXIT_CODE_TABLE = """\
\b
Exit codes:
  0    pass: the agent exited 0 and every gate passed
  1    one or more gates failed (the verdict names them)
  2    usage error: bad arguments or configuration
  3    the agent exited non-zero (gates passed)
  4    the agent timed out (--timeout)
  5    the repository cannot be used as asked (not a repository, bare, no commits,
       --base does not resolve, task/branch/worktree exists, not enough disk)
  6    git failed, or ccm-guard refused to run git on tampered repository metadata
  7    ccm-guard state error (unknown task, registry problem, illegal status change)
  8    apply refused: the merge conflicts, or the checked-out target has uncommitted
       changes (nothing was changed)
  9    the agent is blocked on a question (question.json); `task resume` continues
  126  the agent command is not executable
  127  the agent command was not found
  130  interrupted (Ctrl-C)"""


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
