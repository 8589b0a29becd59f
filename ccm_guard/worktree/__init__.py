"""Task worktrees: preflight, create (all or nothing), archive, remove.

A task is a linked worktree on branch `ccm/<task>` made from a recorded base commit,
under the state home, so the person's checkout is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ccm_guard import failpoints, git, progress
from ccm_guard.errors import GitError, RepoError, StateError, UsageError
from ccm_guard.files import identity, read_regular, replace_file
from ccm_guard.git import index as indexfile
from ccm_guard.git.layout import admin_dir_of, admin_dirs_pointing_at, host_repo
from ccm_guard.state import trash
from ccm_guard.state.home import (
    admin_lock,
    home,
    no_interrupts,
    repo_key,
    require_space,
)
from ccm_guard.state.pins import ARCHIVE_PREFIX, BRANCH_PREFIX, Pins
from ccm_guard.state.registry import Registry, Task, new_task_id, sanitise_task_id

if TYPE_CHECKING:
    from ccm_guard.agent.processes import Proc

IDENTITY = {
    "GIT_AUTHOR_NAME": "ccm-guard",
    "GIT_AUTHOR_EMAIL": "ccm-guard@localhost",
    "GIT_COMMITTER_NAME": "ccm-guard",
    "GIT_COMMITTER_EMAIL": "ccm-guard@localhost",
}


class Plan(NamedTuple):
    """Everything decided and checked before anything is written."""

    main: git.Discovered
    task_id: str
    branch: str
    base: str
    worktree: Path
    log_dir: Path


def plan(start: Path, task_id: str | None, base_rev: str) -> Plan:
    found = git.discover_commits(start, base_rev)  # one git process where that answers
    main = found[0] if found else git.discover(start)
    base = found[1][0] if found else git.resolve_commit(main.repo(), base_rev)
    host = host_repo(main.common_dir)
    if base is None and not git.has_any_commit(host):
        raise RepoError(f"{main.toplevel} has no commits yet: make a first commit, then run ccm-guard")
    if base is None:
        raise RepoError(f"--base {base_rev!r} does not name a commit in {main.toplevel}: check `git log`")
    task = sanitise_task_id(task_id) if task_id else new_task_id()
    branch = BRANCH_PREFIX + task
    if not git.check_branch_name(branch):
        raise UsageError(f"task id {task!r} does not make a valid branch name: choose another --task")
    if git.branch_taken(host, branch):
        raise RepoError(f"branch {branch} already exists, though no task of that id is registered: choose another "
                        f"--task (the branch may hold work: `git log {branch}` shows it)")
    key = repo_key(main)
    worktree = home() / "worktrees" / key / task
    if os.path.lexists(worktree):
        raise RepoError(f"{worktree} already exists: choose another --task, or remove that directory")
    return Plan(main, task, branch, base, worktree, home() / "logs" / key / task)


def check_disk(p: Plan) -> None:
    """Refuse a checkout that will not fit. The person's index is a close estimate of what
    it writes (each entry records its file's size), and is read only when it changed:
    its figures are kept under the index file's identity (40 ms at 100k files, twice that
    beside the status of the person's checkout that runs meanwhile, on every run)."""
    index = p.main.git_dir / "index"
    kept = home() / "index-sizes" / repo_key(p.main)
    try:
        key: str | None = f"{identity(os.stat(index))} {len(p.base) // 2}"
    except OSError:
        key = None
    estimate = read = None
    if key is not None:
        estimate = _kept_sizes(kept, key)
    if estimate is None:
        estimate = read = indexfile.sizes(index, len(p.base) // 2)
    files, total = estimate or git.tree_size(host_repo(p.main.common_dir), p.base)
    require_space(p.worktree, files, total, "for the checkout")
    if read is not None and key is not None:
        _keep_sizes(kept, key, read)  # once the run goes on: a refused one leaves nothing


def _kept_sizes(kept: Path, key: str) -> tuple[int, int] | None:
    """The (files, bytes) kept for the index `key` names, if it is the one kept. A forged
    record (the state home is the person's) can only mislead this estimate: a checkout
    that then fills the disk fails as any would, and leaves nothing behind."""
    data = read_regular(kept, 256)
    fields = data.decode("ascii", "replace").split() if data else []
    if len(fields) != 4 or f"{fields[0]} {fields[1]}" != key or not (fields[2] + fields[3]).isdigit():
        return None
    return int(fields[2]), int(fields[3])


def _keep_sizes(kept: Path, key: str, sizes: tuple[int, int]) -> None:
    """Keep the figures (whole or not at all); where that fails, the next run reads the index."""
    with contextlib.suppress(OSError):
        kept.parent.mkdir(parents=True, exist_ok=True)
        replace_file(kept, f"{key} {sizes[0]} {sizes[1]}\n".encode())


def create(p: Plan, registry: Registry, command: list[str], options: dict[str, object], *,
           pool: bool | None = None, sparse: tuple[str, ...] = ()) -> tuple[Pins, Task]:
    """Register, then make the worktree; on any failure or Ctrl-C leave nothing behind.

    The worktree comes from the warm pool when the repository has one (`pool`: None,
    look; False, never), else fresh; a `sparse` one (cone-mode directories) is always fresh.
    """
    host = host_repo(p.main.common_dir)
    from ccm_guard.worktree.sparse import sparse_cone  # (the policy's modules: not for apply or discard)

    cone = sparse_cone(host, p.base, sparse, pool)  # refused before anything is written
    now = time.time()
    task = Task(
        id=p.task_id, repo=str(p.main.common_dir), main_worktree=str(p.main.toplevel),
        main_git_dir=str(p.main.git_dir), worktree=str(p.worktree), admin_dir="", branch=p.branch,
        base=p.base, status="PENDING", created_at=now, updated_at=now, pid=os.getpid(),
        command=json.dumps(command), log_dir=str(p.log_dir), baseline=None, verdict=None,
        options=json.dumps({**options, **({"sparse": cone} if cone else {})}),
    )
    registry.add(task)
    try:
        p.worktree.parent.mkdir(parents=True, exist_ok=True)
        admin = None if cone or pool is False else _from_pool(p, registry, asked=pool is True)
        if admin is None:
            check_disk(p)  # only a fresh checkout writes the files (a pooled one has them)
            admin = _fresh(p, host, cone)
        failpoints.point("create-after-worktree-add")
        p.log_dir.mkdir(parents=True, exist_ok=True)
    except BaseException:
        with no_interrupts():
            _undo_create(host, p)
            registry.delete(p.task_id)
        raise
    registry.move(p.task_id, "CREATED", admin_dir=str(admin))
    task.admin_dir, task.status = str(admin), "CREATED"
    return Pins(p.worktree, admin, p.main.common_dir, p.branch), task


def _from_pool(p: Plan, registry: Registry, asked: bool) -> Path | None:
    if not asked and not _pool_exists():
        return None  # no pool was ever made: its tables and modules are not opened
    from ccm_guard import pool

    if not asked and not pool.has_pool(registry, p.main.common_dir):
        return None
    admin = pool.take(registry, p.main.common_dir, p.task_id, p.branch, p.base, p.worktree)
    if admin is not None:
        registry.set_option(p.task_id, "pooled", True)
    return admin


def _fresh(p: Plan, host: git.Repo, cone: list[str]) -> Path:
    """The metadata first, under the lock (~10 ms at any size: concurrent `git worktree
    add`s trip over each other's half-written admin dirs), then the checkout outside it,
    so that runs on one repository (forks) check out side by side: what `git worktree add`
    runs for its checkout, a `git reset --hard` (of just the cone, for a sparse one)."""
    with progress.step(f"checking out the task's {'sparse ' if cone else ''}worktree"):
        with admin_lock(p.main.common_dir):  # a wait for another run's admin work shows too
            git.worktree_add_bare(host, p.worktree, p.branch, p.base)
        admin = admin_dir_of(p.worktree, p.main.common_dir)
        repo = git.Repo(admin, p.main.common_dir, p.worktree)
        failpoints.point("create-before-checkout")  # the admin dir and branch made, no files yet
        if cone:
            git.sparse_set_cone(repo, cone)
        git.reset_hard(repo)
    return admin


def in_use(task: Task) -> list[Proc]:
    """Live processes of the task (see processes.using); none when its worktree is gone."""
    from ccm_guard.agent import processes  # (ctypes: only where a worktree is to go)

    if not os.path.isdir(task.worktree):
        return []
    return processes.using(Path(task.worktree), task.option("marker"))


def not_in_use(task: Task) -> None:
    """Refuse to remove or archive a worktree that a process is still writing into."""
    alive = in_use(task)
    if alive:
        shown = "; ".join(p.describe() for p in alive[:5])
        raise StateError(f"task {task.id}'s worktree is in use by {len(alive)} process(es) ({shown}): "
                         f"stop them (kill {' '.join(str(p.pid) for p in alive[:5])}), then run the command again")


def abandon(p: Plan, registry: Registry) -> None:
    """Take back a created task whose agent never started: no worktree, branch or row left."""
    with no_interrupts():
        _undo_create(host_repo(p.main.common_dir), p)
        registry.delete(p.task_id)


def _undo_create(host: git.Repo, p: Plan) -> None:
    """Remove whatever a failed or interrupted `worktree add` left: dir, admin dir, branch."""
    trash.discard(p.worktree)  # one rename now: a half-made checkout can be 100k files
    _forget_pooled(p.worktree)
    for admin in admin_dirs_pointing_at(p.main.common_dir, p.worktree):
        shutil.rmtree(admin, ignore_errors=True)  # a half-made one is `locked`; prune keeps those
    ref = f"refs/heads/{p.branch}"
    if git.ref_exists(host, ref):
        git.delete_ref(host, ref, p.base)
    with contextlib.suppress(GitError), admin_lock(p.main.common_dir):
        git.worktree_prune(host)
    with contextlib.suppress(OSError):
        p.worktree.parent.rmdir()


def archive(task_repo: git.Repo, host: git.Repo, task_id: str, base: str, head: str, clean: bool = False) -> str | None:
    """Save all of the task's work, committed and not, under refs/ccm-guard/archive/<task>.

    `clean` (the clean-tree gate passed) spares building a commit of the work tree.
    Returns the archive ref, or None when there was no work at all to keep.
    """
    with progress.step("archiving the task's work"):
        commit = head if clean else git.archive_commit(task_repo, head, f"ccm-guard archive of task {task_id}\n",
                                                       IDENTITY)
    stashed = git.worktree_stash(task_repo)  # its own stash goes with the worktree: kept as more parents
    if commit == head or git.tree_of(host, commit) == git.tree_of(host, head):
        if head == base and not stashed:
            return None
        commit = head  # everything is committed: the branch tip is the archive
    if stashed:
        commit = with_parents(host, commit, stashed, f"ccm-guard archive of task {task_id}, with its stash entries\n")
    return keep_archive(host, task_id, commit)


def with_parents(host: git.Repo, commit: str, more: list[str], message: str) -> str:
    """A commit with `commit`'s tree and `commit` as first parent that also keeps `more`
    reachable: at most 64 parents to a commit (an agent's stash can hold any number of
    entries, and a command line cannot)."""
    tree = git.tree_of(host, commit)
    while len(more) > 63:
        more = [git.commit_tree(host, tree, more[i:i + 64], message, IDENTITY) for i in range(0, len(more), 64)]
    return git.commit_tree(host, tree, [commit, *more], message, IDENTITY)


def keep_archive(host: git.Repo, task_id: str, commit: str) -> str:
    """Point refs/ccm-guard/archive/<task> at `commit` without ever losing what it held.

    An archive that already holds `commit` stays as it is: a discard repeated after a
    killed one finds only the branch left, while the archive also holds the uncommitted
    files. Work beyond the old archive replaces it (compare-and-swap); work beside it (a
    restored task discarded again) is archived with the old archive as a second parent.
    """
    ref = ARCHIVE_PREFIX + task_id
    old = git.resolve_commit(host, ref)
    if old is not None and (old == commit or git.is_ancestor(host, commit, old)):
        return ref
    if old is not None and not git.is_ancestor(host, old, commit):
        commit = git.commit_tree(host, git.tree_of(host, commit), [commit, old],
                                 f"ccm-guard archive of task {task_id}, the earlier archive kept\n", IDENTITY)
    git.update_ref(host, ref, commit, old or "", message=f"ccm-guard: archive {task_id}")
    return ref


def remove(host: git.Repo, pins: Pins, head: str | None, *, reuse: bool = False) -> bool:
    """Remove the worktree and its branch (only if the branch is still at `head`).

    The directory is renamed into the trash and deleted after ccm-guard has exited
    (trash.py): the caller waits for a rename, not for unlinking every file. With
    `reuse` (its task passed), a worktree from the warm pool goes back to the pool
    instead, reset and cleaned, if the pool wants one. Returns whether it went back.
    """
    returned = False
    if reuse and head is not None and _pool_exists():
        from ccm_guard import pool

        returned = pool.give_back(pins, head)
    if not returned:
        # An admin dir whose gitdir names another place (the worktree was moved) is left be.
        trash.remove_worktree(pins.worktree, pins.admin_dir, lambda: admin_lock(pins.common_dir))
        _forget_pooled(pins.worktree)
    if head is not None:
        git.delete_ref(host, pins.branch_ref, head, missing_ok=True)
    with contextlib.suppress(OSError):
        pins.worktree.parent.rmdir()
    return returned


def _pool_exists() -> bool:
    return (home() / "pool").is_dir()  # spares opening the pool's tables when none was ever made


def _forget_pooled(worktree: Path) -> None:
    if _pool_exists():
        from ccm_guard import pool

        pool.forget(worktree)
