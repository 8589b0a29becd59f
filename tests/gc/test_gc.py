"""`ccm-guard gc`: stale tasks, orphans in every direction, dead locks, expired archives.

Real repositories, real `ccm-guard` processes (killed for real where a test needs a dead
one). Each test checks the repository and the registry afterwards, and where gc removes
something, that the work is still reachable from a ref.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git, make_repo, run_exec, spawn_exec, state_of, write_agent

from ccm_guard import gc, worktree
from ccm_guard import git as cg
from ccm_guard.gc import keep, linked
from ccm_guard.git import layout
from ccm_guard.state import home
from ccm_guard.state.registry import Registry

DAY = 86400.0
COMMIT = 'echo feature > feature.txt\nrgit add feature.txt\nrgit commit -q -m "add feature"\n'
COMMIT_AND_LEAVE = COMMIT + 'echo notes > notes.txt\necho changed >> README.md\n'


def _exec(repo: Path, tmp_path: Path, task: str, body: str = COMMIT, *options: str) -> dict[str, Any]:
    result = run_exec(repo, write_agent(tmp_path, body, name=f"{task}.sh"), "--task", task, *options)
    return result.verdict


def _age(task: str, seconds: float) -> None:
    """Make a task look untouched for `seconds` (as if it had finished then)."""
    db = sqlite3.connect(Path(os.environ["CCM_GUARD_HOME"]) / "registry.db")
    with db:
        db.execute("UPDATE tasks SET updated_at = ? WHERE id = ?", (time.time() - seconds, task))
    db.close()


def _set(task: str, **fields: object) -> None:
    """Put a row in the state a ccm-guard killed at that moment leaves."""
    db = sqlite3.connect(Path(os.environ["CCM_GUARD_HOME"]) / "registry.db")
    with db:
        for name, value in fields.items():
            db.execute(f"UPDATE tasks SET {name} = ? WHERE id = ?", (value, task))
    db.close()


def _gc(cwd: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = ccm("gc", "--json", *args, cwd=cwd)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _only(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [a for a in report["actions"] if a["kind"] == kind]


def _status(task: str) -> str:
    return Registry().get(task).status


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _ref(repo: Path, ref: str) -> str | None:
    out = git(repo, "rev-parse", "--verify", "--quiet", ref, check=False)
    return out or None


def _worktrees(repo: Path) -> str:
    return git(repo, "worktree", "list", "--porcelain")


def _worktree_with_work(repo: Path, path: Path, branch: str) -> str:
    """A linked worktree at `path` on a new `branch` with a commit no other ref has, and an
    untracked dirty.txt; returns that commit."""
    git(repo, "worktree", "add", "-q", "-b", branch, str(path))
    (path / "new.txt").write_text("new\n")
    git(path, "add", "new.txt")
    git(path, "commit", "-q", "-m", "unmerged")
    (path / "dirty.txt").write_text("dirty\n")
    return git(path, "rev-parse", "HEAD")


def _key_dir(repo: Path) -> Path:
    return Path(os.environ["CCM_GUARD_HOME"]) / "worktrees" / home.repo_key(cg.discover(repo))


# --- stale tasks -----------------------------------------------------------------------------------


def test_dry_run_shows_a_stale_task_and_why_and_changes_nothing(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1")
    _age("t1", 8 * DAY)
    before = (state_of(repo), _worktrees(repo), Path(v["worktree"]).exists(), _status("t1"))
    proc = ccm("gc", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "dry run" in proc.stdout and "stale-task" in proc.stdout
    assert "t1: COMMITTED for 8d, older than 7d" in proc.stdout
    assert f"would remove the worktree {v['worktree']}" in proc.stdout
    code, report = _gc(repo)
    [action] = _only(report, "stale-task")
    assert code == 0 and report["dry_run"] and action["safe"] and action["task"] == "t1" and not action["done"]
    assert (state_of(repo), _worktrees(repo), Path(v["worktree"]).exists(), _status("t1")) == before


def test_stale_task_is_archived_with_committed_and_uncommitted_work_then_removed(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1", COMMIT_AND_LEAVE)
    assert _status("t1") == "ERRORED"  # clean-tree failed: work left uncommitted
    tip = _ref(repo, "ccm/t1")
    _age("t1", 8 * DAY)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "stale-task")
    assert code == 0 and action["error"] is None, action
    assert not Path(v["worktree"]).exists() and _ref(repo, "refs/heads/ccm/t1") is None
    assert "ccm/t1" not in _worktrees(repo)
    archive = "refs/ccm-guard/archive/t1"
    assert git(repo, "rev-parse", f"{archive}^") == tip  # the commit, with the uncommitted work on top
    assert git(repo, "show", f"{archive}:notes.txt") == "notes"
    assert git(repo, "show", f"{archive}:README.md").endswith("changed")
    assert git(repo, "show", f"{archive}:feature.txt") == "feature"
    assert _status("t1") == "DISCARDED"
    assert f"archived to {archive}" in action["done"]
    # Restorable: the task comes back with its work, uncommitted work uncommitted.
    back = ccm("task", "restore", "t1", cwd=repo)
    assert back.returncode == 0, back.stderr
    assert (Path(v["worktree"]) / "notes.txt").read_text() == "notes\n"
    assert git(Path(v["worktree"]), "rev-parse", "HEAD") == tip


def test_gc_killed_between_archive_and_removal_finishes_on_the_next_run(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1", COMMIT_AND_LEAVE)
    _age("t1", 8 * DAY)
    killed = ccm("gc", "--yes", cwd=repo, env={"CCM_GUARD_FAILPOINT": "gc-after-archive"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    archive = _ref(repo, "refs/ccm-guard/archive/t1")
    assert archive and Path(v["worktree"], "notes.txt").exists() and _status("t1") == "ERRORED"
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "stale-task")
    assert code == 0 and action["error"] is None and not any("archived" in d for d in action["done"]), action
    assert _ref(repo, "refs/ccm-guard/archive/t1") == archive  # the first run's archive keeps it all
    assert not Path(v["worktree"]).exists() and _status("t1") == "DISCARDED", json.dumps(report["actions"])
    assert git(repo, "show", "refs/ccm-guard/archive/t1:notes.txt") == "notes"


def test_applied_task_whose_work_is_in_the_target_goes_without_an_archive(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge t1", "ccm/t1")
    Registry().move("t1", "APPLIED")
    _age("t1", 8 * DAY)
    [action] = _only(_gc(repo)[1], "stale-task")
    assert "keep nothing more: its commits are in refs/heads/main" in action["steps"]
    proc = ccm("gc", "--yes", cwd=repo)
    assert proc.returncode == 0 and proc.stdout.startswith("gc: 1 done, 0 failed, 0 left alone"), proc.stdout
    assert "deleted branch ccm/t1; marked CLEANED_UP" in proc.stdout
    assert not Path(v["worktree"]).exists() and _ref(repo, "refs/heads/ccm/t1") is None
    assert _ref(repo, "refs/ccm-guard/archive/t1") is None
    assert _status("t1") == "CLEANED_UP"
    assert git(repo, "show", "main:feature.txt") == "feature"


def test_young_and_running_tasks_are_left_alone(repo: Path, tmp_path: Path) -> None:
    _exec(repo, tmp_path, "young")
    assert _gc(repo)[1]["actions"] == []
    assert [a["subject"] for a in _only(_gc(repo, "--older-than", "0")[1], "stale-task")] == ["young"]
    release = tmp_path / "release"
    agent = write_agent(tmp_path, f'echo work > w.txt\nwhile [ ! -e {release} ]; do sleep 0.05; done\n', "wait.sh")
    proc = spawn_exec(repo, "--sandbox", "none", "--task", "running", "--", str(agent))
    try:
        _wait_for(lambda: Registry().exists("running") and _status("running") == "ACTIVE")
        code, report = _gc(repo, "--older-than", "0", "--yes")
        assert code == 0
        assert all(a["subject"] != "running" and a["task"] != "running" for a in report["actions"])
        assert Path(Registry().get("running").worktree, "w.txt").exists()
    finally:
        release.touch()
        out, err = proc.communicate(timeout=60)
    assert _status("running") == "ERRORED", (out, err)  # left w.txt uncommitted; judged normally, gc took nothing


def _wait_for(condition: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


# --- runs whose ccm-guard died -----------------------------------------------------------------------


def test_killed_exec_leaves_an_active_task_that_gc_marks_errored_and_keeps(repo: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "agent.pid"
    agent = write_agent(tmp_path, f'echo work > w.txt\necho $$ > {pidfile}\nsleep 60\n', "sleepy.sh")
    proc = spawn_exec(repo, "--sandbox", "none", "--task", "t1", "--", str(agent))
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the agent runs in its own session
    task = Registry().get("t1")
    assert task.status == "ACTIVE" and task.abandoned
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "abandoned-run")
    assert code == 0 and action["error"] is None, action
    assert "`ccm-guard audit t1` judges it" in " ".join(action["done"])
    assert _status("t1") == "ERRORED"
    assert (Path(task.worktree) / "w.txt").read_text() == "work\n"  # kept, not deleted
    # Marked just now, so not yet stale; once stale, its work goes to an archive first.
    assert _only(_gc(repo)[1], "stale-task") == []
    _age("t1", 8 * DAY)
    assert _gc(repo, "--yes")[0] == 0
    assert git(repo, "show", "refs/ccm-guard/archive/t1:w.txt") == "work"
    assert not Path(task.worktree).exists() and _status("t1") == "DISCARDED"


def test_apply_killed_after_it_landed_is_recorded_before_anything_else(repo: Path, tmp_path: Path) -> None:
    _exec(repo, tmp_path, "t1")
    git(repo, "branch", "release")
    killed = ccm("task", "apply", "t1", "--into", "release", cwd=repo, env={"CCM_GUARD_FAILPOINT": "apply-after-cas"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    _age("t1", 8 * DAY)
    code, report = _gc(repo, "--yes")
    assert code == 0 and [a["kind"] for a in report["actions"]] == ["interrupted-apply"], report
    assert "recorded it as APPLIED" in report["actions"][0]["done"][0] and _status("t1") == "APPLIED"
    # Next time it is an ordinary stale applied task: its work is in release, no archive.
    _age("t1", 8 * DAY)
    code, report = _gc(repo, "--yes")
    assert code == 0 and _status("t1") == "CLEANED_UP" and _ref(repo, "refs/ccm-guard/archive/t1") is None


def test_active_task_whose_ccm_guard_and_worktree_are_gone_keeps_its_commits(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1")
    tip = _ref(repo, "ccm/t1")
    _set("t1", status="ACTIVE", pid=_dead_pid())  # killed mid-run; then its directory was deleted
    subprocess.run(["rm", "-rf", v["worktree"]], check=True)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "abandoned-run")
    assert code == 0 and action["error"] is None, action
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/t1") == tip and _ref(repo, "refs/heads/ccm/t1") is None
    assert _status("t1") == "DISCARDED"  # the row stays: its agent ran, its work is archived


def _created(repo: Path, task: str) -> worktree.Plan:
    """A task set up as exec does, by a ccm-guard that then died before its agent started."""
    plan = worktree.plan(repo, task, "HEAD")
    worktree.create(plan, Registry(), ["agent"], {})
    _set(task, pid=_dead_pid())
    return plan


def test_abandoned_setup_is_removed_entirely(repo: Path) -> None:
    created = _created(repo, "made")
    pending = _created(repo, "half")
    # Killed inside `git worktree add`: the row still PENDING, git's own lock still there.
    admin = Path(Registry().get("half").admin_dir)
    (admin / "locked").write_text("initializing")
    _set("half", status="PENDING")
    code, report = _gc(repo, "--yes")
    assert code == 0, report
    done = {a["subject"]: a for a in _only(report, "abandoned-run")}
    assert set(done) == {"made", "half"} and not any(a["error"] for a in done.values()), done
    for plan in (created, pending):
        assert not plan.worktree.exists() and _ref(repo, f"refs/heads/{plan.branch}") is None
    assert not admin.exists() and _worktrees(repo).count("worktree ") == 1
    assert git(repo, "for-each-ref", "refs/ccm-guard") == ""  # nothing to archive: no agent ran
    # As if never created: the rows are gone and the ids can be used again.
    assert not Registry().exists("made") and not Registry().exists("half")
    _created(repo, "made")


# --- orphans -----------------------------------------------------------------------------------------


def test_row_whose_worktree_vanished_is_archived_with_its_staged_work(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1")
    wt = Path(v["worktree"])
    (wt / "staged.txt").write_text("staged\n")
    git(wt, "add", "staged.txt")
    tip = _ref(repo, "ccm/t1")
    subprocess.run(["rm", "-rf", str(wt)], check=True)
    # Just now: another ccm-guard may be half-way through a discard; gc waits.
    assert _only(_gc(repo)[1], "orphan-row") == []
    _age("t1", 3600)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "orphan-row")
    assert code == 0 and action["error"] is None, action
    archive = "refs/ccm-guard/archive/t1"
    assert git(repo, "rev-parse", f"{archive}^") == tip
    assert git(repo, "show", f"{archive}:staged.txt") == "staged"
    assert _ref(repo, "refs/heads/ccm/t1") is None and "t1" not in _worktrees(repo)
    assert _status("t1") == "DISCARDED"


def test_worktree_directory_without_a_row_is_archived_then_removed(repo: Path) -> None:
    keydir = _key_dir(repo)
    lost = keydir / "lost"
    tip = _worktree_with_work(repo, lost, "ccm/lost")
    (keydir / "stray").mkdir()
    (keydir / "stray" / "file.txt").write_text("mine\n")
    (keydir / "empty").mkdir()
    code, report = _gc(repo)
    by_path = {Path(a["subject"]).name: a for a in _only(report, "orphan-dir")}
    assert by_path["lost"]["safe"] and by_path["empty"]["safe"] and not by_path["stray"]["safe"]
    assert "remove it by hand" in by_path["stray"]["reason"]
    code, report = _gc(repo, "--yes")
    assert code == 0, report
    assert not lost.exists() and not (keydir / "empty").exists()
    assert (keydir / "stray" / "file.txt").read_text() == "mine\n"
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/lost^") == tip
    assert git(repo, "show", "refs/ccm-guard/archive/lost:dirty.txt") == "dirty"
    assert _ref(repo, "refs/heads/ccm/lost") is None and "lost" not in _worktrees(repo)


def test_admin_entry_whose_directory_vanished_is_pruned_after_archiving_detached_work(repo: Path,
                                                                                       tmp_path: Path) -> None:
    side, kept = tmp_path / "side", tmp_path / "kept"
    git(repo, "worktree", "add", "-q", "--detach", str(side))
    (side / "s.txt").write_text("s\n")
    git(side, "add", "s.txt")
    git(side, "commit", "-q", "-m", "detached work")
    detached = git(side, "rev-parse", "HEAD")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(kept))
    subprocess.run(["rm", "-rf", str(side), str(kept)], check=True)
    common = repo / ".git"
    code, report = _gc(repo, "--repo", str(repo))
    [action] = _only(report, "prune")
    assert action["safe"] and "git worktree prune (kept, side)" in action["steps"]
    assert (common / "worktrees" / "side").exists()  # dry run
    code, report = _gc(repo, "--repo", str(repo), "--yes")
    assert code == 0 and _only(report, "prune")[0]["error"] is None, report
    assert not (common / "worktrees").exists() or list((common / "worktrees").iterdir()) == []
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/side") == detached
    assert _ref(repo, "refs/ccm-guard/archive/kept") is None  # the branch keeps it
    assert _ref(repo, "refs/heads/feature") is not None


def test_prune_waits_while_a_task_runs(repo: Path, tmp_path: Path) -> None:
    running = worktree.plan(repo, "running", "HEAD")
    worktree.create(running, Registry(), ["agent"], {})  # pid: this test process, alive
    subprocess.run(["rm", "-rf", str(running.worktree)], check=True)
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "other"))
    subprocess.run(["rm", "-rf", str(tmp_path / "other")], check=True)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "prune")
    assert code == 0 and not action["safe"] and "belongs to running task running" in action["reason"]
    assert (repo / ".git" / "worktrees" / "other").exists() and (repo / ".git" / "worktrees" / "running").exists()


def test_ccm_branch_without_task_or_worktree_is_archived_then_deleted(repo: Path) -> None:
    lost = git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "lost")
    git(repo, "branch", "ccm/lost", lost)
    git(repo, "branch", "ccm/merged", "main")
    main = _ref(repo, "main")
    code, report = _gc(repo, "--yes", "--repo", str(repo))  # no task yet: the registry knows no repository
    done = {a["subject"]: a for a in _only(report, "orphan-branch")}
    assert code == 0 and set(done) == {"refs/heads/ccm/lost", "refs/heads/ccm/merged"}, report
    assert _ref(repo, "refs/heads/ccm/lost") is None and _ref(repo, "refs/heads/ccm/merged") is None
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/lost") == lost
    assert _ref(repo, "refs/ccm-guard/archive/merged") is None  # main keeps it
    assert _ref(repo, "main") == main


def test_a_branch_that_moved_after_the_plan_is_left_alone(repo: Path) -> None:
    first = git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "first")
    git(repo, "branch", "ccm/busy", first)
    actions = gc.plan(Registry(), gc.options("7d", 30, repo))
    [action] = [a for a in actions if a.kind == "orphan-branch"]
    second = git(repo, "commit-tree", "HEAD^{tree}", "-p", first, "-m", "second")
    git(repo, "update-ref", "refs/heads/ccm/busy", second)  # somebody is still using it
    gc.execute(actions, Registry())
    assert action.error and "moved since gc looked" in action.error and not action.done
    assert _ref(repo, "refs/heads/ccm/busy") == second and _ref(repo, "refs/ccm-guard/archive/busy") is None


def test_a_worktree_whose_git_file_points_at_another_one_is_not_trusted(repo: Path, tmp_path: Path) -> None:
    keydir = _key_dir(repo)
    real = keydir / "real"
    git(repo, "worktree", "add", "-q", "-b", "ccm/real", str(real))
    (real / "wip.txt").write_text("wip\n")
    decoy = keydir / "decoy"
    decoy.mkdir()
    (decoy / "mine.txt").write_text("mine\n")
    (decoy / ".git").write_text(f"gitdir: {repo / '.git' / 'worktrees' / 'real'}\n")  # an agent's redirect
    code, report = _gc(repo, "--repo", str(repo), "--yes")
    dirs = {Path(a["subject"]).name: a for a in _only(report, "orphan-dir")}
    assert not dirs["decoy"]["safe"] and "remove it by hand" in dirs["decoy"]["reason"]
    assert (decoy / "mine.txt").exists()
    # The real one is an orphan too and is handled on its own terms: archived, then removed.
    assert dirs["real"]["error"] is None and not real.exists()
    assert git(repo, "show", "refs/ccm-guard/archive/real:wip.txt") == "wip"


def test_an_archive_holding_other_work_is_never_overwritten(repo: Path) -> None:
    old = git(repo, "commit-tree", "HEAD^{tree}", "-m", "archived earlier")
    git(repo, "update-ref", "refs/ccm-guard/archive/x", old)
    new = git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "other work")
    git(repo, "branch", "ccm/x", new)
    code, report = _gc(repo, "--yes", "--repo", str(repo))
    [action] = _only(report, "orphan-branch")
    assert code == 0 and not action["safe"] and "does not overwrite an archive" in action["reason"]
    assert _ref(repo, "refs/ccm-guard/archive/x") == old and _ref(repo, "refs/heads/ccm/x") == new


# --- locks and retention --------------------------------------------------------------------------


def test_lock_of_a_dead_ccm_guard_is_released_and_other_locks_are_kept(repo: Path, tmp_path: Path) -> None:
    reasons = {"dead": gc.lock_reason(_dead_pid(), "a"), "live": gc.lock_reason(os.getpid(), "b"),
               "person": "on a USB disk"}
    assert gc.lock_owner(reasons["live"]) == (os.getpid(), "b") and gc.lock_owner("on a USB disk") is None
    for name, reason in reasons.items():
        git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / name))
        git(repo, "worktree", "lock", "--reason", reason, str(tmp_path / name))
    code, report = _gc(repo, "--yes", "--repo", str(repo))
    [action] = _only(report, "dead-lock")
    assert code == 0 and action["subject"] == str(tmp_path / "dead") and action["done"] == ["unlocked"]
    listing = _worktrees(repo)
    assert f"locked {reasons['live']}" in listing and "locked on a USB disk" in listing
    assert "locked ccm-guard pid" in listing and listing.count("locked") == 2


def test_archive_past_retention_is_deleted_only_with_yes(repo: Path, tmp_path: Path) -> None:
    for task in ("old", "recent"):
        _exec(repo, tmp_path, task, COMMIT_AND_LEAVE, "--on-fail", "discard")
        assert _status(task) == "DISCARDED" and _ref(repo, f"refs/ccm-guard/archive/{task}")
    _age("old", 31 * DAY)
    _age("recent", 5 * DAY)
    code, report = _gc(repo)
    [action] = _only(report, "expired-archive")
    assert action["subject"] == "refs/ccm-guard/archive/old" and "past --archive-days 30" in action["reason"]
    assert _ref(repo, "refs/ccm-guard/archive/old")
    code, report = _gc(repo, "--yes")
    logs = Registry().get("old").log_dir
    assert code == 0 and _only(report, "expired-archive")[0]["done"] == [f"removed {logs}",
                                                                         "deleted refs/ccm-guard/archive/old",
                                                                         "marked CLEANED_UP"]
    assert not os.path.exists(logs) and os.path.isdir(Registry().get("recent").log_dir)
    assert _ref(repo, "refs/ccm-guard/archive/old") is None and _status("old") == "CLEANED_UP"
    assert _ref(repo, "refs/ccm-guard/archive/recent") and _status("recent") == "DISCARDED"
    assert _only(_gc(repo, "--archive-days", "1")[1], "expired-archive")[0]["subject"].endswith("/recent")


def test_an_expired_task_takes_its_snapshots_and_logs_along_and_its_row_goes_later(repo: Path, tmp_path: Path) -> None:
    _exec(repo, tmp_path, "old", COMMIT)
    assert ccm("task", "snapshot", "old", cwd=repo).returncode == 0
    assert ccm("task", "discard", "old", cwd=repo).returncode == 0
    snapshots = git(repo, "for-each-ref", "--format=%(refname)", "refs/ccm-guard/snapshots/old/").split()
    logs = Path(Registry().get("old").log_dir)
    assert snapshots and logs.is_dir()
    _age("old", 31 * DAY)
    code, report = _gc(repo)
    [action] = _only(report, "expired-archive")
    assert action["steps"] == [f"remove {logs}", "delete refs/ccm-guard/archive/old",
                               *(f"delete {r}" for r in sorted(snapshots)), "mark CLEANED_UP (no longer restorable)"]
    assert logs.is_dir() and _ref(repo, snapshots[0])  # a dry run changes nothing
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "expired-archive")
    assert code == 0 and action["error"] is None, action
    assert git(repo, "for-each-ref", "refs/ccm-guard/") == "" and not logs.exists()
    assert _status("old") == "CLEANED_UP" and _only(_gc(repo)[1], "expired-archive") == []
    # One retention later the row goes too: the registry does not grow without bound.
    _age("old", 31 * DAY)  # its last change long ago, but its archive went just now
    assert _only(_gc(repo)[1], "expired-row") == []
    options = Registry().get("old").option_dict()
    assert time.time() - options["expired_at"] < 600
    _set("old", options=json.dumps({**options, "expired_at": time.time() - 31 * DAY}))
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "expired-row")
    assert code == 0 and action["done"] == ["forgot the row"]
    assert not Registry().exists("old")


def test_an_expired_copied_directory_archive_is_removed(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    agent = write_agent(tmp_path, "echo b >> a.txt\n")
    result = run_exec(plain, agent, "--task", "copied")
    assert result.code == 0, result.stderr
    assert ccm("task", "discard", "copied", cwd=tmp_path).returncode == 0
    archived = Path(Registry().get("copied").option("archive")["path"])
    assert archived.is_dir()
    _age("copied", 31 * DAY)
    code, report = _gc(tmp_path, "--yes")
    [action] = _only(report, "expired-archive")
    assert code == 0 and action["error"] is None and f"removed {archived}" in action["done"], action
    assert not archived.exists() and _status("copied") == "CLEANED_UP"
    assert (plain / "a.txt").read_text() == "a\n"  # the original was never the copy's to touch


@pytest.mark.parametrize("where", ["outside", "live worktrees", "another task's logs", "not normalised"])
def test_expiry_removes_only_the_places_made_for_the_task(repo: Path, tmp_path: Path, where: str) -> None:
    _exec(repo, tmp_path, "old", COMMIT_AND_LEAVE, "--on-fail", "discard")
    live = _exec(repo, tmp_path, "live", COMMIT_AND_LEAVE)  # kept, with uncommitted work
    state = Path(os.environ["CCM_GUARD_HOME"])
    target = {"outside": tmp_path / "precious", "live worktrees": state / "worktrees",
              "another task's logs": Path(live["log_dir"]), "not normalised": Path(live["log_dir"])}[where]
    target.mkdir(exist_ok=True)
    (target / "keep.txt").write_text("mine\n")
    named = f"{Registry().get('old').log_dir}/../live" if where == "not normalised" else str(target)
    _set("old", log_dir=named)  # a registry row rewritten to name another place
    _age("old", 31 * DAY)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "expired-archive")
    assert action["error"] and "not a place ccm-guard made for task old" in action["error"]
    assert (target / "keep.txt").read_text() == "mine\n" and Path(live["worktree"], "notes.txt").exists()
    assert _ref(repo, "refs/ccm-guard/archive/old") and _status("old") == "DISCARDED"  # nothing done at all


# --- the invariant ----------------------------------------------------------------------------------


def test_every_removal_refuses_work_that_no_surviving_ref_keeps(repo: Path, tmp_path: Path) -> None:
    common = repo / ".git"
    host = layout.host_repo(common)
    path = tmp_path / "w"
    tip = _worktree_with_work(repo, path, "ccm/w")
    repo_w = cg.Repo(common / "worktrees" / "w", common, path)
    with pytest.raises(keep.WorkWouldBeLost):
        keep.remove_worktree(host, repo_w, ("refs/heads/ccm/w",))
    with pytest.raises(keep.WorkWouldBeLost):
        keep.delete_branch(host, "refs/heads/ccm/w", tip)
    with pytest.raises(keep.WorkWouldBeLost):
        keep.remove_unmade(host, path, tip)  # a "base" that nothing but the task's branch holds
    assert (path / "dirty.txt").exists() and _ref(repo, "refs/heads/ccm/w") == tip
    # An archive of the commits alone does not keep the uncommitted file.
    git(repo, "update-ref", "refs/ccm-guard/archive/w", tip)
    with pytest.raises(keep.WorkWouldBeLost):
        keep.remove_worktree(host, repo_w, ("refs/heads/ccm/w",))
    assert (path / "dirty.txt").exists()
    git(repo, "update-ref", "-d", "refs/ccm-guard/archive/w")
    # Once archived, the same removals go through, and the archive holds everything.
    done: list[str] = []
    assert keep.keep(host, "w", keep.worktree_work(repo_w), ("refs/heads/ccm/w",), repo_w, done) == \
        "refs/ccm-guard/archive/w"
    keep.remove_worktree(host, repo_w, ("refs/heads/ccm/w",))
    keep.delete_branch(host, "refs/heads/ccm/w", tip)
    assert not path.exists() and git(repo, "show", "refs/ccm-guard/archive/w:dirty.txt") == "dirty"
    # A vanished worktree with a detached commit: neither prune nor removing its entry passes.
    side = tmp_path / "side"
    git(repo, "worktree", "add", "-q", "--detach", str(side))
    git(side, "commit", "-q", "--allow-empty", "-m", "detached")
    subprocess.run(["rm", "-rf", str(side)], check=True)
    [entry] = [e for e in linked.admin_entries(common) if e.admin.name == "side"]
    with pytest.raises(keep.WorkWouldBeLost):
        keep.prune_entries(host, set())
    with pytest.raises(keep.WorkWouldBeLost):
        keep.remove_admin_entry(host, entry, ())
    assert entry.admin.exists()


def test_worktree_whose_config_would_run_code_is_left_alone(repo: Path, tmp_path: Path) -> None:
    v = _exec(repo, tmp_path, "t1", COMMIT_AND_LEAVE)
    marker = tmp_path / "pwned"
    admin = Path(Registry().get("t1").admin_dir)
    with open(admin / "config.worktree", "a") as fh:
        fh.write(f'[filter "x"]\n\tclean = touch {marker}\n')
    (Path(v["worktree"]) / ".gitattributes").write_text("* filter=x\n")
    _age("t1", 8 * DAY)
    code, report = _gc(repo, "--yes")
    [action] = _only(report, "stale-task")
    assert code == 0 and not action["safe"] and "filter.x.clean" in action["reason"]
    assert Path(v["worktree"]).exists() and not marker.exists() and _status("t1") == "ERRORED"


# --- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, code, words", [
    (["--older-than", "7x"], 2, "--older-than '7x' is not an age"),
    (["--older-than", "7"], 2, "give a number and a unit"),
    (["--archive-days", "-1"], 2, "--archive-days"),
    (["--repo", "{plain}"], 5, "is not in a git repository"),
])
def test_bad_input_is_one_line_with_its_exit_code_and_touches_nothing(tmp_path: Path, args: list[str], code: int,
                                                                     words: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = ccm("gc", *[a.replace("{plain}", str(plain)) for a in args], cwd=tmp_path)
    assert proc.returncode == code and words in proc.stderr, proc.stderr
    if code != 2 or "--archive-days" not in words:  # click's own usage errors print usage lines
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "state").exists()  # not even the registry was created


def test_repo_option_limits_gc_to_one_repository(tmp_path: Path) -> None:
    a, b = make_repo(tmp_path / "a"), make_repo(tmp_path / "b")
    va, vb = _exec(a, tmp_path, "ta"), _exec(b, tmp_path, "tb")
    _age("ta", 8 * DAY)
    _age("tb", 8 * DAY)
    code, report = _gc(tmp_path, "--repo", str(a), "--yes")
    assert code == 0 and [x["subject"] for x in report["actions"]] == ["ta"]
    assert not Path(va["worktree"]).exists() and Path(vb["worktree"]).exists()
    assert _status("ta") == "DISCARDED" and _status("tb") == "COMMITTED"


def test_gc_hands_trash_a_killed_ccm_guard_left_to_a_deleter(tmp_path: Path) -> None:
    import time

    from ccm_guard.state import trash

    repo = make_repo(tmp_path / "repo")
    left = trash.trash_dir() / "wt-of-a-killed-run"
    (left / "deep" / "deeper").mkdir(parents=True)
    (left / "deep" / "deeper" / "file.txt").write_text("x\n")
    dry = ccm("gc", "--json", cwd=repo)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["trash"]["deleted"] == [str(left)] and left.exists()
    done = ccm("gc", "--yes", cwd=repo)
    assert done.returncode == 0 and "handed to a background deleter" in done.stdout
    for _ in range(100):
        if not left.exists():
            break
        time.sleep(0.1)
    assert not left.exists()


def test_applied_task_whose_worktree_holds_stash_entries_is_archived_with_them(repo: Path, tmp_path: Path) -> None:
    """Its commits are in the target, but its own stash (refs/worktree/stash, kept under the
    sandbox) is not: gc archives the entries before the worktree goes."""
    v = _exec(repo, tmp_path, "t1")
    wt = Path(v["worktree"])
    (wt / "feature.txt").write_text("stashed work")
    entry = git(wt, "stash", "create").strip()
    git(wt, "update-ref", "--create-reflog", "-m", "WIP", "refs/worktree/stash", entry)
    git(wt, "checkout", "--", "feature.txt")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge t1", "ccm/t1")
    Registry().move("t1", "APPLIED")
    _age("t1", 8 * DAY)
    proc = ccm("gc", "--yes", cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not wt.exists()
    archive = _ref(repo, "refs/ccm-guard/archive/t1")
    assert archive is not None and entry in git(repo, "rev-list", archive).split()


def test_an_archive_keeps_any_number_of_stash_entries(repo: Path) -> None:
    """An agent's stash may hold more entries than a command line can name parents."""
    host = layout.host_repo(repo / ".git")
    head = git(repo, "rev-parse", "HEAD").strip()
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    many = [git(repo, "commit-tree", tree, "-p", head, "-m", f"entry {i}").strip() for i in range(150)]
    kept = worktree.with_parents(host, head, many, "archive\n")
    assert cg.all_reachable(host, many, kept) and git(repo, "rev-parse", f"{kept}^1").strip() == head
    widest = max(len(line.split()) - 1 for line in git(repo, "rev-list", "--parents", kept).splitlines())
    assert widest <= 64
