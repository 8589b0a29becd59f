"""Class 1: going around the git shim.

The shim is the first `git` on the agent's PATH; an agent can always reach the real
binary. What stops it then is the guard hooks (they live in the task's config.worktree
and run for any git binary) and, when it also switches hooks off, the gates.
"""

from __future__ import annotations

from pathlib import Path

from adv import COMMIT, refusals
from conftest import git, run_exec, write_agent


def test_real_git_by_absolute_path_is_stopped_by_the_reference_transaction_hook(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f'{COMMIT}\n"$CCM_GUARD_REAL_GIT" update-ref refs/heads/main HEAD 2> "$TMPDIR/err" || true\n'
                        'cat "$TMPDIR/err" >&2')
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main  # prevented
    assert "ccm-guard: refused: update of refs/heads/main" in res.stderr  # the agent was told why
    hook = refusals(res, "ref-write")
    assert hook and hook[0]["source"] == "hook" and hook[0]["refs"] == ["refs/heads/main"]
    assert res.code == 0 and res.status("refs-untouched") == "pass"


def test_command_p_git_with_hooks_off_moves_main_and_fails_refs_untouched(repo: Path, tmp_path: Path) -> None:
    before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\ncommand -p git -c core.hooksPath=/dev/null update-ref refs/heads/main HEAD")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == res.verdict["head"] != before  # it happened
    assert res.code == 1 and res.status("refs-untouched") == "fail"
    assert f"refs/heads/main moved {before[:12]} -> {res.verdict['head'][:12]}" in res.reasons("refs-untouched")
    assert not refusals(res)  # neither the shim nor the hooks saw it: the gate did


def test_a_copied_git_binary_tags_and_fails_refs_untouched(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f'{COMMIT}\ncp "$CCM_GUARD_REAL_GIT" "$TMPDIR/g"\n'
                        '"$TMPDIR/g" -c core.hooksPath=/dev/null tag release-1.0 HEAD')
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "release-1.0") == res.verdict["head"]
    assert res.code == 1
    assert f"refs/tags/release-1.0 was created at {res.verdict['head'][:12]}" in res.reasons("refs-untouched")


def test_git_exec_path_pointing_at_planted_subcommands_is_refused_by_the_shim(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    agent = write_agent(tmp_path, f"""{COMMIT}
mkdir -p "$TMPDIR/exec"; printf '#!/bin/sh\\necho ran >> {marker}\\n' > "$TMPDIR/exec/git-status"
chmod +x "$TMPDIR/exec/git-status"
GIT_EXEC_PATH="$TMPDIR/exec" git status || true""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert not marker.exists()  # prevented
    refused = refusals(res, "redirect")
    assert refused and refused[0]["argv"] == ["status"] and "GIT_EXEC_PATH" in refused[0]["reason"]
    assert "ccm-guard: refused: GIT_EXEC_PATH set" in res.stderr


def test_env_i_loses_the_shim_but_not_the_hooks(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\nenv -i PATH=/usr/bin:/bin HOME=$HOME git update-ref refs/heads/main HEAD || true")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    # The hook found its settings from the path baked into it, not from the (empty) environment.
    assert [r["hook"] for r in refusals(res, "ref-write")] == ["reference-transaction"]
    assert res.code == 0


def test_the_persons_alias_for_push_is_stopped_by_the_pre_push_hook(repo: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "config", "alias.ship", "push origin HEAD:refs/heads/shipped")  # the person's own alias
    agent = write_agent(tmp_path, f"{COMMIT}\ngit ship || true")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(remote, "for-each-ref") == ""  # nothing left the machine
    pushed = refusals(res, "remote")
    assert pushed and pushed[0]["hook"] == "pre-push"
    assert res.code == 0


def test_dash_c_alias_that_runs_a_shell_is_refused(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    agent = write_agent(tmp_path, f"{COMMIT}\ngit -c 'alias.st=!echo ran >> {marker}' st || true")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert not marker.exists()
    assert [r["argv"][:2] for r in refusals(res, "dangerous-config")] == [["-c", f"alias.st=!echo ran >> {marker}"]]


def test_git_dir_and_work_tree_aimed_at_the_persons_checkout_is_refused_by_the_shim(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
git --git-dir={repo}/.git --work-tree={repo} commit -q --allow-empty -m evil || true
GIT_DIR={repo}/.git git commit -q --allow-empty -m evil || true
GIT_INDEX_FILE={repo}/.git/index git add work.txt || true""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    assert git(repo, "status", "--porcelain") == ""
    assert [r["op"] for r in refusals(res)] == ["redirect"] * 3
    assert res.code == 0


def test_git_dir_aimed_at_the_persons_checkout_with_real_git_commits_on_main_and_is_reported(
        repo: Path, tmp_path: Path) -> None:
    """A commit made the way the person would make it (their index moves too) cannot be told
    from theirs: a stated limitation, reported as a warning; the sandbox prevents it."""
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
echo evil > {repo}/evil.txt
rgit --git-dir={repo}/.git --work-tree={repo} add evil.txt
rgit --git-dir={repo}/.git --work-tree={repo} commit -q -m 'looks like yours'""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "log", "-1", "--format=%s", "main") == "looks like yours" and git(repo, "rev-parse", "main~1") == main
    assert res.status("refs-untouched") == "warn"
    assert "refs/heads/main moved" in res.reasons("refs-untouched") and "your own commit, or the agent's?" in res.reasons("refs-untouched")


def test_git_dir_aimed_at_the_persons_checkout_is_denied_by_landlock(repo: Path, tmp_path: Path) -> None:
    import pytest
    from adv import LANDLOCK

    if not LANDLOCK:
        pytest.skip("this kernel has no Landlock")
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
if rgit --git-dir={repo}/.git --work-tree={repo} commit -q --allow-empty -m evil 2> "$TMPDIR/err"; then echo COMMITTED; fi
cat "$TMPDIR/err" >&2""")
    res = run_exec(repo, agent, "--sandbox", "landlock")
    assert git(repo, "rev-parse", "main") == main
    assert "COMMITTED" not in res.stderr and "Permission denied" in res.stderr
    assert res.code == 0 and res.status("refs-untouched") == "pass"


def test_git_config_parameters_switch_hooks_off_and_path_policy_catches_the_commit(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """echo '* filter=evil' > .gitattributes; git add .gitattributes
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=/dev/null "$CCM_GUARD_REAL_GIT" commit -q -m attrs""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cfgparams")
    assert ".gitattributes" in git(repo, "ls-tree", "--name-only", "ccm/cfgparams")  # the hook never ran
    assert not refusals(res)
    assert res.code == 1 and res.status("path-policy") == "fail"
    assert ".gitattributes: changed, but" in res.reasons("path-policy")


def test_git_config_count_through_the_shim_cannot_switch_the_hooks_off(repo: Path, tmp_path: Path) -> None:
    """Hooks switched off through the environment are switched on again by the shim (the
    pair is neutralised, not refused: agents like Gemini CLI set it on every command), so
    the task's pre-commit hook still refuses the forbidden file."""
    agent = write_agent(tmp_path, """echo '* filter=evil' > .gitattributes; git add .gitattributes
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=/dev/null git commit -q -m attrs || true
git reset -q; rm .gitattributes; """ + COMMIT)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cfgcount")
    assert ".gitattributes" not in git(repo, "ls-tree", "--name-only", "ccm/cfgcount")
    assert [r.get("hook") for r in refusals(res)] == ["pre-commit"]
    assert res.code == 0


def test_a_ref_named_after_the_task_branch_and_a_unicode_line_separator_is_stopped_by_the_hook(
        repo: Path, tmp_path: Path) -> None:
    """git allows U+2028 and U+0085 in ref names. Split as text lines, the hook's input
    `refs/heads/<task branch>\\u2028HEAD` would read as two names it allows."""
    agent = write_agent(tmp_path, f'''{COMMIT}
odd="refs/heads/$CCM_GUARD_BRANCH$(printf '\\342\\200\\250')HEAD"
"$CCM_GUARD_REAL_GIT" update-ref "$odd" HEAD 2> "$TMPDIR/err" || true
odd2="refs/heads/$CCM_GUARD_BRANCH$(printf '\\302\\205')ORIG_HEAD"
"$CCM_GUARD_REAL_GIT" update-ref "$odd2" HEAD 2>> "$TMPDIR/err" || true
cat "$TMPDIR/err" >&2''')
    res = run_exec(repo, agent, "--sandbox", "none")
    branch = res.verdict["branch"]
    assert git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/") == f"refs/heads/{branch}\nrefs/heads/main"
    hook = [r["refs"] for r in refusals(res, "ref-write") if r["source"] == "hook"]
    assert [f"refs/heads/{branch}\u2028HEAD"] in hook and [f"refs/heads/{branch}\u0085ORIG_HEAD"] in hook
    assert res.code == 0 and res.status("refs-untouched") == "pass"
