"""The runner: leftovers, timeouts, signals, the pseudo-terminal."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, alive, git, run_exec, spawn_exec, write_agent

from ccm_guard.state import home

COMMIT = "echo x > work.txt; git add work.txt; git commit -q -m work"


def test_background_writer_is_killed_and_reported(repo: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    agent = write_agent(tmp_path, f"""{COMMIT}
(while true; do date >> "$HOME/bg.log"; sleep 0.05; done) &
echo $! > {pidfile}""")
    res = run_exec(repo, agent, "--sandbox", "none")
    pid = int(pidfile.read_text())
    assert res.code == 1
    assert res.status("processes") == "fail"
    assert any(f"pid {pid}" in p for f in res.gate("processes")["findings"] for p in f["paths"])
    assert not alive(pid)


def test_setsid_double_fork_with_cleared_environment_is_still_found(repo: Path, tmp_path: Path) -> None:
    """Outside the process group, without the marker variable, with its cwd elsewhere."""
    pidfile = tmp_path / "daemon.pid"
    agent = write_agent(tmp_path, f"""{COMMIT}
setsid -f sh -c 'echo $$ > {pidfile}; cd /; exec env -i sleep 300' < /dev/null > /dev/null 2>&1
while [ ! -s {pidfile} ]; do sleep 0.02; done""")
    res = run_exec(repo, agent, "--sandbox", "none")
    pid = int(pidfile.read_text())
    assert res.status("processes") == "fail"
    assert not alive(pid)


def test_process_that_edits_after_the_agent_exits_is_stopped_before_the_gates(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
nohup sh -c 'sleep 0.5; echo late > late.txt' > /dev/null 2>&1 &""")
    res = run_exec(repo, agent, "--sandbox", "none")
    time.sleep(1)
    assert res.status("processes") == "fail"
    assert not (Path(res.verdict["worktree"]) / "late.txt").exists()


def test_timeout_stops_the_whole_group(repo: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    agent = write_agent(tmp_path, f"sleep 300 & echo $! > {pidfile}; wait")
    start = time.monotonic()
    res = run_exec(repo, agent, "--sandbox", "none", "--timeout", "1", "--grace", "0.5", "--no-require-commit")
    assert time.monotonic() - start < 20
    assert res.code == 4
    assert res.verdict["agent"]["timed_out"] is True
    assert res.verdict["outcome"] == "agent-timed-out"
    assert not alive(int(pidfile.read_text()))


def test_agent_ignoring_term_is_killed_after_the_grace_period(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "trap '' TERM; while true; do sleep 0.1; done")
    res = run_exec(repo, agent, "--sandbox", "none", "--timeout", "0.5", "--grace", "0.5", "--no-require-commit")
    assert res.code == 4
    assert res.verdict["agent"]["signal"] == signal.SIGKILL


def test_sigint_to_ccm_guard_stops_the_agent_and_still_judges(repo: Path, tmp_path: Path) -> None:
    started = tmp_path / "started"
    agent = write_agent(tmp_path, f"touch {started}; sleep 300")
    proc = spawn_exec(repo, "--json", "--sandbox", "none", "--grace", "0.5", "--", str(agent))
    while not started.exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    verdict = json.loads(out)
    assert verdict["agent"]["interrupted"] is True
    assert Path(verdict["worktree"]).exists()  # kept for inspection


def test_terminal_agent_gets_a_pty_with_the_callers_window_size(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """tty; stty size; printf 'colour: \\033[31mred\\033[0m\\n'""")
    pid, master = pty.fork()
    if pid == 0:  # the child: ccm-guard on a terminal
        os.chdir(repo)
        os.execvpe(sys.executable, [sys.executable, "-m", "ccm_guard", "exec", "--no-require-commit", "--",
                                    str(agent)], {**os.environ, "PYTHONPATH": str(ROOT)})
    import fcntl
    import struct
    import termios

    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 37, 101, 0, 0))
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert "/dev/pts/" in out
    assert "37 101" in out
    assert "\x1b[31mred" in out  # colours pass through untouched
    assert "(terminal)" in out
    logs = list(Path(os.environ["CCM_GUARD_HOME"], "logs").glob("*/*/agent.pty.log"))
    assert logs and "37 101" in logs[0].read_text()


def test_stdout_and_stderr_are_passed_through_and_logged(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo to-out; echo to-err >&2")
    proc = subprocess.run([sys.executable, "-m", "ccm_guard", "exec", "--no-require-commit", "--", str(agent)],
                          cwd=repo, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout.startswith("to-out\n")
    assert "to-err" in proc.stderr
    log_dir = Path(os.environ["CCM_GUARD_HOME"], "logs")
    assert [p.read_text() for p in log_dir.glob("*/*/agent.stdout.log")] == ["to-out\n"]
    assert [p.read_text() for p in log_dir.glob("*/*/agent.stderr.log")] == ["to-err\n"]
    assert git(repo, "status", "--porcelain") == ""


def _task_worktree(repo: Path, task: str) -> Path:
    from ccm_guard import git as gitmod

    return Path(os.environ["CCM_GUARD_HOME"], "worktrees", home.repo_key(gitmod.discover(repo)), task)


def test_the_persons_own_shell_in_the_worktree_is_left_alone(repo: Path, tmp_path: Path) -> None:
    """A process older than the run that cd's into the worktree is not the agent's."""
    wt = _task_worktree(repo, "visited")
    person = subprocess.Popen(["sh", "-c", f"while [ ! -d {wt}/src ]; do sleep 0.02; done; cd {wt}; exec sleep 300"],
                              env={"PATH": os.environ["PATH"]})
    try:
        time.sleep(1.1)  # clearly older than the run, whose clock counts in 1/100 s ticks
        agent = write_agent(tmp_path, f"while [ \"$(readlink /proc/{person.pid}/cwd)\" != {wt} ]; do sleep 0.02; done\n{COMMIT}")
        res = run_exec(repo, agent, "--sandbox", "none", "--task", "visited")
        assert res.status("processes") == "pass"
        assert person.poll() is None
    finally:
        person.kill()
        person.wait()


def test_a_process_outside_the_tree_started_during_the_run_in_the_worktree_is_caught(repo: Path, tmp_path: Path) -> None:
    """As if the agent had a service start it: not our descendant, no marker, cwd in the worktree."""
    wt = _task_worktree(repo, "escape")
    started, go = tmp_path / "started", tmp_path / "go"
    agent = write_agent(tmp_path, f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done\n{COMMIT}")
    run = spawn_exec(repo, "--json", "--sandbox", "none", "--task", "escape", "--", str(agent))
    while not started.exists():
        time.sleep(0.02)
    stray = subprocess.Popen(["sleep", "300"], cwd=wt, env={}, start_new_session=True)
    go.touch()
    out, err = run.communicate(timeout=60)
    verdict = json.loads(out)
    stray.wait(timeout=10)  # killed by ccm-guard
    gate = next(g for g in verdict["gates"] if g["name"] == "processes")
    assert gate["status"] == "fail"
    assert any(f"pid {stray.pid}" in p for f in gate["findings"] for p in f["paths"])
