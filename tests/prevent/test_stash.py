"""`git stash` under the sandbox: the worktree's own stash (refs/worktree/stash).

The shared refs/stash is read-only in the sandbox, so a benign stash failed. The shim now
keeps the agent's entries on its worktree's own ref; the person's stash is never touched,
a stash left behind is named in the verdict, and discarding the task keeps it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ccm, git, run_exec, write_agent

from ccm_guard.prevent import sandbox

pytestmark = pytest.mark.skipif(sandbox.abi() == 0, reason=f"no Landlock here: {sandbox.describe()}")


def test_stash_and_pop_work_under_the_sandbox_and_leave_the_persons_stash_alone(repo: Path, tmp_path: Path) -> None:
    git(repo, "stash", "list")  # the person's: empty, and it stays so
    agent = write_agent(tmp_path, """
set -e
echo wip >> README.md
git stash
git diff --quiet                       # the change is put away
git stash list | grep -q '^stash@{0}: WIP on ccm/'
git stash show -p | grep -q '^+wip'
git stash pop
grep -q wip README.md
git commit -qam 'work after a stash'
""")
    res = run_exec(repo, agent)
    assert res.code == 0 and res.verdict["passed"] is True, res.stdout + res.stderr
    assert res.verdict["refusals"] == [] and res.status("clean-tree") == "pass"
    assert res.status("git-metadata") == "pass" and res.status("refs-untouched") == "pass"
    assert git(repo, "stash", "list") == ""


def test_every_covered_form_acts_on_the_worktrees_own_entries(repo: Path, tmp_path: Path) -> None:
    """save/push -m, list, drop, clear, store of a `stash create`, pop of a named entry, and
    `stash@{N}` naming the worktree's own entries."""
    agent = write_agent(tmp_path, """
set -e
echo one >> README.md && git stash push -q -m first
echo two >> README.md && git stash save second
test "$(git stash list | wc -l)" -eq 2
git stash list | grep -q '^stash@{1}: On ccm/.*: first'
git stash drop stash@{1} | grep -q '^Dropped stash@{1}'
git stash clear
test -z "$(git stash list)"
echo three >> README.md
c=$(git stash create)
git checkout -- README.md
git stash store -m kept "$c"
git stash list | grep -q '^stash@{0}: kept'
git stash pop -q stash@{0}
grep -q three README.md
git stash list | wc -l | grep -qx 0
git commit -qam 'three'
""")
    res = run_exec(repo, agent)
    assert res.code == 0 and res.verdict["passed"] is True, res.stdout + res.stderr
    assert res.verdict["refusals"] == []


def test_a_stash_left_behind_is_named_and_discarding_keeps_it(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """
set -e
echo done >> README.md && git commit -qam work
echo unfinished >> README.md && git stash -q
""")
    res = run_exec(repo, agent, "--task", "stashed")
    assert res.code == 0 and res.verdict["passed"] is True, res.stdout + res.stderr
    assert res.status("clean-tree") == "warn" and "1 stash entry left" in res.reasons("clean-tree")
    entry = git(Path(res.verdict["worktree"]), "rev-parse", "refs/worktree/stash").strip()
    assert ccm("task", "discard", "stashed", cwd=repo).returncode == 0
    kept = git(repo, "rev-list", "refs/ccm-guard/archive/stashed").split()
    assert entry in kept
    assert "unfinished" in git(repo, "show", f"{entry}:README.md")


def test_a_form_not_covered_is_gits_own_and_the_shim_says_why_it_fails(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo new > untracked.txt\ngit stash -u || echo DENIED >&2\nrm untracked.txt\n")
    res = run_exec(repo, agent, "--no-require-commit")
    assert "DENIED" in res.stderr and "keeps it read-only" in res.stderr and "plain `git stash`" in res.stderr
    assert git(repo, "stash", "list") == ""


def test_the_same_change_stashed_again_after_a_pop_is_kept_and_an_empty_stash_says_so(
        repo: Path, tmp_path: Path) -> None:
    """After the last pop the ref goes with its reflog (git answers `REF@{0}` with the ref's
    own value when the reflog is empty): a pop of nothing fails as git's does, and the same
    change stashed again in the same second is an entry, not lost to a no-op ref update."""
    agent = write_agent(tmp_path, """
set -e
echo done >> README.md && git commit -qam work
echo wip >> README.md
git stash -q && git stash pop -q
git checkout -- README.md
if git stash pop 2>/dev/null; then echo POPPED-NOTHING >&2; fi
echo wip >> README.md
git stash -q && git stash -q && git stash -q || true
git diff --quiet || { git stash list >&2; echo LOST >&2; }
""")
    res = run_exec(repo, agent, "--task", "again")
    assert "POPPED-NOTHING" not in res.stderr and "LOST" not in res.stderr, res.stderr
    assert res.status("clean-tree") == "warn" and "1 stash entry left" in res.reasons("clean-tree")
    entry = git(Path(res.verdict["worktree"]), "rev-parse", "refs/worktree/stash").strip()
    assert "wip" in git(repo, "show", f"{entry}:README.md")


def test_store_after_a_reflog_emptied_under_a_stale_ref_logs_the_entry(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A ref left with an empty reflog (a killed drop, gc's reflog expiry) must not swallow a
    store of its own value: the entry is logged, and the host sees it."""
    import shutil

    from ccm_guard import git as cg
    from ccm_guard.errors import GitError
    from ccm_guard.prevent.stash import Stash

    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "update-ref", "--create-reflog", "-m", "old", "refs/worktree/stash", head)
    (repo / ".git/logs/refs/worktree/stash").write_text("")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("CCM_GUARD_REAL_GIT", shutil.which("git") or "git")
    assert Stash([]).run(["store", "-m", "kept", head]) == 0
    host = cg.Repo(repo / ".git", repo / ".git", repo)
    assert cg.worktree_stash(host) == [head]
    assert Stash([]).run(["store", "-m", "again", head]) == 1  # the newest already: refused, not swallowed
    assert "could not save" in capsys.readouterr().err
    log = repo / ".git/logs/refs/worktree/stash"
    log.unlink()
    log.symlink_to(repo / "README.md")
    with pytest.raises(GitError, match="cannot all be read"):
        cg.worktree_stash(host)


def test_an_expired_reflog_or_an_unreadable_one_loses_no_entry(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`git reflog expire` empties the reflog and leaves the ref at a live entry: the host
    keeps it, and a new save keeps it as the new entry's old value. A reflog that cannot be
    read refuses (helper and host alike), deleting and resetting nothing."""
    import shutil

    from ccm_guard import git as cg
    from ccm_guard.errors import GitError
    from ccm_guard.prevent.stash import Stash

    monkeypatch.chdir(repo)
    monkeypatch.setenv("CCM_GUARD_REAL_GIT", shutil.which("git") or "git")
    host = cg.Repo(repo / ".git", repo / ".git", repo)
    (repo / "README.md").write_text("first\n")
    assert Stash([]).run(["push", "-q"]) == 0
    live = git(repo, "rev-parse", "refs/worktree/stash").strip()
    git(repo, "reflog", "expire", "--expire=now", "--all")
    assert (repo / ".git/logs/refs/worktree/stash").read_text() == "" and cg.worktree_stash(host) == [live]
    (repo / "README.md").write_text("second\n")
    assert Stash([]).run(["push", "-q"]) == 0
    assert live in cg.worktree_stash(host) and len(cg.worktree_stash(host)) == 2
    newest = git(repo, "rev-parse", "refs/worktree/stash").strip()
    log = repo / ".git/logs/refs/worktree/stash"
    log.unlink()
    log.mkdir()
    (repo / "README.md").write_text("third\n")
    assert Stash([]).run(["push", "-q"]) == 1 and "cannot be read" in capsys.readouterr().err
    assert (repo / "README.md").read_text() == "third\n"  # nothing reset
    assert git(repo, "rev-parse", "refs/worktree/stash").strip() == newest  # the ref is as it was
    with pytest.raises(GitError, match="cannot all be read"):
        cg.worktree_stash(host)
