"""The policy as a repository committed it: read with git, built by `policy` (which never
runs git), and the staged-paths check the guard hooks run with it."""

from __future__ import annotations

from pathlib import Path

from ccm_guard import git, policy
from ccm_guard.detect import staged
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


def check_staged(repo_root: Path, role: str | None, policy_rev: str = "HEAD") -> list[str]:
    """Violations of the role's path rules in what is staged, one line each (for hooks
    installed without exec, which hands its hooks the role's rules compiled ahead)."""
    from ccm_guard.pathrules.rules import Rules

    repo, pol = for_checkout(repo_root, policy_rev, None)
    checked = pol.role(role)
    return staged.refusals(Rules(checked.allow, checked.forbid), str(repo.work_tree or repo_root))
