"""`ccm-guard check-paths`: a role's path rules on the staged change or on each commit of
a range, and nothing else. Kept apart from verify (which imports the gates) so that a
pre-commit hook or a CI step that asks only this loads only this."""

from __future__ import annotations

from pathlib import Path

from ccm_guard import git
from ccm_guard.detect.paths import from_raw, link_targets
from ccm_guard.detect.policy_at import for_checkout, policy_at
from ccm_guard.errors import UsageError
from ccm_guard.pathrules.check import Violation, check
from ccm_guard.policy import Role


def discover_range(start: Path, rev_range: str) -> tuple[git.Repo, str, str]:
    """The repository holding `start`, and BASE..HEAD as two commit ids: in one git process
    where it answers plainly, else asked one at a time, which says what is wrong (not a
    repository first; then how to write a range, or that a commit is not in this clone,
    as in a shallow CI checkout)."""
    base, sep, head = rev_range.partition("..")
    ends = (base, head or "HEAD") if sep and base and not head.startswith(".") else None
    found = git.discover_commits(start, *ends) if ends else None
    if found:
        return found[0].repo(), found[1][0], found[1][1]
    repo = git.discover(start).repo()
    if ends is None:
        raise UsageError(f"{rev_range!r} is not a range of two commits: write it as BASE..HEAD")
    ids = []
    for rev in ends:
        commit = git.resolve_commit(repo, rev)
        if commit is None:
            raise UsageError(f"{rev!r} is not a commit in this repository; in CI fetch the whole history "
                             "(actions/checkout with fetch-depth: 0, or git fetch origin BASE)")
        ids.append(commit)
    return repo, ids[0], ids[1]


_HELD: list[object] = []  # range_violations' changes (one range a command)


def check_paths_command(start: Path, rev_range: str | None, role: str | None,
                        override: Path | None) -> list[Violation]:
    """`ccm-guard check-paths`: the staged change, or each commit of REV-RANGE.

    The staged change without a role is a person's own commit (the pre-commit framework's
    hook): the rules written for agents (no .gitignore, no policy edits) are not theirs,
    so only what breaks any checkout is checked (case and Unicode twins, symlinks out of
    the repository, nested repositories). In a task's worktree the guard hooks check the
    task's role; a team that wants a role on every commit names it (`--role`)."""
    if rev_range is None:
        from ccm_guard.detect import staged
        from ccm_guard.pathrules.rules import Rules

        if role is None and override is None:
            return staged.violations(Rules(None, ()), str(git.discover(start).toplevel))
        repo, pol = for_checkout(start, "HEAD", override)
        checked = pol.role(role)
        return staged.violations(Rules(checked.allow, checked.forbid), str(repo.work_tree or start))
    repo, base, head = discover_range(start, rev_range)
    # The policy at BASE: a range that edits .ccm-guard.toml is not judged by its own edit.
    return range_violations(repo, policy_at(repo, base, override).role(role), base, head)


def range_violations(repo: git.Repo, role: Role, base: str, head: str) -> list[Violation]:
    """The path rules on every commit of base..head."""
    from ccm_guard.pathrules.rules import Rules  # (pathspec, where a pattern needs it: not for the staged check)

    changes = from_raw(git.commit_changes(repo, base, head))
    # Held to the end of the process, which frees nothing on its way out (cli.run): 100k
    # changes freed when this returns cost the command 10 ms for nothing.
    _HELD[:] = [changes]  # (a process that checks again, a test's, lets the last range go then)
    return check(changes, Rules(role.allow, role.forbid), link_targets(repo, changes),
                 lambda: git.tree_paths(repo, head))
