"""The verdict: a dataclass first, then a short human summary and JSON for programs."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ccm_guard.agent.runner import AgentResult
from ccm_guard.detect import gates
from ccm_guard.detect.context import MAX_PATHS
from ccm_guard.detect.gates import GateResult
from ccm_guard.errors import ExitCode
from ccm_guard.git import FileStat
from ccm_guard.policy import Role
from ccm_guard.text import safe


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
        return gates.select(self.read_only, self.require_commit, self.role is not None)

    def to_json(self) -> dict[str, object]:
        return {"role": self.role.name if self.role else None, "read_only": self.read_only,
                "require_commit": self.require_commit, "policy": self.policy}


# The gates that judge finished work: a blocked agent has not finished, so they may fail.
UNFINISHED_WORK_GATES = frozenset({"new-commit", "clean-tree"})


@dataclasses.dataclass
class Verdict:
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
    recovery: dict[str, object] | None = None  # the host-side commit of a sandbox-blocked one
    refusals: list[dict[str, object]] = dataclasses.field(default_factory=list)  # by the shim and hooks
    sandbox: str = "none"
    profile: str = "generic"
    next_steps: list[str] = dataclasses.field(default_factory=list)
    question: str | None = None  # the agent's question.json: the run is BLOCKED, not finished
    applied: dict[str, Any] | None = None  # `exec --apply`: the apply summary
    apply_refused: str | None = None  # `exec --apply` passed the gates but the apply was refused
    notes: list[str] = dataclasses.field(default_factory=list)  # how this run differs (a copied directory, ...)

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
        if self.agent is not None and self.agent.interrupted:
            return ExitCode.INTERRUPTED
        if self.blocked:
            return ExitCode.BLOCKED
        if not self.gates_passed:
            return ExitCode.GATES_FAILED
        if self.agent is not None and self.agent.timed_out:
            return ExitCode.AGENT_TIMEOUT
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
        }[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["commits"] = [{"sha": sha, "subject": subject} for sha, subject in self.commits]
        data["outcome"] = self.outcome
        data["exit_code"] = int(self.exit_code)
        data["passed"] = self.exit_code == ExitCode.OK
        return data


def to_json(verdict: Verdict) -> str:
    # ASCII with escapes: a path that is not UTF-8 (git keeps any bytes) stays valid JSON.
    return json.dumps(verdict.to_json(), indent=2)


# What an agent's output can leave a terminal in: a string sequence (OSC, DCS, APC) that
# swallows everything up to its terminator, concealed or invisible colours, another
# character set, the alternate screen, a hidden cursor. ST and CAN end any sequence in
# progress; the rest puts the terminal back, so the verdict after it is seen as written.
TERMINAL_RESET = "\x1b\\\x18\x1b[0m\x1b(B\x1b[?1049l\x1b[?25h\r"


MAX_FINDINGS = 10  # per gate in the human verdict


def _on_terminal() -> bool:
    import sys

    return sys.stdout is not None and sys.stdout.isatty()


def render(v: Verdict) -> str:
    """The human verdict; on a terminal, preceded by TERMINAL_RESET."""
    text = _render(v)
    return TERMINAL_RESET + text if _on_terminal() else text


def _render(v: Verdict) -> str:
    mark = {"pass": "PASS", "gates-failed": "FAIL"}.get(v.outcome, v.outcome.upper())
    lines = [f"ccm-guard: {mark}  task {safe(v.task)}  branch {safe(v.branch)}  base {v.base[:12]}"]
    lines.extend(f"  note: {safe(note)}" for note in v.notes)
    if v.agent is not None:
        lines.append("  agent: " + _agent_line(v.agent) + f"  sandbox: {v.sandbox}  profile: {v.profile}")
    if v.recovery:
        lines.append(f"  recovered: the sandbox blocked the agent's commit; ccm-guard committed "
                     f"{len(v.recovery['committed'])} file(s) as {str(v.recovery['commit'])[:12]} "  # type: ignore[arg-type]
                     "(Recovery-Reason trailer)")
        lines.append(f"    git said: {safe(str(v.recovery['line']))}")
    if v.refusals:
        lines.append(f"  refused by the git shim and hooks: {len(v.refusals)}")
        for item in v.refusals[:5]:
            lines.append(f"    {safe(str(item.get('op', '?')))}: {safe(str(item.get('reason', item)))[:150]}")
    if v.commits:
        lines.append(f"  commits: {len(v.commits)}")
        lines.extend(f"    {sha[:12]} {safe(subject)}" for sha, subject in v.commits[-10:])
    if v.files:
        added = sum(f.added or 0 for f in v.files)
        deleted = sum(f.deleted or 0 for f in v.files)
        lines.append(f"  files changed: {len(v.files)} (+{added} -{deleted})")
        for f in v.files[:MAX_PATHS]:
            counts = "binary" if f.added is None else f"+{f.added} -{f.deleted}"
            lines.append(f"    {counts:>12}  {safe(f.path)}")
        if len(v.files) > MAX_PATHS:
            lines.append(f"    ... and {len(v.files) - MAX_PATHS} more (--json lists all)")
    lines.append("  gates:")
    for g in v.gates:
        lines.append(f"    {g.status.upper():7} {g.name}" + (f": {safe(g.note)}" if g.note else ""))
        # Failures first, and a bounded number: an agent that plants thousands of files
        # must not bury the verdict (--json lists every finding).
        findings = sorted(g.findings, key=lambda f: f.severity != "fail")
        for finding in findings[:MAX_FINDINGS]:
            lines.append(f"      {'x' if finding.severity == 'fail' else '!'} {safe(finding.reason)}")
            shown = finding.paths[:MAX_PATHS]
            lines.extend(f"          {safe(p)}" for p in shown)
            if len(finding.paths) > len(shown):
                lines.append(f"          ... and {len(finding.paths) - len(shown)} more")
        if len(findings) > MAX_FINDINGS:
            lines.append(f"      ... and {len(findings) - MAX_FINDINGS} more findings (--json lists all)")
    for err in v.errors:
        lines.append(f"  error: {safe(err)}")
    if v.question is not None:
        lines.append(f"  blocked: the agent asks: {safe(v.question)[:500]}")
    if v.applied:
        from ccm_guard.worktree.apply import render as render_apply

        lines.extend("  " + line for line in render_apply(v.applied))
    if v.apply_refused:
        lines.append(f"  apply refused: {safe(v.apply_refused)}")
    lines.append(f"  worktree: {v.worktree} ({v.disposition})")
    if v.archive:
        lines.append(f"  archive: {v.archive}")
    lines.append(f"  logs: {v.log_dir}")
    if v.next_steps:
        lines.append("  next:")
        lines.extend(f"    {step}" for step in v.next_steps)
    return "\n".join(lines)


def _agent_line(a: AgentResult) -> str:
    if a.timed_out:
        how = "timed out and was stopped"
    elif a.interrupted:
        how = "interrupted"
    elif a.signal:
        how = f"killed by signal {a.signal}"
    else:
        how = f"exited {a.exit_code}"
    return f"{how} after {a.duration:.1f}s ({'terminal' if a.terminal else 'pipes'})"
