"""`exec` and `audit`: create, snapshot, run, snapshot, judge, dispose."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from ccm_guard import failpoints, git, worktree
from ccm_guard.agent import processes, runner
from ccm_guard.agent.options import ExecOptions
from ccm_guard.detect import gates, recovery, signatures
from ccm_guard.detect.context import Context, untrusted_reason
from ccm_guard.detect.delta import compare
from ccm_guard.detect.policy_at import policy_at
from ccm_guard.detect.snapshot import Snapshot, read_nofollow, take
from ccm_guard.detect.verdict import Checks, Recovered, Verdict
from ccm_guard.errors import GitError, GuardError, NotARepository, StateError
from ccm_guard.git import config as configfile
from ccm_guard.git import layout
from ccm_guard.policy import Role
from ccm_guard.prevent import arm as prevention
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, Task


def exec_task(opts: ExecOptions, registry: Registry) -> Verdict:
    command = runner.resolve_command(opts.command, os.environ, Path.cwd())
    try:
        plan = worktree.plan(opts.start, opts.task, opts.base)
    except NotARepository:
        from ccm_guard.copy import (
            exec as copyexec,  # a plain directory: the copied-directory strategy
        )

        return copyexec.exec_copied(opts, registry)
    # The policy comes from the base commit, before the agent exists: it cannot edit it.
    role = policy_at(layout.host_repo(plan.main.common_dir), plan.base, opts.policy).role(opts.role)
    role = worktree.sparse_role(role, opts.sparse)  # a change outside the cone fails path-policy
    checks = Checks.of(role, opts.read_only, opts.require_commit, str(opts.policy) if opts.policy else None)
    prevention.check_options(opts.sandbox, opts.no_network, opts.agent)
    main = plan.main.repo()
    with ThreadPoolExecutor(max_workers=2) as pool:
        # While git checks out the task's files: read the person's checkout, and compile
        # the role's path rules for the pre-commit hook (pathspec's import is slow).
        main_status = pool.submit(main_files, main)
        compiled = pool.submit(_compiled_rules, role)
        pins, task = worktree.create(plan, registry, opts.command, checks.to_json(), pool=opts.pool,
                                     sparse=opts.sparse)
        main_before = main_status.result()
    try:
        notes = _copy_included(plan.main.toplevel, pins.worktree, opts.link_dirs)
        armed = prevention.arm(task, pins, role, command, sandbox_mode=opts.sandbox, no_network=opts.no_network,
                               agent=opts.agent, rules=compiled.result())
        before = snapshot(pins)  # after arming: its own config and hooks are the baseline
    except BaseException:
        with contextlib.suppress(Exception):
            prevention.disarm(pins)
        worktree.abandon(plan, registry)  # nothing of the agent's exists yet: leave nothing behind
        raise
    baseline = write_baseline(Path(task.log_dir, "baseline.json"), before, main_before)
    registry.move(task.id, "ACTIVE", baseline=str(baseline))
    registry.set_option(task.id, "baseline_sha256", file_digest(baseline))
    return run_and_judge(opts, registry, task, pins, role, checks, armed, before, main_before, notes)


def _copy_included(main_top: Path, new: Path, link_dirs: bool) -> list[str]:
    """The ignored files `.worktreeinclude` names (.env, node_modules/, ...), as Claude Code does."""
    from ccm_guard.worktree.include import INCLUDE_FILE, copy_included

    if not os.path.lexists(main_top / INCLUDE_FILE):
        return []
    result = copy_included(main_top, new, link_dirs)
    how = ", ".join(f"{n} by {kind}" for kind, n in sorted(result.by_how.items()))
    return [f"{INCLUDE_FILE}: brought {result.files} ignored file(s), {result.bytes} bytes ({how or 'none'})",
            *result.warnings, *(f"{INCLUDE_FILE}: skipped {path}: {why}" for path, why in result.skipped[:20])]


def write_baseline(path: Path, before: Snapshot, main_before: Mapping[str, str]) -> Path:
    path.write_text(json.dumps({"snapshot": before.to_json(), "main_files": main_before}))
    return path


def file_digest(path: Path) -> str:
    """The baseline's digest, kept in the registry: an agent without the sandbox can rewrite
    the file (it is under the state home), and a later audit must not be misled by it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_and_judge(opts: ExecOptions, registry: Registry, task: Task, pins: Pins, role: Role, checks: Checks,
                  armed: prevention.Armed, before: Snapshot, main_before: Mapping[str, str] | None,
                  notes: list[str] | None = None) -> Verdict:
    """The agent's run and everything after it, for a new task and a resumed one alike."""
    host = layout.host_repo(pins.common_dir)
    marker = f"CCM_GUARD_RUN={task.id}:{secrets.token_hex(8)}"
    env = runner.agent_environment(os.environ, opts.keep_env, {
        **armed.env, "CCM_GUARD_TASK": task.id, "CCM_GUARD_WORKTREE": str(pins.worktree),
        "CCM_GUARD_SUMMARY": str(Path(task.log_dir, "agent", "summary")),
        "CCM_GUARD_QUESTION": str(pins.worktree / QUESTION_FILE),
        marker.split("=", 1)[0]: marker.split("=", 1)[1],
    })
    processes.become_subreaper()
    since = processes.now_ticks()
    agent = runner.run(armed.command, pins.worktree, env, Path(task.log_dir), opts.timeout, opts.grace,
                       opts.terminal, echo_stdout_to_stderr=opts.json_stdout, confine=armed.confine)
    leftovers = tuple(p.describe() for p in processes.stop(marker, pins.worktree, since))
    failpoints.point("before-gates")

    verdict = judge(task, pins, before, main_before, registry, checks, leftovers)
    recovered = recover_blocked_commit(verdict, task, pins, role, agent.logs, armed.refusal_log)
    if recovered is not None:
        verdict = judge(task, pins, before, main_before, registry, checks, leftovers)
        verdict.recovery = recovered
    verdict.agent = agent
    verdict.sandbox, verdict.profile = armed.sandbox, armed.profile
    verdict.refusals = prevention.refusals(armed.refusal_log)
    verdict.question = read_question(pins.worktree)
    verdict.notes = list(notes or [])
    if opts.snapshot_every is None:
        opts = dataclasses.replace(opts, snapshot_every=role.snapshot_every)
    try:
        dispose(verdict, opts, task, pins, host, registry)
    except StateError as exc:  # the verdict still reaches the person (a full disk, seen for real)
        verdict.errors.append(exc.message)
    return verdict


QUESTION_FILE = "question.json"


def read_question(worktree_dir: Path) -> str | None:
    """The agent's question, if it left one (seed 000's BLOCKED): its "question" field, else
    the text. Read without following a link and capped: the agent wrote it."""
    path = worktree_dir / QUESTION_FILE
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(1 << 16).decode("utf-8", "replace")
    except OSError as exc:
        return f"({QUESTION_FILE} could not be read: {exc.strerror})"
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.strip()
    if isinstance(data, dict) and isinstance(data.get("question"), str):
        return str(data["question"])
    return raw.strip()


def _compiled_rules(role: Role) -> dict[str, Any]:
    from ccm_guard.policy.rules import Rules

    return Rules(role.allow, role.forbid).to_data()


def recover_blocked_commit(verdict: Verdict, task: Task, pins: Pins, role: Role, logs: tuple[str, ...],
                           refusal_log: Path) -> Recovered | None:
    """When git's own report shows a sandbox-blocked lock in this task's git metadata and
    the tree holds work, commit the work the role allows, on the host (seed 003, Bug E).

    A spoofed report gains nothing: only what the agent could have committed itself is
    committed, and the gates then judge it like any commit.
    """
    if not verdict.git_trusted:
        return None
    text = "\n".join(_tail(Path(p)) for p in (*logs, str(refusal_log)))
    found = signatures.find_blocked_commit(text, [pins.admin_dir, pins.common_dir])
    if found is None:
        return None
    from ccm_guard.policy.rules import Rules

    rules = Rules(role.allow, role.forbid)
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    result = recovery.recover(repo, lambda p: rules.violation(p) is None, _agent_message(task, pins),
                              worktree.IDENTITY)
    if result.commit is None:
        return None
    return Recovered(reason="sandbox blocked commit", line=found.line, commit=result.commit,
                     committed=result.committed, left_uncommitted=result.refused, warning=result.warning)


def _tail(path: Path, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _agent_message(task: Task, pins: Pins) -> str | None:
    """The message the agent meant: its summary file, else the commit message it tried."""
    for path in (Path(task.log_dir, "agent", "summary"), pins.admin_dir / "COMMIT_EDITMSG"):
        text = _tail(path, 1 << 16).strip()
        if text:
            return text
    return None


def snapshot(pins: Pins) -> Snapshot:
    """One walk of the metadata, with the files the config files include in it (the
    config files are few and read first, so the walk is not done twice)."""
    common = pins.common_dir
    targets: list[Path] = []
    for path in (common / "config", common / "config.worktree", *common.glob("worktrees/*/config.worktree")):
        data = read_nofollow(path)
        if data:
            targets += configfile.include_targets(path, data)
    return take(pins, tuple(targets))


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
    registry: Registry, checks: Checks, leftovers: tuple[str, ...] = (),
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
    ctx = Context(pins, repo, task.base, before, after, delta, main_before, None, others, leftovers, role=checks.role,
                  ccm_moves=_recorded_moves(registry, task))
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
    results = gates.run_gates(ctx, checks.gate_names())
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


def _recorded_moves(registry: Registry, task: Task) -> tuple[tuple[str, str, str], ...]:
    """The local ref moves other tasks' applies and rollbacks made (and one in flight)."""
    moves = []
    for other in registry.list(repo=task.repo, live_only=False):
        for key in ("applying", "applied", "rolled_back"):
            record = other.option(key) if other.id != task.id else None
            if record and not record.get("remote") and not record.get("url") and record.get("ref"):
                moves.append((record["ref"], record["old"], record["new"]))
    return tuple(moves)


def dispose(verdict: Verdict, opts: ExecOptions, task: Task, pins: Pins, host: git.Repo, registry: Registry) -> None:
    """Keep, or archive and remove; record the outcome. Nothing is removed unarchived."""
    if verdict.blocked:
        registry.move(task.id, "BLOCKED")
        verdict.disposition = "kept: the agent is blocked on a question"
        verdict.next_steps = [f"answer, then: ccm-guard task resume {task.id} -- <agent command>",
                              f"or give up:   ccm-guard task discard {task.id}"]
        registry.update(task.id, verdict=json.dumps(verdict.to_json()))
        return
    passed = verdict.exit_code == 0
    registry.move(task.id, "COMMITTED" if passed else "ERRORED", verdict=json.dumps(verdict.to_json()))
    if verdict.git_trusted and verdict.head:
        from ccm_guard.worktree.ops import auto_snapshots

        with contextlib.suppress(GitError):
            auto_snapshots(host, task, verdict.head, opts.snapshot_every or 0)
    if passed and opts.apply and verdict.head and verdict.head != task.base:
        _apply_on_pass(verdict, task, registry)
        passed = verdict.exit_code == 0
    remove = opts.cleanup if passed else opts.on_fail == "discard"
    if remove:
        _archive_and_remove(verdict, task, pins, host)
        if verdict.disposition.startswith("removed"):
            registry.set_option(task.id, "archive", {"ref": verdict.archive, "head": verdict.head or task.base})
            registry.move(task.id, "CLEANED_UP" if passed else "DISCARDED")
    verdict.next_steps = next_steps(verdict, task)
    registry.update(task.id, verdict=json.dumps(verdict.to_json()))


def _apply_on_pass(verdict: Verdict, task: Task, registry: Registry) -> None:
    from ccm_guard.worktree import apply as applying

    try:
        verdict.applied = applying.apply_task(registry, task.id).to_json()
    except GuardError as exc:
        verdict.apply_refused = exc.message


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
        with contextlib.suppress(GuardError, OSError):
            prevention.disarm(pins)  # its hooks live under the state home, not in the worktree
        # Only a passed task's worktree may go back to the warm pool.
        pooled = worktree.remove(host, pins, verdict.head, reuse=verdict.exit_code == 0)
    except GitError as exc:
        verdict.disposition = "kept: archived, but removing the worktree failed"
        verdict.errors.append(exc.message)
        return
    verdict.disposition = "removed after archiving" if verdict.archive else "removed (no work to keep)"
    if pooled:
        verdict.disposition += "; the worktree went back to the warm pool"


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
