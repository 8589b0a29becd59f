"""ccm-guard itself interrupted, starved and raced (docs/design-notes.md#interrupted-and-concurrent-runs).

Each test stops or disturbs a real ccm-guard process at a named point (SIGKILL through
CCM_GUARD_FAILPOINT, see ccm_guard/failpoints.py), then checks the invariants: no agent
work is lost (it is in the worktree, the branch or an archive), `task show` explains the
state, `gc` repairs it, and a second run succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git, make_repo, run_exec, small_tmpfs, write_agent

COMMIT = 'echo work > work.txt\nrgit add work.txt\nrgit commit -q -m "agent work"\n'


def _killed_at(point: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = ccm(*args, cwd=cwd, env={"CCM_GUARD_FAILPOINT": point})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    return proc


def _show(repo: Path, task: str) -> dict[str, Any]:
    proc = ccm("task", "show", task, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    shown: dict[str, Any] = json.loads(proc.stdout)
    return shown


def _gc(repo: Path) -> subprocess.CompletedProcess[str]:
    proc = ccm("gc", "--yes", "--older-than", "0s", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return proc


def _second_run_succeeds(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, 'echo again > again.txt\nrgit add again.txt\nrgit commit -q -m again\n', name="again.sh")
    assert run_exec(repo, agent, "--task", "again").code == 0


@pytest.mark.parametrize("point", ["create-before-checkout", "create-after-worktree-add"])
def test_sigkill_during_worktree_creation(repo: Path, tmp_path: Path, point: str) -> None:
    agent = write_agent(tmp_path, COMMIT)
    _killed_at(point, "exec", "--task", "t1", "--", str(agent), cwd=repo)
    shown = _show(repo, "t1")
    assert shown["status"] == "PENDING" and shown["abandoned"] is True
    _gc(repo)
    # Nothing of the agent's existed: the half-made task is gone, branch and all.
    assert not git(repo, "branch", "--list", "ccm/t1")
    assert not Path(shown["worktree"]).exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    after = ccm("task", "show", "t1", "--json", cwd=repo)
    assert after.returncode == 7 or json.loads(after.stdout)["status"] in ("CLEANED_UP", "DISCARDED")
    _second_run_succeeds(repo, tmp_path)


def test_sigkill_while_the_gates_run_keeps_the_agent_s_work(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n")
    _killed_at("before-gates", "exec", "--task", "t1", "--", str(agent), cwd=repo)
    shown = _show(repo, "t1")
    assert shown["status"] == "ACTIVE" and shown["abandoned"] is True
    head = git(repo, "rev-parse", "ccm/t1")
    assert git(repo, "show", f"{head}:work.txt") == "work"
    _gc(repo)
    shown = _show(repo, "t1")
    assert shown["status"] == "ERRORED" and Path(shown["worktree"], "wip.txt").exists()  # kept, not removed
    audit = ccm("audit", "t1", "--json", cwd=repo)
    assert json.loads(audit.stdout)["head"] == head  # the gates can still judge it
    # Discarding it afterwards archives everything, uncommitted work included.
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    assert git(repo, "show", "refs/ccm-guard/archive/t1:wip.txt") == "wip"
    _second_run_succeeds(repo, tmp_path)


def test_sigkill_after_the_apply_moved_the_target_is_recorded_by_task_show(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    git(repo, "branch", "release")
    _killed_at("apply-after-cas", "task", "apply", "t1", "--into", "release", cwd=repo)
    landed = git(repo, "rev-parse", "release")
    assert git(repo, "show", f"{landed}:work.txt") == "work"
    shown = _show(repo, "t1")
    assert "recorded it as APPLIED" in shown["repaired"] and shown["status"] == "APPLIED"
    assert shown["options"]["applied"]["new"] == landed
    _second_run_succeeds(repo, tmp_path)


def test_sigkill_before_the_apply_moved_the_target_changes_nothing(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    before = git(repo, "rev-parse", "main")
    _killed_at("apply-before-cas", "task", "apply", "t1", cwd=repo)
    assert git(repo, "rev-parse", "main") == before and git(repo, "status", "--porcelain") == ""
    shown = _show(repo, "t1")
    assert shown["status"] == "COMMITTED" and "did not land" in shown["repaired"]
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0  # and applying again works


def test_sigkill_during_discard_after_the_archive(repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    assert result.code == 1
    _killed_at("discard-after-archive", "task", "discard", "t1", cwd=repo)
    assert git(repo, "show", "refs/ccm-guard/archive/t1:wip.txt") == "wip"  # the work is safe already
    assert _show(repo, "t1")["status"] == "ERRORED"
    proc = ccm("task", "discard", "t1", cwd=repo)  # finishing the job is simply discarding again
    assert proc.returncode == 0, proc.stderr
    assert not Path(result.verdict["worktree"]).exists()
    assert git(repo, "show", "refs/ccm-guard/archive/t1:wip.txt") == "wip"


def test_the_person_commits_to_the_target_during_an_apply(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    git(repo, "branch", "release")
    go = tmp_path / "go"
    applying = subprocess.Popen([sys.executable, "-m", "ccm_guard", "task", "apply", "t1", "--into", "release", "--json"],
                                cwd=repo, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "CCM_GUARD_FAILPOINT": f"apply-before-cas:wait={go}"})
    reached = Path(f"{go}.reached")
    for _ in range(6000):  # until the apply has computed its merge and waits to move the branch
        if reached.exists() or applying.poll() is not None:
            break
        time.sleep(0.01)
    assert reached.exists(), applying.communicate()
    theirs = git(repo, "commit-tree", "-p", "release", "-m", "person's commit", git(repo, "rev-parse", "release^{tree}"))
    git(repo, "update-ref", "refs/heads/release", theirs)
    go.write_text("")
    out, err = applying.communicate(timeout=60)
    assert applying.returncode == 0, err
    applied = json.loads(out)["applied"]
    assert applied["attempts"] == 2 and applied["old"] == theirs  # lost the race once, rebuilt on their commit
    assert git(repo, "rev-parse", "release") == applied["new"] and git(repo, "rev-parse", "release^1") == theirs


def test_a_registry_locked_by_another_process_is_waited_for(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    db = Path(os.environ["CCM_GUARD_HOME"], "registry.db")
    released = tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "db.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(2)\n"
        f"open({str(released)!r}, 'w').write(repr(time.time()))\ndb.execute('COMMIT')\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    proc = ccm("task", "apply", "t1", cwd=repo)
    holder.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(db) as check:
        # It waited for the lock instead of failing: its write came after the holder let go.
        updated = check.execute("SELECT updated_at FROM tasks WHERE id = 't1'").fetchone()[0]
        assert updated > float(released.read_text())
        assert check.execute("SELECT status FROM tasks WHERE id = 't1'").fetchone() == ("APPLIED",)


def test_index_lock_left_by_a_dead_git_in_the_checkout_refuses_the_apply_and_changes_nothing(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    (repo / ".git" / "index.lock").write_text("")
    before = git(repo, "rev-parse", "main")
    proc = ccm("task", "apply", "t1", cwd=repo)
    assert proc.returncode == 8 and "branch was put back" in proc.stderr, proc.stderr
    assert git(repo, "rev-parse", "main") == before
    (repo / ".git" / "index.lock").unlink()
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0


def test_index_lock_left_in_the_task_worktree_does_not_stop_the_archive(repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    admin = Path(_show(repo, "t1")["admin_dir"])
    (admin / "index.lock").write_text("")
    proc = ccm("task", "discard", "t1", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", "refs/ccm-guard/archive/t1:wip.txt") == "wip"
    assert not Path(result.verdict["worktree"]).exists()


def test_enospc_while_archiving_keeps_the_worktree(tmp_path: Path) -> None:
    """A real full disk (a small tmpfs holding the repository, whose object store the
    archive writes to): discard stops before removing anything."""
    from ccm_guard.errors import GuardError
    from ccm_guard.run.tasks import discard
    from ccm_guard.state.registry import Registry

    with small_tmpfs(tmp_path / "small", "40m") as small:
        repo = make_repo(small / "repo")  # the state home (worktree, registry) stays on the roomy disk
        wip = "head -c 200000 /dev/urandom | base64 > wip.txt\n"  # uncommitted: the archive must write it
        result = run_exec(repo, write_agent(tmp_path, COMMIT + wip), "--task", "t1")
        assert result.code == 1 and Path(result.verdict["worktree"], "wip.txt").exists()
        with open(small / "filler", "wb") as fh, pytest.raises(OSError):
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        with pytest.raises(GuardError, match="No space left on device"):
            discard(Registry(), "t1")
        assert Path(result.verdict["worktree"], "wip.txt").exists()  # nothing removed
        assert git(repo, "rev-parse", "--verify", "--quiet", "ccm/t1", check=False)
        assert Registry().get("t1").status == "ERRORED"


def test_a_discard_killed_after_removing_the_worktree_then_repeated_keeps_the_uncommitted_work(
        repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    assert result.code == 1
    _killed_at("discard-after-remove", "task", "discard", "t1", cwd=repo)
    assert not Path(result.verdict["worktree"]).exists()
    archived = git(repo, "rev-parse", "refs/ccm-guard/archive/t1")
    proc = ccm("task", "discard", "t1", "--json", cwd=repo)  # the documented retry
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["archive"] == "refs/ccm-guard/archive/t1"
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/t1") == archived  # not replaced by the bare branch
    assert git(repo, "show", "refs/ccm-guard/archive/t1:wip.txt") == "wip"
    assert ccm("task", "restore", "t1", cwd=repo).returncode == 0
    worktree = Path(result.verdict["worktree"])
    assert (worktree / "wip.txt").read_text() == "wip\n"
    # The agent's commit comes back as a commit on the branch, not as untracked files.
    assert git(repo, "show", "ccm/t1:work.txt") == "work" and git(worktree, "status", "--porcelain") == "?? wip.txt"


def test_a_restored_task_discarded_again_keeps_both_archives(repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    first = git(repo, "rev-parse", "refs/ccm-guard/archive/t1")
    assert ccm("task", "restore", "t1", cwd=repo).returncode == 0
    worktree = Path(result.verdict["worktree"])
    (worktree / "wip.txt").unlink()
    (worktree / "other.txt").write_text("other\n")
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    second = git(repo, "rev-parse", "refs/ccm-guard/archive/t1")
    assert git(repo, "show", f"{second}:other.txt") == "other"
    assert first in git(repo, "rev-list", second).split()  # the earlier archive is still reachable


@pytest.mark.parametrize("sandbox", ["none", "auto"])
def test_the_agent_dies_with_a_killed_ccm_guard(repo: Path, tmp_path: Path, sandbox: str) -> None:
    # A daemonised writer (setsid, double fork) that would go on writing into the worktree.
    agent = write_agent(tmp_path, "setsid sh -c 'while :; do date +%s%N >> tick.txt; sleep 0.05; done' &\n"
                                  "touch started; sleep 60\n")
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--sandbox", sandbox, "--task", "t1",
                             "--", str(agent)], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worktree = None
    for _ in range(3000):
        found = list((Path(os.environ["CCM_GUARD_HOME"]) / "worktrees").glob("*/t1/started"))
        if found and (found[0].parent / "tick.txt").exists():
            worktree = found[0].parent
            break
        time.sleep(0.01)
    assert worktree is not None, "the agent never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # the watchdog stops the run at once; give the writer time to show it is gone
    ticks = (worktree / "tick.txt").stat().st_size
    time.sleep(0.5)
    assert (worktree / "tick.txt").stat().st_size == ticks, "the agent's writer outlived ccm-guard"


def test_sigkill_after_the_apply_moved_the_checked_out_branch_repairs_the_checkout(repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1").code == 0
    _killed_at("apply-after-cas", "task", "apply", "t1", cwd=repo)  # into main, checked out in repo
    landed = git(repo, "rev-parse", "main")
    assert git(repo, "show", f"{landed}:work.txt") == "work"
    assert "D  work.txt" in git(repo, "status", "--porcelain")  # as the kill left it: a commit would revert
    shown = _show(repo, "t1")
    assert shown["status"] == "APPLIED" and "brought up to date" in shown["repaired"]
    assert git(repo, "status", "--porcelain") == "" and (repo / "work.txt").read_text() == "work\n"
    _second_run_succeeds(repo, tmp_path)


def test_sigkill_after_the_rollback_of_an_apply_moved_the_target_is_recorded_and_repaired(
        repo: Path, tmp_path: Path) -> None:
    before = git(repo, "rev-parse", "main")
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1", "--apply").code == 0
    assert (repo / "work.txt").exists()
    _killed_at("rollback-after-cas", "task", "rollback", "t1", cwd=repo)
    assert git(repo, "rev-parse", "main") == before  # main is back, the checkout not yet
    shown = _show(repo, "t1")
    assert shown["status"] == "ROLLED_BACK" and "recorded it as ROLLED_BACK" in shown["repaired"]
    assert "brought up to date" in shown["repaired"]
    assert git(repo, "status", "--porcelain") == "" and not (repo / "work.txt").exists()
    _second_run_succeeds(repo, tmp_path)


def test_a_rollback_killed_before_it_moved_the_target_changes_nothing_and_runs_again(
        repo: Path, tmp_path: Path) -> None:
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "t1", "--apply").code == 0
    applied = git(repo, "rev-parse", "main")
    _killed_at("rollback-before-cas", "task", "rollback", "t1", cwd=repo)
    assert git(repo, "rev-parse", "main") == applied
    proc = _gc(repo)
    assert proc.returncode == 0, proc.stderr
    assert _show(repo, "t1")["status"] == "APPLIED"
    assert ccm("task", "rollback", "t1", cwd=repo).returncode == 0
    assert _show(repo, "t1")["status"] == "ROLLED_BACK" and not (repo / "work.txt").exists()


def test_a_restore_killed_after_making_the_worktree_is_finished_by_restoring_again(repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    _killed_at("restore-after-worktree-add", "task", "restore", "t1", cwd=repo)
    worktree = Path(result.verdict["worktree"])
    assert worktree.is_dir() and _show(repo, "t1")["status"] == "DISCARDED"  # as the kill left it
    proc = ccm("task", "restore", "t1", cwd=repo)  # the same command again finishes the job
    assert proc.returncode == 0, proc.stderr
    assert _show(repo, "t1")["status"] == "ERRORED"
    assert (worktree / "wip.txt").read_text() == "wip\n" and (worktree / "work.txt").read_text() == "work\n"
    assert git(worktree, "status", "--porcelain") == "?? wip.txt"


def test_no_command_removes_a_worktree_a_process_still_uses(repo: Path, tmp_path: Path) -> None:
    result = run_exec(repo, write_agent(tmp_path, COMMIT + "echo wip > wip.txt\n"), "--task", "t1")
    worktree = Path(result.verdict["worktree"])
    writer = subprocess.Popen(["sleep", "300"], cwd=worktree)  # an editor, or an agent that outlived its run
    try:
        assert f"{writer.pid}" in " ".join(_show(repo, "t1")["processes"])
        proc = ccm("task", "discard", "t1", cwd=repo)
        assert proc.returncode == 7 and f"kill {writer.pid}" in proc.stderr, proc.stderr
        assert worktree.is_dir() and _show(repo, "t1")["status"] == "ERRORED"
        gc = ccm("gc", "--yes", "--older-than", "0s", "--json", cwd=repo)
        assert gc.returncode in (0, 1) and worktree.is_dir(), gc.stdout + gc.stderr
        assert "in use by" in gc.stdout
    finally:
        writer.kill()
        writer.wait()
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    assert not worktree.exists()


def test_a_hung_holder_of_the_registry_is_waited_for_only_so_long(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ccm_guard.errors import StateError
    from ccm_guard.state import registry
    from ccm_guard.state.registry import Registry

    Registry(tmp_path / "registry.db").close()  # made; now another process hangs holding its open lock
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"f = open({str(tmp_path / 'registry.open.lock')!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(registry, "REGISTRY_WAIT", 0.5)
        started = time.monotonic()
        with pytest.raises(StateError, match="has held .*registry.open.lock for over"):
            Registry(tmp_path / "registry.db")
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()

    Registry(tmp_path / "registry.db").close()  # once it is gone, the registry opens again


def test_gc_on_a_full_disk_says_so_keeps_the_work_and_a_later_gc_finishes(tmp_path: Path) -> None:
    """gc archives a stale task's uncommitted work before removing anything: on a full disk
    that fails, gc names it in one line per action (exit 7, no traceback), keeps the
    worktree, and once there is room the same gc finishes the job."""
    with small_tmpfs(tmp_path / "small", "40m") as small:
        repo = make_repo(small / "repo")
        wip = "head -c 200000 /dev/urandom | base64 > wip.txt\n"
        result = run_exec(repo, write_agent(tmp_path, COMMIT + wip), "--task", "old")
        assert result.code == 1
        with sqlite3.connect(Path(os.environ["CCM_GUARD_HOME"]) / "registry.db") as db:
            db.execute("UPDATE tasks SET updated_at = ? WHERE id = 'old'", (time.time() - 30 * 86400,))
        filler = small / "filler"
        with open(filler, "wb") as fh, pytest.raises(OSError):
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        full = ccm("gc", "--yes", cwd=repo)
        assert full.returncode == 7, full.stdout + full.stderr
        assert "Traceback" not in full.stderr and "No space left on device" in full.stdout + full.stderr
        assert Path(result.verdict["worktree"], "wip.txt").exists()  # nothing removed unarchived
        filler.unlink()
        again = ccm("gc", "--yes", "--json", cwd=repo)
        assert again.returncode == 0, again.stdout + again.stderr
        assert not Path(result.verdict["worktree"]).exists()
        assert git(repo, "show", "refs/ccm-guard/archive/old:wip.txt")
