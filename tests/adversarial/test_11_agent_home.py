"""Class 11: the agent's own home and the rest of the machine.

An agent's CLI runs what its home says (hooks, MCP servers, status lines, `notify`), so a
planted entry there runs in the person's next session, outside any sandbox. Each known
agent gets a private home under the task's state; the person's is never writable under
the sandbox and never written back. What the agent plants in its private home fails the
run (agent-home). Beyond files: from Landlock ABI 6 the sandbox also keeps the agent from
signalling the person's processes and from their abstract Unix sockets, and
`--no-network` keeps TCP to the ports the run allows.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from adv import COMMIT, needs_landlock
from conftest import ccm, run_exec, write_agent

from ccm_guard.prevent import sandbox

HOOK = json.dumps({"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /tmp/pwned"}]}]}})


def _digest(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(top.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def person_home() -> Path:
    home = Path(os.environ["HOME"])
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text('{"model": "opus"}')
    (home / ".claude.json").write_text('{"numStartups": 1}')
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text('model = "o4"\n')
    return home


@needs_landlock
def test_a_hook_written_into_the_persons_claude_settings_is_prevented(repo: Path, tmp_path: Path,
                                                                      person_home: Path) -> None:
    before = _digest(person_home)
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '%s' '{HOOK}' > \"$HOME/.claude/settings.json\" "
                        "|| echo DENIED >&2")
    res = run_exec(repo, agent, "--agent", "claude")
    assert "DENIED" in res.stderr
    assert _digest(person_home) == before
    assert res.code == 0, res.stdout  # nothing happened: the write never landed


def test_a_hook_planted_in_the_agents_private_claude_home_fails_agent_home(repo: Path, tmp_path: Path,
                                                                          person_home: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '%s' '{HOOK}' > \"$CLAUDE_CONFIG_DIR/settings.json\"")
    res = run_exec(repo, agent, "--agent", "claude")
    assert res.code == 1 and res.status("agent-home") == "fail"
    assert "hooks" in res.reasons("agent-home")
    assert json.loads((person_home / ".claude" / "settings.json").read_text()) == {"model": "opus"}


def test_an_mcp_server_added_to_the_agents_private_claude_json_fails_agent_home(repo: Path, tmp_path: Path,
                                                                               person_home: Path) -> None:
    server = json.dumps({"numStartups": 2, "mcpServers": {"x": {"command": "sh", "args": ["-c", "id"]}}})
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '%s' '{server}' > \"$CLAUDE_CONFIG_DIR/.claude.json\"")
    res = run_exec(repo, agent, "--agent", "claude")
    assert res.code == 1 and "mcpServers" in res.reasons("agent-home")


def test_codex_notify_added_to_its_private_config_fails_agent_home(repo: Path, tmp_path: Path,
                                                                  person_home: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\necho 'notify = [\"sh\", \"-c\", \"id\"]' >> \"$CODEX_HOME/config.toml\"")
    res = run_exec(repo, agent, "--agent", "codex")
    assert res.code == 1 and "notify" in res.reasons("agent-home")
    assert (person_home / ".codex" / "config.toml").read_text() == 'model = "o4"\n'


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """One of the person's own processes, outside the sandbox."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(sandbox.abi() < 6, reason="Landlock scopes (signals, abstract sockets) need ABI 6")
def test_signalling_the_persons_process_is_prevented(repo: Path, tmp_path: Path,
                                                     bystander: subprocess.Popen[bytes]) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\nkill -TERM {bystander.pid} 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent)
    assert "DENIED" in res.stderr
    assert bystander.poll() is None  # still running
    assert res.code == 0


def socket_probe(tmp_path: Path, address: str) -> Path:
    """A script that connects to the Unix socket `address` and prints CONNECTED or DENIED."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({address!r})\n"
                     "    print('CONNECTED')\nexcept OSError as e:\n    print('DENIED', e.errno)\n")
    return probe


@pytest.mark.skipif(sandbox.abi() < 6, reason="Landlock scopes (signals, abstract sockets) need ABI 6")
def test_connecting_to_the_persons_abstract_socket_is_prevented(repo: Path, tmp_path: Path) -> None:
    name = f"ccm-guard-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(1)
    try:
        probe = socket_probe(tmp_path, "\0" + name)
        agent = write_agent(tmp_path, f"{COMMIT}\npython3 {probe} >&2")
        res = run_exec(repo, agent)
        assert "DENIED" in res.stderr and "CONNECTED" not in res.stderr
    finally:
        server.close()


@needs_landlock
def test_a_pathname_socket_of_the_persons_server_is_reachable_and_the_verdict_says_so(repo: Path,
                                                                                     tmp_path: Path) -> None:
    """Landlock's limit, shown for real: a socket file (a tmux or D-Bus server's, in the
    person's runtime dir) can be connected to from inside the sandbox. ccm-guard cannot
    refuse it; the verdict names the socket, so the person can stop that server."""
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)  # a runtime dir is the user's own (XDG: 0700)
    path = runtime / "bus"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        probe = socket_probe(tmp_path, str(path))
        agent = write_agent(tmp_path, f"{COMMIT}\npython3 {probe} >&2\nenv | grep -c XDG_RUNTIME_DIR >&2 || true")
        res = run_exec(repo, agent, env={"XDG_RUNTIME_DIR": str(runtime)})
        assert "CONNECTED" in res.stderr  # the limit is real: if this changes, the note is stale
        assert res.code == 0, res.stdout
        [note] = [n for n in res.verdict["notes"] if "Unix sockets on the file system" in n]
        assert str(path) in note and "outside the sandbox" in note
        assert "\n0\n" in f"\n{res.stderr}"  # the variable naming the place is not passed on
    finally:
        server.close()


@needs_landlock
@pytest.mark.skipif(sandbox.abi() < 4, reason="--no-network needs Landlock ABI 4")
def test_no_network_allows_only_the_ports_the_run_names(repo: Path, tmp_path: Path) -> None:
    listeners = [socket.socket(), socket.socket()]
    for s in listeners:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
    allowed, other = (s.getsockname()[1] for s in listeners)
    probe = tmp_path / "probe.py"
    probe.write_text("import socket, sys\nfor port in map(int, sys.argv[1:]):\n    s = socket.socket()\n"
                     "    try:\n        s.connect(('127.0.0.1', port)); print('open', port)\n"
                     "    except OSError as e:\n        print('refused', port, e.errno)\n")
    try:
        agent = write_agent(tmp_path, f"{COMMIT}\npython3 {probe} {allowed} {other} >&2")
        res = run_exec(repo, agent, "--no-network", "--allow-port", str(allowed))
        assert f"open {allowed}" in res.stderr and f"refused {other} 13" in res.stderr
        assert f"TCP only to port {allowed}" in res.verdict["sandbox"]
    finally:
        for s in listeners:
            s.close()


def test_a_linked_config_worktree_is_never_written_through(repo: Path, tmp_path: Path) -> None:
    """The agent swaps its task's config.worktree for a link to the person's ~/.gitconfig;
    ccm-guard edits that file at disarm and must not follow the link."""
    victim = Path(os.environ["HOME"]) / ".gitconfig"
    before = victim.read_bytes()
    agent = write_agent(tmp_path, f'{COMMIT}\nln -sf "{victim}" "$(git rev-parse --git-dir)/config.worktree"')
    res = run_exec(repo, agent, "--task", "linked")
    assert res.code == 1 and res.status("git-metadata") == "fail"
    discard = ccm("task", "discard", "linked", cwd=repo)
    assert victim.read_bytes() == before, discard.stderr
    assert "Traceback" not in discard.stderr


def test_widening_aiders_ignore_file_fails_the_run(repo: Path, tmp_path: Path) -> None:
    """The ignore file ccm-guard gives aider lives in the task's git metadata, so an agent
    that rewrites it to hide its leftovers is caught."""
    agent = write_agent(tmp_path, f'{COMMIT}\necho leftover > stash.bin\n'
                        'echo "*" >> "$(git rev-parse --git-dir)/ccm-guard-excludes"')
    res = run_exec(repo, agent, "--agent", "aider")
    assert res.code == 1 and res.status("git-metadata") == "fail"
    assert any("ccm-guard-excludes" in p for f in res.gate("git-metadata")["findings"] for p in f["paths"])


@needs_landlock
def test_poisoning_the_codex_template_that_seeds_later_homes_is_prevented(repo: Path, tmp_path: Path) -> None:
    """The databases codex's first start makes are kept under the state home and copied into
    every later task's private home: an agent that could rewrite them would speak to the
    next tasks' codex (its memories, its queue). Under the sandbox it cannot."""
    state = Path(os.environ["CCM_GUARD_HOME"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "codex"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = archive ]; then echo clean > "$CODEX_HOME/memories_1.sqlite"; exit 1; fi
for t in {state}/agent-templates/codex-*; do
  [ -d "$t" ] && echo "template=$t"
  echo poisoned > "$t/memories_1.sqlite" && echo wrote=yes || echo wrote=no
done
{COMMIT}
""")
    fake.chmod(0o755)
    first = run_exec(repo, fake, "--task", "one")
    assert first.code == 0, first.stdout
    [template] = (state / "agent-templates").glob("codex-*")
    second = run_exec(repo, fake, "--task", "two")
    output = Path(second.verdict["log_dir"], "agent.stdout.log").read_text(errors="replace")
    assert f"template={template}" in output and "wrote=no" in output
    assert (template / "memories_1.sqlite").read_text() == "clean\n"
