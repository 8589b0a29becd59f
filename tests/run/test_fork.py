"""`exec --fork` / `--fork-cmd`: several agents on one task from one base, compared, and
`task pick` applying one and archiving the rest. Real git, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git

GOOD = "echo 'def f(): return 2' > src/app.py && git add -A && git commit -qm good"
GATE = "echo 'x' > .gitignore && git -c core.hooksPath=/dev/null add -A; echo y >> README.md"  # leaves work uncommitted
CHECK_FAILS = "echo 'def f(): return 3' > src/app.py && touch broken.flag && git add -A && git commit -qm other"
CHECK = "test ! -f broken.flag && echo ran > check.out"


def _fork(repo: Path, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    proc = ccm("exec", "--json", *args, cwd=repo, timeout=timeout)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _by_task(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["task"]: f for f in report["forks"]}


def test_three_forks_compared_and_the_good_one_picked(repo: Path) -> None:
    code, report, stderr = _fork(repo, "--task", "fx", "--check", CHECK,
                                 "--fork-cmd", GOOD, "--fork-cmd", GATE, "--fork-cmd", CHECK_FAILS)
    assert code == 0, report
    assert report["schema"] == 1 and report["best"] == "fx-1"
    forks = _by_task(report)
    good, gate, check = forks["fx-1"], forks["fx-2"], forks["fx-3"]
    assert good["outcome"] == "pass" and good["pickable"] and good["files"] == ["src/app.py"]
    assert good["check"]["ok"] and good["check"]["discarded"] == ["check.out"]  # written, reported, put back
    assert not (Path(git(repo, "worktree", "list", "--porcelain").split("worktree ")[2].split("\n")[0])
                / "check.out").exists()
    assert gate["outcome"] == "gates-failed" and not gate["pickable"] and gate["check"] is None
    assert "clean-tree" in gate["failed_gates"]
    assert check["outcome"] == "pass" and check["check"]["ok"] is False and not check["pickable"]
    assert report["overlaps"] == {"src/app.py": ["fx-1", "fx-3"]}
    assert "[fx-1] " in stderr or "[fx-2] " in stderr  # each fork's output, prefixed

    again = ccm("task", "compare", "fx", cwd=repo)
    assert again.returncode == 0 and "pick:    ccm-guard task pick fx-1" in again.stdout
    assert "src/app.py: fx-1, fx-3" in again.stdout
    between = ccm("task", "diff", "fx-1", "fx-3", cwd=repo)
    assert between.returncode == 0 and "-def f(): return 3" in between.stdout and "+def f(): return 2" in between.stdout

    refused = ccm("task", "pick", "fx-2", cwd=repo)  # failed its gates: refused, nothing discarded
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert {t["status"] for t in json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"]} == \
        {"COMMITTED", "ERRORED"}

    picked = ccm("task", "pick", "fx-1", "--json", cwd=repo)
    assert picked.returncode == 0, picked.stderr
    result = json.loads(picked.stdout)
    assert {d["task"] for d in result["discarded"]} == {"fx-2", "fx-3"} and result["left"] == []
    assert git(repo, "show", "main:src/app.py") == "def f(): return 2"
    statuses = {t["id"]: t["status"] for t in json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"]}
    assert statuses == {"fx-1": "APPLIED", "fx-2": "DISCARDED", "fx-3": "DISCARDED"}
    assert git(repo, "rev-parse", "--verify", "refs/ccm-guard/archive/fx-3")  # archived, restorable
    assert ccm("task", "restore", "fx-3", cwd=repo).returncode == 0


def test_fork_n_runs_one_command_n_times(repo: Path, tmp_path: Path) -> None:
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\necho \"$CCM_GUARD_TASK\" > who.txt\ngit add who.txt\ngit commit -qm who\n")
    agent.chmod(0o755)
    code, report, _ = _fork(repo, "--task", "n", "--fork", "3", "--jobs", "2", "--", str(agent))
    assert code == 0
    assert [f["task"] for f in report["forks"]] == ["n-1", "n-2", "n-3"]
    assert all(f["pickable"] for f in report["forks"])
    bases = {t["base"] for t in json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"]}
    assert len(bases) == 1
    assert report["overlaps"] == {"who.txt": ["n-1", "n-2", "n-3"]}


def test_two_fork_groups_at_once_on_one_repository(repo: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--json", "--task", name, "--fork-cmd",
                               f"echo {name}1 > {name}1.txt && git add -A && git commit -qm a", "--fork-cmd",
                               f"echo {name}2 > {name}2.txt && git add -A && git commit -qm b"],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("left", "right")]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert all(f["pickable"] for f in json.loads(out)["forks"])
    listed = json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"]
    assert sorted(t["id"] for t in listed) == ["left-1", "left-2", "right-1", "right-2"]
    assert [t["id"][:4] for t in listed] in (["left"] * 2 + ["righ"] * 2, ["righ"] * 2 + ["left"] * 2)  # together
    assert len({t["worktree"] for t in listed}) == 4


def _wait_for(repo: Path, wanted: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The registry's rows once the tasks have the statuses wanted (the agents run sandboxed:
    they cannot leave a marker outside their worktree)."""
    deadline = time.monotonic() + 60
    while True:
        rows = {t["id"]: t for t in json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"]}
        if all(rows.get(task, {}).get("status") == status for task, status in wanted.items()):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.1)


def test_a_kill_during_a_fork_run_leaves_every_fork_explained(repo: Path) -> None:
    # It prints after the fork runner is gone: its ccm-guard must not die of the broken pipe.
    slow = "sleep 3; seq 1 3000; seq 1 3000 >&2; echo w > w.txt && git add -A && git commit -qm w"
    parent = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--task", "k", "--fork-cmd", slow,
                               "--fork-cmd", slow], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = _wait_for(repo, {"k-1": "ACTIVE", "k-2": "ACTIVE"})
    os.kill(parent.pid, signal.SIGKILL)  # the fork runner dies; and one fork's own ccm-guard with it
    os.kill(rows["k-2"]["pid"], signal.SIGKILL)
    parent.wait()
    _wait_for(repo, {"k-1": "COMMITTED"})  # a fork whose ccm-guard lived finished on its own
    shown = ccm("task", "show", "k-2", cwd=repo)
    assert shown.returncode == 0 and "ACTIVE" in shown.stdout and "gone" in shown.stdout  # explained
    compared = ccm("task", "compare", "k", cwd=repo)
    assert compared.returncode == 0 and "k-2" in compared.stdout
    gc = ccm("gc", "--yes", cwd=repo)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert ccm("task", "show", "k-2", cwd=repo).returncode == 0


def test_gc_leaves_a_fork_group_alone_while_a_fork_runs(repo: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--task", "g", "--fork-cmd", "true",
                               "--fork-cmd", "sleep 5"], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(repo, {"g-1": "ERRORED", "g-2": "ACTIVE"})  # g-1 made no commit: finished, failed
    plan = json.loads(ccm("gc", "--dry-run", "--older-than", "0s", "--json", cwd=repo).stdout)
    parent.wait(timeout=60)
    assert [a for a in plan["actions"] if a.get("task", "").startswith("g-")] == []
    later = json.loads(ccm("gc", "--dry-run", "--older-than", "0s", "--json", cwd=repo).stdout)
    assert {a["task"] for a in later["actions"] if a.get("task")} >= {"g-1", "g-2"}


def test_fork_usage_errors_leave_nothing(repo: Path) -> None:
    for args, expected in ((["--fork", "1", "--", "true"], "--fork"),
                           (["--fork", "2", "--apply", "--", "true"], "task pick"),
                           (["--fork-cmd", "true", "--", "true"], "not both"),
                           (["--fork", "3", "--fork-cmd", "a", "--fork-cmd", "b"], "drop --fork"),
                           (["--fork", "2"], "no agent command")):
        proc = ccm("exec", *args, cwd=repo)
        assert proc.returncode == 2 and expected in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"] == []


def test_every_exec_option_reaches_the_forks() -> None:
    """A new ExecOptions field must be carried to each fork's exec, or named here with why not."""
    import dataclasses

    from ccm_guard.agent.options import ExecOptions
    from ccm_guard.cli.exec import exec_cmd
    from ccm_guard.run.fork import child_args

    opts = ExecOptions(command=["agent"], start=Path("/r"), task="t", base="abc", timeout=11.0, grace=2.5,
                       role="docs", policy=Path("/p.toml"), read_only=True, require_commit=False, on_fail="discard",
                       keep_env=("SSH_AUTH_SOCK",), sandbox="none", no_network=True, allow_ports=(8443,),
                       agent="codex", snapshot_every=3, link_dirs=True, pool=False, sparse=("src",),
                       setup=("npm ci",), setup_timeout=33.0, check="pytest -q", check_timeout=44.0, group="g")
    not_carried = {"command": "after --", "start": "--repo", "task": "each fork's own id", "group": "the group's",
                   "terminal": "forks run without a terminal", "json_stdout": "always --json",
                   "apply": "refused with --fork", "cleanup": "refused with --fork"}
    params = exec_cmd.make_context("exec", [*child_args(opts, "t-1"), "--", "agent"]).params
    as_parsed = {"keep_env": params["keep_env"], "policy": params["policy_file"], "sandbox": params["sandbox_mode"],
                 "pool": params["use_pool"], "base": params["base"]}
    for field in dataclasses.fields(ExecOptions):
        if field.name in not_carried:
            continue
        value = getattr(opts, field.name)
        parsed = as_parsed.get(field.name, params.get(field.name))
        assert parsed == value or (field.name == "policy" and parsed == value.resolve()), (field.name, parsed, value)


def test_forks_that_cannot_start_say_why_once(repo: Path) -> None:
    proc = ccm("exec", "--fork", "2", "--", "/nonexistent/agent", cwd=repo)
    assert proc.returncode == 127
    assert proc.stderr.strip().splitlines()[-1] == ("ccm-guard: error: no fork started: agent command "
                                                    "'/nonexistent/agent' not found: check the path")
    assert json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"] == []


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_fork_run_starts_no_more_forks_and_shows_what_ran(repo: Path, how: str) -> None:
    parent = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--task", "cc", "--jobs", "1",
                               "--fork", "3", "--", "sh", "-c", "sleep 2; echo a > a.txt; git add a.txt; git commit -qm a"],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True,
                              # as a background job is started: SIGINT ignored from the start
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _wait_for(repo, {"cc-1": "ACTIVE"})
    if how == "ctrl-c":
        os.killpg(parent.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    else:
        parent.send_signal(signal.SIGTERM)  # a CI runner cancelling the job: the fork run only
    out, _ = parent.communicate(timeout=60)
    assert parent.returncode == 130
    assert "cc-1" in out and "cc-2" not in out
    ids = {t["id"] for t in json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"]}
    assert ids == {"cc-1"}


def test_a_relative_agent_path_is_taken_from_where_exec_runs(repo: Path, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "agent.sh").write_text("#!/bin/sh\necho r > r.txt && git add r.txt && git commit -qm r\n")
    (agents / "agent.sh").chmod(0o755)
    proc = ccm("exec", "--json", "--repo", str(repo), "--fork", "2", "--", "./agent.sh", cwd=agents)
    assert proc.returncode == 0, proc.stderr
    assert all(f["pickable"] for f in json.loads(proc.stdout)["forks"])


def test_fork_output_is_relayed_by_lines_and_a_long_line_is_not_held_forever() -> None:
    import io

    from ccm_guard.run.fork import LONG_LINE, ForkRun, _Child

    child = _Child(ForkRun("t-1"), pid=0, out_fd=-1, err_fd=-2)
    shown = io.StringIO()
    child._echo(shown, b"one\ntw")
    child._echo(shown, b"o\nthr")
    assert shown.getvalue() == "[t-1] one\n[t-1] two\n"
    child._echo(shown, b"x" * (LONG_LINE + 1))  # no end in sight: shown, not kept growing
    assert shown.getvalue().endswith("x\n") and not child.partial
    child._echo(shown, b"tail", flush=True)
    assert shown.getvalue().endswith("[t-1] tail\n")
