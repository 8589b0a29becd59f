"""The directories a sandboxed agent needs writable to commit in its worktree.

A linked worktree keeps its git metadata outside itself, so a sandbox that only lets the
agent write its working directory turns every `git commit` into
`fatal: Unable to create '.../worktrees/<name>/index.lock': Permission denied`
(docs/design-notes.md#sandbox-blocked-commits). The answer here is the narrowest set that lets `git add` +
`git commit` succeed, each root checked for real under Landlock in tests/prevent/test_roots.py
(take any one away and the commit fails):

  worktree              the files the agent edits. Tamper: the `.git` pointer file.
  admin dir             worktrees/<name>/: index, HEAD, logs/HEAD, COMMIT_EDITMSG and
                        their .lock files, renamed into place. Private to the task.
                        Tamper: HEAD (switch branch), config.worktree (code-running keys),
                        gitdir/commondir (redirect git) - all in the snapshot.
  common objects/       new loose objects go to objects/xx/, a fan-out directory git may
                        have to create. Shared: the agent can also delete or rewrite
                        existing objects and write objects/info/alternates or packs; the
                        snapshot inventories existing objects and objects/info/*.
                        Only a task with a private object store (a clone borrowing
                        these objects as an alternate) would close this.
  refs/heads/<dir>/     where the branch's loose ref is replaced via `<branch>.lock`.
                        For ccm/<task> that is refs/heads/ccm/, shared by every task: the
                        agent can rewrite other tasks' branches there, so refs-untouched
                        must compare every ref, not only the task's.
  logs/refs/heads/<dir>/  the branch's reflog (appended on commit; git fails the commit
                        when it cannot: "unable to append to ...").

Both hold an empty `.ccm-guard-keep/` directory (for refs/heads/ccm/, every task's): the person's
`git pack-refs --all` prunes a ref directory it emptied, and the agent cannot make the
directory its sandbox granted again.

Not granted, and not needed: the common dir itself (config, hooks/, info/, packed-refs,
the main worktree's index and HEAD), other admin dirs, other ref directories. git writes
`packed-refs` only when deleting a ref or packing refs, never for a commit.

Everything is read from the files (the `.git` pointer, `commondir`, `gitdir`, `HEAD`)
rather than from git's discovery, which honours GIT_DIR and core.worktree. Any probe that
fails raises: a partial answer would give a sandbox in which the commit still fails
halfway (docs/design-notes.md#writable-roots). Call it before the task's first snapshot: it may create the
branch's (empty) ref and reflog directories, which a snapshot would then see appear.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ccm_guard.errors import RepoError
from ccm_guard.state.pins import BRANCH_PREFIX

_READ_LIMIT = 4096  # pointer files are one line; anything bigger is not git's
_DETACHED = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def writable_roots(path: Path) -> list[Path]:
    """Real paths to make writable for an agent in the worktree holding `path`.

    [] for a main worktree (its git dir is inside it) and for a non-repository.
    """
    start = Path(os.path.realpath(path))
    if not start.exists():
        raise RepoError(f"{path} does not exist: pass the task's worktree")
    top = _worktree_top(start)
    if top is None:
        return []
    dotgit = top / ".git"
    mode = os.lstat(dotgit).st_mode
    if stat.S_ISDIR(mode):
        return []
    if not stat.S_ISREG(mode):
        raise RepoError(f"{dotgit} is a symlink or special file, not a worktree's gitdir file: "
                        "grant its git dir to the sandbox by hand")
    admin = _admin_dir(dotgit)
    common = _common_dir(admin)
    _check_admin(admin, common, dotgit)
    roots = [top, admin, _subdir(common, "objects")]
    branch = _branch(admin)
    if branch is not None:
        parents = branch.split("/")[:-1]  # ["refs", "heads", "ccm"] for refs/heads/ccm/<task>
        # Where that is every task's (refs/heads/ccm/), a file keeps it: a deeper one (a task
        # named a/b) would then stand in the way of a branch named like it (ccm/a).
        keep = _kept if parents == ["refs", "heads", BRANCH_PREFIX.rstrip("/")] else (lambda d: d)
        roots.append(keep(_ensure_dir(common, parents)))
        roots.append(keep(_ensure_dir(common, ["logs", *parents])))
    return list(dict.fromkeys(roots))


def _worktree_top(start: Path) -> Path | None:
    """The nearest directory at or above `start` holding a `.git` entry (git's own walk)."""
    for candidate in (start, *start.parents):
        if os.path.lexists(candidate / ".git"):
            return candidate
    return None


def _read(path: Path) -> str:
    """A small metadata file, never through a symlink; raise with the reason."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RepoError(f"cannot read {path} ({exc.strerror}): run `git worktree repair` "
                        "in the main checkout") from exc
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise RepoError(f"{path} is not a regular file: run `git worktree repair` in the main checkout")
        data = fh.read(_READ_LIMIT + 1)
    if len(data) > _READ_LIMIT:
        raise RepoError(f"{path} is too large for a git pointer file: inspect it by hand")
    return data.decode("utf-8", "surrogateescape").strip()


def _admin_dir(dotgit: Path) -> Path:
    text = _read(dotgit)
    if not text.startswith("gitdir: "):
        raise RepoError(f"{dotgit} does not start with 'gitdir: ': run `git worktree repair` in the main checkout")
    # As git does (read_gitfile): a relative gitdir is relative to the pointer's directory.
    admin = Path(os.path.realpath(dotgit.parent / text[len("gitdir: "):]))
    if not admin.is_dir():
        raise RepoError(f"{dotgit} points at {admin}, which is not a directory: run `git worktree prune`")
    return admin


def _common_dir(admin: Path) -> Path:
    if not os.path.lexists(admin / "commondir"):
        # A submodule or --separate-git-dir checkout: its whole git dir is outside it.
        raise RepoError(f"{admin} has no commondir, so this is not a linked worktree (a submodule or a "
                        f"separate git dir): grant {admin} to the sandbox by hand")
    return Path(os.path.realpath(admin / _read(admin / "commondir")))


def _check_admin(admin: Path, common: Path, dotgit: Path) -> None:
    """The pointer, the admin dir and its back-pointer must agree, as git worktree sets them up."""
    if admin.parent != common / "worktrees":
        raise RepoError(f"{admin} is not inside {common}/worktrees/: this worktree was not made by "
                        "`git worktree add`; run `git worktree repair`")
    back = Path(os.path.realpath(admin / _read(admin / "gitdir")))
    if back != dotgit:
        raise RepoError(f"{admin}/gitdir names {back}, not {dotgit}: the worktree was moved or copied; "
                        "run `git worktree repair` in it")


def _branch(admin: Path) -> str | None:
    """The ref HEAD points at (refs/heads/...), or None when HEAD is detached."""
    head = _read(admin / "HEAD")
    if _DETACHED.fullmatch(head):
        return None
    ref = head.removeprefix("ref: ")
    parts = ref.split("/")
    if (not head.startswith("ref: ") or parts[:2] != ["refs", "heads"] or len(parts) < 3
            or any(p in ("", ".", "..") or p.startswith(".") for p in parts)):
        raise RepoError(f"{admin}/HEAD holds {head!r}, not a branch or a commit: check out the task's branch")
    return ref


def _subdir(common: Path, name: str) -> Path:
    found = common / name
    if os.path.realpath(found) != str(found) or not found.is_dir():
        raise RepoError(f"{found} is not a plain directory (a symlink, or missing): "
                        "grant the object store to the sandbox by hand")
    return found


KEEP = ".ccm-guard-keep"


def _kept(directory: Path) -> Path:
    """`directory` with an empty directory in it that keeps git from removing it when it
    holds no ref: the person's `git pack-refs --all` prunes a ref directory it emptied, and
    the agent, whose sandbox granted that very directory, could not make it again to
    commit. Git lists no ref under a name that begins with a dot, and a directory holds no
    ref to check: a file there would fail a newer git's `git fsck` (badRefName)."""
    try:
        os.mkdir(directory / KEEP)
    except OSError:
        pass  # there already; or not, and only that pruning could still take the directory
    return directory


def _ensure_dir(common: Path, parts: list[str]) -> Path:
    """common/<parts...>, creating what is missing, refusing any symlink on the way.

    git creates these on demand, but a Landlock rule needs the directory to exist; and
    the check stops a planted symlink (refs/heads/ccm -> ~/.ssh) from becoming a root.
    """
    current = common
    for part in parts:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RepoError(f"cannot create {current} ({exc.strerror}): check the permissions of {common}") from exc
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            raise RepoError(f"{current} is not a directory (a symlink or a file): remove it, "
                            "git recreates it as needed")
    return current
