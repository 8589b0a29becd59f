"""The copied-directory strategy: an agent run on a directory that is in no git repository.

exec falls back to it when its directory is not in git (docs/design-notes.md#strategies). The
directory is copied, reflinked where the file system can, to
`$CCM_GUARD_HOME/copies/<key>/<task>`; a manifest of what the agent starts from is kept
(copy/tree.py), and the agent runs in the copy. The gates that make sense without git
judge the run (copy/gates.py); then the copy is kept, applied back into the original or
moved to the archive (copy/apply.py). This module is the run itself: refuse what cannot
work before anything is written, copy, run the agent, judge, dispose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Callable

from ccm_guard import policy
from ccm_guard.agent import processes, runner
from ccm_guard.agent.options import ExecOptions
from ccm_guard.copy.apply import CopyApplied, apply_copy, discard_copy, restore_copy
from ccm_guard.copy.gates import BRANCH, CopyVerdict, judge_copy
from ccm_guard.copy.tree import (
    STRATEGY,
    Item,
    copy_directory,
    manifest_hash,
    read_manifest,
    walk,
    write_manifest,
)
from ccm_guard.detect import agent_home
from ccm_guard.detect.verdict import Checks, Verdict
from ccm_guard.errors import GuardError, RepoError, UsageError
from ccm_guard.prevent import arm as prevention
from ccm_guard.state.home import home, key_hash, no_interrupts, require_space
from ccm_guard.state.registry import Registry, Task, new_task_id, sanitise_task_id

# The strategy's entry points, and what its callers and tests reach through this module.
__all__ = ["STRATEGY", "Checks", "CopyApplied", "CopyVerdict", "apply_copy", "discard_copy", "exec_copied",
           "judge_copy", "manifest_hash", "read_manifest", "restore_copy", "walk"]


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """Where a run on a copy of a non-git directory keeps the copy and its logs."""

    source: Path
    task_id: str
    copy: Path
    log_dir: Path


def exec_copied(opts: ExecOptions, registry: Registry) -> Verdict:
    command = runner.resolve_command(opts.command, os.environ, Path.cwd())
    plan = plan_copy(opts)
    role = load_policy(plan.source, opts.policy).role(opts.role)
    checks = Checks.of(role, opts.read_only, False, str(opts.policy) if opts.policy else None)
    prevention.check_options(opts.sandbox, opts.no_network, opts.agent)
    options = {"strategy": STRATEGY, "source": str(plan.source), **checks.to_json()}
    task, base, copied = create_copy(plan, registry, opts.command, options)
    private = plan.log_dir / "agent"
    try:
        (private / "tmp").mkdir(parents=True, exist_ok=True)
        who = prevention.prepare_agent(command, opts.agent, private, main=plan.source, worktree=plan.copy)
        # As the git strategy does with its worktree, with the copy as the task's one root.
        confine, described, _ = prevention.landlock(
            opts.sandbox, opts.no_network, lambda: [plan.copy], private,
            ports=(*opts.allow_ports, *who.ports()) if opts.no_network else ())
    except BaseException:
        _abandon(plan, registry)  # nothing of the agent's exists yet: leave nothing behind
        raise
    marker = f"{task.id}:{os.urandom(8).hex()}"
    env = {**_agent_env(opts, task.id, plan.copy, private, marker), **who.env,
           **(prevention.sandboxed_caches(private) if confine is not None else {})}
    command, said = prevention.with_own_sandbox(who, sandboxed=confine is not None, described=described,
                                                task_roots=lambda: [plan.copy])
    registry.move(task.id, "ACTIVE")
    processes.become_subreaper()
    since = processes.now_ticks()
    with processes.watchdog(f"CCM_GUARD_RUN={marker}", plan.copy, since):
        agent = runner.run(command, plan.copy, env, plan.log_dir, opts.timeout, opts.grace, opts.terminal,
                           echo_stdout_to_stderr=opts.json_stdout, confine=confine)
    leftovers = tuple(p.describe() for p in processes.stop(f"CCM_GUARD_RUN={marker}", plan.copy, since))
    verdict = judge_copy(task, base, checks, leftovers, sandboxed=confine is not None)
    verdict.agent, verdict.sandbox, verdict.profile = agent, described, who.profile
    if who.home is not None:
        verdict.gates.append(agent_home.gate(who.home_before, who.home.read_watched()))
    verdict.notes.insert(1, copied)
    verdict.notes.extend(said)
    verdict.notes.extend(prevention.socket_notes(sandboxed=confine is not None))
    dispose_copy(verdict, opts, task, registry)
    return verdict


def plan_copy(opts: ExecOptions) -> CopyPlan:
    """Everything decided and refused before anything is written."""
    source = Path(os.path.realpath(opts.start))
    if not source.is_dir():
        raise RepoError(f"{source} is not a directory: run ccm-guard in the directory the agent should work on")
    if opts.base != "HEAD":
        raise UsageError(f"--base {opts.base!r} needs a git repository, and {source} is in none: drop --base "
                         "(the directory is copied as it is)")
    if opts.require_commit:
        raise UsageError(f"--require-commit needs a git repository, and {source} is in none: drop it")
    state = Path(os.path.realpath(home()))
    if state == source or state.is_relative_to(source):
        raise RepoError(f"{source} holds ccm-guard's state directory {state}, so it cannot be copied into it: "
                        "run in a subdirectory, or point CCM_GUARD_HOME elsewhere")
    task_id = sanitise_task_id(opts.task) if opts.task else new_task_id()
    key = f"{source.name or 'root'}-{key_hash(source)}"
    copy, logs = state / "copies" / key / task_id, state / "logs" / key / task_id
    for path in (copy, logs):
        if os.path.lexists(path):
            raise RepoError(f"{path} already exists: choose another --task, or remove that directory")
    return CopyPlan(source, task_id, copy, logs)


def load_policy(source: Path, override: Path | None) -> policy.Policy:
    """The built-in roles, the user's policy, the directory's own (read from the original
    before the agent exists, as the git strategy reads it from the base commit), --policy."""
    sources = []
    for path in (home() / "policy.toml", source / "pyproject.toml", source / policy.POLICY_FILE):
        if path.is_file():
            sources.append(policy.read_file(path))
    if override is not None:
        sources.append(policy.read_file(override))
    return policy.build(sources)


def create_copy(plan: CopyPlan, registry: Registry, command: list[str],
                options: dict[str, object]) -> tuple[Task, dict[str, Item], str]:
    """Register, copy, record the manifest; on any failure or Ctrl-C leave nothing behind.
    Returns the task, the manifest, and a note saying what was copied."""
    now = time.time()
    task = Task(
        id=plan.task_id, repo=str(plan.source), main_worktree=str(plan.source), main_git_dir="",
        worktree=str(plan.copy), admin_dir="", branch=BRANCH, base="", status="PENDING", created_at=now,
        updated_at=now, pid=os.getpid(), command=json.dumps(command), log_dir=str(plan.log_dir), baseline=None,
        verdict=None, options=json.dumps(options),
    )
    registry.add(task)
    try:
        check_disk(plan.source, plan.copy)
        plan.copy.parent.mkdir(parents=True, exist_ok=True)
        plan.log_dir.mkdir(parents=True, exist_ok=True)
        items, counts, special = copy_directory(plan.source, plan.copy)
        baseline = plan.log_dir / "baseline.json"
        write_manifest(baseline, plan.source, plan.copy, items)
    except BaseException as exc:
        _abandon(plan, registry)
        if isinstance(exc, OSError):
            where = exc.filename or plan.source
            raise RepoError(f"could not copy {where}: {exc.strerror or exc}; fix that path, or run elsewhere") from exc
        raise
    base = manifest_hash(items)
    registry.move(task.id, "CREATED", base=base, baseline=str(baseline))
    task.base, task.baseline, task.status = base, str(baseline), "CREATED"
    return task, items, _copied_note(counts, special)


def _copied_note(counts: dict[str, int], special: list[str]) -> str:
    files = counts.get("reflink", 0) + counts.get("copy", 0)
    note = f"copied {files} file(s) and {counts.get('symlink', 0)} symlink(s) ({counts.get('reflink', 0)} reflinked)"
    if special:
        note += f"; {len(special)} special file(s) (FIFO, socket, device) not copied: {', '.join(special[:5])}"
    return note


def _abandon(plan: CopyPlan, registry: Registry) -> None:
    with no_interrupts():
        remove_tree(plan.copy)
        remove_tree(plan.log_dir)
        with contextlib.suppress(OSError):
            plan.copy.parent.rmdir()
        registry.delete(plan.task_id)


def check_disk(source: Path, dest: Path) -> None:
    """Refuse when the copy cannot fit (counted as plain copies: a reflink may need less)."""
    files = total = 0
    for _, st in walk(source):
        if stat.S_ISREG(st.st_mode):
            files += 1
            total += st.st_size
    require_space(dest, files, total, f"to copy {source}")


def _agent_env(opts: ExecOptions, task_id: str, copy: Path, private: Path, marker: str) -> dict[str, str]:
    """The agent's scrubbed environment; CCM_GUARD_RUN marks its processes for the sweep."""
    return runner.agent_environment(os.environ, opts.keep_env, {
        "CCM_GUARD_TASK": task_id, "CCM_GUARD_WORKTREE": str(copy), "CCM_GUARD_STRATEGY": STRATEGY,
        "CCM_GUARD_SUMMARY": str(private / "summary"), "TMPDIR": str(private / "tmp"), "LC_MESSAGES": "C",
        "CCM_GUARD_RUN": marker,
    })


def dispose_copy(verdict: CopyVerdict, opts: ExecOptions, task: Task, registry: Registry) -> None:
    """Keep the copy, apply it (--apply), or move it to the archive; record the outcome."""
    passed = verdict.exit_code == 0
    registry.move(task.id, "COMMITTED" if passed else "ERRORED")
    if passed and opts.apply and verdict.head != task.base:
        try:
            verdict.applied = apply_copy(registry, registry.get(task.id)).to_json()
        except GuardError as exc:
            verdict.apply_refused = exc.message
        passed = verdict.exit_code == 0
    archive = opts.cleanup if passed else opts.on_fail == "discard"
    if archive:
        done = discard_copy(registry, registry.get(task.id))
        verdict.archive = done["archive"]
        verdict.disposition = f"moved to the archive {done['archive']}" if done["archive"] else "gone"
    verdict.next_steps = _next_steps(verdict, task)
    registry.update(task.id, verdict=json.dumps(verdict.to_json()))


def _next_steps(v: CopyVerdict, task: Task) -> list[str]:
    if v.archive:
        return [f"restore the copy: ccm-guard task restore {task.id}"]
    if v.applied:
        return [f"discard the copy: ccm-guard task discard {task.id}"]
    steps = []
    if v.exit_code == 0 and v.head != task.base:
        steps.append(f"review: diff -r {task.main_worktree} {task.worktree}")
        steps.append(f"apply:  ccm-guard task apply {task.id}")
    else:
        steps.append(f"inspect: cd {task.worktree}   (logs in {task.log_dir})")
    steps.append(f"discard: ccm-guard task discard {task.id}")
    return steps


def remove_tree(path: Path) -> None:
    """Remove a tree ccm-guard made, read-only directories in it included."""
    if not os.path.lexists(path):
        return

    def writable_and_retry(func: Callable[..., Any], failed: str, _: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            func(failed)

    shutil.rmtree(path, onerror=writable_and_retry)
