"""Judging a finished run: snapshot again, compare, decide whether git can be trusted, run
the gates; and the host-side recovery of a commit the sandbox blocked."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Mapping

from ccm_guard import git, worktree
from ccm_guard.detect import gates, signatures
from ccm_guard.detect.context import Context, config_plants, plants, untrusted_reason
from ccm_guard.detect.delta import compare
from ccm_guard.detect.snapshot import Snapshot, main_files, take
from ccm_guard.detect.verdict import Checks, Recovered, Verdict
from ccm_guard.errors import GitError
from ccm_guard.files import read_regular
from ccm_guard.later import Later
from ccm_guard.policy import Role
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, Task
from ccm_guard.worktree.sparse import in_cone


def recover_blocked_commit(verdict: Verdict, task: Task, pins: Pins, role: Role, logs: tuple[str, ...],
                           refusal_log: Path, git_errors: str) -> Recovered | None:
    """When git's own report shows a sandbox-blocked lock in this task's git metadata and
    the tree holds work, commit the work the role allows, on the host (docs/design-notes.md#recovery-on-the-host).

    A spoofed report gains nothing: only what the agent could have committed itself is
    committed, and the gates then judge it like any commit. `git_errors`: read_git_errors.
    """
    if not verdict.git_trusted:
        return None
    text = "\n".join([*(_tail(Path(p)) for p in (*logs, str(refusal_log))), git_errors])
    found = signatures.find_blocked_commit(text, [pins.admin_dir, pins.common_dir])
    if found is None:
        return None
    from ccm_guard.detect import recovery  # only where a commit was blocked
    from ccm_guard.pathrules.rules import Rules

    rules = Rules(role.allow, role.forbid)
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    result = recovery.recover(repo, lambda p: rules.violation(p) is None, _agent_message(task, pins),
                              worktree.IDENTITY)
    if result.commit is None:
        return None
    return Recovered(reason="sandbox blocked commit", line=found.line, commit=result.commit,
                     committed=result.committed, left_uncommitted=result.refused, warning=result.warning)


def read_git_errors(git_log: Path) -> str:
    """The errors of every git the agent ran, from git's own trace2 events (read once: both
    recovery and the identity note look at them)."""
    return signatures.git_errors(_tail(git_log, 8 << 20))


def identity_note(git_errors: str) -> str | None:
    """What to do when the agent's commit failed because git did not know who commits."""
    if not signatures.identity_missing(git_errors):
        return None
    return ("the agent's commit failed: git has no identity for it (Author identity unknown); set yours with "
            "git config --global user.name 'Your Name' and git config --global user.email you@example.com, "
            "or give GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL in the environment, then run the task again")


def _tail(path: Path, limit: int = 1 << 20) -> str:
    """The end of a file the agent may have written (a link, a FIFO, /dev/zero: nothing)."""
    return (read_regular(path, limit, tail=True) or b"").decode("utf-8", "replace")


def _agent_message(task: Task, pins: Pins) -> str | None:
    """The message the agent meant: its summary file, else the commit message it tried."""
    for path in (Path(task.log_dir, "agent", "summary"), pins.admin_dir / "COMMIT_EDITMSG"):
        text = _tail(path, 1 << 16).strip()
        if text:
            return text
    return None


def _remove_finished_pseudorefs(ctx: Context) -> None:
    """What a finished rebase, revert or cherry-pick left only because the sandbox kept git
    from deleting it goes now (git-metadata warned): the person's `git status` in the kept
    worktree would say an operation is still under way."""
    for key in ctx.finished_pseudorefs:
        with contextlib.suppress(OSError):
            os.unlink(ctx.pins.common_dir / key.removeprefix("common/"))


def _recorded_refs(tasks: list[Task]) -> dict[str, str | None]:
    """The refs under refs/ccm-guard/ these tasks' rows say ccm-guard wrote (ref -> commit,
    None where the row does not say which)."""
    from ccm_guard.state.pins import SNAPSHOT_PREFIX

    refs: dict[str, str | None] = {}
    for t in tasks:
        for number, commit in (t.option("snapshots") or {}).items():
            refs[f"{SNAPSHOT_PREFIX}{t.id}/{number}"] = commit
        archive = t.option("archive") or {}
        if archive.get("ref"):
            refs[archive["ref"]] = None
        if t.option("applying") or t.option("applied"):
            refs[f"refs/ccm-guard/push/{t.id}"] = None
    return refs


def judge(
    task: Task, pins: Pins, before: Snapshot, main_before: Mapping[str, str] | None,
    registry: Registry, checks: Checks, leftovers: tuple[str, ...] = (), sandboxed: bool = True,
    setup_files: Mapping[str, str] | None = None, *, index_before: git.KeptIndex | None = None,
) -> Verdict:
    """Snapshot again (files only, no git), compare, decide trust, run the gates.
    `sandboxed`: the agent could not write the registry (its records excuse for certain).
    `index_before`: ccm-guard's copy of the task's index from before the agent (see
    git.status_without_trusting_index; None: every file of the work tree is read)."""
    after = take(pins, previous=before)
    main_git_dir = Path(task.main_git_dir)
    delta = compare(before, after, pins, main_git_dir)
    # Other tasks' worktrees, including ones still being created (git names the admin
    # dir after the worktree's directory until it has to pick another name).
    # Finished tasks untouched since this run began cannot have done anything during it.
    neighbours = [t for t in registry.list(repo=task.repo, since=before.taken_at - 1) if t.id != task.id]
    others = {Path(t.admin_dir or t.worktree).name: f"refs/heads/{t.branch}" for t in neighbours}
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    own = registry.get(task.id)
    changed = [t for t in neighbours if t.updated_at >= before.taken_at - 1]  # what ccm-guard did meanwhile
    ctx = Context(pins=pins, repo=repo, base=task.base, before=before, after=after, delta=delta,
                  main_files_before=main_before, other_tasks=others, leftovers=leftovers, role=checks.role,
                  recorded_refs=_recorded_refs([*changed, own] if own.updated_at >= before.taken_at - 1 else changed),
                  ccm_moves=_recorded_moves(changed), ccm_commits=own.ccm_commits(), registry_reachable=not sandboxed,
                  setup_files=setup_files or {})
    reason = untrusted_reason(ctx)
    errors = [f"git was not run on this repository again: {reason}"] if reason else []
    if reason:
        ctx.repo = repo.distrust(reason)
    else:
        # The two walks of a work tree, the task's and the person's, run side by side.
        main = git.Repo(main_git_dir, pins.common_dir, Path(task.main_worktree))
        ctx.main_repo = main
        cone = task.option("sparse")
        absent = (lambda path: not in_cone(path, cone)) if cone else None
        index = f"common/worktrees/{pins.admin_name}/index"
        split = any(key.startswith(f"common/worktrees/{pins.admin_name}/sharedindex.") for key in after.files)
        untouched = not split and index in before.files and before.files.get(index) == after.files.get(index)
        ctx.task_status = Later(lambda: git.status_without_trusting_index(
            repo, index_before, ignored=True, head=ctx.head, absent_by_design=absent, index_untouched=untouched))
        if main_before is not None:  # None: a baseline that did not read it
            main_status = Later(lambda: main_files(main))
            try:
                ctx.main_files_after = main_status.result()
            except GitError as exc:
                errors.append(f"could not read your checkout's status: {exc.message}")
    results = gates.run_gates(ctx, checks.gate_names())
    _remove_finished_pseudorefs(ctx)
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
        gates=results, disposition="kept", errors=errors, git_trusted=reason is None, plants=plants(ctx),
        config_plants=config_plants(ctx),
    )


def record_commit(registry: Registry, task: Task, commit: str) -> None:
    recorded = registry.get(task.id).option("ccm_commits")
    registry.set_option(task.id, "ccm_commits", [*(recorded if isinstance(recorded, list) else []), commit])


def _recorded_moves(others: list[Task]) -> tuple[tuple[str, str, str], ...]:
    """The local ref moves other tasks' applies and rollbacks made (and one in flight), of
    the tasks whose rows changed during the run: a record from before it excuses nothing."""
    moves = []
    for other in others:
        for key in ("applying", "applied", "rolled_back"):
            record = other.option(key)
            if record and not record.get("remote") and not record.get("url") and record.get("ref"):
                moves.append((record["ref"], record["old"], record["new"]))
    return tuple(moves)
