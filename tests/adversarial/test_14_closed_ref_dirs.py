"""Ref directories closed to a sandboxed agent, which its run's snapshots keep by identity
rather than read (detect/refdirs.py): the agent cannot write there, a change someone
else makes there meanwhile is still named, and the one thing not seen, a ref file
rewritten in place from outside the sandbox, is pinned down as the limitation it is."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from adv import COMMIT, needs_landlock
from conftest import git, make_repo, run_exec, spawn_exec, write_agent

MANY = 100  # more than refdirs.SMALL: the directory is kept by identity, not listed


def _repo_with_many_branches(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo")
    lines = "".join(f"create refs/heads/bench/r{i:04d} HEAD\n" for i in range(MANY))
    subprocess.run(["git", "-c", "core.logAllRefUpdates=true", "update-ref", "--stdin"], cwd=repo, input=lines,
                   text=True, check=True)
    time.sleep(2.2)  # settled for two seconds: kept by identity from the first snapshot on
    return repo


def _kept(tmp_path: Path) -> bool:
    return len(list((tmp_path / "state" / "refdirs").glob("*-*.json"))) >= 2


@needs_landlock
def test_a_sandboxed_agent_cannot_move_a_branch_in_a_directory_kept_by_identity(tmp_path: Path) -> None:
    repo = _repo_with_many_branches(tmp_path)
    before = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    agent = write_agent(tmp_path, f"""{COMMIT}
common=$(rgit rev-parse --git-common-dir)
new=$(rgit rev-parse HEAD)
printf '%s\\n' "$new" > "$common/refs/heads/bench/r0001" 2>/dev/null && echo wrote >> "$TMPDIR/done" || true
rgit update-ref refs/heads/bench/r0002 "$new" 2>/dev/null && echo moved >> "$TMPDIR/done" || true
rgit update-ref refs/heads/bench/new "$new" 2>/dev/null && echo made >> "$TMPDIR/done" || true
rm -f "$common/refs/heads/bench/r0003" 2>/dev/null || true
echo tried >> "$TMPDIR/done"
""")
    res = run_exec(repo, agent)
    assert res.code == 0, res.stdout + res.stderr  # the attack never happened; the work passes
    assert _kept(tmp_path)
    after = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    assert {line for line in after.splitlines() if "bench" in line} == \
           {line for line in before.splitlines() if "bench" in line}
    done = next((tmp_path / "state").rglob("done")).read_text()
    assert done == "tried\n", done  # every write was refused by the sandbox


@needs_landlock
def test_a_branch_rewritten_in_place_from_outside_the_sandbox_is_the_limitation(tmp_path: Path) -> None:
    """A process outside the sandbox (as an agent that reached the person's server through
    a socket could use) that rewrites a ref file in a closed directory in place, not in
    git's way, is not named; the same move made by git is, and so, then, is the earlier
    one (the directory's listing is read again)."""
    repo = _repo_with_many_branches(tmp_path)
    git(repo, "commit", "-q", "--allow-empty", "-m", "elsewhere")
    elsewhere = git(repo, "rev-parse", "HEAD")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    results = {}
    for how in ("in-place", "git"):
        gate = tmp_path / f"go-{how}"
        agent = write_agent(tmp_path, f"""touch "$TMPDIR/started"; while [ ! -e {gate} ]; do sleep 0.05; done
{COMMIT}""", name=f"{how}.sh")
        proc = spawn_exec(repo, "--json", "--task", how, "--", str(agent))
        try:
            deadline = time.monotonic() + 60
            while not list((tmp_path / "state").rglob(f"*{how}*/agent/tmp/started")):
                assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
                time.sleep(0.05)
            ref = "refs/heads/bench/r0010" if how == "in-place" else "refs/heads/bench/r0011"
            if how == "in-place":
                with open(repo / ".git" / ref, "r+") as fh:  # same inode, same directory identity
                    fh.write(elsewhere + "\n")
            else:
                git(repo, "update-ref", ref, elsewhere)
        finally:
            gate.touch()
            out, _ = proc.communicate(timeout=60)
        results[how] = (proc.returncode, out)
        assert git(repo, "rev-parse", ref) == elsewhere  # it did move, as git sees it
    assert _kept(tmp_path)
    code, out = results["in-place"]
    assert code == 0 and "r0010" not in out, out  # the limitation: not seen
    code, out = results["git"]
    assert code != 0 and "refs/heads/bench/r0011 moved" in out, out
    assert "refs/heads/bench/r0010 moved" in out, out


@needs_landlock
def test_a_sandboxed_agents_chmod_in_a_closed_directory(tmp_path: Path) -> None:
    """Landlock governs writes, not chmod. In a directory listed in the snapshot itself (one
    of fewer than 64 entries, as in most repositories) a mode the agent changed on a reflog
    is named, as before; in one kept by identity it is not (the limitation: a chmod changes
    no directory's identity). Either way no ref moves and nothing runs; the person's next
    update of that ref fails with git's own message naming the file."""
    repo = _repo_with_many_branches(tmp_path)
    agent = write_agent(tmp_path, f"""{COMMIT}
common=$(rgit rev-parse --git-common-dir)
chmod 444 "$common/logs/refs/heads/bench/r0001" "$common/logs/refs/heads/main"
""")
    res = run_exec(repo, agent)
    assert _kept(tmp_path)
    common = repo / ".git"
    assert (common / "logs/refs/heads/main").stat().st_mode & 0o777 == 0o444  # it happened
    assert (common / "logs/refs/heads/bench/r0001").stat().st_mode & 0o777 == 0o444
    assert res.code != 0 and "logs/refs/heads/main" in res.stdout, res.stdout
    assert "bench/r0001" not in res.stdout  # the limitation
