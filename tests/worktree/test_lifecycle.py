"""After the run: apply, discard, restore, rollback, snapshot, diff, BLOCKED and resume.

Real repositories, real `ccm-guard` processes; each test checks the repository afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ccm, git, make_repo, run_exec, write_agent

COMMIT_A = 'echo "feature" > feature.txt\nrgit add feature.txt\nrgit commit -q -m "add feature"\n'


def _task(repo: Path, tmp_path: Path, task: str, body: str = COMMIT_A, *options: str) -> dict[str, Any]:
    agent = write_agent(tmp_path, body, name=f"{task}.sh")
    result = run_exec(repo, agent, "--task", task, *options)
    return result.verdict | {"code": result.code}


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_apply_merges_without_touching_the_person_s_files_and_updates_their_clean_checkout(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1")
    assert v["code"] == 0, v
    before = git(repo, "rev-parse", "main")
    proc = ccm("task", "apply", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    applied = _json(proc)["applied"]
    assert applied["old"] == before and applied["target"] == "main" and applied["files"] == 1
    new = git(repo, "rev-parse", "main")
    assert new == applied["new"]
    assert git(repo, "rev-parse", f"{new}^1") == before and git(repo, "rev-parse", f"{new}^2") == v["head"]
    assert "Ccm-Guard-Task: t1" in git(repo, "log", "-1", "--format=%B", new)
    # The checkout was clean, so it was brought up to date: the file is there, status clean.
    assert (repo / "feature.txt").read_text() == "feature\n"
    assert git(repo, "status", "--porcelain") == ""
    show = _json(ccm("task", "show", "t1", "--json", cwd=repo))
    assert show["status"] == "APPLIED" and show["options"]["applied"]["new"] == new
    # Applying twice is refused with the reason.
    again = ccm("task", "apply", "t1", cwd=repo)
    assert again.returncode == 8 and "already applied" in again.stderr


_IMPORTED = """import json, sys
from ccm_guard.cli import main
try:
    main(sys.argv[1:], prog_name="ccm-guard")
finally:
    print(json.dumps(sorted(m for m in ("ctypes", "ccm_guard.agent.processes", "ccm_guard.policy",
                                         "ccm_guard.detect.gates") if m in sys.modules)), file=sys.stderr)
"""


def test_apply_imports_neither_the_process_search_nor_the_policy(repo: Path, tmp_path: Path) -> None:
    """An apply reads no policy and looks for no process (ctypes): a few ms of every apply."""
    assert _task(repo, tmp_path, "t1")["code"] == 0
    proc = subprocess.run([sys.executable, "-c", _IMPORTED, "task", "apply", "t1", "--json"], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert _json(proc)["applied"]["target"] == "main"
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == []


def test_apply_refuses_a_checkout_whose_changes_are_in_its_way_and_changes_nothing(repo: Path, tmp_path: Path) -> None:
    """As git merge: an uncommitted change to a file the apply changes, or an untracked file
    where it puts one, refuses the apply; the branch is put back and no file is touched."""
    _task(repo, tmp_path, "t1", COMMIT_A + 'echo "theirs" > README.md\nrgit commit -q -am "readme"\n')
    refs = git(repo, "for-each-ref")
    for mine, path, said in (("my own edit\n", "README.md", "uncommitted changes in the way"),
                             ("mine\n", "feature.txt", "files of yours where the apply puts its own")):
        (repo / path).write_text(mine)
        proc = ccm("task", "apply", "t1", cwd=repo)
        assert proc.returncode == 8, proc.stderr
        assert said in proc.stderr and path in proc.stderr and "nothing" in proc.stderr and "changed" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert git(repo, "for-each-ref") == refs
        assert (repo / path).read_text() == mine
        shown = _json(ccm("task", "show", "t1", "--json", cwd=repo))
        assert shown["status"] == "COMMITTED" and "applying" not in shown["options"]  # no move left on record
        (repo / path).unlink() if path == "feature.txt" else git(repo, "checkout", "--", path)
    assert not (repo / "feature.txt").exists() and git(repo, "status", "--porcelain") == ""


def test_apply_never_overwrites_the_persons_ignored_files(repo: Path, tmp_path: Path) -> None:
    """Git takes an ignored file as expendable (read-tree and git merge overwrite one); a task
    that force-adds .env, or a file where the person's ignored file is in the way of a
    directory it adds, is refused before anything moves, and the person's files stay."""
    (repo / ".gitignore").write_text(".env\nbuild\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    _task(repo, tmp_path, "t1", 'echo "TOKEN=agent" > .env\nrgit add -f .env\nrgit commit -q -m env\n')
    _task(repo, tmp_path, "t2", 'mkdir build\necho x > build/out.txt\nrgit add -f build/out.txt\nrgit commit -q -m b\n')
    (repo / ".env").write_text("TOKEN=mine\n")
    (repo / "build").write_text("my build notes\n")
    refs = git(repo, "for-each-ref")
    for task, path in (("t1", ".env"), ("t2", "build")):
        proc = ccm("task", "apply", task, cwd=repo)
        assert proc.returncode == 8 and path in proc.stderr and "ignored" in proc.stderr, proc.stderr
        assert git(repo, "for-each-ref") == refs
    assert (repo / ".env").read_text() == "TOKEN=mine\n" and (repo / "build").read_text() == "my build notes\n"
    (repo / ".env").unlink()
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0
    assert (repo / ".env").read_text() == "TOKEN=agent\n"


def test_apply_into_a_checkout_whose_files_were_only_touched(repo: Path, tmp_path: Path) -> None:
    """A file the apply changes whose stat data alone changed (touched, saved unchanged) is
    no change in the way: the index is refreshed, as git merge does, and the apply lands."""
    _task(repo, tmp_path, "t1", COMMIT_A + 'echo "theirs" > README.md\nrgit commit -q -am "readme"\n')
    os.utime(repo / "README.md", ns=(1, 1))
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "README.md").read_text() == "theirs\n" and git(repo, "status", "--porcelain") == ""


def test_apply_keeps_the_persons_changes_out_of_its_way(repo: Path, tmp_path: Path) -> None:
    """Changes to files the apply does not touch stay as they were, staged or not, and the
    checkout is brought up to date around them (no status walk of the tree first)."""
    _task(repo, tmp_path, "t1")
    (repo / "README.md").write_text("my own edit\n")
    (repo / "notes.txt").write_text("staged\n")
    git(repo, "add", "notes.txt")
    proc = ccm("task", "apply", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "feature.txt").read_text() == "feature\n"
    assert (repo / "README.md").read_text() == "my own edit\n"
    assert git(repo, "diff", "--name-only") == "README.md" and git(repo, "diff", "--cached", "--name-only") == "notes.txt"
    assert git(repo, "rev-parse", "HEAD") == _json(proc)["applied"]["new"]


def test_apply_into_a_branch_not_checked_out_touches_no_work_tree(repo: Path, tmp_path: Path) -> None:
    git(repo, "branch", "release")
    _task(repo, tmp_path, "t1")
    proc = ccm("task", "apply", "t1", "--into", "release", "--strategy", "squash", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    new = git(repo, "rev-parse", "release")
    assert git(repo, "rev-list", "--count", "--parents", "-1", new) and \
        len(git(repo, "log", "-1", "--format=%P", new).split()) == 1  # squash: one parent
    assert git(repo, "show", f"{new}:feature.txt") == "feature"
    assert not (repo / "feature.txt").exists()  # main's checkout untouched


def test_conflicting_apply_reports_each_path_and_changes_nothing(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1", 'echo agent > README.md\nrgit commit -q -am "agent edit"\n')
    (repo / "README.md").write_text("person edit\n")
    git(repo, "commit", "-q", "-am", "person edit")
    refs = git(repo, "for-each-ref")
    show = _json(ccm("task", "show", "t1", "--json", cwd=repo))
    assert show["divergence"]["conflicts"] == {"README.md": show["divergence"]["conflicts"]["README.md"]}
    assert show["divergence"]["task_commits"] == 1 and show["divergence"]["target_commits"] == 1
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8 and "conflicts in 1 path(s)" in proc.stderr and "README.md" in proc.stderr
    assert git(repo, "for-each-ref") == refs and git(repo, "status", "--porcelain") == ""


def test_ff_strategy_refuses_when_the_target_moved(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1")
    (repo / "other.txt").write_text("x\n")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-q", "-m", "person")
    proc = ccm("task", "apply", "t1", "--strategy", "ff", cwd=repo)
    assert proc.returncode == 8 and "not a fast-forward" in proc.stderr


def test_apply_refuses_a_task_that_failed_its_gates(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1", COMMIT_A + "echo left > loose.txt\n")
    assert v["code"] == 1
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 7 and "ERRORED" in proc.stderr


def test_apply_refuses_when_the_branch_moved_after_the_gates(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1")
    wt = Path(_json(ccm("task", "show", "t1", "--json", cwd=repo))["worktree"])
    (wt / "late.txt").write_text("late\n")
    git(wt, "add", "late.txt")
    git(wt, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "after the gates")
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8 and "moved since its gates passed" in proc.stderr


def test_exec_apply_lands_on_pass(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1", COMMIT_A, "--apply")
    assert v["code"] == 0 and v["applied"]["target"] == "main"
    assert git(repo, "rev-parse", "main") == v["applied"]["new"]
    assert (repo / "feature.txt").exists()


def test_discard_archives_committed_and_uncommitted_work_and_restore_brings_it_back(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1", COMMIT_A + "echo wip > wip.txt\necho more >> README.md\n")
    assert v["code"] == 1  # uncommitted work: clean-tree fails, the worktree is kept
    wt = Path(v["worktree"])
    proc = ccm("task", "discard", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    result = _json(proc)
    assert result["archive"] == "refs/ccm-guard/archive/t1"
    assert not wt.exists() and not git(repo, "branch", "--list", "ccm/t1")
    archive = git(repo, "rev-parse", "refs/ccm-guard/archive/t1")
    assert git(repo, "show", f"{archive}:wip.txt") == "wip"
    assert git(repo, "rev-parse", f"{archive}^") == v["head"]
    assert _json(ccm("task", "show", "t1", "--json", cwd=repo))["status"] == "DISCARDED"

    proc = ccm("task", "restore", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "ccm/t1") == v["head"]
    assert (wt / "wip.txt").read_text() == "wip\n" and (wt / "feature.txt").exists()
    status = git(wt, "status", "--porcelain")
    assert "?? wip.txt" in status and "M README.md" in status  # (git() strips the leading blank)
    assert _json(ccm("task", "show", "t1", "--json", cwd=repo))["status"] == "ERRORED"
    # And it can be discarded again: the archive is rebuilt from the restored worktree.
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0


def test_rollback_to_base_saves_the_work_as_a_snapshot_first(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1")
    wt = Path(v["worktree"])
    (wt / "extra.txt").write_text("extra\n")
    proc = ccm("task", "rollback", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    saved = _json(proc)["saved_as_snapshot"]
    assert git(repo, "rev-parse", "ccm/t1") == v["base"]
    assert not (wt / "feature.txt").exists() and not (wt / "extra.txt").exists()
    snap = git(repo, "rev-parse", f"refs/ccm-guard/snapshots/t1/{saved}")
    assert git(repo, "show", f"{snap}:extra.txt") == "extra" and git(repo, "show", f"{snap}:feature.txt") == "feature"
    # ... and rolling back to that snapshot brings everything back, uncommitted work uncommitted.
    proc = ccm("task", "rollback", "t1", "--to-snapshot", str(saved), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "ccm/t1") == v["head"]
    assert (wt / "extra.txt").read_text() == "extra\n" and "?? extra.txt" in git(wt, "status", "--porcelain")


def test_a_snapshot_trailer_in_an_agents_own_commit_does_not_steer_a_rollback(repo: Path, tmp_path: Path) -> None:
    """An automatic snapshot is the agent's own commit. A `Ccm-Guard-Snapshot-Head:` line in
    its message's body (not its trailers, which the new-commit gate holds to account),
    naming a rev of the agent's choosing (here the base: the run's commits would leave
    the branch), names nothing: only the commit's own parent counts."""
    body = ('base=$(rgit rev-parse HEAD)\necho 1 > f1.txt\nrgit add f1.txt\nrgit commit -q -m one\n'
            'echo 2 > f2.txt\nrgit add f2.txt\n'
            'rgit commit -q -m "two" -m "Ccm-Guard-Snapshot-Head: $base" -m "(a body line: not a trailer)"\n')
    v = _task(repo, tmp_path, "t1", body, "--snapshot-every", "2")
    assert v["code"] == 0, [g for g in v["gates"] if g["status"] != "pass"]
    assert git(repo, "rev-parse", "refs/ccm-guard/snapshots/t1/1") == v["head"]
    proc = ccm("task", "rollback", "t1", "--to-snapshot", "1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "ccm/t1") == v["head"]  # not the base the message named
    assert git(Path(v["worktree"]), "status", "--porcelain") == ""


def test_rollback_of_one_file(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1", 'echo changed > README.md\necho new > new.txt\nrgit add -A\nrgit commit -q -m x\n')
    wt = Path(v["worktree"])
    assert ccm("task", "rollback", "t1", "--file", "README.md", cwd=repo).returncode == 0
    assert (wt / "README.md").read_text() == "# project\n" and (wt / "new.txt").exists()
    assert ccm("task", "rollback", "t1", "--file", "new.txt", cwd=repo).returncode == 0
    assert "new.txt" not in git(wt, "ls-files")
    assert _json(ccm("task", "show", "t1", "--json", cwd=repo))["status"] == "COMMITTED"


def test_rollback_of_an_applied_task_resets_the_target_when_nothing_landed_since(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1")
    before = git(repo, "rev-parse", "main")
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0
    proc = ccm("task", "rollback", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["how"].startswith("reset")
    assert git(repo, "rev-parse", "main") == before and not (repo / "feature.txt").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_rollback_of_an_applied_task_reverts_when_work_landed_since(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1")
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0
    (repo / "later.txt").write_text("later\n")
    git(repo, "add", "later.txt")
    git(repo, "commit", "-q", "-m", "later work")
    later = git(repo, "rev-parse", "main")
    proc = ccm("task", "rollback", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["how"].startswith("revert")
    assert git(repo, "rev-parse", "main^") == later
    assert not (repo / "feature.txt").exists() and (repo / "later.txt").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_snapshot_and_diff_include_uncommitted_work(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1")
    wt = Path(v["worktree"])
    (wt / "draft.txt").write_text("draft\n")
    proc = ccm("task", "snapshot", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    snap = _json(proc)
    assert snap["snapshot"] == 1 and snap["uncommitted"]
    assert git(repo, "show", f"refs/ccm-guard/snapshots/t1/1:draft.txt") == "draft"
    text = ccm("task", "diff", "t1", cwd=repo).stdout
    assert "+feature" in text and "+draft" in text and "feature.txt" in text
    # The worktree itself was not changed by either.
    assert "?? draft.txt" in git(wt, "status", "--porcelain")


def test_auto_snapshot_every_n_commits(repo: Path, tmp_path: Path) -> None:
    body = "".join(f'echo {i} > f{i}.txt\nrgit add f{i}.txt\nrgit commit -q -m c{i}\n' for i in range(5))
    v = _task(repo, tmp_path, "t1", body, "--snapshot-every", "2")
    assert v["code"] == 0
    snaps = git(repo, "for-each-ref", "--format=%(refname)", "refs/ccm-guard/snapshots/t1/").split()
    assert snaps == ["refs/ccm-guard/snapshots/t1/1", "refs/ccm-guard/snapshots/t1/2"]
    commits = git(repo, "rev-list", "--reverse", f"{v['base']}..{v['head']}").split()
    assert git(repo, "rev-parse", snaps[0]) == commits[1] and git(repo, "rev-parse", snaps[1]) == commits[3]


def test_the_roles_snapshot_every_applies_unless_exec_says_otherwise(repo: Path, tmp_path: Path) -> None:
    policy = tmp_path / "snap.toml"
    policy.write_text('[roles.implementor]\nsnapshot_every = 3\n')
    body = "".join(f'echo {i} > f{i}.txt\nrgit add f{i}.txt\nrgit commit -q -m c{i}\n' for i in range(6))
    v = _task(repo, tmp_path, "t1", body, "--policy", str(policy))
    assert v["code"] == 0
    commits = git(repo, "rev-list", "--reverse", f"{v['base']}..{v['head']}").split()
    snaps = git(repo, "for-each-ref", "--format=%(objectname)", "refs/ccm-guard/snapshots/t1/").split()
    assert snaps == [commits[2], commits[5]]
    v = _task(repo, tmp_path, "t2", body.replace("f", "g"), "--policy", str(policy), "--snapshot-every", "0")
    assert v["code"] == 0 and git(repo, "for-each-ref", "refs/ccm-guard/snapshots/t2/") == ""


def test_question_blocks_the_run_and_resume_continues_in_the_same_worktree(repo: Path, tmp_path: Path) -> None:
    ask = 'echo half > half.txt\nprintf \'{"question": "Which database?"}\' > question.json\n'
    v = _task(repo, tmp_path, "t1", ask)
    assert v["code"] == 9 and v["outcome"] == "blocked" and v["question"] == "Which database?"
    wt = Path(v["worktree"])
    assert wt.exists() and (wt / "half.txt").exists()
    assert _json(ccm("task", "show", "t1", "--json", cwd=repo))["status"] == "BLOCKED"
    finish = write_agent(tmp_path, 'test -f half.txt\ntest ! -e question.json\necho done >> half.txt\n'
                         'rgit add half.txt\nrgit commit -q -m "finish"\n', name="finish.sh")
    proc = ccm("task", "resume", "t1", "--json", "--", str(finish), cwd=repo)
    verdict = _json(proc)
    assert proc.returncode == 0, proc.stderr + json.dumps(verdict["gates"])
    assert verdict["head"] == git(repo, "rev-parse", "ccm/t1") and verdict["question"] is None
    assert _json(ccm("task", "show", "t1", "--json", cwd=repo))["status"] == "COMMITTED"
    assert list(Path(v["log_dir"], "questions").iterdir())  # the answered question is kept in the logs


def test_a_question_does_not_hide_a_security_failure(repo: Path, tmp_path: Path) -> None:
    v = _task(repo, tmp_path, "t1", 'echo q > question.json\nrgit update-ref refs/heads/main HEAD~0\n'
              'rgit -C "$CCM_GUARD_WORKTREE" config --local core.fsmonitor "touch /tmp/x"\n', "--sandbox", "none")
    assert v["code"] == 1 and v["outcome"] == "gates-failed"


def test_resume_refuses_a_task_that_is_not_blocked(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1")
    proc = ccm("task", "resume", "t1", "--", "true", cwd=repo)
    assert proc.returncode == 7 and "not BLOCKED" in proc.stderr


def test_unknown_task_is_a_state_error_for_every_verb(repo: Path) -> None:
    for verb in ("show", "diff", "apply", "discard", "restore", "rollback", "snapshot"):
        proc = ccm("task", verb, "nope", cwd=repo)
        assert proc.returncode == 7 and "no task 'nope'" in proc.stderr, (verb, proc.stderr)


def test_apply_into_a_remote_bare_repository(tmp_path: Path) -> None:
    origin = tmp_path / "origin.git"
    seed = make_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    repo = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(origin), str(repo))
    _task(repo, tmp_path, "t1")
    proc = ccm("task", "apply", "t1", "--into", "origin/main", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    applied = _json(proc)["applied"]
    assert git(origin, "rev-parse", "main") == applied["new"] and applied["remote"]
    assert git(origin, "show", "main:feature.txt") == "feature"
    # Rolling back a remote apply is a revert commit pushed on top (never a force push).
    proc = ccm("task", "rollback", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(origin, "rev-parse", "main^") == applied["new"]
    assert git(origin, "ls-tree", "--name-only", "main").split() == ["README.md", "src"]


def test_discard_of_a_task_whose_worktree_vanished_keeps_its_commits_and_only_drops_its_own_entry(
        repo: Path, tmp_path: Path) -> None:
    import shutil

    v = _task(repo, tmp_path, "t1")
    other = tmp_path / "other-wt"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    shutil.rmtree(other)  # somebody else's vanished worktree: not ours to prune
    shutil.rmtree(v["worktree"])
    proc = ccm("task", "discard", "t1", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/t1") == v["head"]
    assert not git(repo, "branch", "--list", "ccm/t1")
    entries = git(repo, "worktree", "list", "--porcelain")
    assert str(other) in entries and v["worktree"] not in entries


def test_apply_and_rollback_where_the_git_dir_is_separate(tmp_path: Path) -> None:
    """`git init --separate-git-dir` (and submodule checkouts): git names the checkout by
    its git dir; the apply still brings the person's files along, and the rollback too."""
    repo = tmp_path / "project"
    git(tmp_path, "init", "-q", "--separate-git-dir", str(tmp_path / "project.git"), "-b", "main", str(repo))
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    agent = write_agent(tmp_path, "echo b > b.txt\ngit add b.txt\ngit commit -q -m b")
    assert run_exec(repo, agent, "--task", "sep").code == 0
    applied = ccm("task", "apply", "sep", cwd=repo)
    assert applied.returncode == 0, applied.stderr
    assert f"updated your checkout: {repo}" in applied.stdout
    assert (repo / "b.txt").read_text() == "b\n" and git(repo, "status", "--porcelain") == ""
    rolled = ccm("task", "rollback", "sep", cwd=repo)
    assert rolled.returncode == 0, rolled.stderr
    assert not (repo / "b.txt").exists() and git(repo, "status", "--porcelain") == ""


def test_apply_never_brings_along_a_checkout_of_another_branch(tmp_path: Path) -> None:
    """Separate git dir, exec run from a linked worktree on another branch, apply --into
    main (checked out in the separate-git-dir checkout): the linked worktree is not main's
    checkout; the apply is refused rather than updating the wrong files."""
    repo = tmp_path / "project"
    git(tmp_path, "init", "-q", "--separate-git-dir", str(tmp_path / "project.git"), "-b", "main", str(repo))
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    linked = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(linked))
    agent = write_agent(tmp_path, "echo b > b.txt\ngit add b.txt\ngit commit -q -m b")
    assert run_exec(linked, agent, "--task", "other").code == 0
    proc = ccm("task", "apply", "other", "--into", "main", cwd=linked)
    assert proc.returncode == 5 and "cannot find" in proc.stderr, proc.stdout + proc.stderr
    assert git(linked, "status", "--porcelain") == "" and git(repo, "status", "--porcelain") == ""
    assert git(repo, "log", "-1", "--format=%s") == "initial"


def test_which_checkout_has_the_target_is_read_from_the_files_where_plain(repo: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The main checkout, or none, needs no git process; a branch a linked worktree has
    checked out is git's worktree list to find, and both answers agree with git's."""
    from ccm_guard import git as gitapi
    from ccm_guard.worktree import apply as applying

    host = gitapi.Repo(repo / ".git", repo / ".git")
    git(repo, "branch", "side")
    git(repo, "branch", "free")
    git(repo, "worktree", "add", "-q", str(tmp_path / "linked"), "side")
    monkeypatch.setattr(gitapi, "worktree_list", lambda *a: pytest.fail("git was asked"))
    found = applying.checked_out(host, "refs/heads/main", repo)
    assert found is not None and found.work_tree == repo and found.git_dir == repo / ".git"
    assert applying.checked_out(host, "refs/heads/free", repo) is None
    monkeypatch.undo()
    linked = applying.checked_out(host, "refs/heads/side", repo)
    assert linked is not None and linked.work_tree is not None and linked.work_tree.resolve() == (tmp_path / "linked").resolve()


@pytest.mark.parametrize("where", ["sub", "notes/sub"])
def test_apply_never_deletes_the_persons_submodule_checkout(repo: Path, tmp_path: Path, where: str) -> None:
    """read-tree never looks inside a submodule it replaces: a task that turns one into a
    file, or a directory holding one (notes/sub, notes made a file), would take the
    person's uncommitted work in it. Refused while the submodule holds anything (found by
    the second and fourth reviews)."""
    top = where.split("/")[0]
    if "/" in where:
        (repo / top).mkdir()
        (repo / top / "a.md").write_text("a\n")
        git(repo, "add", top)
    sub = make_repo(tmp_path / "subsrc", {"f": "f\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), where)
    git(repo, "commit", "-q", "-m", "add sub")
    _task(repo, tmp_path, "t1", f'rgit rm -q -r --cached {top}\nrm -rf {top}\necho agent > {top}\nrgit add {top}\n'
                                f'rgit commit -q -m "{top} is a file now"\n')
    (repo / where / "f").write_text("my uncommitted work\n")
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8 and f"{where} (a submodule's checkout)" in proc.stderr, proc.stderr
    assert (repo / where / "f").read_text() == "my uncommitted work\n"


def test_apply_of_a_directory_made_a_file_is_no_refusal(tmp_path: Path) -> None:
    """A tracked directory the task replaces with a file of the same name holds nothing of
    the person's: git's own listing says so, and the apply lands (found by a review)."""
    repo = make_repo(tmp_path / "repo", {"README.md": "r\n", "notes/a.md": "a\n"})
    _task(repo, tmp_path, "t1", 'rgit rm -q -r notes\necho "all notes" > notes\nrgit add notes\n'
                                'rgit commit -q -m "notes in one file"\n')
    (repo / "empty").mkdir()  # an empty directory is nothing of the person's either
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "notes").read_text() == "all notes\n"


def test_an_apply_of_a_task_another_process_is_applying_is_refused(repo: Path, tmp_path: Path) -> None:
    """Two applies of one task at once: the second would overwrite the first's record of its
    move and, losing the race, take it back (found by a review). It waits its turn instead."""
    from ccm_guard.state.registry import Registry

    _task(repo, tmp_path, "t1")
    other = subprocess.Popen(["sleep", "30"])
    try:
        registry = Registry()
        main, head = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "ccm/t1")
        registry.set_option("t1", "applying", {"ref": "refs/heads/main", "old": main, "new": head, "pid": other.pid})
        proc = ccm("task", "apply", "t1", cwd=repo)
        assert proc.returncode == 8 and f"being applied by process {other.pid}" in proc.stderr, proc.stderr
        registry.drop_option_if("t1", "applying", {"something": "else"})  # only its own record goes
        assert registry.get("t1").option("applying")["pid"] == other.pid
    finally:
        other.kill()
        other.wait()
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0  # its process gone: reconciled, then applied


def test_apply_never_overwrites_a_file_in_the_persons_ignored_repository(repo: Path, tmp_path: Path) -> None:
    """git lists nothing inside a nested repository, ignored or not: a file there that the
    index does not track is the person's all the same (found by a third review)."""
    (repo / ".gitignore").write_text("tools/\n*.env\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    make_repo(repo / "tools", {"x.py": "MY WORK\n"})
    _task(repo, tmp_path, "t1", 'mkdir -p tools\necho agent > tools/x.py\nrgit add -f tools/x.py\nrgit commit -q -m t\n')
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8 and "tools/x.py" in proc.stderr, proc.stderr
    assert (repo / "tools/x.py").read_text() == "MY WORK\n"


def test_apply_trusts_the_checkout_not_the_target_for_what_it_removes(repo: Path, tmp_path: Path) -> None:
    """The target tracks a file `cfg`, the task makes it a directory with cfg/local.env; the
    person already removed cfg (staged) and keeps an ignored cfg/local.env of their own."""
    (repo / ".gitignore").write_text("*.env\n")
    (repo / "cfg").write_text("old\n")
    git(repo, "add", ".gitignore", "cfg")
    git(repo, "commit", "-q", "-m", "cfg")
    _task(repo, tmp_path, "t1", 'rgit rm -q cfg\nmkdir cfg\necho agent > cfg/local.env\nrgit add -f cfg/local.env\n'
                                'rgit commit -q -m t\n')
    git(repo, "rm", "-q", "cfg")
    (repo / "cfg").mkdir()
    (repo / "cfg/local.env").write_text("MY SECRET\n")
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8, proc.stderr
    assert (repo / "cfg/local.env").read_text() == "MY SECRET\n"


def test_a_task_that_removes_a_submodule_applies_and_keeps_its_checkout(repo: Path, tmp_path: Path) -> None:
    """Removing a submodule is no refusal: git removes its directory only when empty, so the
    person's work in it stays, as git checkout and git merge leave it (a third review)."""
    sub = make_repo(tmp_path / "subsrc", {"f": "f\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sub")
    git(repo, "commit", "-q", "-m", "add sub")
    _task(repo, tmp_path, "t1", "rgit rm -q --cached sub\nrgit commit -q -m 'no sub'\n")
    (repo / "sub/f").write_text("my uncommitted work\n")
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "sub/f").read_text() == "my uncommitted work\n"


def test_a_move_is_claimed_in_one_transaction_with_the_tasks_status(repo: Path, tmp_path: Path) -> None:
    """Two applies of one task could both pass the first look and both land (a squash twice;
    a third review): the record of a move is written only while the task is still what the
    move needs and no other live process holds one."""
    from ccm_guard.state.registry import Registry

    _task(repo, tmp_path, "t1")
    registry = Registry()
    other = subprocess.Popen(["sleep", "30"])
    try:
        registry.set_option("t1", "applying", {"pid": other.pid})
        assert not registry.claim_option("t1", "applying", {"pid": os.getpid()}, status="COMMITTED")
    finally:
        other.kill()
        other.wait()
    assert not registry.claim_option("t1", "applying", {"pid": os.getpid()}, status="APPLIED")
    assert registry.claim_option("t1", "applying", {"pid": os.getpid()}, status="COMMITTED")
    assert registry.drop_option_if("t1", "applying", {"pid": os.getpid()})
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0
    assert not registry.claim_option("t1", "applying", {"pid": os.getpid()}, status="COMMITTED")  # applied now


def test_only_empty_directories_where_the_task_puts_a_file_are_no_refusal(repo: Path, tmp_path: Path) -> None:
    _task(repo, tmp_path, "t1", 'echo b > build\nrgit add build\nrgit commit -q -m build\n')
    (repo / "build/sub/deeper").mkdir(parents=True)
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "build").read_text() == "b\n"


def test_a_submodule_added_where_the_persons_ignored_file_stands_is_in_the_way(repo: Path) -> None:
    """Git deletes a file standing where a move adds a submodule (a rollback re-adds one a
    task removed); a real directory there it keeps, so that is no refusal (a fourth review)."""
    from ccm_guard import git as gitapi
    from ccm_guard.worktree.apply import in_the_way

    old = git(repo, "rev-parse", "HEAD")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{old},sub")
    git(repo, "commit", "-q", "-m", "a submodule")
    new = git(repo, "rev-parse", "HEAD")
    git(repo, "reset", "-q", "--hard", old)
    (repo / ".git/info").mkdir(exist_ok=True)
    (repo / ".git/info/exclude").write_text("sub\n")
    host = gitapi.Repo(repo / ".git", repo / ".git", repo)
    (repo / "sub").write_text("my ignored file\n")
    assert in_the_way(host, host, old, new) == "sub"
    (repo / "sub").unlink()
    (repo / "sub").mkdir()
    (repo / "sub/keep.txt").write_text("x\n")
    assert in_the_way(host, host, old, new) is None
