"""The hooks at work: real git commands in a real task worktree fire them.

Each test makes a repository, a linked worktree on ccm/t1 and installs the hooks for
it (ccm_guard.prevent.hooks.install_worktree), then runs git exactly as an agent would,
bypassing nothing but also using no shim: these hooks must hold on their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import AUTHOR, git

from ccm_guard.prevent import hookfiles, hookrun
from ccm_guard.prevent import hooks as install

REAL_GIT = os.path.realpath(shutil.which("git") or "git")


@dataclass
class Task:
    repo: Path
    wt: Path
    log: Path

    def refusals(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def run_git(cwd: Path, *args: str, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real git binary, by absolute path, as an agent bypassing any shim would run it."""
    return subprocess.run([REAL_GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          input=stdin, env={**os.environ, **AUTHOR, **(env or {})})


def commit(wt: Path, name: str, text: str = "x\n", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = wt / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(wt, "add", "--", name)
    return run_git(wt, "commit", "-q", "-m", f"add {name}", env=env)


def hook_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def make_task(repo: Path, name: str = "t1", **options: Any) -> Task:
    wt = repo.parent / f"wt-{name}"
    git(repo, "worktree", "add", "-q", "-b", f"ccm/{name}", str(wt))
    log = repo.parent / f"{name}-refusals.jsonl"
    install.install_worktree(wt, task=name, branch=f"ccm/{name}", role="implementor", log=log,
                             **options)
    return Task(repo, wt, log)


@pytest.fixture
def task(repo: Path) -> Task:
    return make_task(repo)


# --- reference-transaction ---------------------------------------------------------------


def test_normal_commit_on_task_branch_works(task: Task) -> None:
    before = git(task.repo, "rev-parse", "main")
    proc = commit(task.wt, "src/new.py")
    assert proc.returncode == 0, proc.stderr
    assert git(task.repo, "log", "-1", "--format=%s", "ccm/t1") == "add src/new.py"
    assert git(task.repo, "rev-parse", "main") == before
    assert task.refusals() == []


def test_update_ref_of_main_by_real_git_is_refused_and_logged(task: Task) -> None:
    assert commit(task.wt, "a.txt").returncode == 0
    main_before = git(task.repo, "rev-parse", "main")
    proc = run_git(task.wt, "update-ref", "refs/heads/main", "HEAD")
    assert proc.returncode != 0
    assert "ccm-guard: refused: update of refs/heads/main" in proc.stderr
    assert git(task.repo, "rev-parse", "main") == main_before
    [entry] = task.refusals()
    assert entry["hook"] == "reference-transaction" and entry["op"] == "ref-write"
    assert entry["refs"] == ["refs/heads/main"] and entry["task"] == "t1"


@pytest.mark.parametrize("args", [
    ("branch", "other"),
    ("tag", "v1"),
    ("branch", "-f", "feature", "HEAD"),
    ("branch", "-D", "feature"),
    ("update-ref", "main-worktree/HEAD", "HEAD"),
    ("update-ref", "-d", "refs/heads/main"),
])
def test_other_refs_are_refused(task: Task, args: tuple[str, ...]) -> None:
    git(task.repo, "branch", "feature")
    assert commit(task.wt, "a.txt").returncode == 0
    refs_before = git(task.repo, "for-each-ref")
    proc = run_git(task.wt, *args)
    assert proc.returncode != 0 and "ccm-guard: refused:" in proc.stderr
    assert git(task.repo, "for-each-ref") == refs_before
    assert git(task.repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert len(task.refusals()) == 1


def test_worktree_own_refs_and_stash_are_allowed(task: Task) -> None:
    assert commit(task.wt, "a.txt").returncode == 0
    assert commit(task.wt, "b.txt").returncode == 0
    for args in (("reset", "-q", "--soft", "HEAD~1"),  # writes ORIG_HEAD
                 ("commit", "-q", "-m", "again"),
                 ("checkout", "-q", "--detach"),
                 ("checkout", "-q", "ccm/t1")):
        proc = run_git(task.wt, *args)
        assert proc.returncode == 0, (args, proc.stderr)
    (task.wt / "a.txt").write_text("changed\n")
    assert run_git(task.wt, "stash", "-q").returncode == 0  # refs/stash: allowed by default
    assert run_git(task.wt, "stash", "pop", "-q").returncode == 0
    assert task.refusals() == []


REFS = ["HEAD", "refs/heads/ccm/t1", "ORIG_HEAD", "AUTO_MERGE", "refs/bisect/bad",
        "refs/heads/main", "refs/heads/ccm/t1x", "refs/heads/ccm/t", "main-worktree/HEAD",
        "worktrees/other/HEAD", "refs/tags/v1", "refs/stash", "refs/notes/commits", "Orig_HEAD"]


@pytest.mark.parametrize("ref", REFS)
def test_sh_fast_path_and_python_agree(task: Task, ref: str) -> None:
    """The sh script allows a subset without Python; the answer must be Python's."""
    settings = next(task.wt.parent.glob("state/hooks/*/worktrees/*/settings"))
    hook = settings.parent / "reference-transaction"
    zero = "0" * 40
    proc = subprocess.run([str(hook), "prepared"], cwd=task.wt, input=f"{zero} {'1' * 40} {ref}\n",
                          capture_output=True, text=True)
    expected = hookrun.ref_allowed(ref, "ccm/t1", ["refs/stash"])
    assert (proc.returncode == 0) == expected, proc.stderr


def test_legacy_reference_transaction_gets_the_updates_on_stdin(repo: Path) -> None:
    seen = repo.parent / "seen"
    hook_script(repo / ".git/hooks/reference-transaction", f'{{ echo "== $1"; cat; }} >> "{seen}"')
    task = make_task(repo)
    assert commit(task.wt, "a.txt").returncode == 0
    head = git(task.wt, "rev-parse", "HEAD")
    text = seen.read_text()
    assert text.count(f" {head} refs/heads/ccm/t1\n") == 2  # prepared and committed
    assert "== prepared" in text and "== committed" in text


# --- pre-push, pre-commit, commit-msg ---------------------------------------------------


def test_push_to_a_local_bare_repository_is_refused(task: Task, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    assert commit(task.wt, "a.txt").returncode == 0
    proc = run_git(task.wt, "push", str(bare), "ccm/t1")
    assert proc.returncode != 0
    assert "ccm-guard: refused: git push" in proc.stderr
    assert git(bare, "for-each-ref") == ""
    assert task.refusals()[0]["op"] == "remote"


def test_commit_of_a_forbidden_path_is_refused(task: Task) -> None:
    head = git(task.wt, "rev-parse", "HEAD")
    proc = commit(task.wt, ".gitattributes", "* text=auto\n")
    assert proc.returncode != 0
    assert "ccm-guard: refused: .gitattributes" in proc.stderr
    assert git(task.wt, "rev-parse", "HEAD") == head
    [entry] = task.refusals()
    assert entry["hook"] == "pre-commit" and entry["op"] == "path-policy"


@pytest.mark.parametrize("compiled", [True, False], ids=["rules-from-exec", "policy-at-base"])
@pytest.mark.parametrize("how", [("-a",), (".gitattributes",)], ids=["commit-a", "commit-path"])
def test_a_commit_from_another_index_is_judged_by_that_index(repo: Path, compiled: bool,
                                                               how: tuple[str, ...]) -> None:
    """`git commit -a` and `git commit PATH` commit from a temporary index (GIT_INDEX_FILE):
    pre-commit must judge that one, not the worktree's index, which holds nothing."""
    from ccm_guard.pathrules.rules import Rules
    from ccm_guard.policy import load

    (repo / ".gitattributes").write_text("* text=auto\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "the person's attributes")
    role = load(None, {}, None).role("implementor")
    task = make_task(repo, rules=Rules(role.allow, role.forbid).to_data() if compiled else None)
    (task.wt / ".gitattributes").write_text("* -text\n")  # changed, not staged
    head = git(task.wt, "rev-parse", "HEAD")
    proc = run_git(task.wt, "commit", "-q", "-m", "sneak", *how)
    assert proc.returncode != 0
    assert "ccm-guard: refused: .gitattributes" in proc.stderr
    assert git(task.wt, "rev-parse", "HEAD") == head


def test_a_gitlink_is_refused_even_when_gitmodules_says_ignore_all(task: Task) -> None:
    """`ignore = all` in a .gitmodules (even an untracked one) drops the gitlink from git's
    diffs unless told otherwise: the hook must still see it."""
    (task.wt / ".gitmodules").write_text('[submodule "vendor"]\n\tpath = vendor\n\turl = ./x\n\tignore = all\n')
    head = git(task.wt, "rev-parse", "HEAD")
    git(task.wt, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor")
    proc = run_git(task.wt, "commit", "-q", "-m", "vendor")
    assert proc.returncode != 0
    assert "ccm-guard: refused: vendor: a gitlink (submodule entry) was added" in proc.stderr
    assert git(task.wt, "rev-parse", "HEAD") == head


def test_ccm_guard_skip_skips_the_check_before_python(task: Task) -> None:
    proc = commit(task.wt, ".gitattributes", "* text=auto\n", env={"CCM_GUARD_SKIP": "1"})
    assert proc.returncode == 0, proc.stderr
    assert task.refusals() == []


def test_legacy_pre_commit_is_chained_and_its_exit_code_respected(repo: Path) -> None:
    ran = repo.parent / "ran"
    hook_script(repo / ".git/hooks/pre-commit", f'echo "$PWD" >> "{ran}"; exit ${{LEGACY_EXIT:-0}}')
    task = make_task(repo)
    assert commit(task.wt, "a.txt").returncode == 0
    assert ran.read_text().splitlines() == [str(task.wt)]
    proc = commit(task.wt, "b.txt", env={"LEGACY_EXIT": "3"})
    assert proc.returncode != 0
    assert "b.txt" not in git(task.wt, "ls-tree", "--name-only", "HEAD")
    # The person's skip switch skips ccm-guard, not the hooks it chains.
    proc = commit(task.wt, "c.txt", env={"LEGACY_EXIT": "3", "CCM_GUARD_SKIP": "1"})
    assert proc.returncode != 0


def test_main_checkout_keeps_its_own_hooks(repo: Path) -> None:
    ran = repo.parent / "ran"
    hook_script(repo / ".git/hooks/pre-commit", f'echo "$PWD" >> "{ran}"')
    hooks_before = sorted(p.name for p in (repo / ".git/hooks").iterdir())
    task = make_task(repo)
    assert git(repo, "config", "core.hooksPath", check=False) == ""
    assert sorted(p.name for p in (repo / ".git/hooks").iterdir()) == hooks_before
    assert commit(repo, "main.txt").returncode == 0  # the person's own hook runs there...
    assert ran.read_text().splitlines() == [str(repo)]
    assert run_git(repo, "branch", "feature").returncode == 0  # ...and ccm-guard's do not
    assert run_git(repo, "update-ref", "refs/heads/feature", "HEAD~1").returncode == 0
    assert task.refusals() == []


def test_commit_msg_adds_configured_trailers(repo: Path) -> None:
    task = make_task(repo, trailers=("Ccm-Task: t1",))
    assert commit(task.wt, "a.txt").returncode == 0
    assert git(task.wt, "log", "-1", "--format=%(trailers:key=Ccm-Task,valueonly)") == "t1"


def test_no_trailers_unless_configured(task: Task) -> None:
    assert commit(task.wt, "a.txt").returncode == 0
    assert git(task.wt, "log", "-1", "--format=%B") == "add a.txt"


# --- installed twice, chained to itself --------------------------------------------------


def test_installed_twice_runs_each_hook_once(repo: Path) -> None:
    ran = repo.parent / "ran"
    hook_script(repo / ".git/hooks/pre-commit", f'echo once >> "{ran}"')
    install.install_repo(repo)
    install.install_repo(repo)
    task = make_task(repo)
    install.install_worktree(task.wt, task="t1", branch="ccm/t1", role="implementor", log=task.log)
    assert commit(task.wt, "a.txt").returncode == 0
    assert commit(repo, "b.txt").returncode == 0
    assert ran.read_text().splitlines() == ["once", "once"]
    assert run_git(task.wt, "update-ref", "refs/heads/main", "HEAD").returncode != 0
    assert len(task.refusals()) == 1


def test_a_hook_chained_to_itself_does_not_loop(repo: Path) -> None:
    install.install_repo(repo)
    hooks = repo / ".git/hooks"
    # The kept legacy is a copy of our own hook whose legacy is the hook itself: A -> B -> A.
    loop = hookfiles.render({"HOOK": "pre-commit", "PY": sys.executable, "PYPATH": "", "SETTINGS": "",
                           "TASKS": "", "LEGACY": str(hooks / "pre-commit"), "CHECK": "1"})
    (hooks / f"pre-commit{install.LEGACY_SUFFIX}").write_text(loop)
    (hooks / f"pre-commit{install.LEGACY_SUFFIX}").chmod(0o755)
    task = make_task(repo)
    assert commit(repo, "a.txt").returncode == 0  # returns at all: no loop
    assert commit(task.wt, "b.txt").returncode == 0


def test_repository_hooks_still_guard_a_task_that_dropped_its_hooks_path(repo: Path) -> None:
    install.install_repo(repo)
    task = make_task(repo)
    # What an agent could do to its own config.worktree: back to the repository's hooks.
    git(task.wt, "config", "--worktree", "--unset", "core.hooksPath")
    assert commit(task.wt, "a.txt").returncode == 0
    proc = run_git(task.wt, "update-ref", "refs/heads/main", "HEAD")
    assert proc.returncode != 0 and "refused: update of refs/heads/main" in proc.stderr
    # In the person's checkout the same hooks find no task and step aside.
    assert run_git(repo, "update-ref", "refs/heads/other", "HEAD").returncode == 0


# --- the Python entry point --------------------------------------------------------------


def test_hookrun_module_refuses_without_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CCM_GUARD_HOOK_SETTINGS"}
    proc = subprocess.run([sys.executable, "-m", "ccm_guard.prevent.hookrun", "pre-push", "origin", "url"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "reinstall the hooks" in proc.stderr


def test_hookrun_module_runs_a_hook(task: Task) -> None:
    settings = next(task.wt.parent.glob("state/hooks/*/worktrees/*/settings"))
    env = {**os.environ, "CCM_GUARD_HOOK_SETTINGS": str(settings)}
    run = [sys.executable, "-m", "ccm_guard.prevent.hookrun", "reference-transaction", "prepared"]
    ok = subprocess.run(run, input="a b refs/heads/ccm/t1\n", capture_output=True, text=True, env=env)
    bad = subprocess.run(run, input="a b refs/heads/main\n", capture_output=True, text=True, env=env)
    assert (ok.returncode, bad.returncode) == (0, 1)
    assert bad.stderr.startswith("ccm-guard: refused: update of refs/heads/main")


def test_a_vanished_interpreter_refuses_clearly(task: Task) -> None:
    hooks = next(task.wt.parent.glob("state/hooks/*/worktrees/*"))
    hook = hooks / "pre-commit"
    hook.write_text(hook.read_text().replace(hookfiles.interpreter(), "/nonexistent/python3", 1))
    proc = commit(task.wt, "a.txt")
    assert proc.returncode != 0
    assert "ccm-guard: refused: /nonexistent/python3 is gone: reinstall the hooks" in proc.stderr
