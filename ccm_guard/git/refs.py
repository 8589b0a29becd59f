"""Refs: resolving names to commits, checking ref names, moving and deleting refs
(compare-and-swap where another process may race), listing them, and fetching or
pushing one ref to a remote."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

from ccm_guard.errors import GitError
from ccm_guard.files import read_regular
from ccm_guard.git.core import Repo, describe_failure, is_oid, run


def resolve_commit(repo: Repo, rev: str) -> str | None:
    """The commit `rev` names, or None. One plain id only: rev-parse also "verifies" a
    negation (`^HEAD` prints `^<id>`), which names no single commit."""
    res = run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], repo, check=False)
    out = res.out.strip()
    return out if res.returncode == 0 and is_oid(out) else None


def symbolic_head(repo: Repo) -> str | None:
    res = run(["symbolic-ref", "--quiet", "HEAD"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def set_symbolic_head(repo: Repo, ref: str) -> None:
    """Point the worktree's HEAD at the branch `ref` again."""
    run(["symbolic-ref", "HEAD", ref], repo)


def branch_tip(repo: Repo, ref: str) -> str | None:
    """What the branch `ref` (refs/heads/...) points at, or None where there is none: read
    from the files as git reads them (the loose ref, else its packed-refs record), with no
    git process; git answers (peeled to a commit) wherever the files cannot say plainly:
    a symbolic or broken loose ref, reftable, an unreadable or oversized packed-refs."""
    common = repo.common_dir
    if not repo.untrusted and ref.startswith("refs/heads/") and not os.path.lexists(common / "reftable"):
        loose = read_regular(common / ref, 100)
        if loose is not None:
            value = loose.strip().decode("ascii", "replace")
            if is_oid(value):
                return value
        elif not os.path.lexists(common / ref) and (packed := _packed_refs(common)) is not None:
            end = packed.find(f" {ref}\n".encode())
            if end < 0:
                return None
            value = packed[packed.rfind(b"\n", 0, end) + 1:end].decode("ascii", "replace")
            if is_oid(value):
                return value
    return resolve_commit(repo, ref)


def _packed_refs(common: Path) -> bytes | None:
    """packed-refs whole (b"" where there is none); None where it cannot be read in Python
    (not a plain file, or too large): git's to read."""
    packed = read_regular(common / "packed-refs", _READ_LIMIT + 1)
    if packed is None:
        return None if os.path.lexists(common / "packed-refs") else b""
    return packed if len(packed) <= _READ_LIMIT else None


def current_branch(repo: Repo) -> str | None:
    """The branch a checkout's HEAD (in repo.git_dir) names, or None (detached): read from
    the file, git asked only where it is not plainly `ref: refs/heads/...`."""
    data = read_regular(repo.git_dir / "HEAD", 1024)
    if data is not None and data.startswith(b"ref: refs/heads/") and data.endswith(b"\n") and data.count(b"\n") == 1:
        return data[5:-1].decode("utf-8", "surrogateescape")
    if data is not None and is_oid(data.strip()):
        return None
    return symbolic_head(repo)


def ref_exists(repo: Repo, ref: str) -> bool:
    return run(["rev-parse", "--verify", "--quiet", ref], repo, check=False).returncode == 0


WORKTREE_STASH = "refs/worktree/stash"
_READ_LIMIT = 1 << 26  # a larger ref file (packed-refs, a stash reflog) is not read in Python


def worktree_stash(repo: Repo) -> list[str]:
    """The commits on a worktree's own stash (refs/worktree/stash, which the shim keeps
    under ccm-guard's sandbox), newest first, each once; no git process where there is none.

    Read from the files, which the agent could write, and so as to keep too much rather
    than too little: every value its reflog names (new and old: an expired reflog leaves
    the ref at a live entry, which the next entry names as its old value) and the ref's
    own, each that is a commit. What cannot be read whole is an error, never "none"."""
    ids: list[str] = []
    for rel in ("logs/" + WORKTREE_STASH, WORKTREE_STASH):
        data = _read_whole(repo.git_dir / rel)
        for line in reversed(data.splitlines()):
            ids += [f.decode("ascii", "replace") for f in line.split(b" ", 2)[:2] if not line.startswith(b"ref:")]
    ids = [oid for oid in dict.fromkeys(ids) if is_oid(oid) and oid.strip("0")]
    if not ids:
        return []
    res = run(["cat-file", "--batch-check=%(objectname) %(objecttype)"], repo, check=False,
              input="".join(f"{oid}\n" for oid in ids).encode())
    commits = {line.split(" ")[0] for line in res.lines() if line.endswith(" commit")}
    return [oid for oid in ids if oid in commits]


def _read_whole(path: Path) -> bytes:
    """A file the agent could have written, whole: b"" where there is none, an error where it
    cannot be read whole (a link, not a plain file, too large, unreadable)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise GitError(f"{path} cannot be looked at ({exc.strerror}): its stash entries cannot be read; look at it "
                       "by hand (git -C <worktree> stash list) before removing anything") from exc
    data = read_regular(path, _READ_LIMIT + 1)
    if data is None or len(data) > _READ_LIMIT:
        raise GitError(f"{path} is not a plain file of at most {_READ_LIMIT >> 20} MiB: its stash entries cannot "
                       "all be read; look at it by hand (git -C <worktree> stash list) before removing anything")
    return data


def all_reachable(repo: Repo, commits: Sequence[str], tip: str) -> bool:
    """Whether every one of `commits` is in `tip`'s history (one git process; none for none)."""
    if not commits:
        return True
    res = run(["rev-list", "--max-count=1", "--stdin"], repo, check=False,
              input="".join(f"{c}\n" for c in commits).encode() + f"^{tip}\n".encode())
    return res.returncode == 0 and not res.out.strip()


def branch_taken(repo: Repo, branch: str) -> bool:
    """Whether refs/heads/`branch` is there already, so that `worktree add -b` would refuse
    it: read from the files where refs are files (a loose ref, even a broken one, or a
    record of packed-refs), no git process on every exec. Any other storage (reftable), or a
    packed-refs that is not a plain file or is too large, is git's to answer."""
    common, ref = repo.common_dir, f"refs/heads/{branch}"
    if os.path.lexists(common / "reftable"):
        return ref_exists(repo, ref)
    try:
        st = os.lstat(common / ref)
    except OSError:
        pass
    else:
        # A directory there is a branch's name only if refs are under it (ccm/t/x): git
        # removes empty ones in its way (an agent can plant them: refs/heads/ccm/ is its).
        return not stat.S_ISDIR(st.st_mode) or any(files for _, _, files in os.walk(common / ref))
    packed = _packed_refs(common)
    if packed is None:
        return ref_exists(repo, ref)
    return f" {ref}\n".encode() in packed


# Names made of these parts are valid branch names by every rule of git-check-ref-format(1)
# (no component starts with a dot or a dash, none holds "..", "@{" or ends in ".lock"):
# task branches always are, and need no git process to say so. Anything else, git decides.
_PLAINLY_VALID = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*/)*"
                            r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")


def _plainly_valid(name: str) -> bool:
    return bool(_PLAINLY_VALID.fullmatch(name)) and not any(p.endswith(".lock") for p in name.split("/"))


def check_branch_name(name: str) -> bool:
    if name != "HEAD" and _plainly_valid(name):
        return True
    return run(["check-ref-format", "--branch", name], check=False).returncode == 0


def update_ref(repo: Repo, ref: str, new: str, old: str | None = None, message: str = "ccm-guard",
               identity: Mapping[str, str] | None = None) -> None:
    """`identity` (GIT_COMMITTER_*): who the reflog entry names, whatever config the agent
    could write says."""
    args = ["update-ref", "-m", message, ref, new]
    if old is not None:
        args.append(old)
    run(args, repo, env=identity)


def delete_ref(repo: Repo, ref: str, old: str, *, missing_ok: bool = False) -> None:
    """Delete `ref` only if it still points at `old` (compare-and-swap); `missing_ok`:
    a ref that is already gone is no error (asked only after git refused: one call).
    A plain loose ref is deleted from the files, as git does (`_delete_loose`); anything
    else is git's."""
    done = _delete_loose(repo, ref, old)
    if done is True:
        return
    missing_ok = missing_ok or done is None
    res = run(["update-ref", "-d", ref, old], repo, check=False)
    if res.returncode != 0 and not (missing_ok and not ref_exists(repo, ref)):
        raise GitError(describe_failure(res))


def _delete_loose(repo: Repo, ref: str, old: str) -> bool | None:
    """Delete a loose ref at `old` the way git's files backend does, without a git process
    (every exec deletes its task's branch): take `<ref>.lock`, check the value, remove the
    reflog and the ref, prune the emptied directories below refs/<kind>/, drop the lock.

    True: deleted here. False: nothing done, git must do it (reftable, a lock held, a
    value that is not `old` (git says why), a ref that packed-refs lists too, an unusual
    name). None: the loose ref is gone, but a `git pack-refs` ran meanwhile (its lock, or
    the ref now in packed-refs): git must finish, and may find nothing left to delete."""
    common = repo.common_dir
    parts = ref.split("/")
    if (repo.untrusted or len(parts) < 3 or parts[0] != "refs" or not _plainly_valid(ref)
            or os.path.lexists(common / "reftable") or not _unpacked(common, ref)):
        return False
    path = common / ref
    lock = Path(f"{path}.lock")
    try:
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError:
        return False  # another git holds it, or the directory is not there: git's to report
    try:
        value = read_regular(path, 100)
        if value is None or value.strip() != old.encode():
            return False
        for place in (common / "logs" / ref, path):  # the reflog first, as git does
            try:
                os.unlink(place)
            except FileNotFoundError:
                pass
            except OSError:
                # Not a file (the agent can make its reflog a directory): git copes with
                # that, and nothing is gone yet if it is the reflog that would not go.
                return False if place != path else None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
    for depth in range(len(parts) - 1, 2, -1):  # refs/<kind>/ itself stays, as git keeps it
        for top in (common, common / "logs"):
            with contextlib.suppress(OSError):
                os.rmdir(top.joinpath(*parts[:depth]))
    # A pack-refs that read the ref before it went has written (or is writing) it into
    # packed-refs, and could not prune it while we held its lock: git deletes it there.
    return True if _unpacked(common, ref) else None


def _unpacked(common: Path, ref: str) -> bool:
    """Nobody is packing refs, and packed-refs (read whole) does not list `ref`."""
    if os.path.lexists(common / "packed-refs.lock"):
        return False
    packed = _packed_refs(common)
    return packed is not None and f" {ref}\n".encode() not in packed


def drop_ref(repo: Repo, ref: str) -> None:
    """Delete a private ref whatever it points at (a missing one is fine)."""
    run(["update-ref", "-d", ref], repo)


def try_update_ref(repo: Repo, ref: str, new: str, old: str, message: str) -> bool:
    """Compare-and-swap: move `ref` from `old` to `new`; False if it was not at `old`."""
    res = run(["update-ref", "-m", message, ref, new, old], repo, check=False)
    if res.returncode == 0:
        return True
    if resolve_commit(repo, ref) != old:
        return False  # somebody else moved it first: the caller recomputes and retries
    raise GitError(describe_failure(res))


def refs_under(repo: Repo, prefix: str) -> dict[str, str]:
    res = run(["for-each-ref", "--format=%(refname) %(objectname)", prefix], repo)
    return dict(line.split(" ", 1) for line in res.lines() if " " in line)


# --- gc: which refs keep a piece of work -----------------------------------------------------


class RefTree(NamedTuple):
    ref: str
    commit: str
    tree: str  # the tree of the commit the ref points at (an annotated tag is peeled)


def ref_trees(repo: Repo, contains: str | None = None) -> list[RefTree]:
    """Every ref (only those whose history holds `contains`, when given) with its tree."""
    fmt = "--format=%(refname)%00%(objectname)%00%(tree)%00%(*objectname)%00%(*tree)"
    args = ["for-each-ref", fmt] + ([f"--contains={contains}"] if contains else [])
    found = []
    for line in run(args, repo).lines():
        if not line:
            continue  # no refs at all
        ref, commit, tree, peeled, peeled_tree = line.split("\0")
        if tree or peeled_tree:  # refs to blobs or trees keep no commit
            found.append(RefTree(ref, peeled or commit, tree or peeled_tree))
    return found


# --- one ref to or from a remote ---------------------------------------------------------------


def fetch_ref(repo: Repo, url: str, branch: str, into: str) -> str | None:
    """Fetch `branch` of `url` into the private ref `into`; None when the remote lacks it."""
    res = run(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, f"+refs/heads/{branch}:{into}"],
              repo, check=False)
    if res.returncode != 0:
        if b"couldn't find remote ref" in res.stderr:
            return None
        raise GitError(describe_failure(res))
    return resolve_commit(repo, into)


def push_ref(repo: Repo, url: str, commit: str, branch: str) -> str | None:
    """Push without force; the rejection message when the remote moved, None on success."""
    res = run(["push", "--porcelain", url, f"{commit}:refs/heads/{branch}"], repo, check=False)
    if res.returncode == 0:
        return None
    text = (res.stdout + res.stderr).decode("utf-8", "replace")
    # A lost race shows as a rejection, or (two pushes at the same moment) as the remote
    # failing to lock or update the ref it was about to move.
    races = ("fetch first", "non-fast-forward", "[rejected]", "stale info", "cannot lock ref",
             "failed to update ref", "incorrect old value")
    if any(sign in text for sign in races):
        return text.strip().splitlines()[-1] if text.strip() else "rejected"
    raise GitError(describe_failure(res))
