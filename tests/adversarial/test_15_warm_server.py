"""Class 15: the warm server (`ccm-guard server start`) as a way out of the sandbox.

A server runs commands unconfined for any client it accepts, so it is a door out of the
sandbox if a sandboxed agent can reach it, and a trap for the person's commands if an
agent can stand in for it. Both are tried for real under the default sandbox: the agent
sends a request that the server runs when it comes from outside (shown first, as the
control), and an agent that takes the server's name before any server runs waits for
the person's next command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from adv import needs_landlock
from conftest import alive, ccm, run_exec, spawn_exec, warm_socket_name, write_agent

from ccm_guard.prevent import sandbox

pytestmark = [needs_landlock, pytest.mark.skipif(sandbox.abi() < 6, reason="the warm server needs Landlock ABI 6")]

# Sends the request in $1 (made by REQUEST below) to the name in $2 with this process's
# streams and directory, and prints what happened.
SENDER = """
import array, socket, sys
request, name = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    sock.connect(name)
except OSError as exc:
    print("connect refused: errno", exc.errno, file=sys.stderr)
    sys.exit(0)
fds = array.array("i", [0, 1, 2, __import__("os").open(".", __import__("os").O_RDONLY)])
sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
if sock.recv(4096) == b"started":  # as the installed client does: "go", then the command's end
    sock.send(b"go")
    print("reply:", sock.recv(4096).decode(), file=sys.stderr)
"""

# A request exactly as the installed command makes it, for `exec --sandbox none` of a
# command that writes the file in argv[1]: what a real client of this interpreter sends.
REQUEST = """
import sys
target, out = sys.argv[1], sys.argv[2]
sys.argv = ["ccm-guard", "exec", "--sandbox", "none", "--no-require-commit", "--cleanup",
            "--", "sh", "-c", f"echo escaped > {target}"]
from ccm_guard.warm.client import request_fields
open(out, "wb").write(b"\\0".join(request_fields()))
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    started = ccm("server", "start", "--json", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    pid = int(json.loads(started.stdout)["pid"])
    yield pid
    ccm("server", "stop", cwd=tmp_path)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def _request(tmp_path: Path, repo: Path, target: Path, name: str) -> Path:
    out = tmp_path / f"{name}.request"
    subprocess.run([sys.executable, "-c", REQUEST, str(target), str(out)], cwd=repo, check=True, timeout=60,
                   env={**os.environ, "CCM_GUARD_NO_SERVER": "1"})
    return out


def test_a_sandboxed_agent_cannot_have_the_warm_server_run_a_command(repo: Path, tmp_path: Path,
                                                                     server: int) -> None:
    names = tmp_path / "server.name"
    names.write_bytes(warm_socket_name(repo))
    sender = tmp_path / "sender.py"
    sender.write_text(SENDER)
    # The control: the same kind of request from an unconfined process of the person's is run.
    control = tmp_path / "control.txt"
    sent = subprocess.run([sys.executable, str(sender), str(_request(tmp_path, repo, control, "control")),
                           str(names)], cwd=repo, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    assert "reply: exit 0" in sent.stderr and control.read_text() == "escaped\n", sent.stderr
    # The attack: the agent, under the default sandbox, sends it to write outside.
    outside = tmp_path / "outside.txt"
    request = _request(tmp_path, repo, outside, "attack")
    agent = write_agent(tmp_path, f'python3 "{sender}" "{request}" "{names}"')
    res = run_exec(repo, agent, "--no-require-commit")
    assert not outside.exists()
    assert "connect refused: errno 1" in res.stderr, res.stderr  # EPERM: Landlock's abstract-socket scope
    assert res.code == 0 and res.verdict["sandbox"].startswith("landlock")


SQUATTER = """
import os, socket, sys, time
name, record = open(sys.argv[1], "rb").read(), sys.argv[2]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.bind(name)
sock.listen(1)
open(record, "w").write("bound\\n")
sock.settimeout(30)
conn, _ = sock.accept()
conn.settimeout(10)
data, fds, _, _ = socket.recv_fds(conn, 300000, 8)
open(record, "a").write(f"received {len(data)} bytes and {len(fds)} descriptors\\n")
"""


def test_an_agent_that_takes_the_servers_name_gets_none_of_the_persons_commands(repo: Path, tmp_path: Path) -> None:
    names = tmp_path / "server.name"
    names.write_bytes(warm_socket_name(repo))
    squatter = tmp_path / "squatter.py"
    squatter.write_text(SQUATTER)
    agent = write_agent(tmp_path, f'python3 "{squatter}" "{names}" "$PWD/record.txt"\n'
                                  'git add record.txt && git commit -qm "what the squatter got"')
    run = spawn_exec(repo, "--json", "--no-require-commit", "--task", "squat", "--", str(agent))
    record = tmp_path / "state" / "worktrees"
    deadline = time.monotonic() + 30
    while not list(record.glob("*/squat/record.txt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = list(record.glob("*/squat/record.txt"))
    assert found, run.communicate(timeout=60)
    # The person's next command, as an orchestrator runs it: it runs, and runs here.
    person = subprocess.run([sys.executable, "-m", "ccm_guard", "task", "list", "--json"], cwd=repo,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    out, err = run.communicate(timeout=60)
    assert person.returncode == 0 and [t["id"] for t in json.loads(person.stdout)["tasks"]] == ["squat"]
    assert found[0].read_text() == "bound\nreceived 0 bytes and 0 descriptors\n"
    assert json.loads(out)["passed"] is True, err


# An agent that wants its ccm-guard command run by the server: it drops the variable that
# keeps it off, and takes the variables the server compares (the locale, the state home)
# from the server's own environment (/proc/<pid>/environ: readable outside the sandbox).
NESTED = """
import os, sys
env = {k: v for k, v in os.environ.items() if k != "CCM_GUARD_NO_SERVER" and not k.startswith(("LC_", "LANG", "PYTHON"))}
try:
    with open(f"/proc/{sys.argv[1]}/environ", "rb") as f:
        for item in f.read().split(b"\\0"):
            key, _, value = item.decode().partition("=")
            if key.startswith(("LC_", "LANG", "PYTHON", "CCM_GUARD_HOME")):
                env[key] = value
    with open(f"/proc/{sys.argv[1]}/status") as f:  # and which signals it ignores (under nohup: SIGHUP)
        ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    import signal
    for signum in range(1, 32):
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_IGN if ignored >> (signum - 1) & 1 else signal.SIG_DFL)
except OSError as exc:
    print("cannot read the server's environment:", exc.strerror, file=sys.stderr)
os.execve(sys.executable, [sys.executable, "-m", "ccm_guard", "--version"], env)
"""


@pytest.mark.parametrize("sandbox_mode", ["none", "landlock"])
def test_an_agent_that_unsets_the_variable_is_served_only_without_the_sandbox(repo: Path, tmp_path: Path,
                                                                             server: int, sandbox_mode: str) -> None:
    """Limitation, stated precisely: the agent's environment carries CCM_GUARD_NO_SERVER=1,
    so that a ccm-guard it starts runs in its own process tree, but an agent can drop it.
    Without the sandbox the server then runs that command, outside the run's process
    tree (as the person's tmux or D-Bus would run anything: docs/attacks.md section 8);
    under the sandbox it cannot connect."""
    nested = tmp_path / "nested.py"
    nested.write_text(NESTED)
    agent = write_agent(tmp_path, f'echo "set=$CCM_GUARD_NO_SERVER" >&2\n'
                                  f'"{sys.executable}" "{nested}" {server} >&2')
    # The run itself in its own process: the only command the server can have run is the agent's.
    res = run_exec(repo, agent, "--no-require-commit", "--sandbox", sandbox_mode, env={"CCM_GUARD_NO_SERVER": "1"})
    log = (tmp_path / "state" / "server.log").read_text()
    assert "set=1" in res.stderr and "ccm-guard, version" in res.stderr and res.code == 0, res.stderr
    assert (" for client " in log) is (sandbox_mode == "none"), log


# Takes the server's name, fills its queue (and never accepts), then waits for the test's
# word: a client whose connect waited for room would hang every command meanwhile.
CLOGGER = """
import os, socket, sys, time
name, ready, done = open(sys.argv[1], "rb").read(), sys.argv[2], sys.argv[3]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.bind(name)
sock.listen(0)
held = []
for _ in range(4):
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
    try:
        peer.connect(name)
    except BlockingIOError:
        break
    held.append(peer)
open(ready, "w").write(f"queued {len(held)}\\n")
deadline = time.monotonic() + 30
while not os.path.exists(done) and time.monotonic() < deadline:
    time.sleep(0.05)
os.unlink(ready)
"""


def test_an_agent_that_takes_the_name_and_fills_its_queue_hangs_no_command(repo: Path, tmp_path: Path) -> None:
    names = tmp_path / "server.name"
    names.write_bytes(warm_socket_name(repo))
    clogger = tmp_path / "clogger.py"
    clogger.write_text(CLOGGER)
    done = tmp_path / "done"
    agent = write_agent(tmp_path, f'python3 "{clogger}" "{names}" "$PWD/ready.txt" "{done}"')
    run = spawn_exec(repo, "--json", "--no-require-commit", "--task", "clog", "--", str(agent))
    worktrees = tmp_path / "state" / "worktrees"
    deadline = time.monotonic() + 30
    while not list(worktrees.glob("*/clog/ready.txt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        ready = list(worktrees.glob("*/clog/ready.txt"))
        assert ready and ready[0].read_text().startswith("queued "), run.communicate(timeout=60)
        person = subprocess.run([sys.executable, "-m", "ccm_guard", "task", "list", "--json"], cwd=repo,
                                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        assert person.returncode == 0 and [t["id"] for t in json.loads(person.stdout)["tasks"]] == ["clog"]
    finally:
        done.write_text("")
    out, err = run.communicate(timeout=60)
    assert json.loads(out)["passed"] is True, err
