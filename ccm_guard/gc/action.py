"""What one gc action is: the data `gc.plan` returns and `gc.run.execute` does.

Besides the `Action` itself: the rules about a task's status that planning and running
must agree on, and the steps an action will take as the dry run tells them. The steps
are a forecast: they say which ref will keep each piece of work (or which archive gc
will make) without writing anything, so a dry run never hashes a worktree's files.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ccm_guard import git
from ccm_guard.errors import StateError
from ccm_guard.gc.keep import (
    Work,
    admin_work,
    archive_name,
    archive_slot,
    keeper,
    worktree_head,
)
from ccm_guard.gc.linked import AdminEntry, trusted
from ccm_guard.state.pins import ARCHIVE_PREFIX, BRANCH_PREFIX
from ccm_guard.state.registry import TRANSITIONS, Task

GONE = ("DISCARDED", "CLEANED_UP")  # statuses whose worktree and branch are meant to be gone
TASK_BRANCHES = "refs/heads/" + BRANCH_PREFIX


@dataclasses.dataclass
class Action:
    """One thing gc found to repair or remove, and what became of it."""

    kind: str  # dead-lock, interrupted-apply, abandoned-run, orphan-row, stale-task, orphan-dir, orphan-branch,
    #            prune, expired-archive, expired-row, repo-gone
    repo: str  # the repository's common dir ("" when it cannot be told)
    subject: str  # a task id, a path or a ref
    reason: str  # why gc acts, or (not safe) why it leaves the thing alone
    safe: bool  # False: reported, never done
    steps: list[str]  # what doing it means, in order
    task: str | None = None
    status: str | None = None  # the task's status when planned: execute refuses if it changed
    commit: str | None = None  # the ref's value when planned (deleted only if still there)
    refs: dict[str, str] = dataclasses.field(default_factory=dict)  # more refs to delete: name -> value
    paths: list[str] = dataclasses.field(default_factory=list)  # directories to remove (logs, a copy's archive)
    done: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# --- task status rules ----------------------------------------------------------------------------


def running(t: Task) -> bool:
    """Its ccm-guard is still at work on it: gc touches nothing of it."""
    return t.running


def to_audit(t: Task) -> bool:
    """A run whose ccm-guard died with the worktree in place: its work is judged by
    `ccm-guard audit`, so gc only marks it ERRORED and keeps the worktree."""
    return t.status == "ACTIVE" and t.abandoned and Path(t.worktree).is_dir()


def final_status(current: str, archived: bool) -> str | None:
    """DISCARDED when the work lives on in an archive, else CLEANED_UP, as TRANSITIONS allow;
    None when the task stays as it is."""
    wanted = ("DISCARDED", "CLEANED_UP") if archived else ("CLEANED_UP", "DISCARDED")
    if current == wanted[0] or current == "CLEANED_UP":
        return None
    return next((s for s in wanted if s in TRANSITIONS[current]), None)


def branch_refs(rows: list[Task]) -> set[str]:
    return {f"refs/heads/{t.branch}" for t in rows}


def orphan_branch_of(entry: AdminEntry, claimed: set[str]) -> str | None:
    """The ccm/* branch an orphan worktree has checked out, when no task claims it."""
    ref = entry.head_ref
    return ref if ref and ref.startswith(TASK_BRANCHES) and ref not in claimed else None


def live_entry(entry: AdminEntry | None, wt: Path) -> AdminEntry:
    """The admin entry of the task's worktree directory, which must still be a worktree."""
    if not (entry and not entry.vanished and wt.is_dir()):
        raise StateError(f"{wt} is no git worktree any more: look inside, then remove it by hand")
    return entry


# --- the steps, forecast --------------------------------------------------------------------------


@dataclasses.dataclass
class Forecast:
    """What a planned action's earlier steps will have archived, for the later steps' text."""

    archived_tip: str | None = None  # the commit an archive made by this action holds
    in_archive: bool = False  # some of the work will live only in an archive

    def kept_in(self, host: git.Repo, work: Work, dropping: tuple[str, ...], name: str) -> str:
        """The ref `keep.keep` will find or make for `work`."""
        found = keeper(host, work, dropping)
        if found is None:
            found = archive_slot(host, name, work.tip)
            self.archived_tip = work.tip
        self.in_archive |= found.startswith(ARCHIVE_PREFIX)
        return found


def task_steps(host: git.Repo, t: Task, entry: AdminEntry | None, held: dict[Path, str], tip: str | None) -> list[str]:
    """What removing a task's worktree and branch, then settling its row, will do."""
    if entry and entry.admin in held:
        raise StateError(held[entry.admin])
    wt, ref = Path(t.worktree), f"refs/heads/{t.branch}"
    steps: list[str] = []
    seen = Forecast()
    if t.status == "PENDING" and os.path.lexists(wt):
        steps.append(f"remove {wt}, which `git worktree add` left half-made (its agent never started)")
    elif os.path.lexists(wt):
        repo = trusted(t, host.common_dir, live_entry(entry, wt).admin, wt)
        steps += worktree_steps(host, repo, t.id, (ref,), seen)
    elif entry:
        steps += admin_steps(host, entry, t.id, (ref,), seen)
    if tip:
        steps.append(branch_step(host, ref, tip, t.id, seen))
    if t.status in ("PENDING", "CREATED") and not seen.in_archive:
        steps.append("forget the task (its agent never ran), so the id can be used again")
    else:
        steps.append(f"mark {final_status(t.status, seen.in_archive) or t.status}")
    return steps


def worktree_steps(host: git.Repo, repo: git.Repo, name: str, dropping: tuple[str, ...],
                   seen: Forecast) -> list[str]:
    head = worktree_head(repo)
    dirty = bool(git.status(repo))
    stash = tuple(git.worktree_stash(repo))
    kept_in = keeper(host, Work(head, stash=stash), dropping)
    if kept_in and not dirty:
        save = f"keep nothing more: its commits are in {kept_in}"
    else:
        unkept = "commits and stash entries" if stash else "commits"
        what = " and ".join(w for w, on in ((unkept, kept_in is None), ("uncommitted changes", dirty)) if on)
        earlier = ARCHIVE_PREFIX + archive_name(name)
        if dirty and kept_in == earlier:
            # An archive made on top of this HEAD (a discard or gc killed before it removed
            # anything): whether it holds today's uncommitted work is only known by hashing
            # the files, which a dry run does not do.
            save = f"keep its uncommitted changes in {earlier} if it holds exactly them, else leave it all alone"
        else:
            kept_in = archive_slot(host, name, head)
            save = f"archive its {what} to {kept_in}"
        seen.archived_tip = head
    seen.in_archive |= kept_in.startswith(ARCHIVE_PREFIX)
    return [save, f"remove the worktree {repo.work_tree}"]


def admin_steps(host: git.Repo, entry: AdminEntry, name: str, dropping: tuple[str, ...], seen: Forecast) -> list[str]:
    kept_in = seen.kept_in(host, admin_work(host.common_dir, entry.admin), dropping, name)
    return [f"keep what {entry.admin} holds (HEAD, staged changes) in {kept_in}", f"remove {entry.admin}"]


def branch_step(host: git.Repo, ref: str, tip: str, name: str, seen: Forecast) -> str:
    branch = ref.removeprefix("refs/heads/")
    if seen.archived_tip and git.is_ancestor(host, tip, seen.archived_tip):
        return f"delete branch {branch} (its commits go into that archive)"
    return f"delete branch {branch} (its commits are kept in {seen.kept_in(host, Work(tip), (ref,), name)})"
