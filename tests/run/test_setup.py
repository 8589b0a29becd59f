"""The setup step (`exec --setup CMD`, `setup = [...]` in the policy): run in the fresh
worktree before the agent, in its sandbox; what it leaves is not blamed on the agent; a
failing setup stops the run before the agent starts (exit 10) with its log's tail."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import ccm, git, run_exec, write_agent

from ccm_guard.prevent import sandbox

COMMIT = 'echo done > work.txt\ngit add work.txt\ngit commit -q -m "agent work"\n'


def test_what_setup_leaves_is_the_starting_point(repo: Path, tmp_path: Path) -> None:
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore build")
    agent = write_agent(tmp_path, 'test -f .venv-ready && test -f build/out.o\n' + COMMIT)
    setup = "mkdir -p build && echo obj > build/out.o && echo ready > .venv-ready"
    result = run_exec(repo, agent, "--setup", setup, "--task", "s1")
    assert result.code == 0, result.stdout + result.stderr
    assert result.verdict["setup"]["failed"] is None and result.verdict["setup"]["commands"] == [setup]
    assert result.status("clean-tree") == "pass"
    assert ccm("audit", "s1", cwd=repo).returncode == 0  # the audit knows the setup's files too


def test_the_agent_changing_a_setup_file_is_its_own_doing(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo more >> generated.txt\n" + COMMIT)
    result = run_exec(repo, agent, "--setup", "echo gen > generated.txt")
    assert result.code == 1
    assert "generated.txt" in result.gate("clean-tree")["findings"][0]["paths"]


def test_a_failing_setup_stops_the_run_before_the_agent(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "agent-ran"
    agent = write_agent(tmp_path, f"touch {marker}\n" + COMMIT)
    result = run_exec(repo, agent, "--setup", "echo 'npm ERR! missing lockfile' >&2; exit 3", "--task", "s2")
    assert result.code == 10 and result.verdict["outcome"] == "setup-failed"
    assert not marker.exists() and result.verdict["agent"] is None
    assert result.verdict["setup"]["exit_code"] == 3
    assert "npm ERR! missing lockfile" in result.verdict["setup"]["tail"]
    shown = ccm("task", "show", "s2", cwd=repo)
    assert shown.returncode == 0 and "ERRORED" in shown.stdout


def test_setup_timeout_and_its_processes_do_not_outlive_it(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, COMMIT)
    result = run_exec(repo, agent, "--setup", "sleep 300 & echo $! > daemon.pid", "--setup", "sleep 30",
                      "--setup-timeout", "1")
    assert result.code == 10 and result.verdict["setup"]["timed_out"] is True
    assert result.verdict["setup"]["failed"] == "sleep 30"
    pid = int((Path(result.verdict["worktree"]) / "daemon.pid").read_text())
    try:  # gone, or at most a zombie that a container's init has not reaped
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass


@pytest.mark.skipif(sandbox.abi() == 0, reason="this kernel has no Landlock")
def test_setup_runs_in_the_agents_sandbox(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    agent = write_agent(tmp_path, COMMIT)
    result = run_exec(repo, agent, "--setup", f"echo x > {outside}")
    assert result.code == 10 and not outside.exists()
    assert "Permission denied" in "\n".join(result.verdict["setup"]["tail"])


def test_setup_from_the_committed_policy(repo: Path, tmp_path: Path) -> None:
    (repo / ".ccm-guard.toml").write_text('setup = ["echo top > top.txt"]\n'
                                          '[roles.docs]\nextends = "implementor"\nsetup = ["echo own > own.txt"]\n')
    git(repo, "add", ".ccm-guard.toml")
    git(repo, "commit", "-q", "-m", "policy")
    agent = write_agent(tmp_path, "ls *.txt > seen.list\ngit add seen.list\ngit commit -q -m seen\n")
    for role, expected in (("implementor", "top.txt"), ("docs", "own.txt")):
        result = run_exec(repo, agent, "--role", role, "--task", f"p-{role}")
        assert result.code == 0, result.stdout + result.stderr
        seen = git(repo, "show", f"ccm/p-{role}:seen.list")
        assert seen == expected
    skipped = run_exec(repo, write_agent(tmp_path, COMMIT, "plain.sh"), "--no-setup")
    assert skipped.code == 0 and skipped.verdict["setup"] is None
    bad = ccm("exec", "--setup", "x", "--no-setup", "--", "true", cwd=repo)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_setup_that_is_not_a_list_is_a_policy_error(repo: Path) -> None:
    (repo / ".ccm-guard.toml").write_text('setup = "npm ci"\n')
    git(repo, "add", ".ccm-guard.toml")
    git(repo, "commit", "-q", "-m", "bad policy")
    proc = ccm("exec", "--", "true", cwd=repo)
    assert proc.returncode == 2 and "setup: must be a list of commands" in proc.stderr
    assert subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout.count("\n") == 1


def test_files_setup_leaves_are_not_path_policy_changes_either(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "mkdir -p tests\necho ok > tests/test_x.py\ngit add tests\ngit commit -q -m t\n")
    result = run_exec(repo, agent, "--role", "test-writer", "--setup", "echo gen > gen.txt; echo lock >> README.md")
    assert result.code == 0, result.stdout
    assert result.status("path-policy") == "pass" and result.status("clean-tree") == "pass"


def test_a_check_is_put_back_and_judged_again(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, COMMIT)
    # A check (the agent's own tests could do this) that detaches HEAD, commits, dirties a
    # setup file and leaves files: all put back, and the run is judged again afterwards.
    check = ('"${CCM_GUARD_REAL_GIT:-git}" -c core.hooksPath=/dev/null checkout -q --detach && '
             'echo EVIL > work.txt && "${CCM_GUARD_REAL_GIT:-git}" -c core.hooksPath=/dev/null commit -qam evil; '
             'echo cache >> gen.txt; echo junk > junk.txt; echo x >> README.md; exit 3')
    result = run_exec(repo, agent, "--setup", "echo gen > gen.txt", "--check", check, "--task", "c1")
    assert result.code == 0, result.stdout + result.stderr  # a failing check is reported, not a failed run
    checked = result.verdict["check"]
    assert checked["failed"] and checked["exit_code"] == 3 and checked["moved_branch"] is True
    assert sorted(checked["discarded"]) == ["README.md", "junk.txt", "work.txt"]  # work.txt: its commit
    worktree = Path(result.verdict["worktree"])
    assert (worktree / "work.txt").read_text() == "done\n" and (worktree / "gen.txt").exists()
    assert git(worktree, "symbolic-ref", "HEAD") == "refs/heads/ccm/c1"
    assert git(worktree, "status", "--porcelain") == "?? gen.txt"
    shown = ccm("exec", "--setup", "true", "--check", "exit 4", "--", str(agent), cwd=repo)
    assert "check: 'exit 4' exited 4" in shown.stdout
    assert ccm("audit", "c1", cwd=repo).returncode == 0  # the setup file as the check left it is recorded


def test_a_check_that_reshapes_the_tree_is_put_back(repo: Path, tmp_path: Path) -> None:
    """A tracked directory replaced by a link, a tracked file by a directory, and a commit
    on top of a tracked file setup had edited: all put back, setup's edit kept."""
    agent = write_agent(tmp_path, COMMIT)
    check = ('rm -rf src && ln -s /tmp src && rm README.md && mkdir README.md && echo x > README.md/inner && '
             '"${CCM_GUARD_REAL_GIT:-git}" -c core.hooksPath=/dev/null commit -qam reshaped')
    result = run_exec(repo, agent, "--setup", "echo setup-line >> work-notes.txt && git add -N work-notes.txt",
                      "--check", check, "--task", "c2")
    assert result.code == 0, result.stdout + result.stderr
    worktree = Path(result.verdict["worktree"])
    assert (worktree / "src" / "app.py").read_text() == "print('hi')\n" and not (worktree / "src").is_symlink()
    assert (worktree / "README.md").read_text() == "# project\n"
    assert (worktree / "work-notes.txt").read_text() == "setup-line\n"
    assert result.verdict["check"]["moved_branch"] is True and result.verdict["errors"] == []


def test_a_setup_file_the_agent_committed_other_bytes_for_is_the_agents(repo: Path, tmp_path: Path) -> None:
    """Setup leaves gen.py untracked; the agent commits other bytes under that name without
    touching the file on disk: the commit says SAFE = False, the work tree (and a --check
    run in it) SAFE = True. The file is no longer setup's to excuse."""
    agent = write_agent(tmp_path, """blob=$(printf 'SAFE = False\\n' | git hash-object -w --stdin)
git update-index --add --cacheinfo "100644,$blob,gen.py"
git commit -q -m "generated"
""")
    res = run_exec(repo, agent, "--setup", "printf 'SAFE = True\\n' > gen.py", "--task", "gen")
    assert git(repo, "show", "ccm/gen:gen.py") == "SAFE = False"
    paths = [p for f in res.gate("clean-tree")["findings"] for p in f["paths"]]
    assert res.code == 1 and "gen.py" in paths, res.verdict["gates"]
