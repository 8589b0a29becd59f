"""Command line for `ccm-guard gc`: parse, call gc.plan (and gc.execute), render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ccm_guard.cli.options import CONTEXT, handled, json_text
from ccm_guard.errors import ExitCode
from ccm_guard.text import safe

if TYPE_CHECKING:
    from ccm_guard.gc import Action
    from ccm_guard.state.registry import Registry

GC_EPILOG = """\
\b
Exit codes:
  0    nothing to do, or everything it did succeeded (things left alone are not failures)
  2    usage error (--older-than not an age, ...)
  5    --repo is not a git repository
  6    git failed
  7    with --yes: one or more actions failed (each says why; nothing was lost)"""


@click.command("gc", context_settings=CONTEXT, epilog=GC_EPILOG)
@click.option("--dry-run/--yes", "dry_run", default=True,
              help="Only show what would be done and why (the default), or do it.")
@click.option("--older-than", "older_than", default="7d", show_default=True, metavar="AGE",
              help="Finished tasks untouched this long are stale (s, m, h, d, w; 0: all finished tasks).")
@click.option("--archive-days", type=click.FloatRange(min=0), default=30, show_default=True, metavar="N",
              help="Tasks discarded or cleaned up more than N days ago lose their archive, snapshot refs and logs.")
@click.option("--repo", "repo", type=click.Path(file_okay=False, path_type=Path),
              help="Only this repository (default: every repository the registry knows).")
@click.option("--json", "as_json", is_flag=True, help="Print the actions as JSON.")
@handled
def gc_cmd(dry_run: bool, older_than: str, archive_days: float, repo: Path | None, as_json: bool) -> None:
    """Clean up what ccm-guard left behind, archiving before anything is removed.

    \b
    - stale tasks: finished (COMMITTED, APPLIED, ERRORED, ROLLED_BACK, BLOCKED) and not
      changed for --older-than: worktree and branch removed once their work is kept by
      the target or archived under refs/ccm-guard/archive/<task> (`task restore`);
    - runs whose ccm-guard died: not started yet -> removed; ACTIVE -> marked ERRORED,
      the worktree kept for `ccm-guard audit`;
    - orphans: task rows whose worktree vanished, worktree directories under
      $CCM_GUARD_HOME/worktrees with no row, git admin entries whose directory is gone
      (git worktree prune), ccm/* branches no task uses;
    - worktree locks ("ccm-guard pid N task ID") whose process is gone;
    - tasks discarded more than --archive-days ago: their archive (refs/ccm-guard/archive/<task>,
      or a copied directory's), snapshot refs and logs; the registry row stays, as history.
    Nothing is removed while no surviving ref keeps its work, and nothing that is running,
    locked by someone else, or whose git config would run code is touched. Ignored files
    (.env, build output) are not archived. A task row whose worktree vanished is repaired
    once it has been untouched for 10 minutes (another ccm-guard may be finishing it).
    """
    from ccm_guard import gc
    from ccm_guard.state.registry import Registry

    opts = gc.options(older_than, archive_days, repo.resolve() if repo else None)
    registry = Registry()
    actions = gc.plan(registry, opts)
    if not dry_run:
        gc.execute(actions, registry)
    extra = _sweep(registry, opts.repo, dry_run)
    failed = any(a.error for a in actions)
    if as_json:
        click.echo(json_text({"dry_run": dry_run, "actions": [a.to_json() for a in actions],
                               "failed": sum(1 for a in actions if a.error), **extra}))
    else:
        click.echo(render(actions, dry_run))
        for line in _render_sweep(extra, dry_run):
            click.echo(line)
    sys.exit(int(ExitCode.STATE) if failed else 0)


def _sweep(registry: "Registry", repo: Path | None, dry_run: bool) -> dict[str, object]:
    """What a killed ccm-guard left outside the registry's tasks: trash not yet deleted
    (handed to a detached deleter), and pool entries left half filled, taken or returned."""
    from ccm_guard import pool
    from ccm_guard.state import trash

    swept = trash.sweep(dry_run=dry_run, wait=False)
    repaired: list[str] = []
    if not dry_run:
        pool.open_registry(registry)  # the pool's tables exist once a pool was ever used
        repos = [repo] if repo else sorted({Path(t.repo) for t in registry.list(live_only=False)})
        for each in repos:
            repaired += pool.reconcile(registry, each)
    return {"trash": swept.to_json(), "pool_repaired": repaired}


def _render_sweep(extra: dict[str, object], dry_run: bool) -> list[str]:
    trash = extra["trash"]
    assert isinstance(trash, dict)
    lines = []
    if trash["deleted"]:
        lines.append(f"  trash: {len(trash['deleted'])} removed worktree(s) " +
                     ("would be deleted" if dry_run else "handed to a background deleter"))
    if trash["busy"]:
        lines.append(f"  trash: {len(trash['busy'])} being deleted already")
    lines += [f"  pool: {item}" for item in extra["pool_repaired"]]  # type: ignore[attr-defined]
    return lines


def render(actions: list["Action"], dry_run: bool) -> str:
    todo = [a for a in actions if a.safe]
    alone = [a for a in actions if not a.safe]
    if not actions:
        return "gc: nothing to do"
    lines = []
    if dry_run:
        lines.append(f"gc (dry run, nothing changed; --yes does it): {len(todo)} to do, {len(alone)} left alone")
        for a in todo:
            lines.append(f"  {a.kind:16} {a.subject}: {a.reason}")
            lines += [f"      would {step}" for step in a.steps]
    else:
        failed = [a for a in todo if a.error]
        lines.append(f"gc: {len(todo) - len(failed)} done, {len(failed)} failed, {len(alone)} left alone")
        for a in todo:
            mark = "FAILED" if a.error else "done"
            lines.append(f"  {mark:6} {a.kind:16} {a.subject}: {'; '.join(a.done) or '-'}")
            if a.error:
                lines.append(f"         error: {a.error}")
    for a in alone:
        lines.append(f"  left alone {a.kind:16} {a.subject}: {a.reason}")
    return "\n".join(safe(line) for line in lines)  # a lock reason, a path: the agent may have chosen them
