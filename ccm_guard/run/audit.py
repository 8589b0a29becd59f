"""`audit`: the gates again on a finished worktree."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ccm_guard import git
from ccm_guard.detect import gates
from ccm_guard.detect.context import Context, Finding
from ccm_guard.detect.delta import compare
from ccm_guard.detect.policy_at import policy_at
from ccm_guard.detect.snapshot import Snapshot, with_file_as_now, without
from ccm_guard.detect.verdict import Checks, Verdict
from ccm_guard.errors import RepoError, StateError
from ccm_guard.git import config as configfile
from ccm_guard.git import layout
from ccm_guard.prevent.hooks import worktree_hooks_dir
from ccm_guard.run.dispose import next_steps
from ccm_guard.run.exec import file_digest, kept_index
from ccm_guard.run.judge import judge
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, Task
from ccm_guard.worktree.ops import require_git


def audit_task(task_id: str, registry: Registry, read_only: bool = False,
               require_commit: bool | None = None, accept: bool = False) -> Verdict:
    """The same gates on a finished task, against the snapshot and the checks of its run."""
    task = registry.get(task_id)
    require_git(task, "audit")
    recorded = json.loads(task.options or "{}")
    override = Path(recorded["policy"]) if recorded.get("policy") else None
    role = policy_at(layout.host_repo(Path(task.repo)), task.base, override).role(recorded.get("role"))
    checks = Checks.of(role, read_only or bool(recorded.get("read_only")),
                       recorded.get("require_commit") if require_commit is None else require_commit)
    if not task.baseline or not Path(task.baseline).exists():
        raise StateError(f"task {task_id} has no recorded baseline: it never started its agent")
    recorded_digest = task.option("baseline_sha256")
    if recorded_digest and file_digest(Path(task.baseline)) != recorded_digest:
        raise StateError(f"task {task_id}'s baseline {task.baseline} was changed after it was recorded (the agent "
                         "could write there without --sandbox): it cannot be audited; its exec verdict stands")
    data = json.loads(Path(task.baseline).read_text())
    pins = Pins(Path(task.worktree), Path(task.admin_dir), Path(task.repo), task.branch)
    if not pins.worktree.exists():
        raise StateError(f"task {task_id}'s worktree {task.worktree} is gone ({task.status}): nothing to audit")
    before = Snapshot.from_json(data["snapshot"])
    restored = task.option("restored") or {}
    if restored.get("at", 0) > before.taken_at:  # restored after this baseline was taken
        before = _as_restored(before, pins)
    ran = json.loads(task.verdict) if task.verdict else {}
    verdict = judge(task, pins, before, data.get("main_files"), registry, checks,
                    # the run's record of its sandbox: every unsandboxed description starts "none"
                    sandboxed=not str(ran.get("sandbox", "none")).startswith("none"),
                    setup_files=data.get("setup_files"), index_before=kept_index(data.get("index")))
    verdict.next_steps = next_steps(verdict, task)
    if task.status == "ERRORED" and verdict.gates_passed and not accept:
        verdict.next_steps = [f"accept: ccm-guard audit --accept {task.id}   (records it COMMITTED for task apply)"]
    if accept:
        _accept(registry, task, verdict, ran)
    return verdict


def _as_restored(before: Snapshot, pins: Pins) -> Snapshot:
    """The baseline of a restored task: its discard removed the guard hooks exec had
    installed (their directory under the state home, core.hooksPath and the identity in
    its config.worktree), and the restore made the worktree anew without them. What the
    discard and the restore left is the baseline of those; all else is judged as ever."""
    before = with_file_as_now(before, pins.common_dir, f"worktrees/{pins.admin_name}/config.worktree")
    return without(before, f"host/{worktree_hooks_dir(pins.common_dir, pins.admin_dir)}")


ACCEPTABLE = ("ERRORED", "COMMITTED")


def _accept(registry: Registry, task: Task, verdict: Verdict, ran: dict[str, Any]) -> None:
    """`audit --accept`: a task whose work the person finished by hand (or whose branch
    moved since its run) is recorded as COMMITTED at the head this audit passed, so
    that `task apply` takes it. A failing audit accepts nothing. `ran`: the run's verdict."""
    if task.status not in ACCEPTABLE:
        raise StateError(f"task {task.id} is {task.status}: only an ERRORED or COMMITTED task can be accepted")
    if ran.get("plants") or ran.get("git_trusted") is False:
        raise StateError(f"task {task.id}'s run planted code or tampered with git's metadata: it cannot be "
                         f"accepted; inspect it by hand, then `ccm-guard task discard {task.id}`")
    if not verdict.gates_passed:
        verdict.notes.append("not accepted: the gates failed; fix what they name, then audit --accept again")
        return
    registry.update(task.id, verdict=json.dumps(verdict.to_json()))
    registry.set_option(task.id, "accepted", {"by": "audit", "head": verdict.head, "at": time.time(),
                                              "was": task.status})
    if task.status != "COMMITTED":
        registry.move(task.id, "COMMITTED")
    verdict.notes.append(f"accepted: task {task.id} is recorded as COMMITTED at {str(verdict.head)[:12]}")
    verdict.next_steps = [f"apply: ccm-guard task apply {task.id}"]


def audit_target(target: str | None, base_ref: str | None, registry: Registry,
                 read_only: bool = False, require_commit: bool | None = None, accept: bool = False) -> Verdict:
    """Audit a task by id, the task owning a path, or any worktree against a base."""
    if target and not os.path.exists(target):
        if registry.exists(target):
            return audit_task(target, registry, read_only, require_commit, accept)
        raise StateError(f"no task {target!r} and no directory of that name: `ccm-guard task list --all` shows "
                         "the known tasks; give a task id or a path inside a worktree")
    where = Path(target or ".").resolve()
    found = git.discover(where)
    for task in registry.list(repo=str(found.common_dir), live_only=False):
        if Path(task.worktree) == found.toplevel:
            return audit_task(task.id, registry, read_only, require_commit, accept)
    if accept:
        raise StateError(f"{found.toplevel} is no ccm-guard task: --accept records a task's audit; "
                         "audit it without --accept")
    return audit_foreign(found, base_ref, read_only, require_commit is not False)


def audit_foreign(found: git.Discovered, base_ref: str | None, read_only: bool, require_commit: bool) -> Verdict:
    """A worktree ccm-guard did not create: the checks that need no earlier snapshot."""
    repo = found.repo()
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
        base = git.merge_base(repo, head, target)
    branch = (None if reason else git.symbolic_head(repo)) or "HEAD"
    pins = Pins(found.toplevel, found.git_dir, found.common_dir, branch.removeprefix("refs/heads/"))
    # No snapshot was taken before: the gates see the head and nothing else.
    empty = Snapshot({}, {}, {}, {}, 0.0)
    now = Snapshot({}, {}, {pins.branch_ref: head} if head else {}, {}, 0.0)
    ctx = Context(pins=pins, repo=repo, base=base or "", before=empty, after=now,
                  delta=compare(empty, empty, pins, found.git_dir))
    names = ["clean-tree"] + ([] if read_only or not require_commit or base_ref is None else ["new-commit"])
    results = gates.run_gates(ctx, names)
    if reason:
        results.append(gates.GateResult("git-metadata", "fail", (Finding("git-metadata", reason),)))
    return Verdict(task="(not a ccm-guard task)", branch=pins.branch, base=base or "", head=head,
                   repo=str(found.toplevel), worktree=str(found.toplevel), log_dir="", agent=None,
                   commits=[], files=[], gates=results, disposition="not managed by ccm-guard")
