"""`ccm-guard exec` end to end: real repositories, real scripted agents, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, git, make_repo, run_exec, spawn_exec, state_of, write_agent

COMMIT = 'echo "$1" > "${2:-work.txt}"; git add -A; git commit -q -m "agent work"'


def person_view(repo: Path) -> dict[str, str]:
    state = state_of(repo)
    state["refs"] = "\n".join(line for line in state["refs"].splitlines() if "refs/heads/ccm/" not in line)
    # The one shared setting exec makes, so that each task's hooks apply to its worktree only.
    state["config"] = state["config"].replace("[extensions]\n\tworktreeConfig = true\n", "")
    return state


def test_good_agent_passes_in_its_own_worktree_and_leaves_the_checkout_alone(repo: Path, tmp_path: Path) -> None:
    before = person_view(repo)
    agent = write_agent(tmp_path, 'pwd; echo hello > work.txt; git add work.txt; git commit -q -m "add work"')
    res = run_exec(repo, agent, "--task", "t1")

    assert res.code == 0, res.stdout + res.stderr
    v = res.verdict
    assert v["passed"] and v["outcome"] == "pass"
    assert v["branch"] == "ccm/t1"
    assert v["base"] == git(repo, "rev-parse", "main")
    assert [c["subject"] for c in v["commits"]] == ["add work"]
    assert v["files"] == [{"path": "work.txt", "added": 1, "deleted": 0}]
    assert {g["name"]: g["status"] for g in v["gates"]} == {
        "processes": "pass", "git-metadata": "pass", "refs-untouched": "pass",
        "main-checkout": "pass", "new-commit": "pass", "path-policy": "pass", "limits": "pass",
        "clean-tree": "pass",
    }
    worktree = Path(v["worktree"])
    assert res.stderr.splitlines()[0] == str(worktree)  # the agent's stdout: ccm-guard's stderr under --json
    assert str(worktree).startswith(os.environ["CCM_GUARD_HOME"])
    assert (worktree / "work.txt").read_text() == "hello\n"
    assert git(worktree, "symbolic-ref", "HEAD") == "refs/heads/ccm/t1"
    assert git(repo, "rev-parse", "ccm/t1") == v["head"]
    assert person_view(repo) == before
    assert not (repo / "work.txt").exists()


def test_uncommitted_and_untracked_work_fails_clean_tree(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f'{COMMIT.replace("$1", "done")}\necho more >> README.md\necho new > stray.txt')
    res = run_exec(repo, agent)
    assert res.code == 1
    assert res.status("clean-tree") == "fail"
    paths = [p for f in res.gate("clean-tree")["findings"] for p in f["paths"]]
    assert sorted(paths) == ["README.md", "stray.txt"]
    assert res.status("new-commit") == "pass"


def test_agent_that_does_not_commit_fails_new_commit(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, "true"))
    assert res.code == 1
    assert res.status("new-commit") == "fail"
    assert "no new commit" in res.reasons("new-commit")
    no_req = run_exec(repo, write_agent(tmp_path, "true"), "--no-require-commit")
    assert no_req.code == 0 and "new-commit" not in [g["name"] for g in no_req.verdict["gates"]]


def test_read_only_run_may_not_move_head(repo: Path, tmp_path: Path) -> None:
    reviewer = write_agent(tmp_path, "git log --oneline > /dev/null; cat README.md > /dev/null", "review.sh")
    ok = run_exec(repo, reviewer, "--read-only")
    assert ok.code == 0
    assert ok.status("head-frozen") == "pass"

    sneaky = write_agent(tmp_path, COMMIT.replace("$1", "x"), "sneaky.sh")
    res = run_exec(repo, sneaky, "--read-only")
    assert res.code == 1
    assert res.status("head-frozen") == "fail"
    assert "moved" in res.reasons("head-frozen")


def test_agent_committing_to_main_fails_refs_untouched(repo: Path, tmp_path: Path) -> None:
    main_before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT.replace('$1', 'x')}\nrgit update-ref refs/heads/main HEAD\nrgit tag sneaky")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") != main_before  # the attack happened
    assert res.code == 1
    assert res.status("refs-untouched") == "fail"
    reasons = res.reasons("refs-untouched")
    assert "refs/heads/main moved" in reasons
    assert "refs/tags/sneaky was created" in reasons


def test_editing_config_and_a_shared_hook_fails_git_metadata_and_stops_git(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT.replace('$1', 'x')}
common=$(git rev-parse --git-common-dir)
mkdir -p "$common/hooks"; printf '#!/bin/sh\\necho pwned\\n' > "$common/hooks/post-merge"; chmod +x "$common/hooks/post-merge"
rgit config core.fsmonitor "$common/hooks/post-merge"
rgit config user.name Mallory""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert not (repo / ".git/hooks/post-merge").exists()  # moved aside, where the person can read it
    assert Path(res.verdict["log_dir"], "quarantine", "hooks", "post-merge").is_file()
    assert res.code == 1
    reasons = res.reasons("git-metadata")
    assert "hooks/post-merge was added" in reasons
    assert "DANGEROUS (runs code or steers git) core.fsmonitor" in reasons
    assert "user.name: (unset) -> 'Mallory'" in reasons
    # From then on ccm-guard runs no git on the repository: the git gates say so.
    assert res.status("clean-tree") == "skipped"
    assert "refusing to run git" in res.gate("clean-tree")["note"]
    assert any("git was not run" in e for e in res.verdict["errors"])


def test_concurrent_person_work_in_main_is_a_warning_not_a_failure(repo: Path, tmp_path: Path) -> None:
    """The person commits to main and edits files while the agent runs."""
    flag, started = tmp_path / "go", tmp_path / "started"
    agent = write_agent(tmp_path, f"""touch {started}; while [ ! -e {flag} ]; do sleep 0.05; done
{COMMIT.replace('$1', 'agent')}""")
    proc = spawn_exec(repo, "--sandbox", "none", "--json", "--", str(agent))
    while not started.exists():
        time.sleep(0.05)
    (repo / "mine.txt").write_text("person\n")
    git(repo, "add", "mine.txt")
    git(repo, "commit", "-q", "-m", "person's own commit")
    (repo / "README.md").write_text("edited by the person\n")
    flag.touch()
    out, err = proc.communicate(timeout=60)
    v = json.loads(out)
    assert proc.returncode == 0, out + err
    gates = {g["name"]: g for g in v["gates"]}
    assert gates["refs-untouched"]["status"] == "warn"
    assert "refs/heads/main" in gates["refs-untouched"]["findings"][0]["paths"]
    assert gates["main-checkout"]["status"] == "warn"
    touched = [p for f in gates["main-checkout"]["findings"] for p in f["paths"]]
    assert "README.md" in touched


def test_four_agents_at_once_on_one_repository_all_pass(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"sleep 0.5\n{COMMIT.replace('$1', '$CCM_GUARD_TASK')}")
    procs = [
        spawn_exec(repo, "--sandbox", "none", "--json", "--task", f"par{i}", "--", str(agent))
        for i in range(4)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, out + err
    heads = {git(repo, "rev-parse", f"ccm/par{i}") for i in range(4)}
    assert len(heads) == 4


def test_on_fail_discard_archives_everything_then_removes(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT.replace('$1', 'committed')}\necho dirty >> README.md\necho new > untracked.txt")
    res = run_exec(repo, agent, "--task", "gone", "--on-fail", "discard")
    assert res.code == 1
    v = res.verdict
    assert v["archive"] == "refs/ccm-guard/archive/gone"
    assert v["disposition"] == "removed after archiving"
    assert not Path(v["worktree"]).exists()
    assert git(repo, "branch", "--list", "ccm/gone") == ""
    archived = git(repo, "ls-tree", "-r", "--name-only", "refs/ccm-guard/archive/gone").split()
    assert sorted(archived) == ["README.md", "src/app.py", "untracked.txt", "work.txt"]
    assert git(repo, "show", "refs/ccm-guard/archive/gone:README.md").endswith("dirty")
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/gone^") == v["head"]  # the commit is kept too
    show = ccm("task", "show", "gone", "--json", cwd=repo)
    assert json.loads(show.stdout)["status"] == "DISCARDED"
    assert any("restore" in s for s in v["next_steps"])


def test_cleanup_on_pass_archives_the_branch_tip_and_removes(repo: Path, tmp_path: Path) -> None:
    res = run_exec(repo, write_agent(tmp_path, COMMIT.replace("$1", "x")), "--task", "done", "--cleanup")
    assert res.code == 0
    v = res.verdict
    assert not Path(v["worktree"]).exists()
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/done") == v["head"]
    assert json.loads(ccm("task", "show", "done", "--json", cwd=repo).stdout)["status"] == "CLEANED_UP"
    assert "ccm/done" not in git(repo, "branch", "--list")


def test_agent_environment_is_scrubbed(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "env")  # to its stdout: under --json, ccm-guard's stderr
    env = {"SSH_AUTH_SOCK": "/tmp/agent.sock", "TMUX": "/tmp/tmux,1,0", "DOCKER_HOST": "unix:///x",
           "GIT_DIR": "/elsewhere", "CCM_GUARD_SKIP": "1", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/x",
           "KEEP_ME": "yes", "MY_TOKEN": "t"}
    res = run_exec(repo, agent, "--no-require-commit", "--pass-env", "DOCKER_HOST", env=env)
    seen = dict(line.split("=", 1) for line in res.stderr.splitlines() if "=" in line)
    for name in ("SSH_AUTH_SOCK", "TMUX", "GIT_DIR", "CCM_GUARD_SKIP", "DBUS_SESSION_BUS_ADDRESS"):
        assert name not in seen
    assert seen["DOCKER_HOST"] == "unix:///x"  # passed through explicitly
    assert seen["KEEP_ME"] == "yes"
    assert seen["CCM_GUARD_TASK"] and seen["CCM_GUARD_BRANCH"].startswith("ccm/")


def test_who_commits_reaches_the_agent_and_its_commit_uses_it(repo: Path, tmp_path: Path) -> None:
    """CI, containers and Nix say who commits through the environment or GIT_CONFIG_GLOBAL."""
    Path(os.environ["HOME"], ".gitconfig").unlink()  # no ~/.gitconfig: only the environment says who
    config = tmp_path / "ci-gitconfig"
    config.write_text("[user]\n\temail = ci@example.com\n")
    agent = write_agent(tmp_path, "echo x > x.txt; git add x.txt; git commit -q -m x")
    env = {"GIT_AUTHOR_NAME": "CI Bot", "GIT_COMMITTER_NAME": "CI Bot", "GIT_CONFIG_GLOBAL": str(config)}
    res = run_exec(repo, agent, env=env)
    assert res.code == 0, res.stdout
    assert res.verdict["refusals"] == []
    assert git(repo, "log", "-1", "--format=%an <%ae>", res.verdict["branch"]) == "CI Bot <ci@example.com>"
    assert res.verdict["identity"] == "CI Bot <ci@example.com>"  # the verdict says who the commits are by


def test_no_identity_anywhere_is_said_plainly(repo: Path, tmp_path: Path) -> None:
    Path(os.environ["HOME"], ".gitconfig").write_text("[user]\n\tuseConfigOnly = true\n")  # no guessing
    agent = write_agent(tmp_path, "echo x > x.txt; git add x.txt; git commit -q -m x")
    res = run_exec(repo, agent)
    assert res.code != 0 and res.verdict["commits"] == []
    assert any("no identity for commits" in note and "git config --global user.name" in note
               for note in res.verdict["notes"])


def test_a_commit_that_failed_for_want_of_an_identity_says_how_to_fix_it(repo: Path, tmp_path: Path) -> None:
    """Whatever the agent's CLI shows of git's error, git's own trace has it."""
    agent = write_agent(tmp_path, "echo x > x.txt; git add x.txt; git -c user.name= commit -q -m x 2>/dev/null")
    res = run_exec(repo, agent)
    assert res.code != 0
    assert any("commit failed: git has no identity" in note for note in res.verdict["notes"]), res.verdict["notes"]


def test_human_verdict_names_the_failed_gate_and_next_steps(repo: Path, tmp_path: Path) -> None:
    proc = ccm("exec", "--task", "human", "--", str(write_agent(tmp_path, "echo leftover > x.txt")), cwd=repo)
    assert proc.returncode == 1
    out = proc.stdout
    assert "ccm-guard: FAIL  task human  branch ccm/human" in out
    assert "FAIL    clean-tree" in out and "x.txt" in out
    assert "FAIL    new-commit" in out
    assert "check again: ccm-guard audit human" in out


def test_agent_exit_code_is_reported_when_gates_pass(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT.replace('$1', 'x')}\nexit 3")
    res = run_exec(repo, agent)
    assert res.code == 3
    assert res.verdict["agent"]["exit_code"] == 3
    assert res.verdict["outcome"] == "agent-failed"


def test_task_list_and_show(repo: Path, tmp_path: Path) -> None:
    run_exec(repo, write_agent(tmp_path, COMMIT.replace("$1", "x")), "--task", "listed")
    listing = ccm("task", "list", cwd=repo)
    assert "listed" in listing.stdout and "COMMITTED" in listing.stdout
    rows = json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"]
    assert [r["id"] for r in rows] == ["listed"]
    shown = ccm("task", "show", "listed", cwd=repo).stdout
    assert "verdict:" in shown and "pass" in shown
    missing = ccm("task", "show", "nope", cwd=repo)
    assert missing.returncode == 7 and "ccm-guard task list --all" in missing.stderr


def test_task_list_shows_the_repository_you_are_in(repo: Path, tmp_path: Path) -> None:
    other = make_repo(tmp_path / "other")
    agent = write_agent(tmp_path, COMMIT.replace("$1", "x"))
    run_exec(repo, agent, "--task", "here")
    run_exec(other, agent, "--task", "there")
    here = ccm("task", "list", cwd=repo).stdout
    assert "here" in here and "there" not in here and "AGE" in here and "worktree" in here
    assert [r["id"] for r in json.loads(ccm("task", "list", "--json", cwd=repo).stdout)["tasks"]] == ["here"]
    everywhere = ccm("task", "list", "--all-repos", cwd=repo).stdout
    assert "here" in everywhere and "there" in everywhere and "REPO" in everywhere and str(other) in everywhere
    outside = tmp_path / "plain"
    outside.mkdir()
    assert {r["id"] for r in json.loads(ccm("task", "list", "--json", cwd=outside).stdout)["tasks"]} == {"here", "there"}


def test_exec_from_a_linked_worktree_of_the_person(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    mine = tmp_path / "mine"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(mine))
    res = run_exec(mine, write_agent(tmp_path, COMMIT.replace("$1", "x")))
    assert res.code == 0, res.stdout + res.stderr
    assert res.verdict["base"] == git(mine, "rev-parse", "feature")


def test_the_shim_and_hooks_refuse_and_the_verdict_lists_it(repo: Path, tmp_path: Path) -> None:
    """Prevention: git push and moving main are refused on the spot, by the shim and by the
    reference-transaction hook even when the agent runs the real git by path."""
    main_before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT.replace('$1', 'x')}
git push origin HEAD 2> push.err || echo "push refused: $?" >> "$HOME/log"
"$CCM_GUARD_REAL_GIT" update-ref refs/heads/main HEAD 2> ref.err || echo "update-ref refused" >> "$HOME/log"
rm -f push.err ref.err""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main_before
    log = (Path(os.environ["HOME"]) / "log").read_text()
    assert "push refused: 1" in log and "update-ref refused" in log
    ops = [(r.get("source", "shim"), r["op"]) for r in res.verdict["refusals"]]
    assert ("shim", "remote") in ops and ("hook", "ref-write") in ops
    assert len(res.verdict["refusals"]) == 2
    assert res.code == 0  # nothing got through, so the run itself is clean


def _printed_commands(verdict: dict[str, Any]) -> list[str]:
    """The next steps a verdict prints that are commands (after their label)."""
    return [step.split(":", 1)[1].split("   (")[0].strip() for step in verdict["next_steps"]
            if not step.startswith(("inspect:", "first:"))]


UNTRUSTING = '\nrgit config -f "$(git rev-parse --git-common-dir)/config" core.fsmonitor true\n'


@pytest.mark.parametrize("case", ["passed", "failed", "applied", "removed", "untrusted"])
def test_every_printed_next_step_runs(repo: Path, tmp_path: Path, case: str) -> None:
    body = COMMIT.replace("$1", "x") + ("\necho junk > junk.txt\n" if case in ("failed", "removed") else "") \
        + (UNTRUSTING if case == "untrusted" else "")
    options = {"applied": ["--apply"], "removed": ["--on-fail", "discard"], "untrusted": ["--sandbox", "none"]}.get(
        case, [])
    res = run_exec(repo, write_agent(tmp_path, body), "--task", "t1", *options)
    commands = _printed_commands(res.verdict)
    assert commands, res.verdict["next_steps"]
    elsewhere = tmp_path / "elsewhere"  # printed commands work from anywhere
    elsewhere.mkdir()
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=elsewhere, capture_output=True, text=True,
                              env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        # audit of a failing task reports the failure (1); anything else must just work
        assert proc.returncode in ((0, 1) if "audit" in command else (0,)), (command, proc.stderr)
        assert "error:" not in proc.stderr, (command, proc.stderr)
    if case == "untrusted":  # no step may send the person into the repository with git first
        assert res.verdict["next_steps"][0].startswith("first:   run no git in")
        assert not any(step.startswith(("inspect:", "discard:")) for step in res.verdict["next_steps"])


def test_judging_is_imported_while_the_agent_runs_not_before(repo: Path, tmp_path: Path) -> None:
    """exec imports the gates, recovery and disposal on a thread once the agent is running
    (run.exec.import_judging): none of them may be imported before, or the agent's time
    no longer hides them."""
    agent = write_agent(tmp_path, "echo hi > hi.txt; git add hi.txt; git commit -q -m hi")
    seen = tmp_path / "seen.json"
    code = f"""
import json, sys
from ccm_guard.agent import runner
from ccm_guard.run.exec import JUDGING_MODULES
heavy = (*JUDGING_MODULES, "ccm_guard.detect.gates", "ccm_guard.detect.context", "ccm_guard.cli.render",
         # and what a plain repository does not need: no pool, no .worktreeinclude, no other command
         "ccm_guard.pool", "ccm_guard.worktree.include", "ccm_guard.cli.demo", "ccm_guard.cli.task", "hashlib")
real = runner.run
def run(*args, **kwargs):
    with open({str(seen)!r}, "w") as f:
        json.dump(sorted(m for m in heavy if m in sys.modules), f)
    return real(*args, **kwargs)
runner.run = run
from ccm_guard.cli import main
main(["exec", "--json", "--", {str(agent)!r}], prog_name="ccm-guard")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcome"] == "pass"
    assert json.loads(seen.read_text()) == []


def test_the_include_file_exec_looks_for_is_the_one_the_copier_reads() -> None:
    from ccm_guard.run import exec as running
    from ccm_guard.worktree import include

    assert running.INCLUDE_FILE == include.INCLUDE_FILE


def test_a_split_index_repository_runs_clean(repo: Path, tmp_path: Path) -> None:
    """core.splitIndex: git writes the index's shared half (sharedindex.<id>) beside it,
    in the task's admin dir as in the person's git dir; that is the index, not a planted
    file (it failed git-metadata)."""
    git(repo, "config", "core.splitIndex", "true")
    git(repo, "update-index", "--split-index")
    agent = write_agent(tmp_path, COMMIT.replace("$1", "split"))
    res = run_exec(repo, agent)
    assert res.code == 0, res.stdout + res.stderr
    assert list((repo / ".git" / "worktrees").glob("*/sharedindex.*")), "git wrote no shared index for the task"
    assert res.status("git-metadata") == "pass" and res.status("clean-tree") == "pass"


def test_the_persons_pack_refs_during_a_sandboxed_run_does_not_stop_its_commit(repo: Path, tmp_path: Path) -> None:
    """`git pack-refs --all` packs the task's branch and prunes the ref directory it
    emptied: refs/heads/ccm/, the very directory the sandbox granted the agent, which it
    could not make again ("unable to create directory"). A file of ccm-guard's keeps it."""
    from ccm_guard.prevent import sandbox

    if sandbox.abi() == 0:
        pytest.skip("this kernel has no Landlock")
    flag = tmp_path / "go"
    agent = write_agent(tmp_path, f"""touch "$TMPDIR/started"; while [ ! -e {flag} ]; do sleep 0.05; done
{COMMIT.replace('$1', 'after the pack')}""")
    proc = spawn_exec(repo, "--json", "--", str(agent))
    deadline = time.monotonic() + 60
    while not list((tmp_path / "state").rglob("agent/tmp/started")):
        assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
        time.sleep(0.05)
    git(repo, "pack-refs", "--all")
    assert (repo / ".git" / "refs" / "heads" / "ccm").is_dir()  # kept
    assert ".ccm-guard-keep" not in git(repo, "for-each-ref")  # by nothing git takes for a ref
    assert subprocess.run(["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True).returncode == 0
    flag.touch()
    out, err = proc.communicate(timeout=60)
    gates = {g["name"]: g["status"] for g in json.loads(out)["gates"]}
    assert gates["new-commit"] == "pass" and gates["clean-tree"] == "pass", out + err


_COUNTING = """import os, sys
def count(event, args):
    if event == "subprocess.Popen" and os.path.basename(str(args[0] or args[1][0])) == "git":
        argv = list(map(str, args[1]))[1:]
        while argv and argv[0].startswith("-"):  # git's own options: the command comes after them
            argv = argv[2:] if argv[0] == "-c" else argv[1:]
        with open(os.environ["GIT_CALLS_LOG"], "a") as fh:
            fh.write(" ".join(argv)[:200] + "\\n")
sys.addaudithook(count)
sys.argv[0] = "ccm-guard"
from ccm_guard.cli import main
sys.exit(main(prog_name="ccm-guard"))
"""


def test_a_plain_exec_spawns_at_most_seven_git_processes(repo: Path, tmp_path: Path) -> None:
    """The git-call budget (bench/exec_overhead measures the time): discovery, the policy at
    the base, the person's checkout before and after, the worktree's admin entry, its
    checkout, the task's status; the branch is deleted from the files. Counted by the
    interpreter that runs exec (its audit hook sees every process it starts)."""
    assert run_exec(repo, "true", "--no-require-commit", "--cleanup").code == 0  # the first one also sets
    log = tmp_path / "git-calls.log"                                               # extensions.worktreeConfig
    proc = subprocess.run([sys.executable, "-c", _COUNTING, "exec", "--no-require-commit", "--cleanup", "--json",
                           "--", "true"], cwd=repo, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**os.environ, "GIT_CALLS_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"]
    calls = log.read_text().splitlines()
    assert 3 <= len(calls) <= 7, "\n".join(calls)
    assert not any("update-ref" in c or "branch" in c for c in calls), calls
    assert "ccm/" not in git(repo, "branch", "--list")  # and the branch is gone all the same
