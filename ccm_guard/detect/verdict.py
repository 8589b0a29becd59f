"""The verdict: a dataclass first, then a short human summary and JSON for programs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ccm_guard.errors import ExitCode

if TYPE_CHECKING:
    # Not at run time: exec reads Checks before the agent runs, and the gates (the heavy
    # part of judging) are imported while it runs (run.exec, _judging_modules).
    from ccm_guard.agent.runner import AgentResult
    from ccm_guard.agent.steps import StepResult
    from ccm_guard.detect.gates import GateResult
    from ccm_guard.git import FileStat
    from ccm_guard.policy import Role


@dataclasses.dataclass(frozen=True)
class Checks:
    """What a run is judged by: its role's rules, and whether it must commit or stay still."""

    role: Role | None
    read_only: bool
    require_commit: bool
    policy: str | None = None  # the --policy file, kept for audits

    @classmethod
    def of(cls, role: Role | None, read_only: bool = False, require_commit: bool | None = None,
           policy: str | None = None) -> "Checks":
        read_only = read_only or bool(role and role.read_only)
        must = (role.must_commit if role else True) if require_commit is None else require_commit
        return cls(role, read_only, must and not read_only, policy)

    def gate_names(self) -> list[str]:
        from ccm_guard.detect import gates

        return gates.select(self.read_only, self.require_commit, self.role is not None)

    def to_json(self) -> dict[str, object]:
        return {"role": self.role.name if self.role else None, "read_only": self.read_only,
                "require_commit": self.require_commit, "policy": self.policy}


@dataclasses.dataclass(frozen=True)
class Recovered:
    """The host-side commit of work whose commit the sandbox blocked."""

    reason: str  # why ccm-guard committed for the agent
    line: str  # what git said, as the agent's output or the shim's record showed it
    commit: str
    committed: tuple[str, ...]
    left_uncommitted: tuple[str, ...]  # changed paths the role does not allow
    warning: str | None = None


# The gates that judge finished work: a blocked agent has not finished, so they may fail.
UNFINISHED_WORK_GATES = frozenset({"new-commit", "clean-tree"})


@dataclasses.dataclass
class Verdict:
    """Everything known about a finished run: the agent, its commits, the gates, what became of the worktree."""

    task: str
    branch: str
    base: str
    head: str | None
    repo: str
    worktree: str
    log_dir: str
    agent: AgentResult | None
    commits: list[tuple[str, str]]  # (sha, subject)
    files: list[FileStat]
    gates: list[GateResult]
    disposition: str  # what happened to the worktree afterwards
    archive: str | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    git_trusted: bool = True  # False once the agent tampered with what steers git
    recovery: Recovered | None = None  # the host-side commit of a sandbox-blocked one
    refusals: list[dict[str, object]] = dataclasses.field(default_factory=list)  # by the shim and hooks
    sandbox: str = "none"
    profile: str = "generic"
    identity: str | None = None  # who the agent's commits are by, as set for its worktree
    next_steps: list[str] = dataclasses.field(default_factory=list)
    question: str | None = None  # the agent's question.json: the run is BLOCKED, not finished
    applied: dict[str, Any] | None = None  # `exec --apply`: the apply summary
    apply_refused: str | None = None  # `exec --apply` passed the gates but the apply was refused
    notes: list[str] = dataclasses.field(default_factory=list)  # how this run differs (a copied directory, ...)
    # Plants (context.plants) relative to the common dir; dispose moves them into the logs.
    plants: list[str] = dataclasses.field(default_factory=list)
    # Keys that run code, new in the repository's own config (context.config_plants);
    # dispose unsets them and keeps them in the logs.
    config_plants: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    setup: StepResult | None = None  # the setup step, when the run had one
    check: StepResult | None = None  # --check after a passing run: it does not change the verdict

    @property
    def gates_passed(self) -> bool:
        return all(g.status in ("pass", "warn") for g in self.gates) and not self.errors

    @property
    def blocked(self) -> bool:
        """A question ends the run unfinished: only the gates that judge finished work may fail."""
        return self.question is not None and not self.errors and all(
            g.status in ("pass", "warn") or g.name in UNFINISHED_WORK_GATES for g in self.gates)

    @property
    def exit_code(self) -> ExitCode:
        """The most telling code when several apply (README, "Exit codes"): a failure of a
        gate that guards something other than the work's completeness (a security finding)
        always wins; then Ctrl-C, a question, the timeout, which explain an unfinished
        work tree better than the gates that judge it; then those gates."""
        unfinished_only = all(g.status in ("pass", "warn") or g.name in UNFINISHED_WORK_GATES for g in self.gates)
        if self.errors or not unfinished_only:
            return ExitCode.GATES_FAILED
        if self.setup is not None and not self.setup.ok:
            return ExitCode.SETUP_FAILED  # the agent never ran: its unfinished work is no news
        if self.agent is not None and self.agent.interrupted:
            return ExitCode.INTERRUPTED
        if self.blocked:
            return ExitCode.BLOCKED
        if self.agent is not None and self.agent.timed_out:
            return ExitCode.AGENT_TIMEOUT
        if not self.gates_passed:
            return ExitCode.GATES_FAILED
        if self.agent is not None and not self.agent.ok and self.recovery is None:
            return ExitCode.AGENT_FAILED  # (a recovered run failed only because its commit was blocked)
        if self.apply_refused:
            return ExitCode.APPLY_REFUSED
        return ExitCode.OK

    @property
    def outcome(self) -> str:
        return {
            ExitCode.OK: "pass",
            ExitCode.GATES_FAILED: "gates-failed",
            ExitCode.AGENT_TIMEOUT: "agent-timed-out",
            ExitCode.AGENT_FAILED: "agent-failed",
            ExitCode.INTERRUPTED: "interrupted",
            ExitCode.BLOCKED: "blocked",
            ExitCode.APPLY_REFUSED: "apply-refused",
            ExitCode.SETUP_FAILED: "setup-failed",
        }[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["commits"] = [{"sha": sha, "subject": subject} for sha, subject in self.commits]
        data["outcome"] = self.outcome
        data["exit_code"] = int(self.exit_code)
        data["passed"] = self.exit_code == ExitCode.OK
        return data
