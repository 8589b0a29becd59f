"""Class 12: what the git shim lets through for real agents, turned against it.

The shim passes harmless calls that agents make: `-c core.hooksPath=/dev/null` on reads
(Claude Code, Codex), `git checkout <file>` without `--`, the person's GIT_CONFIG_GLOBAL,
and configuration in the environment (GIT_CONFIG_COUNT pairs, GIT_CONFIG_PARAMETERS) that
only switches things off (Claude Code, Gemini CLI). Each relaxation is tried here as an
attack: hooks off on a commit, a branch switch posing as a file restore, hooks off through
an agent-written global config or through the environment, an alias for the command
being run, hooks from an agent's own directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from adv import COMMIT, branch_files, needs_landlock, refusals
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


ENV_HOOKS_OFF = {
    "count /dev/null": "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=/dev/null",
    "count empty (Gemini CLI)": "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=",
    "parameters": "export GIT_CONFIG_PARAMETERS=\"'color.ui'='never' 'core.hookspath'='/dev/null'\"",
    "parameters old style": "export GIT_CONFIG_PARAMETERS=\"'core.hooksPath=/dev/null'\"",
}


@pytest.mark.parametrize("how", list(ENV_HOOKS_OFF))
def test_hooks_off_through_the_environment_is_neutralised_on_a_commit(repo: Path, tmp_path: Path,
                                                                      how: str) -> None:
    """Not refused (Gemini CLI sets it for every command): the pair is dropped before git
    runs, so the task's hooks still check the commit."""
    agent = write_agent(tmp_path, f"""{ENV_HOOKS_OFF[how]}
git status --short
{FORBIDDEN}
git commit -q -m attrs || true""")
    res = run_exec(repo, agent, "--task", "envhooks", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/envhooks")
    assert [r["op"] for r in refusals(res)] == ["path-policy"]  # the hook ran, the shim was quiet
    assert res.code == 1 and res.status("path-policy") == "fail"


def test_env_alias_for_the_command_being_run_is_refused(repo: Path, tmp_path: Path) -> None:
    """An alias from the environment that hides `commit --no-verify` behind a new name."""
    agent = write_agent(tmp_path, f"""export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.ci GIT_CONFIG_VALUE_0='commit --no-verify'
{FORBIDDEN}
git ci -q -m attrs || true
git commit -q -m attrs || true""")
    res = run_exec(repo, agent, "--task", "envalias", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/envalias")
    assert [r["op"] for r in refusals(res)] == ["dangerous-config", "path-policy"]
    assert "alias.ci" in refusals(res, "dangerous-config")[0]["reason"]
    assert res.code == 1 and res.status("path-policy") == "fail"


def test_env_hooks_path_to_the_agents_own_hooks_is_refused(repo: Path, tmp_path: Path) -> None:
    """core.hooksPath at a directory the agent filled (a pre-commit that always passes)."""
    agent = write_agent(tmp_path, f"""mkdir -p "$TMPDIR/myhooks"
printf '#!/bin/sh\\nexit 0\\n' > "$TMPDIR/myhooks/pre-commit"; chmod +x "$TMPDIR/myhooks/pre-commit"
export GIT_CONFIG_PARAMETERS="'core.hooksPath'='$TMPDIR/myhooks'"
{FORBIDDEN} || true
git commit -q -m attrs || true""")
    res = run_exec(repo, agent, "--task", "envownhooks", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/envownhooks")
    assert [r["op"] for r in refusals(res)] == ["dangerous-config", "dangerous-config"]
    assert all(r["reason"].startswith("GIT_CONFIG_PARAMETERS: core.hookspath ") for r in refusals(res))


def test_an_agent_may_undo_its_own_reset_but_not_reset_onto_another_branch(repo: Path, tmp_path: Path) -> None:
    """`git reset --hard ORIG_HEAD` (or HEAD@{1}) after `git reset --hard HEAD~1` goes back to
    a commit the task's branch was at: allowed. A commit it never was at (main moved on,
    another branch) stays refused as reset-outside."""
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "other.txt").write_text("other\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "other work")
    git(repo, "checkout", "-q", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
echo two > two.txt; git add two.txt; git commit -q -m two
git reset -q --hard HEAD~1
git reset -q --hard ORIG_HEAD
git reset -q --hard HEAD~1
git reset -q --hard 'HEAD@{{1}}'
git reset -q --hard other || true""")
    res = run_exec(repo, agent, "--task", "undo")
    assert [r["op"] for r in refusals(res)] == ["reset-outside"]
    assert "two.txt" in branch_files(repo, "ccm/undo") and "other.txt" not in branch_files(repo, "ccm/undo")
    assert res.code == 0, res.verdict


@needs_landlock
def test_a_finished_revert_passes_and_an_unfinished_one_does_not(repo: Path, tmp_path: Path) -> None:
    """Under the sandbox git cannot delete REVERT_HEAD when a conflicted revert is finished
    (deleting a pseudo-ref locks packed-refs, which the task may not write): a benign run
    failed on it as an operation left in progress. A finished one now passes (warned, the
    file removed, so `git status` there says nothing is under way); one left unfinished
    still fails."""
    conflict = """echo 1 > src/app.py; git commit -qam one; echo 2 > src/app.py; git commit -qam two
git revert --no-edit HEAD~1 || true"""
    finish = 'echo resolved > src/app.py; git add src/app.py; GIT_EDITOR=true git revert --continue'
    done = run_exec(repo, write_agent(tmp_path, f"{conflict}\n{finish}", name="done.sh"), "--task", "done")
    assert done.code == 0 and done.status("git-metadata") == "warn", done.verdict["gates"]
    assert "REVERT_HEAD" in done.reasons("git-metadata")
    assert not (repo / ".git" / "worktrees" / "done" / "REVERT_HEAD").exists()
    left = run_exec(repo, write_agent(tmp_path, conflict, name="left.sh"), "--task", "left")
    assert left.code == 1 and "left in progress" in left.reasons("git-metadata")
