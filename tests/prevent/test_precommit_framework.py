"""The check-paths hook through the real pre-commit framework (it installs ccm-guard from
this repository into its own virtualenv, so this test needs the package index)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import AUTHOR, ROOT, git, make_repo


def test_pre_commit_framework_refuses_a_path_the_role_forbids(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "project")
    rev = git(ROOT, "rev-parse", "HEAD")
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {ROOT}\n  rev: {rev}\n  hooks:\n  - id: ccm-guard-paths\n    args: [--role, implementor]\n")
    git(repo, "add", ".pre-commit-config.yaml")
    git(repo, "commit", "-q", "-m", "use ccm-guard's hook")
    env = {**os.environ, **AUTHOR, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    install = subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, env=env,
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr

    (repo / "src/more.py").write_text("ok\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, env=env, check=True)
    good = subprocess.run(["git", "commit", "-m", "fine"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    shown = good.stdout + good.stderr  # git prints the hooks' output on stderr
    assert "ccm-guard path policy" in shown and "Passed" in shown

    (repo / ".gitattributes").write_text("* filter=evil\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, env=env, check=True)
    bad = subprocess.run(["git", "commit", "-m", "sneaky"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0
    assert ".gitattributes: changed, but forbidden by '**/.gitattributes' (staged)" in bad.stdout + bad.stderr
    assert git(repo, "log", "-1", "--format=%s") == "fine"


def test_a_persons_own_commit_is_not_held_to_agents_rules(repo: Path) -> None:
    """check-paths on the staged change without --role (the hook without args): a person
    may change .gitignore; a case twin, which breaks a checkout on macOS, still fails."""
    from conftest import ccm

    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", ".gitignore")
    assert ccm("check-paths", cwd=repo).returncode == 0
    assert ccm("check-paths", "--role", "implementor", cwd=repo).returncode == 1
    git(repo, "commit", "-q", "-m", "ignore build")
    (repo / "README.MD").write_text("twin\n")
    git(repo, "add", "README.MD")
    twin = ccm("check-paths", cwd=repo)
    assert twin.returncode == 1 and "README.MD" in twin.stdout
