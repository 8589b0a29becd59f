"""`ccm-guard verify BASE..HEAD`: judge a range of commits (an agent's pull request) the way
exec judges a run, for what a range can show.

A range has no before/after snapshot of git's metadata, no processes and no work tree:
what it shows is its commits. Judged here: the role's path rules on every commit and on
every parent of a merge (so the net change is seen), executable project content and
control paths, an edit of the policy table, the role's limits, and commits that claim to
be ccm-guard's. The policy is the one committed at BASE: a pull request that edits
`.ccm-guard.toml` is not judged by its own edit.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ccm_guard import git
from ccm_guard.detect.checkpaths import discover_range
from ccm_guard.detect.context import FAIL, Finding
from ccm_guard.detect.gates import (
    GateResult,
    config_steered,
    forged_claims,
    host_code,
    limit_findings,
    policy_table_edits,
)
from ccm_guard.detect.paths import from_raw, link_targets, measure
from ccm_guard.detect.policy_at import policy_at
from ccm_guard.errors import GuardError, UsageError
from ccm_guard.pathrules.check import check


@dataclasses.dataclass(frozen=True)
class RangeReport:
    """The gates' judgement of a commit range (`verify`, `check-paths`)."""

    base: str
    head: str
    role: str
    policy_files: tuple[str, ...]
    commits: tuple[tuple[str, str], ...]  # (sha, subject), oldest first
    gates: tuple[GateResult, ...]

    @property
    def outcome(self) -> str:
        return "fail" if any(g.status == FAIL for g in self.gates) else "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome, "base": self.base, "head": self.head, "role": self.role,
            "policy_files": list(self.policy_files),
            "commits": [{"sha": sha, "subject": subject} for sha, subject in self.commits],
            "gates": [{"name": g.name, "status": g.status,
                       "findings": [{"reason": f.reason, "paths": list(f.paths), "severity": f.severity}
                                    for f in g.findings]} for g in self.gates],
        }


def verify_range(start: Path, rev_range: str, role_name: str | None, override: Path | None) -> RangeReport:
    repo, base, head = discover_range(start, rev_range)
    policy = policy_at(repo, base, override)
    role = policy.role(role_name)
    from ccm_guard.pathrules.rules import Rules

    commits = git.commits(repo, base, head)
    changes = from_raw(git.commit_changes(repo, base, head, merged_base=True)) if commits else []
    rules = Rules(role.allow, role.forbid)
    paths = [Finding("path-policy", f"{v.path}: {v.reason} ({v.where})", (v.path,), v.severity)
             for v in check(changes, rules, link_targets(repo, changes), lambda: git.tree_paths(repo, head))]
    paths += policy_table_edits(repo, base, head, changes, worktree=None)
    paths += host_code(changes, role, config_steered(repo.common_dir, repo.work_tree))
    figures = measure(changes, len(commits), repo, Path("/nonexistent"))  # every change is committed
    # In CI no registry says which commits ccm-guard made (a `task apply` merge, a
    # recovery): a claim is reported for review, not failed, unless a record here shows it.
    claims = forged_claims(repo, base, head, made_by_us=_recorded_commits(repo), severity="warn")
    if not commits:
        claims.append(Finding("new-commit", f"no commits in {rev_range}: nothing to verify", (), "warn"))
    gates = (GateResult.of("new-commit", claims), GateResult.of("path-policy", paths),
             GateResult.of("limits", limit_findings(role.limits, figures)))
    return RangeReport(base=base, head=head, role=role.name, policy_files=tuple(policy.files),
                       commits=tuple(commits), gates=gates)


def github_range() -> str:
    """BASE..HEAD of the pull request (or push) GitHub Actions is running for."""
    path = os.environ.get("GITHUB_EVENT_PATH")
    if not path:
        raise UsageError("no range given: write BASE..HEAD (in GitHub Actions the event payload names it)")
    try:
        with open(path, encoding="utf-8") as f:
            event = json.load(f)
        if "pull_request" in event:
            return f"{event['pull_request']['base']['sha']}..{event['pull_request']['head']['sha']}"
        before = event["before"]
        if not before.strip("0"):  # a push that made the branch: there is no "before"
            raise UsageError("this push created the branch, so it has no base to compare with: "
                             "give BASE..HEAD (e.g. origin/main..HEAD)")
        return f"{before}..{event['after']}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"$GITHUB_EVENT_PATH ({path}) names no pull request or push ({exc}): "
                         "give BASE..HEAD") from None


def _recorded_commits(repo: git.Repo) -> tuple[str, ...]:
    """The commits ccm-guard's registry on this machine says it made in this repository
    (applies and recoveries); none where there is no registry (CI)."""
    from ccm_guard.state.home import home

    if not (home() / "registry.db").exists():
        return ()
    from ccm_guard.state.registry import Registry

    try:
        registry = Registry()
        try:
            tasks = registry.list(repo=str(repo.common_dir), live_only=False)
        finally:
            registry.close()
    except GuardError:  # a damaged registry proves nothing; verify itself does not need it
        return ()
    return tuple(c for t in tasks for c in t.ccm_commits())
