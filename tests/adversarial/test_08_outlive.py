"""Class 8: outliving the run.

tests/agent/test_processes.py covers a background writer, a `setsid` double fork with a cleared
environment, a `nohup` child that edits after the agent exits, a timeout and TERM ignored.
ccm-guard is a child subreaper: every orphan of the agent becomes its child, so these all
end before the gates look. What is not its descendant (a service that was already running)
is the stated limitation, shown here with a stand-in service.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from adv import COMMIT, SANDBOXES
from conftest import alive, git, run_exec, write_agent


def test_a_process_that_waits_for_the_gates_then_moves_main_is_killed_first(repo: Path, tmp_path: Path) -> None:
    pidfile, main = tmp_path / "waiter.pid", git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
agent=$$
setsid -f env -i PATH=/usr/bin:/bin sh -c 'cd /; echo $$ > {pidfile}
  while kill -0 '$agent' 2>/dev/null; do sleep 0.05; done   # the agent has exited: the gates are next
  sleep 0.5; git -C {repo} -c core.hooksPath=/dev/null update-ref refs/heads/main refs/heads/ccm/late' \\
  < /dev/null > /dev/null 2>&1
while [ ! -s {pidfile} ]; do sleep 0.02; done""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "late")
    time.sleep(1.5)  # longer than the waiter would have waited
    assert git(repo, "rev-parse", "main") == main
    assert not alive(int(pidfile.read_text()), "sh")
    assert res.code == 1 and res.status("processes") == "fail"


def test_a_renamed_process_that_ignores_term_is_killed_and_named(repo: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "stubborn.pid"
    agent = write_agent(tmp_path, f"""{COMMIT}
setsid -f bash -c 'trap "" TERM HUP INT; echo $$ > {pidfile}; exec -a "[kworker/0:1]" sleep 30' < /dev/null > /dev/null 2>&1
while [ ! -s {pidfile} ]; do sleep 0.02; done""")
    res = run_exec(repo, agent, "--sandbox", "none")
    pid = int(pidfile.read_text())
    assert not alive(pid, "kworker")
    assert res.code == 1 and any(p.startswith(f"pid {pid}:") for f in res.gate("processes")["findings"] for p in f["paths"])


def test_a_respawning_process_family_is_all_gone(repo: Path, tmp_path: Path) -> None:
    """Each member restarts the other when it dies: TERM alone would never win."""
    pids = tmp_path / "pids"
    agent = write_agent(tmp_path, f"""{COMMIT}
end=$(($(date +%s) + 8))  # one deadline for the whole family: bounded even if ccm-guard failed
cat > "$TMPDIR/twin.sh" <<EOS
end=$end
EOS
cat >> "$TMPDIR/twin.sh" <<'EOS'
echo $$ >> {pids}
trap '' TERM
while [ "$(date +%s)" -lt "$end" ]; do
  if [ -z "$peer" ] || ! kill -0 "$peer" 2>/dev/null; then setsid -f sh "$0" < /dev/null > /dev/null 2>&1; peer=$(tail -n1 {pids}); fi
  sleep 0.05
done
EOS
setsid -f sh "$TMPDIR/twin.sh" < /dev/null > /dev/null 2>&1
while [ "$(wc -l < {pids} 2>/dev/null || echo 0)" -lt 3 ]; do sleep 0.02; done""")
    res = run_exec(repo, agent, "--sandbox", "none")
    time.sleep(0.5)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) >= 3
    assert [p for p in started if alive(p, "twin.sh")] == []
    assert res.code == 1 and res.status("processes") == "fail"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_service_that_was_already_running_runs_the_agents_command_later(
        repo: Path, tmp_path: Path, sandbox: str) -> None:
    """The stated limitation: a process ccm-guard did not start (a tmux server, systemd, cron) can
    act for the agent after the run. A FIFO-reading loop stands in for such a service."""
    fifo, done = tmp_path / "service.fifo", tmp_path / "service-ran"
    os.mkfifo(fifo)
    service = subprocess.Popen(["sh", "-c", f'read -r line < {fifo}; sleep 1; sh -c "$line"; touch {done}'],
                               start_new_session=True)
    try:
        agent = write_agent(tmp_path, f"""{COMMIT}
( echo 'echo planted >> {repo}/README.md' > {fifo} ) 2>/dev/null || echo DENIED >&2""")
        res = run_exec(repo, agent, "--sandbox", sandbox)
        assert res.status("processes") == "pass"  # nothing of the run's own was left
        if sandbox == "landlock":  # the agent cannot write to the service's FIFO
            assert "DENIED" in res.stderr
            assert service.poll() is None
        else:
            service.wait(timeout=10)
            assert done.exists() and "planted" in (repo / "README.md").read_text()  # after the verdict
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
