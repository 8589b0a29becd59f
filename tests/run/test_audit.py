"""`ccm-guard audit`: the gates again on a finished worktree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import ccm, git, run_exec, spawn_exec, write_agent

from ccm_guard.errors import ExitCode

COMMIT = "echo x > work.txt; git add work.txt; git commit -q -m work"


def audit(*args: str, cwd: Path) -> tuple[int, dict[str, Any]]:
    proc = ccm("audit", "--json", *args, cwd=cwd)
    return proc.returncode, json.loads(proc.stdout)


def statuses(verdict: dict[str, Any]) -> dict[str, str]:
    return {g["name"]: g["status"] for g in verdict["gates"]}


def test_audit_of_a_task_compares_against_the_recorded_snapshot(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, COMMIT), "--task", "aud")
    assert res.code == 0
    code, verdict = audit("aud", cwd=repo)
    assert code == 0 and statuses(verdict)["git-metadata"] == "pass"

    # Afterwards something plants a hook and leaves a file in the worktree.
    hooks = repo / ".git/hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "pre-push").write_text("#!/bin/sh\n")
    (Path(res.verdict["worktree"]) / "later.txt").write_text("x")
    code, verdict = audit("aud", cwd=repo)
    assert code == 1
    assert statuses(verdict)["git-metadata"] == "fail"
    assert statuses(verdict)["clean-tree"] == "fail"

    # The same task found from a path inside its worktree.
    code, by_path = audit(cwd=Path(res.verdict["worktree"]))
    assert by_path["task"] == "aud" and code == 1


def test_audit_of_a_foreign_worktree_uses_the_merge_base(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(other))
    code, verdict = audit(str(other), "--base", "main", cwd=repo)
    assert code == 1 and statuses(verdict) == {"clean-tree": "pass", "new-commit": "fail"}

    git(other, "commit", "-q", "--allow-empty", "-m", "work")
    (other / "stray.txt").write_text("x")
    code, verdict = audit(str(other), "--base", "main", cwd=repo)
    assert statuses(verdict) == {"clean-tree": "fail", "new-commit": "pass"}
    assert verdict["base"] == git(repo, "rev-parse", "main")


def test_audit_refuses_to_run_git_where_config_would_run_code(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    git(repo, "config", "filter.evil.clean", f"sh -c 'touch {marker}; cat'")
    (repo / ".gitattributes").write_text("* filter=evil\n")
    (repo / "README.md").write_text("changed\n")
    code, verdict = audit(str(repo), "--base", "main", cwd=repo)
    assert code == 1
    assert statuses(verdict)["clean-tree"] == "skipped"
    assert "filter.evil.clean" in verdict["gates"][-1]["findings"][0]["reason"]
    assert not marker.exists()


def test_audit_of_an_unknown_task_or_path(tmp_path: Path) -> None:
    proc = ccm("audit", "no-such-task", cwd=tmp_path)
    assert proc.returncode == 7  # as `task show` of an unknown task
    assert "no task 'no-such-task'" in proc.stderr
    outside = ccm("audit", str(tmp_path), cwd=tmp_path)  # a directory that is in no repository
    assert outside.returncode == 5 and "not in a git repository" in outside.stderr


def test_a_task_whose_ccm_guard_was_killed_is_explained_and_auditable(repo: Path, tmp_path: Path) -> None:
    import os
    import signal
    import time

    started = tmp_path / "started"
    agent = write_agent(tmp_path, f"{COMMIT}; echo $$ > {started}; exec sleep 300")
    run = spawn_exec(repo, "--sandbox", "none", "--task", "killed", "--", str(agent))
    while not started.exists() or not started.read_text().strip():
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
    run.wait()
    try:
        shown = ccm("task", "show", "killed", cwd=repo).stdout
        assert "ACTIVE" in shown and "is gone" in shown
        code, verdict = audit("killed", cwd=repo)
        assert statuses(verdict)["new-commit"] == "pass"
        assert verdict["head"] == git(repo, "rev-parse", "ccm/killed")
    finally:
        os.kill(int(started.read_text()), signal.SIGKILL)  # the agent outlived its runner


def test_an_errored_task_finished_by_hand_is_accepted_by_a_passing_audit(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, "echo half > half.txt\nexit 1\n"), "--task", "t1")
    assert res.code != 0
    worktree = Path(res.verdict["worktree"])
    git(worktree, "add", "half.txt")
    git(worktree, "commit", "-q", "-m", "finished by hand")
    refused = ccm("task", "apply", "t1", cwd=repo)
    assert refused.returncode != 0 and "audit --accept t1" in refused.stderr
    accepted = ccm("audit", "--accept", "t1", "--json", cwd=repo)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert any("recorded as COMMITTED" in n for n in json.loads(accepted.stdout)["notes"])
    shown = json.loads(ccm("task", "show", "t1", "--json", cwd=repo).stdout)
    assert shown["status"] == "COMMITTED" and shown["options"]["accepted"]["was"] == "ERRORED"
    assert ccm("task", "apply", "t1", cwd=repo).returncode == 0
    assert (repo / "half.txt").read_text() == "half\n"


def test_a_failing_audit_accepts_nothing(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, "echo junk > junk.txt\nexit 1\n"), "--task", "t1")
    proc = ccm("audit", "--accept", "t1", "--json", cwd=repo)
    assert proc.returncode == ExitCode.GATES_FAILED
    assert any("not accepted" in n for n in json.loads(proc.stdout)["notes"])
    assert res.code != 0
    assert json.loads(ccm("task", "show", "t1", "--json", cwd=repo).stdout)["status"] == "ERRORED"


def test_a_restored_task_passes_its_audit(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, 'echo w > w.txt; git add w.txt; git commit -q -m w\n'), "--task", "t1")
    assert res.code == 0
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    assert ccm("task", "restore", "t1", cwd=repo).returncode == 0
    proc = ccm("audit", "t1", "--json", cwd=repo)
    verdict = json.loads(proc.stdout)
    assert proc.returncode == 0, [g for g in verdict["gates"] if g["status"] != "pass"]


def test_a_baseline_written_by_an_older_ccm_guard_is_judged_by_what_it_recorded(repo: Path, tmp_path: Path) -> None:
    """Baselines of tasks run by an older version record neither lock files nor the guard
    hooks of other tasks: what exists of those now is not news to them."""
    import hashlib

    from ccm_guard.state.registry import Registry

    first = run_exec(repo, write_agent(tmp_path, COMMIT, "a.sh"), "--task", "older-a")
    second = run_exec(repo, write_agent(tmp_path, COMMIT, "b.sh"), "--task", "older-b")
    assert first.code == 0 and second.code == 0
    registry = Registry()
    try:
        task = registry.get("older-b")
        assert task.baseline is not None
        path = Path(task.baseline)
        data = json.loads(path.read_text())
        snap = data["snapshot"]
        del snap["locks"], snap["format"]  # as a baseline of before both existed
        others = [k for k in snap["files"] if "/hooks/" in k and "/worktrees/" in k and "older-b" not in k]
        assert others, "the test needs another task's hooks in the baseline"
        for key in others:
            del snap["files"][key]
        path.write_text(json.dumps(data))
        registry.set_option("older-b", "baseline_sha256", hashlib.sha256(path.read_bytes()).hexdigest())
    finally:
        registry.close()
    (repo / ".git" / "packed-refs.lock").write_text("")  # stale before the run, for all the older baseline knows
    try:
        code, verdict = audit("older-b", cwd=repo)
    finally:
        (repo / ".git" / "packed-refs.lock").unlink()
    assert statuses(verdict)["git-metadata"] == "pass", verdict
    assert code == 0
