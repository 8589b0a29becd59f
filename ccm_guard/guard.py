"""`exec` and `audit`: create, snapshot, run, snapshot, judge, dispose."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping

from . import configfile, gates, git, processes, runner, worktree
from .context import Context, Finding, untrusted_reason
from .delta import compare
from .errors import GitError, RepoError, StateError
from .registry import Registry, Task
from .report import Verdict
from .snapshot import Pins, Snapshot, take


@dataclasses.dataclass
class ExecOptions:
    command: list[str]
    start: Path
    task: str | None = None
    base: str = "HEAD"
    timeout: float | None = None
    grace: float = 5.0
    read_only: bool = False
    require_commit: bool = True
    on_fail: str = "keep"  # or "discard"
    cleanup: bool = False
    keep_env: tuple[str, ...] = ()
    terminal: bool | None = None  # None: a pseudo-terminal when ccm-guard runs on one
    json_stdout: bool = False  # stdout carries the verdict: the agent's stdout goes to stderr


def exec_task(opts: ExecOptions, registry: Registry) -> Verdict:
    command = runner.resolve_command(opts.command, os.environ, Path.cwd())
    plan = worktree.plan(opts.start, opts.task, opts.base)
    worktree.check_disk(plan)
    main = git.Repo(plan.main.git_dir, plan.main.common_dir, plan.main.toplevel)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Reading the person's checkout overlaps the checkout of the task's: both are I/O.
        main_status = pool.submit(main_files, main)
        pins, task = worktree.create(plan, registry, opts.command)
        main_before = main_status.result()
    host = worktree.host_repo(pins.common_dir)
    before = snapshot(pins)
    baseline = Path(task.log_dir, "baseline.json")
    baseline.write_text(json.dumps({"snapshot": before.to_json(), "main_files": main_before}))
    registry.move(task.id, "ACTIVE", baseline=str(baseline))

    marker = f"CCM_GUARD_RUN={task.id}:{secrets.token_hex(8)}"
    env = runner.agent_environment(os.environ, opts.keep_env, {
        "CCM_GUARD_TASK": task.id, "CCM_GUARD_BRANCH": task.branch,
        "CCM_GUARD_WORKTREE": str(pins.worktree), marker.split("=", 1)[0]: marker.split("=", 1)[1],
    })
    processes.become_subreaper()
    since = processes.now_ticks()
    agent = runner.run(command, pins.worktree, env, Path(task.log_dir), opts.timeout, opts.grace,
                       opts.terminal, echo_stdout_to_stderr=opts.json_stdout)
    leftovers = processes.stop(marker, pins.worktree, since)

    verdict = judge(task, pins, before, main_before, registry, opts.read_only, opts.require_commit,
                    tuple(p.describe() for p in leftovers))
    verdict.agent = agent
    dispose(verdict, opts, task, pins, host, registry)
    return verdict


def snapshot(pins: Pins) -> Snapshot:
    """Take a snapshot with the config files' include targets in it."""
    first = take(pins)
    targets: list[Path] = []
    for key, data in first.contents.items():
        if key.startswith("common/") and key.endswith(("/config", "/config.worktree")):
            targets += configfile.include_targets(pins.common_dir / key[len("common/"):], data)
    return take(pins, tuple(targets)) if targets else first


def main_files(main: git.Repo) -> dict[str, str]:
    """The person's dirty and untracked files with an identity each (changes show as a new one)."""
    found = {}
    for entry in git.status(main):
        try:
            st = os.lstat(Path(main.work_tree or "/", entry.path))
            found[entry.path] = f"{entry.code}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        except OSError:
            found[entry.path] = f"{entry.code}:missing"
    return found


def judge(
    task: Task, pins: Pins, before: Snapshot, main_before: Mapping[str, str] | None,
    registry: Registry, read_only: bool, require_commit: bool, leftovers: tuple[str, ...] = (),
) -> Verdict:
    """Snapshot again (files only, no git), compare, decide trust, run the gates."""
    after = snapshot(pins)
    main_git_dir = Path(task.main_git_dir)
    delta = compare(before, after, pins, main_git_dir)
    # Other tasks' worktrees, including ones still being created (git names the admin
    # dir after the worktree's directory until it has to pick another name).
    others = {
        Path(t.admin_dir or t.worktree).name: f"refs/heads/{t.branch}"
        for t in registry.list(repo=task.repo, live_only=False)
        if t.id != task.id
    }
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    ctx = Context(pins, repo, task.base, before, after, delta, main_before, None, others, leftovers)
    reason = untrusted_reason(ctx)
    errors = [f"git was not run on this repository again: {reason}"] if reason else []
    if reason:
        ctx.repo = repo.distrust(reason)
    else:
        # The two walks of a work tree, the task's and the person's, run side by side.
        with ThreadPoolExecutor(max_workers=2) as pool:
            ctx.task_status = pool.submit(git.status, repo, ignored=True)
            main_status = pool.submit(main_files, git.Repo(main_git_dir, pins.common_dir, Path(task.main_worktree)))
        if main_before is not None:
            try:
                ctx.main_files_after = main_status.result()
            except GitError as exc:
                errors.append(f"could not read your checkout's status: {exc.message}")
    results = gates.run_gates(ctx, gates.select(read_only, require_commit))
    head = ctx.head
    commits: list[tuple[str, str]] = []
    files: list[git.FileStat] = []
    if head and not reason and head != task.base:
        try:
            commits = git.commits(ctx.repo, task.base, head)
            files = git.numstat(ctx.repo, task.base, head)
        except GitError as exc:
            errors.append(exc.message)
    return Verdict(
        task=task.id, branch=task.branch, base=task.base, head=head, repo=task.main_worktree,
        worktree=task.worktree, log_dir=task.log_dir, agent=None, commits=commits, files=files,
        gates=results, disposition="kept", errors=errors, git_trusted=reason is None,
    )


def dispose(verdict: Verdict, opts: ExecOptions, task: Task, pins: Pins, host: git.Repo, registry: Registry) -> None:
    """Keep, or archive and remove; record the outcome. Nothing is removed unarchived."""
    passed = verdict.exit_code == 0
    registry.move(task.id, "COMMITTED" if passed else "ERRORED")
    remove = opts.cleanup if passed else opts.on_fail == "discard"
    if remove:
        _archive_and_remove(verdict, task, pins, host)
        if verdict.disposition.startswith("removed"):
            registry.move(task.id, "CLEANED_UP" if passed else "DISCARDED")
    verdict.next_steps = next_steps(verdict, task)
    registry.update(task.id, verdict=json.dumps(verdict.to_json()))


def _archive_and_remove(verdict: Verdict, task: Task, pins: Pins, host: git.Repo) -> None:
    if not verdict.git_trusted:
        verdict.disposition = "kept: its git metadata was tampered with, so ccm-guard ran no git to archive it"
        return
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    clean = any(g.name == "clean-tree" and g.status == "pass" for g in verdict.gates)
    try:
        verdict.archive = worktree.archive(repo, host, task.id, task.base, verdict.head or task.base, clean)
    except GitError as exc:
        verdict.disposition = "kept: the archive could not be made, so nothing was removed"
        verdict.errors.append(exc.message)
        return
    try:
        worktree.remove(host, pins, verdict.head)
    except GitError as exc:
        verdict.disposition = "kept: archived, but removing the worktree failed"
        verdict.errors.append(exc.message)
        return
    verdict.disposition = "removed after archiving" if verdict.archive else "removed (no work to keep)"


def next_steps(v: Verdict, task: Task) -> list[str]:
    main = task.main_worktree
    if v.disposition.startswith("removed"):
        if v.archive:
            return [f"restore the work: git -C {main} branch {task.branch} {v.archive}"]
        return []
    steps = []
    if v.exit_code == 0 and v.head and v.head != task.base:
        steps.append(f"review: git -C {main} log -p {task.base[:12]}..{task.branch}")
        steps.append(f"merge:  git -C {main} merge {task.branch}")
    else:
        steps.append(f"inspect: cd {v.worktree}   (logs in {v.log_dir})")
    steps.append(f"check again: ccm-guard audit {task.id}")
    return steps


def audit_task(task_id: str, registry: Registry, read_only: bool = False, require_commit: bool = True) -> Verdict:
    """The same gates on a finished task, against the snapshot recorded at exec time."""
    task = registry.get(task_id)
    if not task.baseline or not Path(task.baseline).exists():
        raise StateError(f"task {task_id} has no recorded baseline: it never started its agent")
    data = json.loads(Path(task.baseline).read_text())
    pins = Pins(Path(task.worktree), Path(task.admin_dir), Path(task.repo), task.branch)
    if not pins.worktree.exists():
        raise StateError(f"task {task_id}'s worktree {task.worktree} is gone ({task.status}): nothing to audit")
    verdict = judge(task, pins, Snapshot.from_json(data["snapshot"]), data.get("main_files"),
                    registry, read_only, require_commit)
    verdict.next_steps = next_steps(verdict, task)
    return verdict


def audit_target(target: str | None, base_ref: str | None, registry: Registry,
                 read_only: bool = False, require_commit: bool = True) -> Verdict:
    """Audit a task by id, the task owning a path, or any worktree against a base."""
    if target and not os.path.exists(target) and registry.exists(target):
        return audit_task(target, registry, read_only, require_commit)
    where = Path(target or ".").resolve()
    found = git.discover(where)
    for task in registry.list(repo=str(found.common_dir), live_only=False):
        if Path(task.worktree) == found.toplevel:
            return audit_task(task.id, registry, read_only, require_commit)
    return audit_foreign(found, base_ref, read_only, require_commit)


def audit_foreign(found: git.Discovered, base_ref: str | None, read_only: bool, require_commit: bool) -> Verdict:
    """A worktree ccm-guard did not create: the checks that need no earlier snapshot."""
    repo = git.Repo(found.git_dir, found.common_dir, found.toplevel)
    reason = configfile.unsafe_to_run(found.common_dir / "config", found.git_dir / "config.worktree")
    if reason:
        repo = repo.distrust(reason)
    head = None if reason else git.resolve_commit(repo, "HEAD")
    base = None
    if head:
        ref = base_ref or "HEAD"
        target = git.resolve_commit(repo, ref)
        if target is None:
            raise RepoError(f"--base {ref!r} does not name a commit: pass the branch the work started from")
        base = git.run(["merge-base", head, target], repo).out.strip()
    branch = (None if reason else git.symbolic_head(repo)) or "HEAD"
    pins = Pins(found.toplevel, found.git_dir, found.common_dir, branch.removeprefix("refs/heads/"))
    # No snapshot was taken before: the gates see the head and nothing else.
    empty = Snapshot({}, {}, {}, {}, 0.0)
    now = Snapshot({}, {}, {pins.branch_ref: head} if head else {}, {}, 0.0)
    ctx = Context(pins, repo, base or "", empty, now, compare(empty, empty, pins, found.git_dir), None, None, {})
    names = ["clean-tree"] + ([] if read_only or not require_commit or base_ref is None else ["new-commit"])
    results = gates.run_gates(ctx, names)
    if reason:
        results.append(gates.GateResult("git-metadata", "fail", (Finding("git-metadata", reason),)))
    return Verdict(task="(not a ccm-guard task)", branch=pins.branch, base=base or "", head=head,
                   repo=str(found.toplevel), worktree=str(found.toplevel), log_dir="", agent=None,
                   commits=[], files=[], gates=results, disposition="not managed by ccm-guard")
