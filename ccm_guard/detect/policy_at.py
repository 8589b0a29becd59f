"""The policy as a repository committed it: read with git, built by `policy` (which never
runs git), and the staged-paths check the guard hooks run with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ccm_guard import git, policy
from ccm_guard.detect.paths import staged_violations
from ccm_guard.policy import Policy, Role


def policy_at(repo: git.Repo | None, rev: str | None, override: Path | None) -> Policy:
    """The effective policy with the repository's files as committed at `rev`."""
    committed = git.files_at(repo, rev, list(policy.COMMITTED_FILES)) if repo is not None and rev else {}
    return policy.load(rev, committed, override)


def role_at(repo: git.Repo, rev: str, override: Path | None, name: str | None, *, checkout: Path) -> Role:
    """The role `name` of the policy committed at `rev`; when there is no such role and the
    person's checkout holds a policy file that differs from the committed one, the error
    says that exec reads the committed one (an agent cannot edit that)."""
    committed = git.files_at(repo, rev, list(policy.COMMITTED_FILES))
    try:
        return policy.load(rev, committed, override).role(name)
    except policy.PolicyError as exc:
        from ccm_guard.files import read_regular

        differs = [p for p in policy.COMMITTED_FILES
                   if (data := read_regular(checkout / p, policy.POLICY_LIMIT)) is not None
                   and data != committed.get(p)]
        if not differs or "unknown role" not in exc.message:
            raise
        raise policy.PolicyError(
            f"unknown role {name!r} in the policy committed at {rev[:12]}; your working-tree {', '.join(differs)} "
            "differs from it, but exec reads the committed policy (an agent cannot edit that): commit it, "
            "then run exec again") from None


def for_checkout(start: Path, rev: str | None, override: Path | None) -> tuple[git.Repo, Policy]:
    """The repository holding `start`, and its effective policy as committed at `rev` (HEAD)."""
    repo = git.discover(start).repo()
    commit = git.resolve_commit(repo, rev or "HEAD")
    return repo, policy_at(repo, commit, override)


def check_staged(repo_root: Path, role: str | None, policy_rev: str = "HEAD",
                 rules: dict[str, Any] | None = None) -> list[str]:
    """Violations of the role's path rules in what is staged, one line each (for hooks).

    `rules`: the role's rules compiled ahead (Rules.to_data), as exec hands them to the
    hooks: no policy to load and no pathspec to import on every commit.
    """
    from ccm_guard.policy.rules import (
        Rules,  # pathspec's import is slow: only when rules are needed
    )

    if rules is not None:
        repo = git.discover(repo_root).repo()
        checked: Role | Rules = Rules.from_data(rules)
    else:
        repo, pol = for_checkout(repo_root, policy_rev, None)
        checked = pol.role(role)
    return [v.line() for v in staged_violations(repo, checked) if v.severity == "fail"]
