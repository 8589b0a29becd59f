"""The warm pool and sparse tasks: real repositories, real `ccm-guard` processes.

A pooled worktree must never carry one task's files into another: what is left in it,
or any change to its git metadata, and it is destroyed, never handed out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git, make_repo, run_exec, small_tmpfs, spawn_exec, write_agent

from ccm_guard import pool
from ccm_guard.pool import admin as pool_admin
from ccm_guard.pool import refiller
from ccm_guard.state.registry import Registry

FILES = {"README.md": "# project\n", "src/app.py": "print('hi')\n", ".gitignore": "*.log\n",
         "docs/guide.md": "guide\n", "lib/top.txt": "top\n", "lib/sub/deep.txt": "deep\n",
         "lib/other/x.txt": "x\n"}
COMMIT = "echo \"work $CCM_GUARD_TASK\" >> src/app.py\ngit commit -q -am \"work\"\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", FILES)


def pool_cmd(repo: Path, *args: str) -> dict[str, Any]:
    if args[:1] == ("fill",) and "--refill" not in args:
        args = (*args, "--no-refill")  # takes and returns are judged without a refiller racing them
    proc = ccm("pool", *args, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def pool_of(repo: Path) -> dict[str, Any]:
    pools = pool_cmd(repo, "status", "--repo", str(repo))["pools"]
    return pools[0] if pools else {"ready": 0, "dirty": 0, "entries": []}


def ready(repo: Path) -> list[dict[str, Any]]:
    return [e for e in pool_of(repo)["entries"] if e["state"] == "ready"]


def settled(repo: Path, seconds: float = 60) -> list[dict[str, Any]]:
    """The ready entries once no entry is being given back (that runs after exec exited)."""
    deadline = time.monotonic() + seconds
    while any(e["state"] == "returning" and not e["dirty"] for e in pool_of(repo)["entries"]):
        assert time.monotonic() < deadline, "an entry never finished returning"
        time.sleep(0.05)
    return ready(repo)


def worktrees(repo: Path) -> str:
    return git(repo, "worktree", "list", "--porcelain")


def wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# --- fill, take, give back ----------------------------------------------------------------------


def test_fill_makes_checked_out_trees_that_git_itself_does_not_see(repo: Path) -> None:
    listing = worktrees(repo)
    made = pool_cmd(repo, "fill", "-n", "2")
    assert made["ready"] == 2 and len(made["made"]) == 2 and made["base"] == git(repo, "rev-parse", "HEAD")
    # No admin entry under .git/worktrees: nothing for `git worktree prune` to touch, and
    # nothing a running task's snapshot sees come or go.
    assert worktrees(repo) == listing and not (repo / ".git" / "worktrees").exists()
    for entry in ready(repo):
        home = Path(entry["path"])
        assert (home / "src" / "app.py").read_text() == "print('hi')\n" and not (home / ".git").exists()
        assert Path(entry["home"] + ".index").is_file() and entry["base"] == made["base"]
    # Filling again makes nothing; -n 1 trims.
    assert pool_cmd(repo, "fill", "-n", "2")["made"] == []
    trimmed = pool_cmd(repo, "fill", "-n", "1")
    assert trimmed["ready"] == 1 and len(trimmed["destroyed"]) == 1


def inode(path: Path) -> int:
    return os.stat(path).st_ino


INODE = "stat -c %i docs/guide.md > \"$CCM_GUARD_SUMMARY.inode\"\n"


def seen_inode(result: Any) -> int:
    return int(Path(result.verdict["log_dir"], "agent", "summary.inode").read_text())


def test_exec_takes_a_pooled_worktree_and_a_passed_cleanup_gives_it_back_clean(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    pooled = inode(Path(entry["path"], "docs", "guide.md"))
    agent = write_agent(tmp_path, INODE + "echo build > out.log\nmkdir -p cache && echo c > cache/x.log\n" + COMMIT)
    result = run_exec(repo, agent, "--task", "one", "--cleanup")
    assert result.code == 0, result.stderr
    assert seen_inode(result) == pooled  # the pool's files, not a fresh checkout
    assert "went back to the warm pool" in result.verdict["disposition"]
    show = json.loads(ccm("task", "show", "one", "--json", cwd=repo).stdout)
    assert show["options"]["pooled"] is True and Path(show["admin_dir"]).name == "one"
    # Back in the pool, at its base, without the task's ignored build output or commit.
    (back,) = settled(repo)
    assert back["id"] == entry["id"] and back["path"] == entry["path"]
    home = Path(back["path"])
    assert not (home / "out.log").exists() and not (home / "cache").exists() and not (home / ".git").exists()
    assert (home / "src" / "app.py").read_text() == "print('hi')\n"
    assert git(repo, "branch", "--list", "ccm/one") == "" and worktrees(repo).count("worktree ") == 1
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/one") == result.verdict["head"]
    # The next task gets the same files, pristine.
    check = write_agent(tmp_path, INODE + "test ! -e out.log && test ! -e cache\n"
                        "test -z \"$(git status --porcelain --ignored)\"\n"
                        "test \"$(git symbolic-ref HEAD)\" = refs/heads/ccm/two\n" + COMMIT, name="check.sh")
    second = run_exec(repo, check, "--task", "two")
    assert second.code == 0, second.stderr + json.dumps(second.verdict["gates"])
    assert seen_inode(second) == pooled and pool_of(repo)["ready"] == 0


def test_taking_writes_only_the_files_that_differ_from_the_pooled_base(repo: Path, tmp_path: Path) -> None:
    old = git(repo, "rev-parse", "HEAD")
    pool_cmd(repo, "fill", "-n", "1", "--base", old)
    (entry,) = ready(repo)
    pooled = inode(Path(entry["path"], "docs", "guide.md"))
    (repo / "src" / "app.py").write_text("print('new')\n")
    git(repo, "commit", "-q", "-am", "newer")
    agent = write_agent(tmp_path, INODE + "grep -q new src/app.py\n" + COMMIT)
    result = run_exec(repo, agent, "--task", "newer")  # --base HEAD: one commit past the pool's
    assert result.code == 0, result.stderr + json.dumps(result.verdict["gates"])
    assert result.verdict["base"] == git(repo, "rev-parse", "HEAD")
    assert seen_inode(result) == pooled  # unchanged between the bases: not rewritten


def test_a_failed_task_never_returns_its_worktree(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    agent = write_agent(tmp_path, "echo left > stray.txt")  # no commit, and an untracked file: fails
    result = run_exec(repo, agent, "--task", "bad", "--on-fail", "discard")
    assert result.code == 1 and result.verdict["disposition"].startswith("removed")
    assert pool_of(repo)["entries"] == [] and not Path(entry["path"]).exists()
    assert worktrees(repo).count("worktree ") == 1


def test_a_task_that_makes_a_stray_branch_fails_and_gives_nothing_back(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    agent = write_agent(tmp_path, COMMIT + "rgit branch stray\n")
    result = run_exec(repo, agent, "--sandbox", "none", "--task", "strays", "--cleanup", "--on-fail", "discard")
    assert result.code == 1 and result.status("refs-untouched") == "fail"
    assert pool_of(repo)["entries"] == [] and not Path(entry["path"]).exists()


def test_drain_destroys_ready_worktrees_and_exec_then_makes_fresh_ones(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "2")
    paths = [e["path"] for e in ready(repo)]
    drained = pool_cmd(repo, "drain")
    assert len(drained["destroyed"]) == 2 and drained["left_with_tasks"] == []
    assert pool_cmd(repo, "status")["pools"] == [] and all(not Path(p).exists() for p in paths)
    result = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "fresh")
    assert result.code == 0
    assert "pooled" not in json.loads(ccm("task", "show", "fresh", "--json", cwd=repo).stdout)["options"]


def test_apply_cleanup_and_discard_give_a_passed_tasks_worktree_back(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "2")
    homes = {e["path"] for e in ready(repo)}
    for name in ("applied", "kept"):
        result = run_exec(repo, write_agent(tmp_path, COMMIT, name=f"{name}.sh"), "--task", name)
        assert result.code == 0, result.stderr
    # Left in the kept task after its run: an edit and an ignored file. The archive keeps
    # the edit; the pool must not hand either to the next task.
    kept = Path(json.loads(ccm("task", "show", "kept", "--json", cwd=repo).stdout)["worktree"])
    (kept / "README.md").write_text("edited after the run\n")
    (kept / "after.log").write_text("ignored\n")
    git(repo, "branch", "landing")
    applied = ccm("task", "apply", "applied", "--into", "landing", "--cleanup", "--json", cwd=repo)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["cleanup"]["to_pool"] is True
    discarded = ccm("task", "discard", "kept", cwd=repo)
    assert discarded.returncode == 0 and "went back to the warm pool" in discarded.stdout, discarded.stderr
    archive = git(repo, "rev-parse", "refs/ccm-guard/archive/kept")
    assert git(repo, "show", f"{archive}:README.md") == "edited after the run"
    back = settled(repo)
    assert {e["path"] for e in back} == homes and worktrees(repo).count("worktree ") == 1
    for entry in back:
        home = Path(entry["path"])
        assert (home / "README.md").read_text() == "# project\n" and not (home / "after.log").exists()
        assert (home / "src" / "app.py").read_text() == "print('hi')\n"


def test_discarding_a_failed_task_destroys_its_pooled_worktree(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    result = run_exec(repo, write_agent(tmp_path, "echo left > stray.txt"), "--task", "bad")
    assert result.code == 1
    discarded = ccm("task", "discard", "bad", "--json", cwd=repo)
    assert discarded.returncode == 0 and json.loads(discarded.stdout)["to_pool"] is False
    assert pool_of(repo)["entries"] == [] and not Path(entry["path"]).exists()


def test_a_taken_worktree_is_replaced_in_the_background_and_the_pool_stays_at_its_size(
        repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1", "--refill")
    (first,) = ready(repo)
    assert pool_of(repo)["refill"] is True
    result = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "one")
    assert result.code == 0, result.stderr + json.dumps(result.verdict["gates"])
    deadline = time.monotonic() + 60
    while not ready(repo):
        assert time.monotonic() < deadline, f"the pool was never refilled: {pool_of(repo)}"
        time.sleep(0.1)
    (second,) = ready(repo)
    assert second["id"] != first["id"] and second["base"] == git(repo, "rev-parse", "HEAD")
    home = Path(second["path"])
    assert (home / "src" / "app.py").read_text() == "print('hi')\n" and not (home / ".git").exists()
    # The pool is full again: the task's worktree is removed, not returned.
    discarded = ccm("task", "discard", "one", "--json", cwd=repo)
    assert discarded.returncode == 0 and json.loads(discarded.stdout)["to_pool"] is False, discarded.stderr
    assert [e["id"] for e in settled(repo)] == [second["id"]] and len(pool_of(repo)["entries"]) == 1
    # The next task takes the new one, pristine.
    check = write_agent(tmp_path, "test -z \"$(git status --porcelain --ignored)\"\n" + COMMIT, name="check.sh")
    assert run_exec(repo, check, "--task", "two").code == 0


def _refiller_held(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Thread, Path]:
    """A refiller stopped with its new entry checked out, not yet ready; touch the path to go on."""
    go = tmp_path / "go"
    monkeypatch.setenv("CCM_GUARD_FAILPOINT", f"pool-before-settle:wait={go}")
    common = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    worker = threading.Thread(target=refiller.refill_now, args=(common,))
    worker.start()
    wait_for(Path(f"{go}.reached"))
    monkeypatch.delenv("CCM_GUARD_FAILPOINT")
    return worker, go


@pytest.mark.parametrize("then", [["drain"], ["fill", "-n", "1"], ["fill", "-n", "0"]])
def test_fill_and_drain_wait_for_a_refiller_and_count_what_it_made(repo: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  then: list[str]) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "one").code == 0  # the pool is short by one
    worker, go = _refiller_held(repo, tmp_path, monkeypatch)
    (filling,) = [e for e in pool_of(repo)["entries"] if e["state"] == "filling"]
    person = subprocess.Popen([sys.executable, "-m", "ccm_guard", "pool", *then, "--no-refill", "--json"]
                              if then[0] == "fill" else [sys.executable, "-m", "ccm_guard", "pool", *then, "--json"],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert person.poll() is None, "fill/drain did not wait for the refiller"
    go.touch()
    worker.join(60)
    out, err = person.communicate(timeout=60)
    assert person.returncode == 0, err
    entries = [e for e in pool_of(repo)["entries"] if e["state"] != "out"]
    wanted = 1 if then == ["fill", "-n", "1"] else 0
    assert len(entries) == wanted and all(e["state"] == "ready" for e in entries)
    if wanted == 0:
        assert not Path(filling["path"]).exists()
    else:
        assert json.loads(out)["made"] == [] and entries[0]["id"] == filling["id"]


def test_the_refiller_leaves_the_running_task_its_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state home with room for another checkout but not for the reserve a running task
    keeps (512 MB here): the refiller makes nothing, and says nothing."""
    with small_tmpfs(tmp_path / "small", "300m") as small:
        repo = make_repo(small / "repo", FILES)
        monkeypatch.setenv("CCM_GUARD_HOME", str(small / "state"))
        pool_cmd(repo, "fill", "-n", "1")
        assert run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "one").code == 0
        refiller.refill_now(Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")))
        assert [e["state"] for e in pool_of(repo)["entries"]] == ["out"]


def test_a_worktree_coming_back_to_a_drained_pool_is_destroyed(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    go = tmp_path / "go"
    result = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "one", "--cleanup",
                      env={"CCM_GUARD_FAILPOINT": f"pool-finishing:wait={go}"})  # the detached finisher waits
    assert result.code == 0 and "warm pool" in result.verdict["disposition"]
    wait_for(Path(f"{go}.reached"))
    (returning,) = pool_of(repo)["entries"]
    drained = pool_cmd(repo, "drain")
    assert drained["left_with_tasks"] == [returning["id"]]
    go.touch()
    deadline = time.monotonic() + 60
    while pool_of(repo)["entries"]:
        assert time.monotonic() < deadline, pool_of(repo)
        time.sleep(0.05)
    assert not Path(returning["path"]).exists()
    fresh = run_exec(repo, write_agent(tmp_path, COMMIT, name="two.sh"), "--task", "two")
    assert fresh.code == 0 and "pooled" not in json.loads(ccm("task", "show", "two", "--json", cwd=repo).stdout)["options"]


def test_an_emptied_pool_is_refilled_by_the_next_exec(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1", "--refill")
    (entry,) = ready(repo)
    Path(entry["path"], "planted.txt").write_text("x\n")  # not pristine: the next take destroys it
    result = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "one")
    assert result.code == 0
    assert "pooled" not in json.loads(ccm("task", "show", "one", "--json", cwd=repo).stdout)["options"]
    deadline = time.monotonic() + 60
    while not ready(repo):
        assert time.monotonic() < deadline, f"the emptied pool was never refilled: {pool_of(repo)}"
        time.sleep(0.1)
    (new,) = ready(repo)
    assert new["id"] != entry["id"] and not Path(new["path"], "planted.txt").exists()


def test_resizing_keeps_the_stored_refill_setting(repo: Path) -> None:
    assert pool_cmd(repo, "fill", "-n", "1")["ready"] == 1  # --no-refill (pool_cmd's default)
    proc = ccm("pool", "fill", "-n", "2", "--json", cwd=repo)  # the flag not repeated
    assert proc.returncode == 0 and pool_of(repo)["refill"] is False
    assert "not refilled" in ccm("pool", "status", cwd=repo).stdout


def test_an_older_registry_is_migrated_by_many_processes_at_once(tmp_path: Path) -> None:
    import sqlite3

    for trial in range(4):
        home = tmp_path / f"home{trial}"
        home.mkdir()
        db = sqlite3.connect(home / "registry.db")
        db.execute("CREATE TABLE pool_repos (repo TEXT PRIMARY KEY, size INTEGER NOT NULL, rev TEXT NOT NULL, "
                   "key TEXT NOT NULL, main_git_dir TEXT NOT NULL, main_worktree TEXT NOT NULL)")
        db.execute("INSERT INTO pool_repos VALUES ('/r', 1, 'HEAD', 'k', '/r', '/w')")
        db.commit()
        db.close()
        code = "from ccm_guard.pool import records as p; print(p.config_of(p.open_registry(), __import__('pathlib').Path('/r')).refill)"
        procs = [subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "CCM_GUARD_HOME": str(home)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
        results = [(p.wait(60), *p.communicate()) for p in procs]
        assert all(rc == 0 and out.strip() == "1" for rc, out, _ in results), results


# --- never leak one task's files into another -------------------------------------------------


def test_leftovers_planted_in_a_returned_worktree_never_reach_the_next_task(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    first = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "first", "--cleanup")
    assert first.code == 0 and "warm pool" in first.verdict["disposition"]
    (entry,) = settled(repo)
    home = Path(entry["path"])
    (home / "planted.txt").write_text("untracked\n")
    (home / "planted.log").write_text("ignored\n")
    (home / "README.md").write_text("dirty\n")
    git(repo, "branch", "stray")  # and git metadata pointing the tree at a stray branch
    git(repo, "worktree", "add", "-q", "--no-checkout", str(tmp_path / "stray"), "stray")
    (home / ".git").write_text((tmp_path / "stray" / ".git").read_text())
    check = write_agent(tmp_path, "test ! -e planted.txt && test ! -e planted.log\n"
                        "test \"$(cat README.md)\" = '# project'\n"
                        "test \"$(git symbolic-ref HEAD)\" = refs/heads/ccm/next\n" + COMMIT, name="check.sh")
    result = run_exec(repo, check, "--task", "next")
    assert result.code == 0, result.stderr + json.dumps(result.verdict["gates"])
    # The planted entry was destroyed, not cleaned and handed out: the task got a fresh worktree.
    assert not home.exists() and pool_of(repo)["entries"] == []
    assert "pooled" not in json.loads(ccm("task", "show", "next", "--json", cwd=repo).stdout)["options"]


def _plant(kind: str, home: Path, index: Path) -> None:
    if kind == "untracked":
        (home / "new.txt").write_text("x\n")
    elif kind == "ignored":
        (home / "build.log").write_text("x\n")
    elif kind == "ignored-dir":
        (home / "cache" / "deep").mkdir(parents=True)
        (home / "cache" / "deep" / "x.log").write_text("x\n")
    elif kind == "dirty":
        (home / "src" / "app.py").write_text("print('evil')\n")
    elif kind == "same-size":
        (home / "src" / "app.py").write_text("print('HI')\n")
    elif kind == "mode":
        (home / "src" / "app.py").chmod(0o755)
    elif kind == "deleted":
        (home / "docs" / "guide.md").unlink()
    elif kind == "symlink":
        (home / "docs" / "guide.md").unlink()
        (home / "docs" / "guide.md").symlink_to("/etc/passwd")
    elif kind == "dot-git":
        (home / ".git").write_text("gitdir: /somewhere/else\n")
    elif kind == "index":
        os.utime(index)


KINDS = ["untracked", "ignored", "ignored-dir", "dirty", "same-size", "mode", "deleted", "symlink", "dot-git", "index"]


def test_any_change_to_a_pooled_tree_makes_it_not_pristine(repo: Path) -> None:
    pool_cmd(repo, "fill", "-n", str(len(KINDS) + 1))
    control, *planted = pool.entries(Registry(), None, ("ready",))
    for kind, entry in zip(KINDS, planted):
        _plant(kind, Path(entry.path), entry.index)
    assert pool.problem(control) is None
    for kind, entry in zip(KINDS, planted):
        assert pool.problem(entry) is not None, kind


def test_a_task_hiding_a_change_from_git_status_does_not_leak_it(repo: Path, tmp_path: Path) -> None:
    """assume-unchanged hides a changed file from `git status`, but not from clean-tree,
    and a failed task's worktree never goes back to the pool: the next task sees none of it."""
    pool_cmd(repo, "fill", "-n", "1")
    hide = write_agent(tmp_path, COMMIT + "echo evil > README.md\ngit update-index --assume-unchanged README.md\n")
    first = run_exec(repo, hide, "--task", "hider", "--cleanup", "--on-fail", "discard")
    assert first.code == 1 and "flagged assume-unchanged" in first.reasons("clean-tree"), first.stderr
    check = write_agent(tmp_path, "test \"$(cat README.md)\" = '# project'\n" + COMMIT, name="check.sh")
    assert run_exec(repo, check, "--task", "after").code == 0


# --- concurrency and crashes ----------------------------------------------------------------------


def test_concurrent_pool_execs_never_share_a_worktree(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "3")
    pooled = {inode(Path(e["path"], "docs", "guide.md")) for e in ready(repo)}
    seen = tmp_path / "seen"
    seen.mkdir()
    # No commits: another task's commit seen half-done (ref moved, index.lock not yet
    # renamed) fails refs-untouched now and then, pool or not; that is not what this checks.
    agent = write_agent(tmp_path, f"stat -c %i docs/guide.md > {seen}/$CCM_GUARD_TASK\nsleep 1\n")
    procs = [spawn_exec(repo, "--sandbox", "none", "--json", "--pool", "--no-require-commit", "--task", f"c{i}", "--", str(agent))
             for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (stdout, stderr) in zip(procs, outs):
        assert proc.returncode == 0, stderr + stdout
    inodes = {p.name: int(p.read_text()) for p in seen.iterdir()}
    assert len(inodes) == 4 and len(set(inodes.values())) == 4
    assert len(pooled & set(inodes.values())) == 3  # the pool's three, and one fresh checkout
    out = [e for e in pool_of(repo)["entries"] if e["state"] == "out"]
    assert len(out) == 3 and len({e["task"] for e in out}) == 3 and len({e["path"] for e in out}) == 3


def test_filling_and_draining_while_a_task_runs_leaves_its_gates_alone(repo: Path, tmp_path: Path) -> None:
    """Pool entries have no admin dir under .git/worktrees, so nothing of them shows in a
    running task's snapshots: not their making, nor their destruction."""
    started, go = tmp_path / "started", tmp_path / "go"
    agent = write_agent(tmp_path, f"touch {started}\nwhile [ ! -e {go} ]; do sleep 0.05; done\n" + COMMIT)
    proc = spawn_exec(repo, "--sandbox", "none", "--json", "--no-pool", "--task", "busy", "--", str(agent))
    wait_for(started)
    pool_cmd(repo, "fill", "-n", "2")
    pool_cmd(repo, "drain")
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err + out
    assert all(g["status"] == "pass" for g in json.loads(out)["gates"])


def test_a_crash_while_checked_out_leaves_it_dirty_and_out_of_the_pool(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    started = tmp_path / "started"
    agent = write_agent(tmp_path, f"echo $$ > {started}.tmp && mv {started}.tmp {started}\nsleep 60\n")
    proc = spawn_exec(repo, "--sandbox", "none", "--json", "--task", "crashed", "--", str(agent))
    try:
        wait_for(started)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if started.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(started.read_text()), signal.SIGKILL)
    (out,) = pool_of(repo)["entries"]
    assert out["id"] == entry["id"] and out["state"] == "out" and out["dirty"] and "crashed" in out["note"]
    assert out["path"] in worktrees(repo)  # an ordinary (abandoned) task worktree now
    # Never handed out again: the next task gets a fresh worktree; fill does not count it.
    result = run_exec(repo, write_agent(tmp_path, COMMIT, name="next.sh"), "--sandbox", "none", "--task", "after")
    assert result.code == 0
    assert "pooled" not in json.loads(ccm("task", "show", "after", "--json", cwd=repo).stdout)["options"]
    refilled = pool_cmd(repo, "fill", "-n", "1")
    assert refilled["ready"] == 1 and len(refilled["made"]) == 1 and refilled["destroyed"] == []
    assert pool_of(repo)["dirty"] == 1
    # Discarding the crashed task removes it, and the pool forgets it.
    assert ccm("task", "discard", "crashed", cwd=repo).returncode == 0
    assert pool_of(repo)["dirty"] == 0 and not Path(out["path"]).exists()


@pytest.mark.parametrize("point", ["pool-after-claim", "pool-after-move"])
def test_a_take_killed_halfway_is_recognised_and_destroyed(repo: Path, tmp_path: Path, point: str) -> None:
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    agent = write_agent(tmp_path, COMMIT)
    killed = ccm("exec", "--json", "--task", "killed", "--", str(agent), cwd=repo,
                 env={"CCM_GUARD_FAILPOINT": point})
    assert killed.returncode == -signal.SIGKILL
    (half,) = pool_of(repo)["entries"]
    assert half["state"] == "taking" and half["dirty"] and "interrupted" in half["note"]
    result = run_exec(repo, agent, "--task", "after")
    assert result.code == 0
    assert "pooled" not in json.loads(ccm("task", "show", "after", "--json", cwd=repo).stdout)["options"]
    refilled = pool_cmd(repo, "fill", "-n", "1")
    assert refilled["destroyed"] == [entry["id"]] and refilled["ready"] == 1
    assert not Path(half["path"]).exists() and not Path(entry["home"]).exists()
    assert half["path"] not in worktrees(repo)  # nor is its admin dir left behind


@pytest.mark.parametrize("point", ["pool-returning", "pool-finishing"])
def test_a_return_killed_halfway_is_recognised_and_destroyed(repo: Path, tmp_path: Path, point: str) -> None:
    """Killed while exec hands the files back, or while the detached finisher resets them."""
    pool_cmd(repo, "fill", "-n", "1")
    (entry,) = ready(repo)
    run = ccm("exec", "--json", "--task", "killed", "--cleanup", "--", str(write_agent(tmp_path, COMMIT)),
              cwd=repo, env={"CCM_GUARD_FAILPOINT": point})
    assert run.returncode == (-signal.SIGKILL if point == "pool-returning" else 0)
    deadline = time.monotonic() + 60
    while not (half := pool_of(repo)["entries"][0])["dirty"]:
        assert time.monotonic() < deadline, half
        time.sleep(0.05)
    assert half["state"] == "returning" and "interrupted" in half["note"]
    assert pool_cmd(repo, "fill", "-n", "1")["destroyed"] == [entry["id"]]
    assert not Path(half["path"]).exists() and worktrees(repo).count("worktree ") == 1


# --- sparse tasks ------------------------------------------------------------------------------------


def test_sparse_exec_checks_out_only_the_cone_and_its_own_setup_is_baseline(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "1")  # a pool exists, and still a sparse task is made fresh
    agent = write_agent(tmp_path, "test -e README.md && test -e src/app.py && test ! -e docs && test ! -e lib\n"
                        + COMMIT)
    result = run_exec(repo, agent, "--task", "sp", "--sparse", "src")
    assert result.code == 0, result.stderr + json.dumps(result.verdict["gates"])
    assert all(g["status"] == "pass" for g in result.verdict["gates"])
    assert pool_of(repo)["ready"] == 1
    show = json.loads(ccm("task", "show", "sp", "--json", cwd=repo).stdout)
    assert show["options"]["sparse"] == ["src"] and "pooled" not in show["options"]


def test_sparse_change_outside_the_cone_committed_around_the_hooks_fails_path_policy(
        repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "mkdir -p docs && echo new > docs/new.md\n"
                        "rgit add --sparse docs/new.md\nrgit commit -q -m 'outside'\n")
    result = run_exec(repo, agent, "--task", "out", "--sparse", "src")
    assert result.code == 1
    assert result.status("path-policy") == "fail" and "docs/new.md" in result.reasons("path-policy")
    assert result.status("git-metadata") == "pass"


def test_sparse_uncommitted_change_outside_the_cone_fails(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "mkdir -p docs && echo changed > docs/guide.md\n" + COMMIT)
    result = run_exec(repo, agent, "--task", "dirty", "--sparse", "src")
    assert result.code == 1
    assert result.status("clean-tree") == "fail" and result.status("path-policy") == "fail"
    assert "docs/guide.md" in result.reasons("path-policy")


def test_sparse_agent_widening_its_checkout_fails_git_metadata(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "rgit sparse-checkout disable\n" + COMMIT)
    result = run_exec(repo, agent, "--task", "widen", "--sparse", "src")
    assert result.code == 1 and result.status("git-metadata") == "fail"
    assert "sparse" in result.reasons("git-metadata").lower()


def test_the_cone_rules_agree_with_git_on_every_path(tmp_path: Path) -> None:
    """What the forbid rules let through is exactly what git checks out for the cone."""
    from ccm_guard.pathrules.rules import Rules
    from ccm_guard.worktree.sparse import cone_forbid

    files = {f"{a}/{b}/{c}.txt": "x\n" for a in ("a", "b", "lib") for b in ("x", "y", "sub") for c in ("1", "2")}
    files.update({"top.txt": "t\n", "a/direct.txt": "d\n", "lib/sub/x/deeper/z.txt": "z\n", "lib/direct.txt": "d\n"})
    repo = make_repo(tmp_path / "many", files)
    for cone in (["a"], ["lib/sub"], ["a/x", "lib/sub/x"], ["a", "a/y"]):
        git(repo, "sparse-checkout", "set", "--cone", *cone)
        rules = Rules(None, cone_forbid(sorted(cone)))
        for line in git(repo, "ls-files", "-t").splitlines():
            tag, path = line.split(" ", 1)
            assert (tag == "H") == (rules.violation(path) is None), (cone, path, tag)


@pytest.mark.parametrize("args, message", [
    (["--sparse", "docs/guide.md"], "is a blob, not a directory"),
    (["--sparse", "nowhere"], "does not exist"),
    (["--sparse", "../up"], "relative to the repository's top"),
    (["--sparse", "src", "--pool"], "do not mix"),
])
def test_bad_sparse_input_is_one_line_exit_2_and_leaves_nothing(repo: Path, tmp_path: Path, args: list[str],
                                                               message: str) -> None:
    refs = git(repo, "for-each-ref")
    proc = ccm("exec", "--task", "bad", *args, "--", str(write_agent(tmp_path, COMMIT)), cwd=repo)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert git(repo, "for-each-ref") == refs and worktrees(repo).count("worktree ") == 1
    assert ccm("task", "show", "bad", cwd=repo).returncode == 7


# --- the command line ----------------------------------------------------------------------------


def test_pool_commands_refuse_bad_input(repo: Path, tmp_path: Path) -> None:
    not_repo = tmp_path / "plain"
    not_repo.mkdir()
    cases = [(["fill", "-n", "-1"], 2, "-1"), (["fill", "--repo", str(not_repo)], 5, "not in a git repository"),
             (["fill", "--base", "nope"], 5, "does not name a commit"), (["drain", "--repo", str(not_repo)], 5, "")]
    for args, code, text in cases:
        proc = ccm("pool", *args, cwd=repo)
        assert proc.returncode == code and text in proc.stderr, (args, proc.stderr)
    assert pool_cmd(repo, "status")["pools"] == []
    assert "no pool" in ccm("pool", "status", cwd=repo).stdout


def test_human_status_names_ready_and_dirty_entries(repo: Path, tmp_path: Path) -> None:
    pool_cmd(repo, "fill", "-n", "2")
    text = ccm("pool", "status", cwd=repo).stdout
    assert "2 ready of 2" in text and text.count("\n  p-") == 2
    killed = ccm("exec", "--task", "killed", "--", str(write_agent(tmp_path, COMMIT)), cwd=repo,
                 env={"CCM_GUARD_FAILPOINT": "pool-after-claim"})
    assert killed.returncode == -signal.SIGKILL
    text = ccm("pool", "status", cwd=repo).stdout
    assert "1 ready of 2, 1 dirty" in text and "interrupted while taking" in text
    (entry,) = ready(repo)
    Path(entry["path"], "stray.txt").write_text("x\n")
    (row,) = pool.entries(Registry(), None, ("ready",))
    assert "1 leftover(s) in its work tree: ?? stray.txt" in (pool.problem(row) or "")


def test_the_takes_of_runs_started_together_start_one_refiller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each take asks for a refill; while one refiller waits to start (holding the
    refill-pending lock it was handed), the others start none: it counts what is missing
    when it starts. Once it has started, the next take starts another."""
    common = tmp_path / "repo.git"
    monkeypatch.setattr(refiller, "config_of", lambda registry, repo: types.SimpleNamespace(refill=True))
    monkeypatch.setattr(pool_admin, "missing", lambda registry, config: 1)
    started: list[tuple[str, ...]] = []
    held: list[int] = []

    def child(call: str, *args: str, orphan: bool = False, keep: tuple[int, ...] = (), **later: object) -> None:
        held.extend(os.dup(fd) for fd in keep)  # the refiller goes on holding what it was handed
        started.append((call, *args))

    monkeypatch.setattr(refiller, "detached", child)
    for _ in range(4):  # a fork group's takes
        refiller.refill_soon(Registry(), common)
    assert len(started) == 1 and started[0][:2] == ("refill", str(common)) and len(held) == 1
    os.close(held.pop())  # the refiller starts: it gives the lock up
    refiller.refill_soon(Registry(), common)
    assert len(started) == 2
    os.close(held.pop())


def test_a_refiller_gives_the_pending_lock_up_before_it_counts_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A take after that point must start a refiller of its own: this one's count may
    already be made without it."""
    common = tmp_path / "repo.git"
    pending = refiller._pending(common)
    assert pending is not None and pending >= 0
    assert refiller._pending(common) is None  # held
    free_when_counting: list[bool] = []

    def counting(repo: Path, registry: Registry | None = None) -> None:
        again = refiller._pending(repo)
        free_when_counting.append(again is not None)
        if again is not None and again >= 0:
            os.close(again)

    monkeypatch.setattr(refiller, "refill_now", counting)
    refiller.refill([str(common), str(pending)])
    assert free_when_counting == [True]


def _filled(repo: Path) -> tuple[Registry, Any]:
    pool_cmd(repo, "fill", "-n", "1")
    registry = pool.open_registry(Registry())
    (entry,) = pool.entries(registry, None, ("ready",))
    return registry, entry


def test_a_take_trusts_the_proof_made_with_the_full_check_and_walks_nothing(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The status walk of a pooled tree runs when the entry is made or comes back; a take
    checks the directories' identities and has diff-files compare the tracked files."""
    from ccm_guard import git as gitapi
    from ccm_guard.pool import records

    registry, entry = _filled(repo)
    assert entry.proof and entry.dirs.is_file()
    listed = {line.split(" ", 3)[3] for line in entry.dirs.read_text().splitlines()}
    assert listed == {"", "src", "docs", "lib", "lib/sub", "lib/other"}
    monkeypatch.setattr(gitapi, "status_with_index", lambda *a: pytest.fail("the tree was walked"))
    assert records.problem(entry, trust_proof=True) is None


def test_a_proof_is_recorded_only_once_every_directory_is_a_tick_old(repo: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system whose times tick by the second, a name made in the tick of its
    directory's last change leaves the directory's times as they were: a directory changed
    within the tick before the proof's stamp (its file's mtime) proves nothing, so
    recording waits that out, a tick at a time, and a take does not trust one that did."""
    from ccm_guard.pool import records

    registry, entry = _filled(repo)
    lib = Path(entry.path) / "lib"
    (lib / "tmp").mkdir()
    (lib / "tmp").rmdir()  # lib changed just now, as a return's clean does
    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    records.record_proof(registry, entry)
    assert slept and all(0 < s <= 1.1 for s in slept)
    assert records._unchanged_since_proof(entry)
    changed = max(lib.stat().st_ctime_ns, lib.stat().st_mtime_ns)
    for after, trusted in ((500_000_000, False), (2_000_000_000, True)):  # the stamp half a tick, then two, after
        os.utime(entry.dirs, ns=(changed + after, changed + after))
        records.set_fields(registry, entry, proof=records.identity(entry.dirs))
        assert records._unchanged_since_proof(entry) is trusted


def test_a_directory_dated_in_the_future_leaves_the_entry_without_proof(repo: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent can date a directory decades ahead (and a reset keeps a tracked directory's
    times): the background recorder must not wait for it; the take walks instead."""
    from ccm_guard.pool import records

    registry, entry = _filled(repo)
    ahead = time.time_ns() + 30 * 365 * 86400 * 10**9
    os.utime(Path(entry.path) / "docs", ns=(ahead, ahead))
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail(f"slept {s} s"))
    records.record_proof(registry, entry)
    assert entry.proof == "" and not records._unchanged_since_proof(entry)


@pytest.mark.parametrize("tamper", ["untracked", "ignored", "empty-dir", "edited-same-size", "chmod", "proof-rewritten",
                                    "removed", "replaced-dir"])
def test_anything_changed_since_the_proof_is_found_by_the_walk(repo: Path, tamper: str) -> None:
    """Each change shows in a directory's identity or in diff-files; then the take walks the
    tree, which names it (an empty directory, or a directory made anew around the same
    file, is no leftover as git sees it, but the proof does not vouch for it either)."""
    from ccm_guard.pool import records

    registry, entry = _filled(repo)  # the repository ignores *.log
    root = Path(entry.path)
    walked: list[bool] = []
    real = records._unchanged_since_proof
    if tamper == "untracked":
        (root / "lib/sub/new.py").write_text("x\n")
    elif tamper == "ignored":
        (root / "lib/other/debug.log").write_text("x\n")
    elif tamper == "empty-dir":
        (root / "lib/sub/empty").mkdir()
    elif tamper == "edited-same-size":
        path = root / "lib/sub/deep.txt"
        st = path.stat()
        path.write_text("DEEP\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back: the ctime moved
    elif tamper == "chmod":
        (root / "docs/guide.md").chmod(0o755)
    elif tamper == "proof-rewritten":
        (root / "src/planted.py").write_text("x\n")
        lines = []
        for line in entry.dirs.read_text().splitlines():
            rel = line.split(" ", 3)[3]
            st = os.lstat(root / rel)
            lines.append(f"{st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns} {rel}")
        entry.dirs.write_text("\n".join(lines) + "\n")  # as it would be: its own identity is not
    elif tamper == "removed":
        (root / "docs/guide.md").unlink()
    elif tamper == "replaced-dir":
        os.rename(root / "lib/other", root / "lib/gone")
        (root / "lib/other").mkdir()
        os.rename(root / "lib/gone/x.txt", root / "lib/other/x.txt")
        os.rmdir(root / "lib/gone")
    walked.append(real(entry))
    found = records.problem(entry, trust_proof=True)
    assert walked == [False]
    if tamper in ("empty-dir", "replaced-dir"):  # the same files, as git sees them: pristine after the walk
        assert found is None
    else:
        assert found is not None and "leftover" in found
