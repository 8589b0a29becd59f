"""Class 2: disabling the guard hooks.

The task's hooks are set in its own config.worktree (core.hooksPath, which wins over
every other scope) and live under the state home. Switching them off is possible for an
agent that is not sandboxed; the path-policy gate judges the commits all the same, and
every place the switch can be made is in the snapshot.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from adv import (
    COMMIT,
    all_paths,
    branch_files,
    plain_git,
    refusals,
)
from conftest import git, marker_script, run_exec, write_agent

FORBIDDEN = "echo '* filter=evil' > .gitattributes; git add .gitattributes"


def test_no_verify_is_refused_by_the_shim(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{FORBIDDEN}\ngit commit -q --no-verify -m attrs || true\ngit commit -q -m attrs || true")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "nv", "--no-require-commit")
    assert ".gitattributes" not in branch_files(repo, "ccm/nv")
    assert [r["op"] for r in refusals(res)] == ["no-verify", "path-policy"]  # the shim, then the hook
    assert res.code == 1 and res.status("path-policy") == "fail"  # still staged: the gate names it


def test_no_verify_with_the_real_git_commits_and_path_policy_fails(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f'{FORBIDDEN}\n"$CCM_GUARD_REAL_GIT" commit -q --no-verify -m attrs')
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "nvr")
    assert ".gitattributes" in branch_files(repo, "ccm/nvr")
    assert not refusals(res)
    assert res.code == 1 and ".gitattributes" in all_paths(res, "path-policy")


def test_hooks_path_in_the_shared_config_does_not_switch_off_the_tasks_hooks(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"rgit config core.hooksPath /dev/null\n{FORBIDDEN}\ngit commit -q -m attrs || true\n"
                        "git reset -q; rm .gitattributes\n" + COMMIT)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "hp")
    # The attack happened (the key was set in the shared config); ccm-guard unset it after the run.
    assert "--add core.hookspath /dev/null" in Path(res.verdict["log_dir"], "quarantine", "config-keys.sh").read_text()
    assert git(repo, "config", "core.hooksPath", check=False) == ""
    assert [r["op"] for r in refusals(res)] == ["path-policy"]  # the worktree's own setting won
    assert ".gitattributes" not in branch_files(repo, "ccm/hp")
    assert res.code == 1
    assert "DANGEROUS (runs code or steers git) core.hookspath: (unset) -> '/dev/null'" in res.reasons("git-metadata")


def test_hooks_path_in_the_global_config_is_reported(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    hooks = tmp_path / "evil-hooks"
    marker_script(hooks, marker, "pre-commit")
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '[core]\\n\\thooksPath = {hooks}\\n' >> \"$HOME/.gitconfig\"")
    res = run_exec(repo, agent, "--sandbox", "none")
    gitconfig = Path(os.environ["HOME"], ".gitconfig")
    assert res.code == 1 and res.status("git-metadata") == "fail"
    assert f"{gitconfig} was modified: DANGEROUS (runs code or steers git) core.hookspath" in res.reasons("git-metadata")
    assert not marker.exists()
    plain_git(repo, "commit", "-q", "--allow-empty", "-m", "later")  # the person's next commit, anywhere
    assert marker.exists(), "the planted global hooksPath never ran: the test proves nothing"


def test_include_if_in_the_shared_config_is_dangerous(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
printf '[core]\\n\\thooksPath = /dev/null\\n' > "$TMPDIR/inc.cfg"
rgit config 'includeIf.gitdir:/.path' "$TMPDIR/inc.cfg" """)
    res = run_exec(repo, agent, "--sandbox", "none")
    # It took effect until the run ended; then ccm-guard unset the include (kept in the logs).
    restore = Path(res.verdict["log_dir"], "quarantine", "config-keys.sh")
    assert "--add includeif.gitdir:/.path " in restore.read_text()
    assert plain_git(repo, "config", "core.hooksPath").stdout.strip() == ""
    subprocess.run(["sh", str(restore)], check=True)
    assert plain_git(repo, "config", "core.hooksPath").stdout.strip() == "/dev/null"  # the plant was live
    assert res.code == 1
    assert "DANGEROUS (runs code or steers git) includeif.gitdir:/.path" in res.reasons("git-metadata")
    assert res.status("clean-tree") == "skipped"


def _task_hooks(res_worktree: Path) -> Path:
    return Path(git(res_worktree, "config", "--get", "core.hooksPath"))


def test_deleting_the_tasks_pre_commit_hook_lets_a_commit_through_and_is_reported(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f'rm "$(git config --get core.hooksPath)/pre-commit"\n{FORBIDDEN}\ngit commit -q -m attrs')
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "rmhook")
    hooks = _task_hooks(Path(res.verdict["worktree"]))
    assert not (hooks / "pre-commit").exists() and ".gitattributes" in branch_files(repo, "ccm/rmhook")
    assert res.code == 1 and ".gitattributes" in all_paths(res, "path-policy")
    assert f"{hooks}/pre-commit was removed" in res.reasons("git-metadata")


def test_chmod_of_the_tasks_hook_is_reported(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f'chmod -x "$(git config --get core.hooksPath)/pre-commit"\n{FORBIDDEN}\n'
                        'git commit -q -m attrs 2>/dev/null')
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "chmodhook")
    hooks = _task_hooks(Path(res.verdict["worktree"]))
    assert not os.access(hooks / "pre-commit", os.X_OK) and ".gitattributes" in branch_files(repo, "ccm/chmodhook")
    assert res.code == 1 and ".gitattributes" in all_paths(res, "path-policy")
    assert f"{hooks}/pre-commit was modified" in res.reasons("git-metadata")


def test_editing_the_tasks_config_worktree_is_dangerous(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""printf '[core]\\n\\thooksPath = /dev/null\\n' > "$(git rev-parse --git-dir)/config.worktree"
{FORBIDDEN}; git commit -q -m attrs""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cfgwt")
    assert ".gitattributes" in branch_files(repo, "ccm/cfgwt") and not refusals(res)
    assert res.code == 1
    assert "worktrees/cfgwt/config.worktree was modified: DANGEROUS (runs code or steers git) core.hookspath" \
        in res.reasons("git-metadata")
    assert res.status("path-policy") == "skipped"  # git is no longer run on it: the run fails


def test_unsetting_extensions_worktree_config_is_dangerous(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"rgit config --unset extensions.worktreeConfig\n{FORBIDDEN}\ngit commit -q -m attrs")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "ext")
    assert ".gitattributes" in branch_files(repo, "ccm/ext") and not refusals(res)  # the hooks were gone
    assert res.code == 1
    assert "DANGEROUS (runs code or steers git) extensions.worktreeconfig: 'true' -> (unset)" in res.reasons("git-metadata")


def test_the_persons_skip_switch_set_by_the_agent_is_ignored_by_the_hooks(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{FORBIDDEN}\nCCM_GUARD_SKIP=1 git commit -q -m attrs || true\n"
                        "git reset -q; rm .gitattributes\n" + COMMIT)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "skip")
    assert ".gitattributes" not in branch_files(repo, "ccm/skip")
    assert [r["op"] for r in refusals(res)] == ["path-policy"]
    assert res.code == 0


def test_a_forged_hook_chain_variable_does_not_skip_the_check(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{FORBIDDEN}
hooks=$(git config --get core.hooksPath)
CCM_GUARD_HOOK_CHAIN="pre-commit:/elsewhere" git commit -q -m attrs || true
CCM_GUARD_HOOK_CHAIN="pre-commit:$hooks/pre-commit:/x" git commit -q -m attrs || true
git reset -q; rm .gitattributes
{COMMIT}""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "chain")
    assert ".gitattributes" not in branch_files(repo, "ccm/chain")
    assert [r["op"] for r in refusals(res)] == ["path-policy", "path-policy"]
    assert res.code == 0
