"""`ccm-guard task ...`: what ran, and what to do with it now."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from ccm_guard.cli.options import (
    CONTEXT,
    complete_tasks,
    handled,
    json_text,
    run_options,
)
from ccm_guard.errors import EXIT_CODE_TABLE
from ccm_guard.text import safe, safe_lines


def _task_command(name: str, *params: Callable[[Any], Any], json_flag: bool = True,
                  epilog: str | None = None) -> Callable[[Callable[..., None]], Any]:
    """`ccm-guard task NAME TASK [params] [--json]`, the shape of every command on one task."""
    def wrap(fn: Callable[..., None]) -> Any:
        fn = handled(fn)
        if json_flag:
            fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)
        for param in reversed(params):
            fn = param(fn)
        return task.command(name, context_settings=CONTEXT, epilog=epilog)(
            click.argument("task_id", metavar="TASK", shell_complete=complete_tasks)(fn))
    return wrap


def _emit(data: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    click.echo(json_text(data) if as_json else "\n".join(lines))


@click.group(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
def task() -> None:
    """The task registry: what ran, where, and what to do with its work.

    \b
    Lifecycle: PENDING -> CREATED -> ACTIVE -> COMMITTED -> APPLIED | DISCARDED -> CLEANED_UP,
    with BLOCKED (the agent asked a question), ERRORED (gates failed) and ROLLED_BACK.

    \b
      ccm-guard task show T          status, divergence from the target, snapshots
      ccm-guard task diff T          the change against its base, uncommitted work included
      ccm-guard task apply T         merge into your branch without touching a work tree
      ccm-guard task discard T       archive everything, then remove worktree and branch
      ccm-guard task restore T       bring a discarded task back
      ccm-guard task rollback T      worktree back to base (or an applied task's target back)
      ccm-guard task compare G       the forks of `exec --fork` side by side
      ccm-guard task pick G-2        apply one fork, archive the others
    """


@task.command("list", context_settings=CONTEXT)
@click.option("--all", "show_all", is_flag=True, help="Include tasks that were applied, discarded or cleaned up.")
@click.option("--all-repos", is_flag=True,
              help="Tasks of every repository (default: the repository you are in, if any).")
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON.")
@handled
def task_list(show_all: bool, all_repos: bool, as_json: bool) -> None:
    """List the tasks of the repository you are in (live ones unless --all).

    Outside any repository, or with --all-repos, every repository's tasks are listed,
    with a REPO column. AGE is the time since the task last changed state.
    """
    import time

    from ccm_guard.state.registry import Registry
    from ccm_guard.text import human_age

    repo = None if all_repos else _current_repository()
    from ccm_guard.run.fork import sorted_by_group

    tasks = sorted_by_group(Registry().list(repo=repo, live_only=not show_all))  # a fork group together
    if as_json:
        click.echo(json_text([t.to_json() for t in tasks], key="tasks"))
        return
    if not tasks:
        where = f" in {Path(repo).parent}" if repo else ""
        click.echo(f"no tasks{where}" + ("" if show_all else " (--all shows finished ones)")
                   + (" (--all-repos shows other repositories)" if repo else ""))
        return
    now = time.time()
    click.echo(f"{'TASK':28} {'STATUS':11} {'AGE':>4}  {'STRATEGY':16} {'BRANCH':36} WORKTREE"
               + ("" if repo else "  REPO"))
    for t in tasks:
        status = t.status + ("?" if t.abandoned else "")
        click.echo(f"{t.id:28} {status:11} {human_age(now - t.updated_at):>4}  {t.strategy:16} {t.branch:36} "
                   f"{t.worktree}" + ("" if repo else f"  {t.main_worktree}"))


def _current_repository() -> str | None:
    """The common dir of the repository the command runs in, as the registry records it."""
    from ccm_guard import git
    from ccm_guard.errors import RepoError

    try:
        return str(git.discover(Path.cwd()).common_dir)
    except RepoError:  # not in a repository (or in a bare one): every repository's tasks
        return None


@_task_command("show")
def task_show(task_id: str, as_json: bool) -> None:
    """One task: status, base, paths, last verdict, divergence from its target, snapshots.

    Divergence is computed in the object store (no work tree is touched): how many commits
    the task and the target each have since the base, and which paths an apply would
    conflict in. An apply or run that ccm-guard was killed in the middle of is explained
    (and an apply that had landed is recorded).
    """
    from ccm_guard.state.registry import Registry
    from ccm_guard.worktree.divergence import describe

    registry = Registry()
    t = registry.get(task_id)
    extra = describe(registry, t)
    t = registry.get(task_id)
    if as_json:
        click.echo(json_text({**t.to_json(), **extra}))
        return
    for name in ("id", "status", "branch", "base", "main_worktree", "worktree", "admin_dir", "log_dir"):
        click.echo(f"{name + ':':15} {getattr(t, name)}")
    click.echo(f"{'command:':15} {' '.join(json.loads(t.command))}")
    if extra.get("repaired"):
        click.echo(f"{'repaired:':15} {extra['repaired']}")
    if t.abandoned:
        click.echo(f"{'note:':15} the ccm-guard process that ran this task (pid {t.pid}) is gone; the worktree "
                   f"is kept: `ccm-guard audit {t.id}` judges it, `ccm-guard gc` marks it ERRORED")
    if not extra["worktree_present"] and t.status not in ("DISCARDED", "CLEANED_UP"):
        click.echo(f"{'note:':15} the worktree is gone; `ccm-guard gc` repairs the registry")
    if t.verdict:
        v = json.loads(t.verdict)
        failed = [g["name"] for g in v["gates"] if g["status"] in ("fail", "skipped")]
        click.echo(f"{'verdict:':15} {v['outcome']}" + (f" (failed: {', '.join(failed)})" if failed else ""))
        if v.get("question"):
            click.echo(f"{'question:':15} {v['question'][:300]!r}")
    div = extra.get("divergence")
    if div:
        state = "already applied" if div["applied"] else (
            f"apply would conflict in {len(div['conflicts'])} path(s): {', '.join(safe(p) for p in sorted(div['conflicts']))}"
            if div["conflicts"] else "applies cleanly")
        click.echo(f"{'divergence:':15} task +{div['task_commits']}, {div['target']} +{div['target_commits']} "
                   f"since the base; {state}")
    for key, label in (("applied", "applied:"), ("archive", "archive:")):
        value = t.option(key)
        if value:
            click.echo(f"{label:15} {value.get('target') or value.get('ref')} {str(value.get('new') or '')[:12]}")
    if extra.get("snapshots"):
        click.echo(f"{'snapshots:':15} " + ", ".join(f"{n}={sha[:12]}" for n, sha in extra["snapshots"].items()))


@_task_command("diff", click.argument("other", required=False, metavar="[OTHER]", shell_complete=complete_tasks),
               json_flag=False)
def task_diff(task_id: str, other: str | None) -> None:
    """The task's change against its base, as `git diff` shows it (uncommitted work included);
    with OTHER, how the two tasks' work differs (two forks: `task diff T-2 T-3`)."""
    from ccm_guard.state.registry import Registry
    from ccm_guard.worktree.ops import diff

    text = diff(Registry(), task_id, other)
    # The agent wrote these bytes: on a terminal its escape sequences are shown, not obeyed
    # (a pipe, e.g. into a patch file, gets them as they are).
    click.echo(safe_lines(text) if sys.stdout.isatty() else text, nl=False)


@_task_command("compare")
def task_compare(task_id: str, as_json: bool) -> None:
    """The forks of a fork group side by side (`exec --fork`): verdict, failed gates, files,
    lines, commits, agent time and exit, check; and which files several forks changed.
    TASK is the group's name (its forks are TASK-1, TASK-2, ...)."""
    from ccm_guard.cli.render import render_comparison
    from ccm_guard.run.fork import compare
    from ccm_guard.state.registry import Registry

    found = compare(Registry(), task_id)
    click.echo(json_text(found.to_json()) if as_json else render_comparison(found))


@_task_command(
    "pick",
    click.option("--into", metavar="REF", help="Where to land it (as task apply)."),
    click.option("--strategy", type=click.Choice(["merge", "squash", "ff"]), default="merge", show_default=True,
                 help="As task apply."),
    epilog=EXIT_CODE_TABLE)
def task_pick(task_id: str, into: str | None, strategy: str, as_json: bool) -> None:
    """Apply one fork (as `task apply`; one that failed its gates is refused) and discard
    its siblings, each archived first (`task restore` brings one back)."""
    from ccm_guard.cli.render import render_apply
    from ccm_guard.run.fork import pick
    from ccm_guard.run.tasks import apply, discard
    from ccm_guard.state.registry import Registry

    registry = Registry()
    result = pick(registry, task_id,
                  apply=lambda: apply(registry, task_id, into=into, how=strategy, retries=10).to_json(),
                  discard=lambda sibling: discard(registry, sibling))
    lines = [f"ccm-guard: PICKED  task {task_id} of {result['group']}",
             *("  " + line for line in render_apply(result["applied"]))]
    lines += [f"  discarded {d['task']} (archive: {d['archive'] or 'no work'})" for d in result["discarded"]]
    lines += [f"  left {item['task']}: {item['reason']}" for item in result["left"]]
    lines += ["  next:", f"    undo:    ccm-guard task rollback {task_id}"]
    lines += [f"    restore: ccm-guard task restore {d['task']}" for d in result["discarded"][:1]]
    _emit(result, as_json, lines)


@_task_command(
    "apply",
    click.option("--into", metavar="REF", help="Where to land: a local branch, REMOTE/BRANCH, or a repository path "
                 "(pushed to). Default: the branch checked out where exec ran."),
    click.option("--strategy", type=click.Choice(["merge", "squash", "ff"]), default="merge", show_default=True,
                 help="merge: a merge commit; squash: one commit on the target; ff: fast-forward only."),
    click.option("--retries", type=click.IntRange(1, 100), default=10, show_default=True,
                 help="For a remote target: how often to fetch, rebuild and push again when another push won."),
    click.option("--cleanup", is_flag=True,
                 help="Then remove the task's worktree and branch (the work is in the target)."),
    epilog=EXIT_CODE_TABLE)
def task_apply(task_id: str, into: str | None, strategy: str, retries: int, cleanup: bool, as_json: bool) -> None:
    """Land a task that passed its gates (COMMITTED) on a branch, touching no work tree.

    The result is computed in the object store (git merge-tree), committed with trailers
    naming the task, and the target is moved with compare-and-swap, recomputed if another
    apply won the race. A target that is checked out is brought up to date as `git merge`
    would: your uncommitted changes stay; if one is in the apply's way (a file the task
    changes too, an untracked or ignored file where it puts one), or the merge conflicts, nothing
    changes (exit 8).
    """
    from ccm_guard.cli.render import render_apply
    from ccm_guard.run.tasks import apply
    from ccm_guard.state.registry import Registry

    registry = Registry()
    applied = apply(registry, task_id, into=into, how=strategy, retries=retries).to_json()
    data: dict[str, Any] = {"applied": applied}
    if cleanup:
        from ccm_guard.run.tasks import discard

        data["cleanup"] = discard(registry, task_id)
    lines = [f"ccm-guard: APPLIED  task {task_id}", *("  " + line for line in render_apply(applied))]
    if cleanup:
        gone = "the worktree went back to the warm pool" if data["cleanup"]["to_pool"] else "removed the worktree"
        lines.append(f"  {gone}, and the branch (archive: {data['cleanup']['archive']})")
    lines += ["  next:", f"    review: git log -p {applied['old'][:12]}..{applied['new'][:12]}",
              f"    undo:   ccm-guard task rollback {task_id}"]
    if not cleanup:
        lines.append(f"    clean up: ccm-guard task discard {task_id}")
    _emit(data, as_json, lines)


@_task_command("discard")
def task_discard(task_id: str, as_json: bool) -> None:
    """Archive all of the task's work, committed and not, under refs/ccm-guard/archive/<task>,
    then remove its worktree and branch. `task restore` brings it back."""
    from ccm_guard.run.tasks import discard
    from ccm_guard.state.registry import Registry

    result = discard(Registry(), task_id)
    lines = [f"ccm-guard: discarded task {task_id}"]
    lines.append(f"  archive: {result['archive']}" if result["archive"] else "  no work to archive")
    if result["to_pool"]:
        lines.append("  the worktree went back to the warm pool (reset and cleaned after this command)")
    if result["restore"]:
        lines.append(f"  undo: {result['restore']}")
    _emit(result, as_json, lines)


@_task_command("restore")
def task_restore(task_id: str, as_json: bool) -> None:
    """Bring a discarded task back from its archive: its worktree, its branch, and its
    uncommitted work as uncommitted changes."""
    from ccm_guard.run.tasks import restore
    from ccm_guard.state.registry import Registry

    result = restore(Registry(), task_id)
    where = f" on {result['branch']}" if result.get("branch") else " (a copied directory)"
    _emit(result, as_json, [f"ccm-guard: restored task {task_id} in {result['worktree']}{where}"
                            + (" (with its uncommitted work)" if result.get("uncommitted_work") else "")])


@_task_command(
    "rollback",
    click.option("--to-snapshot", type=int, metavar="N", help="Back to snapshot N (`task show` lists them)."),
    click.option("--file", "path", metavar="PATH", help="Only this file, back to the base (relative to the worktree)."),
    epilog=EXIT_CODE_TABLE)
def task_rollback(task_id: str, to_snapshot: int | None, path: str | None, as_json: bool) -> None:
    """Undo a task's work: the worktree back to its base, to a snapshot, or one file.

    The current state is saved as a snapshot first, so a rollback loses nothing. For an
    APPLIED task, the target goes back to its pre-apply commit if nothing landed on it
    since (compare-and-swap), else a revert commit keeps the later work.
    """
    from ccm_guard.errors import UsageError
    from ccm_guard.state.registry import Registry
    from ccm_guard.worktree.rollback import rollback

    if to_snapshot is not None and path is not None:
        raise UsageError("--to-snapshot and --file do not go together: pick one")
    result = rollback(Registry(), task_id, to_snapshot, path)
    lines = [f"ccm-guard: rolled back task {task_id}: " + ", ".join(f"{k} {v}" for k, v in result.items()
                                                                  if k != "task")]
    _emit(result, as_json, lines)


@_task_command("snapshot")
def task_snapshot(task_id: str, as_json: bool) -> None:
    """Save the worktree as it is (commits and uncommitted work) as the task's next
    snapshot, refs/ccm-guard/snapshots/<task>/<n>."""
    from ccm_guard.state.registry import Registry
    from ccm_guard.worktree.rollback import take_snapshot

    result = take_snapshot(Registry(), task_id)
    _emit(result, as_json, [f"ccm-guard: snapshot {result['snapshot']} of task {task_id}: {result['commit'][:12]}"
                            + (" (with uncommitted work)" if result["uncommitted"] else "")])


@_task_command("resume", run_options, click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED),
               epilog=EXIT_CODE_TABLE)
def task_resume(task_id: str, timeout: float | None, grace: float, keep_env: tuple[str, ...], terminal: bool | None,
                sandbox_mode: str, no_network: bool, allow_ports: tuple[int, ...], agent: str | None, as_json: bool,
                command: tuple[str, ...]) -> None:
    """Run COMMAND again in a BLOCKED task's worktree, judged like an exec of the same task.

    The agent's question.json is moved to the task's log directory first. The options
    mean what they mean for `exec`.
    """
    from ccm_guard.agent.options import ExecOptions
    from ccm_guard.cli.render import render, to_json
    from ccm_guard.run.resume import resume_task
    from ccm_guard.state.registry import Registry

    opts = ExecOptions(command=list(command), start=Path.cwd(), timeout=timeout, grace=grace, keep_env=keep_env,
                       terminal=False if as_json and terminal is None else terminal, json_stdout=as_json,
                       sandbox=sandbox_mode, no_network=no_network, allow_ports=allow_ports, agent=agent)
    verdict = resume_task(Registry(), task_id, opts)
    click.echo(to_json(verdict) if as_json else render(verdict))
    sys.exit(int(verdict.exit_code))
