"""SIGKILL at random moments of each lifecycle command, then the invariants.

Named failpoints (test_faults.py) hit the moments we thought of; this campaign hits the
ones we did not. Each round starts a real ccm-guard command, kills it after a random
delay drawn from a seeded generator (the seed is printed; CCM_GUARD_KILL_SEED=N runs the
same delays again), and checks what must hold whenever ccm-guard dies:

- everything the agent committed, and every file it left uncommitted, is still reachable:
  from a ref (its branch, an archive, a snapshot) or in its worktree;
- the person's repository is sound (`git fsck`) and their checkout clean once `task show`
  has looked at the task (it finishes interrupted records);
- `task show` explains the task, `gc --yes` runs clean, and running the same command
  again (or a new exec) succeeds.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import ccm, git, make_repo, run_exec, write_agent

ROUNDS = 3  # per command; each round is one random kill
SEED = int(os.environ.get("CCM_GUARD_KILL_SEED") or random.SystemRandom().randrange(1 << 30))

# The agent commits, leaves a file uncommitted, and says (outside its worktree) when each is done.
AGENT = """echo work > work.txt; git add work.txt; git commit -q -m "agent work"; touch "{marks}/committed"
echo wip > wip.txt; touch "{marks}/wip"
exit 1
"""


@pytest.fixture(scope="module")
def rng() -> random.Random:
    print(f"kill campaign seed: {SEED} (CCM_GUARD_KILL_SEED={SEED} repeats it)")
    return random.Random(SEED)


def _kill_after(delay: float, *args: str, cwd: Path) -> None:
    """SIGKILL ccm-guard after `delay`, then wait for the git it was running to finish: a
    killed parent does not stop its child (a `git worktree add` goes on, and its admin dir
    holds a placeholder HEAD until it is done), and what is checked is the state left."""
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(delay)
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # any process of its group (its git) still there?
        except ProcessLookupError:
            return
        time.sleep(0.02)


def _reachable(repo: Path, name: str, text: str) -> bool:
    """Whether a file `name` holding `text` is in some commit of any ref, or in a task worktree."""
    for sha in git(repo, "log", "--all", "--format=%H", "--", name).split():
        if git(repo, "show", f"{sha}:{name}", check=False) == text:
            return True
    home = Path(os.environ["CCM_GUARD_HOME"])
    return any(p.read_text().strip() == text for p in home.glob(f"worktrees/*/*/{name}"))


def _invariants(repo: Path, task: str, marks: Path, context: str) -> None:
    if (marks / "committed").exists():
        assert _reachable(repo, "work.txt", "work"), f"committed work lost ({context})"
    if (marks / "wip").exists():
        assert _reachable(repo, "wip.txt", "wip"), f"uncommitted work lost ({context})"
    shown = ccm("task", "show", task, "--json", cwd=repo)
    assert shown.returncode in (0, 7), (context, shown.stderr)  # 7: no such task (killed before the row)
    if shown.returncode == 0:
        assert json.loads(shown.stdout)["status"], context
    assert subprocess.run(["git", "fsck", "--no-dangling", "--no-progress"], cwd=repo,
                          capture_output=True).returncode == 0, context
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == "", f"checkout left dirty ({context})"
    gc = ccm("gc", "--yes", "--older-than", "0s", cwd=repo)
    assert gc.returncode == 0, (context, gc.stdout, gc.stderr)
    if (marks / "committed").exists():
        assert _reachable(repo, "work.txt", "work"), f"committed work lost by gc ({context})"
    if (marks / "wip").exists():
        assert _reachable(repo, "wip.txt", "wip"), f"uncommitted work lost by gc ({context})"


def _finished_task(repo: Path, tmp_path: Path, marks: Path, task: str, *options: str) -> None:
    res = run_exec(repo, write_agent(tmp_path, AGENT.format(marks=marks)), "--sandbox", "none", "--task", task,
                   *options)
    assert (marks / "wip").exists(), res.stderr


Setup = Callable[[Path, Path, Path], list[str]]


def _exec(repo: Path, tmp_path: Path, marks: Path) -> list[str]:
    agent = write_agent(tmp_path, AGENT.format(marks=marks))
    return ["exec", "--sandbox", "none", "--task", "t1", "--json", "--", str(agent)]


def _discard(repo: Path, tmp_path: Path, marks: Path) -> list[str]:
    _finished_task(repo, tmp_path, marks, "t1")
    return ["task", "discard", "t1"]


def _restore(repo: Path, tmp_path: Path, marks: Path) -> list[str]:
    _finished_task(repo, tmp_path, marks, "t1")
    assert ccm("task", "discard", "t1", cwd=repo).returncode == 0
    return ["task", "restore", "t1"]


def _apply(repo: Path, tmp_path: Path, marks: Path) -> list[str]:
    _finished_task(repo, tmp_path, marks, "t1")
    worktree = next(Path(os.environ["CCM_GUARD_HOME"]).glob("worktrees/*/t1"))
    git(worktree, "add", "wip.txt")
    git(worktree, "commit", "-q", "-m", "finished by hand")
    assert ccm("audit", "--accept", "t1", cwd=repo).returncode == 0
    return ["task", "apply", "t1"]


def _rollback(repo: Path, tmp_path: Path, marks: Path) -> list[str]:
    command = _apply(repo, tmp_path, marks)
    assert ccm(*command, cwd=repo).returncode == 0
    return ["task", "rollback", "t1"]


SCENARIOS: dict[str, Setup] = {"exec": _exec, "discard": _discard, "restore": _restore, "apply": _apply,
                               "rollback": _rollback}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_kill_at_a_random_moment_loses_nothing_and_is_repaired(tmp_path: Path, rng: random.Random,
                                                                 monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    for round_ in range(ROUNDS):
        where = tmp_path / f"round{round_}"
        monkeypatch.setenv("CCM_GUARD_HOME", str(where / "state"))  # each round its own state and repository
        repo = make_repo(where / "repo")
        marks = where / "marks"
        marks.mkdir()
        command = SCENARIOS[scenario](repo, where, marks)
        delay = rng.uniform(0.0, 0.8)
        context = f"{scenario}, round {round_}, killed after {delay:.3f} s, seed {SEED}"
        _kill_after(delay, *command, cwd=repo)
        _invariants(repo, "t1", marks, context)
        # The same command again finishes the job, or says it is done already.
        again = ccm(*command, cwd=repo)
        # (exec again with the same id: 5, the id is taken by the killed run's task)
        assert again.returncode in (0, 1, 5, 7, 8), (context, again.stderr)
        assert "Traceback" not in again.stderr, (context, again.stderr)
        _invariants(repo, "t1", marks, context + ", after running it again")
        fresh = write_agent(where, 'echo again > again.txt; git add again.txt; git commit -q -m again\n',
                            name="again.sh")
        assert run_exec(repo, fresh, "--sandbox", "none", "--task", "after").code == 0, context
