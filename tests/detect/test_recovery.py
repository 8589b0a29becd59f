"""Host-side recovery commits, on real repositories; the bug itself reproduced under Landlock."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, make_repo
from test_sandbox import confined, linked_worktree, needs_landlock

from ccm_guard import git as gitmod
from ccm_guard.detect import recovery, signatures
from ccm_guard.errors import GitError
from ccm_guard.prevent import roots

IDENTITY = {
    "GIT_AUTHOR_NAME": "ccm-guard", "GIT_AUTHOR_EMAIL": "ccm-guard@localhost",
    "GIT_COMMITTER_NAME": "ccm-guard", "GIT_COMMITTER_EMAIL": "ccm-guard@localhost",
}


def allowed(path: str) -> bool:
    return not path.startswith(("forbidden/", ".github/"))


def task_repo(main: Path, wt: Path, admin: Path) -> gitmod.Repo:
    return gitmod.Repo(admin.resolve(), (main / ".git").resolve(), wt.resolve())


def dirty(wt: Path) -> list[str]:
    return sorted(git(wt, "status", "--porcelain", "--untracked-files=all").splitlines())


def trailers(wt: Path, rev: str = "HEAD") -> list[str]:
    return git(wt, "log", "-1", "--format=%(trailers:key=Recovery-Reason)", rev).splitlines()


def test_only_allowed_paths_are_committed_and_the_rest_stays_dirty(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    base = git(wt, "rev-parse", "HEAD")
    (wt / "src" / "app.py").write_text("print('better')\n")
    (wt / "src" / "new.py").write_text("x = 1\n")
    (wt / "README.md").unlink()
    (wt / "forbidden").mkdir()
    (wt / "forbidden" / "secret").write_text("no\n")
    (wt / ".github").mkdir()
    (wt / ".github" / "ci.yml").write_text("run: evil\n")
    git(wt, "add", "forbidden/secret")  # staged by the agent before its commit failed
    result = recovery.recover(task_repo(main, wt, admin), allowed, "Improve the app\n\nRecovery-Reason: mine\n",
                              IDENTITY)
    assert result.recovered and result.warning is None
    assert result.committed == ("README.md", "src/app.py", "src/new.py")
    assert result.refused == (".github/ci.yml", "forbidden/secret")
    assert git(wt, "rev-parse", "HEAD") == result.commit == git(main, "rev-parse", "ccm/t1")
    assert git(wt, "rev-parse", "HEAD^") == base
    assert git(wt, "diff-tree", "--no-commit-id", "--name-only", "-r", "HEAD").splitlines() == [
        "README.md", "src/app.py", "src/new.py"]
    assert trailers(wt) == ["Recovery-Reason: sandbox blocked commit"]
    assert git(wt, "log", "-1", "--format=%s|%an").split("|") == ["Improve the app", "ccm-guard"]
    assert dirty(wt) == ["?? .github/ci.yml", "?? forbidden/secret"]


@pytest.mark.parametrize("message, expected", [
    (None, f"{recovery.DEFAULT_MESSAGE}\n\n{recovery.TRAILER}\n"),
    ("", f"{recovery.DEFAULT_MESSAGE}\n\n{recovery.TRAILER}\n"),
    ("Recovery-Reason: forged\n", f"{recovery.DEFAULT_MESSAGE}\n\n{recovery.TRAILER}\n"),
    ("Fix: a bug", f"Fix: a bug\n\n{recovery.TRAILER}\n"),
    ("Fix it\n\nBecause.\n", f"Fix it\n\nBecause.\n\n{recovery.TRAILER}\n"),
    ("Fix it\n\nSigned-off-by: A <a@x>\nrecovery-reason : forged\n  folded on\n",
     f"Fix it\n\nSigned-off-by: A <a@x>\n{recovery.TRAILER}\n"),
    ("Fix it\n\nRecovery-Reason: one\n\nRecovery-Reason: two\n", f"Fix it\n\n{recovery.TRAILER}\n"),
    ("\n\nFix it   \n\n\n", f"Fix it\n\n{recovery.TRAILER}\n"),
    # Claims only ccm-guard makes: the recovered commit is recorded as its own.
    ("Fix it\n\nCcm-Guard-Task: other\nccm-guard-head : 1111\n", f"Fix it\n\n{recovery.TRAILER}\n"),
])
def test_exactly_one_trailer(message: str | None, expected: str) -> None:
    assert recovery.with_trailer(message) == expected


def test_a_message_with_a_trailer_gets_exactly_one_on_the_commit(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (wt / "src" / "app.py").write_text("print('x')\n")
    msg = "Work\n\nRecovery-Reason: sandbox blocked commit\nRecovery-Reason: something else\n"
    recovery.recover(task_repo(main, wt, admin), allowed, msg, IDENTITY)
    assert trailers(wt) == ["Recovery-Reason: sandbox blocked commit"]


def test_a_clean_tree_has_nothing_to_recover(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    head, index = git(wt, "rev-parse", "HEAD"), (admin / "index").read_bytes()
    result = recovery.recover(task_repo(main, wt, admin), allowed, "msg", IDENTITY)
    assert result == recovery.RecoveryResult(None, (), (), "")
    assert git(wt, "rev-parse", "HEAD") == head and (admin / "index").read_bytes() == index


def test_only_forbidden_changes_commit_nothing(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    head = git(wt, "rev-parse", "HEAD")
    (wt / "forbidden").mkdir()
    (wt / "forbidden" / "x").write_text("x\n")
    result = recovery.recover(task_repo(main, wt, admin), allowed, None, IDENTITY)
    assert not result.recovered and result.refused == ("forbidden/x",)
    assert git(wt, "rev-parse", "HEAD") == head and dirty(wt) == ["?? forbidden/x"]


def test_ignored_files_are_not_recovered(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (wt / ".gitignore").write_text("*.log\n")
    git(wt, "add", ".gitignore")
    git(wt, "commit", "-qm", "ignore logs")
    (wt / "debug.log").write_text("noise\n")
    (wt / "src" / "app.py").write_text("print(1)\n")
    result = recovery.recover(task_repo(main, wt, admin), allowed, None, IDENTITY)
    assert result.committed == ("src/app.py",)


def test_stale_index_lock_of_the_task_is_removed(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (admin / "index.lock").write_text("")  # left by the agent's git when it was killed
    (wt / "src" / "app.py").write_text("print(2)\n")
    result = recovery.recover(task_repo(main, wt, admin), allowed, None, IDENTITY)
    assert result.recovered and result.removed_lock == admin.resolve() / "index.lock"
    assert result.warning is None and dirty(wt) == []


def test_the_main_checkouts_index_lock_is_never_removed(tmp_path: Path) -> None:
    main = make_repo(tmp_path / "repo")
    (main / ".git" / "index.lock").write_text("")  # maybe the person's git, running now
    (main / "README.md").write_text("changed\n")
    head = git(main, "rev-parse", "HEAD")
    repo = gitmod.Repo((main / ".git").resolve(), (main / ".git").resolve(), main.resolve())
    with pytest.raises(GitError, match="index.lock exists: another git may be running"):
        recovery.recover(repo, allowed, None, IDENTITY)
    assert (main / ".git" / "index.lock").exists() and git(main, "rev-parse", "HEAD") == head


def test_agent_config_runs_nothing_and_shapes_nothing(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    marker = tmp_path / "ran"
    template = tmp_path / "template"
    template.write_text("Injected subject\n")
    for key, value in (("trailer.recovery-reason.cmd", f"touch {marker}; echo x"),
                       ("trailer.recovery-reason.ifExists", "addIfDifferent"),
                       ("commit.template", str(template)), ("commit.cleanup", "verbatim")):
        git(main, "config", key, value)
    (wt / "src" / "app.py").write_text("print(3)\n")
    result = recovery.recover(task_repo(main, wt, admin), allowed, "Mine", IDENTITY)
    assert git(wt, "log", "-1", "--format=%B") == f"Mine\n\n{recovery.TRAILER}"
    assert result.message == f"Mine\n\n{recovery.TRAILER}\n" and not marker.exists()


def test_a_branch_moved_meanwhile_is_not_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (wt / "src" / "app.py").write_text("print(4)\n")
    # Real git cannot stop between recover's reading HEAD and its update-ref, so the one
    # fake: reading HEAD also moves the branch, as a racing process would.
    real = gitmod.resolve_commit

    def racing(repo: gitmod.Repo, rev: str) -> str | None:
        found = real(repo, rev)
        git(main, "update-ref", "refs/heads/ccm/t1",
            git(main, "commit-tree", "-p", "ccm/t1", "-m", "raced", "ccm/t1^{tree}"))
        return found

    monkeypatch.setattr(gitmod, "resolve_commit", racing)
    with pytest.raises(GitError, match="update-ref"):
        recovery.recover(task_repo(main, wt, admin), allowed, None, IDENTITY)
    assert git(main, "log", "-1", "--format=%s", "ccm/t1") == "raced"


@needs_landlock
def test_commit_blocked_by_sandbox_is_recovered(tmp_path: Path) -> None:
    """The blocked commit end to end: the agent's commit dies under a worktree-only sandbox; the host recovers."""
    main, wt, admin = linked_worktree(tmp_path)
    agent = ("echo improved > src/app.py; mkdir -p forbidden; echo x > forbidden/f; "
             "git add -A; git commit -qm 'Improve app'")
    proc = confined([wt], agent, wt)
    assert proc.returncode == 128
    found = signatures.find_blocked_commit(proc.stderr, [admin, main / ".git"])
    assert found is not None
    result = recovery.recover(task_repo(main, wt, admin), allowed, "Improve app", IDENTITY)
    assert result.committed == ("src/app.py",) and result.refused == ("forbidden/f",)
    assert trailers(wt) == ["Recovery-Reason: sandbox blocked commit"]
    assert git(main, "show", "ccm/t1:src/app.py") == "improved"


@needs_landlock
def test_with_its_roots_the_agent_commits_itself(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    proc = confined(roots.writable_roots(wt), "echo improved > src/app.py && git commit -qam 'Improve app'", wt)
    assert proc.returncode == 0, proc.stderr
    assert signatures.find_blocked_commit(proc.stderr, [admin, main / ".git"]) is None
    result = recovery.recover(task_repo(main, wt, admin), allowed, None, IDENTITY)
    assert not result.recovered and trailers(wt) == []
