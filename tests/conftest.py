"""Real git, real processes, isolated from the machine's HOME and config.

Helpers (plain functions, import them from conftest):
  make_repo(path)          a repository on `main` with a few committed files
  git(repo, *args)         run git for the test itself (never through ccm-guard)
  write_agent(dir, body)   a /bin/sh agent script ("set -e", `rgit` = git around the shim and hooks, body)
  run_exec(repo, agent)    `python -m ccm_guard exec --json ...` as a real process
  spawn_exec(repo, *args)  the same in the background (a Popen)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
AUTHOR = {
    "GIT_AUTHOR_NAME": "Test Person",
    "GIT_AUTHOR_EMAIL": "person@example.com",
    "GIT_COMMITTER_NAME": "Test Person",
    "GIT_COMMITTER_EMAIL": "person@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Nothing a test does may reach the real HOME, git config or ~/.ccm."""
    home = tmp_path / "home"
    home.mkdir()
    # The agents' own git reads $HOME/.gitconfig (GIT_* is scrubbed from their environment).
    (home / ".gitconfig").write_text("[user]\n\tname = Agent\n\temail = agent@example.com\n")
    templates = tmp_path / "git-templates"
    templates.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CCM_GUARD_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(templates))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for name in list(os.environ):
        if name.startswith("GIT_") and name not in ("GIT_CONFIG_NOSYSTEM", "GIT_TEMPLATE_DIR"):
            monkeypatch.delenv(name)
    return tmp_path


def git(repo: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True,
        env={**os.environ, **AUTHOR, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "# project\n", "src/app.py": "print('hi')\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


# In agent scripts, `rgit` is git as an agent that goes around the prevention layer
# would run it: the real binary by path, hooks off. Attacks meant for the gates use it.
RGIT = 'rgit() { "${CCM_GUARD_REAL_GIT:-git}" -c core.hooksPath=/dev/null "$@"; }\n'


def marker_script(directory: Path, marker: Path, name: str) -> Path:
    """An executable that appends one line to `marker` (and swallows stdin, as a pager would)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{marker}"\ncat >/dev/null 2>&1 || true\nexit 0\n')
    path.chmod(0o755)
    return path


def write_agent(directory: Path, body: str, name: str = "agent.sh") -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nset -e\n" + RGIT + body + "\n")
    path.chmod(0o755)
    return path


@dataclass
class ExecResult:
    code: int
    verdict: dict[str, Any]
    stdout: str
    stderr: str

    def gate(self, name: str) -> dict[str, Any]:
        return next(g for g in self.verdict["gates"] if g["name"] == name)

    def status(self, name: str) -> str:
        return str(self.gate(name)["status"])

    def reasons(self, name: str) -> str:
        return "\n".join(f["reason"] for f in self.gate(name)["findings"])


def ccm(*args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ccm_guard", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )


def warm_socket_name(cwd: Path) -> bytes:
    """The warm server's name as `python -m ccm_guard` run in `cwd` computes it: it is made
    of the package's path, and this test process may import another copy (the checkout)."""
    code = "import sys\nfrom ccm_guard.warm.client import socket_name\nsys.stdout.buffer.write(socket_name())"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, check=True, timeout=60).stdout


def spawn_exec(repo: Path, *args: str) -> subprocess.Popen[str]:
    """`ccm-guard exec ARGS` started in the background, its output captured."""
    return subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", *args], cwd=repo, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def run_exec(repo: Path, agent: Path | str, *options: str, timeout: float = 60,
             env: dict[str, str] | None = None) -> ExecResult:
    proc = ccm("exec", "--json", *options, "--", str(agent), cwd=repo, timeout=timeout, env=env)
    try:
        verdict = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"no JSON verdict (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from exc
    return ExecResult(proc.returncode, verdict, proc.stdout, proc.stderr)


def state_of(repo: Path) -> dict[str, str]:
    """What the person sees of their checkout: refs, HEAD, status, config and hooks."""
    common = Path(git(repo, "rev-parse", "--git-common-dir"))
    if not common.is_absolute():
        common = repo / common
    hooks = sorted(p.name for p in (common / "hooks").glob("*")) if (common / "hooks").exists() else []
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git(repo, "symbolic-ref", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "config": (common / "config").read_text(),
        "hooks": " ".join(hooks),
    }


def alive(pid: int, running: str = "") -> bool:
    """Whether `pid` is a live process, not a zombie (running `running`: pids are reused quickly)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
    return state != "Z" and running in cmdline


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a small tmpfs needs root and mount here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def read_terminal(leader: int) -> bytes:
    """Everything written to a pseudo-terminal until its last writer has gone; closes `leader`."""
    out = b""
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        out += data
    os.close(leader)
    return out


def no_disk_room(patch: pytest.MonkeyPatch) -> None:
    """os.statvfs as it is, but one block free: the disk-room check refuses anything."""
    real = os.statvfs

    def full(path: str) -> os.statvfs_result:
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 1, 1, st.f_files,
                                  st.f_ffree, st.f_favail, st.f_flag, st.f_namemax))

    patch.setattr(os, "statvfs", full)
