"""Class 12: what the git shim lets through for real agents, turned against it.

The shim passes harmless calls that agents make: `-c core.hooksPath=/dev/null` on reads
(Claude Code, Codex), `git checkout <file>` without `--`, and the person's
GIT_CONFIG_GLOBAL. Each relaxation is tried here as an attack: hooks off on a commit, a
branch switch posing as a file restore, hooks off through an agent-written global config.
"""

from __future__ import annotations

from pathlib import Path

from adv import COMMIT, branch_files, refusals
from conftest import git, run_exec, write_agent

FORBIDDEN = "echo '* filter=evil' > .gitattributes; git add .gitattributes"


def test_hooks_path_dev_null_on_a_commit_is_refused_as_no_verify(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""git -c core.hooksPath=/dev/null status --short
{FORBIDDEN}
git -c core.hooksPath=/dev/null commit -q -m attrs || true
git commit -q -m attrs || true""")
    res = run_exec(repo, agent, "--task", "hpnull", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/hpnull")
    # The read passed; the commit with hooks off is the shim's, the plain one the hook's.
    assert [r["op"] for r in refusals(res)] == ["no-verify", "path-policy"]
    assert "core.hooksPath=/dev/null" in refusals(res, "no-verify")[0]["reason"]
    assert res.code == 1 and res.status("path-policy") == "fail"


def test_checkout_of_a_remote_tracking_name_is_refused_as_a_switch(repo: Path, tmp_path: Path) -> None:
    """`git checkout feature` reads like a file restore but would create and switch to a
    local branch from origin/feature."""
    git(repo, "update-ref", "refs/remotes/origin/feature", "HEAD")
    git(repo, "config", "remote.origin.url", str(tmp_path / "nowhere"))
    git(repo, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
    agent = write_agent(tmp_path, f"git checkout feature || true\n{COMMIT}")
    res = run_exec(repo, agent, "--task", "dwim")
    assert [r["op"] for r in refusals(res)] == ["switch"]
    assert git(repo, "branch", "--list", "feature") == ""
    assert "work.txt" in branch_files(repo, "ccm/dwim")
    assert res.code == 0


def test_agent_written_global_config_cannot_switch_the_tasks_hooks_off(repo: Path, tmp_path: Path) -> None:
    """GIT_CONFIG_GLOBAL passes the shim; the task's own config.worktree still wins."""
    agent = write_agent(tmp_path, f"""printf '[core]\\n\\thooksPath = /dev/null\\n[user]\\n\\tname = A\\n\\temail = a@example.com\\n' > "$TMPDIR/evil.gitconfig"
export GIT_CONFIG_GLOBAL="$TMPDIR/evil.gitconfig"
{FORBIDDEN}
git commit -q -m attrs || true""")
    res = run_exec(repo, agent, "--task", "globalcfg", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/globalcfg")
    assert [r["op"] for r in refusals(res)] == ["path-policy"]  # the hook ran
    assert res.code == 1 and res.status("path-policy") == "fail"
