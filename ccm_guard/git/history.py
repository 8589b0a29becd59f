"""History: the commits of a range and what each changed, ancestry, merging in the
object store only, and making commits (from a tree, or from a whole work tree)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ccm_guard.errors import GitError
from ccm_guard.git.base import raw_changes_batched
from ccm_guard.git.core import Repo, describe_failure, is_oid, run, run_z


def parents_and_message(repo: Repo, commit: str) -> tuple[list[str], str]:
    """A commit's parents and its message, in one call."""
    parents, _, message = run(["log", "-1", "--format=%P%n%B", commit, "--"], repo).out.partition("\n")
    return parents.split(), message


def is_ancestor(repo: Repo, ancestor: str, descendant: str) -> bool:
    res = run(["merge-base", "--is-ancestor", ancestor, descendant], repo, check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    return res.returncode == 0


def merge_base(repo: Repo, a: str, b: str) -> str:
    return run(["merge-base", a, b], repo).out.strip()


def count_commits(repo: Repo, base: str, head: str) -> int:
    return int(run(["rev-list", "--count", f"{base}..{head}"], repo).out.strip() or 0)


def has_any_commit(repo: Repo) -> bool:
    return bool(run(["rev-list", "-n1", "--all"], repo).out.strip())


class MergeResult(NamedTuple):
    tree: str | None  # None when the merge conflicts
    conflicts: dict[str, str]  # path -> git's CONFLICT message


def merge_tree(repo: Repo, ours: str, theirs: str) -> MergeResult:
    """Merge two commits in the object store only (no index, no work tree touched)."""
    res = run(["merge-tree", "--write-tree", "-z", "--name-only", ours, theirs], repo, check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    head, _, messages = res.out.partition("\0\0")
    tree, *names = head.split("\0")
    # Messages: <count> NUL <count paths> NUL <type> NUL <text> NUL, repeated.
    conflicts = {name.rstrip("\0"): "conflict" for name in names if name}
    fields = messages.split("\0")
    i = 0
    while i < len(fields) and fields[i].isdigit():
        count = int(fields[i])
        paths, kind, text = fields[i + 1:i + 1 + count], fields[i + 1 + count], fields[i + 2 + count]
        if kind.startswith("CONFLICT"):
            for path in paths:
                conflicts[path] = text.strip()
        i += count + 3
    return MergeResult(tree if res.returncode == 0 else None, conflicts)


def commit_tree(repo: Repo, tree: str, parents: Sequence[str], message: str, identity: Mapping[str, str]) -> str:
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    return run([*args, "-F", "-"], repo, env=identity, input=message.encode()).out.strip()


def archive_commit(repo: Repo, parent: str, message: str, identity: Mapping[str, str]) -> str:
    """A commit holding everything in the work tree (tracked and untracked, not ignored).

    Built in a private copy of the index, so neither the task's index nor its branch
    moves; the copy keeps git's stat cache, so only changed files are hashed again.
    """
    with tempfile.TemporaryDirectory(prefix="ccm-guard-archive-") as tmp:
        index = Path(tmp, "index")
        env = {"GIT_INDEX_FILE": str(index), **identity}
        try:
            shutil.copyfile(repo.git_dir / "index", index)
            run(["add", "--all", "--", "."], repo, env=env)
        except (OSError, GitError):
            # No usable index (the agent may have removed or corrupted it): start from the commit.
            index.unlink(missing_ok=True)
            run(["read-tree", parent], repo, env=env)
            run(["add", "--all", "--", "."], repo, env=env)
        tree = run(["write-tree"], repo, env=env).out.strip()
        return run(["commit-tree", tree, "-p", parent, "-F", "-"], repo, env=env, input=message.encode()).out.strip()


def diff_text(repo: Repo, base: str, head: str) -> str:
    return run(["diff", "--no-ext-diff", "--no-textconv", "--stat", "--patch", base, head, "--"], repo).out


# What a range of two commit ids holds never changes: one process asks once (a run's
# gates, verdict and snapshots all want the same range).
_RANGES: dict[tuple[str, str, str, str], list[Any]] = {}


def _range_once(repo: Repo, kind: str, base: str, head: str, compute: Callable[[], list[Any]]) -> list[Any]:
    if not (is_oid(base) and is_oid(head)):
        return compute()
    key = (str(repo.common_dir), kind, base, head)
    if key not in _RANGES:
        _RANGES[key] = compute()
    return list(_RANGES[key])


def commits(repo: Repo, base: str, head: str) -> list[tuple[str, str]]:
    """(sha, subject) of each commit in base..head, oldest first."""
    return [(sha, subject) for sha, subject, _, _, _ in _log(repo, base, head)]


def commit_claims(repo: Repo, base: str, head: str) -> list[tuple[str, str, str, list[str]]]:
    """(sha, author email, committer email, trailer lines) of each commit in base..head:
    what a commit says about who made it and why."""
    return [(sha, author, committer, trailers) for sha, _, author, committer, trailers in _log(repo, base, head)]


def _log(repo: Repo, base: str, head: str) -> list[tuple[str, str, str, str, list[str]]]:
    """One `git log` of base..head for both views above, oldest first: a subject (%s) is
    one line, an email never holds a newline, so each field is a line of its record."""
    def compute() -> list[Any]:
        records = run(["log", "--reverse", "--no-decorate", "-z",
                       "--format=%H%n%s%n%ae%n%ce%n%(trailers:only=true,unfold=true)", f"{base}..{head}", "--"],
                      repo).z()
        found = []
        for record in records:
            sha, subject, author, committer, trailers = (record.split("\n", 4) + [""] * 4)[:5]
            found.append((sha, subject, author, committer, [t for t in trailers.splitlines() if t]))
        return found

    return _range_once(repo, "log", base, head, compute)


@dataclasses.dataclass(frozen=True)
class FileStat:
    """Lines added and deleted in one file (`git diff --numstat`)."""

    path: str
    added: int | None  # None for binary files
    deleted: int | None


def numstat(repo: Repo, base: str, head: str) -> list[FileStat]:
    def compute() -> list[Any]:
        out = run(["diff", "--numstat", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", base, head, "--"],
                  repo).z()
        stats = []
        for record in out:
            added, deleted, path = record.split("\t", 2)
            stats.append(FileStat(path, None if added == "-" else int(added), None if deleted == "-" else int(deleted)))
        return stats

    return _range_once(repo, "numstat", base, head, compute)


class RawChange(NamedTuple):
    """One path changed, as `git diff --raw` reports it (renames split into delete + add).

    A tuple with pathrules.check.PathChange's fields in PathChange's order, so the path
    check takes a range's 100k changes as they are (detect.paths.from_raw)."""

    path: str
    status: str  # A, M, D, T
    old_mode: str
    new_mode: str
    old_blob: str | None  # None: git's null id (no blob on that side)
    new_blob: str | None
    where: str  # the commit that made the change


def range_log(base: str, head: str) -> list[str]:
    """The git command (its arguments) listing, raw, what each commit of base..head changed
    against each of its parents (commit_changes; the bench and tests run it as it is).
    --ignore-submodules=none: a .gitmodules saying `ignore = all` must not hide a gitlink."""
    return ["log", "--reverse", "-z", "--raw", "--no-renames", "--no-abbrev", "--diff-merges=separate",
            "--ignore-submodules=none", "--format=%x00commit %H", f"{base}..{head}", "--"]


def commit_changes(repo: Repo, base: str, head: str, *, merged_base: bool = False) -> list[RawChange]:
    """Every path each commit in base..head changed against each of its parents, oldest first.

    Per commit, not base..head as a whole: a forbidden file changed and changed back,
    or a change brought in by a merge, is still seen. Against every parent of a merge,
    not the first only: a merge whose first parent is an older commit undoes the base's
    changes without any first-parent diff showing it. Along any line of parents from the
    base to the head every step is one of these diffs, so the net change is within them.

    `merged_base` (a pull request that merged its base branch in, as GitHub's "Update
    branch" does): a merge with parents outside the range (reachable from the base) is
    judged against those parents only. Its diffs against its in-range parents show the
    base's own work coming in; what the merge itself brings relative to the base,
    an undoing of the base's changes included, is in the diffs kept.
    """
    with closing(run_z(range_log(base, head), repo)) as out:
        changes = raw_changes_batched(out, "", RawChange)  # (closing: git stopped at once if the parse fails)
    if not merged_base:
        return changes
    parents = {line.split(" ")[0]: line.split(" ")[1:] for line in
               run(["rev-list", "--parents", f"{base}..{head}", "--"], repo).out.split("\n") if line}
    outside = {commit: base_side for commit, ps in parents.items() if len(ps) > 1
               for base_side in [[p for p in ps if p not in parents]] if base_side}
    if not outside:
        return changes
    kept = [c for c in changes if c.where not in outside]
    try:
        meeting = merge_base(repo, base, head)
    except GitError:  # unrelated histories: the base itself is the nearest thing
        meeting = base
    for merge, base_side in outside.items():
        for parent in base_side:
            kept += tree_changes(repo, parent, merge)
            if parent != meeting:
                # An older commit of the base: what the base changed since is compared
                # with the merge too, or a merge of an older base could undo it unseen.
                since = {c.path for c in tree_changes(repo, parent, meeting)}
                kept += [c for c in tree_changes(repo, meeting, merge) if c.path in since]
    return kept


def tree_changes(repo: Repo, old: str, new: str) -> list[RawChange]:
    """Every path tree `new` changes against tree `old`, with modes (a gitlink is 160000)."""
    with closing(run_z(["diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", "--ignore-submodules=none",
                        old, new, "--"], repo)) as diff:
        return raw_changes_batched(diff, new, RawChange)


def numstat_trees(old: Path, new: Path) -> dict[str, tuple[int | None, int | None]]:
    """Lines added and deleted per file from directory `old` to directory `new`, outside any
    repository (`git diff --no-index`), keyed by the path relative to them; (None, None)
    for a binary file. git's diff, not Python's: difflib takes minutes on some inputs an
    agent can write.
    """
    res = run(["diff", "--no-index", "--no-renames", "--numstat", "-z", "--no-ext-diff", "--no-textconv",
               "--", str(old), str(new)], check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    tokens = res.out.split("\0")
    found: dict[str, tuple[int | None, int | None]] = {}
    for i in range(0, len(tokens) - 2, 3):  # "ADDED\tDELETED\t", the old path, the new path
        added, deleted, _ = tokens[i].split("\t", 2)
        gone = tokens[i + 2] == os.devnull
        rel = os.path.relpath(tokens[i + 1] if gone else tokens[i + 2], old if gone else new)
        found[rel] = (None, None) if added == "-" else (int(added), int(deleted))
    return found
