"""Bad input: a one-line error naming the fix, a documented exit code, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import ccm, git, no_disk_room, write_agent

from ccm_guard import git as gitmod
from ccm_guard.agent.options import ExecOptions
from ccm_guard.errors import ExitCode, RepoError
from ccm_guard.run import exec as guard
from ccm_guard.state import home
from ccm_guard.state.registry import Registry


def assert_nothing_left(repo: Path) -> None:
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert git(repo, "for-each-ref", "refs/heads/ccm/") == ""
    common = Path(git(repo, "rev-parse", "--absolute-git-dir"))
    assert not (common / "worktrees").exists() or not any((common / "worktrees").iterdir())
    state = Path(os.environ["CCM_GUARD_HOME"])
    trees = state / "worktrees"
    assert not trees.exists() or not any(p for d in trees.iterdir() for p in d.iterdir())
    assert json.loads(ccm("task", "list", "--all", "--json", cwd=repo).stdout)["tasks"] == []


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ccm-guard: error: ")
    return lines[0]


def test_not_a_git_repository_needs_no_base(tmp_path: Path) -> None:
    """A plain directory runs in a copy (tests/copy/test_copyexec.py); a git-only option is refused."""
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = ccm("exec", "--base", "HEAD~1", "--", "true", cwd=plain)
    assert proc.returncode == ExitCode.USAGE
    assert "needs a git repository" in one_line_error(proc) and "drop --base" in proc.stderr
    assert not Path(os.environ["CCM_GUARD_HOME"], "copies").exists()  # nothing was copied


def test_bare_repository(tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    proc = ccm("exec", "--", "true", cwd=bare)
    assert proc.returncode == ExitCode.REPO
    assert "bare repository" in one_line_error(proc)


def test_repository_without_commits(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    git(tmp_path, "init", "-q", str(empty))
    proc = ccm("exec", "--", "true", cwd=empty)
    assert proc.returncode == ExitCode.REPO
    assert "no commits yet" in one_line_error(proc)


def test_base_that_does_not_resolve(repo: Path) -> None:
    proc = ccm("exec", "--base", "no-such-branch", "--", "true", cwd=repo)
    assert proc.returncode == ExitCode.REPO
    assert "--base 'no-such-branch' does not name a commit" in one_line_error(proc)
    assert_nothing_left(repo)


def test_branch_that_exists(repo: Path) -> None:
    git(repo, "branch", "ccm/taken")
    proc = ccm("exec", "--task", "taken", "--", "true", cwd=repo)
    assert proc.returncode == ExitCode.REPO
    assert "branch ccm/taken already exists" in one_line_error(proc)


def test_task_id_that_exists(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo x > f; git add f; git commit -qm x")
    assert ccm("exec", "--task", "once", "--cleanup", "--", str(agent), cwd=repo).returncode == 0
    proc = ccm("exec", "--task", "once", "--", str(agent), cwd=repo)
    assert proc.returncode == ExitCode.STATE
    assert "task once already exists" in one_line_error(proc)


def test_worktree_path_that_exists(repo: Path) -> None:
    key = home.repo_key(gitmod.discover(repo))
    squatter = Path(os.environ["CCM_GUARD_HOME"], "worktrees", key, "squat")
    squatter.mkdir(parents=True)
    proc = ccm("exec", "--task", "squat", "--", "true", cwd=repo)
    assert proc.returncode == ExitCode.REPO
    assert f"{squatter} already exists" in one_line_error(proc)
    assert git(repo, "for-each-ref", "refs/heads/ccm/") == ""


def test_missing_agent_command(repo: Path) -> None:
    proc = ccm("exec", "--", "no-such-agent-xyz", "--flag", cwd=repo)
    assert proc.returncode == int(ExitCode.NOT_FOUND) == 127
    assert "'no-such-agent-xyz' not found on PATH" in one_line_error(proc)
    assert_nothing_left(repo)


def test_agent_path_not_executable(repo: Path, tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    proc = ccm("exec", "--", str(script), cwd=repo)
    assert proc.returncode == int(ExitCode.NOT_EXECUTABLE) == 126
    assert "chmod +x" in one_line_error(proc)
    assert_nothing_left(repo)


def test_missing_command_is_a_usage_error(repo: Path) -> None:
    proc = ccm("exec", cwd=repo)
    assert proc.returncode == ExitCode.USAGE


def test_task_id_is_sanitised_into_a_safe_name(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo x > f; git add f; git commit -qm x")
    proc = ccm("exec", "--json", "--task", "../../evil; rm -rf ~ $(id)", "--", str(agent), cwd=repo)
    v = json.loads(proc.stdout)
    assert proc.returncode == 0
    assert v["task"] == "evil-rm-rf-id"
    assert v["branch"] == "ccm/evil-rm-rf-id"
    assert Path(v["worktree"]).parent.parent == Path(os.environ["CCM_GUARD_HOME"], "worktrees")


def test_not_enough_disk_is_refused_before_anything_is_made(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ExecOptions(command=["true"], start=repo, terminal=False)
    with monkeypatch.context() as patch, pytest.raises(RepoError, match="not enough disk space for the checkout"):
        no_disk_room(patch)
        guard.exec_task(opts, Registry())
    assert_nothing_left(repo)


@pytest.mark.parametrize("step", ["worktree_add_bare", "reset_hard"])
def test_ctrl_c_during_worktree_creation_leaves_nothing(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                        step: str) -> None:
    """git is interrupted half-way through making the new worktree (`worktree add
    --no-checkout`: its admin dir, under the lock) or through its checkout (what `worktree
    add` runs for it: `reset --hard`), then ccm-guard gets the Ctrl-C."""
    for i in range(400):
        (repo / f"bulk/{i:03}.txt").parent.mkdir(exist_ok=True)
        (repo / f"bulk/{i:03}.txt").write_text(f"{i}\n" * 50)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bulk")
    common = Path(git(repo, "rev-parse", "--absolute-git-dir"))

    def interrupted_add(host: gitmod.Repo, path: Path, branch: str, base: str) -> None:
        argv = [gitmod.binary(), *gitmod.HARDENING, "worktree", "add", "--no-checkout", "-b", branch, str(path), base]
        proc = subprocess.Popen(argv, env=gitmod.environment(host), cwd="/")
        while not (common / "worktrees").exists() and proc.poll() is None:
            pass
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise KeyboardInterrupt

    def interrupted_checkout(task: gitmod.Repo, rev: str = "HEAD") -> None:
        assert task.work_tree is not None
        argv = [gitmod.binary(), *gitmod.HARDENING, "reset", "--hard", "--no-recurse-submodules", rev, "--"]
        proc = subprocess.Popen(argv, env=gitmod.environment(task), cwd=task.work_tree)
        while not (task.work_tree / "bulk").exists() and proc.poll() is None:
            pass
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise KeyboardInterrupt

    opts = ExecOptions(command=["true"], start=repo, task="halfway", terminal=False)
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(gitmod, step, interrupted_add if step == "worktree_add_bare" else interrupted_checkout)
        guard.exec_task(opts, Registry())
    assert_nothing_left(repo)


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_a_policy_that_is_no_regular_file_is_refused_unread(repo: Path, tmp_path: Path, kind: str) -> None:
    policy = Path("/dev/zero")
    if kind == "fifo":
        policy = tmp_path / "policy.toml"
        os.mkfifo(policy)  # reading it would wait for a writer for ever
    elif kind == "huge":
        policy = tmp_path / "policy.toml"
        policy.write_text("# padding\n" * 200_000)
    proc = ccm("exec", "--policy", str(policy), "--", "true", cwd=repo, timeout=30)
    assert proc.returncode == ExitCode.USAGE
    line = one_line_error(proc)
    assert f"policy file {policy}" in line and ("not a regular file" in line or "over the" in line)
    assert_nothing_left(repo)


def test_a_relative_state_home_is_refused_before_anything_is_made(repo: Path) -> None:
    proc = ccm("exec", "--no-require-commit", "--", "true", cwd=repo, env={"CCM_GUARD_HOME": "state-here"})
    assert proc.returncode == ExitCode.USAGE
    assert "CCM_GUARD_HOME=state-here is a relative path" in one_line_error(proc)
    assert not (repo / "state-here").exists() and git(repo, "status", "--porcelain") == ""
    assert_nothing_left(repo)


def test_pty_without_a_terminal_is_refused_before_anything_is_made(repo: Path) -> None:
    proc = ccm("exec", "--pty", "--no-require-commit", "--", "true", cwd=repo)  # stdin and stdout are pipes
    assert proc.returncode == ExitCode.USAGE
    assert "--pty needs a terminal" in one_line_error(proc)
    assert_nothing_left(repo)


@pytest.mark.parametrize("base", ["^HEAD", "HEAD..HEAD", "HEAD^@"])
def test_a_base_that_names_no_single_commit(repo: Path, base: str) -> None:
    proc = ccm("exec", "--base", base, "--", "true", cwd=repo)
    assert proc.returncode == ExitCode.REPO
    assert f"--base {base!r} does not name a commit" in one_line_error(proc)
    assert_nothing_left(repo)


@pytest.mark.parametrize("args", [("exec", "--bogus", "--", "true"), ("exec",), ("no-such-command",),
                                  ("task", "show"), ("exec", "--timeout", "soon", "--", "true")])
def test_click_usage_errors_are_one_line(repo: Path, args: tuple[str, ...]) -> None:
    proc = ccm(*args, cwd=repo)
    assert proc.returncode == ExitCode.USAGE
    assert "--help" in one_line_error(proc)
    assert_nothing_left(repo)


def test_a_timeout_wins_over_the_unfinished_work_it_explains_but_not_over_a_security_finding(
        repo: Path, tmp_path: Path) -> None:
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\necho half > half.txt\nsleep 30\n")
    slow.chmod(0o755)
    proc = ccm("exec", "--sandbox", "none", "--timeout", "1", "--json", "--", str(slow), cwd=repo)
    verdict = json.loads(proc.stdout)
    assert proc.returncode == ExitCode.AGENT_TIMEOUT, verdict["gates"]
    assert {g["name"] for g in verdict["gates"] if g["status"] == "fail"} == {"new-commit", "clean-tree"}
    moving = tmp_path / "moving.sh"
    moving.write_text('#!/bin/sh\n"${CCM_GUARD_REAL_GIT:-git}" -c core.hooksPath=/dev/null tag sneaky\nsleep 30\n')
    moving.chmod(0o755)
    proc = ccm("exec", "--sandbox", "none", "--timeout", "1", "--json", "--", str(moving), cwd=repo)
    assert proc.returncode == ExitCode.GATES_FAILED
    assert json.loads(proc.stdout)["exit_code"] == 1


def test_a_role_only_in_the_uncommitted_policy_says_exec_reads_the_committed_one(repo: Path) -> None:
    (repo / ".ccm-guard.toml").write_text('[roles.docs]\nextends = "implementor"\nallow = ["docs/"]\n')
    assert ccm("policy", "check", cwd=repo).returncode == 0  # the file itself is fine
    proc = ccm("exec", "--role", "docs", "--", "true", cwd=repo)
    assert proc.returncode == ExitCode.USAGE
    line = one_line_error(proc)
    assert "working-tree .ccm-guard.toml differs" in line and "exec reads the committed policy" in line
    assert_nothing_left(repo)


def test_audit_of_an_unknown_task_is_a_state_error(repo: Path) -> None:
    proc = ccm("audit", "nope", cwd=repo)
    assert proc.returncode == ExitCode.STATE == ccm("task", "show", "nope", cwd=repo).returncode
    assert "no task 'nope'" in one_line_error(proc) and "task list --all" in proc.stderr


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "foreign schema"])
def test_a_damaged_registry_says_how_to_start_again(repo: Path, tmp_path: Path, damage: str) -> None:
    import sqlite3

    state = Path(os.environ["CCM_GUARD_HOME"])
    db = state / "registry.db"
    if damage == "truncated":
        assert ccm("exec", "--task", "t", "--", "true", cwd=repo).returncode == 1  # a real registry first
        for extra in ("registry.db-wal", "registry.db-shm"):
            (state / extra).unlink(missing_ok=True)
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    else:
        state.mkdir(parents=True, exist_ok=True)
        if damage == "random bytes":
            db.write_bytes(os.urandom(4096))
        else:
            with sqlite3.connect(db) as conn:
                conn.execute("CREATE TABLE tasks (id TEXT)")
    for args in (("task", "list"), ("exec", "--", "true")):
        proc = ccm(*args, cwd=repo)
        assert proc.returncode == ExitCode.STATE, proc.stderr
        line = one_line_error(proc)
        assert "is damaged" in line and f"mv {db} {db}.damaged" in line


def test_an_empty_task_list_says_where_to_look_next(repo: Path) -> None:
    out = ccm("task", "list", cwd=repo).stdout.strip()
    assert out == (f"no tasks in {repo} (--all shows finished ones) (--all-repos shows other repositories)")
