"""Writable roots: read from the files, checked for real under Landlock."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import git, make_repo
from test_sandbox import confined, linked_worktree, needs_landlock

from ccm_guard.errors import RepoError
from ccm_guard.prevent import roots

WORK = "echo more >> README.md && git add README.md && git commit -qm work"


def expected(main: Path, wt: Path, admin: Path) -> list[Path]:
    common = main.resolve() / ".git"
    return [wt.resolve(), admin.resolve(), common / "objects", common / "refs" / "heads" / "ccm",
            common / "logs" / "refs" / "heads" / "ccm"]


def test_linked_worktree_roots_from_anywhere_inside(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (wt / "src" / "deep").mkdir()
    assert roots.writable_roots(wt) == expected(main, wt, admin)
    assert roots.writable_roots(wt / "src" / "deep") == expected(main, wt, admin)


def test_roots_are_real_paths(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (tmp_path / "link").symlink_to(wt)
    got = roots.writable_roots(tmp_path / "link")
    assert got == expected(main, wt, admin)
    assert all(str(p) == os.path.realpath(p) for p in got)


def test_main_worktree_and_non_repository_need_nothing_extra(tmp_path: Path) -> None:
    main = make_repo(tmp_path / "repo")
    (tmp_path / "plain").mkdir()
    assert roots.writable_roots(main) == []
    assert roots.writable_roots(main / "src") == []
    assert roots.writable_roots(tmp_path / "plain") == []


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RepoError, match="does not exist"):
        roots.writable_roots(tmp_path / "nope")


def test_detached_head_needs_no_ref_directories(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    git(wt, "checkout", "-q", "--detach")
    assert roots.writable_roots(wt) == expected(main, wt, admin)[:3]


def test_missing_ref_and_reflog_directories_are_created(tmp_path: Path) -> None:
    main = make_repo(tmp_path / "repo")
    git(main, "config", "core.logAllRefUpdates", "false")
    wt = tmp_path / "wt"
    git(main, "worktree", "add", "-q", "-b", "ccm/t1", str(wt))
    git(main, "pack-refs", "--all")  # the branch now lives only in packed-refs
    common = main / ".git"
    assert not (common / "refs" / "heads" / "ccm").exists()
    assert not (common / "logs" / "refs" / "heads" / "ccm").exists()
    got = roots.writable_roots(wt)
    assert got == expected(main, wt, common / "worktrees" / "wt")
    assert all(p.is_dir() for p in got)


@pytest.mark.parametrize("damage, message", [
    (lambda wt, admin: (wt / ".git").write_text("nonsense\n"), "does not start with 'gitdir: '"),
    (lambda wt, admin: (wt / ".git").write_text("gitdir: /nowhere\n"), "not a directory"),
    (lambda wt, admin: (admin / "gitdir").write_text("/elsewhere/.git\n"), "run `git worktree repair`"),
    (lambda wt, admin: (admin / "commondir").unlink(), "not a linked worktree"),
    (lambda wt, admin: (admin / "HEAD").write_text("ref: refs/tags/v1\n"), "not a branch or a commit"),
    (lambda wt, admin: (admin / "HEAD").write_text("ref: refs/heads/../../config\n"), "not a branch"),
])
def test_a_failing_probe_gives_no_partial_answer(
    tmp_path: Path, damage: Callable[[Path, Path], object], message: str,
) -> None:
    _, wt, admin = linked_worktree(tmp_path)
    damage(wt, admin)
    with pytest.raises(RepoError, match=message):
        roots.writable_roots(wt)


def test_planted_symlink_never_becomes_a_root(tmp_path: Path) -> None:
    main, wt, _ = linked_worktree(tmp_path)
    refs = main / ".git" / "refs" / "heads" / "ccm"
    elsewhere = tmp_path / "ssh"
    shutil.move(refs, elsewhere)
    refs.symlink_to(elsewhere)
    with pytest.raises(RepoError, match="is not a directory .a symlink or a file."):
        roots.writable_roots(wt)


def test_worktree_pointer_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    _, wt, _ = linked_worktree(tmp_path)
    (wt / ".git").rename(tmp_path / "pointer")
    (wt / ".git").symlink_to(tmp_path / "pointer")
    with pytest.raises(RepoError, match="symlink or special file"):
        roots.writable_roots(wt)


@needs_landlock
def test_commit_succeeds_with_exactly_these_roots_and_metadata_stays_read_only(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    common = main / ".git"
    for name in ("hooks", "info"):  # the test's empty git template makes neither
        (common / name).mkdir(exist_ok=True)
    granted = roots.writable_roots(wt)
    proc = confined(granted, WORK, wt)
    assert proc.returncode == 0, proc.stderr
    assert git(main, "log", "-1", "--format=%s", "ccm/t1") == "work"
    for script in (f"echo '[core]hooksPath=/tmp' >> {common / 'config'}",
                   f"echo evil > {common / 'hooks' / 'x'}",
                   f"echo evil > {common / 'info' / 'exclude'}",
                   f"echo 0 > {common / 'refs' / 'heads' / 'main'}",
                   f"echo evil >> {main / 'README.md'}"):
        denied = confined(granted, script, wt)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, script
    assert "hooksPath" not in (common / "config").read_text()
    assert not (common / "hooks" / "x").exists()


@needs_landlock
@pytest.mark.parametrize("left_out", range(5))
def test_each_root_is_needed(tmp_path: Path, left_out: int) -> None:
    """Minimality: without any one root, the agent's edit-add-commit fails."""
    main, wt, _ = linked_worktree(tmp_path)
    granted = roots.writable_roots(wt)
    assert len(granted) == 5
    del granted[left_out]
    proc = confined(granted, WORK, wt)
    assert proc.returncode != 0
    # git's own words for EACCES: "Permission denied" for files, "insufficient permission"
    # for the object store.
    assert "Permission denied" in proc.stderr or "insufficient permission" in proc.stderr, proc.stderr
    assert git(main, "rev-parse", "ccm/t1") == git(main, "rev-parse", "main")
