"""Class 9: exhausting resources, bounded so that the test machine survives.

ccm-guard must still give a verdict, in bounded time and size: objects and large files
are tracked by identity (never hashed twice), the human verdict lists a bounded number
of findings and paths, and the agent's processes are stopped by the timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from adv import COMMIT, with_policy
from conftest import git, make_repo, run_exec, small_tmpfs, write_agent


def test_a_huge_file_is_measured_against_the_roles_limit(repo: Path, tmp_path: Path) -> None:
    policy = with_policy(tmp_path, "[roles.implementor.limits]\nmax_file_bytes = 10_000_000\n")
    agent = write_agent(tmp_path, "truncate -s 64M blob.bin; git add blob.bin; git commit -q -m 'a data file'")
    res = run_exec(repo, agent, "--sandbox", "none", "--policy", str(policy), "--task", "huge", timeout=120)
    assert git(repo, "cat-file", "-s", "ccm/huge:blob.bin") == str(64 << 20)
    assert res.code == 1
    assert f"the largest file, 'blob.bin', has {64 << 20} bytes; the limit is 10000000" in res.reasons("limits")


def test_a_large_file_committed_then_removed_still_counts(repo: Path, tmp_path: Path) -> None:
    """Added in one commit, removed in the next: the work tree ends small, but a merge
    brings the 3 MB blob into the person's history."""
    policy = with_policy(tmp_path, "[roles.implementor.limits]\nmax_file_bytes = 100_000\n")
    agent = write_agent(tmp_path, """head -c 3000000 /dev/urandom > blob.bin; git add blob.bin; git commit -q -m add
git rm -q blob.bin; git commit -q -m rm; echo s > s.txt; git add s.txt; git commit -q -m s""")
    res = run_exec(repo, agent, "--policy", str(policy), "--task", "big")
    assert res.code == 1 and res.status("limits") == "fail"
    assert "'blob.bin', has 3000000 bytes" in res.reasons("limits")


def test_twenty_thousand_files_get_a_short_human_verdict(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
python3 -c "
import os
for d in range(20):
    os.makedirs(f'gen/{{d}}')
    for i in range(1000):
        open(f'gen/{{d}}/{{i}}.txt', 'w').close()" """)
    proc = subprocess.run([sys.executable, "-m", "ccm_guard", "exec", "--sandbox", "none", "--task", "many", "--", str(agent)], cwd=repo,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 1
    assert "20000 untracked file(s) left behind" in proc.stdout
    assert "... and 19980 more" in proc.stdout
    assert len(proc.stdout.splitlines()) < 100


def test_thousands_of_files_planted_in_the_git_dir_get_a_short_human_verdict(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
python3 -c "
import os
d = '{repo}/.git/rr-cache/junk'
os.makedirs(d)
for i in range(3000):
    open(f'{{d}}/{{i}}', 'w').close()" """)
    proc = subprocess.run([sys.executable, "-m", "ccm_guard", "exec", "--sandbox", "none", "--", str(agent)], cwd=repo,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 1
    assert "rr-cache/junk/" in proc.stdout and "FAIL    git-metadata" in proc.stdout
    assert "more findings (--json lists all)" in proc.stdout
    assert len(proc.stdout.splitlines()) < 120, proc.stdout[-2000:]


# 1200 levels of `dddd/` (past PATH_MAX) under the directory given, then a file `evil`.
DEEP_TREE = """python3 -c "
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(1200):
    os.mkdir('dddd', dir_fd=fd)
    fd = os.open('dddd', os.O_RDONLY, dir_fd=fd)
os.close(os.open('evil', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\""""


def test_a_directory_tree_deeper_than_path_max_in_the_git_dir(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
mkdir {repo}/.git/deep
{DEEP_TREE} {repo}/.git/deep""")
    try:
        res = run_exec(repo, agent, "--sandbox", "none", timeout=120)
        assert res.code == 1 and res.status("git-metadata") == "fail"
        assert "deep" in " ".join(p for f in res.gate("git-metadata")["findings"] for p in f["paths"])
    finally:
        _remove_deep(repo / ".git" / "deep")


def _remove_deep(path: Path) -> None:
    # rm, not shutil.rmtree: pytest's own clean-up of old temp dirs recurses and fails on it.
    subprocess.run(["rm", "-rf", "--", str(path)], check=False)


def test_a_directory_tree_deeper_than_path_max_in_the_worktree(repo: Path, tmp_path: Path) -> None:
    """A stated limitation: git itself cannot name a file that deep, so `git status` (and with it
    clean-tree and the archive) does not see it; nor can it be committed. It stays on disk."""
    agent = write_agent(tmp_path, f"""{COMMIT}
mkdir deep
{DEEP_TREE} deep""")
    res = run_exec(repo, agent, "--sandbox", "none", timeout=120)
    fd = os.open(Path(res.verdict["worktree"], "deep"), os.O_RDONLY)
    for _ in range(1200):
        fd, old = os.open("dddd", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    assert "evil" in os.listdir(fd)  # it is there ...
    os.close(fd)
    assert git(Path(res.verdict["worktree"]), "status", "--porcelain", "--untracked-files=all") == ""  # ... git sees nothing
    assert res.status("clean-tree") == "pass" and res.code == 0
    _remove_deep(Path(res.verdict["worktree"], "deep"))


def test_filling_the_disk_still_gives_a_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by this suite: the registry write failed and exec ended in a traceback."""
    with small_tmpfs(tmp_path / "small", "120m") as small:
        repo = make_repo(small / "repo")
        monkeypatch.setenv("CCM_GUARD_HOME", str(small / "state"))
        agent = write_agent(tmp_path, f"""{COMMIT}
dd if=/dev/zero of=fill bs=1M 2>/dev/null || true
df -k . >&2""")
        res = run_exec(repo, agent, "--sandbox", "none", timeout=120)
        assert "fill" in [f for f in os.listdir(res.verdict["worktree"])]
        assert os.statvfs(small).f_bavail < 16  # the disk really was full
        assert res.code == 1 and res.status("clean-tree") == "fail"
        assert "fill" in " ".join(p for f in res.gate("clean-tree")["findings"] for p in f["paths"])


def test_a_fork_bomb_is_stopped_by_the_timeout(repo: Path, tmp_path: Path) -> None:
    """Bounded: 2^8 processes at most (ulimit -u also caps it where it applies, not as root)."""
    pids = tmp_path / "pids"
    agent = write_agent(tmp_path, f"""ulimit -u 4096 2>/dev/null || true
bomb() {{ read -r me _ < /proc/self/stat; echo $me >> {pids}; if [ "$1" -gt 0 ]; then bomb $(($1 - 1)) & bomb $(($1 - 1)) & fi; sleep 60; }}
bomb 7""")
    res = run_exec(repo, agent, "--sandbox", "none", "--timeout", "3", "--grace", "0.5", "--no-require-commit", timeout=120)
    assert res.verdict["agent"]["timed_out"] is True
    assert res.code == 4
    started = {int(p) for p in pids.read_text().split()}
    assert len(started) > 100
    survivors = []
    for pid in started:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"agent.sh" in cmd:
            survivors.append(pid)
    assert survivors == []
