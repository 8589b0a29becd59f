"""The warm server (ccm_guard.warm), for real: a detached server started by `server start`
in the test's own state home (the socket's name is made of it, so no other test's
commands reach it), clients that are real `python -m ccm_guard` processes in a session
of their own (no controlling terminal, as an orchestrator's), and the server's log,
which names the client of every command it ran: that is how a test tells a served
command from one run in the client.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import ROOT, alive, ccm, git, warm_socket_name, write_agent

from ccm_guard.prevent import sandbox
from ccm_guard.warm.client import MAX_REQUEST

pytestmark = pytest.mark.skipif(sandbox.abi() < 6, reason="the warm server needs Landlock ABI 6 (this kernel: "
                                                          f"{sandbox.describe()})")


def wait_for(check: Callable[[], bool], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    started = ccm("server", "start", "--idle", "120", "--json", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    state = json.loads(started.stdout)
    assert state["running"] is True and state["started_now"] is True
    yield state
    ccm("server", "stop", cwd=tmp_path)
    if not wait_for(lambda: not alive(state["pid"]), 10):
        os.kill(state["pid"], signal.SIGKILL)
        pytest.fail("the server did not leave when stopped")


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "state" / "server.log").read_text()


def served(tmp_path: Path, client: int) -> bool:
    return f" for client {client}: " in log_of(tmp_path)


def client(*args: str, cwd: Path, env: dict[str, str] | None = None,
           preexec: Callable[[], object] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ccm_guard", *args], cwd=cwd, text=True, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})}, preexec_fn=preexec)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


COMMITTING = 'echo work > work.txt\ngit add work.txt\ngit commit -qm "agent work"\n'


def test_a_served_exec_is_the_run_it_would_have_been(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    agent = write_agent(tmp_path, COMMITTING + 'echo "umask $(umask) no-server=$CCM_GUARD_NO_SERVER" >&2\n')
    outcomes = []
    for mode, env in (("served", {}), ("here", {"CCM_GUARD_NO_SERVER": "1"})):
        proc = client("exec", "--json", "--task", mode, "--", str(agent), cwd=repo, env=env,
                      preexec=lambda: os.umask(0o027))
        code, out, err = finish(proc)
        assert served(tmp_path, proc.pid) is (mode == "served"), log_of(tmp_path)
        verdict = json.loads(out)
        outcomes.append((code, verdict["passed"], [(g["name"], g["status"]) for g in verdict["gates"]],
                         verdict["sandbox"], "umask 0027 no-server=1" in err))
        assert git(repo, "log", "-1", "--format=%s", f"ccm/{mode}") == "agent work"
    assert outcomes[0] == outcomes[1] and outcomes[0][:2] == (0, True) and outcomes[0][4]


def test_a_usage_error_reads_the_same_through_the_server(repo: Path, tmp_path: Path,
                                                         server: dict[str, Any]) -> None:
    ran = [client("exec", "--bogus", cwd=repo, env=env) for env in ({}, {"CCM_GUARD_NO_SERVER": "1"})]
    (code, out, err), (code_here, out_here, err_here) = finish(ran[0]), finish(ran[1])
    assert served(tmp_path, ran[0].pid) and not served(tmp_path, ran[1].pid)
    assert (code, out, err) == (code_here, out_here, err_here) == (2, "", err_here)
    assert err.startswith("ccm-guard: error: No such option '--bogus'") and err.count("\n") == 1


def _no_new_privs() -> None:
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: as any sandbox sets it


def _fewer_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))


def _other_hangup() -> None:
    """SIGHUP ignored where the server (started from this process) takes it, or the other
    way round (a test run under nohup)."""
    ignored = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    signal.signal(signal.SIGHUP, signal.SIG_DFL if ignored else signal.SIG_IGN)


DECLINED = {
    "confined (no_new_privs)": ({}, _no_new_privs, "NoNewPrivs"),
    "other resource limits": ({}, _fewer_files, "limits"),
    "SIGHUP ignored or not (nohup)": ({}, _other_hangup, "SigIgn"),
    "another nice value": ({}, lambda: os.nice(1), "scheduling"),
    "the idle scheduler (chrt --idle)": ({}, lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)),
                                         "scheduling"),
    "another locale for the streams": ({"PYTHONIOENCODING": "latin-1"}, None, "variables differ"),
    "another state home": ({"CCM_GUARD_HOME": "<other>"}, None, None),
}


@pytest.mark.parametrize("case", DECLINED)
def test_a_client_the_server_cannot_become_runs_its_command_itself(repo: Path, tmp_path: Path, case: str,
                                                                    server: dict[str, Any]) -> None:
    env, preexec, reason = DECLINED[case]
    env = {k: str(tmp_path / "other-home") if v == "<other>" else v for k, v in env.items()}
    proc = client("task", "list", "--json", cwd=repo, env=env, preexec=preexec)
    code, out, err = finish(proc)
    assert code == 0 and json.loads(out)["tasks"] == [], err
    assert not served(tmp_path, proc.pid)
    refused = [line for line in log_of(tmp_path).splitlines() if " refused " in line]
    if reason is None:  # another home is another server's name: this one never heard of it
        assert not refused, log_of(tmp_path)
    else:
        assert refused and reason in refused[-1], log_of(tmp_path)


def test_a_client_on_a_terminal_keeps_its_command(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "task", "list"], cwd=repo, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=subprocess.PIPE, start_new_session=True)
    os.close(follower)
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0 and not served(tmp_path, proc.pid)


def _sleeping(repo: Path, tmp_path: Path, task: str) -> tuple[subprocess.Popen[str], int]:
    """A served `exec -- sleep` and the agent's pid, once it runs."""
    pidfile = tmp_path / f"{task}.pid"
    agent = write_agent(tmp_path, f'echo $$ > "{pidfile}"\nexec sleep 60\n', name=f"{task}.sh")
    proc = client("exec", "--json", "--sandbox", "none", "--task", task, "--", str(agent), cwd=repo)
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != ""), proc.stderr
    return proc, int(pidfile.read_text())


def test_a_signal_to_the_client_reaches_the_command(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    proc, agent = _sleeping(repo, tmp_path, "term")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert served(tmp_path, proc.pid) and code == 130, err  # as the command itself answers SIGTERM
    assert json.loads(out)["task"] == "term" and not alive(agent, "sleep")


def test_a_killed_client_takes_its_command_with_it(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    proc, agent = _sleeping(repo, tmp_path, "killed")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not alive(agent, "sleep")), "the agent outlived its killed command"
    assert wait_for(lambda: f"for client {proc.pid}: signal 9 (the client went away)" in log_of(tmp_path))
    shown = ccm("task", "show", "killed", cwd=repo)
    assert shown.returncode == 0 and "ACTIVE" in shown.stdout  # as after killing the command itself: gc repairs it


def test_a_killed_server_ends_its_commands_and_says_so(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    proc, agent = _sleeping(repo, tmp_path, "orphan")
    os.kill(server["pid"], signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 137 and err.startswith("ccm-guard: error: the warm server went away") and err.count("\n") == 1
    assert wait_for(lambda: not alive(agent, "sleep")), "the agent outlived its server"


def test_start_status_stop_and_idle(tmp_path: Path) -> None:
    first = json.loads(ccm("server", "start", "--idle", "1.5", "--json", cwd=tmp_path).stdout)
    again = json.loads(ccm("server", "start", "--json", cwd=tmp_path).stdout)
    assert again["pid"] == first["pid"] and again["started_now"] is False
    shown = ccm("server", "status", cwd=tmp_path).stdout
    assert shown.startswith(f"warm server {first['pid']}: up ")
    assert wait_for(lambda: not alive(first["pid"]), 10), "an idle server stays"
    assert "idle: leaving" in log_of(tmp_path)
    assert json.loads(ccm("server", "status", "--json", cwd=tmp_path).stdout)["running"] is False
    second = json.loads(ccm("server", "start", "--json", cwd=tmp_path).stdout)
    stopped = ccm("server", "stop", cwd=tmp_path)
    assert stopped.stdout == f"warm server {second['pid']} stopped\n"
    assert wait_for(lambda: not alive(second["pid"]), 10)
    assert ccm("server", "stop", cwd=tmp_path).stdout.startswith("no warm server runs")


def test_the_server_does_not_start_confined(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ccm_guard", "server", "start"], cwd=tmp_path, capture_output=True,
                          text=True, preexec_fn=_no_new_privs, stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "confined (no_new_privs: a sandbox): start the server outside it" in proc.stderr
    assert not (tmp_path / "state" / "server.log").exists()


def test_a_replaced_installation_is_not_served(tmp_path: Path, repo: Path) -> None:
    copy = tmp_path / "site"
    for part in ("ccm_guard", "hooks", "shims"):  # a source checkout's layout
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(copy)}
    state = json.loads(ccm("server", "start", "--json", cwd=tmp_path, env=env).stdout)
    try:
        proc = client("task", "list", cwd=repo, env=env)
        assert finish(proc)[0] == 0 and served(tmp_path, proc.pid)
        module = copy / "ccm_guard" / "text.py"
        module.write_text(module.read_text() + "\n# upgraded\n")
        proc = client("task", "list", cwd=repo, env=env)
        assert finish(proc)[0] == 0 and not served(tmp_path, proc.pid)
        assert "the installed package changed" in log_of(tmp_path)
        assert wait_for(lambda: not alive(state["pid"]), 10), "a server of replaced code stays"
    finally:
        if alive(state["pid"]):
            os.kill(state["pid"], signal.SIGKILL)


# A client of the raw protocol, in a session of its own (the server declines a process with
# a controlling terminal, which the test process may have): it sends the request in
# argv[2] to the name in argv[1] (with stdin, stdout, stderr and its directory when
# argv[3] is "fds"), prints the first reply, and on "started" waits for a line on stdin,
# says "go" ("sent"), and prints the end.
RAW_CLIENT = """
import os, socket, sys
name, request = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
sock.connect(name)
sock.settimeout(20)
if sys.argv[3] == "fds":
    null = os.open(os.devnull, os.O_RDWR)
    socket.send_fds(sock, [request], [null, null, null, os.open(".", os.O_RDONLY)])
else:
    sock.send(request)
reply = sock.recv(4096)
print("reply", reply.decode("utf-8", "replace"), flush=True)
if reply == b"started":
    sys.stdin.readline()
    sock.send(b"go")
    print("sent", flush=True)
    try:
        end = sock.recv(64)
    except ConnectionResetError:  # closed with the "go" unread
        end = b""
    print("end", end.decode(), flush=True)
"""


def raw_client(repo: Path, tmp_path: Path, request: bytes, *, fds: bool = False) -> subprocess.Popen[str]:
    (tmp_path / "raw.py").write_text(RAW_CLIENT)
    (tmp_path / "raw.name").write_bytes(warm_socket_name(repo))
    (tmp_path / "raw.request").write_bytes(request)
    return subprocess.Popen([sys.executable, str(tmp_path / "raw.py"), str(tmp_path / "raw.name"),
                             str(tmp_path / "raw.request"), "fds" if fds else "-"], cwd=repo, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


MALFORMED = {
    b"run\0only\0three": "list index out of range",
    b"run\0a\0b\0c\x009\0x": "a count past the end",
    b"\xff" * 100: "an unknown request",
    b"s" * (MAX_REQUEST + 1): "a request too large",
}


@pytest.mark.parametrize("request_", MALFORMED, ids=["short", "count", "unknown", "large"])
def test_a_malformed_request_is_refused_and_the_server_goes_on(repo: Path, tmp_path: Path, request_: bytes,
                                                               server: dict[str, Any]) -> None:
    out, err = raw_client(repo, tmp_path, request_).communicate(timeout=60)
    assert out == f"reply refused {MALFORMED[request_]}\n", err
    proc = client("task", "list", cwd=repo)
    assert finish(proc)[0] == 0 and served(tmp_path, proc.pid)


def test_a_client_that_sends_nothing_holds_up_no_one(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as idle:
        idle.connect(warm_socket_name(repo))  # and then says nothing
        proc = client("task", "list", cwd=repo)
        assert finish(proc)[0] == 0 and served(tmp_path, proc.pid)
        idle.settimeout(10)
        assert idle.recv(64) == b""  # dropped, after the other was served: it was not queued behind
    log = log_of(tmp_path)
    assert log.index(f"for client {proc.pid}: exit 0") < log.index("dropped a client that sent nothing")


def test_a_stopped_server_is_passed_by(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    os.kill(server["pid"], signal.SIGSTOP)
    try:
        proc = client("task", "list", "--json", cwd=repo)
        code, out, _ = finish(proc)
        assert code == 0 and json.loads(out)["tasks"] == []
    finally:
        os.kill(server["pid"], signal.SIGCONT)
    assert not served(tmp_path, proc.pid)


@contextlib.contextmanager
def fake_server(name: bytes, answer: Callable[[socket.socket], object]) -> Iterator[list[bytes]]:
    """A server of this user (trusted: it is this test) that answers one client as told;
    yields what it received."""
    received: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(name)
    listener.listen(4)
    listener.settimeout(30)

    def serve_one() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                data, fds, _, _ = socket.recv_fds(conn, 300_000, 8)
                for fd in fds:
                    os.close(fd)
                received.append(data)
                answer(conn)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        listener.close()
        thread.join(timeout=30)


def _started_then_gone(conn: socket.socket) -> None:
    conn.send(b"started")
    assert conn.recv(64) == b"go"


ANSWERS: dict[str, Callable[[socket.socket], object]] = {
    "refuses": lambda conn: conn.send(b"refused for the test"),
    "hangs up at once": lambda conn: None,
    "never answers": lambda conn: time.sleep(3),  # past the client's wait for "started"
}


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_server_that_does_not_start_the_command_leaves_it_to_the_client(repo: Path, answer: str) -> None:
    with fake_server(warm_socket_name(repo), ANSWERS[answer]) as received:
        proc = client("task", "list", "--json", cwd=repo)
        code, out, err = finish(proc)
    assert received and received[0].startswith(b"run\0")  # it was asked
    assert code == 0 and json.loads(out)["tasks"] == [] and err == ""  # and the client ran the command itself


def test_a_server_gone_after_starting_the_command_is_reported(repo: Path) -> None:
    with fake_server(warm_socket_name(repo), _started_then_gone):
        code, out, err = finish(client("task", "list", cwd=repo))
    assert code == 137 and out == ""
    assert err.startswith("ccm-guard: error: the warm server went away before the command finished") \
        and err.count("\n") == 1


def test_a_client_with_a_closed_stream_asks_no_server(repo: Path) -> None:
    """A socket opened with stdin closed would take fd 0 and be sent as the command's
    stdin: such a client runs its command itself."""
    with fake_server(warm_socket_name(repo), _started_then_gone) as received:
        code, out, _ = finish(client("task", "list", "--json", cwd=repo, preexec=lambda: os.close(0)))
    assert code == 0 and json.loads(out)["tasks"] == [] and received == []


def test_a_served_command_has_the_clients_time_zone(repo: Path, tmp_path: Path, server: dict[str, Any]) -> None:
    proc = client("exec", "--json", "--no-require-commit", "--", "true", cwd=repo, env={"TZ": "Etc/GMT-9"})
    code, out, err = finish(proc)
    assert code == 0 and served(tmp_path, proc.pid), err
    hour = int(json.loads(out)["task"].split("-")[1][:2])
    assert hour in {(time.gmtime().tm_hour + 9 + d) % 24 for d in (-1, 0)}  # (a run across the hour)


def test_a_log_that_cannot_be_written_stops_no_command(tmp_path: Path, repo: Path) -> None:
    """A full disk under the state home, as RLIMIT_FSIZE makes one for the server and its
    clients alike (they must share their limits): the server goes on serving."""
    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    started = subprocess.run([sys.executable, "-m", "ccm_guard", "server", "start", "--json"], cwd=tmp_path,
                             capture_output=True, text=True, preexec_fn=small_files, stdin=subprocess.DEVNULL,
                             timeout=60)
    pid = json.loads(started.stdout)["pid"]
    try:
        for _ in range(4):
            code, out, _ = finish(client("--version", cwd=repo, preexec=small_files))
            assert code == 0 and out.startswith("ccm-guard, version")
        status = client("server", "status", "--json", cwd=repo, env={"CCM_GUARD_NO_SERVER": "1"})
        state = json.loads(finish(status)[1])
        assert state["pid"] == pid and state["served"] == 4
        assert (tmp_path / "state" / "server.log").stat().st_size <= 200
    finally:
        ccm("server", "stop", cwd=tmp_path)
        wait_for(lambda: not alive(pid), 10)


def _as_a_background_job() -> None:
    """What a shell without job control does to `cmd &`, and nohup to SIGHUP."""
    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def test_what_the_server_and_its_clients_ignore_stays_ignored(repo: Path, tmp_path: Path) -> None:
    """A server and clients started as background jobs: the server stays through SIGHUP, and
    an agent sees the same ignored signals served as in its own process."""
    started = subprocess.run([sys.executable, "-m", "ccm_guard", "server", "start", "--json"], cwd=tmp_path,
                             capture_output=True, text=True, preexec_fn=_as_a_background_job,
                             stdin=subprocess.DEVNULL, timeout=60)
    pid = json.loads(started.stdout)["pid"]
    try:
        os.kill(pid, signal.SIGHUP)  # nohup'd: it stays
        agent = write_agent(tmp_path, 'grep "^SigIgn" /proc/$$/status >&2\n')
        seen = []
        for mode, env in (("served", {}), ("here", {"CCM_GUARD_NO_SERVER": "1"})):
            proc = client("exec", "--json", "--sandbox", "none", "--no-require-commit", "--", str(agent), cwd=repo,
                          env=env, preexec=_as_a_background_job)
            code, _, err = finish(proc)
            assert code == 0 and served(tmp_path, proc.pid) is (mode == "served"), err
            seen.append([line for line in err.splitlines() if line.startswith("SigIgn")])
        assert seen[0] == seen[1] and len(seen[0]) == 1
        ignored = int(seen[0][0].split()[1], 16)
        assert ignored >> (signal.SIGQUIT - 1) & 1  # the agent's own (ccm-guard sets its SIGINT and SIGHUP)
        assert alive(pid)
    finally:
        ccm("server", "stop", cwd=tmp_path)
        wait_for(lambda: not alive(pid), 10)


def _no_zombies() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as an orchestrator that never reaps may set it


def test_a_server_and_clients_that_ignore_sigchld_still_hand_on_the_exit_code(repo: Path, tmp_path: Path) -> None:
    started = subprocess.run([sys.executable, "-m", "ccm_guard", "server", "start", "--json"], cwd=tmp_path,
                             capture_output=True, text=True, preexec_fn=_no_zombies, stdin=subprocess.DEVNULL,
                             timeout=60)
    pid = json.loads(started.stdout)["pid"]
    try:
        proc = client("task", "show", "nosuch", cwd=repo, preexec=_no_zombies)
        code, _, err = finish(proc)
        assert served(tmp_path, proc.pid) and code == 7 and err.count("\n") == 1, err  # not 137, no hang
        assert "error:" not in log_of(tmp_path)
    finally:
        ccm("server", "stop", cwd=tmp_path)
        wait_for(lambda: not alive(pid), 10)


def test_a_served_command_run_inside_a_worktree_is_not_in_its_own_way(repo: Path, tmp_path: Path,
                                                                       server: dict[str, Any]) -> None:
    """`task discard` run from inside the task's worktree: the client (and the shell it runs
    under) are the person's, not processes using the worktree, as when it runs itself."""
    made = ccm("exec", "--json", "--no-require-commit", "--task", "inside", "--", "true", cwd=repo,
               env={"CCM_GUARD_NO_SERVER": "1"})
    worktree = Path(json.loads(made.stdout)["worktree"])
    proc = client("task", "discard", "inside", "--json", cwd=worktree)
    code, out, err = finish(proc)
    assert served(tmp_path, proc.pid) and code == 0, err


def test_a_server_command_is_never_served_and_another_home_has_its_own(repo: Path, tmp_path: Path,
                                                                        server: dict[str, Any]) -> None:
    status = client("server", "status", "--json", cwd=repo)
    state = json.loads(finish(status)[1])
    assert state["pid"] == server["pid"] and not served(tmp_path, status.pid)
    elsewhere = tmp_path / "other-home"
    elsewhere.mkdir()
    other = client("server", "status", "--json", cwd=repo, env={"HOME": str(elsewhere)})
    assert json.loads(finish(other)[1])["running"] is False  # HOME is part of the name: another server's


def test_a_state_home_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # a file where the state home's parent would be
    proc = ccm("server", "start", cwd=tmp_path, env={"CCM_GUARD_HOME": str(tmp_path / "file" / "home")})
    assert proc.returncode == 7 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("ccm-guard: error: cannot make the state home ")


_REQUEST = """
import sys
sys.argv = ["ccm-guard", "--version"]
from ccm_guard.warm.client import request_fields
sys.stdout.buffer.write(b"\\0".join(request_fields()))
"""


def test_a_child_gone_before_its_go_costs_the_server_nothing(repo: Path, tmp_path: Path,
                                                              server: dict[str, Any]) -> None:
    """The child killed between "started" and the client's "go" (the server's write of go
    then fails): that command is reported or dropped, and the server serves on."""
    request = subprocess.run([sys.executable, "-c", _REQUEST], cwd=repo, capture_output=True, check=True,
                             timeout=60).stdout
    raw = raw_client(repo, tmp_path, request, fds=True)
    assert raw.stdout is not None and raw.stdin is not None
    assert raw.stdout.readline() == "reply started\n", log_of(tmp_path)
    children = Path(f"/proc/{server['pid']}/task/{server['pid']}/children").read_text().split()
    assert len(children) == 1
    # The server held still, so that it meets the "go" (its client's descriptor is the
    # lower: handled first) with the child already dead and not yet reaped.
    os.kill(server["pid"], signal.SIGSTOP)
    try:
        os.kill(int(children[0]), signal.SIGKILL)
        assert wait_for(lambda: not alive(int(children[0])))
        raw.stdin.write("go\n")
        raw.stdin.flush()
        assert raw.stdout.readline() == "sent\n"
    finally:
        os.kill(server["pid"], signal.SIGCONT)
    out, err = raw.communicate(timeout=60)
    assert out in ("end \n", "end signal 9\n"), err
    proc = client("task", "list", cwd=repo)
    assert finish(proc)[0] == 0 and served(tmp_path, proc.pid) and alive(server["pid"])


def test_a_client_or_child_that_cannot_be_watched_is_let_go_once(tmp_path: Path) -> None:
    """The loop's last resort (an event whose handling failed): the command is killed and
    reaped, its descriptors closed, and forgetting it twice, or by its other descriptor,
    is no error; the listener is never forgotten."""
    from ccm_guard.warm.server import Served, Server

    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(b"\0ccm-guard-test-" + str(os.getpid()).encode())
    listener.listen(1)
    server = Server(run=lambda: None, idle=60, log=log, listener=listener)
    server.poller = select.poll()
    server.poller.register(listener, select.POLLIN)
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    go_r, go_w = os.pipe()
    os.close(go_r)
    served = Served(pid=pid, pidfd=os.pidfd_open(pid), conn=ours, client=os.getpid(), go=go_w)
    server.children[served.pidfd] = served
    server.waiting[ours.fileno()] = served
    server.poller.register(served.pidfd, select.POLLIN)
    server.poller.register(ours, select.POLLIN)
    pidfd = served.pidfd
    server.forget_fd(ours.fileno())
    server.forget_fd(pidfd)
    server.forget_fd(listener.fileno())
    assert not alive(pid) and not server.children and not server.waiting and served.go is None
    assert theirs.recv(64) == b""  # its client hears the end: it says the server went away
    assert listener.fileno() >= 0 and "killed (it could not be watched)" in (tmp_path / "log").read_text()
    listener.close()
    theirs.close()
    os.close(server.spare)
    os.close(log)
