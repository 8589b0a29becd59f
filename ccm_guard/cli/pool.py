"""Command line for `ccm-guard pool`: parse, call pool_admin.fill/drain/status, render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ccm_guard.cli.options import CONTEXT, handled, json_text

POOL_EPILOG = """\
\b
Exit codes:
  0    done
  2    usage error (-n below 0, ...)
  5    --repo is not a usable git repository, or --base does not name a commit
  6    git failed
  7    registry problem"""


@click.group(context_settings=CONTEXT)
def pool() -> None:
    """The warm pool: ready worktrees per repository, so `exec` starts in milliseconds.

    \b
    A pooled checkout sits under $CCM_GUARD_HOME/pool/ at a recent base, with
    ccm-guard's own index and no git admin entry (filling or draining the pool is
    invisible to running tasks, and `git worktree prune` has nothing to touch). `exec`
    takes one when the repository has a pool (--no-pool makes a fresh one), checks that
    it is pristine (anything left in it, or its index changed, and it is destroyed
    instead), and makes it the task's worktree on its branch and base, writing only the
    files that differ. A taken worktree is replaced in the background (see `pool fill
    --refill`); a passed task's worktree comes back when it is removed (exec --cleanup,
    task apply --cleanup, task discard) and the pool is short, reset and cleaned; a failed
    task's worktree never goes back.
    """


def _repo_option(fn: Any) -> Any:
    return click.option("--repo", "repo", type=click.Path(file_okay=False, path_type=Path), default=".",
                        help="The repository (default: the current directory).")(fn)


@pool.command("fill", context_settings=CONTEXT, epilog=POOL_EPILOG)
@click.option("-n", "size", type=click.IntRange(min=0), default=2, show_default=True, metavar="N",
              help="How many ready worktrees to keep (0 empties the pool but keeps it configured).")
@click.option("--base", default="HEAD", show_default=True, metavar="REV",
              help="What the worktrees are checked out at; resolved again whenever one comes back.")
@click.option("--refill/--no-refill", default=None,
              help="Replace a worktree a task takes, in a background process (niced, a second after the take, "
              "only with room to spare on the disk). Default: as set before; on for a new pool.")
@_repo_option
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@handled
def pool_fill(size: int, base: str, refill: bool | None, repo: Path, as_json: bool) -> None:
    """Make (or trim to) N ready worktrees for the repository, and keep N.

    Each costs one checkout, as `git worktree add` does: on a large repository run this
    ahead of time. Entries an interrupted ccm-guard left half-done are destroyed first.
    Afterwards the pool keeps its size by itself: a passed task's worktree comes back
    when the pool is short, and (--refill) a taken one is replaced in the background.
    """
    from ccm_guard import git
    from ccm_guard.pool import admin as pools

    report = pools.fill(git.discover(repo.resolve()), size, base, refill=refill)
    if as_json:
        click.echo(json_text(report.to_json()))
        return
    click.echo(f"{report.repo}: {report.ready} ready at {report.base[:12]} (made {len(report.made)}"
               + (f", destroyed {len(report.destroyed)} dirty or extra" if report.destroyed else "") + ")")


@pool.command("status", context_settings=CONTEXT, epilog=POOL_EPILOG)
@click.option("--repo", "repo", type=click.Path(file_okay=False, path_type=Path),
              help="Only this repository (default: every repository with a pool).")
@click.option("--json", "as_json", is_flag=True, help="Print the pools as JSON.")
@handled
def pool_status(repo: Path | None, as_json: bool) -> None:
    """Show each repository's pool: how many are ready, out with tasks, or dirty."""
    from ccm_guard import git
    from ccm_guard.pool import admin as pools
    from ccm_guard.state import trash

    common = git.discover(repo.resolve()).common_dir if repo else None
    found = pools.status(repo=common)
    waiting = [str(e) for e in trash.entries()]
    if as_json:
        click.echo(json_text({"pools": found, "trash": waiting}))
        return
    if not found:
        click.echo("no pool (`ccm-guard pool fill -n N` makes one)")
    for item in found:
        click.echo(f"{item['repo']}: {item['ready']} ready of {item['size']}"
                   + (f", {item['dirty']} dirty" if item["dirty"] else "")
                   + (f" (base {item['rev']})" if item["rev"] else "")
                   + ("" if item["refill"] else ", not refilled"))
        for e in item["entries"]:
            click.echo(f"  {e['id']:12} {e['state']:9} {e['path']}" + (f"  {e['note']}" if e["note"] else ""))
    if waiting:
        click.echo(f"trash: {len(waiting)} removed worktree(s) still being deleted under {Path(waiting[0]).parent}")


@pool.command("drain", context_settings=CONTEXT, epilog=POOL_EPILOG)
@_repo_option
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@handled
def pool_drain(repo: Path, as_json: bool) -> None:
    """Destroy the repository's ready worktrees and stop keeping any.

    Worktrees out with tasks stay with them, and are removed (not returned) with the task.
    """
    from ccm_guard import git
    from ccm_guard.pool import admin as pools

    report = pools.drain(git.discover(repo.resolve()).common_dir)
    if as_json:
        click.echo(json_text(report.to_json()))
        return
    click.echo(f"{report.repo}: destroyed {len(report.destroyed)}"
               + (f"; {len(report.left_with_tasks)} out with tasks go when their tasks do"
                  if report.left_with_tasks else ""))
