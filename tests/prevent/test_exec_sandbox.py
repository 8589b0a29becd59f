"""exec under Landlock, the blocked-commit signature for real, recovery, and `roots`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import ROOT, ccm, git, run_exec, write_agent

from ccm_guard.prevent import sandbox

pytestmark = pytest.mark.skipif(sandbox.abi() == 0, reason="this kernel has no Landlock")

# An agent that sandboxes itself as tools unaware of linked worktrees do: only its cwd
# (the worktree) and a temp dir writable. Its `git commit` then dies on index.lock.
NAIVE_SANDBOX = f'''naive() {{
  PYTHONPATH={ROOT} python3 -c '
import os, sys
from pathlib import Path
from ccm_guard.prevent import sandbox
sandbox.restrict([Path.cwd(), Path(os.environ["TMPDIR"])])
os.execvp("sh", ["sh", "-c", sys.argv[1]])' "$1"
}}
'''


def test_sandboxed_agent_can_commit_but_not_write_elsewhere(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""
try() {{ if sh -c "$1" 2>/dev/null; then echo "$2 allowed"; else echo "$2 denied"; fi; }}
{{ try "echo x >> {repo}/README.md" main-checkout
   try "echo x >> {repo}/.git/config" git-config
   try "echo x > {repo}/.git/hooks/pre-commit" git-hooks
   try "echo x > $HOME/dotfile" home
   try "echo x > $TMPDIR/scratch" private-tmp; }} > report.txt
cat report.txt > /dev/stderr
git add report.txt; git commit -qm 'sandboxed work'""")
    res = run_exec(repo, agent, "--sandbox", "landlock")
    assert res.code == 0, res.stdout + res.stderr
    assert res.verdict["sandbox"].startswith("landlock ABI")
    report = (Path(res.verdict["worktree"]) / "report.txt").read_text()
    for place in ("main-checkout", "git-config", "git-hooks", "home"):
        assert f"{place} denied" in report
    assert "private-tmp allowed" in report
    assert [c["subject"] for c in res.verdict["commits"]] == ["sandboxed work"]
    assert res.verdict["recovery"] is None
    assert git(repo, "status", "--porcelain") == ""


def test_commit_blocked_by_readonly_gitdir_is_recovered(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, NAIVE_SANDBOX + """echo 'print("fixed")' > src/app.py
echo "Fix the app" > "$CCM_GUARD_SUMMARY"
naive 'git add -A && git commit -qm "Fix the app"'""")
    res = run_exec(repo, agent, "--task", "blocked")
    stderr = Path(res.verdict["log_dir"], "agent.stderr.log").read_text()
    assert "fatal: Unable to create" in stderr and "index.lock" in stderr  # git really failed
    assert res.verdict["agent"]["exit_code"] != 0
    rec = res.verdict["recovery"]
    assert rec and rec["reason"] == "sandbox blocked commit" and rec["committed"] == ["src/app.py"]
    assert res.code == 0, res.stdout
    message = git(repo, "log", "-1", "--format=%B", "ccm/blocked")
    assert message.startswith("Fix the app") and message.count("Recovery-Reason: sandbox blocked commit") == 1
    assert git(repo, "show", "ccm/blocked:src/app.py") == 'print("fixed")'


def test_with_the_roots_the_same_agent_commits_without_recovery(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """echo 'print("fixed")' > src/app.py
git add -A; git commit -qm 'Fix the app'""")
    res = run_exec(repo, agent, "--sandbox", "landlock")
    assert res.code == 0 and res.verdict["recovery"] is None
    assert [c["subject"] for c in res.verdict["commits"]] == ["Fix the app"]


@pytest.mark.parametrize("spoof", ["no-git-failure", "other-repository"])
def test_spoofed_signature_gains_nothing(repo: Path, tmp_path: Path, spoof: str) -> None:
    other = tmp_path / "elsewhere/.git/worktrees/x/index.lock"
    line = ("fatal: Unable to create '$(git rev-parse --git-dir)/index.lock': Operation not permitted"
            if spoof == "no-git-failure" else f"fatal: Unable to create '{other}': Operation not permitted")
    agent = write_agent(tmp_path, f"""echo change > src/app.py
echo "{line}" >&2
exit 1""")
    res = run_exec(repo, agent)
    if spoof == "other-repository":  # not this task's git metadata: no recovery, the work is left
        assert res.verdict["recovery"] is None
        assert res.status("clean-tree") == "fail"
    else:  # it matches; the allowed work is committed and judged like any commit the agent could make
        assert res.verdict["recovery"]["committed"] == ["src/app.py"]
        assert res.code == 0


def test_spoofed_signature_with_forbidden_work_still_fails(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """echo change > src/app.py; echo '* filter=x' > .gitattributes
echo "fatal: Unable to create '$(git rev-parse --git-dir)/index.lock': Permission denied" >&2
exit 1""")
    res = run_exec(repo, agent)
    rec = res.verdict["recovery"]
    assert rec["committed"] == ["src/app.py"] and rec["left_uncommitted"] == [".gitattributes"]
    assert res.code == 1
    assert res.status("clean-tree") == "fail"
    assert ".gitattributes" in git(Path(res.verdict["worktree"]), "status", "--porcelain")


def test_roots_command(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "ccm/r", str(wt))
    lines = ccm("roots", str(wt), cwd=repo).stdout.split()
    assert lines[0] == str(wt.resolve()) and lines[1].endswith(".git/worktrees/wt")
    assert json.loads(ccm("roots", str(wt), "--json", cwd=repo).stdout)["roots"] == lines
    codex = ccm("roots", str(wt), "--format", "codex", cwd=repo).stdout.split()
    assert codex[::2] == ["--add-dir"] * (len(lines) - 1) and codex[1::2] == lines[1:]
    assert ccm("roots", str(repo), cwd=repo).stdout == ""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert ccm("roots", str(plain), cwd=repo).stdout == ""


def test_sandbox_option_errors(repo: Path) -> None:
    proc = ccm("exec", "--sandbox", "none", "--no-network", "--", "true", cwd=repo)
    assert proc.returncode == 2 and "--no-network needs the sandbox: drop --sandbox none" in proc.stderr
    assert not (Path(os.environ["CCM_GUARD_HOME"]) / "worktrees").exists()  # refused before anything was made


def test_the_sandbox_is_on_by_default(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"echo x >> {repo}/README.md 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--no-require-commit")
    assert res.verdict["sandbox"].startswith("landlock ABI") and "DENIED" in res.stderr
    assert git(repo, "status", "--porcelain") == ""
    unsandboxed = run_exec(repo, agent, "--no-require-commit", "--sandbox", "none")
    assert unsandboxed.verdict["sandbox"] == "none (--sandbox none)"


def _codex_args(repo: Path, tmp_path: Path, *options: str) -> list[str]:
    """The arguments a stand-in `codex` on PATH was given by exec (printed on its stdout,
    which --json sends to ccm-guard's stderr)."""
    fake = tmp_path / "bin" / "codex"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "arg:%s\\n" "$@"\n')
    fake.chmod(0o755)
    proc = ccm("exec", "--json", "--no-require-commit", *options, "--", "codex", "exec", "-s", "workspace-write",
               "do it", cwd=repo, env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    return [line[4:] for line in proc.stderr.splitlines() if line.startswith("arg:")]


def test_inside_the_sandbox_codex_leaves_confinement_to_it(repo: Path, tmp_path: Path) -> None:
    """Codex's own sandbox (bubblewrap) cannot start inside Landlock: ccm-guard's confines it."""
    args = _codex_args(repo, tmp_path)
    assert args == ["exec", "-c", 'sandbox_mode="danger-full-access"', "-s", "danger-full-access", "do it"]


def test_codex_profile_gets_add_dir_for_its_workspace_write_sandbox(repo: Path, tmp_path: Path) -> None:
    args = _codex_args(repo, tmp_path, "--sandbox", "none")
    assert args[0] == "exec" and args[1] == "--add-dir" and args[-3:] == ["-s", "workspace-write", "do it"]
    assert any(a.endswith("/objects") for a in args)


def test_tools_keep_their_caches_in_the_tasks_private_directory(repo: Path, tmp_path: Path) -> None:
    """pip, go and friends write ~/.cache: read-only under the sandbox, so XDG_CACHE_HOME moves."""
    agent = write_agent(tmp_path, 'mkdir -p "$XDG_CACHE_HOME/pip" && echo x > "$XDG_CACHE_HOME/pip/entry"\n'
                        'echo "$XDG_CACHE_HOME $npm_config_cache"')
    res = run_exec(repo, agent, "--no-require-commit")
    assert res.code == 0, res.stderr
    cache, npm = res.stderr.split()[:2]
    assert cache.startswith(res.verdict["log_dir"]) and npm == f"{cache}/npm"
    assert (Path(cache) / "pip" / "entry").is_file()
