"""Many ccm-guard processes on one repository at once: ten runs, then ten applies.

Processes, not threads: each is a real `python -m ccm_guard`. Every task must get its
own worktree and branch, every apply must land (or report a conflict), no ref update may
be lost, the registry must agree with the repository, and no lock may be left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git, make_repo, spawn_exec, write_agent

N = 10


def _run_all(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[tuple[int, str, str]]:
    return [(p.wait(timeout=timeout), *p.communicate()) for p in procs]


def _start_tasks(repo: Path, tmp_path: Path) -> list[dict[str, Any]]:
    agent = write_agent(tmp_path, 'echo "$CCM_GUARD_TASK" > "out-$CCM_GUARD_TASK.txt"\n'
                        'rgit add -A\nrgit commit -q -m "work of $CCM_GUARD_TASK"\n')
    procs = [spawn_exec(repo, "--json", "--task", f"t{i}", "--", str(agent)) for i in range(N)]
    verdicts = []
    for code, out, err in _run_all(procs):
        assert code == 0, err + out
        verdicts.append(json.loads(out))
    return verdicts


def _apply_all(repo: Path, *extra: str) -> list[dict[str, Any]]:
    procs = [subprocess.Popen([sys.executable, "-m", "ccm_guard", "task", "apply", f"t{i}", "--json", *extra],
                              cwd=repo, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL) for i in range(N)]
    results = []
    for code, out, err in _run_all(procs):
        assert code == 0, err
        results.append(json.loads(out)["applied"])
    return results


def _no_locks_left(repo: Path) -> None:
    common = repo / ".git"
    assert not list(common.rglob("*.lock")), list(common.rglob("*.lock"))


@pytest.mark.parametrize("into", ["checked-out", "other-branch"])
def test_ten_runs_then_ten_applies_at_once(tmp_path: Path, into: str) -> None:
    repo = make_repo(tmp_path / "repo")
    if into == "other-branch":
        git(repo, "branch", "release")
    verdicts = _start_tasks(repo, tmp_path)
    assert len({v["worktree"] for v in verdicts}) == N and len({v["branch"] for v in verdicts}) == N
    for v in verdicts:
        assert git(repo, "rev-parse", v["branch"]) == v["head"]

    target = "main" if into == "checked-out" else "release"
    start = git(repo, "rev-parse", target)
    applied = _apply_all(repo, "--into", target)
    tip = git(repo, "rev-parse", target)
    # No update was lost: the target's first-parent chain is exactly the ten applies.
    chain = git(repo, "rev-list", "--first-parent", f"{start}..{tip}").split()
    assert sorted(chain) == sorted(a["new"] for a in applied) and len(chain) == N
    for i in range(N):
        assert git(repo, "show", f"{target}:out-t{i}.txt") == f"t{i}"
    tasks = json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"]
    assert sorted(t["status"] for t in tasks) == ["APPLIED"] * N
    _no_locks_left(repo)
    if into == "checked-out":
        assert git(repo, "status", "--porcelain") == ""  # the checkout followed every apply
        assert all((repo / f"out-t{i}.txt").exists() for i in range(N))
    else:
        assert not list(repo.glob("out-t*.txt"))


def test_concurrent_applies_to_a_remote_retry_until_each_lands(tmp_path: Path) -> None:
    seed = make_repo(tmp_path / "seed")
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", str(origin), str(repo))
    _start_tasks(repo, tmp_path)
    start = git(origin, "rev-parse", "main")
    applied = _apply_all(repo, "--into", "origin/main", "--retries", "50")
    chain = git(origin, "rev-list", "--first-parent", f"{start}..main").split()
    assert sorted(chain) == sorted(a["new"] for a in applied)
    assert sum(a["attempts"] for a in applied) >= N
    for i in range(N):
        assert git(origin, "show", f"main:out-t{i}.txt") == f"t{i}"


@pytest.mark.parametrize("sandbox", ["none", "auto"])
@pytest.mark.parametrize("into", ["main", "release"])
def test_an_apply_during_another_run_is_not_blamed_on_that_run_s_agent(tmp_path: Path, into: str,
                                                                        sandbox: str) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "release")
    first = write_agent(tmp_path, 'echo one > one.txt\nrgit add one.txt\nrgit commit -q -m one\n', name="one.sh")
    assert ccm("exec", "--sandbox", "none", "--task", "first", "--json", "--", str(first), cwd=repo).returncode == 0
    gate = tmp_path / "applied"
    slow = write_agent(tmp_path, f'while [ ! -e {gate} ]; do sleep 0.1; done\n'
                       'echo two > two.txt\nrgit add two.txt\nrgit commit -q -m two\n', name="slow.sh")
    running = spawn_exec(repo, "--sandbox", sandbox, "--json", "--task", "second", "--timeout", "60", "--", str(slow))
    for _ in range(100):  # wait until the second agent is running
        if json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"][-1]["status"] == "ACTIVE":
            break
        time.sleep(0.1)
    applied = ccm("task", "apply", "first", "--into", into, cwd=repo)
    assert applied.returncode == 0, applied.stderr
    gate.write_text("")
    code, out, err = running.wait(timeout=120), *running.communicate()
    verdict = json.loads(out)
    refs = next(g for g in verdict["gates"] if g["name"] == "refs-untouched")
    assert code == 0, json.dumps(verdict["gates"], indent=1) + err
    if verdict["sandbox"].startswith("none"):  # the agent could have written the record: said, not failed
        assert refs["status"] != "fail" and "unverified" in refs["findings"][0]["reason"]
    else:
        assert refs["status"] == "pass", json.dumps(refs, indent=1)
