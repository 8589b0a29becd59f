"""`ccm-guard install/uninstall --worktree` and the hook command, through the CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import AUTHOR, ccm, git


def test_install_worktree_guards_only_that_worktree_and_uninstall_restores(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(wt))
    config_before = (repo / ".git/config").read_bytes()
    installed = ccm("install", "--worktree", str(wt), cwd=repo)
    assert installed.returncode == 0, installed.stderr
    refused = subprocess.run(["git", "update-ref", "refs/heads/main", "HEAD"], cwd=wt, capture_output=True, text=True)
    assert refused.returncode != 0 and "ccm-guard: refused: update of refs/heads/main" in refused.stderr
    mine = subprocess.run(["git", "update-ref", "refs/heads/main", "HEAD"], cwd=repo, capture_output=True, text=True,
                          env={**AUTHOR, "PATH": "/usr/bin:/bin"})
    assert mine.returncode == 0  # the person's own checkout is not guarded
    assert git(wt, "commit", "-q", "--allow-empty", "-m", "ok") == ""  # the worktree's own branch moves
    removed = ccm("uninstall", "--worktree", str(wt), cwd=repo)
    assert removed.returncode == 0
    assert (repo / ".git/config").read_bytes() == config_before
    assert git(wt, "update-ref", "refs/heads/main", "HEAD") == ""


def test_install_refuses_a_detached_worktree(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "--detach", str(wt))
    proc = ccm("install", "--worktree", str(wt), cwd=repo)
    assert proc.returncode == 5 and "no branch checked out" in proc.stderr
