"""gc's one rule: nothing is removed whose work no surviving ref keeps.

Every removal gc makes (a worktree, an admin entry, a branch, a half-made directory, a
prune) is a function of this module, and each calls `ensure_kept` right before it acts,
under the repository's administration lock: a mistake in planning or running cannot
lose work, it can only make a removal refuse. `keep` is how gc satisfies the rule
before it removes: it archives to refs/ccm-guard/archive/<name> what nothing else keeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path

from ccm_guard import git, worktree
from ccm_guard.errors import StateError
from ccm_guard.gc.linked import AdminEntry, admin_entries, same
from ccm_guard.prevent import hooks as install
from ccm_guard.state.home import admin_lock
from ccm_guard.state.pins import ARCHIVE_PREFIX, SNAPSHOT_PREFIX
from ccm_guard.state.registry import sanitise_task_id

# A task's snapshot refs go when the task is discarded, and apply's push refs right after
# the fetch: they keep nothing for good.
NOT_KEEPERS = (SNAPSHOT_PREFIX, "refs/ccm-guard/push/")
EMPTY_TREES = ("4b825dc642cb6eb9a060e54bf8d69288fbee4904",
               "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321")


class WorkWouldBeLost(StateError):
    """A removal was refused: no ref that survives it keeps the work it would drop."""


@dataclasses.dataclass(frozen=True)
class Work:
    """The commits a worktree holds that must stay reachable before it goes."""

    tip: str | None  # the commit the work sits on
    tree: str | None = None  # everything in it when that is more than the tip's own tree
    stash: tuple[str, ...] = ()  # the worktree's own stash entries (commits), kept too


def ensure_kept(host: git.Repo, work: Work, dropping: tuple[str, ...], what: str) -> str:
    """The ref that keeps `work` once `dropping` are gone, or WorkWouldBeLost.

    Kept means: a ref holds the tip in its history and, when the work has uncommitted
    changes, that ref's own tree is exactly the work (an archive commit is such a ref).
    """
    if work.tip is None and (work.tree is None or work.tree in EMPTY_TREES) and not work.stash:
        return "(nothing to keep)"
    for found in git.ref_trees(host, work.tip):
        if found.ref in dropping or found.ref.startswith(NOT_KEEPERS):
            continue
        if (work.tree is None or found.tree == work.tree) and git.all_reachable(host, work.stash, found.commit):
            return found.ref
    held = f"commit {work.tip[:12]}" if work.tip else ("staged changes" if work.tree else "stash entries")
    raise WorkWouldBeLost(f"refusing to remove {what}: no ref that stays keeps its {held}"
                          f"{' and its uncommitted work' if work.tree and work.tip else ''}"
                          f"{' and its stash entries' if work.stash and (work.tip or work.tree) else ''}; archive it first "
                          f"(`ccm-guard gc --yes` archives to {ARCHIVE_PREFIX}<name>)")


def keeper(host: git.Repo, work: Work, dropping: tuple[str, ...]) -> str | None:
    """`ensure_kept` as a question: the keeping ref, or None."""
    try:
        return ensure_kept(host, work, dropping, "")
    except WorkWouldBeLost:
        return None


def keep(host: git.Repo, name: str, work: Work, dropping: tuple[str, ...], repo: git.Repo | None,
         done: list[str]) -> str:
    """The ref that keeps `work`, archiving it first when nothing else does."""
    found = keeper(host, work, dropping)
    if found is not None:
        return found
    ref = archive_work(host, name, work, repo)
    done.append(f"archived to {ref}")
    return ref


# --- what a removal would drop ------------------------------------------------------------------


def worktree_head(repo: git.Repo) -> str:
    tip = git.resolve_commit(repo, "HEAD")
    if tip is None:
        raise StateError(f"{repo.work_tree} has no commit checked out: gc cannot archive it; "
                         "look and remove it by hand")
    return tip


def worktree_work(repo: git.Repo) -> Work:
    """A worktree's HEAD and everything in it, tracked and untracked (not ignored)."""
    tip = worktree_head(repo)
    probe = git.archive_commit(repo, tip, "ccm-guard gc: what the worktree holds\n", worktree.IDENTITY)
    tree, tip_tree = git.trees_of(repo, [probe, tip])
    return Work(tip, None if tree == tip_tree else tree, tuple(git.worktree_stash(repo)))


def admin_work(common: Path, admin: Path) -> Work:
    """What a worktree's admin dir still holds once its directory is gone: HEAD and the index."""
    repo = git.Repo(admin, common)
    tip = git.resolve_commit(repo, "HEAD")
    stash = tuple(git.worktree_stash(repo))
    index = admin / "index"
    if not index.is_file():
        return Work(tip, stash=stash)
    tree = git.index_tree(repo, index)
    if tree is None:
        raise StateError(f"{index} cannot be read as a tree (a conflict in progress?): "
                         "delete it if it holds nothing you need, then run gc again")
    return Work(tip, None if tip and tree == git.tree_of(repo, tip) else tree, stash)


def unmade_work(host: git.Repo, path: Path, base: str) -> Work:
    """A half-made checkout of `base` holds no work of its own: every file in it is the
    base's, byte for byte (files missing are fine: the checkout stopped). Else it is work."""
    files: list[Path] = []
    links: list[Path] = []
    for top, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not (top == str(path) and d == ".git")]
        for name in names:
            full = Path(top, name)
            if full != path / ".git":
                (links if full.is_symlink() else files).append(full)
    base_files = git.tree_blobs(host, base)
    ids = dict(zip(files, git.hash_files(host, files)))
    for full in files + links:
        rel = str(full.relative_to(path))
        want = base_files.get(rel)
        same_file = want is not None and (ids[full] == want[1] if full in ids else
                                          git.file_at(host, base, rel) == os.readlink(full).encode())
        if not same_file:
            raise WorkWouldBeLost(f"refusing to remove {path}: {rel} is not the base commit's file, "
                                  "so it may be somebody's work; look, then remove it by hand")
    return Work(base)


# --- archives ---------------------------------------------------------------------------------------


def archive_name(name: str) -> str:
    return sanitise_task_id(name)


def archive_slot(host: git.Repo, name: str, tip: str | None) -> str:
    """The archive ref for `name`, refused if it already holds work the new one would not."""
    ref = ARCHIVE_PREFIX + archive_name(name)
    old = git.resolve_commit(host, ref)
    if old is not None and (tip is None or not git.is_ancestor(host, old, tip)):
        raise WorkWouldBeLost(f"{ref} already holds other work and gc does not overwrite an archive: "
                              "restore or delete it, then run gc again")
    return ref


def archive_work(host: git.Repo, name: str, work: Work, repo: git.Repo | None) -> str:
    """Save `work` under refs/ccm-guard/archive/<name>: as discard does for a worktree, else
    the tip with the staged tree on top."""
    ref = archive_slot(host, name, work.tip)
    if repo is not None and work.tip is not None:
        made = worktree.archive(repo, host, archive_name(name), "", work.tip)
        assert made == ref
        return ref
    commit = work.tip
    if work.tree:
        commit = git.commit_tree(host, work.tree, [work.tip] if work.tip else [],
                                 f"ccm-guard gc: archive of {name}\n", worktree.IDENTITY)
    stash = list(work.stash)
    if commit is None and stash:
        commit, stash = stash[0], stash[1:]
    assert commit is not None
    if stash:
        commit = worktree.with_parents(host, commit, stash, f"ccm-guard gc: archive of {name}, with its stash entries\n")
    git.update_ref(host, ref, commit, message=f"ccm-guard gc: archive {name}")
    return ref


# --- removals: each one through ensure_kept ------------------------------------------------------


def remove_worktree(host: git.Repo, repo: git.Repo, dropping: tuple[str, ...]) -> str:
    assert repo.work_tree is not None
    with admin_lock(repo.common_dir):
        kept_in = ensure_kept(host, worktree_work(repo), dropping, f"worktree {repo.work_tree}")
        git.worktree_remove(host, repo.work_tree)
        _drop_hooks(repo.common_dir, repo.git_dir.name)
    return kept_in


def remove_admin_entry(host: git.Repo, entry: AdminEntry, dropping: tuple[str, ...]) -> str:
    """The admin dir of a worktree whose directory is gone (`git worktree remove` of the path)."""
    with admin_lock(host.common_dir):
        if entry.path is None or os.path.lexists(entry.path):
            raise StateError(f"{entry.admin} names no vanished directory: `git worktree prune` decides")
        kept_in = ensure_kept(host, admin_work(host.common_dir, entry.admin), dropping, f"{entry.admin}")
        git.worktree_remove(host, entry.path)
        _drop_hooks(host.common_dir, entry.admin.name)
    return kept_in


def delete_branch(host: git.Repo, ref: str, tip: str) -> str:
    kept_in = ensure_kept(host, Work(tip), (ref,), f"branch {ref.removeprefix('refs/heads/')}")
    git.delete_ref(host, ref, tip)  # compare-and-swap: a branch that moved since stays
    return kept_in


def prune_entries(host: git.Repo, running: set[Path]) -> list[str]:
    """`git worktree prune`, once every entry it would drop is kept and none is running."""
    common = host.common_dir
    with admin_lock(common):
        doomed = [e for e in admin_entries(common) if e.vanished and e.locked is None]
        for entry in doomed:
            if entry.admin in running:
                raise StateError(f"{entry.admin} belongs to a running task: nothing pruned; run gc when it ends")
            ensure_kept(host, admin_work(common, entry.admin), (), f"{entry.admin}")
        git.worktree_prune(host)
        for entry in doomed:
            _drop_hooks(common, entry.admin.name)
    return [str(e.admin) for e in doomed]


def remove_unmade(host: git.Repo, path: Path, base: str) -> None:
    """What a `git worktree add` killed half-way left: part of git's checkout of the base,
    and its admin dir. Removed only while every file in it is the base's own."""
    common = host.common_dir
    with admin_lock(common):
        ensure_kept(host, unmade_work(host, path, base), (), f"{path}")
        admins = [e.admin for e in admin_entries(common) if e.path and same(e.path, path)]
        for admin in admins:
            ensure_kept(host, admin_work(common, admin), (), f"{admin}")
        for admin in admins:
            shutil.rmtree(admin, ignore_errors=True)
            _drop_hooks(common, admin.name)
        shutil.rmtree(path, ignore_errors=True)


def _drop_hooks(common: Path, admin_name: str) -> None:
    """The hooks ccm-guard installed for that worktree live under the state home."""
    hooks = install.worktree_hooks_dir(common, Path(admin_name))
    shutil.rmtree(hooks, ignore_errors=True)
    for directory in (hooks.parent, hooks.parent.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()
