"""Landlock for real: confined child processes, real git in a linked worktree.

Each test starts a child with `preexec_fn=sandbox.prepare(...).enforce` (or a child that
calls `sandbox.restrict` itself) and looks at what the kernel let it do.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, git, make_repo

from ccm_guard.detect import signatures
from ccm_guard.errors import UsageError
from ccm_guard.prevent import roots, sandbox

needs_landlock = pytest.mark.skipif(sandbox.abi() == 0, reason=f"no Landlock here: {sandbox.describe()}")

# Tries each (operation, path) and prints the outcome: "ok" or the errno's name.
PROBE = r"""
import errno, json, os, sys, socket
out = []
for op, arg in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        if op == "append":
            with open(arg, "a") as fh: fh.write("x\n")
        elif op == "create":
            open(arg, "x").close()
        elif op == "read":
            open(arg).read()
        elif op == "list":
            os.listdir(arg)
        elif op == "truncate":
            os.truncate(arg, 0)
        elif op == "mkdir":
            os.mkdir(arg)
        elif op == "unlink":
            os.unlink(arg)
        elif op == "rename":
            os.rename(*arg.split("|"))
        elif op == "bind":
            socket.socket().bind(("127.0.0.1", 0))
        elif op in ("winsize", "openpty"):
            import fcntl, termios
            if op == "openpty":
                fd = os.openpty()[1]  # the other end by ioctl, not by its name under /dev/pts
            else:
                fd = int(arg) if arg.isdigit() else os.open(arg, os.O_RDWR | os.O_NOCTTY)
            fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            termios.tcsetattr(fd, termios.TCSANOW, termios.tcgetattr(fd))
        out.append("ok")
    except OSError as exc:
        out.append(errno.errorcode[exc.errno])
print(json.dumps(out))
"""


def probe(writable: list[Path], *ops: tuple[str, str | Path], no_network: bool = False,
          pass_fds: tuple[int, ...] = ()) -> list[str]:
    ruleset = sandbox.prepare(writable, no_network=no_network)
    try:
        argv = [a for op, arg in ops for a in (op, str(arg))]
        proc = subprocess.run([sys.executable, "-B", "-c", PROBE, *argv], capture_output=True, text=True,
                              preexec_fn=ruleset.enforce, check=True, pass_fds=pass_fds)
    finally:
        ruleset.close()
    result: list[str] = json.loads(proc.stdout)
    return result


def confined(writable: list[Path], script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in `cwd` with only `writable` writable."""
    ruleset = sandbox.prepare(writable)
    try:
        return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                              preexec_fn=ruleset.enforce)
    finally:
        ruleset.close()


def linked_worktree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(main checkout, linked worktree on ccm/t1, its admin dir)."""
    main = make_repo(tmp_path / "repo")
    wt = tmp_path / "wt"
    git(main, "worktree", "add", "-q", "-b", "ccm/t1", str(wt))
    return main, wt, main / ".git" / "worktrees" / "wt"


def test_describe_names_the_abi_or_why_not() -> None:
    text = sandbox.describe()
    assert text == f"landlock ABI {sandbox.abi()}" if sandbox.abi() else text.startswith("landlock un")


@needs_landlock
def test_writes_only_beneath_the_writable_dir(tmp_path: Path) -> None:
    inside, outside, home = tmp_path / "inside", tmp_path / "outside", Path(os.environ["HOME"])
    inside.mkdir()
    outside.mkdir()
    (outside / "data").write_text("kept\n")
    (inside / "sub").mkdir()
    (inside / "old").write_text("x\n")
    got = probe(
        [inside],
        ("create", inside / "new"), ("append", inside / "new"), ("mkdir", inside / "d"),
        ("rename", f"{inside / 'old'}|{inside / 'sub' / 'moved'}"),  # REFER: across directories
        ("truncate", inside / "new"), ("unlink", inside / "new"),
        ("create", outside / "new"), ("append", outside / "data"), ("truncate", outside / "data"),
        ("mkdir", outside / "d"), ("unlink", outside / "data"), ("create", home / "x"),
        ("read", outside / "data"), ("list", "/etc"), ("append", "/dev/null"),
    )
    assert got == ["ok"] * 6 + ["EACCES"] * 6 + ["ok"] * 3
    assert (outside / "data").read_text() == "kept\n"
    assert not (home / "x").exists()


@needs_landlock
def test_repository_metadata_and_main_checkout_are_read_only(tmp_path: Path) -> None:
    main, wt, admin = linked_worktree(tmp_path)
    (main / ".git" / "hooks").mkdir(exist_ok=True)  # the test's empty git template has none
    got = probe(
        [wt],
        ("append", wt / "README.md"),
        ("append", main / ".git" / "config"), ("create", main / ".git" / "hooks" / "pre-commit"),
        ("append", main / "README.md"), ("create", admin / "index.lock"),
        ("read", main / ".git" / "config"),
    )
    assert got == ["ok", "EACCES", "EACCES", "EACCES", "EACCES", "ok"]


@needs_landlock
def test_restrict_confines_the_calling_process_and_what_it_execs(tmp_path: Path) -> None:
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    code = ("import os, sys; from ccm_guard.prevent import sandbox; "
            "sandbox.restrict([sandbox.Path(sys.argv[1])]); "
            "os.execvp('sh', ['sh', '-c', 'echo a > \"$0\"/f && echo b > \"$1\"/f; echo rc=$?', *sys.argv[1:]])")
    proc = subprocess.run([sys.executable, "-B", "-c", code, str(inside), str(outside)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip() == "rc=2", proc.stderr
    assert "Permission denied" in proc.stderr
    assert (inside / "f").read_text() == "a\n" and not (outside / "f").exists()


@needs_landlock
def test_a_terminal_still_works_inside(tmp_path: Path) -> None:
    """The terminal the agent is given works, by its open descriptor and by its name, and
    so does a pty it makes (aider runs commands through pexpect): the kernel opens the
    other end by its name under /dev/pts, so that stays writable (docs/attacks.md, 7)."""
    leader, follower = os.openpty()
    try:
        assert probe([tmp_path], ("winsize", str(follower)), ("winsize", os.ttyname(follower)), ("openpty", "-"),
                     pass_fds=(follower,)) == ["ok", "ok", "ok"]
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.skipif(sandbox.abi() < 4, reason="TCP rules need Landlock ABI 4")
def test_no_network_refuses_tcp_bind(tmp_path: Path) -> None:
    assert probe([tmp_path], ("bind", "-")) == ["ok"]
    assert probe([tmp_path], ("bind", "-"), no_network=True) == ["EACCES"]
    # The parent is not confined by building a ruleset.
    socket.socket().bind(("127.0.0.1", 0))


@needs_landlock
def test_git_commit_in_a_linked_worktree_succeeds_with_its_roots(tmp_path: Path) -> None:
    main, wt, _ = linked_worktree(tmp_path)
    proc = confined(roots.writable_roots(wt), "echo more >> README.md && git add README.md && git commit -qm work", wt)
    assert proc.returncode == 0, proc.stderr
    assert git(main, "log", "-1", "--format=%s", "ccm/t1") == "work"


@needs_landlock
def test_git_commit_blocked_when_only_the_worktree_is_writable(tmp_path: Path) -> None:
    """The blocked commit, for real: a sandbox that knows nothing of linked worktrees."""
    main, wt, admin = linked_worktree(tmp_path)
    proc = confined([wt], "echo more >> README.md; git add README.md; git commit -qm work", wt)
    assert proc.returncode == 128
    found = signatures.find_blocked_commit(proc.stderr, [admin, main / ".git"])
    assert found is not None, proc.stderr
    assert found.lock == admin.resolve() / "index.lock"
    assert found.reason == "Permission denied"
    assert git(main, "rev-parse", "ccm/t1") == git(main, "rev-parse", "main")


def test_a_missing_writable_path_is_a_clear_error(tmp_path: Path) -> None:
    if sandbox.abi() == 0:
        pytest.skip(f"no Landlock here: {sandbox.describe()}")
    with pytest.raises(UsageError, match=r"cannot sandbox with .*/nope writable \(No such file or directory\)"):
        sandbox.prepare([tmp_path / "nope"])


def test_unsupported_machine_is_reported_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    # No kernel here lacks Landlock, so the one fake: an architecture without a syscall table.
    sandbox.abi.cache_clear()
    monkeypatch.setattr("platform.machine", lambda: "sparc64")
    try:
        assert sandbox.abi() == 0
        assert sandbox.describe() == "landlock unsupported on sparc64"
        with pytest.raises(UsageError, match="--sandbox landlock is not available here"):
            sandbox.prepare([Path("/tmp")])
    finally:
        sandbox.abi.cache_clear()


def test_reachable_sockets_come_from_the_sessions_variables_and_a_private_runtime_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the verdict's socket note lists: the sockets the session names first (a D-Bus
    address with keys after the path, %-escaped), then a runtime dir's, but only when it is
    the user's own 0700 directory (a CI that points XDG_RUNTIME_DIR at /tmp is not listed)."""
    from ccm_guard.prevent.sandbox import reachable_sockets

    def serve(path: Path) -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s

    bus_dir = tmp_path / "a b"
    bus_dir.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    servers = [serve(bus_dir / "bus"), serve(shared / "other.sock"), serve(private / "tool.sock")]
    try:
        monkeypatch.delenv("TMUX", raising=False)
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        monkeypatch.delenv("DOCKER_HOST", raising=False)
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/a%20b/bus,guid=0123;unix:abstract=/x")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
        found = reachable_sockets()
        assert str(bus_dir / "bus") in found and str(shared / "other.sock") not in found
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(private))
        found = reachable_sockets()
        assert found.index(str(bus_dir / "bus")) < found.index(str(private / "tool.sock"))
    finally:
        for s in servers:
            s.close()
